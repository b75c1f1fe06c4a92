"""Built-in datasets and models by name, filled by the packages that ship them.

The command-line tools of the core (``trl-ext gate``, ``build-value-table``, ``advise``) accept names such as
``--task addition``, ``--dataset sum3`` or ``--model smollm2``. They look them up here instead of importing the
packages that ship them (the offline testbed, the real model): those register their datasets and models when they
are imported, and :mod:`trl_ext.cli` imports them before a subcommand runs. So the core never depends on the
development assets, and another package can add its own names.

Registration must stay cheap (``trl-ext --help`` imports the registering packages): register *loader functions*,
which import torch, transformers or ``datasets`` only when a name is used. This module imports nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BuiltinDataset",
    "dataset_names",
    "get_dataset",
    "model_names",
    "register_dataset",
    "register_model",
    "resolve_model",
]


@dataclass(frozen=True)
class BuiltinDataset:
    """A built-in task: how to draw its prompts, how big its splits are and how to score it."""

    name: str
    source: str  # the package that ships it ("testbed", "real"); tools that accept one source filter on it
    make: Callable[[str, int | None, int], Any]  # (split, n or None for all, seed) -> a datasets.Dataset
    split_size: Callable[[str], int]  # split -> number of distinct prompts
    rewards: Callable[[], dict[str, Callable]]  # reward functions by name; the first is the task's own (default)
    max_answer_chars: int | None = None  # the longest answer, when known (a completion cap follows from it)

    def default_rewards(self) -> list[Callable]:
        """The task's own reward function, as a list (what ``reward_funcs=`` takes)."""
        return [next(iter(self.rewards().values()))]


_DATASET_LOADERS: dict[str, tuple[str, Callable[[], BuiltinDataset]]] = {}
_DATASETS: dict[str, BuiltinDataset] = {}
_MODELS: dict[str, Callable[..., str]] = {}


def register_dataset(name: str, loader: Callable[[], BuiltinDataset], *, source: str) -> None:
    """Make ``name`` a built-in dataset; ``loader()`` builds its :class:`BuiltinDataset` on first use. Registering a
    name again replaces it (a package re-imported, a user overriding a built-in)."""
    _DATASET_LOADERS[name] = (source, loader)
    _DATASETS.pop(name, None)


def dataset_names(source: str | None = None) -> list[str]:
    """The built-in dataset names (of ``source`` only, when given), in registration order."""
    return [n for n, (s, _) in _DATASET_LOADERS.items() if source is None or s == source]


def get_dataset(name: str, *, source: str | None = None) -> BuiltinDataset:
    """The built-in dataset ``name`` (of ``source``, when given); ``ValueError`` listing the valid names."""
    names = dataset_names(source)
    if name not in names:
        raise ValueError(f"unknown task {name!r}; valid tasks: {sorted(names)}")
    if name not in _DATASETS:
        _DATASETS[name] = _DATASET_LOADERS[name][1]()
    return _DATASETS[name]


def register_model(name: str, resolver: Callable[..., str]) -> None:
    """Make ``name`` a model alias: ``resolver(name, dataset_name=, cache_dir=)`` returns the model's local folder
    (building or fetching it once). A name ending in ``:`` is a prefix: ``"testbed:"`` resolves ``testbed:TASK``."""
    _MODELS[name] = resolver


def model_names() -> list[str]:
    """The registered model aliases and prefixes, in registration order."""
    return list(_MODELS)


def resolve_model(name: str, *, dataset_name: str | None = None, cache_dir: str | None = None) -> str | None:
    """The folder of the model alias ``name`` (case and surrounding spaces ignored) or of a ``prefix:ARG`` name;
    None when no registered alias matches. ``dataset_name`` is the dataset the model will see (a warm model of that
    task); resolvers raise ``ValueError`` on names they own but cannot resolve."""
    key = name.strip().lower()
    if key in _MODELS and not key.endswith(":"):
        return _MODELS[key](name, dataset_name=dataset_name, cache_dir=cache_dir)
    prefix, sep, _ = name.partition(":")
    if sep and prefix + ":" in _MODELS:
        return _MODELS[prefix + ":"](name, dataset_name=dataset_name, cache_dir=cache_dir)
    return None

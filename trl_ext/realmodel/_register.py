"""The real-model chat tasks and SmolLM2 in :mod:`trl_ext.registry` (``--dataset sum3``, ``--model smollm2``).
Imported by the package; the loaders import ``datasets`` and fetch the model only when a name is used."""

from __future__ import annotations

import sys
from functools import partial

from .. import registry
from .tasks import REAL_TASKS, accuracy_reward, format_reward, make_real_dataset, split_items


def _dataset(name: str) -> registry.BuiltinDataset:
    return registry.BuiltinDataset(
        name=name, source="real", make=lambda split, n, seed: make_real_dataset(name, n, seed=seed, split=split),
        split_size=lambda split: len(split_items(name, split)),
        rewards=lambda: {"accuracy": accuracy_reward, "format": format_reward})


def _real_model(name: str, *, dataset_name: str | None, cache_dir: str | None) -> str:
    """``smollm2`` / ``real``: the cached SmolLM2-135M-Instruct (fetched once). Read from the package at call time,
    so a test's replacement of ``trl_ext.realmodel.get_real_model`` is the one called."""
    return sys.modules[__package__].get_real_model(cache_dir)


for _name in REAL_TASKS:
    registry.register_dataset(_name, partial(_dataset, _name), source="real")
registry.register_model("smollm2", _real_model)
registry.register_model("real", _real_model)

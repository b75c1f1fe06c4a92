"""Lazy package exports: a package names what it exports and where each name lives, and the submodule is imported
on first access. This keeps ``import trl_ext.<package>`` (and ``trl-ext --help``) free of torch, transformers and
TRL while ``from trl_ext.<package> import Name`` keeps working."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(module_name: str, exports: Mapping[str, str], *, submodules: Iterable[str] = (),
                 cache: bool = True) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the package ``module_name``; assign both at its module level.

    Parameters
    ----------
    module_name : str
        The package's ``__name__``.
    exports : mapping
        Exported name -> the submodule defining it, relative to the package (``"tasks"``, ``"trainers.base"``).
    submodules : iterable of str
        Submodules reachable as attributes too (``trl_ext.stats.floors``).
    cache : bool
        Store a name in the package's namespace on first access (later accesses skip ``__getattr__``). Without it
        every access reads the submodule's current value (what a test's monkeypatch of the submodule sees).
    """
    exports = dict(exports)
    submodules = tuple(submodules)

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(import_module(f".{exports[name]}", module_name), name)
            if cache:
                setattr(sys.modules[module_name], name, value)
            return value
        if name in submodules:
            return import_module(f".{name}", module_name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[module_name]), *exports, *submodules})

    return __getattr__, __dir__

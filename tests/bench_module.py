"""Benchmark scripts (``benchmarks/*.py``, not part of the package) as modules for the tests that exercise them,
each loaded once per test session under its file name (``compare_trainers`` for the comparison harness)."""

from __future__ import annotations

import importlib.util
import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def bench_script(name: str):
    """The loaded ``benchmarks/<name>.py`` (cached in ``sys.modules``)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def compare_trainers():
    """The loaded ``benchmarks/compare_trainers.py``."""
    return bench_script("compare_trainers")

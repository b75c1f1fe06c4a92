"""The comparison harness ``benchmarks/compare_trainers.py`` as a module for the tests that exercise it (a script,
not part of the package): loaded once per test session under the name ``compare_trainers``."""

from __future__ import annotations

import importlib.util
import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def compare_trainers():
    """The loaded ``benchmarks/compare_trainers.py`` (cached in ``sys.modules``)."""
    if "compare_trainers" in sys.modules:
        return sys.modules["compare_trainers"]
    spec = importlib.util.spec_from_file_location("compare_trainers", os.path.join(BENCH, "compare_trainers.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["compare_trainers"] = mod
    spec.loader.exec_module(mod)
    return mod

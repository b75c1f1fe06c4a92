"""``trl_ext.registry`` (built-in names the core CLIs look up) and ``trl_ext._lazy`` (lazy package exports)."""

import sys
import types

import pytest

from trl_ext import registry
from trl_ext._lazy import lazy_exports


def test_the_dev_packages_register_their_names():
    """Importing the dev packages registers their names (that it stays torch-free is
    ``tests/test_cli.py::test_help_does_not_import_trl_or_torch``: ``build_parser`` imports them)."""
    import trl_ext.realmodel  # noqa: F401
    import trl_ext.testbed  # noqa: F401

    assert registry.dataset_names("testbed") == ["addition", "substitution", "scratchpad"]
    assert registry.dataset_names("real") == ["sum3", "largest", "steps", "steps_matched"]
    assert {"testbed-warm", "testbed:", "smollm2", "real"} <= set(registry.model_names())


def test_lookups_and_their_errors(monkeypatch):
    import trl_ext.testbed  # noqa: F401 - registers the testbed's tasks

    monkeypatch.setattr(registry, "_DATASET_LOADERS", dict(registry._DATASET_LOADERS))
    monkeypatch.setattr(registry, "_DATASETS", {})
    monkeypatch.setattr(registry, "_MODELS", dict(registry._MODELS))
    add = registry.get_dataset("addition", source="testbed")
    assert add.max_answer_chars == 3 and add.split_size("test") > 0
    assert [f.__name__ for f in add.default_rewards()] == ["addition_reward"]
    with pytest.raises(ValueError, match=r"unknown task 'sum3'; valid tasks: \['addition', 'scratchpad', 'subst"):
        registry.get_dataset("sum3", source="testbed")
    seen = []
    registry.register_model("mine", lambda name, **kw: seen.append((name, kw)) or "/m")
    registry.register_model("pre:", lambda name, **kw: f"/p/{name}")
    assert registry.resolve_model(" MINE ", dataset_name="d") == "/m"
    assert seen == [(" MINE ", {"dataset_name": "d", "cache_dir": None})]
    assert registry.resolve_model("pre:x") == "/p/pre:x"
    assert registry.resolve_model("pre:") == "/p/pre:" and registry.resolve_model("nope") is None


def test_lazy_exports_cache_and_dir(monkeypatch):
    pkg = types.ModuleType("fake_lazy_pkg")
    pkg.__path__ = []
    sub = types.ModuleType("fake_lazy_pkg.sub")
    sub.VALUE = 1
    for mod in (pkg, sub):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    pkg.__getattr__, pkg.__dir__ = lazy_exports("fake_lazy_pkg", {"VALUE": "sub"}, submodules=("sub",), cache=False)
    assert pkg.VALUE == 1 and pkg.sub is sub and "VALUE" in dir(pkg) and "sub" in dir(pkg)
    sub.VALUE = 2
    assert pkg.VALUE == 2  # not cached: a monkeypatch of the submodule shows through
    with pytest.raises(AttributeError, match="module 'fake_lazy_pkg' has no attribute 'nope'"):
        _ = pkg.nope
    pkg.__getattr__, _ = lazy_exports("fake_lazy_pkg", {"VALUE": "sub"})
    assert pkg.VALUE == 2 and pkg.__dict__["VALUE"] == 2  # cached in the package's namespace

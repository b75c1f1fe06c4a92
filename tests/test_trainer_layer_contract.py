"""Structural contract of the trainer layer (no training; runs in a few seconds).

* options are declared once: every trl_ext field of ``ExtGRPOConfig``, ``V05GRPOConfig``, ``BASISConfig`` and
  ``PAIRConfig`` is one dataclass field with help text, declared in exactly one place of ``trl_ext/trainers/``, and
  no ``*Options`` class declares a field (the typed options a strategy reads, ``V05Options`` ..., are generated from
  the method config's fields: ``method_options_class``);
* one naming convention: method-specific fields carry their method's prefix (``v05_``, ``basis_``, ``pair_``);
* options are documented once: the help of each field; no config class docstring repeats the fields in a numpydoc
  ``Parameters`` block;
* one rule for config classes: a plain ``trl.GRPOConfig`` or the base ``ExtGRPOConfig`` is upgraded to each
  trainer's config class, another trainer's method config and anything that is not a ``trl.GRPOConfig`` are a
  ``TypeError``, and method configs refuse an ``advantage_estimator`` they would ignore;
* each equation once: the estimator functions (GRPO, OSLA, BASIS std scaling, PAIR design / advantages / fixed
  normalizer / standardization, PAIR heads) are defined in ``trl_ext/estimators/`` only; no module of ``trl_ext/trainers/`` redefines them.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import typing

import pytest
import trl

from trl_ext import BASISConfig, PAIRConfig, V05GRPOConfig
from trl_ext.trainers.base import ExtGRPOConfig, as_config

ROOT = pathlib.Path(__file__).resolve().parents[1] / "trl_ext"
TRAINERS = ROOT / "trainers"

METHOD_CONFIGS = [(V05GRPOConfig, "v05_"), (BASISConfig, "basis_"), (PAIRConfig, "pair_")]
TRL_FIELDS = {f.name for f in dataclasses.fields(trl.GRPOConfig)}


def _own_fields(cls) -> list[dataclasses.Field]:
    """Dataclass fields declared in ``cls`` itself (not inherited), ClassVars excluded by ``dataclasses``."""
    own = cls.__dict__.get("__annotations__", {})
    return [f for f in dataclasses.fields(cls) if f.name in own]


def _kw(tmp_path) -> dict:
    return {"output_dir": str(tmp_path), "use_cpu": True, "report_to": "none"}


@pytest.mark.parametrize("cls", [ExtGRPOConfig, V05GRPOConfig, BASISConfig, PAIRConfig], ids=lambda c: c.__name__)
def test_every_option_is_one_field_with_help(cls):
    own = _own_fields(cls)
    assert own, f"{cls.__name__} declares no field"
    no_help = [f.name for f in own if len(str(f.metadata.get("help", "")).strip()) < 10]
    assert not no_help, f"{cls.__name__}: fields without help text: {no_help}"


@pytest.mark.parametrize("cls,prefix", METHOD_CONFIGS, ids=lambda x: getattr(x, "__name__", x))
def test_method_fields_carry_the_method_prefix(cls, prefix):
    own = [f.name for f in _own_fields(cls) if f.name not in TRL_FIELDS]  # TRL fields keep TRL's names
    assert own
    wrong = [n for n in own if not n.startswith(prefix)]
    assert not wrong, f"{cls.__name__}: method fields without the {prefix!r} prefix: {wrong}"
    others = [p for _, p in METHOD_CONFIGS if p != prefix]
    assert not [n for n in own if any(n.startswith(p) for p in others)]


def test_each_option_is_declared_in_exactly_one_place():
    """No mirror: the name of every trl_ext option is annotated once across ``trl_ext/trainers/``."""
    names = {f.name for cls in (ExtGRPOConfig, *(c for c, _ in METHOD_CONFIGS)) for f in _own_fields(cls)}
    names -= TRL_FIELDS  # e.g. BASIS re-declares num_generations with default 1 (a TRL field, not an option)
    counts = dict.fromkeys(names, 0)
    for path in TRAINERS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in counts:
                counts[node.target.id] += 1
    assert {n: c for n, c in counts.items() if c != 1} == {}


ALL_CONFIGS = [ExtGRPOConfig, V05GRPOConfig, BASISConfig, PAIRConfig]


@pytest.mark.parametrize("cls", ALL_CONFIGS, ids=lambda c: c.__name__)
def test_class_docstring_does_not_repeat_the_field_help(cls):
    """The help lives in ``metadata={"help": ...}`` (as in TRL's configs); the class docstring is prose that points
    at it, with no numpydoc ``Parameters`` block listing the fields a second time."""
    doc = cls.__doc__ or ""
    assert not re.search(r"^\s*(Parameters|Attributes)\s*\n\s*-{3,}", doc, flags=re.M), \
        f"{cls.__name__} docstring has a Parameters/Attributes block"
    names = {f.name for f in _own_fields(cls)} - TRL_FIELDS
    listed = [n for n in names if re.search(rf"^\s*{n}\s*(,[\w\s,]*)?:", doc, flags=re.M)]
    assert not listed, f"{cls.__name__} docstring lists fields numpydoc-style: {listed}"
    assert "help" in doc, f"{cls.__name__} docstring does not point at the field help"


def test_no_options_mirror_class():
    """No ``*Options`` class re-declares option fields (class-level constants, ``ClassVar``, are not fields)."""
    mirrors = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and re.search(r"Options?$", node.name):
                declared = [b.target.id for b in node.body if isinstance(b, ast.AnnAssign)
                            and isinstance(b.target, ast.Name) and "ClassVar" not in ast.unparse(b.annotation)]
                if declared:
                    mirrors.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} declares {declared}")
    assert not mirrors, mirrors


@pytest.mark.parametrize("cls", [V05GRPOConfig, BASISConfig, PAIRConfig], ids=lambda c: c.__name__)
def test_method_configs_are_ext_configs_with_their_route_as_defaults(tmp_path, cls):
    """A method config is an ExtGRPOConfig whose estimator and strategy default to its method's (``method_route``);
    another estimator or strategy is refused, naming the route and ExtGRPOConfig."""
    kw = {**_kw(tmp_path), **({"num_generations": 1} if cls is BASISConfig else {})}
    if cls is V05GRPOConfig:
        kw.update(num_generations=4, per_device_train_batch_size=8, loss_type="dapo")
    cfg = cls(**kw)
    assert (cfg.advantage_estimator, cfg.rollout_strategy) == cls.method_route and cfg.rollout_strategy_kwargs == {}
    for bad in ({"advantage_estimator": "rloo"}, {"rollout_strategy": "fixed_groups"},
                {"advantage_estimator_kwargs": {"x": 1}}):
        with pytest.raises(ValueError, match=rf"trains with advantage_estimator='{cls.method_route[0]}'.*ExtGRPOConfig"):
            cls(**kw, **bad)


@pytest.mark.parametrize("cls", [ExtGRPOConfig, V05GRPOConfig, BASISConfig, PAIRConfig], ids=lambda c: c.__name__)
def test_one_config_rule(tmp_path, cls):
    extra = {"num_generations": 2, "per_device_train_batch_size": 4}
    if cls is V05GRPOConfig:
        extra = {"num_generations": 4, "per_device_train_batch_size": 8, "loss_type": "dapo"}
    plain = trl.GRPOConfig(**_kw(tmp_path), **extra)
    if cls is BASISConfig:  # BASIS needs one rollout per prompt: the upgrade validates and says so
        with pytest.raises(ValueError, match="num_generations"):
            as_config(plain, cls, "Trainer")
        plain.num_generations = 1
    up = as_config(plain, cls, "Trainer")
    assert type(up) is cls and up.learning_rate == plain.learning_rate
    for f in _own_fields(cls):  # the fields the plain config lacks take the class defaults
        if f.name in TRL_FIELDS:
            continue
        want = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        got = getattr(up, f.name)
        assert got == want or (isinstance(want, str | type(None)) and isinstance(got, dict) and not got), f.name
    own = cls(**_kw(tmp_path), **({"num_generations": 1} if cls is BASISConfig else {}))
    assert as_config(own, cls, "Trainer") is own
    with pytest.raises(TypeError, match=cls.__name__):
        as_config({"learning_rate": 1e-5}, cls, "Trainer")


def _config(cls, tmp_path):
    extra = {"num_generations": 1} if cls is BASISConfig else {}
    if cls is V05GRPOConfig:
        extra = {"num_generations": 4, "per_device_train_batch_size": 8, "loss_type": "dapo"}
    return cls(**_kw(tmp_path), **extra)


@pytest.mark.parametrize("src,dst", [(s, d) for s, _ in METHOD_CONFIGS for d, _ in METHOD_CONFIGS if s is not d],
                         ids=lambda c: c.__name__)
def test_a_sibling_method_config_is_refused(tmp_path, src, dst):
    """Another trainer's method config is not silently upgraded (it would carry its own options along, unused): a
    ``TypeError`` names both classes and says what to pass."""
    with pytest.raises(TypeError) as err:
        as_config(_config(src, tmp_path), dst, "Trainer")
    msg = str(err.value)
    assert src.__name__ in msg and dst.__name__ in msg and f"Pass args={dst.__name__}(...)" in msg


@pytest.mark.parametrize("dst", [c for c, _ in METHOD_CONFIGS], ids=lambda c: c.__name__)
def test_the_base_ext_config_is_upgraded(tmp_path, dst):
    base = ExtGRPOConfig(**_kw(tmp_path), num_generations=4, per_device_train_batch_size=8, loss_type="dapo",
                         log_rollout_metadata=True)
    if dst is BASISConfig:  # the upgrade runs BASIS's validation, which wants one rollout per prompt
        base.num_generations = 1
    up = as_config(base, dst, "Trainer")
    assert type(up) is dst and up.log_rollout_metadata is True
    own = {f.name for f in _own_fields(dst)} - TRL_FIELDS
    assert own <= set(vars(up))  # the method's fields at their defaults
    assert (up.advantage_estimator, up.rollout_strategy) == dst.method_route  # the upgrade takes the method's route
    # a method config given to the base trl_ext.GRPOTrainer is accepted as is: it is an ExtGRPOConfig whose estimator,
    # strategy and options are the method's, so the base trainer runs the method (one route)
    own_cfg = _config(dst, tmp_path)
    assert as_config(own_cfg, ExtGRPOConfig, "GRPOTrainer") is own_cfg


@dataclasses.dataclass
class _ScriptConfig(trl.GRPOConfig):
    """A user's own script config with an extra field (the common TRL pattern)."""

    my_dataset: str = dataclasses.field(default="mine", metadata={"help": "read by the user's script"})


@dataclasses.dataclass
class _ScriptExtConfig(ExtGRPOConfig):
    my_dataset: str = dataclasses.field(default="mine", metadata={"help": "read by the user's script"})


@pytest.mark.parametrize("dst", [ExtGRPOConfig, *(c for c, _ in METHOD_CONFIGS)], ids=lambda c: c.__name__)
@pytest.mark.parametrize("user_cls", [_ScriptConfig, _ScriptExtConfig], ids=lambda c: c.__name__)
def test_a_users_own_config_subclass_is_upgraded_with_its_fields(tmp_path, dst, user_cls):
    cfg = user_cls(**_kw(tmp_path), num_generations=4, per_device_train_batch_size=8, loss_type="dapo",
                   my_dataset="theirs")
    if dst is BASISConfig:  # TRL's config refuses 1 at construction; BASIS's validation (in the upgrade) wants it
        cfg.num_generations = 1
    up = as_config(cfg, dst, "Trainer")
    if isinstance(cfg, dst):  # already the trainer's class (ExtGRPOConfig subclass given to the base trainer)
        assert up is cfg
    else:
        assert type(up) is dst
    assert up.my_dataset == "theirs" and up.learning_rate == cfg.learning_rate


@pytest.mark.parametrize("dst", [c for c, _ in METHOD_CONFIGS], ids=lambda c: c.__name__)
def test_a_users_subclass_of_the_trainers_own_config_is_kept(tmp_path, dst):
    sub = dataclasses.make_dataclass("Mine", [("my_flag", bool, dataclasses.field(default=True))], bases=(dst,))
    cfg = sub(**_kw(tmp_path), **({"num_generations": 1} if dst is BASISConfig else
                                   {"num_generations": 4, "per_device_train_batch_size": 8, "loss_type": "dapo"}))
    assert as_config(cfg, dst, "Trainer") is cfg


ESTIMATOR_FUNCTIONS = {
    "trl_grpo_advantages", "grpo_advantages", "osla_step", "shrinkage_fusion_batch", "fused_advantages_batch",
    "equal_prompt_weights", "std_scale_advantages", "calibrate_beta", "pair_design", "pair_advantages",
    "draw_selection", "scorable_selection", "nanstd", "fixed_normalizer", "standardize_pair_advantages",
    "design_and_draw", "anchor_pair_joint_inclusion", "anchor_marginal_inclusion", "draw_advantages", "simulate_draw",
}
ESTIMATOR_CLASSES = {"PrefixHeads", "DesignWarmStart", "GroupDraw"}


def test_each_equation_is_defined_once_in_estimators():
    import trl_ext.estimators as est

    for name in ESTIMATOR_FUNCTIONS | ESTIMATOR_CLASSES:
        obj = getattr(est, name, None) or getattr(__import__("trl_ext.estimators.pair_heads", fromlist=[name]),
                                                  name, None)
        assert obj is not None, f"trl_ext.estimators has no {name}"
        assert obj.__module__.startswith("trl_ext.estimators"), (name, obj.__module__)
    names = ESTIMATOR_FUNCTIONS | ESTIMATOR_CLASSES
    redefined = []
    for path in TRAINERS.rglob("*.py"):
        if path.name == "_trl_compat.py":  # re-exports TRL's nanstd for the bitwise test, defines nothing else
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in names:
                redefined.append(f"trainers/{path.name}:{node.lineno}: {node.name}")
    assert not redefined, redefined


def test_optional_kwargs_fields_are_typed_as_dict_or_json():
    """Dict-valued options accept a dict or a JSON string (command line) under one parser."""
    for cls in (ExtGRPOConfig, V05GRPOConfig):
        hints = typing.get_type_hints(cls)
        for f in _own_fields(cls):
            if f.name.endswith("_kwargs"):
                assert dict in typing.get_args(hints[f.name]) and str in typing.get_args(hints[f.name]), f.name


def test_a_config_can_name_a_method_strategy_before_any_method_trainer_is_imported(tmp_path):
    """``from trl_ext import ExtGRPOConfig`` alone: the method strategies load on demand when a config names one."""
    import os
    import subprocess
    import sys

    code = ("from trl_ext import ExtGRPOConfig\n"
            f"c = ExtGRPOConfig({str(tmp_path)!r}, use_cpu=True, bf16=False, report_to='none',\n"
            "                  per_device_train_batch_size=16, num_generations=8, advantage_estimator='v05',\n"
            "                  rollout_strategy='v05_osla')\n"
            "print(c.rollout_strategy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT.parent)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "v05_osla"

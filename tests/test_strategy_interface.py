"""The rollout-strategy interface: what an author implements, and the old interface refused instead of ignored.

A strategy returns data (``RolloutGroups``) and learns in ``update``; the base trainer alone replays, gathers, runs
the estimator and calls ``update``. Checked here: the interface has five members an author implements, a class
still written against the interface before trl_ext 0.3 is refused naming each replacement (registration and
trainer construction), the base-trainer hand-off has no hidden slot left after a batch, and a strategy's fixed
normalizer is refused with signal-only denominators.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))

from base_helpers import hash_reward, make_config, make_trainer, tiny_dataset, tiny_model_and_tokenizer  # noqa: E402

from trl_ext.trainers.base import GRPOTrainer  # noqa: E402
from trl_ext.trainers.rollouts import (  # noqa: E402
    REMOVED_MEMBERS,
    FixedGroups,
    RolloutGroups,
    RolloutStrategy,
    register_rollout_strategy,
)


def test_a_strategy_author_implements_at_most_five_members():
    methods = sorted(n for n, v in vars(RolloutStrategy).items()
                     if inspect.isfunction(v) and not n.startswith("_"))
    assert methods == ["describe", "load_state_dict", "rollout", "state_dict", "update"]
    # construction: two classmethods with working defaults (the constructor, accept-all validation)
    assert sorted(n for n, v in vars(RolloutStrategy).items() if isinstance(v, classmethod)) == \
        ["from_trainer", "validate_kwargs"]


@pytest.mark.parametrize("member", sorted(REMOVED_MEMBERS))
def test_a_strategy_written_against_the_old_interface_is_refused(member):
    old = type("Old", (FixedGroups,), {member: lambda self, *a: None})
    with pytest.raises(TypeError, match=rf"\['{member}'\].*{member} -> "):
        register_rollout_strategy(f"old_{member}")(old)


def test_an_unregistered_old_strategy_is_refused_at_construction(tmp_path):
    class Old(FixedGroups):
        def generate_and_score(self, trainer, inputs):  # never called by the base: refused, not ignored
            raise AssertionError

    class Trainer(GRPOTrainer):
        def create_rollout_strategy(self):
            return Old()

    with pytest.raises(TypeError, match=r"generate_and_score -> rollout\(api, rows\) returning RolloutGroups"):
        make_trainer(tmp_path, cls=Trainer)


def test_one_batch_leaves_no_hand_off_behind(tmp_path):
    """The one scoped call context is cleared after every generation batch; the batch carries what the strategy
    handed over (record, estimator inputs, fixed normalizer)."""

    class Recorded(RolloutStrategy):
        name = "recorded"

        def __init__(self):
            self.seen = []

        def rollout(self, api, rows):
            return RolloutGroups.trl(record={"rows": len(rows), "mode": api.mode})

        def update(self, api, batch, result):
            self.seen.append(batch.record)
            return {"recorded/rows": float(batch.record["rows"])}

    class Trainer(GRPOTrainer):
        def create_rollout_strategy(self):
            return Recorded()

    tr = make_trainer(tmp_path, cls=Trainer, max_steps=2)
    tr.train()
    assert tr._ext_call is None
    assert [s["mode"] for s in tr.rollout_strategy.seen] == ["train", "train"]
    assert tr.last_rollout_batch.record == tr.rollout_strategy.seen[-1]
    assert all("recorded/rows" in rec for rec in tr.state.log_history if "loss" in rec)


def test_fixed_normalizer_and_signal_only_denominators_are_refused(tmp_path):
    class Fixed(RolloutStrategy):
        name = "fixed_k"

        def rollout(self, api, rows):
            return RolloutGroups.trl(fixed_normalizer=2.0)

    class Trainer(GRPOTrainer):
        def create_rollout_strategy(self):
            return Fixed()

    tr = make_trainer(tmp_path, cls=Trainer, signal_only_denominator=True)
    with pytest.raises(ValueError, match="fixed policy normalizer.*signal_only_denominator=False"):
        tr.train()


# ----------------------------------------------------------------------------------------------- validation once
def _count_validations(monkeypatch) -> dict:
    """Count the shared rules (``validate_ext_config``), each class's method rules (``validate_method``) and the
    V0.5 / PAIR option rules (``validate_v05_options``, ``validate_pair_options``, keyed ``"options"``) by the id of
    the config object they ran on."""
    from trl_ext import BASISConfig, ExtGRPOConfig, PAIRConfig, V05GRPOConfig
    from trl_ext.trainers import config as config_module
    from trl_ext.trainers.pair import config as pair_config
    from trl_ext.trainers.pair import strategy as pair_strategy
    from trl_ext.trainers.v05 import config as v05_config
    from trl_ext.trainers.v05 import strategy as v05_strategy

    counts: dict = {}
    real = config_module.validate_ext_config

    def shared(o):
        counts.setdefault(("shared", id(o)), 0)
        counts[("shared", id(o))] += 1
        return real(o)

    monkeypatch.setattr(config_module, "validate_ext_config", shared)
    for cls in (ExtGRPOConfig, V05GRPOConfig, PAIRConfig, BASISConfig):
        method = vars(cls)["validate_method"]

        def counted(self, _method=method, _cls=cls):
            counts.setdefault((_cls.__name__, id(self)), 0)
            counts[(_cls.__name__, id(self))] += 1
            return _method(self)

        monkeypatch.setattr(cls, "validate_method", counted)
    for name, modules in (("validate_v05_options", (v05_config, v05_strategy)),
                          ("validate_pair_options", (pair_config, pair_strategy))):
        def options_rules(o, args, _real=getattr(modules[0], name)):
            counts.setdefault(("options", id(args)), 0)
            counts[("options", id(args))] += 1
            return _real(o, args)

        for module in modules:
            monkeypatch.setattr(module, name, options_rules)
    return counts


@pytest.mark.parametrize("route", ["base", "v05_preset", "v05_by_config", "pair_preset", "pair_by_config", "basis"])
def test_validation_runs_once_per_config_object(monkeypatch, tmp_path, route):
    """Every config object is validated exactly once (shared rules, then its own class's rules); V0.5's and PAIR's
    option rules run once on it, whether the options are the method config's fields or ``rollout_strategy_kwargs``;
    the trainer validates nothing again."""
    from trl_ext import BASISConfig, PAIRConfig, PAIRTrainer, V05GRPOConfig, V05GRPOTrainer

    counts = _count_validations(monkeypatch)
    common = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, max_completion_length=6, use_cpu=True,
                  report_to="none", max_steps=1, save_strategy="no")
    if route == "base":
        cfg, cls = make_config(tmp_path), GRPOTrainer
    elif route == "v05_preset":
        cfg, cls = V05GRPOConfig(**common, loss_type="dapo", v05_value_prior="constant"), V05GRPOTrainer
    elif route == "v05_by_config":
        cfg, cls = make_config(tmp_path, advantage_estimator="v05", rollout_strategy="v05_osla", loss_type="dapo",
                               rollout_strategy_kwargs={"value_prior": "constant"}), GRPOTrainer
    elif route == "pair_preset":
        cfg, cls = PAIRConfig(**common, num_generations=4, pair_prefix_tokens=2), PAIRTrainer
    elif route == "pair_by_config":
        cfg, cls = make_config(tmp_path, advantage_estimator="pair_draw", rollout_strategy="pair_prefix_probe",
                               max_completion_length=6, rollout_strategy_kwargs={"prefix_tokens": 2}), GRPOTrainer
    else:
        cfg, cls = BASISConfig(**common, num_generations=1), None
    own = type(cfg).__name__
    assert counts.pop(("shared", id(cfg))) == 1 and counts.pop((own, id(cfg))) == 1, counts
    if route.startswith(("v05", "pair")):  # the typed options' rules: once, on this config, by either route
        assert counts.pop(("options", id(cfg))) == 1, counts
    assert counts == {}, counts
    if cls is None:
        return
    counts.clear()
    model, tok = tiny_model_and_tokenizer(0)
    cls(model=model, reward_funcs=[hash_reward], args=cfg, train_dataset=tiny_dataset(16), processing_class=tok)
    assert counts == {}, f"the trainer validated again: {counts}"


# ----------------------------------------------------------------------------------------------- one route per method
def _method_config(method: str, tmp_path):
    import zlib

    from trl_ext import BASISConfig, PAIRConfig, V05GRPOConfig
    from trl_ext.priors.table_format import ValueTable, ValueTableRow, save_value_table

    common = dict(output_dir=str(tmp_path / "out"), max_completion_length=5, max_steps=2, learning_rate=1e-3,
                  use_cpu=True, report_to="none", beta=0.0, logging_steps=1, save_strategy="no", seed=0,
                  disable_tqdm=True)
    if method == "v05":  # a rejected constant prior: the OSLA rounds run
        return V05GRPOConfig(**common, per_device_train_batch_size=16, num_generations=4, loss_type="dapo",
                             v05_value_prior="constant", v05_value_prior_kwargs={"p": 0.9})
    if method == "basis":
        path = tmp_path / "table.jsonl"
        if not path.exists():
            rows = [ValueTableRow.from_rewards(p, [1.0] * (1 + zlib.crc32(p.encode()) % 7) +
                                               [0.0] * (7 - zlib.crc32(p.encode()) % 7), (0.0, 1.0))
                    for p in tiny_dataset(16)["prompt"]]
            save_value_table(str(path), ValueTable(rows, {"reward_funcs": ["hash_reward"]}))
        return BASISConfig(**common, per_device_train_batch_size=8, num_generations=1,
                           basis_value_table_path=str(path))
    return PAIRConfig(**common, per_device_train_batch_size=16, num_generations=8, pair_prefix_tokens=2,
                      pair_head_min_labels=8, pair_lr_scaling="none")


@pytest.mark.parametrize("method", ["v05", "basis", "pair"])
def test_the_base_trainer_runs_a_method_config_as_the_method_trainer(tmp_path, method):
    """One route per method: a method config is an ExtGRPOConfig with the method's estimator, strategy and options,
    so ``trl_ext.GRPOTrainer`` trains it exactly as the method's named trainer (same rollouts, advantages and
    weights after two steps)."""
    import warnings

    import torch

    from trl_ext import BASISTrainer, PAIRTrainer, V05GRPOTrainer

    named = {"v05": V05GRPOTrainer, "basis": BASISTrainer, "pair": PAIRTrainer}[method]
    runs = []
    for cls in (named, GRPOTrainer):
        model, tok = tiny_model_and_tokenizer(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PAIR's short-probe warning
            tr = cls(model=model, reward_funcs=[hash_reward], args=_method_config(method, tmp_path),
                     train_dataset=tiny_dataset(16), processing_class=tok)
            tr.train()
        assert tr.rollout_strategy.name == tr.args.rollout_strategy
        runs.append((tr.last_advantages, tr.state.log_history[-2]["ext/generated_tokens_total"],
                     sum(float(p.detach().double().sum()) for p in tr.model.parameters())))
    (adv_a, tok_a, w_a), (adv_b, tok_b, w_b) = runs
    assert torch.equal(adv_a, adv_b) and tok_a == tok_b and w_a == pytest.approx(w_b, rel=1e-9)
    assert adv_a.abs().sum() > 0


def test_the_base_trainer_rescales_a_pair_config_as_pair_trainer(tmp_path):
    """The learning-rate scaling is the config's (``PAIRConfig.optimizer_lr_factor``), applied by the base trainer's
    ``create_optimizer``: ``trl_ext.GRPOTrainer`` and ``PAIRTrainer`` build the same scaled optimizer from a
    ``PAIRConfig`` and say so once; an ``ExtGRPOConfig`` keeps TRL's rate."""
    from trl_ext import DropInDifferenceWarning, PAIRTrainer

    rates, said = [], []
    for cls in (GRPOTrainer, PAIRTrainer):
        cfg = _method_config("pair", tmp_path / cls.__name__)
        cfg.pair_lr_scaling, cfg.lr_scheduler_type = "sqrt_budget", "constant"
        model, tok = tiny_model_and_tokenizer(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tr = cls(model=model, reward_funcs=[hash_reward], args=cfg, train_dataset=tiny_dataset(16),
                     processing_class=tok)
        said.append([str(w.message) for w in caught if issubclass(w.category, DropInDifferenceWarning)
                     and "optimizer learning rate" in str(w.message)])
        tr.create_optimizer()
        rates.append([g["lr"] for g in tr.optimizer.param_groups])
    assert rates[0] == rates[1] and all(r == pytest.approx(1e-3 * 0.5 ** 0.5) for r in rates[0])
    assert [len(s) for s in said] == [1, 1] and "pair_lr_scaling='none'" in said[0][0]
    tr = make_trainer(tmp_path / "ext")
    tr.create_optimizer()
    assert all(g["lr"] == pytest.approx(1e-3) for g in tr.optimizer.param_groups)


# ----------------------------------------------------------------------------------------------- self-registration
def test_method_strategies_register_themselves_through_entry_points():
    """The base holds no table of method names: the method strategies are declared in the entry-point group and a
    config names them before their module is imported; building a base config imports no method module."""
    import subprocess
    from importlib.metadata import entry_points

    from trl_ext.trainers import rollouts

    declared = {ep.name: ep.value for ep in entry_points(group=rollouts.ENTRY_POINT_GROUP)}
    assert declared == {"value_table": "trl_ext.trainers.basis.strategy:ValueTableLookup",
                        "v05_osla": "trl_ext.trainers.v05.strategy:OSLARounds",
                        "pair_prefix_probe": "trl_ext.trainers.pair.strategy:PrefixProbeRollouts"}
    assert not hasattr(rollouts, "METHOD_STRATEGY_MODULES")
    code = (
        "import sys\n"
        "from trl_ext import ExtGRPOConfig\n"
        "ExtGRPOConfig('out', use_cpu=True, per_device_train_batch_size=8, report_to='none')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('trl_ext.trainers.v05', 'trl_ext.trainers.pair',"
        " 'trl_ext.trainers.basis')))\n"
        "assert loaded == [], loaded\n"
        "from trl_ext.trainers.rollouts import get_rollout_strategy\n"
        "assert get_rollout_strategy('v05_osla').__name__ == 'OSLARounds'\n"
        "assert 'trl_ext.trainers.v05.strategy' in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_method_checkpoint_from_before_the_route_fields_resumes():
    """Checkpoints of method configs written before the configs carried their route recorded
    advantage_estimator="grpo" and rollout_strategy=None for the same run: resuming accepts them as the route; any
    other recorded estimator is still a refused change."""
    import json
    from types import SimpleNamespace

    from trl_ext.checkpoints.resume import check_resumed_config

    args = SimpleNamespace(method_route=("v05", "v05_osla"), resume_config_changes=[])
    current = {"advantage_estimator": "v05", "rollout_strategy": "v05_osla", "learning_rate": 1e-3}
    old = {**current, "advantage_estimator": "grpo", "rollout_strategy": None}
    state = {"config_fingerprint": json.dumps(old)}
    assert check_resumed_config(state, current, args, None, None, "ckpt", 3) == {}
    other = {"config_fingerprint": json.dumps({**old, "advantage_estimator": "rloo"})}
    with pytest.raises(ValueError, match="advantage_estimator"):
        check_resumed_config(other, current, args, None, None, "ckpt", 3)


# ----------------------------------------------------------------------------------------------- typed method options
@pytest.mark.parametrize("method", ["v05", "pair", "basis"])
def test_typed_method_options_mirror_the_method_config_and_agree_across_routes(tmp_path, method):
    """``V05Options`` / ``PAIROptions`` are the method config's prefixed fields without the prefix (same defaults and
    help, generated so they cannot drift); a method config and the same options given as
    ``rollout_strategy_kwargs`` give equal option objects; an unknown key is refused naming the known ones; a strategy
    holds the typed object, never a config."""
    from dataclasses import MISSING, fields

    from trl_ext import BASISConfig, PAIRConfig, V05GRPOConfig
    from trl_ext.trainers.basis import BASISOptions
    from trl_ext.trainers.pair import PAIROptions
    from trl_ext.trainers.pair.config import pair_kwargs_options
    from trl_ext.trainers.v05 import V05Options

    config_cls, options_cls, prefix = {"v05": (V05GRPOConfig, V05Options, "v05_"),
                                       "pair": (PAIRConfig, PAIROptions, "pair_"),
                                       "basis": (BASISConfig, BASISOptions, "basis_")}[method]
    own = {f.name[len(prefix):]: f for f in fields(config_cls) if f.name.startswith(prefix)}
    typed = {f.name: f for f in fields(options_cls)}
    assert set(own) == set(typed) and len(typed) >= 10
    for name, f in typed.items():
        g = own[name]
        assert f.metadata["help"] == g.metadata["help"], name
        assert (f.default if f.default is not MISSING else f.default_factory()) == (
            g.default if g.default is not MISSING else g.default_factory()), name
    common = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, max_completion_length=6, use_cpu=True,
                  report_to="none", num_generations=4)
    if method == "v05":
        preset = V05GRPOConfig(**common, loss_type="dapo", v05_k_init=4, v05_value_prior="constant")
        by_kwargs = V05Options.from_kwargs({"k_init": 4, "value_prior": "constant"})
        bad = {"kinit": 4}
    elif method == "pair":
        preset = PAIRConfig(**common, pair_prefix_tokens=2, pair_budget_ratio=0.6, pair_lr_scaling="none")
        by_kwargs = pair_kwargs_options({"prefix_tokens": 2, "budget_ratio": 0.6})
        bad = {"budjet_ratio": 0.6}
    else:
        preset = BASISConfig(**{**common, "num_generations": 1}, basis_value_table_path="t.jsonl", basis_eps=0.01)
        by_kwargs = BASISOptions.from_kwargs({"value_table_path": "t.jsonl", "eps": 0.01})
        bad = {"objectiv": "paper"}
    assert options_cls.from_config(preset) == by_kwargs
    assert options_cls.of(preset, {}) == by_kwargs
    with pytest.raises(ValueError, match=rf"unknown rollout_strategy_kwargs \['{next(iter(bad))}'\]; known: \["):
        options_cls.from_kwargs(bad)
    if method == "v05":  # dict-valued options given as JSON (the command line) are parsed once, by the options
        assert V05Options.from_kwargs({"value_prior_kwargs": '{"p": 0.3}'}).value_prior_kwargs == {"p": 0.3}
        with pytest.raises(ValueError, match="v05_value_prior_kwargs must be a dict"):
            V05Options.from_kwargs({"value_prior_kwargs": "[1]"})
    if method == "basis":  # its strategy holds the estimator's options (a table is needed to build one)
        return
    model, tok = tiny_model_and_tokenizer(0)
    tr = GRPOTrainer(model=model, reward_funcs=[hash_reward], args=make_config(
        tmp_path, loss_type="dapo", max_completion_length=6, advantage_estimator="v05" if method == "v05" else "pair_draw",
        rollout_strategy="v05_osla" if method == "v05" else "pair_prefix_probe",
        rollout_strategy_kwargs={"k_init": 4, "value_prior": "constant"} if method == "v05" else
        {"prefix_tokens": 2, "budget_ratio": 0.6}), train_dataset=tiny_dataset(16), processing_class=tok)
    assert tr.rollout_strategy.options == by_kwargs and isinstance(tr.rollout_strategy.options, options_cls)

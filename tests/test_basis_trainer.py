"""BASISTrainer / BASISConfig : G = 1 training with the BASIS baseline.

CPU-fast: the testbed's tiny untrained Llama, ``max_completion_length`` 4-5, 1-2 steps. Value tables are written
with the table format directly (deterministic per-prompt reference samples), so nothing depends on the table
builder. The two-rank test runs ``torchrun --standalone --nproc_per_node 2`` with ``ACCELERATE_DEBUG_MODE=1``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import warnings
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
from base_helpers import binary_reward, tiny_dataset, tiny_model_and_tokenizer  # noqa: E402

from trl_ext.estimators.basis import (  # noqa: E402
    calibrate_beta,
    default_beta_grid,
    std_scale_advantages,
    v_beta,
    v_beta_from_samples,
)
from trl_ext.priors.table_checks import check_table_coverage  # noqa: E402
from trl_ext.priors.table_format import ValueTable, ValueTableRow, save_value_table  # noqa: E402
from trl_ext.trainers.base import EXT_STATE_FILE  # noqa: E402
from trl_ext.trainers.basis import BASIS_METRICS, BASISConfig, BASISTrainer  # noqa: E402
from trl_ext.trainers.batch import RolloutBatch  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "basis_two_rank.py")


# ------------------------------------------------------------------------------------------------------ helpers
def ref_rewards(prompt, n: int = 8) -> list[float]:
    """Deterministic reference samples with pass rate k/n, k in 1..n-1 (every prompt active)."""
    k = 1 + zlib.crc32(("t" + str(prompt)).encode()) % (n - 1)
    return [1.0] * k + [0.0] * (n - k)


def make_table(prompts, rewards_fn=ref_rewards, reward_range=(0.0, 1.0), reward_funcs=("binary_reward",),
               store_rewards=True, **meta) -> ValueTable:
    rows = []
    for p in prompts:
        r = rewards_fn(p)
        if store_rewards:
            rows.append(ValueTableRow.from_rewards(p, r, reward_range))
        else:
            from trl_ext.priors.table_format import prompt_key

            rows.append(ValueTableRow(prompt_key=prompt_key(p), n=len(r), mean_reward=sum(r) / len(r),
                                      reward_range=reward_range, prompt=p))
    return ValueTable(rows, {"reward_funcs": list(reward_funcs), **meta})


def basis_config(tmp_path, **overrides) -> BASISConfig:
    kw = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_completion_length=5, max_steps=2,
              learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none", beta=0.0, logging_steps=1,
              save_strategy="no", seed=0, temperature=1.0, dataloader_num_workers=0, disable_tqdm=True)
    kw.update(overrides)
    return BASISConfig(**kw)


def make_basis(tmp_path, table=None, reward_funcs=None, n_rows: int = 16, dataset=None, model=None, **overrides):
    torch.set_num_threads(1)
    ds = dataset if dataset is not None else tiny_dataset(n_rows)
    if model is None:
        model, tok = tiny_model_and_tokenizer(0)
    else:
        tok = tiny_model_and_tokenizer(0)[1]
    table = make_table(ds["prompt"]) if table is None else table
    return BASISTrainer(model=model, reward_funcs=reward_funcs or [binary_reward], args=basis_config(tmp_path, **overrides),
                        train_dataset=ds, processing_class=tok, value_table=table)


def make_batch(trainer, prompts, rewards, is_pad=None, mode="train") -> RolloutBatch:
    """A global batch as the base builds it: ``p_hat`` and the estimator options from the trainer's value-table
    strategy (its ``rollout``)."""
    n = len(prompts)
    r = torch.tensor(rewards, dtype=torch.float32)
    pad = torch.zeros(n, dtype=torch.bool) if is_pad is None else torch.tensor(is_pad)
    gid = torch.arange(n, dtype=torch.long)
    gid[pad] = -1
    r[pad] = float("nan")
    groups = trainer.rollout_strategy.rollout(trainer.rollout_api, [{"prompt": p} for p in prompts])
    return RolloutBatch(rewards=r, rewards_per_func=r.unsqueeze(1).clone(), group_ids=gid,
                        row_idx=torch.arange(n, dtype=torch.long), prompts=list(prompts),
                        completion_lengths=torch.ones(n, dtype=torch.long), is_pad=pad, mode=mode,
                        side_inputs={k: np.asarray(v, dtype=np.float64) for k, v in groups.side_inputs.items()},
                        estimator_inputs=groups.estimator_inputs)


def last_metric(trainer, name, mode="train"):
    return trainer._metrics[mode][name][-1]


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def max_change(before, model):
    return max(float((a - b.detach()).abs().max()) for a, b in zip(before, model.parameters()))


# ------------------------------------------------------------------------------------------------------ config
def test_config_accepts_one_generation_where_trl_refuses(tmp_path):
    import trl

    with pytest.raises(ValueError, match="at least 2 generations"):
        trl.GRPOConfig(output_dir=str(tmp_path), num_generations=1, per_device_train_batch_size=8, use_cpu=True,
                       bf16=False, report_to="none")
    cfg = basis_config(tmp_path)
    assert cfg.num_generations == 1
    assert cfg.num_generations_eval is None
    assert cfg.generation_batch_size == 8 and cfg.steps_per_generation == 1
    cfg = basis_config(tmp_path, per_device_train_batch_size=3, generation_batch_size=9, num_generations_eval=3)
    assert (cfg.num_generations, cfg.num_generations_eval, cfg.steps_per_generation) == (1, 3, 3)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pdbs=st.integers(1, 6), spg=st.integers(1, 3))
def test_config_generation_batch_any_size(tmp_path, pdbs, spg):
    """Any generation batch of >= 2 prompts is accepted (odd sizes included); a single prompt is refused."""
    if pdbs * spg < 2 and int(os.environ.get("WORLD_SIZE", "1")) < 2:
        with pytest.raises(ValueError, match="at least 2 prompts"):
            basis_config(tmp_path, per_device_train_batch_size=pdbs, steps_per_generation=spg)
        return
    cfg = basis_config(tmp_path, per_device_train_batch_size=pdbs, steps_per_generation=spg)
    assert cfg.num_generations == 1
    assert cfg.generation_batch_size == pdbs * spg


@pytest.mark.parametrize("overrides, match", [
    ({"num_generations": 2}, "num_generations must be 1"),
    ({"num_generations": None}, "num_generations must be 1"),
    ({"basis_variant": "blue"}, "basis_variant"),
    ({"basis_objective": "mse"}, "basis_objective"),
    ({"basis_fallback": "mean"}, "basis_fallback"),
    ({"basis_eps": 0.5}, "basis_eps"),
    ({"basis_eps": -1e-3}, "basis_eps"),
    ({"basis_min_active_fraction": 1.5}, "basis_min_active_fraction"),
    ({"basis_max_missing_fraction": -0.1}, "basis_max_missing_fraction"),
    ({"basis_max_missing_fraction": 2.0}, "basis_max_missing_fraction"),
    ({"basis_beta_grid": [0.5, 0.1]}, "basis_beta_grid"),
    ({"basis_beta_grid": []}, "basis_beta_grid"),
    ({"basis_beta_grid": [0.0, 1.0]}, "basis_beta_grid"),
    ({"basis_beta_grid": [0.1, float("nan")]}, "basis_beta_grid"),
])
def test_config_rejects_bad_options(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        basis_config(tmp_path, **overrides)


# ------------------------------------------------------------------------------------------------------ training
def test_g1_training_changes_weights_while_trl_g1_does_not(tmp_path):
    import trl

    # plain TRL, G forced to 1 after init (its config refuses 1): every advantage is 0 -> no update at all
    torch.set_num_threads(1)
    model, tok = tiny_model_and_tokenizer(0)
    cfg = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=8, num_generations=2,
                         max_completion_length=5, max_steps=2, learning_rate=1e-3, use_cpu=True, bf16=False,
                         report_to="none", beta=0.0, logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True)
    plain = trl.GRPOTrainer(model=model, reward_funcs=[binary_reward], args=cfg, train_dataset=tiny_dataset(16),
                            processing_class=tok)
    plain.num_generations = 1
    trl_adv = []
    orig = plain._generate_and_score_completions

    def record(inputs):
        out = orig(inputs)
        trl_adv.append(out["advantages"].clone())
        return out

    plain._generate_and_score_completions = record
    before = params(plain.model)
    plain.train()
    assert len(trl_adv) == 2
    assert all(bool((a == 0).all()) for a in trl_adv)
    assert max_change(before, plain.model) == 0.0

    # BASIS, G = 1: same model, same data, same reward -> non-zero advantages and a real update
    trainer = make_basis(tmp_path)
    before = params(trainer.model)
    trainer.train()
    batch = trainer.last_rollout_batch
    assert batch.num_rows == 8 and len(set(batch.prompts)) == 8  # one rollout per prompt, unique prompts
    assert bool((trainer.last_advantages != 0).any())
    assert max_change(before, trainer.model) > 0.0
    assert len(trainer.rollout_strategy.beta_history) == 2 and trainer.rollout_strategy.beta_history_steps == [0, 1]
    assert all(b in set(default_beta_grid().tolist()) for b in trainer.rollout_strategy.beta_history)
    logged = [h for h in trainer.state.log_history if "basis/beta" in h]
    assert len(logged) == 2 and all(set(BASIS_METRICS) <= set(h) for h in logged)


def test_trainer_advantages_equal_estimator_on_gathered_batch(tmp_path):
    trainer = make_basis(tmp_path, max_steps=1)
    table = trainer.rollout_strategy.table
    trainer.train()
    batch = trainer.last_rollout_batch
    r = batch.rewards.double().numpy()
    p = np.array([table.lookup(x).success_probability for x in batch.prompts])
    cal = calibrate_beta(r, p)
    np.testing.assert_allclose(trainer.last_advantages.numpy(), r - cal.baseline, atol=1e-6)
    assert trainer.rollout_strategy.beta_history[-1] == cal.beta
    logged = [h for h in trainer.state.log_history if "basis/mean_sq_advantage" in h][-1]
    assert logged["basis/mean_sq_advantage"] == pytest.approx(np.mean((r - cal.baseline) ** 2), rel=1e-5)
    assert logged["basis/beta"] == cal.beta


# ------------------------------------------------------------------------------------------------------ compute_advantages
PROMPTS = [f"{a}+{a + 1}=" for a in range(8)]
REWARDS = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]


def _unit_trainer(tmp_path, table_prompts=PROMPTS, **kw):
    from datasets import Dataset

    ds = Dataset.from_dict({"prompt": PROMPTS})
    table = kw.pop("table", None) or make_table(table_prompts)
    return make_basis(tmp_path, table=table, dataset=ds, **kw)


def test_missing_prompts_error_above_limit(tmp_path):
    trainer = _unit_trainer(tmp_path, table_prompts=PROMPTS[3:], basis_max_missing_fraction=0.25)  # 3/8 missing
    with pytest.warns(UserWarning, match="missing from the value table"):
        check_table_coverage(trainer.rollout_strategy.table, trainer.train_dataset,
                             trainer.args.basis_max_missing_fraction)
    with pytest.raises(ValueError, match=r"3 of the 8 prompts .* missing from the value table"):
        trainer.compute_advantages(make_batch(trainer, PROMPTS, REWARDS))


@pytest.mark.parametrize("fallback", ["zero", "batch_mean", "value"])
def test_missing_prompts_fallback_counted(tmp_path, fallback):
    trainer = _unit_trainer(tmp_path, table_prompts=PROMPTS[2:], basis_max_missing_fraction=0.25, basis_fallback=fallback)
    adv = trainer.compute_advantages(make_batch(trainer, PROMPTS, REWARDS)).double().numpy()
    r = np.array(REWARDS)
    if fallback == "batch_mean":
        expected = [r[i] - np.delete(r, i).mean() for i in range(2)]
    else:  # zero, and value (0 when missing)
        expected = r[:2]
    np.testing.assert_allclose(adv[:2], expected, atol=1e-6)
    assert last_metric(trainer, "basis/missing_count") == 2
    assert last_metric(trainer, "basis/missing_fraction") == 0.25
    assert last_metric(trainer, "basis/fallback_count") >= 2
    assert trainer.rollout_strategy.totals["missing_total"] == 2
    # the present prompts get the estimator's baseline with the missing ones as NaN values
    p = np.array([np.nan, np.nan] + [trainer.rollout_strategy.table.lookup(x).success_probability for x in PROMPTS[2:]])
    cal = calibrate_beta(r, p, fallback=fallback)
    np.testing.assert_allclose(adv, r - cal.baseline, atol=1e-6)


def test_pad_and_nan_rows(tmp_path):
    trainer = _unit_trainer(tmp_path)
    ref = trainer.compute_advantages(make_batch(trainer, PROMPTS, REWARDS)).numpy()
    # pad rows (copies of the last prompt, NaN reward) change nothing and are not counted
    padded = trainer.compute_advantages(make_batch(trainer, PROMPTS + ["not in table"] * 2, REWARDS + [0.0, 0.0],
                                                   is_pad=[False] * 8 + [True] * 2)).numpy()
    np.testing.assert_array_equal(padded[:8], ref)
    assert (padded[8:] == 0).all() and last_metric(trainer, "basis/missing_count") == 0
    # a NaN (unscorable) reward: advantage 0, excluded as a source
    r = list(REWARDS)
    r[3] = float("nan")
    adv = trainer.compute_advantages(make_batch(trainer, PROMPTS, r)).double().numpy()
    assert adv[3] == 0 and np.isfinite(adv).all()
    p = np.array([trainer.rollout_strategy.table.lookup(x).success_probability for x in PROMPTS])
    cal = calibrate_beta(np.array(r), p)
    keep = np.arange(8) != 3
    np.testing.assert_allclose(adv[keep], np.array(r)[keep] - cal.baseline[keep], atol=1e-6)


def test_empty_active_set_uses_fallback(tmp_path):
    table = make_table(PROMPTS, rewards_fn=lambda p: [float(int(p.split("+")[0]) % 2)] * 8)  # p_hat in {0, 1}
    trainer = _unit_trainer(tmp_path, table=table)
    adv = trainer.compute_advantages(make_batch(trainer, PROMPTS, REWARDS)).numpy()
    np.testing.assert_allclose(adv, REWARDS)  # zero baseline everywhere
    assert last_metric(trainer, "basis/active_fraction") == 0
    assert last_metric(trainer, "basis/fallback_count") == 8
    assert last_metric(trainer, "basis/frac_baseline_0_or_1") == 1.0


def test_reward_outside_table_range_raises(tmp_path):
    trainer = _unit_trainer(tmp_path)
    with pytest.raises(ValueError, match="outside the value table's reward_range"):
        trainer.compute_advantages(make_batch(trainer, PROMPTS, [2.0] + REWARDS[1:]))


def test_signed_reward_range_maps_back(tmp_path):
    table = make_table(PROMPTS, rewards_fn=lambda p: [2 * x - 1 for x in ref_rewards(p)], reward_range=(-1.0, 1.0))
    trainer = _unit_trainer(tmp_path, table=table)
    r = np.array([2 * x - 1 for x in REWARDS])
    adv = trainer.compute_advantages(make_batch(trainer, PROMPTS, r.tolist())).double().numpy()
    p = np.array([table.lookup(x).success_probability for x in PROMPTS])
    cal = calibrate_beta((r + 1) / 2, p)
    np.testing.assert_allclose(adv, r - (-1 + 2 * cal.baseline), atol=1e-6)


def test_non_binary_rewards(tmp_path):
    def graded(p):  # rewards in {0, 0.5, 1}
        k = zlib.crc32(str(p).encode()) % 5
        return [0.5] * k + [1.0] * 2 + [0.0] * (6 - k)

    r = [0.5, 0.0, 1.0, 0.5, 0.5, 1.0, 0.0, 0.5]
    # samples stored: the (N, K) plug-in V_beta table (Proposition 2) is used
    table = make_table(PROMPTS, rewards_fn=graded)
    trainer = _unit_trainer(tmp_path, table=table)
    adv = trainer.compute_advantages(make_batch(trainer, PROMPTS, r)).double().numpy()
    vt = v_beta_from_samples([graded(p) for p in PROMPTS], default_beta_grid())
    cal = calibrate_beta(np.array(r), vt)
    np.testing.assert_allclose(adv, np.array(r) - cal.baseline, atol=1e-6)
    # only pass rates stored: binary closed form, with a warning
    table = make_table(PROMPTS, rewards_fn=graded, store_rewards=False)
    trainer = _unit_trainer(tmp_path, table=table)
    with pytest.warns(UserWarning, match="only binary statistics"):
        trainer.compute_advantages(make_batch(trainer, PROMPTS, r))


def test_scale_advantages_and_eval_mode(tmp_path):
    trainer = _unit_trainer(tmp_path, basis_scale_advantages=True)
    adv = trainer.compute_advantages(make_batch(trainer, PROMPTS, REWARDS)).double().numpy()
    assert np.std(adv, ddof=1) == pytest.approx(1.0, abs=1e-2)
    assert len(trainer.rollout_strategy.beta_history) == 1
    trainer.compute_advantages(make_batch(trainer, PROMPTS, REWARDS, mode="eval"))
    assert len(trainer.rollout_strategy.beta_history) == 1  # eval batches are calibrated and logged, not recorded
    assert "basis/beta" in trainer._metrics["eval"]


def test_scaled_advantages_come_from_the_estimator_function(tmp_path, monkeypatch):
    import trl_ext.estimators.basis as basis_estimator_package

    table = make_table(PROMPTS, rewards_fn=lambda p: [2 * x - 1 for x in ref_rewards(p)], reward_range=(-1.0, 1.0))
    trainer = _unit_trainer(tmp_path, table=table, basis_scale_advantages=True)
    r = np.array([2 * x - 1 for x in REWARDS])
    r[3] = np.nan
    batch = make_batch(trainer, PROMPTS + ["pad"], r.tolist() + [0.0], is_pad=[False] * 8 + [True])
    # expected: the estimator's std_scale_advantages on r - b, with b mapped back to the reward scale [-1, 1]
    fin = ~np.isnan(r)
    p = np.array([table.lookup(x).success_probability for x in PROMPTS])
    cal = calibrate_beta((r + 1) / 2, p)
    raw = np.where(fin, r - (-1 + 2 * cal.baseline), 0.0)
    expected, scale = std_scale_advantages(raw, fin, eps=1e-4)
    assert scale != 1.0 and not np.allclose(expected, raw)
    adv = trainer.compute_advantages(batch).double().numpy()
    np.testing.assert_allclose(adv[:8], expected, rtol=1e-6, atol=1e-6)
    assert adv[3] == 0.0 and adv[8] == 0.0
    # the trainer must call the estimator function (one implementation): a marked output comes back unchanged. The
    # registered "basis" estimator looks it up on its package; it sees the real rows (the pad row removed, the
    # unscorable row kept: registered with sees_unscorable)
    calls = []

    def spy(advantages, valid=None, eps=1e-4):
        calls.append((np.array(advantages), np.array(valid), eps))
        out, s = std_scale_advantages(advantages, valid, eps)
        return np.where(valid, out + 100.0, 0.0), s

    monkeypatch.setattr(basis_estimator_package, "std_scale_advantages", spy)
    marked = trainer.compute_advantages(batch).double().numpy()
    assert len(calls) == 1 and calls[0][2] == 1e-4
    np.testing.assert_allclose(calls[0][0], raw, atol=1e-12)
    np.testing.assert_array_equal(calls[0][1], fin)
    np.testing.assert_allclose(marked[:8], np.where(fin, expected + 100.0, 0.0), rtol=1e-6, atol=1e-5)
    monkeypatch.undo()
    # a single finite reward: the std is undefined and r - b is returned unscaled (as before the refactor)
    lone = [float("nan")] * 8
    lone[2] = 1.0
    adv = trainer.compute_advantages(make_batch(trainer, PROMPTS, lone)).double().numpy()
    cal = calibrate_beta((np.array(lone) + 1) / 2, p)
    assert adv[2] == pytest.approx(1.0 - (-1 + 2 * cal.baseline[2]), abs=1e-6)
    assert np.count_nonzero(adv) <= 1


def test_batch_without_a_scorable_row_is_recorded_like_any_other(tmp_path):
    """Every reward NaN: the "basis" estimator (registered with sees_unscorable) still calibrates on the real rows
    (the largest beta, every prompt on the fallback); beta_t is recorded and the missing prompts counted."""
    trainer = _unit_trainer(tmp_path, table_prompts=PROMPTS[1:], basis_max_missing_fraction=0.25)
    adv = trainer.compute_advantages(make_batch(trainer, PROMPTS, [float("nan")] * 8)).numpy()
    assert (adv == 0).all()
    assert trainer.rollout_strategy.beta_history == [float(default_beta_grid().max())]
    assert last_metric(trainer, "basis/missing_count") == 1 and last_metric(trainer, "basis/fallback_count") == 8
    assert last_metric(trainer, "basis/calibration_loss") == math.inf
    assert last_metric(trainer, "basis/mean_sq_advantage") == 0.0
    assert trainer.rollout_strategy.totals == {"missing_total": 1, "fallback_total": 8, "rows_total": 8}
    assert set(BASIS_METRICS) <= set(trainer._metrics["train"])


def test_sample_based_values_only_when_the_batch_has_such_a_row(tmp_path):
    """A table mixing binary rows (pass rates: the closed form) and non-binary per-sample rows (the plug-in V_beta on
    the grid): p_hat is (N,) for a batch of binary rows only, (N, K) as soon as one row is sample-based -- the
    estimator's input exactly as the trainer built it before the strategy."""
    def mixed(p):  # the first four prompts graded, the others binary
        return [0.5, 1.0, 0.0, 0.5, 0.0, 0.0] if PROMPTS.index(p) < 4 else ref_rewards(p)

    table = make_table(PROMPTS, rewards_fn=mixed)
    trainer = _unit_trainer(tmp_path, table=table)
    grid = default_beta_grid()
    binary = make_batch(trainer, PROMPTS[4:], REWARDS[4:])
    assert binary.side_inputs["p_hat"].shape == (4,)
    p = np.array([table.lookup(x).success_probability for x in PROMPTS[4:]])
    expected = np.array(REWARDS[4:]) - calibrate_beta(np.array(REWARDS[4:]), p).baseline
    np.testing.assert_array_equal(trainer.compute_advantages(binary).numpy(), expected.astype(np.float32))
    r = [0.5, 0.0, 1.0, 0.5, 1.0, 0.0, 1.0, 1.0]
    full = make_batch(trainer, PROMPTS, r)
    assert full.side_inputs["p_hat"].shape == (8, grid.size)
    vt = np.array([v_beta_from_samples([mixed(x)], grid)[0] if i < 4 else
                   v_beta(table.lookup(x).success_probability, grid) for i, x in enumerate(PROMPTS)])
    expected = np.array(r) - calibrate_beta(np.array(r), vt).baseline
    np.testing.assert_allclose(trainer.compute_advantages(full).numpy(), expected, atol=1e-6)


def test_value_table_strategy_is_registered_and_built_by_the_preset(tmp_path, caplog):
    import logging

    from trl_ext import ExtGRPOConfig
    from trl_ext.trainers.basis.strategy import ValueTableLookup
    from trl_ext.trainers.rollouts import get_rollout_strategy

    assert get_rollout_strategy("value_table") is ValueTableLookup
    assert "p_hat" in ValueTableLookup.provides and "beta_grid" in ValueTableLookup.provides
    # the basis estimator on the base trainer's fixed groups: refused, naming the strategy and the preset
    with pytest.raises(ValueError, match=r"\['p_hat'\].*BASISTrainer.*value_table"):
        ExtGRPOConfig("out", use_cpu=True, per_device_train_batch_size=8, report_to="none",
                      advantage_estimator="basis", num_generations=1)
    with caplog.at_level(logging.INFO, logger="trl_ext.trainers.base"):
        trainer = _unit_trainer(tmp_path)
    assert isinstance(trainer.rollout_strategy, ValueTableLookup) and trainer.args.advantage_estimator == "basis"
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("BASISTrainer:")]
    assert line == ["BASISTrainer: rollout strategy value_table: 8 rollouts per generation batch (1 per prompt), as "
                    "TRL; each prompt's offline value p_hat from a value table of 8 rows (reward range [0, 1], "
                    "230-point beta grid); advantage estimator basis (evaluation batches without its inputs: "
                    "grpo)."]


# ------------------------------------------------------------------------------------------------------ table input
def test_table_bad_input(tmp_path):
    from datasets import Dataset

    ds = Dataset.from_dict({"prompt": PROMPTS})
    model, tok = tiny_model_and_tokenizer(0)

    def build(table=None, **kw):
        args = kw.pop("args", None) or basis_config(tmp_path, **kw)
        return BASISTrainer(model=model, reward_funcs=[binary_reward], args=args, train_dataset=ds,
                            processing_class=tok, value_table=table)

    with pytest.raises(ValueError, match="needs a value table"):
        build()
    with pytest.raises(FileNotFoundError, match="build-value-table"):
        build(str(tmp_path / "nope.jsonl"))
    bad = tmp_path / "corrupt.jsonl"
    bad.write_text('{"format": "trl_ext.value_table", "version": 1, "metadata": {}}\n{"prompt_key": "x", "n": \n')
    with pytest.raises(ValueError):
        build(str(bad))
    with pytest.raises(ValueError, match="no rows"):
        build(ValueTable([], {}))
    with pytest.raises(ValueError, match="covers none"):
        build(make_table(["9+9=", "8+8="]))
    mixed = make_table(PROMPTS[:4])
    mixed.add(ValueTableRow.from_rewards(PROMPTS[5], [1.0, -1.0], (-1.0, 1.0)))
    with pytest.raises(ValueError, match="mixes reward ranges"):
        build(mixed)
    from trl_ext.priors.table_format import prompt_key

    collide = make_table(PROMPTS[1:])
    collide.add(ValueTableRow.from_rewards("7+7=", [1.0, 0.0], (0.0, 1.0), key=prompt_key(PROMPTS[0])))
    with pytest.raises(ValueError, match="stores a different prompt"):
        build(collide)
    other = make_table(PROMPTS, reward_funcs=("other_reward",))
    with pytest.warns(UserWarning, match="reward_funcs"):
        build(other)
    with pytest.raises(ValueError, match="reward_funcs"):
        build(other, basis_strict_table_check=True)
    model.config._name_or_path = "my/policy"
    with pytest.warns(UserWarning, match="model"):
        build(make_table(PROMPTS, model="other/policy"))
    from trl_ext.trainers.base import ExtGRPOConfig

    # a TRL / parent config is upgraded to BASISConfig and validated: G = 2 is refused with the fix
    with pytest.raises(ValueError, match="num_generations must be 1"):
        BASISTrainer(model=model, reward_funcs=[binary_reward], train_dataset=ds, processing_class=tok,
                     args=ExtGRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=8,
                                        use_cpu=True, bf16=False, report_to="none"), value_table=other)
    with pytest.raises(TypeError, match="BASISConfig"):
        BASISTrainer(model=model, reward_funcs=[binary_reward], train_dataset=ds, processing_class=tok,
                     args={"output_dir": str(tmp_path)}, value_table=other)
    # a table saved to disk loads through basis_value_table_path
    path = tmp_path / "table.jsonl"
    save_value_table(path, make_table(PROMPTS))
    trainer = build(args=basis_config(tmp_path, basis_value_table_path=str(path)))
    assert len(trainer.rollout_strategy.table) == 8


# ------------------------------------------------------------------------------------------------------ resume
def test_trls_default_num_generations_is_refused_with_the_fix(tmp_path):
    """TRL's default G (8) cannot silently become BASIS's G = 1: BASISConfig and a plain TRL config (upgraded by
    the trainer) both raise the error that says what to change (for the TRL config: build a BASISConfig)."""
    import trl

    with pytest.raises(ValueError, match=r"num_generations must be 1 \(BASIS uses one rollout per prompt\), got 8\. "
                                         r"Set num_generations=1"):
        basis_config(tmp_path, num_generations=8)
    plain = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, use_cpu=True, bf16=False,
                           report_to="none")
    assert plain.num_generations == 8  # TRL's default
    model, tok = tiny_model_and_tokenizer(0)
    ds = tiny_dataset(16)
    # the fix for a plain TRL config is BASISConfig (trl.GRPOConfig itself refuses num_generations=1)
    with pytest.raises(ValueError, match=r"num_generations must be 1 .*got 8\. Pass args=trl_ext\.BASISConfig\(\.\.\., "
                                         r"num_generations=1\) instead \(trl\.GRPOConfig refuses") as err:
        BASISTrainer(model=model, reward_funcs=[binary_reward], args=plain, train_dataset=ds, processing_class=tok,
                     value_table=make_table(ds["prompt"]))
    assert "Set num_generations=1" not in str(err.value)


def test_rollouts_and_tokens_per_step_equal_trls_with_the_same_batch(tmp_path):
    """Drop-in compute: with the same TRL arguments (per_device_train_batch_size 8, completions fixed at L tokens
    with ``generation_kwargs={"min_new_tokens": L}``) and num_generations=1, BASIS generates generation_batch_size
    rollouts per step (one per prompt) -- as many rollouts and tokens as TRL's GRPO (``trl_ext.GRPOTrainer`` with a
    default ``ExtGRPOConfig``: one prompt x TRL's default G = 8). Factor 1."""

    from trl_ext.trainers.base import ExtGRPOConfig, GRPOTrainer

    L, steps = 6, 2
    trl_args = dict(per_device_train_batch_size=8, max_completion_length=L, generation_kwargs={"min_new_tokens": L},
                    max_steps=steps, learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none", logging_steps=1,
                    save_strategy="no", seed=0, dataloader_num_workers=0, disable_tqdm=True)
    ds = tiny_dataset(16)
    model, tok = tiny_model_and_tokenizer(0)
    grpo = GRPOTrainer(model=model, reward_funcs=[binary_reward], args=ExtGRPOConfig(output_dir=str(tmp_path / "g"),
                       **trl_args), train_dataset=ds, processing_class=tok)
    model, tok = tiny_model_and_tokenizer(0)
    basis = BASISTrainer(model=model, reward_funcs=[binary_reward], args=BASISConfig(
        output_dir=str(tmp_path / "b"), **trl_args), train_dataset=ds, processing_class=tok,
        value_table=make_table(ds["prompt"]))
    assert grpo.args.num_generations == 8 and basis.args.num_generations == 1
    assert basis.args.generation_batch_size == grpo.args.generation_batch_size == 8
    assert "8 rollouts per generation batch (1 per prompt)" in basis.rollout_strategy.describe(basis.rollout_api)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grpo.train()
        basis.train()

    def per_step(tr, name):
        return [h[name] for h in tr.state.log_history if name in h]

    assert per_step(basis, "ext/rollouts") == per_step(grpo, "ext/rollouts") == [8.0] * steps
    assert per_step(basis, "ext/generated_tokens") == per_step(grpo, "ext/generated_tokens") == [8.0 * L] * steps
    assert len(set(map(str, basis.last_rollout_batch.prompts))) == 8  # 8 prompts x 1 rollout
    assert len(set(map(str, grpo.last_rollout_batch.prompts))) == 1  # 1 prompt x 8 rollouts


def test_resume_restores_beta_history(tmp_path):
    trainer = make_basis(tmp_path, save_strategy="steps", save_steps=1, max_steps=2)
    trainer.train()
    full = list(trainer.rollout_strategy.beta_history)
    assert len(full) == 2
    ckpt = os.path.join(trainer.args.output_dir, "checkpoint-1")
    state = torch.load(os.path.join(ckpt, EXT_STATE_FILE), weights_only=True)
    strategy_state = state["rollout_strategy"]  # the beta history is the value_table strategy's state
    assert strategy_state["name"] == "value_table"
    assert strategy_state["state"]["beta_history"] == full[:1] and strategy_state["state"]["beta_steps"] == [0]
    assert strategy_state["state"]["rows_total"] == 8

    resumed = make_basis(tmp_path, save_strategy="no", max_steps=2)
    assert resumed.rollout_strategy.beta_history == []
    resumed.train(resume_from_checkpoint=ckpt)
    assert resumed.rollout_strategy.beta_history[0] == full[0]
    assert len(resumed.rollout_strategy.beta_history) == 2 and resumed.rollout_strategy.beta_history_steps == [0, 1]
    assert resumed.rollout_strategy.totals["rows_total"] == 16

    corrupt = {**strategy_state, "state": {**strategy_state["state"], "beta_history": [1.0, float("nan")],
                                             "beta_steps": [0, 1]}}
    with pytest.raises(ValueError, match="Corrupt BASIS state"):
        resumed.load_ext_state_dict({**state, "rollout_strategy": corrupt})
    with pytest.warns(UserWarning, match="holds no rollout-strategy state"):
        resumed.load_ext_state_dict({k: v for k, v in state.items() if k != "rollout_strategy"})
    # a trl_ext 0.2 checkpoint (the beta history as basis_* trainer keys): refused, not translated
    legacy = {k: v for k, v in state.items() if k != "rollout_strategy"}
    legacy.update(basis_beta_history=[0.5, 0.25], basis_beta_steps=[0, 1], rollout_strategy={"name": "fixed_groups",
                                                                                             "state": {}})
    with pytest.raises(ValueError, match="trl_ext 0.2 and earlier.*basis_beta_history"):
        resumed.load_ext_state_dict(legacy)


# ------------------------------------------------------------------------------------------------------ two ranks
def _load_script():
    spec = importlib.util.spec_from_file_location("basis_two_rank", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gathered_baseline_identical_with_one_and_two_processes(tmp_path, monkeypatch):
    steps = 2
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "ACCELERATE_DEBUG_MODE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", SCRIPT, str(tmp_path), str(steps)],
                          env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, f"torchrun failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    # the same script in this process (one rank, per_device_train_batch_size 8)
    monkeypatch.setattr(sys, "argv", [SCRIPT, str(tmp_path), str(steps)])
    assert _load_script().main() == 0
    r0, r1, single = (json.load(open(tmp_path / f)) for f in ("world2_rank0.json", "world2_rank1.json",
                                                                "world1_rank0.json"))
    assert (r0["world_size"], r1["world_size"], single["world_size"]) == (2, 2, 1)
    assert len(r0["steps"]) == len(single["steps"]) == steps
    assert r0["steps"] == r1["steps"]  # every rank computes the same global advantages
    assert r0["weight_checksum"] == r1["weight_checksum"]  # DDP kept the replicas identical
    for two, one in zip(r0["steps"], single["steps"]):
        assert two["num_processes"] == 2 and one["num_processes"] == 1
        assert two["prompts"] == one["prompts"] and len(set(one["prompts"])) == 8
        assert two["rewards"] == one["rewards"]
        assert two["beta"] == one["beta"]
        assert two["advantages"] == one["advantages"]  # bitwise: same global batch -> same baseline
        assert all(math.isfinite(a) for a in one["advantages"])


# ------------------------------------------------------------------------------------------------------ objectives
@pytest.mark.parametrize("overrides", [
    {"loss_type": "grpo"},  # GRPO (sequence-mean aggregation) + BASIS
    {"loss_type": "dapo"},  # verl's token-mean GRPO / GPG aggregation (on-policy: ratio 1, no clipping)
    {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4,
     "per_device_train_batch_size": 4, "steps_per_generation": 2},  # GSPO-style sequence ratios, 2 mini-batches
])
def test_objective_combinations_train(tmp_path, overrides):
    trainer = make_basis(tmp_path, max_steps=2, **overrides)
    before = params(trainer.model)
    trainer.train()
    assert trainer.last_rollout_batch.num_rows == 8 and len(set(trainer.last_rollout_batch.prompts)) == 8
    assert max_change(before, trainer.model) > 0.0
    n_gen = 2 // trainer.args.steps_per_generation
    assert len(trainer.rollout_strategy.beta_history) == n_gen  # one calibration per generation batch


# ------------------------------------------------------------------------------------------------------ review fixes
def test_evaluate_on_held_out_prompts_uses_the_fallback(tmp_path):
    """Evaluation prompts are normally held out, hence absent from the (training) value table.

    ``basis_max_missing_fraction`` guards training against a wrong table; applied to eval batches it made
    ``trainer.evaluate()`` raise on any held-out set. Eval batches get the fallback baseline and log the missing
    share instead; training batches still raise.
    """
    from trl_ext.testbed import make_dataset

    held_out = make_dataset("addition", 8, seed=0, split="test")
    ds = tiny_dataset(16)
    model, tok = tiny_model_and_tokenizer(0)
    trainer = BASISTrainer(model=model, reward_funcs=[binary_reward],
                           args=basis_config(tmp_path, per_device_eval_batch_size=4),
                           train_dataset=ds, eval_dataset=held_out, processing_class=tok,
                           value_table=make_table(ds["prompt"]))
    assert not set(held_out["prompt"]) & set(ds["prompt"])
    metrics = trainer.evaluate()
    assert metrics["eval_basis/missing_fraction"] == 1.0
    assert np.isfinite(metrics["eval_loss"])
    assert trainer.rollout_strategy.beta_history == []  # eval batches do not enter the training beta trajectory
    with pytest.raises(ValueError, match="missing from the value table"):
        trainer.compute_advantages(make_batch(trainer, held_out["prompt"], [1.0, 0.0] * 4, mode="train"))


# ------------------------------------------------------------------------------------------- BASIS selected by config
def _by_config(tmp_path, table_path, **kwargs):
    from trl_ext import ExtGRPOConfig

    cfg = dict(output_dir=str(tmp_path / "cfg"), per_device_train_batch_size=8, max_completion_length=5, max_steps=2,
               learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none", beta=0.0, logging_steps=1,
               save_strategy="no", seed=0, temperature=1.0, dataloader_num_workers=0, disable_tqdm=True,
               num_generations=1, advantage_estimator="basis", rollout_strategy="value_table",
               rollout_strategy_kwargs={"value_table_path": str(table_path), **kwargs})
    return ExtGRPOConfig(**cfg)


def test_basis_selected_by_config_on_the_base_trainer_equals_the_preset(tmp_path):
    """``advantage_estimator="basis"`` + ``rollout_strategy="value_table"`` on ``trl_ext.GRPOTrainer`` trains as
    ``BASISTrainer`` does: the same advantages, beta trajectory and weights after two steps (and evaluation batches get
    ``p_hat`` too)."""
    from trl_ext import GRPOTrainer
    from trl_ext.trainers.basis.strategy import ValueTableLookup

    ds, held_out = tiny_dataset(16), tiny_dataset(4, seed=1)
    path = tmp_path / "table.jsonl"
    save_value_table(str(path), make_table(ds["prompt"]))
    runs = {}
    for name in ("preset", "config"):
        torch.set_num_threads(1)
        model, tok = tiny_model_and_tokenizer(0)
        if name == "preset":
            args = basis_config(tmp_path, basis_value_table_path=str(path), basis_variant="vop",
                                per_device_eval_batch_size=4)
            trainer = BASISTrainer(model=model, reward_funcs=[binary_reward], args=args, train_dataset=ds,
                                   eval_dataset=held_out, processing_class=tok)
        else:
            args = _by_config(tmp_path, path, variant="vop")
            args.per_device_eval_batch_size = 4
            trainer = GRPOTrainer(model=model, reward_funcs=[binary_reward], args=args, train_dataset=ds,
                                  eval_dataset=held_out, processing_class=tok)
            assert type(trainer) is GRPOTrainer and isinstance(trainer.rollout_strategy, ValueTableLookup)
        trainer.train()
        runs[name] = (trainer.last_advantages.clone(), list(trainer.rollout_strategy.beta_history),
                      params(trainer.model), trainer.evaluate())
    (a0, b0, w0, e0), (a1, b1, w1, e1) = runs["preset"], runs["config"]
    assert torch.equal(a0, a1) and bool((a0 != 0).any())
    assert b0 == b1 and len(b0) == 2
    assert all(torch.equal(x, y) for x, y in zip(w0, w1))
    assert e0["eval_basis/missing_fraction"] == e1["eval_basis/missing_fraction"] == 1.0
    assert e0["eval_loss"] == e1["eval_loss"]


@pytest.mark.parametrize("kwargs, match", [
    ({}, "value_table_path"),
    ({"variant": "blue"}, "variant must be one of"),
    ({"eps": 0.5}, r"eps must be a number in \[0, 0.5\)"),
    ({"beta_grid": [0.5, 0.1]}, "beta_grid"),
    ({"objectiv": "paper"}, r"unknown rollout_strategy_kwargs \['objectiv'\]"),
])
def test_value_table_strategy_kwargs_are_checked_when_the_config_is_built(tmp_path, kwargs, match):
    path = tmp_path / "t.jsonl"
    kw = dict(kwargs)
    if match != "value_table_path":
        kw = {"value_table_path": str(path), **kw}
    from trl_ext import ExtGRPOConfig

    with pytest.raises(ValueError, match=match):
        ExtGRPOConfig(str(tmp_path / "o"), use_cpu=True, bf16=False, per_device_train_batch_size=8, report_to="none",
                      num_generations=1, advantage_estimator="basis", rollout_strategy="value_table",
                      rollout_strategy_kwargs=kw)


def test_value_table_strategy_by_config_checks_the_table_against_the_data(tmp_path):
    """A table for other prompts fails at construction, as with the preset."""
    from trl_ext import GRPOTrainer

    path = tmp_path / "other.jsonl"
    save_value_table(str(path), make_table(["unrelated prompt"]))
    model, tok = tiny_model_and_tokenizer(0)
    with pytest.raises(ValueError, match="covers none of the 16 training prompts"):
        GRPOTrainer(model=model, reward_funcs=[binary_reward], args=_by_config(tmp_path, path),
                    train_dataset=tiny_dataset(16), processing_class=tok)


@pytest.mark.parametrize("route", ["preset", "by_config"])
def test_trl_fields_basis_ignores_are_warned_on_either_route(tmp_path, route):
    """``scale_rewards`` (beyond on/off) and ``multi_objective_aggregation`` do not apply to BASIS (the advantage is
    ``r - b`` of the weighted reward sum): one ``UserWarning`` each, on the preset and on ``trl_ext.GRPOTrainer``
    selecting BASIS by config (the strategy's ``check_setup``), none with TRL's defaults."""
    from trl_ext import GRPOTrainer

    ds = tiny_dataset(16)
    path = tmp_path / "table.jsonl"
    save_value_table(str(path), make_table(ds["prompt"]))
    for ignored in ({}, {"scale_rewards": "batch", "multi_objective_aggregation": "normalize_then_sum"}):
        model, tok = tiny_model_and_tokenizer(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if route == "preset":
                BASISTrainer(model=model, reward_funcs=[binary_reward], processing_class=tok, train_dataset=ds,
                             args=basis_config(tmp_path, basis_value_table_path=str(path), **ignored))
            else:
                args = _by_config(tmp_path, path)
                for k, v in ignored.items():
                    setattr(args, k, v)
                GRPOTrainer(model=model, reward_funcs=[binary_reward], args=args, train_dataset=ds,
                            processing_class=tok)
        said = [str(w.message) for w in caught if "BASIS ignores" in str(w.message)]
        assert len(said) == (2 if ignored else 0), said
        if ignored:
            assert "scale_rewards='batch'" in said[0] and "multi_objective_aggregation" in said[1]

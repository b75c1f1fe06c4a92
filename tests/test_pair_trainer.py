"""Tests of :class:`trl_ext.trainers.pair.trainer.PAIRTrainer` on the tiny CPU testbed.

Covers: design-unbiasedness of the trainer's realized advantages (exact enumeration over draws, and Monte Carlo over
fresh draws on candidate groups the tiny policy generated), the policy-loss coefficient of every row through the
full trainer path for every supported loss type (PAIR's fixed normalizer, whatever the number of real and pad rows),
the expected-cost budget, the solver warm start, the NaN rule, heads learning when the prefix predicts success,
1 vs 2 processes, resume of heads, replay window and warm start, vLLM stand-in continuation, the one generated-token
counter, config validation and bad inputs (degenerate or NaN head outputs, solver failures, NaN rewards, every
candidate finishing inside the prefix, zero selected vertices).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_ext.estimators import DesignWarmStart
from trl_ext.estimators import pair as pair_est
from trl_ext.estimators.pair import group_draw as pair_draw  # where design_and_draw looks up pair_design, draws
from trl_ext.trainers import _trl_compat as compat
from trl_ext.trainers import pair as pair_mod
from trl_ext.trainers.pair import PAIRConfig, PAIRTrainer, PrefixProbeRollouts
from trl_ext.trainers.pair import config as pair_config
from trl_ext.trainers.pair import strategy as pair_rollouts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "pair_two_rank.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import pair_two_rank as two_rank  # noqa: E402  (stand-in generator and loss recorder shared with the 2-rank script)

pytestmark = pytest.mark.filterwarnings("ignore::trl_ext.trainers.pair.PAIRShortProbeWarning")
"""The CPU tests use 5-token completions and a 2-token probe; the warning itself is tested below."""

LOSS_TYPES = ("grpo", "sapo", "luspo", "dr_grpo", "dapo", "cispo", "vespo")
"""Every loss type TRL 1.16 accepts that PAIR's fixed normalizer supports (``bnpo`` is rejected)."""


def _text(c) -> str:
    return c if isinstance(c, str) else c[-1]["content"]


def parity_reward(prompts, completions, **kw):
    return [float(zlib.crc32(_text(c).encode()) % 2) for c in completions]


def first_char_reward(prompts, completions, **kw):
    """Success is decided by the first generated character: the prefix (tau = 1) predicts it exactly."""
    return [1.0 if _text(c)[:1] in ("0", "1", "2", "3", "4") and _text(c) else 0.0 for c in completions]


def make_config(tmp_path, **over) -> PAIRConfig:
    kw = dict(output_dir=str(tmp_path), per_device_train_batch_size=16, num_generations=8, max_completion_length=5,
              pair_prefix_tokens=2, max_steps=1, learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none",
              beta=0.0, logging_steps=1, save_strategy="no", seed=0, temperature=1.0, dataloader_num_workers=0,
              disable_tqdm=True, pair_head_min_labels=8, pair_head_fit_steps=20)
    kw.update(over)
    return PAIRConfig(**kw)


def make_trainer(tmp_path, reward=None, n_rows=32, cls=PAIRTrainer, **over) -> PAIRTrainer:
    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset

    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0)
    return cls(model=model, reward_funcs=[reward or parity_reward], args=make_config(tmp_path, **over),
               train_dataset=make_dataset("addition", n_rows, seed=0), processing_class=tok)


Scripted = two_rank.recording_class(PAIRTrainer)
"""PAIRTrainer with the deterministic stand-in generator (below the base's token counter) and the loss recorder."""


def preload_labels(trainer: PAIRTrainer, n: int = 64, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    h = trainer.rollout_strategy.heads.heads.config["input_dim"]
    f = torch.randn(n, h, generator=g)
    r = (f[:, 0] > 0).float()
    c = 1.0 + 3.0 * torch.rand(n, generator=g)
    trainer.rollout_strategy.heads.heads.add_labels(f, r, c, torch.full((n,), 0.5))


def design_and_draw(trainer, p_hat, cost_hat, finished, rng, **kw):
    """The design the rollout strategy runs per prompt, with the trainer's ``pair_*`` options."""
    return pair_est.design_and_draw(p_hat, cost_hat, finished, rng, **kw, **pair_config.pair_design_options(trainer.rollout_strategy.options))


def group_advantages(trainer, rewards, draw):
    """Eq. 13 of one group's draw with the trainer's options (what the ``pair_draw`` estimator computes per group)."""
    return pair_est.draw_advantages(rewards, draw, **pair_config.pair_advantage_options(trainer.rollout_strategy.options))


def full_advantages(trainer, rewards):
    G = len(rewards)
    draw = pair_mod.GroupDraw(pi=np.ones(G), pi_design=np.ones(G), selected=np.ones(G, bool),
                              finished=np.zeros(G, bool), anchor=None, expected_cost=0, budget=0, full_cost=0,
                              reason="full")
    return group_advantages(trainer, np.asarray(rewards, float), draw)[0]


def metric(trainer, name):
    vals = [h[name] for h in trainer.state.log_history if name in h]
    assert vals, f"metric {name} was not logged"
    return vals


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    return make_trainer(tmp_path_factory.mktemp("pair"))


# --------------------------------------------------------------------------------------------- design-unbiasedness
def test_realized_advantages_exact_expectation_equals_complete_pair(trainer):
    """E_design[trainer's Eq. 13 advantages] over every draw pattern = complete-pair advantages (Theorem 2)."""
    rng = np.random.default_rng(0)
    naive_gap = 0.0
    for _ in range(6):
        G = 6
        p = rng.uniform(0.05, 0.95, G)
        c = rng.uniform(1.0, 20.0, G)
        fin = rng.random(G) < 0.25
        fin[0] = False
        r = rng.integers(0, 2, G).astype(float)
        r[:2] = [0.0, 1.0]
        draw = design_and_draw(trainer, p, c, fin, np.random.default_rng(1))
        assert np.all(draw.pi[fin] == 1.0) and np.all(draw.selected[fin])
        expect = np.zeros(G)
        naive = np.zeros(G)
        total = 0.0
        for bits in itertools.product([False, True], repeat=G):
            sel = np.array(bits)
            prob = float(np.prod(np.where(sel, draw.pi, 1.0 - draw.pi)))
            if prob == 0.0:
                continue
            total += prob
            d = dataclasses.replace(draw, selected=sel)
            expect += prob * group_advantages(trainer, np.where(sel, r, np.nan), d)[0]
            if sel.sum() >= 2:
                naive += prob * pair_est.pair_advantages(np.where(sel, r, np.nan), sel, np.ones(G)).advantages
        assert total == pytest.approx(1.0, abs=1e-12)
        target = full_advantages(trainer, r)
        np.testing.assert_allclose(expect, target, atol=1e-12)
        np.testing.assert_allclose(target, (r - r.mean()) / (G - 1), atol=1e-12)  # Theorem 1 / Eq. 13 at J = 1
        naive_gap = max(naive_gap, float(np.abs(naive - target).max()))
    assert naive_gap > 0.01  # unweighted selection is biased: the test can fail


def _probe_population(trainer, n_prompts=2, seed=0):
    """A frozen candidate population generated by the tiny policy through the strategy's own probe and the base's
    ``generate_token_ids`` continuation."""
    from trl_ext.testbed import make_dataset

    G = trainer.num_generations
    strat = trainer.rollout_strategy
    ds = make_dataset("addition", n_prompts, seed=seed)
    rows = [dict(ds[k]) for k in range(n_prompts) for _ in range(G)]
    torch.manual_seed(seed)
    pr = strat.probe(trainer.rollout_api, rows)
    fin = np.array(pr["finished"])
    L1 = strat.probe_len()
    idx = [j for j in range(len(rows)) if not fin[j]]
    cont, _ = trainer.generate_token_ids([list(pr["prompt_ids"][j]) + list(pr["probe_ids"][j]) for j in idx],
                                         max_new_tokens=trainer.args.max_completion_length - L1)
    full = [list(c) for c in pr["probe_ids"]]
    for j, c in zip(idx, cont):
        full[j] += c
    texts = trainer.processing_class.batch_decode(full, skip_special_tokens=True)
    rewards = np.array(parity_reward(None, texts))
    return rows, pr["features"], fin, rewards


@pytest.mark.parametrize("n_prompts, n_draws", [
    pytest.param(2, 800, id="quick"),
    pytest.param(4, 4000, id="full", marks=pytest.mark.slow),
])
def test_realized_advantages_average_to_complete_pair_monte_carlo(tmp_path, n_prompts, n_draws):
    """End to end on candidates the tiny policy generated: heads -> design -> fresh draws -> Eq. 13, averaged over
    many draws, matches the complete-pair advantages within 5 standard errors (with and without the anchor pair);
    the unweighted estimator does not."""
    tr = make_trainer(tmp_path)
    preload_labels(tr, 128)
    tr.rollout_strategy.heads.heads.refresh(steps=100)
    G = tr.num_generations
    rows, feats, fin, rewards = _probe_population(tr, n_prompts=n_prompts, seed=1)
    pred = tr.rollout_strategy.heads.heads.predict(feats)
    assert tr.rollout_strategy.heads.heads.ready
    mixed, spread, naive_detected = 0, 0.0, False
    for anchor in (False, True):
        tr.rollout_strategy.options.anchor_pair = anchor
        for k in range(len(rows) // G):
            sl = slice(k * G, (k + 1) * G)
            r = rewards[sl]
            target = full_advantages(tr, r)
            mixed += int(np.ptp(r) > 0)
            rng = np.random.default_rng(100 + k)
            samples, naive = [], []
            for _ in range(n_draws):
                adv, draw, _ = pair_est.simulate_draw(
                    pred.p_hat[sl].numpy(), pred.cost_hat[sl].numpy(), fin[sl], r, rng,
                    design=pair_config.pair_design_options(tr.rollout_strategy.options),
                    estimator=pair_config.pair_advantage_options(tr.rollout_strategy.options))
                samples.append(adv)
                sel = draw.selected
                naive.append(pair_est.pair_advantages(np.where(sel, r, np.nan), sel, np.ones(G)).advantages)
                spread = max(spread, float(np.ptp(draw.pi_design[~fin[sl]]))) if (~fin[sl]).any() else spread
            s = np.array(samples)
            se = s.std(axis=0, ddof=1) / np.sqrt(len(s))
            assert np.all(np.abs(s.mean(axis=0) - target) <= 5 * se + 1e-9), (k, anchor, s.mean(0), target)
            nv = np.array(naive)
            nse = nv.std(axis=0, ddof=1) / np.sqrt(len(nv))
            naive_detected |= bool(np.any(np.abs(nv.mean(axis=0) - target) > 5 * nse + 1e-9))
    tr.rollout_strategy.options.anchor_pair = False
    assert mixed >= 1, "population has no reward contrast; the test would be vacuous"
    assert spread > 0.01, "the heads produced a uniform design; the test would not exercise the weights"
    assert naive_detected


# --------------------------------------------------------------------------------------------- loss normalizer
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_policy_loss_coefficient_of_every_row_is_advantage_over_K(tmp_path, loss_type):
    """Through the full trainer path (strategy -> the base's replay -> the base's policy scale -> TRL's loss), with
    ``steps_per_generation=2`` so generation batches with an odd number of completed vertices get pad rows: the
    coefficient of every real row in TRL's policy loss, ``A'_i / D_TRL`` (``two_rank.coefficient_report``), equals
    ``A_i / K`` (grpo, sapo, luspo) or ``A_i / (K L)`` (dr_grpo, dapo, cispo, vespo) with ``A_i`` Eq. 13 recomputed
    from the design log and ``K`` the prompts of the batch -- across batches with different real-row counts. (The
    former double rescale with pad rows gave 14/13 or 18/17 times the intended advantages.)"""
    extra = {"importance_sampling_level": "sequence"} if loss_type == "luspo" else {}
    tr = two_rank.build(str(tmp_path), per_device=8, max_steps=8, steps_per_generation=2, loss_type=loss_type,
                        **extra)
    tr.train()
    rep = two_rank.coefficient_report(two_rank.recorded(tr))
    assert rep["nonzero_rows"] >= 10 and rep["pad_rows"] >= 1, rep
    assert len(rep["real_row_counts"]) >= 2 and rep["padded_generations"] >= 1, rep  # the draws differ
    assert rep["unscaled_dev"] < 1e-6, rep  # the batch's advantages are Eq. 13 exactly (no pad rescale)
    assert rep["max_rel"] < 1e-5, rep  # float32 advantages: exact up to rounding
    assert metric(tr, "pair/warmup")[0] == 1.0


def test_coefficient_check_detects_a_realized_normalizer(tmp_path):
    """The check can fail: with ``pair_fixed_normalizer=False`` (TRL's realized row count) the coefficients are
    ``A_i / n_real``, not ``A_i / K``."""
    tr = two_rank.build(str(tmp_path), per_device=8, max_steps=4, steps_per_generation=2, pair_fixed_normalizer=False)
    tr.train()
    rep = two_rank.coefficient_report(two_rank.recorded(tr))
    assert rep["max_rel"] > 0.05, rep


def test_fixed_normalizer_is_the_global_number_of_prompts(tmp_path):
    tr = make_trainer(tmp_path)
    strat = tr.rollout_strategy
    assert isinstance(strat, PrefixProbeRollouts) and strat.name == "pair_prefix_probe"
    tr.train()
    assert tr.last_rollout_batch.fixed_normalizer == 2.0  # K = 2 prompts probed, whatever was completed
    rows = [dict(tr.train_dataset[k]) for k in range(2) for _ in range(tr.args.num_generations)]
    tr.model.train()
    tr.rollout_strategy.options.fixed_normalizer = False
    assert strat.rollout(tr.rollout_api, rows).fixed_normalizer is None
    tr.rollout_strategy.options.fixed_normalizer = True


# --------------------------------------------------------------------------------------------- budget
@settings(max_examples=60, deadline=None)
@given(
    G=st.integers(2, 10),
    data=st.data(),
    ratio=st.floats(0.08, 1.0),
    anchor=st.booleans(),
)
def test_expected_cost_respects_budget(trainer, G, data, ratio, anchor):
    p = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=G, max_size=G)))
    c = np.array(data.draw(st.lists(st.floats(0.5, 500.0), min_size=G, max_size=G)))
    fin = np.array(data.draw(st.lists(st.booleans(), min_size=G, max_size=G)))
    warm = data.draw(st.booleans())
    ws = None
    if data.draw(st.booleans()):  # a warm start from an arbitrary previous profile changes nothing here
        ws = DesignWarmStart()
        ws.update([np.array(data.draw(st.lists(st.floats(0.0, 3.0), min_size=G, max_size=G)))])
    old = (trainer.rollout_strategy.options.budget_ratio, trainer.rollout_strategy.options.anchor_pair)
    trainer.rollout_strategy.options.budget_ratio, trainer.rollout_strategy.options.anchor_pair = ratio, anchor
    try:
        d = design_and_draw(trainer, p, c, fin, np.random.default_rng(0), warmup=warm, warm_start=ws)
    finally:
        trainer.rollout_strategy.options.budget_ratio, trainer.rollout_strategy.options.anchor_pair = old
    unf = ~fin
    assert np.all(d.pi[fin] == 1.0) and np.all(d.selected[fin])
    if unf.any():
        assert d.budget == pytest.approx(ratio * c[unf].sum())
        assert d.expected_cost == pytest.approx(float((c * d.pi_design)[unf].sum()))
        assert d.expected_cost <= d.budget * (1 + 1e-7) + 1e-9
        assert np.all(d.pi_design[unf] >= trainer.args.pair_pi_min - 1e-12) and np.all(d.pi_design <= 1.0)
    else:
        assert d.reason == "all finished in prefix" and d.expected_cost == 0.0
    if anchor:
        k, l_ = d.anchor
        assert d.pi[k] == d.pi[l_] == 1.0 and d.selected[k] and d.selected[l_]


def test_training_logs_design_before_rewards_and_budget(tmp_path):
    """The design log of the current generation exists when the reward functions run, and the completions scored
    are exactly the selected candidates; logged predicted cost <= budget; the one token counter holds every probe
    and continuation token, broken down by ``pair/prefix_tokens`` and ``pair/realized_suffix_tokens``."""
    holder = {}

    def checking_reward(prompts, completions, **kw):
        tr = holder["trainer"]
        log = tr.rollout_strategy.design_log
        # the strategy counts this generation batch once it has returned its rollouts
        assert log and all(d["generation"] == tr.rollout_strategy.generation_index - 1 for d in log)
        assert len(completions) == sum(sum(d["selected"]) for d in log)
        holder["calls"] = holder.get("calls", 0) + 1
        return parity_reward(prompts, completions)

    tr = make_trainer(tmp_path, reward=checking_reward, max_steps=3)
    holder["trainer"] = tr
    tr.train()
    assert holder["calls"] == 3
    pred, budget = metric(tr, "pair/predicted_suffix_cost"), metric(tr, "pair/budget")
    assert all(p <= b * (1 + 1e-7) for p, b in zip(pred, budget))
    assert metric(tr, "pair/warmup")[0] == 1.0 and metric(tr, "pair/warmup")[-1] == 0.0  # warm-up then heads
    gen = metric(tr, "ext/generated_tokens")
    pre, suf = metric(tr, "pair/prefix_tokens"), metric(tr, "pair/realized_suffix_tokens")
    assert all(g == p + s for g, p, s in zip(gen, pre, suf))  # one process: no equalizing dummy rows
    assert metric(tr, "ext/generated_tokens_total")[-1] == sum(gen)
    assert not any(k.startswith("pair/generated_tokens") for h in tr.state.log_history for k in h)
    assert all(p <= 16 * 2 for p in pre)  # every candidate probed, at most tau tokens each
    for d in tr.rollout_strategy.design_log:  # realized suffix costs appended after the design: 0 unless continued
        cont = np.array(d["selected"]) & ~np.array(d["finished"])
        assert all((s > 0) == bool(c) for s, c in zip(d["realized_suffix_tokens"], cont))
        assert d["expected_cost"] <= d["budget"] * (1 + 1e-7)


# --------------------------------------------------------------------------------------------- warm start
def test_design_solver_is_warm_started_from_the_previous_step(tmp_path, monkeypatch):
    """Appendix C: each step's SLSQP starts from the previous step's solutions (carried over by priority rank); the
    start point is exactly ``DesignWarmStart.initial_point`` of the state saved after the previous step, the answer
    is the cold-start optimum (same objective) and a valid design, and the state is checkpointed."""
    tr = make_trainer(tmp_path, max_steps=3, save_strategy="steps", save_steps=3)
    preload_labels(tr)  # heads ready from the first step: every step solves the program
    strat = tr.rollout_strategy
    calls, snapshots = [], []
    orig_design, orig_gen = pair_draw.pair_design, strat.rollout

    def spy_design(*a, **k):
        d = orig_design(*a, **k)
        calls.append({"generation": strat.generation_index, "args": a, "kwargs": k, "design": d})
        return d

    def spy_generation(api, inputs):
        if api.mode == "train":
            snapshots.append(copy.deepcopy(strat.warm_start.state_dict()))
        return orig_gen(api, inputs)

    monkeypatch.setattr(pair_draw, "pair_design", spy_design)
    strat.rollout = spy_generation
    tr.train()
    assert len(snapshots) == 3 and snapshots[0] == {"profiles": {}, "n_solutions": {}}
    by_gen = {g: [c for c in calls if c["generation"] == g] for g in range(3)}
    assert all(c["kwargs"]["x0"] is None for c in by_gen[0])  # nothing to start from
    warm_checked = 0
    for g in (1, 2):
        ws = DesignWarmStart()
        ws.load_state_dict(snapshots[g])
        assert 8 in ws.profiles
        for c in by_gen[g]:
            p, cost, budget, pi_min = c["args"]
            want = ws.initial_point(p, cost, budget, pi_min)
            np.testing.assert_array_equal(c["kwargs"]["x0"], want)
            d = c["design"]
            assert d.warm_started
            cold = orig_design(p, cost, budget, pi_min, max_iter=50, tol=1e-6)
            assert d.objective == pytest.approx(cold.objective, rel=1e-4)
            assert d.expected_cost <= budget * (1 + 1e-9) and np.all(d.pi >= pi_min - 1e-12)
            warm_checked += 1
    assert warm_checked >= 4
    assert metric(tr, "pair/warm_started_groups")[-1] == 2.0
    assert all(d["warm_started"] for d in tr.rollout_strategy.design_log)
    # the profile after the last step: mean of that step's sorted solutions
    last = [c["design"].x for c in by_gen[2] if c["design"].reason in ("optimal", "iteration limit")]
    np.testing.assert_allclose(strat.warm_start.profiles[8], np.mean([np.sort(x) for x in last], axis=0),
                               rtol=0, atol=1e-12)
    saved = torch.load(tmp_path / "checkpoint-3" / "trl_ext_state.pt", weights_only=True)
    assert saved["rollout_strategy"]["name"] == "pair_prefix_probe"
    assert saved["rollout_strategy"]["state"]["warm_start"] == strat.warm_start.state_dict()
    assert saved["rollout_strategy"]["state"]["generation_index"] == 3


def test_warm_start_can_be_turned_off(tmp_path, monkeypatch):
    tr = make_trainer(tmp_path, max_steps=2, pair_solver_warm_start=False)
    preload_labels(tr)
    x0s = []
    orig = pair_draw.pair_design

    def spy(*a, **k):
        x0s.append(k.get("x0"))
        return orig(*a, **k)

    monkeypatch.setattr(pair_draw, "pair_design", spy)
    tr.train()
    assert x0s and all(x is None for x in x0s)
    assert tr.rollout_strategy.warm_start.profiles  # still learned (cheap), just not used


# --------------------------------------------------------------------------------------------- heads
def test_heads_learn_when_prefix_predicts_success(tmp_path):
    """Frozen policy (lr 0), tau = 1, reward decided by the first generated token: after a few steps the heads beat
    the base-rate predictor on fresh prefixes. The summary is the last hidden state (``pair_summary_last_k=1``):
    with a one-token prefix a 16-position mean is dominated by the prompt tokens and, with ~150 labels, the heads
    did not beat the base rate (measured Brier 0.22 vs 0.17)."""
    tr = make_trainer(tmp_path, reward=first_char_reward, pair_prefix_tokens=1, learning_rate=0.0, max_steps=10,
                      per_device_train_batch_size=32, n_rows=64, pair_head_min_labels=32, pair_head_fit_steps=100,
                      pair_summary_last_k=1)
    tr.train()
    assert tr.rollout_strategy.heads.heads.n_labels >= 100
    tr.rollout_strategy.heads.refresh()
    from trl_ext.testbed import make_dataset

    ds = make_dataset("addition", 24, seed=7)
    rows = [dict(ds[k]) for k in range(24) for _ in range(8)]
    torch.manual_seed(3)
    pr = tr.rollout_strategy.probe(tr.rollout_api, rows)
    y = np.array(first_char_reward(None, tr.processing_class.batch_decode(pr["probe_ids"], skip_special_tokens=True)))
    p = tr.rollout_strategy.heads.heads.predict(pr["features"]).p_hat.numpy()
    brier = float(np.mean((p - y) ** 2))
    base = float(np.mean((y.mean() - y) ** 2))
    assert 0.05 < y.mean() < 0.95
    assert brier < 0.6 * base, (brier, base)
    assert np.isfinite(metric(tr, "pair/head_brier")).all()


# --------------------------------------------------------------------------------------------- processes
def _errors(stderr: str) -> str:
    keep = [ln for ln in stderr.splitlines() if "Warning" not in ln and "warn" not in ln]
    return "\n".join(keep)[-6000:]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_one_and_two_processes_agree(tmp_path):
    """``tests/scripts/pair_two_rank.py`` with 1 and 2 processes (torchrun, gloo, ``ACCELERATE_DEBUG_MODE=1``):
    same designs, draws, rewards, advantages, heads, warm start and weights (``loss_type="grpo"``, ranks padded to
    equal row counts), and on every rank of both scenarios (``steps_per_generation`` 1 and 2) the coefficient of
    every row in TRL's loss is ``A_i / K``."""
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "ACCELERATE_DEBUG_MODE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    d1, d2 = tmp_path / "one", tmp_path / "two"
    d1.mkdir()
    d2.mkdir()
    steps = "3"
    p1 = subprocess.Popen([sys.executable, SCRIPT, str(d1), steps, "16"], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    p2 = subprocess.Popen([torchrun, "--standalone", "--nproc_per_node", "2", SCRIPT, str(d2), steps, "8"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out1, err1 = p1.communicate(timeout=250)
    out2, err2 = p2.communicate(timeout=250)
    assert p1.returncode == 0, _errors(err1)
    assert p2.returncode == 0, _errors(err2)
    a = json.loads((d1 / "result.json").read_text())
    b = json.loads((d2 / "result.json").read_text())
    assert (a["world"], b["world"]) == (1, 2)
    assert len(a["trace"]) == len(b["trace"]) == int(steps)
    for ta, tb in zip(a["trace"], b["trace"]):
        assert [d["row_idx"] for d in ta["design"]] == [d["row_idx"] for d in tb["design"]]
        assert [d["selected"] for d in ta["design"]] == [d["selected"] for d in tb["design"]]
        np.testing.assert_allclose([d["pi"] for d in ta["design"]], [d["pi"] for d in tb["design"]], atol=1e-5)
        assert ta["rewards"] == tb["rewards"]
        np.testing.assert_allclose(ta["advantages"], tb["advantages"], atol=1e-5)
    assert a["trace"][0]["stats"]["pair/warmup"] == 1.0 and a["trace"][-1]["stats"]["pair/warmup"] == 0.0
    assert a["trace"][-1]["stats"]["pair/warm_started_groups"] == b["trace"][-1]["stats"]["pair/warm_started_groups"] > 0
    assert a["n_labels"] == b["n_labels"] > 0
    assert a["heads_checksum"] == pytest.approx(b["heads_checksum"], rel=1e-5)
    assert a["model_checksum"] == pytest.approx(b["model_checksum"], rel=1e-6)
    np.testing.assert_allclose(a["warm_start"]["profiles"]["4"], b["warm_start"]["profiles"]["4"], atol=1e-5)
    pads = 0
    for d, world in ((d1, 1), (d2, 2)):
        for scenario in ("agree", "spg2"):
            for r in range(world):
                rec = json.loads((d / f"{scenario}_rank{r}.json").read_text())
                assert rec["world"] == world and rec["spg"] == (2 if scenario == "spg2" else 1)
                rep = two_rank.coefficient_report(rec)
                assert rep["rows"] > 0 and rep["nonzero_rows"] > 0, (scenario, r, rep)
                assert rep["max_rel"] < 1e-5 and rep["unscaled_dev"] < 1e-6, (scenario, world, r, rep)
                pads += rep["pad_rows"] if world == 2 else 0
    assert pads > 0, "no rank was padded; the two-process check would not exercise pad rows"


# --------------------------------------------------------------------------------------------- resume
def test_resume_restores_heads_replay_window_and_warm_start(tmp_path):
    tr = make_trainer(tmp_path / "a", max_steps=2, save_strategy="steps", save_steps=2)
    preload_labels(tr)
    tr.train()
    saved = copy.deepcopy(tr.rollout_strategy.heads.heads.state_dict())
    saved_strategy = copy.deepcopy(tr.rollout_strategy.state_dict())
    assert tr.rollout_strategy.heads.heads.n_labels > 0 and tr.rollout_strategy.heads.needs_refresh and saved_strategy["warm_start"]["profiles"]
    ckpt = tmp_path / "a" / "checkpoint-2"
    assert (ckpt / "trl_ext_state.pt").exists()
    tr2 = make_trainer(tmp_path / "b", max_steps=3)
    assert tr2.rollout_strategy.heads.heads.n_labels == 0 and not tr2.rollout_strategy.warm_start.profiles
    snap = {}
    load = tr2.load_ext_state_dict

    def load_and_snapshot(state):  # the state right after the checkpoint is restored (training then continues)
        load(state)
        snap.update(heads=copy.deepcopy(tr2.rollout_strategy.heads.heads.state_dict()), refresh=tr2.rollout_strategy.heads.needs_refresh,
                    strategy=copy.deepcopy(tr2.rollout_strategy.state_dict()))

    tr2.load_ext_state_dict = load_and_snapshot
    tr2.train(resume_from_checkpoint=str(ckpt))
    got = snap["heads"]
    for key in ("features", "rewards", "costs", "inclusion"):
        assert torch.equal(got["replay"][key], saved["replay"][key])
    for head in ("success_head", "cost_head"):
        for name, t in saved[head].items():
            assert torch.equal(got[head][name], t), name
    assert got["temperature"] == saved["temperature"] and got["n_seen"] == saved["n_seen"]
    assert got["optimizer"]["state"].keys() == saved["optimizer"]["state"].keys()
    no_heads = lambda st: {k: v for k, v in st.items() if k != "heads"}  # noqa: E731 - the heads are compared above
    assert snap["refresh"] and no_heads(snap["strategy"]) == no_heads(saved_strategy)
    assert snap["strategy"]["generation_index"] == 2
    assert tr2.state.global_step == 3 and tr2.rollout_strategy.heads.heads.n_seen > saved["n_seen"]  # training continued from there
    assert tr2.rollout_strategy.design_log[0]["warm_started"]  # the resumed step started from the restored profile


# --------------------------------------------------------------------------------------------- vLLM stand-in
class FakeVLLMGeneration:
    """Stand-in for TRL's ``VLLMGeneration`` (vLLM is not installed): ``generate`` returns fixed digit tokens with
    per-token top-1 log-probs and records the prompts and the ``max_completion_length`` of each call."""

    mode = "colocate"
    tensor_parallel_size = 1

    def __init__(self, token: int, max_completion_length: int):
        self.token = token
        self.max_completion_length = max_completion_length
        self.calls = []

    def sync_weights(self):
        pass

    def generate(self, prompts, images, num_generations, profiler=None):
        n = self.max_completion_length
        self.calls.append({"prompts": [list(p) for p in prompts], "max": n})
        phase = len(self.calls)
        comp = [[self.token] * n for _ in prompts]
        lps = [[[-float(phase) - 0.01 * t] for t in range(n)] for _ in prompts]
        return prompts, comp, lps, None


def test_vllm_continuation_resubmits_prefix_and_concatenates_logprobs(tmp_path, monkeypatch):
    tr = make_trainer(tmp_path)
    tok = tr.processing_class
    fake = FakeVLLMGeneration(tok.convert_tokens_to_ids("7"), tr.args.max_completion_length)
    tr.use_vllm = True
    tr.vllm_generation = fake
    tr._last_loaded_step = tr.state.global_step  # test scaffolding of the fake engine: TRL skips its weight sync
    from trl_ext.testbed import make_dataset

    ds = make_dataset("addition", 2, seed=0)
    rows = [dict(ds[k], trl_ext_row_idx=k) for k in range(2) for _ in range(8)]
    tr.model.train()
    groups = tr.rollout_strategy.rollout(tr.rollout_api, rows)
    captured = {"ids": groups.completion_ids, "lps": groups.logprobs, "is_pad": groups.is_pad}
    tau, L = tr.rollout_strategy.probe_len(), tr.args.max_completion_length
    assert [c["max"] for c in fake.calls] == [tau, L - tau]
    assert fake.max_completion_length == L  # restored
    n_sel = sum(sum(d["selected"]) for d in tr.rollout_strategy.design_log)
    assert len(fake.calls[1]["prompts"]) == n_sel == len(captured["ids"]) and captured["is_pad"] is None
    prompt_ids = compat.tokenize_prompts(tr, [rows[0]["prompt"]])
    assert fake.calls[1]["prompts"][0] == prompt_ids[0] + [fake.token] * tau  # prompt + prefix resubmitted
    for ids, lp in zip(captured["ids"], captured["lps"]):
        assert len(ids) == len(lp) == L
        np.testing.assert_allclose(lp, [-1 - 0.01 * t for t in range(tau)] + [-2 - 0.01 * t for t in range(L - tau)])


# --------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "over, match",
    [
        (dict(pair_prefix_tokens=5), "must be < max_completion_length"),
        (dict(pair_prefix_tokens=3, pair_snap_window=2), "must be < max_completion_length"),
        (dict(pair_budget_ratio=0.05), "below pair_pi_min"),
        (dict(pair_budget_ratio=1.5), r"pair_budget_ratio must be in \(0, 1\]"),
        (dict(pair_pi_min=0.0), r"pair_pi_min must be in \(0, 1\]"),
        (dict(pair_w_max=0.5), "pair_w_max"),
        (dict(per_device_train_batch_size=12), "(multiple of|divisible by) num_generations"),
        (dict(signal_only_denominator=True, loss_type="grpo"), "signal_only_denominator"),
        (dict(loss_type="bnpo"), "pair_fixed_normalizer"),
        (dict(pair_replay_size=4, pair_head_min_labels=8), "pair_replay_size"),
        (dict(pair_edge_proxy="energy"), "pair_edge_proxy"),
        (dict(dynamic_sampling=True), "dynamic_sampling"),
        (dict(keyed_sampling=True), "keyed_sampling"),
        (dict(advantage_estimator="rloo"), "trains with advantage_estimator='pair_draw'"),
        (dict(pair_lr_scaling="sqrt"), "pair_lr_scaling"),
    ],
)
def test_config_validation(tmp_path, over, match):
    with pytest.raises(ValueError, match=match):
        make_config(tmp_path, **over)


def test_config_defaults_and_upgrade_of_a_plain_trl_config(tmp_path):
    from trl import GRPOConfig

    cfg = PAIRConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    trl_cfg = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    # drop-in: TRL's arguments keep TRL's defaults (G = 8; the paper's G = 16 is set explicitly)
    assert cfg.num_generations == trl_cfg.num_generations == 8
    assert cfg.per_device_train_batch_size == trl_cfg.per_device_train_batch_size
    assert cfg.generation_batch_size == trl_cfg.generation_batch_size
    assert PAIRConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=16,
                      per_device_train_batch_size=16).num_generations == 16
    assert cfg.pair_budget_ratio == 0.5 and cfg.pair_pi_min == 0.08
    assert cfg.pair_tau == min(256, cfg.max_completion_length // 8)
    assert not (cfg.pair_standardize or cfg.pair_self_normalize or cfg.pair_anchor_pair) and cfg.pair_w_max is None
    assert cfg.pair_replay_size == 2048 and cfg.pair_head_hidden == 256 and cfg.pair_summary_last_k == 16
    assert cfg.pair_solver_warm_start and cfg.pair_fixed_normalizer
    from trl_ext.trainers.base import as_config

    assert PAIRTrainer.config_class is PAIRConfig
    plain = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=4,
                       per_device_train_batch_size=8, max_completion_length=16)
    up = as_config(plain, PAIRConfig, "PAIRTrainer")
    assert isinstance(up, PAIRConfig) and up.num_generations == 4 and up.pair_budget_ratio == 0.5
    assert up.pair_tau == 2
    bad = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=4,
                     per_device_train_batch_size=8, max_completion_length=16, loss_type="bnpo")
    with pytest.raises(ValueError, match="pair_fixed_normalizer"):  # PAIR's validation runs on the upgrade
        as_config(bad, PAIRConfig, "PAIRTrainer")
    with pytest.raises(TypeError, match="PAIRConfig"):
        PAIRTrainer(model=None, args=object())


@pytest.mark.parametrize("mode, factor", [("sqrt_budget", 0.5 ** 0.5), ("linear_budget", 0.5), ("none", 1.0)])
def test_learning_rate_scaling_reaches_the_optimizer_and_the_logs(tmp_path, caplog, mode, factor):
    """``pair_lr_scaling``: the optimizer (and the scheduler built on it, hence the logged ``learning_rate``) runs at
    ``learning_rate x factor``; the construction log says so; ``sqrt_budget`` is the default."""
    import logging

    assert PAIRConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none").pair_lr_scaling == "sqrt_budget"
    from trl_ext import DropInDifferenceWarning

    with caplog.at_level(logging.INFO, logger="trl_ext.trainers.base"), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tr = make_trainer(tmp_path, pair_lr_scaling=mode, lr_scheduler_type="constant")
    said = [r.getMessage() for r in caplog.records if "optimizer learning rate" in r.getMessage()]
    warned = [str(x.message) for x in w if issubclass(x.category, DropInDifferenceWarning)]
    assert len(said) == len(warned) == (mode != "none")  # the INFO line and one warning users see
    if said:
        assert f"{factor * 1e-3:.3g}" in said[0] and mode in said[0] and said[0] in warned[0]
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.train()
    assert all(g["lr"] == pytest.approx(1e-3 * factor) for g in tr.optimizer.param_groups)
    assert tr.state.log_history[0]["learning_rate"] == pytest.approx(1e-3 * factor)
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))
    # an optimizer the caller passes in is never rescaled
    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset

    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0)
    own = torch.optim.AdamW(model.parameters(), lr=2e-3)
    tr2 = PAIRTrainer(model=model, reward_funcs=[parity_reward], args=make_config(tmp_path / "own",
                      pair_lr_scaling=mode, lr_scheduler_type="constant"), train_dataset=make_dataset("addition", 32, seed=0), processing_class=tok,
                      optimizers=(own, None))
    tr2.train()
    assert own.param_groups[0]["lr"] == pytest.approx(2e-3)


def test_every_option_is_declared_once_with_help_and_documented():
    """Options declared once: each PAIR field has its help metadata, no other class mirrors them, and
    ``docs/pair.md`` lists every one."""
    own = [f for f in dataclasses.fields(PAIRConfig) if f.name in PAIRConfig.__annotations__]
    assert {f.name for f in own} >= {"pair_budget_ratio", "pair_solver_warm_start"}
    assert not {f.name for f in own} & {"num_generations", "per_device_train_batch_size"}  # TRL's, not redeclared
    for f in own:
        assert len(f.metadata.get("help", "")) > 10, f.name
    doc = open(os.path.join(ROOT, "docs", "pair.md")).read()
    missing = [f.name for f in own if f"`{f.name}`" not in doc]
    assert not missing, f"docs/pair.md does not document {missing}"
    src = "".join(open(m.__file__).read() for m in (pair_mod, pair_config, pair_rollouts))
    assert len(re.findall(r"^\s+pair_budget_ratio\b", src, flags=re.M)) == 1  # one declaration, no mirror class


@pytest.mark.parametrize("over, probe", [
    (dict(max_completion_length=8, pair_prefix_tokens=None), 1),  # default tau = L // 8 = 1
    (dict(max_completion_length=16, pair_prefix_tokens=None), 2),  # default tau = 2
    (dict(max_completion_length=5, pair_prefix_tokens=1, pair_snap_window=1), 2),
    (dict(max_completion_length=24, pair_prefix_tokens=None), 3),  # default tau = 3: no warning
    (dict(max_completion_length=5, pair_prefix_tokens=2, pair_snap_window=1), 3),
])
def test_a_one_or_two_token_probe_warns_at_construction(tmp_path, over, probe):
    """A 1-2-token probe: the heads see almost nothing, and the benchmark on 5-token answers showed PAIR losing; the
    trainer says so when it is built (whatever the config class), and only then."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr = make_trainer(tmp_path, **over)
    assert tr.rollout_strategy.probe_len() == probe
    msgs = [str(w.message) for w in caught if issubclass(w.category, pair_mod.PAIRShortProbeWarning)]
    if probe > pair_mod.SHORT_PROBE_TOKENS:
        assert not msgs and pair_mod.short_probe_message(tr.rollout_strategy.options, tr.args.max_completion_length) is None
        return
    assert len(msgs) == 1
    msg = msgs[0]
    assert f"only {probe} token(s)" in msg and "see almost nothing" in msg
    assert "5-token answers" in msg and "PAIR lost" in msg and "trl_ext.GRPOTrainer" in msg
    assert ("max_completion_length // 8" in msg) == (over["pair_prefix_tokens"] is None)


def test_generated_tokens_with_trls_own_arguments_within_the_documented_factor(tmp_path):
    """Drop-in compute: the same TRL arguments (TRL's defaults: G = 8, per_device_train_batch_size 8, loss dapo;
    completions fixed at L tokens with ``generation_kwargs={"min_new_tokens": L}``) given to TRL's GRPO
    (``trl_ext.GRPOTrainer`` + default ``ExtGRPOConfig``) and to PAIR. Per step GRPO generates G x L tokens per
    prompt; PAIR generates G probes of tau + w tokens plus the continued suffixes -- never more than GRPO -- and the
    design's expected tokens equal the factor ``describe()`` logs (``tau/L + ratio x (1 - tau/L)``, at most
    ``tau/L + ratio``); the realized total is within binomial noise of it."""
    import warnings

    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset
    from trl_ext.trainers.base import ExtGRPOConfig, GRPOTrainer

    L, steps = 24, 6
    trl_args = dict(max_completion_length=L, generation_kwargs={"min_new_tokens": L}, max_steps=steps,
                    learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none", logging_steps=1,
                    save_strategy="no", seed=0, dataloader_num_workers=0, disable_tqdm=True)

    def run(cls, config_cls, name):
        torch.set_num_threads(1)
        tok = build_tokenizer()
        tr = cls(model=build_tiny_model(tok, seed=0), reward_funcs=[parity_reward],
                 args=config_cls(output_dir=str(tmp_path / name), **trl_args),
                 train_dataset=make_dataset("addition", 32, seed=0), processing_class=tok)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # min_new_tokens > the probe's cap: transformers' length warning
            tr.train()
        return tr

    grpo, pair = run(GRPOTrainer, ExtGRPOConfig, "grpo"), run(PAIRTrainer, PAIRConfig, "pair")
    G, K = pair.args.num_generations, pair.args.per_device_train_batch_size // pair.args.num_generations
    assert G == grpo.args.num_generations == 8 and K == 1  # TRL's defaults on both sides
    n_probe = pair.rollout_strategy.probe_len()
    ratio = pair.args.pair_budget_ratio
    factor = pair.rollout_strategy.expected_token_factor()
    assert n_probe == 3 and factor == pytest.approx(n_probe / L + ratio * (1 - n_probe / L))
    assert factor <= n_probe / L + ratio and factor <= 1.0
    line = pair.rollout_strategy.describe(pair.rollout_api)
    assert f"= {factor:.3g}x TRL's generated tokens (<= 1x" in line
    per_batch = pair.args.generation_batch_size * ratio
    warm = math.ceil(pair.args.pair_head_min_labels / per_batch)
    assert f"pair_head_min_labels = {pair.args.pair_head_min_labels} labels: about {warm} generation batch" in line
    trl_tokens = metric(grpo, "ext/generated_tokens")
    assert trl_tokens == [float(K * G * L)] * steps  # fixed-length completions: TRL's count is exact
    pair_tokens = metric(pair, "ext/generated_tokens")
    continued, finished = metric(pair, "pair/continued_from_prefix"), metric(pair, "pair/finished_in_prefix")
    pi_mean, warmup = metric(pair, "pair/pi_mean"), metric(pair, "pair/warmup")
    assert len(pair_tokens) == steps and set(finished) == {0.0} and set(warmup) == {1.0}
    for tok_s, cont, pi, trl_s in zip(pair_tokens, continued, pi_mean, trl_tokens):
        assert tok_s == K * G * n_probe + cont * (L - n_probe)  # every probe + every continued suffix, counted once
        assert tok_s <= trl_s  # never more than TRL's GRPO
        expected = K * G * n_probe + pi * K * G * (L - n_probe)  # the design's expectation (logged pi, pre-outcome)
        assert expected / trl_s == pytest.approx(factor, abs=1e-9)
    realized = sum(pair_tokens) / sum(trl_tokens)
    n = steps * K * G
    slack = 3 * math.sqrt(ratio * (1 - ratio) / n) * (1 - n_probe / L)
    assert abs(realized - factor) <= slack, (realized, factor, slack)
    assert realized <= n_probe / L + ratio + slack


def test_pair_module_uses_no_trl_private_names():
    src = "".join(open(m.__file__).read() for m in (pair_mod, pair_config, pair_rollouts))
    private = re.compile(r"(?<![A-Za-z0-9_])_(generate_and_score_completions|generate_single_turn|generate|"
                         r"tokenize_prompts|tokenizer|metrics|logs|compute_loss|dist|calculate_rewards|prepare_inputs|"
                         r"finish_rollouts|last_loaded_step|buffered_inputs)\b")
    assert not private.findall(src), private.findall(src)


def test_the_strategy_calls_no_pair_trainer_method():
    """One direction of calls: the strategy module reads PAIR options from its ``options`` (a ``PAIRConfig``) but
    never touches a ``pair_*`` attribute of the trainer (heads, features and delimiters are built with it)."""
    import ast

    tree = ast.parse(open(pair_rollouts.__file__).read())
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith(("pair_", "_pair_")):
            owner = node.value
            if not ((isinstance(owner, ast.Attribute) and owner.attr in ("args", "options"))
                    or (isinstance(owner, ast.Name) and owner.id in ("a", "args", "options"))):
                bad.append(f"line {node.lineno}: .{node.attr}")
    assert not bad, bad


# --------------------------------------------------------------------------------------------- bad input
def test_degenerate_invalid_and_malformed_head_outputs(trainer):
    rng = np.random.default_rng(0)
    c = np.full(8, 3.0)
    fin = np.zeros(8, bool)
    for p in (np.zeros(8), np.ones(8)):  # saturated group: every edge proxy vanishes
        d = design_and_draw(trainer, p, c, fin, rng)
        assert d.degenerate and not d.fell_back
        np.testing.assert_allclose(d.pi, 0.5)
    for p, cc in ((np.full(8, np.nan), c), (np.full(8, 0.5), np.full(8, -1.0)), (np.full(8, 1.5), c)):
        d = design_and_draw(trainer, p, cc, fin, rng)
        assert d.fell_back and d.reason == "invalid head output (uniform)"
        np.testing.assert_allclose(d.pi, 0.5)
    with pytest.raises(ValueError, match="G >= 2"):
        design_and_draw(trainer, [0.5], [1.0], [False], rng)
    with pytest.raises(ValueError, match=r"\(G,\)"):
        design_and_draw(trainer, [0.5, 0.5], [1.0], [False, False], rng)


def test_nan_reward_on_completed_vertex_is_an_unobserved_vertex(trainer):
    """The one NaN rule (``scorable_selection``): an unscorable completed vertex observes no edge, gets 0, and the
    others keep their logged weights -- not the former "NaN = reward 0"."""
    draw = design_and_draw(trainer, np.linspace(0.1, 0.9, 6), np.full(6, 2.0), np.zeros(6, bool),
                                        np.random.default_rng(3))
    draw = dataclasses.replace(draw, selected=np.array([True, True, True, False, True, False]))
    r = np.array([1.0, np.nan, 0.0, np.nan, 1.0, np.nan])
    got, res = group_advantages(trainer, r, draw)
    assert res.n_unscorable == 1 and got[1] == got[3] == got[5] == 0.0
    unobserved = dataclasses.replace(draw, selected=np.array([True, False, True, False, True, False]))
    np.testing.assert_allclose(got, group_advantages(trainer, r, unobserved)[0], rtol=0, atol=0)
    as_zero = group_advantages(trainer, np.nan_to_num(r, nan=0.0), draw)[0]
    assert np.abs(got - as_zero).max() > 1e-3


def test_nan_rule_keeps_the_trainer_design_unbiased(trainer):
    """Exact enumeration through the trainer's design + advantages: with candidate 5 unscorable whenever it is
    completed, E_design[A] equals the complete-pair advantages of the population in which every contrast with the
    unscorable candidate is zero."""
    G = 6
    rng = np.random.default_rng(4)
    p, c = rng.uniform(0.1, 0.9, G), rng.uniform(1.0, 10.0, G)
    r = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    unscorable = np.arange(G) == 5
    draw = design_and_draw(trainer, p, c, np.zeros(G, bool), np.random.default_rng(0))
    expect = np.zeros(G)
    for bits in itertools.product([False, True], repeat=G):
        sel = np.array(bits)
        prob = float(np.prod(np.where(sel, draw.pi, 1.0 - draw.pi)))
        rr = np.where(sel & ~unscorable, r, np.nan)
        expect += prob * group_advantages(trainer, rr, dataclasses.replace(draw, selected=sel))[0]
    ok = ~unscorable
    M = G * (G - 1) / 2
    target = np.array([sum(r[i] - r[j] for j in range(G) if j != i and ok[j]) / (2 * M) if ok[i] else 0.0
                       for i in range(G)])
    np.testing.assert_allclose(expect, target, atol=1e-12)


def test_unscorable_rows_in_training_are_counted_and_get_no_advantage_or_label(tmp_path):
    def sometimes_none(prompts, completions, **kw):
        out = parity_reward(prompts, completions)
        return [None if zlib.crc32(("x" + _text(c)).encode()) % 3 == 0 else v for c, v in zip(completions, out)]

    tr = two_rank.build(str(tmp_path), per_device=16, max_steps=3, reward_funcs=[sometimes_none])
    labels_before = []
    orig = tr.rollout_strategy.heads.heads.add_labels

    def count_labels(f, r, c, pi):
        labels_before.append(int(r.numel()))
        return orig(f, r, c, pi)

    tr.rollout_strategy.heads.heads.add_labels = count_labels
    tr.train()
    nan_total = 0
    for gen in tr.generations:
        r = np.asarray(gen["rewards"])
        real = ~np.asarray(gen["is_pad"])
        nan_rows = real & np.isnan(r)
        assert np.all(np.asarray(gen["advantages"])[nan_rows] == 0.0)
        np.testing.assert_allclose(gen["advantages"], two_rank.independent_pair_advantages(gen), atol=1e-6)
        assert gen["stats"]["pair/nan_rewards"] == int(nan_rows.sum())
        nan_total += int(nan_rows.sum())
    assert nan_total > 0, "no unscorable completion; the test would be vacuous"
    completed = sum(int((~np.asarray(g["is_pad"])).sum()) for g in tr.generations)
    assert sum(labels_before) == completed - nan_total  # unscorable completions carry no label


def test_solver_failure_falls_back_and_is_logged(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("injected solver failure")

    monkeypatch.setattr(pair_est, "run_slsqp", boom)
    tr = make_trainer(tmp_path)
    preload_labels(tr)
    tr.train()
    assert metric(tr, "pair/solver_fallbacks")[-1] == 2.0  # both prompts
    assert metric(tr, "pair/warmup")[-1] == 0.0
    assert all(d["reason"].startswith("solver failed") for d in tr.rollout_strategy.design_log)
    assert metric(tr, "pair/predicted_suffix_cost")[-1] <= metric(tr, "pair/budget")[-1] * (1 + 1e-7)
    assert not tr.rollout_strategy.warm_start.profiles  # fallbacks are not solutions to learn from


def test_nan_head_outputs_are_replaced_and_counted(tmp_path):
    tr = make_trainer(tmp_path)
    preload_labels(tr)
    with torch.no_grad():
        for p in tr.rollout_strategy.heads.heads.success_head.parameters():
            p.fill_(float("nan"))
    tr.train()
    assert metric(tr, "pair/head_nonfinite")[-1] == 16.0
    assert np.isfinite(metric(tr, "loss")).all()
    assert all(np.all(np.isfinite(d["pi"])) for d in tr.rollout_strategy.design_log)


def alternating_reward(prompts, completions, **kw):
    return [float(i % 2) for i in range(len(completions))]


def test_every_candidate_finishing_inside_the_prefix(tmp_path):
    tr = make_trainer(tmp_path, reward=alternating_reward, cls=Scripted)
    eos = tr.processing_class.eos_token_id
    tr.script = lambda n: [tr.processing_class.convert_tokens_to_ids("3"), eos]
    tr.train()
    assert tr.generation_calls == [(16, 2)]  # probe only: nothing left to continue
    stats = tr.rollout_strategy.last_stats
    assert stats["pair/all_finished_groups"] == stats["pair/groups"] == 2
    assert stats["pair/completed_vertices"] == 16 and stats["pair/realized_suffix_tokens"] == 0
    assert metric(tr, "ext/generated_tokens") == [32.0]
    b, adv = tr.last_rollout_batch, tr.last_advantages
    for g in range(2):
        rows = (b.group_ids == g).numpy()
        np.testing.assert_allclose(adv[rows].numpy(), full_advantages(tr, b.rewards[rows].numpy()), atol=1e-6)
    assert adv.abs().sum() > 0


def test_zero_selected_vertices_are_counted_and_masked(tmp_path, monkeypatch):
    tr = make_trainer(tmp_path, cls=Scripted)
    digit = tr.processing_class.convert_tokens_to_ids("5")
    tr.script = lambda n: [digit] * n  # never finishes inside the prefix
    monkeypatch.setattr(pair_draw, "draw_selection", lambda pi, rng, anchor=None: np.zeros(len(pi), bool))
    seen = {}
    orig = tr.replay_rollouts

    def spy(groups, inputs):
        out, batch = orig(groups, inputs)
        seen["out"] = out
        return out, batch

    tr.replay_rollouts = spy
    tr.train()
    seen["mask"], seen["items"] = seen["out"]["completion_mask"], seen["out"]["num_items_in_batch"]
    stats = tr.rollout_strategy.last_stats
    assert stats["pair/zero_edge_groups"] == stats["pair/groups"] == 2
    assert stats["pair/completed_vertices"] == 0 and stats["pair/observed_edges"] == 0
    assert stats["pair/prefix_tokens"] == 16 * 2 and stats["pair/realized_suffix_tokens"] == 0
    assert tr.generation_calls == [(16, 2)]  # no continuation call
    assert int(seen["mask"].sum()) == 0 and int(seen["items"]) == 0  # the pad row carries no loss
    assert bool(tr.last_rollout_batch.is_pad.all())
    assert float(tr.last_advantages.abs().sum()) == 0.0
    assert np.isfinite(metric(tr, "loss")).all()


# --------------------------------------------------------------------------------------------- example
def test_example_runs_with_peft_and_writes_summary(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "examples", "testbed"))
    import pair as pair_example

    from trl_ext.testbed import save_tiny_model

    torch.set_num_threads(1)
    model_dir = save_tiny_model(str(tmp_path / "tiny"), seed=0)
    out = tmp_path / "out"
    rc = pair_example.main(["--model_path", model_dir, "--output_dir", str(out), "--max_steps", "2", "--seed", "0",
                            "--num_generations", "4", "--prompts_per_step", "2", "--n_eval", "4",
                            "--eval_samples", "1", "--prefix_tokens", "1", "--use_peft"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    tok = summary["method"]["train_generated_tokens"]
    assert summary["schema"] == "trl_ext.testbed_summary/v1"  # the one schema of every testbed example
    assert summary["trainer"] == "pair" and summary["method"]["use_peft"]
    assert tok["generated"] == tok["prefix"] + tok["suffix"] and tok["prefix"] == 2 * 2 * 4  # steps x rows x tau
    assert summary["generated_tokens"]["train_completion_tokens"] == tok["generated"]
    assert (out / "trainer_state.json").exists() and (out / "outcomes_after_sampled.jsonl").exists()


# ------------------------------------------------------------------------------------------- PAIR selected by config
def _pair_by_config(tmp_path, max_steps=3, **strategy_kwargs):
    from trl_ext import ExtGRPOConfig, GRPOTrainer
    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset

    torch.set_num_threads(1)
    tok = build_tokenizer()
    kw = dict(output_dir=str(tmp_path), per_device_train_batch_size=16, num_generations=8, max_completion_length=5,
              max_steps=max_steps, learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none", beta=0.0,
              logging_steps=1, save_strategy="no", seed=0, temperature=1.0, dataloader_num_workers=0,
              disable_tqdm=True, advantage_estimator="pair_draw", rollout_strategy="pair_prefix_probe",
              rollout_strategy_kwargs={"prefix_tokens": 2, "head_min_labels": 8, "head_fit_steps": 20,
                                       **strategy_kwargs})
    ds = make_dataset("addition", 32, seed=0)
    return GRPOTrainer(model=build_tiny_model(tok, seed=0), reward_funcs=[first_char_reward],
                       args=ExtGRPOConfig(**kw), train_dataset=ds, eval_dataset=ds.select(range(4)),
                       processing_class=tok)


def test_pair_selected_by_config_on_the_base_trainer_equals_the_preset(tmp_path):
    """``advantage_estimator="pair_draw"`` + ``rollout_strategy="pair_prefix_probe"`` on the base trainer trains as
    ``PAIRTrainer`` with ``pair_lr_scaling="none"`` (the base trainer does not rescale its optimizer): the same
    designs, advantages, heads and weights after three steps (the heads leave warm-up), the same evaluation loss."""
    from trl_ext import GRPOTrainer
    from trl_ext.testbed import make_dataset

    runs = {}
    for name in ("config", "preset"):
        if name == "config":
            tr = _pair_by_config(tmp_path / name)
            assert type(tr) is GRPOTrainer and isinstance(tr.rollout_strategy, PrefixProbeRollouts)
        else:
            tr = make_trainer(tmp_path / name, reward=first_char_reward, max_steps=3, pair_lr_scaling="none")
            tr.eval_dataset = make_dataset("addition", 32, seed=0).select(range(4))
        tr.train()
        strat = tr.rollout_strategy
        runs[name] = (tr.last_advantages.clone(), [d["pi"] for d in strat.design_log], strat.heads.heads.n_labels,
                      [p.detach().clone() for p in tr.model.parameters()], dict(strat.totals), tr.evaluate())
    (a0, d0, n0, w0, t0, e0), (a1, d1, n1, w1, t1, e1) = runs["config"], runs["preset"]
    assert torch.equal(a0, a1) and bool((a0 != 0).any())
    assert all(np.array_equal(x, y) for x, y in zip(d0, d1)) and len(d0) == len(d1) > 0
    assert n0 == n1 >= 8 and t0 == t1
    assert all(torch.equal(x, y) for x, y in zip(w0, w1))
    assert e0["eval_loss"] == e1["eval_loss"]


def test_pair_by_config_checkpoints_its_heads(tmp_path):
    tr = _pair_by_config(tmp_path / "a", max_steps=2)
    tr.train()
    state = tr.ext_state_dict()["rollout_strategy"]
    assert state["name"] == "pair_prefix_probe" and state["state"]["heads"]["heads"] is not None
    fresh = _pair_by_config(tmp_path / "b", max_steps=2)
    assert fresh.rollout_strategy.heads.heads.n_labels != tr.rollout_strategy.heads.heads.n_labels
    fresh.load_ext_state_dict(tr.ext_state_dict())
    assert fresh.rollout_strategy.heads.heads.n_labels == tr.rollout_strategy.heads.heads.n_labels
    assert fresh.rollout_strategy.generation_index == tr.rollout_strategy.generation_index == 2


@pytest.mark.parametrize("kwargs, match", [
    ({"budget_ratio": 2.0}, r"pair_budget_ratio must be in \(0, 1\]"),
    ({"lr_scaling": "sqrt_budget"}, "cannot rescale the optimizer"),
    ({"budjet_ratio": 0.5}, r"unknown rollout_strategy_kwargs \['budjet_ratio'\]"),
    ({"prefix_tokens": 5}, "must be < max_completion_length"),
])
def test_pair_strategy_kwargs_are_checked_when_the_config_is_built(tmp_path, kwargs, match):
    from trl_ext import ExtGRPOConfig

    with pytest.raises(ValueError, match=match):
        ExtGRPOConfig(str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=16, report_to="none",
                      num_generations=8, max_completion_length=5, advantage_estimator="pair_draw",
                      rollout_strategy="pair_prefix_probe", rollout_strategy_kwargs=kwargs)

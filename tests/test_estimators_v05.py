"""Tests for trl_ext.estimators.v05: shrinkage fusion (Eq. 6-9, Theorems 3.2-3.4) and OSLA (Theorem 3.6)."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

import trl_ext.estimators.v05 as v05_estimators
from trl_ext.estimators import (
    FusionResult,
    OslaStep,
    equal_prompt_weights,
    fused_advantages,
    fused_advantages_batch,
    get_advantage_estimator,
    osla_allocate,
    osla_cap,
    osla_need_more,
    osla_next_counts,
    osla_should_stop,
    osla_step,
    osla_target,
    shrinkage_fusion,
    shrinkage_fusion_batch,
    to_signed_reward,
)


def _exact_binary(p, V, k):
    """Exact law of the fused baseline over the k+1 binomial outcomes of k {-1, 1} rewards."""
    j = np.arange(k + 1)
    rewards_mean = (2 * j - k) / k
    pmf = binom.pmf(j, k, p)
    fr = shrinkage_fusion_batch(np.where(np.arange(k)[None, :] < j[:, None], 1.0, -1.0), None, np.full(k + 1, V))
    np.testing.assert_allclose(fr.mean, rewards_mean, atol=1e-12)
    return pmf, fr


# ------------------------------------------------------------------------------------------ Theorem 3.4
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 8, 16, 32])
def test_theorem_3_4_bias_bound_by_exact_enumeration(k):
    worst = 0.0
    for p in np.linspace(0, 1, 41):
        for V in np.linspace(-1, 1, 41):
            pmf, fr = _exact_binary(p, V, k)
            bias = float(pmf @ fr.baseline - (2 * p - 1))
            worst = max(worst, abs(bias))
            assert abs(bias) <= 1 / math.sqrt(k) + 1e-12, (p, V, k, bias)
    assert worst > 0.2 / math.sqrt(k)  # the bound is not vacuous on this grid


@pytest.mark.parametrize("p, V", [(0.5, 0.8), (0.2, 0.9), (0.9, -0.5), (0.5, 0.3)])
def test_theorem_3_4_bias_decays_as_one_over_k(p, V):
    # with Delta = |V - mu_true| != 0 the bias is O(1/k); in fact k * |bias| -> 1 / Delta
    delta = abs(V - (2 * p - 1))
    pmf, fr = _exact_binary(p, V, 512)
    k_bias = 512 * abs(pmf @ fr.baseline - (2 * p - 1))
    assert k_bias == pytest.approx(1 / delta, rel=0.05)


def test_theorem_3_2_mse_decomposition_for_a_static_weight():
    for p, V, k, w in [(0.3, 0.5, 4, 0.3), (0.8, -0.2, 8, 0.7)]:
        j = np.arange(k + 1)
        v = (2 * j - k) / k
        pmf = binom.pmf(j, k, p)
        mu = 2 * p - 1
        mse = pmf @ (w * v + (1 - w) * V - mu) ** 2
        var = 4 * p * (1 - p) / k
        assert mse == pytest.approx(w**2 * var + (1 - w) ** 2 * (V - mu) ** 2, abs=1e-12)


# ------------------------------------------------------------------------------------------ Eq. 6-9
rewards_st = st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=20)
prior_st = st.floats(-1, 1, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(rewards_st, prior_st)
def test_fusion_properties(rewards, V):
    fr = shrinkage_fusion(rewards, V)
    k = len(rewards)
    gap2 = (np.mean(rewards) - V) ** 2
    assert fr.k == k and 0.0 <= fr.weight < 1.0
    # hypothesis-test equivalence (Eq. 7-8): w == 0 exactly when the discrepancy is within the 1/k noise bound,
    # decided in exact rational arithmetic on the given floats (a float gap2 can land a few ulps off an exact tie)
    exact_gap2 = (sum(Fraction(x) for x in rewards) / k - Fraction(V)) ** 2
    if exact_gap2 <= Fraction(1, k):
        assert fr.weight == 0.0
    elif exact_gap2 > Fraction(1, k) * (1 + Fraction(1, 10**9)):
        assert fr.weight > 0.0
    assert fr.accepted == (fr.bias2 == 0.0)
    if fr.weight == 0.0:
        assert fr.baseline == V
    assert -1.0 <= fr.baseline <= 1.0
    lo, hi = min(fr.mean, V), max(fr.mean, V)
    assert lo - 1e-12 <= fr.baseline <= hi + 1e-12  # convex combination
    # the pointwise step of the Theorem 3.4 proof: |mu* - vbar| <= 1/sqrt(k)
    assert abs(fr.baseline - fr.mean) <= 1 / math.sqrt(k) + 1e-12
    assert fr.bias2 == pytest.approx(max(0.0, gap2 - 1 / k), abs=1e-12)


def test_exact_ties_are_accepted_despite_round_off():
    # (vbar_k - V)^2 == 1/k exactly must accept the prior (Eq. 7 is "<= 1/k"). Before the fix, ~30% of these exact
    # ties (e.g. k = 9, three successes, V = 0: (-1/3)^2 vs 1/9) were rejected with bias2 ~ 1e-17.
    n_ties = 0
    for k in (1, 4, 9, 16, 25, 36, 49, 64, 81, 100):
        root = math.isqrt(k)
        for s in range(k + 1):
            r = np.array([1.0] * s + [-1.0] * (k - s))
            for sign in (1, -1):
                v_exact = Fraction(2 * s - k, k) + sign * Fraction(1, root)
                if abs(v_exact) > 1:
                    continue
                for V in (float(v_exact), 2.0 * float((v_exact + 1) / 2) - 1.0):  # as given, and as 2p - 1
                    if (Fraction(s - (k - s), k) - Fraction(V)) ** 2 > Fraction(1, k):
                        continue  # the float V is itself off the tie: not an exact tie any more
                    fr = shrinkage_fusion(r, V)
                    assert fr.bias2 == 0.0 and fr.weight == 0.0 and fr.accepted and fr.baseline == V, (k, s, V)
                    n_ties += 1
    assert n_ties > 500
    # just past the tie is still a rejection
    assert shrinkage_fusion([1.0, 1.0, 1.0, 1.0], 0.5 - 1e-9).bias2 > 0.0


def test_appendix_a8_worked_example():
    fr = shrinkage_fusion([1, 1, 1, -1], 0.8)  # vbar_4 = 0.5, |0.5 - 0.8| = 0.3 <= 0.5 -> accept
    assert fr.mean == 0.5 and fr.bias2 == 0.0 and fr.baseline == pytest.approx(0.8)
    fr = shrinkage_fusion([-1, -1, -1, -1], 0.8)  # discrepancy 1.8: reject, bias2 = 3.24 - 0.25
    assert fr.bias2 == pytest.approx(2.99) and fr.weight == pytest.approx(2.99 / 3.24)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=10), st.integers(0, 2**31 - 1))
def test_batch_matches_single_and_padded_form(sizes, seed):
    rng = np.random.default_rng(seed)
    ids = np.concatenate([np.full(n, j) for j, n in enumerate(sizes)])
    r = rng.choice([-1.0, 1.0], size=ids.size)
    priors = rng.uniform(-1, 1, size=len(sizes))
    perm = rng.permutation(ids.size)
    # first-appearance order after shuffling
    order = list(dict.fromkeys(ids[perm].tolist()))
    fb = shrinkage_fusion_batch(r[perm], ids[perm], priors[order])
    pad = np.full((len(sizes), max(sizes)), np.nan)
    for j, n in enumerate(sizes):
        pad[j, :n] = r[ids == j]
    fp = shrinkage_fusion_batch(pad, None, priors)
    for pos, j in enumerate(order):
        single = shrinkage_fusion(r[ids == j], priors[j])
        assert fb.k[pos] == single.k == fp.k[j]
        assert fb.baseline[pos] == pytest.approx(single.baseline, abs=1e-12)
        assert fp.weight[j] == pytest.approx(single.weight, abs=1e-12)


def test_nan_rewards_excluded_and_counted():
    fr = shrinkage_fusion([1.0, np.nan, -1.0, 1.0, 1.0], 0.0)
    assert fr.k == 4 and fr.mean == 0.5
    res = fused_advantages(torch.tensor([1.0, np.nan, -1.0, 1.0, 1.0]), 0.0)
    assert res.n_nan == 1 and res.advantages[1] == 0.0


# ------------------------------------------------------------------------------------------ advantages
def test_fused_advantage_formula_and_floor():
    r = np.array([1.0, -1.0, -1.0, 1.0])
    res = fused_advantages(r, 0.2)
    mu = res.extras["fusion"].baseline
    np.testing.assert_allclose(res.advantages, (r - mu) / math.sqrt(1 - mu**2))
    assert res.n_degenerate == 0
    # |mu*| -> 1: prior 1 accepted with one failure -> sigma* = 0 -> floor applies, |A| <= 2 / floor
    res = fused_advantages([1.0, 1.0, 1.0, -1.0], 1.0, floor=0.25)
    assert res.scale[0] == 0.25 and res.advantages[3] == pytest.approx(-8.0) and res.n_degenerate == 4
    assert np.isfinite(res.advantages).all()


@settings(max_examples=60, deadline=None)
@given(rewards_st, prior_st, st.floats(0.01, 1.0))
def test_fused_advantages_bounded(rewards, V, floor):
    res = fused_advantages(rewards, V, floor=floor)
    assert np.isfinite(res.advantages).all()
    assert np.abs(res.advantages).max() <= 2 / floor + 1e-9


def test_batch_advantages_and_registry():
    r = np.array([1, 1, -1, -1, 1, 1, 1, np.nan])
    ids = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    res = get_advantage_estimator("v05")(r, ids, priors=[0.0, 0.9])
    for j, V in enumerate([0.0, 0.9]):
        m = ids == j
        single = fused_advantages(r[m], V)
        np.testing.assert_allclose(res.advantages[m], single.advantages, atol=1e-12)
    assert res.n_nan == 1 and res.n_groups == 2 and res.n_zero_std_groups == 1
    with pytest.raises(ValueError, match="priors"):
        fused_advantages_batch(r, ids)


# ------------------------------------------------------------------------------------------ OSLA
def test_osla_target_and_cap():
    assert osla_cap(0.0039) == 16  # the paper's cap
    assert osla_cap(0.01) == 10 and osla_cap(0.001) == 32
    assert osla_target(0.0, 0.0039) == -math.inf
    assert osla_target(0.5, 0.0039) == pytest.approx(1 / math.sqrt(0.0039) - 2)
    t = osla_target(np.array([0.0, 1.0]), 0.01)
    assert t[0] == -math.inf and t[1] == pytest.approx(9.0)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(0, 4, allow_nan=False), min_size=1, max_size=30),
    st.floats(1e-4, 0.5),
    st.integers(1, 5),
    st.integers(1, 40),
)
def test_osla_never_exceeds_cap_and_is_monotone(bias2, cost, step, k0):
    b = np.array(bias2)
    cap = osla_cap(cost)
    k = np.full(b.size, min(k0, cap))
    for _ in range(cap + 1):
        nk = osla_next_counts(k, b, cost, step=step)
        assert (nk >= k).all() and (nk <= max(cap, k0)).all()
        need = osla_need_more(k, b, cost)
        assert ((nk > k) == need).all()
        # continuing only where k < 1/sqrt(c) - 1/bias2 (Theorem 3.6)
        assert not need[b == 0].any()
        k = nk
    assert not osla_need_more(k, b, cost).any()


def test_osla_allocate_stops_at_k_init_when_prior_accepted():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 0.95, size=64)

    def sample(idx, n):
        # deterministic rewards whose mean is as close to 2p-1 as 4 draws allow (always within 1/2)
        j = np.round(p[idx] * n).astype(int)
        return np.where(np.arange(n)[None, :] < j[:, None], 1.0, -1.0)

    out = osla_allocate(sample, 2 * p - 1, cost=0.0039, k_init=4)
    assert out.rounds == 0 and (out.k == 4).all() and out.fusion.accepted.all()
    np.testing.assert_allclose(out.fusion.baseline, 2 * p - 1)


def test_osla_allocate_expands_to_cap_for_hallucinating_prior():
    def sample(idx, n):
        return np.ones((len(idx), n))  # always right, prior says always wrong

    out = osla_allocate(sample, np.full(8, -1.0), cost=0.0039, min_active_frac=None)
    assert (out.k == 16).all() and out.rounds == 6 and not out.stopped_globally
    assert all(len(x) == 16 for x in out.rewards)
    assert isinstance(out.fusion, FusionResult) and (out.fusion.weight > 0.9).all()


def test_osla_global_stop():
    assert osla_should_stop([True] + [False] * 4)  # 20% < 25%
    assert not osla_should_stop([True] + [False] * 3)  # exactly 25% keeps going
    assert osla_should_stop([False, False], min_active_frac=0.0)

    def sample(idx, n):
        return np.ones((len(idx), n))

    priors = np.r_[np.full(1, -1.0), np.full(9, 1.0)]  # only 1 in 10 prompts disagrees with its prior
    out = osla_allocate(sample, priors)
    assert out.stopped_globally and (out.k == 4).all()
    out = osla_allocate(sample, priors, min_active_frac=None)
    assert out.k[0] == 16 and (out.k[1:] == 4).all()


def test_osla_step_one_round():
    k = np.array([4, 4, 4, 14, 16, 4])
    b2 = np.array([0.0, 3.0, 0.05, 3.0, 3.0, np.nan])  # accepted, rejected, barely rejected, near cap, at cap, untestable
    st = osla_step(k, b2, 0.0039)
    assert isinstance(st, OslaStep) and not st.stop and not st.stopped_globally
    # Theorem 3.6: 4 < 16.01 - 1/3 continues; 4 >= 16.01 - 20 stops; k = cap stops; NaN (no scorable rollout) stops
    assert st.need.tolist() == [False, True, False, True, False, False]
    assert st.add.tolist() == [0, 2, 0, 2, 0, 0]
    np.testing.assert_array_equal(k + st.add, np.where(st.need, osla_next_counts(k, np.nan_to_num(b2), 0.0039), k))
    # cap not a multiple of the step: never above the cap
    assert osla_step([15], [3.0], 0.0039).add.tolist() == [1]
    # global stop: 2 of 6 need more (33%) continues at 25%, stops at 50% (add all zero); nothing needed -> stop
    st = osla_step(k, b2, 0.0039, min_active_frac=0.5)
    assert st.stop and st.stopped_globally and not st.add.any() and st.need.sum() == 2
    st = osla_step([4, 4], [0.0, np.nan], 0.0039)
    assert st.stop and not st.stopped_globally
    assert osla_step([4, 4, 4, 4, 4], [3.0, 0, 0, 0, 0], 0.0039).stop  # 20% < 25%
    assert not osla_step([4, 4, 4, 4, 4], [3.0, 0, 0, 0, 0], 0.0039, min_active_frac=None).stop
    assert not osla_step([4, 4, 4, 4, 4], [3.0, 0, 0, 0, 0], 0.0039, min_active_frac=0.0).stop


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([None, 0.0, 0.25, 0.6]))
def test_osla_step_stacked_batches_equal_separate_calls(seed, frac):
    rng = np.random.default_rng(seed)
    k = rng.integers(4, 17, size=(3, 2, 8))
    b2 = np.where(rng.random(k.shape) < 0.5, 0.0, rng.uniform(0, 4, k.shape))
    b2[rng.random(k.shape) < 0.1] = np.nan
    st = osla_step(k, b2, 0.0039, min_active_frac=frac)
    assert st.add.shape == k.shape and st.stop.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            one = osla_step(k[i, j], b2[i, j], 0.0039, min_active_frac=frac)
            assert one.stop == st.stop[i, j] and one.stopped_globally == st.stopped_globally[i, j]
            np.testing.assert_array_equal(one.add, st.add[i, j])
            assert one.stop == (not one.need.any() or bool(frac) and one.need.mean() < frac)


def test_osla_allocate_decides_with_osla_step(monkeypatch):
    calls = []
    real = v05_estimators.osla_step

    def spy(*a, **kw):
        calls.append(a)
        return real(*a, **kw)

    monkeypatch.setattr(v05_estimators, "osla_step", spy)
    out = osla_allocate(lambda idx, n: np.ones((len(idx), n)), np.full(8, -1.0), min_active_frac=None)
    assert len(calls) == out.rounds + 1 == 7 and (out.k == 16).all()


def test_equal_prompt_weights_k4_vs_k16():
    k = np.array([4, 16])
    c = equal_prompt_weights(k)
    np.testing.assert_allclose(c, [2.5, 0.625])  # kbar = 10
    # equal completion lengths T and equal |A|: each prompt's total weight is c_j k_j T -> equal shares
    w_equal, w_rollout = c * k * 7.0, k * 7.0
    np.testing.assert_allclose(w_equal / w_equal.sum(), [0.5, 0.5])
    np.testing.assert_allclose(w_rollout / w_rollout.sum(), [0.2, 0.8])
    assert w_equal.sum() == pytest.approx(w_rollout.sum())  # the overall scale is unchanged
    np.testing.assert_allclose(equal_prompt_weights([4, 4, 4]), 1.0)
    with pytest.raises(ValueError, match="k"):
        equal_prompt_weights([0, 4])


# ------------------------------------------------------------------------------------------ helpers / bad input
def test_to_signed_reward():
    assert to_signed_reward(0.0) == -1.0 and to_signed_reward(1.0) == 1.0 and to_signed_reward(0.75) == 0.5
    np.testing.assert_allclose(to_signed_reward([0, 5, 10], low=0, high=10), [-1, 0, 1])
    assert np.isnan(to_signed_reward([np.nan]))[0]
    with pytest.raises(ValueError, match=r"\[0.0, 1.0\]"):
        to_signed_reward(1.5)
    with pytest.raises(ValueError, match="low < high"):
        to_signed_reward(0.5, low=1, high=1)


@pytest.mark.parametrize(
    "call, exc, msg",
    [
        (lambda: shrinkage_fusion([0.0, 2.0], 0.0), ValueError, r"\[-1.0, 1.0\]"),
        (lambda: shrinkage_fusion([0.0, 1.0], 1.5), ValueError, "prior"),
        (lambda: shrinkage_fusion([0.0, 1.0], np.nan), ValueError, "NaN"),
        (lambda: shrinkage_fusion([np.nan, np.nan], 0.0), ValueError, "no finite reward"),
        (lambda: shrinkage_fusion([], 0.0), ValueError, "empty"),
        (lambda: shrinkage_fusion([[1.0]], 0.0), ValueError, "1-D"),
        (lambda: shrinkage_fusion([1.0], [0.0, 0.1]), ValueError, "scalar"),
        (lambda: shrinkage_fusion_batch([1.0, -1.0], [0, 1], [0.0]), ValueError, "priors must have shape"),
        (lambda: shrinkage_fusion_batch([[1.0, np.nan], [np.nan, np.nan]], None, [0.0, 0.0]), ValueError, "no finite"),
        (lambda: shrinkage_fusion_batch([1.0, -1.0], None, [0.0]), ValueError, "padded"),
        (lambda: fused_advantages([1.0], 0.0, floor=0.0), ValueError, "floor"),
        (lambda: fused_advantages([1.0], 0.0, floor=2.0), ValueError, "floor"),
        (lambda: osla_target(0.1, 0.0), ValueError, "cost"),
        (lambda: osla_target(0.1, -1.0), ValueError, "cost"),
        (lambda: osla_target(-0.1, 0.01), ValueError, "bias2"),
        (lambda: osla_cap(float("nan")), ValueError, "cost"),
        (lambda: osla_need_more([0], [0.1], 0.01), ValueError, "k"),
        (lambda: osla_need_more([2.5], [0.1], 0.01), ValueError, "whole"),
        (lambda: osla_next_counts([4], [0.1], 0.01, step=0), ValueError, "step"),
        (lambda: osla_should_stop([]), ValueError, "empty"),
        (lambda: osla_should_stop([True], 1.5), ValueError, "min_active_frac"),
        (lambda: osla_step([], [], 0.01), ValueError, "empty"),
        (lambda: osla_step(4, 0.1, 0.01), ValueError, "G >= 1"),
        (lambda: osla_step([4], [-0.1], 0.01), ValueError, "bias2"),
        (lambda: osla_step([4], [0.1], 0.01, step=0), ValueError, "step"),
        (lambda: osla_step([4], [0.1], 0.01, min_active_frac=2.0), ValueError, "min_active_frac"),
        (lambda: equal_prompt_weights([[4]]), ValueError, "1-D"),
        (lambda: osla_allocate(lambda i, n: np.ones((len(i), n)), [0.0], k_init=20), ValueError, "k_init"),
        (lambda: osla_allocate(lambda i, n: np.ones((1, 1)), [0.0, 0.0]), ValueError, "shape"),
    ],
)
def test_bad_input(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


# ------------------------------------------------------------------------------------------ audit runner
def test_v05_audit_quick_via_runner(tmp_path):
    import argparse
    import json

    from trl_ext.estimators import audit_cli

    parser = argparse.ArgumentParser()
    audit_cli.add_arguments(parser)
    rc = audit_cli.main(parser.parse_args(["--only", "v05", "--quick", "--output_dir", str(tmp_path)]))
    assert rc == 0
    res = json.loads((tmp_path / "audit_v05.json").read_text())
    assert (tmp_path / "audit_v05.txt").read_text().startswith("V0.5 audit")
    assert json.loads((tmp_path / "audit_summary.json").read_text())["audits"]["v05"]["status"] == "ok"
    assert res["theorem_3_4_holds"]
    pri = res["priors"]
    # a perfect prior: fusion beats the empirical mean at k = 4, and OSLA stays close to k_init
    assert pri["perfect"]["estimators"]["fused_k4"]["mse"] < pri["perfect"]["estimators"]["empirical_k4"]["mse"]
    assert pri["perfect"]["estimators"]["fused_osla"]["mean_k"] < 6
    # worse priors get rejected more often and get more rollouts; OSLA never exceeds the cap
    assert pri["inverted"]["rejection_rate_k4"] > pri["good"]["rejection_rate_k4"]
    assert pri["inverted"]["estimators"]["fused_osla"]["mean_k"] > pri["good"]["estimators"]["fused_osla"]["mean_k"]
    assert all(p["max_k_osla"] <= res["config"]["cap"] for p in pri.values())
    for c in res["corruption"]:
        assert c["detect_rate_k4_corrupted"] > c["false_reject_rate_k4_clean"]
        assert c["mean_k_corrupted"] > c["mean_k_clean"]


def test_runner_reports_missing_audit_instead_of_crashing():
    from trl_ext.estimators import audit_cli

    mod, why = audit_cli._load("does_not_exist")
    assert mod is None and "not found" in why


# ------------------------------------------------------------------------------------------------ per-step budget
def test_round_cost_charges_dispatch_padding_per_rank():
    assert v05_estimators.osla_round_cost([3, 0, 5]) == 8
    assert v05_estimators.osla_round_cost([3, 0, 5], dispatch_multiple=4) == 4 + 0 + 8
    with pytest.raises(ValueError, match="dispatch_multiple"):
        v05_estimators.osla_round_cost([1], dispatch_multiple=0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.floats(0.0, 2.0), st.integers(0, 2)), min_size=1, max_size=12),
       st.integers(0, 40), st.sampled_from([1, 2, 4]))
def test_trim_to_budget_properties(items, remaining, m):
    """Served requests fit the budget, never exceed the request, go to larger bias2 first, and the rule is exact:
    no unserved rollout of a prompt could still have been added within the budget (greedy by priority)."""
    add = np.array([a for a, _, _ in items], dtype=np.int64)
    bias2 = np.array([b for _, b, _ in items])
    owner = np.array([o for _, _, o in items])
    served, short = v05_estimators.osla_trim_to_budget(add, bias2, owner, 3, remaining, m)
    per_rank = np.bincount(owner, weights=served, minlength=3).astype(int)
    assert v05_estimators.osla_round_cost(per_rank, m) <= remaining
    assert np.all((0 <= served) & (served <= add)) and short == bool((served < add).any())
    order = sorted(np.flatnonzero(add > 0).tolist(), key=lambda i: (-bias2[i], i))
    for pos, j in enumerate(order):  # a prompt left short: nothing served to lower-priority prompts could be moved
        if served[j] < add[j]:
            trial = per_rank.copy()
            trial[owner[j]] += 1
            for later in order[pos + 1:]:  # what the greedy had not yet given when it reached j
                trial[owner[later]] -= served[later]
            assert v05_estimators.osla_round_cost(trial, m) > remaining


def test_trim_to_budget_serves_the_largest_bias_first_and_unbounded_passes_through():
    add, bias2, owner = np.array([2, 2, 2]), np.array([0.1, 0.9, 0.5]), np.array([0, 0, 0])
    served, short = v05_estimators.osla_trim_to_budget(add, bias2, owner, 1, 3)
    assert served.tolist() == [0, 2, 1] and short
    served, short = v05_estimators.osla_trim_to_budget(add, bias2, owner, 1, None)
    assert served.tolist() == [2, 2, 2] and not short


def test_extra_budget_is_the_floor_of_the_fraction_and_inf_is_unbounded():
    assert v05_estimators.osla_extra_budget(1.0, 32) == 32
    assert v05_estimators.osla_extra_budget(0.3, 10) == 3 and v05_estimators.osla_extra_budget(0.0, 10) == 0
    assert v05_estimators.osla_extra_budget(0.7, 10) == 7  # 0.7 x 10 = 6.999...: not floored to 6
    assert v05_estimators.osla_extra_budget(float("inf"), 10) is None

"""Tests for trl_ext.estimators.basis (BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing
for LLM Reasoning, May 2026)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.special import expit, logit

from trl_ext.estimators.basis import (
    basis_advantages,
    batchwise_baseline,
    calibrate_beta,
    default_beta_grid,
    std_scale_advantages,
    v_beta,
    v_beta_from_samples,
    v_beta_table,
)

unit = st.floats(0.0, 1.0, allow_nan=False)
inner = st.floats(0.02, 0.98, allow_nan=False)
betas = st.floats(0.01, 50.0, allow_nan=False)


def _paper_formula(p, beta):
    """Appendix 10 as printed: p e^{1/b} / (1 - p + p e^{1/b}) (fine for moderate beta)."""
    e = np.exp(1.0 / beta)
    return p * e / (1.0 - p + p * e)


# ------------------------------------------------------------------------------------------------ grid / v_beta
def test_default_grid_matches_appendix_10():
    g = default_beta_grid()
    assert g.shape == (230,)
    assert g[0] == 0.01 and g[199] == 2.0 and g[200] == 2.1 and g[-1] == 5.0
    np.testing.assert_allclose(np.diff(g[:200]), 0.01, atol=1e-12)
    np.testing.assert_allclose(np.diff(g[200:]), 0.1, atol=1e-12)
    assert np.all(np.diff(g) > 0)


@given(p=unit, beta=st.floats(0.2, 20.0))
def test_v_beta_matches_paper_closed_form(p, beta):
    np.testing.assert_allclose(v_beta(p, beta), _paper_formula(p, beta), rtol=1e-10, atol=1e-14)


@given(p=unit)
def test_v_beta_limits(p):
    assert v_beta(p, np.inf) == pytest.approx(p, abs=1e-15)  # beta -> inf: reference policy
    assert v_beta(p, 1e6) == pytest.approx(p, abs=1e-5)
    small = float(v_beta(p, 1e-3))  # beta -> 0: reward-optimal policy 1[p > 0]
    if p == 0.0:
        assert small == 0.0
    elif p > 1e-300:
        assert small > 1.0 - 1e-12 or p < 1e-200
    assert np.isfinite(v_beta(p, 0.01))


@given(p=inner, b1=betas, b2=betas)
def test_v_beta_monotone_in_beta(p, b1, b2):
    lo, hi = min(b1, b2), max(b1, b2)
    assert v_beta(p, lo) >= v_beta(p, hi)  # more tilt (smaller beta) -> higher value
    assert v_beta(p, hi) >= p


@given(p1=unit, p2=unit, beta=betas)
def test_v_beta_monotone_in_p_and_fixed_points(p1, p2, beta):
    lo, hi = min(p1, p2), max(p1, p2)
    assert v_beta(lo, beta) <= v_beta(hi, beta)
    assert v_beta(0.0, beta) == 0.0 and v_beta(1.0, beta) == 1.0


def test_v_beta_broadcast_and_table_shapes():
    p = np.array([0.0, 0.3, 1.0])
    g = default_beta_grid()
    tab = v_beta_table(p)
    assert tab.shape == (3, 230)
    np.testing.assert_allclose(tab, v_beta(p[:, None], g[None, :]))
    assert np.all(tab[0] == 0.0) and np.all(tab[2] == 1.0)


@pytest.mark.parametrize("bad", [-0.1, 1.2, np.nan, np.inf])
def test_v_beta_rejects_bad_p(bad):
    with pytest.raises(ValueError, match="p_hat"):
        v_beta(np.array([0.5, bad]), 1.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, np.nan])
def test_v_beta_rejects_bad_beta(bad):
    with pytest.raises(ValueError, match="beta"):
        v_beta(0.5, bad)


# ------------------------------------------------------------------------------------ general form (Prop. 2)
@given(n=st.integers(1, 64), data=st.data(), beta=st.floats(0.01, 10.0))
def test_general_form_reduces_to_binary_closed_form(n, data, beta):
    k = data.draw(st.integers(0, n))
    samples = np.array([1.0] * k + [0.0] * (n - k))
    got = v_beta_from_samples([samples], beta)
    np.testing.assert_allclose(got, v_beta(k / n, beta), rtol=1e-9, atol=1e-12)


@settings(max_examples=50)
@given(r=arrays(np.float64, st.integers(1, 20), elements=st.integers(-20, 20).map(lambda k: k / 4)),
       shift=st.floats(-10, 10),
       beta=st.floats(0.01, 5.0))
def test_general_form_properties(r, shift, beta):
    v = v_beta_from_samples([r], beta)[0]
    assert r.min() - 1e-9 <= v <= r.max() + 1e-9  # a weighted mean of the samples
    assert v >= r.mean() - 1e-9  # tilting toward high rewards never lowers the value
    np.testing.assert_allclose(v_beta_from_samples([r + shift], beta)[0], v + shift, atol=1e-8)  # shift-equivariant
    np.testing.assert_allclose(v_beta_from_samples([r], np.inf)[0], r.mean(), atol=1e-12)
    assert v_beta_from_samples([r], 1e-3)[0] == pytest.approx(r.max(), abs=1e-9)  # beta -> 0: best sample


def test_general_form_stable_for_large_rewards_and_tiny_beta():
    v = v_beta_from_samples([np.array([100.0, 99.0, 0.0])], 0.01)
    assert np.isfinite(v).all() and v[0] == pytest.approx(100.0)


def test_general_form_ragged_padded_and_grid_agree():
    rows = [np.array([0.2, 0.9]), np.array([1.0, 0.0, 0.5]), np.array([0.7])]
    padded = np.array([[0.2, 0.9, -7.0], [1.0, 0.0, 0.5], [0.7, 99.0, 99.0]])
    g = np.array([0.1, 1.0, np.inf])
    a = v_beta_from_samples(rows, g)
    b = v_beta_from_samples(padded, g, counts=[2, 3, 1])
    assert a.shape == (3, 3)
    np.testing.assert_allclose(a, b)
    np.testing.assert_allclose(a[:, 2], [0.55, 0.5, 0.7])
    np.testing.assert_allclose(a[:, 1], [v_beta_from_samples([r], 1.0)[0] for r in rows])


def test_general_form_nan_samples_excluded_and_counted():
    vals, used = v_beta_from_samples([np.array([1.0, np.nan, 0.0]), np.array([0.5])], 0.5, return_counts=True)
    np.testing.assert_array_equal(used, [2, 1])
    np.testing.assert_allclose(vals[0], v_beta(0.5, 0.5))
    with pytest.raises(ValueError, match="no finite reference reward"):
        v_beta_from_samples([np.array([np.nan]), np.array([0.5])], 0.5)
    with pytest.raises(ValueError, match="inf"):
        v_beta_from_samples([np.array([np.inf])], 0.5)
    with pytest.raises(ValueError, match="empty"):
        v_beta_from_samples([], 0.5)
    with pytest.raises(ValueError, match="counts"):
        v_beta_from_samples(np.zeros((2, 3)), 0.5, counts=[1, 4])


# ------------------------------------------------------------------------ Proposition 1 by exact enumeration
def _enumerate(values, variant, true_v=None):
    """Exact distribution of the baseline over all 2^N binary reward vectors with P(r_j = 1) = true_v[j]."""
    true_v = values if true_v is None else true_v
    n = len(values)
    outs, probs = [], []
    for bits in itertools.product((0.0, 1.0), repeat=n):
        r = np.array(bits)
        probs.append(np.prod(np.where(r == 1.0, true_v, 1.0 - true_v)))
        res = batchwise_baseline(r, values, variant=variant)
        assert res.n_fallback == 0
        outs.append(res.baseline)
    probs = np.array(probs)
    outs = np.array(outs)
    mean = probs @ outs
    var = probs @ (outs - mean) ** 2
    mse = probs @ (outs - true_v) ** 2
    return mean, var, mse


@pytest.mark.parametrize("seed", range(6))
def test_proposition_1_blue_weights_unbiased_and_minimum_variance(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 8))
    v = rng.uniform(0.05, 0.95, n)
    sig2 = v * (1 - v)
    mean, var, _ = _enumerate(v, "unb")
    np.testing.assert_allclose(mean, v, atol=1e-12)  # E[b_i | batch] = V_i exactly
    s = v**2 / sig2
    np.testing.assert_allclose(var, v**2 / (s.sum() - s), rtol=1e-10)  # closed-form BLUE variance
    # RVG (Eq. 6) is also unbiased with exact values, but never has smaller variance (Gauss-Markov).
    mean_rvg, var_rvg, _ = _enumerate(v, "rvg")
    np.testing.assert_allclose(mean_rvg, v, atol=1e-12)
    assert np.all(var <= var_rvg + 1e-12)
    # Any other unbiased leave-one-out weights: project random weights onto sum_j w_j V_j = V_i.
    for i in range(n):
        others = np.arange(n) != i
        for _ in range(20):
            w = rng.normal(size=n - 1)
            vv = v[others]
            w = w + (v[i] - w @ vv) * vv / (vv @ vv)
            assert w @ vv == pytest.approx(v[i])
            assert var[i] <= np.sum(w**2 * sig2[others]) + 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_proposition_3_vop_has_lower_mse_but_is_biased(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 8))
    v = rng.uniform(0.05, 0.95, n)
    _, _, mse_unb = _enumerate(v, "unb")
    mean_vop, _, mse_vop = _enumerate(v, "vop")
    assert np.all(mse_vop <= mse_unb + 1e-12)
    assert np.all(mean_vop < v)  # shrinks toward zero


def test_misspecified_values_make_unb_biased():
    true_v = np.array([0.3, 0.5, 0.7, 0.4])
    mean, _, _ = _enumerate(true_v * 0.5 + 0.25, "unb", true_v=true_v)
    assert np.max(np.abs(mean - true_v)) > 1e-3  # unbiasedness is a property of exact values only


# --------------------------------------------------------------------------- batchwise baseline properties
batch = st.integers(2, 40).flatmap(
    lambda n: st.tuples(
        arrays(np.float64, n, elements=st.sampled_from([0.0, 1.0, 0.5, 0.25])),
        arrays(np.float64, n, elements=unit),
    )
)


@settings(max_examples=60)
@given(rv=batch, variant=st.sampled_from(["unb", "vop", "rvg"]), fb=st.sampled_from(["zero", "batch_mean"]))
def test_batchwise_shapes_masks_counts(rv, variant, fb):
    r, v = rv
    res = batchwise_baseline(r, v, variant=variant, fallback=fb)
    n = r.size
    assert res.baseline.shape == (n,) and np.all(np.isfinite(res.baseline)) and np.all(res.baseline >= 0)
    np.testing.assert_array_equal(res.active, (v > 1e-6) & (v < 1 - 1e-6))
    assert res.n_active == res.active.sum() and res.n_fallback == res.fallback.sum()
    assert np.all(res.fallback[~res.active])
    assert res.n_fallback == (~res.active).sum() + res.n_no_source
    if fb == "zero":
        assert np.all(res.baseline[res.fallback] == 0.0)
    assert 0.0 <= res.frac_extreme <= 1.0 and res.active_fraction == res.n_active / n


@settings(max_examples=60)
@given(rv=batch, variant=st.sampled_from(["unb", "vop", "rvg"]), data=st.data())
def test_batchwise_is_leave_one_out(rv, variant, data):
    r, v = rv
    i = data.draw(st.integers(0, r.size - 1))
    r2 = r.copy()
    r2[i] = 1.0 - r[i]
    b1 = batchwise_baseline(r, v, variant=variant, fallback="batch_mean").baseline[i]
    b2 = batchwise_baseline(r2, v, variant=variant, fallback="batch_mean").baseline[i]
    assert b1 == pytest.approx(b2, rel=1e-9, abs=1e-12)  # b_i never uses r_i


@settings(max_examples=40)
@given(rv=batch, variant=st.sampled_from(["unb", "vop", "rvg"]), seed=st.integers(0, 1000))
def test_batchwise_permutation_equivariant(rv, variant, seed):
    r, v = rv
    perm = np.random.default_rng(seed).permutation(r.size)
    a = batchwise_baseline(r, v, variant=variant).baseline
    b = batchwise_baseline(r[perm], v[perm], variant=variant).baseline
    np.testing.assert_allclose(a[perm], b, rtol=1e-9, atol=1e-12)


@given(r=arrays(np.float64, st.integers(2, 30), elements=st.sampled_from([0.0, 1.0])), v=inner)
def test_equal_values_reduce_to_leave_one_out_mean(r, v):
    vals = np.full(r.size, v)
    loo = (r.sum() - r) / (r.size - 1)
    for variant in ("unb", "rvg"):
        np.testing.assert_allclose(batchwise_baseline(r, vals, variant=variant).baseline, loo, atol=1e-12)


def test_all_same_rewards():
    v = np.array([0.2, 0.4, 0.6, 0.8])
    assert np.all(batchwise_baseline(np.zeros(4), v).baseline == 0.0)
    np.testing.assert_allclose(batchwise_baseline(np.ones(4), np.full(4, 0.3)).baseline, 1.0)


def test_formulas_against_direct_loops():
    rng = np.random.default_rng(3)
    n = 12
    v = rng.uniform(0.01, 0.99, n)
    v[[2, 7]] = [0.0, 1.0]  # inactive
    r = rng.integers(0, 2, n).astype(float)
    act = (v > 1e-6) & (v < 1 - 1e-6)
    s2 = v * (1 - v)
    for variant in ("unb", "vop", "rvg"):
        got = batchwise_baseline(r, v, variant=variant).baseline
        for i in range(n):
            if not act[i]:
                assert got[i] == 0.0
                continue
            js = [j for j in range(n) if j != i and act[j]]
            if variant == "rvg":
                exp = v[i] / len(js) * sum(r[j] / v[j] for j in js)
            else:
                num = sum(v[j] * r[j] / s2[j] for j in js)
                den = sum(v[j] ** 2 / s2[j] for j in js) + (1.0 if variant == "vop" else 0.0)
                exp = v[i] * num / den
            assert got[i] == pytest.approx(exp, rel=1e-10)


def test_nan_rewards_excluded_and_counted():
    v = np.array([0.3, 0.5, 0.7, 0.6, 0.2])
    r = np.array([1.0, np.nan, 0.0, 1.0, 1.0])
    res = batchwise_baseline(r, v)
    assert res.n_nan_rewards == 1 and not res.valid[1]
    keep = np.array([0, 2, 3, 4])
    ref = batchwise_baseline(r[keep], v[keep]).baseline
    np.testing.assert_allclose(res.baseline[keep], ref)  # as if the NaN prompt were not a source
    assert np.isfinite(res.baseline[1])  # its own baseline is still defined
    adv, cal = basis_advantages(r, v, beta_grid=[np.inf])
    assert adv[1] == 0.0 and cal.result.n_nan_rewards == 1
    np.testing.assert_allclose(adv[keep], r[keep] - cal.baseline[keep])


def test_missing_values_fall_back_and_are_counted():
    res = batchwise_baseline([1.0, 0.0, 1.0], [np.nan, 0.5, 0.5])
    assert res.n_missing_values == 1 and not res.active[0] and res.fallback[0] and res.baseline[0] == 0.0


def test_batch_mean_fallback_is_leave_one_out_mean():
    r = np.array([1.0, 0.0, 1.0, 1.0, np.nan])
    v = np.array([0.0, 1.0, 0.5, 0.5, 0.5])
    res = batchwise_baseline(r, v, fallback="batch_mean")
    assert res.baseline[0] == pytest.approx(2 / 3) and res.baseline[1] == pytest.approx(1.0)


def test_value_fallback_uses_initial_value():
    r = np.array([1.0, 0.0, 1.0, 0.0])
    v = np.array([1.0, 0.0, 0.5, np.nan])
    res = batchwise_baseline(r, v, fallback="value")
    assert res.baseline[0] == 1.0 and res.baseline[1] == 0.0 and res.baseline[3] == 0.0
    assert res.fallback[2]  # single active prompt: no source -> its own value
    assert res.baseline[2] == 0.5
    cal = calibrate_beta(r, np.array([1.0, 0.0, 0.5, 0.5]), fallback="value", objective="robust")
    np.testing.assert_allclose(cal.baseline, batchwise_baseline(r, v_beta(np.array([1.0, 0.0, 0.5, 0.5]), cal.beta),
                                                                fallback="value").baseline)


def test_batch_of_one_and_singleton_active_set_fall_back():
    res = batchwise_baseline([1.0], [0.5])
    assert res.n_no_source == 1 and res.fallback[0] and res.baseline[0] == 0.0
    res = batchwise_baseline([1.0], [0.5], fallback="batch_mean")
    assert res.baseline[0] == 0.0  # no other reward at all
    res = batchwise_baseline([1.0, 0.0, 1.0], [0.5, 0.0, 1.0], fallback="batch_mean")
    assert res.n_no_source == 1 and res.baseline[0] == pytest.approx(0.5)


def test_near_boundary_values_are_accurate():
    # one prompt a hair inside the active set dominates the weights; the others must still be exact
    v = np.array([1 - 2e-6, 1e-5, 2e-5, 0.5])
    r = np.array([1.0, 0.0, 1.0, 0.0])
    got = batchwise_baseline(r, v).baseline
    s2 = v * (1 - v)
    for i in range(4):
        js = [j for j in range(4) if j != i]
        exp = v[i] * sum(v[j] * r[j] / s2[j] for j in js) / sum(v[j] ** 2 / s2[j] for j in js)
        assert got[i] == pytest.approx(exp, rel=1e-8)


@pytest.mark.parametrize(
    ("rewards", "values", "kw", "match"),
    [
        ([], [], {}, "empty"),
        ([1.0, 0.0], [0.5], {}, "rewards has 2 entries"),
        ([[1.0, 0.0]], [0.5, 0.5], {}, "1-D"),
        ([1.5, 0.0], [0.5, 0.5], {}, r"\[0, 1\]"),
        ([np.inf, 0.0], [0.5, 0.5], {}, "inf"),
        ([1.0, 0.0], [0.5, -0.5], {}, r"\[0, 1\]"),
        ([1.0, 0.0], [0.5, 0.5], {"variant": "blue"}, "variant"),
        ([1.0, 0.0], [0.5, 0.5], {"fallback": "mean"}, "fallback"),
        ([1.0, 0.0], [0.5, 0.5], {"eps": 0.6}, "eps"),
    ],
)
def test_batchwise_bad_input(rewards, values, kw, match):
    with pytest.raises(ValueError, match=match):
        batchwise_baseline(rewards, values, **kw)


# ------------------------------------------------------------------------------------------- calibration
def _population(seed, n=256, drift=1.0):
    rng = np.random.default_rng(seed)
    p_ref = rng.beta(0.7, 0.7, n)
    p_hat = rng.binomial(64, p_ref) / 64
    with np.errstate(divide="ignore"):
        p_cur = 1.0 / (1.0 + np.exp(-(np.log(p_ref) - np.log1p(-p_ref) + drift)))
    r = (rng.random(n) < p_cur).astype(float)
    return r, p_hat, p_cur


@pytest.mark.parametrize("objective", ["robust", "paper"])
@pytest.mark.parametrize("variant", ["unb", "vop", "rvg"])
def test_calibration_consistent_with_scalar_path(objective, variant):
    r, p_hat, _ = _population(1, n=64)
    cal = calibrate_beta(r, p_hat, variant=variant, objective=objective)
    grid = default_beta_grid()
    assert cal.beta in grid and grid[cal.index] == cal.beta
    assert cal.losses_per_beta.shape == (230,) and cal.loss == np.min(cal.losses_per_beta)
    for k in (0, 17, cal.index, 150, 229):
        res = batchwise_baseline(r, v_beta(p_hat, grid[k]), variant=variant)
        for fb in ("batch_mean", "value"):
            other = calibrate_beta(r, p_hat, variant=variant, objective=objective, fallback=fb)
            res_fb = batchwise_baseline(r, v_beta(p_hat, grid[k]), variant=variant, fallback=fb)
            assert other.robust_losses[k] == pytest.approx(np.mean((r - res_fb.baseline) ** 2), rel=1e-9)
        sq = (r - res.baseline) ** 2
        assert cal.robust_losses[k] == pytest.approx(sq.mean(), rel=1e-9)
        if res.active.any():
            assert cal.paper_losses[k] == pytest.approx(sq[res.active].mean(), rel=1e-9)
        assert cal.active_fraction_per_beta[k] == pytest.approx(res.active_fraction)
    ref = batchwise_baseline(r, v_beta(p_hat, cal.beta), variant=variant)
    np.testing.assert_allclose(cal.baseline, ref.baseline)
    assert cal.active_fraction == pytest.approx(ref.active_fraction)
    # a precomputed V_beta table (the non-binary path) gives the same answer
    cal2 = calibrate_beta(r, v_beta_table(p_hat), variant=variant, objective=objective)
    assert cal2.index == cal.index
    np.testing.assert_allclose(cal2.baseline, cal.baseline, atol=1e-12)


def test_paper_objective_collapses_on_constructed_batch():
    # 18 medium prompts (p_hat = 0.5) and 2 hard ones (p_hat = 0.01) that failed. For small beta the medium prompts'
    # V_beta leaves the active set (V -> 1), only the two hard prompts remain, and they fit their zero rewards
    # perfectly: Eq. 3's average over the active set is exactly 0 there.
    p_hat = np.array([0.01, 0.01] + [0.5] * 18)
    r = np.array([0.0, 0.0] + [1.0, 0.0] * 9)
    paper = calibrate_beta(r, p_hat, objective="paper")
    robust = calibrate_beta(r, p_hat, objective="robust")
    assert paper.loss == 0.0 and paper.active_fraction == pytest.approx(0.1)
    assert paper.n_fallback == 18
    assert robust.active_fraction == 1.0 and robust.n_fallback == 0
    assert robust.robust_losses[robust.index] < robust.robust_losses[paper.index]


@pytest.mark.parametrize("seed", range(5))
def test_robust_objective_beats_paper_objective_on_drifted_population(seed):
    r, p_hat, p_cur = _population(seed, n=512)
    paper = calibrate_beta(r, p_hat, objective="paper")
    robust = calibrate_beta(r, p_hat, objective="robust")
    assert robust.active_fraction >= 0.8
    assert paper.active_fraction < 0.5  # the collapse occurs in this realistic population too
    mse = lambda b: np.mean((b - p_cur) ** 2)  # noqa: E731
    assert mse(robust.baseline) < mse(paper.baseline)


def test_min_active_fraction_guard():
    r, p_hat, _ = _population(2, n=256)
    cal = calibrate_beta(r, p_hat, objective="paper", min_active_fraction=0.7)
    assert cal.constraint_satisfied and cal.active_fraction >= 0.7
    assert np.all(np.isinf(cal.losses_per_beta[cal.active_fraction_per_beta < 0.7]))
    cal = calibrate_beta(np.array([1.0, 0.0]), np.array([0.0, 1.0]), objective="paper", min_active_fraction=0.5)
    assert not cal.constraint_satisfied


def test_ties_go_to_largest_beta_and_undefined_paper_objective():
    cal = calibrate_beta(np.zeros(10), np.linspace(0.1, 0.9, 10))
    assert cal.beta == 5.0 and cal.loss == 0.0
    cal = calibrate_beta(np.array([1.0, 0.0, 1.0]), np.array([1.0, 0.0, 1.0]), objective="paper")
    assert cal.beta == 5.0 and cal.loss == np.inf and cal.active_fraction == 0.0
    assert np.all(cal.baseline == 0.0)
    cal = calibrate_beta(np.array([np.nan, np.nan]), np.array([0.3, 0.5]))
    assert cal.beta == 5.0 and cal.loss == np.inf and cal.result.n_nan_rewards == 2
    # "largest beta" means the largest value, not the last grid entry (a user grid need not be increasing)
    grid = np.array([5.0, 1.0, 0.1])
    assert calibrate_beta(np.zeros(6), np.full(6, 0.5), beta_grid=grid).beta == 5.0  # was 0.1
    assert calibrate_beta(np.array([np.nan, np.nan]), np.array([0.3, 0.5]), beta_grid=grid).beta == 5.0


def test_calibration_non_binary_rewards_via_table():
    rng = np.random.default_rng(5)
    samples = [rng.uniform(0, 1, 32) ** rng.uniform(0.3, 3) for _ in range(40)]
    grid = np.array([0.05, 0.2, 1.0, 5.0])
    table = v_beta_from_samples(samples, grid)
    r = rng.uniform(0, 1, 40)
    cal = calibrate_beta(r, table, beta_grid=grid)
    assert cal.beta in grid and 0 <= cal.active_fraction <= 1
    np.testing.assert_allclose(cal.baseline, batchwise_baseline(r, table[:, cal.index]).baseline)


@pytest.mark.parametrize(
    ("p_hat", "kw", "match"),
    [
        (np.full((4, 3), 0.5), {}, "aligned with beta_grid"),
        (np.full(3, 0.5), {}, "rewards has 4 entries"),
        (np.array([0.5, 0.5, 2.0, 0.5]), {}, "p_hat"),
        (np.full(4, 0.5), {"objective": "mse"}, "objective"),
        (np.full(4, 0.5), {"beta_grid": [0.1, -1.0]}, "beta"),
        (np.full(4, 0.5), {"min_active_fraction": 1.5}, "min_active_fraction"),
    ],
)
def test_calibration_bad_input(p_hat, kw, match):
    with pytest.raises(ValueError, match=match):
        calibrate_beta(np.array([1.0, 0.0, 1.0, 0.0]), p_hat, **kw)


def test_calibration_partly_nan_table_row_rejected():
    tab = np.full((2, 3), 0.5)
    tab[0, 1] = np.nan
    with pytest.raises(ValueError, match="partly NaN"):
        calibrate_beta([1.0, 0.0], tab, beta_grid=[0.1, 1.0, 2.0])


# ------------------------------------------------------------------------------- calibration vs. a slow reference
def _reference_calibration(rewards, p_hat, beta_grid=None, variant="unb", objective="robust", eps=1e-6,
                           fallback="zero", min_active_fraction=0.0):
    """calibrate_beta written from the paper and the docstring: a plain loop over the grid.

    Per beta: ``V = expit(logit(p) + 1/beta)`` and ``1 - V = expit(-(logit(p) + 1/beta))`` (Appendix 10) or a table
    column; the active set ``eps < V < 1 - eps``; for every active prompt the sums over ``S \\ {i}`` (active, finite
    reward, not i) taken directly (no total-minus-own-term); UNB Eq. 4, VOP Eq. 5, RVG Eq. 6; the fallback elsewhere;
    the robust loss over all finite rewards and the paper loss Eq. 3 over the sources. Selection: the smallest loss,
    ties (1e-12 relative) to the largest beta, grid values below ``min_active_fraction`` excluded unless none is left.
    """
    r = np.asarray(rewards, dtype=float)
    p = np.asarray(p_hat, dtype=float)
    grid = default_beta_grid() if beta_grid is None else np.asarray(beta_grid, dtype=float)
    n = r.size
    finite = ~np.isnan(r)
    r0 = np.where(finite, r, 0.0)
    not_self = 1.0 - np.eye(n)  # row i of not_self @ t is sum_{j != i} t_j
    robust, paper, frac, baselines = [], [], [], []
    for k, beta in enumerate(grid):
        if p.ndim == 1:
            missing = np.isnan(p)
            z = logit(np.where(missing, 0.5, p)) + 1.0 / beta
            v, q = expit(z), expit(-z)
        else:
            missing = np.isnan(p).all(axis=1)
            v = np.where(missing, 0.5, p[:, k])
            q = 1.0 - v
        active = ~missing & (v > eps) & (q > eps)
        src = active & finite
        n_others = not_self @ src
        with np.errstate(divide="ignore", invalid="ignore"):
            sigma2 = v * q  # Bernoulli plug-in variance
            if variant == "rvg":
                basis = v / n_others * (not_self @ np.where(src, r0 / v, 0.0))
            else:
                num = not_self @ np.where(src, v * r0 / sigma2, 0.0)
                den = not_self @ np.where(src, v**2 / sigma2, 0.0) + (1.0 if variant == "vop" else 0.0)
                basis = v * num / den
            if fallback == "zero":
                fb = np.zeros(n)
            elif fallback == "batch_mean":  # leave-one-out mean of the finite rewards
                cnt = not_self @ finite
                fb = np.where(cnt > 0, (not_self @ r0) / cnt, 0.0)
            else:
                fb = np.where(missing, 0.0, v)
        b = np.where(active & (n_others > 0), basis, fb)
        sq = (r0 - b) ** 2
        robust.append(sq[finite].mean() if finite.any() else np.inf)
        paper.append(sq[src].mean() if src.any() else np.inf)
        frac.append(active.mean())
        baselines.append(b)
    robust, paper, frac = np.array(robust), np.array(paper), np.array(frac)
    losses = (robust if objective == "robust" else paper).copy()
    satisfied = True
    if min_active_fraction > 0:
        if (frac >= min_active_fraction).any():
            losses[frac < min_active_fraction] = np.inf
        else:
            satisfied = False
    if np.isfinite(losses).any():
        best = losses[np.isfinite(losses)].min()
        tied = np.flatnonzero(losses <= best + 1e-12 * max(1.0, abs(best)))
        idx = int(tied[np.argmax(grid[tied])])
    else:
        idx = int(np.argmax(grid))
    return {"index": idx, "robust": robust, "paper": paper, "frac": frac, "losses": losses,
            "baseline": baselines[idx], "satisfied": satisfied}


def _reference_inputs():
    """(rewards, p_hat, kwargs): both grid paths, NaN rewards and values, p in {0, 1}, ties, tiny and large batches."""
    rng = np.random.default_rng(2024)
    out = []
    p = rng.beta(0.6, 0.6, 24)
    out.append(((rng.random(24) < p).astype(float), p, {}))  # default grid: masked and all-source chunks
    p = rng.beta(0.6, 0.6, 40)
    r = (rng.random(40) < p).astype(float)
    r[rng.random(40) < 0.25] = np.nan
    p[rng.random(40) < 0.15] = np.nan
    out.append((r, p, {"beta_grid": rng.uniform(0.005, 6.0, 15), "eps": 1e-3}))  # unsorted grid
    p = np.round(rng.random(17) * 6) / 6  # exact 0 and 1 pass rates
    out.append((rng.random(17), p, {"beta_grid": np.linspace(0.02, 3.0, 12), "min_active_fraction": 0.5}))
    out.append((np.zeros(10), np.linspace(0.1, 0.9, 10), {}))  # all-equal rewards: every beta ties
    out.append((np.full(4, np.nan), np.array([0.2, 0.5, 0.7, 0.9]), {"beta_grid": [0.1, 1.0]}))
    out.append((np.array([1.0]), np.array([0.5]), {"beta_grid": [0.1, 1.0]}))
    out.append((np.array([1.0, 0.0]), np.array([0.3, 0.6]), {}))
    samples = [rng.uniform(0, 1, 16) ** rng.uniform(0.3, 3) for _ in range(30)]
    grid = np.array([0.03, 0.1, 0.4, 1.0, 2.5, 5.0])
    table = v_beta_from_samples(samples, grid)
    table[3] = np.nan  # a missing table row
    out.append((rng.random(30), table, {"beta_grid": grid}))  # the (N, K) table path
    p = rng.beta(0.6, 0.6, 600)
    r = (rng.random(600) < p).astype(float)
    r[rng.random(600) < 0.1] = np.nan
    out.append((r, p, {"beta_grid": np.linspace(0.01, 0.5, 50)}))  # several chunks of the masked path
    p = rng.uniform(0.05, 0.95, 50)
    out.append(((rng.random(50) < p).astype(float), p, {"beta_grid": np.linspace(0.5, 5.0, 10)}))  # all sources
    # a dominant source (1 - V = 2e-7, just above eps): total - own term cancels below 1e-6 of the total in its
    # leave-one-out sums, the rows calibrate_beta recomputes exactly (without that the loss is off by 6e-8 for UNB)
    p = np.array([expit(15.22), 0.001, 0.002, 0.003, 0.004, 0.005])
    out.append((np.array([1.0, 1.0, 0.0, 0.0, 0.0, 0.0]), p, {"beta_grid": [4.0, 5.0], "eps": 1e-7}))
    return out


@pytest.mark.parametrize("fallback", ["zero", "batch_mean", "value"])
@pytest.mark.parametrize("objective", ["robust", "paper"])
@pytest.mark.parametrize("variant", ["unb", "vop", "rvg"])
def test_calibrate_beta_matches_slow_reference(variant, objective, fallback):
    # The objectives agree to 1e-12 relative (observed <= 2e-15). Single baselines only to 1e-10: calibrate_beta forms
    # each leave-one-out sum as total - own term, recomputed exactly only when it falls below 1e-6 of the total, so a
    # dominant source costs up to ~1e-10 relative there (the loss, a mean over prompts, is barely affected).
    for rewards, p_hat, kw in _reference_inputs():
        kw = {"variant": variant, "objective": objective, "fallback": fallback, **kw}
        cal = calibrate_beta(rewards, p_hat, **kw)
        ref = _reference_calibration(rewards, p_hat, **kw)
        assert cal.index == ref["index"]
        assert cal.beta == cal.beta_grid[ref["index"]]
        assert cal.constraint_satisfied == ref["satisfied"]
        np.testing.assert_array_equal(cal.active_fraction_per_beta, ref["frac"])
        np.testing.assert_allclose(cal.robust_losses, ref["robust"], rtol=1e-12, atol=0)
        np.testing.assert_allclose(cal.paper_losses, ref["paper"], rtol=1e-12, atol=0)
        np.testing.assert_allclose(cal.losses_per_beta, ref["losses"], rtol=1e-12, atol=0)
        assert cal.loss == pytest.approx(ref["losses"][ref["index"]], rel=1e-12, abs=0)
        np.testing.assert_allclose(cal.baseline, ref["baseline"], rtol=1e-10, atol=0)


@pytest.mark.parametrize("objective", ["robust", "paper"])
def test_calibrate_beta_matches_slow_reference_at_benchmark_size(objective):
    # benchmarks/estimator_microbench.py's input: 512 prompts, the full 230-point grid
    rng = np.random.default_rng(0)
    p_hat = rng.beta(1.0, 1.0, size=512)
    rewards = (rng.random(512) < np.clip(p_hat + rng.normal(0, 0.1, 512), 0, 1)).astype(np.float64)
    cal = calibrate_beta(rewards, p_hat, objective=objective)
    ref = _reference_calibration(rewards, p_hat, objective=objective)
    assert cal.index == ref["index"]
    np.testing.assert_array_equal(cal.active_fraction_per_beta, ref["frac"])
    np.testing.assert_allclose(cal.robust_losses, ref["robust"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(cal.paper_losses, ref["paper"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(cal.baseline, ref["baseline"], rtol=1e-10, atol=0)


# Outputs of calibrate_beta before its grid loop was vectorized (per-chunk _refine / np.where temporaries), on
# _golden_inputs: (seed, N, kind, variant, objective, fallback, min_active_fraction, index, loss, sum of the finite
# robust losses, sum of the finite paper losses, sum of the baselines). The rewrite reproduced them bitwise.
_GOLDEN = [
    (0, 512, "binary", "unb", "robust", "zero", 0.0, 216, 0.14496523261356986, 45.349788012793255, 41.171026212492144,
     286.74321067129813),
    (0, 512, "binary", "unb", "paper", "zero", 0.0, 5, 0.0, 45.349788012793255, 41.171026212492144, 0.0),
    (0, 512, "binary", "unb", "paper", "zero", 0.8, 216, 0.14496523261356986, 45.349788012793255, 41.171026212492144,
     286.74321067129813),
    (1, 300, "nan", "vop", "robust", "batch_mean", 0.0, 229, 0.1637078810271598, 48.871703549161424, 46.81126332947958,
     156.66214807366217),
    (2, 300, "nan", "rvg", "paper", "value", 0.0, 5, 0.0, 50.131494632014366, 41.55572571056346, 260.9999666485923),
    (3, 64, "graded", "unb", "robust", "value", 0.0, 9, 0.09604609819169793, 33.12991190023415, 31.256160118437343,
     34.63618938377556),
    (4, 700, "nan", "unb", "paper", "batch_mean", 0.0, 5, 0.0, 46.70645822021417, 44.44196683424762, 314.9740580343918),
    (5, 40, "binary", "rvg", "robust", "zero", 0.0, 229, 0.11863282657212079, 38.63940334439059, 34.08820633313845,
     21.162129672479757),
    (6, 40, "table", "vop", "robust", "zero", 0.0, 229, 0.09889039189502097, 40.72794941107747, 37.81403485192578,
     17.775171233781975),
]


def _golden_inputs(seed, n, kind):
    rng = np.random.default_rng(seed)
    p = rng.beta(0.7, 0.7, n)
    r = (rng.random(n) < p).astype(float)
    if kind == "nan":
        r[rng.random(n) < 0.2] = np.nan
        p[rng.random(n) < 0.05] = np.nan
    elif kind == "graded":
        r = rng.random(n)
    return r, (v_beta_table(p) if kind == "table" else p)


@pytest.mark.parametrize("row", _GOLDEN, ids=lambda row: "-".join(map(str, row[:7])))
def test_calibrate_beta_reproduces_the_pre_vectorization_outputs(row):
    seed, n, kind, variant, objective, fallback, maf, index, loss, robust_sum, paper_sum, baseline_sum = row
    r, p = _golden_inputs(seed, n, kind)
    cal = calibrate_beta(r, p, variant=variant, objective=objective, fallback=fallback, min_active_fraction=maf)
    assert cal.index == index
    assert cal.loss == pytest.approx(loss, rel=1e-12, abs=0)
    assert math.fsum(cal.robust_losses[np.isfinite(cal.robust_losses)]) == pytest.approx(robust_sum, rel=1e-12)
    assert math.fsum(cal.paper_losses[np.isfinite(cal.paper_losses)]) == pytest.approx(paper_sum, rel=1e-12)
    assert math.fsum(cal.baseline) == pytest.approx(baseline_sum, rel=1e-12, abs=1e-300)


# ------------------------------------------------------------------------------------------ registry / audit
def test_registry_entry():
    from trl_ext.estimators.baselines import ADVANTAGE_ESTIMATORS, get_advantage_estimator

    assert "basis" in ADVANTAGE_ESTIMATORS
    fn = get_advantage_estimator("basis")
    r = np.array([1.0, 0.0, np.nan, 1.0, 0.0, 1.0])
    p = np.array([0.3, 0.5, 0.6, 0.7, 0.0, 1.0])
    res = fn(r, p_hat=p)
    cal = calibrate_beta(r, p)
    ok = ~np.isnan(r)
    np.testing.assert_allclose(res.advantages[ok], r[ok] - cal.baseline[ok])
    assert res.advantages[2] == 0.0 and res.n_nan == 1 and res.n_groups == 6
    assert res.extras["beta"] == cal.beta and res.extras["n_fallback"] == cal.n_fallback
    norm = fn(r, np.arange(6), p_hat=p, normalize=True)
    np.testing.assert_allclose(norm.advantages, res.advantages / (np.std(res.advantages[ok], ddof=1) + 1e-4))
    with pytest.raises(TypeError):
        fn(r)  # p_hat is required


# ------------------------------------------------------------------------------------------ reward range
def test_rewards_to_unit_maps_clips_round_off_and_refuses_other_scales():
    from trl_ext.estimators.basis import RANGE_TOL, rewards_to_unit

    r = np.array([-1.0, 0.0, 1.0, np.nan, 1.0 + RANGE_TOL, -1.0 - RANGE_TOL])
    u = rewards_to_unit(r, (-1.0, 1.0))
    np.testing.assert_array_equal(u[:3], [0.0, 0.5, 1.0])
    assert np.isnan(u[3]) and u[4] == 1.0 and u[5] == 0.0  # NaN kept, round-off clipped
    with pytest.raises(ValueError, match=r"1 training reward\(s\) lie outside the value table's reward_range"):
        rewards_to_unit(np.array([0.0, 2.0]), (0.0, 1.0))
    for bad in ((1.0, 0.0), (0.0, np.inf), (0.0,), "ab"):
        with pytest.raises(ValueError, match="reward_range"):
            rewards_to_unit(np.array([0.5]), bad)


def test_registry_reward_range_calibrates_on_unit_scale_and_answers_on_the_reward_scale():
    from trl_ext.estimators.baselines import get_advantage_estimator

    fn = get_advantage_estimator("basis")
    u = np.array([1.0, 0.0, np.nan, 1.0, 0.0, 1.0])
    r = 2.0 * u - 1.0  # rewards on [-1, 1]
    p = np.array([0.3, 0.5, 0.6, 0.7, 0.2, 0.9])
    res = fn(r, p_hat=p, reward_range=(-1.0, 1.0))
    cal = calibrate_beta(u, p)
    ok = ~np.isnan(r)
    np.testing.assert_array_equal(res.baselines, -1.0 + 2.0 * cal.baseline)  # the baseline on the reward scale
    np.testing.assert_array_equal(res.advantages, np.where(ok, np.nan_to_num(r) - res.baselines, 0.0))
    assert res.extras["beta"] == cal.beta and res.extras["n_no_source"] == cal.result.n_no_source
    # std scaling on the reward scale
    norm = fn(r, p_hat=p, reward_range=(-1.0, 1.0), normalize=True)
    np.testing.assert_array_equal(norm.advantages, std_scale_advantages(res.advantages, ok)[0])
    # [0, 1] is the identity map: same result as without reward_range
    unit_res = fn(u, p_hat=p, reward_range=(0.0, 1.0))
    plain = fn(u, p_hat=p)
    np.testing.assert_array_equal(unit_res.advantages, plain.advantages)
    np.testing.assert_array_equal(unit_res.baselines, plain.baselines)
    with pytest.raises(ValueError, match=r"rewards must lie in \[0, 1\].*\(r - lo\) / \(hi - lo\)"):
        fn(r, p_hat=p)  # rewards on [-1, 1] without their range
    with pytest.raises(ValueError, match="outside the value table's reward_range"):
        fn(np.array([3.0, 0.0]), p_hat=np.array([0.5, 0.5]), reward_range=(-1.0, 1.0))


# ---------------------------------------------------------------------------------------- std scaling (opt-in)
def test_std_scale_advantages_formula_and_invalid_rows():
    a = np.array([0.5, -0.25, np.nan, 1.0, 0.0, -0.75])
    ok = ~np.isnan(a)
    out, scale = std_scale_advantages(a, ok, eps=1e-4)
    sd = np.sqrt(np.sum((a[ok] - a[ok].mean()) ** 2) / (ok.sum() - 1))  # Bessel-corrected sample std
    assert scale == pytest.approx(sd + 1e-4, rel=1e-15)
    np.testing.assert_allclose(out[ok], a[ok] / (sd + 1e-4), rtol=1e-15)
    assert out[2] == 0.0
    # default valid = the finite entries; an explicit mask also zeroes finite rows it leaves out
    np.testing.assert_array_equal(std_scale_advantages(a)[0], out)
    masked, _ = std_scale_advantages(np.nan_to_num(a), ok & (np.arange(6) != 0))
    assert masked[0] == 0.0 and masked[2] == 0.0


@pytest.mark.parametrize("adv", [[0.7, np.nan, np.nan], [np.nan, np.nan], [-0.3]])
def test_std_scale_advantages_leaves_fewer_than_two_rows_unscaled(adv):
    # the sample std of one value is undefined: the paper's r - b is returned, not r - b divided by eps
    a = np.array(adv)
    out, scale = std_scale_advantages(a)
    assert scale == 1.0
    np.testing.assert_array_equal(out, np.nan_to_num(a, nan=0.0))


def test_std_scale_advantages_equal_advantages_divide_by_eps():
    out, scale = std_scale_advantages(np.array([1.0, 1.0, 1.0]), eps=1e-4)
    assert scale == 1e-4
    np.testing.assert_allclose(out, 1e4)


@pytest.mark.parametrize(
    ("args", "match"),
    [((np.ones((2, 2)),), "1-D"), ((np.ones(3), np.ones(2, dtype=bool)), "shape"),
     ((np.ones(3), None, -1e-4), "eps"), ((np.ones(3), None, np.nan), "eps")],
)
def test_std_scale_advantages_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        std_scale_advantages(*args)


def test_registry_normalize_uses_std_scale_advantages(monkeypatch):
    import trl_ext.estimators.basis as basis_module
    from trl_ext.estimators.baselines import get_advantage_estimator

    fn = get_advantage_estimator("basis")
    r = np.array([1.0, 0.0, np.nan, 1.0, 0.0, 1.0])
    p = np.array([0.3, 0.5, 0.6, 0.7, 0.2, 0.9])
    raw = fn(r, p_hat=p)
    calls = []

    def spy(adv, valid=None, eps=1e-4):
        calls.append((np.array(adv), np.array(valid), eps))
        return std_scale_advantages(adv, valid, eps)

    monkeypatch.setattr(basis_module, "std_scale_advantages", spy)
    norm = fn(r, p_hat=p, normalize=True, norm_eps=1e-3)
    assert len(calls) == 1 and calls[0][2] == 1e-3
    np.testing.assert_array_equal(calls[0][0], raw.advantages)
    np.testing.assert_array_equal(calls[0][1], ~np.isnan(r))
    expected, scale = std_scale_advantages(raw.advantages, ~np.isnan(r), 1e-3)
    np.testing.assert_array_equal(norm.advantages, expected)
    np.testing.assert_array_equal(norm.scale, np.full(6, scale))
    # one finite reward: unscaled (scale 1), where the registry used to divide by norm_eps
    one = fn(np.array([1.0, np.nan, np.nan]), p_hat=np.array([0.5, 0.5, 0.5]), normalize=True)
    assert one.advantages[0] == 1.0 and np.all(one.scale == 1.0)


def test_audit_quick_runs_and_is_sane():
    import json

    from trl_ext.estimators.audits.basis import format_table, run_audit

    res = run_audit(seed=0, quick=True)
    json.dumps(res)
    for sc in res["scenarios"].values():
        est = sc["estimators"]
        mse = {k: v["mse"] for k, v in est.items()}
        assert mse["GRPO G=1"] > mse["GRPO G=2"] > mse["GRPO G=4"] > mse["GRPO G=8"]
        for g in (2, 4, 8):
            assert mse[f"RLOO G={g}"] > mse[f"GRPO G={g}"]  # one fewer rollout in each leave-one-out mean
        assert est["GRPO G=1"]["frac_extreme"] == 1.0 and est["REINFORCE++"]["frac_extreme"] < 0.05
        assert mse["BASIS-UNB"] < mse["REINFORCE++"]
        cal = sc["basis_calibration"]
        assert cal["paper"]["active_fraction_mean"] < cal["robust"]["active_fraction_mean"]
        assert len(est["BASIS-UNB"]["mse_by_bin"]) == 5
        assert sc["mse_reduction_vs_reinforce_pp"] == pytest.approx(1 - mse["BASIS-UNB"] / mse["REINFORCE++"])
    text = format_table(res)
    for name in ("REINFORCE++", "GRPO G=8", "RLOO G=2", "BASIS-UNB", "kl_tilt", "tilt_noisy", "no_drift"):
        assert name in text
    assert run_audit(seed=0, quick=True)["scenarios"]["kl_tilt"]["estimators"] == res["scenarios"]["kl_tilt"][
        "estimators"
    ]  # deterministic given the seed


@pytest.mark.slow
def test_audit_full_runs_and_is_deterministic():
    # Timing lives in benchmarks/estimator_microbench.py, not in tests (these machines are noisy).
    from trl_ext.estimators.audits.basis import run_audit

    a, b = run_audit(seed=1, quick=False), run_audit(seed=1, quick=False)
    a.pop("seconds", None), b.pop("seconds", None)  # wall time is reported, not part of the result
    assert a == b and a["scenarios"]


def test_torch_tensors_with_grad_and_bf16_are_accepted_like_numpy():
    # docs/estimators.md: "torch tensors accepted as input". Rewards that require grad, or bfloat16 tensors, used to
    # raise inside np.asarray (RuntimeError / TypeError "unsupported ScalarType BFloat16").
    torch = pytest.importorskip("torch")
    r = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    p = np.array([0.25, 0.5, 0.75, 0.5, 0.0, 0.5])
    ref = batchwise_baseline(r, p).baseline
    for rt in (torch.tensor(r, requires_grad=True), torch.tensor(r, dtype=torch.bfloat16)):
        np.testing.assert_allclose(batchwise_baseline(rt, torch.tensor(p, dtype=torch.bfloat16)).baseline, ref,
                                   atol=1e-12)  # 0.25 / 0.5 / 0.75 are exact in bfloat16
        cal = calibrate_beta(rt, torch.tensor(p, requires_grad=True))
        np.testing.assert_allclose(cal.baseline, calibrate_beta(r, p).baseline, atol=1e-12)
    np.testing.assert_allclose(v_beta_from_samples(torch.tensor([[0.0, 1.0], [1.0, 1.0]]), 0.5),
                               v_beta_from_samples([[0.0, 1.0], [1.0, 1.0]], 0.5), atol=1e-12)
    np.testing.assert_allclose(v_beta(torch.tensor(p, requires_grad=True), 0.5), v_beta(p, 0.5), atol=1e-12)

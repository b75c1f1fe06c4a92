"""Tests of the pure estimators of ``trl-ext advise`` (``trl_ext.advise.regime`` / ``rates`` / ``recommend``).

Exact enumeration over every binomial (or multinomial) outcome checks that the estimators are unbiased for their
closed forms; hypothesis checks the U-statistic against brute-force subset enumeration; hand-computed cases pin the
method rates, the intervals and the errors.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from trl_ext.advise import rates, regime
from trl_ext.advise.recommend import AdviceWarning, measure, recommend


def _row(s: int, k: int) -> np.ndarray:
    return np.array([[1.0] * s + [0.0] * (k - s)])


# ------------------------------------------------------------------------------------------------ unbiasedness
@pytest.mark.parametrize("k", [2, 3, 5, 8, 12])
@pytest.mark.parametrize("p", [0.0, 0.05, 0.3, 0.5, 0.77, 1.0])
def test_zero_variance_estimator_is_exactly_unbiased(k, p):
    """sum_s Binom(s; k, p) [C(s,G) + C(k-s,G)] / C(k,G) == p^G + (1-p)^G for every G <= k (eq. A4)."""
    pmf = stats.binom.pmf(np.arange(k + 1), k, p)
    for g in range(1, k + 1):
        est = [regime.zero_variance_estimates(_row(s, k), g)["z"][0] for s in range(k + 1)]
        assert float(np.dot(pmf, est)) == pytest.approx(p ** g + (1 - p) ** g, abs=1e-12)
        assert regime.zero_variance_estimates(_row(0, k), g)["unbiased"].all()


def test_plugin_is_biased_upwards_and_unbiased_is_not():
    k, g, p = 8, 4, 0.3
    pmf = stats.binom.pmf(np.arange(k + 1), k, p)
    plugin = float(np.dot(pmf, regime.plugin_zero_variance(np.arange(k + 1) / k, g)))
    assert plugin > p ** g + (1 - p) ** g + 0.01  # Jensen: the naive plug-in over-states ties


def test_nonbinary_u_statistic_is_exactly_unbiased():
    """Rewards in {0, 0.5, 1} with probabilities q: E[sum_v C(c_v, G) / C(k, G)] = sum_v q_v^G (eq. A5)."""
    q = {0.0: 0.2, 0.5: 0.5, 1.0: 0.3}
    k = 5
    for g in (2, 3, 5):
        total = 0.0
        for outcome in itertools.product(q, repeat=k):
            prob = math.prod(q[v] for v in outcome)
            total += prob * regime.zero_variance_estimates(np.array([outcome]), g)["z"][0]
        assert total == pytest.approx(sum(v ** g for v in q.values()), abs=1e-12)


def test_wasted_tokens_is_exactly_unbiased():
    """(reward, length) i.i.d. with a length law that depends on the reward: E[W_hat] = sum_v q_v^G G E[len | v]."""
    joint = {(1.0, 3): 0.25, (1.0, 9): 0.15, (0.0, 5): 0.35, (0.0, 20): 0.25}
    k = 4
    q1 = 0.4
    e_len = {1.0: (3 * 0.25 + 9 * 0.15) / q1, 0.0: (5 * 0.35 + 20 * 0.25) / (1 - q1)}
    for g in (1, 2, 3, 4):
        total = 0.0
        for outcome in itertools.product(joint, repeat=k):
            prob = math.prod(joint[o] for o in outcome)
            r = np.array([[o[0] for o in outcome]])
            ln = np.array([[o[1] for o in outcome]])
            total += prob * regime.wasted_tokens(r, ln, g)["waste"][0]
        truth = q1 ** g * g * e_len[1.0] + (1 - q1) ** g * g * e_len[0.0]
        assert total == pytest.approx(truth, rel=1e-12)


def test_variance_decomposition_unbiased_with_ragged_k():
    """Per-prompt k_i (after unscorable samples): between -> sum (p - p_bar)^2 / (N - 1), within -> mean p(1-p)."""
    p = np.array([0.2, 0.6, 0.9])
    ks = (2, 3, 4)
    e_between = e_within = 0.0
    for s in itertools.product(*(range(k + 1) for k in ks)):
        prob = math.prod(stats.binom.pmf(si, k, pi) for si, k, pi in zip(s, ks, p))
        d = regime.variance_decomposition(np.array(s) / np.array(ks), np.array(ks))
        e_between += prob * d["between_variance"]
        e_within += prob * d["within_variance"]
    assert e_between == pytest.approx(p.var(ddof=1), abs=1e-12)
    assert e_within == pytest.approx(float((p * (1 - p)).mean()), abs=1e-12)
    # scalar k and a constant array agree
    rates_ = [0.25, 0.5, 1.0, 0.0]
    assert regime.variance_decomposition(rates_, 4) == pytest.approx(
        {**regime.variance_decomposition(rates_, [4, 4, 4, 4]), "k": 4})


# ------------------------------------------------------------------------------------------------ properties
@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=9), st.integers(1, 9))
def test_u_statistic_equals_brute_force_subsets(row, g):
    z = regime.zero_variance_estimates(np.array([row]), g)
    brute = regime.all_equal_subset_share(row, g)
    if len(row) < g:
        assert math.isnan(brute) and not z["unbiased"][0]
        assert 0.0 <= z["z"][0] <= 1.0  # the Jeffreys fallback is still a probability
    else:
        assert z["z"][0] == pytest.approx(brute, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.data())
def test_intervals_contain_the_rate(k, data):
    s = data.draw(st.integers(0, k))
    for method in ("jeffreys", "clopper-pearson"):
        pr = regime.pass_rate_intervals(_row(s, k), method=method)
        assert pr["low"][0] <= pr["rate"][0] <= pr["high"][0]
        assert 0.0 <= pr["low"][0] and pr["high"][0] <= 1.0


def test_clopper_pearson_matches_scipy_exact():
    for s, k in ((0, 10), (3, 10), (10, 10), (7, 16)):
        pr = regime.pass_rate_intervals(_row(s, k), method="clopper-pearson", confidence=0.9)
        ci = stats.binomtest(s, k).proportion_ci(confidence_level=0.9, method="exact")
        assert (pr["low"][0], pr["high"][0]) == pytest.approx((ci.low, ci.high), abs=1e-10)


# ------------------------------------------------------------------------------------------------ hand cases
def test_unscorable_samples_are_counted_and_excluded():
    r = np.array([[1, 0, np.nan, 1], [np.nan] * 4, [0, 0, 0, 0]], dtype=float)
    pr = regime.pass_rate_intervals(r)
    assert pr["n_unscorable"] == 5 and pr["n_prompts_unscorable"] == 1
    assert pr["n_samples"].tolist() == [3, 0, 4] and pr["rate"][0] == pytest.approx(2 / 3)
    assert math.isnan(pr["rate"][1])
    z = regime.zero_variance_estimates(r, 2)["z"]
    assert z[0] == pytest.approx((1 + 0) / 3) and math.isnan(z[1]) and z[2] == 1.0
    chk = regime.disjoint_group_zero_variance(r, 2)
    assert chk == {"share": 2 / 3, "groups": 3, "tied": 2, "skipped_unscorable": 3}


def test_bad_rewards_raise_with_what_to_change():
    with pytest.raises(ValueError, match="unscorable"):
        regime.check_rewards([[None, None], [None, None]])
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        regime.check_rewards([[0.0, 2.0]])
    with pytest.raises(ValueError, match="non-empty"):
        regime.check_rewards(np.zeros((0, 4)))
    with pytest.raises(ValueError, match="inf"):
        regime.check_rewards([[0.0, np.inf]])


def test_histogram_bins():
    assert regime.pass_rate_histogram([0, 0.25, 0.26, 0.75, 0.9, 1]) == {
        "0": 1, "(0,0.25]": 1, "(0.25,0.5]": 1, "(0.5,0.75]": 1, "(0.75,1)": 1, "1": 1}


def test_method_rates_hand_computed():
    """Two prompts: p = 1/2 (lengths 10) and p = 0 (lengths 30), k = 4."""
    r = np.array([[1, 0, 1, 0], [0, 0, 0, 0]], dtype=float)
    ln = np.array([[10] * 4, [30] * 4], dtype=float)
    t = rates.method_terms(r, ln, group_sizes=(2,), basis_table_samples=3, basis_table_uses=math.inf)
    a, b = t["grpo_g2"]["groups_per_1k"]
    z1 = 2 / 6  # [C(2,2) + C(2,2)] / C(4,2)
    assert a.tolist() == pytest.approx([1000 * (1 - z1), 0.0]) and b.tolist() == [20.0, 60.0]
    a, b = t["dapo_g2"]["tokens_per_kept_group"]
    assert a.sum() / b.sum() == pytest.approx(80 / (1 - z1))  # all generated tokens / kept groups
    a, b = t["reinforce_pp"]["rollouts_per_1k"]
    assert a.sum() / b.sum() == pytest.approx(2000 / 40)
    assert t["basis"].info["table_tokens_per_online_token"] == 0.0
    a, b = t["basis"]["useful_token_share"]  # zero advantage iff the 3 table samples and the rollout agree: z(4)
    assert a.tolist() == [10.0, 0.0] and b.tolist() == [10.0, 30.0]  # C(2, 4) = 0: the p = 1/2 prompt never ties
    t2 = rates.method_terms(r, ln, group_sizes=(2,), basis_table_samples=3, basis_table_uses=1.0)
    assert t2["basis"]["useful_token_share"][1].tolist() == [40.0, 120.0]


def test_v05_schedule_respects_budget_and_cap():
    z = {4: np.array([1.0, 0.0]), 6: np.array([1.0, 0.0]), 8: np.array([0.5, 0.0])}
    marks, expected = rates.v05_schedule(4, 2, 8, 10.0, lambda m: z[m])
    assert marks == [4, 6, 8] and expected.tolist() == [8.0, 4.0]
    marks, expected = rates.v05_schedule(4, 2, 16, 0.25, lambda m: z.get(m, np.zeros(2)))
    assert marks == [4, 6] and expected.tolist() == [6.0, 4.0]  # one round: mean extra 1 <= 0.25 x 4
    with pytest.raises(ValueError):
        rates.v05_schedule(4, 2, 3, 1.0, lambda m: z[m])


def test_bootstrap_ratio_ci_contains_point_and_needs_two_prompts():
    rng = np.random.default_rng(0)
    a = rng.random((50, 2))
    b = np.ones((50, 2))
    lo, hi = regime.bootstrap_ratio_ci(a, b, n_resamples=300)
    assert np.all(lo <= a.mean(axis=0)) and np.all(a.mean(axis=0) <= hi)
    lo, hi = regime.bootstrap_ratio_ci(a[:1], b[:1])
    assert np.isnan(lo).all() and np.isnan(hi).all()


def test_measure_and_recommend_on_planted_matrix():
    """Planted pass rates: the unbiased zero-variance share's interval covers the planted truth at every G, the
    disjoint-group check agrees, the subset check is exact, and the advice is strict JSON."""
    rng = np.random.default_rng(3)
    p = rng.choice([0.0, 0.1, 0.3, 0.5, 0.8, 1.0], size=300)
    r = (rng.random((300, 16)) < p[:, None]).astype(float)
    ln = rng.integers(5, 50, size=r.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AdviceWarning)
        adv = recommend(measure(r, ln, ln >= 49, max_new_tokens=49, n_resamples=300))
    for g in (2, 4, 8, 16):
        e = adv.zero_variance[str(g)]["share"]
        truth = float(np.mean(p ** g + (1 - p) ** g))
        assert e.low <= truth <= e.high, (g, e, truth)
        assert abs(adv.zero_variance[str(g)]["disjoint_check"]["share"] - e.value) < 0.1
        assert adv.zero_variance[str(g)]["subset_check_max_abs_diff"] == pytest.approx(0.0, abs=1e-12)
    assert adv.recommendation in ("grpo", "reinforce_pp", "basis")
    assert adv.methods["grpo_g8"]["saving_vs_user_grpo"].value == pytest.approx(0.0, abs=1e-12)
    d = adv.to_dict()
    import json

    json.dumps(d, allow_nan=False)


def test_too_few_prompts_warns_with_achieved_width():
    r = np.array([[1, 0, 0, 1, 0, 0, 0, 1], [0] * 8, [1] * 8, [1, 1, 0, 1, 0, 1, 1, 1]], dtype=float)
    adv = measure(r, np.full(r.shape, 5), n_resamples=200)
    with pytest.warns(AdviceWarning, match=r"width .* with 4 prompts.*prompts would reach it"):
        recommend(adv, target_width=0.05)

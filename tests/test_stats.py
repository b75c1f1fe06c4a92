"""Tests for trl_ext.stats: formulas against the hand-worked cases of "Measurement Discipline for RLVR", exact
enumeration, property tests and bad input.

"Companion section N" in the comments is section N of that paper's companion piece "Same RL Recipe, Different
Seed, Different Verdict: Here's a Training Comparison You Can Trust", published alongside it.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sst

from trl_ext import stats as S
from trl_ext.stats.two_part import binom_two_sided_half

# --------------------------------------------------------------------------------------------------------------
# Floors: the paper's worked cases
# --------------------------------------------------------------------------------------------------------------


def test_detection_constant_is_z975_plus_z80():
    assert S.DETECTION_Z == pytest.approx(1.959964 + 0.841621, abs=1e-5)
    assert round(S.DETECTION_Z, 4) == 2.8016  # section 2's unrounded constant


def test_dcpo_floor_35_4_points_and_ratio_0_19():
    floor = S.detection_floor(0.4, 30)
    assert round(100 * floor, 1) == 35.4  # section 1
    assert round(S.margin_to_floor_ratio(0.067, floor), 2) == 0.19
    assert S.read_margin(0.067, floor).zone == "below significance"
    # the paper's display rounding gives the same first decimal
    assert round(100 * S.detection_floor(0.4, 30, z=2.80), 1) == 35.4


def test_longrlvr_floor_scales_with_sqrt_n():
    # section 2: 600 items -> ratio 2.2; if the honest N is 200 the ratio drops by sqrt(3) to 1.27
    f600, f200 = S.detection_floor(0.27, 600), S.detection_floor(0.27, 200)
    assert f200 / f600 == pytest.approx(math.sqrt(3))
    assert round(2.2 / math.sqrt(3), 2) == 1.27


def test_win_share_floors_21_7_and_17_4():
    # section 6: comparison 1 = 86 vs 80 of 166 decided; comparison 2 = 137 vs 122 of 259 decided
    f1 = S.win_share_floor(166, 86 / 166)
    f2 = S.win_share_floor(259, 137 / 259)
    assert round(100 * f1, 1) == 21.7
    assert round(100 * f2, 1) == 17.4
    r1 = S.margin_to_floor_ratio(6 / 166, f1)
    r2 = S.margin_to_floor_ratio(15 / 259, f2)
    assert round(r1, 2) == 0.17 and round(r2, 2) == 0.33
    # "converting each ratio back to a z-score gives 0.47 and 0.93, implying p of about 0.64 and 0.35"
    z1, z2 = r1 * S.DETECTION_Z, r2 * S.DETECTION_Z
    assert round(z1, 2) == 0.47 and round(z2, 2) == 0.93
    assert round(2 * sst.norm.sf(z1), 2) == 0.64 and round(2 * sst.norm.sf(z2), 2) == 0.35
    # symmetric in w <-> 1 - w
    assert S.win_share_floor(259, 122 / 259) == pytest.approx(f2)


def test_significance_crossing_0_70_and_zones():
    assert round(S.significance_crossing(), 2) == 0.70  # 1.96 / 2.80
    f = 0.1
    assert S.read_margin(0.105, f).zone == "clears floor"
    assert S.read_margin(-0.08, f).zone == "significant, below floor"
    assert S.read_margin(0.05, f).zone == "below significance"


def test_six_point_margin_at_500_questions():
    # gate section: n = 500, p ~ 0.5, 2 standard errors of the difference ~ 6 points
    assert 100 * S.detection_floor(0.5, 500, z=2.0) == pytest.approx(6.3, abs=0.05)


def test_paired_floor_equals_unpaired_for_independent_scores():
    p, n = 0.37, 123
    assert S.paired_detection_floor(2 * p * (1 - p), n) == pytest.approx(S.detection_floor(p, n))


@given(p=st.floats(0.01, 0.99), n=st.integers(1, 5000), k=st.integers(1, 50))
def test_floors_decrease_with_n_and_are_symmetric(p, n, k):
    assert S.detection_floor(p, n + k) < S.detection_floor(p, n)
    assert S.detection_floor(p, n) == pytest.approx(S.detection_floor(1 - p, n))
    assert S.win_share_floor(n + k, p) < S.win_share_floor(n, p)
    assert S.win_share_floor(n, p) == pytest.approx(S.win_share_floor(n, 1 - p))
    assert S.win_share_floor(n, p) <= S.win_share_floor(n, 0.5) + 1e-15  # the null is the widest


def test_floors_broadcast():
    out = S.detection_floor(np.array([0.2, 0.5]), np.array([[10], [40]]))
    assert out.shape == (2, 2) and out[1, 1] == pytest.approx(out[0, 1] / 2)


@pytest.mark.parametrize(
    "call",
    [
        lambda: S.detection_floor(1.2, 30),
        lambda: S.detection_floor(float("nan"), 30),
        lambda: S.detection_floor(0.4, 0),
        lambda: S.detection_floor(0.4, -3),
        lambda: S.detection_floor(0.4, 30, alpha=0),
        lambda: S.detection_floor(0.4, 30, z=-1),
        lambda: S.win_share_floor(0, 0.5),
        lambda: S.win_share_floor(10, -0.1),
        lambda: S.margin_to_floor_ratio(0.1, 0.0),
        lambda: S.margin_to_floor_ratio(float("nan"), 0.1),
    ],
)
def test_floor_bad_input(call):
    with pytest.raises(ValueError):
        call()


def test_saturated_baseline_floor_is_zero_and_ratio_refuses():
    assert S.detection_floor(1.0, 30) == 0.0
    with pytest.raises(ValueError, match="saturation"):
        S.margin_to_floor_ratio(0.05, S.detection_floor(0.0, 30))


# --------------------------------------------------------------------------------------------------------------
# Exact binomial test and McNemar
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k,n,expected,rel",
    [
        (147, 251, 0.0079, 0.02),  # section 4/5 pooled votes, 74 undecided
        (114, 190, 0.0071, 0.02),  # companion section 3 worked example
        (184, 237, 3.96e-18, 0.01),  # seed 1, Mistral judge
        (200, 236, 9.44e-29, 0.01),  # seed 3: exact, not floored at 1e-15
        (80, 166, 0.698, 0.01),  # comparison 1
        (143, 164, 1.7e-23, 0.05),  # plant control
        (211, 365, 0.0033, 0.02),
        (108, 216, 1.0, 1e-12),  # the exact 108-108 dead heat
    ],
)
def test_exact_binomial_matches_paper(k, n, expected, rel):
    assert S.exact_binomial_test(k, n) == pytest.approx(expected, rel=rel)


def _minlike_enumeration(k, n, p):
    pmf = [math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(n + 1)]
    return min(1.0, sum(x for x in pmf if x <= pmf[k] * (1 + 1e-7)))


@given(n=st.integers(1, 40), data=st.data(), p=st.sampled_from([0.5, 0.3, 0.8]))
@settings(max_examples=60)
def test_exact_binomial_equals_enumeration(n, data, p):
    k = data.draw(st.integers(0, n))
    assert S.exact_binomial_test(k, n, p) == pytest.approx(_minlike_enumeration(k, n, p), rel=1e-9, abs=1e-300)
    greater = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))
    assert S.exact_binomial_test(k, n, p, alternative="greater") == pytest.approx(greater, rel=1e-9)


def test_vectorised_half_test_is_the_scalar_test():
    """``binom_two_sided_half`` (the floors' Monte Carlo) is ``exact_binomial_test`` elementwise, bit for bit."""
    ks, ns = zip(*[(k, n) for n in range(0, 45) for k in range(n + 1)])
    got = binom_two_sided_half(np.array(ks), np.array(ns))
    want = [S.exact_binomial_test(k, n) for k, n in zip(ks, ns)]
    assert got.tolist() == want
    grid = binom_two_sided_half(np.array([[3, 4], [0, 7]]), 7)
    assert grid.shape == (2, 2) and grid[1, 0] == S.exact_binomial_test(0, 7)
    assert float(binom_two_sided_half(0, 0)) == 1.0


def test_binomtest_equals_the_closed_form_at_one_half():
    """Why one test suffices: at p = 1/2 scipy's ``binomtest`` (minlike) equals the closed form
    ``min(1, 2 F(min(k, n - k)))`` the two-part rule used to compute on its own -- exactly, except where the p-value
    rounds to 1 (an odd ``n`` split ``(n +- 1) / 2``), where binomtest gives 1.0 and the closed form 1 - O(1e-15)."""
    from scipy import stats

    checked = 0
    for n in [*range(1, 121), *range(121, 2500, 61)]:
        k = np.arange(n + 1) if n <= 120 else np.unique(np.r_[0 : n + 1 : 11, n // 2 - 3 : n // 2 + 4])
        closed = np.minimum(1.0, 2.0 * stats.binom.cdf(np.minimum(k, n - k), n, 0.5))
        exact = np.array([S.exact_binomial_test(int(i), n) for i in k])
        mid = (exact > 1e-300) & (exact < 0.999)  # below 1e-300 both are subnormal and differ in their last bits
        assert np.array_equal(exact[mid], closed[mid]), n
        np.testing.assert_allclose(exact[~mid], closed[~mid], rtol=2e-15, atol=1e-320)
        checked += k.size
    assert checked > 10_000


def test_exact_binomial_edge_and_bad_input():
    assert S.exact_binomial_test(0, 0) == 1.0  # no decided votes: documented fallback
    for bad in [(-1, 3), (4, 3), (1.5, 3), (True, 3)]:
        with pytest.raises(ValueError):
            S.exact_binomial_test(*bad)
    with pytest.raises(ValueError):
        S.exact_binomial_test(1, 3, p=1.5)
    with pytest.raises(ValueError, match="alternative"):
        S.exact_binomial_test(1, 3, alternative="bigger")


@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=80))
def test_mcnemar_counts_properties(pairs):
    a = np.array([x for x, _ in pairs])
    b = np.array([y for _, y in pairs])
    m = S.mcnemar_counts(a, b)
    assert m.both + m.a_only + m.b_only + m.neither == m.n == len(pairs)
    assert m.difference == pytest.approx(a.mean() - b.mean())
    assert m.p_value == pytest.approx(S.exact_binomial_test(m.a_only, m.a_only + m.b_only))
    swapped = S.mcnemar_counts(b, a)
    assert (swapped.a_only, swapped.b_only) == (m.b_only, m.a_only)
    assert swapped.p_value == pytest.approx(m.p_value)


def test_mcnemar_bad_input():
    with pytest.raises(ValueError, match="0/1"):
        S.mcnemar_counts([0, 2], [0, 1])
    with pytest.raises(ValueError, match="same questions"):
        S.mcnemar_counts([0, 1], [0, 1, 1])
    with pytest.raises(ValueError, match="empty"):
        S.mcnemar_counts([], [])
    with pytest.raises(ValueError, match="0/1"):
        S.mcnemar_counts([0, float("nan")], [0, 1])


# --------------------------------------------------------------------------------------------------------------
# Paired bootstrap
# --------------------------------------------------------------------------------------------------------------


def test_bootstrap_ci_covers_true_difference_in_simulation():
    # Questions drawn from a population: half easy (both sides 0.9), half hard (a 0.3 + lift, b 0.3).
    # The population difference is 0.5 * lift; the 95 % interval should cover it about 95 % of the time.
    rng = np.random.default_rng(1)
    n, reps, lift = 150, 200, 0.16
    truth = 0.5 * lift
    covered = 0
    for r in range(reps):
        easy = rng.random(n) < 0.5
        a = (rng.random(n) < np.where(easy, 0.9, 0.3 + lift)).astype(float)
        b = (rng.random(n) < np.where(easy, 0.9, 0.3)).astype(float)
        covered += S.paired_bootstrap_ci(a, b, n_boot=400, seed=r).contains(truth)
    assert 0.88 <= covered / reps <= 0.99


def test_bootstrap_estimate_and_shapes():
    a = np.array([[1, 0, 1, 1], [1, 1, 0, 1]], dtype=float)
    b = np.array([[0, 0, 1, 1], [1, 0, 0, 0]], dtype=float)
    ci = S.paired_bootstrap_ci(a, b, n_boot=500, seed=0)
    assert ci.estimate == pytest.approx(a.mean() - b.mean())
    assert ci.low <= ci.estimate <= ci.high
    again = S.paired_bootstrap_ci(a, b, n_boot=500, seed=0)
    assert (again.low, again.high) == (ci.low, ci.high)  # seeded
    custom = S.paired_bootstrap_ci(a, b, n_boot=200, seed=0, statistic=lambda x, y: float(np.median(x - y)))
    assert custom.estimate == float(np.median(a - b))
    single = S.paired_bootstrap_ci([1.0], [0.0], n_boot=100)
    assert single.low == single.high == 1.0  # documented: zero width with one question


def _hand_written_paired_bootstrap(a, b, n_boot, seed, level):
    """The resampler ``paired_bootstrap_ci`` used before it called ``scipy.stats.bootstrap`` (default statistic)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = a.shape[-1]
    rng = np.random.default_rng(seed)
    reps = np.empty(n_boot)
    d = (a - b).reshape(-1, n).mean(axis=0)
    for start in range(0, n_boot, 2048):
        m = min(2048, n_boot - start)
        reps[start : start + m] = d[rng.integers(0, n, size=(m, n))].mean(axis=1)
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


@pytest.mark.parametrize("shape,n_boot,level", [((2,), 100, 0.95), ((7,), 2047, 0.9), ((3, 150), 2049, 0.95),
                                                ((5, 2001), 2000, 0.95), ((1, 33), 5000, 0.8)])
def test_bootstrap_is_bit_identical_to_the_hand_written_one(shape, n_boot, level):
    """scipy.stats.bootstrap draws the same question indices as the earlier hand-written loop, so the interval (and
    the intervals committed in benchmarks/results) is unchanged to the last bit."""
    rng = np.random.default_rng(sum(shape) + n_boot)
    a = (rng.random(shape) < 0.6).astype(float)
    b = rng.random(shape)  # pass rates: non-binary differences too
    for seed in (0, 3):
        ci = S.paired_bootstrap_ci(a, b, n_boot=n_boot, seed=seed, level=level)
        assert (ci.low, ci.high) == _hand_written_paired_bootstrap(a, b, n_boot, seed, level)


def test_bootstrap_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        S.paired_bootstrap_ci([1, 0], [1, 0, 1])
    with pytest.raises(ValueError, match="finite"):
        S.paired_bootstrap_ci([1, np.nan], [1, 0])
    with pytest.raises(ValueError, match="n_boot"):
        S.paired_bootstrap_ci([1, 0], [1, 0], n_boot=5)
    with pytest.raises(ValueError, match="level"):
        S.paired_bootstrap_ci([1, 0], [1, 0], level=1.0)
    with pytest.raises(ValueError):
        S.paired_bootstrap_ci([], [])


# --------------------------------------------------------------------------------------------------------------
# Two-part rule
# --------------------------------------------------------------------------------------------------------------


def _seeds_from_votes(pattern_counts, n_seeds=3):
    """Build (a, b) per-seed 0/1 arrays from {per-question verdict tuple: count}."""
    a, b = [[] for _ in range(n_seeds)], [[] for _ in range(n_seeds)]
    for verdicts, count in pattern_counts.items():
        for _ in range(count):
            for s, v in enumerate(verdicts):
                a[s].append(1 if v > 0 else 0)
                b[s].append(1 if v < 0 else 0)
    return np.array(a), np.array(b)


def test_two_part_worked_example_called_win():
    # companion section 3: 114 question votes for the peak, 76 for the final, the rest abstain; all seeds agree
    a, b = _seeds_from_votes({(1, 1, 1): 114, (-1, -1, 0): 76, (0, 0, 0): 310})
    v = S.two_part_rule(a, b)
    assert (v.votes_a, v.votes_b, v.abstain) == (114, 76, 310)
    assert v.pooled_p_value == pytest.approx(0.0071, rel=0.02)
    assert v.status == "a_wins" and v.winner == "a" and v.pooled_significant and v.unanimous
    flipped = S.two_part_rule(b, a)
    assert flipped.status == "b_wins" and flipped.pooled_p_value == pytest.approx(v.pooled_p_value)


def test_two_part_dissenting_seed_no_winner():
    # section 4/5 shape: pooled significant, but seed "2" points the other way -> no winner
    a, b = _seeds_from_votes({(1, 1, 1): 60, (1, -1, 1): 60, (-1, -1, 0): 40, (0, -1, 0): 45, (0, 0, 0): 120})
    v = S.two_part_rule(a, b, seed_labels=["1", "2", "3"])
    assert v.seeds[1].net < 0 < v.seeds[0].net
    assert v.pooled_significant and not v.unanimous
    assert v.status == "no_winner" and v.winner is None and "2" in v.reason


def test_two_part_dead_heat_seed_breaks_unanimity():
    # a seed on an exact split (net 0) agrees with nobody
    a, b = _seeds_from_votes({(1, 1, 1): 40, (1, 1, -1): 40, (-1, -1, 0): 10, (0, 0, 0): 30})
    assert S.two_part_rule(a, b).seeds[2].net == 0
    v = S.two_part_rule(a, b)
    assert v.pooled_significant and not v.unanimous and v.status == "no_winner"


def test_two_part_single_seed_cannot_call():
    a = np.ones((1, 50))
    b = np.zeros((1, 50))
    v = S.two_part_rule(a, b)
    assert v.status == "cannot_call" and v.winner is None and "single seed" in v.reason
    assert v.pooled_p_value < 1e-10  # the numbers are still reported


def test_two_part_all_tied_votes():
    a = np.array([[1, 0, 1, 1], [0, 0, 1, 1], [1, 1, 1, 0]])
    v = S.two_part_rule(a, a.copy())
    assert v.status == "no_winner" and v.votes_a == v.votes_b == 0 and v.pooled_p_value == 1.0
    assert "tied" in v.reason
    # seeds that cancel question by question also leave nothing to test
    a2, b2 = _seeds_from_votes({(1, -1, 0): 30, (-1, 1, 0): 30})
    v2 = S.two_part_rule(a2, b2)
    assert v2.abstain == 60 and v2.status == "no_winner"


def test_two_part_tie_margin_for_scores():
    a = np.array([[0.50, 0.90, 0.30], [0.52, 0.80, 0.31]])
    b = np.array([[0.49, 0.10, 0.30], [0.50, 0.20, 0.30]])
    v0 = S.two_part_rule(a, b)
    v1 = S.two_part_rule(a, b, tie_margin=0.05)
    assert v0.votes_a == 3 and v1.votes_a == 1 and v1.abstain == 2


@given(st.lists(st.lists(st.integers(0, 1), min_size=6, max_size=6), min_size=4, max_size=4), st.integers(2, 3))
@settings(max_examples=60)
def test_two_part_symmetry_and_consistency(rows, n_seeds):
    a = np.array(rows[:n_seeds])
    b = np.array(rows[-n_seeds:])[:, ::-1]
    v, w = S.two_part_rule(a, b), S.two_part_rule(b, a)
    assert (v.votes_a, v.votes_b) == (w.votes_b, w.votes_a)
    assert v.pooled_p_value == pytest.approx(w.pooled_p_value)
    assert {v.winner, w.winner} in ({None}, {"a", "b"})
    assert v.votes_a + v.votes_b + v.abstain == a.shape[1]
    if v.winner == "a":
        assert all(s.net > 0 for s in v.seeds) and v.pooled_p_value < 0.05
    # brute-force the question votes
    expected = np.sign(np.sign(a - b).sum(axis=0))
    np.testing.assert_array_equal(v.question_votes, expected)
    json.dumps(v.to_dict())


def test_two_part_bad_input():
    with pytest.raises(ValueError, match="same"):
        S.two_part_rule(np.ones((3, 5)), np.ones((3, 4)))
    with pytest.raises(ValueError, match="same"):
        S.two_part_rule(np.ones((2, 5)), np.ones((3, 5)))
    with pytest.raises(ValueError, match="non-finite"):
        S.two_part_rule([[1, np.nan]], [[1, 0]])
    with pytest.raises(ValueError, match="no seeds"):
        S.two_part_rule([], [])
    with pytest.raises(ValueError, match="same questions"):
        S.two_part_rule([[1, 0], [1]], [[1, 0], [1]])
    with pytest.raises(ValueError, match="seed_labels"):
        S.two_part_rule(np.ones((2, 3)), np.zeros((2, 3)), seed_labels=["x"])
    with pytest.raises(ValueError, match="alpha"):
        S.two_part_rule(np.ones((2, 3)), np.zeros((2, 3)), alpha=0)


# --------------------------------------------------------------------------------------------------------------
# Smallest detectable gap (Monte Carlo) against the paper's simulation
# --------------------------------------------------------------------------------------------------------------


def test_catch_rates_match_paper_at_1319_questions():
    # section 5: at 1,319 questions and measured discordance 0.2223, 3 seeds: 0.945 (3 pts), 0.654 (2 pts)
    r3, r2 = S.two_part_catch_rate([0.03, 0.02], 1319, 3, 0.2223, n_sim=1200, seed=3)
    assert r3 == pytest.approx(0.945, abs=0.03)
    assert r2 == pytest.approx(0.654, abs=0.05)


def test_null_catch_rate_is_small_and_monotone():
    rates = S.two_part_catch_rate(np.array([0.0, 0.01, 0.03, 0.06]), 300, 3, 0.25, n_sim=600, seed=1)
    assert rates[0] <= 0.03  # false wins under the null: below alpha / 2 (one direction) plus MC noise
    assert np.all(np.diff(rates) >= 0)


def test_smallest_detectable_gap_matches_paper_3_8_points():
    gap = S.smallest_detectable_gap(500, 3, 0.226, n_sim=1000, seed=0)
    assert 100 * gap == pytest.approx(3.83, abs=0.35)
    bigger = S.smallest_detectable_gap(2000, 3, 0.226, n_sim=400, seed=0)
    assert bigger < gap  # more questions buy resolution


def test_smallest_gap_unreachable_and_bad_input():
    assert S.smallest_detectable_gap(5, 3, 0.2, n_sim=200) == math.inf
    with pytest.raises(ValueError, match="discordance"):
        S.two_part_catch_rate(0.01, 100, 3, 0.0)
    with pytest.raises(ValueError, match="impossible"):
        S.two_part_catch_rate(0.5, 100, 3, 0.2)
    with pytest.raises(ValueError, match="n_questions"):
        S.two_part_catch_rate(0.01, 0, 3, 0.2)


# --------------------------------------------------------------------------------------------------------------
# Length-residualized difference
# --------------------------------------------------------------------------------------------------------------


def test_length_residualized_recovers_exact_line_and_worked_example():
    ell = np.array([-40.0, -10, 0, 5, 20, 35, 60])
    d = 0.01 + 0.0035 * ell
    lr = S.length_residualized_difference(d, np.zeros_like(d), ell, np.zeros_like(ell))
    assert lr.slope == pytest.approx(0.0035) and lr.difference == pytest.approx(0.01)
    assert lr.r_squared == pytest.approx(1.0) and lr.difference_se == pytest.approx(0.0, abs=1e-12)
    # worked example (companion section 4): raw 0.05 with 20 extra tokens at slope 0.0035 -> residual -0.020
    assert 0.05 - 20 * lr.slope == pytest.approx(-0.020)


@given(st.integers(0, 10_000))
@settings(max_examples=25)
def test_length_residualized_matches_linregress(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    la, lb = rng.integers(10, 200, n).astype(float), rng.integers(10, 200, n).astype(float)
    sa, sb = rng.normal(size=n) + 0.01 * la, rng.normal(size=n)
    lr = S.length_residualized_difference(sa, sb, la, lb)
    ref = sst.linregress(la - lb, sa - sb)
    assert lr.slope == pytest.approx(ref.slope, rel=1e-8, abs=1e-12)
    assert lr.difference == pytest.approx(ref.intercept, rel=1e-8, abs=1e-12)
    assert lr.difference_se == pytest.approx(ref.intercept_stderr, rel=1e-6)
    assert lr.slope_se == pytest.approx(ref.stderr, rel=1e-6)
    assert lr.residuals.mean() == pytest.approx(lr.difference, abs=1e-9)  # mean residual = intercept
    assert lr.ci_low < lr.difference < lr.ci_high


def test_length_residualized_constant_length_fallback_and_bad_input():
    lr = S.length_residualized_difference([1, 0, 1, 1], [0, 0, 1, 0], [5, 6, 7, 8], [3, 4, 5, 6])
    assert not lr.slope_identified and lr.slope == 0.0 and lr.difference == pytest.approx(0.5)
    # the fallback estimates one mean: its interval is the one-sample t-interval with n - 1 degrees of freedom
    d = np.array([1.0, 0.0, 0.0, 1.0])
    lo, hi = sst.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sst.sem(d))
    assert (lr.ci_low, lr.ci_high) == (pytest.approx(lo, rel=1e-12), pytest.approx(hi, rel=1e-12))
    with pytest.raises(ValueError, match="at least 3"):
        S.length_residualized_difference([1, 0], [0, 0], [1, 2], [2, 1])
    with pytest.raises(ValueError, match="same number"):
        S.length_residualized_difference([1, 0, 1], [0, 0, 1, 1], [1, 2, 3], [2, 1, 3])
    with pytest.raises(ValueError, match="NaN"):
        S.length_residualized_difference([1, 0, np.nan], [0, 0, 1], [1, 2, 3], [2, 1, 3])


# --------------------------------------------------------------------------------------------------------------
# The evaluate metric
# --------------------------------------------------------------------------------------------------------------


def test_metric_path_unknown_name():
    with pytest.raises(ValueError, match="accuracy_with_floor"):
        S.metric_path("nope")


def test_evaluate_metric_loads_offline_and_reports_floor():
    evaluate = pytest.importorskip("evaluate")
    metric = evaluate.load(S.metric_path("accuracy_with_floor"))
    preds = [1] * 12 + [0] * 18
    out = metric.compute(predictions=preds, references=[1] * 30, n_boot=500, seed=0)
    assert out["accuracy"] == pytest.approx(0.4) and out["n"] == 30
    assert out["detection_floor"] == pytest.approx(S.detection_floor(0.4, 30))
    assert out["ci_low"] < 0.4 < out["ci_high"]
    # a DCPO-shaped comparison through the metric: 6.7 points over a 40 % baseline on 30 questions
    out2 = metric.compute(predictions=[1] * 14 + [0] * 16, references=[1] * 30, n_boot=200, baseline_accuracy=0.4)
    assert out2["detection_floor"] == pytest.approx(0.354, abs=1e-3)
    assert out2["margin"] == pytest.approx(14 / 30 - 0.4)
    assert out2["margin_zone"] == "below significance"
    strings = metric.compute(predictions=["4", "7"], references=["4", "5"], n_boot=100)
    assert strings["accuracy"] == 0.5
    with pytest.raises(ValueError, match="no predictions"):
        metric.compute(predictions=[], references=[])


def test_compare_single_seed_does_not_attribute_its_smallest_gap_to_the_two_part_rule(tmp_path):
    # With one seed the two-part rule cannot call a winner at any gap; the report used to print a finite
    # "smallest gap the two-part rule catches" for it. It now says which test the number belongs to.
    import json

    rng = np.random.default_rng(0)
    files = {}
    for side, p in (("a", 0.7), ("b", 0.4)):
        path = tmp_path / f"{side}_seed1.jsonl"
        path.write_text("".join(json.dumps({"question_id": f"q{i}", "correct": int(rng.random() < p)}) + "\n"
                                for i in range(60)))
        files[side] = [str(path)]
    rep = S.compare_outcome_files(files["a"], files["b"], n_boot=200, n_sim=100)
    assert rep["verdict"]["status"] == "cannot_call"
    assert rep["smallest_detectable_gap_rule"] == "single_seed_paired_test"
    text = S.format_report(rep)
    assert "the two-part rule catches" not in text and "single-seed paired test" in text


def test_catch_rate_memory_does_not_grow_with_n_sim():
    # The Monte Carlo chunks its uniforms "to bound memory" but used to keep every chunk alive (for common random
    # numbers across gaps), so memory grew linearly in n_sim: 16 bytes x n_sim x seeds x questions.
    import tracemalloc

    def peak(n_sim):
        tracemalloc.start()
        S.two_part_catch_rate([0.02, 0.04], 1000, 4, 0.25, n_sim=n_sim, seed=1)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    small, large = peak(500), peak(2000)  # 500 sims = one chunk at this size
    assert large < 1.5 * small, (small, large)
    # common random numbers are kept: the rate is a deterministic, monotone function of the gap for a fixed seed
    r = S.two_part_catch_rate([0.0, 0.02, 0.04], 300, 3, 0.25, n_sim=200, seed=3)
    assert np.array_equal(r, S.two_part_catch_rate([0.0, 0.02, 0.04], 300, 3, 0.25, n_sim=200, seed=3))
    assert r[0] <= r[1] <= r[2]
    assert S.two_part_catch_rate(0.02, 300, 3, 0.25, n_sim=200, seed=3) == r[1]

"""Tests for trl_ext.estimators.tiebreak ("Measurement Discipline for RLVR", Section 2 tie-break blend)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_ext.estimators import blend_opened_groups, grpo_advantages, tie_break_blend, within_class_rank


def _paper_group(eps):
    """The paper's dead group: eight wrong attempts, scores distinct, ranked 0..7 by score."""
    scores = np.array([0.3, -1.2, 2.5, 0.9, -0.4, 1.7, 0.1, 3.3])  # any distinct scores give the same ranks
    return tie_break_blend(np.zeros(8), scores, np.zeros(8), epsilon=eps), scores


def test_paper_eight_attempt_example():
    blended, scores = _paper_group(0.1)
    rank = np.argsort(np.argsort(scores))
    np.testing.assert_allclose(blended, 0.1 * rank / 7)
    assert blended.mean() == pytest.approx(0.05) and blended.std() == pytest.approx(0.0327, abs=5e-5)
    # "training code's own formula": (r - mean) / (std + 0.0001), population std
    adv = grpo_advantages(blended, np.zeros(8), eps=1e-4, ddof=0).advantages
    np.testing.assert_allclose(np.sort(adv), [-1.52, -1.09, -0.65, -0.22, 0.22, 0.65, 1.09, 1.52], atol=5e-3)
    assert adv[np.argmax(scores)] == pytest.approx(1.52, abs=5e-3)
    # the coefficient sizes nothing: 1.0 -> 1.53, 0.01 -> 1.48 (the 1e-4 guard is the only epsilon dependence)
    top = {e: grpo_advantages(_paper_group(e)[0], np.zeros(8), ddof=0).advantages.max() for e in (1.0, 0.01)}
    assert round(top[1.0], 2) == 1.53 and round(top[0.01], 2) == 1.48


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.floats(1e-3, 0.99), st.floats(1e-3, 0.99), st.integers(0, 2**31 - 1), st.integers(0, 1))
def test_grpo_standardisation_cancels_epsilon_exactly(n, e1, e2, seed, ddof):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=n)
    grade = float(rng.integers(0, 2))
    ids = np.zeros(n)
    a1 = grpo_advantages(tie_break_blend(np.full(n, grade), scores, ids, e1), ids, eps=0.0, ddof=ddof).advantages
    a2 = grpo_advantages(tie_break_blend(np.full(n, grade), scores, ids, e2), ids, eps=0.0, ddof=ddof).advantages
    np.testing.assert_allclose(a1, a2, atol=1e-9)
    rank = within_class_rank(scores, np.zeros(n, dtype=int))
    np.testing.assert_allclose(a1, (rank - rank.mean()) / rank.std(ddof=ddof), atol=1e-9)


def test_mixed_group_checker_alone_vs_blend():
    grades = np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=float)
    ids = np.zeros(8)
    plain = grpo_advantages(grades, ids, ddof=0).advantages
    np.testing.assert_allclose(np.abs(plain), 1.0, atol=1e-3)  # paper: exactly +-1.00
    rng = np.random.default_rng(0)
    blended = tie_break_blend(grades, rng.normal(size=8), ids, 0.1)
    adv = grpo_advantages(blended, ids, ddof=0).advantages
    assert (adv[grades == 1] > 0).all() and (adv[grades == 0] < 0).all()  # ordering survives
    assert 0.85 < np.abs(adv).min() < 1.0 < np.abs(adv).max() < 1.15  # "0.90 to 1.10 in size", not untouched


group_st = st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0.0, 1.0]), st.floats(-5, 5)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(group_st, st.floats(1e-3, 0.999))
def test_blend_never_overrules_the_checker(rows, eps):
    ids = np.array([r[0] for r in rows])
    grades = np.array([r[1] for r in rows])
    scores = np.array([r[2] for r in rows])
    b = tie_break_blend(grades, scores, ids, eps)
    assert b.shape == grades.shape
    assert ((b >= grades) & (b <= grades + eps + 1e-12)).all()
    for g in np.unique(ids):
        m = ids == g
        gi, bi, si = grades[m], b[m], scores[m]
        hi, lo = gi[:, None] > gi[None, :], gi[:, None] == gi[None, :]
        assert (bi[:, None] > bi[None, :])[hi].all()  # checker order preserved strictly
        # within a class the blend follows the scorer's order (ties in score -> equal reward)
        assert ((si[:, None] > si[None, :]) == (bi[:, None] > bi[None, :]))[lo].all()
    # and after GRPO standardisation too
    adv = grpo_advantages(b, ids).advantages
    for g in np.unique(ids):
        m = ids == g
        gi, ai = grades[m], adv[m]
        if gi.min() < gi.max():
            assert ai[gi == 1].min() > ai[gi == 0].max()


def test_singleton_class_and_score_ties():
    b = tie_break_blend([1, 0, 0, 0], [5.0, 1.0, 1.0, 2.0], [0, 0, 0, 0], 0.1)
    np.testing.assert_allclose(b, [1.0, 0.025, 0.025, 0.1])  # singleton class -> rank 0; ties share avg rank
    b = tie_break_blend([1, 0, 0], [5.0, 1.0, 2.0], [0, 0, 0], 0.1, singleton_rank=0.5)
    np.testing.assert_allclose(b, [1.05, 0.0, 0.1])


def test_nan_grade_passes_through_and_is_counted_downstream():
    b = tie_break_blend([1, np.nan, 0, 0], [0.1, np.nan, 0.5, 0.2], [0, 0, 0, 0], 0.1)
    assert np.isnan(b[1]) and grpo_advantages(b, np.zeros(4)).n_nan == 1


def test_opened_groups_diagnostics():
    grades = np.array([0, 0, 0, 1, 1, 1, 0, 1, 1, 1, np.nan, np.nan])
    scores = np.array([1, 2, 3, 5, 5, 5, 1, 2, 3, 4, 0, 0], dtype=float)
    ids = np.array([0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4])
    b = tie_break_blend(grades, scores, ids, 0.1)
    d = blend_opened_groups(grades, b, ids)
    # group 0 tied & opened, 1 tied but scorer tie keeps it shut, 2 mixed, 3 tied & opened, 4 all NaN
    assert (d.n_groups, d.n_tied_by_checker, d.n_opened, d.n_still_tied) == (5, 3, 2, 1)
    assert d.attempts_in_opened == 5 and d.frac_opened == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "args, kw, msg",
    [
        (([0, 1], [0.1, np.nan], [0, 0]), {}, "NaN at graded rows"),
        (([0, 1], [0.1], [0, 0]), {}, "length"),
        (([0, 1], [0.1, 0.2], [0, 0]), {"epsilon": 1.0}, "overrule"),
        (([0, 0.5], [0.1, 0.2], [0, 0]), {"epsilon": 0.6}, "overrule"),
        (([0, 1], [0.1, 0.2], [0, 0]), {"epsilon": 0.0}, "epsilon"),
        (([0, 1], [0.1, 0.2], [0, 0]), {"singleton_rank": 2.0}, "singleton_rank"),
        (([], [], []), {}, "empty"),
    ],
)
def test_bad_input(args, kw, msg):
    with pytest.raises(ValueError, match=msg):
        tie_break_blend(*args, **kw)


def test_separation_check_is_per_group_and_optional():
    # grades 0 and 1 live in different groups: epsilon = 1 cannot overrule anything
    b = tie_break_blend([0, 0, 1, 1], [1.0, 2.0, 1.0, 2.0], [0, 0, 1, 1], epsilon=1.0)
    np.testing.assert_allclose(b, [0, 1, 1, 2])
    b = tie_break_blend([0, 1], [2.0, 1.0], [0, 0], epsilon=1.0, check_separation=False)
    np.testing.assert_allclose(b, [0, 1])
    with pytest.raises(TypeError, match="numeric"):
        tie_break_blend(["a"], [1.0], [0])
    with pytest.raises(ValueError, match="NaN"):
        blend_opened_groups([0, 1], [np.nan, 1], [0, 0])


def test_within_class_rank_rejects_labels_it_would_truncate():
    # Float labels 0.2 / 0.7 used to be cast to int 0 and silently merged into one class (ranks 0 and 1 instead of
    # two singletons); a (M, 1) label array was silently flattened.
    with pytest.raises(ValueError, match="integer"):
        within_class_rank([1.0, 2.0, 3.0, 4.0], [0.2, 0.7, 1.5, 1.9])
    with pytest.raises(ValueError, match="shape"):
        within_class_rank([1.0, 2.0], [[0], [0]])
    with pytest.raises(TypeError, match="integer"):
        within_class_rank([1.0, 2.0], ["a", "b"])
    # whole-number floats and bools are fine and equal the integer labels
    np.testing.assert_array_equal(within_class_rank([3.0, 1.0, 2.0], [1.0, 1.0, 0.0]),
                                  within_class_rank([3.0, 1.0, 2.0], [1, 1, 0]))
    np.testing.assert_array_equal(within_class_rank([3.0, 1.0], np.array([True, True])), [1.0, 0.0])

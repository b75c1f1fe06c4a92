"""Tests for trl_ext.estimators.baselines: GRPO / RLOO / REINFORCE++ on ragged groups, NaN handling, registry."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_ext.estimators import (
    ADVANTAGE_ESTIMATORS,
    AdvantageResult,
    batch_mean_baseline,
    get_advantage_estimator,
    group_mean_baseline,
    grpo_advantages,
    leave_one_out_baseline,
    register_advantage_estimator,
    reinforce_pp_advantages,
    rloo_advantages,
)
from trl_ext.estimators.baselines import group_stats


def _ragged(draw_sizes, rng):
    ids = np.concatenate([np.full(n, j) for j, n in enumerate(draw_sizes)])
    return rng.normal(size=ids.size), ids


def _loop_reference(r, ids):
    """Slow per-group reference of mean, LOO, std (ddof 1)."""
    mean, loo, std = np.empty_like(r), np.empty_like(r), np.empty_like(r)
    for g in np.unique(ids):
        m = ids == g
        x = r[m]
        mean[m] = x.mean()
        std[m] = x.std(ddof=1) if x.size > 1 else np.nan
        loo[m] = (x.sum() - x) / (x.size - 1) if x.size > 1 else np.nan
    return mean, loo, std


sizes = st.lists(st.integers(1, 9), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(sizes, st.integers(0, 2**31 - 1))
def test_baselines_match_loop_reference_on_ragged_groups(sz, seed):
    rng = np.random.default_rng(seed)
    r, ids = _ragged(sz, rng)
    perm = rng.permutation(r.size)  # groups need not be contiguous
    r, ids = r[perm], ids[perm]
    mean, loo, std = _loop_reference(r, ids)
    np.testing.assert_allclose(group_mean_baseline(r, ids), mean, atol=1e-12)
    np.testing.assert_allclose(leave_one_out_baseline(r, ids), loo, atol=1e-12)  # NaN where singleton
    adv = grpo_advantages(r, ids).advantages
    expect = np.where(np.isnan(std), 0.0, (r - mean) / (np.nan_to_num(std) + 1e-4))
    np.testing.assert_allclose(adv, expect, atol=1e-9)
    res = rloo_advantages(r, ids)
    assert res.n_degenerate == sum(1 for n in sz if n == 1)
    np.testing.assert_allclose(res.advantages, np.nan_to_num(r - loo, nan=0.0), atol=1e-12)
    assert res.advantages.shape == r.shape and np.isfinite(res.advantages).all()


def test_theorem_pair_identity_rloo_is_g_over_g_minus_1_times_centred():
    # PAIR Theorem 1 corollary: r_i - LOO_i = G/(G-1) (r_i - mean_g)
    rng = np.random.default_rng(0)
    r = rng.normal(size=40)
    ids = np.repeat(np.arange(5), 8)
    a_loo = rloo_advantages(r, ids).advantages
    a_mean = grpo_advantages(r, ids, scale="none").advantages
    np.testing.assert_allclose(a_loo, 8 / 7 * a_mean, atol=1e-12)


def test_grpo_matches_trl_formula_on_equal_groups():
    from trl.trainer.utils import nanstd

    rng = np.random.default_rng(1)
    r = rng.integers(0, 2, size=32).astype(float)
    r[[3, 17]] = np.nan
    ids = np.repeat(np.arange(4), 8)
    t = torch.tensor(r).view(-1, 8)
    mean = torch.nanmean(t, dim=1).repeat_interleave(8)
    std = nanstd(t, dim=1).repeat_interleave(8)
    trl_adv = torch.nan_to_num((torch.tensor(r) - mean) / (std + 1e-4), nan=0.0).numpy()
    res = grpo_advantages(torch.tensor(r), torch.tensor(ids))  # torch in, numpy out
    np.testing.assert_allclose(res.advantages, trl_adv, atol=1e-12)
    assert res.n_nan == 2


def test_nan_rewards_are_excluded_and_counted_never_silent():
    r = np.array([1.0, np.nan, 0.0, 1.0, np.nan, np.nan])
    ids = np.array([0, 0, 0, 1, 1, 1])
    for fn in (grpo_advantages, rloo_advantages, reinforce_pp_advantages):
        res = fn(r, ids)
        assert res.n_nan == 3
        assert (res.advantages[np.isnan(r)] == 0).all()
    # NaN is excluded from the baseline (not treated as 0)
    assert group_mean_baseline(r, ids)[0] == pytest.approx(0.5)
    assert batch_mean_baseline(r)[0] == pytest.approx(2 / 3)
    # group 1 has one finite reward: RLOO singleton fallback -> 0 and counted
    res = rloo_advantages(r, ids)
    assert res.advantages[3] == 0.0 and res.n_degenerate == 1


def test_all_nan_group_and_all_nan_batch():
    r = np.array([np.nan, np.nan, 1.0, 0.0])
    ids = np.array([0, 0, 1, 1])
    assert np.isnan(group_mean_baseline(r, ids)[:2]).all()
    assert (grpo_advantages(r, ids).advantages[:2] == 0).all()
    with pytest.raises(ValueError, match="every reward is NaN"):
        batch_mean_baseline([np.nan, np.nan])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_scales_and_shut_gate_count(scale):
    r = np.array([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    ids = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    res = grpo_advantages(r, ids, scale=scale)
    assert res.n_groups == 4 and res.n_zero_std_groups == 2
    assert (res.advantages[[0, 1, 6, 7]] == 0).all()
    if scale == "none":
        np.testing.assert_allclose(res.advantages[[2, 3]], [0.5, -0.5])
    if scale == "batch":
        np.testing.assert_allclose(res.scale, np.std(r, ddof=1) + 1e-4)


def test_reinforce_pp_global_baseline():
    r = np.array([1.0, 0.0, 0.0, 0.0])
    res = reinforce_pp_advantages(r, normalize=False)
    np.testing.assert_allclose(res.advantages, r - 0.25)
    res = reinforce_pp_advantages(r)
    np.testing.assert_allclose(res.advantages, (r - 0.25) / (np.std(r, ddof=1) + 1e-4))
    assert abs(res.advantages.sum()) < 1e-12


def test_rloo_normalize_whitens():
    rng = np.random.default_rng(3)
    r = rng.normal(size=24)
    ids = np.repeat(np.arange(6), 4)
    a = rloo_advantages(r, ids, normalize=True).advantages
    assert abs(a.mean()) < 1e-10 and abs(a.std(ddof=1) - 1) < 1e-3


@pytest.mark.parametrize(
    "args, exc, msg",
    [
        (([1.0, 2.0], [0]), ValueError, "length"),
        (([[1.0, 2.0]], [0, 0]), ValueError, "1-D"),
        (([], []), ValueError, "empty"),
        (([1.0, np.inf], [0, 0]), ValueError, "inf"),
        ((["a", "b"], [0, 0]), TypeError, "numeric"),
        (([1.0, 2.0], [0.0, np.nan]), ValueError, "group id"),
    ],
)
def test_bad_input(args, exc, msg):
    with pytest.raises(exc, match=msg):
        grpo_advantages(*args)


def test_bad_options():
    with pytest.raises(ValueError, match="scale"):
        grpo_advantages([1.0], [0], scale="std")
    with pytest.raises(ValueError, match="eps"):
        grpo_advantages([1.0], [0], eps=-1)
    with pytest.raises(ValueError, match="ddof"):
        group_stats([1.0], [0], ddof=2)


def test_registry():
    assert {"grpo", "rloo", "reinforce_pp"} <= set(ADVANTAGE_ESTIMATORS)
    assert get_advantage_estimator("grpo") is grpo_advantages
    with pytest.raises(KeyError, match="registered"):
        get_advantage_estimator("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("grpo")(lambda r, g: None)

    # a namesake from another module is a different function: it must not silently replace the built-in
    # (the check used to compare __qualname__ only, so any function called "grpo_advantages" overwrote "grpo")
    def grpo_advantages_namesake(rewards, group_ids):
        return None

    grpo_advantages_namesake.__qualname__ = "grpo_advantages"
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("grpo")(grpo_advantages_namesake)
    assert get_advantage_estimator("grpo") is grpo_advantages
    register_advantage_estimator("grpo")(grpo_advantages)  # re-registering the same function stays a no-op

    @register_advantage_estimator("_test_tmp")
    def _tmp(rewards, group_ids):
        return grpo_advantages(rewards, group_ids)

    try:
        res = get_advantage_estimator("_test_tmp")([1.0, 0.0], ["a", "a"])  # string group ids work
        assert isinstance(res, AdvantageResult)
        np.testing.assert_allclose(np.asarray(res), res.advantages)
    finally:
        del ADVANTAGE_ESTIMATORS["_test_tmp"]


@settings(max_examples=40, deadline=None)
@given(sizes, st.integers(0, 2**31 - 1), st.sampled_from(["group", "batch", "none"]))
def test_grpo_properties(sz, seed, scale):
    rng = np.random.default_rng(seed)
    r, ids = _ragged(sz, rng)
    nan = rng.random(r.size) < 0.2
    r[nan] = np.nan
    res = grpo_advantages(r, ids, scale=scale)
    assert res.advantages.shape == r.shape and np.isfinite(res.advantages).all()
    assert res.n_nan == int(nan.sum())
    # centred within each group: advantages sum to ~0 per group (scale is constant within a group)
    for g in np.unique(ids):
        assert abs(res.advantages[ids == g].sum()) < 1e-6
    if scale == "group":
        assert np.abs(res.advantages).max() <= np.sqrt(max(sz)) + 1e-9  # |z| <= (n-1)/sqrt(n) < sqrt(n)

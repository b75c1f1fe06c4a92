"""James-Stein shrinkage baseline (``james_stein``; arXiv:2511.03710, equations JS1-JS4 of
``trl_ext/estimators/shrinkage.py``): the closed form against a per-rollout loop, unbiasedness by exact enumeration,
the variance reduction it exists for, the limits of lambda, and every edge case."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from trl_ext.estimators import get_advantage_estimator, james_stein_advantages, james_stein_lambda, rloo_advantages


def _loop_reference(r, g, eps=1e-6):
    """JS1-JS4 written per rollout, straight from the definitions (equal or ragged groups, no NaN)."""
    r, g = np.asarray(r, float), np.asarray(g)
    ids = list(dict.fromkeys(g.tolist()))
    out = np.zeros_like(r)
    for i, (rij, gi) in enumerate(zip(r, g)):
        own = r[(g == gi)]
        others = [r[g == k] for k in ids if k != gi]
        means = np.array([o.mean() for o in others])
        mu = means.mean()
        s2 = np.mean((means - mu) ** 2)
        v2 = np.mean([o.var(ddof=1) / o.size for o in others if o.size >= 2])
        lam = v2 / (v2 + s2 + eps)
        loo = (own.sum() - rij) / (own.size - 1)
        out[i] = rij - ((1 - lam) * loo + lam * mu)
    return out


def test_closed_form_matches_per_rollout_loop():
    rng = np.random.default_rng(0)
    for _ in range(20):
        sizes = rng.integers(2, 6, size=rng.integers(2, 6))
        g = np.repeat(np.arange(sizes.size), sizes)
        r = rng.binomial(1, rng.uniform(0.1, 0.9, size=sizes.size)[g]).astype(float)
        r += rng.normal(0, 0.1, size=r.size) * rng.integers(0, 2)  # graded rewards too
        np.testing.assert_allclose(james_stein_advantages(r, g).advantages, _loop_reference(r, g), atol=1e-12)


def test_registered_and_selectable_by_name():
    assert get_advantage_estimator("james_stein") is james_stein_advantages


def test_baseline_of_a_rollout_does_not_depend_on_its_own_reward():
    rng = np.random.default_rng(1)
    g = np.repeat(np.arange(4), 3)
    r = rng.binomial(1, 0.5, size=12).astype(float)
    base = james_stein_advantages(r, g).baselines
    for i in range(r.size):
        r2 = r.copy()
        r2[i] = 1.0 - r2[i]
        assert james_stein_advantages(r2, g).baselines[i] == pytest.approx(base[i], abs=1e-12)


def _enumerate(estimator, p, G):
    """Exact mean and variance of the score-function gradient sum_ij A_ij (r_ij - p_i) for a Bernoulli bandit
    with logits theta_i (d log P(r)/d theta_i = r - p_i), over all 2^(K G) reward outcomes."""
    K = len(p)
    g = np.repeat(np.arange(K), G)
    mean, second = np.zeros(K), np.zeros(K)
    for bits in itertools.product((0.0, 1.0), repeat=K * G):
        r = np.array(bits)
        prob = np.prod(np.where(r == 1.0, np.asarray(p)[g], 1 - np.asarray(p)[g]))
        a = estimator(r, g).advantages
        grad = np.bincount(g, weights=a * (r - np.asarray(p)[g]), minlength=K)
        mean += prob * grad
        second += prob * grad ** 2
    return mean, second - mean ** 2


def test_unbiased_by_exact_enumeration():
    p, G = [0.2, 0.5, 0.7], 3
    mean, _ = _enumerate(james_stein_advantages, p, G)
    # E[sum_j r_ij (r_ij - p_i)] = G p_i (1 - p_i): the true gradient; any baseline independent of r_ij keeps it
    np.testing.assert_allclose(mean, G * np.array(p) * (1 - np.array(p)), atol=1e-12)


def test_lower_gradient_variance_than_rloo_when_prompt_means_are_close():
    """Stein's effect: with similar pass rates and few rollouts, shrinking toward the other prompts' mean lowers
    the gradient variance below RLOO's (the paper's claim), here exactly."""
    p, G = [0.4, 0.5, 0.6], 3
    _, var_js = _enumerate(james_stein_advantages, p, G)
    _, var_rloo = _enumerate(rloo_advantages, p, G)
    assert var_js.sum() < var_rloo.sum()


def test_lambda_limits():
    # far-apart prompt means with no within-prompt noise: lambda 0, the baseline is RLOO's
    r = np.array([0, 0, 0, 1, 1, 1, 0, 0, 0.0])
    g = np.repeat(np.arange(3), 3)
    res = james_stein_advantages(r, g)
    np.testing.assert_allclose(res.extras["lambda"], 0.0)
    np.testing.assert_allclose(res.advantages, rloo_advantages(r, g).advantages, atol=1e-12)
    # identical noisy prompts: s2 = 0, lambda = v2 / (v2 + eps) ~ 1, the baseline is the other prompts' mean
    r = np.array([0, 1, 0, 1, 0, 1.0])
    g = np.repeat(np.arange(3), 2)
    res = james_stein_advantages(r, g)
    assert np.all(res.extras["lambda"] > 0.999)
    np.testing.assert_allclose(res.baselines, 0.5, atol=1e-4)
    lam, mu, v2, s2 = james_stein_lambda([0.2, 0.4, 0.9], [4, 4, 4], [0.1, 0.2, 0.3])
    assert np.all((lam >= 0) & (lam < 1))
    np.testing.assert_allclose(mu, [0.65, 0.55, 0.3])


def test_tied_groups_get_signal_from_the_other_prompts():
    """An all-0 prompt among solved ones gets negative advantages (GRPO and RLOO give it 0)."""
    r = np.array([0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 0, 1.0])
    g = np.repeat(np.arange(3), 4)
    res = james_stein_advantages(r, g)
    assert np.all(res.advantages[:4] < 0)
    assert np.all(rloo_advantages(r, g).advantages[:4] == 0)
    assert res.n_zero_std_groups == 1


def test_nan_singletons_and_lonely_prompt():
    r = np.array([1.0, np.nan, 0.0, 1.0, 1.0, 0.0])
    g = np.array([0, 0, 1, 1, 1, 2])
    res = james_stein_advantages(r, g)
    assert res.n_nan == 1 and res.advantages[1] == 0.0
    # group 0 has one finite reward: its baseline is the other prompts' mean (lambda 1 for it), counted
    assert res.extras["n_singleton"] == 2  # groups 0 and 2
    assert res.baselines[0] == pytest.approx(np.mean([2 / 3, 0.0]))
    assert res.baselines[5] == pytest.approx(np.mean([1.0, 2 / 3]))
    assert res.n_degenerate == 0
    # one prompt, one finite reward: no baseline at all, advantage 0, counted
    res = james_stein_advantages(np.array([1.0, np.nan]), np.array([0, 0]))
    assert res.n_degenerate == 1 and np.all(res.advantages == 0.0)
    # one prompt with several rewards: lambda 0, plain RLOO
    r, g = np.array([1.0, 0.0, 1.0]), np.zeros(3, int)
    np.testing.assert_allclose(james_stein_advantages(r, g).advantages, rloo_advantages(r, g).advantages)


def test_normalize_and_metrics_and_bad_input():
    rng = np.random.default_rng(3)
    g = np.repeat(np.arange(5), 4)
    r = rng.binomial(1, 0.5, size=20).astype(float)
    res = james_stein_advantages(r, g, normalize=True)
    assert abs(res.advantages.mean()) < 1e-9 and res.advantages.std(ddof=1) == pytest.approx(1.0, rel=1e-3)
    m = res.extras["metrics"]
    assert set(m) == {"js_lambda", "js_v2", "js_s2", "js_singletons"}
    assert 0.0 <= m["js_lambda"] < 1.0
    with pytest.raises(ValueError, match="eps"):
        james_stein_advantages(r, g, eps=-1.0)
    with pytest.raises(ValueError):
        james_stein_advantages(r[:-1], g)

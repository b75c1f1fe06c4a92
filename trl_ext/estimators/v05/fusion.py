"""Empirical shrinkage fusion of V0.5 (Theorems 3.2-3.4, Eq. 6-9): the fused baseline of a value prior and sparse
rollouts, the standardized advantages built on it, and the reward mapping onto [-1, 1] (V = 2p - 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validation import (
    as_float_array,
    check_no_nan,
    check_positive_scalar,
    check_range,
    factorize_groups,
)
from ..baselines import AdvantageResult

DEFAULT_SIGMA_FLOOR = 0.2  #: sigma* floor; bounds |A_i| <= 2 / 0.2 = 10


@dataclass(frozen=True)
class FusionResult:
    """Output of Eq. 6-9 for one prompt (floats) or a batch of prompts (arrays of shape (G,)).

    Attributes
    ----------
    mean : empirical mean vbar_k of the finite rewards.
    bias2 : Eq. 7 estimate max(0, (vbar_k - V)^2 - 1/k); 0 means the prior is accepted.
    weight : Eq. 8 weight w = bias2 / (bias2 + 1/k) in [0, 1).
    baseline : Eq. 9 fused baseline mu* = w vbar_k + (1 - w) V, in [-1, 1].
    k : number of finite rewards used (NaN rewards are excluded).
    """

    mean: Any
    bias2: Any
    weight: Any
    baseline: Any
    k: Any

    @property
    def accepted(self) -> Any:
        """True where the hypothesis test accepts the prior ((vbar_k - V)^2 <= 1/k, so w = 0)."""
        return np.asarray(self.bias2) == 0.0


#: Relative tolerance of the Eq. 7 test at an exact tie (vbar_k - V)^2 == 1/k. Round-off in vbar_k, V and the square
#: is a few ulps, so an exact tie such as k = 9, vbar = 1/3, V = 0 (or k = 100, 10 successes, V = 2 * 0.95 - 1) can
#: come out ~1e-17 above 1/k and be rejected with bias2 ~ 1e-17; the paper's test accepts ties ("<= 1/k").
_TIE_RTOL = 1e-12


def _fuse(mean: np.ndarray, k: np.ndarray, prior: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    inv_k = 1.0 / k
    excess = (mean - prior) ** 2 - inv_k
    bias2 = np.where(excess <= _TIE_RTOL * inv_k, 0.0, excess)  # Eq. 7: max(0, .), ties (to round-off) accepted
    weight = bias2 / (bias2 + inv_k)  # Eq. 8
    baseline = weight * mean + (1.0 - weight) * prior  # Eq. 9
    return bias2, weight, np.clip(baseline, -1.0, 1.0)


def check_prior(prior: Any, name: str = "prior") -> np.ndarray:
    v = as_float_array(prior, name, ndim=None)
    check_no_nan(v.reshape(-1), name)
    check_range(v, name, -1.0, 1.0)
    return v


def shrinkage_fusion(rewards: Any, prior: float) -> FusionResult:
    """Empirical shrinkage fusion for one prompt (Eq. 6-9).

    Parameters
    ----------
    rewards : array_like, shape (k,)
        Rewards in [-1, 1]; NaN entries (unscorable rollouts) are excluded and ``k`` counts the rest.
    prior : float
        Value prior V in [-1, 1] (V = 2p - 1 for a predicted success probability p).

    Returns
    -------
    FusionResult
        Floats; ``k`` is an int.

    Raises
    ------
    ValueError
        Rewards or prior out of [-1, 1], NaN prior, wrong shape, or no finite reward (k = 0). k = 1..3 is
        computed (the paper's Appendix A.8 recommends k >= 4 because the test over-rejects below that).
    """
    r = as_float_array(rewards, "rewards", ndim=1)
    check_range(r, "rewards", -1.0, 1.0)
    v = check_prior(prior)
    if v.ndim != 0:
        raise ValueError(f"prior must be a scalar for shrinkage_fusion, got shape {v.shape}; "
                         f"use shrinkage_fusion_batch for many prompts.")
    fin = r[~np.isnan(r)]
    if fin.size == 0:
        raise ValueError("no finite reward for this prompt (all NaN); fusion needs k >= 1 scored rollouts.")
    k = fin.size
    mean = float(fin.mean())
    b2, w, mu = _fuse(np.float64(mean), np.float64(k), v)
    return FusionResult(mean=mean, bias2=float(b2), weight=float(w), baseline=float(mu), k=int(k))


def _ragged_to_groups(rewards: Any, group_ids: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Return (flat rewards, codes, finite mask, per-group k, G) from flat+ids or padded (G, K) input."""
    r = as_float_array(rewards, "rewards", ndim=None)
    if group_ids is None:
        if r.ndim != 2:
            raise ValueError(f"without group_ids, rewards must be a padded (G, K) array with NaN padding; "
                             f"got shape {r.shape}.")
        g, kmax = r.shape
        codes = np.repeat(np.arange(g), kmax)
        r = r.reshape(-1)
    else:
        if r.ndim != 1:
            raise ValueError(f"with group_ids, rewards must be flat 1-D, got shape {r.shape}.")
        codes, uniq = factorize_groups(group_ids, r.shape[0])
        g = uniq.shape[0]
    check_range(r, "rewards", -1.0, 1.0)
    ok = ~np.isnan(r)
    k = np.bincount(codes, weights=ok.astype(np.float64), minlength=g)
    return r, codes, ok, k, g


def shrinkage_fusion_batch(rewards: Any, group_ids: Any, priors: Any) -> FusionResult:
    """Vectorised Eq. 6-9 for many prompts.

    Parameters
    ----------
    rewards : array_like
        Either flat (N,) with ``group_ids`` (N,), or a padded (G, K) array with ``group_ids=None``, NaN padding.
    group_ids : array_like of shape (N,) or None
        Groups are ordered by first appearance; ``priors[j]`` belongs to the j-th group to appear.
    priors : array_like, shape (G,)
        Priors V in [-1, 1].

    Returns
    -------
    FusionResult
        Arrays of shape (G,); ``k`` is int64.

    Raises
    ------
    ValueError
        Length mismatch between priors and groups, out-of-range values, or a group without any finite reward.
    """
    r, codes, ok, k, g = _ragged_to_groups(rewards, group_ids)
    v = check_prior(priors, "priors")
    if v.ndim != 1 or v.shape[0] != g:
        raise ValueError(f"priors must have shape ({g},) (one per group, in order of first appearance), got {v.shape}.")
    if (k == 0).any():
        bad = np.flatnonzero(k == 0)[:10].tolist()
        raise ValueError(f"groups {bad} have no finite reward (all NaN or empty rows); give each at least one.")
    mean = np.bincount(codes, weights=np.where(ok, r, 0.0), minlength=g) / k
    b2, w, mu = _fuse(mean, k, v)
    return FusionResult(mean=mean, bias2=b2, weight=w, baseline=mu, k=k.astype(np.int64))


def fused_advantages(rewards: Any, prior: float, floor: float = DEFAULT_SIGMA_FLOOR) -> AdvantageResult:
    """V0.5 advantages for one prompt: A_i = (r_i - mu*) / sigma*, sigma* = max(sqrt(1 - mu*^2), floor).

    Section "Standardisation for advantage computation" (after Theorem 3.4) defines sigma* = sqrt(1 - mu*^2),
    which tends to 0 as |mu*| -> 1 (e.g. V = 1 accepted while one rollout failed gives A = -2/0). The paper
    does not say what to do there; we floor sigma* at ``floor`` (default 0.2), which bounds |A_i| <= 2/floor = 10
    -- about 2.6x the largest GRPO advantage at G = 16. ``floor`` must be in (0, 1].

    Returns
    -------
    AdvantageResult
        ``baselines`` = mu*, ``scale`` = sigma*; NaN rewards get advantage 0 and are counted in ``n_nan``;
        ``n_degenerate`` counts rollouts whose sigma* was floored; ``extras["fusion"]`` is the FusionResult.
    """
    floor = check_positive_scalar(floor, "floor")
    if floor > 1.0:
        raise ValueError(f"floor must be in (0, 1], got {floor}.")
    fr = shrinkage_fusion(rewards, prior)
    r = as_float_array(rewards, "rewards", ndim=1)
    ok = ~np.isnan(r)
    raw = math.sqrt(max(0.0, 1.0 - fr.baseline**2))
    sigma = max(raw, floor)
    adv = np.where(ok, (r - fr.baseline) / sigma, 0.0)
    n = r.shape[0]
    zero_std = int(np.ptp(r[ok]) == 0.0)
    return AdvantageResult(
        advantages=adv, baselines=np.full(n, fr.baseline), scale=np.full(n, sigma), n_nan=int((~ok).sum()),
        n_groups=1, n_zero_std_groups=zero_std, n_degenerate=int(ok.sum()) if raw < floor else 0,
        extras={"fusion": fr},
    )


def fused_advantages_batch(
    rewards: Any, group_ids: Any, priors: Any = None, floor: float = DEFAULT_SIGMA_FLOOR
) -> AdvantageResult:
    """Vectorised :func:`fused_advantages` over ragged groups (the core of the ``"v05"`` estimator,
    :func:`~trl_ext.estimators.v05.v05_advantages`).

    Parameters
    ----------
    rewards, group_ids : array_like, shape (N,)
        Rewards in [-1, 1] (NaN = unscorable, excluded and counted).
    priors : array_like, shape (G,)
        One prior per group in order of first appearance. Required.
    floor : float in (0, 1]

    Returns
    -------
    AdvantageResult
        ``extras["fusion"]`` holds the batch FusionResult; ``n_degenerate`` counts rollouts with a floored sigma*.
    """
    if priors is None:
        raise ValueError("the v05 estimator needs priors=(one value prior in [-1, 1] per group).")
    floor = check_positive_scalar(floor, "floor")
    if floor > 1.0:
        raise ValueError(f"floor must be in (0, 1], got {floor}.")
    r = as_float_array(rewards, "rewards", ndim=1)
    fr = shrinkage_fusion_batch(r, group_ids, priors)
    codes, _ = factorize_groups(group_ids, r.shape[0])
    ok = ~np.isnan(r)
    raw = np.sqrt(np.clip(1.0 - fr.baseline**2, 0.0, None))
    sigma = np.maximum(raw, floor)
    mu_i, s_i = fr.baseline[codes], sigma[codes]
    adv = np.where(ok, (np.where(ok, r, 0.0) - mu_i) / s_i, 0.0)
    rz = np.where(ok, r, np.inf)
    lo = np.full(fr.k.shape, np.inf)
    np.minimum.at(lo, codes, rz)
    hi = np.full(fr.k.shape, -np.inf)
    np.maximum.at(hi, codes, np.where(ok, r, -np.inf))
    return AdvantageResult(
        advantages=adv, baselines=mu_i, scale=s_i, n_nan=int((~ok).sum()), n_groups=int(fr.k.shape[0]),
        n_zero_std_groups=int(np.sum(hi == lo)), n_degenerate=int(np.sum(ok & (raw[codes] < floor))),
        extras={"fusion": fr},
    )



def to_signed_reward(r: Any, low: float = 0.0, high: float = 1.0, rel_tol: float = 0.0) -> Any:
    """Map rewards bounded in [low, high] linearly onto [-1, 1]: 2 (r - low) / (high - low) - 1.

    With the defaults this is the paper's V = 2p - 1 (Workflow Step 1) and maps a {0, 1} checker to {-1, 1}.
    NaN passes through (unscorable stays unscorable). Raises when ``high <= low`` or any non-NaN value lies outside
    ``[low - rel_tol (high - low), high + rel_tol (high - low)]`` (values inside that slack are clipped to [-1, 1];
    the V0.5 trainer uses ``rel_tol=1e-6`` so that weighted sums rounded past a bound are accepted). Returns a
    float for scalar input, else an ndarray of the same shape.
    """
    lo, hi = float(low), float(high)
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        raise ValueError(f"need finite low < high, got low={low!r}, high={high!r}.")
    tol = float(rel_tol) * (hi - lo)
    if not (math.isfinite(tol) and tol >= 0.0):
        raise ValueError(f"rel_tol must be a finite number >= 0, got {rel_tol!r}.")
    x = as_float_array(r, "r", ndim=None, allow_empty=True)
    check_range(x, "r", lo - tol, hi + tol)
    out = np.clip(2.0 * (x - lo) / (hi - lo) - 1.0, -1.0, 1.0)
    return float(out) if out.ndim == 0 else out

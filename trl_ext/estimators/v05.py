"""V0.5: empirical shrinkage fusion of a value prior with sparse rollouts, and Sequential OSLA allocation.

Source: "V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts" (arXiv:2603.10848) -- "Empirical
Shrinkage Fusion" (Theorems 3.2-3.4, Eq. 6-9), "Sequential OSLA Allocation" (Eq. 11, Theorems 3.5-3.6,
Appendix A.8) and "End-to-End Implementation Workflow" (Section 4.1.3). Rewards live in [-1, 1] (binary {-1, 1} in
the paper); the prior is V = 2p - 1.

For one prompt with k finite rewards r_1..r_k and prior V:

* Eq. 6  sigma2_noise = 1/k                                (bound: any reward in [-1, 1] has variance <= 1)
* Eq. 7  bias2 = max(0, (vbar_k - V)^2 - 1/k)               (= 0 exactly when the prior passes the test)
* Eq. 8  w = bias2 / (bias2 + 1/k)                           (in [0, 1))
* Eq. 9  mu* = w vbar_k + (1 - w) V
* advantage A_i = (r_i - mu*) / sigma*, sigma* = sqrt(1 - mu*^2)  (floored, see :func:`fused_advantages`)
* Theorem 3.4: |E[mu*] - mu_true| <= 1/sqrt(k) for every k, V and reward law on [-1, 1].
* Theorem 3.6: stop at the first k >= k_min with k >= 1/sqrt(c) - 1/bias2; add 2 rollouts otherwise,
  never beyond round(1/sqrt(c)) (= 16 for the paper's c = 0.0039).
* Eq. 10: the surrogate averages (1/k) sum_i over each prompt's k rollouts, so every prompt carries the same total
  weight whatever its k (:func:`equal_prompt_weights`).

The OSLA decision exists once: :func:`osla_need_more` (Theorem 3.6, one prompt) -> :func:`osla_next_counts` (one
round, one prompt) -> :func:`osla_step` (one round of a batch, with the Section 4.1.3 global stop). The simulation
loop :func:`osla_allocate`, the estimator audit and the trainer's rollout strategy
(:class:`trl_ext.trainers.v05.OSLARounds`) all call :func:`osla_step`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validation import (
    as_float_array,
    check_no_nan,
    check_positive_scalar,
    check_range,
    factorize_groups,
    to_numpy,
)
from .baselines import AdvantageResult, register_advantage_estimator

__all__ = [
    "FusionResult",
    "shrinkage_fusion",
    "shrinkage_fusion_batch",
    "fused_advantages",
    "fused_advantages_batch",
    "osla_target",
    "osla_cap",
    "osla_need_more",
    "osla_next_counts",
    "osla_should_stop",
    "osla_step",
    "OslaStep",
    "osla_allocate",
    "OslaAllocation",
    "equal_prompt_weights",
    "to_signed_reward",
    "V05_PAPER_COST",
    "V05_K_INIT",
    "DEFAULT_SIGMA_FLOOR",
]

V05_PAPER_COST = 0.0039  #: the paper's marginal rollout cost c (1/sqrt(c) ~ 16.01 -> cap 16)
V05_K_INIT = 4  #: k_init = k_min from Appendix A.8 (1/sqrt(k) >= 2/k  <=>  k >= 4)
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


def _check_prior(prior: Any, name: str = "prior") -> np.ndarray:
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
    v = _check_prior(prior)
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
    v = _check_prior(priors, "priors")
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


@register_advantage_estimator("v05")
def fused_advantages_batch(
    rewards: Any, group_ids: Any, priors: Any = None, floor: float = DEFAULT_SIGMA_FLOOR
) -> AdvantageResult:
    """Vectorised :func:`fused_advantages` over ragged groups (registered as estimator ``"v05"``).

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


# --------------------------------------------------------------------------------------------- OSLA
def _check_cost(cost: Any) -> float:
    return check_positive_scalar(cost, "cost")


def _check_bias2(bias2: Any) -> np.ndarray:
    b = as_float_array(bias2, "bias2", ndim=None)
    check_no_nan(b.reshape(-1), "bias2")
    if (b < 0).any():
        raise ValueError("bias2 must be >= 0 (it is max(0, ...) from Eq. 7).")
    return b


def osla_target(bias2: Any, cost: float) -> Any:
    """Theorem 3.6 target budget k_target = 1/sqrt(c) - 1/bias2 (``-inf`` where bias2 == 0).

    Parameters
    ----------
    bias2 : float or array_like
        Eq. 7 estimates (>= 0).
    cost : float > 0
        Marginal cost c of one rollout (paper: 0.0039).

    Returns
    -------
    float or ndarray (same shape as ``bias2``)
    """
    c = _check_cost(cost)
    b = _check_bias2(bias2)
    with np.errstate(divide="ignore", over="ignore"):  # a subnormal bias2 gives 1/bias2 = inf -> -inf
        t = 1.0 / math.sqrt(c) - np.where(b > 0, 1.0 / np.where(b > 0, b, 1.0), np.inf)
    return float(t) if t.ndim == 0 else t


def osla_cap(cost: float) -> int:
    """Maximum budget round(1/sqrt(c)) (round half up). The paper's c = 0.0039 gives 1/sqrt(c) = 16.01 -> 16."""
    c = _check_cost(cost)
    return int(math.floor(1.0 / math.sqrt(c) + 0.5))


def _check_k(k: Any) -> np.ndarray:
    kk = to_numpy(k)
    if kk.dtype.kind == "f":
        if np.isnan(kk).any() or (kk != np.round(kk)).any():
            raise ValueError("k must hold whole rollout counts.")
    elif kk.dtype.kind not in "iu":
        raise TypeError(f"k must be integer counts, got dtype {kk.dtype}.")
    kk = kk.astype(np.int64)
    if (kk < 1).any():
        raise ValueError("k (rollouts so far) must be >= 1 for every prompt.")
    return kk


def osla_need_more(k: Any, bias2: Any, cost: float, cap: int | None = None) -> np.ndarray:
    """Theorem 3.6 continuation test: True where k < 1/sqrt(c) - 1/bias2 and k < cap.

    Stateless and vectorised; ``k`` and ``bias2`` broadcast. ``cap`` defaults to :func:`osla_cap`.
    A prompt whose prior is accepted (bias2 == 0) never needs more.
    """
    kk = _check_k(k)
    cap = osla_cap(cost) if cap is None else int(cap)
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}.")
    tgt = np.asarray(osla_target(bias2, cost))
    return np.asarray((kk < tgt) & (kk < cap))


def osla_next_counts(k: Any, bias2: Any, cost: float, step: int = 2, cap: int | None = None) -> np.ndarray:
    """One OSLA round: k + step where :func:`osla_need_more`, else k, never above ``cap``.

    Parameters
    ----------
    k : int array_like, shape (G,)
    bias2 : array_like, shape (G,)
    cost : float > 0
    step : int >= 1
        Rollouts added per round (paper: 2).
    cap : int, optional
        Defaults to round(1/sqrt(c)). The result is ``min(k + step, cap)`` for prompts that continue, so a
        prompt never exceeds the cap even if ``(cap - k_init)`` is not a multiple of ``step``.
    """
    if int(step) != step or step < 1:
        raise ValueError(f"step must be a positive integer, got {step!r}.")
    kk = _check_k(k)
    cap = osla_cap(cost) if cap is None else int(cap)
    need = osla_need_more(kk, bias2, cost, cap=cap)
    return np.where(need, np.minimum(kk + int(step), cap), kk)


def _global_stop(need: np.ndarray, f: float) -> np.ndarray:
    """Section 4.1.3's global stop along the last axis (one batch): fewer than ``f`` of its prompts need more.

    ``f = 0`` disables the fraction rule (the batch then stops only when no prompt needs more).
    """
    return need.mean(axis=-1) < f if f > 0 else ~need.any(axis=-1)


def _check_frac(min_active_frac: Any) -> float:
    try:
        f = float(min_active_frac)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"min_active_frac must be a number in [0, 1] or None, got {min_active_frac!r}.") from exc
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"min_active_frac must be in [0, 1], got {min_active_frac!r}.")
    return f


def osla_should_stop(need_mask: Any, min_active_frac: float = 0.25) -> bool:
    """Global stop (Section 4.1.3): True when fewer than ``min_active_frac`` of the batch's prompts need more.

    ``min_active_frac = 0`` stops only when no prompt needs more. Raises ``ValueError`` on an empty mask or
    ``min_active_frac`` outside [0, 1].
    """
    m = to_numpy(need_mask).astype(bool).reshape(-1)
    if m.size == 0:
        raise ValueError("need_mask is empty; pass one flag per prompt in the batch.")
    return bool(_global_stop(m, _check_frac(min_active_frac)))


@dataclass(frozen=True)
class OslaStep:
    """One round of Sequential OSLA for a batch of prompts (output of :func:`osla_step`).

    Attributes
    ----------
    need : ndarray of bool, shape (..., G)
        Theorem 3.6's per-prompt continuation test (``k < 1/sqrt(c) - 1/bias2`` and ``k < cap``); False for
        prompts whose prior cannot be tested (NaN ``bias2``).
    add : ndarray of int64, shape (..., G)
        Rollouts to draw for each prompt in this round: ``min(k + step, cap) - k`` where ``need`` and the batch goes
        on, else 0. All zero when ``stop``.
    stop : bool (or ndarray of bool, shape (...))
        True when the batch draws nothing more: no prompt needs more, or the global stop fired.
    stopped_globally : bool (or ndarray of bool, shape (...))
        True when the global stop ended the batch while some prompts still needed more.
    """

    need: np.ndarray
    add: np.ndarray
    stop: Any
    stopped_globally: Any


def osla_step(
    k: Any,
    bias2: Any,
    cost: float,
    *,
    step: int = 2,
    cap: int | None = None,
    min_active_frac: float | None = 0.25,
) -> OslaStep:
    """One Sequential OSLA round for a batch (Theorem 3.6 per prompt + the global stop of Section 4.1.3).

    The single implementation of the per-round decision: :func:`osla_allocate`, the V0.5 estimator audit and the
    trainer's rollout strategy (:class:`trl_ext.trainers.v05.OSLARounds`, on the batch gathered over ranks) call it.

    Parameters
    ----------
    k : int array_like, shape (..., G)
        Rollouts drawn so far per prompt (>= 1; an unscorable rollout still counts: it cost compute).
    bias2 : array_like, shape (..., G)
        Eq. 7 estimates at the current counts (>= 0). NaN marks a prompt whose prior cannot be tested (no scorable
        rollout): it never gets more rollouts but counts in the batch for the global stop.
    cost : float > 0
        Marginal rollout cost c (paper: 0.0039).
    step : int >= 1
        Rollouts added per round to a prompt that needs more (paper: 2).
    cap : int, optional
        Budget cap; defaults to :func:`osla_cap` (``round(1/sqrt(c))``, 16 for the paper's c).
    min_active_frac : float in [0, 1] or None
        Global stop: the batch (the last axis; leading axes are independent batches) stops when fewer than this
        fraction of its prompts need more (paper: 0.25; exactly 25% continues). ``None`` or 0 disables it.

    Returns
    -------
    OslaStep
        ``stop`` / ``stopped_globally`` are Python bools for a single batch (1-D input), else arrays of the leading
        shape.
    """
    kk = _check_k(k)
    b = as_float_array(bias2, "bias2", ndim=None)
    kk, b = np.broadcast_arrays(kk, b)
    if kk.ndim == 0 or kk.shape[-1] == 0:
        raise ValueError(f"osla_step needs one count and one bias2 per prompt (shape (..., G), G >= 1), got shape "
                         f"{kk.shape}.")
    if isinstance(step, bool) or int(step) != step or step < 1:
        raise ValueError(f"step must be a positive integer, got {step!r}.")
    f = 0.0 if min_active_frac is None else _check_frac(min_active_frac)
    cap = osla_cap(cost) if cap is None else int(cap)
    testable = ~np.isnan(b)
    nxt = kk.copy()
    if testable.any():
        nxt[testable] = osla_next_counts(kk[testable], b[testable], cost, step=step, cap=cap)
    need = nxt > kk
    none = ~need.any(axis=-1)
    stop = none | _global_stop(need, f)
    stopped_globally = stop & ~none
    add = np.where(stop[..., None], 0, nxt - kk).astype(np.int64)
    if kk.ndim == 1:
        return OslaStep(need=need, add=add, stop=bool(stop), stopped_globally=bool(stopped_globally))
    return OslaStep(need=need, add=add, stop=stop, stopped_globally=stopped_globally)


@dataclass(frozen=True)
class OslaAllocation:
    """Result of :func:`osla_allocate`.

    Attributes
    ----------
    rewards : list of ndarray, the rewards gathered per prompt (length k[j] each).
    k : ndarray (G,), final rollout counts.
    fusion : FusionResult at the final counts.
    rounds : int, number of extra-rollout rounds run.
    stopped_globally : bool, True when the 25% rule ended allocation while some prompts still needed more.
    """

    rewards: list
    k: np.ndarray
    fusion: FusionResult
    rounds: int
    stopped_globally: bool


def osla_allocate(
    sample: Callable[[np.ndarray, int], Any],
    priors: Any,
    cost: float = V05_PAPER_COST,
    k_init: int = V05_K_INIT,
    step: int = 2,
    cap: int | None = None,
    min_active_frac: float | None = 0.25,
) -> OslaAllocation:
    """Run the End-to-End Workflow Steps 2-5 for a batch of prompts with a sampling callback.

    Parameters
    ----------
    sample : callable(prompt_indices: ndarray[int], n: int) -> array (len(prompt_indices), n)
        Draws ``n`` new rewards in [-1, 1] for each listed prompt (NaN allowed = unscorable).
    priors : array_like, shape (G,)
    cost, k_init, step, cap : see :func:`osla_next_counts`; ``k_init`` must be >= 1 and <= cap.
    min_active_frac : float or None
        Global stop threshold (paper: 0.25); None disables the global stop.

    Returns
    -------
    OslaAllocation

    Raises
    ------
    ValueError
        Bad priors / k_init, a ``sample`` output of the wrong shape or range, or a prompt whose rewards are all
        NaN (fusion needs at least one finite reward).
    """
    v = _check_prior(priors, "priors")
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"priors must be a non-empty 1-D array, got shape {v.shape}.")
    cap = osla_cap(cost) if cap is None else int(cap)
    if int(k_init) != k_init or k_init < 1 or k_init > cap:
        raise ValueError(f"k_init must be an integer in [1, cap={cap}], got {k_init!r}.")
    g = v.shape[0]
    idx = np.arange(g)
    first = as_float_array(sample(idx, int(k_init)), "sample() output", ndim=2)
    if first.shape != (g, k_init):
        raise ValueError(f"sample() must return shape ({g}, {k_init}), got {first.shape}.")
    buf = np.full((g, cap), np.nan)
    buf[:, :k_init] = first
    k = np.full(g, int(k_init), dtype=np.int64)
    rounds, stopped = 0, False
    while True:
        fr = shrinkage_fusion_batch(buf, None, v)
        # the rule uses the number of rollouts drawn (an unscorable NaN rollout still cost compute)
        st = osla_step(k, fr.bias2, cost, step=step, cap=cap, min_active_frac=min_active_frac)
        if st.stop:
            stopped = st.stopped_globally
            break
        act = np.flatnonzero(st.add)
        n_new = int(st.add[act].max())
        draws = as_float_array(sample(act, n_new), "sample() output", ndim=2)
        if draws.shape != (act.size, n_new):
            raise ValueError(f"sample() must return shape ({act.size}, {n_new}), got {draws.shape}.")
        for j, p in enumerate(act):
            add = int(st.add[p])
            buf[p, k[p]:k[p] + add] = draws[j, :add]
        k[act] += st.add[act]
        rounds += 1
    fr = shrinkage_fusion_batch(buf, None, v)
    return OslaAllocation([buf[j, : k[j]].copy() for j in range(g)], k, fr, rounds, stopped)


# --------------------------------------------------------------------------------------------- prompt weights
def equal_prompt_weights(k: Any) -> np.ndarray:
    """Per-prompt advantage multipliers ``c_j = kbar / k_j`` that give every prompt the same total weight (Eq. 10).

    The paper's surrogate (Eq. 10) averages ``(1/k) sum_i`` over each prompt's ``k`` rollouts, then over prompts:
    every prompt weighs the same whatever ``k`` OSLA gave it. A loss that sums over all rollouts of the batch with one
    global normalizer (TRL's token-level ``dapo``/``cispo``/``vespo``) weighs a prompt in proportion to its
    ``k``; multiplying prompt ``j``'s advantages by ``c_j`` restores equal weights (for equal completion lengths:
    ``c_j k_j = kbar`` for every prompt). ``kbar`` is the mean of ``k``, so ``sum_j c_j k_j = sum_j k_j``: the
    total advantage mass of the batch, and hence the overall gradient scale, is unchanged. The clipped surrogate is
    positively homogeneous in ``A``, so prompt ``j``'s gradient is multiplied by exactly ``c_j``.

    Parameters
    ----------
    k : array_like of int, shape (G,)
        Rollouts per prompt that carry an advantage (scorable rollouts), each >= 1.

    Returns
    -------
    ndarray of float64, shape (G,)
        ``mean(k) / k``; in ``[k_min / k_max, k_max / k_min]`` (at most ``cap / k_init`` = 4 with the paper's
        defaults, so ``|c_j A_i| <= 4 x 2 / sigma_floor``).
    """
    kk = _check_k(k)
    if kk.ndim != 1 or kk.size == 0:
        raise ValueError(f"k must be a non-empty 1-D array of per-prompt rollout counts, got shape {kk.shape}.")
    return float(kk.mean()) / kk.astype(np.float64)


# --------------------------------------------------------------------------------------------- rewards
def to_signed_reward(r: Any, low: float = 0.0, high: float = 1.0) -> Any:
    """Map rewards bounded in [low, high] linearly onto [-1, 1]: 2 (r - low) / (high - low) - 1.

    With the defaults this is the paper's V = 2p - 1 (Workflow Step 1) and maps a {0, 1} checker to {-1, 1}.
    NaN passes through (unscorable stays unscorable). Raises when ``high <= low`` or any finite value lies
    outside [low, high]. Returns a float for scalar input, else an ndarray of the same shape.
    """
    lo, hi = float(low), float(high)
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        raise ValueError(f"need finite low < high, got low={low!r}, high={high!r}.")
    x = as_float_array(r, "r", ndim=None, allow_empty=True)
    check_range(x, "r", lo, hi)
    out = np.clip(2.0 * (x - lo) / (hi - lo) - 1.0, -1.0, 1.0)
    return float(out) if out.ndim == 0 else out

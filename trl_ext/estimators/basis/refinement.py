"""Batchwise refinement of BASIS (Eq. 2, Proposition 1, Appendix 8 Eq. 4-6): the leave-one-out, prompt-dependent
baseline built from the other prompts' single rewards, and its fallbacks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ._checks import as_1d_float, check_eps, check_fallback, check_unit_interval, check_variant


@dataclass
class BaselineResult:
    """Output of :func:`batchwise_baseline`.

    Attributes
    ----------
    baseline : numpy.ndarray, shape (N,)
        ``b_i``: the BASIS baseline for active prompts with at least one other active source, the fallback otherwise.
        Defined for every prompt, including those whose own reward is NaN (their baseline does not use ``r_i``).
    active : numpy.ndarray of bool, shape (N,)
        The active set ``eps < V_i < 1 - eps`` (Section 4); prompts with a missing (NaN) value are inactive.
    fallback : numpy.ndarray of bool, shape (N,)
        Prompts that received the fallback baseline: inactive ones plus active ones without any source.
    valid : numpy.ndarray of bool, shape (N,)
        Prompts whose reward is finite (the only ones used as sources).
    n_active, n_fallback, n_no_source, n_nan_rewards, n_missing_values : int
        Counts of active prompts, fallback prompts, active prompts without any other active finite-reward source
        (e.g. a batch of size 1), NaN rewards (excluded from every baseline) and NaN values (missing table rows).
    variant, fallback_mode : str
    eps : float
    """

    baseline: np.ndarray
    active: np.ndarray
    fallback: np.ndarray
    valid: np.ndarray
    n_active: int
    n_fallback: int
    n_no_source: int
    n_nan_rewards: int
    n_missing_values: int
    variant: str
    fallback_mode: str
    eps: float

    @property
    def active_fraction(self) -> float:
        """Share of the batch in the active set."""
        return float(self.n_active) / float(self.baseline.size)

    @property
    def frac_extreme(self) -> float:
        """Share of baselines exactly 0 or 1 (zero advantage for the matching binary reward; Section 5.1 Fig. 4d)."""
        return float(np.mean((self.baseline == 0.0) | (self.baseline == 1.0)))


def exclusive_sum_exact(x: np.ndarray) -> np.ndarray:
    """``out[..., i] = sum_{j != i} x[..., j]`` by prefix + suffix sums (no subtraction of a dominant own term)."""
    zeros = np.zeros(x.shape[:-1] + (1,))
    pre = np.cumsum(np.concatenate([zeros, x[..., :-1]], axis=-1), axis=-1)
    suf = np.cumsum(np.concatenate([zeros, x[..., :0:-1]], axis=-1), axis=-1)[..., ::-1]
    return pre + suf


def _exclusive_sum(x: np.ndarray) -> np.ndarray:
    """Leave-one-out sums of a non-negative array along the last axis.

    Fast path ``total - x``; rows where that subtraction cancels badly (``total - x_i < 1e-6 total``, i.e. one
    prompt's weight dominates, as happens for V_i within a few eps of 1) are recomputed exactly.
    """
    tot = x.sum(axis=-1, keepdims=True)
    out = tot - x
    bad = out < 1e-6 * tot
    if bad.any():
        if x.ndim == 1:
            return exclusive_sum_exact(x)
        rows = bad.reshape(-1, x.shape[-1]).any(axis=1).reshape(x.shape[:-1])
        out[rows] = exclusive_sum_exact(x[rows])
    return np.maximum(out, 0.0)


def _refine(r0: np.ndarray, src: np.ndarray, v: np.ndarray, q: np.ndarray, variant: str):
    """Vectorized Eq. 4 / 5 / 6 over leading (grid) axes.

    r0 : (N,) rewards with NaN -> 0; src : (..., N) active & finite reward; v, q : (..., N) with q = 1 - v.
    Returns (baseline (..., N), has_source (..., N) bool). Entries without a source are 0 and must be replaced.
    With sigma^2 = V (1 - V):  V_j / sigma_j^2 = 1 / (1 - V_j)  and  V_j^2 / sigma_j^2 = V_j / (1 - V_j).
    """
    srcf = src.astype(np.float64)
    n_src = srcf.sum(axis=-1, keepdims=True) - srcf  # integer counts: exact
    has = n_src > 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        if variant == "rvg":
            inv = np.divide(1.0, v, out=np.zeros(src.shape), where=src)
            base = v * _exclusive_sum(r0 * inv) / n_src
        else:
            inv = np.divide(1.0, q, out=np.zeros(src.shape), where=src)
            num = _exclusive_sum(r0 * inv)
            den = _exclusive_sum(v * inv)
            if variant == "vop":
                den += 1.0
            base = v * num / den
    return np.where(has, base, 0.0), has


def _loo_mean(r0: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Leave-one-out mean of the finite rewards (0 where no other finite reward exists)."""
    tot = r0[valid].sum()
    n = valid.sum()
    cnt = n - valid
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (tot - np.where(valid, r0, 0.0)) / cnt
    return np.where(cnt > 0, out, 0.0)


def fallback_values(r0: np.ndarray, valid: np.ndarray, mode: str, v0: np.ndarray | None = None) -> np.ndarray:
    """Fallback baselines: zeros, the leave-one-out batch mean, or the initial value itself (0 where missing)."""
    if mode == "zero":
        return np.zeros_like(r0)
    if mode == "batch_mean":
        return _loo_mean(r0, valid)
    return v0


def prep_rewards(rewards, n: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = as_1d_float(rewards, "rewards")
    if n is not None and r.shape[0] != n:
        raise ValueError(f"rewards has {r.shape[0]} entries but the values/p_hat describe {n} prompts; "
                         "pass one reward and one value per prompt, in the same order.")
    check_unit_interval(r, "rewards", allow_nan=True)
    valid = ~np.isnan(r)
    return r, valid, np.where(valid, r, 0.0)


def batchwise_baseline(
    rewards,
    values,
    variant: Literal["unb", "vop", "rvg"] = "unb",
    eps: float = 1e-6,
    fallback: Literal["zero", "batch_mean", "value"] = "zero",
) -> BaselineResult:
    """Leave-one-out, prompt-dependent batchwise baseline (Eq. 2 with the weights of Appendix 8).

    With ``S_i = (A \\ {i})`` restricted to prompts with a finite reward, ``A = {i : eps < V_i < 1 - eps}`` and the
    Bernoulli plug-in ``sigma_j^2 = V_j (1 - V_j)``:

    - ``"unb"`` (Eq. 4; Proposition 1 BLUE weights): ``b_i = V_i sum_S V_j r_j / sigma_j^2 / sum_S V_j^2 / sigma_j^2``
      -- unbiased for ``V_i`` when the values are exact.
    - ``"vop"`` (Eq. 5; Proposition 3): the same with ``1 +`` in the denominator (MSE-optimal, shrinks toward 0).
    - ``"rvg"`` (Eq. 6): ``b_i = V_i / |S_i| sum_S r_j / V_j`` (the paper writes ``|A_t| - 1``; with NaN rewards
      removed the count of actual sources is used).

    Parameters
    ----------
    rewards : array_like, shape (N,)
        One reward per prompt in [0, 1]. NaN marks an unscorable rollout: it is excluded from every other prompt's
        baseline and counted in ``n_nan_rewards`` (its own baseline is still returned; give it advantage 0).
    values : array_like, shape (N,)
        Initial value estimates ``V_hat_i`` in [0, 1] (e.g. ``v_beta(p_hat, beta_t)``). NaN marks a prompt missing
        from the value table: inactive, counted in ``n_missing_values``.
    variant : {"unb", "vop", "rvg"}
    eps : float
        Active-set threshold, ``0 <= eps < 0.5`` (paper: 1e-6).
    fallback : {"zero", "batch_mean", "value"}
        Baseline for prompts outside the active set or without any source: ``"zero"`` (paper, Section 4 and
        Appendix 10: the vanilla G = 1 baseline); ``"batch_mean"``: the leave-one-out mean of the other finite
        rewards in the batch (leave-one-out so that the baseline stays independent of ``r_i``; 0 if there is none);
        ``"value"``: the initial value ``V_hat_i`` itself (0 for a missing value). ``"value"`` is the most accurate
        for ``p_hat`` in {0, 1} but returns baselines exactly 0 or 1, i.e. zero advantage whenever the reward
        matches (Section 5.1, Fig. 4d).

    Returns
    -------
    BaselineResult

    Notes
    -----
    A batch of size 1 (or an active set with a single finite-reward member) has no leave-one-out source: those
    prompts take the fallback and are counted in ``n_no_source`` -- no error. Equal rewards are not special: if all
    rewards are 0 every active baseline is 0; if all values are equal, UNB and RVG reduce to the leave-one-out mean
    of the active rewards. Complexity O(N).

    Raises
    ------
    ValueError
        Shape mismatch, empty batch, rewards or values outside [0, 1] or infinite, unknown variant/fallback, bad eps.
    """
    variant = check_variant(variant)
    fallback = check_fallback(fallback)
    eps = check_eps(eps)
    v = as_1d_float(values, "values")
    check_unit_interval(v, "values", allow_nan=True)
    r, valid, r0 = prep_rewards(rewards, v.shape[0])
    missing = np.isnan(v)
    v0 = np.where(missing, 0.0, v)
    q0 = 1.0 - v0
    active = (~missing) & (v0 > eps) & (q0 > eps)
    src = active & valid
    base, has = _refine(r0, src, v0, q0, variant)
    use_fb = ~(active & has)
    baseline = np.where(use_fb, fallback_values(r0, valid, fallback, v0), base)
    return BaselineResult(
        baseline=baseline,
        active=active,
        fallback=use_fb,
        valid=valid,
        n_active=int(active.sum()),
        n_fallback=int(use_fb.sum()),
        n_no_source=int((active & ~has).sum()),
        n_nan_rewards=int((~valid).sum()),
        n_missing_values=int(missing.sum()),
        variant=variant,
        fallback_mode=fallback,
        eps=eps,
    )

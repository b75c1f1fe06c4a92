"""BASIS: batchwise single-rollout baselines, offline V_beta value tables and per-step beta calibration.

Source: Gong et al., "BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM
Reasoning" (May 2026). Section and equation numbers below refer to that paper.

Pipeline per training step (Section 4, Algorithm 3):

1. **Offline value table** (Section 4 "Offline value estimation", Proposition 2, Appendix 10): from ``n`` reference
   rollouts per prompt, the KL-tilted value ``V_beta(x) = E_ref[r exp(r/beta)] / E_ref[exp(r/beta)]`` on a fixed
   grid of ``beta`` (:func:`default_beta_grid`, :func:`v_beta`, :func:`v_beta_table`, :func:`v_beta_from_samples`).
2. **Batchwise refinement** (Eq. 2, Proposition 1, Appendix 8 Eq. 4-6): each prompt's baseline is a weighted
   average of the *other* prompts' single rewards, restricted to the active set ``eps < V < 1 - eps``
   (:func:`batchwise_baseline`).
3. **Online calibration** (Eq. 3): choose ``beta_t`` on the grid (:func:`calibrate_beta`). The default objective
   is a robust variant of Eq. 3 (see :func:`calibrate_beta` and ``docs/estimators_basis.md``).
4. **Advantage** ``A_i = r_i - b_i`` (Section 4, after Eq. 3; :func:`basis_advantages`). The opt-in batch std
   scaling that the BASIS trainer and the registry entry offer is :func:`std_scale_advantages` (not in the paper).

All functions are pure numpy/scipy and vectorized; nothing here imports TRL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy.special import logit

from ._validation import to_numpy

__all__ = [
    "BASIS_VARIANTS",
    "BaselineResult",
    "CalibrationResult",
    "basis_advantages",
    "batchwise_baseline",
    "calibrate_beta",
    "default_beta_grid",
    "std_scale_advantages",
    "v_beta",
    "v_beta_from_samples",
    "v_beta_table",
]

BASIS_VARIANTS: tuple[str, ...] = ("unb", "vop", "rvg")
_FALLBACKS: tuple[str, ...] = ("zero", "batch_mean", "value")
_OBJECTIVES: tuple[str, ...] = ("robust", "paper")


# ----------------------------------------------------------------------------------------------------------------
# validation helpers (private)
# ----------------------------------------------------------------------------------------------------------------
def _f64(x) -> np.ndarray:
    """``x`` (numpy, sequence, or torch tensor of any dtype / device / grad state) as a float64 numpy array."""
    return np.asarray(to_numpy(x), dtype=np.float64)


def _as_1d_float(x, name: str) -> np.ndarray:
    arr = _f64(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of shape (N,), got shape {arr.shape}; flatten or index it first.")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: BASIS needs at least one prompt in the batch.")
    return arr


def _check_unit_interval(arr: np.ndarray, name: str, allow_nan: bool) -> None:
    nan = np.isnan(arr)
    if nan.any() and not allow_nan:
        raise ValueError(f"{name} contains {int(nan.sum())} NaN value(s) at indices {np.flatnonzero(nan)[:10].tolist()}; "
                         "drop or impute them before calling.")
    fin = arr[~nan]
    if np.isinf(fin).any():
        raise ValueError(f"{name} contains +/-inf; values must lie in [0, 1].")
    bad = (fin < 0.0) | (fin > 1.0)
    if bad.any():
        raise ValueError(f"{name} must lie in [0, 1] (BASIS uses the Bernoulli variance V(1-V)); got min={fin.min():.6g}, "
                         f"max={fin.max():.6g}. Rescale bounded rewards with (r - lo) / (hi - lo).")


def _check_variant(variant: str) -> str:
    v = str(variant).lower()
    if v not in BASIS_VARIANTS:
        raise ValueError(f"variant must be one of {BASIS_VARIANTS}, got {variant!r}.")
    return v


def _check_fallback(fallback: str) -> str:
    if fallback not in _FALLBACKS:
        raise ValueError(f"fallback must be one of {_FALLBACKS}, got {fallback!r}.")
    return fallback


def _check_eps(eps: float) -> float:
    eps = float(eps)
    if not (0.0 <= eps < 0.5) or np.isnan(eps):
        raise ValueError(f"eps must satisfy 0 <= eps < 0.5 (the paper uses 1e-6), got {eps!r}.")
    return eps


def _check_beta(beta) -> np.ndarray:
    b = _f64(beta)
    if np.isnan(b).any() or (b <= 0).any():
        raise ValueError("beta must be > 0 (np.inf allowed: the reference policy's value); got "
                         f"{b.ravel()[:5].tolist()}{'...' if b.size > 5 else ''}.")
    return b


def _check_grid(beta_grid) -> np.ndarray:
    grid = default_beta_grid() if beta_grid is None else _check_beta(beta_grid)
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"beta_grid must be a non-empty 1-D array, got shape {grid.shape}.")
    return grid


# ----------------------------------------------------------------------------------------------------------------
# offline values (Proposition 2, Appendix 10)
# ----------------------------------------------------------------------------------------------------------------
def default_beta_grid() -> np.ndarray:
    """The paper's 230-point calibration grid on [0.01, 5.0] (Appendix 10, "Offline value-table generation").

    200 steps of width 0.01 on [0.01, 2.00] followed by 30 steps of width 0.1 on [2.1, 5.0]; values are rounded to
    their decimal spelling so that ``0.07`` is exactly ``float("0.07")``.

    Returns
    -------
    numpy.ndarray
        Shape (230,), float64, strictly increasing.
    """
    fine = np.round(np.arange(1, 201) * 0.01, 2)
    coarse = np.round(2.0 + np.arange(1, 31) * 0.1, 1)
    return np.concatenate([fine, coarse])


def _v_and_q(p_hat: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """V_beta and 1 - V_beta for binary rewards, both computed without cancellation (broadcasting).

    With x = logit(p) + 1/beta and e = exp(-x): V = 1 / (1 + e) and 1 - V = e V. The logit is clipped to
    [-600, 600] (exp stays finite and normal, which keeps numpy on its fast path) and p in {0, 1} is then set
    exactly (V = p for every beta).
    """
    p = np.asarray(p_hat, dtype=np.float64)
    with np.errstate(divide="ignore"):
        lp = np.clip(logit(p), -600.0, 600.0)
    b = np.asarray(beta, dtype=np.float64)
    # in-place chain: large temporaries are the dominant cost for a (230, 512) grid
    e = np.asarray(np.add(lp, 1.0 / b))  # 0-d input: np.add returns a scalar, asarray makes it writable
    np.negative(e, out=e)
    np.exp(e, out=e)
    v = np.asarray(np.add(e, 1.0))
    np.reciprocal(v, out=v)
    q = np.multiply(e, v, out=e)
    zero, one = p == 0.0, p == 1.0
    if zero.any() or one.any():
        v = np.where(zero, 0.0, np.where(one, 1.0, v))
        q = np.where(zero, 1.0, np.where(one, 0.0, q))
    return v, q


def v_beta(p_hat, beta) -> np.ndarray:
    """Closed-form KL-tilted value for binary rewards (Section 4 and Appendix 10).

    .. math:: \\widehat V_\\beta = \\frac{\\hat p\\, e^{1/\\beta}}{1 - \\hat p + \\hat p\\, e^{1/\\beta}}
              = \\operatorname{expit}(\\operatorname{logit}(\\hat p) + 1/\\beta),

    the expected reward of ``pi*_beta ∝ pi_ref exp(r / beta)`` (Proposition 2 with r in {0, 1}). It is evaluated in
    the logit form, which cannot overflow for small ``beta``.

    Parameters
    ----------
    p_hat : array_like
        Reference pass rates in [0, 1] (any shape). NaN is an error (use :func:`batchwise_baseline`'s missing-value
        handling for prompts without a table entry).
    beta : array_like
        KL strength(s) > 0, broadcast against ``p_hat`` with numpy rules; ``np.inf`` is allowed.

    Returns
    -------
    numpy.ndarray
        ``broadcast(p_hat, beta)``-shaped values in [0, 1].

    Notes
    -----
    Limits: ``beta -> inf`` gives ``p_hat`` (the reference policy, first training step); ``beta -> 0`` gives
    ``1[p_hat > 0]`` (the reward-optimal policy). For fixed ``p_hat`` in (0, 1) the value is strictly decreasing in
    ``beta`` and strictly increasing in ``p_hat``; ``p_hat`` in {0, 1} is a fixed point for every ``beta``.
    """
    p = _f64(p_hat)
    _check_unit_interval(p.ravel(), "p_hat", allow_nan=False)
    b = _check_beta(beta)
    return _v_and_q(p, b)[0]


def v_beta_table(p_hat, beta_grid=None) -> np.ndarray:
    """Offline table ``V[i, k] = v_beta(p_hat[i], beta_grid[k])`` (Appendix 10: the N x 230 table).

    Parameters
    ----------
    p_hat : array_like, shape (N,)
        Reference pass rates in [0, 1].
    beta_grid : array_like, shape (K,), optional
        Defaults to :func:`default_beta_grid`.

    Returns
    -------
    numpy.ndarray, shape (N, K)
    """
    p = _as_1d_float(p_hat, "p_hat")
    return v_beta(p[:, None], _check_grid(beta_grid)[None, :])


def _to_padded(reward_samples, counts) -> tuple[np.ndarray, np.ndarray]:
    """Ragged samples -> (padded (N, M) float array with NaN/garbage padding, mask (N, M) of real entries)."""
    if counts is None:
        if hasattr(reward_samples, "detach"):  # a torch tensor is a dense (N, M) array
            reward_samples = to_numpy(reward_samples)
        if isinstance(reward_samples, np.ndarray) and reward_samples.ndim == 2:
            arr = reward_samples.astype(np.float64)
            return arr, np.ones(arr.shape, dtype=bool)
        rows = [_f64(r).ravel() for r in reward_samples]
        if not rows:
            raise ValueError("reward_samples is empty: pass one array of reference rewards per prompt.")
        m = max((r.size for r in rows), default=0)
        arr = np.full((len(rows), max(m, 1)), np.nan)
        mask = np.zeros(arr.shape, dtype=bool)
        for i, r in enumerate(rows):
            arr[i, : r.size] = r
            mask[i, : r.size] = True
        return arr, mask
    arr = _f64(reward_samples)
    if arr.ndim != 2:
        raise ValueError(f"with counts, reward_samples must be a padded 2-D array (N, M), got shape {arr.shape}.")
    c = to_numpy(counts)
    if c.shape != (arr.shape[0],):
        raise ValueError(f"counts must have shape ({arr.shape[0]},) to match reward_samples, got {c.shape}.")
    if not np.issubdtype(c.dtype, np.integer) and not np.all(c == np.round(c)):
        raise ValueError("counts must be integers.")
    c = c.astype(np.int64)
    if (c < 0).any() or (c > arr.shape[1]).any():
        raise ValueError(f"counts must lie in [0, {arr.shape[1]}] (the padded width), got min={c.min()}, max={c.max()}.")
    mask = np.arange(arr.shape[1])[None, :] < c[:, None]
    return arr, mask


def v_beta_from_samples(reward_samples, beta, counts=None, *, return_counts: bool = False):
    """Plug-in estimate of the general KL-tilted value of Proposition 2 (Eq. 2 of Prop. 2) from reference rewards.

    .. math:: \\widehat V_\\beta(x) = \\frac{\\sum_s r_s e^{r_s/\\beta}}{\\sum_s e^{r_s/\\beta}},

    i.e. the softmax(r / beta)-weighted mean of the reference rewards, computed with a max shift (log-sum-exp) so
    that ``beta = 0.01`` does not overflow. Valid for any bounded reward; for {0, 1} samples with mean ``p_hat`` it
    equals :func:`v_beta` exactly.

    Parameters
    ----------
    reward_samples : sequence of 1-D arrays, or 2-D array
        Per-prompt reference rewards: a list of N arrays (ragged), a dense (N, M) array (all M entries real), or a
        padded (N, M) array together with ``counts``.
    beta : float or array_like of shape (K,)
        KL strength(s) > 0; ``np.inf`` gives the plain sample mean.
    counts : array_like of int, shape (N,), optional
        Number of real entries at the start of each padded row.
    return_counts : bool
        Also return the number of finite samples used per prompt.

    Returns
    -------
    values : numpy.ndarray
        Shape (N,) for scalar ``beta``, (N, K) for a 1-D ``beta``.
    n_used : numpy.ndarray of int, shape (N,)
        Only with ``return_counts=True``: finite samples per prompt (NaN samples are excluded, and counted here).

    Raises
    ------
    ValueError
        A prompt with no finite sample (the value is undefined: rebuild that table row), +/-inf rewards, bad shapes.
    """
    arr, mask = _to_padded(reward_samples, counts)
    if arr.shape[0] == 0:
        raise ValueError("reward_samples is empty: pass one array of reference rewards per prompt.")
    real = mask & ~np.isnan(arr)
    if np.isinf(arr[real]).any():
        raise ValueError("reward_samples contains +/-inf; rewards must be bounded (Proposition 2).")
    n_used = real.sum(axis=1)
    if (n_used == 0).any():
        bad = np.flatnonzero(n_used == 0)
        raise ValueError(f"{bad.size} prompt(s) have no finite reference reward (indices {bad[:10].tolist()}); "
                         "their V_beta is undefined -- resample them or drop them from the table.")
    b = _check_beta(beta)
    if b.ndim > 1:
        raise ValueError(f"beta must be a scalar or 1-D grid, got shape {b.shape}.")
    r = np.where(real, arr, 0.0)
    rmax = np.max(np.where(real, arr, -np.inf), axis=1, keepdims=True)
    shifted = np.where(real, arr - rmax, -np.inf)  # <= 0 on real entries
    out = np.empty((arr.shape[0], b.size))
    for k, bk in enumerate(np.atleast_1d(b)):
        w = np.exp(shifted / bk) if np.isfinite(bk) else real.astype(np.float64)
        out[:, k] = (w * r).sum(axis=1) / w.sum(axis=1)
    values = out[:, 0] if b.ndim == 0 else out
    return (values, n_used) if return_counts else values


# ----------------------------------------------------------------------------------------------------------------
# batchwise refinement (Eq. 2, Proposition 1, Appendix 8)
# ----------------------------------------------------------------------------------------------------------------
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


def _exclusive_sum_exact(x: np.ndarray) -> np.ndarray:
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
            return _exclusive_sum_exact(x)
        rows = bad.reshape(-1, x.shape[-1]).any(axis=1).reshape(x.shape[:-1])
        out[rows] = _exclusive_sum_exact(x[rows])
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


def _fallback_values(r0: np.ndarray, valid: np.ndarray, mode: str, v0: np.ndarray | None = None) -> np.ndarray:
    """Fallback baselines: zeros, the leave-one-out batch mean, or the initial value itself (0 where missing)."""
    if mode == "zero":
        return np.zeros_like(r0)
    if mode == "batch_mean":
        return _loo_mean(r0, valid)
    return v0


def _prep_rewards(rewards, n: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = _as_1d_float(rewards, "rewards")
    if n is not None and r.shape[0] != n:
        raise ValueError(f"rewards has {r.shape[0]} entries but the values/p_hat describe {n} prompts; "
                         "pass one reward and one value per prompt, in the same order.")
    _check_unit_interval(r, "rewards", allow_nan=True)
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
    variant = _check_variant(variant)
    fallback = _check_fallback(fallback)
    eps = _check_eps(eps)
    v = _as_1d_float(values, "values")
    _check_unit_interval(v, "values", allow_nan=True)
    r, valid, r0 = _prep_rewards(rewards, v.shape[0])
    missing = np.isnan(v)
    v0 = np.where(missing, 0.0, v)
    q0 = 1.0 - v0
    active = (~missing) & (v0 > eps) & (q0 > eps)
    src = active & valid
    base, has = _refine(r0, src, v0, q0, variant)
    use_fb = ~(active & has)
    baseline = np.where(use_fb, _fallback_values(r0, valid, fallback, v0), base)
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


# ----------------------------------------------------------------------------------------------------------------
# online calibration (Eq. 3)
# ----------------------------------------------------------------------------------------------------------------
# Cells per grid chunk in _grid_losses (32 grid rows for N = 512): its work buffers stay cache-resident and are reused
# for every chunk, and a (230, 512) grid takes 8 rounds of numpy calls.
_CHUNK_CELLS = 16384
_TINY = 5e-324  # smallest positive float64: max(q, _TINY) == q for every q > 0


def _closed_form_values_into(p: np.ndarray, grid: np.ndarray):
    """``values_into(sl, v_buf, q_buf)`` for :func:`_grid_losses` from pass rates ``p`` of shape (N,).

    Writes ``V_beta`` and ``1 - V_beta`` of the grid rows ``sl`` into the buffers with the operations of
    :func:`_v_and_q` (``-(lp + 1/beta)`` is computed as ``(-lp) - 1/beta``, the same IEEE result), so every value
    is bitwise the one :func:`v_beta` returns.

    Parameters
    ----------
    p : numpy.ndarray, shape (N,)
        Pass rates in [0, 1], 0 for missing prompts.
    grid : numpy.ndarray, shape (K,)
        Beta grid.

    Returns
    -------
    callable
        ``values_into(sl, v_buf, q_buf) -> (v, q)``, both the ``(k, N)`` buffers, filled.
    """
    with np.errstate(divide="ignore"):
        neg_lp = np.negative(np.clip(logit(p), -600.0, 600.0))
    inv_beta = 1.0 / grid
    zero = np.flatnonzero(p == 0.0)
    one = np.flatnonzero(p == 1.0)

    def values_into(sl: slice, v_buf: np.ndarray, q_buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        e = np.subtract(neg_lp, inv_beta[sl, None], out=q_buf)
        np.exp(e, out=e)
        v = np.add(e, 1.0, out=v_buf)
        np.reciprocal(v, out=v)
        q = np.multiply(e, v, out=q_buf)
        if zero.size:
            v[:, zero] = 0.0
            q[:, zero] = 1.0
        if one.size:
            v[:, one] = 1.0
            q[:, one] = 0.0
        return v, q

    return values_into


def _exclusive_sum_into(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """:func:`_exclusive_sum` of a 2-D array ``x`` (entries >= 0, +inf or NaN), written into ``out``.

    Same arithmetic: ``total - x``, with the rows where that cancels (some ``total - x_i < 1e-6 total``) recomputed
    exactly. Rounding is monotone, so ``min_i fl(total - x_i) = fl(total - max_i x_i)`` finds those rows without a
    (k, N) mask. :func:`_exclusive_sum` clips the result at 0; outside the recomputed rows ``total - x`` is already
    ``>= 1e-6 total >= 0`` or NaN, where the clip is the identity, so it is applied to the recomputed rows only.

    Parameters
    ----------
    x : numpy.ndarray, shape (k, N)
        Terms to sum (read only).
    out : numpy.ndarray, shape (k, N)
        Receives ``out[:, i] = sum_{j != i} x[:, j]``; must not be ``x``.

    Returns
    -------
    numpy.ndarray
        ``out``.
    """
    tot = x.sum(axis=1)
    np.subtract(tot[:, None], x, out=out)
    rows = np.flatnonzero(tot - x.max(axis=1) < 1e-6 * tot)
    if rows.size:
        out[rows] = np.maximum(_exclusive_sum_exact(x[rows]), 0.0)
    return out


def _grid_losses(values_into, n_grid: int, r0: np.ndarray, valid: np.ndarray, fb: np.ndarray | None, variant: str,
                 eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both calibration objectives and the active fraction on every grid value (the hot loop of :func:`calibrate_beta`).

    Parameters
    ----------
    values_into : callable
        ``values_into(sl, v_buf, q_buf) -> (v, q)``: ``V_beta`` and ``1 - V_beta`` of the grid rows ``sl`` as
        ``(k, N)`` arrays (written into the buffers, or views of a precomputed table). Missing prompts must have
        ``V = 0`` and ``1 - V = 1`` (then they are never active).
    n_grid : int
        Number of grid values K.
    r0, valid : numpy.ndarray, shape (N,)
        Rewards with NaN -> 0 and the finite-reward mask.
    fb : numpy.ndarray of shape (N,), or None
        Fallback baseline per prompt (``"zero"``, ``"batch_mean"``), or None for ``"value"`` (the prompt's own
        ``V_beta``).
    variant : {"unb", "vop", "rvg"}
    eps : float

    Returns
    -------
    robust, paper, active_fraction : numpy.ndarray, shape (K,)

    Notes
    -----
    Per grid row this computes what :func:`batchwise_baseline` computes (Eq. 4-6 through :func:`_refine` and
    :func:`_exclusive_sum`), then the fallback and both losses (Eq. 3 and the robust variant), with the same
    floating-point operations on the same operands: the losses are bitwise those of the plain per-row code. It is
    faster because

    - chunks of ``_CHUNK_CELLS`` cells reuse work buffers allocated once per call (``out=``) instead of ~40 fresh
      temporaries per chunk;
    - chunks where every prompt is a source on every row (typical once beta exceeds a few tenths) skip all masking;
    - masks enter as a 0/1 float matrix: ``where(src, 1/q, 0) = src / max(q, tiny)`` and
      ``where(src, sq, 0) = sq * src`` are exact because ``q > eps >= 0`` on the sources and ``sq`` is finite off
      them;
    - the leave-one-out source test (``has`` in :func:`_refine`) is per row: a row with fewer than 2 sources takes
      the fallback everywhere (a prompt with a NaN reward may still have a source there, but its square is zeroed).
    """
    n = r0.size
    all_valid = bool(valid.all())
    n_valid = int(valid.sum())
    invalid_cols = np.flatnonzero(~valid)
    rvg = variant == "rvg"
    step = max(1, min(n_grid, _CHUNK_CELLS // max(n, 1)))
    fbuf = np.empty((7, step, n))
    fbuf[0] = r0  # broadcast once: operations on equal shapes are faster than row-broadcasting ones
    bbuf = np.empty((2, step, n), dtype=bool)
    robust = np.empty(n_grid)
    paper = np.empty(n_grid)
    act_frac = np.empty(n_grid)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for start in range(0, n_grid, step):
            sl = slice(start, min(start + step, n_grid))
            k = sl.stop - sl.start
            r_mat, v_buf, q_buf, srcf, w, x, y = fbuf[:, :k]
            active, scratch = bbuf[:, :k]
            v, q = values_into(sl, v_buf, q_buf)
            # active set eps < V < 1 - eps; missing prompts have V = 0 (never > eps), so they are inactive
            np.greater(v, eps, out=active)
            np.logical_and(active, np.greater(q, eps, out=scratch), out=active)
            # every prompt a source on every row (the usual case for moderate beta): no masks, no fallback cells
            dense = all_valid and n >= 2 and bool(active.all())
            if dense:
                n_src = n_act = np.full(k, float(n))
                np.divide(1.0, v if rvg else q, out=w)  # _refine's inv on every cell
            else:
                np.copyto(srcf, active if all_valid else np.logical_and(active, valid, out=scratch))  # 0/1
                n_src = srcf.sum(axis=1)  # exact integer counts
                n_act = n_src if all_valid else np.count_nonzero(active, axis=1)
                # _refine's inv = 1/q (UNB, VOP) or 1/v (RVG) on the sources, 0 elsewhere
                np.maximum(v if rvg else q, _TINY, out=w)
                np.divide(srcf, w, out=w)
            np.multiply(r_mat, w, out=x)  # r0 * inv
            if rvg:
                num = _exclusive_sum_into(x, w)
                den = float(n - 1) if dense else np.subtract(n_src[:, None], srcf, out=y)  # leave-one-out counts
            else:
                np.multiply(v, w, out=y)  # v * inv
                num = _exclusive_sum_into(x, w)
                den = _exclusive_sum_into(y, x)
                if variant == "vop":
                    den += 1.0
            base = np.multiply(v, num, out=num)
            np.divide(base, den, out=base)
            if dense:
                sq = np.subtract(r_mat, base, out=base)
                np.multiply(sq, sq, out=sq)
                robust[sl] = paper[sl] = sq.sum(axis=1) / n
                act_frac[sl] = 1.0
                continue
            # the baseline actually used: the BASIS one where active with a source, the fallback elsewhere. In a row
            # with fewer than 2 sources no prompt with a finite reward has a leave-one-out source; prompts with a NaN
            # reward may (their squares are zeroed below), so the whole row takes the fallback.
            use_fb = np.logical_not(active, out=scratch)
            use_fb[n_src < 2] = True
            sq = np.where(use_fb, v if fb is None else fb, base)
            np.subtract(r_mat, sq, out=sq)
            np.multiply(sq, sq, out=sq)
            if invalid_cols.size:
                sq[:, invalid_cols] = 0.0
            robust[sl] = sq.sum(axis=1) / n_valid if n_valid > 0 else np.inf
            src_sq = np.multiply(sq, srcf, out=x)  # where(src, sq, 0)
            paper[sl] = np.where(n_src > 0, src_sq.sum(axis=1) / n_src, np.inf)
            act_frac[sl] = n_act / n
    return robust, paper, act_frac


@dataclass
class CalibrationResult:
    """Output of :func:`calibrate_beta`.

    Attributes
    ----------
    beta : float
        Selected grid value ``beta_t``.
    index : int
        Its position in ``beta_grid``.
    baseline : numpy.ndarray, shape (N,)
        ``b_i`` at ``beta_t`` (BASIS for active prompts with a source, the fallback elsewhere).
    loss : float
        The selected objective at ``beta_t``.
    active_fraction : float
        Share of prompts in the active set at ``beta_t``.
    losses_per_beta : numpy.ndarray, shape (K,)
        The selected objective on the whole grid (``inf`` where it is undefined or excluded by
        ``min_active_fraction``).
    paper_losses, robust_losses : numpy.ndarray, shape (K,)
        Both objectives on the whole grid (diagnostics; ``paper_losses`` is ``inf`` where the active set has no
        finite reward).
    active_fraction_per_beta : numpy.ndarray, shape (K,)
    beta_grid : numpy.ndarray, shape (K,)
    objective, variant : str
    constraint_satisfied : bool
        False when no grid value met ``min_active_fraction`` (the constraint was then ignored).
    result : BaselineResult
        Full bookkeeping at ``beta_t`` (fallback counts, NaN counts, masks).
    """

    beta: float
    index: int
    baseline: np.ndarray
    loss: float
    active_fraction: float
    losses_per_beta: np.ndarray
    paper_losses: np.ndarray
    robust_losses: np.ndarray
    active_fraction_per_beta: np.ndarray
    beta_grid: np.ndarray
    objective: str
    variant: str
    constraint_satisfied: bool
    result: BaselineResult = field(repr=False)

    @property
    def n_fallback(self) -> int:
        return self.result.n_fallback

    @property
    def frac_extreme(self) -> float:
        return self.result.frac_extreme


def calibrate_beta(
    rewards,
    p_hat,
    beta_grid=None,
    variant: Literal["unb", "vop", "rvg"] = "unb",
    objective: Literal["robust", "paper"] = "robust",
    eps: float = 1e-6,
    fallback: Literal["zero", "batch_mean", "value"] = "zero",
    min_active_fraction: float = 0.0,
) -> CalibrationResult:
    """Select ``beta_t`` on the grid and return the BASIS baseline at it (Eq. 3, Section 4 "Online calibration").

    Objectives, with ``b_i(beta)`` the refined baseline (fallback included) built from ``V_hat_beta``:

    - ``"paper"`` (Eq. 3): ``L(beta) = mean_{i in A_beta} (r_i - b_i(beta))^2`` -- the average runs over the
      beta-dependent active set, so grid values whose active set is a small, easy-to-fit minority can win while
      leaving most prompts on the fallback (see ``docs/estimators_basis.md`` and the collapse test).
    - ``"robust"`` (default): ``L(beta) = mean_{all i with finite r_i} (r_i - b_i(beta))^2`` with each prompt's
      *actual* baseline, fallback included. Because every ``b_i`` is leave-one-out (independent of ``r_i`` given the
      batch), ``E (r_i - b_i)^2 = Var(r_i | x_i) + E (b_i - V_i)^2``: the robust loss is, up to a beta-free constant,
      an unbiased estimate of the mean baseline MSE over the *same* prompts for every beta, so grid values are
      compared on equal footing.

    Both are evaluated on the whole grid, vectorized over chunks of grid rows: O(K N) time and O(N) memory plus
    fixed ~16k-cell work buffers (N = 512, K = 230: about 1.5 ms on a 2-core machine, see
    ``benchmarks/estimator_microbench.py``).

    Parameters
    ----------
    rewards : array_like, shape (N,)
        One reward per prompt in [0, 1]; NaN = unscorable (excluded from sources and from both losses, counted).
    p_hat : array_like, shape (N,) or (N, K)
        Reference pass rates (binary rewards: the closed form :func:`v_beta` is used), or a precomputed
        ``V_beta`` table aligned with ``beta_grid`` (non-binary rewards: from :func:`v_beta_from_samples`). A NaN
        row marks a prompt missing from the table (inactive, fallback).
    beta_grid : array_like, shape (K,), optional
        Default :func:`default_beta_grid` (230 values on [0.01, 5.0]).
    variant : {"unb", "vop", "rvg"}
    objective : {"robust", "paper"}
    eps : float
        Active-set threshold (paper: 1e-6).
    fallback : {"zero", "batch_mean", "value"}
        See :func:`batchwise_baseline`.
    min_active_fraction : float in [0, 1]
        Optional extra guard for either objective: grid values whose active fraction is below it are excluded. If
        none qualifies the constraint is dropped and ``constraint_satisfied`` is False.

    Returns
    -------
    CalibrationResult

    Notes
    -----
    Ties (e.g. all rewards 0, where every beta fits perfectly) are broken toward the *largest* beta, i.e. toward
    the reference policy, which is where the paper's calibrated trajectory starts (Appendix 10, Fig. 8). When the
    paper objective is undefined for every beta (no active prompt with a finite reward anywhere on the grid), or
    every reward is NaN (both objectives undefined), the largest beta is returned with ``loss = inf``; the NaN count
    is in ``result.n_nan_rewards``.
    """
    variant = _check_variant(variant)
    fallback = _check_fallback(fallback)
    eps = _check_eps(eps)
    if objective not in _OBJECTIVES:
        raise ValueError(f"objective must be one of {_OBJECTIVES}, got {objective!r}.")
    maf = float(min_active_fraction)
    if not (0.0 <= maf <= 1.0):
        raise ValueError(f"min_active_fraction must lie in [0, 1], got {min_active_fraction!r}.")
    grid = _check_grid(beta_grid)
    ph = _f64(p_hat)
    if ph.ndim == 1:
        n = ph.shape[0]
        if n == 0:
            raise ValueError("p_hat is empty: BASIS needs at least one prompt in the batch.")
        _check_unit_interval(ph, "p_hat", allow_nan=True)
        missing = np.isnan(ph)
        p_row = np.where(missing, 0.0, ph)[None, :]
        values_into = _closed_form_values_into(p_row[0], grid)

        def values_for(sl: slice) -> tuple[np.ndarray, np.ndarray]:
            return _v_and_q(p_row, grid[sl, None])

    elif ph.ndim == 2:
        n = ph.shape[0]
        if ph.shape[1] != grid.size:
            raise ValueError(f"a V_beta table p_hat must have shape (N, K={grid.size}) aligned with beta_grid, "
                             f"got {ph.shape}.")
        if n == 0:
            raise ValueError("p_hat is empty: BASIS needs at least one prompt in the batch.")
        _check_unit_interval(ph.ravel(), "p_hat (V_beta table)", allow_nan=True)
        row_nan = np.isnan(ph)
        missing = row_nan.all(axis=1)
        if (row_nan.any(axis=1) & ~missing).any():
            raise ValueError("a V_beta table row is partly NaN; a row must be complete or entirely NaN (missing).")
        table = np.ascontiguousarray(np.where(missing[:, None], 0.0, ph).T)  # (K, N)

        def values_for(sl: slice) -> tuple[np.ndarray, np.ndarray]:
            v_ = table[sl]
            return v_, 1.0 - v_

        def values_into(sl: slice, v_buf: np.ndarray, q_buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            v_ = table[sl]
            return v_, np.subtract(1.0, v_, out=q_buf)

    else:
        raise ValueError(f"p_hat must have shape (N,) or (N, K), got {ph.shape}.")
    r, valid, r0 = _prep_rewards(rewards, n)

    fb = None if fallback == "value" else _fallback_values(r0, valid, fallback)
    robust, paper, act_frac = _grid_losses(values_into, grid.size, r0, valid, fb, variant, eps)

    losses = (robust if objective == "robust" else paper).copy()
    constraint_ok = True
    if maf > 0.0:
        ok = act_frac >= maf
        if ok.any():
            losses = np.where(ok, losses, np.inf)
        else:
            constraint_ok = False
    finite = np.isfinite(losses)
    if finite.any():
        lmin = losses[finite].min()
        tol = 1e-12 * max(1.0, abs(lmin))
        tied = np.flatnonzero(finite & (losses <= lmin + tol))
        idx = int(tied[np.argmax(grid[tied])])  # the largest tied beta, whatever the grid's order
    else:
        idx = int(np.argmax(grid))
    beta = float(grid[idx])
    v_sel = values_for(slice(idx, idx + 1))[0][0]
    res = batchwise_baseline(r, np.where(missing, np.nan, v_sel), variant=variant, eps=eps, fallback=fallback)
    return CalibrationResult(
        beta=beta,
        index=idx,
        baseline=res.baseline,
        loss=float(losses[idx]),
        active_fraction=float(act_frac[idx]),
        losses_per_beta=losses,
        paper_losses=paper,
        robust_losses=robust,
        active_fraction_per_beta=act_frac,
        beta_grid=grid,
        objective=objective,
        variant=variant,
        constraint_satisfied=constraint_ok,
        result=res,
    )


def basis_advantages(rewards, p_hat, beta_grid=None, variant="unb", objective="robust", eps=1e-6,
                     fallback="zero", min_active_fraction=0.0) -> tuple[np.ndarray, CalibrationResult]:
    """One BASIS step: calibrate beta, then ``A_i = r_i - b_i`` (Section 4, last paragraph).

    Parameters are those of :func:`calibrate_beta`. NaN rewards get advantage 0 (they are counted in
    ``calibration.result.n_nan_rewards``). No batch standardization is applied.

    Returns
    -------
    advantages : numpy.ndarray, shape (N,)
    calibration : CalibrationResult
    """
    cal = calibrate_beta(rewards, p_hat, beta_grid=beta_grid, variant=variant, objective=objective, eps=eps,
                         fallback=fallback, min_active_fraction=min_active_fraction)
    r = _f64(rewards)
    adv = np.where(cal.result.valid, np.nan_to_num(r) - cal.baseline, 0.0)
    return adv, cal


def std_scale_advantages(advantages, valid=None, eps: float = 1e-4) -> tuple[np.ndarray, float]:
    """Optional batch std scaling of BASIS advantages, ``A_i / (sd + eps)`` (the one implementation).

    BASIS itself does not scale: its advantage is ``A_i = r_i - b_i`` (Section 4, the paragraph after Eq. 3, with
    ``b_i`` the refined baseline of Eq. 2 -- weights of Eq. 4, 5 or 6 -- at the ``beta_t`` selected by Eq. 3). This
    opt-in step is shared by :class:`~trl_ext.trainers.basis.BASISTrainer` (``basis_scale_advantages=True``) and
    the ``"basis"`` registry entry (``normalize=True``). ``sd`` is the sample standard deviation (Bessel's
    correction, ``ddof=1``) of the advantages of the ``valid`` rows and ``eps`` is the guard TRL adds for
    ``scale_rewards="batch"`` (1e-4 in TRL 1.16, ``grpo_trainer.py``); unlike TRL nothing is re-centred, so the
    baseline stays ``b_i``.

    Parameters
    ----------
    advantages : array_like, shape (N,)
        ``r_i - b_i`` on any reward scale (the trainer passes the reward's own scale).
    valid : array_like of bool, shape (N,), optional
        Rows that enter the std and are scaled, e.g. the finite rewards. Default: the finite entries of
        ``advantages``. The other rows are returned as 0.
    eps : float, default 1e-4
        Guard added to the std, >= 0.

    Returns
    -------
    scaled : numpy.ndarray, shape (N,)
        ``A_i / (sd + eps)`` on valid rows, 0 elsewhere. With fewer than 2 valid rows the sample std is undefined
        and the advantages are returned unscaled (the paper's ``r - b``), not divided by ``eps``.
    scale : float
        The divisor ``sd + eps``; 1.0 when unscaled.

    Raises
    ------
    ValueError
        ``advantages`` not 1-D, ``valid`` of another shape, ``eps`` negative or not finite.

    Notes
    -----
    Valid advantages that are all equal give ``sd = 0`` and the divisor ``eps``: unlike GRPO's group-centred
    advantages they need not be 0 (e.g. every prompt on the zero fallback with reward 1), and are then multiplied by
    ``1 / eps``. With ``eps = 0`` such a batch divides by zero.
    """
    a = _f64(advantages)
    if a.ndim != 1:
        raise ValueError(f"advantages must be a 1-D array of shape (N,), got shape {a.shape}.")
    ok = np.isfinite(a) if valid is None else np.asarray(to_numpy(valid), dtype=bool)
    if ok.shape != a.shape:
        raise ValueError(f"valid must have the shape of advantages {a.shape}, got {ok.shape}.")
    eps = float(eps)
    if not (np.isfinite(eps) and eps >= 0.0):
        raise ValueError(f"eps must be a finite number >= 0 (TRL uses 1e-4), got {eps!r}.")
    if int(ok.sum()) < 2:
        return np.where(ok, a, 0.0), 1.0
    scale = float(np.std(a[ok], ddof=1)) + eps
    return np.where(ok, a / scale, 0.0), scale


# ----------------------------------------------------------------------------------------------------------------
# registry entry
# ----------------------------------------------------------------------------------------------------------------
def _register():
    from .baselines import AdvantageResult, group_stats, register_advantage_estimator

    @register_advantage_estimator("basis")
    def basis_registry_advantages(
        rewards,
        group_ids=None,
        *,
        p_hat,
        beta_grid=None,
        variant: str = "unb",
        objective: str = "robust",
        eps: float = 1e-6,
        fallback: str = "zero",
        min_active_fraction: float = 0.0,
        normalize: bool = False,
        norm_eps: float = 1e-4,
    ) -> AdvantageResult:
        """BASIS advantages ``r_i - b_i`` with per-call beta calibration (registry name ``"basis"``).

        Parameters
        ----------
        rewards : array_like, shape (N,)
            One reward per rollout in [0, 1]; NaN = unscorable (advantage 0, counted in ``n_nan``).
        group_ids : array_like, shape (N,), optional
            Prompt ids; only used for the ``n_groups`` / ``n_zero_std_groups`` diagnostics. BASIS is designed for
            one rollout per prompt, but repeated prompts are allowed: rollouts are independent given the prompt,
            so the leave-one-out weights of Proposition 1 stay unbiased.
        p_hat : array_like, shape (N,) or (N, K)
            Per-rollout reference pass rate, or V_beta table row (see :func:`calibrate_beta`). Required.
        beta_grid, variant, objective, eps, fallback, min_active_fraction
            See :func:`calibrate_beta`.
        normalize : bool
            Divide by the std of the finite advantages + ``norm_eps`` with :func:`std_scale_advantages` (the
            function the BASIS trainer uses; off by default, the paper uses the raw ``r - b``). With fewer than 2
            finite rewards nothing is scaled (``scale`` 1).
        norm_eps : float
            Guard added to the std (TRL's 1e-4).

        Returns
        -------
        AdvantageResult
            ``extras``: ``beta``, ``loss``, ``active_fraction``, ``n_fallback``, ``frac_extreme`` and the full
            :class:`CalibrationResult` under ``"calibration"``. ``n_degenerate`` is 0 (fallback prompts keep a
            non-zero advantage ``r_i - fallback``).
        """
        adv, cal = basis_advantages(rewards, p_hat, beta_grid=beta_grid, variant=variant, objective=objective,
                                    eps=eps, fallback=fallback, min_active_fraction=min_active_fraction)
        ok = cal.result.valid
        n = adv.shape[0]
        divisor = 1.0
        if normalize:
            adv, divisor = std_scale_advantages(adv, ok, eps=norm_eps)
        scale = np.full(n, divisor)
        ids = np.arange(n) if group_ids is None else group_ids
        st = group_stats(_f64(rewards), ids)
        cnt, sd_g = st["count"], np.nan_to_num(st["std"], nan=0.0)
        n_zero = int(np.sum((cnt >= 1) & ((cnt == 1) | np.isclose(sd_g, 0.0, atol=1e-12))))
        extras = {"beta": cal.beta, "loss": cal.loss, "active_fraction": cal.active_fraction,
                  "n_fallback": cal.n_fallback, "frac_extreme": cal.frac_extreme, "calibration": cal}
        return AdvantageResult(adv, cal.baseline, scale, cal.result.n_nan_rewards, int(cnt.shape[0]), n_zero, 0, extras)

    return basis_registry_advantages


basis_registry_advantages = _register()

"""Offline KL-tilted values of BASIS (Proposition 2, Appendix 10): the beta grid, the closed form ``V_beta`` for
binary rewards, its table over the grid and the plug-in estimate from reference rewards."""

from __future__ import annotations

import numpy as np
from scipy.special import logit

from .._validation import to_numpy
from ._checks import as_1d_float, check_beta, check_unit_interval, f64


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



def check_grid(beta_grid) -> np.ndarray:
    grid = default_beta_grid() if beta_grid is None else check_beta(beta_grid)
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"beta_grid must be a non-empty 1-D array, got shape {grid.shape}.")
    return grid



def v_and_q(p_hat: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    p = f64(p_hat)
    check_unit_interval(p.ravel(), "p_hat", allow_nan=False)
    b = check_beta(beta)
    return v_and_q(p, b)[0]


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
    p = as_1d_float(p_hat, "p_hat")
    return v_beta(p[:, None], check_grid(beta_grid)[None, :])


def _to_padded(reward_samples, counts) -> tuple[np.ndarray, np.ndarray]:
    """Ragged samples -> (padded (N, M) float array with NaN/garbage padding, mask (N, M) of real entries)."""
    if counts is None:
        if hasattr(reward_samples, "detach"):  # a torch tensor is a dense (N, M) array
            reward_samples = to_numpy(reward_samples)
        if isinstance(reward_samples, np.ndarray) and reward_samples.ndim == 2:
            arr = reward_samples.astype(np.float64)
            return arr, np.ones(arr.shape, dtype=bool)
        rows = [f64(r).ravel() for r in reward_samples]
        if not rows:
            raise ValueError("reward_samples is empty: pass one array of reference rewards per prompt.")
        m = max((r.size for r in rows), default=0)
        arr = np.full((len(rows), max(m, 1)), np.nan)
        mask = np.zeros(arr.shape, dtype=bool)
        for i, r in enumerate(rows):
            arr[i, : r.size] = r
            mask[i, : r.size] = True
        return arr, mask
    arr = f64(reward_samples)
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
    b = check_beta(beta)
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

"""The hot loop of BASIS's online calibration (Eq. 3): both objectives on every value of the beta grid, vectorized
over chunks of grid rows with reused work buffers (bitwise the per-row computation of :mod:`.refinement`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import logit

from .refinement import exclusive_sum_exact

# Cells per grid chunk in grid_losses (32 grid rows for N = 512): its work buffers stay cache-resident and are reused
# for every chunk, and a (230, 512) grid takes 8 rounds of numpy calls.
_CHUNK_CELLS = 16384
_TINY = 5e-324  # smallest positive float64: max(q, _TINY) == q for every q > 0


def closed_form_values_into(p: np.ndarray, grid: np.ndarray):
    """``values_into(sl, v_buf, q_buf)`` for :func:`grid_losses` from pass rates ``p`` of shape (N,).

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
        out[rows] = np.maximum(exclusive_sum_exact(x[rows]), 0.0)
    return out


def grid_losses(values_into, n_grid: int, r0: np.ndarray, valid: np.ndarray, fb: np.ndarray | None, variant: str,
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
    bt = _GridBatch(n=r0.size, valid=valid, all_valid=bool(valid.all()), n_valid=int(valid.sum()),
                    invalid_cols=np.flatnonzero(~valid), fb=fb, variant=variant, rvg=variant == "rvg", eps=eps)
    n = bt.n
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
            dense, n_src, n_act = _chunk_sources(bt, v, q, srcf, w, active, scratch)
            base = _chunk_baselines(bt, r_mat, v, srcf, w, x, y, dense, n_src)
            if dense:
                sq = np.subtract(r_mat, base, out=base)
                np.multiply(sq, sq, out=sq)
                robust[sl] = paper[sl] = sq.sum(axis=1) / n
                act_frac[sl] = 1.0
                continue
            robust[sl], paper[sl] = _chunk_losses(bt, r_mat, v, base, srcf, x, active, scratch, n_src)
            act_frac[sl] = n_act / n
    return robust, paper, act_frac


@dataclass(frozen=True)
class _GridBatch:
    """Per-call constants of :func:`grid_losses`: the batch's finite-reward mask, the fallback and the settings."""

    n: int
    valid: np.ndarray
    all_valid: bool
    n_valid: int
    invalid_cols: np.ndarray
    fb: np.ndarray | None
    variant: str
    rvg: bool
    eps: float


def _chunk_sources(bt: _GridBatch, v: np.ndarray, q: np.ndarray, srcf: np.ndarray, w: np.ndarray,
                   active: np.ndarray, scratch: np.ndarray) -> tuple[bool, np.ndarray, np.ndarray]:
    """Active set ``eps < V < 1 - eps`` (Section 4), sources and the inverse weights of Eq. 4-6 for one chunk.

    Writes the active mask into ``active``, the 0/1 source matrix (active and finite reward) into ``srcf`` and
    :func:`_refine`'s ``inv`` -- ``1/(1 - V)`` (UNB, VOP) or ``1/V`` (RVG) on the sources, 0 elsewhere -- into ``w``.
    Returns ``(dense, n_src, n_act)``: whether every prompt is a source on every row, and per row the source and
    active counts.
    """
    k = active.shape[0]
    # active set eps < V < 1 - eps; missing prompts have V = 0 (never > eps), so they are inactive
    np.greater(v, bt.eps, out=active)
    np.logical_and(active, np.greater(q, bt.eps, out=scratch), out=active)
    # every prompt a source on every row (the usual case for moderate beta): no masks, no fallback cells
    dense = bt.all_valid and bt.n >= 2 and bool(active.all())
    if dense:
        n_src = n_act = np.full(k, float(bt.n))
        np.divide(1.0, v if bt.rvg else q, out=w)  # _refine's inv on every cell
    else:
        np.copyto(srcf, active if bt.all_valid else np.logical_and(active, bt.valid, out=scratch))  # 0/1
        n_src = srcf.sum(axis=1)  # exact integer counts
        n_act = n_src if bt.all_valid else np.count_nonzero(active, axis=1)
        # _refine's inv = 1/q (UNB, VOP) or 1/v (RVG) on the sources, 0 elsewhere
        np.maximum(v if bt.rvg else q, _TINY, out=w)
        np.divide(srcf, w, out=w)
    return dense, n_src, n_act


def _chunk_baselines(bt: _GridBatch, r_mat: np.ndarray, v: np.ndarray, srcf: np.ndarray, w: np.ndarray,
                     x: np.ndarray, y: np.ndarray, dense: bool, n_src: np.ndarray) -> np.ndarray:
    """Refined leave-one-out baselines of one chunk (Eq. 4 UNB, Eq. 5 VOP, Eq. 6 RVG), as :func:`_refine` computes.

    Uses the inverse weights in ``w`` (from :func:`_chunk_sources`); overwrites ``w``, ``x`` and ``y`` and returns the
    baselines in ``w``. Cells without a source hold garbage that :func:`_chunk_losses` replaces by the fallback.
    """
    np.multiply(r_mat, w, out=x)  # r0 * inv
    if bt.rvg:
        num = _exclusive_sum_into(x, w)
        den = float(bt.n - 1) if dense else np.subtract(n_src[:, None], srcf, out=y)  # leave-one-out counts
    else:
        np.multiply(v, w, out=y)  # v * inv
        num = _exclusive_sum_into(x, w)
        den = _exclusive_sum_into(y, x)
        if bt.variant == "vop":
            den += 1.0
    base = np.multiply(v, num, out=num)
    np.divide(base, den, out=base)
    return base


def _chunk_losses(bt: _GridBatch, r_mat: np.ndarray, v: np.ndarray, base: np.ndarray, srcf: np.ndarray,
                  x: np.ndarray, active: np.ndarray, scratch: np.ndarray, n_src: np.ndarray):
    """Robust loss and the paper's Eq. 3 loss of each row of a chunk that has fallback cells.

    Robust: mean of ``(r_i - b_i)^2`` over the finite rewards, with each prompt's actual baseline (fallback
    included); paper: the same squares averaged over the sources only (``inf`` for a row without a source).
    Overwrites ``scratch`` and ``x``.
    """
    # the baseline actually used: the BASIS one where active with a source, the fallback elsewhere. In a row with
    # fewer than 2 sources no prompt with a finite reward has a leave-one-out source; prompts with a NaN reward may
    # (their squares are zeroed below), so the whole row takes the fallback.
    use_fb = np.logical_not(active, out=scratch)
    use_fb[n_src < 2] = True
    sq = np.where(use_fb, v if bt.fb is None else bt.fb, base)
    np.subtract(r_mat, sq, out=sq)
    np.multiply(sq, sq, out=sq)
    if bt.invalid_cols.size:
        sq[:, bt.invalid_cols] = 0.0
    robust = sq.sum(axis=1) / bt.n_valid if bt.n_valid > 0 else np.inf
    src_sq = np.multiply(sq, srcf, out=x)  # where(src, sq, 0)
    paper = np.where(n_src > 0, src_sq.sum(axis=1) / n_src, np.inf)
    return robust, paper

"""Online calibration of BASIS (Eq. 3, Section 4 "Online calibration"): select ``beta_t`` on the grid and return
the refined baseline at it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ._checks import OBJECTIVES, check_eps, check_fallback, check_unit_interval, check_variant, f64
from .grid import closed_form_values_into, grid_losses
from .refinement import BaselineResult, batchwise_baseline, fallback_values, prep_rewards
from .values import check_grid, v_and_q


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
    variant = check_variant(variant)
    fallback = check_fallback(fallback)
    eps = check_eps(eps)
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}.")
    maf = float(min_active_fraction)
    if not (0.0 <= maf <= 1.0):
        raise ValueError(f"min_active_fraction must lie in [0, 1], got {min_active_fraction!r}.")
    grid = check_grid(beta_grid)
    n, missing, values_for, values_into = _grid_values(f64(p_hat), grid)
    r, valid, r0 = prep_rewards(rewards, n)

    fb = None if fallback == "value" else fallback_values(r0, valid, fallback)
    robust, paper, act_frac = grid_losses(values_into, grid.size, r0, valid, fb, variant, eps)

    losses, idx, constraint_ok = _select_beta(robust if objective == "robust" else paper, act_frac, grid, maf)
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


def _grid_values(ph: np.ndarray, grid: np.ndarray):
    """``V_beta`` and ``1 - V_beta`` on the grid, from pass rates (closed form) or from a precomputed table.

    Parameters
    ----------
    ph : numpy.ndarray, shape (N,) or (N, K)
        ``p_hat`` of :func:`calibrate_beta`: pass rates (binary rewards, :func:`v_beta`) or a ``V_beta`` table aligned
        with ``grid``; a NaN (row) marks a prompt missing from the table.
    grid : numpy.ndarray, shape (K,)

    Returns
    -------
    n : int
        Number of prompts N.
    missing : numpy.ndarray of bool, shape (N,)
    values_for : callable
        ``values_for(sl) -> (v, q)``: fresh ``(k, N)`` arrays for the grid rows ``sl`` (missing prompts: V = 0).
    values_into : callable
        ``values_into(sl, v_buf, q_buf) -> (v, q)`` for :func:`grid_losses` (same values, written into buffers).
    """
    if ph.ndim == 1:
        n = ph.shape[0]
        if n == 0:
            raise ValueError("p_hat is empty: BASIS needs at least one prompt in the batch.")
        check_unit_interval(ph, "p_hat", allow_nan=True)
        missing = np.isnan(ph)
        p_row = np.where(missing, 0.0, ph)[None, :]
        values_into = closed_form_values_into(p_row[0], grid)

        def values_for(sl: slice) -> tuple[np.ndarray, np.ndarray]:
            return v_and_q(p_row, grid[sl, None])

    elif ph.ndim == 2:
        n = ph.shape[0]
        if ph.shape[1] != grid.size:
            raise ValueError(f"a V_beta table p_hat must have shape (N, K={grid.size}) aligned with beta_grid, "
                             f"got {ph.shape}.")
        if n == 0:
            raise ValueError("p_hat is empty: BASIS needs at least one prompt in the batch.")
        check_unit_interval(ph.ravel(), "p_hat (V_beta table)", allow_nan=True)
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
    return n, missing, values_for, values_into


def _select_beta(objective_losses: np.ndarray, act_frac: np.ndarray, grid: np.ndarray,
                 maf: float) -> tuple[np.ndarray, int, bool]:
    """The minimizer of the selected objective on the grid (Eq. 3), ties broken toward the largest beta.

    Grid values whose active fraction is below ``maf`` are excluded (set to ``inf``) unless none qualifies. Returns
    ``(losses, index, constraint_satisfied)`` with ``losses`` a copy of ``objective_losses``.
    """
    losses = objective_losses.copy()
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
    return losses, idx, constraint_ok

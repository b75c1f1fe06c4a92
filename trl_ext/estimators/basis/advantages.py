"""BASIS advantages ``A_i = r_i - b_i`` (Section 4, after Eq. 3), the map of rewards from a value table's reward range
to [0, 1], and the opt-in batch std scaling (not in the paper) of the ``"basis"`` registry entry."""

from __future__ import annotations

import numpy as np

from .._validation import to_numpy
from ._checks import f64
from .calibration import CalibrationResult, calibrate_beta

RANGE_TOL = 1e-6
"""Rewards at most this far outside a value table's ``reward_range`` are clipped by :func:`rewards_to_unit`; further
ones raise."""


def check_reward_range(reward_range) -> tuple[float, float]:
    """``reward_range`` as a pair of finite floats ``lo < hi`` (``ValueError`` otherwise)."""
    try:
        lo, hi = (float(x) for x in reward_range)
    except (TypeError, ValueError):
        raise ValueError(f"reward_range must be a pair (low, high), got {reward_range!r}.") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"reward_range must hold two finite numbers low < high, got {reward_range!r}.")
    return lo, hi


def rewards_to_unit(rewards, reward_range, tol: float = RANGE_TOL) -> np.ndarray:
    """Rewards mapped linearly from a value table's ``reward_range`` ``[lo, hi]`` to [0, 1]: ``(r - lo) / (hi - lo)``.

    BASIS's values live on [0, 1]: the closed form ``V_beta = p e^{1/beta} / (1 - p + p e^{1/beta})`` (Proposition 2,
    Appendix 10) and the Bernoulli plug-in variance ``V (1 - V)`` behind the weights of Eq. 4-6 are stated for
    rewards in [0, 1]. A value table records the range its reference rewards were scored on, and the online rewards
    are mapped with the same range before the refinement (Eq. 2) and the calibration (Eq. 3). Values at most
    ``tol`` outside [0, 1] (round-off of a weighted reward sum) are clipped; NaN (unscorable) stays NaN.

    Parameters
    ----------
    rewards : array_like, shape (N,)
        Rewards on the reward functions' own scale; NaN = unscorable.
    reward_range : tuple of float
        ``(lo, hi)`` with ``lo < hi``: the value table's ``reward_range``.
    tol : float, default :data:`RANGE_TOL`
        Largest distance outside [0, 1] (after the map) that is clipped instead of refused.

    Returns
    -------
    numpy.ndarray, shape (N,)
        The mapped rewards in [0, 1], NaN where ``rewards`` is NaN.

    Raises
    ------
    ValueError
        A finite reward further than ``tol`` outside the range: the table was built with other reward functions or
        weights; a bad ``reward_range``.
    """
    lo, hi = check_reward_range(reward_range)
    r = f64(rewards)
    u = (r - lo) / (hi - lo)
    fin = np.isfinite(u)
    outside = fin & ((u < -tol) | (u > 1 + tol))
    if outside.any():
        bad = r[outside][:5].tolist()
        raise ValueError(
            f"{int(outside.sum())} training reward(s) lie outside the value table's reward_range [{lo}, {hi}] "
            f"(e.g. {bad}): the table was built with different reward functions or weights. Rebuild it with the "
            "training reward_funcs and reward_weights."
        )
    return np.where(fin, np.clip(u, 0.0, 1.0), np.nan)


def basis_advantages(rewards, p_hat, beta_grid=None, variant="unb", objective="robust", eps=1e-6,
                     fallback="zero", min_active_fraction=0.0,
                     reward_range=None) -> tuple[np.ndarray, CalibrationResult]:
    """One BASIS step: calibrate beta, then ``A_i = r_i - b_i`` (Section 4, last paragraph).

    Parameters other than ``reward_range`` are those of :func:`calibrate_beta`. NaN rewards get advantage 0 (they
    are counted in ``calibration.result.n_nan_rewards``). No batch standardization is applied.

    Parameters
    ----------
    reward_range : tuple of float, optional
        ``(lo, hi)`` of the value table. Given, ``rewards`` are on that scale: they are mapped to [0, 1] with
        :func:`rewards_to_unit` for the calibration, and the baseline is mapped back, ``b_i = lo + (hi - lo)
        b_i^unit``, so that ``A_i = r_i - b_i`` is on the reward's own scale. ``None``: rewards already in [0, 1].

    Returns
    -------
    advantages : numpy.ndarray, shape (N,)
    calibration : CalibrationResult
        Calibrated on the [0, 1] scale (its ``baseline`` is ``b^unit``; :func:`baseline_on_reward_scale` maps it).
    """
    r = f64(rewards)
    u = r if reward_range is None else rewards_to_unit(r, reward_range)
    cal = calibrate_beta(u, p_hat, beta_grid=beta_grid, variant=variant, objective=objective, eps=eps,
                         fallback=fallback, min_active_fraction=min_active_fraction)
    b = baseline_on_reward_scale(cal.baseline, reward_range)
    adv = np.where(cal.result.valid, np.nan_to_num(r) - b, 0.0)
    return adv, cal


def baseline_on_reward_scale(baseline, reward_range=None) -> np.ndarray:
    """A [0, 1] baseline mapped back to ``reward_range`` ``(lo, hi)``: ``lo + (hi - lo) b`` (unchanged for ``None``)."""
    if reward_range is None:
        return baseline
    lo, hi = check_reward_range(reward_range)
    return lo + (hi - lo) * baseline


def std_scale_advantages(advantages, valid=None, eps: float = 1e-4) -> tuple[np.ndarray, float]:
    """Optional batch std scaling of BASIS advantages, ``A_i / (sd + eps)`` (the one implementation).

    BASIS itself does not scale: its advantage is ``A_i = r_i - b_i`` (Section 4, the paragraph after Eq. 3, with
    ``b_i`` the refined baseline of Eq. 2 -- weights of Eq. 4, 5 or 6 -- at the ``beta_t`` selected by Eq. 3). This
    opt-in step is the ``"basis"`` registry entry's ``normalize=True`` (which
    :class:`~trl_ext.trainers.basis.BASISTrainer` sets for ``basis_scale_advantages=True``). ``sd`` is the sample standard deviation (Bessel's
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
    a = f64(advantages)
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

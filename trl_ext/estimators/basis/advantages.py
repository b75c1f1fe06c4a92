"""BASIS advantages ``A_i = r_i - b_i`` (Section 4, after Eq. 3) and the opt-in batch std scaling (not in the
paper) that the BASIS trainer and the registry entry share."""

from __future__ import annotations

import numpy as np

from .._validation import to_numpy
from ._checks import _f64
from .calibration import CalibrationResult, calibrate_beta


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

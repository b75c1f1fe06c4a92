"""Length-residualized comparisons.

Source: "Measurement Discipline for RLVR" section 5 step 4 (length explains 40 % of score-difference variance;
"the length-independent remainder is 0.309, standard error 0.086") and the definition in section 4 of its
companion piece "Same RL Recipe, Different Seed, Different Verdict"::

    score_diff = beta0 + beta1 x length_diff          (ordinary least squares over every scored pair)

"then judge each pair on its residual (its score difference with the length-predicted component removed)", i.e.
``residual_i = score_diff_i - beta1 x length_diff_i``; worked example: ``beta1 = 0.0035``, a pair with raw
difference 0.05 and 20 extra tokens has residual ``0.05 - 20 x 0.0035 = -0.020``. The mean residual equals the
intercept ``beta0``: the difference the two sides would show at equal length.

The paper's caveat (step 4): residualizing is safe only when the length slope at fixed quality is positive; where
short answers are more often right, subtracting length subtracts real signal. This module reports the slope and its
standard error so the caller can apply that rule; it does not decide for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import stats as _st

__all__ = ["LengthResidualized", "length_residualized_difference"]


@dataclass(frozen=True)
class LengthResidualized:
    """Result of :func:`length_residualized_difference`.

    Attributes
    ----------
    difference : float
        ``beta0``, the length-residualized difference (mean residual; the gap at equal length).
    difference_se : float
        OLS standard error of ``beta0``.
    ci_low, ci_high : float
        ``level`` t-interval for ``beta0``.
    slope : float
        ``beta1``, score difference per unit of length difference (per token).
    slope_se : float
    r_squared : float
        Share of score-difference variance explained by length difference.
    raw_difference : float
        Mean raw score difference (before residualizing).
    slope_identified : bool
        ``False`` when every pair has the same length difference: the slope is then not identifiable from the data,
        it is set to 0 and ``difference`` falls back to the raw mean with its one-sample t-interval (``n - 1``
        degrees of freedom; documented fallback, never silent: the flag says so).
    n : int
    residuals : ndarray, shape (n,)
        ``score_diff - slope * length_diff`` per pair (use their signs for residualized votes).
    """

    difference: float
    difference_se: float
    ci_low: float
    ci_high: float
    slope: float
    slope_se: float
    r_squared: float
    raw_difference: float
    slope_identified: bool
    n: int
    level: float
    residuals: np.ndarray = field(repr=False)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("difference", "difference_se", "ci_low", "ci_high", "slope", "slope_se",
                                              "r_squared", "raw_difference", "slope_identified", "n", "level")}


def _vec(name: str, x) -> np.ndarray:
    arr = np.asarray(x, dtype=float).reshape(-1) if np.ndim(x) > 0 else None
    if arr is None:
        raise ValueError(f"{name} must be array-like (one value per pair); got a scalar")
    if np.any(~np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN/inf at index {int(np.flatnonzero(~np.isfinite(arr))[0])}")
    return arr


def length_residualized_difference(score_a, score_b, length_a, length_b, *, level: float = 0.95) -> LengthResidualized:
    """Compare two configurations after regressing score differences on length differences.

    Fits ``d_i = beta0 + beta1 * l_i`` by OLS, where ``d_i = score_a_i - score_b_i`` and ``l_i = length_a_i -
    length_b_i`` for each paired question (and seed: flatten seeds into pairs; the SE then treats pairs as
    independent, which pooling one question across seeds strains -- section 7). Returns ``beta0`` with its OLS
    standard error and a t-interval with ``n - 2`` degrees of freedom.

    Parameters
    ----------
    score_a, score_b : array_like, shape (n,) or (n_seeds, n)
        Paired scores (0/1 correctness, pass rates or judge scores).
    length_a, length_b : array_like, same shape
        Completion lengths (e.g. mean completion tokens per question).
    level : float
        Interval coverage in (0, 1).

    Returns
    -------
    LengthResidualized

    Raises
    ------
    ValueError
        Shapes differ, non-finite values, or fewer than 3 pairs (no residual degrees of freedom).
    """
    sa, sb, la, lb = (_vec(n, x) for n, x in
                      (("score_a", score_a), ("score_b", score_b), ("length_a", length_a), ("length_b", length_b)))
    if not (sa.shape == sb.shape == la.shape == lb.shape):
        raise ValueError(f"all four inputs must have the same number of pairs; got {sa.size}, {sb.size}, {la.size}, "
                         f"{lb.size}")
    if not (0.0 < level < 1.0):
        raise ValueError(f"level must be in (0, 1); got {level!r}")
    n = sa.size
    if n < 3:
        raise ValueError(f"need at least 3 pairs to fit an intercept and slope with a standard error; got {n}")
    d = sa - sb
    ell = la - lb
    tq = float(_st.t.ppf(0.5 + level / 2, n - 2))
    ell_c = ell - ell.mean()
    sxx = float(np.sum(ell_c**2))
    raw = float(d.mean())
    if sxx <= 1e-12 * max(1.0, float(np.sum(ell**2))):
        # Slope not identifiable: fall back to the raw mean difference (flagged). Only the mean is estimated then,
        # so its t-interval has n - 1 degrees of freedom (not the n - 2 of the two-parameter fit).
        resid = d.copy()
        se = float(d.std(ddof=1) / np.sqrt(n))
        tq1 = float(_st.t.ppf(0.5 + level / 2, n - 1))
        return LengthResidualized(raw, se, raw - tq1 * se, raw + tq1 * se, 0.0, float("nan"), 0.0, raw, False, n,
                                  float(level), resid)
    slope = float(np.sum(ell_c * (d - raw)) / sxx)
    intercept = raw - slope * float(ell.mean())
    fitted = intercept + slope * ell
    e = d - fitted
    sse = float(np.sum(e**2))
    sst = float(np.sum((d - raw) ** 2))
    s2 = sse / (n - 2)
    se_slope = float(np.sqrt(s2 / sxx))
    se_int = float(np.sqrt(s2 * (1.0 / n + float(ell.mean()) ** 2 / sxx)))
    r2 = 0.0 if sst == 0 else 1.0 - sse / sst
    resid = d - slope * ell
    return LengthResidualized(intercept, se_int, intercept - tq * se_int, intercept + tq * se_int, slope, se_slope,
                              float(r2), raw, True, n, float(level), resid)

"""Private input checks of the BASIS estimators and the option names they accept.

Every check raises ``ValueError`` with a message that names the argument and says what to change.
"""

from __future__ import annotations

import numpy as np

from .._validation import to_numpy

BASIS_VARIANTS: tuple[str, ...] = ("unb", "vop", "rvg")
FALLBACKS: tuple[str, ...] = ("zero", "batch_mean", "value")
OBJECTIVES: tuple[str, ...] = ("robust", "paper")


def f64(x) -> np.ndarray:
    """``x`` (numpy, sequence, or torch tensor of any dtype / device / grad state) as a float64 numpy array."""
    return np.asarray(to_numpy(x), dtype=np.float64)


def as_1d_float(x, name: str) -> np.ndarray:
    arr = f64(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of shape (N,), got shape {arr.shape}; flatten or index it first.")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: BASIS needs at least one prompt in the batch.")
    return arr


def check_unit_interval(arr: np.ndarray, name: str, allow_nan: bool) -> None:
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


def check_variant(variant: str) -> str:
    v = str(variant).lower()
    if v not in BASIS_VARIANTS:
        raise ValueError(f"variant must be one of {BASIS_VARIANTS}, got {variant!r}.")
    return v


def check_fallback(fallback: str) -> str:
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}.")
    return fallback


def check_eps(eps: float) -> float:
    eps = float(eps)
    if not (0.0 <= eps < 0.5) or np.isnan(eps):
        raise ValueError(f"eps must satisfy 0 <= eps < 0.5 (the paper uses 1e-6), got {eps!r}.")
    return eps


def check_beta(beta) -> np.ndarray:
    b = f64(beta)
    if np.isnan(b).any() or (b <= 0).any():
        raise ValueError("beta must be > 0 (np.inf allowed: the reference policy's value); got "
                         f"{b.ravel()[:5].tolist()}{'...' if b.size > 5 else ''}.")
    return b

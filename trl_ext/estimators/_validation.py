"""Private input checks shared by :mod:`.baselines`, :mod:`.v05`, :mod:`.tiebreak` and the V0.5 audit.

Every check raises ``ValueError`` (or ``TypeError``) with a message that names the argument and says what to
change. Torch tensors are accepted wherever an array is expected and converted with ``.detach().cpu()``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__: list[str] = []  # private module: nothing is re-exported


def to_numpy(x: Any) -> np.ndarray:
    """Convert a numpy array, a torch tensor or a sequence to a numpy array (no copy when possible)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor without importing torch
        x = x.detach().cpu()
        if str(getattr(x, "dtype", "")) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def as_float_array(x: Any, name: str, ndim: int | None = 1, allow_empty: bool = False) -> np.ndarray:
    """Return ``x`` as a float64 array, checking its number of dimensions and emptiness.

    NaN is allowed here (callers decide what NaN means); +-inf is always rejected.
    """
    arr = to_numpy(x)
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise TypeError(f"{name} must be numeric, got dtype {arr.dtype}; convert it to floats first.")
    try:
        arr = arr.astype(np.float64, copy=False)
    except (TypeError, ValueError) as exc:  # pragma: no cover - defensive
        raise TypeError(f"{name} must be numeric: {exc}") from exc
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}.")
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name} is empty; pass at least one value.")
    if np.isinf(arr).any():
        raise ValueError(f"{name} contains +-inf; rewards/scores must be finite (use NaN to mark an unscorable row).")
    return arr


def check_range(arr: np.ndarray, name: str, low: float, high: float) -> None:
    """Raise unless every non-NaN entry of ``arr`` lies in ``[low, high]``."""
    finite = arr[~np.isnan(arr)]
    if finite.size and (finite.min() < low or finite.max() > high):
        raise ValueError(
            f"{name} must lie in [{low}, {high}], got values in [{finite.min():.6g}, {finite.max():.6g}]; "
            f"map bounded rewards with to_signed_reward(r, low, high) first."
        )


def check_no_nan(arr: np.ndarray, name: str) -> None:
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN at positions {np.flatnonzero(np.isnan(arr))[:10].tolist()}; "
                         f"NaN is not allowed here.")


def check_positive_scalar(value: Any, name: str) -> float:
    """Return ``value`` as a float, raising unless it is a finite number > 0."""
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a number, got {value!r}.") from exc
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
    return v


def check_nonneg_scalar(value: Any, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a number, got {value!r}.") from exc
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")
    return v


def factorize_groups(group_ids: Any, n: int, name: str = "group_ids") -> tuple[np.ndarray, np.ndarray]:
    """Map arbitrary group labels to dense codes ``0..G-1`` in order of first appearance.

    Returns
    -------
    codes : ndarray of int64, shape (n,)
    uniques : ndarray, shape (G,)
        The labels, ``uniques[codes] == group_ids``.
    """
    g = to_numpy(group_ids)
    if g.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {g.shape}.")
    if g.shape[0] != n:
        raise ValueError(f"{name} has length {g.shape[0]} but rewards have length {n}; pass one id per rollout.")
    if n == 0:
        raise ValueError(f"{name} is empty; pass at least one rollout.")
    if g.dtype.kind == "f" and np.isnan(g).any():
        raise ValueError(f"{name} contains NaN; every rollout needs a valid group id.")
    uniq, first_idx, inv = np.unique(g, return_index=True, return_inverse=True)
    order = np.argsort(first_idx, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inv.reshape(-1)].astype(np.int64), uniq[order]

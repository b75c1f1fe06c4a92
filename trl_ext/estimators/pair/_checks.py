"""Private input checks of the PAIR estimators (shapes, finiteness, probabilities, joint-inclusion matrices).

Every check raises ``ValueError`` with a message that names the argument and says what to change.
"""

from __future__ import annotations

import numpy as np

from .._validation import to_numpy


def f64(x) -> np.ndarray:
    """``x`` (numpy, sequence, or torch tensor of any dtype / device / grad state) as a float64 numpy array."""
    return np.asarray(to_numpy(x), dtype=np.float64)


def check_vector(name: str, x, *, allow_nan: bool = False, min_len: int = 1) -> np.ndarray:
    arr = f64(x)
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D array of shape (G,), got shape {arr.shape}.")
    if arr.shape[0] < min_len:
        raise ValueError(f"`{name}` needs at least {min_len} entries (got {arr.shape[0]}).")
    if not allow_nan and not np.all(np.isfinite(arr)):
        bad = np.flatnonzero(~np.isfinite(arr)).tolist()
        raise ValueError(f"`{name}` contains NaN/inf at positions {bad}; pass finite values.")
    return arr


def check_scores(scores, G: int) -> np.ndarray:
    s = f64(scores)
    if s.ndim != 2 or s.shape[0] != G:
        raise ValueError(
            f"`scores` must have shape (G, D) = ({G}, D) (one score vector per vertex), got {s.shape}; "
            "reshape a 1-D score to (G, 1)."
        )
    if not np.all(np.isfinite(s)):
        raise ValueError("`scores` contains NaN/inf; pass finite score vectors.")
    return s


def check_probabilities(name: str, x, G: int | None = None) -> np.ndarray:
    p = check_vector(name, x)
    if G is not None and p.shape[0] != G:
        raise ValueError(f"`{name}` has {p.shape[0]} entries but the group has G = {G}.")
    if np.any(p <= 0.0) or np.any(p > 1.0):
        bad = np.flatnonzero((p <= 0.0) | (p > 1.0)).tolist()
        raise ValueError(
            f"`{name}` must lie in (0, 1] (positivity, Theorem 2); entries {bad} are outside. "
            "Every candidate needs a strictly positive continuation probability."
        )
    return p


def check_selected(selected, G: int) -> np.ndarray:
    sel = to_numpy(selected)
    if sel.shape != (G,):
        raise ValueError(f"`selected` must have shape ({G},), got {sel.shape}.")
    if sel.dtype != bool:
        if not np.all(np.isin(sel, (0, 1))):
            raise ValueError("`selected` must be boolean (or 0/1) continuation indicators J_i.")
        sel = sel.astype(bool)
    return sel


def check_joint(joint, inclusion: np.ndarray) -> np.ndarray:
    G = inclusion.shape[0]
    rho = f64(joint)
    if rho.shape != (G, G):
        raise ValueError(f"`joint` must be a ({G}, {G}) joint-inclusion matrix, got {rho.shape}.")
    if not np.all(np.isfinite(rho)):
        raise ValueError("`joint` contains NaN/inf.")
    if not np.allclose(rho, rho.T, rtol=0.0, atol=1e-12):
        raise ValueError("`joint` must be symmetric (rho_ij = rho_ji).")
    if not np.allclose(np.diag(rho), inclusion, rtol=0.0, atol=1e-9):
        raise ValueError("the diagonal of `joint` must equal `inclusion` (rho_ii = pi_i).")
    off = ~np.eye(G, dtype=bool)
    if np.any(rho[off] <= 0.0):
        raise ValueError("every off-diagonal joint inclusion probability must be > 0 (positivity, Theorem 2).")
    upper = np.minimum.outer(inclusion, inclusion)
    lower = np.add.outer(inclusion, inclusion) - 1.0
    if np.any(rho[off] > upper[off] + 1e-9) or np.any(rho[off] < lower[off] - 1e-9):
        raise ValueError(
            "`joint` violates the Frechet bounds max(0, pi_i + pi_j - 1) <= rho_ij <= min(pi_i, pi_j); "
            "it cannot come from a design with marginals `inclusion`."
        )
    return rho

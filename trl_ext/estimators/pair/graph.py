r"""Sections 4.3-4.4 of PAIR: the contrast graph -- edge proxies :math:`a_{ij}` (Eq. 8-9) and the shared-vertex
covariance term :math:`b_i` -- that weighs the design objective of Eq. 10."""

from __future__ import annotations

import numpy as np

from ._checks import check_vector, f64


def edge_proxies(p_hat, kind: str = "disagreement", score_norm=None) -> np.ndarray:
    r"""Edge proxies :math:`a_{ij} \approx E[\|h_{ij}\|^2 \mid z_i, z_j]` (Eq. 8-9).

    ``kind="disagreement"`` (the paper's parameter-free default):
    :math:`a_{ij} = \hat d_{ij} = \hat p_i(1-\hat p_j) + (1-\hat p_i)\hat p_j` (Eq. 8).
    ``kind="score_norm"``: :math:`a_{ij} = \hat d_{ij} (\hat m_i + \hat m_j)^2 / 4` with a predicted score norm
    :math:`\hat m_i \ge 0` (Eq. 9, second option).

    Parameters
    ----------
    p_hat : array_like, shape (G,)
        Predicted success probabilities in [0, 1].
    kind : {"disagreement", "score_norm"}
    score_norm : array_like, shape (G,), optional
        Required (finite, >= 0) for ``kind="score_norm"``.

    Returns
    -------
    ndarray, shape (G, G)
        Symmetric, nonnegative, zero diagonal. All zeros when every ``p_hat`` is 0 or every one is 1
        (saturated group, Appendix F): :func:`pair_design` then returns the uniform design.
    """
    p = check_vector("p_hat", p_hat)
    if np.any(p < 0.0) or np.any(p > 1.0):
        raise ValueError("`p_hat` must lie in [0, 1] (predicted success probabilities).")
    d = p[:, None] * (1.0 - p[None, :]) + (1.0 - p[:, None]) * p[None, :]
    if kind == "disagreement":
        a = d
    elif kind == "score_norm":
        if score_norm is None:
            raise ValueError('kind="score_norm" needs `score_norm` (predicted score norms m_i >= 0).')
        m = check_vector("score_norm", score_norm)
        if m.shape != p.shape:
            raise ValueError(f"`score_norm` must have shape {p.shape}, got {m.shape}.")
        if np.any(m < 0):
            raise ValueError("`score_norm` must be >= 0.")
        a = d * (m[:, None] + m[None, :]) ** 2 / 4.0
    else:
        raise ValueError(f'unknown edge proxy kind {kind!r}; use "disagreement" or "score_norm".')
    a = np.array(a, dtype=np.float64)
    np.fill_diagonal(a, 0.0)
    return a


def check_edge_matrix(a) -> np.ndarray:
    a = f64(a)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"edge proxies must be a square (G, G) matrix, got {a.shape}.")
    if not np.all(np.isfinite(a)):
        raise ValueError("edge proxies contain NaN/inf.")
    if np.any(a < 0):
        raise ValueError("edge proxies must be nonnegative (Proposition 2 needs a_ij >= 0).")
    if not np.allclose(a, a.T, rtol=0.0, atol=1e-12):
        raise ValueError("edge proxies must be symmetric.")
    a = a.copy()
    np.fill_diagonal(a, 0.0)
    return a


def shared_vertex_term(a) -> np.ndarray:
    r"""Shared-vertex covariance term :math:`b_i = (\sum_{j\ne i}\sqrt{a_{ij}})^2 - \sum_{j\ne i} a_{ij}` (Sec. 4.4).

    If :math:`a_{ij} \ge \|h_{ij}\|^2`, :math:`b_i` upper-bounds :math:`2\sum_{j<k} |\langle h_{ij}, h_{ik}\rangle|`
    (Appendix A.6, Cauchy-Schwarz); with predicted proxies it is a covariance surrogate.

    Parameters
    ----------
    a : array_like, shape (G, G)
        Symmetric nonnegative edge proxies (diagonal ignored).

    Returns
    -------
    ndarray, shape (G,), nonnegative.
    """
    a = check_edge_matrix(a)
    root = np.sqrt(a).sum(axis=1)
    return np.maximum(root**2 - a.sum(axis=1), 0.0)

r"""Design-variance diagnostics of PAIR: the exact conditional design covariance (Proposition 1, Appendix A.5) and the
Kish effective sample size of the observed edge weights (Appendix D.3)."""

from __future__ import annotations

import numpy as np

from ._checks import check_probabilities, f64
from .kernel import pair_kernel


def effective_sample_size(weights) -> float:
    r"""Kish effective sample size :math:`(\sum_e w_e)^2 / \sum_e w_e^2` of observed edge weights (Appendix D.3).

    Parameters
    ----------
    weights : array_like, shape (E,)
        Nonnegative finite weights of the observed edges (E may be 0).

    Returns
    -------
    float
        In [1, E] for E >= 1 with some positive weight; 0.0 for an empty (or all-zero) set.
    """
    w = f64(weights).ravel()
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("`weights` must be finite and nonnegative.")
    top = float(w.max()) if w.size else 0.0
    if top <= 0.0:
        return 0.0
    w = w / top  # scale-free; without it tiny weights square to subnormals and the ratio exceeds E (1e-158 -> 2 + 1e-8)
    return float(w.sum() ** 2 / (w**2).sum())


def design_covariance(rewards, scores, inclusion) -> np.ndarray:
    r"""Exact conditional design covariance of :math:`\hat g_{PAIR}` under independent Bernoulli continuation
    (Proposition 1, Appendix A.5).

    .. math::
        \frac{1}{M^2}\Big[\sum_{i<j}\Big(\frac{1}{\pi_i\pi_j}-1\Big)h_{ij}h_{ij}^\top
        + \sum_i \Big(\frac1{\pi_i}-1\Big)\sum_{j\ne k;\ j,k\ne i} h_{ij}h_{ik}^\top\Big]

    (the inner ordered sum is the paper's ":math:`2\sum_{j<k}` with symmetric completion"). Edges without a shared
    vertex are uncorrelated under independence.

    Parameters
    ----------
    rewards : array_like, shape (G,), finite (the full frozen population)
    scores : array_like, shape (G, D)
    inclusion : array_like, shape (G,), entries in (0, 1]

    Returns
    -------
    ndarray, shape (D, D)
        Symmetric positive semidefinite; its trace is the design MSE of the exact estimator.
    """
    h = pair_kernel(rewards, scores)
    G = h.shape[0]
    pi = check_probabilities("inclusion", inclusion, G)
    M = G * (G - 1) / 2.0
    iu = np.triu_indices(G, k=1)
    he = h[iu]  # (E, D)
    ve = 1.0 / (pi[iu[0]] * pi[iu[1]]) - 1.0
    cov = (he * ve[:, None]).T @ he
    H = h.sum(axis=1)  # (G, D): sum_{j != i} h_ij (diagonal is zero)
    self_outer = np.einsum("ijd,ije->ide", h, h)  # sum_j h_ij h_ij^T
    shared = np.einsum("id,ie->ide", H, H) - self_outer
    cov = cov + np.einsum("i,ide->de", 1.0 / pi - 1.0, shared)
    cov = cov / M**2
    return 0.5 * (cov + cov.T)

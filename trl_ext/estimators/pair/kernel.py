r"""Section 3 of PAIR: the pair kernel and the complete pair target it averages (Eq. 2-4, Theorem 1)."""

from __future__ import annotations

import numpy as np

from ._checks import check_scores, check_vector


def pair_kernel(rewards, scores) -> np.ndarray:
    r"""All pair kernels :math:`h_{ij} = \tfrac12 (r_i - r_j)(s_i - s_j)` (Eq. 3).

    Parameters
    ----------
    rewards : array_like, shape (G,)
        Finite rewards.
    scores : array_like, shape (G, D)
        Score-function vectors, one per vertex.

    Returns
    -------
    ndarray, shape (G, G, D)
        ``h[i, j]``; symmetric in ``(i, j)`` with a zero diagonal.
    """
    r = check_vector("rewards", rewards)
    s = check_scores(scores, r.shape[0])
    return 0.5 * (r[:, None] - r[None, :])[:, :, None] * (s[:, None, :] - s[None, :, :])


def complete_pair_average(rewards, scores) -> np.ndarray:
    r"""Complete pair average :math:`\hat g_{pair} = \frac1M \sum_{i<j} h_{ij}`, :math:`M = \binom G2` (Eq. 4).

    Computed literally from the pair kernels (not through Theorem 1), so it can be tested against
    :func:`loo_score_gradient`. Theorem 1: this equals the leave-one-out estimator (Eq. 2); the group-mean-baseline
    estimator :math:`\frac1G\sum_i (r_i - \bar r) s_i` equals :math:`\frac{G-1}{G}` times it.

    Parameters
    ----------
    rewards : array_like, shape (G,), G >= 2
    scores : array_like, shape (G, D)

    Returns
    -------
    ndarray, shape (D,)
    """
    r = check_vector("rewards", rewards, min_len=2)
    h = pair_kernel(r, scores)
    G = r.shape[0]
    iu = np.triu_indices(G, k=1)
    return h[iu].sum(axis=0) / (G * (G - 1) / 2.0)


def loo_score_gradient(rewards, scores) -> np.ndarray:
    r"""Leave-one-out score estimator :math:`\frac1G \sum_i (r_i - \bar r_{-i}) s_i` (Eq. 2).

    Parameters
    ----------
    rewards : array_like, shape (G,), G >= 2
    scores : array_like, shape (G, D)

    Returns
    -------
    ndarray, shape (D,)
    """
    r = check_vector("rewards", rewards, min_len=2)
    s = check_scores(scores, r.shape[0])
    G = r.shape[0]
    loo_mean = (r.sum() - r) / (G - 1)
    return ((r - loo_mean)[:, None] * s).sum(axis=0) / G

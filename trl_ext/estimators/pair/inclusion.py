r"""Section 4.5 and Appendix B of PAIR: inclusion probabilities of the continuation draw (independent Bernoulli,
optional anchor pair) and the draw itself."""

from __future__ import annotations

import numpy as np

from ._checks import check_probabilities


def independent_joint_inclusion(inclusion) -> np.ndarray:
    r"""Joint inclusion matrix of independent Bernoulli continuation: :math:`\rho_{ij} = \pi_i\pi_j`, diagonal
    :math:`\pi_i` (Eq. 12).

    Parameters
    ----------
    inclusion : array_like, shape (G,), entries in (0, 1]

    Returns
    -------
    ndarray, shape (G, G)
    """
    pi = check_probabilities("inclusion", inclusion)
    rho = np.outer(pi, pi)
    np.fill_diagonal(rho, pi)
    return rho


def anchor_pair_joint_inclusion(inclusion, anchor) -> tuple[np.ndarray, np.ndarray]:
    r"""Conditional inclusion probabilities under the optional anchor pair (Appendix B).

    The anchor pair ``(k, l)`` is drawn uniformly from the M pairs (pre-outcome, e.g. with
    ``rng.choice(G, 2, replace=False)``) and continued with conditional probability one; every other vertex stays an
    independent Bernoulli(:math:`\pi_i`). Conditional on the anchor the design is again independent, so
    :math:`\rho_{ij \mid anchor} = \pi'_i\pi'_j` with :math:`\pi'_k = \pi'_l = 1`. Using these logged conditional
    probabilities in :func:`pair_advantages` keeps the estimator design-unbiased conditionally on every anchor, hence
    unconditionally (Theorem 2 applied to the conditional design). Every draw then observes at least one edge.
    The anchor raises the expected cost by :math:`(1-\pi_k)c_k + (1-\pi_l)c_l`.

    Parameters
    ----------
    inclusion : array_like, shape (G,), entries in (0, 1]
        Design probabilities before the anchor.
    anchor : tuple of two distinct ints

    Returns
    -------
    (marginals, joint) : ndarray (G,), ndarray (G, G)
        Conditional marginals and joint inclusion probabilities to log and to pass to :func:`pair_advantages`.
    """
    pi = check_probabilities("inclusion", inclusion).copy()
    G = pi.shape[0]
    try:
        k, l_ = (int(v) for v in anchor)
    except (TypeError, ValueError) as exc:
        raise ValueError("`anchor` must be a pair of vertex indices (k, l).") from exc
    if k == l_ or not (0 <= k < G and 0 <= l_ < G):
        raise ValueError(f"`anchor` must be two distinct indices in [0, {G}), got {anchor}.")
    pi[[k, l_]] = 1.0
    return pi, independent_joint_inclusion(pi)


def draw_selection(inclusion, rng: np.random.Generator, anchor=None) -> np.ndarray:
    """Draw independent Bernoulli continuation indicators ``J_i ~ Bernoulli(pi_i)`` (fresh randomness, Sec. 4.5).

    Parameters
    ----------
    inclusion : array_like, shape (G,), entries in (0, 1]
    rng : numpy.random.Generator
    anchor : (k, l), optional
        Force both anchor vertices to 1 (Appendix B; use :func:`anchor_pair_joint_inclusion` for the weights).

    Returns
    -------
    ndarray of bool, shape (G,)
    """
    pi = check_probabilities("inclusion", inclusion)
    sel = rng.random(pi.shape[0]) < pi
    if anchor is not None:
        pi_c, _ = anchor_pair_joint_inclusion(pi, anchor)
        sel |= pi_c == 1.0
    return sel

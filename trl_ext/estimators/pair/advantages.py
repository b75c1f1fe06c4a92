r"""Sections 4.5 and Appendix B of PAIR: the inverse pair-inclusion advantages (Eq. 12-13), PAIR's one NaN rule,
the design-independent loss normalizer and the biased standardization option."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import check_joint, check_probabilities, check_selected, check_vector
from .inclusion import independent_joint_inclusion
from .variance import effective_sample_size


@dataclass
class PairAdvantages:
    """Result of :func:`pair_advantages`.

    Attributes
    ----------
    advantages : ndarray (G,)
        Eq. 13 sequence advantages; exactly 0 for unselected vertices (they are not in the loss) and for unscorable
        completed vertices (see :func:`pair_advantages`, "Unscorable completed vertices").
    edge_weights : ndarray (G, G)
        Weight used on each observed edge (0 on unobserved edges and on the diagonal).
    n_selected : int
        Completed vertices ``sum_i J_i`` (unscorable ones included).
    n_edges : int
        Observed edges ``k(k-1)/2`` between the ``k`` completed *scorable* vertices.
    ess : float
        Effective sample size of the observed edge weights (Appendix D.3); 0 when no edge is observed.
    max_weight : float
    weight_sum : float
        Sum of observed edge weights (the Hajek normalizer).
    n_clipped : int
        Observed edges whose weight was clipped at ``w_max``.
    variant : str
        "ht" (exact), "clipped", "hajek" or "clipped+hajek".
    biased : bool
        True for every variant but "ht": clipping and self-normalization are not design-unbiased (Appendix B).
    n_unscorable : int
        Completed vertices whose reward is NaN (unscorable): they observe no edge and get advantage 0.
    """

    advantages: np.ndarray
    edge_weights: np.ndarray
    n_selected: int
    n_edges: int
    ess: float
    max_weight: float
    weight_sum: float
    n_clipped: int
    variant: str
    biased: bool
    n_unscorable: int = 0


def scorable_selection(rewards, selected) -> tuple[np.ndarray, int]:
    r"""The one NaN rule of PAIR: a completed vertex with a NaN reward carries no reward information.

    Such a vertex (a reward function returned ``None``: the completion could not be scored) is treated as an
    **unobserved vertex**: none of its edges is observed, it gets advantage 0, and the design is left exactly as
    logged -- the other vertices keep their probabilities ``pi_j``, their edge weights ``1/rho_ij`` and the
    complete-pair normalizer ``M = G(G-1)/2``. Nothing is renormalized or redrawn.

    Why this keeps the inclusion weights unbiased: when being unscorable is a property of the candidate (its
    potential completion cannot be scored, whatever the draw), the estimator is Eq. 12 with ``h_ij`` replaced by
    ``S_i S_j h_ij`` (``S`` = scorable), whose weights are still the logged ``1/rho_ij``; Theorem 2 then gives
    :math:`E_{design}[\hat g_{PAIR}] = \frac1M \sum_{i<j} S_iS_j h_{ij}`, the complete-pair gradient in which every
    contrast involving an unscorable candidate is zero (the tests check this by exact enumeration). Reweighting the
    partners (e.g. dividing by the number of scorable vertices) would depend on the outcome of the draw and break
    that. The alternative, reading NaN as reward 0, targets a different population (unscorable = failed) and would
    push the unscorable completion down; reward functions that mean "failed" (the paper's parser exceptions,
    Appendix D.1) should return 0, not ``None``.

    Parameters
    ----------
    rewards : array_like, shape (G,)
        NaN on completed vertices marks them unscorable; entries of unselected vertices are ignored. ``+-inf`` on a
        completed vertex is an error (a broken reward, not an unscorable one).
    selected : array_like of bool, shape (G,)

    Returns
    -------
    (observed, n_unscorable) : ndarray of bool (G,), int
        ``observed = selected & ~isnan(rewards)``, the vertices whose edges enter Eq. 12-13.
    """
    r = check_vector("rewards", rewards, allow_nan=True)
    sel = check_selected(selected, r.shape[0])
    if np.any(np.isinf(r[sel])):
        bad = np.flatnonzero(sel & np.isinf(r)).tolist()
        raise ValueError(f"selected (completed) vertices {bad} have infinite rewards; pass finite rewards (NaN marks "
                         "an unscorable completion).")
    unscorable = sel & np.isnan(r)
    return sel & ~unscorable, int(unscorable.sum())


def pair_advantages(rewards, selected, inclusion, *, joint=None, w_max=None, self_normalize=False) -> PairAdvantages:
    r"""Pair-inclusion-weighted sequence advantages (Eq. 12-13; Appendix B variants).

    .. math::
        \tilde A_i = \frac{1}{2M} \sum_{j\ne i} \frac{J_i J_j}{\rho_{ij}} (r_i - r_j),
        \qquad \sum_i \tilde A_i s_i = \hat g_{PAIR} = \frac1M \sum_{i<j} \frac{J_iJ_j}{\rho_{ij}} h_{ij}.

    With the exact weights, :math:`E_{design}[\hat g_{PAIR}] = \hat g_{pair}` (Theorem 2) for any design whose joint
    inclusion probabilities are given (``joint``), or for independent Bernoulli continuation (``joint=None``,
    :math:`\rho_{ij} = \pi_i\pi_j`). The advantages sum to zero over the completed vertices (they are already
    "centered", Appendix C).

    Parameters
    ----------
    rewards : array_like, shape (G,)
        Rewards; entries of unselected vertices are never read and may be NaN (they were never generated). A NaN on
        a *selected* vertex marks an unscorable completion (see below); ``+-inf`` is an error.
    selected : array_like of bool, shape (G,)
        Continuation indicators J.
    inclusion : array_like, shape (G,), entries in (0, 1]
        Logged marginal probabilities pi.
    joint : array_like, shape (G, G), optional
        Logged joint inclusion probabilities (symmetric, diagonal = ``inclusion``, off-diagonal > 0 and within the
        Frechet bounds). Default: independent Bernoulli.
    w_max : float >= 1, optional
        Clip edge weights at ``min(1/rho_ij, w_max)`` (biased: conditional bias
        :math:`\frac1M\sum_e(\min(1, w_{max}\rho_e) - 1)h_e`, Appendix B).
    self_normalize : bool
        Hajek ratio estimator: divide by :math:`\sum_e I_e w_e` instead of M (biased, Appendix B). With no observed
        edge the advantages are 0.

    Returns
    -------
    PairAdvantages

    Notes
    -----
    A draw with fewer than two completed vertices gives all-zero advantages; this is part of the unbiased estimator
    (Appendix B, "At least two completed vertices") and is reported via ``n_edges == 0``.

    **Unscorable completed vertices** (NaN reward on a selected vertex) follow :func:`scorable_selection`: no edge of
    theirs is observed, their advantage is 0, everything else (``pi``, ``rho``, ``M``) is unchanged; they are
    counted in ``n_unscorable``.
    """
    pi = check_probabilities("inclusion", inclusion)
    G = pi.shape[0]
    if G < 2:
        raise ValueError("a candidate group needs G >= 2 vertices to have pairs.")
    r = check_vector("rewards", rewards, allow_nan=True)
    if r.shape[0] != G:
        raise ValueError(f"`rewards` has {r.shape[0]} entries but `inclusion` has G = {G}.")
    sel_all = check_selected(selected, G)
    sel, n_unscorable = scorable_selection(r, sel_all)
    rho = independent_joint_inclusion(pi) if joint is None else check_joint(joint, pi)
    if w_max is not None:
        w_max = float(w_max)
        if not math.isfinite(w_max) or w_max < 1.0:
            raise ValueError(f"`w_max` must be a finite number >= 1 (1/rho >= 1 always), got {w_max}.")
    M = G * (G - 1) / 2.0
    obs = np.outer(sel, sel)
    np.fill_diagonal(obs, False)
    raw = np.where(obs, 1.0 / rho, 0.0)
    w = raw if w_max is None else np.minimum(raw, w_max)
    n_clipped = int(np.count_nonzero(np.triu(raw > w, k=1)))
    r0 = np.where(sel, r, 0.0)
    diff = r0[:, None] - r0[None, :]
    adv = (w * diff).sum(axis=1) / (2.0 * M)
    iu = np.triu_indices(G, k=1)
    edge_w = w[iu][obs[iu]]
    weight_sum = float(edge_w.sum())
    if self_normalize:
        adv = adv * (M / weight_sum) if weight_sum > 0 else np.zeros(G)
    adv = np.where(sel, adv, 0.0)
    variant = "+".join(v for v, on in (("clipped", w_max is not None), ("hajek", self_normalize)) if on) or "ht"
    k = int(sel.sum())
    return PairAdvantages(
        advantages=adv,
        edge_weights=w,
        n_selected=int(sel_all.sum()),
        n_edges=k * (k - 1) // 2,
        ess=effective_sample_size(edge_w),
        max_weight=float(edge_w.max()) if edge_w.size else 0.0,
        weight_sum=weight_sum,
        n_clipped=n_clipped,
        variant=variant,
        biased=variant != "ht",
        n_unscorable=n_unscorable,
    )


def fixed_normalizer(num_prompts: int, max_completion_length: int | None = None) -> float:
    r"""The design-independent denominator of PAIR's policy loss (Sec. 4.5, Eq. 13; Theorem 2).

    For the ``K`` prompts of a generation batch, PAIR's policy loss is

    .. math:: \mathcal L = \frac1K \sum_{k=1}^K \sum_i \tilde A_{ki}\, \ell_{ki}
              \quad\text{or}\quad \frac{1}{KL} \sum_{k=1}^K \sum_i \tilde A_{ki} \sum_t \ell_{kit},

    (sequence-level losses, :math:`\ell_{ki}` the row's length-averaged term; token-level losses, ``L`` the
    completion-length cap), with :math:`\tilde A` the Eq. 13 advantages (:func:`pair_advantages`). ``K`` counts every
    prompt whose candidates were probed, also those that completed no vertex: it is fixed before the continuation
    draw, so the loss is linear in the :math:`J_iJ_j / \rho_{ij}` terms and its unclipped gradient at
    :math:`\theta_{old}` is design-unbiased for the complete-pair gradient (Theorem 2). A denominator counting the
    *realized* rows or tokens (TRL's) depends on the draw and turns the estimator into a ratio estimator (biased).

    Parameters
    ----------
    num_prompts : int >= 0
        ``K``, the prompts of the generation batch whose candidates were probed (all ranks).
    max_completion_length : int >= 1, optional
        ``L``, for the global token-level losses (``dapo``, ``cispo``, ``vespo``); ``None`` for the sequence-level
        denominator ``K`` (``grpo``, ``sapo``, ``luspo``; ``dr_grpo``, whose loss already divides by ``L``).

    Returns
    -------
    float
        ``K`` (or ``K * L``), with ``K`` taken as 1 for an empty batch (whose loss is 0 anyway) so it never divides
        by zero.

    Raises
    ------
    ValueError
        ``num_prompts`` negative or not an integer, ``max_completion_length`` < 1 or not an integer.
    """
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int | np.integer) or num_prompts < 0:
        raise ValueError(f"`num_prompts` must be an integer >= 0 (the probed prompts K), got {num_prompts!r}.")
    k = float(max(int(num_prompts), 1))
    if max_completion_length is None:
        return k
    if isinstance(max_completion_length, bool) or not isinstance(max_completion_length, int | np.integer) \
            or max_completion_length < 1:
        raise ValueError(f"`max_completion_length` must be an integer >= 1, got {max_completion_length!r}.")
    return k * float(max_completion_length)


def standardize_pair_advantages(advantages, rewards, selected, eps: float = 1e-4) -> tuple[np.ndarray, float]:
    r"""The biased ``pair_standardize`` option: one group's Eq. 13 advantages divided by the std of its rewards.

    .. math:: \tilde A_i \;\to\; \frac{\tilde A_i}{\operatorname{sd}(\{r_j : J_j = 1,\ r_j\ \text{scorable}\})
              + \epsilon}

    with the sample standard deviation (Bessel's correction, ``ddof=1``) of the completed, scorable rewards
    (:func:`scorable_selection`) and ``eps`` the guard standardized GRPO adds (1e-4 in TRL 1.16). Appendix B lists
    reward standardization among the variants that are **not** design-unbiased: the divisor depends on which
    vertices the draw completed, so Theorem 2 no longer holds. Off by default in the trainer.

    Parameters
    ----------
    advantages : array_like, shape (G,)
        Eq. 13 advantages of one candidate group (:attr:`PairAdvantages.advantages`).
    rewards : array_like, shape (G,)
        Rewards; entries of unselected vertices are ignored (NaN allowed there), a NaN on a selected vertex marks it
        unscorable and leaves it out of the std.
    selected : array_like of bool, shape (G,)
        Continuation indicators J.
    eps : float, default 1e-4
        Guard added to the std, finite and >= 0.

    Returns
    -------
    scaled : numpy.ndarray, shape (G,), float64
        ``advantages / (sd + eps)``; unchanged (a copy) when fewer than two completed vertices are scorable (the
        sample std is undefined; their advantages are 0 anyway).
    scale : float
        The divisor ``sd + eps``; 1.0 when unscaled.

    Raises
    ------
    ValueError
        Shapes that differ, advantages that are not finite, ``eps`` negative or not finite, an infinite reward on a
        selected vertex.
    """
    a = check_vector("advantages", advantages)
    r = check_vector("rewards", rewards, allow_nan=True)
    if r.shape != a.shape:
        raise ValueError(f"`rewards` has {r.shape[0]} entries but `advantages` has {a.shape[0]}.")
    eps = float(eps)
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"`eps` must be finite and >= 0, got {eps}.")
    observed, _ = scorable_selection(r, selected)
    if observed.sum() < 2:
        return a.copy(), 1.0
    scale = float(np.std(r[observed], ddof=1)) + eps
    return a / scale, scale

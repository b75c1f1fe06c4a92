r"""Algorithm 1 of PAIR for one candidate group: the continuation design with its warm-up and fallbacks, the draw
(optional anchor pair, Appendix B), the Eq. 13 advantages of the draw and the anchor's marginal inclusion.

Pure numpy (no TRL import): a trainer probes the candidates and predicts ``p_hat`` / ``cost_hat`` with its heads,
calls :func:`design_and_draw` before generating any continuation, continues the selected prefixes, and calls
:func:`draw_advantages` once the rewards are known. :func:`simulate_draw` does both on a frozen, fully generated
group (the design-unbiasedness tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .advantages import PairAdvantages, pair_advantages, standardize_pair_advantages
from .design import pair_design
from .inclusion import anchor_pair_joint_inclusion, draw_selection
from .warm_start import DesignWarmStart

_FINISHED_COST_FRACTION = 1e-9
"""Finished candidates enter ``pair_design`` with cost ``1e-9 * max(c_hat)`` (the solver needs c > 0); their
probability is then fixed at 1. The budget is raised by the same negligible amount."""

_SOLVED = ("optimal", "iteration limit")
"""``PairDesign.reason`` values of a solver answer (the ones the warm start learns from)."""


@dataclass
class GroupDraw:
    """One prompt's design and continuation draw (everything here is fixed before any reward is seen).

    Attributes
    ----------
    pi : ndarray (G,)
        Logged probabilities used in the weights: the design's ``pi`` with finished candidates at 1 and, with the
        anchor pair, the anchor's conditional probability 1 (Appendix B).
    pi_design : ndarray (G,)
        The design's probabilities before the anchor.
    selected : ndarray of bool (G,)
        Completed vertices ``J`` (finished-in-prefix candidates are always 1).
    finished : ndarray of bool (G,)
    anchor : tuple or None
    expected_cost, budget, full_cost : float
        Predicted expected suffix cost ``sum c_hat pi`` over unfinished candidates, the budget, and the predicted
        full-group suffix cost ``sum c_hat``.
    reason : str
        ``"warm-up (uniform)"``, ``"all finished in prefix"``, ``"invalid head output (uniform)"`` or the
        :class:`~trl_ext.estimators.PairDesign` reason.
    fell_back, degenerate : bool
    n_iter : int
        SLSQP iterations (0 when the solver did not run).
    warm_started : bool
        The solver started from the warm-start point (:class:`~trl_ext.estimators.DesignWarmStart`).
    solution : ndarray (G,) or None
        The solver's ``x = -log(pi)`` over all ``G`` vertices when it answered (``reason`` "optimal" or "iteration
        limit"); what the warm start of the next step learns from.
    """

    pi: np.ndarray
    pi_design: np.ndarray
    selected: np.ndarray
    finished: np.ndarray
    anchor: tuple | None
    expected_cost: float
    budget: float
    full_cost: float
    reason: str
    fell_back: bool = False
    degenerate: bool = False
    n_iter: int = 0
    warm_started: bool = False
    solution: np.ndarray | None = None


def design_and_draw(p_hat, cost_hat, finished, rng: np.random.Generator, *, budget_ratio: float = 0.5,
                    pi_min: float = 0.08, anchor_pair: bool = False, warmup: bool = False,
                    warm_start: DesignWarmStart | None = None, max_iter: int = 50, tol: float = 1e-6,
                    kind: str = "disagreement") -> GroupDraw:
    r"""Design and continuation draw for one candidate group (Algorithm 1, "contrast-graph allocation").

    The design solves Eq. 10-11 (:func:`~trl_ext.estimators.pair_design`, Proposition 2) over the unfinished
    candidates under the expected suffix budget :math:`C = \text{budget\_ratio}\sum_{i\,\text{unfinished}}\hat c_i`
    with floor ``pi_min``; candidates that finished inside the probe cost nothing and are continued with
    probability 1. Then :math:`J_i \sim \text{Bernoulli}(\pi_i)` with fresh randomness (Sec. 4.5), after the
    optional anchor pair (Appendix B, "At least two completed vertices": two vertices drawn uniformly among the
    :math:`M = \binom G2` pairs and continued with conditional probability 1,
    :func:`~trl_ext.estimators.anchor_pair_joint_inclusion`).

    Parameters
    ----------
    p_hat : array_like (G,)
        Predicted success probabilities in [0, 1] (Eq. 5).
    cost_hat : array_like (G,)
        Predicted remaining suffix tokens (> 0 on unfinished candidates; ignored on finished ones).
    finished : array_like of bool (G,)
        Candidates that emitted EOS inside the probe: continued with probability 1 at zero cost.
    rng : numpy.random.Generator
        Fresh randomness for the anchor and the Bernoulli draw (never derived from outcomes). With the anchor pair
        the anchor is drawn first (``rng.choice(G, 2, replace=False)``), then the Bernoulli draw.
    budget_ratio : float in (0, 1]
        ``C`` as a fraction of the predicted full-group suffix cost (paper: 0.5).
    pi_min : float in (0, 1]
        Probability floor (Appendix C: 0.08).
    anchor_pair : bool
        Draw the Appendix B anchor pair.
    warmup : bool
        Use the uniform design ``pi = min(1, max(budget_ratio, pi_min))`` (heads not ready yet; same expected cost
        as the budget when ``budget_ratio >= pi_min``).
    warm_start : DesignWarmStart, optional
        Start SLSQP from ``warm_start.initial_point(...)`` (Appendix C) when it has a profile for ``G``.
    max_iter, tol : int, float
        SLSQP iteration cap and relative objective change (Appendix C: 50 and 1e-6).
    kind : str
        Edge proxy of :func:`~trl_ext.estimators.edge_proxies` (Eq. 8: ``"disagreement"``).

    Returns
    -------
    GroupDraw
        ``sum_{i unfinished} c_hat_i pi_design_i <= budget_ratio * sum_{i unfinished} c_hat_i`` (up to ``1e-9``
        relative). ``pi`` is what the weights use (anchor at 1), ``pi_design`` the design before the anchor.

    Raises
    ------
    ValueError
        ``p_hat``, ``cost_hat`` and ``finished`` not all of shape ``(G,)`` with ``G >= 2``.

    Notes
    -----
    Fallbacks, all to a uniform design: invalid head output (NaN/inf ``p_hat``, ``p_hat`` outside [0, 1],
    ``cost_hat <= 0`` or non-finite on an unfinished candidate; ``reason="invalid head output (uniform)"``,
    ``fell_back=True``); warm-up (``reason="warm-up (uniform)"``); and the solver's own fallbacks (Appendix C:
    uniform probabilities with the same expected cost when SLSQP fails, see
    :func:`~trl_ext.estimators.pair_design`). Finished candidates enter the program with the negligible cost
    ``1e-9 * max(c_hat)`` (the solver needs ``c > 0``; the budget grows by the same amount) and are then fixed at 1.
    """
    p = np.asarray(p_hat, dtype=np.float64).reshape(-1)
    c = np.asarray(cost_hat, dtype=np.float64).reshape(-1)
    fin = np.asarray(finished, dtype=bool).reshape(-1)
    G = p.shape[0]
    if G < 2 or c.shape[0] != G or fin.shape[0] != G:
        raise ValueError(f"design_and_draw: p_hat, cost_hat and finished must all be (G,) with G >= 2; got "
                         f"{p.shape}, {c.shape}, {fin.shape}.")
    unf = ~fin
    ratio, pi_min = float(budget_ratio), float(pi_min)
    solution, warm_started = None, False
    if not unf.any():
        pi = np.ones(G)
        reason, fell_back, degenerate, n_iter = "all finished in prefix", False, False, 0
        budget = full = expected = 0.0
    else:
        invalid = bool(np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)) or np.any(~np.isfinite(c[unf]))
                       or np.any(c[unf] <= 0))
        c_unf = np.where(np.isfinite(c) & (c > 0), c, 1.0)
        full = float(c_unf[unf].sum())
        budget = ratio * full
        fell_back, degenerate, n_iter = False, False, 0
        if warmup or invalid:
            pi = np.where(unf, min(1.0, max(ratio, pi_min)), 1.0)
            reason = "invalid head output (uniform)" if invalid else "warm-up (uniform)"
            fell_back = invalid
        else:
            pi, reason, fell_back, n_iter, degenerate, warm_started, solution = _solved_design(
                p, c_unf, unf, fin, budget, pi_min, warm_start, max_iter, tol, kind)
        expected = float((c_unf * pi)[unf].sum())
    pi_design = pi.copy()
    anchor = None
    if anchor_pair:
        anchor = tuple(sorted(int(v) for v in rng.choice(G, size=2, replace=False)))
        pi, _ = anchor_pair_joint_inclusion(pi_design, anchor)
    selected = draw_selection(pi_design, rng, anchor=anchor)
    selected |= fin
    return GroupDraw(pi=pi, pi_design=pi_design, selected=selected, finished=fin, anchor=anchor,
                     expected_cost=expected, budget=budget, full_cost=full, reason=reason, fell_back=fell_back,
                     degenerate=degenerate, n_iter=n_iter, warm_started=warm_started, solution=solution)


def _solved_design(p, c_unf, unf, fin, budget, pi_min, warm_start, max_iter, tol, kind):
    """The Eq. 10-11 design over the unfinished candidates (finished ones at the negligible cost
    ``_FINISHED_COST_FRACTION * max(c_hat)``, then fixed at 1): ``(pi, reason, fell_back, n_iter, degenerate,
    warm_started, solution)``, ``solution`` the solver's point when it solved (for the warm start)."""
    eps = _FINISHED_COST_FRACTION * float(c_unf[unf].max())
    c_design = np.where(unf, c_unf, eps)
    p_design = np.clip(p, 0.0, 1.0)
    budget_design = budget + eps * float(fin.sum())
    x0 = None
    if warm_start is not None:
        x0 = warm_start.initial_point(p_design, c_design, budget_design, pi_min, kind=kind)
    design = pair_design(p_design, c_design, budget_design, pi_min, x0=x0, max_iter=int(max_iter),
                         tol=float(tol), kind=kind)
    pi = np.where(unf, np.clip(design.pi, pi_min, 1.0), 1.0)
    solution = np.asarray(design.x, dtype=np.float64).copy() if design.reason in _SOLVED else None
    return (pi, design.reason, bool(design.fell_back), int(design.n_iter), design.reason.startswith("degenerate"),
            bool(design.warm_started), solution)


def anchor_marginal_inclusion(inclusion, anchor_pair: bool) -> np.ndarray:
    r"""Unconditional marginal inclusion probabilities of a design drawn with or without the anchor pair.

    With the Appendix B anchor pair (two of the ``G`` vertices drawn uniformly, continued with probability 1; every
    other vertex an independent Bernoulli(:math:`\pi_i`)), vertex ``i`` is an anchor with probability
    :math:`2/G`, so

    .. math:: P(J_i = 1) = \frac2G + \Big(1 - \frac2G\Big)\pi_i = \pi_i + (1 - \pi_i)\,\frac2G .

    Without the anchor it is :math:`\pi_i`. These are the inverse-probability weights of the heads' losses (Eq. 6-7:
    a label is observed with the *marginal* probability, not the anchor-conditional one
    :func:`~trl_ext.estimators.anchor_pair_joint_inclusion` logs for Eq. 13).

    Parameters
    ----------
    inclusion : array_like, shape (G,)
        Design probabilities before the anchor (``GroupDraw.pi_design``).
    anchor_pair : bool
        Whether the draw used the anchor pair (``GroupDraw.anchor is not None``).

    Returns
    -------
    ndarray, shape (G,), float64
        A new array; the input is not modified.
    """
    pi = np.array(inclusion, dtype=np.float64)
    if anchor_pair:
        pi = pi + (1.0 - pi) * 2.0 / pi.shape[0]
    return pi


def draw_advantages(rewards, draw: GroupDraw, *, w_max: float | None = None, self_normalize: bool = False,
                    standardize: bool = False) -> tuple[np.ndarray, PairAdvantages]:
    r"""Eq. 13 advantages of one group from its logged draw (float64), with the Appendix B variants.

    .. math:: \tilde A_i = \frac{1}{2M}\sum_{j\ne i} \frac{J_iJ_j}{\rho_{ij}} (r_i - r_j),\qquad
              \rho_{ij} = \pi_i\pi_j,\quad M = \binom G2,

    with :math:`\pi` = ``draw.pi`` (the anchor's conditional probabilities, Appendix B) and :math:`J` =
    ``draw.selected`` (:func:`~trl_ext.estimators.pair_advantages`).

    Parameters
    ----------
    rewards : array_like (G,)
        Rewards of the completed vertices (entries of unselected candidates are ignored). A NaN reward on a
        completed vertex marks it unscorable: PAIR's one NaN rule
        (:func:`~trl_ext.estimators.scorable_selection`) -- it observes no edge and gets advantage 0, every
        other weight stays as logged; counted in ``result.n_unscorable``.
    draw : GroupDraw
    w_max : float >= 1, optional
        BIASED: clip edge weights (Appendix B).
    self_normalize : bool
        BIASED: Hajek self-normalization (Appendix B).
    standardize : bool
        BIASED: divide by the std of the completed, scorable rewards
        (:func:`~trl_ext.estimators.standardize_pair_advantages`).

    Returns
    -------
    advantages : ndarray (G,), float64
        0 on unselected and unscorable candidates; all 0 when fewer than two scorable vertices were completed
        (unbiased, Appendix B).
    result : PairAdvantages
        Of the unstandardized estimator.
    """
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    sel = np.asarray(draw.selected, dtype=bool)
    res = pair_advantages(r, sel, draw.pi, w_max=w_max, self_normalize=bool(self_normalize))
    adv = res.advantages.astype(np.float64)
    if standardize:
        adv, _ = standardize_pair_advantages(adv, r, sel)
    return adv, res


def simulate_draw(p_hat, cost_hat, finished, rewards, rng: np.random.Generator, *, warmup: bool = False,
                  design: dict | None = None, estimator: dict | None = None
                  ) -> tuple[np.ndarray, GroupDraw, PairAdvantages]:
    """One fresh design draw on a frozen, fully generated candidate group (``rewards`` known for every candidate):
    :func:`design_and_draw`, then :func:`draw_advantages` on the rewards of the selected candidates -- what training
    produces for this group, without generating anything.

    Parameters
    ----------
    p_hat, cost_hat, finished, rng, warmup
        As :func:`design_and_draw`.
    rewards : array_like (G,)
        Every candidate's reward (unselected ones are masked to NaN before Eq. 13).
    design : dict, optional
        Keyword arguments of :func:`design_and_draw` (``budget_ratio``, ``pi_min``, ``anchor_pair``, ...).
    estimator : dict, optional
        Keyword arguments of :func:`draw_advantages` (``w_max``, ``self_normalize``, ``standardize``).

    Returns
    -------
    (advantages, draw, result) : ndarray (G,), GroupDraw, PairAdvantages
    """
    draw = design_and_draw(p_hat, cost_hat, finished, rng, warmup=warmup, **(design or {}))
    r = np.where(draw.selected, np.asarray(rewards, dtype=np.float64), np.nan)
    adv, res = draw_advantages(r, draw, **(estimator or {}))
    return adv, draw, res

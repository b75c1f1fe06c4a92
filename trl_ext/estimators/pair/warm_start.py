r"""Appendix C of PAIR: warm start of the design solver from the previous step's solutions."""

from __future__ import annotations

import math

import numpy as np

from ._checks import check_vector
from .graph import check_edge_matrix, edge_proxies, shared_vertex_term


def design_priority(p_hat, cost_hat, budget, pi_min: float = 0.08, *, kind: str = "disagreement", score_norm=None,
                    edge_weights=None) -> np.ndarray:
    r"""First-order allocation priority of each vertex for Eq. 10-11 (higher: larger optimal :math:`\pi_i`).

    At an interior optimum of Eq. 10-11 the KKT condition in :math:`\pi` reads
    :math:`\pi_i^2 \propto (A u + b)_i / \hat c_i` with :math:`u = 1/\pi`. Evaluating it at the uniform design
    (:math:`u_j = 1/\pi_u`, :math:`\pi_u = \mathrm{clip}(C / \sum_j \hat c_j, \pi_{min}, 1)`) gives the priority
    :math:`((A\mathbf 1)_i / \pi_u + b_i) / \hat c_i` used to rank vertices for the warm start
    (:class:`DesignWarmStart`). Only its order matters.

    Parameters
    ----------
    p_hat, cost_hat, budget, pi_min, kind, score_norm, edge_weights : as in :func:`pair_design`.

    Returns
    -------
    ndarray, shape (G,)
        Nonnegative priorities (0 for a vertex without any predicted contrast).
    """
    p = check_vector("p_hat", p_hat)
    c = check_vector("cost_hat", cost_hat)
    if c.shape != p.shape:
        raise ValueError(f"`cost_hat` has {c.shape[0]} entries but `p_hat` has {p.shape[0]}.")
    if np.any(c <= 0):
        raise ValueError("`cost_hat` must be > 0 (predicted remaining suffix tokens).")
    a = edge_proxies(p, kind=kind, score_norm=score_norm) if edge_weights is None else check_edge_matrix(edge_weights)
    b = shared_vertex_term(a)
    pi_u = min(1.0, max(float(pi_min), float(budget) / float(c.sum())))
    return (a.sum(axis=1) / pi_u + b) / c


def fit_to_budget(x, cost_hat, budget, pi_min: float) -> np.ndarray:
    """Shift ``x = -log(pi)`` by one constant (inside the box ``[0, -log pi_min]``) so the expected cost
    ``sum_i c_i e^{-x_i}`` equals ``budget`` (or comes as close as the box allows). Bisection; used to make a warm
    start feasible and on the budget surface, where the optimum of Eq. 10-11 lies."""
    x = check_vector("x", x)
    c = check_vector("cost_hat", cost_hat)
    x_max = -math.log(float(pi_min))
    budget = float(budget)
    lo, hi = -x_max - 1.0, x_max + 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if float(c @ np.exp(-np.clip(x + mid, 0.0, x_max))) > budget:
            lo = mid
        else:
            hi = mid
    return np.clip(x + hi, 0.0, x_max)  # hi: never above the budget


class DesignWarmStart:
    r"""Warm start of :func:`pair_design` from the previous step's solutions (Appendix C, "Probability
    optimization": "warm-started from the previous step's probabilities").

    Vertices are exchangeable across prompts (vertex 3 of one prompt has nothing to do with vertex 3 of the next),
    so the previous probabilities are carried over **by rank**, not by position. The state is, per group size
    ``G``, a *profile*: the mean over the previous step's solved groups of the sorted solution
    :math:`x_{(1)} \le \dots \le x_{(G)}` (:math:`x = -\log\pi`, i.e. the probabilities in decreasing order). For a
    new group, :meth:`initial_point` gives the ``r``-th largest profile probability to the vertex of ``r``-th highest
    :func:`design_priority` and shifts the result onto the budget (:func:`fit_to_budget`). Without a profile for
    ``G`` it returns ``None`` (cold start at the uniform design).

    The warm start changes only where SLSQP starts, not the program: the answer is the same optimum up to the
    solver tolerance, and it is still a valid design (floor, budget) because :func:`pair_design` enforces both. On
    simulated G = 16 groups it cuts SLSQP iterations by about a third (see ``tests/test_estimators_pair.py``).

    Everything in the state is computed before any reward of the step it is used in (previous steps' head
    predictions only), so the design stays a pre-outcome design (Theorem 2).
    """

    def __init__(self):
        self.profiles: dict[int, np.ndarray] = {}
        self.n_solutions: dict[int, int] = {}

    def initial_point(self, p_hat, cost_hat, budget, pi_min: float = 0.08, **proxy_kw) -> np.ndarray | None:
        """The warm start ``x0`` for :func:`pair_design` (same arguments), or ``None`` without a profile for G."""
        c = check_vector("cost_hat", cost_hat)
        profile = self.profiles.get(int(c.shape[0]))
        if profile is None:
            return None
        prio = design_priority(p_hat, c, budget, pi_min, **proxy_kw)
        order = np.argsort(-prio, kind="stable")
        x0 = np.empty_like(profile)
        x0[order] = profile
        return fit_to_budget(x0, c, budget, pi_min)

    def update(self, solutions) -> None:
        """Replace the profiles by those of ``solutions`` (the solver answers ``x`` of one step, any group sizes).

        Call it with the same solutions in the same order on every process (e.g. gathered and sorted by dataset
        row) so the state stays identical. Group sizes absent from ``solutions`` keep their previous profile.
        """
        by_g: dict[int, list[np.ndarray]] = {}
        for x in solutions:
            x = np.sort(check_vector("x", x))
            by_g.setdefault(int(x.shape[0]), []).append(x)
        for g, xs in by_g.items():
            self.profiles[g] = np.mean(np.stack(xs), axis=0)
            self.n_solutions[g] = len(xs)

    def state_dict(self) -> dict:
        """``torch.load(weights_only=True)``-compatible state (plain lists and ints)."""
        return {"profiles": {str(g): [float(v) for v in x] for g, x in self.profiles.items()},
                "n_solutions": {str(g): int(n) for g, n in self.n_solutions.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.profiles = {int(g): np.asarray(x, dtype=np.float64) for g, x in state.get("profiles", {}).items()}
        self.n_solutions = {int(g): int(n) for g, n in state.get("n_solutions", {}).items()}

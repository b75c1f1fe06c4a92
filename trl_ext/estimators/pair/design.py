r"""Sections 4.3-4.4 and Appendix C of PAIR: the convex continuation design (Eq. 10-11, Proposition 2) and its SLSQP
solver, plus the uniform design it falls back to."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ._checks import check_vector
from .graph import check_edge_matrix, edge_proxies, shared_vertex_term


def uniform_design(cost_hat, budget) -> np.ndarray:
    r"""Uniform continuation probabilities with expected cost equal to the budget: :math:`\pi_i = \min(1, C/\sum c_i)`.

    Parameters
    ----------
    cost_hat : array_like, shape (G,)
        Predicted suffix costs, all > 0.
    budget : float
        Expected suffix-token budget C > 0.

    Returns
    -------
    ndarray, shape (G,)
        Constant probabilities; the expected cost :math:`\sum_i c_i\pi_i` is ``min(C, sum(c))``. Note that this may be
        below a probability floor when ``C < pi_min * sum(c)`` (see :func:`pair_design`).
    """
    c = check_vector("cost_hat", cost_hat)
    if np.any(c <= 0):
        raise ValueError("`cost_hat` must be > 0 (predicted remaining suffix tokens).")
    budget = float(budget)
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"`budget` must be a finite positive number, got {budget}.")
    return np.full(c.shape, min(1.0, budget / c.sum()))


@dataclass
class PairDesign:
    """Result of :func:`pair_design`.

    Attributes
    ----------
    pi : ndarray (G,)
        Continuation probabilities (log these before any terminal reward is seen).
    expected_cost : float
        Predicted expected suffix cost ``sum(cost_hat * pi)``.
    objective : float
        Phi(x) of Eq. 10 at the returned probabilities (unnormalized).
    fell_back : bool
        True when the optimizer was not used or its answer was rejected and the uniform design was returned
        instead (solver failure, infeasible budget).
    reason : str
        Human-readable status ("optimal", "iteration limit", "budget covers the full group", "degenerate ...",
        "infeasible budget ...", "solver failed: ...").
    n_iter : int
        SLSQP iterations (0 when the solver was not run).
    x : ndarray (G,)
        ``-log(pi)``; pass as ``x0`` to warm-start the next call.
    budget : float
    pi_min : float
    floor_violated : bool
        True when some probability is below ``pi_min`` (only possible for the infeasible-budget fallback).
    warm_started : bool
        True when SLSQP ran from the caller's ``x0`` (False for a cold start and when the solver did not run).
    """

    pi: np.ndarray
    expected_cost: float
    objective: float
    fell_back: bool
    reason: str
    n_iter: int
    x: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    budget: float = float("nan")
    pi_min: float = float("nan")
    floor_violated: bool = False
    warm_started: bool = False


def _phi(u: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    # u = exp(x) = 1/pi; Phi = sum_{i<j} a_ij u_i u_j + sum_i b_i u_i = 0.5 u'Au + b'u  (Eq. 10)
    return float(0.5 * u @ a @ u + b @ u)


def _repair_budget(x: np.ndarray, c: np.ndarray, budget: float, x_max: float) -> np.ndarray:
    """Remove SLSQP's small constraint violation (it tolerates ~ftol) by scaling pi down, keeping the box.

    Vertices already at the floor (``x = x_max``) cannot give up cost, so the free ones are scaled by the exact factor
    that brings the expected cost to the target; any that then hit the floor are frozen and the step repeats (at most
    G passes). A plain ``x + log(cost / target)`` shift converges only geometrically when most vertices sit at the
    floor, and 100 such steps left the budget exceeded by up to ~1e-7 relative on tight budgets.
    """
    target = budget * (1.0 - 1e-12)
    for _ in range(x.shape[0] + 1):
        pi = np.exp(-x)
        cost = float(c @ pi)
        if cost <= target:
            break
        free = x < x_max
        fixed = float(c[~free] @ pi[~free])
        movable = float(c[free] @ pi[free])
        if movable <= 0.0:
            break  # everything at the floor: cost = pi_min * sum(c) <= budget (feasibility was checked)
        scale = (target - fixed) / movable
        if scale <= 0.0:
            return np.where(free, x_max, x)  # the floor alone uses the whole budget (up to round-off)
        x = np.where(free, np.minimum(x - math.log(scale), x_max), x)
    return x


def run_slsqp(a, b, c, budget, x_start, x_max, max_iter, tol):
    """Solve Eq. 10-11 in x = -log(pi) with SLSQP. Returns (x, n_iter, success, message)."""
    from scipy import optimize

    scale = _phi(np.exp(x_start), a, b)
    scale = scale if scale > 0 else 1.0

    def fun(x):
        u = np.exp(x)
        au = a @ u
        val = 0.5 * u @ au + b @ u
        return val / scale, u * (au + b) / scale

    def con(x):
        return 1.0 - (c @ np.exp(-x)) / budget

    def con_jac(x):
        return c * np.exp(-x) / budget

    res = optimize.minimize(
        fun,
        x_start,
        jac=True,
        method="SLSQP",
        bounds=[(0.0, x_max)] * len(x_start),
        constraints=[{"type": "ineq", "fun": con, "jac": con_jac}],
        options={"maxiter": int(max_iter), "ftol": float(tol)},
    )
    return (
        np.asarray(res.x, dtype=np.float64),
        int(getattr(res, "nit", 0)),
        bool(res.success),
        str(res.message),
        int(res.status),
    )


def pair_design(
    p_hat,
    cost_hat,
    budget,
    pi_min: float = 0.08,
    x0=None,
    max_iter: int = 50,
    *,
    kind: str = "disagreement",
    score_norm=None,
    edge_weights=None,
    tol: float = 1e-6,
    on_infeasible: str = "uniform",
) -> PairDesign:
    r"""Graph-coupled continuation probabilities (Eq. 10-11, Proposition 2, Appendix C).

    Solves, in :math:`x_i = -\log\pi_i`,

    .. math::
        \min_x \sum_{i<j} a_{ij} e^{x_i + x_j} + \sum_i b_i e^{x_i}
        \quad\text{s.t.}\quad \sum_i \hat c_i e^{-x_i} \le C,\quad 0 \le x_i \le -\log\pi_{min},

    a convex program (Proposition 2), with SLSQP in double precision: analytic gradients, objective normalized by its
    value at the start point so ``tol`` is a relative objective change (paper: 1e-6), at most ``max_iter`` (paper: 50)
    iterations, warm start from ``x0``.

    Parameters
    ----------
    p_hat : array_like, shape (G,)
        Predicted success probabilities in [0, 1] (edge proxies via :func:`edge_proxies`).
    cost_hat : array_like, shape (G,)
        Predicted remaining suffix costs, all > 0.
    budget : float
        Expected suffix-token budget C > 0 (the paper's default is 0.5 * sum(cost_hat)).
    pi_min : float in (0, 1]
        Probability floor (paper Appendix C: 0.08; Section 6.3 recommends 0.05).
    x0 : array_like, shape (G,), optional
        Warm start in x-space (``previous_design.x``); clipped into the box. Default: the uniform design.
    max_iter : int >= 1
    kind, score_norm : passed to :func:`edge_proxies`.
    edge_weights : array_like (G, G), optional
        Use these edge proxies instead of computing them from ``p_hat`` (e.g. a pair-energy head).
    tol : float
        Relative objective change at which SLSQP stops.
    on_infeasible : {"uniform", "floor", "raise"}
        What to do when ``budget < pi_min * sum(cost_hat)`` (no feasible point, Proposition 2):
        ``"uniform"`` (default, the paper's fallback) returns uniform probabilities ``budget / sum(cost_hat)``, which
        keep the expected cost at the budget but lie below the floor (``floor_violated=True``);
        ``"floor"`` returns ``pi = pi_min`` everywhere, keeping the floor but exceeding the budget;
        ``"raise"`` raises ``ValueError``. Both fallbacks set ``fell_back=True`` and say why in ``reason``.

    Returns
    -------
    PairDesign

    Notes
    -----
    - ``budget >= sum(cost_hat)``: every vertex is continued (pi = 1 is optimal since Phi increases in each x_i).
    - All edge proxies zero (a saturated group): Phi is identically 0, every feasible point is optimal, and the
      uniform design with the same expected cost is returned (``fell_back=False``, ``reason`` starts "degenerate").
    - Solver exception, non-finite or infeasible answer, or an answer worse than the uniform design: the uniform
      design with the same expected cost is returned, ``fell_back=True``.
    """
    p, c, pi_min, budget = _check_design_args(p_hat, cost_hat, budget, pi_min, max_iter, on_infeasible)
    G = p.shape[0]
    a = _design_edges(p, G, kind, score_norm, edge_weights)
    b = shared_vertex_term(a)
    total = float(c.sum())
    x_max = -math.log(pi_min)
    make = partial(_design_result, a=a, b=b, c=c, budget=budget, pi_min=pi_min)

    if budget >= total:
        return make(np.ones(G), False, "budget covers the full group")
    if budget < pi_min * total * (1.0 - 1e-12):
        return _infeasible_design(make, c, budget, pi_min, total, on_infeasible)
    pi_u = np.clip(uniform_design(c, budget), pi_min, 1.0)
    if not np.any(a > 0):
        return make(pi_u, False, "degenerate: all edge proxies are zero (no predicted contrast); uniform design")

    x_start, warm = _start_point(x0, pi_u, G, x_max)
    return _solve_design(partial(make, warm=warm), a, b, c, budget, pi_u, x_start, x_max, max_iter, tol)


def _check_design_args(p_hat, cost_hat, budget, pi_min, max_iter, on_infeasible):
    """Validated ``(p, c, pi_min, budget)`` of :func:`pair_design` (positivity of costs, the floor, the budget)."""
    p = check_vector("p_hat", p_hat)
    c = check_vector("cost_hat", cost_hat)
    G = p.shape[0]
    if c.shape[0] != G:
        raise ValueError(f"`cost_hat` has {c.shape[0]} entries but `p_hat` has {G}.")
    if np.any(c <= 0):
        raise ValueError(
            f"`cost_hat` must be > 0 (predicted remaining suffix tokens); entries {np.flatnonzero(c <= 0).tolist()} "
            "are not. Floor predicted costs at a small positive value (e.g. 1 token)."
        )
    pi_min = float(pi_min)
    if not (0.0 < pi_min <= 1.0) or not math.isfinite(pi_min):
        raise ValueError(f"`pi_min` must be in (0, 1], got {pi_min}.")
    budget = float(budget)
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"`budget` must be a finite positive number, got {budget}.")
    if int(max_iter) < 1:
        raise ValueError("`max_iter` must be >= 1.")
    if on_infeasible not in ("uniform", "floor", "raise"):
        raise ValueError('`on_infeasible` must be "uniform", "floor" or "raise".')
    return p, c, pi_min, budget


def _design_edges(p: np.ndarray, G: int, kind: str, score_norm, edge_weights) -> np.ndarray:
    """The edge proxies :math:`a_{ij}` of Eq. 10: from ``p_hat`` (Eq. 8-9) or the caller's ``edge_weights``."""
    if edge_weights is None:
        return edge_proxies(p, kind=kind, score_norm=score_norm)
    a = check_edge_matrix(edge_weights)
    if a.shape != (G, G):
        raise ValueError(f"`edge_weights` must have shape ({G}, {G}), got {a.shape}.")
    return a


def _design_result(pi, fell_back, reason, n_iter=0, floor_violated=False, *, a, b, c, budget, pi_min,
                   warm=False) -> PairDesign:
    """A :class:`PairDesign` for the probabilities ``pi``, with its expected cost and objective Phi (Eq. 10)."""
    pi = np.asarray(pi, dtype=np.float64)
    return PairDesign(
        pi=pi,
        expected_cost=float(c @ pi),
        objective=_phi(1.0 / pi, a, b),
        fell_back=fell_back,
        reason=reason,
        n_iter=n_iter,
        x=-np.log(pi),
        budget=budget,
        pi_min=pi_min,
        floor_violated=floor_violated,
        warm_started=warm,
    )


def _infeasible_design(make, c: np.ndarray, budget: float, pi_min: float, total: float,
                       on_infeasible: str) -> PairDesign:
    """The documented fallback when ``budget < pi_min * sum(c)``: Eq. 11 has no feasible point (Proposition 2)."""
    G = c.shape[0]
    msg = (
        f"infeasible budget: {budget:.6g} < pi_min * sum(cost_hat) = {pi_min * total:.6g} "
        "(Proposition 2 needs C >= pi_min * sum(c))"
    )
    if on_infeasible == "raise":
        raise ValueError(msg + "; raise the budget or lower pi_min.")
    if on_infeasible == "floor":
        return make(np.full(G, pi_min), True, msg + "; returned pi = pi_min (expected cost exceeds the budget)")
    return make(
        uniform_design(c, budget),
        True,
        msg + "; returned the uniform design at the budget (below the floor)",
        0,
        True,
    )


def _start_point(x0, pi_u: np.ndarray, G: int, x_max: float) -> tuple[np.ndarray, bool]:
    """SLSQP's start in ``x = -log(pi)``: the caller's warm start clipped into the box, else the uniform design.

    Returns ``(x_start, warm)`` with ``warm`` True when ``x0`` was given.
    """
    if x0 is None:
        return -np.log(pi_u), False
    x_start = check_vector("x0", x0)
    if x_start.shape[0] != G:
        raise ValueError(f"`x0` has {x_start.shape[0]} entries but the group has G = {G}.")
    return np.clip(x_start, 0.0, x_max), True


def _solve_design(make, a, b, c, budget, pi_u, x_start, x_max, max_iter, tol) -> PairDesign:
    """Run SLSQP on Eq. 10-11 and accept its answer only if finite, on budget and no worse than uniform (Appendix C).

    Any rejection returns the uniform design ``pi_u`` with ``fell_back=True`` and the reason.
    """
    # The solver is looked up on the package at call time: tests replace `trl_ext.estimators.pair.run_slsqp`
    # (monkeypatch) to simulate solver failures, and the replacement must reach this call.
    solver = sys.modules[__package__].run_slsqp
    try:
        x, n_iter, success, message, status = solver(a, b, c, budget, x_start, x_max, max_iter, tol)
    except Exception as exc:  # noqa: BLE001 - any solver crash becomes a documented fallback
        return make(pi_u, True, f"solver failed: {type(exc).__name__}: {exc}")
    if not np.all(np.isfinite(x)):
        return make(pi_u, True, "solver failed: non-finite solution", n_iter)
    x = np.clip(x, 0.0, x_max)
    if c @ np.exp(-x) > budget * (1.0 + 1e-4):
        return make(pi_u, True, f"solver failed: budget violated ({message})", n_iter)
    pi = np.exp(-_repair_budget(x, c, budget, x_max))
    if not success and status != 9:  # 9 = iteration limit: a feasible iterate is still usable (Appendix C)
        return make(pi_u, True, f"solver failed: {message}", n_iter)
    if _phi(1.0 / pi, a, b) > _phi(1.0 / pi_u, a, b) * (1.0 + 1e-9):
        return make(pi_u, True, "solver failed: answer worse than the uniform design", n_iter)
    return make(pi, False, "optimal" if success else "iteration limit", n_iter)

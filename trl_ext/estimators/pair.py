r"""PAIR: pair kernel, contrast-graph continuation design and inverse pair-inclusion advantages.

Source: Voss, Hale and Reyes, "Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR"
(arXiv:2608.11368, "PAIR"). Equation, theorem and appendix numbers below refer to that paper.

Notation (one prompt, a candidate group of ``G`` vertices):

- ``rewards`` ``r`` of shape ``(G,)``; binary in the paper, but every identity here holds for real rewards.
- ``scores`` ``s`` of shape ``(G, D)``: one sequence score-function vector
  :math:`s_i = \nabla_\theta \log \pi_\theta(o_i \mid q)` per vertex (any real vectors in tests).
- ``inclusion`` :math:`\pi` of shape ``(G,)``: the marginal continuation probabilities, all in ``(0, 1]``.
- ``selected`` :math:`J` of shape ``(G,)``: boolean draw of which vertices were continued to completion.
- ``joint`` :math:`\rho` of shape ``(G, G)``: joint inclusion probabilities
  :math:`\rho_{ij} = P(J_i = J_j = 1 \mid z_{1:G})` (diagonal = marginals). Independent Bernoulli designs have
  :math:`\rho_{ij} = \pi_i \pi_j` (Section 3.3, Eq. 12).

Everything is numpy float64; no TRL import. Pair coefficients are accumulated in float64 (Appendix C uses FP32;
FP64 is strictly more accurate at G <= a few hundred and costs nothing at these sizes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ._validation import as_float_array, factorize_groups, to_numpy
from .baselines import AdvantageResult, register_advantage_estimator

__all__ = [
    "PairAdvantages",
    "DesignWarmStart",
    "PairDesign",
    "anchor_pair_joint_inclusion",
    "complete_pair_average",
    "design_covariance",
    "design_priority",
    "draw_selection",
    "edge_proxies",
    "effective_sample_size",
    "fit_to_budget",
    "fixed_normalizer",
    "independent_joint_inclusion",
    "loo_score_gradient",
    "pair_advantages",
    "pair_design",
    "pair_group_advantages",
    "pair_kernel",
    "scorable_selection",
    "shared_vertex_term",
    "standardize_pair_advantages",
    "uniform_design",
]


# ----------------------------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------------------------
def _f64(x) -> np.ndarray:
    """``x`` (numpy, sequence, or torch tensor of any dtype / device / grad state) as a float64 numpy array."""
    return np.asarray(to_numpy(x), dtype=np.float64)


def _vector(name: str, x, *, allow_nan: bool = False, min_len: int = 1) -> np.ndarray:
    arr = _f64(x)
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D array of shape (G,), got shape {arr.shape}.")
    if arr.shape[0] < min_len:
        raise ValueError(f"`{name}` needs at least {min_len} entries (got {arr.shape[0]}).")
    if not allow_nan and not np.all(np.isfinite(arr)):
        bad = np.flatnonzero(~np.isfinite(arr)).tolist()
        raise ValueError(f"`{name}` contains NaN/inf at positions {bad}; pass finite values.")
    return arr


def _scores(scores, G: int) -> np.ndarray:
    s = _f64(scores)
    if s.ndim != 2 or s.shape[0] != G:
        raise ValueError(
            f"`scores` must have shape (G, D) = ({G}, D) (one score vector per vertex), got {s.shape}; "
            "reshape a 1-D score to (G, 1)."
        )
    if not np.all(np.isfinite(s)):
        raise ValueError("`scores` contains NaN/inf; pass finite score vectors.")
    return s


def _probabilities(name: str, x, G: int | None = None) -> np.ndarray:
    p = _vector(name, x)
    if G is not None and p.shape[0] != G:
        raise ValueError(f"`{name}` has {p.shape[0]} entries but the group has G = {G}.")
    if np.any(p <= 0.0) or np.any(p > 1.0):
        bad = np.flatnonzero((p <= 0.0) | (p > 1.0)).tolist()
        raise ValueError(
            f"`{name}` must lie in (0, 1] (positivity, Theorem 2); entries {bad} are outside. "
            "Every candidate needs a strictly positive continuation probability."
        )
    return p


def _selected(selected, G: int) -> np.ndarray:
    sel = to_numpy(selected)
    if sel.shape != (G,):
        raise ValueError(f"`selected` must have shape ({G},), got {sel.shape}.")
    if sel.dtype != bool:
        if not np.all(np.isin(sel, (0, 1))):
            raise ValueError("`selected` must be boolean (or 0/1) continuation indicators J_i.")
        sel = sel.astype(bool)
    return sel


def _joint(joint, inclusion: np.ndarray) -> np.ndarray:
    G = inclusion.shape[0]
    rho = _f64(joint)
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


# ----------------------------------------------------------------------------------------------------------------
# Section 3: the pair target
# ----------------------------------------------------------------------------------------------------------------
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
    r = _vector("rewards", rewards)
    s = _scores(scores, r.shape[0])
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
    r = _vector("rewards", rewards, min_len=2)
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
    r = _vector("rewards", rewards, min_len=2)
    s = _scores(scores, r.shape[0])
    G = r.shape[0]
    loo_mean = (r.sum() - r) / (G - 1)
    return ((r - loo_mean)[:, None] * s).sum(axis=0) / G


# ----------------------------------------------------------------------------------------------------------------
# Section 4.3-4.4: contrast graph and design
# ----------------------------------------------------------------------------------------------------------------
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
    p = _vector("p_hat", p_hat)
    if np.any(p < 0.0) or np.any(p > 1.0):
        raise ValueError("`p_hat` must lie in [0, 1] (predicted success probabilities).")
    d = p[:, None] * (1.0 - p[None, :]) + (1.0 - p[:, None]) * p[None, :]
    if kind == "disagreement":
        a = d
    elif kind == "score_norm":
        if score_norm is None:
            raise ValueError('kind="score_norm" needs `score_norm` (predicted score norms m_i >= 0).')
        m = _vector("score_norm", score_norm)
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


def _check_edge_matrix(a) -> np.ndarray:
    a = _f64(a)
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
    a = _check_edge_matrix(a)
    root = np.sqrt(a).sum(axis=1)
    return np.maximum(root**2 - a.sum(axis=1), 0.0)


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
    c = _vector("cost_hat", cost_hat)
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


def _run_slsqp(a, b, c, budget, x_start, x_max, max_iter, tol):
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
    p = _vector("p_hat", p_hat)
    c = _vector("cost_hat", cost_hat)
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
    if edge_weights is None:
        a = edge_proxies(p, kind=kind, score_norm=score_norm)
    else:
        a = _check_edge_matrix(edge_weights)
        if a.shape != (G, G):
            raise ValueError(f"`edge_weights` must have shape ({G}, {G}), got {a.shape}.")
    b = shared_vertex_term(a)
    total = float(c.sum())
    x_max = -math.log(pi_min)

    warm = False

    def make(pi, fell_back, reason, n_iter=0, floor_violated=False):
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

    if budget >= total:
        return make(np.ones(G), False, "budget covers the full group")
    if budget < pi_min * total * (1.0 - 1e-12):
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
    pi_u = np.clip(uniform_design(c, budget), pi_min, 1.0)
    if not np.any(a > 0):
        return make(pi_u, False, "degenerate: all edge proxies are zero (no predicted contrast); uniform design")

    if x0 is None:
        x_start = -np.log(pi_u)
    else:
        x_start = _vector("x0", x0)
        if x_start.shape[0] != G:
            raise ValueError(f"`x0` has {x_start.shape[0]} entries but the group has G = {G}.")
        x_start = np.clip(x_start, 0.0, x_max)
        warm = True
    try:
        x, n_iter, success, message, status = _run_slsqp(a, b, c, budget, x_start, x_max, max_iter, tol)
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


# ----------------------------------------------------------------------------------------------------------------
# Appendix C: warm start of the design solver from the previous step
# ----------------------------------------------------------------------------------------------------------------
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
    p = _vector("p_hat", p_hat)
    c = _vector("cost_hat", cost_hat)
    if c.shape != p.shape:
        raise ValueError(f"`cost_hat` has {c.shape[0]} entries but `p_hat` has {p.shape[0]}.")
    if np.any(c <= 0):
        raise ValueError("`cost_hat` must be > 0 (predicted remaining suffix tokens).")
    a = edge_proxies(p, kind=kind, score_norm=score_norm) if edge_weights is None else _check_edge_matrix(edge_weights)
    b = shared_vertex_term(a)
    pi_u = min(1.0, max(float(pi_min), float(budget) / float(c.sum())))
    return (a.sum(axis=1) / pi_u + b) / c


def fit_to_budget(x, cost_hat, budget, pi_min: float) -> np.ndarray:
    """Shift ``x = -log(pi)`` by one constant (inside the box ``[0, -log pi_min]``) so the expected cost
    ``sum_i c_i e^{-x_i}`` equals ``budget`` (or comes as close as the box allows). Bisection; used to make a warm
    start feasible and on the budget surface, where the optimum of Eq. 10-11 lies."""
    x = _vector("x", x)
    c = _vector("cost_hat", cost_hat)
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
        c = _vector("cost_hat", cost_hat)
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
            x = np.sort(_vector("x", x))
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


# ----------------------------------------------------------------------------------------------------------------
# Section 4.5 and Appendix B: induced-edge correction
# ----------------------------------------------------------------------------------------------------------------
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
    pi = _probabilities("inclusion", inclusion)
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
    pi = _probabilities("inclusion", inclusion).copy()
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
    pi = _probabilities("inclusion", inclusion)
    sel = rng.random(pi.shape[0]) < pi
    if anchor is not None:
        pi_c, _ = anchor_pair_joint_inclusion(pi, anchor)
        sel |= pi_c == 1.0
    return sel


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
    r = _vector("rewards", rewards, allow_nan=True)
    sel = _selected(selected, r.shape[0])
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
    pi = _probabilities("inclusion", inclusion)
    G = pi.shape[0]
    if G < 2:
        raise ValueError("a candidate group needs G >= 2 vertices to have pairs.")
    r = _vector("rewards", rewards, allow_nan=True)
    if r.shape[0] != G:
        raise ValueError(f"`rewards` has {r.shape[0]} entries but `inclusion` has G = {G}.")
    sel_all = _selected(selected, G)
    sel, n_unscorable = scorable_selection(r, sel_all)
    rho = independent_joint_inclusion(pi) if joint is None else _joint(joint, pi)
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
    a = _vector("advantages", advantages)
    r = _vector("rewards", rewards, allow_nan=True)
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
    w = _f64(weights).ravel()
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("`weights` must be finite and nonnegative.")
    sq = float((w**2).sum())
    return float(w.sum() ** 2 / sq) if sq > 0 else 0.0


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
    pi = _probabilities("inclusion", inclusion, G)
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


# ----------------------------------------------------------------------------------------------------------------
# registry entry (ragged groups)
# ----------------------------------------------------------------------------------------------------------------
@register_advantage_estimator("pair")
def pair_group_advantages(rewards, group_ids, selected, inclusion, w_max=None, self_normalize=False) -> AdvantageResult:
    """Eq. 13 PAIR advantages for a flat batch of ragged candidate groups (registry name ``"pair"``).

    Each group is the *full* candidate group (all G prefixes, continued or not), so that M = G(G-1)/2 is the
    complete-pair normalizer. Independent Bernoulli continuation within each group.

    Parameters
    ----------
    rewards : array_like, shape (N,)
        Rewards; unselected rows are ignored (NaN allowed there).
    group_ids : array_like, shape (N,)
    selected : array_like of bool, shape (N,)
    inclusion : array_like, shape (N,)
        Logged marginal continuation probabilities in (0, 1].
    w_max, self_normalize : see :func:`pair_advantages` (biased variants).

    Returns
    -------
    AdvantageResult
        ``advantages`` is 0 for unselected rows. ``baselines`` is NaN (PAIR has no per-rollout baseline) and
        ``scale`` is 1. A *selected* row with a NaN reward (unscorable completion) follows PAIR's one NaN rule
        (:func:`scorable_selection`): it observes no edge, gets advantage 0 and is counted in ``n_nan``; the other
        rows keep their logged weights. Groups with a single candidate get advantage 0 (``n_degenerate``).
        ``extras`` carries per-group ``n_edges``, ``ess``, ``max_weight`` and ``biased``.
    """
    r = as_float_array(rewards, "rewards", ndim=1)
    n = r.shape[0]
    codes, uniq = factorize_groups(group_ids, n)
    sel = to_numpy(selected)
    if sel.shape != (n,):
        raise ValueError(f"`selected` must have shape ({n},), got {sel.shape}.")
    sel = _selected(sel, n)
    pi = _probabilities("inclusion", inclusion, n)
    sel_ok, n_nan = scorable_selection(r, sel)
    adv = np.zeros(n)
    n_deg = 0
    extras = {"n_edges": [], "ess": [], "max_weight": [], "biased": self_normalize or w_max is not None}
    for g in range(uniq.shape[0]):
        idx = np.flatnonzero(codes == g)
        if idx.size < 2:
            n_deg += int(idx.size)
            extras["n_edges"].append(0)
            extras["ess"].append(0.0)
            extras["max_weight"].append(0.0)
            continue
        res = pair_advantages(r[idx], sel[idx], pi[idx], w_max=w_max, self_normalize=self_normalize)
        adv[idx] = res.advantages
        extras["n_edges"].append(res.n_edges)
        extras["ess"].append(res.ess)
        extras["max_weight"].append(res.max_weight)
    n_zero_std = 0
    for g in range(uniq.shape[0]):
        rr = r[(codes == g) & sel_ok]
        if rr.size >= 1 and np.all(rr == rr[0]):
            n_zero_std += 1
    extras["n_unselected"] = int((~sel).sum())
    return AdvantageResult(
        advantages=adv,
        baselines=np.full(n, np.nan),
        scale=np.ones(n),
        n_nan=n_nan,
        n_groups=int(uniq.shape[0]),
        n_zero_std_groups=n_zero_std,
        n_degenerate=n_deg,
        extras=extras,
    )

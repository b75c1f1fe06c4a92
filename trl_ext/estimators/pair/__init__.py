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

Layout (one module per part of the paper; every name, private helpers included, is importable from here):

- :mod:`.kernel` -- Section 3: pair kernel :math:`h_{ij}` (Eq. 3), complete pair average (Eq. 4), leave-one-out
  estimator (Eq. 2).
- :mod:`.graph` -- Sections 4.3-4.4: edge proxies (Eq. 8-9) and the shared-vertex term :math:`b_i`.
- :mod:`.design` -- Sections 4.3-4.4, Appendix C: the convex design program (Eq. 10-11) and its SLSQP solver.
- :mod:`.warm_start` -- Appendix C: warm start of the solver from the previous step.
- :mod:`.inclusion` -- Section 4.5, Appendix B: joint inclusion probabilities, anchor pair, the continuation draw.
- :mod:`.advantages` -- Eq. 12-13 advantages, the NaN rule, the fixed loss normalizer, the standardization option.
- :mod:`.group_draw` -- Algorithm 1 for one candidate group: design and draw (warm-up, fallbacks, anchor pair),
  the anchor's marginal inclusion, Eq. 13 advantages of a logged draw, a simulated draw.
- :mod:`.variance` -- Proposition 1 design covariance and the effective sample size (Appendix D.3).
- :mod:`.registry` -- the ``"pair"`` (ragged full groups) and ``"pair_draw"`` (completed vertices of designed
  draws, what PAIRTrainer trains on) advantage-estimator registry entries.
"""

from __future__ import annotations

from .._validation import as_float_array, factorize_groups, to_numpy  # noqa: F401 - importable here before the split
from ..baselines import AdvantageResult, register_advantage_estimator  # noqa: F401 - importable here before the split
from .advantages import (
    PairAdvantages,
    fixed_normalizer,
    pair_advantages,
    scorable_selection,
    standardize_pair_advantages,
)
from .design import (  # noqa: F401 - `run_slsqp` is the patch point of the solver-failure tests
    PairDesign,
    pair_design,
    run_slsqp,
    uniform_design,
)
from .graph import edge_proxies, shared_vertex_term
from .group_draw import (
    GroupDraw,
    anchor_marginal_inclusion,
    design_and_draw,
    draw_advantages,
    simulate_draw,
)
from .inclusion import anchor_pair_joint_inclusion, draw_selection, independent_joint_inclusion
from .kernel import complete_pair_average, loo_score_gradient, pair_kernel
from .registry import pair_draw_group_advantages, pair_group_advantages
from .variance import design_covariance, effective_sample_size
from .warm_start import DesignWarmStart, design_priority, fit_to_budget

__all__ = [
    "PairAdvantages",
    "DesignWarmStart",
    "GroupDraw",
    "PairDesign",
    "anchor_marginal_inclusion",
    "anchor_pair_joint_inclusion",
    "complete_pair_average",
    "design_and_draw",
    "design_covariance",
    "design_priority",
    "draw_advantages",
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
    "pair_draw_group_advantages",
    "pair_kernel",
    "scorable_selection",
    "shared_vertex_term",
    "simulate_draw",
    "standardize_pair_advantages",
    "uniform_design",
]

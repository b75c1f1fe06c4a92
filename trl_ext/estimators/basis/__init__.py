"""BASIS: batchwise single-rollout baselines, offline V_beta value tables and per-step beta calibration.

Source: Gong et al., "BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM
Reasoning" (May 2026). Section and equation numbers below refer to that paper.

Pipeline per training step (Section 4, Algorithm 3):

1. **Offline value table** (Section 4 "Offline value estimation", Proposition 2, Appendix 10): from ``n`` reference
   rollouts per prompt, the KL-tilted value ``V_beta(x) = E_ref[r exp(r/beta)] / E_ref[exp(r/beta)]`` on a fixed
   grid of ``beta`` (:func:`default_beta_grid`, :func:`v_beta`, :func:`v_beta_table`, :func:`v_beta_from_samples`).
2. **Batchwise refinement** (Eq. 2, Proposition 1, Appendix 8 Eq. 4-6): each prompt's baseline is a weighted
   average of the *other* prompts' single rewards, restricted to the active set ``eps < V < 1 - eps``
   (:func:`batchwise_baseline`).
3. **Online calibration** (Eq. 3): choose ``beta_t`` on the grid (:func:`calibrate_beta`). The default objective
   is a robust variant of Eq. 3 (see :func:`calibrate_beta` and ``docs/estimators_basis.md``).
4. **Advantage** ``A_i = r_i - b_i`` (Section 4, after Eq. 3; :func:`basis_advantages`), on the reward's own scale
   when the value table's ``reward_range`` is not [0, 1] (:func:`rewards_to_unit`). The opt-in batch std scaling
   of the registry entry (which the BASIS trainer uses) is :func:`std_scale_advantages` (not in the paper).

All functions are pure numpy/scipy and vectorized; nothing here imports TRL.

Layout (the public names are importable from here):

- :mod:`.values` -- step 1: the beta grid and the offline ``V_beta`` values (Proposition 2, Appendix 10).
- :mod:`.refinement` -- step 2: the batchwise leave-one-out baseline (Eq. 2, Eq. 4-6) and its fallbacks.
- :mod:`.grid` -- the vectorized hot loop of step 3: both calibration objectives on the whole grid.
- :mod:`.calibration` -- step 3: beta selection (Eq. 3).
- :mod:`.advantages` -- step 4: ``A_i = r_i - b_i``, the reward-range map and the opt-in batch std scaling.
- :mod:`.registry` -- the ``"basis"`` advantage-estimator registry entry.
- :mod:`._checks` -- input checks and the accepted option names.
"""

from __future__ import annotations

from .._validation import to_numpy  # noqa: F401 - importable here before the split
from ._checks import BASIS_VARIANTS
from .advantages import (
    RANGE_TOL,
    baseline_on_reward_scale,
    basis_advantages,
    check_reward_range,
    rewards_to_unit,
    std_scale_advantages,
)
from .calibration import CalibrationResult, calibrate_beta
from .options import BASIS_OPTION_DEFAULTS, check_beta_grid, validate_basis_options
from .refinement import BaselineResult, batchwise_baseline
from .registry import basis_registry_advantages  # noqa: F401 - registers "basis" on import
from .values import (
    default_beta_grid,
    v_beta,
    v_beta_from_samples,
    v_beta_table,
)

__all__ = [
    "BASIS_OPTION_DEFAULTS",
    "BASIS_VARIANTS",
    "RANGE_TOL",
    "BaselineResult",
    "CalibrationResult",
    "basis_advantages",
    "baseline_on_reward_scale",
    "batchwise_baseline",
    "calibrate_beta",
    "check_beta_grid",
    "check_reward_range",
    "default_beta_grid",
    "rewards_to_unit",
    "std_scale_advantages",
    "v_beta",
    "v_beta_from_samples",
    "v_beta_table",
    "validate_basis_options",
]

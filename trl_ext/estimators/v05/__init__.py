"""V0.5: empirical shrinkage fusion of a value prior with sparse rollouts, and Sequential OSLA allocation.

Source: "V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts" (arXiv:2603.10848) -- "Empirical
Shrinkage Fusion" (Theorems 3.2-3.4, Eq. 6-9), "Sequential OSLA Allocation" (Eq. 11, Theorems 3.5-3.6,
Appendix A.8) and "End-to-End Implementation Workflow" (Section 4.1.3). Rewards live in [-1, 1] (binary {-1, 1} in
the paper); the prior is V = 2p - 1.

For one prompt with k finite rewards r_1..r_k and prior V:

* Eq. 6  sigma2_noise = 1/k                                (bound: any reward in [-1, 1] has variance <= 1)
* Eq. 7  bias2 = max(0, (vbar_k - V)^2 - 1/k)               (= 0 exactly when the prior passes the test)
* Eq. 8  w = bias2 / (bias2 + 1/k)                           (in [0, 1))
* Eq. 9  mu* = w vbar_k + (1 - w) V
* advantage A_i = (r_i - mu*) / sigma*, sigma* = sqrt(1 - mu*^2)  (floored, see :func:`fused_advantages`)
* Theorem 3.4: |E[mu*] - mu_true| <= 1/sqrt(k) for every k, V and reward law on [-1, 1].
* Theorem 3.6: stop at the first k >= k_min with k >= 1/sqrt(c) - 1/bias2; add 2 rollouts otherwise,
  never beyond round(1/sqrt(c)) (= 16 for the paper's c = 0.0039).
* Eq. 10: the surrogate averages (1/k) sum_i over each prompt's k rollouts, so every prompt carries the same total
  weight whatever its k (:func:`equal_prompt_weights`).

The OSLA decision exists once: :func:`osla_need_more` (Theorem 3.6, one prompt) -> :func:`osla_next_counts` (one
round, one prompt) -> :func:`osla_step` (one round of a batch, with the Section 4.1.3 global stop). The simulation
loop :func:`osla_allocate`, the estimator audit and the trainer's rollout strategy
(:class:`trl_ext.trainers.v05.OSLARounds`) all call :func:`osla_step`.

Layout (every name, private helpers included, is importable from here):

- :mod:`.fusion` -- Eq. 6-9 fusion, the fused advantages (and the ``"v05"`` registry entry), ``to_signed_reward``.
- :mod:`.osla` -- Theorem 3.6 and the Section 4.1.3 global stop, one round (:func:`osla_step`) and the loop.
- :mod:`.weights` -- Eq. 10 equal per-prompt weights.
"""

from __future__ import annotations

from .._validation import (  # noqa: F401 - importable here before the split
    as_float_array,
    check_no_nan,
    check_positive_scalar,
    check_range,
    factorize_groups,
    to_numpy,
)
from ..baselines import AdvantageResult, register_advantage_estimator  # noqa: F401 - importable here before the split
from .estimator import v05_advantages, v05_signed_rewards
from .fusion import (
    DEFAULT_SIGMA_FLOOR,
    FusionResult,
    fused_advantages,
    fused_advantages_batch,
    shrinkage_fusion,
    shrinkage_fusion_batch,
    to_signed_reward,
)
from .osla import (  # noqa: F401 - `osla_step` is the patch point tests spy on
    V05_K_INIT,
    V05_PAPER_COST,
    OslaAllocation,
    OslaStep,
    osla_allocate,
    osla_cap,
    osla_extra_budget,
    osla_need_more,
    osla_next_counts,
    osla_round_cost,
    osla_should_stop,
    osla_step,
    osla_target,
    osla_trim_to_budget,
)
from .weights import equal_prompt_weights

__all__ = [
    "FusionResult",
    "shrinkage_fusion",
    "shrinkage_fusion_batch",
    "fused_advantages",
    "fused_advantages_batch",
    "osla_target",
    "osla_cap",
    "osla_need_more",
    "osla_next_counts",
    "osla_should_stop",
    "osla_step",
    "OslaStep",
    "osla_allocate",
    "OslaAllocation",
    "osla_extra_budget",
    "osla_round_cost",
    "osla_trim_to_budget",
    "equal_prompt_weights",
    "to_signed_reward",
    "v05_advantages",
    "v05_signed_rewards",
    "V05_PAPER_COST",
    "V05_K_INIT",
    "DEFAULT_SIGMA_FLOOR",
]

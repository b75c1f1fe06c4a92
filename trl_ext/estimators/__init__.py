"""Framework-free estimators: baselines, value-prior fusion, calibration and designs.

Everything here is pure numpy (or torch where noted) and never imports TRL, so other RL stacks can call it.
Each submodule declares ``__all__``; the public API is re-exported here.

- :mod:`.baselines` -- group mean (GRPO), leave-one-out (RLOO), global batch mean (REINFORCE++) on ragged groups,
  and the advantage-estimator registry.
- :mod:`.v05` -- V0.5 empirical shrinkage fusion and Sequential OSLA ("V0.5: Generalist Value Model as a Prior
  for Sparse RL Rollouts", arXiv:2603.10848).
- :mod:`.basis` -- BASIS V_beta tables, batchwise leave-one-out baselines and beta calibration ("BASIS: Batchwise
  Advantage Estimation from Single-Rollout Information Sharing for LLM Reasoning", May 2026).
- :mod:`.pair` -- PAIR pair kernel, edge proxies, convex continuation design and inverse pair-inclusion
  advantages ("PAIR: Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR", Voss, Hale and
  Reyes, arXiv:2608.11368).
- :mod:`.shrinkage` -- James-Stein shrinkage baseline ("Shrinking the Variance: Shrinkage Baselines for RLVR",
  arXiv:2511.03710).
- :mod:`.tiebreak` -- checker + epsilon x within-class rank blends ("Measurement Discipline for RLVR").
"""

from . import baselines, basis, pair, shrinkage, tiebreak, v05  # noqa: E402
from .baselines import *  # noqa: F401,F403
from .basis import *  # noqa: F401,F403
from .pair import *  # noqa: F401,F403
from .shrinkage import *  # noqa: F401,F403
from .tiebreak import *  # noqa: F401,F403
from .v05 import *  # noqa: F401,F403

__all__ = [*baselines.__all__, *basis.__all__, *pair.__all__, *shrinkage.__all__, *tiebreak.__all__, *v05.__all__]

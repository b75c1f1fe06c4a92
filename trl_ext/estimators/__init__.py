"""Framework-free estimators: baselines, value-prior fusion, calibration and designs.

Everything here is pure numpy (or torch where noted) and never imports TRL, so other RL stacks can call it.
Each submodule declares ``__all__``; the public API is re-exported here.

- :mod:`.baselines` -- group mean (GRPO), leave-one-out (RLOO), global batch mean (REINFORCE++) on ragged groups,
  and the advantage-estimator registry.
- :mod:`.v05` -- V0.5 empirical shrinkage fusion and Sequential OSLA (``v05_value_prior_osla.txt``).
- :mod:`.basis` -- BASIS V_beta tables, batchwise leave-one-out baselines and beta calibration
  (``basis_batchwise_single_rollout.txt``).
- :mod:`.pair` -- PAIR pair kernel, edge proxies, convex continuation design and inverse pair-inclusion
  advantages (``pair_prefix_inclusion_reweighting.txt``).
- :mod:`.tiebreak` -- checker + epsilon x within-class rank blends (``rlvr_measurement_discipline.txt``).
"""

from . import baselines, basis, pair, tiebreak, v05  # noqa: E402
from .baselines import *  # noqa: F401,F403
from .basis import *  # noqa: F401,F403
from .pair import *  # noqa: F401,F403
from .tiebreak import *  # noqa: F401,F403
from .v05 import *  # noqa: F401,F403

__all__ = [*baselines.__all__, *basis.__all__, *pair.__all__, *tiebreak.__all__, *v05.__all__]

"""V0.5 ("V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts", arXiv:2603.10848) on the base trainer.

One module per part (the math is :mod:`trl_ext.estimators.v05`, the registered estimator ``"v05"``):

* :mod:`.config` -- :class:`V05GRPOConfig` (every ``v05_*`` option, with help) and :data:`V05Options` (the same
  options typed, without the prefix: what the strategy reads, from the config or ``rollout_strategy_kwargs``);
* :mod:`.strategy` -- :class:`OSLARounds`, the registered rollout strategy ``"v05_osla"`` (prior query, ``k_init``
  rollouts, Sequential OSLA rounds, the support buffer);
* :mod:`.prior` -- the value prior the config describes (the default embedding prior's frozen backbone);
* :mod:`.trainer` -- :class:`V05GRPOTrainer`, the drop-in preset, and its model card.
"""

from .config import (
    V05_PROMPT_WEIGHTINGS,
    V05_SUPPORTED_LOSS_TYPES,
    V05GRPOConfig,
    V05Options,
    validate_v05_options,
)
from .strategy import OSLARounds
from .trainer import V05GRPOTrainer, v05_model_card_details

__all__ = ["V05GRPOConfig", "V05GRPOTrainer", "OSLARounds", "V05_SUPPORTED_LOSS_TYPES", "V05_PROMPT_WEIGHTINGS",
           "V05Options", "v05_model_card_details", "validate_v05_options"]

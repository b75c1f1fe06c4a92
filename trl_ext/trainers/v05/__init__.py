"""V0.5 ("V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts", arXiv:2603.10848) on the base trainer.

One module per part (the math is :mod:`trl_ext.estimators.v05`, the registered estimator ``"v05"``):

* :mod:`.config` -- :class:`V05GRPOConfig` (every ``v05_*`` option, with help) and :func:`v05_config_view` (the
  options given as ``rollout_strategy_kwargs`` to ``trl_ext.GRPOTrainer``);
* :mod:`.strategy` -- :class:`OSLARounds`, the registered rollout strategy ``"v05_osla"`` (prior query, ``k_init``
  rollouts, Sequential OSLA rounds, the support buffer);
* :mod:`.prior` -- the value prior the config describes (the default embedding prior's frozen backbone);
* :mod:`.trainer` -- :class:`V05GRPOTrainer`, the drop-in preset, and its model card.
"""

from .config import (
    V05_PROMPT_WEIGHTINGS,
    V05_SUPPORTED_LOSS_TYPES,
    V05GRPOConfig,
    v05_config_view,
    validate_v05_config,
)
from .strategy import OSLARounds
from .trainer import V05GRPOTrainer, v05_model_card_details

__all__ = ["V05GRPOConfig", "V05GRPOTrainer", "OSLARounds", "V05_SUPPORTED_LOSS_TYPES", "V05_PROMPT_WEIGHTINGS",
           "v05_config_view", "v05_model_card_details", "validate_v05_config"]

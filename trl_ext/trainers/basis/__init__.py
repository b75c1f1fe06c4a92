"""BASIS ("BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM Reasoning") on the
base trainer.

One module per part (the math is :mod:`trl_ext.estimators.basis`, the registered estimator ``"basis"``):

* :mod:`.config` -- :class:`BASISConfig` (every ``basis_*`` option, with help), its validation and
  :data:`BASISOptions` (the same options typed, without the prefix: what the strategy reads);
* :mod:`.strategy` -- :class:`ValueTableLookup`, the registered rollout strategy ``"value_table"`` (each row's
  offline value ``p_hat``, the beta history, the ``basis/*`` metrics);
* :mod:`.trainer` -- :class:`BASISTrainer`, the drop-in preset, and its model card.

The table's loading and its checks against the training setup are :mod:`trl_ext.priors.table_checks`.
"""

from ...priors.table_checks import common_reward_range, resolve_value_table
from .config import BASISConfig, BASISOptions
from .strategy import BASIS_METRICS, ValueTableLookup
from .trainer import BASIS_PAPER, BASISTrainer, basis_model_card_details, card_table_source, file_sha256

__all__ = ["BASISConfig", "BASISOptions", "BASISTrainer", "BASIS_METRICS", "BASIS_PAPER", "ValueTableLookup",
           "basis_model_card_details",
           "card_table_source", "common_reward_range", "file_sha256", "resolve_value_table"]

"""PAIR ("Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR", arXiv:2608.11368) on the
base trainer.

One module per part (the math is :mod:`trl_ext.estimators.pair` and :mod:`trl_ext.estimators.pair_heads`, the
registered estimator ``"pair_draw"``):

* :mod:`.config` -- :class:`PAIRConfig` (every ``pair_*`` option, with help), its validation and
  :data:`PAIROptions` (the same options typed, without the prefix: what the strategy reads, from the config or
  ``rollout_strategy_kwargs``);
* :mod:`.strategy` -- :class:`PrefixProbeRollouts`, the registered rollout strategy ``"pair_prefix_probe"`` (probe,
  heads, design, draw, continuation);
* :mod:`.heads` -- :class:`DesignHeads` (the prefix heads as the strategy uses them), the prefix features and the
  snap delimiters;
* :mod:`.diagnostics` -- the ``pair/*`` metrics;
* :mod:`.trainer` -- :class:`PAIRTrainer`, the drop-in preset (learning-rate scaling, model card).
"""

from ...estimators.pair import GroupDraw
from .config import (
    PAIR_LR_SCALINGS,
    SHORT_PROBE_TOKENS,
    PAIRConfig,
    PAIROptions,
    PAIRShortProbeWarning,
    pair_lr_factor,
    short_probe_message,
    validate_pair_options,
)
from .heads import DesignHeads, prefix_features
from .strategy import PrefixProbeRollouts
from .trainer import PAIR_PAPER, PAIRTrainer, pair_model_card_details

__all__ = ["PAIRConfig", "PAIRTrainer", "GroupDraw", "PrefixProbeRollouts", "DesignHeads", "validate_pair_options",
           "PAIRShortProbeWarning", "short_probe_message", "PAIR_PAPER", "SHORT_PROBE_TOKENS", "PAIR_LR_SCALINGS",
           "PAIROptions", "pair_lr_factor", "pair_model_card_details", "prefix_features"]

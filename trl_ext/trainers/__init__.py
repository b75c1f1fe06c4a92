"""TRL-backed trainers: the only subpackage that imports TRL internals.

:mod:`.base` holds ``GRPOTrainer`` / ``ExtGRPOConfig`` (the shared base of every trl_ext trainer) and
:mod:`.batch` the ``RolloutBatch`` handed to ``compute_advantages``. TRL-version-specific glue lives in
:mod:`._trl_compat`. Names are imported lazily so ``import trl_ext.trainers`` stays cheap.
"""

from .._lazy import lazy_exports

_LAZY = {
    "GRPOTrainer": "base",
    "ExtGRPOConfig": "config",
    "trl_grpo_advantages": "base",
    "EXT_STATE_FILE": "state",
    "RolloutBatch": "batch",
    "BASISTrainer": "basis",
    "BASISConfig": "basis",
    "V05GRPOTrainer": "v05",
    "V05GRPOConfig": "v05",
    "PAIRTrainer": "pair",
    "PAIRConfig": "pair",
}

__all__ = list(_LAZY)
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

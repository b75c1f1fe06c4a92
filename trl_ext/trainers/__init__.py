"""TRL-backed trainers: the only subpackage that imports TRL internals.

:mod:`.base` holds ``GRPOTrainer`` / ``ExtGRPOConfig`` (the shared base of every trl_ext trainer) and
:mod:`.batch` the ``RolloutBatch`` handed to ``compute_advantages``. TRL-version-specific glue lives in
:mod:`._trl_compat`. Names are imported lazily so ``import trl_ext.trainers`` stays cheap.
"""

from importlib import import_module

_LAZY = {
    "GRPOTrainer": "trl_ext.trainers.base",
    "ExtGRPOConfig": "trl_ext.trainers.config",
    "trl_grpo_advantages": "trl_ext.trainers.base",
    "EXT_STATE_FILE": "trl_ext.trainers.state",
    "RolloutBatch": "trl_ext.trainers.batch",
    "BASISTrainer": "trl_ext.trainers.basis",
    "BASISConfig": "trl_ext.trainers.basis",
    "V05GRPOTrainer": "trl_ext.trainers.v05",
    "V05GRPOConfig": "trl_ext.trainers.v05",
    "PAIRTrainer": "trl_ext.trainers.pair",
    "PAIRConfig": "trl_ext.trainers.pair",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_ext.trainers' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)

"""trl_ext: rollout-efficient RLVR trainers and measurement tools for TRL.

Layout (see ``docs/architecture.md``):

- :mod:`trl_ext.estimators` -- pure numpy/torch math (baselines, fusion, calibration, designs); no TRL import.
- :mod:`trl_ext.stats` -- comparison statistics (detection floors, two-part rule); no TRL import.
- :mod:`trl_ext.priors` -- value priors (table, callable, in-context) and the support buffer.
- :mod:`trl_ext.measurement` -- shut-gate, noise floor, keyed replayable sampling.
- :mod:`trl_ext.trainers` -- thin subclasses of TRL's ``GRPOTrainer`` (the only place that imports TRL internals).
- :mod:`trl_ext.testbed` -- the offline tiny-model RLVR testbed.

Trainer classes are imported lazily so that ``import trl_ext.estimators`` stays cheap and TRL-free.
"""

from importlib import import_module

__version__ = "0.1.0"

_LAZY = {
    "GRPOTrainer": "trl_ext.trainers.base",
    "ExtGRPOConfig": "trl_ext.trainers.base",
    "V05GRPOTrainer": "trl_ext.trainers.v05",
    "V05GRPOConfig": "trl_ext.trainers.v05",
    "BASISTrainer": "trl_ext.trainers.basis",
    "BASISConfig": "trl_ext.trainers.basis",
    "PAIRTrainer": "trl_ext.trainers.pair",
    "PAIRConfig": "trl_ext.trainers.pair",
    "DropInDifferenceWarning": "trl_ext.trainers.base",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_ext' has no attribute {name!r}")

"""trl_ext: rollout-efficient RLVR trainers and measurement tools for TRL.

Layout (see ``docs/architecture.md``):

- :mod:`trl_ext.estimators` -- pure numpy/torch math (baselines, fusion, calibration, designs); no TRL import.
- :mod:`trl_ext.stats` -- comparison statistics (detection floors, two-part rule); no TRL import.
- :mod:`trl_ext.priors` -- value priors (table, callable, in-context) and the support buffer.
- :mod:`trl_ext.measurement` -- shut-gate, noise floor, keyed replayable sampling.
- :mod:`trl_ext.generation` -- generation back-ends: keyed replayable sampling, vLLM colocate weight sync.
- :mod:`trl_ext.trainers` -- thin subclasses of TRL's ``GRPOTrainer`` (the only place that imports TRL internals).
- :mod:`trl_ext.testbed` -- the offline tiny-model RLVR testbed.

Trainer classes are imported lazily so that ``import trl_ext.estimators`` stays cheap and TRL-free.
"""

from ._lazy import lazy_exports

__version__ = "0.3.0"

_LAZY = {
    "GRPOTrainer": "trainers.base",
    "ExtGRPOConfig": "trainers.base",
    "V05GRPOTrainer": "trainers.v05",
    "V05GRPOConfig": "trainers.v05",
    "BASISTrainer": "trainers.basis",
    "BASISConfig": "trainers.basis",
    "PAIRTrainer": "trainers.pair",
    "PAIRConfig": "trainers.pair",
    "DropInDifferenceWarning": "trainers.base",
}

__all__ = ["__version__", *_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, cache=False)

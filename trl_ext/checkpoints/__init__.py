"""Checkpoints that never lie: the configuration fingerprint each checkpoint records and its check on resume,
checkpoint validity before a checkpoint is chosen, atomic writes with disk-full errors, and the SIGTERM / SIGINT
handler that saves before a preemption (:mod:`.resume`, :mod:`.preemption`). Framework-free except the
:class:`~trl_ext.checkpoints.preemption.PreemptionHandler` callback (transformers); no TRL import."""

from .resume import (
    FINGERPRINT_TRL_FIELDS,
    FROZEN_ON_RESUME,
    IDENTITY_FIELDS,
    atomic_torch_save,
    checkpoint_problem,
    config_fingerprint,
    fingerprint_field_names,
    last_valid_checkpoint,
)

__all__ = ["FINGERPRINT_TRL_FIELDS", "FROZEN_ON_RESUME", "IDENTITY_FIELDS", "atomic_torch_save", "checkpoint_problem",
           "config_fingerprint", "fingerprint_field_names", "last_valid_checkpoint"]

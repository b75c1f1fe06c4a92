"""Measurement tools ("Measurement Discipline for RLVR") shared by every trl_ext trainer.

- :mod:`.shut_gate` -- share of tied (zero-signal) groups, all-right / all-wrong, tied-correct share; ``trl-ext gate``.
- :mod:`.noise_floor` -- a scorer's noise floor (alone vs. inside filler batches); ``trl-ext noise-floor``.
- :mod:`.keyed_sampling` -- keyed Gumbel-max sampling: each token's noise hashed from (key, sample index, position).
- :mod:`.replay` -- regenerate logged keyed rollouts and diff two checkpoints on the same keys; ``trl-ext replay``.

Names are imported lazily so that ``import trl_ext.measurement`` does not pull in torch or transformers.
"""

from .._lazy import lazy_exports

_LAZY = {
    "ShutGateStats": "shut_gate",
    "shut_gate_stats": "shut_gate",
    "tied_group_mask": "shut_gate",
    "measure_gate": "gate_cli",
    "measure_noise_floor": "noise_floor",
    "NoiseFloorResult": "noise_floor",
    "KeyedGumbelLogitsProcessor": "keyed_sampling",
    "SamplerSettings": "keyed_sampling",
    "keyed_generate": "keyed_sampling",
    "request_key": "keyed_sampling",
    "regenerate": "replay",
    "regenerate_batch": "replay",
    "diff_checkpoints": "replay",
    "load_rollout_log": "replay",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, cache=False)

"""Checkpointed trl_ext state: the file name and its format version (checkpoint validity, the configuration
fingerprint and preemption live in :mod:`trl_ext.checkpoints`)."""

from __future__ import annotations

__all__ = ["EXT_STATE_FILE", "EXT_STATE_VERSION"]

EXT_STATE_FILE = "trl_ext_state.pt"
"""File name of the trl_ext state inside each ``checkpoint-*`` directory."""

EXT_STATE_VERSION = 1
"""Format version of that file (a checkpoint with another version is refused with a clear error)."""


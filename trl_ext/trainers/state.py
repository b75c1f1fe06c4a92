"""Checkpointed trl_ext state: the file name, its format version, and finding the newest complete checkpoint."""

from __future__ import annotations

from . import _trl_compat as compat

__all__ = ["EXT_STATE_FILE"]

EXT_STATE_FILE = "trl_ext_state.pt"
"""File name of the trl_ext state inside each ``checkpoint-*`` directory."""

_EXT_STATE_VERSION = 1


def _last_complete_checkpoint(output_dir: str) -> str:
    """The newest ``checkpoint-N`` folder of ``output_dir`` whose files all parse
    (:func:`trl_ext.trainers.resume.last_valid_checkpoint`); newer unusable folders are reported and skipped."""
    from .resume import last_valid_checkpoint

    return last_valid_checkpoint(output_dir, compat.checkpoint_prefix())

"""Checkpointed trl_ext state: the file name, its format version, and finding the newest complete checkpoint."""

from __future__ import annotations

import os
import warnings

from . import _trl_compat as compat

__all__ = ["EXT_STATE_FILE"]

EXT_STATE_FILE = "trl_ext_state.pt"
"""File name of the trl_ext state inside each ``checkpoint-*`` directory."""

_EXT_STATE_VERSION = 1


def _last_complete_checkpoint(output_dir: str) -> str:
    """The newest ``checkpoint-N`` folder of ``output_dir`` that holds ``trainer_state.json`` (written last by
    Trainer's save); newer incomplete folders are reported and skipped."""
    import re

    prefix = compat.checkpoint_prefix()
    pattern = re.compile(rf"^{prefix}-(\d+)$")
    found = []
    if os.path.isdir(output_dir):
        for name in os.listdir(output_dir):
            m = pattern.match(name)
            if m and os.path.isdir(os.path.join(output_dir, name)):
                found.append((int(m.group(1)), os.path.join(output_dir, name)))
    skipped = []
    for _, path in sorted(found, reverse=True):
        if os.path.exists(os.path.join(path, "trainer_state.json")):
            if skipped:
                warnings.warn(f"Skipping incomplete checkpoint folder(s) {skipped} (no trainer_state.json: a save was "
                              f"interrupted); resuming from {path}. Delete them to silence this warning.", stacklevel=3)
            return path
        skipped.append(path)
    raise ValueError(f"No complete checkpoint (a {prefix}-N folder with trainer_state.json) found in {output_dir}"
                     + (f"; incomplete: {skipped}" if skipped else "") + ".")

"""Small file helpers shared by the examples, benchmarks and CLI."""

from __future__ import annotations

import json
import os

__all__ = ["write_json"]


def write_json(path: str, obj) -> str:
    """Write ``obj`` as indented JSON atomically (tmp file then rename); returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)
    return path

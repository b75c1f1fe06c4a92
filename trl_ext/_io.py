"""Small file helpers shared by the examples, benchmarks and CLI."""

from __future__ import annotations

import hashlib
import json
import os

__all__ = ["write_json", "sha256_file", "read_cache_meta"]


def sha256_file(path: str) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_cache_meta(path: str, marker: str, meta_name: str) -> tuple[dict | None, str | None]:
    """The metadata of a cache directory built in place and marked complete last (the testbed warm models, the real
    model): ``(meta, None)``, or ``(None, reason)`` when the directory is missing, lacks the ``marker`` file (an
    interrupted build) or its ``meta_name`` JSON is unreadable or not an object."""
    if not os.path.isdir(path):
        return None, "missing"
    if not os.path.isfile(os.path.join(path, marker)):
        return None, f"no {marker} marker (an interrupted build)"
    try:
        with open(os.path.join(path, meta_name), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        return None, f"unreadable {meta_name} ({e})"
    if not isinstance(meta, dict):
        return None, f"{meta_name} is not a JSON object"
    return meta, None


def write_json(path: str, obj) -> str:
    """Write ``obj`` as indented JSON atomically (tmp file then rename); returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)
    return path

"""Small file helpers shared by the examples, benchmarks and CLI."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os

__all__ = ["write_json", "sha256_file", "read_cache_meta", "resolve_jsonl", "open_text", "write_text_atomic",
           "write_json_compact", "read_json", "read_jsonl", "json_safe"]


def resolve_jsonl(path: str | os.PathLike) -> str:
    """The file to read for a JSON Lines ``path``: ``path`` itself when it exists; otherwise, for a ``X.jsonl`` path,
    ``X.jsonl.gz`` when that exists (results stored compressed keep working under their ``.jsonl`` name); otherwise
    ``path`` unchanged, so the caller reports it as missing."""
    path = os.fspath(path)
    if not os.path.exists(path) and path.endswith(".jsonl") and os.path.isfile(path + ".gz"):
        return path + ".gz"
    return path


def open_text(path: str | os.PathLike):
    """Open ``path`` for reading UTF-8 text, gunzipping it when its name ends with ``.gz``."""
    path = os.fspath(path)
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_jsonl(path: str | os.PathLike, *, error: type[Exception] = ValueError, objects: bool = True,
               numbered: bool = False) -> list:
    """The records of a JSON Lines file, read strictly: the one JSONL reader of the package.

    A ``.gz`` name is gunzipped, and a missing ``X.jsonl`` whose ``X.jsonl.gz`` exists is read from the latter
    (:func:`resolve_jsonl`). Blank (whitespace-only) lines are skipped; every other line must hold one JSON value,
    a JSON object when ``objects`` is true. Lines are split on ``\n`` (``\r\n`` and ``\r`` included), never on the
    other Unicode line breaks a JSON string may contain. An empty file gives ``[]``: whether that is an error is the
    caller's call (it knows what the records are).

    Parameters
    ----------
    path : str or PathLike
    error : exception class, default ValueError
        Raised, with a message naming the file (and the 1-based line), for a line that is not valid JSON, a line
        that is not an object (with ``objects``), a file that is not UTF-8 text, or one that cannot be read (a
        corrupt or truncated ``.gz``).
    objects : bool, default True
        Require every record to be a JSON object.
    numbered : bool, default False
        Return ``(line number, record)`` pairs (for callers whose own checks name the line).

    Raises
    ------
    FileNotFoundError
        If neither ``path`` nor its ``.gz`` twin exists.
    """
    path = resolve_jsonl(path)
    try:
        with open_text(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc})") from None
    except (OSError, EOFError) as exc:  # e.g. a truncated or non-gzip .gz file
        raise error(f"{path}: unreadable ({exc})") from None
    out: list = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if objects and not isinstance(rec, dict):
            raise error(f"{path}:{lineno}: each line must be a JSON object; got {type(rec).__name__}")
        out.append((lineno, rec) if numbered else rec)
    return out


def write_text_atomic(path: str | os.PathLike, text: str) -> str:
    """Write ``text`` as UTF-8 to ``path`` atomically (tmp file then rename); gzip-compressed when the name ends with
    ``.gz`` (level 9, no file name or time stamp in the header, so equal text gives equal bytes). Returns ``path``."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    data = text.encode("utf-8")
    if path.endswith(".gz"):
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buf, mtime=0) as gz:
            gz.write(data)
        data = buf.getvalue()
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes (a path or ``os.PathLike``), read in 1 MiB blocks.

    The one file-hash helper of the package (``trl_ext.trainers.basis.file_sha256`` is this function)."""
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


def write_json_compact(path: str | os.PathLike, obj) -> str:
    """Write ``obj`` as compact JSON (sorted keys, no spaces) atomically; gzip-compressed and deterministic when the
    name ends with ``.gz`` (see :func:`write_text_atomic`: equal objects give equal bytes). Returns ``path``."""
    return write_text_atomic(path, json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str))


def read_json(path: str | os.PathLike, *, error: type[Exception] = ValueError):
    """The JSON document in ``path``, gunzipped when its name ends with ``.gz``.

    Raises ``error`` naming the file, the line and column and what to do for a file that is not valid JSON (a run
    record cut short, a hand edit), or not UTF-8 text; ``FileNotFoundError`` when it does not exist."""
    try:
        with open_text(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise error(f"{os.fspath(path)}: not valid JSON at line {e.lineno}, column {e.colno} ({e.msg}); the file is "
                    "truncated or was edited by hand: regenerate it with the command that wrote it.") from None
    except (UnicodeDecodeError, EOFError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise error(f"{os.fspath(path)}: cannot be read as JSON text ({type(e).__name__}: {e}).") from None


def json_safe(obj, *, infinity=None):
    """``obj`` as strict JSON can hold it: dict keys as strings, tuples and numpy arrays as lists, numpy scalars as
    Python numbers, NaN as ``None`` and +-inf as ``infinity`` (``None`` by default; a callable gets the value, e.g.
    to write ``"inf"`` / ``"-inf"``). ``json.dump`` would otherwise write the non-JSON ``NaN`` / ``Infinity``."""
    import math

    if isinstance(obj, dict):
        return {str(k): json_safe(v, infinity=infinity) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v, infinity=infinity) for v in obj]
    if hasattr(obj, "tolist") and type(obj).__module__ == "numpy":  # arrays and numpy scalars, without importing numpy
        return json_safe(obj.tolist(), infinity=infinity)
    if isinstance(obj, float) and not math.isfinite(obj):
        if math.isnan(obj):
            return None
        return infinity(obj) if callable(infinity) else infinity
    return obj

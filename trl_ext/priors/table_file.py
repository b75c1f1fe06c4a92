"""Reading and writing value-table files (layout and integrity record: :mod:`trl_ext.priors.table_format`).

:func:`load_value_table` (with its integrity checks), :func:`save_value_table` (a complete table at once) and
:class:`ValueTableWriter` (appends rows one at a time: resumable builds). Every name is importable from
:mod:`trl_ext.priors.table_format`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import warnings
from collections.abc import Mapping
from typing import Any

from .table_rows import (
    REBUILD_HINT,
    STATUS_COMPLETE,
    STATUS_IN_PROGRESS,
    TABLE_FORMAT,
    TABLE_VERSION,
    ValueTable,
    ValueTableRow,
    canonical_line,
    rows_content_hash,
)

__all__ = ["load_value_table", "save_value_table", "ValueTableWriter"]


def _header(metadata: Mapping[str, Any], integrity: Mapping[str, Any] | None = None) -> dict:
    md = dict(metadata)
    md.setdefault("created", _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    h: dict[str, Any] = {"format": TABLE_FORMAT, "version": TABLE_VERSION, "metadata": md}
    if integrity is not None:
        h["integrity"] = dict(integrity)
    return h


def _header_line(header: Mapping[str, Any]) -> str:
    return json.dumps(dict(header), ensure_ascii=False) + "\n"


def _parse_header(line: str, path: str) -> tuple[dict, dict | None]:
    """Header metadata and integrity record (None for a trl_ext 0.1 table without one)."""
    try:
        h = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line 1 is not JSON ({e}); not a trl_ext value table.") from e
    if not isinstance(h, dict) or h.get("format") != TABLE_FORMAT:
        raise ValueError(f"{path}: line 1 is not a value-table header (expected format={TABLE_FORMAT!r}).")
    if h.get("version") != TABLE_VERSION:
        raise ValueError(f"{path}: value-table version {h.get('version')!r} is not supported (expected {TABLE_VERSION}).")
    md = h.get("metadata", {})
    if not isinstance(md, dict):
        raise ValueError(f"{path}: header metadata must be a JSON object.")
    integ = h.get("integrity")
    if integ is None:
        return md, None
    ok = isinstance(integ, dict) and integ.get("status") in (STATUS_COMPLETE, STATUS_IN_PROGRESS)
    if ok and integ["status"] == STATUS_COMPLETE:
        n, sha = integ.get("n_rows"), integ.get("sha256")
        ok = (isinstance(n, int) and not isinstance(n, bool) and n >= 0 and isinstance(sha, str) and len(sha) == 64
              and all(c in "0123456789abcdef" for c in sha))
    if not ok:
        raise ValueError(f"{path}: malformed header integrity record {integ!r} (expected {{'status': 'complete', "
                         "'n_rows': int, 'sha256': hex} or {'status': 'in_progress'}): the header was edited. "
                         "Rebuild the table: re-run `trl-ext build-value-table` with the same arguments and --overwrite.")
    return md, dict(integ)


def _check_integrity(table: ValueTable, integ: dict | None, path: str, *, allow_incomplete: bool,
                     warn_legacy: bool) -> None:
    n = len(table)
    if integ is None:
        if warn_legacy:
            warnings.warn(
                f"{path}: this value table records no row count or content hash (written by trl_ext 0.1), so a table "
                f"cut short or edited cannot be detected ({n} rows read). To check and upgrade it, {REBUILD_HINT}; "
                "a table you saved yourself: save_value_table(path, load_value_table(path)).",
                UserWarning, stacklevel=3,
            )
        return
    if integ["status"] == STATUS_IN_PROGRESS:
        if not allow_incomplete:
            raise ValueError(
                f"{path}: this value table is incomplete: its build has not finished (still running, interrupted, or "
                f"stopped early by --max_prompts / max_prompts=), {n} rows so far. To finish it, {REBUILD_HINT}. "
                "(load_value_table(..., allow_incomplete=True) reads the partial table on purpose.)"
            )
        return
    want = integ["n_rows"]
    if n < want:
        if not allow_incomplete:
            raise ValueError(
                f"{path}: this value table is truncated: its header records {want} rows but the file holds {n} (the "
                f"file was cut, e.g. by an interrupted copy or a full disk). To restore it, {REBUILD_HINT}, or copy "
                "the complete file again."
            )
        return
    if n > want:
        raise ValueError(
            f"{path}: this value table is corrupted: its header records {want} rows but the file holds {n} (rows were "
            "appended after the build finished). Rebuild it: re-run `trl-ext build-value-table` with the same "
            "arguments and --overwrite."
        )
    have = table.content_hash
    if have != integ["sha256"]:
        raise ValueError(
            f"{path}: this value table is corrupted: the SHA-256 of its {n} rows is {have[:16]}... but its header "
            f"records {integ['sha256'][:16]}... (a row was modified after the build finished). Rebuild it: re-run "
            "`trl-ext build-value-table` with the same arguments and --overwrite."
        )


def load_value_table(path: str | os.PathLike, *, allow_truncated_tail: bool = False,
                     allow_incomplete: bool = False) -> ValueTable:
    """Read a value table written by :func:`save_value_table` or :class:`ValueTableWriter`, checking its integrity.

    Parameters
    ----------
    path : str or PathLike
    allow_truncated_tail : bool
        If True, an unparsable *last* line without a trailing newline (an interrupted write) is skipped with a
        ``UserWarning`` and counted in ``table.metadata["n_truncated_lines"]``. Corruption anywhere else is an error.
    allow_incomplete : bool
        If True, load a table whose build has not finished (header ``in_progress``) or that holds fewer rows than
        its header records, instead of refusing it. A complete table whose rows do not match its hash is refused
        either way.

    Returns
    -------
    ValueTable
        With :attr:`ValueTable.integrity` set to the header's integrity record.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        On an empty file, a bad header, an unparsable or invalid row (the message gives the line number), a
        duplicate key; an unfinished or truncated table (unless ``allow_incomplete``); a finished table whose rows
        no longer match its recorded count and SHA-256. The message says what to do (re-run ``trl-ext
        build-value-table`` with the same arguments to resume and finish it, or rebuild an edited one).

    Warns
    -----
    UserWarning
        A table without an integrity record (written by trl_ext 0.1): it loads, unchecked.
    """
    return _load(path, allow_truncated_tail=allow_truncated_tail, allow_incomplete=allow_incomplete,
                 warn_legacy=True)


def _load(path, *, allow_truncated_tail: bool, allow_incomplete: bool, warn_legacy: bool) -> ValueTable:
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        raise ValueError(f"{path}: empty file; not a value table.")
    lines = text.split("\n")
    ends_with_newline = text.endswith("\n")
    if ends_with_newline:
        lines = lines[:-1]
    md, integ = _parse_header(lines[0], path)
    table = ValueTable(metadata=md)
    n_truncated = 0
    for i, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        is_last = i == len(lines)
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            if is_last and not ends_with_newline and allow_truncated_tail:
                warnings.warn(f"{path}: skipping truncated last line {i} (interrupted write).", UserWarning,
                              stacklevel=3)
                n_truncated += 1
                continue
            hint = " (an interrupted write? pass allow_truncated_tail=True to skip it)" if is_last else ""
            raise ValueError(f"{path}: line {i} is not valid JSON{hint}: {e}") from e
        try:
            table.add(ValueTableRow.from_json(d))
        except ValueError as e:
            raise ValueError(f"{path}: line {i}: {e}") from e
    _check_integrity(table, integ, path, allow_incomplete=allow_incomplete, warn_legacy=warn_legacy)
    table.integrity = integ
    table.legacy_format = integ is None
    if n_truncated:
        table.metadata["n_truncated_lines"] = n_truncated
    return table


def save_value_table(path: str | os.PathLike, table: ValueTable) -> None:
    """Write ``table`` to ``path`` (header line, then one row per line), atomically (temp file + rename).

    The header records the table as complete, with its row count and :attr:`ValueTable.content_hash`.
    ``metadata["created"]`` is filled with the current UTC time if absent.

    Raises
    ------
    TypeError
        If ``table`` is not a :class:`ValueTable` or its metadata is not JSON-serializable.
    """
    if not isinstance(table, ValueTable):
        raise TypeError(f"save_value_table expects a ValueTable, got {type(table).__name__}.")
    path = os.fspath(path)
    rows = list(table)
    integrity = {"status": STATUS_COMPLETE, "n_rows": len(rows), "sha256": table.content_hash}
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(_header_line(_header(table.metadata, integrity)))
        for row in rows:
            f.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
    os.replace(tmp, path)


class ValueTableWriter:
    """Append rows to a value table one at a time (resumable builds).

    On open, a new file gets a header marked ``in_progress``. An existing file (``resume=True``) is read: its
    finished keys are in :attr:`done_keys`, its metadata must agree with ``metadata`` on ``model``, ``reward_funcs``
    and ``seed`` (else ``ValueError``), a truncated last line from an interrupted run is cut off (with a
    ``UserWarning``), and a table cut short on a row boundary is resumed. A finished table whose rows no longer match
    its recorded hash is refused (``ValueError``: rebuild it). Writing to a finished (or trl_ext 0.1) table marks it
    ``in_progress`` again first.

    :meth:`close` (and leaving a ``with`` block normally) marks the table complete: the header line is rewritten,
    atomically, with the row count and :attr:`ValueTable.content_hash`. ``close(complete=False)`` -- and leaving a
    ``with`` block by an exception -- leaves an unfinished table ``in_progress``, which :func:`load_value_table`
    refuses until a later writer finishes it.

    Parameters
    ----------
    path : str or PathLike
    metadata : dict
    resume : bool
        If False and the file exists, raise ``FileExistsError``.

    Examples
    --------
    >>> with ValueTableWriter("table.jsonl", {"model": "m", "seed": 0}) as w:  # doctest: +SKIP
    ...     for prompt in prompts:
    ...         if prompt_key(prompt) not in w.done_keys:
    ...             w.write(ValueTableRow.from_rewards(prompt, score(prompt), (0.0, 1.0)))
    """

    def __init__(self, path: str | os.PathLike, metadata: Mapping[str, Any], *, resume: bool = True):
        self.path = os.fspath(path)
        self.done_keys: set[str] = set()
        self._lines: dict[str, str] = {}  # prompt_key -> canonical line, for the content hash
        self._f = None
        self._closed = False
        if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            if not resume:
                raise FileExistsError(f"{self.path} exists; pass resume=True to continue it or remove it.")
            self._repair_tail()
            existing = _load(self.path, allow_truncated_tail=False, allow_incomplete=True, warn_legacy=False)
            for name in ("model", "reward_funcs", "seed"):
                if name in metadata and existing.metadata.get(name) != metadata[name]:
                    raise ValueError(
                        f"{self.path}: cannot resume, the existing table has {name}={existing.metadata.get(name)!r} "
                        f"but this build uses {name}={metadata[name]!r}; use a new path."
                    )
            self.metadata = existing.metadata
            self.done_keys = set(existing.keys())
            self._lines = {r.prompt_key: canonical_line(r) for r in existing}
            self._status = (existing.integrity or {}).get("status")  # None: a trl_ext 0.1 table
        else:
            self.metadata = _header(metadata)["metadata"]
            self._status = STATUS_IN_PROGRESS
            self._f = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
            self._f.write(_header_line(self._header_for(STATUS_IN_PROGRESS)))
            self._f.flush()

    def _header_for(self, status: str) -> dict:
        if status == STATUS_IN_PROGRESS:
            integrity: dict[str, Any] = {"status": STATUS_IN_PROGRESS}
        else:
            integrity = {"status": STATUS_COMPLETE, "n_rows": len(self._lines), "sha256": rows_content_hash(self._lines.items())}
        return {"format": TABLE_FORMAT, "version": TABLE_VERSION, "metadata": self.metadata, "integrity": integrity}

    def _rewrite_header(self, header: Mapping[str, Any]) -> None:
        """Replace line 1 (temp file + fsync + rename: a crash leaves the old or the new file, never a mix)."""
        new = _header_line(header).encode("utf-8")
        with open(self.path, "rb") as src:
            if src.readline() == new:
                return
            tmp = f"{self.path}.tmp-{os.getpid()}"
            with open(tmp, "wb") as dst:
                dst.write(new)
                shutil.copyfileobj(src, dst)
                dst.flush()
                os.fsync(dst.fileno())
        os.replace(tmp, self.path)

    def _repair_tail(self) -> None:
        with open(self.path, "rb") as f:
            data = f.read()
        if data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            raise ValueError(f"{self.path}: the header line itself is truncated; remove the file and rebuild.")
        warnings.warn(f"{self.path}: removing a truncated last line left by an interrupted write.", UserWarning,
                      stacklevel=3)
        with open(self.path, "r+b") as f:
            f.truncate(cut)

    def write(self, row: ValueTableRow) -> None:
        """Append one row and flush. Raises ``ValueError`` if its key was already written."""
        if self._closed:
            raise ValueError(f"{self.path}: the writer is closed.")
        if not isinstance(row, ValueTableRow):
            raise TypeError(f"ValueTableWriter.write expects a ValueTableRow, got {type(row).__name__}.")
        if row.prompt_key in self.done_keys:
            raise ValueError(f"{self.path}: prompt_key {row.prompt_key!r} is already in the table.")
        if self._status != STATUS_IN_PROGRESS:  # reopening a finished (or 0.1) table: unfinished until closed again
            self._rewrite_header(self._header_for(STATUS_IN_PROGRESS))
            self._status = STATUS_IN_PROGRESS
        if self._f is None:
            self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._f.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
        self._f.flush()
        self.done_keys.add(row.prompt_key)
        self._lines[row.prompt_key] = canonical_line(row)

    @property
    def content_hash(self) -> str:
        """:attr:`ValueTable.content_hash` of the rows written so far (earlier runs' included)."""
        return rows_content_hash(self._lines.items())

    def close(self, complete: bool = True) -> None:
        """Close the file; with ``complete=True`` (default) record the table as finished (row count + SHA-256).

        Pass ``complete=False`` when the build did not cover every prompt (an error, an interruption, a partial
        build): the table then stays ``in_progress`` (or as it was, if nothing was written).
        """
        if self._closed:
            return
        if self._f is not None and not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
        self._closed = True
        if complete:
            self._rewrite_header(self._header_for(STATUS_COMPLETE))
            self._status = STATUS_COMPLETE

    def __enter__(self) -> ValueTableWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(complete=exc_type is None)

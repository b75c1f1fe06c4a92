"""The offline value-table file format shared by :class:`~trl_ext.priors.TablePrior` and the BASIS builder.

A value table stores, for each training prompt, the rewards of ``n`` reference rollouts scored with the training
reward functions (BASIS, "BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM
Reasoning", May 2026, Section 4 "Offline value" and Appendix 10: the plug-in :math:`\\widehat V_\\beta(x)` of Eq. 2
needs the per-sample rewards, not only their mean, when rewards are not binary).

File layout (JSON Lines, UTF-8)
-------------------------------
Line 1, the header::

    {"format": "trl_ext.value_table", "version": 1,
     "metadata": {"model": "...", "seed": 0, "reward_funcs": ["accuracy"], "created": "2026-...Z", ...}}

Every following line is one prompt::

    {"prompt_key": "3f2a9c0d1b7e4a55", "prompt": "1+2=", "n": 32, "mean_reward": 0.40625,
     "rewards": [1.0, 0.0, ...], "reward_range": [0.0, 1.0], "question_id": null}

- ``prompt_key``: :func:`prompt_key` of the prompt (first 16 hex chars of the SHA-256 of the text, or of the
  canonical JSON of a conversation) unless the builder chose another key (e.g. a dataset row id); it must be
  unique in the file.
- ``prompt``: the prompt (text or list of messages); optional but recommended -- lookups then verify it, which
  catches key collisions and tables built for another dataset.
- ``n`` >= 1 samples, ``rewards`` (length ``n``, optional but needed for non-binary rewards), ``mean_reward``
  (must equal the mean of ``rewards`` when both are present), ``reward_range`` ``[low, high]`` with
  ``low < high`` and every reward inside it. ``question_id`` (any JSON scalar) and ``extra`` (a dict) are optional.

Integrity
---------
The header also carries an ``"integrity"`` record (outside ``metadata``)::

    "integrity": {"status": "complete", "n_rows": 512, "sha256": "9f2c..."}   # a finished table
    "integrity": {"status": "in_progress"}                                     # a build that has not finished

``sha256`` is :attr:`ValueTable.content_hash`: the SHA-256 of the rows' canonical JSON (``ValueTableRow.to_json()``
with sorted keys, no whitespace, UTF-8, one row per ``\n``-terminated line), rows ordered by ``prompt_key``; it
covers the rows only, not the header metadata, and does not depend on the row order in the file.
:func:`save_value_table` writes a complete table at once. :class:`ValueTableWriter` (the resumable builder) writes
``in_progress`` first and rewrites the header line as ``complete`` when it is closed at the end of a build.

:func:`load_value_table` refuses (``ValueError``, saying to re-run ``trl-ext build-value-table`` with the same
arguments, which resumes and finishes the table) a table that is ``in_progress`` or holds fewer rows than its header
records (a file cut on a row boundary), and refuses a complete table whose rows no longer match the hash or count (an
edited or appended file: rebuild it). ``allow_incomplete=True`` loads an unfinished or cut table on purpose. A
header without the record (tables written by trl_ext 0.1) loads with a ``UserWarning``: nothing can be checked.

Writers append one line per prompt and flush, so an interrupted build leaves at most one truncated last line;
:func:`load_value_table` refuses it unless ``allow_truncated_tail=True`` and :class:`ValueTableWriter` repairs it
on resume.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import numbers
import os
import shutil
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "TABLE_FORMAT",
    "TABLE_VERSION",
    "prompt_key",
    "ValueTableRow",
    "ValueTable",
    "load_value_table",
    "save_value_table",
    "ValueTableWriter",
]

TABLE_FORMAT = "trl_ext.value_table"
TABLE_VERSION = 1
_MEAN_TOL = 1e-6
_COMPLETE, _IN_PROGRESS = "complete", "in_progress"
_REBUILD_HINT = "re-run `trl-ext build-value-table` with the same arguments (it resumes the build and finishes the table)"


def _canonical_prompt(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and not isinstance(prompt, bytes | bytearray):
        msgs = list(prompt)
        if all(isinstance(m, Mapping) for m in msgs):
            return json.dumps([dict(m) for m in msgs], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    raise TypeError(
        f"prompt_key: a prompt must be a str or a list of message dicts, got {type(prompt).__name__}: {prompt!r:.80}"
    )


def prompt_key(prompt: str | Sequence[Mapping[str, Any]], length: int = 16) -> str:
    """Stable key of a prompt: the first ``length`` hex characters of its SHA-256.

    Plain text is hashed as UTF-8. A conversation (list of message dicts) is hashed as canonical JSON
    (keys sorted, no whitespace, non-ASCII kept), so key order inside a message does not matter but message order,
    roles and content do. A string and a one-message conversation with the same text get different keys.

    Parameters
    ----------
    prompt : str or list of dict
    length : int, 8..64
        Hex characters kept (16 = 64 bits: collisions are negligible below ~10^8 prompts).

    Returns
    -------
    str
    """
    if not isinstance(length, int) or not 8 <= length <= 64:
        raise ValueError(f"prompt_key: length must be an int in [8, 64], got {length!r}.")
    return hashlib.sha256(_canonical_prompt(prompt).encode("utf-8")).hexdigest()[:length]


def _is_number(x: Any) -> bool:
    """A real number, numpy scalars included (``np.int64`` is not an ``int``); bools are not numbers here."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool | np.bool_)


@dataclass
class ValueTableRow:
    """One prompt of a value table (see the module docstring for the field semantics).

    Raises
    ------
    ValueError
        From :meth:`validate` (called on construction) if the row is inconsistent.
    """

    prompt_key: str
    n: int
    mean_reward: float
    reward_range: tuple[float, float]
    rewards: list[float] | None = None
    prompt: Any = None
    question_id: Any = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        k = self.prompt_key
        if not isinstance(k, str) or not k:
            raise ValueError(f"value table row: prompt_key must be a non-empty string, got {k!r}.")
        if not isinstance(self.n, numbers.Integral) or isinstance(self.n, bool | np.bool_) or self.n < 1:
            raise ValueError(f"value table row {k}: n must be an int >= 1 (samples scored), got {self.n!r}.")
        self.n = int(self.n)
        rr = self.reward_range
        if not (isinstance(rr, Sequence) and len(rr) == 2 and all(_is_number(v) and math.isfinite(v) for v in rr)):
            raise ValueError(f"value table row {k}: reward_range must be [low, high] finite numbers, got {rr!r}.")
        low, high = float(rr[0]), float(rr[1])
        if not low < high:
            raise ValueError(f"value table row {k}: reward_range needs low < high, got {rr!r}.")
        self.reward_range = (low, high)
        if not (_is_number(self.mean_reward) and math.isfinite(self.mean_reward)):
            raise ValueError(f"value table row {k}: mean_reward must be a finite number, got {self.mean_reward!r}.")
        self.mean_reward = float(self.mean_reward)
        tol = _MEAN_TOL * (high - low)
        if not (low - tol <= self.mean_reward <= high + tol):
            raise ValueError(f"value table row {k}: mean_reward {self.mean_reward} is outside reward_range {rr}.")
        if self.rewards is not None:
            r = self.rewards
            if not (isinstance(r, Sequence) and all(_is_number(v) and math.isfinite(v) for v in r)):
                raise ValueError(f"value table row {k}: rewards must be a list of finite numbers (no NaN/None).")
            if len(r) != self.n:
                raise ValueError(f"value table row {k}: n={self.n} but {len(r)} rewards are stored.")
            if any(v < low - tol or v > high + tol for v in r):
                raise ValueError(f"value table row {k}: a reward lies outside reward_range {list(rr)}.")
            self.rewards = [float(v) for v in r]
            m = sum(self.rewards) / len(self.rewards)
            if abs(m - self.mean_reward) > max(tol, 1e-9):
                raise ValueError(f"value table row {k}: mean_reward {self.mean_reward} != mean(rewards) {m}.")
        if not isinstance(self.extra, dict):
            raise ValueError(f"value table row {k}: extra must be a dict, got {type(self.extra).__name__}.")

    @property
    def success_probability(self) -> float:
        """Mean reward mapped linearly from ``reward_range`` to ``[0, 1]``: ``(mean - low) / (high - low)``.

        For a {0, 1} checker this is the empirical success rate; for {-1, 1} it is ``(mean + 1) / 2``; for bounded
        non-binary rewards it is the normalized mean reward (the quantity V0.5's ``V = 2p - 1`` expects).
        """
        low, high = self.reward_range
        return min(1.0, max(0.0, (self.mean_reward - low) / (high - low)))

    @property
    def is_binary(self) -> bool | None:
        """True if every stored reward is an endpoint of ``reward_range``; None if ``rewards`` were not stored."""
        if self.rewards is None:
            return None
        low, high = self.reward_range
        return all(v == low or v == high for v in self.rewards)

    def to_json(self) -> dict:
        d = {
            "prompt_key": self.prompt_key,
            "prompt": self.prompt,
            "n": self.n,
            "mean_reward": self.mean_reward,
            "rewards": self.rewards,
            "reward_range": list(self.reward_range),
            "question_id": self.question_id,
        }
        if self.extra:
            d["extra"] = self.extra
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ValueTableRow:
        if not isinstance(d, Mapping):
            raise ValueError(f"value table row must be a JSON object, got {type(d).__name__}.")
        missing = [f for f in ("prompt_key", "n", "mean_reward", "reward_range") if f not in d]
        if missing:
            raise ValueError(f"value table row is missing required fields {missing}: {str(dict(d))[:120]}")
        known = {"prompt_key", "prompt", "n", "mean_reward", "rewards", "reward_range", "question_id", "extra"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"value table row {d.get('prompt_key')}: unknown fields {unknown} (put them in 'extra').")
        return cls(
            prompt_key=d["prompt_key"],
            n=d["n"],
            mean_reward=d["mean_reward"],
            reward_range=tuple(d["reward_range"]) if isinstance(d["reward_range"], list) else d["reward_range"],
            rewards=d.get("rewards"),
            prompt=d.get("prompt"),
            question_id=d.get("question_id"),
            extra=d.get("extra") or {},
        )

    @classmethod
    def from_rewards(
        cls,
        prompt: Any,
        rewards: Sequence[float],
        reward_range: tuple[float, float],
        *,
        key: str | None = None,
        question_id: Any = None,
        extra: dict | None = None,
    ) -> ValueTableRow:
        """Build a row from per-sample rewards (``n`` and ``mean_reward`` are derived; key defaults to
        :func:`prompt_key` of ``prompt``)."""
        r = [float(v) for v in rewards]
        if not r:
            raise ValueError("ValueTableRow.from_rewards: no rewards; a prompt needs at least one scored sample.")
        return cls(
            prompt_key=key if key is not None else prompt_key(prompt),
            n=len(r),
            mean_reward=sum(r) / len(r),
            reward_range=tuple(reward_range),
            rewards=r,
            prompt=prompt,
            question_id=question_id,
            extra=dict(extra or {}),
        )


class ValueTable:
    """In-memory value table: header metadata plus rows indexed by ``prompt_key``.

    Parameters
    ----------
    rows : iterable of ValueTableRow
    metadata : dict, optional
        JSON-serializable; conventional keys: ``model``, ``seed``, ``reward_funcs`` (list of names), ``created``
        (ISO 8601), ``n_samples``, ``dataset``.

    Raises
    ------
    ValueError
        On duplicate ``prompt_key``.
    """

    def __init__(self, rows: Iterable[ValueTableRow] = (), metadata: Mapping[str, Any] | None = None):
        self.metadata: dict[str, Any] = dict(metadata or {})
        #: The header's integrity record as loaded (``{"status": "complete", "n_rows": ..., "sha256": ...}`` or
        #: ``{"status": "in_progress"}``); None for an in-memory table or a trl_ext 0.1 file without one.
        self.integrity: dict[str, Any] | None = None
        self._rows: dict[str, ValueTableRow] = {}
        for row in rows:
            self.add(row)

    def add(self, row: ValueTableRow) -> None:
        """Add one row; duplicate keys are an error (a resumed build must skip finished prompts)."""
        if not isinstance(row, ValueTableRow):
            raise TypeError(f"ValueTable.add expects a ValueTableRow, got {type(row).__name__}.")
        if row.prompt_key in self._rows:
            raise ValueError(f"value table: duplicate prompt_key {row.prompt_key!r}.")
        self._rows[row.prompt_key] = row

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, key: object) -> bool:
        return key in self._rows

    def __iter__(self):
        return iter(self._rows.values())

    def keys(self) -> list[str]:
        return list(self._rows)

    def get(self, key: str) -> ValueTableRow | None:
        return self._rows.get(key)

    def lookup(self, prompt: Any, *, key_fn=prompt_key) -> ValueTableRow | None:
        """Row for ``prompt`` (None if absent).

        Raises
        ------
        ValueError
            If a row exists under the key but stores a different prompt (key collision, or a table built from a
            different dataset rendering).
        """
        row = self._rows.get(key_fn(prompt))
        if row is not None and row.prompt is not None and _canonical_prompt(row.prompt) != _canonical_prompt(prompt):
            raise ValueError(
                f"value table: key {row.prompt_key!r} stores a different prompt ({str(row.prompt)[:60]!r}) than the "
                f"one looked up ({str(prompt)[:60]!r}); the table was built for other prompts or with another key_fn."
            )
        return row

    @property
    def content_hash(self) -> str:
        """SHA-256 (hex) of the rows: their canonical JSON, one line per row, ordered by ``prompt_key``.

        The value a finished table records in its header (``integrity.sha256``) and the identity to quote for a
        table (e.g. in a model card): two tables with the same rows have the same hash whatever their row order,
        header metadata or file formatting. Computed from the rows on every access.
        """
        return _content_hash((k, _canonical_line(r)) for k, r in self._rows.items())

    @property
    def is_binary(self) -> bool | None:
        """True if every row with stored rewards is binary; None if no row stores rewards."""
        flags = [r.is_binary for r in self._rows.values() if r.rewards is not None]
        return None if not flags else all(flags)

    def check_compatible(
        self,
        *,
        model: str | None = None,
        reward_funcs: Sequence[str] | None = None,
        seed: int | None = None,
        strict: bool = False,
    ) -> list[str]:
        """Compare the header metadata with the training setup.

        Parameters
        ----------
        model, reward_funcs, seed
            Expected values; None skips the check. A key missing from the header counts as a mismatch.
        strict : bool
            Raise instead of warning.

        Returns
        -------
        list of str
            One message per mismatch (empty when compatible). Each is also issued as a ``UserWarning``.

        Raises
        ------
        ValueError
            If ``strict`` and there is a mismatch.
        """
        problems = []
        for name, want in (("model", model), ("reward_funcs", list(reward_funcs) if reward_funcs else None),
                           ("seed", seed)):
            if want is None:
                continue
            have = self.metadata.get(name)
            if have != want:
                problems.append(f"value table was built with {name}={have!r}, training uses {name}={want!r}")
        if problems and strict:
            raise ValueError("; ".join(problems))
        for p in problems:
            warnings.warn(p, UserWarning, stacklevel=2)
        return problems


def _canonical_line(row: ValueTableRow) -> str:
    """A row's canonical JSON line (sorted keys, no whitespace, non-ASCII kept, ``\n``-terminated)."""
    return json.dumps(row.to_json(), sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"


def _content_hash(items: Iterable[tuple[str, str]]) -> str:
    """SHA-256 over ``(prompt_key, canonical line)`` pairs taken in ``prompt_key`` order (keys are unique), so the
    hash does not depend on the order the rows were written."""
    h = hashlib.sha256()
    for _, line in sorted(items):
        h.update(line.encode("utf-8"))
    return h.hexdigest()


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
    ok = isinstance(integ, dict) and integ.get("status") in (_COMPLETE, _IN_PROGRESS)
    if ok and integ["status"] == _COMPLETE:
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
                f"cut short or edited cannot be detected ({n} rows read). To check and upgrade it, {_REBUILD_HINT}; "
                "a table you saved yourself: save_value_table(path, load_value_table(path)).",
                UserWarning, stacklevel=3,
            )
        return
    if integ["status"] == _IN_PROGRESS:
        if not allow_incomplete:
            raise ValueError(
                f"{path}: this value table is incomplete: its build has not finished (still running, interrupted, or "
                f"stopped early by --max_prompts / max_prompts=), {n} rows so far. To finish it, {_REBUILD_HINT}. "
                "(load_value_table(..., allow_incomplete=True) reads the partial table on purpose.)"
            )
        return
    want = integ["n_rows"]
    if n < want:
        if not allow_incomplete:
            raise ValueError(
                f"{path}: this value table is truncated: its header records {want} rows but the file holds {n} (the "
                f"file was cut, e.g. by an interrupted copy or a full disk). To restore it, {_REBUILD_HINT}, or copy "
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
    integrity = {"status": _COMPLETE, "n_rows": len(rows), "sha256": table.content_hash}
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
            self._lines = {r.prompt_key: _canonical_line(r) for r in existing}
            self._status = (existing.integrity or {}).get("status")  # None: a trl_ext 0.1 table
        else:
            self.metadata = _header(metadata)["metadata"]
            self._status = _IN_PROGRESS
            self._f = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
            self._f.write(_header_line(self._header_for(_IN_PROGRESS)))
            self._f.flush()

    def _header_for(self, status: str) -> dict:
        if status == _IN_PROGRESS:
            integrity: dict[str, Any] = {"status": _IN_PROGRESS}
        else:
            integrity = {"status": _COMPLETE, "n_rows": len(self._lines), "sha256": _content_hash(self._lines.items())}
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
        if self._status != _IN_PROGRESS:  # reopening a finished (or 0.1) table: unfinished until closed again
            self._rewrite_header(self._header_for(_IN_PROGRESS))
            self._status = _IN_PROGRESS
        if self._f is None:
            self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._f.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
        self._f.flush()
        self.done_keys.add(row.prompt_key)
        self._lines[row.prompt_key] = _canonical_line(row)

    @property
    def content_hash(self) -> str:
        """:attr:`ValueTable.content_hash` of the rows written so far (earlier runs' included)."""
        return _content_hash(self._lines.items())

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
            self._rewrite_header(self._header_for(_COMPLETE))
            self._status = _COMPLETE

    def __enter__(self) -> ValueTableWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(complete=exc_type is None)

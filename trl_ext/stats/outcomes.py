"""Reading per-question outcome files and lining runs up by seed and question.

Format (one JSON object per line, written by the testbed evaluation)::

    {"question_id": "q17", "correct": 1, "pass_rate": 0.75, "n_samples": 8, "completion_tokens": 4.5,
     "prompt": "...", "answer": "...", "completions": [...]}

Only ``question_id`` (str) and ``correct`` (0/1) are required; ``pass_rate`` (float in [0, 1]), ``n_samples`` (int)
and ``completion_tokens`` (float, mean tokens per completion) are validated when present and read as NaN when
absent (the comparison then reports that it cannot use them). Files may be gzip-compressed (``.jsonl.gz``).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._io import read_jsonl, resolve_jsonl, write_text_atomic

__all__ = ["OutcomeFormatError", "RunOutcomes", "read_outcomes", "pair_seed_files", "align_runs", "REQUIRED_KEYS",
           "read_outcomes_jsonl", "write_outcomes_jsonl"]

#: Keys every outcome record must have (checked by :func:`write_outcomes_jsonl` / :func:`read_outcomes_jsonl`).
REQUIRED_KEYS: tuple[str, ...] = ("question_id", "correct", "pass_rate", "n_samples", "completion_tokens")

_SEED_RE = re.compile(r"seed[_-]?(\d+)", re.IGNORECASE)


class OutcomeFormatError(ValueError):
    """Raised for malformed or inconsistent outcome files (the message names file and line)."""


@dataclass(frozen=True)
class RunOutcomes:
    """One configuration at one seed: per-question outcomes in file order."""

    path: str
    question_ids: tuple[str, ...]
    correct: np.ndarray
    pass_rate: np.ndarray
    n_samples: np.ndarray
    completion_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.question_ids)

    def select(self, ids: Sequence[str]) -> RunOutcomes:
        """Return the rows for ``ids`` in that order."""
        pos = {q: i for i, q in enumerate(self.question_ids)}
        idx = np.array([pos[q] for q in ids], dtype=np.int64)
        return RunOutcomes(self.path, tuple(ids), self.correct[idx], self.pass_rate[idx], self.n_samples[idx],
                           self.completion_tokens[idx])


def _num(path, lineno, key, value, *, integer=False, lo=None, hi=None):
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OutcomeFormatError(f"{path}:{lineno}: field {key!r} must be a number; got {value!r}")
    if not math.isfinite(value):
        raise OutcomeFormatError(f"{path}:{lineno}: field {key!r} must be finite; got {value!r}")
    if integer and int(value) != value:
        raise OutcomeFormatError(f"{path}:{lineno}: field {key!r} must be an integer; got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise OutcomeFormatError(f"{path}:{lineno}: field {key!r} must be in [{lo}, {hi}]; got {value!r}")
    return float(value)


def read_outcomes(path: str | Path) -> RunOutcomes:
    """Read one outcomes JSONL file (gzip-compressed when its name ends with ``.gz``; a missing ``X.jsonl`` whose
    ``X.jsonl.gz`` exists is read from the latter).

    Blank lines are skipped. Raises :class:`OutcomeFormatError` naming ``file:line`` for invalid JSON, a non-object
    line, a missing/invalid ``question_id`` or ``correct``, out-of-range optional fields, a duplicated
    ``question_id``, or a file with no records.
    """
    path = resolve_jsonl(path)
    try:
        records = read_jsonl(path, error=OutcomeFormatError, numbered=True)
    except FileNotFoundError:
        raise OutcomeFormatError(f"{path}: file not found") from None
    ids, correct, pr, ns, ct = [], [], [], [], []
    seen: dict[str, int] = {}
    for lineno, rec in records:
        if "question_id" not in rec or not isinstance(rec["question_id"], str) or not rec["question_id"]:
            raise OutcomeFormatError(f"{path}:{lineno}: missing or non-string 'question_id'")
        qid = rec["question_id"]
        if qid in seen:
            raise OutcomeFormatError(f"{path}:{lineno}: duplicate question_id {qid!r} (first seen on line {seen[qid]})")
        seen[qid] = lineno
        if "correct" not in rec:
            raise OutcomeFormatError(f"{path}:{lineno}: missing field 'correct' (0/1)")
        c = rec["correct"]
        if isinstance(c, bool):
            c = int(c)
        if not isinstance(c, int | float) or c not in (0, 1):
            raise OutcomeFormatError(f"{path}:{lineno}: field 'correct' must be 0 or 1; got {rec['correct']!r}")
        ids.append(qid)
        correct.append(float(c))
        pr.append(_num(path, lineno, "pass_rate", rec["pass_rate"], lo=0, hi=1) if "pass_rate" in rec else np.nan)
        ns.append(_num(path, lineno, "n_samples", rec["n_samples"], integer=True, lo=1) if "n_samples" in rec
                  else np.nan)
        ct.append(_num(path, lineno, "completion_tokens", rec["completion_tokens"], lo=0)
                  if "completion_tokens" in rec else np.nan)
    if not ids:
        raise OutcomeFormatError(f"{path}: no outcome records (empty file)")
    return RunOutcomes(path, tuple(ids), np.asarray(correct), np.asarray(pr), np.asarray(ns), np.asarray(ct))


def _seed_of(path: str) -> int | None:
    """The seed number from the last ``seedN`` path component (``seed3``, ``run_seed-3``, ``seed_3``)."""
    hits = [m for part in Path(path).parts for m in _SEED_RE.findall(part)]
    return int(hits[-1]) if hits else None


def pair_seed_files(files_a: Sequence[str], files_b: Sequence[str]) -> list[tuple[str, str, str]]:
    """Pair configuration ``a``'s files with ``b``'s, one pair per seed.

    Rule: if every file on both sides has a ``seedN`` path component (``seed[_-]?N``, case-insensitive, the last
    match in the path wins), files are paired by that number and the sets of seed numbers must match exactly.
    Otherwise files are paired by sorted path order and both sides must have the same count.

    Returns
    -------
    list of (label, path_a, path_b)
        ``label`` is ``"seedN"`` or the 0-based sort position.
    """
    files_a, files_b = list(files_a), list(files_b)
    if not files_a or not files_b:
        raise OutcomeFormatError("both --a and --b need at least one outcomes file")
    for side, files in (("a", files_a), ("b", files_b)):
        if len(set(files)) != len(files):
            raise OutcomeFormatError(f"side {side} lists the same file twice: {sorted(files)}")
    seeds_a = [_seed_of(f) for f in files_a]
    seeds_b = [_seed_of(f) for f in files_b]
    if all(s is not None for s in seeds_a + seeds_b):
        for side, files, seeds in (("a", files_a, seeds_a), ("b", files_b, seeds_b)):
            if len(set(seeds)) != len(seeds):
                raise OutcomeFormatError(f"side {side} has two files for the same seed number: {files}")
        if set(seeds_a) != set(seeds_b):
            raise OutcomeFormatError(
                f"seed numbers differ between sides: a has {sorted(seeds_a)}, b has {sorted(seeds_b)}; "
                "pass matching seeds"
            )
        by_b = dict(zip(seeds_b, files_b))
        return [(f"seed{s}", fa, by_b[s]) for s, fa in sorted(zip(seeds_a, files_a))]
    if len(files_a) != len(files_b):
        raise OutcomeFormatError(
            f"a has {len(files_a)} files and b has {len(files_b)}; without seedN path components files are paired "
            "by sort order, so the counts must match"
        )
    return [(str(i), fa, fb) for i, (fa, fb) in enumerate(zip(sorted(files_a), sorted(files_b)))]


def align_runs(runs: Sequence[RunOutcomes], *, intersect: bool = False) -> tuple[list[RunOutcomes], dict]:
    """Put every run on one common question list.

    Parameters
    ----------
    runs : sequence of RunOutcomes
    intersect : bool
        ``False`` (default): every run must hold exactly the same question ids, else :class:`OutcomeFormatError`
        names the ids each file is missing. ``True``: keep the ids common to all runs and report what was dropped.

    Returns
    -------
    aligned : list of RunOutcomes
        In the first run's question order.
    report : dict
        ``{"n_common": int, "dropped": {path: [ids present in that file but dropped]}}``.
    """
    if not runs:
        raise OutcomeFormatError("no runs to align")
    union: list[str] = []
    seen = set()
    for r in runs:
        for q in r.question_ids:
            if q not in seen:
                seen.add(q)
                union.append(q)
    common = set(runs[0].question_ids).intersection(*[set(r.question_ids) for r in runs[1:]])
    missing = {r.path: [q for q in union if q not in set(r.question_ids)] for r in runs}
    missing = {p: m for p, m in missing.items() if m}
    if missing and not intersect:
        parts = []
        for p, m in missing.items():
            shown = ", ".join(m[:10]) + (f", ... ({len(m)} in all)" if len(m) > 10 else "")
            parts.append(f"{p} is missing {shown}")
        raise OutcomeFormatError(
            "question sets differ between runs: " + "; ".join(parts)
            + ". Re-run the evaluation on the same questions, or pass --intersect to compare on the common ones."
        )
    if not common:
        raise OutcomeFormatError("the runs share no question ids at all; nothing to compare")
    order = [q for q in runs[0].question_ids if q in common]
    dropped = {r.path: [q for q in r.question_ids if q not in common] for r in runs}
    return [r.select(order) for r in runs], {"n_common": len(order),
                                             "dropped": {p: d for p, d in dropped.items() if d}}


# ------------------------------------------------------------------- the strict writer / reader of the evaluation
def _validate_record(rec: dict, where: str) -> None:
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: outcome record must be a JSON object, got {type(rec).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in rec]
    if missing:
        raise ValueError(f"{where}: outcome record lacks key(s) {missing}")
    if rec["correct"] not in (0, 1) or isinstance(rec["correct"], bool):
        raise ValueError(f"{where}: 'correct' must be 0 or 1, got {rec['correct']!r}")
    pr = rec["pass_rate"]
    if not isinstance(pr, (int, float)) or not (0.0 <= pr <= 1.0):
        raise ValueError(f"{where}: 'pass_rate' must be a number in [0, 1], got {pr!r}")
    if not isinstance(rec["n_samples"], int) or rec["n_samples"] < 1:
        raise ValueError(f"{where}: 'n_samples' must be a positive int, got {rec['n_samples']!r}")


def write_outcomes_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> str:
    """Write per-question outcome records, one JSON object per line (atomically: tmp file then rename;
    gzip-compressed, deterministically, when ``path`` ends with ``.gz``).

    Raises ``ValueError`` if a record misses a required key, has a bad value, or a ``question_id`` repeats.
    Returns the path written.
    """
    path = os.fspath(path)
    seen: set[str] = set()
    lines = []
    for i, rec in enumerate(records):
        _validate_record(rec, f"record {i}")
        qid = str(rec["question_id"])
        if qid in seen:
            raise ValueError(f"record {i}: duplicate question_id {qid!r}; one record per question")
        seen.add(qid)
        lines.append(json.dumps({**rec, "question_id": qid}, sort_keys=True))
    return write_text_atomic(path, "\n".join(lines) + ("\n" if lines else ""))


def read_outcomes_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read records written by :func:`write_outcomes_jsonl` (:func:`trl_ext._io.read_jsonl`: blank lines skipped). A
    ``.gz`` file is gunzipped; a missing ``X.jsonl`` whose ``X.jsonl.gz`` exists is read from the latter.

    Raises ``ValueError`` naming the line for invalid JSON or an invalid record, and for an unreadable file.
    """
    path = resolve_jsonl(path)
    out = []
    for lineno, rec in read_jsonl(path, numbered=True):
        _validate_record(rec, f"{path}:{lineno}")
        out.append(rec)
    return out

"""Rows and in-memory tables of the value-table format (:mod:`trl_ext.priors.table_format` describes the file).

:func:`prompt_key`, :class:`ValueTableRow` (one prompt: ``n``, mean reward, rewards, reward range) and
:class:`ValueTable` (rows indexed by prompt key, header metadata, :attr:`ValueTable.content_hash`). Reading and writing
files is :mod:`trl_ext.priors.table_file`. Every name is importable from :mod:`trl_ext.priors.table_format`.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["TABLE_FORMAT", "TABLE_VERSION", "prompt_key", "ValueTableRow", "ValueTable"]

TABLE_FORMAT = "trl_ext.value_table"
TABLE_VERSION = 1
_MEAN_TOL = 1e-6
STATUS_COMPLETE, STATUS_IN_PROGRESS = "complete", "in_progress"
REBUILD_HINT = "re-run `trl-ext build-value-table` with the same arguments (it resumes the build and finishes the table)"


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
        #: True for a table read from a trl_ext 0.1 file (no integrity record: a cut on a row boundary is undetectable)
        self.legacy_format: bool = False
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
        return rows_content_hash((k, canonical_line(r)) for k, r in self._rows.items())

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
            Expected values; None skips the check. A key missing from the header counts as a mismatch. A header
            model written with a placeholder root, ``<NAME>/rest`` (how committed tables name a machine's cache,
            e.g. ``<TRL_EXT_CACHE>/smollm2-135m-instruct-v1``), matches any model path ending in ``/rest``.
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
            if have != want and not (name == "model" and _same_model_path(have, want)):
                problems.append(f"value table was built with {name}={have!r}, training uses {name}={want!r}")
        if problems and strict:
            raise ValueError("; ".join(problems))
        for p in problems:
            warnings.warn(p, UserWarning, stacklevel=2)
        return problems


def _same_model_path(have, want) -> bool:
    """``have`` is ``<ROOT>/rest`` (a placeholder for a machine-specific root) and ``want`` ends with ``/rest``."""
    if not (isinstance(have, str) and isinstance(want, str) and have.startswith("<") and ">/" in have):
        return False
    rest = have.split(">/", 1)[1]
    return bool(rest) and want.replace("\\", "/").rstrip("/").endswith("/" + rest.rstrip("/"))


def canonical_line(row: ValueTableRow) -> str:
    """A row's canonical JSON line (sorted keys, no whitespace, non-ASCII kept, ``\n``-terminated)."""
    return json.dumps(row.to_json(), sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"


def rows_content_hash(items: Iterable[tuple[str, str]]) -> str:
    """SHA-256 over ``(prompt_key, canonical line)`` pairs taken in ``prompt_key`` order (keys are unique), so the
    hash does not depend on the order the rows were written."""
    h = hashlib.sha256()
    for _, line in sorted(items):
        h.update(line.encode("utf-8"))
    return h.hexdigest()

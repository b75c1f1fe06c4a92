"""A value prior read from an offline per-prompt success table.

The table holds reference-rollout rewards per prompt (format: :mod:`trl_ext.priors.table_format`, shared with the
BASIS value-table builder). The prior is the row's mean reward mapped to ``[0, 1]``
(:attr:`~trl_ext.priors.table_format.ValueTableRow.success_probability`); the context set is ignored, so this is a
frozen, zero-variance prior in the sense of V0.5 ("V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts",
arXiv:2603.10848, Section 3, fusion Eq. 6-9 treat V as a constant with unknown bias).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .base import ValuePrior, is_probability
from .table_format import ValueTable, load_value_table, prompt_key

__all__ = ["TablePrior"]

_MISSING = ("error", "default")


class TablePrior(ValuePrior):
    """Per-prompt offline success rates.

    Parameters
    ----------
    table : ValueTable, str/PathLike, or Mapping
        A loaded table, a path to a value-table JSONL file (read with
        :func:`~trl_ext.priors.table_format.load_value_table`, which refuses an unfinished, truncated or edited
        table), or a plain mapping ``{prompt or prompt_key: p}`` with
        probabilities in ``[0, 1]`` (string keys that are not 16-hex-char keys are treated as prompt text).
    missing : {"error", "default"}
        What to do for a prompt not in the table: raise ``KeyError`` (default; a wrong table is a user error), or
        return ``default_probability``. Either way misses are counted in :attr:`n_missing` (cumulative) and
        :attr:`last_n_missing` (last call).
    default_probability : float in [0, 1]
        Fallback for ``missing="default"``; 0.5 is the uninformative ``V = 0``.
    key_fn : callable, optional
        Prompt -> key; defaults to :func:`~trl_ext.priors.table_format.prompt_key`. Must match the builder's.

    Raises
    ------
    ValueError
        On an unknown ``missing`` mode, an out-of-range default, or a mapping value outside ``[0, 1]``.
    """

    def __init__(
        self,
        table: ValueTable | str | os.PathLike | Mapping[Any, float],
        *,
        missing: str = "error",
        default_probability: float = 0.5,
        key_fn: Callable[[Any], str] = prompt_key,
    ):
        if missing not in _MISSING:
            raise ValueError(f"TablePrior: missing must be one of {_MISSING}, got {missing!r}.")
        if not (np.isfinite(default_probability) and 0.0 <= default_probability <= 1.0):
            raise ValueError(f"TablePrior: default_probability must be in [0, 1], got {default_probability!r}.")
        self.missing = missing
        self.default_probability = float(default_probability)
        self.key_fn = key_fn
        self.table: ValueTable | None = None
        self._probs: dict[str, float] | None = None
        if isinstance(table, ValueTable):
            self.table = table
        elif isinstance(table, str | os.PathLike):
            self.table = load_value_table(table)
        elif isinstance(table, Mapping):
            probs = {}
            for k, p in table.items():
                if not is_probability(p):
                    raise ValueError(f"TablePrior: mapping value for {str(k)[:40]!r} must be in [0, 1], got {p!r}.")
                key = k if _looks_like_key(k) else key_fn(k)
                probs[key] = float(p)
            self._probs = probs
        else:
            raise TypeError(
                f"TablePrior: table must be a ValueTable, a path or a mapping, got {type(table).__name__}."
            )
        self.n_missing = 0
        self.last_n_missing = 0
        n = len(self.table) if self.table is not None else len(self._probs)
        self.name = f"TablePrior({n} prompts)"

    @property
    def content_hash(self) -> str | None:
        """:attr:`~trl_ext.priors.table_format.ValueTable.content_hash` of the table (None for a plain mapping):
        the identity of the values this prior serves, for a model card or a run log."""
        return None if self.table is None else self.table.content_hash

    def _lookup(self, prompt) -> float | None:
        if self.table is not None:
            row = self.table.lookup(prompt, key_fn=self.key_fn)
            return None if row is None else row.success_probability
        return self._probs.get(self.key_fn(prompt))

    def _predict(self, target_prompts, context_prompts, context_outcomes):
        out = np.empty(len(target_prompts))
        missing = []
        for i, prompt in enumerate(target_prompts):
            p = self._lookup(prompt)
            if p is None:
                missing.append(i)
                p = self.default_probability
            out[i] = p
        self.last_n_missing = len(missing)
        self.n_missing += len(missing)
        if missing and self.missing == "error":
            first = target_prompts[missing[0]]
            raise KeyError(
                f"{self.name}: {len(missing)} of {len(target_prompts)} prompts are not in the table (first: "
                f"{str(first)[:60]!r}, key {self.key_fn(first)!r}). Build the table for this dataset, or pass "
                "missing='default' to fall back to default_probability."
            )
        return out


def _looks_like_key(k: Any) -> bool:
    return isinstance(k, str) and len(k) == 16 and all(c in "0123456789abcdef" for c in k)

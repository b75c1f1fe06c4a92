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

# The format is implemented in two modules: rows and in-memory tables (table_rows) and files (table_file). Their
# public names stay importable from here.
from .table_file import (  # noqa: F401
    ValueTableWriter,
    load_value_table,
    save_value_table,
)
from .table_rows import (  # noqa: F401
    TABLE_FORMAT,
    TABLE_VERSION,
    ValueTable,
    ValueTableRow,
    prompt_key,
)

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

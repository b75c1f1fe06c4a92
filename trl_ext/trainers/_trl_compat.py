"""All TRL-version-specific glue of :mod:`trl_ext.trainers` in one place.

``trl_ext`` subclasses :class:`trl.GRPOTrainer` and relies on private attributes and on the exact data flow of
TRL 1.16 (see ``/work/shared/notes/trl_1.16_extension_points.md``, sections 0-2). Everything that touches a TRL
private name or a TRL-internal invariant goes through this module, so a TRL upgrade means auditing one file.

TRL 1.16 invariants relied on (re-check them on any upgrade):

* ``GRPOTrainer._calculate_rewards`` returns the **gathered** ``(N_global, F)`` reward tensor in rank order
  (GT 1681).
* ``GRPOTrainer._generate`` returns ``(prompt_ids, completion_ids, tool_mask, completions, logprobs,
  extra_fields, images, tool_images)`` (GT 2193-2322).
* ``_generate_and_score_completions`` slices advantages with ``process_slice = rank * len(prompts)`` and reads
  ``self.num_generations`` in ``view(-1, G)`` (GT 2753-2818).
* ``_prepare_inputs`` shuffles per rank then ``split_tensor_dict(batch, steps_per_generation)``, which drops the
  remainder rows silently (GT 1543-1544, U 1077): every value must be an ``(N, ...)`` tensor, a list of length
  N, a 0-dim tensor or ``None``.
* Loss normalizers in ``_compute_loss`` (GT 3153-3190): ``grpo``/``sapo``/``luspo``/``bnpo``/``dr_grpo`` divide
  by ``current_gradient_accumulation_steps``; ``dapo``/``cispo``/``vespo`` by
  ``num_items_in_batch / P * GA / steps_per_generation``.
* ``self._metrics[mode]`` is a ``defaultdict(list)`` averaged in ``log``; ``self._logs`` holds deques sized to the
  generation batch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

SUPPORTED_TRL = ("1.16",)
"""TRL major.minor versions whose internals this module was audited against."""

SEQUENCE_LEVEL_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")
"""Loss types whose policy term is averaged over sequences (rows) of the micro-batch (GT 3153-3163, 3174-3181)."""

GLOBAL_TOKEN_LEVEL_LOSSES = ("dapo", "cispo", "vespo")
"""Loss types normalized by the global token count ``num_items_in_batch`` (GT 3167-3172)."""

LOCAL_TOKEN_LEVEL_LOSSES = ("bnpo",)
"""Loss types normalized by the local micro-batch token count (GT 3158-3162)."""

SIGNAL_ONLY_LOSSES = SEQUENCE_LEVEL_LOSSES + GLOBAL_TOKEN_LEVEL_LOSSES + LOCAL_TOKEN_LEVEL_LOSSES
"""Every TRL 1.16 loss type: the per-token policy loss is positively homogeneous in the advantage for all of them
(notes section D), so signal-only denominators can be implemented by rescaling advantages."""

ROW_IDX_COLUMN = "trl_ext_row_idx"
"""Dataset column the base trainer adds (the dataset row index) to key groups by row, not by prompt text."""


def trl_version() -> str:
    """Return the installed TRL version string."""
    import trl

    return trl.__version__


def check_trl_version() -> None:
    """Raise a clear error unless the installed TRL is a version whose internals were audited.

    Set the environment variable ``TRL_EXT_SKIP_VERSION_CHECK=1`` to bypass (at your own risk: the overrides in
    :mod:`trl_ext.trainers.base` depend on private TRL internals that change between releases).

    Raises
    ------
    ImportError
        If TRL's ``major.minor`` is not in :data:`SUPPORTED_TRL`.
    """
    if os.environ.get("TRL_EXT_SKIP_VERSION_CHECK") == "1":
        return
    version = trl_version()
    if ".".join(version.split(".")[:2]) not in SUPPORTED_TRL:
        raise ImportError(
            f"trl_ext.trainers supports TRL {', '.join(v + '.x' for v in SUPPORTED_TRL)} but found trl=={version}. "
            "Install a supported version (pip install 'trl>=1.16,<1.17') or set TRL_EXT_SKIP_VERSION_CHECK=1 to try "
            "anyway."
        )


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """TRL's Bessel-corrected NaN-ignoring std (``trl.trainer.utils.nanstd``), re-exported for bitwise parity."""
    from trl.trainer.utils import nanstd as _nanstd

    return _nanstd(x, dim=dim, keepdim=keepdim)


def gather(t: torch.Tensor) -> torch.Tensor:
    """``accelerate.utils.gather``: concatenation over ranks in rank order. All ranks must pass equal shapes."""
    from accelerate.utils import gather as _gather

    return _gather(t)


def gather_object(obj: list) -> list:
    """``accelerate.utils.gather_object``: list concatenation over ranks (unequal lengths allowed)."""
    from accelerate.utils import gather_object as _gather_object

    return _gather_object(obj)


def checkpoint_prefix() -> str:
    """``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR`` (``"checkpoint"``)."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    return PREFIX_CHECKPOINT_DIR


def metrics(trainer: Any, mode: str) -> dict[str, list]:
    """The trainer's per-mode metric lists (``GRPOTrainer._metrics[mode]``, averaged in ``log``)."""
    return trainer._metrics[mode]


def replace_last_metric(trainer: Any, mode: str, name: str, value: float) -> None:
    """Overwrite the value TRL appended for ``name`` during the current generation (append if absent)."""
    store = trainer._metrics[mode][name]
    if store:
        store[-1] = float(value)
    else:
        store.append(float(value))


def rewrite_completion_logs(trainer: Any, n_new: int, keep: Sequence[bool], advantages: Sequence[float]) -> None:
    """Rewrite the last ``n_new`` rows TRL appended to ``trainer._logs`` (the completions table).

    Drops rows whose ``keep`` flag is False (pad rows) from every column (``log_extra`` columns included) and
    replaces the logged advantages with ``advantages`` (length ``n_new``, global order), keeping the columns aligned.
    """
    keep = [bool(k) for k in keep]
    if len(keep) != n_new or len(advantages) != n_new:
        raise ValueError(f"rewrite_completion_logs: got {len(keep)} keep flags / {len(advantages)} advantages, "
                         f"expected {n_new}.")
    logs = trainer._logs

    def _rewrite(dq, replacement=None):
        n = min(n_new, len(dq))
        tail = [dq.pop() for _ in range(n)][::-1]
        if replacement is not None:
            tail = list(replacement)[n_new - n:]
        flags = keep[n_new - n:]
        dq.extend(v for v, k in zip(tail, flags) if k)

    _rewrite(logs["advantages"], [float(a) for a in advantages])
    for key in ("prompt", "completion"):
        _rewrite(logs[key])
    for dq in logs["rewards"].values():
        _rewrite(dq)
    for dq in logs["extra"].values():  # log_extra columns TRL flushed for the same rows (no-op without pad rows)
        _rewrite(dq)


def resize_completion_logs(trainer: Any, maxlen: int, keep_last: int | None = None) -> None:
    """Re-create every deque of ``trainer._logs`` (the completions table) with ``maxlen``.

    TRL sizes them to ``generation_batch_size`` (GT 1088-1095), which assumes every generation batch has exactly that
    many rows; a variable-size batch (``_finish_rollouts``) can hold more. ``keep_last`` keeps only the newest rows
    of each column (the current generation batch, as TRL's fixed ``maxlen`` does for fixed-size batches). Columns
    created later (``rewards``/``extra`` are ``defaultdict`` s) get the new ``maxlen`` too.
    """
    from collections import deque

    maxlen = int(maxlen)
    logs = trainer._logs

    def _fix(dq):
        items = list(dq)
        if keep_last is not None:
            items = items[max(len(items) - int(keep_last), 0):]
        return deque(items, maxlen=maxlen)

    for key in ("images", "prompt", "completion", "advantages"):
        if key in logs:
            logs[key] = _fix(logs[key])
    for key in ("rewards", "extra"):
        if key in logs:
            table = logs[key]
            for name in list(table):
                table[name] = _fix(table[name])
            table.default_factory = lambda: deque(maxlen=maxlen)


def set_sampler_num_generations(trainer: Any, value: int) -> None:
    """Set ``trainer.num_generations`` after ``__init__`` (bypasses GC 1137; notes B.1 / E).

    The train sampler and dataloader are built lazily in ``train()`` from ``self.num_generations``
    (GT 1258-1316), so setting it to 1 makes every rank receive ``per_device * steps_per_generation`` unique
    prompts. Evaluation keeps ``num_generations_eval``.
    """
    trainer.num_generations = int(value)

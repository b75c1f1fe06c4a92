"""The :class:`RolloutBatch` handed to :meth:`trl_ext.GRPOTrainer.compute_advantages`.

One ``RolloutBatch`` describes one **generation batch** (``generation_batch_size`` rows over all ranks and all
``steps_per_generation`` micro-steps, or the variable number of rows a subclass produced through
a rollout strategy returned). Every field is **global**: gathered across ranks in rank order and identical on every
rank, so any estimator computed from it is the same on every rank (no collective needed) and equal to a
single-process run on the same global batch.

Row order is the rank order TRL uses: rank ``p`` owns rows ``local_slice(p)``. Within a rank, rows of one prompt
are contiguous (TRL's ``RepeatSampler`` or the rollout strategy's own layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["RolloutBatch"]


@dataclass
class RolloutBatch:
    """Global per-row data of one generation batch (identical on every rank).

    Attributes
    ----------
    rewards : Tensor, shape (N,), float32
        The scalar reward each estimator should use: the weighted sum ``sum_f w_f r_f`` of the reward functions
        (``nansum`` as TRL does in TRL 1.16 ``trl/trainer/grpo_trainer.py``,
        ``GRPOTrainer._generate_and_score_completions``), or the tie-break blend when ``tie_break_scorer_index`` is
        set. ``NaN`` where the row is unscorable (every reward function returned ``None``) and on pad rows.
    rewards_per_func : Tensor, shape (N, F), float32
        Raw per-function rewards exactly as TRL gathered them (``NaN`` for ``None``; pad rows are ``NaN``).
    group_ids : Tensor, shape (N,), int64
        Group (prompt) index ``0..num_groups-1``, numbered in order of first appearance; the rows of one group are
        contiguous. Derived from the dataset row index (the ``trl_ext_row_idx`` column the trainer adds), never
        from the prompt text, so duplicate prompts in the dataset stay separate groups. Pad rows carry ``-1``.
    row_idx : Tensor, shape (N,), int64
        Dataset row index of each rollout's prompt (``-1`` when unknown, e.g. a dataset the trainer could not
        index).
    prompts : list, length N
        The prompt of every row (strings, or message lists for conversational data).
    completion_lengths : Tensor, shape (N,), int64
        Generated tokens per row (0 on pad rows).
    is_pad : Tensor, shape (N,), bool
        True on rows added only to equalize row counts across ranks (the replay's padding); they carry no
        reward, no advantage and no loss.
    extra : dict
        Gathered per-row dataset columns the trainer class asked for in ``rollout_columns`` (e.g.
        ``value_prior``, ``question_id``): a float/int tensor of shape (N,) for numeric columns, else a list.
    num_processes : int
        World size ``P``.
    process_index : int
        This rank.
    local_sizes : list of int
        Rows owned by each rank (equal across ranks in TRL; kept explicit for clarity).
    side_inputs : dict
        Estimator side inputs supplied by the rollout strategy (``RolloutStrategy.provides``), gathered: ``{name:
        float64 ndarray of shape (N,)}`` (pad rows included; group-level inputs repeat the group's value on each
        row). Empty unless the strategy provides some.
    estimator_inputs : dict
        The strategy's global keyword inputs of the estimator (``RolloutGroups.estimator_inputs``).
    fixed_normalizer : float or None
        The strategy's fixed policy-loss normalizer (``RolloutGroups.fixed_normalizer``).
    record : any
        What the strategy handed over for its ``update`` (``RolloutGroups.record``).
    grades : Tensor or None, shape (N,)
        The checker grade (weighted sum of the non-scorer reward functions) when the tie-break blend is on; then
        ``rewards`` holds the blended reward. ``None`` otherwise.
    mode : str
        ``"train"`` or ``"eval"``.
    """

    rewards: torch.Tensor
    rewards_per_func: torch.Tensor
    group_ids: torch.Tensor
    row_idx: torch.Tensor
    prompts: list
    completion_lengths: torch.Tensor
    is_pad: torch.Tensor
    extra: dict[str, Any] = field(default_factory=dict)
    num_processes: int = 1
    process_index: int = 0
    local_sizes: list[int] = field(default_factory=list)
    side_inputs: dict[str, Any] = field(default_factory=dict)
    grades: torch.Tensor | None = None
    mode: str = "train"
    estimator_inputs: dict[str, Any] = field(default_factory=dict)
    fixed_normalizer: float | None = None
    record: Any = None

    def __post_init__(self) -> None:
        n = int(self.rewards.shape[0]) if self.rewards.ndim == 1 else -1
        if n < 0:
            raise ValueError(f"RolloutBatch.rewards must be 1-D (N,), got shape {tuple(self.rewards.shape)}.")
        checks = {
            "rewards_per_func": self.rewards_per_func.shape[0] if self.rewards_per_func.ndim == 2 else -1,
            "group_ids": self.group_ids.shape[0] if self.group_ids.ndim == 1 else -1,
            "row_idx": self.row_idx.shape[0] if self.row_idx.ndim == 1 else -1,
            "completion_lengths": self.completion_lengths.shape[0] if self.completion_lengths.ndim == 1 else -1,
            "is_pad": self.is_pad.shape[0] if self.is_pad.ndim == 1 else -1,
            "prompts": len(self.prompts),
        }
        bad = {k: v for k, v in checks.items() if v != n}
        if bad:
            raise ValueError(f"RolloutBatch fields must all have N={n} rows; mismatched: {bad}.")
        for key, value in self.extra.items():
            if len(value) != n:
                raise ValueError(f"RolloutBatch.extra[{key!r}] has {len(value)} rows, expected {n}.")
        for key, value in self.side_inputs.items():
            if len(value) != n:
                raise ValueError(f"RolloutBatch.side_inputs[{key!r}] has {len(value)} rows, expected {n}.")
        if self.grades is not None and tuple(self.grades.shape) != (n,):
            raise ValueError(f"RolloutBatch.grades must have shape ({n},), got {tuple(self.grades.shape)}.")
        if self.group_ids.dtype != torch.int64:
            raise ValueError(f"RolloutBatch.group_ids must be int64, got {self.group_ids.dtype}.")
        if not self.local_sizes:
            if n % self.num_processes:
                raise ValueError(f"{n} rows cannot be split evenly over {self.num_processes} processes.")
            self.local_sizes = [n // self.num_processes] * self.num_processes
        if sum(self.local_sizes) != n or len(self.local_sizes) != self.num_processes:
            raise ValueError(f"local_sizes {self.local_sizes} do not sum to N={n} over {self.num_processes} ranks.")
        if not 0 <= self.process_index < self.num_processes:
            raise ValueError(f"process_index {self.process_index} out of range for {self.num_processes} processes.")

    # ------------------------------------------------------------------ derived views
    @property
    def num_rows(self) -> int:
        """Total rows ``N`` (including pad rows)."""
        return int(self.rewards.shape[0])

    @property
    def num_groups(self) -> int:
        """Number of real (non-pad) groups."""
        valid = self.group_ids[~self.is_pad]
        return int(valid.max().item()) + 1 if valid.numel() else 0

    @property
    def unscorable(self) -> torch.Tensor:
        """(N,) bool: rows whose reward is NaN (unscorable or pad)."""
        return torch.isnan(self.rewards)

    @property
    def valid(self) -> torch.Tensor:
        """(N,) bool: rows that can carry an advantage (not pad, reward finite)."""
        return ~self.is_pad & ~self.unscorable

    @property
    def group_sizes(self) -> torch.Tensor:
        """(num_groups,) int64: rows per group (pad rows excluded)."""
        gid = self.group_ids[~self.is_pad]
        return torch.bincount(gid, minlength=self.num_groups)

    def local_slice(self, process_index: int | None = None) -> slice:
        """Rows owned by ``process_index`` (default: this rank) in the global order."""
        p = self.process_index if process_index is None else int(process_index)
        start = sum(self.local_sizes[:p])
        return slice(start, start + self.local_sizes[p])

    def local(self, x):
        """Slice a global per-row tensor/list down to this rank's rows."""
        return x[self.local_slice()]

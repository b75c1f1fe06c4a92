"""``trl_ext.GRPOTrainer``: a drop-in subclass of TRL 1.16's ``GRPOTrainer`` that every trl_ext trainer builds on.

With a default :class:`ExtGRPOConfig` it computes exactly TRL's advantages (bitwise for TRL's fixed-size groups)
and only *adds* metrics. On top it provides:

* **hooks for trainer authors** (see ``docs/base_trainer.md``):

  - :class:`~trl_ext.trainers.batch.RolloutBatch`: the gathered, rank-identical view of one generation batch;
  - :meth:`GRPOTrainer.compute_advantages`: override it to plug in an estimator (BASIS, V0.5, PAIR);
  - :meth:`GRPOTrainer._finish_rollouts`: feed rollouts a subclass generated itself (variable count per prompt)
    into TRL's tail (padding, old/ref log-probs, loss masks, logs), notes section B.3; helpers
    :meth:`GRPOTrainer._generate_completion_ids` and :meth:`GRPOTrainer._score_rollouts_local` for rounds;
  - ``unique_prompt_sampler = True``: the sampler yields unique prompts (G = 1 in the sampler), notes B.1;
  - ``rollout_columns``: dataset columns gathered into ``RolloutBatch.extra``;
  - :meth:`GRPOTrainer.ext_state_dict` / :meth:`GRPOTrainer.load_ext_state_dict`: state saved as
    ``trl_ext_state.pt`` in every checkpoint and restored on ``resume_from_checkpoint``;
  - :meth:`GRPOTrainer.log_ext_metric`: a scalar into ``self._metrics`` (every ``report_to`` backend).

* **measurement options** (``rlvr_measurement_discipline.txt``):

  - signal-only loss denominators (``signal_only_denominator``), notes section D;
  - the tie-break blend reward (``tie_break_scorer_index``) computed on the gathered groups, with optional
    confidence scaling of formerly tied groups by scorer separation relative to the noise floor;
  - shut-gate diagnostics every generation batch (``gate/*``) and generated-token counts (``ext/*``).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch

from ..measurement.shut_gate import shut_gate_stats
from . import _trl_compat as compat
from .batch import RolloutBatch
from .keyed_sampling_mixin import KeyedSamplingMixin

compat.check_trl_version()

import trl  # noqa: E402

__all__ = ["ExtGRPOConfig", "GRPOTrainer", "RolloutBatch", "trl_grpo_advantages", "EXT_STATE_FILE"]

EXT_STATE_FILE = "trl_ext_state.pt"
"""File name of the trl_ext state inside each ``checkpoint-*`` directory."""

_EXT_STATE_VERSION = 1


# ---------------------------------------------------------------------------------------------------------- config
@dataclass
class ExtGRPOConfig(trl.GRPOConfig):
    """:class:`trl.GRPOConfig` plus the trl_ext measurement options.

    Every new option is off (or purely additive) by default, so a default ``ExtGRPOConfig`` trains exactly like
    ``trl.GRPOConfig``. A plain ``trl.GRPOConfig`` is also accepted by :class:`GRPOTrainer` (the defaults below
    apply).

    Parameters
    ----------
    signal_only_denominator : bool, default False
        Divide the policy loss only by the sequences (sequence-level losses ``grpo``, ``sapo``, ``luspo``,
        ``dr_grpo``) or tokens (token-level losses ``dapo``, ``cispo``, ``vespo``, ``bnpo``) of **groups that carry
        a nonzero advantage**, instead of all of them (the paper's "fair-accounting" configuration: a tied group
        "contributes no signal, and this configuration also drops it from the count it averages over"). The KL
        and entropy terms keep TRL's normalizers. For equal-size groups, dividing by the live rows equals
        dividing by the number of live groups of per-group means.
    tie_break_scorer_index : int or None, default None
        Index into ``reward_funcs`` of the scorer (any reward function or reward model). When set, the other
        reward functions are checkers whose weighted sum is the grade, and the reward is
        ``grade + tie_break_epsilon * within-class rank of the score`` (rank normalized to [0, 1] inside each
        (group, grade) class), computed on the groups gathered across ranks.
    tie_break_epsilon : float, default 0.1
        Blend weight (the paper's epsilon = 0.1; not GRPO's clipping epsilon). Must be > 0 and below the smallest
        gap between distinct grades inside a group (checked at run time), so the blend never overrules the
        checker.
    tie_break_confidence_scaling : bool, default False
        Multiply the advantages of every group the blend opened (checker-tied, scorer-separated) by
        ``min(1, (max score - min score) / scorer_noise_floor)``: a group the scorer separated by less than its
        own noise floor is shrunk proportionally instead of getting a full-strength update (the experiment the
        paper says would separate its two explanations of the tie-break's gap). Requires
        ``scorer_noise_floor``.
    scorer_noise_floor : float or None, default None
        The scorer's noise floor on its own scale (3 x the 95th percentile of per-item spread; measure it with
        ``trl-ext noise-floor``).
    log_shut_gate : bool, default True
        Log ``gate/tied_share``, ``gate/tied_all_right_share``, ``gate/tied_all_wrong_share``,
        ``gate/tied_correct_share`` every generation batch.
    gate_success_threshold : float, default 0.5
        A rollout counts as correct for the gate when its reward (the grade under the tie-break) is >= this.
    gate_atol : float, default 0.0
        Tie tolerance of the gate (``max - min <= gate_atol``).
    log_rollout_metadata : bool, default False
        Add ``row_idx``, ``group_id`` and the trainer's ``rollout_columns`` to the completions table.
    """

    signal_only_denominator: bool = field(
        default=False,
        metadata={"help": "Divide the policy loss only by the sequences/tokens of groups with nonzero advantage "
                          "(KL and entropy keep their normalizers). Off by default."},
    )
    tie_break_scorer_index: int | None = field(
        default=None,
        metadata={"help": "Index of the scorer in reward_funcs; the other reward functions are the checkers. "
                          "Enables reward = grade + epsilon * within-class rank of the score."},
    )
    tie_break_epsilon: float = field(
        default=0.1, metadata={"help": "Tie-break blend weight epsilon (> 0, below the smallest grade gap)."}
    )
    tie_break_confidence_scaling: bool = field(
        default=False,
        metadata={"help": "Scale each formerly tied group's advantages by min(1, score range / scorer_noise_floor)."},
    )
    scorer_noise_floor: float | None = field(
        default=None, metadata={"help": "Noise floor of the scorer on its own scale (trl-ext noise-floor)."}
    )
    log_shut_gate: bool = field(default=True, metadata={"help": "Log shut-gate diagnostics (gate/*) every batch."})
    gate_success_threshold: float = field(
        default=0.5, metadata={"help": "Reward (grade) >= this counts as a correct rollout for the shut gate."}
    )
    gate_atol: float = field(default=0.0, metadata={"help": "Tie tolerance of the shut gate (max - min <= atol)."})
    log_rollout_metadata: bool = field(
        default=False, metadata={"help": "Add row_idx, group_id and rollout columns to the completions table."}
    )
    keyed_sampling: bool = field(
        default=False,
        metadata={"help": "Draw every rollout token with Gumbel noise hashed from (request key, sample index, "
                          "position) so each rollout regenerates byte-identically (transformers generation only; "
                          "see docs/replay.md)."},
    )
    keyed_sampling_seed: int | None = field(
        default=None, metadata={"help": "Run seed of the request keys (None: args.seed). Share it across runs "
                                        "that must draw identical noise."},
    )
    keyed_sampling_key_column: str | None = field(
        default=None, metadata={"help": "Dataset column with a stable question id for the keys (None: hash of "
                                        "the prompt text)."},
    )
    keyed_sampling_log: bool = field(
        default=True, metadata={"help": "With keyed_sampling, log every rollout with its key to "
                                        "<output_dir>/rollouts/rank<r>.jsonl (for trl-ext replay)."},
    )

    def __post_init__(self):
        super().__post_init__()
        _validate_ext_options(_ExtOptions.from_args(self), self)


@dataclass(frozen=True)
class _ExtOptions:
    signal_only_denominator: bool = False
    tie_break_scorer_index: int | None = None
    tie_break_epsilon: float = 0.1
    tie_break_confidence_scaling: bool = False
    scorer_noise_floor: float | None = None
    log_shut_gate: bool = True
    gate_success_threshold: float = 0.5
    gate_atol: float = 0.0
    log_rollout_metadata: bool = False

    @classmethod
    def from_args(cls, args) -> _ExtOptions:
        return cls(**{f.name: getattr(args, f.name, f.default) for f in fields(cls)})


def _validate_ext_options(o: _ExtOptions, args) -> None:
    if o.signal_only_denominator and args.loss_type not in compat.SIGNAL_ONLY_LOSSES:
        raise ValueError(
            f"signal_only_denominator supports loss_type in {compat.SIGNAL_ONLY_LOSSES}, got {args.loss_type!r}. "
            "Use one of those loss types or set signal_only_denominator=False."
        )
    if o.tie_break_scorer_index is not None:
        if isinstance(o.tie_break_scorer_index, bool) or not isinstance(o.tie_break_scorer_index, int) \
                or o.tie_break_scorer_index < 0:
            raise ValueError(
                f"tie_break_scorer_index must be a non-negative int (index into reward_funcs), got "
                f"{o.tie_break_scorer_index!r}."
            )
        if getattr(args, "multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize":
            raise ValueError(
                "The tie-break blend needs multi_objective_aggregation='sum_then_normalize' (the blend is the summed "
                "reward); 'normalize_then_sum' would standardize the scorer and checkers separately."
            )
    if not (isinstance(o.tie_break_epsilon, int | float) and math.isfinite(o.tie_break_epsilon)
            and o.tie_break_epsilon > 0):
        raise ValueError(f"tie_break_epsilon must be a finite number > 0, got {o.tie_break_epsilon!r}.")
    if o.scorer_noise_floor is not None and not (
        isinstance(o.scorer_noise_floor, int | float) and math.isfinite(o.scorer_noise_floor)
        and o.scorer_noise_floor > 0
    ):
        raise ValueError(f"scorer_noise_floor must be a finite number > 0 (or None), got {o.scorer_noise_floor!r}.")
    if o.tie_break_confidence_scaling:
        if o.tie_break_scorer_index is None:
            raise ValueError("tie_break_confidence_scaling=True needs tie_break_scorer_index (the blend) to be set.")
        if o.scorer_noise_floor is None:
            raise ValueError(
                "tie_break_confidence_scaling=True needs scorer_noise_floor (measure it with `trl-ext noise-floor`)."
            )
    if not math.isfinite(float(o.gate_success_threshold)):
        raise ValueError(f"gate_success_threshold must be finite, got {o.gate_success_threshold!r}.")
    if not (math.isfinite(float(o.gate_atol)) and o.gate_atol >= 0):
        raise ValueError(f"gate_atol must be a finite number >= 0, got {o.gate_atol!r}.")


# ------------------------------------------------------------------------------------------------ advantages (pure)
def _group_mean_std(values: torch.Tensor, gid: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """NaN-ignoring per-group mean and Bessel-corrected std (TRL's ``nanstd``), for ragged groups.

    ``values`` is (N,) or (N, F); groups with fewer than 2 finite values get std NaN (as TRL's ``nanstd``).
    """
    ok = ~torch.isnan(values)
    shape = (k,) + tuple(values.shape[1:])
    cnt = torch.zeros(shape, dtype=values.dtype).index_add_(0, gid, ok.to(values.dtype))
    tot = torch.zeros(shape, dtype=values.dtype).index_add_(0, gid, torch.nan_to_num(values, nan=0.0))
    mean = tot / cnt  # NaN when cnt == 0
    dev = torch.where(ok, (values - mean[gid]) ** 2, torch.zeros_like(values))
    var = torch.zeros(shape, dtype=values.dtype).index_add_(0, gid, dev) / cnt
    var = torch.where(cnt > 1, var * cnt / (cnt - 1), torch.full_like(var, float("nan")))
    return mean, var.sqrt()


def trl_grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    scale_rewards: str = "group",
    rewards_per_func: torch.Tensor | None = None,
    reward_weights: torch.Tensor | None = None,
    aggregation: str = "sum_then_normalize",
    eps: float = 1e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL 1.16's GRPO advantages (GT 2753-2810), generalized to ragged groups.

    ``sum_then_normalize`` (TRL default)::

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)       scale_rewards="group"
        A_i = (r_i - mean_g(r)) / (std_batch(r) + eps)   scale_rewards="batch"
        A_i =  r_i - mean_g(r)                           scale_rewards="none"

    ``normalize_then_sum`` (GDPO): each reward function is standardized within its group, the weighted sum is then
    standardized over the batch. Means/stds ignore NaN rewards, std is Bessel-corrected (TRL's ``nanstd``), NaN
    advantages (unscorable rows, singleton groups under group scaling) become 0 as in TRL.

    When every row belongs to one of ``K`` contiguous groups of equal size ``G`` (TRL's layout) the computation uses
    TRL's own ``view(-1, G)`` operations, so the result is bitwise identical to TRL's.

    Parameters
    ----------
    rewards : Tensor, shape (N,)
        Weighted summed rewards, NaN for unscorable rows (ignored if ``aggregation="normalize_then_sum"``).
    group_ids : Tensor, shape (N,), int64
        Group index ``0..K-1``; rows with ``group_ids < 0`` (pad rows) get advantage 0 and are ignored.
    scale_rewards : {"group", "batch", "none"}
    rewards_per_func : Tensor, shape (N, F), optional
        Needed for ``normalize_then_sum``.
    reward_weights : Tensor, shape (F,), optional
        Needed for ``normalize_then_sum``.
    aggregation : {"sum_then_normalize", "normalize_then_sum"}
    eps : float
        TRL's guard constant 1e-4.

    Returns
    -------
    advantages : Tensor, shape (N,), float32
    group_std : Tensor, shape (N,)
        Each row's group std of ``rewards`` (NaN for groups with < 2 finite rewards and for pad rows): TRL's
        ``is_std_zero`` uses it for ``frac_reward_zero_std``.
    """
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards and group_ids must both be (N,), got {tuple(rewards.shape)} and "
                         f"{tuple(group_ids.shape)}.")
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}.")
    if aggregation not in ("sum_then_normalize", "normalize_then_sum"):
        raise ValueError(f"aggregation must be 'sum_then_normalize' or 'normalize_then_sum', got {aggregation!r}.")
    n = rewards.shape[0]
    rewards = rewards.float()
    valid = group_ids >= 0
    out = torch.zeros(n, dtype=torch.float32, device=rewards.device)
    std_out = torch.full((n,), float("nan"), dtype=torch.float32, device=rewards.device)
    if not valid.any():
        return out, std_out
    gid = group_ids[valid]
    k = int(gid.max().item()) + 1
    sizes = torch.bincount(gid, minlength=k)
    g_size = int(sizes[0].item())
    uniform = bool(valid.all()) and bool((sizes == g_size).all()) and bool(
        torch.equal(gid, torch.arange(n, device=gid.device) // g_size)
    )
    r = rewards[valid]
    if aggregation == "sum_then_normalize":
        if uniform:  # TRL's exact operations (GT 2765-2808)
            mean = torch.nanmean(r.view(-1, g_size), dim=1).repeat_interleave(g_size, dim=0)
            if g_size > 1:
                std_g = compat.nanstd(r.view(-1, g_size), dim=1).repeat_interleave(g_size, dim=0)
            else:
                std_g = torch.zeros_like(r)
        else:
            mean_k, std_k = _group_mean_std(r.cpu(), gid.cpu(), k)
            mean, std_g = mean_k.to(r.device)[gid], std_k.to(r.device)[gid]
        if scale_rewards == "batch":
            std = compat.nanstd(r).expand_as(r) if r.numel() > 1 else torch.zeros_like(r)
        else:
            std = std_g
        adv = r - mean
        if scale_rewards != "none":
            adv = adv / (std + eps)
    else:
        if rewards_per_func is None or reward_weights is None:
            raise ValueError("normalize_then_sum needs rewards_per_func and reward_weights.")
        rpf = rewards_per_func[valid].float()
        w = reward_weights.to(rpf.device, torch.float32)
        unscorable = torch.isnan(rpf).all(dim=1)
        if uniform:
            grouped = rpf.view(-1, g_size, rpf.shape[1])
            mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
            std_k = compat.nanstd(grouped, dim=1, keepdim=True) if g_size > 1 else torch.zeros_like(mean_k)
            reward_k = ((grouped - mean_k) / (std_k + eps)).view(-1, rpf.shape[1])
        else:
            mk, sk = _group_mean_std(rpf.cpu(), gid.cpu(), k)
            reward_k = (rpf - mk.to(rpf.device)[gid]) / (sk.to(rpf.device)[gid] + eps)
        summed = (reward_k * w.unsqueeze(0)).nansum(dim=1)
        summed[unscorable] = torch.nan
        std = compat.nanstd(summed).expand_as(summed) if summed.numel() > 1 else torch.zeros_like(summed)
        adv = (summed - torch.nanmean(summed)) / (std + eps)
        if uniform and g_size > 1:
            std_g = compat.nanstd(r.view(-1, g_size), dim=1).repeat_interleave(g_size, dim=0)
        elif uniform:
            std_g = torch.zeros_like(r)
        else:
            std_g = _group_mean_std(r.cpu(), gid.cpu(), k)[1].to(r.device)[gid]
    out[valid] = torch.nan_to_num(adv, nan=0.0).float()
    std_out[valid] = std_g.float()
    return out, std_out


# ---------------------------------------------------------------------------------------------------------- trainer
def _add_row_index(dataset):
    """Add the ``trl_ext_row_idx`` column (dataset row index) unless present. Handles dict-like eval datasets."""
    if dataset is None:
        return None
    from datasets import Dataset, IterableDataset

    if isinstance(dataset, dict):  # DatasetDict / IterableDatasetDict / plain dict of datasets
        mapped = {k: _add_row_index(v) for k, v in dataset.items()}
        return mapped if type(dataset) is dict else type(dataset)(mapped)
    col = compat.ROW_IDX_COLUMN
    if isinstance(dataset, Dataset):
        if col in dataset.column_names:
            return dataset
        return dataset.add_column(col, list(range(len(dataset))))
    if isinstance(dataset, IterableDataset):
        if dataset.column_names is not None and col in dataset.column_names:
            return dataset
        return dataset.map(lambda _, i: {col: i}, with_indices=True)
    return dataset  # torch Dataset or other: groups fall back to TRL's contiguous blocks


class GRPOTrainer(KeyedSamplingMixin, trl.GRPOTrainer):
    """Drop-in :class:`trl.GRPOTrainer` with estimator hooks and measurement options.

    Same constructor as :class:`trl.GRPOTrainer`; ``args`` may be an :class:`ExtGRPOConfig` or a plain
    :class:`trl.GRPOConfig`. The dataset gains a ``trl_ext_row_idx`` column (the row index) that keys groups; like
    every dataset column it is also passed to reward functions as a keyword argument (TRL reward functions take
    ``**kwargs``).

    Class attributes for subclasses
    -------------------------------
    unique_prompt_sampler : bool, default False
        If True, ``self.num_generations`` is set to 1 after ``__init__`` (notes B.1): the train sampler yields
        ``generation_batch_size`` **unique** prompts per generation batch (``args.num_generations`` must still
        divide ``generation_batch_size`` to pass TRL's config check). TRL's own generation then produces one
        rollout per prompt (BASIS, G = 1); subclasses that want more call :meth:`_finish_rollouts`.
    rollout_columns : tuple of str, default ()
        Dataset columns gathered into :attr:`RolloutBatch.extra` (numeric columns become float64 tensors, others
        lists). A missing column raises a ``KeyError`` naming it.

    Attributes
    ----------
    last_rollout_batch : RolloutBatch or None
        The batch of the latest generation (for diagnostics and tests).
    last_advantages : Tensor or None
        The final global advantages of the latest generation (after pad zeroing and confidence scaling).
    """

    unique_prompt_sampler: ClassVar[bool] = False
    rollout_columns: ClassVar[tuple[str, ...]] = ()

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "")
            args = ExtGRPOConfig(f"{str(name).split('/')[-1] or 'model'}-GRPO")
        self._ext = _ExtOptions.from_args(args)
        _validate_ext_options(self._ext, args)  # also for plain trl.GRPOConfig
        train_dataset = _add_row_index(train_dataset)
        eval_dataset = _add_row_index(eval_dataset)
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, **kwargs)
        n_funcs = len(self.reward_funcs)
        if self._ext.tie_break_scorer_index is not None:
            if n_funcs < 2:
                raise ValueError(
                    f"The tie-break blend needs a scorer and at least one checker, but only {n_funcs} reward "
                    "function was given. Pass [checker(s)..., scorer] and set tie_break_scorer_index."
                )
            if self._ext.tie_break_scorer_index >= n_funcs:
                raise ValueError(
                    f"tie_break_scorer_index={self._ext.tie_break_scorer_index} is out of range for {n_funcs} "
                    f"reward functions ({self.reward_func_names})."
                )
        if self.unique_prompt_sampler:
            compat.set_sampler_num_generations(self, 1)
        self._ext_replay: dict | None = None
        self._ext_pending: RolloutBatch | None = None
        self._ext_warned: set[str] = set()
        self._ext_totals = {"generated_tokens_total": 0, "generation_batches": 0, "tie_break_groups_opened_total": 0}
        self.last_rollout_batch: RolloutBatch | None = None
        self.last_advantages: torch.Tensor | None = None

    # ------------------------------------------------------------------------------------------------ public hooks
    def compute_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """Advantages of every row of the generation batch (override this to plug in an estimator).

        The default reproduces TRL 1.16 (:func:`trl_grpo_advantages` with the trainer's ``scale_rewards`` and
        ``multi_objective_aggregation``), on ragged groups too.

        Parameters
        ----------
        batch : RolloutBatch
            Global, identical on every rank. Pad rows have ``group_ids == -1`` and NaN rewards.

        Returns
        -------
        Tensor, shape (N,) or (N, T), float
            Global advantages in batch order. Must be finite on valid rows and identical on every rank (compute it
            from ``batch`` only). The base class then zeroes pad and unscorable rows, applies the tie-break
            confidence scaling, slices the local rows and fixes the logs.
        """
        gid = torch.where(batch.is_pad, torch.full_like(batch.group_ids, -1), batch.group_ids)
        adv, _ = trl_grpo_advantages(
            batch.rewards, gid, scale_rewards=self.scale_rewards, rewards_per_func=batch.rewards_per_func,
            reward_weights=self.reward_weights, aggregation=self.multi_objective_aggregation,
        )
        return adv

    def ext_state_dict(self) -> dict:
        """State saved as ``trl_ext_state.pt`` in each checkpoint (extend with ``state = super().ext_state_dict()``).

        Values must be loadable with ``torch.load(weights_only=True)``: tensors, numbers, strings, bools, ``None``,
        and lists/tuples/dicts of those (convert numpy arrays to tensors or lists). The state must be identical on
        every rank (only the main process writes it; every rank reads it back).
        """
        return {"trl_ext_version": _EXT_STATE_VERSION, "trainer_class": type(self).__name__, **self._ext_totals}

    def load_ext_state_dict(self, state: dict) -> None:
        """Restore what :meth:`ext_state_dict` saved (extend with ``super().load_ext_state_dict(state)``)."""
        if not isinstance(state, dict) or state.get("trl_ext_version") != _EXT_STATE_VERSION:
            raise ValueError(
                f"Unrecognized {EXT_STATE_FILE}: expected a dict with trl_ext_version={_EXT_STATE_VERSION}, got "
                f"{type(state).__name__} with version {getattr(state, 'get', lambda _k: None)('trl_ext_version')!r}."
            )
        if state.get("trainer_class") != type(self).__name__:
            warnings.warn(
                f"{EXT_STATE_FILE} was written by {state.get('trainer_class')!r}, resuming with "
                f"{type(self).__name__!r}.", stacklevel=2,
            )
        for key in self._ext_totals:
            if key in state:
                self._ext_totals[key] = int(state[key])

    def log_ext_metric(self, name: str, value: float, mode: str | None = None) -> None:
        """Append a scalar to ``self._metrics[mode][name]`` (averaged per logging step, sent to every backend).

        Pass values that are already global (identical on every rank, e.g. computed from a
        :class:`RolloutBatch`); the main process's value is what gets logged. ``mode`` defaults to the current
        mode (``"train"`` when the model is in training mode, else ``"eval"``).
        """
        mode = mode or ("train" if self.model.training else "eval")
        value = float(value.item() if hasattr(value, "item") else value)
        compat.metrics(self, mode)[name].append(value)

    # ------------------------------------------------------------------------------------------ variable rollouts
    def _generate_completion_ids(self, rows: Sequence[dict]) -> tuple[list[list[int]], list[list[float]] | None]:
        """Generate one completion per row with TRL's backend (``_generate_single_turn``, notes B.2).

        Parameters
        ----------
        rows : sequence of dict
            Local dataset rows, one per wanted rollout (repeat a row to get several rollouts of its prompt).

        Returns
        -------
        completion_ids : list of list of int
            EOS-truncated completion token ids, in row order.
        logprobs : list of list of float or None
            Per-token sampling log-probs (vLLM only; ``None`` with transformers generation).
        """
        if self.keyed_sampling_enabled:
            # Rows generated outside TRL's _generate need their keys set explicitly. Building them is a collective
            # (sample indices count across ranks), so it runs before the empty-rows shortcut.
            requests = self.keyed_requests_for_rows(list(rows))
            if len(rows) == 0:
                return [], None
            self.set_keyed_requests(requests)
        if len(rows) == 0:
            return [], None
        prompts = [x["prompt"] for x in rows]
        prompt_ids, images, mm = self._tokenize_prompts(prompts)
        return self._generate_single_turn(prompt_ids, images, mm, 1)

    def _score_rollouts_local(self, rows: Sequence[dict], completion_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Score rollouts on this rank only (no gather), e.g. between generation rounds.

        Calls every reward function like TRL's ``_calculate_rewards`` does (dataset columns as keyword arguments,
        ``trainer_state``; ``log_extra``/``log_metric`` are no-ops here so intermediate rounds do not pollute the
        completions table), but without the cross-rank gather, so ranks may hold different row counts.

        Parameters
        ----------
        rows : sequence of dict
            Dataset row of each rollout.
        completion_ids : sequence of list of int
            Completion ids aligned with ``rows``.

        Returns
        -------
        Tensor, shape (n, F), float32
            NaN where a reward function returned ``None``. Pass it to :meth:`_finish_rollouts` as
            ``rewards_per_func`` to avoid scoring twice.

        Raises
        ------
        NotImplementedError
            For async reward functions (score them yourself).
        """
        import inspect

        n, n_funcs = len(rows), len(self.reward_funcs)
        out = torch.full((n, n_funcs), float("nan"))
        if n == 0:
            return out
        if len(completion_ids) != n:
            raise ValueError(f"_score_rollouts_local: {n} rows but {len(completion_ids)} completions.")
        prompts = [x["prompt"] for x in rows]
        texts = self.processing_class.batch_decode([list(c) for c in completion_ids], skip_special_tokens=True)
        conversational = isinstance(prompts[0], list)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        keys = [k for k in rows[0] if k not in ("prompt", "completion", "completion_ids")]
        kwargs = {k: [x[k] for x in rows] for k in keys}
        kwargs.update(trainer_state=self.state, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)
        for i, (func, proc) in enumerate(zip(self.reward_funcs, self.reward_processing_classes)):
            if isinstance(func, torch.nn.Module):
                if conversational:
                    raise NotImplementedError("_score_rollouts_local: reward models on conversational prompts are not "
                                              "supported; score them through _finish_rollouts instead.")
                enc = proc(text=[p + c for p, c in zip(prompts, texts)], return_tensors="pt", padding=True,
                           padding_side="right", add_special_tokens=False).to(self.accelerator.device)
                with torch.inference_mode():
                    out[:, i] = func(**enc).logits[:, 0].float().cpu()
            elif inspect.iscoroutinefunction(func):
                raise NotImplementedError("_score_rollouts_local does not run async reward functions.")
            else:
                values = func(prompts=prompts, completions=completions, completion_ids=[list(c) for c in completion_ids],
                              **kwargs)
                if len(values) != n:
                    raise ValueError(f"reward function {self.reward_func_names[i]!r} returned {len(values)} rewards for "
                                     f"{n} completions.")
                out[:, i] = torch.tensor([float("nan") if v is None else float(v) for v in values])
        return out

    def _finish_rollouts(
        self,
        inputs: Sequence[dict],
        completion_ids: Sequence[Sequence[int]],
        *,
        group_ids: Sequence[int],
        logprobs: Sequence[Sequence[float]] | None = None,
        rewards_per_func: torch.Tensor | None = None,
        is_pad: Sequence[bool] | None = None,
    ) -> dict:
        """Score a variable number of self-generated rollouts through TRL's tail; returns TRL's output dict.

        Call it from an overridden ``_generate_and_score_completions`` (train mode) with the rollouts this rank
        generated. Every rank must call it exactly once per generation batch (it contains collectives). It

        1. pads every rank to the same row count ``N* = ceil(max_rank n / steps_per_generation) *
           steps_per_generation`` with copies of the rank's last row flagged ``is_pad`` (equal sizes are required by
           TRL's gathers, notes 0.4, and by ``split_tensor_dict``, notes 0.2);
        2. replays the rollouts into TRL's ``_generate_and_score_completions`` (notes B.3): prompt/completion
           padding, old/reference log-probs, the vLLM importance-sampling ratio when ``logprobs`` is given, and the
           reward functions (unless ``rewards_per_func`` is given);
        3. builds the :class:`RolloutBatch` (pad rows: ``group_ids = -1``, NaN rewards), calls
           :meth:`compute_advantages`, and masks pad rows out of ``completion_mask`` and ``num_items_in_batch``.

        Parameters
        ----------
        inputs : sequence of dict, length n >= 1
            The dataset row of each rollout (a prompt's row repeated once per rollout), in local order.
        completion_ids : sequence of list of int, length n
            EOS-truncated completion ids (as returned by ``_generate_single_turn``).
        group_ids : sequence of int, length n
            Local group label of each rollout; rows of a group must be contiguous. Labels are per rank (the base
            makes them global).
        logprobs : sequence of list of float, optional
            Sampling log-probs per completion token (vLLM), aligned with ``completion_ids``.
        rewards_per_func : Tensor, shape (n, F), optional
            Local rewards already computed by the subclass (e.g. while deciding further rounds); NaN = ``None``.
            When omitted, TRL's ``_calculate_rewards`` scores the (padded) rows.
        is_pad : sequence of bool, length n, optional
            Rows to treat exactly like the base's own pad rows (no reward, no advantage, no loss, not counted in
            any metric; their ``group_ids`` are ignored). Use it when a rank has nothing to contribute: pass one
            dummy rollout with ``is_pad=[True]`` so the collectives stay aligned.

        Returns
        -------
        dict
            TRL's output (``prompt_ids``, ``completion_ids``, ``completion_mask``, ``advantages`` of shape
            (N*,), ``num_items_in_batch``, ...), ready for ``_prepare_inputs``.

        Notes
        -----
        Tool calling, environments and multimodal prompts are not supported on this path.
        """
        n = len(inputs)
        if n < 1:
            raise ValueError("_finish_rollouts needs at least one rollout on every rank (got 0); if a rank has nothing "
                             "to score, pass one dummy rollout with is_pad=[True].")
        if len(completion_ids) != n or len(group_ids) != n:
            raise ValueError(f"_finish_rollouts: inputs ({n}), completion_ids ({len(completion_ids)}) and group_ids "
                             f"({len(group_ids)}) must have the same length.")
        if logprobs is not None and len(logprobs) != n:
            raise ValueError(f"_finish_rollouts: logprobs has {len(logprobs)} rows, expected {n}.")
        user_pad = [False] * n if is_pad is None else [bool(p) for p in is_pad]
        if len(user_pad) != n:
            raise ValueError(f"_finish_rollouts: is_pad has {len(user_pad)} flags, expected {n}.")
        gids = [-1 if p else int(g) for g, p in zip(group_ids, user_pad)]
        real_g = [g for g, p in zip(gids, user_pad) if not p]
        runs = [g for i, g in enumerate(real_g) if i == 0 or g != real_g[i - 1]]
        if len(runs) != len(set(runs)):
            raise ValueError("_finish_rollouts: the rollouts of a group must be contiguous (group_ids "
                             f"{gids[:20]}...). Sort the rollouts by group first.")
        if rewards_per_func is not None:
            rewards_per_func = torch.as_tensor(rewards_per_func, dtype=torch.float32)
            if tuple(rewards_per_func.shape) != (n, len(self.reward_funcs)):
                raise ValueError(f"_finish_rollouts: rewards_per_func must have shape ({n}, {len(self.reward_funcs)}),"
                                 f" got {tuple(rewards_per_func.shape)}.")
        mode = "train" if self.model.training else "eval"
        device = self.accelerator.device
        multiple = self.args.steps_per_generation if mode == "train" else 1
        n_max = int(compat.gather(torch.tensor([n], device=device)).max().item())
        n_star = math.ceil(n_max / multiple) * multiple
        n_pad = n_star - n
        rows = [dict(x) for x in inputs] + [dict(inputs[-1]) for _ in range(n_pad)]
        c_ids = [list(c) for c in completion_ids] + [list(completion_ids[-1]) for _ in range(n_pad)]
        lps = None
        if logprobs is not None:
            lps = [list(lp) for lp in logprobs] + [list(logprobs[-1]) for _ in range(n_pad)]
        is_pad = user_pad + [True] * n_pad
        if rewards_per_func is not None:
            rewards_per_func = torch.cat(
                [rewards_per_func, torch.full((n_pad, rewards_per_func.shape[1]), float("nan"))], dim=0
            )
        prompts = [x["prompt"] for x in rows]
        prompt_ids, _, _ = self._tokenize_prompts(prompts)
        self._ext_replay = {
            "prompt_ids": prompt_ids,
            "completion_ids": c_ids,
            "logprobs": lps,
            "is_pad": is_pad,
            "group_ids": gids + [-1] * n_pad,
            "rewards_per_func": rewards_per_func,
        }
        # TRL's completions-table deques hold generation_batch_size rows, i.e. exactly the latest generation batch;
        # this batch may hold more (all ranks, pads included). Start the table afresh with room for all of it, so
        # no rollout is evicted and every column TRL extends (log_extra ones too) holds exactly this batch's rows
        # when the pad rows are dropped (_ext_log_batch_metrics).
        compat.resize_completion_logs(self, n_star * self.accelerator.num_processes, keep_last=0)
        saved = (self.num_generations, self.num_generations_eval)
        self.num_generations, self.num_generations_eval = 1, 1  # TRL's view(-1, G) must accept any row count
        try:
            return GRPOTrainer._generate_and_score_completions(self, rows)
        finally:
            self.num_generations, self.num_generations_eval = saved
            self._ext_replay = None

    # ------------------------------------------------------------------------------------------ TRL overrides
    def _generate(self, prompts: list):
        replay = self._ext_replay
        if replay is None:
            return super()._generate(prompts)
        mode = "train" if self.model.training else "eval"
        c_ids = replay["completion_ids"]
        completions = self.processing_class.batch_decode(c_ids, skip_special_tokens=True)
        if isinstance(prompts[0], list):  # conversational prompts
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        self._ext_log_generation_metrics(mode, replay["prompt_ids"], c_ids, replay["is_pad"])
        return replay["prompt_ids"], c_ids, None, completions, replay["logprobs"], {}, None, []

    def _ext_log_generation_metrics(self, mode, prompt_ids, completion_ids, is_pad) -> None:
        """TRL's ``_generate`` metrics (GT 2276-2310) for replayed rollouts, excluding pad rows."""
        device = self.accelerator.device
        keep = torch.tensor([not p for p in is_pad], device=device)
        p_len = torch.tensor([len(x) for x in prompt_ids], device=device)
        c_len = torch.tensor([len(x) for x in completion_ids], device=device)
        eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]
        trunc = torch.tensor([len(x) == 0 or x[-1] not in eos_and_pad for x in completion_ids], device=device)
        keep, p_len, c_len, trunc = (compat.gather(t) for t in (keep, p_len, c_len, trunc))
        p_len, c_len, trunc = p_len[keep], c_len[keep], trunc[keep]
        if mode == "train":
            self.state.num_input_tokens_seen += int((p_len.sum() + c_len.sum()).item())
        m = compat.metrics(self, mode)
        m["num_tokens"] = [self.state.num_input_tokens_seen]
        if c_len.numel() == 0:  # every row is a pad row: nothing generated (NaN is dropped by TRL's `log`)
            c_len = torch.full((1,), float("nan"), device=device)
            trunc = torch.zeros(1, dtype=torch.bool, device=device)
        m["completions/mean_length"].append(c_len.float().mean().item())
        m["completions/min_length"].append(c_len.float().min().item())
        m["completions/max_length"].append(c_len.float().max().item())
        m["completions/clipped_ratio"].append(trunc.float().mean().item())
        term = c_len[~trunc]
        term = term if term.numel() else torch.zeros(1, device=device)
        m["completions/mean_terminated_length"].append(term.float().mean().item())
        m["completions/min_terminated_length"].append(term.float().min().item())
        m["completions/max_terminated_length"].append(term.float().max().item())

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        replay = self._ext_replay
        device = self.accelerator.device
        if replay is not None and replay["rewards_per_func"] is not None:
            rpf = compat.gather(replay["rewards_per_func"].to(device))
        else:
            rpf = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if replay is not None:
            pad = compat.gather(torch.tensor(replay["is_pad"], device=device))
            if pad.any():
                rpf = rpf.clone()
                rpf[pad] = float("nan")
        self._ext_pending = self._ext_build_batch(inputs, prompts, completion_ids_list, rpf)
        return rpf

    def _generate_and_score_completions(self, inputs):
        self._ext_pending = None
        out = super()._generate_and_score_completions(inputs)
        return self._ext_finalize(out)

    def _compute_loss(self, model, inputs):
        kl_rescale = inputs.get("ext_kl_rescale")
        if kl_rescale is None or self.beta == 0.0:
            return self._ext_compute_loss(model, inputs)
        # Pad rows (sequence-level losses): TRL divides beta * KL by all B rows, pads included; N / n_real restores
        # the mean over real rows (pads have an all-zero loss mask, so they add no KL themselves).
        beta = self.beta
        self.beta = beta * float(kl_rescale)
        try:
            return self._ext_compute_loss(model, inputs)
        finally:
            self.beta = beta

    def _ext_compute_loss(self, model, inputs):
        """Signal-only denominators (notes D) by advantage rescaling, then TRL's ``_compute_loss``."""
        if not self._ext.signal_only_denominator or not self.model.training:
            return super()._compute_loss(model, inputs)
        adv = inputs["advantages"]
        lt = self.loss_type
        if lt in compat.SEQUENCE_LEVEL_LOSSES:
            # TRL: mean over the B local rows / GA, DDP mean over P ranks -> 1/(B*P*spg) per generation batch.
            # Signal-only: 1/N_signal, N_signal = global rows of live groups (notes D, probe p7).
            b = adv.shape[0]
            total = b * self.accelerator.num_processes * self.args.steps_per_generation
            scale = total / inputs["ext_num_signal"].clamp(min=1).to(adv.dtype)
        elif lt in compat.GLOBAL_TOKEN_LEVEL_LOSSES:
            # TRL: sum / (num_items_in_batch / P * GA / spg); signal-only replaces num_items_in_batch by the global
            # loss-mask tokens of live rows, for the policy term only (KL keeps num_items_in_batch).
            scale = inputs["num_items_in_batch"].clamp(min=1).to(adv.dtype) / inputs[
                "ext_num_signal_tokens"].clamp(min=1).to(adv.dtype)
        elif lt in compat.LOCAL_TOKEN_LEVEL_LOSSES:
            mask = inputs["completion_mask"] if "tool_mask" not in inputs else \
                inputs["completion_mask"] * inputs["tool_mask"]
            live = inputs["ext_signal_mask"].to(mask.dtype).unsqueeze(1)
            scale = mask.sum().clamp(min=1).to(adv.dtype) / (mask * live).sum().clamp(min=1).to(adv.dtype)
        else:  # guarded in the config; kept for subclasses that change loss_type after init
            raise ValueError(f"signal_only_denominator does not support loss_type={lt!r}.")
        return super()._compute_loss(model, {**inputs, "advantages": adv * scale})

    def _save_checkpoint(self, model, trial):
        # Written *before* Trainer's save: Trainer._save_checkpoint pushes the folder to the Hub (push_to_hub) and
        # rotates old checkpoints from inside, so a file added afterwards would be missing from pushed checkpoints.
        if self.args.should_save:
            folder = f"{compat.checkpoint_prefix()}-{self.state.global_step}"
            out_dir = os.path.join(self._get_output_dir(trial=trial), folder)
            os.makedirs(out_dir, exist_ok=True)
            torch.save(self.ext_state_dict(), os.path.join(out_dir, EXT_STATE_FILE))
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, EXT_STATE_FILE)
        if not os.path.exists(path):
            warnings.warn(
                f"Resuming from {checkpoint} without {EXT_STATE_FILE}: trl_ext state (counters"
                f"{', estimator state' if type(self) is not GRPOTrainer else ''}) starts fresh.", stacklevel=2,
            )
            return
        self.load_ext_state_dict(torch.load(path, map_location="cpu", weights_only=True))

    # ------------------------------------------------------------------------------------------ internals
    def _ext_warn_once(self, key: str, msg: str) -> None:
        if key not in self._ext_warned:
            self._ext_warned.add(key)
            warnings.warn(msg, stacklevel=3)

    def _ext_build_batch(self, inputs, prompts, completion_ids_list, rpf: torch.Tensor) -> RolloutBatch:
        """Gather the per-row data of this generation batch into a :class:`RolloutBatch` (all ranks identical)."""
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        n_proc, rank = self.accelerator.num_processes, self.accelerator.process_index
        n_local = len(prompts)
        replay = self._ext_replay
        col = compat.ROW_IDX_COLUMN
        has_idx = all(col in x for x in inputs)
        row_idx_local = torch.tensor([int(x[col]) if has_idx else -1 for x in inputs], dtype=torch.long,
                                     device=device)
        row_idx = compat.gather(row_idx_local).cpu()
        if replay is not None:
            is_pad = compat.gather(torch.tensor(replay["is_pad"], device=device)).cpu()
            lens_local = [0 if p else len(c) for p, c in zip(replay["is_pad"], replay["completion_ids"])]
            local_g = torch.tensor(replay["group_ids"], dtype=torch.long, device=device)
            rank_col = torch.full_like(local_g, rank)
            keys = compat.gather(torch.stack([rank_col, local_g], dim=1)).cpu()
        else:
            is_pad = torch.zeros(n_local * n_proc, dtype=torch.bool)
            lens_local = [len(c) for c in completion_ids_list]
            keys = None
        completion_lengths = compat.gather(torch.tensor(lens_local, dtype=torch.long, device=device)).cpu()
        n = int(row_idx.shape[0])
        group_ids = torch.full((n,), -1, dtype=torch.long)
        if keys is not None:
            key_list = [tuple(k) for k in keys.tolist()]
        elif bool((row_idx >= 0).all()):
            key_list = row_idx.tolist()
        else:
            g = self.num_generations if mode == "train" else self.num_generations_eval
            self._ext_warn_once(
                "no_row_idx",
                f"Dataset rows lack the '{col}' column (custom dataset or remove_unused_columns=True); grouping rows "
                f"in contiguous blocks of {g} as TRL does.",
            )
            key_list = [i // g for i in range(n)]
        next_id, seen, prev = -1, set(), object()
        for i, key in enumerate(key_list):
            if bool(is_pad[i]):
                continue
            if key != prev:
                if key in seen:
                    raise RuntimeError(
                        f"Rows of group {key!r} are not contiguous in the generation batch; trl_ext needs each "
                        "prompt's rollouts next to each other (TRL's RepeatSampler guarantees it for the default "
                        "path; for _finish_rollouts sort rollouts by group)."
                    )
                seen.add(key)
                next_id += 1
                prev = key
            group_ids[i] = next_id
        rpf = rpf.float()
        w = self.reward_weights.to(rpf.device)
        unscorable = torch.isnan(rpf).all(dim=1)
        rewards = (rpf * w.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = float("nan")
        grades = None
        if self._ext.tie_break_scorer_index is not None:
            grades, rewards = self._ext_tie_break(rpf, group_ids, is_pad, mode)
        extra = {}
        if self.rollout_columns:
            for name in self.rollout_columns:
                missing = [i for i, x in enumerate(inputs) if name not in x]
                if missing:
                    raise KeyError(
                        f"{type(self).__name__}.rollout_columns asks for dataset column {name!r}, missing from the "
                        f"rows (available: {sorted(inputs[0])}). Add the column to the dataset."
                    )
                values = compat.gather_object([x[name] for x in inputs])
                numeric = all(isinstance(v, int | float) and not isinstance(v, bool) or v is None for v in values)
                extra[name] = torch.tensor([float("nan") if v is None else float(v) for v in values],
                                           dtype=torch.float64) if numeric else values
        return RolloutBatch(
            rewards=rewards.cpu(),
            rewards_per_func=rpf.cpu(),
            group_ids=group_ids,
            row_idx=row_idx,
            prompts=compat.gather_object(list(prompts)),
            completion_lengths=completion_lengths,
            is_pad=is_pad.bool(),
            extra=extra,
            num_processes=n_proc,
            process_index=rank,
            local_sizes=[n_local] * n_proc,
            grades=None if grades is None else grades.cpu(),
            mode=mode,
        )

    def _ext_tie_break(self, rpf, group_ids, is_pad, mode):
        """Blend = grade + epsilon * within-class rank (``trl_ext.estimators.tie_break_blend``) on gathered groups.

        Rows whose grade is finite but whose score is NaN keep their grade (no rank bonus) and are counted in
        ``tie_break/nan_scores``; the other rows of their class are ranked among themselves.
        """
        import numpy as np

        from ..estimators import blend_opened_groups, tie_break_blend

        s_idx = self._ext.tie_break_scorer_index
        w = self.reward_weights.to(rpf.device)
        checkers = [i for i in range(rpf.shape[1]) if i != s_idx]
        chk = rpf[:, checkers]
        grades = (chk * w[checkers].unsqueeze(0)).nansum(dim=1)
        grades[torch.isnan(chk).all(dim=1) | is_pad.to(rpf.device)] = float("nan")
        scores = rpf[:, s_idx]
        g_np = grades.cpu().double().numpy()
        s_np = scores.cpu().double().numpy()
        gid = group_ids.numpy()
        nan_score = np.isfinite(g_np) & ~np.isfinite(s_np)
        blended = g_np.copy()
        rank_rows = np.isfinite(g_np) & np.isfinite(s_np)
        if rank_rows.any():
            blended[rank_rows] = tie_break_blend(g_np[rank_rows], s_np[rank_rows], gid[rank_rows],
                                                 float(self._ext.tie_break_epsilon))
        real = ~is_pad.numpy()
        if real.any():
            diag = blend_opened_groups(g_np[real], blended[real], gid[real])
            m = compat.metrics(self, mode)
            m["tie_break/groups_opened"].append(float(diag.n_opened))
            m["tie_break/frac_tied_by_checker"].append(float(diag.frac_tied_by_checker))
            # share of checker-tied groups the blend opened; undefined (NaN -> dropped by TRL's log) without ties
            m["tie_break/frac_opened"].append(float(diag.frac_opened) if diag.n_tied_by_checker else float("nan"))
            m["tie_break/attempts_in_opened_frac"].append(diag.attempts_in_opened / max(int(real.sum()), 1))
            m["tie_break/nan_scores"].append(float(nan_score.sum()))
            if mode == "train":
                self._ext_totals["tie_break_groups_opened_total"] += int(diag.n_opened)
        return grades, torch.as_tensor(blended, dtype=torch.float32)

    def _ext_confidence_scale(self, batch: RolloutBatch) -> torch.Tensor:
        """(N,) multiplier: ``min(1, score range / noise floor)`` on groups the blend opened, 1 elsewhere."""
        import numpy as np

        scale = torch.ones(batch.num_rows, dtype=torch.float32)
        g = batch.grades.double().numpy()
        blended = batch.rewards.double().numpy()
        s = batch.rewards_per_func[:, self._ext.tie_break_scorer_index].double().numpy()
        gid = batch.group_ids.numpy()
        floor = float(self._ext.scorer_noise_floor)
        applied = []
        for k in range(batch.num_groups):
            rows = (gid == k) & np.isfinite(g)
            if rows.sum() < 2:
                continue
            gg, bb, ss = g[rows], blended[rows], s[rows]
            if gg.max() - gg.min() == 0 and bb.max() - bb.min() > 0:  # formerly tied, opened by the blend
                ss = ss[np.isfinite(ss)]
                c = min(1.0, float(ss.max() - ss.min()) / floor) if ss.size else 0.0
                scale[torch.as_tensor(gid == k)] = c
                applied.append(c)
        if applied:
            self.log_ext_metric("tie_break/confidence_scale_mean", float(np.mean(applied)), batch.mode)
        return scale

    def _ext_finalize(self, out: dict) -> dict:
        """Replace TRL's advantages with :meth:`compute_advantages` and add trl_ext bookkeeping and metrics."""
        batch = self._ext_pending
        self._ext_pending = None
        if batch is None:
            raise RuntimeError("internal: _calculate_rewards did not run before _generate_and_score_completions ended.")
        mode = batch.mode
        device = out["advantages"].device
        adv = self.compute_advantages(batch)
        if not isinstance(adv, torch.Tensor):
            raise TypeError(f"{type(self).__name__}.compute_advantages must return a torch.Tensor, got "
                            f"{type(adv).__name__}.")
        if adv.ndim not in (1, 2) or adv.shape[0] != batch.num_rows:
            raise ValueError(f"{type(self).__name__}.compute_advantages returned shape {tuple(adv.shape)}; expected "
                             f"({batch.num_rows},) or ({batch.num_rows}, T) (global rows of the RolloutBatch).")
        adv = adv.detach().float().cpu().clone()
        valid = batch.valid
        bad = ~torch.isfinite(adv.reshape(batch.num_rows, -1)).all(dim=1) & valid
        if bad.any():
            raise ValueError(f"{type(self).__name__}.compute_advantages returned non-finite advantages on "
                             f"{int(bad.sum())} valid rows (first: {bad.nonzero()[:5].flatten().tolist()}).")
        shape_tail = (1,) * (adv.ndim - 1)
        adv = torch.where(valid.view(-1, *shape_tail), adv, torch.zeros_like(adv))
        adv = torch.nan_to_num(adv, nan=0.0)
        if self._ext.tie_break_confidence_scaling and batch.grades is not None:
            adv = adv * self._ext_confidence_scale(batch).view(-1, *shape_tail)
        local = batch.local_slice()
        if adv.ndim == 2 and adv.shape[1] != out["completion_ids"].shape[1]:
            raise ValueError(f"(N, T) advantages must have T = completion length {out['completion_ids'].shape[1]}, "
                             f"got {adv.shape[1]}.")
        n_real = int((~batch.is_pad).sum())
        seq_pad_rescale = bool(batch.is_pad.any()) and self.loss_type in compat.SEQUENCE_LEVEL_LOSSES and n_real > 0
        if seq_pad_rescale and not self._ext.signal_only_denominator:
            # Sequence-level losses average over all B rows, pads included; rescale so the policy term averages over
            # real rows only: exact by positive homogeneity (notes D), independent of how many pads each rank got.
            out["advantages"] = (adv[local] * (batch.num_rows / n_real)).to(device)
        else:
            out["advantages"] = adv[local].to(device)
        if seq_pad_rescale:
            # the KL term has the same B-row normalizer: _compute_loss scales beta by N / n_real (0-dim: survives
            # the shuffle and split, notes 0.2)
            out["ext_kl_rescale"] = torch.tensor(batch.num_rows / n_real, dtype=torch.float32, device=device)
        # pad rows: no loss, excluded from the token normalizer
        pad_local = batch.is_pad[local].to(device)
        if pad_local.any():
            out["completion_mask"] = out["completion_mask"] * (~pad_local).unsqueeze(1).to(out["completion_mask"].dtype)
            if "tool_mask" in out:
                out["tool_mask"] = out["tool_mask"] * (~pad_local).unsqueeze(1).to(out["tool_mask"].dtype)
        loss_mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
        if pad_local.any() or batch.is_pad.any():
            out["num_items_in_batch"] = compat.gather(loss_mask.sum()).sum()
        # signal-only bookkeeping (global counts survive shuffle/split as 0-dim tensors, notes 0.2)
        nonzero_row = adv.reshape(batch.num_rows, -1).ne(0).any(dim=1) & valid
        live_groups = torch.zeros(max(batch.num_groups, 1), dtype=torch.bool)
        gid = batch.group_ids
        if nonzero_row.any():
            live_groups[gid[nonzero_row]] = True
        live_row = (gid >= 0) & live_groups[gid.clamp(min=0)] & ~batch.is_pad
        if self._ext.signal_only_denominator:
            live_local = live_row[local].to(device)
            out["ext_num_signal"] = live_row.sum().to(device)
            out["ext_num_signal_tokens"] = compat.gather((loss_mask * live_local.unsqueeze(1)).sum()).sum()
            out["ext_signal_mask"] = live_local
        self._ext_log_batch_metrics(batch, adv, live_row, mode)
        self.last_rollout_batch = batch
        self.last_advantages = adv
        return out

    def _ext_log_batch_metrics(self, batch: RolloutBatch, adv: torch.Tensor, live_row: torch.Tensor, mode: str):
        m = compat.metrics(self, mode)
        real = ~batch.is_pad
        gid = torch.where(batch.is_pad, torch.full_like(batch.group_ids, -1), batch.group_ids)
        # frac_reward_zero_std: fraction of rows whose group (>= 2 scorable rewards) has zero std, on the reward the
        # estimator used. Fixes TRL's reading for G = 1 (always 1.0), ragged groups and scale_rewards="batch".
        std_row = torch.full((batch.num_rows,), float("nan"))
        if (gid >= 0).any():
            k = int(gid.max()) + 1
            std_row[gid >= 0] = _group_mean_std(batch.rewards[gid >= 0].float(), gid[gid >= 0], k)[1][gid[gid >= 0]]
        defined = ~torch.isnan(std_row)
        if defined.any():
            frac = torch.isclose(std_row[defined], torch.zeros_like(std_row[defined])).float().mean().item()
            compat.replace_last_metric(self, mode, "frac_reward_zero_std", frac)
        else:  # no group with >= 2 rewards (e.g. G = 1): undefined -> NaN, which TRL's `log` drops (logs None)
            compat.replace_last_metric(self, mode, "frac_reward_zero_std", float("nan"))
        # completions table: drop pad rows, log the final advantages
        flat_adv = adv.reshape(batch.num_rows, -1)
        adv_log = flat_adv[:, 0] if adv.ndim == 1 else flat_adv.mean(dim=1)
        compat.rewrite_completion_logs(self, batch.num_rows, real.tolist(), adv_log.tolist())
        if self._ext.log_rollout_metadata:
            from collections import deque

            keep = real.tolist()
            cols = {"row_idx": batch.row_idx.tolist(), "group_id": batch.group_ids.tolist()}
            for name, values in batch.extra.items():
                cols[name] = values.tolist() if isinstance(values, torch.Tensor) else list(values)
            # align each metadata column with the `prompt` column: its older rows (None where the column did not
            # exist yet), then this batch's real rows
            n_prev = max(len(self._logs["prompt"]) - int(real.sum()), 0)
            for name, values in cols.items():
                old = list(self._logs["extra"][name])[-n_prev:] if n_prev else []
                old = [None] * (n_prev - len(old)) + old
                self._logs["extra"][name] = deque(old + [v for v, k in zip(values, keep) if k],
                                                  maxlen=self._logs["prompt"].maxlen)
        if self._ext_replay is not None:
            # variable-size batch: the table holds exactly this generation batch's real rollouts (TRL's fixed-size
            # deques hold exactly the latest generation batch too)
            n_keep = int(real.sum())
            compat.resize_completion_logs(self, max(n_keep, int(self.args.generation_batch_size)), keep_last=n_keep)
        # shut gate on the checker grade (the blend's input) or the reward
        if self._ext.log_shut_gate:
            r = batch.grades if batch.grades is not None else batch.rewards
            stats = shut_gate_stats(r[real], batch.group_ids[real], success_threshold=self._ext.gate_success_threshold,
                                    atol=self._ext.gate_atol)
            for name, value in stats.as_metrics("gate/").items():
                m[name].append(value)
        # signal share and generated tokens
        n_real = int(real.sum())
        m["ext/signal_row_frac"].append(float(live_row.sum()) / max(n_real, 1))
        gen_tokens = int(batch.completion_lengths[real].sum())
        m["ext/generated_tokens"].append(float(gen_tokens))
        m["ext/rollouts"].append(float(n_real))
        if mode == "train":
            self._ext_totals["generated_tokens_total"] += gen_tokens
            self._ext_totals["generation_batches"] += 1
        if self._ext_totals["generation_batches"]:
            m["ext/generated_tokens_total"] = [float(self._ext_totals["generated_tokens_total"])]

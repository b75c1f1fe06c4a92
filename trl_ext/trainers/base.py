"""``trl_ext.GRPOTrainer``: a drop-in subclass of TRL 1.16's ``GRPOTrainer`` that every trl_ext trainer builds on.

With a default :class:`ExtGRPOConfig` it computes exactly TRL's advantages (bitwise for TRL's fixed-size groups)
and only *adds* metrics. On top it provides:

* **hooks for trainer authors** (see ``docs/base_trainer.md``):

  - :class:`~trl_ext.trainers.batch.RolloutBatch`: the gathered, rank-identical view of one generation batch;
  - ``advantage_estimator``: any estimator registered with
    :func:`trl_ext.estimators.register_advantage_estimator` (``grpo`` -- TRL's, bitwise --, ``dr_grpo``,
    ``rloo``, ``reinforce_pp``, or your own), selected by name; :meth:`GRPOTrainer.compute_advantages` dispatches
    through one valid-row adapter (pad rows, NaN rewards, ragged groups); override it for estimators that need
    more than rewards and groups (BASIS, V0.5, PAIR);
  - :class:`~trl_ext.trainers.rollouts.RolloutStrategy` objects for the rollout allocation
    (:meth:`GRPOTrainer.create_rollout_strategy`): TRL's fixed groups, DAPO dynamic sampling
    (``dynamic_sampling=True``), V0.5's OSLA rounds, PAIR's probe-then-continue; they generate with
    :meth:`GRPOTrainer.generate_rollouts`, score with :meth:`GRPOTrainer.score_rollouts_local` and feed variable
    rollout counts into TRL's tail with :meth:`GRPOTrainer.finish_rollouts`;
  - ``unique_prompt_sampler = True``: the sampler yields unique prompts (G = 1 in the sampler);
  - ``rollout_columns``: dataset columns gathered into ``RolloutBatch.extra``;
  - :meth:`GRPOTrainer.ext_state_dict` / :meth:`GRPOTrainer.load_ext_state_dict`: state saved as
    ``trl_ext_state.pt`` in every checkpoint and restored on ``resume_from_checkpoint``;
  - :meth:`GRPOTrainer.log_ext_metric`: a scalar into ``self._metrics`` (every ``report_to`` backend).

* **measurement options** ("Measurement Discipline for RLVR"):

  - signal-only loss denominators (``signal_only_denominator``);
  - the tie-break blend reward (``tie_break_scorer_index``) computed on the gathered groups, with optional
    confidence scaling of formerly tied groups by scorer separation relative to the noise floor;
  - shut-gate diagnostics every generation batch (``gate/*``) and **one generated-token counter**
    (``ext/generated_tokens``, ``ext/generated_tokens_total``) at the generation call every strategy goes through.

Every contact with TRL private names goes through :mod:`trl_ext.trainers._trl_compat` (the ``ext_*`` hooks below
are public names that its :class:`~trl_ext.trainers._trl_compat.TRLGlue` forwards TRL's private methods to).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, ClassVar

import numpy as np
import torch
import trl  # noqa: E402  (after _trl_compat's version check)

from ..estimators.baselines import (
    _group_mean_std,
    estimator_min_group_size,
    get_advantage_estimator,
    trl_grpo_advantages,
)
from ..measurement.shut_gate import shut_gate_stats
from . import _trl_compat as compat
from ._vllm_compat import install_colocate_weight_sync
from .batch import RolloutBatch
from .keyed_sampling_mixin import KeyedSamplingMixin
from .rollouts import DynamicSampling, FixedGroups, RolloutStrategy, validate_dynamic_sampling

__all__ = ["ExtGRPOConfig", "GRPOTrainer", "RolloutBatch", "trl_grpo_advantages", "EXT_STATE_FILE",
           "as_config", "parse_kwargs_field"]

logger = logging.getLogger(__name__)

EXT_STATE_FILE = "trl_ext_state.pt"
"""File name of the trl_ext state inside each ``checkpoint-*`` directory."""

_EXT_STATE_VERSION = 1


# ---------------------------------------------------------------------------------------------------------- config
@dataclass
class ExtGRPOConfig(trl.GRPOConfig):
    """:class:`trl.GRPOConfig` plus the trl_ext measurement options.

    Every trl_ext option is one dataclass field below; its ``help`` metadata documents it (the text
    ``HfArgumentParser`` shows on the command line, as in TRL's own configs), and ``docs/base_trainer.md`` describes
    them. Every new option is off (or purely additive) by default, so a default ``ExtGRPOConfig`` trains exactly
    like ``trl.GRPOConfig``. Which config classes a trainer accepts (one rule for every trl_ext trainer, see
    :func:`as_config`): its own config class or a subclass of it, or a plain ``trl.GRPOConfig`` or
    ``ExtGRPOConfig``, which is upgraded to the trainer's config class with that class's defaults for the fields it
    lacks. Anything else (another trainer's config class included) is a ``TypeError``.
    """

    advantage_estimator: str = field(
        default="grpo",
        metadata={"help": "Registered advantage estimator: grpo (TRL's advantages, bitwise, honouring scale_rewards "
                          "and multi_objective_aggregation; the default), dr_grpo (group mean, no std; use with "
                          "loss_type='dr_grpo'), rloo (leave-one-out), reinforce_pp (global batch mean and std; "
                          "accepts num_generations=1), or a name registered with "
                          "trl_ext.estimators.register_advantage_estimator."},
    )
    advantage_estimator_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments of the advantage estimator (dict or JSON string), e.g. "
                          "{\"normalize\": true} for rloo."},
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "DAPO dynamic sampling (trl_ext.trainers.rollouts.DynamicSampling): drop groups whose "
                          "rewards are all equal and generate more prompts until the batch is full or "
                          "dynamic_sampling_max_rounds extra rounds ran."},
    )
    dynamic_sampling_max_rounds: int = field(
        default=3,
        metadata={"help": "Cap of extra generation rounds per generation batch (dynamic_sampling); each round is at "
                          "most as large as the missing groups."},
    )
    dynamic_sampling_std_atol: float = field(
        default=0.0,
        metadata={"help": "A group is dropped (dynamic_sampling) when max - min of its finite rewards is <= this."},
    )
    shared_prefix_rollouts: bool = field(
        default=False,
        metadata={"help": "Generate with trl_ext.measurement.shared_prefix.shared_prefix_generate: a prompt's "
                          "completions run as one generation while they agree and fork at the first differing "
                          "token (exactly independent sampling; with keyed_sampling the same tokens). "
                          "Transformers generation only (refused with use_vllm); sampling settings only "
                          "(temperature, top-k, top-p, min-p). Off by default so that the default run stays "
                          "bitwise equal to TRL (unkeyed, it draws the same law from a different random stream). "
                          "Recommended on for transformers generation with num_generations >= 4: measured 0.23-0.65 "
                          "of generate's wall time and 0.10-0.33 of its model forward tokens on "
                          "SmolLM2-135M-Instruct (CPU, G = 4-16, T = 0.7-1.0; the larger G, the lower); nothing to "
                          "share with one rollout per prompt (BASIS accepts it, saving 0). See "
                          "docs/shared_prefix.md."},
    )
    signal_only_denominator: bool = field(
        default=False,
        metadata={"help": "Divide the policy loss only by the sequences (sequence-level losses grpo, sapo, luspo, "
                          "dr_grpo) or tokens (token-level losses dapo, cispo, vespo, bnpo) of groups that carry a "
                          "nonzero advantage, instead of all of them (the paper's 'fair-accounting' configuration: a "
                          "tied group contributes no signal and is also dropped from the count it averages over). "
                          "The KL and entropy terms keep TRL's normalizers. For equal-size groups this equals "
                          "dividing by the number of live groups of per-group means. Off by default."},
    )
    tie_break_scorer_index: int | None = field(
        default=None,
        metadata={"help": "Index into reward_funcs of the scorer (any reward function or reward model). When set, "
                          "the other reward functions are checkers whose weighted sum is the grade, and the reward is "
                          "grade + tie_break_epsilon * within-class rank of the score (rank normalized to [0, 1] "
                          "inside each (group, grade) class), computed on the groups gathered across ranks."},
    )
    tie_break_epsilon: float = field(
        default=0.1,
        metadata={"help": "Tie-break blend weight (the paper's epsilon = 0.1; not GRPO's clipping epsilon). Must be "
                          "> 0 and below the smallest gap between distinct grades inside a group (checked at run "
                          "time), so the blend never overrules the checker."},
    )
    tie_break_confidence_scaling: bool = field(
        default=False,
        metadata={"help": "Multiply the advantages of every group the blend opened (checker-tied, scorer-separated) "
                          "by min(1, (max score - min score) / scorer_noise_floor): a group the scorer separated by "
                          "less than its own noise floor is shrunk proportionally instead of getting a full-strength "
                          "update. Requires scorer_noise_floor."},
    )
    scorer_noise_floor: float | None = field(
        default=None,
        metadata={"help": "The scorer's noise floor on its own scale (3 x the 95th percentile of per-item spread; "
                          "measure it with trl-ext noise-floor)."},
    )
    log_shut_gate: bool = field(
        default=True,
        metadata={"help": "Log the shut-gate diagnostics gate/tied_share, gate/tied_all_right_share, "
                          "gate/tied_all_wrong_share and gate/tied_correct_share every generation batch."},
    )
    gate_success_threshold: float = field(
        default=0.5,
        metadata={"help": "A rollout counts as correct for the shut gate when its reward (the grade under the "
                          "tie-break) is >= this."},
    )
    gate_atol: float = field(default=0.0, metadata={"help": "Tie tolerance of the shut gate (max - min <= gate_atol)."})
    log_rollout_metadata: bool = field(
        default=False,
        metadata={"help": "Add row_idx, group_id and the trainer's rollout_columns to the completions table."},
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

    uses_advantage_estimator: ClassVar[bool] = True
    """False for method configs whose trainer computes its own advantages (V0.5, BASIS, PAIR): then
    ``advantage_estimator`` must stay at its default."""

    def __post_init__(self):
        self.advantage_estimator_kwargs = parse_kwargs_field(self.advantage_estimator_kwargs,
                                                             "advantage_estimator_kwargs")
        group_size = self.num_generations if isinstance(self.num_generations, int) else 2
        compat.validate_config_with_placeholder_group_size(self, super().__post_init__, group_size=group_size)
        validate_ext_config(self)


def parse_kwargs_field(value: Any, name: str) -> dict:
    """A dict-valued config field given as a dict, a JSON object string (command line) or ``None``."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} must be a dict or a JSON object string, got {value!r}: {e}") from e
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict (or a JSON object string), got {type(value).__name__}.")
    return dict(value)


def as_config(args: Any, config_class: type, trainer_name: str):
    """Return ``args`` as an instance of ``config_class`` (the one rule every trl_ext trainer applies).

    What decides is the config's *library class*: the most derived trl_ext class in its MRO (``None`` for a plain
    ``trl.GRPOConfig`` or a user's own subclass of it).

    * no library class (``trl.GRPOConfig`` or a user's subclass of it, whose extra fields the user's script may
      read), or a library class that is a parent of ``config_class`` (the base :class:`ExtGRPOConfig`, or a user's
      subclass of it, given to a method trainer): upgraded, unless it already is a ``config_class`` -- a
      ``config_class`` object with the same attribute values (the user's extra fields included), the defaults of
      ``config_class`` for the fields it lacks, and ``config_class``'s own validation (TRL's ``__post_init__`` is
      not re-run: its derived fields are kept);
    * a library class equal to ``config_class`` (the trainer's own config, or a user's subclass of it): returned
      unchanged;
    * any other library class raises ``TypeError``: another trainer's method config (a ``V05GRPOConfig`` given to
      the PAIR trainer, or any method config given to the base ``trl_ext.GRPOTrainer``), whose method options would
      otherwise be silently ignored.
    """
    if not isinstance(args, trl.GRPOConfig):
        raise TypeError(f"{trainer_name} needs a {config_class.__name__} (or a trl.GRPOConfig), got "
                        f"{type(args).__name__}.")
    library = next((c for c in type(args).__mro__ if c.__module__.split(".")[0] == "trl_ext"), None)
    if library is not None and not issubclass(config_class, library):
        raise TypeError(
            f"{trainer_name} needs a {config_class.__name__}, got a {type(args).__name__} ({library.__name__}), "
            f"another trainer's config: its method options would be ignored. Pass args={config_class.__name__}(...) "
            "with the same arguments (a plain trl.GRPOConfig or ExtGRPOConfig is upgraded with its defaults), or "
            f"use the trainer that {library.__name__} belongs to."
        )
    if isinstance(args, config_class):
        return args
    new = object.__new__(config_class)
    new.__dict__.update(args.__dict__)
    for f in fields(config_class):
        if f.name in new.__dict__:
            continue
        if f.default is not MISSING:
            setattr(new, f.name, f.default)
        elif f.default_factory is not MISSING:
            setattr(new, f.name, f.default_factory())
    validate = getattr(config_class, "validate_method_options", None)
    if validate is not None:
        validate(new)
    else:
        validate_ext_config(new)
    return new


def validate_ext_config(o) -> None:
    """Check the trl_ext fields of a config; raises ``ValueError`` saying what to change."""
    args = o
    o.advantage_estimator_kwargs = parse_kwargs_field(o.advantage_estimator_kwargs, "advantage_estimator_kwargs")
    if not getattr(o, "uses_advantage_estimator", True):
        if o.advantage_estimator != "grpo" or o.advantage_estimator_kwargs:
            raise ValueError(f"{type(o).__name__} computes its own advantages; advantage_estimator="
                             f"{o.advantage_estimator!r} would be ignored. Leave advantage_estimator at 'grpo' (it "
                             "then only applies to evaluation batches) or use trl_ext.GRPOTrainer / ExtGRPOConfig.")
    try:
        min_g = estimator_min_group_size(o.advantage_estimator)
    except KeyError as e:
        raise ValueError(f"advantage_estimator={o.advantage_estimator!r} is not registered: {e.args[0]}. Register it "
                         "with @trl_ext.estimators.register_advantage_estimator(name) before building the config."
                         ) from None
    g = o.num_generations
    if isinstance(g, int) and g < min_g and getattr(o, "uses_advantage_estimator", True):
        raise ValueError(f"advantage_estimator={o.advantage_estimator!r} needs num_generations >= {min_g} (it has a "
                         f"per-prompt baseline), got {g}. Raise num_generations or pick an estimator with a "
                         "cross-prompt baseline (reinforce_pp).")
    validate_dynamic_sampling(o)
    if getattr(o, "shared_prefix_rollouts", False):
        if getattr(o, "use_vllm", False):
            raise ValueError(
                "shared_prefix_rollouts=True is implemented for transformers generation only (use_vllm=False). vLLM "
                "already shares each prompt's KV cache between its samples (prefix caching, n>1 sampling) but does not "
                "expose running samples together until their first differing token. Set use_vllm=False or "
                "shared_prefix_rollouts=False."
            )
        if getattr(o, "use_transformers_continuous_batching", False):
            raise ValueError("shared_prefix_rollouts=True replaces transformers' generate loop and cannot be combined "
                             "with use_transformers_continuous_batching; turn one of them off.")
    if o.dynamic_sampling and isinstance(g, int) and g < 2:
        raise ValueError("dynamic_sampling drops groups whose rewards are all equal, which needs num_generations >= 2; "
                         f"got {g}.")
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


def _last_complete_checkpoint(output_dir: str) -> str:
    """The newest ``checkpoint-N`` folder of ``output_dir`` that holds ``trainer_state.json`` (written last by
    Trainer's save); newer incomplete folders are reported and skipped."""
    import re

    prefix = compat.checkpoint_prefix()
    pattern = re.compile(rf"^{prefix}-(\d+)$")
    found = []
    if os.path.isdir(output_dir):
        for name in os.listdir(output_dir):
            m = pattern.match(name)
            if m and os.path.isdir(os.path.join(output_dir, name)):
                found.append((int(m.group(1)), os.path.join(output_dir, name)))
    skipped = []
    for _, path in sorted(found, reverse=True):
        if os.path.exists(os.path.join(path, "trainer_state.json")):
            if skipped:
                warnings.warn(f"Skipping incomplete checkpoint folder(s) {skipped} (no trainer_state.json: a save was "
                              f"interrupted); resuming from {path}. Delete them to silence this warning.", stacklevel=3)
            return path
        skipped.append(path)
    raise ValueError(f"No complete checkpoint (a {prefix}-N folder with trainer_state.json) found in {output_dir}"
                     + (f"; incomplete: {skipped}" if skipped else "") + ".")


def _check_dataset(dataset, name: str) -> None:
    """Clear early errors for a dataset TRL would fail on deep inside (or train zero steps on)."""
    if dataset is None:
        return
    if isinstance(dataset, dict):
        for key, value in dataset.items():
            _check_dataset(value, f"{name}[{key!r}]")
        return
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns:
        raise ValueError(
            f"{name} has no 'prompt' column (columns: {list(columns)}). TRL's GRPO reads the prompt from a column named "
            "'prompt': rename yours, e.g. dataset = dataset.rename_column('question', 'prompt')."
        )
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ValueError(f"{name} is empty: there is nothing to train or evaluate on.")


def _check_process_layout(num_processes: int) -> None:
    """Fail when a launcher started several processes but the trainer sees one (each would train alone)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1 and num_processes == 1:
        raise RuntimeError(
            f"The launcher started {world} processes (WORLD_SIZE={world}) but this trainer sees 1: every process would "
            "train alone and write the same output_dir. On a machine without GPUs set use_cpu=True in the config (or "
            "launch with `accelerate launch --cpu --multi_gpu --num_processes N` or "
            "examples/accelerate_configs/cpu_two_processes.yaml); on GPUs check that CUDA is visible to every process."
        )


def _validated_reward_func(func):
    """Wrap a plain reward function so a wrong return fails with the function's name (TRL would fail deep inside).

    A reward function must return one value per completion: a real number, or ``None`` / NaN (unscorable). An
    infinite value stops training with an error: the step in progress is not trained on, earlier checkpoints are
    kept. Reward models (``nn.Module``), model ids (``str``) and async functions are passed through unchanged.
    """
    import functools
    import inspect

    if isinstance(func, str | torch.nn.Module) or inspect.iscoroutinefunction(func) or not callable(func) \
            or getattr(func, "_trl_ext_validated", False):
        return func
    name = getattr(func, "__name__", type(func).__name__)

    @functools.wraps(func)
    def validated(*args, **kwargs):
        values = func(*args, **kwargs)
        completions = kwargs.get("completions")
        try:
            items = list(values)
        except TypeError:
            raise TypeError(f"reward function {name!r} returned {type(values).__name__}; it must return a list with "
                            "one float (or None for unscorable) per completion.") from None
        if completions is not None and len(items) != len(completions):
            raise ValueError(f"reward function {name!r} returned {len(items)} values for {len(completions)} "
                             "completions; return one float (or None) per completion.")
        for i, v in enumerate(items):
            if v is None:
                continue
            if not isinstance(v, int | float | np.number) and not (torch.is_tensor(v) and v.numel() == 1):
                raise TypeError(f"reward function {name!r} returned {v!r} ({type(v).__name__}) for completion {i}; "
                                "rewards must be real numbers, or None for an unscorable completion.")
            if math.isinf(float(v)):
                raise ValueError(f"reward function {name!r} returned {float(v)} for completion {i}: rewards must not "
                                 "be infinite (return None to mark a completion unscorable). Training stops here; the "
                                 "current step is not trained on and the last checkpoint is intact.")
        return values

    validated._trl_ext_validated = True
    return validated


_KEYED_VARIANTS: dict[type, type] = {}


def _keyed_variant(cls: type) -> type:
    """``cls`` with :class:`KeyedSamplingMixin` first in its MRO (cached; keeps ``cls``'s name and module)."""
    if cls not in _KEYED_VARIANTS:
        _KEYED_VARIANTS[cls] = type(cls.__name__, (KeyedSamplingMixin, cls),
                                    {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                     "__doc__": cls.__doc__})
    return _KEYED_VARIANTS[cls]


class GRPOTrainer(compat.TRLGlue):
    """Drop-in :class:`trl.GRPOTrainer` with estimator selection, rollout strategies and measurement options.

    Same constructor as :class:`trl.GRPOTrainer`; ``args`` may be an :class:`ExtGRPOConfig` or a plain
    :class:`trl.GRPOConfig` (upgraded by :func:`as_config`). The dataset gains a ``trl_ext_row_idx`` column (the row index) that keys groups; like
    every dataset column it is also passed to reward functions as a keyword argument (TRL reward functions take
    ``**kwargs``).

    Class attributes for subclasses
    -------------------------------
    config_class : type, default ExtGRPOConfig
        The config class the trainer accepts (see :func:`as_config`).
    unique_prompt_sampler : bool, default False
        If True, ``self.num_generations`` is set to 1 after ``__init__``: the train sampler yields
        ``generation_batch_size`` **unique** prompts per generation batch. TRL's own generation then produces one
        rollout per prompt (BASIS, G = 1); strategies that want more call :meth:`finish_rollouts`. A config with
        ``num_generations=1`` (estimators with a cross-prompt baseline) has the same effect.
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

    config_class: ClassVar[type] = ExtGRPOConfig
    unique_prompt_sampler: ClassVar[bool] = False
    rollout_columns: ClassVar[tuple[str, ...]] = ()
    keyed_sampling_enabled: ClassVar[bool] = False  # True on the keyed variant (KeyedSamplingMixin's property)

    def __new__(cls, *args, **kwargs):
        # Keyed sampling is installed only when enabled: with keyed_sampling=True the instance is of a subclass
        # that puts KeyedSamplingMixin first in the MRO (same name and module); otherwise the mixin is absent.
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if getattr(config, "keyed_sampling", False) and not issubclass(cls, KeyedSamplingMixin):
            cls = _keyed_variant(cls)
        return super().__new__(cls)

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "")
            args = self.config_class(f"{str(name).split('/')[-1] or 'model'}-GRPO")
        args = as_config(args, self.config_class, type(self).__name__)
        _check_dataset(train_dataset, "train_dataset")
        _check_dataset(eval_dataset, "eval_dataset")
        train_dataset = _add_row_index(train_dataset)
        eval_dataset = _add_row_index(eval_dataset)
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, **kwargs)
        _check_process_layout(self.accelerator.num_processes)
        # "trl" (TRL's own weight sync), "cpu_layerwise_reload" (vLLM CPU engines) or "none" (no colocated engine)
        self.vllm_weight_sync = install_colocate_weight_sync(self)
        self.reward_funcs = [_validated_reward_func(f) for f in self.reward_funcs]
        n_funcs = len(self.reward_funcs)
        if self.args.tie_break_scorer_index is not None:
            if n_funcs < 2:
                raise ValueError(
                    f"The tie-break blend needs a scorer and at least one checker, but only {n_funcs} reward "
                    "function was given. Pass [checker(s)..., scorer] and set tie_break_scorer_index."
                )
            if self.args.tie_break_scorer_index >= n_funcs:
                raise ValueError(
                    f"tie_break_scorer_index={self.args.tie_break_scorer_index} is out of range for {n_funcs} "
                    f"reward functions ({self.reward_func_names})."
                )
        if self.unique_prompt_sampler or args.num_generations == 1:
            compat.set_sampler_num_generations(self, 1)
        self._ext_gen_tokens_local = 0  # the one generated-token counter (this rank, since the last batch)
        self._ext_sp_local: dict[str, float] = {}
        if self.args.shared_prefix_rollouts:  # unsupported generation settings fail here, not at the first step
            from ..measurement.shared_prefix import check_sampler_settings

            check_sampler_settings(self.shared_prefix_settings())
        self._ext_replay: dict | None = None
        self._ext_pending: RolloutBatch | None = None
        self._ext_warned: set[str] = set()
        self._ext_totals = {"generated_tokens_total": 0, "generation_batches": 0, "tie_break_groups_opened_total": 0,
                            "unscorable_rows_total": 0}
        self.last_rollout_batch: RolloutBatch | None = None
        self.last_advantages: torch.Tensor | None = None
        self.last_estimator_result = None
        self.rollout_strategy: RolloutStrategy = self.create_rollout_strategy()
        if self.rollout_strategy.has_fixed_normalizer and self.args.signal_only_denominator:
            raise ValueError(f"{type(self).__name__}: signal_only_denominator cannot be combined with the fixed policy "
                             f"normalizer of rollout strategy {self.rollout_strategy.name!r}; set "
                             "signal_only_denominator=False.")
        if self.args.dynamic_sampling and self.rollout_strategy.name != "dynamic_sampling":
            raise ValueError(f"dynamic_sampling=True is not available in {type(self).__name__} (its rollout strategy is "
                             f"{self.rollout_strategy.name!r}); set dynamic_sampling=False.")
        if self.accelerator.is_main_process:
            logger.info("%s: %s; advantage estimator %s.", type(self).__name__,
                        self.rollout_strategy.describe(self), self.args.advantage_estimator)

    def create_rollout_strategy(self) -> RolloutStrategy:
        """The train-mode rollout allocation (override in trainers with their own, e.g. V0.5's OSLA rounds)."""
        if self.args.dynamic_sampling:
            from datasets import IterableDataset

            if isinstance(self.train_dataset, IterableDataset) or not hasattr(self.train_dataset, "__len__"):
                raise ValueError("dynamic_sampling draws refill prompts by index and needs a map-style training "
                                 "dataset (datasets.Dataset); got an iterable dataset.")
            return DynamicSampling(self.args.dynamic_sampling_max_rounds, self.args.dynamic_sampling_std_atol,
                                   seed=self.args.seed)
        return FixedGroups()

    # ------------------------------------------------------------------------------------------------ public hooks
    def compute_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """Advantages of every row of the generation batch, from the estimator named by ``advantage_estimator``.

        ``"grpo"`` without ``advantage_estimator_kwargs`` reproduces TRL 1.16 bitwise
        (:func:`~trl_ext.estimators.trl_grpo_advantages` with the trainer's ``scale_rewards`` and
        ``multi_objective_aggregation``), on ragged groups too. Any other registered name goes through
        :meth:`registry_advantages`, the one valid-row adapter. Override this method for estimators that need
        more than rewards and group labels (BASIS, V0.5, PAIR).

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
        name, kwargs = self.args.advantage_estimator, self.args.advantage_estimator_kwargs
        if name == "grpo" and not kwargs:
            gid = torch.where(batch.is_pad, torch.full_like(batch.group_ids, -1), batch.group_ids)
            adv, _ = trl_grpo_advantages(
                batch.rewards, gid, scale_rewards=self.scale_rewards, rewards_per_func=batch.rewards_per_func,
                reward_weights=self.reward_weights, aggregation=self.multi_objective_aggregation,
            )
            return adv
        return self.registry_advantages(batch, name, **kwargs)

    def registry_advantages(self, batch: RolloutBatch, name: str, **kwargs) -> torch.Tensor:
        """Run the registered estimator ``name`` on the valid rows of ``batch``; 0 elsewhere.

        The one valid-row adapter: pad rows and unscorable rows (NaN reward) are removed before the estimator sees
        the batch (so it gets flat ``rewards`` and ``group_ids`` of real, scorable rollouts, groups possibly
        ragged) and get advantage 0; they are counted in ``adv/unscorable_rows``. The estimator's own fallbacks
        (e.g. RLOO singletons) are counted in ``adv/degenerate_rows``.

        Returns
        -------
        Tensor, shape (N,), float32
        """
        estimator = get_advantage_estimator(name)
        valid = batch.valid
        adv = torch.zeros(batch.num_rows, dtype=torch.float32)
        n_unscorable = int((~batch.is_pad & ~valid).sum())
        self.log_ext_metric("adv/unscorable_rows", float(n_unscorable), batch.mode)
        if not bool(valid.any()):
            self.last_estimator_result = None
            return adv
        res = estimator(batch.rewards[valid].double().numpy(), batch.group_ids[valid].numpy(), **kwargs)
        values = np.asarray(getattr(res, "advantages", res), dtype=np.float64)
        if values.shape != (int(valid.sum()),):
            raise ValueError(f"advantage estimator {name!r} returned shape {values.shape}; expected "
                             f"({int(valid.sum())},), one advantage per valid row.")
        adv[valid] = torch.as_tensor(values, dtype=torch.float32)
        self.log_ext_metric("adv/degenerate_rows", float(getattr(res, "n_degenerate", 0)), batch.mode)
        self.last_estimator_result = res
        return adv

    def ext_state_dict(self) -> dict:
        """State saved as ``trl_ext_state.pt`` in each checkpoint (extend with ``state = super().ext_state_dict()``).

        Values must be loadable with ``torch.load(weights_only=True)``: tensors, numbers, strings, bools, ``None``,
        and lists/tuples/dicts of those (convert numpy arrays to tensors or lists). The state must be identical on
        every rank (only the main process writes it; every rank reads it back).
        """
        return {"trl_ext_version": _EXT_STATE_VERSION, "trainer_class": type(self).__name__,
                "global_step": int(self.state.global_step), **self._ext_totals,
                "rollout_strategy": {"name": self.rollout_strategy.name, "state": self.rollout_strategy.state_dict()}}

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
        strat = state.get("rollout_strategy")
        if strat is not None and strat.get("name") == self.rollout_strategy.name:
            self.rollout_strategy.load_state_dict(strat.get("state", {}))
        elif strat is not None:
            warnings.warn(f"{EXT_STATE_FILE} holds the state of rollout strategy {strat.get('name')!r}, but this trainer "
                          f"uses {self.rollout_strategy.name!r}; its state starts fresh.", stacklevel=2)

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
    def generate_rollouts(self, rows: Sequence[dict], *, max_new_tokens: int | None = None,
                          fallback_row: dict | None = None) -> tuple[list[list[int]], list[list[float]] | None]:
        """Generate one completion per row with TRL's backend (counted in ``ext/generated_tokens``).

        Every rank must call it the same number of times (keyed sampling builds its keys with a collective, and
        collective generation back-ends need every rank in the call); a rank may pass no rows.

        Parameters
        ----------
        rows : sequence of dict
            Local dataset rows, one per wanted rollout (repeat a row to get several rollouts of its prompt).
        max_new_tokens : int, optional
            Cap for this call (default: ``max_completion_length``).
        fallback_row : dict, optional
            Row used for the dummy rollouts that equalize the call across ranks when generation is a collective
            (vLLM server, tensor parallel, ZeRO-3/FSDP) and this rank has no row of its own; dummy rollouts are
            generated (and counted), then discarded.

        Returns
        -------
        completion_ids : list of list of int
            EOS-truncated completion token ids, in row order.
        logprobs : list of list of float or None
            Per-token sampling log-probs (vLLM only; ``None`` with transformers generation).
        """
        rows = list(rows)
        n = len(rows)
        if compat.generation_is_collective(self):
            n_max = int(compat.gather(torch.tensor([n], device=self.accelerator.device)).max().item())
            filler = rows[0] if rows else fallback_row
            if n_max > n and filler is None:
                raise ValueError("generate_rollouts: generation is a collective and this rank has no row; pass "
                                 "fallback_row so it can join the call with a dummy rollout.")
            rows = rows + [filler] * (n_max - n)
        if self.keyed_sampling_enabled:
            # Rows generated outside TRL's _generate need their keys set explicitly. Building them is a collective
            # (sample indices count across ranks), so it runs before the empty-rows shortcut.
            requests = self.keyed_requests_for_rows(rows)
            if rows:
                self.set_keyed_requests(requests)
        if not rows:
            return [], None
        prompt_ids = compat.tokenize_prompts(self, [x["prompt"] for x in rows])
        c_ids, lps = self.generate_token_ids(prompt_ids, max_new_tokens=max_new_tokens, equalize=False)
        return c_ids[:n], None if lps is None else lps[:n]

    def generate_token_ids(self, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int | None = None,
                           equalize: bool = True) -> tuple[list[list[int]], list[list[float]] | None]:
        """One sampled continuation per token-id prompt (e.g. ``prompt + prefix``), counted in
        ``ext/generated_tokens``.

        With ``equalize`` (default) the call is padded to the same length on every rank when generation is a
        collective (dummy rows are generated, counted and discarded). ``max_new_tokens`` caps this call only.
        """
        seqs = [list(p) for p in prompt_ids]
        n = len(seqs)
        if equalize and compat.generation_is_collective(self):
            n_call = max(1, int(compat.gather(torch.tensor([n], device=self.accelerator.device)).max().item()))
            dummy = seqs[0] if seqs else [compat.tokenizer(self).eos_token_id]
            seqs += [dummy] * (n_call - n)
            pending = getattr(self, "_keyed_requests", None)
            if n_call > n and pending is not None and len(pending) == n:
                # keyed sampling: the dummy rows need requests too (copies of the first one, marked; their
                # completions are discarded like the rows themselves), else the call would see fewer requests
                # than prompts
                from .keyed_sampling_mixin import KeyedRequest

                filler = (replace(pending[0], meta={**pending[0].meta, "dummy": True}) if pending
                          else KeyedRequest(key=0, sample_index=0, meta={"dummy": True}))
                self.set_keyed_requests(list(pending) + [filler] * (n_call - n))
        if not seqs:
            return [], None
        cap = contextlib.nullcontext() if max_new_tokens is None else compat.max_new_tokens(self, max_new_tokens)
        with cap:
            c_ids, lps = self.ext_generate_single_turn(seqs, None, {}, 1)
        self.ext_on_generated(c_ids)
        c_ids = [list(c) for c in c_ids[:n]]
        return c_ids, None if lps is None else [list(lp) for lp in lps[:n]]

    def shared_prefix_settings(self):
        """Sampler settings of :func:`~trl_ext.measurement.shared_prefix.shared_prefix_generate`, read from the
        generation config at every call (so :func:`~trl_ext.trainers._trl_compat.max_new_tokens` caps apply)."""
        from ..measurement.shared_prefix import settings_from_generation_config

        return settings_from_generation_config(self.generation_config, eos_token_ids=self.eos_token_ids,
                                               pad_token_id=compat.tokenizer(self).pad_token_id)

    def ext_generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's generation, or the shared-prefix sampler with ``shared_prefix_rollouts=True``."""
        if not self.args.shared_prefix_rollouts:
            return super().ext_generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                    has_tool_images)
        if images is not None or multimodal_fields:
            raise NotImplementedError("shared_prefix_rollouts does not support image/multimodal prompts.")
        from ..measurement.shared_prefix import shared_prefix_generate

        with compat.generation_model(self) as model:
            ids, stats = shared_prefix_generate(model, [list(p) for p in prompt_ids], self.shared_prefix_settings(),
                                                pad_to_multiple_of=self.pad_to_multiple_of)
        self.ext_record_shared_prefix_stats(stats)
        return ids, None

    def ext_record_shared_prefix_stats(self, stats: dict) -> None:
        """Accumulate one shared-prefix generation call's counters (logged per generation batch, all ranks)."""
        for key in ("forward_tokens", "computed_tokens", "independent_tokens", "shared_positions", "decode_tokens",
                    "decode_shared_positions"):
            self._ext_sp_local[key] = self._ext_sp_local.get(key, 0.0) + float(stats.get(key, 0))
        self._ext_sp_local["max_branches"] = max(self._ext_sp_local.get("max_branches", 0.0),
                                                 float(stats.get("max_branches", 0)))

    def ext_on_generated(self, completion_ids) -> None:
        """The one generated-token counter: every generation call ends here (TRL's ``_generate`` and its tool loops
        through :class:`~trl_ext.trainers._trl_compat.TRLGlue`, strategies through :meth:`generate_token_ids`)."""
        self._ext_gen_tokens_local += int(sum(len(c) for c in completion_ids))

    def score_rollouts_local(self, rows: Sequence[dict], completion_ids: Sequence[Sequence[int]]) -> torch.Tensor:
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
            NaN where a reward function returned ``None``. Pass it to :meth:`finish_rollouts` as
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
            raise ValueError(f"score_rollouts_local: {n} rows but {len(completion_ids)} completions.")
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
                    raise NotImplementedError("score_rollouts_local: reward models on conversational prompts are not "
                                              "supported; score them through finish_rollouts instead.")
                enc = proc(text=[p + c for p, c in zip(prompts, texts)], return_tensors="pt", padding=True,
                           padding_side="right", add_special_tokens=False).to(self.accelerator.device)
                with torch.inference_mode():
                    out[:, i] = func(**enc).logits[:, 0].float().cpu()
            elif inspect.iscoroutinefunction(func):
                raise NotImplementedError("score_rollouts_local does not run async reward functions.")
            else:
                values = func(prompts=prompts, completions=completions, completion_ids=[list(c) for c in completion_ids],
                              **kwargs)
                if len(values) != n:
                    raise ValueError(f"reward function {self.reward_func_names[i]!r} returned {len(values)} rewards for "
                                     f"{n} completions.")
                out[:, i] = torch.tensor([float("nan") if v is None else float(v) for v in values])
        return out

    def finish_rollouts(
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
           TRL's gathers and by ``split_tensor_dict``);
        2. replays the rollouts into TRL's ``_generate_and_score_completions``: prompt/completion
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
            raise ValueError("finish_rollouts needs at least one rollout on every rank (got 0); if a rank has nothing "
                             "to score, pass one dummy rollout with is_pad=[True].")
        if len(completion_ids) != n or len(group_ids) != n:
            raise ValueError(f"finish_rollouts: inputs ({n}), completion_ids ({len(completion_ids)}) and group_ids "
                             f"({len(group_ids)}) must have the same length.")
        if logprobs is not None and len(logprobs) != n:
            raise ValueError(f"finish_rollouts: logprobs has {len(logprobs)} rows, expected {n}.")
        user_pad = [False] * n if is_pad is None else [bool(p) for p in is_pad]
        if len(user_pad) != n:
            raise ValueError(f"finish_rollouts: is_pad has {len(user_pad)} flags, expected {n}.")
        gids = [-1 if p else int(g) for g, p in zip(group_ids, user_pad)]
        real_g = [g for g, p in zip(gids, user_pad) if not p]
        runs = [g for i, g in enumerate(real_g) if i == 0 or g != real_g[i - 1]]
        if len(runs) != len(set(runs)):
            raise ValueError("finish_rollouts: the rollouts of a group must be contiguous (group_ids "
                             f"{gids[:20]}...). Sort the rollouts by group first.")
        if rewards_per_func is not None:
            rewards_per_func = torch.as_tensor(rewards_per_func, dtype=torch.float32)
            if tuple(rewards_per_func.shape) != (n, len(self.reward_funcs)):
                raise ValueError(f"finish_rollouts: rewards_per_func must have shape ({n}, {len(self.reward_funcs)}),"
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
        prompt_ids = compat.tokenize_prompts(self, [x["prompt"] for x in rows])
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
        try:
            with compat.group_size_override(self, 1):  # TRL's view(-1, G) must accept any row count
                return self.score_fixed_groups(rows)
        finally:
            self._ext_replay = None

    # -------------------------------------------------------------------------- hooks TRL's private methods reach
    def ext_generate_and_score(self, inputs):
        """One generation batch: the rollout strategy in train mode, TRL's fixed groups in evaluation."""
        if self.model.training and self._ext_replay is None:
            return self.rollout_strategy.generate_and_score(self, list(inputs))
        return self.score_fixed_groups(inputs)

    def score_fixed_groups(self, inputs):
        """TRL's generation, scoring and tail for ``inputs`` (or the rollouts :meth:`finish_rollouts` replays),
        then :meth:`compute_advantages` and the trl_ext bookkeeping."""
        self._ext_pending = None
        out = super().ext_generate_and_score(inputs)
        return self._ext_finalize(out)

    def ext_generate(self, prompts: list):
        replay = self._ext_replay
        if replay is None:
            return super().ext_generate(prompts)
        mode = "train" if self.model.training else "eval"
        c_ids = replay["completion_ids"]
        completions = self.processing_class.batch_decode(c_ids, skip_special_tokens=True)
        if isinstance(prompts[0], list):  # conversational prompts
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        self._ext_log_generation_metrics(mode, replay["prompt_ids"], c_ids, replay["is_pad"])
        return replay["prompt_ids"], c_ids, None, completions, replay["logprobs"], {}, None, []

    def _ext_log_generation_metrics(self, mode, prompt_ids, completion_ids, is_pad) -> None:
        """TRL's ``_generate`` metrics for replayed rollouts, excluding pad rows."""
        device = self.accelerator.device
        keep = torch.tensor([not p for p in is_pad], device=device)
        p_len = torch.tensor([len(x) for x in prompt_ids], device=device)
        c_len = torch.tensor([len(x) for x in completion_ids], device=device)
        eos_and_pad = [*self.eos_token_ids, compat.tokenizer(self).pad_token_id]
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

    def ext_calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        replay = self._ext_replay
        device = self.accelerator.device
        if replay is not None and replay["rewards_per_func"] is not None:
            rpf = compat.gather(replay["rewards_per_func"].to(device))
        else:
            rpf = super().ext_calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if replay is not None:
            pad = compat.gather(torch.tensor(replay["is_pad"], device=device))
            if pad.any():
                rpf = rpf.clone()
                rpf[pad] = float("nan")
        self._ext_pending = self._ext_build_batch(inputs, prompts, completion_ids_list, rpf)
        return rpf

    def ext_compute_loss(self, model, inputs):
        """TRL's loss with the policy term's denominator chosen in one place (:meth:`_ext_policy_scale`) and the
        KL term averaged over real rows."""
        if self.model.training:
            scale = self._ext_policy_scale(inputs)
            if scale is not None:
                inputs = {**inputs, "advantages": inputs["advantages"] * scale}
        kl_rescale = inputs.get("ext_kl_rescale")
        if kl_rescale is None or self.beta == 0.0:
            return super().ext_compute_loss(model, inputs)
        # Pad rows (sequence-level losses): TRL divides beta * KL by all B rows, pads included; N / n_real restores
        # the mean over real rows (pads have an all-zero loss mask, so they add no KL themselves).
        beta = self.beta
        self.beta = beta * float(kl_rescale)
        try:
            return super().ext_compute_loss(model, inputs)
        finally:
            self.beta = beta

    def _ext_policy_scale(self, inputs) -> torch.Tensor | None:
        """Factor on the advantages that replaces TRL's policy-loss denominator by the wanted one (or ``None``).

        Every TRL 1.16 loss is a sum of ``A_i`` times terms that do not depend on ``A`` (positively homogeneous), so
        changing the denominator is exact by rescaling advantages. TRL's denominators per generation batch:
        ``R = B * P * spg`` rows for sequence-level losses (``B`` local micro-batch rows), ``num_items_in_batch``
        tokens for global token-level losses, local tokens for ``bnpo``. The wanted one is, in order of precedence:

        * the rollout strategy's fixed normalizer ``K`` (``ext_fixed_normalizer``): ``K`` rows, or
          ``K * max_completion_length`` tokens (PAIR);
        * signal-only denominators: the rows / tokens of groups with a nonzero advantage;
        * with pad rows and a sequence-level loss: the real rows ``n_real`` (``ext_real_rows``).
        """
        adv = inputs["advantages"]
        lt = self.loss_type
        rows_trl = adv.shape[0] * self.accelerator.num_processes * self.args.steps_per_generation
        fixed = inputs.get("ext_fixed_normalizer")
        if fixed is not None:
            k = fixed.clamp(min=1).to(adv.dtype)
            if lt in compat.SEQUENCE_LEVEL_LOSSES:
                return rows_trl / k
            if lt in compat.GLOBAL_TOKEN_LEVEL_LOSSES:
                return inputs["num_items_in_batch"].clamp(min=1).to(adv.dtype) / (
                    k * float(self.args.max_completion_length))
            raise ValueError(f"a fixed policy normalizer does not support loss_type={lt!r}.")
        if self.args.signal_only_denominator:
            if lt in compat.SEQUENCE_LEVEL_LOSSES:
                return rows_trl / inputs["ext_num_signal"].clamp(min=1).to(adv.dtype)
            if lt in compat.GLOBAL_TOKEN_LEVEL_LOSSES:
                # the policy term only: the KL term keeps num_items_in_batch
                return inputs["num_items_in_batch"].clamp(min=1).to(adv.dtype) / inputs[
                    "ext_num_signal_tokens"].clamp(min=1).to(adv.dtype)
            if lt in compat.LOCAL_TOKEN_LEVEL_LOSSES:
                mask = inputs["completion_mask"] if "tool_mask" not in inputs else \
                    inputs["completion_mask"] * inputs["tool_mask"]
                live = inputs["ext_signal_mask"].to(mask.dtype).unsqueeze(1)
                return mask.sum().clamp(min=1).to(adv.dtype) / (mask * live).sum().clamp(min=1).to(adv.dtype)
            raise ValueError(f"signal_only_denominator does not support loss_type={lt!r}.")
        real_rows = inputs.get("ext_real_rows")
        if real_rows is not None and lt in compat.SEQUENCE_LEVEL_LOSSES:
            return rows_trl / real_rows.clamp(min=1).to(adv.dtype)
        return None

    def ext_before_save_checkpoint(self, checkpoint_dir: str) -> None:
        # Written before TRL's save (which pushes the folder to the Hub from inside). A folder a crash left with only
        # this file has no trainer_state.json and is skipped by train(resume_from_checkpoint=True).
        self._ext_write_state(checkpoint_dir)

    def _ext_write_state(self, folder: str) -> None:
        """``trl_ext_state.pt`` into ``folder``, atomically (temp file + rename): a crash leaves none or a whole one."""
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, EXT_STATE_FILE)
        torch.save(self.ext_state_dict(), path + ".tmp")
        os.replace(path + ".tmp", path)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """:meth:`transformers.Trainer.save_model`, plus ``trl_ext_state.pt`` in the same folder (written first:
        with ``push_to_hub`` the folder is pushed from inside ``save_model``), so the extension state goes with the
        final model and with ``push_to_hub()``."""
        if self.args.should_save:
            self._ext_write_state(output_dir if output_dir is not None else self.args.output_dir)
        super().save_model(output_dir, _internal_call)

    def ext_after_load_checkpoint(self, checkpoint_dir: str) -> None:
        path = os.path.join(checkpoint_dir, EXT_STATE_FILE)
        if not os.path.exists(path):
            warnings.warn(
                f"Resuming from {checkpoint_dir} without {EXT_STATE_FILE}: trl_ext state (counters"
                f"{', estimator state' if type(self) is not GRPOTrainer else ''}) starts fresh.", stacklevel=2,
            )
            return
        state = torch.load(path, map_location="cpu", weights_only=True)
        saved_step = state.get("global_step") if isinstance(state, dict) else None
        if saved_step is not None and int(saved_step) != int(self.state.global_step):
            raise ValueError(
                f"{path} was written at global step {saved_step} but the checkpoint is at step "
                f"{self.state.global_step}: it is stale (copied from another checkpoint?) and would rewind the trainer "
                f"state. Replace it with the {EXT_STATE_FILE} of checkpoint-{self.state.global_step}, or delete it to "
                "start the trl_ext state fresh."
            )
        self.load_ext_state_dict(state)
        if self.keyed_sampling_enabled and getattr(self.args, "keyed_sampling_log", True):
            dropped = self.keyed_drop_records_from_step(int(self.state.global_step))
            if dropped:
                logger.warning("keyed_sampling: removed %d logged rollouts of steps >= %d from %s; the resumed run "
                               "generates them again.", dropped, self.state.global_step,
                               self.keyed_rollout_log_path())

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """:meth:`transformers.Trainer.train`; ``resume_from_checkpoint=True`` resumes from the latest **complete**
        checkpoint (one holding ``trainer_state.json``), skipping with a warning any newer folder a crash left
        incomplete."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = _last_complete_checkpoint(self.args.output_dir)
        return super().train(resume_from_checkpoint, *args, **kwargs)

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
                        "path; for finish_rollouts sort rollouts by group)."
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
        if self.args.tie_break_scorer_index is not None:
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

        s_idx = self.args.tie_break_scorer_index
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
                                                 float(self.args.tie_break_epsilon))
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
        s = batch.rewards_per_func[:, self.args.tie_break_scorer_index].double().numpy()
        gid = batch.group_ids.numpy()
        floor = float(self.args.scorer_noise_floor)
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
        if self.args.tie_break_confidence_scaling and batch.grades is not None:
            adv = adv * self._ext_confidence_scale(batch).view(-1, *shape_tail)
        local = batch.local_slice()
        if adv.ndim == 2 and adv.shape[1] != out["completion_ids"].shape[1]:
            raise ValueError(f"(N, T) advantages must have T = completion length {out['completion_ids'].shape[1]}, "
                             f"got {adv.shape[1]}.")
        n_real = int((~batch.is_pad).sum())
        out["advantages"] = adv[local].to(device)
        # Denominators for _ext_policy_scale, as 0-dim tensors (they survive TRL's shuffle and split_tensor_dict)
        if bool(batch.is_pad.any()) and n_real > 0:
            # sequence-level losses average over all rows, pads included: the policy term is rescaled to the real
            # rows (independent of how many pads each rank got), and so is the KL term (beta * N / n_real)
            out["ext_real_rows"] = torch.tensor(float(n_real), device=device)
            if self.loss_type in compat.SEQUENCE_LEVEL_LOSSES:
                out["ext_kl_rescale"] = torch.tensor(batch.num_rows / n_real, dtype=torch.float32, device=device)
        fixed = self.rollout_strategy.fixed_policy_normalizer(self, batch) if mode == "train" else None
        if fixed is not None:
            out["ext_fixed_normalizer"] = torch.tensor(float(fixed), device=device)
        # pad rows: no loss, excluded from the token normalizer
        pad_local = batch.is_pad[local].to(device)
        if pad_local.any():
            out["completion_mask"] = out["completion_mask"] * (~pad_local).unsqueeze(1).to(out["completion_mask"].dtype)
            if "tool_mask" in out:
                out["tool_mask"] = out["tool_mask"] * (~pad_local).unsqueeze(1).to(out["tool_mask"].dtype)
        loss_mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
        if pad_local.any() or batch.is_pad.any():
            out["num_items_in_batch"] = compat.gather(loss_mask.sum()).sum()
        # signal-only bookkeeping (global counts survive shuffle/split as 0-dim tensors)
        nonzero_row = adv.reshape(batch.num_rows, -1).ne(0).any(dim=1) & valid
        live_groups = torch.zeros(max(batch.num_groups, 1), dtype=torch.bool)
        gid = batch.group_ids
        if nonzero_row.any():
            live_groups[gid[nonzero_row]] = True
        live_row = (gid >= 0) & live_groups[gid.clamp(min=0)] & ~batch.is_pad
        if self.args.signal_only_denominator:
            live_local = live_row[local].to(device)
            out["ext_num_signal"] = live_row.sum().to(device)
            out["ext_num_signal_tokens"] = compat.gather((loss_mask * live_local.unsqueeze(1)).sum()).sum()
            out["ext_signal_mask"] = live_local
        self._ext_log_batch_metrics(batch, adv, live_row, mode)
        self.last_rollout_batch = batch
        self.last_advantages = adv
        return out

    def _ext_log_shared_prefix(self, m) -> None:
        """Shared-prefix counters summed over ranks (max for ``max_branches``): model positions computed vs what
        independent sampling would compute. Generated tokens are unchanged (``ext/generated_tokens``)."""
        keys = ("forward_tokens", "computed_tokens", "independent_tokens", "shared_positions", "decode_tokens",
                "decode_shared_positions")
        local = torch.tensor([self._ext_sp_local.get(k, 0.0) for k in keys], dtype=torch.float64,
                             device=self.accelerator.device)
        tot = dict(zip(keys, compat.gather(local.unsqueeze(0)).sum(dim=0).tolist()))
        branches = compat.gather(torch.tensor([self._ext_sp_local.get("max_branches", 0.0)], dtype=torch.float64,
                                              device=self.accelerator.device)).max().item()
        self._ext_sp_local = {}
        m["ext/shared_prefix/forward_tokens"].append(tot["forward_tokens"])
        m["ext/shared_prefix/computed_tokens"].append(tot["computed_tokens"])
        m["ext/shared_prefix/independent_tokens"].append(tot["independent_tokens"])
        if tot["independent_tokens"] > 0:
            m["ext/shared_prefix/saved_fraction"].append(1.0 - tot["computed_tokens"] / tot["independent_tokens"])
        if tot["computed_tokens"] > 0:
            m["ext/shared_prefix/shared_fraction"].append(tot["shared_positions"] / tot["computed_tokens"])
        if tot["decode_tokens"] > 0:
            m["ext/shared_prefix/decode_shared_fraction"].append(tot["decode_shared_positions"] / tot["decode_tokens"])
        m["ext/shared_prefix/max_branches"].append(float(branches))

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
        # advantage scale of the real rows (compares step sizes across estimators: GRPO's z-scores vs Eq.-13 sums)
        if real.any():
            a_abs = adv_log[real].abs().float()
            self.log_ext_metric("adv/abs_mean", float(a_abs.mean()), mode)
            self.log_ext_metric("adv/abs_max", float(a_abs.max()), mode)
        compat.rewrite_completion_logs(self, batch.num_rows, real.tolist(), adv_log.tolist())
        if self.args.log_rollout_metadata:
            from collections import deque

            keep = real.tolist()
            cols = {"row_idx": batch.row_idx.tolist(), "group_id": batch.group_ids.tolist()}
            for name, values in batch.extra.items():
                cols[name] = values.tolist() if isinstance(values, torch.Tensor) else list(values)
            # align each metadata column with the `prompt` column: its older rows (None where the column did not
            # exist yet), then this batch's real rows
            logs = compat.completion_logs(self)
            n_prev = max(len(logs["prompt"]) - int(real.sum()), 0)
            for name, values in cols.items():
                old = list(logs["extra"][name])[-n_prev:] if n_prev else []
                old = [None] * (n_prev - len(old)) + old
                logs["extra"][name] = deque(old + [v for v, k in zip(values, keep) if k],
                                            maxlen=logs["prompt"].maxlen)
        if self._ext_replay is not None:
            # variable-size batch: the table holds exactly this generation batch's real rollouts (TRL's fixed-size
            # deques hold exactly the latest generation batch too)
            n_keep = int(real.sum())
            compat.resize_completion_logs(self, max(n_keep, int(self.args.generation_batch_size)), keep_last=n_keep)
        # shut gate on the checker grade (the blend's input) or the reward
        if self.args.log_shut_gate:
            r = batch.grades if batch.grades is not None else batch.rewards
            stats = shut_gate_stats(r[real], batch.group_ids[real], success_threshold=self.args.gate_success_threshold,
                                    atol=self.args.gate_atol)
            for name, value in stats.as_metrics("gate/").items():
                m[name].append(value)
        # signal share and generated tokens
        n_real = int(real.sum())
        m["ext/signal_row_frac"].append(float(live_row.sum()) / max(n_real, 1))
        # the one generated-token counter: every token generated on any rank since the previous batch (discarded
        # rounds, probe prefixes, filtered groups and dummy rows included); trained_tokens: the rows in the loss
        local = torch.tensor([self._ext_gen_tokens_local], dtype=torch.long, device=self.accelerator.device)
        self._ext_gen_tokens_local = 0
        gen_tokens = int(compat.gather(local).sum().item())
        m["ext/generated_tokens"].append(float(gen_tokens))
        if self.args.shared_prefix_rollouts:
            self._ext_log_shared_prefix(m)
        m["ext/trained_tokens"].append(float(batch.completion_lengths[real].sum()))
        m["ext/rollouts"].append(float(n_real))
        # unscorable rollouts (every reward function returned None / NaN), counted over all ranks: they get advantage
        # 0 and no say in any baseline; a whole unscorable batch is a zero-gradient step
        n_unscorable = int((batch.unscorable & real).sum())
        m["ext/unscorable_rows"].append(float(n_unscorable))
        if n_unscorable and mode == "train":
            self._ext_totals["unscorable_rows_total"] += n_unscorable
            if n_unscorable == n_real:
                warnings.warn(f"Every one of the {n_real} rollouts of this generation batch is unscorable (all reward "
                              "functions returned None or NaN): the step trains on nothing.", stacklevel=2)
            else:
                self._ext_warn_once("unscorable_rows", f"{n_unscorable} of {n_real} rollouts of a generation batch are "
                                    "unscorable (every reward function returned None or NaN, on any rank): they get "
                                    "advantage 0 and are counted in ext/unscorable_rows (and the checkpointed "
                                    "unscorable_rows_total).")
        if mode == "train":
            self._ext_totals["generated_tokens_total"] += gen_tokens
            self._ext_totals["generation_batches"] += 1
        if self._ext_totals["generation_batches"]:
            m["ext/generated_tokens_total"] = [float(self._ext_totals["generated_tokens_total"])]

"""``trl_ext.GRPOTrainer``: a drop-in subclass of TRL 1.16's ``GRPOTrainer`` that every trl_ext trainer builds on.

With a default :class:`ExtGRPOConfig` it computes exactly TRL's advantages (bitwise for TRL's fixed-size groups)
and only *adds* metrics. On top it provides:

* **hooks for trainer authors** (see ``docs/base_trainer.md``):

  - :class:`~trl_ext.trainers.batch.RolloutBatch`: the gathered, rank-identical view of one generation batch;
  - ``advantage_estimator``: any estimator registered with
    :func:`trl_ext.estimators.register_advantage_estimator` (``grpo`` -- TRL's, bitwise --, ``dr_grpo``,
    ``rloo``, ``reinforce_pp``, ``james_stein``, or your own), selected by name; :meth:`GRPOTrainer.compute_advantages`
    dispatches through one valid-row adapter (pad rows, NaN rewards, ragged groups); estimators that need more than
    rewards and groups (V0.5's priors, BASIS's ``p_hat``, PAIR's draws) declare side inputs that their rollout
    strategy returns with its rollouts, and no preset overrides ``compute_advantages``;
  - :class:`~trl_ext.trainers.rollouts.RolloutStrategy` objects for the rollout allocation
    (:meth:`GRPOTrainer.create_rollout_strategy`): TRL's fixed groups, DAPO dynamic sampling
    (``dynamic_sampling=True``), V0.5's OSLA rounds, PAIR's probe-then-continue. A strategy returns data
    (:class:`~trl_ext.trainers.rollouts.RolloutGroups`, generated and scored through ``api``, a
    :class:`~trl_ext.trainers.rollout_io.RolloutAPI`) and learns in ``update``; one batch flows one way
    (:meth:`GRPOTrainer.ext_generate_and_score`): rollout -> one replay through TRL's tail -> the gathered batch ->
    the estimator -> ``update``;
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
from typing import ClassVar

import numpy as np
import torch

from .. import __version__ as trl_ext_version
from ..checkpoints.preemption import train_with_preemption
from ..checkpoints.resume import (
    atomic_torch_save,
    check_output_dir_writable,
    check_resumed_config,
    config_fingerprint,
    resolve_resume_checkpoint,
    run_identity,
    write_failure,
)
from ..estimators.baselines import (
    ESTIMATORS_SEEING_UNSCORABLE,
    estimator_side_inputs,
    get_advantage_estimator,
    trl_grpo_advantages,
)
from ..generation.keyed_sampler import KeyedSampler, check_before_trl_init
from ..generation.vllm_colocate import install_colocate_weight_sync
from . import _trl_compat as compat
from . import model_card  # noqa: F401  (sets the trl-ext tag of every trainer's card)
from .accounting import BatchAccounting
from .batch import RolloutBatch
from .config import (  # noqa: F401  (validate_ext_config re-exported)
    ExtGRPOConfig,
    as_config,
    check_side_inputs,
    parse_kwargs_field,
    resolved_rollout_strategy,
    validate_ext_config,
)
from .rollout_io import RolloutAPI, RolloutIO
from .rollouts import (
    RolloutStrategy,
    check_strategy_interface,
    get_rollout_strategy,
    side_input_arrays,
    strategy_description,
)
from .state import EXT_STATE_FILE, EXT_STATE_VERSION

LEGACY_STATE_KEYS = ("v05_generation_index", "v05_support_buffer", "pair", "basis_beta_history")
"""Trainer-state keys of trl_ext 0.2 and earlier (method state kept outside the rollout strategy): such a checkpoint
is refused with one clear error instead of being translated."""

__all__ = ["ExtGRPOConfig", "GRPOTrainer", "RolloutBatch", "trl_grpo_advantages", "EXT_STATE_FILE",
           "as_config", "parse_kwargs_field", "DropInDifferenceWarning"]


class DropInDifferenceWarning(UserWarning):
    """Warned once at construction where a trainer's compute per step, prompts per step or effective learning rate
    differs from what TRL's ``GRPOTrainer`` does with the same arguments; the message names the field that restores
    TRL's behaviour (``docs/migrating.md`` lists every case). Silence it with
    ``warnings.filterwarnings("ignore", category=trl_ext.DropInDifferenceWarning)``."""

logger = logging.getLogger(__name__)



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
            "train alone and write the same output_dir. On a machine without GPUs set use_cpu=True in the trainer "
            "config (--use_cpu on the example scripts) and keep one of these launchers (each needs use_cpu=True): "
            f"`torchrun --nproc_per_node {world} script.py`, `accelerate launch --multi_gpu --num_processes {world} "
            "script.py`, or `accelerate launch --config_file examples/accelerate_configs/cpu_two_processes.yaml "
            "script.py`. On GPUs check that CUDA is visible to every process."
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


class GRPOTrainer(RolloutIO, BatchAccounting, compat.TRLGlue):
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
        rollout per prompt (BASIS, G = 1); strategies that want more return their own rollouts. A config with
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
    keyed_sampler: KeyedSampler | None = None
    """The keyed generation back-end (``keyed_sampling=True``), else ``None`` (TRL's generation runs unchanged)."""

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "")
            args = self.config_class(f"{str(name).split('/')[-1] or 'model'}-GRPO")
        args = as_config(args, self.config_class, type(self).__name__)
        _check_dataset(train_dataset, "train_dataset")
        _check_dataset(eval_dataset, "eval_dataset")
        train_dataset = _add_row_index(train_dataset)
        eval_dataset = _add_row_index(eval_dataset)
        check_before_trl_init(args)
        check_output_dir_writable(args.output_dir)  # here, not at the first save after steps were computed
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, **kwargs)
        _check_process_layout(self.accelerator.num_processes)
        self.keyed_sampler = KeyedSampler(self) if args.keyed_sampling else None
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
        self._ext_call: dict | None = None  # the one scoped hand-off of a replay (see RolloutIO.replay_rollouts)
        self._ext_warned: set[str] = set()
        self._ext_totals = {"generated_tokens_total": 0, "generation_batches": 0, "tie_break_groups_opened_total": 0,
                            "unscorable_rows_total": 0}
        self.last_rollout_batch: RolloutBatch | None = None
        self.last_advantages: torch.Tensor | None = None
        self.rollout_api = RolloutAPI(self)
        self.rollout_strategy: RolloutStrategy = self.create_rollout_strategy()
        check_strategy_interface(type(self.rollout_strategy))
        # a subclass's own strategy must serve the configured estimator
        check_side_inputs(self.args.advantage_estimator, type(self.rollout_strategy))
        if self.args.dynamic_sampling and self.rollout_strategy.name != "dynamic_sampling":
            raise ValueError(f"dynamic_sampling=True is not available in {type(self).__name__} (its rollout strategy is "
                             f"{self.rollout_strategy.name!r}); set dynamic_sampling=False.")
        factor, why = self.args.optimizer_lr_factor()
        self._ext_lr_factor = factor if self.optimizer is None else 1.0  # a caller's optimizer is never rescaled
        if self._ext_lr_factor != 1.0:
            self.warn_dropin_difference(f"optimizer learning rate = learning_rate x {factor:.3g} = "
                                        f"{factor * self.args.learning_rate:.3g} ({why}).")
        if self.accelerator.is_main_process:
            line, differences = strategy_description(self.rollout_strategy, self.rollout_api)
            name = self.args.advantage_estimator
            eval_note = " (evaluation batches without its inputs: grpo)" if estimator_side_inputs(name) else ""
            logger.info("%s: %s; advantage estimator %s%s.", type(self).__name__, line, name, eval_note)
            for message in differences:
                self.warn_dropin_difference(message)

    def create_optimizer(self, model=None):
        """Transformers' optimizer, every group's learning rate times the config's ``optimizer_lr_factor`` (before
        the scheduler is built, so warm-up and decay follow the scaled rate)."""
        fresh = self.optimizer is None
        opt = super().create_optimizer(model)
        if fresh and self._ext_lr_factor != 1.0:
            for group in opt.param_groups:
                group["lr"] *= self._ext_lr_factor
                if "initial_lr" in group:
                    group["initial_lr"] *= self._ext_lr_factor
        return opt

    def warn_dropin_difference(self, message: str) -> None:
        """One :class:`DropInDifferenceWarning` (main process) plus the same line at INFO, for a way this trainer
        differs from TRL with the same arguments; ``message`` names the field that restores TRL's behaviour."""
        if self.accelerator.is_main_process:
            logger.info("%s: %s", type(self).__name__, message)
            warnings.warn(f"{type(self).__name__}: {message}", DropInDifferenceWarning, stacklevel=3)

    def create_rollout_strategy(self) -> RolloutStrategy:
        """The train-mode rollout allocation: the strategy registered under the config's ``rollout_strategy``
        (:func:`~trl_ext.trainers.config.resolved_rollout_strategy`), built with ``rollout_strategy_kwargs``.
        Method trainers whose strategy needs the trainer's own objects override this (V0.5's OSLA rounds, PAIR)."""
        name = resolved_rollout_strategy(self.args)
        return get_rollout_strategy(name).from_trainer(self, **self.args.rollout_strategy_kwargs)

    # ------------------------------------------------------------------------------------------------ public hooks
    def compute_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """Advantages of every row of the generation batch: the estimator, then the rollout strategy's ``update``.

        The estimator is the config's ``advantage_estimator`` (a method config's own by default). It runs with
        the inputs the batch carries: per-row ``side_inputs`` and the strategy's ``estimator_inputs``, under the
        config's ``advantage_estimator_kwargs``. A batch that lacks an input the estimator needs is an error on
        training batches and gets ``"grpo"`` on evaluation batches (TRL's fixed groups, which a method's strategy
        does not feed). ``"grpo"`` without inputs reproduces TRL 1.16 bitwise
        (:func:`~trl_ext.estimators.trl_grpo_advantages` with ``scale_rewards`` and ``multi_objective_aggregation``),
        on ragged groups too; any other name goes through :meth:`registry_advantages`, the one valid-row adapter.
        Then ``rollout_strategy.update(api, batch, result)`` learns from the batch and its metrics are logged.

        Parameters
        ----------
        batch : RolloutBatch
            Global, identical on every rank. Pad rows have ``group_ids == -1`` and NaN rewards.

        Returns
        -------
        Tensor, shape (N,) or (N, T), float
            Global advantages in batch order. Must be finite on valid rows and identical on every rank (a subclass
            computes them from ``batch`` only). The base class then zeroes pad and unscorable rows, applies the
            tie-break confidence scaling, slices the local rows and fixes the logs.
        """
        name = self.args.advantage_estimator
        kwargs = {**batch.estimator_inputs, **self.args.advantage_estimator_kwargs}
        missing = set(estimator_side_inputs(name)) - set(batch.side_inputs) - set(batch.estimator_inputs)
        if missing and batch.mode == "train":
            raise RuntimeError(f"advantage estimator {name!r} needs {sorted(missing)}, which rollout strategy "
                               f"{self.rollout_strategy.name!r} did not supply for this batch.")
        if missing:  # an evaluation batch of TRL's fixed groups that the strategy does not feed
            name, kwargs = "grpo", {}
        if name == "grpo" and not kwargs:
            gid = torch.where(batch.is_pad, torch.full_like(batch.group_ids, -1), batch.group_ids)
            adv, _ = trl_grpo_advantages(
                batch.rewards, gid, scale_rewards=self.scale_rewards, rewards_per_func=batch.rewards_per_func,
                reward_weights=self.reward_weights, aggregation=self.multi_objective_aggregation,
            )
            result = None
        else:
            adv, result = self.registry_advantages(batch, name, **kwargs)
        for key, value in self.rollout_strategy.update(self.rollout_api, batch, result).items():
            self.log_ext_metric(key, value, batch.mode)
        return adv

    def registry_advantages(self, batch: RolloutBatch, name: str, **kwargs) -> tuple[torch.Tensor, object]:
        """Run the registered estimator ``name`` on the valid rows of ``batch``; 0 elsewhere.

        The one valid-row adapter: pad rows and unscorable rows (NaN reward) are removed before the estimator sees
        the batch (so it gets flat ``rewards`` and ``group_ids`` of real, scorable rollouts, groups possibly
        ragged, plus its registered side inputs taken from ``batch.side_inputs`` on the same rows: per row, or per
        group in order of first appearance) and get advantage 0; they are counted in ``adv/unscorable_rows``. The
        estimator's own fallbacks (e.g. RLOO singletons) are counted in ``adv/degenerate_rows``. An estimator
        registered with ``sees_unscorable=True`` (BASIS) also gets the unscorable rows, with their NaN rewards.

        Returns
        -------
        advantages : Tensor, shape (N,), float32
        result : AdvantageResult or None
            What the estimator returned (``None`` when no row was valid and it did not run).
        """
        estimator = get_advantage_estimator(name)
        valid = batch.valid
        adv = torch.zeros(batch.num_rows, dtype=torch.float32)
        n_unscorable = int((~batch.is_pad & ~valid).sum())
        self.log_ext_metric("adv/unscorable_rows", float(n_unscorable), batch.mode)
        if name in ESTIMATORS_SEEING_UNSCORABLE:  # it excludes NaN rewards itself and gives them 0: pads removed
            valid = ~batch.is_pad
        if not bool(valid.any()):
            return adv, None
        side = side_input_arrays(batch, name, valid)
        res = estimator(batch.rewards[valid].double().numpy(), batch.group_ids[valid].numpy(), **side, **kwargs)
        values = np.asarray(getattr(res, "advantages", res), dtype=np.float64)
        if values.shape != (int(valid.sum()),):
            raise ValueError(f"advantage estimator {name!r} returned shape {values.shape}; expected "
                             f"({int(valid.sum())},), one advantage per valid row.")
        adv[valid] = torch.as_tensor(values, dtype=torch.float32)
        self.log_ext_metric("adv/degenerate_rows", float(getattr(res, "n_degenerate", 0)), batch.mode)
        for key, value in (getattr(res, "extras", None) or {}).get("metrics", {}).items():  # estimator diagnostics
            self.log_ext_metric(f"adv/{key}", float(value), batch.mode)
        return adv, res

    def ext_state_dict(self) -> dict:
        """State saved as ``trl_ext_state.pt`` in each checkpoint (extend with ``state = super().ext_state_dict()``).

        Values must be loadable with ``torch.load(weights_only=True)``: tensors, numbers, strings, bools, ``None``,
        and lists/tuples/dicts of those (convert numpy arrays to tensors or lists). The state must be identical on
        every rank (only the main process writes it; every rank reads it back).
        """
        return {"trl_ext_version": EXT_STATE_VERSION, "trainer_class": type(self).__name__,
                "global_step": int(self.state.global_step), **self._ext_totals,
                "rollout_strategy": {"name": self.rollout_strategy.name, "state": self.rollout_strategy.state_dict()},
                "config_fingerprint": json.dumps(self.config_fingerprint(), sort_keys=True)}

    def ext_config_identity(self) -> dict:
        """What identifies the run beyond its config fields, recorded in each checkpoint's fingerprint
        (:func:`trl_ext.checkpoints.resume.run_identity`: model, adapter, reward names, processes, value prior and
        table). Extend it for a method-specific identity."""
        return run_identity(self.accelerator.unwrap_model(self.model), self.reward_func_names,
                            self.accelerator.num_processes, self.rollout_strategy)

    def config_fingerprint(self) -> dict:
        """The fields that change what training means (:func:`trl_ext.checkpoints.resume.config_fingerprint`)."""
        return config_fingerprint(self.args, self.ext_config_identity())

    def load_ext_state_dict(self, state: dict) -> None:
        """Restore what :meth:`ext_state_dict` saved (extend with ``super().load_ext_state_dict(state)``)."""
        if not isinstance(state, dict) or state.get("trl_ext_version") != EXT_STATE_VERSION:
            raise ValueError(
                f"Unrecognized {EXT_STATE_FILE}: expected a dict with trl_ext_version={EXT_STATE_VERSION}, got "
                f"{type(state).__name__} with version {getattr(state, 'get', lambda _k: None)('trl_ext_version')!r}."
            )
        legacy = sorted(k for k in LEGACY_STATE_KEYS if k in state)
        if legacy:
            raise ValueError(
                f"{EXT_STATE_FILE} has the layout of trl_ext 0.2 and earlier, before rollout strategies held the "
                f"method state (keys {legacy}); trl_ext {trl_ext_version} does not read it. "
                "Resume with the trl_ext version that wrote it, or start a new run from the checkpoint's weights "
                "(without resume_from_checkpoint)."
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
        else:
            held = "no rollout-strategy state" if strat is None else f"the state of rollout strategy {strat.get('name')!r}"
            warnings.warn(f"{EXT_STATE_FILE} holds {held}, but this trainer uses {self.rollout_strategy.name!r}; its "
                          "state (what the method learned or buffered) starts fresh.", stacklevel=2)

    def log_ext_metric(self, name: str, value: float, mode: str | None = None) -> None:
        """Append a scalar to ``self._metrics[mode][name]`` (averaged per logging step, sent to every backend).

        Pass values that are already global (identical on every rank, e.g. computed from a
        :class:`RolloutBatch`); the main process's value is what gets logged. ``mode`` defaults to the current
        mode (``"train"`` when the model is in training mode, else ``"eval"``).
        """
        mode = mode or ("train" if self.model.training else "eval")
        value = float(value.item() if hasattr(value, "item") else value)
        compat.metrics(self, mode)[name].append(value)


    # -------------------------------------------------------------------------- hooks TRL's private methods reach
    def ext_generate_and_score(self, inputs):
        """One generation batch, one way: the rollout strategy's :class:`RolloutGroups` -> one replay through TRL's
        tail (:meth:`replay_rollouts`) -> the gathered batch -> :meth:`compute_advantages` (estimator, then the
        strategy's ``update``) -> TRL's output with trl_ext's bookkeeping. With keyed sampling, the batch's rows key
        the generation calls that use them."""
        keyed = contextlib.nullcontext() if self.keyed_sampler is None else self.keyed_sampler.batch_rows(inputs)
        with keyed:
            rows = list(inputs)
            groups = self.rollout_strategy.rollout(self.rollout_api, rows)
            out, batch = self.replay_rollouts(groups, rows)
            return self._ext_finalize(out, batch, replayed=groups.rows is not None)

    def ext_before_save_checkpoint(self, checkpoint_dir: str) -> None:
        # Written before TRL's save (which pushes the folder to the Hub from inside). A folder a crash left with only
        # this file has no trainer_state.json and is skipped by train(resume_from_checkpoint=True).
        self._ext_write_state(checkpoint_dir)

    def _ext_write_state(self, folder: str) -> None:
        """``trl_ext_state.pt`` into ``folder``, atomically (temp file + rename): a crash leaves none or a whole one."""
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise write_failure(folder, e) from e
        atomic_torch_save(self.ext_state_dict(), os.path.join(folder, EXT_STATE_FILE))

    def ext_save_failed(self, checkpoint_dir: str, exc: BaseException) -> None:
        """TRL / transformers' checkpoint save raised ``exc``: re-raise it naming the folder and, when the disk is
        full, saying so (torch reports a short write as ``unexpected pos ...``). Other errors propagate unchanged."""
        text = str(exc)
        if isinstance(exc, OSError | RuntimeError) or "No space left" in text or "os error" in text:
            raise write_failure(checkpoint_dir, exc) from exc

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
        self.resume_config_changes_applied = check_resumed_config(
            state, self.config_fingerprint(), self.args, self.optimizer, self.lr_scheduler, checkpoint_dir,
            int(self.state.global_step))  # refused changes raise here, before any step
        self.load_ext_state_dict(state)
        if self.keyed_sampler is not None and self.args.keyed_sampling_log:
            dropped = self.keyed_sampler.drop_records_from_step(int(self.state.global_step))
            if dropped:
                logger.warning("keyed_sampling: removed %d logged rollouts of steps >= %d from %s; the resumed run "
                               "generates them again.", dropped, self.state.global_step, self.keyed_sampler.log_path())

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """:meth:`transformers.Trainer.train`, with checkpoints that are checked before they are used and a clean
        stop on SIGTERM / SIGINT.

        ``resume_from_checkpoint=True`` resumes from the newest checkpoint whose files all parse
        (:func:`~trl_ext.checkpoints.resume.checkpoint_problem`), skipping with a warning any newer folder a crash or
        a full disk left incomplete; an explicit path with a problem is refused naming the file. With
        ``save_on_preemption`` (default) a signal finishes the current step, saves and raises
        ``SystemExit(preemption_exit_code)`` (see :mod:`trl_ext.checkpoints.preemption`).
        """
        resume_from_checkpoint = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir,
                                                           compat.checkpoint_prefix())
        return train_with_preemption(self, super().train, resume_from_checkpoint, *args, **kwargs)

    # ------------------------------------------------------------------------------------------ internals
    def warn_once(self, key: str, msg: str) -> None:
        """Warn with ``msg`` the first time ``key`` is seen in this run (strategies and estimators' diagnostics)."""
        if key not in self._ext_warned:
            self._ext_warned.add(key)
            warnings.warn(msg, stacklevel=3)


"""Rollout allocation strategies: how a trainer turns one generation batch of prompts into scored rollouts.

A :class:`RolloutStrategy` owns the train-mode generation of :class:`trl_ext.GRPOTrainer` (evaluation always uses
TRL's fixed groups). It receives the rows TRL's sampler yielded for this rank and returns TRL's output dict, either
by running TRL's own path (:class:`FixedGroups`) or by generating rollouts itself and handing them to
:meth:`trl_ext.GRPOTrainer.finish_rollouts` (variable counts per prompt, pad rows, one call per generation batch on
every rank). A strategy keeps its own state (``state_dict`` / ``load_state_dict``), saved in every checkpoint.

Strategies shipped with the library:

* :class:`FixedGroups` -- TRL's behaviour: ``num_generations`` rollouts per prompt, generated in one call.
* :class:`DynamicSampling` -- DAPO's dynamic sampling ("DAPO: An Open-Source LLM Reinforcement Learning System at
  Scale", arXiv:2503.14476, Section 3.2 and Algorithm 1): groups whose rewards are all equal carry no GRPO signal and
  are dropped; more prompts are drawn and generated until the batch holds as many informative groups as TRL's batch
  has prompts, or a cap of extra rounds is reached.
* V0.5's OSLA rounds (:class:`trl_ext.trainers.v05.OSLARounds`), PAIR's probe-then-continue
  (:class:`trl_ext.trainers.pair.PrefixProbeRollouts`) and BASIS's value-table lookup
  (:class:`trl_ext.trainers.basis.strategy.ValueTableLookup`: fixed groups plus each row's offline value).

Every token any strategy generates goes through :meth:`trl_ext.GRPOTrainer.generate_rollouts` or TRL's
``_generate``, both of which end in the one generated-token counter (``ext/generated_tokens``).

To add a strategy, subclass :class:`RolloutStrategy` (or :class:`FixedGroups`), register it with
:func:`register_rollout_strategy` and select it with ``ExtGRPOConfig(rollout_strategy=name,
rollout_strategy_kwargs={...})``. A strategy that feeds an estimator's side inputs lists them in
:attr:`RolloutStrategy.provides` and returns them from :meth:`RolloutStrategy.side_inputs` (or passes them to
``finish_rollouts(side_inputs=...)``); the trainer refuses at construction an estimator whose side inputs its
strategy does not provide (``docs/architecture.md`` has a worked example).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import _trl_compat as compat

if TYPE_CHECKING:  # pragma: no cover
    from .base import GRPOTrainer
    from .batch import RolloutBatch

__all__ = ["RolloutStrategy", "FixedGroups", "DynamicSampling", "register_rollout_strategy", "get_rollout_strategy",
           "ROLLOUT_STRATEGIES"]

ROLLOUT_STRATEGIES: dict[str, type] = {}
"""Rollout strategies selectable by ``rollout_strategy=name`` (registered with :func:`register_rollout_strategy`)."""


def register_rollout_strategy(name: str):
    """Class decorator registering a :class:`RolloutStrategy` subclass under ``name`` (sets ``cls.name``).

    The class is built by ``cls.from_trainer(trainer, **rollout_strategy_kwargs)`` when a trainer's config says
    ``rollout_strategy=name``. Registering a different class under a taken name raises ``ValueError``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"rollout strategy name must be a non-empty string, got {name!r}.")

    def decorator(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, RolloutStrategy)):
            raise TypeError(f"register_rollout_strategy({name!r}) needs a RolloutStrategy subclass, got {cls!r}.")
        old = ROLLOUT_STRATEGIES.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"rollout strategy {name!r} is already registered to {old!r}; pick another name.")
        cls.name = name
        ROLLOUT_STRATEGIES[name] = cls
        return cls

    return decorator


METHOD_STRATEGY_MODULES = {"value_table": "trl_ext.trainers.basis.strategy",
                           "v05_osla": "trl_ext.trainers.v05.strategy",
                           "pair_prefix_probe": "trl_ext.trainers.pair.strategy"}
"""The method strategies of the package, registered when their module is first imported (on demand here, so a
config can name them before any method trainer is imported)."""


def registered_rollout_strategies() -> dict[str, type]:
    """Every registered strategy, the package's method strategies included (their modules imported)."""
    from importlib import import_module

    for module in METHOD_STRATEGY_MODULES.values():
        import_module(module)
    return dict(ROLLOUT_STRATEGIES)


def get_rollout_strategy(name: str) -> type:
    """The strategy class registered under ``name`` (``KeyError`` listing the known names otherwise)."""
    if name not in ROLLOUT_STRATEGIES and name in METHOD_STRATEGY_MODULES:
        registered_rollout_strategies()
    try:
        return ROLLOUT_STRATEGIES[name]
    except KeyError:
        raise KeyError(f"unknown rollout strategy {name!r}; registered: "
                       f"{sorted(registered_rollout_strategies())}") from None


class RolloutStrategy:
    """Base class of rollout allocation strategies (train mode only).

    Attributes
    ----------
    name : str
        Short name used in logs and checkpoints.
    has_fixed_normalizer : bool
        Whether :meth:`fixed_policy_normalizer` returns a value.
    """

    name = "strategy"
    has_fixed_normalizer = False
    """Set True by strategies whose :meth:`fixed_policy_normalizer` returns a value (checked at construction:
    signal-only denominators cannot be combined with a fixed normalizer)."""
    provides: frozenset[str] = frozenset()
    """Estimator side inputs this strategy supplies (:meth:`side_inputs` or ``finish_rollouts(side_inputs=...)``);
    checked at construction against the estimator's registered ``side_inputs``."""
    estimator_kwarg_names: frozenset[str] = frozenset()
    """The keywords :meth:`estimator_kwargs` returns; checked against the configured estimator's signature when the
    config is built (and against what :meth:`estimator_kwargs` really returns at every batch)."""
    provides_objects: frozenset[str] = frozenset()
    """Estimator inputs of level ``"strategy"`` this strategy passes through :meth:`estimator_kwargs` (objects the
    batch cannot carry, e.g. PAIR's designed draws); checked at construction like :attr:`provides`."""

    feeds_evaluation = False
    """Whether the strategy supplies its side inputs on evaluation batches (TRL's fixed groups), for an estimator
    selected by config (``advantage_estimator``); if not, evaluation batches get TRL's GRPO advantages."""

    @classmethod
    def validate_kwargs(cls, kwargs: dict, config=None) -> None:
        """Check the config's ``rollout_strategy_kwargs`` (with the rest of ``config``) when the config is built:
        raise ``ValueError`` saying what to change; the default accepts anything :meth:`from_trainer` accepts."""

    @classmethod
    def from_trainer(cls, trainer: GRPOTrainer, **kwargs) -> RolloutStrategy:
        """Build the strategy for ``trainer`` (``kwargs``: the config's ``rollout_strategy_kwargs``)."""
        return cls(**kwargs)

    def side_inputs(self, trainer: GRPOTrainer, rows: list[dict]) -> dict[str, list]:
        """Per-row side inputs for the estimator, for this rank's ``rows`` of a train generation batch (and of
        evaluation batches for presets with ``train_estimator_in_eval``).

        Called by the base trainer while it builds the :class:`~trl_ext.trainers.batch.RolloutBatch` (after
        generation and scoring), with the local dataset rows in batch order (pad rows included: give them any
        value). Return ``{name: list of len(rows)}`` for every name in :attr:`provides` that is not passed to
        ``finish_rollouts(side_inputs=...)`` instead; the base gathers them into ``RolloutBatch.side_inputs``. A
        value is a number, or -- for a row-level input -- a list of ``K`` numbers, the same ``K`` on every row of
        every rank (the input is then an ``(N, K)`` array).
        """
        return {}

    def generate_and_score(self, trainer: GRPOTrainer, inputs: list[dict]) -> dict:
        """Produce one generation batch and return TRL's output dict.

        Every rank calls this once per generation batch with its local rows; implementations either return
        ``trainer.score_fixed_groups(inputs)`` (TRL's path) or call ``trainer.finish_rollouts(...)`` exactly once.
        """
        raise NotImplementedError

    def dropin_differences(self, trainer: GRPOTrainer) -> list[str]:
        """Ways this strategy's generation differs from TRL's for the same arguments (compute or prompts per step),
        each naming the field that restores TRL's behaviour; the base trainer warns each once at construction
        (:class:`~trl_ext.trainers.base.DropInDifferenceWarning`). Default: none."""
        return []

    def estimator_kwargs(self, trainer: GRPOTrainer) -> dict:
        """Keyword arguments this strategy adds to the estimator call on train batches (and evaluation batches of
        presets with ``train_estimator_in_eval``), e.g. options a method config holds; the config's
        ``advantage_estimator_kwargs`` take precedence."""
        return {}

    def observe_advantages(self, trainer: GRPOTrainer, batch: RolloutBatch, result: Any, valid: torch.Tensor) -> None:
        """Called on train batches (and on evaluation batches of presets with ``train_estimator_in_eval``: check
        ``batch.mode``) after the registered estimator ran on ``batch[valid]`` with ``result`` (its
        :class:`~trl_ext.estimators.AdvantageResult`; ``None`` when no row was valid and the estimator did not run):
        update what the strategy learns (a support buffer, a
        calibration history) and log the method's diagnostics. Identical on every rank (the batch is global)."""

    def fixed_policy_normalizer(self, trainer: GRPOTrainer, batch: RolloutBatch) -> float | None:
        """A normalizer of the policy loss that must not depend on the realized rollouts, or ``None`` (TRL's).

        When a float ``K`` is returned, the base trainer makes the policy term of the loss
        ``(1/K) sum_rows A_i mean_t l_it`` for sequence-level losses (``dr_grpo``: ``(1/(K L)) sum_rows A_i
        sum_t l_it``) and ``(1/(K L)) sum_rows A_i sum_t l_it`` for global token-level losses, with ``L =
        max_completion_length``, whatever the number of real or pad rows (PAIR's design-unbiased normalizer).
        """
        return None

    def describe(self, trainer: GRPOTrainer) -> str:
        """One line saying what each training step generates (logged at construction)."""
        return f"rollout strategy {self.name}"

    def state_dict(self) -> dict:
        """State saved in every checkpoint (``torch.load(weights_only=True)``-loadable values only)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""


@register_rollout_strategy("fixed_groups")
class FixedGroups(RolloutStrategy):
    """TRL's allocation: ``num_generations`` rollouts for each prompt of the generation batch, one call."""

    name = "fixed_groups"

    def generate_and_score(self, trainer, inputs):
        return trainer.score_fixed_groups(inputs)

    def describe(self, trainer):
        g = int(trainer.num_generations)
        return (f"rollout strategy fixed_groups: {trainer.args.generation_batch_size} rollouts per generation batch "
                f"({g} per prompt), as TRL")


def side_input_arrays(batch: RolloutBatch, estimator: str, valid: torch.Tensor, strategy: RolloutStrategy) -> dict:
    """The registered side inputs of ``estimator``, cut to the ``valid`` rows of ``batch`` (keyword -> ndarray).

    Row-level inputs keep one value (or one row of a 2-D input) per valid row; group-level inputs keep one value per
    group that has a valid row, in order of first appearance, and must be equal on every row of a group
    (``ValueError`` otherwise).
    A declared input missing from ``batch.side_inputs`` is a ``RuntimeError`` naming the strategy that should have
    supplied it.
    """
    from ..estimators.baselines import estimator_side_inputs

    out = {}
    for key, level in estimator_side_inputs(estimator).items():
        if level == "strategy":  # passed by the strategy's estimator_kwargs, not gathered from the batch
            continue
        if key not in batch.side_inputs:
            raise RuntimeError(f"advantage estimator {estimator!r} needs side input {key!r}, but rollout strategy "
                               f"{strategy.name!r} did not supply it for this batch (RolloutStrategy.side_inputs or "
                               "finish_rollouts(side_inputs=...)).")
        values = np.asarray(batch.side_inputs[key], dtype=np.float64)[valid.numpy()]
        if level == "group":
            gid = batch.group_ids[valid].numpy()
            _, first = np.unique(gid, return_index=True)
            order = np.sort(first)
            per_group = values[order]
            spread = values - per_group[np.searchsorted(gid[order], gid)] if gid.size else values
            if np.any(np.abs(np.nan_to_num(spread)) > 0):
                raise ValueError(f"side input {key!r} is declared per group but differs within a group.")
            values = per_group
        out[key] = values
    return out


def unique_prompt_rows(rows: list[dict], k: int) -> list[dict]:
    """The prompts of a generation batch in sampler order: rows deduplicated by ``trl_ext_row_idx`` (TRL's
    ``RepeatSampler`` yields each prompt ``k`` times in a row), or every ``k``-th row when the column is missing."""
    col = compat.ROW_IDX_COLUMN
    if rows and all(col in x for x in rows):
        seen, out = set(), []
        for x in rows:
            key = int(x[col])
            if key not in seen:
                seen.add(key)
                out.append(x)
        return out
    return [rows[i] for i in range(0, len(rows), k)]


def rank_block(n: int, p: int, rank: int) -> tuple[int, int]:
    """Contiguous block ``[start, stop)`` of ``n`` items owned by ``rank`` of ``p`` (sizes differ by at most 1)."""
    base, extra = divmod(n, p)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def weighted_reward(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """TRL's scalar reward ``sum_f w_f r_f`` (``nansum``), NaN where every reward function returned ``None``."""
    rpf = rewards_per_func.float()
    r = (rpf * weights.to(rpf.device).float().unsqueeze(0)).nansum(dim=1)
    r[torch.isnan(rpf).all(dim=1)] = float("nan")
    return r


def group_has_signal(rewards: np.ndarray, atol: float) -> bool:
    """Whether a group's finite rewards are not all equal (``max - min > atol``; needs >= 2 finite rewards)."""
    fin = rewards[np.isfinite(rewards)]
    return fin.size >= 2 and float(fin.max() - fin.min()) > atol


@register_rollout_strategy("dynamic_sampling")
class DynamicSampling(RolloutStrategy):
    """DAPO dynamic sampling (arXiv:2503.14476, Eq. 11's constraint ``0 < |{correct}| < G`` and Algorithm 1).

    Per generation batch with ``K = generation_batch_size / num_generations`` prompts:

    1. the ``K`` prompts TRL's sampler yielded are generated, ``G = num_generations`` rollouts each, and scored;
    2. a group is **kept** when its finite rewards are not all equal (``max - min > dynamic_sampling_std_atol``;
       groups with fewer than two scorable rollouts are dropped too, they carry no group baseline);
    3. while fewer than ``K`` groups are kept and fewer than ``dynamic_sampling_max_rounds`` extra rounds ran, the
       strategy draws as many new prompts as groups are missing (uniformly from the training dataset, with a
       generator keyed by ``(seed, generation index, round)``, identical on every rank) and generates them;
    4. the first ``K`` kept groups (in draw order) are trained on; extra kept groups are dropped like DAPO does.
       If the cap is reached with fewer than ``K``, the batch is smaller (``dapo/batch_fill`` < 1); if nothing is
       kept, the step trains on nothing (one masked pad row per rank keeps the collectives aligned).

    Every generated token, including those of dropped groups, is counted in ``ext/generated_tokens``. Whole groups
    are assigned to ranks in contiguous blocks, so each group is generated and scored on one rank and the result does not
    depend on the number of processes (up to generation randomness). Diagnostics: ``dapo/rounds``,
    ``dapo/generated_groups``, ``dapo/filtered_groups``, ``dapo/kept_groups``, ``dapo/batch_fill``,
    ``dapo/keep_rate``.
    """

    name = "dynamic_sampling"

    @classmethod
    def from_trainer(cls, trainer, **kwargs):
        """From the config's ``dynamic_sampling_*`` fields; needs a map-style training dataset (refills by index)."""
        from datasets import IterableDataset

        ds = trainer.train_dataset
        if isinstance(ds, IterableDataset) or not hasattr(ds, "__len__"):
            raise ValueError("dynamic_sampling draws refill prompts by index and needs a map-style training "
                             "dataset (datasets.Dataset); got an iterable dataset.")
        a = trainer.args
        return cls(a.dynamic_sampling_max_rounds, a.dynamic_sampling_std_atol, seed=a.seed, **kwargs)

    def __init__(self, max_rounds: int, std_atol: float = 0.0, seed: int = 0):
        self.max_rounds = int(max_rounds)
        self.std_atol = float(std_atol)
        self.seed = int(seed)
        self.generation_index = 0
        self.totals = {"generated_groups": 0, "filtered_groups": 0, "kept_groups": 0, "short_batches": 0}

    def describe(self, trainer):
        g = int(trainer.num_generations)
        k = int(trainer.args.generation_batch_size) // g
        return (f"rollout strategy dynamic_sampling (DAPO): {k} prompts x {g} rollouts per generation batch as TRL, "
                f"plus up to {self.max_rounds} refill rounds (each at most {k} x {g} rollouts) replacing "
                "zero-variance groups")

    # -------------------------------------------------------------------------------------------------- helpers
    def _draw_refill(self, trainer, n: int, round_index: int) -> list[dict]:
        ds = trainer.train_dataset
        size = len(ds)
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 0xDA90, self.generation_index, round_index])
        idx = rng.choice(size, size=min(n, size), replace=False)
        return [dict(ds[int(i)]) for i in idx]

    # -------------------------------------------------------------------------------------------------- main
    def generate_and_score(self, trainer, inputs):
        g = int(trainer.num_generations)
        p, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
        groups = unique_prompt_rows(compat.gather_object(list(inputs)), g)
        target = len(groups)
        kept: list[dict] = []
        pending = groups
        rounds = generated = filtered = 0
        weights = trainer.reward_weights
        fallback = groups[0]
        while True:
            mine = list(range(*rank_block(len(pending), p, rank)))
            rows = [pending[j] for j in mine for _ in range(g)]
            c_ids, lps = trainer.generate_rollouts(rows, fallback_row=fallback)
            rpf = trainer.score_rollouts_local(rows, c_ids)
            local = []
            for n_j, j in enumerate(mine):
                sl = slice(n_j * g, (n_j + 1) * g)
                local.append({"j": j, "c_ids": c_ids[sl], "lps": None if lps is None else lps[sl],
                              "rpf": rpf[sl].tolist()})
            results = sorted(compat.gather_object(local), key=lambda d: d["j"])
            generated += len(results)
            for res in results:
                r = weighted_reward(torch.tensor(res["rpf"], dtype=torch.float32), weights).double().numpy()
                if group_has_signal(r, self.std_atol):
                    kept.append({"row": pending[res["j"]], **res})
                else:
                    filtered += 1
            if len(kept) >= target or rounds >= self.max_rounds or len(pending) == 0:
                break
            rounds += 1
            pending = self._draw_refill(trainer, target - len(kept), rounds)
        short = len(kept) < target
        kept = kept[:target]
        # whole kept groups to ranks in contiguous blocks (the gathered batch keeps the draw order, as with one
        # process); every rank calls finish_rollouts exactly once
        mine = kept[slice(*rank_block(len(kept), p, rank))]
        rows, c_out, lp_out, rpf_out, gids = [], [], [], [], []
        for n_j, grp in enumerate(mine):
            rows += [grp["row"]] * g
            c_out += [list(c) for c in grp["c_ids"]]
            lp_out += [None] * g if grp["lps"] is None else [list(x) for x in grp["lps"]]
            rpf_out += grp["rpf"]
            gids += [n_j] * g
        is_pad = None
        if not rows:  # nothing for this rank: one masked pad row keeps the collectives aligned
            eos = compat.tokenizer(trainer).eos_token_id
            rows, c_out, lp_out, gids = [fallback], [[eos]], [None], [0]
            rpf_out = [[float("nan")] * len(weights)]
            is_pad = [True]
        use_lps = any(x is not None for x in lp_out)
        if use_lps:
            lp_out = [[0.0] * len(c) if x is None else x for x, c in zip(lp_out, c_out)]
        self.generation_index += 1
        self.totals["generated_groups"] += generated
        self.totals["filtered_groups"] += filtered
        self.totals["kept_groups"] += len(kept)
        self.totals["short_batches"] += int(short)
        log = trainer.log_ext_metric
        log("dapo/rounds", float(rounds), "train")
        log("dapo/generated_groups", float(generated), "train")
        log("dapo/filtered_groups", float(filtered), "train")
        log("dapo/kept_groups", float(len(kept)), "train")
        log("dapo/batch_fill", len(kept) / max(target, 1), "train")
        log("dapo/keep_rate", (generated - filtered) / max(generated, 1), "train")
        return trainer.finish_rollouts(rows, c_out, group_ids=gids, logprobs=lp_out if use_lps else None,
                                       rewards_per_func=torch.tensor(rpf_out, dtype=torch.float32), is_pad=is_pad)

    def state_dict(self) -> dict:
        return {"generation_index": int(self.generation_index), "totals": dict(self.totals)}

    def load_state_dict(self, state: dict) -> None:
        self.generation_index = int(state.get("generation_index", 0))
        self.totals.update({k: int(v) for k, v in state.get("totals", {}).items()})


def validate_dynamic_sampling(args: Any) -> None:
    """Check the ``dynamic_sampling_*`` fields of a config; raises ``ValueError`` saying what to change."""
    r = args.dynamic_sampling_max_rounds
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise ValueError(f"dynamic_sampling_max_rounds must be an int >= 0 (extra generation rounds), got {r!r}.")
    a = args.dynamic_sampling_std_atol
    if not (isinstance(a, int | float) and math.isfinite(a) and a >= 0):
        raise ValueError(f"dynamic_sampling_std_atol must be a finite number >= 0, got {a!r}.")

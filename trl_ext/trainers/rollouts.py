"""Rollout allocation strategies: how a trainer turns one generation batch of prompts into scored rollouts.

A :class:`RolloutStrategy` returns data: :meth:`RolloutStrategy.rollout` gets the rows TRL's sampler yielded on this
rank and returns :class:`RolloutGroups` -- TRL's fixed groups (:meth:`RolloutGroups.trl`) or its own rollouts
(variable counts per prompt, pad rows), with any estimator inputs. The base trainer alone pads, replays once through
TRL's tail, gathers the :class:`~trl_ext.trainers.batch.RolloutBatch`, runs the estimator and calls
:meth:`RolloutStrategy.update`; calls go one way. A strategy keeps its own state (``state_dict`` /
``load_state_dict``), saved in every checkpoint.

Strategies shipped with the library:

* :class:`FixedGroups` -- TRL's behaviour: ``num_generations`` rollouts per prompt, generated in one call.
* :class:`DynamicSampling` -- DAPO's dynamic sampling ("DAPO: An Open-Source LLM Reinforcement Learning System at
  Scale", arXiv:2503.14476, Section 3.2 and Algorithm 1): groups whose rewards are all equal carry no GRPO signal and
  are dropped; more prompts are drawn and generated until the batch holds as many informative groups as TRL's batch
  has prompts, or a cap of extra rounds is reached.
* V0.5's OSLA rounds (:class:`trl_ext.trainers.v05.OSLARounds`), PAIR's probe-then-continue
  (:class:`trl_ext.trainers.pair.PrefixProbeRollouts`) and BASIS's value-table lookup
  (:class:`trl_ext.trainers.basis.strategy.ValueTableLookup`: fixed groups plus each row's offline value).

Every token any strategy generates goes through ``api.generate`` / ``api.generate_ids`` or TRL's ``_generate``,
all of which end in the one generated-token counter (``ext/generated_tokens``).

To add a strategy, subclass :class:`RolloutStrategy`, register it with :func:`register_rollout_strategy` and select
it with ``ExtGRPOConfig(rollout_strategy=name, rollout_strategy_kwargs={...})``. A strategy that feeds an estimator
lists what it hands over in :attr:`RolloutStrategy.provides`; the config refuses an estimator whose side inputs its
strategy does not provide (``docs/architecture.md`` has a worked example).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import _trl_compat as compat

if TYPE_CHECKING:  # pragma: no cover
    from .batch import RolloutBatch

__all__ = ["RolloutGroups", "RolloutStrategy", "FixedGroups", "DynamicSampling", "register_rollout_strategy", "get_rollout_strategy",
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
        check_strategy_interface(cls)
        old = ROLLOUT_STRATEGIES.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"rollout strategy {name!r} is already registered to {old!r}; pick another name.")
        cls.name = name
        ROLLOUT_STRATEGIES[name] = cls
        return cls

    return decorator


ENTRY_POINT_GROUP = "trl_ext.rollout_strategies"
"""Strategies of installed packages register themselves under this entry-point group (``name = "module:Class"``; the
package's own method strategies are declared in its ``pyproject.toml``): a config can name them before their module
is imported, and the base holds no table of method names."""


def registered_rollout_strategies() -> dict[str, type]:
    """Every registered strategy, those of the entry-point group included (their modules imported)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in ROLLOUT_STRATEGIES:
            ep.load()  # the module registers the class with @register_rollout_strategy
    return dict(ROLLOUT_STRATEGIES)


def get_rollout_strategy(name: str) -> type:
    """The strategy class registered under ``name`` (``KeyError`` listing the known names otherwise)."""
    if name not in ROLLOUT_STRATEGIES:
        registered_rollout_strategies()
    try:
        return ROLLOUT_STRATEGIES[name]
    except KeyError:
        raise KeyError(f"unknown rollout strategy {name!r}; registered: "
                       f"{sorted(registered_rollout_strategies())}") from None


REMOVED_MEMBERS = {
    "generate_and_score": "rollout(api, rows) returning RolloutGroups",
    "side_inputs": "RolloutGroups.side_inputs",
    "estimator_kwargs": "RolloutGroups.estimator_inputs",
    "observe_advantages": "update(api, batch, result) returning metrics",
    "fixed_policy_normalizer": "RolloutGroups.fixed_normalizer",
    "dropin_differences": "describe(api) returning (line, differences)",
    "estimator_kwarg_names": "provides", "provides_objects": "provides", "feeds_evaluation": "rollout per api.mode",
}
"""Members of the rollout-strategy interface before trl_ext 0.3 and what replaces each (``docs/migrating.md``)."""


def check_strategy_interface(cls: type) -> None:
    """Refuse a strategy class that still defines a member of the old interface, which the base would never call
    (its rollouts would silently be TRL's fixed groups): ``TypeError`` naming each replacement."""
    old = sorted(m for m in REMOVED_MEMBERS if any(m in vars(k) for k in cls.__mro__ if k is not object))
    if old:
        raise TypeError(f"rollout strategy {cls.__name__} defines {old}, members of the rollout-strategy interface "
                        "before trl_ext 0.3 that are no longer called; port them: "
                        + "; ".join(f"{m} -> {REMOVED_MEMBERS[m]}" for m in old) + " (docs/migrating.md).")


@dataclass
class RolloutGroups:
    """What a rollout strategy hands the base trainer for one generation batch: this rank's rollouts, as data.

    Either TRL's own fixed groups (:meth:`trl`: ``rows is None``; TRL generates ``num_generations`` rollouts for the
    rows its sampler yielded) or the strategy's own rollouts: one entry per rollout, the rollouts of a group
    contiguous. The base pads every rank to the same row count, replays the rollouts once through TRL's tail
    (old/reference log-probs, masks, the vLLM importance-sampling ratio, the reward functions unless
    ``rewards_per_func`` is given), builds the gathered :class:`~trl_ext.trainers.batch.RolloutBatch`, runs the
    estimator and then :meth:`RolloutStrategy.update`.

    Attributes
    ----------
    rows : list of dict or None
        The dataset row of each rollout (a prompt's row repeated once per rollout); ``None``: TRL's fixed groups.
    completion_ids : list of list of int
        EOS-truncated completion ids, aligned with ``rows``.
    group_ids : list of int
        Local group label of each rollout (rows of a group contiguous; the base makes them global).
    logprobs : list of list of float, optional
        Sampling log-probs per completion token (vLLM), aligned with ``completion_ids``.
    rewards_per_func : Tensor (n, F), optional
        Rewards the strategy already computed (NaN = ``None``); else TRL's reward functions score the rows.
    is_pad : list of bool, optional
        Rows that only keep the collectives aligned (a rank with nothing to contribute passes one): no reward, no
        advantage, no loss, in no metric.
    side_inputs : dict of name -> list
        Per-row estimator side inputs of this rank's rows (for :meth:`trl`: of the sampler's rows), gathered into
        ``RolloutBatch.side_inputs``: a number per row, or a list of ``K`` numbers (an ``(N, K)`` input).
    estimator_inputs : dict
        Keyword inputs of the estimator that are not per row (PAIR's designed draws, V0.5's and BASIS's options):
        **global**, identical on every rank; the config's ``advantage_estimator_kwargs`` take precedence.
    fixed_normalizer : float, optional
        A policy-loss normalizer fixed before the rollouts were drawn (PAIR's ``K``), see
        :meth:`~trl_ext.trainers.accounting.BatchAccounting.policy_scale`.
    record : any
        What the strategy wants back in :meth:`RolloutStrategy.update` (``batch.record``), e.g. its per-prompt
        decisions; identical on every rank.
    """

    rows: list[dict] | None = None
    completion_ids: list[list[int]] | None = None
    group_ids: list[int] | None = None
    logprobs: list[list[float]] | None = None
    rewards_per_func: torch.Tensor | None = None
    is_pad: list[bool] | None = None
    side_inputs: dict[str, list] = field(default_factory=dict)
    estimator_inputs: dict[str, Any] = field(default_factory=dict)
    fixed_normalizer: float | None = None
    record: Any = None

    @classmethod
    def trl(cls, side_inputs: dict[str, list] | None = None, **kwargs) -> RolloutGroups:
        """TRL's fixed groups for the sampler's rows (optionally with per-row side inputs of those rows)."""
        return cls(side_inputs=dict(side_inputs or {}), **kwargs)

    @classmethod
    def pad_only(cls, row: dict, eos_token_id: int, num_reward_funcs: int, **kwargs) -> RolloutGroups:
        """One masked pad row (``row``'s prompt, an EOS completion): a rank with no rollout of its own."""
        return cls(rows=[row], completion_ids=[[eos_token_id]], group_ids=[0], is_pad=[True],
                   rewards_per_func=torch.full((1, num_reward_funcs), float("nan")), **kwargs)


class RolloutStrategy:
    """Base class of rollout allocation strategies: a strategy returns data and learns from the batch.

    A strategy author implements at most five members: :meth:`rollout` (this rank's rollouts of one generation
    batch, as :class:`RolloutGroups`), :meth:`update` (after the estimator: learn, return diagnostics),
    :meth:`describe`, :meth:`state_dict` and :meth:`load_state_dict`. It declares in :attr:`provides` the estimator
    inputs it hands over (checked against the estimator when the config is built). Both calls get ``api``
    (:class:`~trl_ext.trainers.rollout_io.RolloutAPI`: generation, scoring, the process group, logging), never the
    trainer; both run on every rank with identical global inputs where they are global.
    """

    name = "strategy"
    provides: frozenset[str] = frozenset()
    """The estimator inputs this strategy supplies: per-row ``side_inputs`` and ``estimator_inputs`` (checked when the
    config is built against the estimator's registered side inputs and keywords)."""

    @classmethod
    def validate_kwargs(cls, kwargs: dict, config=None) -> None:
        """Check the config's ``rollout_strategy_kwargs`` (with the rest of ``config``) when the config is built."""

    @classmethod
    def from_trainer(cls, trainer, **kwargs) -> RolloutStrategy:
        """Build the strategy for ``trainer`` (``kwargs``: the config's ``rollout_strategy_kwargs``)."""
        return cls(**kwargs)

    def rollout(self, api, rows: list[dict]) -> RolloutGroups:
        """This rank's rollouts for the ``rows`` TRL's sampler yielded (train and evaluation batches: ``api.mode``).
        Default: TRL's fixed groups."""
        return RolloutGroups.trl()

    def update(self, api, batch: RolloutBatch, result: Any) -> dict[str, float]:
        """After the estimator ran on ``batch`` (``result``: its :class:`~trl_ext.estimators.AdvantageResult`, or
        ``None`` when it did not run): update what the strategy learns; return metrics to log (``name -> value``,
        global). Default: nothing."""
        return {}

    def describe(self, api) -> str | tuple[str, list[str]]:
        """One line saying what each training step generates (logged at construction), optionally with the ways it
        differs from TRL for the same arguments, each naming the field that restores TRL's behaviour (warned once as
        :class:`~trl_ext.trainers.base.DropInDifferenceWarning`)."""
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

    def describe(self, api):
        return (f"rollout strategy fixed_groups: {api.args.generation_batch_size} rollouts per generation batch "
                f"({api.num_generations} per prompt), as TRL")


def strategy_description(strategy: RolloutStrategy, api) -> tuple[str, list[str]]:
    """``(line, drop-in differences)`` of :meth:`RolloutStrategy.describe` (which may return the line alone)."""
    described = strategy.describe(api)
    return (described, []) if isinstance(described, str) else (described[0], list(described[1]))


def side_input_arrays(batch: RolloutBatch, estimator: str, valid: torch.Tensor) -> dict:
    """The registered per-row and per-group side inputs of ``estimator``, cut to the ``valid`` rows of ``batch``
    (keyword -> ndarray); inputs of level ``"strategy"`` come from ``batch.estimator_inputs`` instead.

    Row-level inputs keep one value (or one row of a 2-D input) per valid row; group-level inputs keep one value per
    group that has a valid row, in order of first appearance, and must be equal on every row of a group
    (``ValueError`` otherwise).
    """
    from ..estimators.baselines import estimator_side_inputs

    out = {}
    for key, level in estimator_side_inputs(estimator).items():
        if level == "strategy":
            continue
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
        return cls(ds, a.dynamic_sampling_max_rounds, a.dynamic_sampling_std_atol, seed=a.seed, **kwargs)

    def __init__(self, dataset, max_rounds: int, std_atol: float = 0.0, seed: int = 0):
        self.dataset = dataset
        self.max_rounds = int(max_rounds)
        self.std_atol = float(std_atol)
        self.seed = int(seed)
        self.generation_index = 0
        self.totals = {"generated_groups": 0, "filtered_groups": 0, "kept_groups": 0, "short_batches": 0}

    def describe(self, api):
        g = api.num_generations
        k = int(api.args.generation_batch_size) // g
        return (f"rollout strategy dynamic_sampling (DAPO): {k} prompts x {g} rollouts per generation batch as TRL, "
                f"plus up to {self.max_rounds} refill rounds (each at most {k} x {g} rollouts) replacing "
                "zero-variance groups")

    # -------------------------------------------------------------------------------------------------- helpers
    def _draw_refill(self, n: int, round_index: int) -> list[dict]:
        ds = self.dataset
        size = len(ds)
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 0xDA90, self.generation_index, round_index])
        idx = rng.choice(size, size=min(n, size), replace=False)
        return [dict(ds[int(i)]) for i in idx]

    # -------------------------------------------------------------------------------------------------- main
    def rollout(self, api, inputs):
        if api.mode != "train":
            return RolloutGroups.trl()
        g = api.num_generations
        p, rank = api.num_processes, api.process_index
        groups = unique_prompt_rows(api.gather_object(list(inputs)), g)
        target = len(groups)
        kept: list[dict] = []
        pending = groups
        rounds = generated = filtered = 0
        fallback = groups[0]
        while True:
            mine = list(range(*rank_block(len(pending), p, rank)))
            rows = [pending[j] for j in mine for _ in range(g)]
            c_ids, lps = api.generate(rows, fallback_row=fallback)
            rpf = api.score(rows, c_ids)
            local = []
            for n_j, j in enumerate(mine):
                sl = slice(n_j * g, (n_j + 1) * g)
                local.append({"j": j, "c_ids": c_ids[sl], "lps": None if lps is None else lps[sl],
                              "rpf": rpf[sl].tolist()})
            results = sorted(api.gather_object(local), key=lambda d: d["j"])
            generated += len(results)
            for res in results:
                r = api.reward(torch.tensor(res["rpf"], dtype=torch.float32)).double().numpy()
                if group_has_signal(r, self.std_atol):
                    kept.append({"row": pending[res["j"]], **res})
                else:
                    filtered += 1
            if len(kept) >= target or rounds >= self.max_rounds or len(pending) == 0:
                break
            rounds += 1
            pending = self._draw_refill(target - len(kept), rounds)
        short = len(kept) < target
        kept = kept[:target]
        self.generation_index += 1
        self.totals["generated_groups"] += generated
        self.totals["filtered_groups"] += filtered
        self.totals["kept_groups"] += len(kept)
        self.totals["short_batches"] += int(short)
        for name, value in (("rounds", rounds), ("generated_groups", generated), ("filtered_groups", filtered),
                            ("kept_groups", len(kept)), ("batch_fill", len(kept) / max(target, 1)),
                            ("keep_rate", (generated - filtered) / max(generated, 1))):
            api.log(f"dapo/{name}", float(value))
        # whole kept groups to ranks in contiguous blocks (the gathered batch keeps the draw order, as with one
        # process)
        mine = kept[slice(*rank_block(len(kept), p, rank))]
        if not mine:  # nothing for this rank: one masked pad row keeps the collectives aligned
            return RolloutGroups.pad_only(fallback, api.eos_token_id, api.num_reward_funcs)
        c_ids = [list(c) for grp in mine for c in grp["c_ids"]]
        lps = None
        if any(grp["lps"] is not None for grp in mine):  # vLLM: per-token sampling log-probs (0 where none came)
            lps = [list(x) for grp in mine for x in (grp["lps"] or [[0.0] * len(c) for c in grp["c_ids"]])]
        return RolloutGroups(
            rows=[grp["row"] for grp in mine for _ in range(g)],
            completion_ids=c_ids,
            group_ids=[n_j for n_j in range(len(mine)) for _ in range(g)],
            logprobs=lps,
            rewards_per_func=torch.tensor([r for grp in mine for r in grp["rpf"]], dtype=torch.float32))

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

"""PAIR's rollout strategy :class:`PrefixProbeRollouts` (probe, design, draw, continue) and :class:`DesignHeads`,
the prefix heads it designs with and refreshes.

The strategy calls only the pure PAIR functions (:func:`~trl_ext.estimators.pair.design_and_draw`, the heads of
:mod:`trl_ext.estimators.pair_heads`) and the base trainer's public rollout API
(``api.generate_ids``, returning its rollouts as :class:`~trl_ext.trainers.rollouts.RolloutGroups`); what it needs from
:class:`~trl_ext.trainers.pair.trainer.PAIRTrainer` -- the heads, the prefix feature extractor and the snap delimiters -- is
built with it (:meth:`PrefixProbeRollouts.build`, from :meth:`PAIRTrainer.create_rollout_strategy` or, selected by
config on any trainer, :meth:`PrefixProbeRollouts.from_trainer`). PAIR's options are read from the strategy's
typed ``options`` (:data:`~trl_ext.trainers.pair.config.PAIROptions`, from a ``PAIRConfig`` or
``rollout_strategy_kwargs``) and TRL's fields from the trainer's ``args``, at call time. Section, equation and appendix
numbers refer to "Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR" (arXiv:2608.11368).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from ...estimators.pair import DesignWarmStart, GroupDraw, anchor_marginal_inclusion, design_and_draw, fixed_normalizer
from ...estimators.pair_heads import PrefixHeads
from .. import _trl_compat as compat
from ..rollouts import RolloutGroups, RolloutStrategy, register_rollout_strategy
from .config import (
    PAIRConfig,
    PAIROptions,
    PAIRShortProbeWarning,
    pair_advantage_options,
    pair_design_options,
    pair_kwargs_options,
    pair_tau,
    short_probe_message,
    validate_pair_options,
)
from .diagnostics import PairBatchStats, pair_description, pair_expected_token_factor, pair_metrics
from .heads import DesignHeads, delimiter_ids, prefix_features

__all__ = ["PrefixProbeRollouts"]


@register_rollout_strategy("pair_prefix_probe")
class PrefixProbeRollouts(RolloutStrategy):
    """PAIR's rollout allocation: probe every candidate to a prefix, design, draw, continue the selected ones.

    Train mode only (evaluation uses TRL's full groups). One call of :meth:`rollout` per generation batch on every
    rank: refresh the heads (labels of the previous batch, :meth:`DesignHeads.refresh`), probe (one
    ``api.generate_ids`` call capped at ``tau + snap_window`` tokens), prefix features and head predictions,
    per-prompt design and draw (:func:`~trl_ext.estimators.pair.design_and_draw`, logged in :attr:`design_log` before
    anything else is generated), continuation (a second ``generate_ids`` call), and the completed vertices returned
    with their gathered draws. The base's one counter
    ``ext/generated_tokens`` therefore holds every probe and continuation token (unselected prefixes and equalizing
    dummy rows included); ``pair/prefix_tokens`` and ``pair/realized_suffix_tokens`` are its breakdown.

    Parameters
    ----------
    delimiter_ids : set of int, optional
        Token ids that end a snapped checkpoint (``pair_snap_window > 0``; Appendix C "Prefix checkpoint").
    heads : DesignHeads
        The prefix heads the design uses; :meth:`update` adds their delayed labels.
    features : callable
        ``features(seqs: list[list[int]]) -> Tensor (B, H)``: stop-gradient prefix summaries of ``prompt + prefix``
        token sequences (:meth:`PAIRTrainer.pair_features`); one call per generation batch on every rank.

    Attributes
    ----------
    generation_index : int
        Generation batches produced so far (keys the design randomness; checkpointed).
    warm_start : DesignWarmStart
        Profiles of the previous step's solutions (checkpointed).
    design_log : list of dict
        Per prompt of the latest generation batch on this rank (see :attr:`PAIRTrainer.pair_design_log`).
    last_stats : dict
        The ``pair/*`` metrics of the latest train batch.
    totals : dict
        Cumulative ``prefix_tokens``, ``suffix_tokens``, ``groups``, ``zero_edge_groups``, ``solver_fallbacks``
        (train mode; checkpointed).
    """

    provides = frozenset({"draws", "w_max", "self_normalize", "standardize"})  # the "pair_draw" estimator's inputs

    def __init__(self, delimiter_ids: set[int] | None = None, *, heads: DesignHeads | None = None,
                 features: Callable[[list[list[int]]], torch.Tensor] | None = None, options=None, args=None):
        self.options = options  # PAIROptions
        self.args = args  # the trainer's config: TRL's fields (num_generations, max_completion_length, seed)
        self.delimiter_ids = set(delimiter_ids or ())
        self.heads = heads
        self.features = features
        self.generation_index = 0
        self.warm_start = DesignWarmStart()
        self.design_log: list[dict] = []
        self.last_stats: dict[str, float] = {}
        self.totals = {"prefix_tokens": 0, "suffix_tokens": 0, "zero_edge_groups": 0, "solver_fallbacks": 0,
                       "groups": 0}

    @classmethod
    def validate_kwargs(cls, kwargs: dict, config=None) -> None:
        """The PAIR options in ``rollout_strategy_kwargs`` (names without ``pair_``) checked with the rest of the
        config as ``PAIRConfig`` checks its own fields (:func:`~.config.validate_pair_options`)."""
        validate_pair_options(pair_kwargs_options(kwargs), config)

    @classmethod
    def from_trainer(cls, trainer, **kwargs) -> PrefixProbeRollouts:
        """The strategy the config selects on any trainer: the options are a :class:`PAIRConfig`'s fields, or
        ``rollout_strategy_kwargs`` (:func:`~trl_ext.trainers.pair.config.pair_kwargs_options`)."""
        args = trainer.args
        return cls.build(trainer, PAIROptions.from_config(args) if isinstance(args, PAIRConfig) else
                         pair_kwargs_options(kwargs))

    @classmethod
    def build(cls, trainer, options) -> PrefixProbeRollouts:
        """The strategy for ``trainer`` with the PAIR ``options`` (:data:`PAIROptions`): fresh prefix heads
        on the model's hidden size (:class:`DesignHeads`), the prefix features of :func:`prefix_features` and the
        snap delimiters of the tokenizer (``pair_snap_window > 0``). Warns (:class:`PAIRShortProbeWarning`) when the
        probe is 1-2 tokens."""
        short = short_probe_message(options, trainer.args.max_completion_length)
        if short is not None:
            warnings.warn(short, PAIRShortProbeWarning, stacklevel=4)
        cfg = getattr(trainer.model, "config", None)
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        hidden = getattr(text_cfg, "hidden_size", None)
        if hidden is None:
            raise ValueError("PAIR needs model.config.hidden_size for the prefix heads.")
        seed = trainer.args.seed if options.head_seed is None else options.head_seed
        heads = PrefixHeads(int(hidden), options.head_hidden, replay_size=options.replay_size,
                            lr=options.head_lr, min_labels=options.head_min_labels, seed=int(seed))
        design_heads = DesignHeads(heads, options, num_processes=trainer.accelerator.num_processes,
                                   device=trainer.accelerator.device)
        delims = delimiter_ids(trainer, options.snap_delimiters) if options.snap_window > 0 else set()
        features = partial(prefix_features, trainer, last_k=int(options.summary_last_k))
        return cls(delims, heads=design_heads, features=features, options=options, args=trainer.args)

    # ------------------------------------------------------------------------------------------------ interface
    def describe(self, api) -> str:
        """What each step generates, compared with TRL's GRPO on the same arguments (logged at construction;
        :func:`~.diagnostics.pair_description`)."""
        return pair_description(self.name, self.options, self.args, self.tau, self.probe_len())

    def expected_token_factor(self) -> float:
        """Expected generated tokens per step relative to TRL's GRPO with the same arguments
        (:func:`~.diagnostics.pair_expected_token_factor`)."""
        return pair_expected_token_factor(self.probe_len(), self.args.max_completion_length, self.options.budget_ratio)

    def update(self, api, batch, result) -> dict[str, float]:
        """After the estimator: the delayed labels of the completed, scorable vertices go to the heads' replay
        window (refit at the next generation, after this batch's update), the solver's answers to the warm start;
        returns the ``pair/*`` diagnostics."""
        records = batch.record
        if records is None:  # an evaluation batch: TRL's fixed groups
            return {}
        row_groups = [rec for rec in records if rec["completed"]]
        results = [] if result is None else result.extras["results"]
        stats = PairBatchStats()
        labels = ([], [], [], [])
        real = ~batch.is_pad
        for g, rec in enumerate(row_groups):
            idx = torch.nonzero((batch.group_ids == g) & real).flatten()
            r_rows = batch.rewards[idx].double().numpy()
            if g < len(results):
                stats.add_result(results[g])
            done = rec["completed"]
            pi_marg = anchor_marginal_inclusion(rec["pi_design"], rec["anchor"] is not None)
            ok = np.isfinite(r_rows) & (r_rows >= 0) & (r_rows <= 1)
            stats.unlabeled += int((np.isfinite(r_rows) & ~ok).sum())
            if ok.any():
                labels[0].append(rec["features"][torch.as_tensor(ok)])
                labels[1].append(torch.as_tensor(r_rows[ok]))
                labels[2].append(torch.as_tensor(np.asarray(rec["suffix_len"], dtype=np.float64)[ok]))
                labels[3].append(torch.as_tensor(pi_marg[done][ok]))
        for rec in records:
            stats.add_design(rec)
        if labels[1]:
            self.heads.add_labels(*(torch.cat(x) for x in labels))
        # warm start of the next step: this step's solver answers, in a layout-independent order
        solved = sorted((rec["row_idx"], rec["solution"]) for rec in records if rec["solution"] is not None)
        if solved:
            self.warm_start.update([x for _, x in solved])
        self.last_stats = pair_metrics(stats, self.heads)
        for key, value in (("prefix_tokens", stats.prefix_tokens), ("suffix_tokens", stats.suffix_tokens),
                           ("zero_edge_groups", stats.zero_edge), ("solver_fallbacks", stats.fallbacks),
                           ("groups", stats.groups)):
            self.totals[key] += int(value)
        return dict(self.last_stats)

    def state_dict(self) -> dict:
        """Generation index, token totals, solver warm start and the heads (:meth:`DesignHeads.state_dict`)."""
        return {"generation_index": int(self.generation_index), "totals": dict(self.totals),
                "warm_start": self.warm_start.state_dict(), "heads": self.heads.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.generation_index = int(state.get("generation_index", 0))
        self.totals.update({k: int(v) for k, v in state.get("totals", {}).items()})
        self.warm_start.load_state_dict(state.get("warm_start", {}))
        if state.get("heads") is not None:
            self.heads.load_state_dict(state["heads"])

    # ------------------------------------------------------------------------------------------------ helpers
    @property
    def tau(self) -> int:
        """The checkpoint ``tau`` in generated tokens (:func:`~trl_ext.trainers.pair.config.pair_tau`)."""
        return pair_tau(self.options, self.args.max_completion_length)

    def probe_len(self) -> int:
        """Tokens generated by the probe: ``tau + pair_snap_window``."""
        return self.tau + int(self.options.snap_window)

    @staticmethod
    def is_finished(eos_token_ids, completion: list[int], probe_len: int) -> bool:
        """Whether a probed candidate ended inside the probe (EOS, or fewer tokens than the cap)."""
        return len(completion) < probe_len or (len(completion) > 0 and completion[-1] in eos_token_ids)

    def checkpoint(self, completion: list[int], finished: bool) -> int:
        """Checkpoint position inside the probe tokens (snapping, Appendix C)."""
        if finished or not self.delimiter_ids:
            return len(completion)
        for pos in range(self.tau - 1, len(completion)):
            if completion[pos] in self.delimiter_ids:
                return pos + 1
        return len(completion)

    def design_rng(self, row_idx: int) -> np.random.Generator:
        """Fresh design randomness keyed by (seed, generation index, dataset row): never by an outcome, identical
        across process layouts."""
        return np.random.default_rng([int(self.args.seed) & 0xFFFFFFFF, 0x9A1, self.generation_index,
                                      int(row_idx) & 0xFFFFFFFF])

    def probe(self, api, rows: list[dict]) -> dict:
        """Steps 1-2 for local candidate rows: prompt ids, probe tokens (and vLLM log-probs), finished flags,
        checkpoints and prefix features."""
        prompt_ids = api.tokenize([x["prompt"] for x in rows])
        n_probe = self.probe_len()
        probe_ids, probe_lps = api.generate_ids(prompt_ids, max_new_tokens=n_probe)
        finished = [self.is_finished(api.eos_token_ids, c, n_probe) for c in probe_ids]
        ckpt = [self.checkpoint(c, f) for c, f in zip(probe_ids, finished)]
        feats = self.features([list(p) + list(c[:t]) for p, c, t in zip(prompt_ids, probe_ids, ckpt)])
        return {"prompt_ids": prompt_ids, "probe_ids": probe_ids, "probe_lps": probe_lps, "finished": finished,
                "features": feats}

    # ------------------------------------------------------------------------------------------------ main
    def rollout(self, api, inputs) -> RolloutGroups:
        """One generation batch (Steps 1-5): probes, design, draws, continuations; the completed vertices with their
        designed draws (gathered: the ``pair_draw`` estimator's input), ``K`` as the fixed normalizer and the
        per-prompt records for :meth:`update`. Evaluation batches are TRL's fixed groups."""
        if api.mode != "train":
            return RolloutGroups.trl()
        self.heads.refresh()
        G = api.num_generations
        rows = list(inputs)
        if len(rows) % G:
            raise RuntimeError(f"PAIR: {len(rows)} local rows are not a multiple of G = {G}.")
        K = len(rows) // G
        col = compat.ROW_IDX_COLUMN
        for k in range(K):
            keys = {rows[k * G + i].get(col, None) for i in range(G)}
            if len(keys) != 1:
                raise RuntimeError("PAIR: a candidate group spans several dataset rows; rows of a prompt must be "
                                   "contiguous in blocks of G (TRL's RepeatSampler with per-rank rows % G == 0).")
        num_prompts = api.all_sum(K)
        # 1-2. prefix probe, features, frozen heads
        pr = self.probe(api, rows)
        prompt_ids, probe_ids, probe_lps, finished = pr["prompt_ids"], pr["probe_ids"], pr["probe_lps"], pr["finished"]
        n_probe = self.probe_len()
        warmup = not self.heads.ready
        pred = self.heads.for_design().predict(pr["features"])
        p_hat = pred.p_hat.numpy()
        c_hat = pred.cost_hat.numpy()
        # 3. design + draw per prompt, logged before any continuation or reward
        warm = self.warm_start if self.options.solver_warm_start else None
        options = pair_design_options(self.options)
        draws: list[GroupDraw] = []
        self.design_log = []
        for k in range(K):
            sl = slice(k * G, (k + 1) * G)
            row_idx = int(rows[k * G].get(col, k))
            draw = design_and_draw(p_hat[sl], c_hat[sl], finished[sl], self.design_rng(row_idx),
                                   warmup=warmup, warm_start=warm, **options)
            draws.append(draw)
            self.design_log.append({
                "generation": self.generation_index, "row_idx": row_idx, "pi": draw.pi.tolist(),
                "pi_design": draw.pi_design.tolist(), "selected": draw.selected.tolist(),
                "finished": draw.finished.tolist(), "p_hat": p_hat[sl].tolist(), "cost_hat": c_hat[sl].tolist(),
                "anchor": draw.anchor, "reason": draw.reason, "n_iter": draw.n_iter,
                "warm_started": draw.warm_started, "expected_cost": draw.expected_cost, "budget": draw.budget,
            })
        # 4. continuation of selected unfinished prefixes from prompt + prefix
        cont_idx = [k * G + i for k, d in enumerate(draws) for i in range(G) if d.selected[i] and not d.finished[i]]
        max_new = int(self.args.max_completion_length) - n_probe
        cont_ids, cont_lps = api.generate_ids([list(prompt_ids[j]) + list(probe_ids[j]) for j in cont_idx],
                                              max_new_tokens=max_new)
        full_ids = [list(c) for c in probe_ids]
        full_lps = None if probe_lps is None else [list(lp) for lp in probe_lps]
        suffix_len = [0] * len(rows)
        for n_c, (j, c) in enumerate(zip(cont_idx, cont_ids)):
            full_ids[j] = full_ids[j] + list(c)
            suffix_len[j] = len(c)
            if full_lps is not None:  # vLLM: concatenate both phases' sampling log-probs (TRL's IS correction)
                if cont_lps is None:
                    raise RuntimeError("PAIR: the probe returned sampling log-probs but the continuation did not.")
                full_lps[j] = full_lps[j] + list(cont_lps[n_c])
        for k, entry in enumerate(self.design_log):  # realized costs, appended after the design was logged
            entry["realized_suffix_tokens"] = suffix_len[k * G:(k + 1) * G]
        # 5. completed vertices -> returned to the base, which replays them through TRL's tail
        out_rows, out_ids, out_gids, out_lps, records = [], [], [], [], []
        for k, d in enumerate(draws):
            done = [i for i in range(G) if d.selected[i]]
            for i in done:
                out_rows.append(rows[k * G + i])
                out_ids.append(full_ids[k * G + i])
                out_gids.append(k)
                if full_lps is not None:
                    out_lps.append(full_lps[k * G + i])
            records.append({
                "G": G, "row_idx": self.design_log[k]["row_idx"], "pi": d.pi.tolist(),
                "pi_design": d.pi_design.tolist(), "selected": d.selected.tolist(), "finished": d.finished.tolist(),
                "anchor": d.anchor, "completed": done, "features": pr["features"][k * G:(k + 1) * G][done].clone(),
                "suffix_len": [suffix_len[k * G + i] for i in done],
                "probe_len": [len(probe_ids[k * G + i]) for i in range(G)],
                "p_hat": p_hat[k * G:(k + 1) * G].tolist(), "c_hat": c_hat[k * G:(k + 1) * G].tolist(),
                "expected_cost": d.expected_cost, "budget": d.budget, "full_cost": d.full_cost, "reason": d.reason,
                "fell_back": d.fell_back, "degenerate": d.degenerate, "warmup": warmup, "n_iter": d.n_iter,
                "warm_started": d.warm_started,
                "solution": None if d.solution is None else [float(v) for v in d.solution],
                "nonfinite": int(pred.n_nonfinite) if k == 0 else 0,
            })
        is_pad = None
        if not out_rows:  # no completed vertex on this rank: one pad row keeps the collectives aligned
            out_rows, out_ids, out_gids, is_pad = [rows[0]], [full_ids[0]], [0], [True]
            out_lps = [full_lps[0]] if full_lps is not None else []
        self.generation_index += 1
        # the designed draw of every group with completed vertices, gathered in rank order (the estimator's input)
        records = api.gather_object(records)
        draws = [(_record_draw(rec), rec["completed"]) for rec in records if rec["completed"]]
        return RolloutGroups(
            rows=out_rows, completion_ids=out_ids, group_ids=out_gids,
            logprobs=out_lps if full_lps is not None else None, is_pad=is_pad, record=records,
            estimator_inputs={"draws": draws, **pair_advantage_options(self.options)},
            # K counts every probed prompt, also those that completed no vertex: fixed before the design draw, so the
            # policy loss (1/K) sum ... is design-unbiased (fixed_normalizer)
            fixed_normalizer=fixed_normalizer(num_prompts) if self.options.fixed_normalizer else None)


def _record_draw(rec: dict) -> GroupDraw:
    """The :class:`~trl_ext.estimators.pair.GroupDraw` of one gathered per-prompt record."""
    return GroupDraw(pi=np.asarray(rec["pi"]), pi_design=np.asarray(rec["pi_design"]),
                     selected=np.asarray(rec["selected"], dtype=bool),
                     finished=np.asarray(rec["finished"], dtype=bool), anchor=rec["anchor"],
                     expected_cost=rec["expected_cost"], budget=rec["budget"], full_cost=rec["full_cost"],
                     reason=rec["reason"])

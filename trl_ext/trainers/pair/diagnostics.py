"""PAIR's per-batch diagnostics: the ``pair/*`` metrics of one generation batch, from the gathered design records
and the ``pair_draw`` estimator's per-group results (logged by :class:`~trl_ext.trainers.pair.strategy.
PrefixProbeRollouts` through the trainer's ``log_ext_metric``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...estimators.pair import PairAdvantages

__all__ = ["PairBatchStats", "pair_description", "pair_expected_token_factor", "pair_metrics"]


def pair_expected_token_factor(probe_len: int, max_completion_length: int, budget_ratio: float) -> float:
    """Expected generated tokens per step relative to TRL's GRPO with the same arguments, for full-length
    completions: ``p + budget_ratio * (1 - p)`` with ``p = probe_len / max_completion_length`` (every candidate
    probed to ``tau + pair_snap_window`` tokens, a ``pair_budget_ratio`` share of the remaining tokens continued in
    expectation; <= 1, and <= ``p + budget_ratio``). Without the anchor pair and with the predicted costs on target."""
    p = probe_len / float(max_completion_length)
    return float(min(1.0, p + float(budget_ratio) * (1.0 - p)))


def pair_description(name: str, options: Any, args: Any, tau: int, n_probe: int) -> str:
    """The construction line of the PAIR strategy ``name``: probe, design and the compute against TRL's GRPO with the
    same arguments (``options``: :data:`~trl_ext.trainers.pair.config.PAIROptions`; ``args``: TRL's fields)."""
    a = options
    G, L = int(args.num_generations), int(args.max_completion_length)
    snap = f" (+ up to {a.snap_window} to a delimiter)" if a.snap_window else ""
    anchor = "; the anchor pair adds up to 2 continuations per prompt" if a.anchor_pair else ""
    factor = pair_expected_token_factor(n_probe, L, a.budget_ratio)
    # warm-up length: a batch completes ~budget_ratio of its generation_batch_size candidates (one label each)
    per_batch = max(1e-9, float(args.generation_batch_size) * float(a.budget_ratio))
    return (f"rollout strategy {name} (PAIR): {G} candidates per prompt probed to tau = {tau} tokens{snap}, then a "
            f"design-chosen subset continued (expected suffix budget {a.budget_ratio} x predicted, floor pi_min = "
            f"{a.pi_min}){anchor}. Compute vs TRL's GRPO with the same arguments ({G} completions of up to L = {L} "
            f"tokens per prompt): about {n_probe}/{L} + {a.budget_ratio} x (1 - {n_probe}/{L}) = {factor:.3g}x TRL's "
            f"generated tokens (<= 1x; ~ tau/L + budget_ratio). The design is uniform (warm-up) until the heads hold "
            f"pair_head_min_labels = {a.head_min_labels} labels: about {math.ceil(a.head_min_labels / per_batch)} "
            f"generation batch(es) at ~{per_batch:.3g} completed candidates a batch (lower it for short runs)")


class PairBatchStats:
    """Accumulates the global per-batch ``pair/*`` diagnostics (every rank sees the same gathered records)."""

    def __init__(self):
        self.groups = self.completed = self.continued = self.finished = self.edges = 0
        self.groups_with_edges = self.zero_edge = self.all_finished = self.fallbacks = self.degenerate = 0
        self.nonfinite = self.nan_rewards = self.unlabeled = 0
        self.solved = self.solver_iters = self.warm_started = 0
        self.ess = self.max_weight = 0.0
        self.pi_min, self.pi_sum, self.pi_count = 1.0, 0.0, 0
        self.budget = self.full_cost = self.expected_cost = self.pred_selected = self.saved_est = 0.0
        self.suffix_tokens = self.prefix_tokens = 0
        self.warmup = False

    def add_result(self, res: PairAdvantages) -> None:
        self.edges += res.n_edges
        self.nan_rewards += int(res.n_unscorable)
        if res.n_edges:
            self.groups_with_edges += 1
            self.ess += res.ess
            self.max_weight = max(self.max_weight, res.max_weight)

    def add_design(self, rec: dict[str, Any]) -> None:
        sel = np.asarray(rec["selected"], dtype=bool)
        fin = np.asarray(rec["finished"], dtype=bool)
        pi = np.asarray(rec["pi_design"], dtype=np.float64)
        c = np.asarray(rec["c_hat"], dtype=np.float64)
        self.groups += 1
        self.completed += int(sel.sum())
        self.continued += int((sel & ~fin).sum())
        self.finished += int(fin.sum())
        if sel.sum() < 2:
            self.zero_edge += 1
        if fin.all():
            self.all_finished += 1
        self.fallbacks += int(rec["fell_back"])
        self.degenerate += int(rec["degenerate"])
        if rec["solution"] is not None:
            self.solved += 1
            self.solver_iters += int(rec["n_iter"])
        self.warm_started += int(rec["warm_started"])
        self.nonfinite += int(rec["nonfinite"])
        self.warmup = self.warmup or bool(rec["warmup"])
        if (~fin).any():
            self.pi_min = min(self.pi_min, float(pi[~fin].min()))
            self.pi_sum += float(pi[~fin].sum())
            self.pi_count += int((~fin).sum())
        self.budget += float(rec["budget"])
        self.full_cost += float(rec["full_cost"])
        self.expected_cost += float(rec["expected_cost"])
        cont = sel & ~fin
        self.pred_selected += float(np.where(np.isfinite(c), c, 0.0)[cont].sum())
        self.saved_est += float(np.where(np.isfinite(c), c, 0.0)[~sel & ~fin].sum())
        self.suffix_tokens += int(sum(rec["suffix_len"]))
        self.prefix_tokens += int(sum(rec["probe_len"]))


def pair_metrics(s: PairBatchStats, heads) -> dict[str, float]:
    """The ``pair/*`` metrics of one batch: its accumulated stats and the heads' latest refresh (``heads``: the
    strategy's :class:`~trl_ext.trainers.pair.heads.DesignHeads`)."""
    n = max(s.groups, 1)
    m = {
        "pair/groups": s.groups,
        "pair/completed_vertices": s.completed,
        "pair/completed_per_group": s.completed / n,
        "pair/continued_from_prefix": s.continued,
        "pair/finished_in_prefix": s.finished,
        "pair/observed_edges": s.edges,
        "pair/ess_mean": s.ess / max(s.groups_with_edges, 1),
        "pair/max_weight": s.max_weight,
        "pair/pi_min": s.pi_min if s.pi_count else float("nan"),
        "pair/pi_mean": s.pi_sum / max(s.pi_count, 1),
        "pair/zero_edge_groups": s.zero_edge,
        "pair/all_finished_groups": s.all_finished,
        "pair/solver_fallbacks": s.fallbacks,
        "pair/degenerate_groups": s.degenerate,
        "pair/solver_iterations": s.solver_iters / s.solved if s.solved else float("nan"),
        "pair/warm_started_groups": s.warm_started,
        "pair/warmup": float(s.warmup),
        "pair/head_nonfinite": s.nonfinite,
        "pair/nan_rewards": s.nan_rewards,
        "pair/unlabeled_rewards": s.unlabeled,
        "pair/budget": s.budget,
        "pair/predicted_full_suffix_cost": s.full_cost,
        "pair/predicted_suffix_cost": s.expected_cost,
        "pair/predicted_cost_selected": s.pred_selected,
        "pair/realized_suffix_tokens": s.suffix_tokens,
        "pair/prefix_tokens": s.prefix_tokens,
        "pair/tokens_saved_vs_full_group": s.saved_est,
        "pair/head_labels": heads.heads.n_labels,
    }
    last_refresh = heads.last_refresh
    for key in ("brier", "ece", "auc", "cost_mape", "loss_p", "loss_c", "temperature"):
        if key in last_refresh and last_refresh[key] is not None:
            m[f"pair/head_{key}"] = float(last_refresh[key])
    return {k: float(v) for k, v in m.items()}

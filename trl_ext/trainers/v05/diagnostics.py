"""V0.5's diagnostics: the ``v05/*`` metrics of one generation batch (:func:`v05_metrics`, from the record of
:class:`~trl_ext.trainers.v05.strategy.OSLARounds`) and the construction line with its drop-in differences
(:func:`v05_description`). "V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts" (arXiv:2603.10848)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...estimators.v05 import osla_cap

__all__ = ["v05_description", "v05_metrics", "v05_unscorable_warnings"]


def v05_description(options: Any, args: Any, budget: int | None) -> tuple[str, list[str]]:
    """One line saying what each generation batch generates compared with TRL for the same arguments, and the
    drop-in differences: prompts per step when ``v05_k_init != num_generations``; extra OSLA rollouts when the
    budget (``budget`` rollouts per generation batch, ``None`` = unbounded) allows any. ``options``: the
    :data:`~trl_ext.trainers.v05.config.V05Options`; ``args``: the trainer's config (TRL's fields)."""
    a = options
    gbs, k, g = int(args.generation_batch_size), int(a.k_init), int(args.num_generations)
    cap = osla_cap(a.rollout_cost)
    natural = gbs // k * max(cap - k, 0)  # what the paper's unbounded rounds could add at most
    most = natural if budget is None else min(budget, natural)
    binds = budget is not None and budget < natural
    stop = f"global stop below {a.global_stop_fraction:.0%} of prompts" if a.global_stop_fraction > 0 \
        else "no global stop"
    pad = (f"; dispatches padded to a multiple of {a.dispatch_multiple} (charged to the budget)"
           if a.dispatch_multiple > 1 else "")
    line = (f"rollout strategy v05_osla (V0.5 Sequential OSLA): round 1: {gbs} rollouts per generation batch "
            f"({gbs // k} prompts x {k}; = TRL's for these arguments: {gbs // g} prompts x {g}); OSLA: at most "
            f"{most} more (+{a.k_step} per round to prompts whose prior fails the test, cap {cap}, {stop}, "
            f"v05_extra_rollout_budget={a.extra_rollout_budget:g}"
            f"{'' if binds else ': does not bind, the paper rounds'}), i.e. <= {(gbs + most) / gbs:.4g}x TRL's"
            f"{pad}; prompt weighting {a.prompt_weighting!r}")
    differences = []
    if gbs // k != gbs // g:
        differences.append(f"takes {gbs // k} prompts per generation batch ({k} rollouts each, v05_k_init={k}) "
                           f"where TRL takes {gbs // g} ({g} each, num_generations={g}) for the same arguments; "
                           f"set v05_k_init={g} to keep TRL's prompts per step.")
    if most > 0:
        differences.append(f"generates up to {(gbs + most) / gbs:.3g}x TRL's rollouts per generation batch (OSLA "
                           "rounds after round 1; measured 1.37-1.70x TRL's tokens with TRL's arguments); set "
                           "v05_extra_rollout_budget=0 to generate exactly TRL's rollouts.")
    return line, differences


def v05_metrics(rec: dict, n_unscorable: int, k_init: int) -> dict[str, float]:
    """The ``v05/*`` diagnostics of one batch record (:attr:`OSLARounds.last_record`)."""
    k = rec["k"].astype(np.float64)
    s = rec["scorable"]
    out = {"v05/rollouts_per_prompt_mean": k.mean(), "v05/rollouts_per_prompt_max": k.max(),
           "v05/rollouts_per_prompt_p50": np.percentile(k, 50), "v05/rollouts_per_prompt_p90": np.percentile(k, 90),
           "v05/frac_prompts_at_k_init": (rec["k"] == k_init).mean(),
           "v05/rounds": rec["rounds"], "v05/early_stop": rec["early_stop"],
           "v05/rejection_rate": rec["rejected_at_init"].mean(), "v05/context_size": rec["context_size"],
           "v05/dispatched_rollouts": rec["dispatched"], "v05/discarded_rollouts": rec["discarded"],
           "v05/unscorable_prompts": n_unscorable, "v05/unscorable_rollouts": rec["unscorable_rollouts"],
           "v05/round1_rollouts": rec["round1_rollouts"], "v05/extra_rollouts": rec["extra_rollouts"],
           "v05/budget_exhausted": rec["budget_exhausted"], "v05/prior_mean": rec["prior_p"].mean()}
    if s.any():
        bias2, weight, vbar = rec["bias2"], rec["weight"], rec["vbar"]
        out.update({
            "v05/rejection_rate_final": (bias2[s] > 0).mean(), "v05/mean_weight": weight[s].mean(),
            "v05/prompt_weight_max": rec["prompt_weight"][s].max(),
            "v05/prompt_weight_min": rec["prompt_weight"][s].min(),
            # Brier score of the prior against the realized group success rates (vbar + 1) / 2
            "v05/prior_brier": np.mean((rec["prior_p"][s] - (vbar[s] + 1.0) / 2.0) ** 2),
            # plug-in MSE of mu*: (1 - w)^2 bias2 + w^2 / k = w / k; the plain mean's bound is 1 / k
            "v05/baseline_mse_proxy": np.mean(weight[s] / rec["k"][s]),
            "v05/mean_only_mse_bound": np.mean(1.0 / rec["k"][s])})
    return {name: float(value) for name, value in out.items()}


def v05_unscorable_warnings(n_bad_rows: int, n_real: int, n_unscorable: int, n_prompts: int) -> list[tuple[str, str]]:
    """``(key, message)`` of the once-per-run warnings about unscorable rollouts and prompts of a batch (the key
    ``"unscorable_rows"`` is the base trainer's: this more specific message is shown instead of its own)."""
    out = []
    if n_bad_rows:
        out.append(("unscorable_rows",
                    f"V0.5: {n_bad_rows} of {n_real} rollouts were unscorable (every reward function returned None or "
                    "NaN); they get advantage 0, are left out of the fusion and of the prompt weights, and still count "
                    "as drawn for OSLA (logged every step as v05/unscorable_rollouts; this warning is shown once)."))
    if n_unscorable:
        out.append(("v05_unscorable",
                    f"V0.5: {n_unscorable} of {n_prompts} prompts had no scorable rollout (every reward function "
                    "returned None or NaN); they get advantage 0 and are not added to the support buffer (logged as "
                    "v05/unscorable_prompts)."))
    return out

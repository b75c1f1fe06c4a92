"""What each method decided during training, from the per-step traces of a comparison's runs (the mechanism paragraphs).

Every run of ``benchmarks/compare_trainers.py`` keeps a per-step ``trace.json.gz`` of the metrics in
``compare_harness.callbacks.TRACE_KEYS``. This script reads them for each method and prints, per metric, the mean over
a run's steps averaged over its seeds (with the range over seeds) and the first and last step's values averaged over
seeds (a trend over training: PAIR's head AUC, BASIS's beta):

* every method: the tied-group share (``gate/tied_share``: groups whose rewards are all equal, no GRPO signal; TRL's
  ``frac_reward_zero_std`` for TRL's own groups), the share of rows that carry signal (``ext/signal_row_frac``), generated tokens and rollouts per step;
* V0.5: rollouts per prompt (mean, max), OSLA rounds, the prior's rejection rate and Brier score, the mean shrinkage
  weight on the prior; DAPO: the keep rate and refill rounds; BASIS: ``beta_t`` and the baseline's mean squared error
  against the realised rewards (``basis/mean_sq_advantage``, the advantage being ``r - b``) and its ratio to the
  batch mean's (``basis/mse_vs_batch_mean``, :func:`add_baseline_mse_ratio`: below 1, the table's baseline predicts
  the rewards better than the step's own mean would); James-Stein: the
  shrinkage weight; PAIR: ESS, inclusion probabilities, the heads' AUC and Brier score, completed candidates per group,
  and how long its design stayed in warm-up (uniform inclusion until the heads hold ``pair_head_min_labels`` labels).

Usage::

    python benchmarks/regime_mechanism.py --output_dir benchmarks/results/compare/smollm2/steps_matched_t07 \\
        [--tuning]  # the tuning runs at each method's chosen rate (lr_choice.json) instead of the main runs

Writes ``<output_dir>/mechanism.json`` (``mechanism_tuning.json`` with ``--tuning``) and prints a table.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import os
import sys
from collections.abc import Sequence

COMMON_KEYS = ("gate/tied_share", "frac_reward_zero_std", "ext/signal_row_frac", "ext/generated_tokens", "ext/rollouts")
METHOD_KEYS: dict[str, tuple[str, ...]] = {
    "v05_osla": ("v05/rollouts_per_prompt_mean", "v05/rollouts_per_prompt_max", "v05/rounds", "v05/rejection_rate",
                 "v05/prior_brier", "v05/mean_weight", "v05/extra_rollouts"),
    "dapo_dynamic": ("dapo/keep_rate", "dapo/rounds", "dapo/batch_fill"),
    "basis": ("basis/beta", "basis/mean_sq_advantage", "basis/mean_baseline", "basis/mse_vs_batch_mean",
              "basis/mse_vs_loo_mean"),
    "james_stein": ("adv/js_lambda", "adv/js_v2", "adv/js_s2"),
    "pair": ("pair/ess_mean", "pair/pi_min", "pair/pi_mean", "pair/max_weight", "pair/head_auc", "pair/head_brier",
             "pair/completed_per_group", "pair/tokens_saved_vs_full_group", "pair/head_labels"),
}
#: PAIR's default warm-up (``PAIRConfig.pair_head_min_labels``): labels in the heads' window before they drive the design
PAIR_MIN_LABELS = 64


def _finite(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def add_baseline_mse_ratio(trace: Sequence[dict]) -> list[dict]:
    """``trace`` with ``basis/mse_vs_batch_mean`` added to each BASIS step: ``basis/mean_sq_advantage`` (the mean of
    ``(r_i - b_i)^2`` over the step's rows) divided by ``rbar (1 - rbar)``, the mean squared error of the step's own
    batch mean as the baseline when every reward is 0 or 1 (``rbar``: the step's mean ``reward``). A ratio below 1:
    the value table's baseline is closer to the realised rewards than the batch mean; above 1: farther. Also
    ``basis/mse_vs_loo_mean``, the ratio to the leave-one-out batch mean's error, ``(n / (n - 1))^2 rbar (1 - rbar)``
    with ``n`` the step's rows (``ext/rollouts``; ``r_i - mean_{j != i} r_j = n / (n - 1) (r_i - rbar)``): the
    baseline a leave-one-out estimator with no table would use.

    Valid only for a 0/1 reward (``steps_matched``'s accuracy reward); steps with ``rbar`` in {0, 1} (no variance
    to explain) or without the two keys get no ratio (skipped by :func:`summarize_metric`, not counted as zero).
    """
    out = []
    for step in trace:
        msa, rbar = step.get("basis/mean_sq_advantage"), step.get("reward")
        if _finite(msa) and _finite(rbar) and 0.0 < rbar < 1.0:
            ratio = float(msa) / (float(rbar) * (1.0 - float(rbar)))
            step = {**step, "basis/mse_vs_batch_mean": ratio}
            n = step.get("ext/rollouts")
            if _finite(n) and n > 1:
                step["basis/mse_vs_loo_mean"] = ratio * ((n - 1.0) / n) ** 2
        out.append(step)
    return out


def summarize_metric(traces: Sequence[Sequence[dict]], key: str) -> dict | None:
    """One metric over several runs' traces (one list of per-step dicts per run).

    Returns ``None`` when no run logged ``key``; else ``mean`` (the mean over seeds of each run's mean over its steps
    with a finite value), ``seed_min`` / ``seed_max`` (the range of those per-run means), ``first`` / ``last`` (the
    first and last logged step's values, averaged over runs) and ``runs`` (how many runs logged it). Steps without
    the key, or with a non-finite value, are skipped (not counted as zero).
    """
    per_run, firsts, lasts = [], [], []
    for trace in traces:
        vals = [float(step[key]) for step in trace if _finite(step.get(key))]
        if vals:
            per_run.append(sum(vals) / len(vals))
            firsts.append(vals[0])
            lasts.append(vals[-1])
    if not per_run:
        return None
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"mean": mean(per_run), "seed_min": min(per_run), "seed_max": max(per_run), "first": mean(firsts),
            "last": mean(lasts), "runs": len(per_run)}


def summarize_method(method: str, traces: Sequence[Sequence[dict]]) -> dict:
    """:func:`summarize_metric` for the common keys and ``method``'s own (:data:`METHOD_KEYS`); metrics no run
    logged are left out."""
    keys = COMMON_KEYS + METHOD_KEYS.get(method, ())
    out = {k: summarize_metric(traces, k) for k in keys}
    return {"runs": len(traces), "steps": [len(t) for t in traces], "metrics": {k: v for k, v in out.items() if v}}


def pair_warmup(traces: Sequence[Sequence[dict]], min_labels: int = PAIR_MIN_LABELS) -> dict | None:
    """How long PAIR's design stayed in warm-up (uniform inclusion) per run, from ``pair/head_labels``.

    ``pair/head_labels`` is logged after a step's labels are added, so step ``t`` designs with the heads only if step
    ``t - 1`` ended with at least ``min_labels`` labels (step 1 always designs in warm-up). Returns ``None`` when no
    run logged the key; else ``warmup_share`` (mean over runs of the share of steps designed in warm-up),
    ``first_headed_step`` (per run, the first 1-based step designed with the heads, ``None`` if none) and
    ``final_labels`` (per run).
    """
    shares, firsts, finals = [], [], []
    for trace in traces:
        labels = [float(step["pair/head_labels"]) for step in trace if _finite(step.get("pair/head_labels"))]
        if not labels:
            continue
        before = [0.0, *labels[:-1]]  # labels in the window when each step designed
        warm = [b < min_labels for b in before]
        shares.append(sum(warm) / len(warm))
        firsts.append(next((i + 1 for i, w in enumerate(warm) if not w), None))
        finals.append(labels[-1])
    if not shares:
        return None
    return {"warmup_share": sum(shares) / len(shares), "first_headed_step": firsts, "final_labels": finals,
            "min_labels": int(min_labels)}


def _load_trace(out_dir: str, rec: dict) -> list[dict] | None:
    ref = rec.get("trace")
    if isinstance(ref, list):
        return ref
    if not isinstance(ref, str):
        return None
    with gzip.open(os.path.join(out_dir, ref), "rt", encoding="utf-8") as f:
        return json.load(f)


def run_records(out_dir: str, tuning: bool) -> dict[str, list[dict]]:
    """The finished (``status == "ok"``) run records per method: the main runs (``runs/<method>/seed*``), or with
    ``tuning`` the tuning runs at each method's chosen rate in ``lr_choice.json``."""
    found: dict[str, list[dict]] = {}
    if tuning:
        with open(os.path.join(out_dir, "lr_choice.json"), encoding="utf-8") as f:
            choice = json.load(f)["methods"]
        paths = {m: glob.glob(os.path.join(out_dir, "runs", "tune", m, f"lr{c['chosen_lr']:g}", "seed*", "result.json"))
                 for m, c in choice.items() if c.get("status") == "ok"}
    else:
        paths = {}
        for p in glob.glob(os.path.join(out_dir, "runs", "*", "seed*", "result.json")):
            paths.setdefault(p.split(os.sep)[-3], []).append(p)
    for method, ps in sorted(paths.items()):
        recs = []
        for p in sorted(ps):
            with open(p, encoding="utf-8") as f:
                rec = json.load(f)
            if rec.get("status") == "ok":
                recs.append(rec)
        if recs:
            found[method] = recs
    return found


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", required=True, help="a compare_trainers.py output directory")
    p.add_argument("--tuning", action="store_true", help="read the tuning runs at the chosen rates")
    args = p.parse_args(argv)
    records = run_records(args.output_dir, args.tuning)
    if not records:
        print(f"no finished runs under {args.output_dir}", file=sys.stderr)
        return 1
    doc = {"source": "tuning runs at the chosen rates" if args.tuning else "main runs", "methods": {}}
    for method, recs in records.items():
        traces = [t for t in (_load_trace(args.output_dir, r) for r in recs) if t]
        if method == "basis":
            traces = [add_baseline_mse_ratio(t) for t in traces]
        doc["methods"][method] = {**summarize_method(method, traces), "seeds": sorted(r["seed"] for r in recs),
                                  "learning_rate": recs[0].get("learning_rate")}
        if method == "pair":
            min_labels = (recs[0].get("config") or {}).get("pair_head_min_labels", PAIR_MIN_LABELS)
            doc["methods"][method]["design_warmup"] = pair_warmup(traces, int(min_labels))
    name = "mechanism_tuning.json" if args.tuning else "mechanism.json"
    with open(os.path.join(args.output_dir, name), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    for method, m in doc["methods"].items():
        print(f"{method} ({m['runs']} run(s), steps {m['steps']}, lr {m['learning_rate']:g})")
        for key, s in m["metrics"].items():
            print(f"  {key:36s} mean {s['mean']:10.4g} [seeds {s['seed_min']:.4g}, {s['seed_max']:.4g}]  first "
                  f"{s['first']:.4g} -> last {s['last']:.4g}")
        if m.get("design_warmup"):
            w = m["design_warmup"]
            print(f"  design in warm-up on {w['warmup_share']:.0%} of steps (heads drive it from step "
                  f"{w['first_headed_step']}; labels at the end {w['final_labels']}, warm-up ends at {w['min_labels']})")
    print(f"wrote {os.path.join(args.output_dir, name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

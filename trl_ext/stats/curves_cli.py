"""``trl-ext curves``: AUC and tokens-to-target of accuracy-vs-tokens curves across methods and seeds.

Inputs: ``--runs_json`` (the ``runs.json`` the comparison harness writes: every run's ``method``, ``seed`` and
``curve``, plus ``start_accuracy``), or ``--run METHOD=GLOB`` (repeatable) for JSON files with ``seed`` and
``curve`` (a list of ``{"tokens": ..., METRIC: ...}``, e.g. the harness's per-run ``result.json``) together with
``--start_accuracy``. See :mod:`trl_ext.stats.curves` for the statistics.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs_json", default=None, help="A comparison harness runs.json.")
    parser.add_argument("--run", action="append", default=[], metavar="METHOD=GLOB",
                        help="Per-run JSON files of one method (repeatable).")
    parser.add_argument("--methods", nargs="*", default=None, help="Only these methods (default: all).")
    parser.add_argument("--baseline", required=True, help="Method the AUC differences are taken against.")
    parser.add_argument("--budget", type=float, default=None,
                        help="Token budget of the AUC (default: the smallest final checkpoint over all runs).")
    parser.add_argument("--target", type=float, default=None,
                        help="Accuracy target for tokens-to-target (default: the baseline's mean final accuracy).")
    parser.add_argument("--start_accuracy", type=float, default=None,
                        help="Accuracy at 0 tokens (default: runs.json's start_accuracy; else the curve starts at "
                             "its first checkpoint, and the AUC needs this value).")
    parser.add_argument("--metric", default="greedy_accuracy", help="Curve key holding the accuracy.")
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--n_resamples", type=int, default=9999)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="Write the result as JSON.")


def _runs_from(args) -> tuple[dict, float | None]:
    runs: dict[str, dict[int, tuple[list, list]]] = {}
    start = args.start_accuracy

    def add(method, rec):
        curve = rec.get("curve") or []
        if not curve:
            raise ValueError(f"a run of {method!r} (seed {rec.get('seed')}) has no curve")
        pts = sorted((float(c["tokens"]), float(c[args.metric])) for c in curve)
        per = runs.setdefault(method, {})
        if int(rec["seed"]) in per:
            raise ValueError(f"two runs of {method!r} have seed {rec['seed']}: give each method's runs once")
        per[int(rec["seed"])] = ([p[0] for p in pts], [p[1] for p in pts])

    if args.runs_json:
        with open(args.runs_json) as f:
            data = json.load(f)
        for rec in data["runs"]:
            if rec.get("status", "ok") == "ok":
                add(rec["method"], rec)
        if start is None:
            start = data.get("start_accuracy")
    for spec in args.run:
        if "=" not in spec:
            raise ValueError(f"--run takes METHOD=GLOB, got {spec!r}")
        method, pattern = spec.split("=", 1)
        files = sorted(glob.glob(pattern, recursive=True))
        if not files:
            raise ValueError(f"--run {spec!r}: no file matches")
        for path in files:
            with open(path) as f:
                add(method, json.load(f))
    if args.methods:
        missing = [m for m in args.methods if m not in runs]
        if missing:
            raise ValueError(f"methods {missing} have no runs (found {sorted(runs)})")
        runs = {m: runs[m] for m in args.methods}
    if not runs:
        raise ValueError("no runs: pass --runs_json or --run METHOD=GLOB")
    return runs, start


def _fmt_t(x: float) -> str:
    return "not reached" if math.isinf(x) else f"{x:,.0f}"


def main(args: argparse.Namespace) -> int:
    from .curves import compare_curves

    try:
        runs, start = _runs_from(args)
        if args.baseline not in runs:
            raise ValueError(f"baseline {args.baseline!r} has no runs (found {sorted(runs)})")
        budget = args.budget or min(t[-1] for per in runs.values() for t, _ in per.values())
        res = compare_curves(runs, budget=budget, baseline=args.baseline, target=args.target, start_value=start,
                             confidence=args.confidence, n_resamples=args.n_resamples, seed=args.seed)
    except (ValueError, KeyError, OSError) as e:
        print(f"trl-ext curves: {e}", file=sys.stderr)
        return 2
    res["start_accuracy"] = start
    pct = int(round(100 * args.confidence))
    print(f"budget {budget:,.0f} tokens; target {res['target']:.4f}; start accuracy {start}; baseline "
          f"{args.baseline}; {pct}% percentile bootstrap over seeds\n")
    print(f"| method | seeds | AUC (mean acc. over budget) [{pct}% CI] | AUC - baseline [{pct}% CI] | paired | "
          f"tokens to target, seed-mean curve [{pct}% CI] | seeds reaching |")
    print("|---|---|---|---|---|---|---|")
    for m, r in res["methods"].items():
        lo, hi = r["auc_ci"]
        dlo, dhi = r["auc_diff_ci"]
        tlo, thi = r["t2t_ci"]
        reach = sum(not math.isinf(x) for x in r["t2t_per_seed"])
        print(f"| {m} | {len(r['seeds'])} | {r['auc_mean']:.4f} [{lo:.4f}, {hi:.4f}] | {100 * r['auc_diff']:+.2f} pts "
              f"[{100 * dlo:+.2f}, {100 * dhi:+.2f}] | {'yes' if r['auc_diff_paired'] else 'no'} | "
              f"{_fmt_t(r['t2t_mean_curve'])} [{_fmt_t(tlo)}, {_fmt_t(thi)}] | {reach}/{len(r['seeds'])} |")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(res, f, indent=1, default=lambda x: None if isinstance(x, float) and math.isinf(x) else x)
    return 0

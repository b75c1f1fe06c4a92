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
import os
import sys

from .._io import json_safe, read_json


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
    parser.add_argument("--questions", action="store_true",
                        help="Also bootstrap over questions (two-level: seeds, then questions) from the per-question "
                             "outcome files every curve point names (`outcomes`, relative to runs.json; written by "
                             "the harness with checkpoint_outcomes, e.g. --scale smollm2), with the start "
                             "checkpoint's outcomes from start_eval.json next to runs.json. Differences to the "
                             "baseline are paired by question, and by seed where the seed sets match (else each "
                             "side's seeds are resampled on their own).")
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
        data = read_json(args.runs_json)
        if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
            raise ValueError(f"{args.runs_json}: not a comparison harness runs.json (no 'runs' list); pass the "
                             "runs.json that benchmarks/compare_trainers.py wrote, or --run METHOD=GLOB.")
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
            add(method, read_json(path))
    if args.methods:
        missing = [m for m in args.methods if m not in runs]
        if missing:
            raise ValueError(f"methods {missing} have no runs (found {sorted(runs)})")
        runs = {m: runs[m] for m in args.methods}
    if not runs:
        raise ValueError("no runs: pass --runs_json or --run METHOD=GLOB")
    return runs, start


def _score(rec: dict) -> float:
    return float(rec["pass_rate"]) if rec.get("pass_rate") is not None else float(rec["correct"])


def question_level_arrays(runs_json: str, methods) -> tuple[dict, list | None, list]:
    """``({method: (outcomes (S, J, Q), tokens (S, J), seeds)}, start (Q,) or None, question ids)`` from a runs.json
    whose curve points name per-question outcome files; questions are those every file has, in sorted order."""
    import numpy as np

    from .outcomes import read_outcomes_jsonl as read_outcome_records

    base = os.path.dirname(os.path.abspath(runs_json))
    data = read_json(runs_json)
    per: dict[str, dict[int, list]] = {}
    for rec in data["runs"]:
        if rec.get("status", "ok") != "ok" or (methods and rec["method"] not in methods):
            continue
        pts = sorted(rec.get("curve") or [], key=lambda c: float(c["tokens"]))
        if not pts or any("outcomes" not in c for c in pts):
            raise ValueError(f"run {rec['method']} seed {rec['seed']}: a curve point has no per-question "
                             "`outcomes` file (--questions needs checkpoint_outcomes runs)")
        files = [{r["question_id"]: _score(r) for r in read_outcome_records(os.path.join(base, c["outcomes"]))}
                 for c in pts]
        per.setdefault(rec["method"], {})[int(rec["seed"])] = [[float(c["tokens"]) for c in pts], files]
    start_path = os.path.join(base, "start_eval.json")
    start_map = None
    if os.path.exists(start_path):
        start_map = {r["question_id"]: _score(r) for r in read_json(start_path)["records"]}
    qsets = [set(f) for m in per.values() for _, files in m.values() for f in files]
    if start_map is not None:
        qsets.append(set(start_map))
    qids = sorted(set.intersection(*qsets)) if qsets else []
    if not qids:
        raise ValueError("no question is shared by every outcome file")
    arrays = {}
    for m, seeds in per.items():
        order = sorted(seeds)
        n_ck = {len(seeds[k][0]) for k in order}
        if len(n_ck) != 1:
            raise ValueError(f"method {m}: seeds have different numbers of checkpoints {sorted(n_ck)}")
        o = np.array([[[f[q] for q in qids] for f in seeds[k][1]] for k in order])
        arrays[m] = (o, np.array([seeds[k][0] for k in order]), order)
    start = None if start_map is None else [start_map[q] for q in qids]
    return arrays, start, qids


def add_question_level(res: dict, args, budget: float) -> None:
    """Adds ``<stat>_ci_two_level`` and ``<stat>_diff_ci_two_level`` (paired by question, and by seed when the seed
    sets match, else each method's seeds resampled on their own: ``diff_two_level_paired_seeds``) to every method,
    for the AUC (``auc``) and the accuracy at the budget (``acc_at_budget``)."""
    from .curves import CURVE_STATISTICS, two_level_auc_difference, two_level_curve_bootstrap

    arrays, start, qids = question_level_arrays(args.runs_json, args.methods)
    res["n_questions_two_level"] = len(qids)
    b_o, b_t, b_seeds = arrays[args.baseline]
    n_res = min(args.n_resamples, 2000)
    for m, (o, t, seeds) in arrays.items():
        rec = res["methods"][m]
        for stat in CURVE_STATISTICS:
            kw = dict(start_outcomes=start, n_resamples=n_res, confidence=args.confidence, seed=args.seed,
                      statistic=stat)
            rec[f"{stat}_ci_two_level"] = two_level_curve_bootstrap(o, t, budget, **kw)["ci"]
            rec["diff_two_level_paired_seeds"] = seeds == b_seeds
            if m == args.baseline:
                rec[f"{stat}_diff_ci_two_level"] = (0.0, 0.0)
            elif seeds == b_seeds or min(len(seeds), len(b_seeds)) >= 2:
                rec[f"{stat}_diff_ci_two_level"] = two_level_auc_difference(
                    o, t, b_o, b_t, budget, paired_seeds=seeds == b_seeds, **kw)["ci"]
            else:
                rec[f"{stat}_diff_ci_two_level"] = (math.nan, math.nan)


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
        if args.questions:
            if not args.runs_json:
                raise ValueError("--questions reads the outcome files named in --runs_json")
            add_question_level(res, args, budget)
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
    print(f"\nAccuracy at the budget (each curve interpolated at {budget:,.0f} tokens: equal tokens for runs whose "
          f"last step overshoots it), {pct}% percentile bootstrap over seeds\n")
    print(f"| method | accuracy at budget [{pct}% CI] | minus baseline [{pct}% CI] | last checkpoint, tokens (mean) |")
    print("|---|---|---|---|")
    for m, r in res["methods"].items():
        lo, hi = r["acc_at_budget_ci"]
        dlo, dhi = r["acc_at_budget_diff_ci"]
        last = sum(runs[m][k][0][-1] for k in r["seeds"]) / len(r["seeds"])
        print(f"| {m} | {r['acc_at_budget_mean']:.4f} [{lo:.4f}, {hi:.4f}] | {100 * r['acc_at_budget_diff']:+.2f} pts "
              f"[{100 * dlo:+.2f}, {100 * dhi:+.2f}] | {last:,.0f} |")
    if args.questions:
        print(f"\nTwo-level bootstrap (seeds, then questions; {res['n_questions_two_level']} questions, differences "
              "paired by question, and by seed where the seed sets match; 'unpaired seeds': each method's seeds "
              "resampled on their own)\n")
        print(f"| method | AUC [{pct}% CI, seeds x questions] | AUC - baseline [{pct}% CI, seeds x questions] | "
              f"accuracy at budget [{pct}% CI] | minus baseline [{pct}% CI] |")
        print("|---|---|---|---|---|")
        for m, r in res["methods"].items():
            cells = []
            for stat in ("auc", "acc_at_budget"):
                lo, hi = r[f"{stat}_ci_two_level"]
                dlo, dhi = r[f"{stat}_diff_ci_two_level"]
                diff_ci = ("[no interval: a method with one seed]" if math.isnan(dlo) else
                           f"[{100 * dlo:+.2f}, {100 * dhi:+.2f}]"
                           + ("" if r["diff_two_level_paired_seeds"] else " unpaired seeds"))
                cells.append(f"{r[f'{stat}_mean']:.4f} [{lo:.4f}, {hi:.4f}] | {100 * r[f'{stat}_diff']:+.2f} pts "
                             f"{diff_ci}")
            print(f"| {m} | {' | '.join(cells)} |")
    if args.output:
        with open(args.output, "w") as f:
            # strict JSON: "not reached" (inf) and "not computed" (nan) are written as null
            json.dump(json_safe(res), f, indent=1, allow_nan=False)
    return 0

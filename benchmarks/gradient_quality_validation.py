"""Does `trl-ext gradient-quality` predict the committed learning-curve benchmarks?

For each benchmark with committed runs, the instrument was run at the benchmark's start checkpoint with its sampling
settings (commands in docs/gradient_quality.md and in each result's ``config.command``). This script reads the
instrument's JSON and the benchmark's ``curves.json`` (``trl-ext curves``) and compares, over the methods both have:

* predicted: each method's corrected cosine to the reference gradient at the benchmark's step budget (the budget
  ``rollouts_per_step x`` the pool's mean completion length, interpolated in log tokens: what one optimizer step
  sees),
  and its tokens-to-target ratio to the best fixed-G GRPO;
* measured: the normalized AUC of accuracy vs generated tokens (mean over seeds) and the accuracy at the budget.

It reports Spearman's rank correlation with an exact permutation p-value and a Fisher-z 95 % interval (standard error
1.06 / sqrt(n - 3), Fieller, Hartley and Pearson, 1957), and whether the predicted best method is the measured best.
A benchmark without runs yet (``steps_matched``) gets its prediction only, recorded before the runs.

    python benchmarks/gradient_quality_validation.py            # writes benchmarks/results/gradient_quality/validation.{md,json}
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os

import numpy as np
from scipy import stats

HERE = os.path.dirname(os.path.abspath(__file__))
RES = os.path.join(HERE, "results", "gradient_quality")
CMP = os.path.join(HERE, "results", "compare")

#: benchmark method name -> instrument method name (the benchmark's DAPO is dynamic sampling at G = 4; V0.5 is
#: k_init = 4 with OSLA; PAIR G = 16)
METHOD_MAP = {"grpo_g4": "grpo_g4", "grpo_g8": "grpo_g8", "grpo_g16": "grpo_g16", "reinforce_pp": "reinforce_pp",
              "dapo_dynamic": "dapo_g4", "basis": "basis", "v05_osla": "v05", "pair": "pair"}

BENCHMARKS = [
    # (label, instrument JSON, curves.json or None, rollouts per optimizer step)
    ("testbed addition (v2, 5 seeds)", "testbed_addition.json", "v2/addition/curves.json", 64),
    ("testbed scratchpad (v2, 5 seeds)", "testbed_scratchpad.json", "v2/scratchpad/curves.json", 64),
    ("SmolLM2 sum3 (3 seeds)", "smollm2_sum3.json", "smollm2/sum3/curves.json", 16),
    ("SmolLM2 steps_matched T=0.7 (no runs yet)", "smollm2_steps_matched_t07.json", None, 16),
]


def spearman_with_intervals(x, y) -> dict:
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = x.size
    rho = float(stats.spearmanr(x, y).statistic)
    # exact permutation p-value (two-sided) over all orderings of y's ranks
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    if n <= 8:  # every ordering of y's ranks against x's: Pearson correlation of ranks, vectorised
        perms = np.array(list(itertools.permutations(ry)))
        a, b = rx - rx.mean(), perms - perms.mean(axis=1, keepdims=True)
        r_all = (b @ a) / (np.linalg.norm(a) * np.linalg.norm(b, axis=1))
        p = float(np.mean(np.abs(r_all) >= abs(rho) - 1e-12))
    else:
        p = float(stats.spearmanr(x, y).pvalue)
    lo = hi = None
    if n > 3 and abs(rho) < 1:
        z, se = math.atanh(rho), 1.06 / math.sqrt(n - 3)
        lo, hi = math.tanh(z - 1.96 * se), math.tanh(z + 1.96 * se)
    return {"rho": rho, "ci95": [lo, hi], "p_exact": p, "n": n}


def at_tokens(curve: list[dict], key: str, tokens: float) -> tuple[float, bool]:
    """``curve``'s ``key`` (point and interval ends) at ``tokens`` generated tokens, linear in log tokens between the
    two budgets around it; the nearest end of the curve (flagged) outside its range (V0.5's smallest batch is one
    generation batch, which may exceed the step budget)."""
    pts = sorted(curve, key=lambda c: c["tokens_mean"])
    t = np.log([c["tokens_mean"] for c in pts])
    out = []
    for part in ("value", "low", "high"):
        y = [c[key][part] for c in pts]
        if any(v is None for v in y):
            out.append(None)
            continue
        out.append(float(np.interp(math.log(tokens), t, y)))
    return out, bool(math.log(tokens) < t[0] or math.log(tokens) > t[-1])


def analyse(label, gq_file, curves_file, rollouts_per_step) -> dict | None:
    path = os.path.join(RES, gq_file)
    if not os.path.exists(path):
        return None
    gq = json.load(open(path))
    step = rollouts_per_step * gq["pool"]["mean_length"]
    pred = {}
    for bm, im in METHOD_MAP.items():
        r = gq["methods"].get(im)
        if r is None or r["error"]:
            continue
        (cos, lo, hi), outside = at_tokens(r["curve"], "cosine", step)
        rel, b, v = (at_tokens(r["curve"], k, step)[0][0] for k in ("relative_error", "bias_part", "variance_part"))
        pred[bm] = {"method": im, "cosine_at_step": cos, "cosine_ci": [lo, hi], "outside_curve": outside,
                    "ratio_to_best_grpo": (r.get("ratio_to_best_grpo") or {}).get("value"),
                    "relative_error": rel, "bias_part": b, "variance_part": v}
    out = {"benchmark": label, "instrument": gq_file, "step_tokens": step, "target_cosine": gq["target_cosine"],
           "best_grpo": gq["best_grpo"], "predicted": pred,
           # a point read off the end of a curve (V0.5's first batch above the step) is not a prediction at the step
           "predicted_best": max((m for m in pred if not pred[m]["outside_curve"]),
                                 key=lambda m: pred[m]["cosine_at_step"])}
    if curves_file is None:
        return out
    cv = json.load(open(os.path.join(CMP, curves_file)))
    common = [m for m in pred if m in cv["methods"]]
    meas = {m: {"auc": cv["methods"][m]["auc_mean"], "acc_at_budget": cv["methods"][m]["acc_at_budget_mean"],
                "tokens_to_target": cv["methods"][m].get("t2t_mean_curve")} for m in common}
    out.update({"measured": meas, "measured_best": max(common, key=lambda m: meas[m]["auc"]),
                "spearman_cosine_vs_auc": spearman_with_intervals([pred[m]["cosine_at_step"] for m in common],
                                                                  [meas[m]["auc"] for m in common]),
                "spearman_cosine_vs_acc": spearman_with_intervals([pred[m]["cosine_at_step"] for m in common],
                                                                  [meas[m]["acc_at_budget"] for m in common])})
    rt = [m for m in common if pred[m]["ratio_to_best_grpo"] is not None]
    if len(rt) > 3:  # fewer tokens to the target cosine should mean a higher AUC: correlate -ratio with AUC
        out["spearman_ratio_vs_auc"] = spearman_with_intervals([-pred[m]["ratio_to_best_grpo"] for m in rt],
                                                               [meas[m]["auc"] for m in rt])
        # measured tokens to the benchmark's accuracy target (mean curve; not reached = worst, tied)
        reached = [m for m in rt if meas[m]["tokens_to_target"] is not None]
        if len(reached) >= 2:
            t2t = [meas[m]["tokens_to_target"] if meas[m]["tokens_to_target"] is not None else math.inf for m in rt]
            out["spearman_ratio_vs_measured_t2t"] = spearman_with_intervals(
                [pred[m]["ratio_to_best_grpo"] for m in rt], t2t) | {"reached": len(reached)}
    return out


def _f(x, nd=3):
    return "n/a" if x is None else f"{x:.{nd}f}"


def to_markdown(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        lines.append(f"### {r['benchmark']}\n")
        lines.append(f"Step budget {r['step_tokens']:.0f} tokens; target cosine {_f(r['target_cosine'])}; best "
                     f"fixed-G GRPO by the instrument: {r['best_grpo']}.\n")
        head = "| method | cosine at step [95 %] | rel. error (bias + variance) | tokens-to-target / best GRPO |"
        sep = "|---|---|---|---|"
        if "measured" in r:
            head += " measured AUC | measured acc @ budget | measured tokens to target |"
            sep += "---|---|---|"
        lines += [head, sep]
        order = sorted(r["predicted"], key=lambda m: -r["predicted"][m]["cosine_at_step"])
        for m in order:
            p = r["predicted"][m]
            flag = " (*)" if p["outside_curve"] else ""
            row = (f"| {m}{flag} | {_f(p['cosine_at_step'])} [{_f(p['cosine_ci'][0])}, {_f(p['cosine_ci'][1])}] | "
                   f"{_f(p['relative_error'])} ({_f(p['bias_part'])} + {_f(p['variance_part'])}) | "
                   f"{_f(p['ratio_to_best_grpo'], 2)} |")
            if "measured" in r:
                mm = r["measured"].get(m)
                t2t = mm and mm["tokens_to_target"]
                row += (f" {_f(mm and mm['auc'])} | {_f(mm and mm['acc_at_budget'])} | "
                        f"{'not reached' if t2t is None else f'{t2t:,.0f}'} |")
            lines.append(row)
        if any(p["outside_curve"] for p in r["predicted"].values()):
            lines.append("\n(*) the step budget lies outside this method's measured token range (its smallest "
                         "batch is larger): the nearest end of its curve is shown, and the method is left out of "
                         "\"predicted best\".")
        if "measured" in r:
            s, a = r["spearman_cosine_vs_auc"], r["spearman_cosine_vs_acc"]
            lines.append(f"\nSpearman (cosine at step vs measured AUC): rho = {s['rho']:+.2f}, 95 % CI "
                         f"[{_f(s['ci95'][0], 2)}, {_f(s['ci95'][1], 2)}], exact p = {s['p_exact']:.3f}, n = {s['n']}; "
                         f"vs accuracy at the budget: rho = {a['rho']:+.2f} [{_f(a['ci95'][0], 2)}, "
                         f"{_f(a['ci95'][1], 2)}], p = {a['p_exact']:.3f}.")
            if "spearman_ratio_vs_auc" in r:
                t = r["spearman_ratio_vs_auc"]
                lines.append(f"Spearman (fewer tokens to the target vs AUC): rho = {t['rho']:+.2f} "
                             f"[{_f(t['ci95'][0], 2)}, {_f(t['ci95'][1], 2)}], p = {t['p_exact']:.3f}.")
            if "spearman_ratio_vs_measured_t2t" in r:
                t = r["spearman_ratio_vs_measured_t2t"]
                lines.append(f"Spearman (tokens-to-target ratio vs measured tokens to the accuracy target, "
                             f"{t['reached']} of {t['n']} methods reached it, the rest tied last): rho = "
                             f"{t['rho']:+.2f} [{_f(t['ci95'][0], 2)}, {_f(t['ci95'][1], 2)}], p = {t['p_exact']:.3f}.")
            lines.append(f"Predicted best: {r['predicted_best']}; measured best (AUC): {r['measured_best']}.\n")
        else:
            lines.append(f"\nPredicted best: {r['predicted_best']} (no runs to check it against yet).\n")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output_dir", default=RES)
    args = ap.parse_args(argv)
    rows = [r for r in (analyse(*b) for b in BENCHMARKS) if r is not None]
    md = to_markdown(rows)
    print(md)
    with open(os.path.join(args.output_dir, "validation.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.output_dir, "validation.md"), "w") as f:
        f.write(md + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

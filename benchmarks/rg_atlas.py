"""Regime atlas of SmolLM2-135M-Instruct on reasoning-gym tasks: ``trl-ext advise`` per task, one table, one plot.

For every spec in :data:`TASKS` (easy to hard; ``chain_sum`` at two curriculum levels) it runs::

    trl-ext advise --model smollm2 --dataset SPEC --split test --num_prompts 32 --num_samples 8 \\
        --max_new_tokens 64 --prefix_heads off --seed 0 --output OUT/<slug>.json

(resumable: a task whose JSON exists is not rerun; ``--jobs 2`` runs two at once, one per core), strips machine
paths from the JSON, then writes ``OUT/atlas.json`` (per task: pass-rate mean and shares at 0 and 1, ICC,
zero-variance share at G = 4/8/16, completion lengths, advise's recommendation, the regime label) and
``OUT/atlas.png`` (ICC against the tied-group share at G = 8, and each task's pass-rate histogram).

Regime labels (the rules the benchmarks use to pick tasks): **methods' regime** when pass rates are spread (at least
a fifth of the prompts mixed), the ICC is at least 0.4 and at least a third of G = 8 groups are tied; **GRPO's home**
when at least 70 % of the prompts are mixed at k = 8 and fewer than a third of G = 8 groups are tied; **too hard** /
**too easy** when at least 90 % of the prompts never / always succeed; otherwise **between**.

    python benchmarks/rg_atlas.py --jobs 2                 # ~5 CPU-minutes per task
    python benchmarks/rg_atlas.py --report_only            # table and plot from the committed JSON
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "benchmarks", "results", "rg_atlas")

#: (spec, why it is in the atlas): arithmetic, counting, algebra, logic and string tasks, easy to hard.
TASKS = [
    ("reasoning_gym:chain_sum:level=1", "two or three 1-digit terms (curriculum level 1)"),
    ("reasoning_gym:chain_sum:level=3", "the same task at level 3 (up to five terms, 1-2 digits)"),
    ("reasoning_gym:basic_arithmetic:level=0", "mixed + - * / expressions, easiest level"),
    ("reasoning_gym:leg_counting:level=1", "count legs of a few animals (level 0 has only ~110 distinct questions)"),
    ("reasoning_gym:letter_counting:level=0", "count a letter in a short text"),
    ("reasoning_gym:gcd:level=0", "GCD of two numbers"),
    ("reasoning_gym:simple_equations:level=0", "solve a linear equation"),
    ("reasoning_gym:count_bits:level=0", "count 1 bits of a number"),
    ("reasoning_gym:spell_backward:level=0", "spell a word backward"),
    ("reasoning_gym:family_relationships:level=0", "a kinship question (logic)"),
]
ADVISE_ARGS = ["--split", "test", "--num_prompts", "32", "--num_samples", "8", "--max_new_tokens", "64",
               "--prefix_heads", "off", "--seed", "0"]


def slug(spec: str) -> str:
    return spec.split(":", 1)[1].replace(":", "_").replace("=", "").replace(",", "_")


def run_one(spec: str, out: str) -> tuple[str, float, int]:
    path = os.path.join(out, f"{slug(spec)}.json")
    if os.path.exists(path):
        return spec, 0.0, 0
    t0 = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "trl_ext.cli", "advise", "--model", "smollm2", "--dataset", spec, *ADVISE_ARGS,
           "--output", os.path.relpath(path + ".tmp", ROOT)]  # relative: the log names no machine path
    log_path = os.path.join(out, "logs", f"{slug(spec)}.log")
    with open(log_path, "w") as log:
        rc = subprocess.run(["nice", "-n", "5", *cmd], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    scrub_log(log_path)
    if rc == 0:
        with open(path + ".tmp") as f:
            data = json.load(f)
        scrub(data)
        data["wall_s"] = round(time.monotonic() - t0, 1)
        with open(path, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.remove(path + ".tmp")
    return spec, time.monotonic() - t0, rc


def scrub_log(path: str) -> None:
    """Drop the repository's absolute path and the progress-bar noise from a worker log."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [ln for ln in f.read().replace(ROOT + os.sep, "").splitlines() if "it/s]" not in ln]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def scrub(data: dict) -> None:
    """Remove machine paths (the output path, the cached model folder) from an advise JSON."""
    cfg = data.get("config", {})
    cfg.pop("model_path", None)
    cfg.get("args", {}).pop("output", None)


def _v(x):
    return x.get("value") if isinstance(x, dict) else x


def summarize(spec: str, why: str, d: dict) -> dict:
    pr, zv, var, ln = d["pass_rates"], d["zero_variance"], d["variance"], d["lengths"]
    hist = pr["histogram"]
    n = sum(hist.values())
    zero, one = _v(pr["share_zero"]), _v(pr["share_one"])
    mixed = 1.0 - zero - one
    tied8 = _v(zv["8"]["share"])
    icc = var.get("icc")
    if zero >= 0.9:
        regime = "too hard"
    elif one >= 0.9:
        regime = "too easy"
    elif mixed >= 0.2 and icc is not None and icc >= 0.4 and tied8 >= 1 / 3:
        regime = "methods' regime"
    elif mixed >= 0.7 and tied8 < 1 / 3:
        regime = "GRPO's home"
    else:
        regime = "between"
    return {"spec": spec, "why": why, "n_prompts": n, "pass_rate_mean": _v(pr["mean"]), "share_zero": zero,
            "share_one": one, "share_mixed": mixed, "icc": icc, "icc_ci": var.get("icc_ci"),
            "tied_share": {g: _v(zv[g]["share"]) for g in ("4", "8", "16")},
            "completion_tokens": {k: ln[k] for k in ("mean", "median", "p90", "truncation_share")},
            "histogram": hist, "binary": d["counts"]["binary"], "recommendation": d["recommendation"],
            "recommended_config": d["recommended_config"], "regime": regime, "wall_s": d.get("wall_s")}


def report(out: str) -> dict:
    rows = []
    for spec, why in TASKS:
        path = os.path.join(out, f"{slug(spec)}.json")
        if os.path.exists(path):
            with open(path) as f:
                rows.append(summarize(spec, why, json.load(f)))
    atlas = {"model": "SmolLM2-135M-Instruct (trl-ext fetch-real-model)", "reasoning_gym": "0.1.25",
             "advise_args": ADVISE_ARGS, "tasks": rows}
    with open(os.path.join(out, "atlas.json"), "w") as f:
        json.dump(atlas, f, indent=1)
    print(f"{'task':44s} {'mean':>5s} {'p=0':>5s} {'p=1':>5s} {'ICC':>6s} {'tied4':>6s} {'tied8':>6s} {'tied16':>6s} "
          f"{'tok':>5s} {'trunc':>5s}  regime / advise")
    for r in rows:
        icc = "n/a" if r["icc"] is None else f"{r['icc']:.2f}"
        t = r["tied_share"]
        print(f"{r['spec'][14:]:44s} {r['pass_rate_mean']:5.2f} {r['share_zero']:5.2f} {r['share_one']:5.2f} "
              f"{icc:>6s} {t['4']:6.2f} {t['8']:6.2f} {t['16']:6.2f} {r['completion_tokens']['mean']:5.1f} "
              f"{r['completion_tokens']['truncation_share']:5.2f}  {r['regime']} / {r['recommendation']}")
    plot(rows, os.path.join(out, "atlas.png"))
    return atlas


def plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    fig = plt.figure(figsize=(13, 5.5))
    ax = fig.add_subplot(1, 2, 1)
    for r in rows:
        x, y = r["tied_share"]["8"], r["icc"] if r["icc"] is not None else 0.0
        ax.scatter([x], [y], s=30)
        ax.annotate(r["spec"][14:].replace(":level=", " L"), (x, y), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    ax.axhline(0.4, ls=":", c="grey")
    ax.axvline(1 / 3, ls=":", c="grey")
    ax.set_xlabel("tied-group share at G = 8")
    ax.set_ylabel("ICC (between-prompt share of reward variance)")
    ax.set_title("SmolLM2-135M-Instruct on reasoning-gym (32 prompts x 8)")
    bins = ["0", "(0,0.25]", "(0.25,0.5]", "(0.5,0.75]", "(0.75,1)", "1"]
    for i, r in enumerate(rows):
        sub = fig.add_subplot(len(rows), 2, 2 * i + 2)
        sub.bar(range(len(bins)), [r["histogram"].get(b, 0) for b in bins])
        sub.set_yticks([])
        sub.set_xticks(range(len(bins)) if i == len(rows) - 1 else [])
        if i == len(rows) - 1:
            sub.set_xticklabels(bins, fontsize=7)
        sub.set_ylabel(r["spec"][14:].replace(":level=", " L"), rotation=0, ha="right", fontsize=7)
    fig.suptitle("per-prompt pass-rate histograms (right)", x=0.75, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=OUT)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--report_only", action="store_true")
    a = p.parse_args(argv)
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    if not a.report_only:
        with ThreadPoolExecutor(max_workers=a.jobs) as pool:
            for spec, wall, rc in pool.map(lambda t: run_one(t[0], a.out), TASKS):
                print(f"{spec}: {'reused' if wall == 0 else f'{wall:.0f}s'}{'' if rc == 0 else f' FAILED rc {rc}'}",
                      flush=True)
    report(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

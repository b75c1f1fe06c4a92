"""Per-level pass counts of a ``steps`` / ``steps_matched`` regime sample saved by ``trl-ext advise --save_samples``,
and the pass-count histogram of a value table (``--value_table``).

    python benchmarks/steps_levels.py --samples steps_matched_samples.json [--output levels.json]
    python benchmarks/steps_levels.py --value_table value_table-<key>.jsonl

``advise`` draws its prompts with the task's own sampler (``make_real_dataset(task, n, seed, split)``) and records
each prompt's ``row_index`` in that draw; this script redraws the same rows (task, split, prompt count and seed from
the file's ``config``), reads each question's level from the item (level 0 ``a + b``, 1 ``a + b - c``, 2
``a + b x c``), and prints per level the number of prompts, the mean pass rate and the histogram of correct
samples out of ``k``. ``--value_table`` reads a table written by ``trl-ext build-value-table`` (or the comparison
harness) with binary rewards and prints its mean and how many prompts had 0, 1, ..., n of their n samples right.
Nothing is generated.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter

LEVEL_NAMES = {0: "a + b", 1: "a + b - c", 2: "a + b x c"}


def question_level(question: str) -> int:
    """The level of a ``steps`` question from its words: 2 (bags), 1 (gives), else 0."""
    if re.search(r"buys \d+ bags with", question):
        return 2
    return 1 if re.search(r"gives \d+ ", question) else 0


def level_table(payload: dict) -> dict[int, dict]:
    """``{level: {"prompts", "mean_pass_rate", "correct_counts" (histogram), "k"}}`` of an advise payload with
    samples; the accuracy is the first reward column (the task's ``accuracy_reward``)."""
    from trl_ext.realmodel import make_real_dataset

    args = payload["config"]["args"]
    task, seed = args["dataset"], int(args["seed"])
    samples = payload["samples"]
    rows = make_real_dataset(task, len(samples), seed=seed, split=args.get("split") or "train", as_list=True)
    per_level: dict[int, list[tuple[int, int]]] = {}
    for rec in samples:
        level = question_level(rows[rec["row_index"]]["prompt"][-1]["content"])
        acc = [r[0] if isinstance(r, list) else r for r in rec["rewards"]]
        per_level.setdefault(level, []).append((int(sum(a >= 0.5 for a in acc)), len(acc)))
    out = {}
    for level, counts in sorted(per_level.items()):
        out[level] = {"name": LEVEL_NAMES[level], "prompts": len(counts),
                      "mean_pass_rate": sum(c / k for c, k in counts) / len(counts),
                      "correct_counts": dict(sorted(Counter(c for c, _ in counts).items())),
                      "k": sorted({k for _, k in counts})}
    return out


def table_pass_counts(path: str) -> dict:
    """``{"prompts", "mean_pass_rate", "correct_counts" ({correct: prompts}), "n"}`` of a binary-reward value table
    (loaded and checked by :func:`trl_ext.priors.table_file.load_value_table`)."""
    from trl_ext.priors.table_file import load_value_table

    table = load_value_table(path)
    rows = [table.get(k) for k in table.keys()]
    if not table.is_binary:
        raise ValueError(f"{path}: rewards are not binary; pass counts need 0/1 rewards")
    counts = Counter(round(r.mean_reward * r.n) for r in rows)
    return {"prompts": len(rows), "mean_pass_rate": sum(r.mean_reward for r in rows) / len(rows),
            "correct_counts": dict(sorted(counts.items())), "n": sorted({r.n for r in rows})}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--samples", help="advise JSON written with --save_samples")
    src.add_argument("--value_table", help="a value table (.jsonl) with binary rewards")
    p.add_argument("--output", default=None, help="write the table as JSON")
    args = p.parse_args(argv)
    if args.value_table:
        res = table_pass_counts(args.value_table)
        hist = " / ".join(str(res["correct_counts"].get(c, 0)) for c in range(max(res["n"]) + 1))
        print(f"{res['prompts']} prompts, mean pass rate {res['mean_pass_rate']:.3f}; prompts with 0 / 1 / ... / "
              f"{max(res['n'])} of {res['n']} right: {hist}")
        if args.output:
            with open(args.output, "w") as f:
                json.dump(res, f, indent=1)
        return 0
    with open(args.samples) as f:
        payload = json.load(f)
    table = level_table(payload)
    for level, row in table.items():
        hist = ", ".join(f"{n} x {c}" for c, n in row["correct_counts"].items())
        print(f"level {level} ({row['name']}): {row['prompts']} prompts, mean pass rate {row['mean_pass_rate']:.3f}, "
              f"correct out of {row['k']}: {hist}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({str(k): v for k, v in table.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

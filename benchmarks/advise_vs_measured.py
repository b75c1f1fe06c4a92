"""``trl-ext advise``'s predictions on a comparison's start checkpoint against what the comparison measured.

Predicted side (the advice JSON recorded before any main run): per method, the token saving against the user's GRPO
group size (``methods[m].saving_vs_user_grpo``: the share of generated tokens saved for the same informative signal,
with its interval; negative = more tokens) and whether the method "pays here" (``alternatives``), and the
recommendation. Measured side (the comparison's ``table.json``): each method's mean tokens to the threshold
accuracy (``tokens_to_threshold_mean``, over the seeds that reached it) and its final accuracy. A method with a
value table (BASIS) is charged its table tokens the way advise charges them: ``table_tokens / table_uses``
(``methods[m].info.table_uses`` of the advice; 1 when absent), added to its online tokens to the threshold; the
online-only saving is reported beside it. The measured saving is ``1 - tokens_to_threshold(method) /
tokens_to_threshold(baseline)``; a prediction is **right in sign** when both savings have the same sign (or the
measured saving lies in the predicted interval), **wrong** otherwise, and **untested** when a side is missing.

Usage::

    python benchmarks/advise_vs_measured.py --advice <dir>/advise_start.json --table <dir>/table.json \\
        [--baseline grpo_g8] [--output <dir>/advise_vs_measured.json]

prints the Markdown table of docs/advise.md ("Predicted vs measured").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

#: the comparison's method -> the advice's method (``methods``) and alternative (``alternatives``) names
ADVICE_NAMES: dict[str, tuple[str | None, str | None]] = {
    "grpo_g16": ("grpo_g16", None), "grpo_g8": ("grpo_g8", None), "grpo_g4": ("grpo_g4", None),
    "reinforce_pp": ("reinforce_pp", "reinforce_pp"), "dapo_dynamic": ("dapo_g4", "dapo"),
    "basis": ("basis", "basis"), "v05_osla": ("v05_osla", "v05_osla"), "pair": (None, "pair"),
    "james_stein": (None, None),
}


def _rank(values: dict[str, float]) -> dict[str, int]:
    """1 = largest; ties share the better rank."""
    order = sorted(values.values(), reverse=True)
    return {k: order.index(v) + 1 for k, v in values.items()}


def compare(advice: dict, table: dict, baseline: str = "grpo_g8") -> dict:
    """One row per method of ``table`` with the advice's prediction and the measured saving (see the module doc).

    Returns ``{"baseline", "recommendation", "rows": [...], "sign_right", "sign_wrong", "untested"}``; a row holds
    ``method``, ``predicted_saving`` (``[value, low, high]`` or ``None``), ``pays_here`` (bool or ``None``),
    ``tokens_to_threshold`` (table charge included), ``table_tokens_charged``, ``online_saving`` (without the table),
    ``reached`` (seeds), ``measured_saving``, ``final_accuracy``, ``predicted_rank`` /
    ``measured_rank`` (by saving, among methods with both) and ``verdict`` (``right`` / ``wrong`` / ``untested``).
    """
    rows_by_method = {r["method"]: r for r in table["rows"] if r.get("status", "ok") == "ok"}
    base = rows_by_method.get(baseline, {}).get("tokens_to_threshold_mean")
    rows = []
    for method, r in rows_by_method.items():
        name, alt = ADVICE_NAMES.get(method, (None, None))
        pred = advice.get("methods", {}).get(name, {}).get("saving_vs_user_grpo") if name else None
        predicted = [pred["value"], pred["low"], pred["high"]] if pred else None
        pays = advice.get("alternatives", {}).get(alt, {}).get("pays_here") if alt else None
        online = r.get("tokens_to_threshold_mean")
        info = advice.get("methods", {}).get(name, {}).get("info", {}) if name else {}
        table_charge = float(r.get("table_tokens") or 0.0) / float(info.get("table_uses") or 1.0)
        ttt = online + table_charge if online else online
        measured = (1.0 - ttt / base) if (ttt and base) else None
        if method == baseline:
            verdict = "baseline"
        elif predicted is None or measured is None:
            verdict = "untested"
        else:
            value, low, high = predicted
            same_sign = (value > 0) == (measured > 0) or low <= measured <= high
            verdict = "right" if same_sign else "wrong"
        rows.append({"method": method, "predicted_saving": predicted, "pays_here": pays, "tokens_to_threshold": ttt,
                     "table_tokens_charged": table_charge,
                     "online_saving": (1.0 - online / base) if (online and base) else None,
                     "reached": r.get("tokens_to_threshold_reached"), "measured_saving": measured,
                     "final_accuracy": r.get("final_accuracy_mean"), "verdict": verdict})
    both = {row["method"]: row for row in rows if row["predicted_saving"] and row["measured_saving"] is not None}
    p_rank = _rank({m: row["predicted_saving"][0] for m, row in both.items()})
    m_rank = _rank({m: row["measured_saving"] for m, row in both.items()})
    for row in rows:
        row["predicted_rank"], row["measured_rank"] = p_rank.get(row["method"]), m_rank.get(row["method"])
    count = lambda v: sum(row["verdict"] == v for row in rows)  # noqa: E731
    return {"baseline": baseline, "recommendation": advice.get("recommendation"),
            "recommended_config": advice.get("recommended_config"), "rows": rows, "sign_right": count("right"),
            "sign_wrong": count("wrong"), "untested": count("untested")}


def markdown(result: dict) -> str:
    """The Markdown table of :func:`compare`'s result."""
    def pct(x):
        return "n/a" if x is None else f"{100 * x:+.0f} %"

    lines = [f"advise recommended `{result['recommendation']}` ({result['recommended_config']}); savings are against "
             f"{result['baseline']}'s tokens to the threshold.", "",
             "| method | predicted saving [interval] | pays here (advise) | measured saving (seeds reaching) | final "
             "accuracy | rank predicted / measured | verdict |", "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        p = row["predicted_saving"]
        pred = "n/a" if p is None else f"{pct(p[0])} [{pct(p[1])}, {pct(p[2])}]"
        pays = "n/a" if row["pays_here"] is None else ("yes" if row["pays_here"] else "no")
        acc = "n/a" if row["final_accuracy"] is None else f"{row['final_accuracy']:.3f}"
        ranks = f"{row['predicted_rank'] or '-'} / {row['measured_rank'] or '-'}"
        table = (f"; online only {pct(row['online_saving'])}, table {row['table_tokens_charged']:,.0f} tokens charged"
                 if row["table_tokens_charged"] else "")
        lines.append(f"| {row['method']} | {pred} | {pays} | {pct(row['measured_saving'])} ({row['reached']}{table}) | "
                     f"{acc} | {ranks} | {row['verdict']} |")
    lines.append(f"\nSign right {result['sign_right']}, wrong {result['sign_wrong']}, untested {result['untested']}.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--advice", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--baseline", default="grpo_g8")
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    with open(args.advice, encoding="utf-8") as f:
        advice = json.load(f)
    with open(args.table, encoding="utf-8") as f:
        table = json.load(f)
    if not any(r["method"] == args.baseline for r in table["rows"]):
        print(f"{args.table} has no {args.baseline} row", file=sys.stderr)
        return 1
    result = compare(advice, table, args.baseline)
    print(markdown(result))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, sort_keys=True)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

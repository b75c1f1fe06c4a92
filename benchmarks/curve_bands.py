"""Accuracy-vs-tokens curves with seed bands, as a table: each method's held-out accuracy at every evaluation
checkpoint, the mean over its seeds and the band over them (min .. max, the shaded band of the harness's
``accuracy_vs_tokens.png``), with the tokens actually generated there (a checkpoint fires at the first step whose
cumulative count reaches it, so the actual count is at or above the nominal one).

Descriptive only: the intervals and the tests are ``trl-ext curves`` (AUC, two-level seed x question bootstrap) and
the harness's two-part verdicts. Used for the 4x-horizon curves of docs/results.md::

    python benchmarks/curve_bands.py --runs_json benchmarks/results/compare/smollm2/steps_matched_t07_4x/runs.json \\
        --output benchmarks/results/compare/smollm2/steps_matched_t07_4x/curve_bands.json

Prints a markdown table (rows: checkpoints; columns: methods, ``mean [min, max]``) and writes the same numbers as
JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from trl_ext._io import write_json


def curve_bands(runs: Sequence[dict], metric: str = "accuracy", start_accuracy: float | None = None) -> dict:
    """Per method, per nominal checkpoint: the seed mean, min and max of ``metric`` and the mean actual tokens.

    Parameters
    ----------
    runs : sequence of dict
        Run records of a harness ``runs.json`` (``method``, ``seed``, ``status``, ``curve``: points with
        ``nominal_tokens``, ``tokens`` and ``metric``). Records whose status is not ``"ok"`` are left out and counted.
    metric : str
        The curve key read at each point.
    start_accuracy : float, optional
        Accuracy at 0 tokens (the start checkpoint), the first row of every method when given.

    Returns
    -------
    dict
        ``{"metric", "methods": {method: {"seeds": [...], "points": [{"nominal_tokens", "tokens_mean", "mean",
        "min", "max", "n"}]}}, "not_ok": {method: {status: n}}}`` (runs not finished: pending, failed,
        skipped). A checkpoint enters a method's points only when every one of
        its seeds has it (a cut-off seed would otherwise pull the mean); its seeds are listed.

    Raises
    ------
    ValueError
        A point without ``metric``, or a run whose checkpoints repeat a nominal value.
    """
    out: dict = {"metric": metric, "methods": {}, "not_ok": {}}
    by_method: dict[str, list[dict]] = {}
    for r in runs:
        if r.get("status") != "ok":
            counts = out["not_ok"].setdefault(r["method"], {})
            counts[r.get("status")] = counts.get(r.get("status"), 0) + 1
            continue
        by_method.setdefault(r["method"], []).append(r)
    for method, rs in by_method.items():
        curves = []
        for r in rs:
            pts = {}
            for p in r["curve"]:
                if metric not in p or p[metric] is None:
                    raise ValueError(f"{method} seed {r['seed']}: a curve point without {metric!r} at "
                                     f"{p.get('nominal_tokens')} tokens")
                if float(p["nominal_tokens"]) in pts:
                    raise ValueError(f"{method} seed {r['seed']}: checkpoint {p['nominal_tokens']} twice")
                pts[float(p["nominal_tokens"])] = (float(p["tokens"]), float(p[metric]))
            curves.append(pts)
        common = sorted(set.intersection(*(set(c) for c in curves)))
        points = []
        if start_accuracy is not None:
            points.append({"nominal_tokens": 0.0, "tokens_mean": 0.0, "mean": float(start_accuracy),
                           "min": float(start_accuracy), "max": float(start_accuracy), "n": len(curves)})
        for nom in common:
            vals = [c[nom][1] for c in curves]
            points.append({"nominal_tokens": nom, "tokens_mean": sum(c[nom][0] for c in curves) / len(curves),
                           "mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals), "n": len(vals)})
        out["methods"][method] = {"seeds": sorted(int(r["seed"]) for r in rs), "points": points}
    return out


def markdown(bands: dict) -> str:
    """The table: one row per nominal checkpoint, one column per method (``mean [min, max]``, accuracy in %)."""
    methods = list(bands["methods"])
    noms = sorted({p["nominal_tokens"] for m in methods for p in bands["methods"][m]["points"]})
    head = ["tokens (nominal)"] + [f"{m} ({len(bands['methods'][m]['seeds'])} seeds)" for m in methods]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for nom in noms:
        row = [f"{nom:,.0f}"]
        for m in methods:
            p = next((q for q in bands["methods"][m]["points"] if q["nominal_tokens"] == nom), None)
            row.append("" if p is None else
                       f"{100 * p['mean']:.1f} [{100 * p['min']:.1f}, {100 * p['max']:.1f}]")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs_json", required=True)
    p.add_argument("--metric", default="accuracy", help="curve key (default: the harness's primary accuracy)")
    p.add_argument("--methods", nargs="*", default=None, help="only these methods (default: all)")
    p.add_argument("--output", default=None, help="write the bands as JSON")
    a = p.parse_args(argv)
    with open(a.runs_json, encoding="utf-8") as f:
        doc = json.load(f)
    runs = [r for r in doc["runs"] if a.methods is None or r["method"] in a.methods]
    bands = curve_bands(runs, a.metric, doc.get("start_accuracy"))
    bands["runs_json"] = os.path.relpath(a.runs_json)
    print(markdown(bands), end="")
    if bands["not_ok"]:
        print(f"runs left out (not finished, by status): {bands['not_ok']}")
    if a.output:
        write_json(a.output, bands)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``trl-ext compare``: two configurations' per-question outcomes over seeds -> two-part-rule verdict and floors.

Usage::

    trl-ext compare --a run_a_seed*/outcomes.jsonl --b run_b_seed*/outcomes.jsonl [--json out.json] [--intersect]

Files may be gzip-compressed (``outcomes.jsonl.gz``); a ``.jsonl`` path or pattern that matches nothing falls back
to the ``.jsonl.gz`` file(s). Seeds are paired by the ``seedN`` path component when every file has one, otherwise by
sorted path order. ``--b`` is the baseline whose accuracy sets the detection floor. See ``docs/measurement.md``.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--a", nargs="+", required=True, metavar="FILE",
                        help="Configuration A outcomes JSONL (or .jsonl.gz), one per seed (shell globs or quoted glob "
                        "patterns).")
    parser.add_argument("--b", nargs="+", required=True, metavar="FILE",
                        help="Configuration B (baseline) outcomes JSONL, one per seed.")
    parser.add_argument("--json", default=None, metavar="OUT", help="Also write the full report as JSON here.")
    parser.add_argument("--intersect", action="store_true",
                        help="Compare on the question ids common to all files (reported) instead of failing.")
    parser.add_argument("--score", choices=("correct", "pass_rate"), default="correct",
                        help="Per-question outcome the verdict uses (default: correct).")
    parser.add_argument("--alpha", type=float, default=0.05, help="Significance level (default 0.05).")
    parser.add_argument("--power", type=float, default=0.8, help="Power for floors and smallest gap (default 0.8).")
    parser.add_argument("--n-boot", type=int, default=5000, help="Paired bootstrap replicates (default 5000).")
    parser.add_argument("--n-sim", type=int, default=1000,
                        help="Monte Carlo reruns for the smallest detectable gap (default 1000).")
    parser.add_argument("--seed", type=int, default=0, help="RNG seed for bootstrap and Monte Carlo.")


def _expand(patterns: list[str], flag: str = "--a") -> list[str]:
    """Expand quoted glob patterns; a ``*.jsonl`` pattern matching nothing is retried as ``*.jsonl.gz``; a pattern
    matching nothing at all is a ``ValueError`` naming the flag and the pattern (a plain path is kept, so the reader
    reports it as missing)."""
    out: list[str] = []
    for p in patterns:
        hits = []
        if any(ch in p for ch in "*?["):
            hits = sorted(glob.glob(p))
            if not hits and p.endswith(".jsonl"):
                hits = sorted(glob.glob(p + ".gz"))
            if not hits:
                raise ValueError(f"{flag} pattern {p!r} matches no file"
                                 + (" (nor its .jsonl.gz twin)" if p.endswith(".jsonl") else "")
                                 + ": check the path, or quote the pattern so the shell does not expand it first.")
        out.extend(hits or [p])
    return out


def main(args: argparse.Namespace) -> int:
    from .compare import compare_outcome_files, format_report
    from .outcomes import OutcomeFormatError

    try:
        report = compare_outcome_files(
            _expand(args.a, "--a"), _expand(args.b, "--b"), intersect=args.intersect, score=args.score, alpha=args.alpha,
            power=args.power, n_boot=args.n_boot, n_sim=args.n_sim, seed=args.seed,
        )
    except (OutcomeFormatError, ValueError) as exc:
        print(f"trl-ext compare: error: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
        print(f"\nfull report written to {args.json}")
    return 0

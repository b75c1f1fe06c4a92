"""``trl-ext audit``: run the estimator audits (BASIS, V0.5, PAIR) and write one JSON + table per audit.

Each audit lives in ``trl_ext.estimators.audits.<name>`` and exposes ``run_audit(seed, quick) -> dict`` and
``format_table(result) -> str``. An audit module that is not installed (or lacks those two functions) is
reported as ``missing`` instead of crashing the run; an audit that raises is reported as ``failed`` with its
error, and the others still run. Exit status: 0 if every requested audit that exists succeeded, 1 if any failed,
and 2 if ``--strict`` is given and some audit is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from typing import Any

from .._io import json_safe

AUDITS = ("basis", "v05", "pair")
DEFAULT_OUTPUT_DIR = os.path.join("benchmarks", "results")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", action="append", choices=AUDITS, default=None,
                        help="Run only this audit (repeatable). Default: all of basis, v05, pair.")
    parser.add_argument("--seed", type=int, default=0, help="Random seed passed to every audit (default 0).")
    parser.add_argument("--quick", action="store_true", help="Smaller populations (seconds instead of minutes).")
    parser.add_argument("--output_dir", default=DEFAULT_OUTPUT_DIR,
                        help=f"Where audit_<name>.json/.txt and audit_summary.json go (default {DEFAULT_OUTPUT_DIR}).")
    parser.add_argument("--strict", action="store_true", help="Exit 2 when a requested audit module is missing.")


def _jsonable(x: Any) -> Any:
    """JSON-safe values for the audit files: NaN as ``None``, +-inf as ``"inf"`` / ``"-inf"``."""
    return json_safe(x, infinity=lambda v: "inf" if v > 0 else "-inf")


def _load(name: str):
    from importlib import import_module

    modname = f"trl_ext.estimators.audits.{name}"
    try:
        mod = import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name == modname:
            return None, f"module {modname} not found (not written yet?)"
        raise
    missing = [f for f in ("run_audit", "format_table") if not callable(getattr(mod, f, None))]
    if missing:
        return None, f"module {modname} lacks {', '.join(missing)}"
    return mod, None


def main(args: argparse.Namespace) -> int:
    names = list(dict.fromkeys(args.only or AUDITS))
    os.makedirs(args.output_dir, exist_ok=True)
    summary: dict[str, Any] = {"seed": args.seed, "quick": bool(args.quick), "audits": {}}
    failed = missing = False
    for name in names:
        t0 = time.perf_counter()
        try:
            mod, why = _load(name)
        except Exception as exc:  # an import error inside the audit module itself
            mod, why = None, None
            failed = True
            summary["audits"][name] = {"status": "failed", "error": f"import: {exc!r}"}
            print(f"[audit {name}] FAILED to import: {exc!r}")
            continue
        if mod is None:
            missing = True
            summary["audits"][name] = {"status": "missing", "reason": why}
            print(f"[audit {name}] MISSING: {why}")
            continue
        try:
            result = _jsonable(mod.run_audit(seed=args.seed, quick=bool(args.quick)))
            table = mod.format_table(result)
        except Exception as exc:
            failed = True
            summary["audits"][name] = {"status": "failed", "error": repr(exc), "traceback": traceback.format_exc()}
            print(f"[audit {name}] FAILED: {exc!r}")
            continue
        jpath = os.path.join(args.output_dir, f"audit_{name}.json")
        tpath = os.path.join(args.output_dir, f"audit_{name}.txt")
        with open(jpath, "w") as f:
            json.dump(result, f, indent=2, allow_nan=False)
        with open(tpath, "w") as f:
            f.write(table + "\n")
        dt = time.perf_counter() - t0
        summary["audits"][name] = {"status": "ok", "json": jpath, "table": tpath, "seconds": round(dt, 3)}
        print(f"[audit {name}] ok in {dt:.1f}s -> {jpath}\n{table}\n")
    with open(os.path.join(args.output_dir, "audit_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if failed:
        return 1
    if missing and args.strict:
        return 2
    return 0

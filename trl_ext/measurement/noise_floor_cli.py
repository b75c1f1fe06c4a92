"""``trl-ext noise-floor``: measure a scorer's noise floor (alone vs. inside batches of unrelated filler).

Usage::

    trl-ext noise-floor --scorer my_pkg.rm:score_batch --items items.jsonl --filler filler.jsonl --output floor.json

``--scorer`` is ``package.module:function`` (the current directory is importable) or ``path/to/file.py:function``,
a function taking a list of texts and returning one float per text. Items and filler are JSONL files with a ``text``
field per line (an ``id`` field, if present, is carried into the output).
Built-in demo scorers: ``trl_ext.measurement.noise_floor:deterministic_toy_scorer`` (floor 0) and
``trl_ext.measurement.noise_floor:batch_sensitive_toy_scorer`` (nonzero floor). See ``docs/measurement.md``.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scorer", required=True, metavar="REF",
                        help="Batch scorer f(list[str]) -> list[float]: 'package.module:function' or "
                             "'path/to/file.py:function'.")
    parser.add_argument("--items", required=True, metavar="JSONL", help="Items to track (one {'text': ...} per line).")
    parser.add_argument("--filler", required=True, metavar="JSONL", help="Unrelated filler texts (JSONL, 'text').")
    parser.add_argument("--output", required=True, metavar="JSON", help="Where to write the floor and every score.")
    parser.add_argument("--positions", type=int, default=4, help="In-batch placements per item (default 4).")
    parser.add_argument("--batch-size", type=int, default=8, help="Batch size with filler (default 8).")
    parser.add_argument("--multiplier", type=float, default=3.0, help="Floor = multiplier x p95 spread (default 3).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the filler draws.")


class _InputError(ValueError):
    pass


def load_scorer(spec: str):
    """Resolve ``package.module:function`` or ``path/to/file.py:function`` (:func:`trl_ext.refs.resolve_callable`,
    the resolver every ``trl-ext`` command uses); errors say what to fix and name the accepted forms."""
    from trl_ext.refs import RefError, resolve_callable

    try:
        return resolve_callable(spec, option="--scorer")
    except RefError as exc:
        raise _InputError(str(exc)) from None


def read_text_jsonl(path: str) -> tuple[list[str], list]:
    """Read a JSONL file of ``{"text": str, ["id": ...]}`` objects (:func:`trl_ext._io.read_jsonl`; a ``.gz`` file is
    gunzipped); errors name ``file:line``."""
    from trl_ext._io import read_jsonl

    try:
        records = read_jsonl(path, error=_InputError, numbered=True)
    except FileNotFoundError:
        raise _InputError(f"{path}: file not found") from None
    texts, ids = [], []
    for lineno, rec in records:
        if not isinstance(rec.get("text"), str):
            raise _InputError(f"{path}:{lineno}: each line must be an object with a string 'text' field")
        texts.append(rec["text"])
        ids.append(rec.get("id", len(ids)))
    if not texts:
        raise _InputError(f"{path}: no records (empty file)")
    return texts, ids


def main(args: argparse.Namespace) -> int:
    from .noise_floor import NoiseFloorError, measure_noise_floor

    try:
        scorer = load_scorer(args.scorer)
        items, ids = read_text_jsonl(args.items)
        filler, _ = read_text_jsonl(args.filler)
        res = measure_noise_floor(scorer, items, filler, positions=args.positions, seed=args.seed,
                                  batch_size=args.batch_size, multiplier=args.multiplier)
    except (_InputError, NoiseFloorError, ValueError) as exc:
        print(f"trl-ext noise-floor: error: {exc}", file=sys.stderr)
        return 2
    out = {"scorer": args.scorer, "items_file": args.items, "filler_file": args.filler, **res.to_dict(ids)}
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=2)
    print(f"noise floor of {args.scorer}: {res.floor:.6g} (= {res.multiplier:g} x p95 spread {res.p95_spread:.6g}; "
          f"{len(items)} items, slots {list(res.positions_used)} of batch {res.batch_size}; "
          f"max spread {res.spreads.max():.6g})")
    print(f"every per-item score written to {args.output}")
    if len(items) < 20:
        print(f"note: only {len(items)} items; with fewer than 20 the 95th percentile is essentially the maximum "
              "spread (the protocol uses about 60)")
    return 0

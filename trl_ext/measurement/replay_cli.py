"""``trl-ext replay``: regenerate logged keyed rollouts, or diff two checkpoints on the same keys.

Examples
--------
Check that checkpoint-20 reproduces its logged rollouts byte-identically::

    trl-ext replay --log out/rollouts/rank0.jsonl --model out/checkpoint-20

Where do checkpoint-20 and checkpoint-40 first decide differently on the step-20 keys? ::

    trl-ext replay --log out/rollouts/rank0.jsonl --step 20 --model out/checkpoint-20 \
        --model_b out/checkpoint-40 --json diff.json

Before replaying, ``--model`` is checked against what the log records about its model (the ``checkpoint`` /
``model`` fields, the vocabulary, the EOS ids; :func:`~trl_ext.measurement.replay.check_model_matches_log`): a
different model gets a warning on stderr (and in ``--json``), a vocabulary too small for the logged token ids an error.

Exit status: 0 on success (replay mode: every record byte-identical), 1 when a replay mismatches, 2 on bad input
(missing file, missing key, unloadable model, a model whose vocabulary cannot have produced the log).
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``replay`` options."""
    parser.add_argument("--log", required=True, help="Rollout log written by keyed sampling (rollouts/rank<r>.jsonl).")
    parser.add_argument("--key", default=None, help="Only records with this request key (decimal or 0x-hex).")
    parser.add_argument("--sample-index", "--sample_index", dest="sample_index", type=int, default=None)
    parser.add_argument("--step", type=int, default=None, help="Only records logged at this global step.")
    parser.add_argument("--limit", type=int, default=None, help="At most this many records (after filtering).")
    parser.add_argument("--model", required=True, help="Checkpoint A (path loadable with AutoModelForCausalLM).")
    parser.add_argument("--model_b", "--model-b", dest="model_b", default=None, help="Checkpoint B: diff A vs B.")
    parser.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="torch device (default cpu).")
    parser.add_argument("--json", default=None, help="Write the per-record results to this JSON file.")


def _load(path: str, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).to(device)
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        tok = None
    return model, tok


def _fmt(x):
    return "-" if x is None else (f"{x:+.4f}" if isinstance(x, float) else str(x))


def main(args: argparse.Namespace) -> int:
    """Run ``trl-ext replay``; see the module docstring."""

    from trl_ext.measurement.replay import (
        check_model_matches_log,
        diff_checkpoints,
        load_rollout_log,
        regenerate_batch,
        select_records,
    )

    try:
        records = load_rollout_log(args.log)
        records = select_records(records, key=args.key, sample_index=args.sample_index)
        if args.step is not None:
            steps = sorted({r.get("step") for r in records})
            records = [r for r in records if r.get("step") == args.step]
            if not records:
                raise KeyError(f"no selected record was logged at step {args.step}; logged steps: {steps}")
        if args.limit is not None:
            if args.limit < 1:
                raise ValueError("--limit must be >= 1")
            records = records[: args.limit]
        if args.batch_size < 1:
            raise ValueError("--batch-size must be >= 1")
    except (FileNotFoundError, ValueError, KeyError, TypeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"trl-ext replay: error: {msg}", file=sys.stderr)
        return 2
    try:
        model_a, tok = _load(args.model, args.device)
        model_b = _load(args.model_b, args.device)[0] if args.model_b else None
    except (OSError, ValueError) as e:
        print(f"trl-ext replay: error: cannot load model: {e}", file=sys.stderr)
        return 2
    try:  # is --model the checkpoint the log says generated these records? (model B is expected to differ)
        warnings = check_model_matches_log(records, model_a, args.model)
    except ValueError as e:
        print(f"trl-ext replay: error: --model {args.model!r}: {e}", file=sys.stderr)
        return 2
    for w in warnings:
        print(f"trl-ext replay: warning: {w}", file=sys.stderr)

    if model_b is None:
        results, n_ok = [], 0
        for s in range(0, len(records), args.batch_size):
            chunk = records[s : s + args.batch_size]
            for rec, comp in zip(chunk, regenerate_batch(model_a, chunk)):
                ok = comp == list(rec["completion_ids"])
                n_ok += ok
                first = None
                if not ok:
                    logged = list(rec["completion_ids"])
                    first = next(
                        (i for i, (x, y) in enumerate(zip(comp, logged)) if x != y), min(len(comp), len(logged))
                    )
                results.append(
                    {"key": rec["key"], "sample_index": rec["sample_index"], "step": rec.get("step"),
                     "identical": ok, "first_mismatch": first, "logged": rec["completion_ids"], "replayed": comp}
                )  # fmt: skip
                status = "identical" if ok else f"MISMATCH at position {first}"
                print(f"key={rec['key']} sample={rec['sample_index']} step={rec.get('step')}: {status}")
        print(f"{n_ok}/{len(records)} rollouts regenerated byte-identically")
        if n_ok < len(records) and warnings:
            print("note: --model may not be the checkpoint that generated these rollouts (see the warnings on stderr)")
        payload = {"mode": "replay", "model": args.model, "n": len(records), "identical": n_ok, "warnings": warnings,
                   "records": results}
        rc = 0 if n_ok == len(records) else 1
    else:
        diffs = diff_checkpoints(model_a, model_b, tok, records, batch_size=args.batch_size)
        n_div = 0
        for d in diffs:
            if d.first_divergence is None:
                print(f"key={d.key} sample={d.sample_index}: identical under both checkpoints")
                continue
            n_div += 1
            print(
                f"key={d.key} sample={d.sample_index}: first divergence at position {d.first_divergence}: "
                f"A={d.token_a!r}({d.text_a!r}) B={d.token_b!r}({d.text_b!r}) "
                f"margin_A={_fmt(d.logit_margin_a)} margin_B={_fmt(d.logit_margin_b)} gumbel_gap={_fmt(d.gumbel_gap)}"
            )
        print(f"{n_div}/{len(diffs)} rollouts diverge between the two checkpoints")
        payload = {"mode": "diff", "model_a": args.model, "model_b": args.model_b, "n": len(diffs),
                   "diverged": n_div, "warnings": warnings, "records": [d.to_dict() for d in diffs]}  # fmt: skip
        rc = 0
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
    return rc

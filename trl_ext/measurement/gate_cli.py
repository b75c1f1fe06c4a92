"""``trl-ext gate``: measure the shut gate of a model on a dataset before training.

Samples ``--num_generations`` completions for each of ``--num_prompts`` prompts of a testbed task (at training
temperature), scores them with the task's reward functions and reports the tied-group share, its split into
all-right / all-wrong, and the tied-correct share (``trl_ext.measurement.shut_gate``). Read it next to the
model's held-out accuracy ("Measurement Discipline for RLVR": "ties in a sub-skill whose held-out score never
left the floor are the reason it never left").

Example::

    trl-ext gate --model PATH --task addition --num_prompts 64 --num_generations 8 --output gate.json

The JSON output keeps every per-prompt reward list, so the reading can be re-derived.
"""

from __future__ import annotations

import json
import math
import sys

__all__ = ["add_arguments", "main", "measure_gate"]


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="Local model directory (AutoModelForCausalLM + tokenizer).")
    parser.add_argument("--task", default="addition", help="Testbed task (trl_ext.testbed.TASKS). Default: addition.")
    parser.add_argument("--split", default="train", choices=["train", "test"], help="Dataset split. Default: train.")
    parser.add_argument("--num_prompts", type=int, default=64, help="Distinct prompts to sample. Default: 64.")
    parser.add_argument("--num_generations", type=int, default=8, help="Rollouts per prompt (>= 2). Default: 8.")
    parser.add_argument("--max_new_tokens", type=int, default=8, help="Max completion tokens. Default: 8.")
    parser.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature. Default: 1.0.")
    parser.add_argument("--top_p", type=float, default=1.0, help="Nucleus sampling p. Default: 1.0.")
    parser.add_argument("--batch_prompts", type=int, default=64, help="Prompts per generate call. Default: 64.")
    parser.add_argument("--success_threshold", type=float, default=0.5,
                        help="Reward >= this counts as correct. Default: 0.5.")
    parser.add_argument("--atol", type=float, default=0.0, help="Tie tolerance (max - min <= atol). Default: 0.")
    parser.add_argument("--seed", type=int, default=0, help="Dataset and sampling seed. Default: 0.")
    parser.add_argument("--output", default=None, help="Write the full reading (with per-prompt rewards) as JSON.")


def _check(args) -> str | None:
    if args.num_prompts < 1:
        return f"--num_prompts must be >= 1, got {args.num_prompts}."
    if args.num_generations < 2:
        return (f"--num_generations must be >= 2 (a group of one rollout always 'ties'), got "
                f"{args.num_generations}.")
    if args.max_new_tokens < 1:
        return f"--max_new_tokens must be >= 1, got {args.max_new_tokens}."
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        return f"--temperature must be > 0, got {args.temperature}."
    if not 0 < args.top_p <= 1:
        return f"--top_p must be in (0, 1], got {args.top_p}."
    if args.batch_prompts < 1:
        return f"--batch_prompts must be >= 1, got {args.batch_prompts}."
    if args.atol < 0 or not math.isfinite(args.atol):
        return f"--atol must be a finite number >= 0, got {args.atol}."
    return None


def measure_gate(model, tokenizer, dataset, reward_funcs, *, num_generations: int = 8, max_new_tokens: int = 8,
                 temperature: float = 1.0, top_p: float = 1.0, batch_prompts: int = 64, success_threshold: float = 0.5,
                 atol: float = 0.0, seed: int = 0):
    """Sample ``num_generations`` completions per dataset prompt and measure the shut gate.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Causal LM (any device; inputs follow ``model.device``).
    tokenizer : PreTrainedTokenizerBase
        With a pad token; prompts are left-padded.
    dataset : datasets.Dataset or list of dict
        Rows with a plain-text ``prompt`` column plus whatever the reward functions read.
    reward_funcs : list of callables
        TRL-signature reward functions ``f(prompts, completions, **columns) -> list[float | None]``; the reward of
        a rollout is their sum (``None`` -> NaN; all-``None`` -> unscorable).
    num_generations, max_new_tokens, temperature, top_p, batch_prompts, seed
        Sampling settings.
    success_threshold, atol
        See :func:`trl_ext.measurement.shut_gate.shut_gate_stats`.

    Returns
    -------
    stats : ShutGateStats
    records : list of dict
        One per prompt: ``prompt``, ``question_id`` (if present), ``completions``, ``rewards``.
    """
    import numpy as np
    import torch

    from .shut_gate import shut_gate_stats

    rows = [dict(r) for r in dataset]
    if not rows:
        raise ValueError("the dataset is empty; nothing to measure.")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token before measuring.")
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    model.eval()
    completions: list[str] = []
    try:
        for start in range(0, len(rows), batch_prompts):
            chunk = [r["prompt"] for r in rows[start:start + batch_prompts]]
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            with torch.no_grad():
                gen = model.generate(**enc, do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                                     max_new_tokens=max_new_tokens, num_return_sequences=num_generations,
                                     pad_token_id=tokenizer.pad_token_id)
            completions += tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = old_side
    rep_rows = [r for r in rows for _ in range(num_generations)]
    prompts = [r["prompt"] for r in rep_rows]
    columns = {k: [r[k] for r in rep_rows] for k in rep_rows[0] if k not in ("prompt", "completion")}
    per_func = []
    for f in reward_funcs:
        out = f(prompts=prompts, completions=completions, **columns)
        if len(out) != len(prompts):
            raise ValueError(f"reward function {getattr(f, '__name__', f)!r} returned {len(out)} rewards for "
                             f"{len(prompts)} completions.")
        per_func.append([np.nan if v is None else float(v) for v in out])
    rpf = np.asarray(per_func, dtype=np.float64).T
    rewards = np.where(np.isnan(rpf).all(axis=1), np.nan, np.nansum(rpf, axis=1))
    gids = np.repeat(np.arange(len(rows)), num_generations)
    stats = shut_gate_stats(rewards, gids, success_threshold=success_threshold, atol=atol)
    records = []
    for i, r in enumerate(rows):
        sl = slice(i * num_generations, (i + 1) * num_generations)
        rec = {"prompt": r["prompt"], "completions": completions[sl],
               "rewards": [None if math.isnan(v) else v for v in rewards[sl].tolist()]}
        if "question_id" in r:
            rec["question_id"] = r["question_id"]
        records.append(rec)
    return stats, records


def _fmt(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.4f}"


def main(args) -> int:
    err = _check(args)
    if err:
        print(f"trl-ext gate: {err}", file=sys.stderr)
        return 2
    import os

    if not os.path.isdir(args.model):
        print(f"trl-ext gate: --model {args.model!r} is not a local directory (nothing is downloaded).",
              file=sys.stderr)
        return 2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.testbed import get_reward_funcs, make_dataset

    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    try:
        dataset = make_dataset(args.task, args.num_prompts, seed=args.seed, split=args.split)
        reward_funcs = get_reward_funcs(args.task)
    except ValueError as e:
        print(f"trl-ext gate: {e}", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    stats, records = measure_gate(
        model, tokenizer, dataset, reward_funcs, num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        batch_prompts=args.batch_prompts, success_threshold=args.success_threshold, atol=args.atol, seed=args.seed,
    )
    print(f"shut gate of {args.model} on {args.task}/{args.split}: {args.num_prompts} prompts x "
          f"{args.num_generations} rollouts, T={args.temperature}")
    print(f"  tied share            {_fmt(stats.tied_share)}  ({stats.num_tied}/{stats.num_eligible_groups} groups)")
    print(f"    tied all-right      {_fmt(stats.tied_all_right_share)}  ({stats.num_tied_all_right})")
    print(f"    tied all-wrong      {_fmt(stats.tied_all_wrong_share)}  ({stats.num_tied_all_wrong})")
    if stats.num_tied_mixed:
        print(f"    tied mixed (atol)   {stats.num_tied_mixed}")
    print(f"  tied-correct share    {_fmt(stats.tied_correct_share)}  ({stats.num_correct_in_tied}/"
          f"{stats.num_correct} correct rollouts)")
    print(f"  sampled accuracy      {_fmt(stats.num_correct / stats.num_rollouts if stats.num_rollouts else math.nan)}")
    if stats.num_unscorable:
        print(f"  unscorable rollouts   {stats.num_unscorable}")
    if args.output:
        stats_d = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in stats.as_dict().items()}
        payload = {"config": {k: v for k, v in vars(args).items() if not k.startswith("_") and not callable(v)},
                   "stats": stats_d, "per_prompt": records}
        out_dir = os.path.dirname(os.path.abspath(args.output))
        os.makedirs(out_dir, exist_ok=True)
        with open(args.output, "w") as f:
            json.dump(payload, f, indent=1, allow_nan=False)
        print(f"  written to {args.output}")
    return 0

"""``trl-ext gate``: measure the shut gate of a model on a dataset before training.

Samples ``--num_generations`` completions for each of ``--num_prompts`` prompts (at training temperature), scores
them with the reward functions and reports the tied-group share, its split into all-right / all-wrong, and the
tied-correct share (``trl_ext.measurement.shut_gate``). Read it next to the model's held-out accuracy ("Measurement
Discipline for RLVR": "ties in a sub-skill whose held-out score never left the floor are the reason it never left").

The prompts come from your own dataset (``--dataset``: a ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file or a
``save_to_disk`` folder with a ``prompt`` column, text or messages) scored by your reward functions (``--reward``,
repeatable, ``package.module:function`` or ``path/to/file.py:function``), or from a testbed task (``--task``, the
default, scored by the task's own reward). Nothing is downloaded: ``--model`` is a local folder.

Examples::

    trl-ext gate --model PATH --dataset train.jsonl --reward my_rewards:accuracy --num_prompts 64 --output gate.json
    trl-ext gate --model PATH --task addition --num_prompts 64 --num_generations 8 --output gate.json

The JSON output keeps every per-prompt reward list (and the dataset row index), so the reading can be re-derived.
Exit status: 0 on success, 2 on bad input (the message says what to change).
"""

from __future__ import annotations

import json
import math
import sys

__all__ = ["add_arguments", "main", "measure_gate"]

# Keyword names TRL passes to a reward function itself; dataset columns with these names are not forwarded.
_RESERVED = ("prompt", "prompts", "completion", "completions", "completion_ids", "trainer_state", "log_extra",
             "log_metric")


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="Local model directory (AutoModelForCausalLM + tokenizer).")
    parser.add_argument("--dataset", default=None, metavar="PATH",
                        help="Your dataset: a .jsonl/.json/.csv/.parquet file or a datasets save_to_disk folder with "
                             "a prompt column (text or messages). Needs --reward. Nothing is downloaded.")
    parser.add_argument("--task", default=None,
                        help="Testbed task (trl_ext.testbed.TASKS) instead of --dataset. Default: addition.")
    parser.add_argument("--reward", action="append", default=None, metavar="REF",
                        help="Reward function, TRL signature f(prompts, completions, **columns): "
                             "'package.module:function' or 'path/to/file.py:function'. Repeatable (rewards are "
                             "summed, weighted by --reward_weights). Default with --task: the task's reward.")
    parser.add_argument("--reward_weights", "--reward-weights", dest="reward_weights", type=float, nargs="+",
                        default=None, help="One weight per --reward (default 1 each), like TRL's reward_weights.")
    parser.add_argument("--prompt_column", "--prompt-column", dest="prompt_column", default="prompt",
                        help="Dataset column holding the prompt. Default: prompt.")
    parser.add_argument("--split", default=None,
                        help="--task: train or test (default train). --dataset: the split of a saved DatasetDict.")
    parser.add_argument("--num_prompts", type=int, default=64,
                        help="Distinct prompts to sample (--dataset: drawn at random with --seed; all rows if the "
                             "dataset has fewer). Default: 64.")
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
    if args.dataset is not None and args.task is not None:
        return "--dataset and --task are alternatives; pass one of them."
    if args.dataset is not None and not args.reward:
        return ("--dataset needs at least one --reward: 'package.module:function' or 'path/to/file.py:function' "
                "(the testbed's reward only fits --task).")
    if args.reward_weights is not None:
        n = len(args.reward) if args.reward else None
        if n is None:
            return "--reward_weights needs --reward (one weight per reward function)."
        if len(args.reward_weights) != n:
            return f"--reward_weights has {len(args.reward_weights)} values for {n} --reward function(s)."
        if not all(math.isfinite(w) for w in args.reward_weights):
            return f"--reward_weights must be finite, got {args.reward_weights}."
    return None


def _is_conversation(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


def measure_gate(model, tokenizer, dataset, reward_funcs, *, num_generations: int = 8, max_new_tokens: int = 8,
                 temperature: float = 1.0, top_p: float = 1.0, batch_prompts: int = 64, success_threshold: float = 0.5,
                 atol: float = 0.0, seed: int = 0, prompt_column: str = "prompt", reward_weights=None,
                 row_indices=None):
    """Sample ``num_generations`` completions per dataset prompt and measure the shut gate.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Causal LM (any device; inputs follow ``model.device``).
    tokenizer : PreTrainedTokenizerBase
        With a pad token; prompts are tokenized as TRL's ``GRPOTrainer`` does (text: ``tokenizer(text=...)``;
        conversations: the chat template with the generation prompt) and left-padded.
    dataset : datasets.Dataset or list of dict
        Rows with a ``prompt_column`` (plain text or a list of messages) plus whatever the reward functions read.
    reward_funcs : list of callables
        TRL-signature reward functions, called as TRL calls them: ``f(prompts=, completions=, completion_ids=,
        trainer_state=, log_extra=, log_metric=, **columns) -> list[float | None]`` (async ones are awaited). The
        reward of a rollout is their weighted sum (``None`` -> skipped; all-``None`` -> unscorable, NaN).
        Completions of conversational prompts are ``[{"role": "assistant", "content": text}]``.
    num_generations, max_new_tokens, temperature, top_p, batch_prompts, seed
        Sampling settings.
    success_threshold, atol
        See :func:`trl_ext.measurement.shut_gate.shut_gate_stats`.
    prompt_column : str
        The prompt column (default ``"prompt"``).
    reward_weights : list of float, optional
        One weight per reward function (default 1 each).
    row_indices : list of int, optional
        The dataset row index of each row, stored in the records as ``row_index``.

    Returns
    -------
    stats : ShutGateStats
    records : list of dict
        One per prompt: ``prompt``, ``question_id`` (if present), ``row_index`` (if given), ``completions``,
        ``rewards``.

    Raises
    ------
    ValueError
        An empty dataset, a missing or ill-typed prompt, no pad token, a reward function returning the wrong number
        of values or non-numbers.
    """
    import numpy as np

    from .offline_sampling import check_prompt_rows, reward_funcs_and_weights, score_completions
    from .shut_gate import shut_gate_stats

    rows = [dict(r) for r in dataset]
    check_prompt_rows(rows, prompt_column, empty="nothing to measure",
                       hint="name the prompt column with --prompt_column / prompt_column=")
    if row_indices is not None and len(row_indices) != len(rows):
        raise ValueError(f"row_indices has {len(row_indices)} entries for {len(rows)} rows.")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token before measuring.")
    funcs, weights = reward_funcs_and_weights(reward_funcs, reward_weights)
    completions, completion_ids = _sample_gate_completions(
        model, tokenizer, rows, prompt_column, num_generations=num_generations, max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=top_p, batch_prompts=batch_prompts, seed=seed)
    rep_rows = [r for r in rows for _ in range(num_generations)]
    prompts = [r[prompt_column] for r in rep_rows]
    skip = set(_RESERVED) | {prompt_column}
    columns = {k: [r.get(k) for r in rep_rows] for k in rows[0] if k not in skip}
    rewards = np.asarray(score_completions(funcs, weights, prompts, completions, completion_ids, columns),
                         dtype=np.float64)
    gids = np.repeat(np.arange(len(rows)), num_generations)
    stats = shut_gate_stats(rewards, gids, success_threshold=success_threshold, atol=atol)
    return stats, _gate_records(rows, prompt_column, completions, rewards, num_generations, row_indices)


def _sample_gate_completions(model, tokenizer, rows: list[dict], prompt_column: str, *, num_generations: int,
                             max_new_tokens: int, temperature: float, top_p: float, batch_prompts: int,
                             seed: int) -> tuple[list, list[list[int]]]:
    """``(completions, completion_ids)``: ``num_generations`` sampled completions of every row, prompt by prompt
    (texts, or assistant messages for conversations), after ``torch.manual_seed(seed)``."""
    import torch

    from trl_ext.measurement.keyed_sampling import truncate_at_eos

    from .offline_sampling import eos_ids, prompt_token_ids

    torch.manual_seed(seed)
    device = next(model.parameters()).device
    pad = int(tokenizer.pad_token_id)
    eos = eos_ids(model, tokenizer)
    model.eval()
    completions: list = []
    completion_ids: list[list[int]] = []
    for start in range(0, len(rows), batch_prompts):
        chunk = [r[prompt_column] for r in rows[start:start + batch_prompts]]
        ids = prompt_token_ids(chunk, tokenizer)
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([[pad] * (width - len(x)) + list(x) for x in ids], dtype=torch.long, device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], dtype=torch.long, device=device)
        with torch.no_grad():
            gen = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=True, temperature=temperature,
                                 top_p=top_p, top_k=0, max_new_tokens=max_new_tokens,
                                 num_return_sequences=num_generations, pad_token_id=pad,
                                 eos_token_id=eos or None)
        comp = truncate_at_eos(gen[:, width:].cpu(), eos) if eos else gen[:, width:].cpu().tolist()
        texts = tokenizer.batch_decode(comp, skip_special_tokens=True)
        for j, text in enumerate(texts):
            p = chunk[j // num_generations]
            completions.append(text if not _is_conversation(p) else [{"role": "assistant", "content": text}])
        completion_ids += comp
    return completions, completion_ids


def _gate_records(rows: list[dict], prompt_column: str, completions: list, rewards, num_generations: int,
                  row_indices) -> list[dict]:
    """One record per prompt of :func:`measure_gate`: prompt, completion texts, rewards (NaN -> None), ids."""
    records = []
    for i, r in enumerate(rows):
        sl = slice(i * num_generations, (i + 1) * num_generations)
        texts = [c if isinstance(c, str) else c[0]["content"] for c in completions[sl]]
        rec = {"prompt": r[prompt_column], "completions": texts,
               "rewards": [None if math.isnan(v) else v for v in rewards[sl].tolist()]}
        if "question_id" in r:
            rec["question_id"] = r["question_id"]
        if row_indices is not None:
            rec["row_index"] = int(row_indices[i])
        records.append(rec)
    return records


def _fmt(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.4f}"


def _sample_rows(rows: list[dict], n: int, seed: int) -> tuple[list[int], list[dict]]:
    """``n`` rows drawn without replacement (all of them if there are fewer), kept in dataset order."""
    if n >= len(rows):
        return list(range(len(rows))), rows
    import numpy as np

    idx = sorted(int(i) for i in np.random.default_rng(seed).choice(len(rows), size=n, replace=False))
    return idx, [rows[i] for i in idx]


def _load_inputs(args):
    """(rows, row_indices, reward_funcs, source label); raises ValueError with a message for the user."""
    from trl_ext.refs import load_dataset_rows, resolve_callable

    funcs = [resolve_callable(ref, option="--reward") for ref in (args.reward or [])]
    if args.dataset is not None:
        rows = load_dataset_rows(args.dataset, split=args.split)
        if args.prompt_column not in rows[0]:
            raise ValueError(f"dataset {args.dataset!r} has no {args.prompt_column!r} column (columns: "
                             f"{sorted(rows[0])}); name the prompt column with --prompt_column.")
        idx, rows = _sample_rows(rows, args.num_prompts, args.seed)
        label = args.dataset + (f" [{args.split}]" if args.split else "")
        return rows, idx, funcs, label
    from trl_ext import registry

    task, split = args.task or "addition", args.split or "train"
    builtin = registry.get_dataset(task, source="testbed")
    rows = [dict(r) for r in builtin.make(split, args.num_prompts, args.seed)]
    return rows, list(range(len(rows))), funcs or builtin.default_rewards(), f"{task}/{split}"


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
    try:
        rows, row_indices, reward_funcs, source = _load_inputs(args)
    except ValueError as e:
        print(f"trl-ext gate: {e}", file=sys.stderr)
        return 2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True)
    except (OSError, ValueError) as e:
        print(f"trl-ext gate: cannot load --model {args.model!r}: {e}", file=sys.stderr)
        return 2
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token  # as TRL does
    try:
        stats, records = measure_gate(
            model, tokenizer, rows, reward_funcs, num_generations=args.num_generations,
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
            batch_prompts=args.batch_prompts, success_threshold=args.success_threshold, atol=args.atol,
            seed=args.seed, prompt_column=args.prompt_column, reward_weights=args.reward_weights,
            row_indices=row_indices,
        )
    except (ValueError, TypeError) as e:
        print(f"trl-ext gate: {e}", file=sys.stderr)
        return 2
    print(f"shut gate of {args.model} on {source}: {len(rows)} prompts x "
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

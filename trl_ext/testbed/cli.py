"""``trl-ext warmup``: build (or load) the cached warmed-up tiny testbed model and print its path and accuracy.

Heavy imports (torch, transformers) happen inside :func:`main` only, so ``trl-ext --help`` stays fast.
"""

from __future__ import annotations

import argparse

TASK_NAMES = ("addition", "substitution", "scratchpad")  # kept in sync with trl_ext.testbed.TASKS (checked by the tests)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``warmup`` options on ``parser``."""
    parser.add_argument("--task", choices=TASK_NAMES, default="addition", help="testbed task (default addition)")
    parser.add_argument("--seed", type=int, default=0, help="model init and data-order seed (default 0)")
    parser.add_argument("--cache_dir", default=None,
                        help="cache root (default $TRL_EXT_CACHE or ~/.cache/trl_ext/testbed)")
    parser.add_argument("--max_steps", type=int, default=None, help="cap on SFT steps (default 1500; scratchpad 4000; early stop)")
    parser.add_argument("--n_eval", type=int, default=200, help="held-out questions to evaluate (default 200)")
    parser.add_argument("--quiet", action="store_true", help="do not print warm-up progress")


def main(args: argparse.Namespace) -> int:
    """Build or load the warm model, evaluate held-out greedy and sampled accuracy, print them. Returns 0."""
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import TASKS, evaluate_model, get_warm_model, make_dataset, split_size

    if args.seed < 0 or (args.max_steps is not None and args.max_steps < 0) or args.n_eval < 1:
        raise SystemExit("--seed and --max_steps must be >= 0 and --n_eval >= 1")
    torch.set_num_threads(1)
    path = get_warm_model(args.task, seed=args.seed, cache_dir=args.cache_dir, max_steps=args.max_steps,
                          verbose=not args.quiet)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    n = min(args.n_eval, split_size(args.task, "test"))
    test = make_dataset(args.task, n, seed=0, split="test")
    max_new = TASKS[args.task].max_answer_chars() + 2
    greedy = evaluate_model(model, tok, test, args.task, max_new_tokens=max_new)
    sampled = evaluate_model(model, tok, test, args.task, greedy=False, num_samples=4, max_new_tokens=max_new)
    print(path)
    print(f"task {args.task}, seed {args.seed}: held-out accuracy on {n} questions: greedy {greedy.accuracy:.3f}, "
          f"sampled (T=1, 4/question) {sampled.accuracy:.3f}")
    return 0

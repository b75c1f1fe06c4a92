"""``trl-ext build-value-table``: sample reference completions per training prompt and write a BASIS value table.

Examples
--------
On the offline testbed (the reward is the task's own)::

    trl-ext build-value-table --model out/warm --task addition --split train --num_prompts 512 \\
        --num_samples 32 --output table.jsonl

On your own data (rows with a ``prompt`` column plus whatever the reward needs; a ``.jsonl`` / ``.json`` / ``.csv`` /
``.parquet`` file or a ``datasets`` ``save_to_disk`` folder)::

    trl-ext build-value-table --model Qwen/Qwen2.5-Math-7B --dataset train.jsonl \\
        --reward my_rewards:accuracy --reward_range 0 1 --num_samples 32 --max_new_tokens 2048 --output table.jsonl

``--reward`` is ``package.module:function`` (the current directory is importable) or ``path/to/file.py:function``
and may be repeated (weights with ``--reward_weights``). Re-running the same command resumes an interrupted build;
the table is marked complete (row count and content hash in its header) only when every prompt is in it, and an
unfinished table is refused by the loaders. Exit status: 0 on success, 2 on bad input (missing file, bad reward
spec, wrong settings, a table built with other settings).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``build-value-table`` options."""
    parser.add_argument("--model", required=True, help="Reference policy: a local path (or an id vLLM can load).")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--task", default=None, help="Testbed task (trl_ext.testbed.make_dataset), e.g. 'addition'.")
    src.add_argument("--dataset", default=None,
                     help="Your dataset: a .jsonl/.json/.csv/.parquet file or a datasets save_to_disk folder, or a "
                          "reasoning-gym spec reasoning_gym:<task>[:options] (its --split; default reward: the task's "
                          "scorer).")
    parser.add_argument("--split", default="train",
                        help="Testbed split (train/test; default train), or the split of a saved DatasetDict.")
    parser.add_argument("--num_prompts", "--num-prompts", dest="num_prompts", type=int, default=None,
                        help="Testbed: number of prompts (required with --task). --dataset: use only the first N rows.")
    parser.add_argument("--dataset_seed", "--dataset-seed", dest="dataset_seed", type=int, default=0,
                        help="Testbed: seed choosing the prompts (use the training run's; default 0).")
    parser.add_argument("--reward", action="append", default=None, metavar="REF",
                        help="Reward function: 'package.module:function' or 'path/to/file.py:function' "
                             "(repeatable). Default with --task: the task's reward functions.")
    parser.add_argument("--reward_weights", "--reward-weights", dest="reward_weights", type=float, nargs="+",
                        default=None, help="One weight per --reward (default 1 each).")
    parser.add_argument("--reward_range", "--reward-range", dest="reward_range", type=float, nargs=2,
                        default=None, metavar=("LOW", "HIGH"), help="Declared reward range (default 0 1).")
    parser.add_argument("--prompt_column", "--prompt-column", dest="prompt_column", default="prompt")
    parser.add_argument("--num_samples", "--num-samples", dest="num_samples", type=int, default=32,
                        help="Reference samples per prompt (paper: 32 or 64; default 32).")
    parser.add_argument("--training_config", "--training-config", dest="training_config", default=None,
                        help="The training run's config (a JSON or YAML file of GRPOConfig fields, e.g. the --config "
                             "file of a TRL script): its max_completion_length, temperature and top_p become the "
                             "defaults of --max_new_tokens, --temperature and --top_p, so the table is sampled as "
                             "training samples (BASIS refuses a table sampled otherwise).")
    parser.add_argument("--max_new_tokens", "--max-new-tokens", dest="max_new_tokens", type=int, default=None,
                        help="Completion cap (default: --training_config's max_completion_length, else the testbed "
                             "answer length + 1, else 512 = TRL's GRPOConfig default).")
    parser.add_argument("--temperature", type=float, default=None,
                        help="Sampling temperature (default: --training_config's, else 1.0 = TRL's).")
    parser.add_argument("--top_p", "--top-p", dest="top_p", type=float, default=None,
                        help="Nucleus mass (default: --training_config's, else 1.0 = TRL's).")
    parser.add_argument("--batch_size", "--batch-size", dest="batch_size", type=int, default=64,
                        help="Sequences per generate call (transformers) / prompts per call (vLLM).")
    parser.add_argument("--seed", type=int, default=0, help="Sampling seed (default 0).")
    parser.add_argument("--output", required=True, help="Output value table (.jsonl).")
    parser.add_argument("--use_vllm", "--use-vllm", dest="use_vllm", choices=("auto", "true", "false"),
                        default="auto", help="auto: vLLM if installed and a GPU is present (default).")
    parser.add_argument("--sampler", choices=("keyed", "multinomial"), default="keyed",
                        help="transformers sampler (default keyed: batch-independent noise).")
    parser.add_argument("--device", default=None, help="torch device for transformers (default cuda if available).")
    parser.add_argument("--max_prompts", "--max-prompts", dest="max_prompts", type=int, default=None,
                        help="Write at most this many new rows, then stop (re-run to continue).")
    parser.add_argument("--overwrite", action="store_true", help="Delete an existing --output first.")
    parser.add_argument("--no_resume", "--no-resume", dest="no_resume", action="store_true",
                        help="Refuse to continue an existing --output.")
    parser.add_argument("--no_progress", "--no-progress", dest="no_progress", action="store_true")


def load_reward(spec: str):
    """Resolve ``package.module:function`` or ``path/to/file.py:function`` with the resolver every ``trl-ext``
    command uses (:func:`trl_ext.refs.resolve_callable`; the current directory is importable).

    Raises
    ------
    ValueError
        On a malformed spec, a missing module/file/attribute, or a non-callable attribute; the message names the
        accepted forms.
    """
    from trl_ext.refs import resolve_callable

    return resolve_callable(spec, option="--reward")


def read_jsonl(path: str) -> list[dict]:
    """Rows of a JSON Lines file (:func:`trl_ext._io.read_jsonl`: blank lines skipped, one object per line); errors
    name the line, and an empty file is an error."""
    from .._io import read_jsonl as _read_jsonl

    rows = _read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: no rows.")
    return rows


TRL_DEFAULT_MAX_COMPLETION_LENGTH = 512
"""``trl.GRPOConfig().max_completion_length`` in TRL 1.16: the cap a table is sampled with when nothing says otherwise."""


def _apply_training_config(args: argparse.Namespace) -> None:
    """Fill ``--max_new_tokens`` / ``--temperature`` / ``--top_p`` left unset from ``--training_config`` (JSON or
    YAML), then from TRL's defaults (temperature 1, top-p 1; the cap's default depends on the task)."""
    if args.training_config:
        path = args.training_config
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ValueError(f"--training_config {path!r}: cannot be read ({e.strerror or e}).") from None
        if path.endswith((".yaml", ".yml")):
            import yaml

            cfg = yaml.safe_load(text)
        else:
            import json

            try:
                cfg = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"--training_config {path}: not valid JSON at line {e.lineno} ({e.msg}); pass a "
                                 "JSON or .yaml file of GRPOConfig fields.") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"--training_config {path}: expected a mapping of GRPOConfig fields.")
        for flag, key in (("max_new_tokens", "max_completion_length"), ("temperature", "temperature"),
                          ("top_p", "top_p")):
            if getattr(args, flag) is None and cfg.get(key) is not None:
                setattr(args, flag, (int if flag == "max_new_tokens" else float)(cfg[key]))
    args.temperature = 1.0 if args.temperature is None else args.temperature
    args.top_p = 1.0 if args.top_p is None else args.top_p


def _check_model_argument(model: str) -> None:
    """A ``--model`` that looks like a local path (absolute, ``./``, ``~``, or with an OS separator beyond one Hub
    ``namespace/name``) must exist: otherwise transformers reports a Hub repo-id error that never names the path."""
    import os

    expanded = os.path.expanduser(model)
    looks_local = os.path.isabs(expanded) or model.startswith((".", "~")) or model.count("/") > 1 \
        or (os.sep != "/" and os.sep in model)
    if looks_local and not os.path.exists(expanded):
        raise ValueError(f"--model {model!r}: no such local folder (nothing is downloaded from the Hub here). Pass the "
                         "folder of a saved model (save_pretrained; `trl-ext fetch-real-model` prints SmolLM2's).")
    if os.path.exists(expanded) and not os.path.isdir(expanded):
        raise ValueError(f"--model {model!r} is a file; pass the model's folder (the one holding config.json).")


def main(args: argparse.Namespace) -> int:
    """Run ``trl-ext build-value-table``; see the module docstring."""
    import os
    import time

    from trl_ext.priors.value_table import build_value_table

    prog = "trl-ext build-value-table"
    try:
        _check_model_argument(args.model)
        _apply_training_config(args)
        if args.task is not None:
            from trl_ext import registry

            if args.num_prompts is None:
                raise ValueError("--num_prompts is required with --task.")
            task = registry.get_dataset(args.task, source="testbed")
            dataset = task.make(args.split, args.num_prompts, args.dataset_seed)
            funcs = [load_reward(s) for s in args.reward] if args.reward else task.default_rewards()
            max_new = args.max_new_tokens or task.max_answer_chars + 1
            ds_name = f"testbed:{args.task}/{args.split}/n={args.num_prompts}/seed={args.dataset_seed}"
        elif args.dataset.startswith("reasoning_gym:"):
            from trl_ext.external_tasks.reasoning_gym import make_rg_dataset, rg_accuracy_reward

            dataset = make_rg_dataset(args.dataset, args.split, args.num_prompts, seed=args.dataset_seed)
            funcs = [load_reward(s) for s in args.reward] if args.reward else [rg_accuracy_reward]
            max_new = args.max_new_tokens or TRL_DEFAULT_MAX_COMPLETION_LENGTH
            ds_name = f"{args.dataset}/{args.split}/n={len(dataset)}/seed={args.dataset_seed}"
        else:
            from trl_ext.refs import ACCEPTED_FORMS, load_dataset_rows

            if not args.reward:
                raise ValueError(f"--dataset needs at least one --reward: {ACCEPTED_FORMS}.")
            funcs = [load_reward(s) for s in args.reward]
            dataset = load_dataset_rows(args.dataset, split=args.split if os.path.isdir(args.dataset) else None)
            if args.num_prompts is not None:
                if args.num_prompts < 1:
                    raise ValueError("--num_prompts must be >= 1.")
                dataset = dataset[: args.num_prompts]
            max_new = args.max_new_tokens or TRL_DEFAULT_MAX_COMPLETION_LENGTH
            ds_name = os.path.abspath(args.dataset)
        if args.overwrite and os.path.exists(args.output):
            os.remove(args.output)
        t0 = time.monotonic()
        table = build_value_table(
            args.model,
            None,
            dataset,
            funcs,
            args.output,
            num_samples=args.num_samples,
            max_new_tokens=max_new,
            temperature=args.temperature,
            top_p=args.top_p,
            batch_size=args.batch_size,
            seed=args.seed,
            prompt_column=args.prompt_column,
            resume=not args.no_resume,
            reward_weights=args.reward_weights,
            reward_range=tuple(args.reward_range) if args.reward_range else None,
            use_vllm={"auto": "auto", "true": True, "false": False}[args.use_vllm],
            sampler=args.sampler,
            max_prompts=args.max_prompts,
            metadata={"dataset": ds_name},
            device=args.device,
            progress=not args.no_progress,
        )
    except (OSError, ValueError, TypeError, ImportError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 2
    st = table.metadata.get("build_stats", {})
    means = [r.mean_reward for r in table]
    overall = sum(means) / len(means) if means else float("nan")
    print(f"{prog}: {args.output}: {len(table)} prompts ({st.get('n_written', 0)} new, "
          f"{st.get('n_already_done', 0)} already done{', stopped early' if st.get('stopped_early') else ''}), "
          f"mean reward {overall:.4f}, {st.get('n_nan_samples', 0)} NaN samples, {time.monotonic() - t0:.1f}s")
    if st.get("complete"):
        print(f"{prog}: complete: {len(table)} rows, content sha256 {table.content_hash}")
    else:
        print(f"{prog}: INCOMPLETE (stopped early by --max_prompts): the table is marked in progress and loaders "
              "refuse it; re-run this command with the same arguments to continue, until every prompt is in it.")
    return 0

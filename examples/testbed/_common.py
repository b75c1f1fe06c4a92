"""Helpers shared by the example scripts (argument parsing, CPU setup, trainer registry loading, output).

Every example accepts ``--output_dir``, ``--max_steps`` and ``--seed`` (:func:`add_common_args`) and leaves the
standard ``trainer_state.json`` (with ``log_history``) in ``--output_dir``.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import import_module

from trl_ext._argtypes import nonneg_int as _nonneg_int
from trl_ext._argtypes import positive_float  # noqa: F401  (re-exported for the example scripts)
from trl_ext._argtypes import positive_int as _positive_int
from trl_ext._io import write_json  # noqa: F401  (re-exported for the example scripts)

# CPU-only, offline defaults; set before torch/transformers are imported by the caller.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")


def add_common_args(parser: argparse.ArgumentParser, *, output_dir: str, max_steps: int, seed: int = 0):
    """Add ``--output_dir``, ``--max_steps``, ``--seed``, ``--num_threads`` and ``--cache_dir`` to ``parser``."""
    parser.add_argument("--output_dir", default=output_dir, help=f"where outputs are written (default {output_dir})")
    parser.add_argument("--max_steps", type=_positive_int, default=max_steps,
                        help=f"optimizer steps to train (default {max_steps})")
    parser.add_argument("--seed", type=_nonneg_int, default=seed, help=f"random seed (default {seed})")
    parser.add_argument("--num_threads", type=_positive_int, default=1,
                        help="torch threads per process (default 1: the testbed is tiny and CPUs are shared)")
    parser.add_argument("--cache_dir", default=None,
                        help="warm-model cache root (default $TRL_EXT_CACHE or ~/.cache/trl_ext/testbed)")
    return parser




def setup_torch(num_threads: int = 1) -> None:
    """Limit torch's intra-op threads (several ranks and engineers share few cores)."""
    import torch

    torch.set_num_threads(num_threads)


def load_object(spec: str):
    """Import ``"package.module:attr"``."""
    module, _, attr = spec.partition(":")
    return getattr(import_module(module), attr)


def world_info() -> tuple[int, int]:
    """``(rank, world_size)`` from the launcher's environment (``torchrun`` / ``accelerate launch``)."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def log(msg: str) -> None:
    """Print on the main process only, flushed."""
    if world_info()[0] == 0:
        print(msg, flush=True)
        sys.stdout.flush()


def shutdown_distributed() -> None:
    """Destroy the process group at the end of a multi-process run (a gloo rank can otherwise abort at exit)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


SUMMARY_SCHEMA = "trl_ext.testbed_summary/v1"
"""The one ``summary.json`` schema of every testbed example (quickstart, basis, v05_grpo, pair)."""


def write_run_outputs(output_dir: str, *, trainer: str, task: str, before, after, curve, train_tokens: int,
                      train_rollouts: int | None, wall_total: float, wall_train: float, world: int, warm_model: str,
                      config: dict, method: dict | None = None) -> dict:
    """Write a testbed example's outputs in the one schema (:data:`SUMMARY_SCHEMA`).

    ``before`` / ``after``: ``(greedy, sampled)`` :class:`trl_ext.testbed.EvalResult` pairs; ``curve``: ``(step,
    training completion tokens, greedy, sampled)`` points (start and end at least). Writes
    ``outcomes_{before,after}_{greedy,sampled}.jsonl`` (per-question outcomes, the format ``trl-ext compare``
    reads), ``summary.json`` and ``accuracy_vs_tokens.png`` (skipped with a message without matplotlib). Keys common
    to every trainer: schema, task, trainer, accuracy_before/after {greedy, sampled}, generated_tokens, curve,
    outcomes, wall_time_s, world_size, warm_model (the folder's name, no machine path), config; ``method`` holds what
    only that trainer has (BASIS's beta history, V0.5's OSLA counters, PAIR's prefix tokens and design diagnostics).
    """
    from trl_ext.testbed import write_outcomes_jsonl

    outcomes = {}
    for tag, res in (("before", before), ("after", after)):
        for mode, r in zip(("greedy", "sampled"), res):
            name = f"outcomes_{tag}_{mode}.jsonl"
            write_outcomes_jsonl(os.path.join(output_dir, name), r.records)
            outcomes[f"{tag}_{mode}"] = name
    summary = {
        "schema": SUMMARY_SCHEMA,
        "task": task,
        "trainer": trainer,
        "accuracy_before": {"greedy": before[0].accuracy, "sampled": before[1].accuracy},
        "accuracy_after": {"greedy": after[0].accuracy, "sampled": after[1].accuracy},
        "generated_tokens": {"train_completion_tokens": int(round(train_tokens)),
                             "train_rollouts": None if train_rollouts is None else int(train_rollouts),
                             "eval_tokens_before": before[0].generated_tokens + before[1].generated_tokens,
                             "eval_tokens_after": after[0].generated_tokens + after[1].generated_tokens},
        "curve": [{"step": st, "generated_tokens": t, "greedy": g, "sampled": sa} for st, t, g, sa in curve],
        "outcomes": outcomes,
        "wall_time_s": {"total": wall_total, "train": wall_train},
        "world_size": world,
        "warm_model": os.path.basename(os.path.normpath(warm_model)),
        "method": method or {},
        "config": config,
    }
    write_json(os.path.join(output_dir, "summary.json"), summary)
    try:
        plot_curve(curve, os.path.join(output_dir, "accuracy_vs_tokens.png"), trainer, task)
    except ImportError as e:
        log(f"no plot: {e}")
    return summary


def plot_curve(points, path: str, label: str, task: str) -> None:
    """Held-out greedy and sampled accuracy against training completion tokens generated."""
    from trl_ext._plots import pyplot

    plt = pyplot("accuracy_vs_tokens.png")
    pts = sorted(points, key=lambda p: p[0])
    x = [p[1] for p in pts]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(x, [p[2] for p in pts], "o-", label=f"{label}: greedy")
    ax.plot(x, [p[3] for p in pts], "s--", label=f"{label}: sampled (T=1)")
    ax.set_xlabel("training completion tokens generated")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{task}: held-out accuracy vs generated tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


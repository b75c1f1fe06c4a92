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

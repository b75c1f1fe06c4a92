"""``argparse`` value types shared by the example scripts, the benchmarks and the CLI."""

from __future__ import annotations

import argparse
import math

__all__ = ["positive_int", "nonneg_int", "positive_float"]


def positive_int(text: str) -> int:
    """An integer >= 1."""
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return v


def nonneg_int(text: str) -> int:
    """An integer >= 0."""
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return v


def positive_float(text: str) -> float:
    """A finite float > 0."""
    v = float(text)
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v

"""The value-table builder's own input checks (:func:`~trl_ext.priors.value_table.build_value_table`): reward
functions and weights, the declared reward range, the sampling settings and the distinct prompts of a dataset. The
prompt checks and the TRL-style reward call it shares with ``trl-ext gate`` and ``advise`` are in
:mod:`trl_ext.measurement.offline_sampling`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from .table_format import prompt_key

__all__ = ["DEFAULT_REWARD_RANGE", "check_build_settings", "check_range", "check_reward_funcs", "distinct_prompts"]

#: Reward range assumed when none is declared: binary {0, 1} verifiers.
DEFAULT_REWARD_RANGE: tuple[float, float] = (0.0, 1.0)


def check_reward_funcs(reward_funcs: Any, reward_weights: Any) -> tuple[list[Callable], list[float]]:
    if callable(reward_funcs):
        reward_funcs = [reward_funcs]
    if not isinstance(reward_funcs, Sequence) or isinstance(reward_funcs, str) or not reward_funcs:
        raise ValueError("reward_funcs must be a reward function or a non-empty list of them "
                         "(TRL signature f(prompts, completions, **columns) -> list[float | None]).")
    funcs = list(reward_funcs)
    for f in funcs:
        if isinstance(f, str):
            raise TypeError(f"reward function {f!r} is a string; load reward models yourself and pass a callable "
                            "f(prompts, completions, **columns) (reward-model ids are not supported by the builder).")
        if not callable(f):
            raise TypeError(f"reward function {f!r} is not callable.")
        try:
            import torch.nn as nn

            if isinstance(f, nn.Module):
                raise TypeError(f"reward function {type(f).__name__} is a torch Module (a reward model); wrap it in a "
                                "function f(prompts, completions, **columns) -> list[float] to use it here.")
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
    if reward_weights is None:
        weights = [1.0] * len(funcs)
    else:
        weights = list(reward_weights)
        if len(weights) != len(funcs):
            raise ValueError(f"reward_weights has {len(weights)} entries but there are {len(funcs)} reward functions.")
        for w in weights:
            if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w):
                raise ValueError(f"reward_weights must be finite numbers, got {reward_weights!r}.")
        weights = [float(w) for w in weights]
    return funcs, weights


def check_range(reward_range: Any) -> tuple[float, float]:
    if reward_range is None:
        return DEFAULT_REWARD_RANGE
    try:
        low, high = (float(v) for v in reward_range)
    except (TypeError, ValueError) as e:
        raise ValueError(f"reward_range must be a pair (low, high), got {reward_range!r}.") from e
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"reward_range must be finite with low < high, got {reward_range!r}.")
    return low, high


def check_build_settings(*, num_samples, max_new_tokens, batch_size, temperature, top_p, seed, sampler,
                          max_prompts) -> None:
    """The sampling settings of :func:`build_value_table`; ``ValueError`` naming the first bad one."""
    for name, val in (("num_samples", num_samples), ("max_new_tokens", max_new_tokens), ("batch_size", batch_size)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}.")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not (
            math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r} (reference sampling needs "
                         "randomness; the paper uses 1.0).")
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}.")
    if sampler not in ("keyed", "multinomial"):
        raise ValueError(f"sampler must be 'keyed' or 'multinomial', got {sampler!r}.")
    if max_prompts is not None and (isinstance(max_prompts, bool) or not isinstance(max_prompts, int)
                                    or max_prompts < 0):
        raise ValueError(f"max_prompts must be None or a non-negative int, got {max_prompts!r}.")


def distinct_prompts(rows: list[dict], prompt_column: str) -> tuple[list[str], list[int], int]:
    """``(keys, unique_idx, n_dup)``: every row's prompt key, the first row of each distinct prompt and the number of
    repeats. Raises ``ValueError`` when a repeated prompt comes with other reward columns."""
    keys = [prompt_key(r[prompt_column]) for r in rows]
    first_of: dict[str, int] = {}
    unique_idx: list[int] = []
    n_dup = 0
    for i, k in enumerate(keys):
        j = first_of.get(k)
        if j is None:
            first_of[k] = i
            unique_idx.append(i)
            continue
        a = {c: v for c, v in rows[i].items() if c != prompt_column}
        b = {c: v for c, v in rows[j].items() if c != prompt_column}
        a.pop("question_id", None)
        b.pop("question_id", None)
        if a != b:
            raise ValueError(f"dataset rows {j} and {i} have the same prompt ({str(rows[i][prompt_column])[:60]!r}) "
                             "but different reward columns; one prompt can only have one value. Deduplicate the "
                             "dataset or make the prompts distinct.")
        n_dup += 1
    return keys, unique_idx, n_dup

"""Prompts, datasets and reward functions for the offline samplers (value tables, ``trl-ext gate``, ``trl-ext advise``).

The checks and the TRL-style reward call that :func:`~trl_ext.priors.value_table.build_value_table` shares with
:mod:`trl_ext.measurement.gate_cli` and :mod:`trl_ext.advise`: a dataset as a list of dict rows with valid prompts
(text or a conversation), reward functions and weights, and :func:`_score`, the weighted per-completion reward
computed the way TRL's ``GRPOTrainer`` computes it. Every name is importable from
:mod:`trl_ext.priors.value_table` as well.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .table_format import prompt_key

__all__ = ["DEFAULT_REWARD_RANGE", "reward_func_name"]

#: Reward range assumed when none is declared: binary {0, 1} verifiers.
DEFAULT_REWARD_RANGE: tuple[float, float] = (0.0, 1.0)


def reward_func_name(func: Any) -> str:
    """Name recorded for a reward function, as TRL's ``GRPOTrainer`` names it (``__name__``; a
    ``functools.partial`` uses the wrapped function's name; other callables their class name)."""
    inner = getattr(func, "func", None)  # functools.partial
    for f in (func, inner):
        name = getattr(f, "__name__", None)
        if isinstance(name, str) and name:
            return name
    return type(func).__name__



def _is_conversation(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, Mapping) for m in prompt)


def _check_prompt(prompt: Any, index: int, column: str) -> None:
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"dataset row {index}: column {column!r} is an empty string; every prompt needs text.")
        return
    if _is_conversation(prompt) and prompt:
        for m in prompt:
            if "role" not in m or "content" not in m:
                raise ValueError(f"dataset row {index}: every message needs 'role' and 'content', got {dict(m)!r:.120}")
        return
    raise ValueError(
        f"dataset row {index}: column {column!r} must be a non-empty str or a list of message dicts, "
        f"got {type(prompt).__name__}: {prompt!r:.80}"
    )


def _check_prompt_rows(rows: list[dict], prompt_column: str, *, empty: str, hint: str) -> None:
    """The dataset check shared by value tables and ``trl-ext gate``: at least one row, and every row has a valid
    prompt (:func:`_check_prompt`) in ``prompt_column``.

    ``empty`` ends the message for an empty dataset (why it cannot be), ``hint`` the one for a missing column (how to
    name the prompt column in the caller's interface). Raises ``ValueError``.
    """
    if not rows:
        raise ValueError(f"the dataset is empty; {empty}.")
    if prompt_column not in rows[0]:
        raise ValueError(f"the dataset has no {prompt_column!r} column (columns: {sorted(rows[0])}); {hint}.")
    for i, r in enumerate(rows):
        if prompt_column not in r:
            raise ValueError(f"dataset row {i} has no {prompt_column!r} column.")
        _check_prompt(r[prompt_column], i, prompt_column)


def _dataset_rows(dataset: Any, prompt_column: str) -> list[dict]:
    """Rows of a ``datasets.Dataset``, a list of dicts or a dict of columns, as a list of dicts."""
    if isinstance(dataset, Mapping):  # dict of columns
        cols = {k: list(v) for k, v in dataset.items()}
        lengths = {k: len(v) for k, v in cols.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"dataset columns have different lengths: {lengths}")
        n = next(iter(lengths.values()), 0)
        rows = [{k: v[i] for k, v in cols.items()} for i in range(n)]
    elif hasattr(dataset, "column_names") and hasattr(dataset, "__getitem__"):  # datasets.Dataset
        rows = [dict(r) for r in dataset]
    elif isinstance(dataset, Sequence) and not isinstance(dataset, str | bytes):
        rows = list(dataset)
        for i, r in enumerate(rows):
            if not isinstance(r, Mapping):
                raise TypeError(f"dataset row {i} is a {type(r).__name__}; pass dict rows, a dict of columns or a "
                                "datasets.Dataset.")
        rows = [dict(r) for r in rows]
    else:
        raise TypeError(f"dataset must be a datasets.Dataset, a list of dict rows or a dict of columns, got "
                        f"{type(dataset).__name__}.")
    _check_prompt_rows(rows, prompt_column, empty="a value table needs at least one prompt",
                       hint="pass prompt_column=<the prompt column>")
    return rows


def _check_reward_funcs(reward_funcs: Any, reward_weights: Any) -> tuple[list[Callable], list[float]]:
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


def _check_range(reward_range: Any) -> tuple[float, float]:
    if reward_range is None:
        return DEFAULT_REWARD_RANGE
    try:
        low, high = (float(v) for v in reward_range)
    except (TypeError, ValueError) as e:
        raise ValueError(f"reward_range must be a pair (low, high), got {reward_range!r}.") from e
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"reward_range must be finite with low < high, got {reward_range!r}.")
    return low, high


def _noop(*args, **kwargs) -> None:
    return None


def _call_reward(func: Callable, **kwargs) -> list:
    out = func(**kwargs)  # an async function returns a coroutine, awaited below
    if inspect.isawaitable(out):
        return asyncio.run(_await(out))
    return out


async def _await(x):
    return await x


def _score(
    funcs: Sequence[Callable],
    weights: Sequence[float],
    prompts: list,
    completions: list,
    completion_ids: list[list[int]],
    columns: dict[str, list],
) -> list[float]:
    """Weighted reward per completion, TRL style: ``nansum_f(w_f * r_f)``; NaN only when every function gives
    None/NaN (TRL's "unscorable" rows). Raises on a wrong output length or a non-numeric reward."""
    from transformers import TrainerState

    n = len(completions)
    per_func = []
    for f in funcs:
        name = reward_func_name(f)
        try:
            out = _call_reward(f, prompts=prompts, completions=completions, completion_ids=completion_ids,
                               trainer_state=TrainerState(), log_extra=_noop, log_metric=_noop, **columns)
        except TypeError as e:
            raise TypeError(f"reward function {name!r} failed: {e}. Reward functions are called like TRL does: "
                            "f(prompts=, completions=, completion_ids=, trainer_state=, log_extra=, log_metric=, "
                            "**dataset_columns); give it **kwargs.") from e
        try:
            out = list(out)
        except TypeError as e:
            raise ValueError(f"reward function {name!r} returned {type(out).__name__}, expected a list.") from e
        if len(out) != n:
            raise ValueError(f"reward function {name!r} returned {len(out)} rewards for {n} completions; it must "
                             "return one reward per completion.")
        vals = []
        for v in out:
            if v is None:
                vals.append(math.nan)
                continue
            try:
                vals.append(float(v))
            except (TypeError, ValueError) as e:
                raise ValueError(f"reward function {name!r} returned a non-numeric reward {v!r}.") from e
        per_func.append(vals)
    combined = []
    for j in range(n):
        terms = [w * col[j] for w, col in zip(weights, per_func) if not math.isnan(col[j])]
        combined.append(math.fsum(terms) if terms else math.nan)
    return combined


def _check_build_settings(*, num_samples, max_new_tokens, batch_size, temperature, top_p, seed, sampler,
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


def _distinct_prompts(rows: list[dict], prompt_column: str) -> tuple[list[str], list[int], int]:
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

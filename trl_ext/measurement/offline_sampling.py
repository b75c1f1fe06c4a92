"""Offline sampling as TRL's ``GRPOTrainer`` samples and scores, shared by every tool that samples a model outside
training: the value-table builder (:mod:`trl_ext.priors.value_table`), ``trl-ext gate``, ``trl-ext advise`` (and its
scorer noise floor).

Prompts (:func:`is_conversation`, :func:`check_prompt_rows`, :func:`dataset_rows`), their token ids as TRL builds
them (:func:`prompt_token_ids`, :func:`render_prompts`, :func:`eos_ids`), the generation backends (keyed Gumbel-max
and multinomial sampling with transformers, seeded vLLM requests; :func:`import_vllm`) and the TRL-style reward call
(:func:`call_reward`, :func:`score_completions`). It lives next to :mod:`~trl_ext.measurement.keyed_sampling`, the
sampler it builds on, so that ``measurement`` needs nothing from ``priors``. Light to import: torch, transformers and
vLLM are imported inside the functions that use them.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "call_reward",
    "check_prompt",
    "check_prompt_rows",
    "dataset_rows",
    "discard_log",
    "eos_ids",
    "generate_keyed",
    "generate_multinomial",
    "generate_vllm_requests",
    "import_vllm",
    "is_conversation",
    "prompt_token_ids",
    "render_prompts",
    "reward_func_name",
    "score_completions",
]


def import_vllm():
    """The ``vllm`` module, or None if it is not installed (tests replace this function with a stand-in)."""
    try:
        import vllm  # type: ignore[import-not-found]
    except ImportError:
        return None
    return vllm


# ------------------------------------------------------------------------------------------------------- prompts
def is_conversation(prompt: Any) -> bool:
    """Whether ``prompt`` is a conversation (a list of message mappings) rather than plain text."""
    return isinstance(prompt, list) and all(isinstance(m, Mapping) for m in prompt)


def check_prompt(prompt: Any, index: int, column: str) -> None:
    """``ValueError`` unless ``prompt`` (row ``index``, column ``column``) is non-empty text or a conversation of
    messages with ``role`` and ``content``."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"dataset row {index}: column {column!r} is an empty string; every prompt needs text.")
        return
    if is_conversation(prompt) and prompt:
        for m in prompt:
            if "role" not in m or "content" not in m:
                raise ValueError(f"dataset row {index}: every message needs 'role' and 'content', got {dict(m)!r:.120}")
        return
    raise ValueError(
        f"dataset row {index}: column {column!r} must be a non-empty str or a list of message dicts, "
        f"got {type(prompt).__name__}: {prompt!r:.80}"
    )


def check_prompt_rows(rows: list[dict], prompt_column: str, *, empty: str, hint: str) -> None:
    """The dataset check shared by value tables and ``trl-ext gate``: at least one row, and every row has a valid
    prompt (:func:`check_prompt`) in ``prompt_column``.

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
        check_prompt(r[prompt_column], i, prompt_column)


def dataset_rows(dataset: Any, prompt_column: str, *, empty: str, hint: str) -> list[dict]:
    """Rows of a ``datasets.Dataset``, a list of dicts or a dict of columns, as a list of dicts, checked by
    :func:`check_prompt_rows` (``empty`` and ``hint`` are its messages)."""
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
    check_prompt_rows(rows, prompt_column, empty=empty, hint=hint)
    return rows


# ------------------------------------------------------------------------------------------------------- rewards
def reward_func_name(func: Any) -> str:
    """Name recorded for a reward function, as TRL's ``GRPOTrainer`` names it (``__name__``; a
    ``functools.partial`` uses the wrapped function's name; other callables their class name)."""
    inner = getattr(func, "func", None)  # functools.partial
    for f in (func, inner):
        name = getattr(f, "__name__", None)
        if isinstance(name, str) and name:
            return name
    return type(func).__name__


def reward_funcs_and_weights(reward_funcs: Sequence[Callable], reward_weights: Sequence[float] | None
                             ) -> tuple[list, list[float]]:
    """``(funcs, weights)``: the reward functions as a list and one float weight each (``None``: 1.0 each, TRL's
    default). Raises ``ValueError`` for no functions or a weight count that does not match."""
    funcs = list(reward_funcs)
    if not funcs:
        raise ValueError("no reward functions given.")
    weights = [1.0] * len(funcs) if reward_weights is None else [float(w) for w in reward_weights]
    if len(weights) != len(funcs):
        raise ValueError(f"{len(weights)} reward weights for {len(funcs)} reward functions.")
    return funcs, weights


def discard_log(*args, **kwargs) -> None:
    """The ``log_extra`` / ``log_metric`` callbacks TRL hands a reward function; outside training nothing is logged."""
    return None


def call_reward(func: Callable, **kwargs) -> list:
    """``func(**kwargs)``, awaited when it is an async reward function (TRL accepts both)."""
    out = func(**kwargs)  # an async function returns a coroutine, awaited below
    if inspect.isawaitable(out):
        return asyncio.run(_await(out))
    return out


async def _await(x):
    return await x


def score_completions(
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
            out = call_reward(f, prompts=prompts, completions=completions, completion_ids=completion_ids,
                               trainer_state=TrainerState(), log_extra=discard_log, log_metric=discard_log, **columns)
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


# ---------------------------------------------------------------------------------------------------- generation
def render_prompts(prompts: list, tokenizer: Any) -> list[str]:
    """Text fed to vLLM: plain prompts as is, conversations through the tokenizer's chat template."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(p)
        else:
            if tokenizer is None:
                raise ValueError("conversational prompts need a tokenizer with a chat template.")
            out.append(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True))
    return out


def prompt_token_ids(prompts: list, tokenizer: Any) -> list[list[int]]:
    """Prompt token ids exactly as TRL's ``_tokenize_prompts`` builds them (text: ``tokenizer(text=...)``;
    conversations: ``apply_chat_template(add_generation_prompt=True)``)."""
    ids: list[list[int]] = []
    for p in prompts:
        if isinstance(p, str):
            ids.append(list(tokenizer(text=[p])["input_ids"][0]))
        else:
            t = tokenizer.apply_chat_template(conversation=[p], add_generation_prompt=True, tokenize=True,
                                              return_dict=True)
            ids.append(list(t["input_ids"][0]))
    for p, i in zip(prompts, ids):
        if not i:
            raise ValueError(f"prompt {p!r:.60} tokenizes to zero tokens.")
    return ids


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The end tokens of a generation: the model's generation config's, then the tokenizer's (no repeats)."""
    eos: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for e in ([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])) + [tokenizer.eos_token_id]:
        if e is not None and int(e) not in eos:
            eos.append(int(e))
    return eos


def generate_keyed(model, prompt_ids, keys, num_samples, batch_size, settings) -> list[list[list[int]]]:
    """``num_samples`` keyed completions (token ids) of every prompt, ``batch_size`` sequences per generate call;
    each sample's noise depends only on (its prompt's key, its index), never on the batch."""
    from trl_ext.measurement.keyed_sampling import keyed_generate

    flat = [(i, s) for i in range(len(prompt_ids)) for s in range(num_samples)]
    out: list[list[list[int]]] = [[None] * num_samples for _ in prompt_ids]  # type: ignore[list-item]
    for start in range(0, len(flat), batch_size):
        chunk = flat[start : start + batch_size]
        comps = keyed_generate(model, [prompt_ids[i] for i, _ in chunk], [keys[i] for i, _ in chunk],
                               [s for _, s in chunk], settings)
        for (i, s), c in zip(chunk, comps):
            out[i][s] = c
    return out


def generate_multinomial(model, prompt_ids, keys, num_samples, batch_size, *, temperature, top_p,
                          max_new_tokens, eos, pad) -> list[list[list[int]]]:
    """``num_samples`` plain ``generate(do_sample=True)`` completions of every prompt, each prompt on its own after
    ``torch.manual_seed(key)`` in a forked RNG."""
    import torch
    from transformers import GenerationConfig

    from trl_ext.measurement.keyed_sampling import truncate_at_eos

    cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_p=top_p,
                           top_k=0, min_p=None, repetition_penalty=1.0, num_beams=1, pad_token_id=pad,
                           eos_token_id=eos, disable_compile=True)
    device = next(model.parameters()).device
    out = []
    for ids, key in zip(prompt_ids, keys):
        comps: list[list[int]] = []
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(key)
            for start in range(0, num_samples, batch_size):
                m = min(batch_size, num_samples - start)
                inp = torch.tensor([ids] * m, dtype=torch.long, device=device)
                gen = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), generation_config=cfg)
                comps.extend(truncate_at_eos(gen[:, inp.shape[1] :].cpu(), eos))
        out.append(comps)
    return out


def generate_vllm_requests(llm, vllm, texts, keys, num_samples, *, temperature, top_p, max_new_tokens):
    """``[(token ids, text)] * num_samples`` per prompt text from one seeded ``SamplingParams(n=num_samples,
    seed=key)`` request each (vLLM gives every seeded request its own generator)."""
    params = [vllm.SamplingParams(n=num_samples, seed=int(k), temperature=temperature, top_p=top_p,
                                  max_tokens=max_new_tokens) for k in keys]
    outputs = llm.generate(texts, params, use_tqdm=False)
    if len(outputs) != len(texts):
        raise RuntimeError(f"vLLM returned {len(outputs)} results for {len(texts)} prompts.")
    result = []
    for o in outputs:
        comps = list(o.outputs)
        if len(comps) != num_samples:
            raise RuntimeError(f"vLLM returned {len(comps)} samples for a prompt, expected n={num_samples}.")
        result.append([(list(c.token_ids), c.text) for c in comps])
    return result

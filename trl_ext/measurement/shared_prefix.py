"""Shared-prefix rollouts: sample the ``G`` completions of a prompt as one generation that forks where they differ.

When ``G`` completions are drawn from one prompt, they agree on the prompt and very often on the first few
completion tokens as well. Sampling them as ``G`` independent rows recomputes those identical positions ``G``
times. This module's sampler computes every distinct prefix once:

* **Branches.** Per distinct prompt there is a tree of *branches*. A branch is a set of *members* (rollouts,
  i.e. rows of the call) whose tokens so far are identical, and it owns ONE row of the KV cache. At the start each
  distinct prompt is one branch holding every row with those prompt ids (rows may come in any order).
* **One forward per step.** Each step the model runs once on the last token of every live branch of every prompt
  (one batched call), giving one logits row per branch.
* **Per-member draws.** Every member draws its own next token from its branch's logits, after transformers'
  ``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper`` and ``MinPLogitsWarper`` (the very
  warpers ``generate(do_sample=True)`` applies, in its order): independently with ``torch.multinomial`` (unkeyed),
  or by the keyed Gumbel-max race of :mod:`trl_ext.measurement.keyed_sampling` with the member's own
  ``(key, sample_index, position)`` noise (keyed).
* **Fork.** Members that drew the same token stay together; a branch whose members drew ``k`` distinct tokens
  becomes ``k`` branches, and its cache row is duplicated by ``Cache.reorder_cache(parent_index)`` (the
  index-select beam search uses). A member ends at its first EOS (any of ``eos_token_ids``; kept in the
  completion, as TRL's ``_generate_single_turn`` keeps it) or at ``max_new_tokens``; a branch with no continuing
  member is dropped from the cache.

Exactness: a branch's logits are the logits of each member's own prefix (the members of a branch have identical
prompt and completion tokens so far; positions and the attention mask come from that prefix alone, left padding
excluded), and each member's draw uses only those logits and its own randomness. So every member's completion
has exactly the law of independent sampling (unkeyed), and under keys exactly the tokens the non-shared keyed path
(:func:`~trl_ext.measurement.keyed_sampling.keyed_generate`) draws, up to float rounding of the logits at a
different batch shape (the same caveat as any keyed replay at another batch shape). See ``docs/shared_prefix.md``.

Public API
----------
``shared_prefix_generate``
    The sampler. Returns EOS-truncated completions and a stats dict (forward tokens, generated tokens, shared
    share).
``KeyedRows``
    Per-row keys, sample indices and position offsets for the keyed mode (``KeyedRows.from_requests`` takes
    the trainer's ``KeyedRequest`` objects).
``settings_from_generation_config``, ``check_sampler_settings``
    A :class:`~trl_ext.measurement.keyed_sampling.SamplerSettings` from a transformers ``GenerationConfig``
    (TRL's ``trainer.generation_config``), refusing what the sampler does not implement; the same check for a
    ``SamplerSettings`` (e.g. the keyed trainer's ``keyed_sampler.settings()``).
``count_forward_tokens``
    A context manager counting the positions a model's forward calls compute (used by the benchmark).

This module imports torch and transformers only (no TRL).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .keyed_sampling import SamplerSettings, keyed_gumbel, left_pad

__all__ = [
    "STATS_KEYS",
    "KeyedRows",
    "build_warpers",
    "check_sampler_settings",
    "count_forward_tokens",
    "settings_from_generation_config",
    "shared_prefix_generate",
]

#: Keys of the stats dict returned by :func:`shared_prefix_generate` (see its docstring for definitions).
STATS_KEYS = (
    "rows", "unique_prompts", "forward_calls", "prefill_tokens", "decode_tokens", "forward_tokens",
    "prompt_tokens", "computed_tokens", "generated_tokens", "independent_tokens", "shared_positions",
    "decode_shared_positions", "shared_fraction", "decode_shared_fraction", "saved_fraction", "forks",
    "max_branches",
)  # fmt: skip

# GenerationConfig fields that change the sampled law and that the sampler does not implement.
_UNSUPPORTED_GC = {
    "typical_p": lambda v: v is not None and v < 1.0,
    "epsilon_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
    "eta_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
    "top_h": lambda v: v is not None,
    "repetition_penalty": lambda v: v is not None and v != 1.0,
    "no_repeat_ngram_size": lambda v: bool(v),
    "encoder_no_repeat_ngram_size": lambda v: bool(v),
    "bad_words_ids": lambda v: bool(v),
    "suppress_tokens": lambda v: bool(v),
    "begin_suppress_tokens": lambda v: bool(v),
    "sequence_bias": lambda v: bool(v),
    "min_length": lambda v: bool(v),
    "min_new_tokens": lambda v: bool(v),
    "forced_bos_token_id": lambda v: v is not None,
    "forced_eos_token_id": lambda v: v is not None,
    "guidance_scale": lambda v: v is not None and v != 1.0,
    "watermarking_config": lambda v: v is not None,
    "renormalize_logits": lambda v: bool(v),
    "stop_strings": lambda v: bool(v),
    "max_time": lambda v: v is not None,
}


@dataclass
class KeyedRows:
    """Per-row keyed-sampling coordinates for :func:`shared_prefix_generate` (one entry per row of the call).

    Attributes
    ----------
    keys : list of int
        Request key of each row (:func:`~trl_ext.measurement.keyed_sampling.request_key`).
    sample_indices : list of int
        Sample index of each row.
    position_offsets : list of int or None
        Generated-token index of each row's first token (``None``: all 0), as in
        :class:`~trl_ext.measurement.keyed_sampling.KeyedGumbelLogitsProcessor`.
    """

    keys: Sequence[int]
    sample_indices: Sequence[int]
    position_offsets: Sequence[int] | None = None

    @classmethod
    def from_requests(cls, requests: Sequence[Any]) -> KeyedRows:
        """Build from objects with ``key``, ``sample_index`` and (optionally) ``position_offset`` attributes, e.g.
        the trainer's ``KeyedRequest`` list."""
        return cls(
            keys=[int(r.key) for r in requests],
            sample_indices=[int(r.sample_index) for r in requests],
            position_offsets=[int(getattr(r, "position_offset", 0)) for r in requests],
        )


def settings_from_generation_config(gc: GenerationConfig, *, eos_token_ids=None, pad_token_id=None) -> SamplerSettings:
    """The :class:`SamplerSettings` equivalent of a sampling ``GenerationConfig`` (e.g. TRL's ``generation_config``).

    Parameters
    ----------
    gc : transformers.GenerationConfig
        Must sample (``do_sample=True``), with one beam and one return sequence. Its ``temperature``, ``top_k``,
        ``top_p``, ``min_p``, ``max_new_tokens``, ``eos_token_id`` and ``pad_token_id`` are used with transformers'
        meaning (``top_k`` 0/None and ``top_p`` None/1.0 are off; ``temperature`` None is 1.0).
    eos_token_ids, pad_token_id : optional
        Override the config's values (TRL keeps its own ``eos_token_ids``).

    Raises
    ------
    ValueError
        Greedy or beam configs, ``num_return_sequences != 1``, a missing ``max_new_tokens``, or any field in
        ``_UNSUPPORTED_GC`` that would change the sampled law (repetition penalty, typical-p, epsilon/eta cutoffs,
        suppressed tokens, minimum lengths, ...): shared-prefix sampling implements temperature, top-k, top-p and
        min-p only.
    """
    if not gc.do_sample:
        raise ValueError("shared_prefix_generate samples; the GenerationConfig has do_sample=False (greedy). "
                         "Greedy rollouts of one prompt are identical anyway; use model.generate for them.")  # fmt: skip
    if (gc.num_beams or 1) != 1 or (gc.num_return_sequences or 1) != 1:
        raise ValueError("shared_prefix_generate needs num_beams=1 and num_return_sequences=1 (repeat the prompt "
                         "rows instead; identical prompts share their prefix automatically)")  # fmt: skip
    bad = [k for k, is_set in _UNSUPPORTED_GC.items() if is_set(getattr(gc, k, None))]
    if bad:
        raise ValueError(
            f"shared_prefix_generate implements temperature, top_k, top_p and min_p only; the GenerationConfig sets "
            f"{bad}, which would change the sampled distribution. Remove them or turn shared-prefix rollouts off."
        )
    if gc.max_new_tokens is None:
        raise ValueError("the GenerationConfig needs max_new_tokens (the completion length cap)")
    eos = gc.eos_token_id if eos_token_ids is None else eos_token_ids
    eos = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
    pad = gc.pad_token_id if pad_token_id is None else pad_token_id
    if pad is None:
        pad = eos[0] if eos else 0
    return SamplerSettings(
        temperature=float(gc.temperature if gc.temperature is not None else 1.0),
        top_k=int(gc.top_k) if gc.top_k else None,
        top_p=float(gc.top_p) if gc.top_p is not None and gc.top_p < 1.0 else None,
        min_p=float(gc.min_p) if gc.min_p is not None else None,
        max_new_tokens=int(gc.max_new_tokens),
        eos_token_ids=eos,
        pad_token_id=int(pad),
    )


def build_warpers(settings: SamplerSettings) -> LogitsProcessorList:
    """transformers' sampling warpers for ``settings``, in the order ``generate(do_sample=True)`` applies them
    (temperature, top-k, top-p, min-p; ``min_tokens_to_keep=1`` as for ``num_beams=1``).

    The same list :class:`~trl_ext.measurement.keyed_sampling.KeyedGumbelLogitsProcessor` builds. None of these
    warpers reads ``input_ids``, so they can be applied to one logits row per branch.
    """
    warpers = LogitsProcessorList()
    if settings.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(float(settings.temperature)))
    if settings.top_k:
        warpers.append(TopKLogitsWarper(top_k=int(settings.top_k)))
    if settings.top_p is not None and settings.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=float(settings.top_p)))
    if settings.min_p is not None:
        warpers.append(MinPLogitsWarper(min_p=float(settings.min_p)))
    return warpers


def check_sampler_settings(settings: SamplerSettings) -> None:
    """Raise ``ValueError`` if ``settings`` use something :func:`shared_prefix_generate` does not implement
    (repetition penalty, extra generation kwargs). Trainers call it at construction to fail early."""
    if settings.repetition_penalty != 1.0:
        raise ValueError(
            f"shared_prefix_generate does not implement repetition_penalty (got {settings.repetition_penalty}); "
            "it penalises tokens of the padded prompt block, which a branch does not have. Set it to 1.0 or turn "
            "shared-prefix rollouts off."
        )
    if settings.extra_generation_kwargs:
        raise ValueError(
            f"shared_prefix_generate does not run extra generation kwargs {sorted(settings.extra_generation_kwargs)}"
            "; remove them or turn shared-prefix rollouts off"
        )


# ---------------------------------------------------------------------------------------------- model plumbing
def _forward_kwargs(model) -> tuple[str, bool]:
    """The name of the cache argument of ``model.forward`` and whether it accepts ``logits_to_keep``."""
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    return cache_kw, "logits_to_keep" in params


def _new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older signature
        return DynamicCache()


def _run(model, cache, cache_kw, keep_kw, input_ids, attention_mask, position_ids):
    kwargs = {cache_kw: cache, "use_cache": True}
    if keep_kw:
        kwargs["logits_to_keep"] = 1
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
    new_cache = getattr(out, "cache", None)
    if new_cache is None:
        new_cache = getattr(out, "past_key_values", None)
    # transformers' generate: ``outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)``
    return out.logits[:, -1, :].to(copy=True, dtype=torch.float32), (cache if new_cache is None else new_cache)


# ---------------------------------------------------------------------------------------------- draws and forks
def _ranks_within(branch_of: torch.Tensor, n_branches: int) -> torch.Tensor:
    """Rank of every member among the members of its branch (0, 1, ... in member order)."""
    m = branch_of.numel()
    order = torch.argsort(branch_of, stable=True)
    counts = torch.bincount(branch_of, minlength=n_branches)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty(m, dtype=torch.long, device=branch_of.device)
    rank[order] = torch.arange(m, device=branch_of.device) - starts[branch_of[order]]
    return rank


def _draw_unkeyed(scores: torch.Tensor, branch_of: torch.Tensor, generator) -> torch.Tensor:
    """One independent draw per member from ``softmax(scores[branch])`` (what ``generate(do_sample=True)`` does
    per row: ``multinomial(softmax(scores), 1)``).

    ``scores``: (n_branches, V) warped logits; ``branch_of``: (M,) branch of each live member. Each branch draws
    ``max members`` samples with replacement (i.i.d.) and member ``j`` of a branch takes sample ``j``.
    """
    n_branches = scores.shape[0]
    probs = torch.softmax(scores, dim=-1)
    rank = _ranks_within(branch_of, n_branches)
    kmax = int(rank.max()) + 1
    draws = torch.multinomial(probs, kmax, replacement=True, generator=generator)
    return draws[branch_of, rank]


def _draw_keyed(scores, branch_of, keys, sample_indices, positions, noise_dtype) -> torch.Tensor:
    """Each member's keyed Gumbel-max race on its branch's warped logits (exactly the race of
    :class:`~trl_ext.measurement.keyed_sampling.KeyedGumbelLogitsProcessor` for that member's row)."""
    v = scores.shape[1]
    g = keyed_gumbel(keys, sample_indices, positions, v, dtype=noise_dtype)
    race = scores.to(noise_dtype)[branch_of] + g
    return race.argmax(dim=-1)


def _fork(branch_of: torch.Tensor, tokens: torch.Tensor, vocab: int):
    """Group continuing members by (branch, token).

    Returns ``(parent, new_token, new_branch_of)``: for every new branch its parent branch (cache row to copy)
    and the token it feeds next, and for every member its new branch.
    """
    key = branch_of * vocab + tokens
    uniq, inverse = torch.unique(key, sorted=True, return_inverse=True)
    return uniq // vocab, uniq % vocab, inverse


def _decode_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position id of the token fed at a decoding step: the number of real (unpadded) tokens before it, i.e.
    ``len(prompt) + t`` for the ``t``-th completion token (what ``generate`` gives a left-padded row)."""
    return mask.sum(-1, keepdim=True) - 1


def _group_prompts(prompt_ids: Sequence[Sequence[int]]):
    """Distinct prompts (first-seen order) and the distinct-prompt index of every row."""
    index: dict[tuple[int, ...], int] = {}
    uniques: list[list[int]] = []
    row_group = []
    for p in prompt_ids:
        t = tuple(int(x) for x in p)
        if t not in index:
            index[t] = len(uniques)
            uniques.append(list(t))
        row_group.append(index[t])
    return uniques, row_group


# ---------------------------------------------------------------------------------------------- the sampler
@torch.no_grad()
def shared_prefix_generate(
    model,
    prompt_ids: Sequence[Sequence[int]],
    settings: SamplerSettings | GenerationConfig,
    *,
    num_per_prompt: int = 1,
    keyed: KeyedRows | Sequence[Any] | None = None,
    generator: torch.Generator | None = None,
    share: bool = True,
    pad_to_multiple_of: int | None = None,
) -> tuple[list[list[int]], dict]:
    """Sample one completion per row, computing every distinct prefix once (module docstring).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A decoder-only causal LM whose forward takes ``attention_mask``, ``position_ids`` and a
        :class:`~transformers.DynamicCache` (already unwrapped from DDP/FSDP; used in its current train/eval mode).
    prompt_ids : list of list of int
        Unpadded prompt ids, one per row (TRL passes each prompt ``G`` times). Rows with identical ids share their
        computation whatever their order.
    settings : SamplerSettings or transformers.GenerationConfig
        Temperature, top-k, top-p, min-p, ``max_new_tokens``, ``eos_token_ids``, ``pad_token_id``. A
        ``GenerationConfig`` goes through :func:`settings_from_generation_config`. Repetition penalty and extra
        generation kwargs are refused (``ValueError``).
    num_per_prompt : int, default 1
        Repeat every entry of ``prompt_ids`` this many times (rows ``i*n .. i*n+n-1`` belong to prompt ``i``), so
        ``shared_prefix_generate(model, prompts, s, num_per_prompt=G)`` equals passing each prompt ``G`` times.
    keyed : KeyedRows or sequence of KeyedRequest-like objects, optional
        Keyed mode: row ``r`` draws its token at generated position ``t`` by the race
        ``argmax(warp(z) + keyed_gumbel(key_r, sample_index_r, t + position_offset_r))``, exactly as
        :func:`~trl_ext.measurement.keyed_sampling.keyed_generate`. One entry per row *after* the
        ``num_per_prompt`` expansion.
    generator : torch.Generator, optional
        RNG of the unkeyed draws, on the model's device (default: torch's global RNG). Ignored in keyed mode.
        The draws follow ``generate``'s law but not its RNG stream.
    share : bool, default True
        ``False`` gives every row its own branch from the start (same loop, no sharing; for benchmarks and tests).
    pad_to_multiple_of : int, optional
        Pad the prompt block of the prefill to a multiple of this (only changes the padding computed).

    Returns
    -------
    completion_ids : list of list of int
        One per row, in row order, cut after the first EOS token (which is kept), at most ``max_new_tokens`` long.
    stats : dict
        ``rows``, ``unique_prompts`` (distinct prompts prefilled; rows when ``share=False``), ``forward_calls``;
        ``prefill_tokens`` (positions computed in the prefill, left padding included), ``decode_tokens`` (one per
        live branch per decoding step), ``forward_tokens`` = their sum (all positions the model computed);
        ``prompt_tokens`` (real prompt positions computed), ``computed_tokens`` = ``prompt_tokens +
        decode_tokens`` (positions computed, padding excluded); ``generated_tokens`` (sum of completion lengths);
        ``independent_tokens`` (what unshared, unpadded sampling needs: ``sum_r len(prompt_r) + len(completion_r)
        - 1``); ``shared_positions`` (computed positions that served two or more rows; prompt and decode),
        ``decode_shared_positions`` (those among the decode positions), ``shared_fraction`` = ``shared_positions /
        computed_tokens``, ``decode_shared_fraction`` = ``decode_shared_positions / decode_tokens``,
        ``saved_fraction`` = ``1 - computed_tokens / independent_tokens``; ``forks`` (branches created by splits),
        ``max_branches`` (peak live branches, i.e. peak KV-cache rows).

    Raises
    ------
    ValueError
        Empty or invalid prompts, a keyed length that is not one per row, unsupported settings.
    """
    settings, rows = _check_call(prompt_ids, settings, num_per_prompt)
    n_rows = len(rows)
    device = next(model.parameters()).device
    noise = None if keyed is None else _keyed_tensors(keyed, n_rows, device, settings)
    if share:
        uniques, row_group = _group_prompts(rows)
    else:
        uniques, row_group = rows, list(range(n_rows))
    fwd = _forward_kwargs(model)
    logits, cache, mask, step_input, stats = _prefill(model, fwd, uniques, row_group, settings, pad_to_multiple_of,
                                                      device)
    out_tokens, lengths, decode_shared = _decode(model, fwd, settings, noise, generator, row_group, device, logits,
                                                 cache, mask, step_input, stats)
    lengths_list = lengths.tolist()
    completions = [out_tokens[r, : lengths_list[r]].tolist() for r in range(n_rows)]
    _finish_stats(stats, decode_shared, rows, lengths_list)
    return completions, {k: stats[k] for k in STATS_KEYS}


def _check_call(prompt_ids, settings, num_per_prompt) -> tuple[SamplerSettings, list[list[int]]]:
    """The checked :class:`SamplerSettings` of a :func:`shared_prefix_generate` call and its rows (every prompt
    repeated ``num_per_prompt`` times)."""
    if isinstance(settings, GenerationConfig):
        settings = settings_from_generation_config(settings)
    if not isinstance(settings, SamplerSettings):
        raise TypeError(f"settings must be a SamplerSettings or GenerationConfig, got {type(settings).__name__}")
    check_sampler_settings(settings)
    if isinstance(num_per_prompt, bool) or not isinstance(num_per_prompt, int) or num_per_prompt < 1:
        raise ValueError(f"num_per_prompt must be a positive int, got {num_per_prompt!r}")
    rows = [list(p) for p in prompt_ids for _ in range(num_per_prompt)]
    if len(rows) == 0:
        raise ValueError("no prompts given")
    if any(len(p) == 0 for p in rows):
        raise ValueError("every prompt needs at least one token")
    return settings, rows


def _keyed_tensors(keyed, n_rows: int, device, settings: SamplerSettings):
    """``(keys, sample indices, position offsets, noise dtype)`` of keyed mode, one tensor entry per row."""
    if not isinstance(keyed, KeyedRows):
        keyed = KeyedRows.from_requests(keyed)
    offsets = [0] * n_rows if keyed.position_offsets is None else list(keyed.position_offsets)
    if not (len(keyed.keys) == len(keyed.sample_indices) == len(offsets) == n_rows):
        raise ValueError(
            f"keyed has {len(keyed.keys)} keys, {len(keyed.sample_indices)} sample indices and {len(offsets)} "
            f"position offsets for {n_rows} rows; pass one of each per row (after num_per_prompt expansion)"
        )
    k_keys = torch.as_tensor([int(k) for k in keyed.keys], dtype=torch.int64, device=device)
    k_idx = torch.as_tensor([int(s) for s in keyed.sample_indices], dtype=torch.int64, device=device)
    k_off = torch.as_tensor([int(o) for o in offsets], dtype=torch.int64, device=device)
    return k_keys, k_idx, k_off, getattr(torch, settings.noise_dtype)


def _prefill(model, fwd, uniques, row_group, settings: SamplerSettings, pad_to_multiple_of, device):
    """Prefill one cache row per distinct prompt (left-padded, positions from the mask).

    Returns ``(logits, cache, mask, input_ids, stats)``, ``stats`` holding the prefill's counters.
    """
    input_ids, mask = left_pad(uniques, settings.pad_token_id, pad_to_multiple_of)
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    cache = _new_cache(model)
    logits, cache = _run(model, cache, *fwd, input_ids, mask, positions)
    n_unique = len(uniques)
    group_sizes = torch.bincount(torch.as_tensor(row_group), minlength=n_unique)
    unique_lens = torch.as_tensor([len(u) for u in uniques])
    stats = {
        "rows": len(row_group),
        "unique_prompts": n_unique,
        "forward_calls": 1,
        "prefill_tokens": int(input_ids.numel()),
        "decode_tokens": 0,
        "prompt_tokens": int(unique_lens.sum()),
        "shared_positions": int(unique_lens[group_sizes >= 2].sum()),
        "forks": 0,
        "max_branches": n_unique,
    }
    return logits, cache, mask, input_ids, stats


def _decode(model, fwd, settings: SamplerSettings, noise, generator, row_group, device, logits, cache, mask,
            step_input, stats):
    """The decoding loop: draw every live member's token from its branch, fork the branches whose members drew
    different tokens, feed one token per branch. Returns ``(out_tokens, lengths, decode_shared)``; updates
    ``stats``."""
    n_rows = len(row_group)
    warpers = build_warpers(settings)
    eos = torch.as_tensor(sorted(set(settings.eos_token_ids)), dtype=torch.long, device=device)
    max_new = settings.max_new_tokens
    decode_shared = 0
    out_tokens = torch.full((n_rows, max_new), int(settings.pad_token_id), dtype=torch.long, device=device)
    lengths = torch.zeros(n_rows, dtype=torch.long, device=device)
    live = torch.arange(n_rows, device=device)  # live members (row ids)
    branch_of = torch.as_tensor(row_group, dtype=torch.long, device=device)  # their branch (cache row)
    # step_input: for the warpers' signature only; none of them reads it
    t = 0
    while True:
        nan_rows = torch.isnan(logits).any(dim=1)
        if nan_rows.any():
            raise ValueError(f"logits contain NaN in branches {nan_rows.nonzero().flatten().tolist()}; check the model")
        scores = warpers(step_input, logits)
        if noise is None:
            tok = _draw_unkeyed(scores, branch_of, generator)
        else:
            k_keys, k_idx, k_off, noise_dtype = noise
            tok = _draw_keyed(scores, branch_of, k_keys[live], k_idx[live], k_off[live] + t, noise_dtype)
        out_tokens[live, t] = tok
        lengths[live] = t + 1
        t += 1
        if t >= max_new:
            break
        cont = ~torch.isin(tok, eos) if eos.numel() else torch.ones_like(tok, dtype=torch.bool)
        if not bool(cont.any()):
            break
        live, branch_of, tok = live[cont], branch_of[cont], tok[cont]
        branch_of, feed, cache, mask, shared = _fork_branches(branch_of, tok, logits.shape[-1], cache, mask, stats,
                                                              device)
        decode_shared += shared
        pos = _decode_positions(mask)
        step_input = feed[:, None]
        logits, cache = _run(model, cache, *fwd, step_input, mask, pos)
        stats["forward_calls"] += 1
    return out_tokens, lengths, decode_shared


def _fork_branches(branch_of, tok, vocab: int, cache, mask, stats: dict, device):
    """Regroup the continuing members by (branch, token) and bring the cache and mask rows along (duplicating forked
    rows, dropping finished ones). Returns ``(branch_of, feed, cache, mask, shared)``, ``shared`` = the new
    branches that serve two or more members; updates the fork / decode counters of ``stats``."""
    n_before = int(torch.unique(branch_of).numel())
    n_rows_before = int(mask.shape[0])
    parent, feed, branch_of = _fork(branch_of, tok, vocab)
    n_branches = int(parent.numel())
    stats["forks"] += n_branches - n_before
    members = torch.bincount(branch_of, minlength=n_branches)
    shared = int((members >= 2).sum())
    stats["decode_tokens"] += n_branches
    stats["max_branches"] = max(stats["max_branches"], n_branches)
    if n_branches != n_rows_before or not bool((parent == torch.arange(n_branches, device=device)).all()):
        cache.reorder_cache(parent)  # duplicate forked rows, drop finished ones (beam search's index-select)
        mask = mask[parent]
    mask = torch.cat([mask, mask.new_ones((n_branches, 1))], dim=-1)
    return branch_of, feed, cache, mask, shared


def _finish_stats(stats: dict, decode_shared: int, rows, lengths_list) -> None:
    """Add the totals and fractions of :data:`STATS_KEYS` that need the finished completions."""
    stats["shared_positions"] += decode_shared
    stats["decode_shared_positions"] = decode_shared
    stats["forward_tokens"] = stats["prefill_tokens"] + stats["decode_tokens"]
    stats["computed_tokens"] = stats["prompt_tokens"] + stats["decode_tokens"]
    stats["generated_tokens"] = int(sum(lengths_list))
    stats["independent_tokens"] = int(sum(len(p) for p in rows) + sum(n - 1 for n in lengths_list))
    stats["shared_fraction"] = stats["shared_positions"] / stats["computed_tokens"]
    stats["decode_shared_fraction"] = decode_shared / stats["decode_tokens"] if stats["decode_tokens"] else 0.0
    stats["saved_fraction"] = 1.0 - stats["computed_tokens"] / stats["independent_tokens"]


@contextlib.contextmanager
def count_forward_tokens(model):
    """Count the positions ``model``'s forward calls compute while the context is open.

    Yields a dict ``{"calls": int, "tokens": int, "per_call": list[int]}`` updated by a forward pre-hook on
    ``model`` (``tokens`` adds ``input_ids.numel()`` of every call: padding and finished rows included, which is
    what the model computes; ``per_call[0]`` of a generation is its prefill).
    """
    counter: dict = {"calls": 0, "tokens": 0, "per_call": []}

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        if ids is None:
            emb = kwargs.get("inputs_embeds")
            n = 0 if emb is None else int(emb.shape[0] * emb.shape[1])
        else:
            n = int(ids.numel())
        counter["calls"] += 1
        counter["tokens"] += n
        counter["per_call"].append(n)

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield counter
    finally:
        handle.remove()

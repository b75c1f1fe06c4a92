"""Draw the advice sample: ``N`` prompts x ``k`` completions from the user's model, scored by the user's rewards.

Generation is transformers ``generate`` with the project's keyed sampling
(:func:`trl_ext.measurement.keyed_sampling.keyed_generate`: Gumbel-max with noise addressed by
``(request key, sample index, position, token)``, the law of ``generate(do_sample=True)``), so every completion
regenerates from the logged key, sample index and settings ("Measurement Discipline for RLVR", "1. The sampler's
noise should be addressable"). The request key of a prompt is ``request_key(seed, 0, prompt_key_of(prompt),
mode="advise")``. Prompts are tokenized as TRL's ``GRPOTrainer`` tokenizes them (text as is; conversations through
the tokenizer's chat template with the generation prompt), reward functions are called as TRL calls them
(``f(prompts=, completions=, completion_ids=, trainer_state=, log_extra=, log_metric=, **columns)``), and the
helpers are those of ``trl-ext gate`` and ``trl-ext build-value-table`` (:mod:`trl_ext.priors.value_table`).

:func:`advise` is the Python API: sample, :func:`~trl_ext.advise.recommend.measure`,
:func:`~trl_ext.advise.recommend.recommend`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Sample", "advise", "draw_sample", "prefix_section", "select_rows"]

# Keyword names TRL passes to a reward function itself; dataset columns with these names are not forwarded.
_RESERVED = ("prompt", "prompts", "completion", "completions", "completion_ids", "trainer_state", "log_extra",
             "log_metric")

PREFIX_HEADS_OFF = {
    "measured": False,
    "reason": "PAIR prefix informativeness not measured: prefix_heads=False (--prefix_heads off).",
}


@dataclass
class Sample:
    """The drawn sample.

    Attributes
    ----------
    rewards : numpy.ndarray, shape (N, k)
        Combined (weighted, optionally rescaled) reward per completion; NaN = unscorable.
    lengths : numpy.ndarray of int, shape (N, k)
        Generated tokens per completion (up to and including the first end token).
    truncated : numpy.ndarray of bool, shape (N, k)
        The completion used all ``max_new_tokens`` without an end token.
    keys : list of int
        The request key of each prompt (replay: same key, sample index ``j`` and ``settings``).
    settings : dict
        :class:`~trl_ext.measurement.keyed_sampling.SamplerSettings` as a dict.
    records : list of dict
        Per prompt: ``row_index``, ``question_id`` (if any), ``key``, ``completions``, ``rewards``.
    prompt_ids : list of list of int
        The prompt token ids each completion continues (for the prefix heads).
    completion_ids : list of list of list of int
        ``completion_ids[i][j]``: sample ``j`` of prompt ``i``, up to and including its first end token.
    eos_ids : list of int
        The end tokens.
    reward_inputs : dict
        What the rewards were called with, one entry per sample (flattened ``N x k``): ``prompts``,
        ``completions``, ``completion_ids``, ``columns`` (for the noise floor).
    """

    rewards: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    keys: list
    settings: dict
    records: list = field(default_factory=list)
    prompt_ids: list = field(default_factory=list)
    completion_ids: list = field(default_factory=list)
    eos_ids: list = field(default_factory=list)
    reward_inputs: dict = field(default_factory=dict)


def select_rows(rows: list[dict], num_prompts: int | None, seed: int) -> tuple[list[int], list[dict]]:
    """``num_prompts`` rows drawn without replacement with ``seed`` (all rows when there are fewer or ``None``),
    kept in dataset order. Returns ``(row indices, rows)``."""
    if num_prompts is None or num_prompts >= len(rows):
        return list(range(len(rows))), list(rows)
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}.")
    idx = sorted(int(i) for i in np.random.default_rng(seed).choice(len(rows), size=num_prompts, replace=False))
    return idx, [rows[i] for i in idx]


def _check_chat_template(rows, prompt_column, tokenizer) -> None:
    from trl_ext.measurement.offline_sampling import is_conversation

    conv = [i for i, r in enumerate(rows) if is_conversation(r[prompt_column])]
    if conv and not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{len(conv)} of {len(rows)} prompts (first: row {conv[0]}) are conversations (lists of "
                         f"messages) but the tokenizer has no chat template. Use the tokenizer of a chat model, set "
                         "tokenizer.chat_template, or give plain-text prompts.")


def _prepare(tokenizer, rows, reward_funcs, *, num_samples, seed, prompt_column, reward_weights, reward_range):
    """Validate the inputs; returns ``(rows, funcs, weights, prompts, prompt_ids, keys)``."""
    from trl_ext.measurement.keyed_sampling import prompt_key_of, request_key
    from trl_ext.measurement.offline_sampling import check_prompt_rows, prompt_token_ids, reward_funcs_and_weights

    rows = [dict(r) for r in rows]
    check_prompt_rows(rows, prompt_column, empty="advise needs prompts to sample",
                       hint="name the prompt column with --prompt_column / prompt_column=")
    if num_samples < 2:
        raise ValueError(f"num_samples must be >= 2 (a pass rate and a zero-variance share need two samples), got "
                         f"{num_samples}.")
    funcs, weights = reward_funcs_and_weights(reward_funcs, reward_weights)
    if reward_range is not None and not float(reward_range[1]) > float(reward_range[0]):
        raise ValueError(f"reward_range must be (low, high) with high > low, got {reward_range!r}.")
    _check_chat_template(rows, prompt_column, tokenizer)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has neither a pad nor an end token; set tokenizer.pad_token.")
        tokenizer.pad_token = tokenizer.eos_token  # as TRL does
    prompts = [r[prompt_column] for r in rows]
    prompt_ids = prompt_token_ids(prompts, tokenizer)
    keys = [request_key(int(seed), 0, prompt_key_of(p), mode="advise") for p in prompts]
    return rows, funcs, weights, prompts, prompt_ids, keys


def _score_and_pack(tokenizer, rows, prompts, prompt_ids, keys, comps, eos, funcs, weights, *, num_samples,
                    max_new_tokens, prompt_column, reward_range, row_indices, settings, seeds=None) -> Sample:
    """Decode, score (TRL style) and pack the completions ``comps[i][j]`` into a :class:`Sample`."""
    from trl_ext.measurement.offline_sampling import is_conversation, score_completions

    eos_set = set(eos)
    flat_ids = [c for per in comps for c in per]
    texts = tokenizer.batch_decode(flat_ids, skip_special_tokens=True)
    completions = [t if not is_conversation(prompts[j // num_samples]) else [{"role": "assistant", "content": t}]
                   for j, t in enumerate(texts)]
    rep_rows = [r for r in rows for _ in range(num_samples)]
    skip = set(_RESERVED) | {prompt_column}
    columns = {c: [r.get(c) for r in rep_rows] for c in rows[0] if c not in skip}
    rewards = np.asarray(score_completions(funcs, weights, [r[prompt_column] for r in rep_rows], completions, flat_ids,
                                           columns), dtype=np.float64).reshape(len(rows), num_samples)
    if reward_range is not None:
        lo, hi = float(reward_range[0]), float(reward_range[1])
        rewards = (rewards - lo) / (hi - lo)
    lengths = np.asarray([len(c) for c in flat_ids], dtype=np.int64).reshape(len(rows), num_samples)
    truncated = np.asarray([len(c) >= max_new_tokens and (not c or c[-1] not in eos_set) for c in flat_ids],
                           dtype=bool).reshape(len(rows), num_samples)
    records = []
    for i, r in enumerate(rows):
        rec = {"row_index": int(row_indices[i]) if row_indices is not None else i, "key": keys[i],
               "completions": texts[i * num_samples:(i + 1) * num_samples],
               "rewards": [None if math.isnan(v) else float(v) for v in rewards[i].tolist()]}
        if seeds is not None:
            rec["request_seeds"] = seeds[i]
        if "question_id" in r:
            rec["question_id"] = r["question_id"]
        records.append(rec)
    return Sample(rewards=rewards, lengths=lengths, truncated=truncated, keys=keys, settings=settings,
                  records=records, prompt_ids=prompt_ids, completion_ids=comps, eos_ids=list(eos),
                  reward_inputs={"prompts": [r[prompt_column] for r in rep_rows], "completions": completions,
                                 "completion_ids": flat_ids, "columns": columns})


def draw_sample(model, tokenizer, rows: list[dict], reward_funcs, *, num_samples: int = 16,
                max_new_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                batch_size: int = 64, prompt_column: str = "prompt", reward_weights=None, reward_range=None,
                row_indices=None, eos_token_ids=None) -> Sample:
    """Sample ``num_samples`` keyed completions of every row's prompt and score them.

    Parameters
    ----------
    model : transformers.PreTrainedModel or vllm.LLM
        Causal LM (inputs follow its device), or a vLLM engine (:func:`trl_ext.advise.vllm_path.generate_vllm`:
        one ``SamplingParams(n=1, seed=per_request_seed(key, j))`` per sample).
    tokenizer : PreTrainedTokenizerBase
        With a pad token (the end token is used when it has none, as TRL does) and, for conversational data, a
        chat template.
    rows : list of dict
        Dataset rows with a ``prompt_column`` (text or a list of messages) plus what the rewards read.
    reward_funcs : list of callables
        TRL-signature reward functions; the reward is their weighted sum (``None`` skipped; all ``None`` ->
        unscorable, NaN).
    num_samples, max_new_tokens, temperature, top_p, seed, batch_size
        Sampling settings (``batch_size``: sequences per generate call; the whole sample is one vLLM call).
    prompt_column : str
    reward_weights : list of float, optional
    reward_range : (float, float), optional
        Rescale the combined reward from ``[low, high]`` to ``[0, 1]`` (the statistics need rewards in [0, 1]).
    row_indices : list of int, optional
        Dataset row index of each row (recorded).
    eos_token_ids : list of int, optional
        End tokens (default: the model's generation config and the tokenizer's; give them for a vLLM engine, whose
        generation config is not read here).

    Raises
    ------
    ValueError
        Empty dataset, missing/ill-typed prompts, conversational prompts without a chat template, a reward function
        returning the wrong number of values or non-numbers, fewer than 2 samples, a bad reward range.
    """
    from trl_ext.measurement.keyed_sampling import SamplerSettings
    from trl_ext.measurement.offline_sampling import eos_ids, generate_keyed

    from .vllm_path import generate_vllm, is_vllm_engine

    rows, funcs, weights, prompts, prompt_ids, keys = _prepare(
        tokenizer, rows, reward_funcs, num_samples=num_samples, seed=seed, prompt_column=prompt_column,
        reward_weights=reward_weights, reward_range=reward_range)
    eos = [int(e) for e in eos_token_ids] if eos_token_ids is not None else eos_ids(model, tokenizer)
    seeds = None
    if is_vllm_engine(model):
        comps, seeds, settings = generate_vllm(model, prompt_ids, keys, num_samples, temperature=temperature,
                                               top_p=top_p, max_new_tokens=max_new_tokens, eos_token_ids=eos)
    else:
        import torch

        cfg = SamplerSettings(temperature=float(temperature), top_p=float(top_p), max_new_tokens=int(max_new_tokens),
                              eos_token_ids=eos, pad_token_id=int(tokenizer.pad_token_id))
        model.eval()
        with torch.no_grad():
            comps = generate_keyed(model, prompt_ids, keys, num_samples, batch_size, cfg)
        settings = cfg.to_dict()
    return _score_and_pack(tokenizer, rows, prompts, prompt_ids, keys, comps, eos, funcs, weights,
                           num_samples=num_samples, max_new_tokens=max_new_tokens, prompt_column=prompt_column,
                           reward_range=reward_range, row_indices=row_indices, settings=settings, seeds=seeds)


def prefix_section(model, tokenizer, smp: Sample, *, max_new_tokens: int, factors=None, n_folds: int = 2,
                   seed: int = 0, head_batch_prompts: int = 8, batch_size: int = 64, confidence: float = 0.95,
                   n_resamples: int = 999) -> dict:
    """The ``prefix_heads`` section from the sample (:func:`trl_ext.advise.prefix.measure_prefix_heads` on the
    model's hidden states), or ``{"measured": False, "reason": ...}`` when it cannot be measured (too short a cap,
    too few prompts with a scorable sample), never silently."""
    from .prefix import PROBE_FACTORS, measure_prefix_heads
    from .vllm_path import is_vllm_engine

    if max_new_tokens < 2:
        return {"measured": False, "reason": f"max_new_tokens = {max_new_tokens}: PAIR needs a prefix and a suffix "
                                             "(max_completion_length >= 2)."}
    if model is None or is_vllm_engine(model):
        return {"measured": False, "reason": "the sample came from a vLLM engine and no transformers model of the "
                                             "same weights was given for the prefix features (feature_model=; the "
                                             "command line loads it)."}
    n_ok = int(np.isfinite(smp.rewards).any(axis=1).sum())
    if n_ok < max(2, n_folds):
        return {"measured": False, "reason": f"{n_ok} prompts have a scorable sample; held-out folds need at least "
                                             f"{max(2, n_folds)}."}
    return measure_prefix_heads(None, smp.prompt_ids, smp.completion_ids, smp.rewards, model=model,
                                pad_token_id=tokenizer.pad_token_id, max_new_tokens=max_new_tokens, eos_ids=smp.eos_ids,
                                factors=tuple(factors) if factors else PROBE_FACTORS, n_folds=n_folds, seed=seed,
                                head_batch_prompts=head_batch_prompts, feature_batch=batch_size,
                                confidence=confidence, n_resamples=n_resamples)


def advise(model, tokenizer, dataset, reward_funcs, *, num_prompts: int | None = 64, num_samples: int = 16,
           max_new_tokens: int = 256, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
           batch_size: int = 64, prompt_column: str = "prompt", reward_weights=None, reward_range=None,
           group_size: int = 8, confidence: float = 0.95, interval_method: str = "jeffreys",
           n_resamples: int = 999, target_width: float = 0.10, basis_table_samples: int = 32,
           basis_table_uses: float = 1.0, prefix_heads: bool = True, probe_factors=None, prefix_folds: int = 2,
           head_batch_prompts: int = 8, noise_floor: bool = False, noise_floor_items: int = 60,
           feature_model=None, eos_token_ids=None, config: dict | None = None, return_sample: bool = False):
    """Sample the model on the dataset, measure the regime and recommend a trainer.

    Parameters
    ----------
    model, tokenizer
        A transformers causal LM, or a ``vllm.LLM`` (the vLLM path, :mod:`trl_ext.advise.vllm_path`), and its
        tokenizer.
    dataset : datasets.Dataset, list of dict or dict of columns
        Rows with a ``prompt_column`` and whatever the rewards read.
    reward_funcs : callable or list of callables
        TRL-signature reward functions (rewards in [0, 1], or give ``reward_range``).
    num_prompts : int or None
        Prompts drawn at random with ``seed`` (``None``: all rows).
    num_samples : int
        ``k`` completions per prompt; the unbiased zero-variance share at ``G`` needs ``k >= G`` (16 covers G = 16).
    group_size : int
        The GRPO group size you would train with; savings are reported against it.
    target_width : float
        Warn (:class:`~trl_ext.advise.recommend.AdviceWarning`) when the interval of the zero-variance share at
        ``group_size`` is wider than this.
    prefix_heads : bool
        Measure PAIR's prefix informativeness (:func:`trl_ext.advise.prefix.measure_prefix_heads`): out-of-fold
        success heads at ``probe_factors`` x PAIR's default ``tau`` (default 0.5, 1, 2), ``prefix_folds`` folds over
        prompts, labels fed ``head_batch_prompts`` prompts per refresh.
    noise_floor : bool
        Measure each reward function's scorer noise floor on ``noise_floor_items`` sampled completions
        (:func:`trl_ext.advise.noise.reward_noise_floors`).
    feature_model : transformers.PreTrainedModel, optional
        The model whose hidden states feed the prefix heads when ``model`` is a ``vllm.LLM`` (the same weights).
    eos_token_ids : list of int, optional
        End tokens (:func:`draw_sample`).
    return_sample : bool
        Also return the :class:`Sample`.

    Other parameters are those of :func:`draw_sample` and :func:`~trl_ext.advise.recommend.measure`.

    Returns
    -------
    Advice, or (Advice, Sample) with ``return_sample=True``.
    """
    from trl_ext.measurement.offline_sampling import dataset_rows

    from .noise import reward_noise_floors
    from .recommend import measure, recommend
    from .vllm_path import is_vllm_engine

    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    rows = dataset_rows(dataset, prompt_column, empty="advise needs prompts",
                        hint="pass prompt_column=<the prompt column>")
    idx, rows = select_rows(rows, num_prompts, seed)
    if len(rows) < 2:
        raise ValueError(f"advise needs at least 2 prompts (the dataset has {len(rows)}); the between-prompt "
                         "statistics and every interval come from the spread over prompts.")
    t0 = time.perf_counter()
    smp = draw_sample(model, tokenizer, rows, funcs, num_samples=num_samples, max_new_tokens=max_new_tokens,
                      temperature=temperature, top_p=top_p, seed=seed, batch_size=batch_size,
                      prompt_column=prompt_column, reward_weights=reward_weights, reward_range=reward_range,
                      row_indices=idx, eos_token_ids=eos_token_ids)
    timing = {"sampling_and_scoring": time.perf_counter() - t0}
    cfg = dict(config or {})
    cfg.update(num_prompts=len(rows), num_samples=num_samples, max_new_tokens=max_new_tokens, temperature=temperature,
               top_p=top_p, seed=seed, prompt_column=prompt_column, reward_weights=reward_weights,
               reward_range=list(reward_range) if reward_range is not None else None, sampler_settings=smp.settings,
               sampler="vllm" if smp.settings.get("backend") == "vllm" else "keyed (transformers, Gumbel-max)",
               key_derivation="request_key(seed, 0, prompt_key_of(prompt), mode='advise')")
    adv = measure(smp.rewards, smp.lengths, smp.truncated, max_new_tokens=max_new_tokens, user_group_size=group_size,
                  confidence=confidence, interval_method=interval_method, n_resamples=n_resamples, seed=seed,
                  basis_table_samples=basis_table_samples, basis_table_uses=basis_table_uses, config=cfg)
    timing["measure"] = time.perf_counter() - t0 - timing["sampling_and_scoring"]
    t1 = time.perf_counter()
    feats = feature_model if feature_model is not None else (None if is_vllm_engine(model) else model)
    adv.prefix_heads = (prefix_section(feats, tokenizer, smp, max_new_tokens=max_new_tokens, factors=probe_factors,
                                       n_folds=prefix_folds, seed=seed, head_batch_prompts=head_batch_prompts,
                                       batch_size=batch_size, confidence=confidence, n_resamples=n_resamples)
                        if prefix_heads else dict(PREFIX_HEADS_OFF))
    timing["prefix_heads"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    if noise_floor:
        ri = smp.reward_inputs
        adv.noise_floor = reward_noise_floors(funcs, ri["prompts"], ri["completions"], ri["completion_ids"],
                                              ri["columns"], weights=reward_weights, reward_range=reward_range,
                                              n_items=noise_floor_items, seed=seed)
    timing["noise_floor"] = time.perf_counter() - t1
    adv.config["timing_s"] = timing
    recommend(adv, target_width=target_width)
    return (adv, smp) if return_sample else adv

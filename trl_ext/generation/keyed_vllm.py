"""vLLM side of keyed sampling: per-request seeds through TRL 1.16's colocated engine.

The keyed Gumbel processor cannot run inside vLLM, so :class:`~trl_ext.generation.keyed_sampler.KeyedSampler` gives
every row its own ``SamplingParams`` whose ``seed`` is :func:`~trl_ext.measurement.keyed_sampling.per_request_seed`
``(key, sample_index)``: for the duration of one generation call ``trainer.vllm_generation.llm`` is replaced by
:class:`PerRequestSeedLLM`, which expands the single ``SamplingParams`` TRL builds into one clone per row. A vLLM seed
seeds vLLM's own generator: it is NOT the keyed Gumbel stream, so ``trl-ext replay`` (transformers) cannot regenerate
such a rollout, and even vLLM reproduces it only at matching batch composition, engine version and kernels
(docs/replay.md). Server mode and tensor parallelism > 1 are refused by :func:`check_vllm_keyed_config` before vLLM
starts.
"""

from __future__ import annotations

import copy
import json
from typing import Any

__all__ = ["VLLM_SEED_SCHEME", "PerRequestSeedLLM", "check_vllm_keyed_config", "vllm_sampling_params_record"]

#: ``seed_scheme`` field of vLLM rollout records: how ``request_seed`` was derived from ``(key, sample_index)``.
VLLM_SEED_SCHEME = "per_request_seed/trl_ext.seed/v1"
# SamplingParams fields logged with each vLLM rollout (those the object has; the seed is logged separately).
_VLLM_LOGGED_FIELDS = (
    "n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
    "max_tokens", "min_tokens", "stop", "stop_token_ids", "ignore_eos", "logprobs", "structured_outputs",
)  # fmt: skip


def check_vllm_keyed_config(mode: Any, tensor_parallel_size: Any, generation_kwargs: dict | None) -> None:
    """Raise unless keyed sampling can give every vLLM request its own seed under this configuration.

    Parameters
    ----------
    mode : str
        ``vllm_mode`` (``"colocate"`` is the only supported value).
    tensor_parallel_size : int
        ``vllm_tensor_parallel_size`` (must be 1).
    generation_kwargs : dict or None
        ``args.generation_kwargs`` (passed to vLLM's ``SamplingParams``); must not set ``seed`` or ``n != 1``.

    Raises
    ------
    NotImplementedError
        Server mode: TRL 1.16 sends ONE set of sampling params with ``n=num_generations`` for the unique prompts to
        ``vllm_client.generate``, so a per-request seed cannot be expressed through TRL's client. Tensor
        parallelism > 1: TRL gathers the prompts of the whole TP group into one ``llm.generate`` call, and the
        other ranks' seeds are not gathered (not implemented).
    ValueError
        If ``generation_kwargs`` sets ``seed`` (it would be overridden per request; a shared seed would make the
        ``G`` rollouts of a prompt identical) or ``n`` other than 1.
    """
    if mode != "colocate":
        raise NotImplementedError(
            f"keyed_sampling=True with use_vllm=True is implemented for vllm_mode='colocate' only (got {mode!r}). "
            "In vLLM server mode TRL 1.16 sends one set of sampling params (n=num_generations, unique prompts) to "
            "vllm_client.generate, so a per-request seed cannot be passed through TRL's client. Use "
            "vllm_mode='colocate', use_vllm=False (keyed Gumbel sampling, byte-identical replay) or "
            "keyed_sampling=False; see docs/replay.md."
        )
    if isinstance(tensor_parallel_size, bool) or tensor_parallel_size != 1:
        raise NotImplementedError(
            f"keyed_sampling=True with vLLM needs vllm_tensor_parallel_size=1 (got {tensor_parallel_size!r}): with "
            "tensor parallelism TRL gathers the prompts of the whole TP group into one llm.generate call on every "
            "rank, and per-row seeds for the other ranks' rows are not gathered (not implemented). Set "
            "vllm_tensor_parallel_size=1, use_vllm=False or keyed_sampling=False."
        )
    gk = generation_kwargs or {}
    if gk.get("seed") is not None:
        raise ValueError(
            f"generation_kwargs sets seed={gk['seed']!r}, but keyed_sampling gives every vLLM request its own seed "
            "(per_request_seed(key, sample_index)); a shared seed would also make the G rollouts of a prompt "
            "identical. Remove 'seed' from generation_kwargs."
        )
    if gk.get("n") not in (None, 1):
        raise ValueError(f"keyed_sampling with vLLM needs n=1 (one request per rollout); generation_kwargs sets "
                         f"n={gk['n']!r}. Remove it.")  # fmt: skip


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def vllm_sampling_params_record(params: Any) -> dict:
    """The loggable fields of a vLLM ``SamplingParams`` (those in ``_VLLM_LOGGED_FIELDS`` that it has).

    Values that are not JSON-serialisable are logged as their ``repr``. The seed is not included (it is logged per
    row as ``request_seed``).
    """
    return {k: _jsonable(getattr(params, k)) for k in _VLLM_LOGGED_FIELDS if hasattr(params, k)}


class PerRequestSeedLLM:
    """Proxy for vLLM's ``LLM`` during ONE keyed generation call: one seeded ``SamplingParams`` per row.

    TRL 1.16's ``VLLMGeneration.generate`` (colocate mode, TP = 1) builds one ``SamplingParams(**generation_kwargs)``
    with ``n=1`` and calls ``self.llm.generate(vllm_prompts, sampling_params=..., use_tqdm=False)`` on this rank's
    rows, in order. While this proxy sits in ``vllm_generation.llm``, that call becomes
    ``llm.generate(vllm_prompts, sampling_params=[p_0, ..., p_{B-1}], ...)`` with ``p_i = params.clone()`` and
    ``p_i.seed = seeds[i]`` (vLLM's ``LLM.generate`` takes a list of ``SamplingParams``, one per prompt, and gives a
    request with a ``seed`` its own generator). Row ``i``'s seed depends only on row ``i``'s request. The template
    TRL built is not modified. Every other attribute (``wake_up``, ``sleep``, ``llm_engine``, ``collective_rpc``,
    ...) is forwarded to the real ``LLM``.

    Parameters
    ----------
    llm : vllm.LLM
        The real engine.
    prompt_ids : list of list of int
        The rows TRL will pass, in order (checked against ``prompt_token_ids`` of each vLLM prompt).
    seeds : list of int
        One seed per row (:func:`~trl_ext.measurement.keyed_sampling.per_request_seed`).

    Attributes
    ----------
    calls : int
        Number of ``generate`` calls made through the proxy (exactly 1 is allowed).
    template : SamplingParams or None
        The single ``SamplingParams`` TRL passed.
    sampling_params : list or None
        The per-row clones passed to the real engine.

    Raises
    ------
    RuntimeError
        From ``generate``: a second call (the seeds would repeat), a list of or missing ``SamplingParams``, a
        template with ``n != 1`` or a ``seed`` already set, a row count or prompt token ids that differ from the
        keyed rows (the seeds would go to the wrong rows).
    """

    def __init__(self, llm: Any, prompt_ids, seeds):
        if len(prompt_ids) != len(seeds):
            raise ValueError(f"PerRequestSeedLLM: {len(prompt_ids)} prompts but {len(seeds)} seeds")
        self._llm = llm
        self._prompt_ids = [[int(t) for t in p] for p in prompt_ids]
        self._seeds = [int(x) for x in seeds]
        self.calls = 0
        self.template = None
        self.sampling_params = None

    def __getattr__(self, name):  # only reached for attributes the proxy does not define
        if name == "_llm":
            raise AttributeError(name)
        return getattr(self._llm, name)

    def generate(self, prompts, sampling_params=None, **kwargs):
        """Forward to the real ``LLM.generate`` with one seeded clone of ``sampling_params`` per prompt."""
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError(
                "keyed_sampling (vLLM): llm.generate was called twice in one keyed generation call; the per-row seeds "
                "would repeat. This TRL version's VLLMGeneration.generate is not the one the keyed path supports."
            )
        if sampling_params is None or isinstance(sampling_params, list | tuple):
            raise RuntimeError(
                "keyed_sampling (vLLM): expected TRL to pass one SamplingParams for the whole call, got "
                f"{type(sampling_params).__name__}; cannot attach per-request seeds"
            )
        if getattr(sampling_params, "n", 1) != 1:
            raise RuntimeError(f"keyed_sampling (vLLM): SamplingParams.n={sampling_params.n}; one request per rollout "
                               "(n=1) is needed for per-request seeds")  # fmt: skip
        if getattr(sampling_params, "seed", None) is not None:
            raise RuntimeError(f"keyed_sampling (vLLM): SamplingParams already carries seed={sampling_params.seed}; "
                               "remove 'seed' from generation_kwargs")  # fmt: skip
        prompts = list(prompts)
        if len(prompts) != len(self._seeds):
            raise RuntimeError(
                f"keyed_sampling (vLLM): llm.generate got {len(prompts)} prompts but the keyed call has "
                f"{len(self._seeds)} rows (tensor parallelism or a TRL change?); refusing to attach seeds to the "
                "wrong rows"
            )
        for i, (p, ids) in enumerate(zip(prompts, self._prompt_ids)):
            got = p.get("prompt_token_ids") if isinstance(p, dict) else None
            if got is None or [int(t) for t in got] != ids:
                raise RuntimeError(
                    f"keyed_sampling (vLLM): prompt {i} passed to llm.generate does not carry the token ids of keyed "
                    f"row {i}; refusing to attach seeds to the wrong rows"
                )
        per_row = []
        for seed in self._seeds:
            sp = sampling_params.clone() if hasattr(sampling_params, "clone") else copy.deepcopy(sampling_params)
            sp.seed = seed
            per_row.append(sp)
        self.template = sampling_params
        self.sampling_params = per_row
        return self._llm.generate(prompts, sampling_params=per_row, **kwargs)

"""``KeyedSamplingMixin``: keyed, replayable rollouts for TRL 1.16's ``GRPOTrainer`` (transformers path).

Put it in front of TRL's trainer in the MRO::

    class GRPOTrainer(KeyedSamplingMixin, trl.GRPOTrainer): ...

With ``args.keyed_sampling=True`` every rollout's tokens are drawn by
:class:`~trl_ext.measurement.keyed_sampling.KeyedGumbelLogitsProcessor` from noise keyed to
``request_key(seed, global_step, prompt_key)`` and the rollout's sample index
("Measurement Discipline for RLVR", "2. Every request should carry its own replay key"), and each rollout is
appended to ``<output_dir>/rollouts/rank<r>.jsonl`` with everything :func:`trl_ext.measurement.replay.regenerate`
needs. With ``keyed_sampling=False`` (the default) the mixin is inert and TRL runs unchanged.

Config fields read (``getattr`` with defaults, so the mixin works before the base config declares them):

``keyed_sampling`` (bool, False)
    Turn keyed sampling on.
``keyed_sampling_seed`` (int or None, None)
    Run seed for the keys; ``None`` uses ``args.seed``. Two runs that must draw identical noise (a paired
    comparison) share this value.
``keyed_sampling_key_column`` (str or None, None)
    Dataset column holding a stable question id (``question_id``, a row index...). ``None``: the key is a hash
    of the prompt itself (:func:`~trl_ext.measurement.keyed_sampling.prompt_key_of`).
``keyed_sampling_log`` (bool, True)
    Write the rollout log.

Sample index: the ``j``-th draw of a prompt key at the current ``(mode, global_step)`` -- earlier generation calls
at this step plus earlier rows of this call's *global* batch (rank order, gathered across processes) -- gets
sample index ``j``; with TRL's ``RepeatSampler`` the ``G`` copies of a prompt are
``0..G-1``, and a prompt that appears twice in one batch gets ``G..2G-1`` for its second group rather than a
copy of the first group's noise.

vLLM (``use_vllm=True``): supported in colocate mode with ``vllm_tensor_parallel_size == 1`` only. The keyed Gumbel
processor cannot run inside vLLM, so instead every row gets its own ``SamplingParams`` whose ``seed`` is
:func:`~trl_ext.measurement.keyed_sampling.per_request_seed` ``(key, sample_index)`` (the per-request-seed fallback
for engines that cannot run the keyed Gumbel processor but accept a seed per request). For the duration of one
generation call ``self.vllm_generation.llm`` is replaced by :class:`PerRequestSeedLLM`, which expands the single
``SamplingParams`` TRL builds into one clone per row; the real ``LLM`` is put back afterwards, also on exceptions.
Rollouts are logged with ``backend: "vllm"`` and their ``request_seed``. A vLLM seed seeds vLLM's own generator: it
is NOT the keyed Gumbel stream, ``trl-ext replay`` (transformers) cannot regenerate such a rollout, and even vLLM
reproduces it only at matching batch composition, engine version and kernels (see ``docs/replay.md``). Server mode
(TRL sends one ``SamplingParams`` with ``n=num_generations`` to ``vllm_client.generate``, so no per-request seed can
be expressed) and tensor parallelism > 1 raise ``NotImplementedError`` at construction, before vLLM starts.

Not supported (clear ``NotImplementedError``): vLLM server mode and TP > 1 (above), transformers continuous
batching, images/multimodal prompts, and tool-calling loops (TRL re-enters ``_generate_single_turn`` with partial
rollouts).

Subclasses that generate rollouts themselves (variable-G rounds, two-phase generation) use the base trainer's
public API: :meth:`~trl_ext.GRPOTrainer.generate_rollouts` builds the keyed requests of its rows itself; before
:meth:`~trl_ext.GRPOTrainer.generate_token_ids` (token-id prompts, no rows) call
:meth:`KeyedSamplingMixin.set_keyed_requests` with one :class:`KeyedRequest` per prompt; use ``position_offset`` for
continuations so a prefix plus its continuation sees exactly the noise of one pass.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from trl_ext.measurement.keyed_sampling import (
    HASH_VERSION,
    KeyedGumbelLogitsProcessor,
    SamplerSettings,
    build_generation_config,
    left_pad,
    per_request_seed,
    prompt_key_of,
    request_key,
    truncate_at_eos,
)

from . import _trl_compat as compat

__all__ = [
    "ROLLOUT_FORMAT",
    "VLLM_SEED_SCHEME",
    "KeyedRequest",
    "KeyedSamplingMixin",
    "PerRequestSeedLLM",
    "check_vllm_keyed_config",
    "vllm_sampling_params_record",
]

#: ``format`` field of every rollout record.
ROLLOUT_FORMAT = "trl_ext.keyed_rollout/v1"
#: ``seed_scheme`` field of vLLM rollout records: how ``request_seed`` was derived from ``(key, sample_index)``.
VLLM_SEED_SCHEME = "per_request_seed/trl_ext.seed/v1"
# SamplingParams fields logged with each vLLM rollout (those the object has; the seed is logged separately).
_VLLM_LOGGED_FIELDS = (
    "n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
    "max_tokens", "min_tokens", "stop", "stop_token_ids", "ignore_eos", "logprobs", "structured_outputs",
)  # fmt: skip

# GenerationConfig fields that are sampling warpers: greedy decoding would silently drop them.
_UNSUPPORTED_WARPERS = ("typical_p", "epsilon_cutoff", "eta_cutoff", "top_h")
# Fields the keyed path sets itself.
_HANDLED = {
    "do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens",
    "pad_token_id", "bos_token_id", "eos_token_id", "cache_implementation", "num_beams",
    "disable_compile", "num_return_sequences",
}  # fmt: skip


@dataclass
class KeyedRequest:
    """One row of a keyed ``generate`` call.

    Attributes
    ----------
    key : int
        Request key (:func:`~trl_ext.measurement.keyed_sampling.request_key`).
    sample_index : int
        Sample index within the request.
    position_offset : int
        Generated-token index of the first token this call produces (0 unless continuing a prefix).
    prompt_key : str
        The question identity the key was derived from.
    meta : dict
        Logged as is (the dataset prompt, mode, ...).
    """

    key: int
    sample_index: int
    position_offset: int = 0
    prompt_key: str = ""
    meta: dict = field(default_factory=dict)


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


class KeyedSamplingMixin:
    """Mixin for ``trl.GRPOTrainer`` adding keyed Gumbel-max sampling and per-rollout key logging."""

    _keyed_requests: list[KeyedRequest] | None = None
    _keyed_rows: list[dict] | None = None
    _keyed_call_counter: int = 0

    def __init__(self, *args, **kwargs):
        # vLLM configurations keyed sampling cannot serve fail before TRL starts the engine or connects to a server.
        cfg = kwargs.get("args")
        if cfg is None:
            cfg = next((a for a in args if hasattr(a, "use_vllm") and hasattr(a, "vllm_mode")), None)
        if cfg is not None and getattr(cfg, "keyed_sampling", False) and getattr(cfg, "use_vllm", False):
            check_vllm_keyed_config(
                cfg.vllm_mode, getattr(cfg, "vllm_tensor_parallel_size", 1), getattr(cfg, "generation_kwargs", None)
            )
        super().__init__(*args, **kwargs)
        if self.keyed_sampling_enabled:  # fail at construction, not at the first generation
            self._check_keyed_supported()
            if not getattr(self, "use_vllm", False):
                self.keyed_sampler_settings()

    # ------------------------------------------------------------------ configuration
    def _check_keyed_supported(self) -> None:
        """Raise ``NotImplementedError`` for generation back-ends keyed sampling does not cover."""
        if getattr(self, "use_vllm", False):
            tp = getattr(self, "vllm_tensor_parallel_size", None)
            if tp is None:
                tp = getattr(self.args, "vllm_tensor_parallel_size", 1)
            check_vllm_keyed_config(getattr(self, "vllm_mode", None), tp, getattr(self.args, "generation_kwargs", None))
        if getattr(self, "use_transformers_continuous_batching", False):
            raise NotImplementedError("keyed_sampling does not support use_transformers_continuous_batching")
        if getattr(self, "tools", None):
            raise NotImplementedError(
                "keyed_sampling does not support tool-calling rollouts yet (TRL re-enters generation with partial "
                "rollouts); turn keyed_sampling off or remove the tools"
            )

    @property
    def keyed_sampling_enabled(self) -> bool:
        """``args.keyed_sampling`` (False when the config does not declare it)."""
        return bool(getattr(self.args, "keyed_sampling", False))

    def _keyed_seed(self) -> int:
        seed = getattr(self.args, "keyed_sampling_seed", None)
        seed = self.args.seed if seed is None else seed
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"keyed_sampling_seed must be an int or None, got {seed!r}")
        return seed

    def keyed_sampler_settings(self) -> SamplerSettings:
        """The :class:`SamplerSettings` this trainer samples with (from TRL's resolved generation settings).

        Raises
        ------
        ValueError
            If ``generation_kwargs`` asks for greedy decoding, beams or several return sequences, or for a
            warper the keyed sampler does not implement (``typical_p``, ``epsilon_cutoff``, ``eta_cutoff``,
            ``top_h``).
        """
        gk = dict(getattr(self.args, "generation_kwargs", None) or {})
        if gk.get("do_sample") is False:
            raise ValueError("keyed_sampling=True samples; generation_kwargs sets do_sample=False. Remove one of them.")
        if (gk.get("num_beams") or 1) != 1 or (gk.get("num_return_sequences") or 1) != 1:
            raise ValueError("keyed_sampling needs num_beams=1 and num_return_sequences=1 in generation_kwargs")
        bad = [k for k in _UNSUPPORTED_WARPERS if gk.get(k) is not None]
        if bad:
            raise ValueError(
                f"keyed_sampling does not implement the warper(s) {bad} set in generation_kwargs; remove them or "
                "turn keyed_sampling off"
            )
        gc = self.generation_config
        extra = {k: v for k, v in gk.items() if k not in _HANDLED}
        try:
            json.dumps(extra)
        except TypeError as e:
            raise ValueError(f"generation_kwargs must be JSON-serialisable to be logged for replay: {e}") from e
        eos = gc.eos_token_id
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return SamplerSettings(
            temperature=float(gc.temperature if gc.temperature is not None else 1.0),
            top_k=gc.top_k or None,
            top_p=gc.top_p if gc.top_p is not None and gc.top_p < 1.0 else None,
            min_p=gc.min_p,
            repetition_penalty=float(gc.repetition_penalty if gc.repetition_penalty is not None else 1.0),
            max_new_tokens=int(gc.max_new_tokens),
            eos_token_ids=[int(e) for e in eos],
            pad_token_id=int(gc.pad_token_id),
            extra_generation_kwargs=extra,
        )

    # ------------------------------------------------------------------ keys
    def _row_prompt_key(self, row: dict) -> str:
        col = getattr(self.args, "keyed_sampling_key_column", None)
        if col is None:
            return prompt_key_of(row.get("prompt"))
        if col not in row:
            raise KeyError(
                f"keyed_sampling_key_column={col!r} is not a column of the dataset rows (columns: {sorted(row)}); "
                "add it (e.g. ds.map(lambda x, i: {'row_idx': i}, with_indices=True)) or set the option to None"
            )
        val = row[col]
        if isinstance(val, torch.Tensor):
            val = val.item()
        return f"{col}:{val}"

    def keyed_requests_for_rows(
        self, rows: list[dict], *, already_drawn: dict[str, int] | None = None
    ) -> list[KeyedRequest]:
        """Build one :class:`KeyedRequest` per dataset row (collective: every rank must call it).

        Parameters
        ----------
        rows : list of dict
            The local dataset rows of this generation call (one per rollout to draw).
        already_drawn : dict, optional
            Prompt key -> number of samples of that prompt already drawn at this step, summed over ranks. By
            default the mixin keeps this count itself: it is reset whenever ``(mode, global_step)`` changes and
            grows by every call's global counts, so a second round (or a second generation batch) at the same step
            continues the sample index instead of reusing earlier noise. Passing it overrides (and does not update)
            the internal count.

        Returns
        -------
        list of KeyedRequest
            Key ``request_key(seed, global_step, prompt_key, mode)``; sample index = ``already_drawn[k]`` plus the
            occurrence number of the prompt key among the global rows of this call in rank order (gathered with
            ``gather_object``).
        """
        mode = "train" if self.model.training else "eval"
        step = int(self.state.global_step)
        seed = self._keyed_seed()
        local = [self._row_prompt_key(r) for r in rows]
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            everyone = gather_object([local])  # list of per-rank lists, rank order
            before = [k for per_rank in everyone[: self.accelerator.process_index] for k in per_rank]
            all_keys = [k for per_rank in everyone for k in per_rank]
        else:
            before, all_keys = [], local
        auto = already_drawn is None
        if auto:
            if getattr(self, "_keyed_drawn_at", None) != (mode, step):
                self._keyed_drawn_at = (mode, step)
                self._keyed_drawn = {}
            already_drawn = self._keyed_drawn
        seen: dict[str, int] = dict(already_drawn)
        for k in before:
            seen[k] = seen.get(k, 0) + 1
        requests = []
        for row, pk in zip(rows, local):
            j = seen.get(pk, 0)
            seen[pk] = j + 1
            requests.append(
                KeyedRequest(
                    key=request_key(seed, step, pk, mode=mode),
                    sample_index=j,
                    prompt_key=pk,
                    meta={"prompt": row.get("prompt"), "mode": mode, "seed": seed},
                )
            )
        if auto:
            for k in all_keys:
                self._keyed_drawn[k] = self._keyed_drawn.get(k, 0) + 1
        return requests

    def set_keyed_requests(self, requests: list[KeyedRequest] | None) -> None:
        """Set the rows of the next ``_generate_single_turn`` call (consumed by that call)."""
        if requests is not None and not all(isinstance(r, KeyedRequest) for r in requests):
            raise TypeError("set_keyed_requests expects a list of KeyedRequest")
        self._keyed_requests = None if requests is None else list(requests)

    # ------------------------------------------------------------------ TRL overrides
    def ext_generate_and_score(self, inputs):
        if not self.keyed_sampling_enabled:
            return super().ext_generate_and_score(inputs)
        self._check_keyed_supported()
        # Keys are built lazily by the _generate_single_turn call that uses these rows (a collective every rank
        # reaches); trainers that replay stored rollouts through TRL's tail never generate and never build them.
        self._keyed_rows = list(inputs)
        try:
            return super().ext_generate_and_score(inputs)
        finally:
            self._keyed_rows = None
            self._keyed_requests = None

    def ext_generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self.keyed_sampling_enabled:
            return super().ext_generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        self._check_keyed_supported()
        if images is not None or multimodal_fields:
            raise NotImplementedError("keyed_sampling does not support image/multimodal prompts yet")
        requests = self._take_keyed_requests(prompt_ids)
        if getattr(self, "use_vllm", False):
            return self._keyed_generate_vllm(prompt_ids, multimodal_fields, num_generations, has_tool_images, requests)
        return self._keyed_generate(prompt_ids, requests)

    def _take_keyed_requests(self, prompt_ids) -> list[KeyedRequest]:
        """This call's requests: those set by ``set_keyed_requests``, else built from the batch rows (collective).

        Shared by the transformers and vLLM paths, so both number samples identically and every rank reaches the
        gather in :meth:`keyed_requests_for_rows`.
        """
        requests = self._keyed_requests
        rows = getattr(self, "_keyed_rows", None)
        if requests is None and rows is not None and len(rows) == len(prompt_ids):
            requests = self.keyed_requests_for_rows(rows)
        self._keyed_rows = None  # the batch rows describe one generation call only
        if requests is None or len(requests) != len(prompt_ids):
            have = "none" if requests is None else len(requests)
            raise RuntimeError(
                f"keyed_sampling: a generation call got {len(prompt_ids)} prompts but {have} keyed requests. "
                "Trainers that generate rollouts themselves should use self.generate_rollouts(rows) (it keys the "
                "rows itself), or call self.set_keyed_requests([...one KeyedRequest per prompt...]) right before "
                "self.generate_token_ids(prompt_ids)."
            )
        self._keyed_requests = None  # consumed
        return requests

    # ------------------------------------------------------------------ generation + logging
    def _keyed_generate(self, prompt_ids, requests: list[KeyedRequest]):
        settings = self.keyed_sampler_settings()
        input_ids, attention_mask = left_pad(prompt_ids, settings.pad_token_id, self.pad_to_multiple_of)
        device = self.accelerator.device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        proc = KeyedGumbelLogitsProcessor.from_settings(
            [r.key for r in requests],
            [r.sample_index for r in requests],
            settings,
            prompt_length=input_ids.shape[1],
            position_offsets=[r.position_offset for r in requests],
        )
        from transformers import LogitsProcessorList

        if getattr(self.args, "shared_prefix_rollouts", False):
            return self._keyed_generate_shared(prompt_ids, requests, settings)
        with compat.generation_model(self) as unwrapped_model:
            out = unwrapped_model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=build_generation_config(settings),
                logits_processor=LogitsProcessorList([proc]),
            )
        completion_ids = truncate_at_eos(out[:, input_ids.shape[1] :].cpu(), settings.eos_token_ids)
        if getattr(self.args, "keyed_sampling_log", True):
            self._log_keyed_rollouts(prompt_ids, completion_ids, requests, settings, int(input_ids.shape[1]))
        return completion_ids, None

    def _keyed_generate_shared(self, prompt_ids, requests: list[KeyedRequest], settings: SamplerSettings):
        """Keyed sampling through the shared-prefix sampler: the same (key, sample index, position) noise, so the same
        tokens as :meth:`_keyed_generate` (``tests/test_shared_prefix.py``), with every distinct prefix computed once."""
        from trl_ext.measurement.shared_prefix import KeyedRows, shared_prefix_generate

        with compat.generation_model(self) as model:
            completion_ids, stats = shared_prefix_generate(model, [list(p) for p in prompt_ids], settings,
                                                           keyed=KeyedRows.from_requests(requests),
                                                           pad_to_multiple_of=self.pad_to_multiple_of)
        self.ext_record_shared_prefix_stats(stats)
        if getattr(self.args, "keyed_sampling_log", True):
            padded = max((len(p) for p in prompt_ids), default=0)
            self._write_rollout_records(
                prompt_ids, completion_ids, requests, per_row=None,
                extra={"backend": "transformers", "sampler": settings.to_dict(), "hash_version": HASH_VERSION},
                call_extra={"padded_prompt_length": padded, "generation": "shared_prefix/v1"},
            )  # fmt: skip
        return completion_ids, None

    def _keyed_generate_vllm(self, prompt_ids, multimodal_fields, num_generations, has_tool_images, requests):
        """TRL's own vLLM generation (colocate, TP = 1) with one seeded ``SamplingParams`` per row.

        Row ``i`` is sampled with ``seed = per_request_seed(requests[i].key, requests[i].sample_index)``.
        ``self.vllm_generation.llm`` is a :class:`PerRequestSeedLLM` for the duration of the call and is restored
        afterwards, also when generation raises. Returns what TRL's ``_generate_single_turn`` returns:
        ``(completion_ids, sampling_logprobs)``.

        Raises
        ------
        NotImplementedError
            If a request has ``position_offset != 0``: vLLM's per-request generator restarts at the first generated
            token, so a continuation cannot see the draws a single pass would have seen.
        RuntimeError
            If TRL never called ``llm.generate`` (nothing was sampled with the seeds).
        """
        if any(r.position_offset != 0 for r in requests):
            raise NotImplementedError(
                "keyed_sampling with vLLM does not support continuations (position_offset != 0): vLLM's per-request "
                "generator restarts at the first generated token. Use use_vllm=False for two-phase generation."
            )
        seeds = [per_request_seed(int(r.key), int(r.sample_index)) for r in requests]
        proxy = PerRequestSeedLLM(self.vllm_generation.llm, prompt_ids, seeds)
        with compat.swap_vllm_engine(self, proxy):
            completion_ids, logprobs = super().ext_generate_single_turn(
                prompt_ids, None, multimodal_fields, num_generations, has_tool_images
            )
        if proxy.calls != 1 and len(prompt_ids) > 0:
            raise RuntimeError(
                f"keyed_sampling (vLLM): TRL's vLLM generation made {proxy.calls} llm.generate calls for one keyed "
                "call (expected 1); the per-request seeds were not applied as documented"
            )
        if getattr(self.args, "keyed_sampling_log", True):
            params = vllm_sampling_params_record(proxy.template) if proxy.template is not None else {}
            vllm_mod = sys.modules.get("vllm")
            extra = {
                "backend": "vllm",
                "seed_scheme": VLLM_SEED_SCHEME,
                "vllm_sampling_params": params,
                "engine": {"name": "vllm", "version": getattr(vllm_mod, "__version__", None)},
            }
            self._write_rollout_records(
                prompt_ids, completion_ids, requests, per_row=[{"request_seed": s} for s in seeds], extra=extra,
                call_extra={},
            )  # fmt: skip
        return completion_ids, logprobs

    def keyed_rollout_log_path(self) -> str:
        """``<output_dir>/rollouts/rank<r>.jsonl`` for this process."""
        return os.path.join(self.args.output_dir, "rollouts", f"rank{self.accelerator.process_index}.jsonl")

    def _log_keyed_rollouts(self, prompt_ids, completion_ids, requests, settings: SamplerSettings, padded_len: int):
        sdict = settings.to_dict()
        self._write_rollout_records(
            prompt_ids, completion_ids, requests, per_row=None,
            extra={"backend": "transformers", "sampler": sdict, "hash_version": HASH_VERSION},
            call_extra={"padded_prompt_length": padded_len},
        )  # fmt: skip

    def _write_rollout_records(self, prompt_ids, completion_ids, requests, *, per_row, extra: dict, call_extra: dict):
        """Append one JSON line per rollout to :meth:`keyed_rollout_log_path` (shared by both back-ends)."""
        path = self.keyed_rollout_log_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        step = int(self.state.global_step)
        rank = int(self.accelerator.process_index)
        call_id = f"s{step}-r{rank}-c{self._keyed_call_counter}"
        self._keyed_call_counter += 1
        name = getattr(getattr(self.model, "config", None), "_name_or_path", None) or None
        # Weights used at global step s are those a save at step s writes to checkpoint-s (step 0: the start model).
        checkpoint = os.path.join(self.args.output_dir, f"checkpoint-{step}") if step > 0 else name
        with open(path, "a", encoding="utf-8") as f:
            for i, (p, c, r) in enumerate(zip(prompt_ids, completion_ids, requests, strict=True)):
                rec: dict[str, Any] = {
                    "format": ROLLOUT_FORMAT,
                    "key": int(r.key),
                    "sample_index": int(r.sample_index),
                    "position_offset": int(r.position_offset),
                    "prompt_key": r.prompt_key,
                    "step": step,
                    "rank": rank,
                    "checkpoint": checkpoint,
                    "model": name,
                    "prompt_ids": [int(t) for t in p],
                    "completion_ids": [int(t) for t in c],
                    **extra,
                    **(per_row[i] if per_row is not None else {}),
                    "call": {"id": call_id, "row": i, "rows": len(prompt_ids), **call_extra},
                    **{k: v for k, v in r.meta.items() if k not in ("key", "sample_index")},
                }
                f.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")

    def keyed_drop_records_from_step(self, step: int) -> int:
        """Remove this rank's logged rollouts of steps ``>= step`` (after a resume they are generated again, with the
        same keys and the same tokens); returns how many were removed. The log is rewritten atomically."""
        path = self.keyed_rollout_log_path()
        if not os.path.exists(path):
            return 0
        kept, dropped = [], 0
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec_step = int(json.loads(line).get("step", -1))
                except (json.JSONDecodeError, TypeError, ValueError):
                    rec_step = -1  # a line torn by the crash: dropped too
                    dropped += 1
                    continue
                if rec_step >= step:
                    dropped += 1
                else:
                    kept.append(line if line.endswith("\n") else line + "\n")
        if dropped:
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(kept)
            os.replace(tmp, path)
        return dropped

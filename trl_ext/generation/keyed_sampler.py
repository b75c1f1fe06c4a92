"""Keyed, replayable rollouts as a generation back-end: :class:`KeyedSampler`.

With ``args.keyed_sampling=True`` the base trainer owns one ``KeyedSampler`` (``trainer.keyed_sampler``; ``None``
otherwise, and TRL's generation runs unchanged). Every rollout's tokens are then drawn by
:class:`~trl_ext.measurement.keyed_sampling.KeyedGumbelLogitsProcessor` from noise keyed to
``request_key(seed, global_step, prompt_key)`` and the rollout's sample index ("Measurement Discipline for RLVR",
"2. Every request should carry its own replay key"), and each rollout is appended to
``<output_dir>/rollouts/rank<r>.jsonl`` with everything :func:`trl_ext.measurement.replay.regenerate` needs.

Config fields read: ``keyed_sampling``; ``keyed_sampling_seed`` (``None``: ``args.seed``; two runs that must draw
identical noise share it); ``keyed_sampling_key_column`` (a dataset column with a stable question id; ``None``: a
hash of the prompt, :func:`~trl_ext.measurement.keyed_sampling.prompt_key_of`); ``keyed_sampling_log``.

Sample index: the ``j``-th draw of a prompt key at the current ``(mode, global_step)`` -- earlier generation calls
at this step plus earlier rows of this call's *global* batch (rank order, gathered across processes) -- gets
sample index ``j``; with TRL's ``RepeatSampler`` the ``G`` copies of a prompt are ``0..G-1``, and a prompt that
appears twice in one batch gets ``G..2G-1`` for its second group rather than a copy of the first group's noise.

vLLM (``use_vllm=True``): colocate mode with ``vllm_tensor_parallel_size == 1`` only, through per-request seeds
(:mod:`trl_ext.generation.keyed_vllm`). Not supported (clear ``NotImplementedError``): vLLM server mode and TP > 1,
transformers continuous batching, images/multimodal prompts, tool-calling loops.

Strategies that generate rollouts themselves use the base trainer's public API:
:meth:`~trl_ext.GRPOTrainer.generate_rollouts` keys its rows itself; before
:meth:`~trl_ext.GRPOTrainer.generate_token_ids` (token-id prompts, no rows) call
``trainer.keyed_sampler.set_requests`` with one :class:`KeyedRequest` per prompt; use ``position_offset`` for
continuations so a prefix plus its continuation sees exactly the noise of one pass.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
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

from ..trainers import _trl_compat as compat
from .keyed_vllm import VLLM_SEED_SCHEME, PerRequestSeedLLM, check_vllm_keyed_config, vllm_sampling_params_record

__all__ = ["ROLLOUT_FORMAT", "KeyedRequest", "KeyedSampler"]

#: ``format`` field of every rollout record.
ROLLOUT_FORMAT = "trl_ext.keyed_rollout/v1"
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


def check_before_trl_init(args) -> None:
    """vLLM configurations keyed sampling cannot serve fail before TRL starts the engine or connects to a server."""
    if getattr(args, "keyed_sampling", False) and getattr(args, "use_vllm", False):
        check_vllm_keyed_config(args.vllm_mode, getattr(args, "vllm_tensor_parallel_size", 1),
                                getattr(args, "generation_kwargs", None))


class KeyedSampler:
    """The keyed generation back-end of one trainer (built by the base trainer after TRL's setup).

    It reads the trainer's configuration and state (``args``, ``state.global_step``, ``model.training``,
    ``accelerator``, ``generation_config``) and samples with its model; the trainer calls it from its generation
    hooks and never the other way round, except that the vLLM path runs the trainer's own (unkeyed) generation with
    the per-request-seed engine swapped in.

    Raises
    ------
    NotImplementedError, ValueError
        At construction, for back-ends and generation settings keyed sampling does not cover
        (:meth:`check_supported`, :meth:`settings`).
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self._requests: list[KeyedRequest] | None = None
        self._rows: list[dict] | None = None
        self._call_counter = 0
        self._drawn_at: tuple | None = None
        self._drawn: dict[str, int] = {}
        self.check_supported()  # fail at construction, not at the first generation
        if not getattr(trainer, "use_vllm", False):
            self.settings()

    # ------------------------------------------------------------------ configuration
    def check_supported(self) -> None:
        """Raise ``NotImplementedError`` for generation back-ends keyed sampling does not cover."""
        t = self.trainer
        if getattr(t, "use_vllm", False):
            tp = getattr(t, "vllm_tensor_parallel_size", None)
            if tp is None:
                tp = getattr(t.args, "vllm_tensor_parallel_size", 1)
            check_vllm_keyed_config(getattr(t, "vllm_mode", None), tp, getattr(t.args, "generation_kwargs", None))
        if getattr(t, "use_transformers_continuous_batching", False):
            raise NotImplementedError("keyed_sampling does not support use_transformers_continuous_batching")
        if getattr(t, "tools", None):
            raise NotImplementedError(
                "keyed_sampling does not support tool-calling rollouts yet (TRL re-enters generation with partial "
                "rollouts); turn keyed_sampling off or remove the tools"
            )

    def seed(self) -> int:
        """``args.keyed_sampling_seed``, or ``args.seed`` when that is ``None``."""
        args = self.trainer.args
        seed = args.seed if args.keyed_sampling_seed is None else args.keyed_sampling_seed
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"keyed_sampling_seed must be an int or None, got {seed!r}")
        return seed

    def settings(self) -> SamplerSettings:
        """The :class:`SamplerSettings` the trainer samples with (from TRL's resolved generation settings).

        Raises
        ------
        ValueError
            If ``generation_kwargs`` asks for greedy decoding, beams or several return sequences, or for a
            warper the keyed sampler does not implement (``typical_p``, ``epsilon_cutoff``, ``eta_cutoff``,
            ``top_h``).
        """
        gk = dict(self.trainer.args.generation_kwargs or {})
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
        gc = self.trainer.generation_config
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
    def row_prompt_key(self, row: dict) -> str:
        """The question identity of a dataset row (``keyed_sampling_key_column`` or a hash of the prompt)."""
        col = self.trainer.args.keyed_sampling_key_column
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

    def requests_for_rows(self, rows: list[dict], *, already_drawn: dict[str, int] | None = None
                          ) -> list[KeyedRequest]:
        """Build one :class:`KeyedRequest` per dataset row (collective: every rank must call it).

        Parameters
        ----------
        rows : list of dict
            The local dataset rows of this generation call (one per rollout to draw).
        already_drawn : dict, optional
            Prompt key -> number of samples of that prompt already drawn at this step, summed over ranks. By
            default the sampler keeps this count itself: it is reset whenever ``(mode, global_step)`` changes and
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
        t = self.trainer
        mode = "train" if t.model.training else "eval"
        step = int(t.state.global_step)
        seed = self.seed()
        local = [self.row_prompt_key(r) for r in rows]
        if t.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            everyone = gather_object([local])  # list of per-rank lists, rank order
            before = [k for per_rank in everyone[: t.accelerator.process_index] for k in per_rank]
            all_keys = [k for per_rank in everyone for k in per_rank]
        else:
            before, all_keys = [], local
        auto = already_drawn is None
        if auto:
            if self._drawn_at != (mode, step):
                self._drawn_at, self._drawn = (mode, step), {}
            already_drawn = self._drawn
        seen: dict[str, int] = dict(already_drawn)
        for k in before:
            seen[k] = seen.get(k, 0) + 1
        requests = []
        for row, pk in zip(rows, local):
            j = seen.get(pk, 0)
            seen[pk] = j + 1
            requests.append(KeyedRequest(key=request_key(seed, step, pk, mode=mode), sample_index=j, prompt_key=pk,
                                         meta={"prompt": row.get("prompt"), "mode": mode, "seed": seed}))
        if auto:
            for k in all_keys:
                self._drawn[k] = self._drawn.get(k, 0) + 1
        return requests

    def set_requests(self, requests: list[KeyedRequest] | None) -> None:
        """Set the rows of the next generation call (consumed by that call)."""
        if requests is not None and not all(isinstance(r, KeyedRequest) for r in requests):
            raise TypeError("set_requests expects a list of KeyedRequest")
        self._requests = None if requests is None else list(requests)

    @property
    def pending_requests(self) -> list[KeyedRequest] | None:
        """Requests set for the next generation call (``None`` if none)."""
        return self._requests

    @contextmanager
    def batch_rows(self, inputs):
        """Scope of one generation batch: its dataset rows key the generation call that uses them.

        Keys are built lazily by that call (a collective every rank reaches); trainers that replay stored rollouts
        through TRL's tail never generate and never build them.
        """
        self.check_supported()
        self._rows = list(inputs)
        try:
            yield
        finally:
            self._rows = None
            self._requests = None

    def _take_requests(self, prompt_ids) -> list[KeyedRequest]:
        """This call's requests: those set by :meth:`set_requests`, else built from the batch rows (collective).

        Shared by the transformers and vLLM paths, so both number samples identically and every rank reaches the
        gather in :meth:`requests_for_rows`.
        """
        requests, rows = self._requests, self._rows
        if requests is None and rows is not None and len(rows) == len(prompt_ids):
            requests = self.requests_for_rows(rows)
        self._rows = None  # the batch rows describe one generation call only
        if requests is None or len(requests) != len(prompt_ids):
            have = "none" if requests is None else len(requests)
            raise RuntimeError(
                f"keyed_sampling: a generation call got {len(prompt_ids)} prompts but {have} keyed requests. "
                "Strategies that generate rollouts themselves should use trainer.generate_rollouts(rows) (it keys "
                "the rows itself), or call trainer.keyed_sampler.set_requests([...one KeyedRequest per prompt...]) "
                "right before trainer.generate_token_ids(prompt_ids)."
            )
        self._requests = None  # consumed
        return requests

    # ------------------------------------------------------------------ generation
    def generate(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """One keyed generation call; returns what TRL's ``_generate_single_turn`` returns."""
        self.check_supported()
        if images is not None or multimodal_fields:
            raise NotImplementedError("keyed_sampling does not support image/multimodal prompts yet")
        requests = self._take_requests(prompt_ids)
        if getattr(self.trainer, "use_vllm", False):
            return self._generate_vllm(prompt_ids, multimodal_fields, num_generations, has_tool_images, requests)
        settings = self.settings()
        if self.trainer.args.shared_prefix_rollouts:
            return self._generate_shared(prompt_ids, requests, settings)
        return self._generate_transformers(prompt_ids, requests, settings)

    def _generate_transformers(self, prompt_ids, requests: list[KeyedRequest], settings: SamplerSettings):
        from transformers import LogitsProcessorList

        t = self.trainer
        input_ids, attention_mask = left_pad(prompt_ids, settings.pad_token_id, t.pad_to_multiple_of)
        device = t.accelerator.device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        proc = KeyedGumbelLogitsProcessor.from_settings(
            [r.key for r in requests], [r.sample_index for r in requests], settings,
            prompt_length=input_ids.shape[1], position_offsets=[r.position_offset for r in requests],
        )  # fmt: skip
        with compat.generation_model(t) as unwrapped_model:
            out = unwrapped_model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                           generation_config=build_generation_config(settings),
                                           logits_processor=LogitsProcessorList([proc]))
        completion_ids = truncate_at_eos(out[:, input_ids.shape[1]:].cpu(), settings.eos_token_ids)
        self._write_transformers_records(prompt_ids, completion_ids, requests, settings,
                                         {"padded_prompt_length": int(input_ids.shape[1])})
        return completion_ids, None

    def _generate_shared(self, prompt_ids, requests: list[KeyedRequest], settings: SamplerSettings):
        """Keyed sampling through the shared-prefix sampler: the same (key, sample index, position) noise, so the same
        tokens as the plain keyed path (``tests/test_shared_prefix.py``), with every distinct prefix computed once."""
        from trl_ext.measurement.shared_prefix import KeyedRows, shared_prefix_generate

        t = self.trainer
        with compat.generation_model(t) as model:
            completion_ids, stats = shared_prefix_generate(model, [list(p) for p in prompt_ids], settings,
                                                           keyed=KeyedRows.from_requests(requests),
                                                           pad_to_multiple_of=t.pad_to_multiple_of)
        t.ext_record_shared_prefix_stats(stats)
        padded = max((len(p) for p in prompt_ids), default=0)
        self._write_transformers_records(prompt_ids, completion_ids, requests, settings,
                                         {"padded_prompt_length": padded, "generation": "shared_prefix/v1"})
        return completion_ids, None

    def _generate_vllm(self, prompt_ids, multimodal_fields, num_generations, has_tool_images, requests):
        """TRL's own vLLM generation (colocate, TP = 1) with one seeded ``SamplingParams`` per row.

        Row ``i`` is sampled with ``seed = per_request_seed(requests[i].key, requests[i].sample_index)``.
        ``trainer.vllm_generation.llm`` is a :class:`~trl_ext.generation.keyed_vllm.PerRequestSeedLLM` for the duration
        of the call and is restored afterwards, also when generation raises.

        Raises
        ------
        NotImplementedError
            If a request has ``position_offset != 0``: vLLM's per-request generator restarts at the first generated
            token, so a continuation cannot see the draws a single pass would have seen.
        RuntimeError
            If TRL did not call ``llm.generate`` exactly once (the seeds were not applied as documented).
        """
        if any(r.position_offset != 0 for r in requests):
            raise NotImplementedError(
                "keyed_sampling with vLLM does not support continuations (position_offset != 0): vLLM's per-request "
                "generator restarts at the first generated token. Use use_vllm=False for two-phase generation."
            )
        t = self.trainer
        seeds = [per_request_seed(int(r.key), int(r.sample_index)) for r in requests]
        proxy = PerRequestSeedLLM(t.vllm_generation.llm, prompt_ids, seeds)
        with compat.swap_vllm_engine(t, proxy):
            completion_ids, logprobs = t.generate_unkeyed(prompt_ids, None, multimodal_fields, num_generations,
                                                          has_tool_images)
        if proxy.calls != 1 and len(prompt_ids) > 0:
            raise RuntimeError(
                f"keyed_sampling (vLLM): TRL's vLLM generation made {proxy.calls} llm.generate calls for one keyed "
                "call (expected 1); the per-request seeds were not applied as documented"
            )
        if t.args.keyed_sampling_log:
            params = vllm_sampling_params_record(proxy.template) if proxy.template is not None else {}
            vllm_mod = sys.modules.get("vllm")
            extra = {"backend": "vllm", "seed_scheme": VLLM_SEED_SCHEME, "vllm_sampling_params": params,
                     "engine": {"name": "vllm", "version": getattr(vllm_mod, "__version__", None)}}
            self._write_records(prompt_ids, completion_ids, requests, per_row=[{"request_seed": s} for s in seeds],
                                extra=extra, call_extra={})
        return completion_ids, logprobs

    # ------------------------------------------------------------------ rollout log
    def log_path(self) -> str:
        """``<output_dir>/rollouts/rank<r>.jsonl`` for this process."""
        t = self.trainer
        return os.path.join(t.args.output_dir, "rollouts", f"rank{t.accelerator.process_index}.jsonl")

    def _write_transformers_records(self, prompt_ids, completion_ids, requests, settings, call_extra: dict):
        if self.trainer.args.keyed_sampling_log:
            self._write_records(prompt_ids, completion_ids, requests, per_row=None, call_extra=call_extra,
                                extra={"backend": "transformers", "sampler": settings.to_dict(),
                                       "hash_version": HASH_VERSION})

    def _write_records(self, prompt_ids, completion_ids, requests, *, per_row, extra: dict, call_extra: dict):
        """Append one JSON line per rollout to :meth:`log_path` (shared by both back-ends)."""
        t = self.trainer
        path = self.log_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        step, rank = int(t.state.global_step), int(t.accelerator.process_index)
        call_id = f"s{step}-r{rank}-c{self._call_counter}"
        self._call_counter += 1
        name = getattr(getattr(t.model, "config", None), "_name_or_path", None) or None
        # Weights used at global step s are those a save at step s writes to checkpoint-s (step 0: the start model).
        checkpoint = os.path.join(t.args.output_dir, f"checkpoint-{step}") if step > 0 else name
        with open(path, "a", encoding="utf-8") as f:
            for i, (p, c, r) in enumerate(zip(prompt_ids, completion_ids, requests, strict=True)):
                rec: dict[str, Any] = {
                    "format": ROLLOUT_FORMAT, "key": int(r.key), "sample_index": int(r.sample_index),
                    "position_offset": int(r.position_offset), "prompt_key": r.prompt_key, "step": step,
                    "rank": rank, "checkpoint": checkpoint, "model": name, "prompt_ids": [int(x) for x in p],
                    "completion_ids": [int(x) for x in c], **extra, **(per_row[i] if per_row is not None else {}),
                    "call": {"id": call_id, "row": i, "rows": len(prompt_ids), **call_extra},
                    **{k: v for k, v in r.meta.items() if k not in ("key", "sample_index")},
                }  # fmt: skip
                f.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")

    def drop_records_from_step(self, step: int) -> int:
        """Remove this rank's logged rollouts of steps ``>= step`` (after a resume they are generated again, with the
        same keys and the same tokens); returns how many were removed. The log is rewritten atomically. A line torn
        by a crash (not JSON) is dropped too: this reader is tolerant on purpose."""
        path = self.log_path()
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

"""Keyed, replayable sampling for transformers generation (Gumbel-max with addressable noise).

Background ("Measurement Discipline for RLVR", "1. The sampler's noise should be addressable" and
"2. Every request should carry its own replay key"): sampling a token from ``softmax(z / T)`` is the same as
taking ``argmax_v (z_v / T + g_v)`` with ``g_v`` i.i.d. standard Gumbel (the Gumbel-max trick; Kool, van Hoof
and Welling, ICML 2019, arXiv:1903.06059, eq. 1). Ordinary samplers draw ``g`` from a live RNG and throw it
away. Here ``g`` is a pure function of ``(request key, sample index, position, vocabulary index)``, so

* a rollout regenerates byte-identically from the three numbers that are logged with it (key, sample index,
  checkpoint) whenever the model produces the same logits again (always at a fixed batch shape on a
  deterministic backend);
* the noise of one row never depends on the other rows of the batch (no shared RNG stream), so a rollout can
  be replayed alone;
* two checkpoints driven by the same keys produce identical tokens until the models themselves disagree, and
  the first differing token is a statement about the models, not about luck.

The prior art for keyed Gumbel noise is LLM watermarking (``jthickstun/watermark``, ``gumbel/key.py``);
seed-keying proposals for RL rollouts are verl PR #6857 and AReaL PR #1524.

Hash
----
A counter-based hash (no state): two independent 32-bit lanes, each a chain of Wellons' ``triple32``
integer finaliser (a bijection of 32-bit words with very low avalanche bias)::

    s = t(salt ^ key_lo); s = t(s ^ key_hi); s = t(s ^ sample_index); s = t(s ^ position)     # per row
    w[v] = t(s ^ v)                                                                             # per token

The two lanes' words give a 52-bit integer ``m`` and ``u = (m + 1/2) / 2**52`` in the open interval
``(0, 1)`` (the end points ``2**-53`` and ``1 - 2**-53`` are exact in float64), and ``g = -log(-log u)``.
All integer arithmetic is done in ``int64`` on values below ``2**48``, so it never overflows and is identical
on every torch backend (32-bit products are split into 16-bit halves). Because ``t`` is a bijection, the
words of one row are pairwise distinct across the vocabulary. This is a statistical hash, not a
cryptographic one.

Public API
----------
``keyed_uniform``, ``keyed_gumbel``
    The noise itself, shape ``(B, V)``.
``request_key``, ``prompt_key_of``, ``per_request_seed``
    Stable 63-bit request keys (and a derived seed for engines such as vLLM that take one).
``SamplerSettings``, ``build_generation_config``
    The sampling settings logged with every rollout, and the greedy ``GenerationConfig`` that runs them.
``KeyedGumbelLogitsProcessor``
    The transformers ``LogitsProcessor``: temperature, top-k, top-p, min-p (the very warpers transformers
    itself uses), then keyed Gumbel noise; run it with ``do_sample=False``.
``keyed_generate``
    Left-pad prompts, run ``model.generate`` with the processor, return EOS-truncated completions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

# The noise and the keys live in keyed_noise; its public names stay importable from here.
from .keyed_noise import (  # noqa: F401
    HASH_VERSION,
    MASK32,
    MAX_KEY,
    as_int64_vector,
    keyed_gumbel,
    keyed_uniform,
    per_request_seed,
    prompt_key_of,
    request_key,
)

__all__ = [
    "HASH_VERSION",
    "KeyedGumbelLogitsProcessor",
    "SamplerSettings",
    "build_generation_config",
    "keyed_generate",
    "keyed_gumbel",
    "keyed_uniform",
    "left_pad",
    "per_request_seed",
    "prompt_key_of",
    "request_key",
    "truncate_at_eos",
]


@dataclass
class SamplerSettings:
    """Everything besides the model and the prompt that decides a keyed completion (logged per rollout).

    Attributes
    ----------
    temperature : float
        ``T > 0``; logits are divided by it before the noise is added.
    top_k : int or None
        Keep the ``k`` largest logits (``None`` or 0: off).
    top_p : float or None
        Nucleus filter in ``(0, 1]`` (``None`` or 1.0: off).
    min_p : float or None
        Min-p filter in ``[0, 1]`` (``None``: off).
    repetition_penalty : float
        transformers' repetition penalty (1.0: off); applied by ``generate`` before the keyed processor.
    max_new_tokens : int
        Completion length cap.
    eos_token_ids : list of int
        Tokens that end a completion (the completion keeps the first one, like TRL).
    pad_token_id : int
        Left-padding token for prompts.
    noise_dtype : str
        ``"float64"`` (default) or ``"float32"``; the dtype the race ``z/T + g`` is run in.
    hash_version : str
        :data:`HASH_VERSION` at logging time.
    extra_generation_kwargs : dict
        Further ``GenerationConfig`` fields that act as logits processors regardless of ``do_sample``
        (e.g. ``no_repeat_ngram_size``, ``suppress_tokens``).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    max_new_tokens: int = 16
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int = 0
    noise_dtype: str = "float64"
    hash_version: str = HASH_VERSION
    extra_generation_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        t = self.temperature
        if not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"temperature must be a finite number > 0, got {t!r} (use greedy decoding for T=0)")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 0):
            raise ValueError(f"top_k must be None or a non-negative int, got {self.top_k!r}")
        if self.top_p is not None and not 0.0 < float(self.top_p) <= 1.0:
            raise ValueError(f"top_p must be None or in (0, 1], got {self.top_p!r}")
        if self.min_p is not None and not 0.0 <= float(self.min_p) <= 1.0:
            raise ValueError(f"min_p must be None or in [0, 1], got {self.min_p!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if isinstance(self.eos_token_ids, int):
            self.eos_token_ids = [self.eos_token_ids]
        self.eos_token_ids = [int(e) for e in (self.eos_token_ids or [])]
        if self.noise_dtype not in ("float64", "float32"):
            raise ValueError(f"noise_dtype must be 'float64' or 'float32', got {self.noise_dtype!r}")
        if self.hash_version != HASH_VERSION:
            raise ValueError(
                f"these settings were logged with noise hash {self.hash_version!r}, but this trl_ext implements "
                f"{HASH_VERSION!r}; replay with the trl_ext version that wrote the log"
            )

    def to_dict(self) -> dict:
        """JSON-ready dict (round-trips through :meth:`from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SamplerSettings:
        """Rebuild from :meth:`to_dict` output; unknown fields raise ``ValueError``."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown sampler setting(s) {unknown}; expected a subset of {sorted(known)}")
        return cls(**d)


def build_generation_config(settings: SamplerSettings) -> GenerationConfig:
    """The greedy ``GenerationConfig`` under which :class:`KeyedGumbelLogitsProcessor` samples.

    ``do_sample=False`` so transformers adds no warpers and takes the plain argmax of the processed scores;
    temperature/top-k/top-p/min-p are applied inside the keyed processor instead.
    """
    kwargs = dict(settings.extra_generation_kwargs)
    kwargs.update(
        max_new_tokens=settings.max_new_tokens,
        do_sample=False,
        num_beams=1,
        pad_token_id=settings.pad_token_id,
        eos_token_id=list(settings.eos_token_ids) or None,
        repetition_penalty=settings.repetition_penalty,
        temperature=None,
        top_k=None,
        top_p=None,
        min_p=None,
        disable_compile=True,
    )
    return GenerationConfig(**kwargs)


class KeyedGumbelLogitsProcessor(LogitsProcessor):
    r"""Sample each row's next token by a keyed Gumbel-max race; run under ``do_sample=False``.

    For row ``b`` at generated position ``t`` the processor computes

    .. math:: s_{b,v} = \tilde z_{b,v} + g(k_b, i_b, t + o_b, v),\qquad
              \text{token}_b = \arg\max_v s_{b,v}

    where :math:`\tilde z` are the logits after transformers' ``TemperatureLogitsWarper``,
    ``TopKLogitsWarper``, ``TopPLogitsWarper`` and ``MinPLogitsWarper`` (in that order, exactly as
    ``generate(do_sample=True)`` would apply them; filtered entries are ``-inf``) and ``g`` is
    :func:`keyed_gumbel`. Since ``g`` is i.i.d. standard Gumbel over ``v``, the token is distributed as
    ``softmax(\tilde z_b)`` (Gumbel-max, Kool et al. 2019, eq. 1) -- the same law as the ordinary sampler.
    The processor returns a score tensor that is ``0`` at the winner and ``-inf`` elsewhere, so the greedy
    argmax of ``generate`` picks the winner whatever the dtype.

    Parameters
    ----------
    keys : sequence of int, shape (B,)
        Request key of each row.
    sample_indices : sequence of int, shape (B,)
        Sample index of each row.
    prompt_length : int
        Length of the (left-padded) prompt block passed to ``generate``; position ``t`` is
        ``input_ids.shape[1] - prompt_length``, the generated-token index (padding never shifts it).
    position_offsets : sequence of int, optional
        Added to ``t`` per row (default 0). Continuing a completion from a ``tau``-token prefix with offset
        ``tau`` reproduces the noise a single pass would have used.
    temperature, top_k, top_p, min_p : optional
        As in :class:`SamplerSettings`.
    noise_dtype : torch.dtype, default torch.float64
        Dtype of the race.

    Raises
    ------
    ValueError
        At call time: batch size or vocabulary width mismatch, ``input_ids`` shorter than ``prompt_length``,
        or NaN logits (the row indices are listed).
    """

    def __init__(
        self,
        keys: Sequence[int],
        sample_indices: Sequence[int],
        *,
        prompt_length: int,
        position_offsets: Sequence[int] | None = None,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        noise_dtype: torch.dtype = torch.float64,
    ):
        self.keys = as_int64_vector("keys", list(keys), None, "cpu", MAX_KEY)
        n = self.keys.numel()
        if n == 0:
            raise ValueError("keys is empty: pass one request key per row of the batch")
        self.sample_indices = as_int64_vector("sample_indices", list(sample_indices), n, "cpu", MASK32)
        offs = [0] * n if position_offsets is None else list(position_offsets)
        self.position_offsets = as_int64_vector("position_offsets", offs, n, "cpu", MASK32)
        if isinstance(prompt_length, bool) or not isinstance(prompt_length, int) or prompt_length < 0:
            raise ValueError(f"prompt_length must be a non-negative int, got {prompt_length!r}")
        self.prompt_length = prompt_length
        # Validate the sampling settings with the same rules as SamplerSettings.
        SamplerSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        self.noise_dtype = noise_dtype
        self.warpers: list[LogitsProcessor] = []
        if temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(float(temperature)))
        if top_k:
            self.warpers.append(TopKLogitsWarper(top_k=int(top_k)))
        if top_p is not None and top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=float(top_p)))
        if min_p is not None:
            self.warpers.append(MinPLogitsWarper(min_p=float(min_p)))

    @classmethod
    def from_settings(cls, keys, sample_indices, settings: SamplerSettings, *, prompt_length, position_offsets=None):
        """Build from a :class:`SamplerSettings` (the logged form)."""
        return cls(
            keys,
            sample_indices,
            prompt_length=prompt_length,
            position_offsets=position_offsets,
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
            min_p=settings.min_p,
            noise_dtype=getattr(torch, settings.noise_dtype),
        )

    def warp(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.Tensor:
        """``\\tilde z``: the logits after temperature and the filters (no noise)."""
        for w in self.warpers:
            scores = w(input_ids, scores)
        return scores

    def positions(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """Generated-token index of every row for this call, shape (B,)."""
        t = input_ids.shape[1] - self.prompt_length
        if t < 0:
            raise ValueError(
                f"input_ids has {input_ids.shape[1]} columns, fewer than prompt_length={self.prompt_length}; "
                "build a new processor for every generate() call with the padded prompt length"
            )
        return self.position_offsets.to(input_ids.device) + t

    def keyed_scores(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.Tensor:
        """The race ``\\tilde z + g`` itself, shape (B, V), in ``noise_dtype`` (for diagnostics and diffs)."""
        b, v = scores.shape
        if b != self.keys.numel():
            raise ValueError(
                f"the batch has {b} rows but the processor was built for {self.keys.numel()} keys; "
                "pass one key per row (num_return_sequences must be 1)"
            )
        nan_rows = torch.isnan(scores).any(dim=1)
        if nan_rows.any():
            raise ValueError(f"logits contain NaN in rows {nan_rows.nonzero().flatten().tolist()}; check the model")
        z = self.warp(input_ids, scores).to(self.noise_dtype)
        dev = scores.device
        g = keyed_gumbel(
            self.keys.to(dev), self.sample_indices.to(dev), self.positions(input_ids), v, dtype=self.noise_dtype
        )
        return z + g

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        race = self.keyed_scores(input_ids, scores)
        winner = race.argmax(dim=-1)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, winner[:, None], 0.0)
        return out


def left_pad(prompt_ids: Sequence[Sequence[int]], pad_token_id: int, pad_to_multiple_of: int | None = None):
    """Left-pad token-id lists into ``(input_ids, attention_mask)`` int64 tensors (TRL's layout)."""
    if len(prompt_ids) == 0:
        raise ValueError("no prompts given")
    lens = [len(p) for p in prompt_ids]
    if min(lens) == 0:
        raise ValueError(f"prompt {lens.index(0)} is empty; every prompt needs at least one token")
    width = max(lens)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    ids = torch.full((len(prompt_ids), width), int(pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def truncate_at_eos(completion_ids: torch.Tensor, eos_token_ids: Sequence[int]) -> list[list[int]]:
    """Cut each row after its first EOS (kept), as TRL's ``_generate_single_turn`` does."""
    rows = []
    eos = set(int(e) for e in eos_token_ids)
    for row in completion_ids.tolist():
        out = []
        for tok in row:
            out.append(tok)
            if tok in eos:
                break
        rows.append(out)
    return rows


@torch.no_grad()
def keyed_generate(
    model,
    prompt_ids: Sequence[Sequence[int]],
    keys: Sequence[int],
    sample_indices: Sequence[int],
    settings: SamplerSettings,
    *,
    position_offsets: Sequence[int] | None = None,
    pad_to_multiple_of: int | None = None,
) -> list[list[int]]:
    """Generate one keyed completion per prompt row with ``model.generate``.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM (already unwrapped from DDP/FSDP); its current train/eval mode is used as is.
    prompt_ids : list of list of int, length B
        Unpadded prompt token ids (left-padded here with ``settings.pad_token_id``).
    keys, sample_indices : sequence of int, length B
        Per-row request key and sample index.
    settings : SamplerSettings
        Sampling settings.
    position_offsets : sequence of int, optional
        See :class:`KeyedGumbelLogitsProcessor`.
    pad_to_multiple_of : int, optional
        Pad the prompt block to a multiple of this (TRL's ``pad_to_multiple_of``).

    Returns
    -------
    list of list of int
        Completion ids per row, cut after the first EOS token (which is kept).
    """
    input_ids, attention_mask = left_pad(prompt_ids, settings.pad_token_id, pad_to_multiple_of)
    device = next(model.parameters()).device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    proc = KeyedGumbelLogitsProcessor.from_settings(
        keys, sample_indices, settings, prompt_length=input_ids.shape[1], position_offsets=position_offsets
    )
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        generation_config=build_generation_config(settings),
        logits_processor=LogitsProcessorList([proc]),
    )
    return truncate_at_eos(out[:, input_ids.shape[1] :].cpu(), settings.eos_token_ids)

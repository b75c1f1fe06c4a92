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

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
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

#: Identifies the noise function. Logged with every rollout; replay refuses records with another version.
HASH_VERSION = "triple32x2/v1"

_MASK32 = 0xFFFFFFFF
_MAX_KEY = 2**63 - 1
_SALT_A = 0x9E3779B9
_SALT_B = 0x85EBCA6B
_TWO52 = float(2**52)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in ``[0, 2**32)`` without int64 overflow (16-bit split)."""
    lo = x & 0xFFFF
    hi = x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _MASK32


def _triple32(x: torch.Tensor) -> torch.Tensor:
    """Wellons' ``triple32`` 32-bit finaliser on int64 tensors holding values in ``[0, 2**32)``."""
    x = x ^ (x >> 17)
    x = _mul32(x, 0xED5AD4BB)
    x = x ^ (x >> 11)
    x = _mul32(x, 0xAC4C1B51)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x31848BAB)
    x = x ^ (x >> 14)
    return x


def _as_int64_vector(name: str, values, n: int | None, device, upper: int) -> torch.Tensor:
    if not isinstance(values, torch.Tensor) and hasattr(values, "__len__") and len(values) == 0:
        values = torch.zeros(0, dtype=torch.int64)
    try:
        t = torch.as_tensor(values, device=device)
    except (RuntimeError, OverflowError, ValueError) as e:  # e.g. a Python int >= 2**63
        raise ValueError(f"{name} must be integers in [0, {upper}] (one per row); torch could not read them: {e}") from e
    if t.ndim == 0:
        t = t.reshape(1)
    if t.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of integers (one per row), got shape {tuple(t.shape)}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got dtype {t.dtype}; pass Python ints or an int64 tensor")
    t = t.to(torch.int64)
    if n is not None and t.numel() != n:
        raise ValueError(f"{name} has {t.numel()} entries but there are {n} rows; pass one value per row")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) > upper):
        raise ValueError(f"{name} must lie in [0, {upper}], got range [{int(t.min())}, {int(t.max())}]")
    return t


def _row_states(keys, sample_indices, positions, device) -> tuple[torch.Tensor, torch.Tensor]:
    keys = _as_int64_vector("keys", keys, None, device, _MAX_KEY)
    n = keys.numel()
    sample_indices = _as_int64_vector("sample_indices", sample_indices, n, device, _MASK32)
    positions = _as_int64_vector("positions", positions, n, device, _MASK32)
    lo = keys & _MASK32
    hi = keys >> 32
    lanes = []
    for salt in (_SALT_A, _SALT_B):
        s = _triple32(lo ^ salt)
        s = _triple32(s ^ hi)
        s = _triple32(s ^ sample_indices)
        s = _triple32(s ^ positions)
        lanes.append(s)
    return lanes[0], lanes[1]


def keyed_uniform(keys, sample_indices, positions, vocab_size: int, *, device=None) -> torch.Tensor:
    """Keyed uniforms ``u[b, v] = U(keys[b], sample_indices[b], positions[b], v)`` in the open interval (0, 1).

    Parameters
    ----------
    keys : sequence of int or int64 tensor, shape (B,)
        Request keys in ``[0, 2**63 - 1]`` (see :func:`request_key`).
    sample_indices : sequence of int or int64 tensor, shape (B,)
        Sample index of each row within its request, in ``[0, 2**32 - 1]``.
    positions : sequence of int or int64 tensor, shape (B,)
        Generated-token index of each row (0 for the first completion token), in ``[0, 2**32 - 1]``.
    vocab_size : int
        ``V``, the number of logits per row (the model's output width, not the tokenizer's length).
    device : torch.device or str, optional
        Where to compute; defaults to the device of ``keys`` (CPU for Python lists).

    Returns
    -------
    torch.Tensor
        float64, shape ``(B, V)``; ``u = (m + 1/2) / 2**52`` with ``m`` the 52-bit keyed hash (module
        docstring), so ``2**-53 <= u <= 1 - 2**-53``. Row ``b`` depends only on row ``b``'s three numbers.

    Raises
    ------
    ValueError
        On lengths that differ, values out of range, non-1-D inputs, or ``vocab_size < 1``.
    TypeError
        On non-integer inputs.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if device is None and isinstance(keys, torch.Tensor):
        device = keys.device
    sa, sb = _row_states(keys, sample_indices, positions, device)
    v = torch.arange(vocab_size, dtype=torch.int64, device=sa.device)
    wa = _triple32(sa[:, None] ^ v[None, :])
    wb = _triple32(sb[:, None] ^ v[None, :])
    m = ((wa >> 6) << 26) | (wb >> 6)  # 26 + 26 = 52 bits, exact in float64
    return (m.to(torch.float64) + 0.5) / _TWO52


def keyed_gumbel(keys, sample_indices, positions, vocab_size: int, *, device=None, dtype=torch.float64) -> torch.Tensor:
    """Keyed standard Gumbel noise ``g = -log(-log u)`` with ``u`` from :func:`keyed_uniform`.

    Parameters
    ----------
    keys, sample_indices, positions, vocab_size, device
        As in :func:`keyed_uniform`.
    dtype : torch.dtype, default torch.float64
        Output dtype. The noise is always computed in float64 and cast at the end (use float32 on backends
        without float64, e.g. MPS; the replay is then exact only on the same backend).

    Returns
    -------
    torch.Tensor
        Shape ``(B, V)``, finite, in roughly ``[-3.6, 36.7]`` (the bounds implied by ``u``'s range).
    """
    u = keyed_uniform(keys, sample_indices, positions, vocab_size, device=device)
    return (-torch.log(-torch.log(u))).to(dtype)


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def prompt_key_of(prompt: Any) -> str:
    """A stable text key for a prompt (plain string or list of chat messages).

    Parameters
    ----------
    prompt : str or JSON-like
        The dataset row's ``prompt``. Non-JSON values (e.g. images) are rendered with ``str``.

    Returns
    -------
    str
        ``"p:" + blake2b-64 hex`` of the canonical JSON; identical across processes and Python versions
        (unlike ``hash()``).
    """
    return "p:" + hashlib.blake2b(_canonical(prompt).encode("utf-8"), digest_size=8).hexdigest()


def request_key(seed: int, step: int, prompt_key: Any, *, mode: str = "train") -> int:
    """Stable 63-bit request key ``H(seed, mode, step, prompt_key)``.

    Implements the keying of "2. Every request should carry its own replay key": the noise is keyed to the
    run seed, the question and the training step, never to anything else about the run (batch position,
    rank, which variant of a paired comparison is training). The sample index is kept separate (it is the
    second argument of the noise function), so the ``G`` rollouts of one prompt share a key.

    Parameters
    ----------
    seed : int
        Run seed (``keyed_sampling_seed``, defaulting to the trainer's ``seed``).
    step : int
        Global optimizer step at generation time (``>= 0``).
    prompt_key : str or int
        Question id, dataset row index, or :func:`prompt_key_of` of the prompt.
    mode : str, default "train"
        ``"train"`` or ``"eval"``; keeps evaluation noise disjoint from training noise at the same step.

    Returns
    -------
    int
        In ``[0, 2**63 - 1]`` (JSON- and int64-safe). blake2b of the canonical tuple, so it is identical
        on every machine.

    Raises
    ------
    TypeError
        If ``seed`` or ``step`` is not an int, or ``prompt_key`` is neither str nor int.
    ValueError
        If ``step`` is negative.
    """
    for name, val in (("seed", seed), ("step", step)):
        if isinstance(val, bool) or not isinstance(val, int):
            raise TypeError(f"{name} must be an int, got {type(val).__name__}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if isinstance(prompt_key, bool) or not isinstance(prompt_key, str | int):
        raise TypeError(f"prompt_key must be a str or int (question id, row index), got {type(prompt_key).__name__}")
    payload = _canonical(["trl_ext.keyed/v1", seed, mode, step, prompt_key])
    return int.from_bytes(hashlib.blake2b(payload.encode("utf-8"), digest_size=8).digest(), "big") & _MAX_KEY


def per_request_seed(key: int, sample_index: int) -> int:
    """A 63-bit seed for engines that take one seed per request (vLLM ``SamplingParams(seed=...)``).

    This does NOT give the keyed Gumbel stream of this module: the engine feeds the seed to its own
    generator, so the draws are reproducible only on that engine, at the same batch composition and kernel
    configuration (see ``docs/replay.md``). It is offered so that every sample of every request can carry a
    distinct, loggable seed derived from the same key.

    Parameters
    ----------
    key : int
        Request key in ``[0, 2**63 - 1]``.
    sample_index : int
        Sample index, ``>= 0``.

    Returns
    -------
    int
        In ``[0, 2**63 - 1]``.
    """
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key <= _MAX_KEY:
        raise ValueError(f"key must be an int in [0, 2**63 - 1], got {key!r}")
    if isinstance(sample_index, bool) or not isinstance(sample_index, int) or sample_index < 0:
        raise ValueError(f"sample_index must be a non-negative int, got {sample_index!r}")
    payload = _canonical(["trl_ext.seed/v1", key, sample_index])
    return int.from_bytes(hashlib.blake2b(payload.encode("utf-8"), digest_size=8).digest(), "big") & _MAX_KEY


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
        self.keys = _as_int64_vector("keys", list(keys), None, "cpu", _MAX_KEY)
        n = self.keys.numel()
        if n == 0:
            raise ValueError("keys is empty: pass one request key per row of the batch")
        self.sample_indices = _as_int64_vector("sample_indices", list(sample_indices), n, "cpu", _MASK32)
        offs = [0] * n if position_offsets is None else list(position_offsets)
        self.position_offsets = _as_int64_vector("position_offsets", offs, n, "cpu", _MASK32)
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

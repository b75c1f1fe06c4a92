"""The addressable noise of keyed sampling: a counter-based hash of (request key, sample index, position, token).

:func:`keyed_uniform` / :func:`keyed_gumbel` (the noise, shape ``(B, V)``) and the stable 63-bit keys
:func:`request_key`, :func:`prompt_key_of` and :func:`per_request_seed`. The hash is specified in the docstring of
:mod:`trl_ext.measurement.keyed_sampling`, which re-exports every name here together with the sampler built on it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

__all__ = ["HASH_VERSION", "keyed_gumbel", "keyed_uniform", "per_request_seed", "prompt_key_of", "request_key"]

#: Identifies the noise function. Logged with every rollout; replay refuses records with another version.
HASH_VERSION = "triple32x2/v1"

MASK32 = 0xFFFFFFFF
MAX_KEY = 2**63 - 1
_SALT_A = 0x9E3779B9
_SALT_B = 0x85EBCA6B
_TWO52 = float(2**52)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in ``[0, 2**32)`` without int64 overflow (16-bit split)."""
    lo = x & 0xFFFF
    hi = x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & MASK32


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


def as_int64_vector(name: str, values, n: int | None, device, upper: int) -> torch.Tensor:
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
    keys = as_int64_vector("keys", keys, None, device, MAX_KEY)
    n = keys.numel()
    sample_indices = as_int64_vector("sample_indices", sample_indices, n, device, MASK32)
    positions = as_int64_vector("positions", positions, n, device, MASK32)
    lo = keys & MASK32
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
    return int.from_bytes(hashlib.blake2b(payload.encode("utf-8"), digest_size=8).digest(), "big") & MAX_KEY


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
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key <= MAX_KEY:
        raise ValueError(f"key must be an int in [0, 2**63 - 1], got {key!r}")
    if isinstance(sample_index, bool) or not isinstance(sample_index, int) or sample_index < 0:
        raise ValueError(f"sample_index must be a non-negative int, got {sample_index!r}")
    payload = _canonical(["trl_ext.seed/v1", key, sample_index])
    return int.from_bytes(hashlib.blake2b(payload.encode("utf-8"), digest_size=8).digest(), "big") & MAX_KEY

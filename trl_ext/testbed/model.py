"""The tiny Llama-style causal LM of the offline testbed (about 0.86M parameters)."""

from __future__ import annotations

import os

__all__ = ["TINY_CONFIG", "build_tiny_model", "save_tiny_model"]

#: Default architecture: hidden 128, 4 layers, 4 heads, tied embeddings. A Llama config (not Qwen2) keeps the
#: custom tokenizer intact when reloading with the Auto classes (see docs/testbed.md).
TINY_CONFIG: dict = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_dropout": 0.0,
}


def build_tiny_model(tokenizer, seed: int = 0, **config_overrides):
    """Build a randomly initialised tiny :class:`~transformers.LlamaForCausalLM`.

    Parameters
    ----------
    tokenizer : PreTrainedTokenizerBase
        Gives ``vocab_size`` (``len(tokenizer)``) and the pad/eos ids written into the config.
    seed : int, default 0
        Seed for the weight initialisation. The same seed gives bitwise-identical weights; the global torch
        RNG state is restored afterwards (initialisation runs inside ``torch.random.fork_rng``).
    **config_overrides
        Any :class:`~transformers.LlamaConfig` field, overriding :data:`TINY_CONFIG`.

    Returns
    -------
    transformers.LlamaForCausalLM
        In ``float32`` and eval mode; ``generation_config`` carries the pad/eos ids.

    Raises
    ------
    ValueError
        If ``seed`` is negative or the tokenizer lacks a pad or eos token.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError("tokenizer needs pad and eos tokens; use trl_ext.testbed.build_tokenizer()")
    cfg = dict(TINY_CONFIG)
    cfg.update(config_overrides)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **cfg,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model.float().eval()


def save_tiny_model(path: str | os.PathLike, seed: int = 0, **config_overrides) -> str:
    """Write an untrained tiny model plus its tokenizer to ``path`` (fast; used by tests).

    Parameters
    ----------
    path : str or PathLike
        Output directory (created if missing; existing files of the same name are overwritten).
    seed : int, default 0
        Initialisation seed, see :func:`build_tiny_model`.
    **config_overrides
        Passed to :func:`build_tiny_model` (e.g. ``max_position_embeddings=512`` for a vLLM engine context).

    Returns
    -------
    str
        ``path`` as a string; loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer``.
    """
    from .tokenizer import build_tokenizer

    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=seed, **config_overrides)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path

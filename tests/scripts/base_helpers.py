"""Shared helpers for the base-trainer tests (tiny testbed model, varied synthetic rewards, config factory).

Imported by ``tests/test_base_trainer.py``, ``tests/test_signal_only.py`` and ``tests/scripts/base_two_rank.py``.
Everything is local and CPU-fast: the testbed's ~0.86M-parameter Llama, ``max_completion_length`` 4-6.
"""

from __future__ import annotations

import zlib

import torch


def text_of(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def hash_reward(prompts, completions, **kwargs) -> list[float]:
    """Deterministic varied reward in {0, 0.5, 1}: a hash of the completion text (gives mixed and tied groups)."""
    return [float(zlib.crc32(text_of(c).encode()) % 3) / 2.0 for c in completions]


def binary_reward(prompts, completions, **kwargs) -> list[float]:
    """Deterministic {0, 1} checker: parity of a hash of the completion (about half right)."""
    return [float(zlib.crc32(b"x" + text_of(c).encode()) % 2) for c in completions]


def length_score(prompts, completions, **kwargs) -> list[float]:
    """A continuous 'scorer': text length plus a hash fraction (ranks rollouts within a class)."""
    return [len(text_of(c)) + (zlib.crc32(text_of(c).encode()) % 1000) / 1000.0 for c in completions]


def tiny_model_and_tokenizer(seed: int = 0):
    from trl_ext.testbed import build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=seed)
    return model, tok


def tiny_dataset(n: int = 16, seed: int = 0):
    from trl_ext.testbed import make_dataset

    return make_dataset("addition", n, seed=seed)


def make_config(output_dir, **overrides):
    from trl_ext.trainers.base import ExtGRPOConfig

    kw = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=5,
        max_steps=2,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        report_to="none",
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        temperature=1.0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    kw.update(overrides)
    return ExtGRPOConfig(**kw)


def make_trainer(output_dir, cls=None, reward_funcs=None, n_rows: int = 16, model_seed: int = 0, **overrides):
    from trl_ext.trainers.base import GRPOTrainer

    torch.set_num_threads(1)
    cls = cls or GRPOTrainer
    model, tok = tiny_model_and_tokenizer(model_seed)
    return cls(
        model=model,
        reward_funcs=reward_funcs or [hash_reward],
        args=make_config(output_dir, **overrides),
        train_dataset=tiny_dataset(n_rows),
        processing_class=tok,
    )

"""The value-table builder's model loading and progress line (:func:`~trl_ext.priors.value_table.build_value_table`);
the sampling itself is :mod:`trl_ext.measurement.offline_sampling`, shared with ``trl-ext gate`` and ``advise``."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

__all__ = ["Progress", "prepare_model"]


class Progress:
    """tqdm when installed, else a line every ~10% (or nothing when disabled)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self._bar = total, 0, enabled, None
        self._next_print, self._t0 = 0, time.monotonic()
        if enabled:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, desc="value table", unit="prompt")
            except ImportError:
                pass

    def update(self, k: int) -> None:
        self.done += k
        if self._bar is not None:
            self._bar.update(k)
        elif self.enabled and (self.done >= self._next_print or self.done == self.total):
            dt = time.monotonic() - self._t0
            print(f"value table: {self.done}/{self.total} prompts ({dt:.0f}s)", file=sys.stderr, flush=True)
            self._next_print = self.done + max(1, self.total // 10)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def prepare_model(model: Any, tokenizer: Any, backend: str, vllm: Any, *, model_id: str | None, seed: int,
                   device: str | None) -> tuple[Any, Any, Any, str, bool | None]:
    """``(model, tokenizer, llm, model id, was_training)`` of a build: a path loaded (transformers) or handed to
    ``vllm.LLM``, the tokenizer taken from the engine or the path when not given, a transformers model put in eval
    mode (``was_training``: its mode before, None with vLLM)."""
    llm = None
    was_training = None
    if backend == "vllm":
        if isinstance(model, vllm.LLM):
            llm = model
            mid = model_id or str(getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "model",
                                          None) or type(llm).__name__)
        else:
            mid = model_id or os.fspath(model)
            llm = vllm.LLM(model=os.fspath(model), seed=seed)
        if tokenizer is None and hasattr(llm, "get_tokenizer"):
            tokenizer = llm.get_tokenizer()
    else:
        import torch

        if isinstance(model, str | os.PathLike):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            mid = model_id or os.fspath(model)
            dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(os.fspath(model), local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(os.fspath(model), local_files_only=True).to(dev)
        else:
            if not (isinstance(model, torch.nn.Module) and hasattr(model, "generate")):
                raise TypeError(f"model must be a transformers causal LM, a vllm.LLM or a path, got "
                                f"{type(model).__name__}.")
            mid = model_id or getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
        if tokenizer is None:
            raise ValueError("tokenizer is None; pass the model's tokenizer (or a model path to load both).")
        was_training = model.training
        model.eval()
    return model, tokenizer, llm, mid, was_training

"""Generation backends of the value-table builder: keyed Gumbel-max and multinomial sampling with transformers, seeded
vLLM requests, prompt rendering / tokenization as TRL does it, and the build's progress line.

Used by :func:`~trl_ext.priors.value_table.build_value_table` (see its module docstring for the determinism of each
sampler) and by ``trl-ext gate`` / ``trl-ext advise``. Every name is importable from
:mod:`trl_ext.priors.value_table` as well.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

__all__: list[str] = []


def _render_prompts(prompts: list, tokenizer: Any) -> list[str]:
    """Text fed to vLLM: plain prompts as is, conversations through the tokenizer's chat template."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(p)
        else:
            if tokenizer is None:
                raise ValueError("conversational prompts need a tokenizer with a chat template.")
            out.append(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True))
    return out


def _prompt_token_ids(prompts: list, tokenizer: Any) -> list[list[int]]:
    """Prompt token ids exactly as TRL's ``_tokenize_prompts`` builds them (text: ``tokenizer(text=...)``;
    conversations: ``apply_chat_template(add_generation_prompt=True)``)."""
    ids: list[list[int]] = []
    for p in prompts:
        if isinstance(p, str):
            ids.append(list(tokenizer(text=[p])["input_ids"][0]))
        else:
            t = tokenizer.apply_chat_template(conversation=[p], add_generation_prompt=True, tokenize=True,
                                              return_dict=True)
            ids.append(list(t["input_ids"][0]))
    for p, i in zip(prompts, ids):
        if not i:
            raise ValueError(f"prompt {p!r:.60} tokenizes to zero tokens.")
    return ids


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for e in ([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])) + [tokenizer.eos_token_id]:
        if e is not None and int(e) not in eos:
            eos.append(int(e))
    return eos


def _generate_keyed(model, prompt_ids, keys, num_samples, batch_size, settings) -> list[list[list[int]]]:
    from trl_ext.measurement.keyed_sampling import keyed_generate

    flat = [(i, s) for i in range(len(prompt_ids)) for s in range(num_samples)]
    out: list[list[list[int]]] = [[None] * num_samples for _ in prompt_ids]  # type: ignore[list-item]
    for start in range(0, len(flat), batch_size):
        chunk = flat[start : start + batch_size]
        comps = keyed_generate(model, [prompt_ids[i] for i, _ in chunk], [keys[i] for i, _ in chunk],
                               [s for _, s in chunk], settings)
        for (i, s), c in zip(chunk, comps):
            out[i][s] = c
    return out


def _generate_multinomial(model, prompt_ids, keys, num_samples, batch_size, *, temperature, top_p,
                          max_new_tokens, eos, pad) -> list[list[list[int]]]:
    import torch
    from transformers import GenerationConfig

    from trl_ext.measurement.keyed_sampling import truncate_at_eos

    cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_p=top_p,
                           top_k=0, min_p=None, repetition_penalty=1.0, num_beams=1, pad_token_id=pad,
                           eos_token_id=eos, disable_compile=True)
    device = next(model.parameters()).device
    out = []
    for ids, key in zip(prompt_ids, keys):
        comps: list[list[int]] = []
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(key)
            for start in range(0, num_samples, batch_size):
                m = min(batch_size, num_samples - start)
                inp = torch.tensor([ids] * m, dtype=torch.long, device=device)
                gen = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), generation_config=cfg)
                comps.extend(truncate_at_eos(gen[:, inp.shape[1] :].cpu(), eos))
        out.append(comps)
    return out


def _generate_vllm(llm, vllm, texts, keys, num_samples, *, temperature, top_p, max_new_tokens):
    params = [vllm.SamplingParams(n=num_samples, seed=int(k), temperature=temperature, top_p=top_p,
                                  max_tokens=max_new_tokens) for k in keys]
    outputs = llm.generate(texts, params, use_tqdm=False)
    if len(outputs) != len(texts):
        raise RuntimeError(f"vLLM returned {len(outputs)} results for {len(texts)} prompts.")
    result = []
    for o in outputs:
        comps = list(o.outputs)
        if len(comps) != num_samples:
            raise RuntimeError(f"vLLM returned {len(comps)} samples for a prompt, expected n={num_samples}.")
        result.append([(list(c.token_ids), c.text) for c in comps])
    return result


class _Progress:
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


def _prepare_model(model: Any, tokenizer: Any, backend: str, vllm: Any, *, model_id: str | None, seed: int,
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

"""Peak resident memory of one loss pass on SmolLM2-135M-Instruct + LoRA (the regime benchmark's adapter: r 16,
alpha 32, all linear layers, dropout 0): a forward over ``--rows`` x (``--prompt_tokens`` + ``--completion_tokens``)
random token ids, the per-token log-probabilities of the completion, and the backward of their mean, with or without
gradient checkpointing. It sizes a V0.5 + OSLA micro-batch (up to 4x TRL's rows with the paper's unbounded rounds,
docs/v05.md "Activation memory") against GRPO's. Not TRL's loss code: ``torch.log_softmax`` materialises the full
log-probabilities, which TRL's ``selective_log_softmax`` avoids, so this over-states the logits' share.

Usage (one measurement per process: the peak is the process's high-water mark)::

    python benchmarks/loss_pass_memory.py --rows 4
    python benchmarks/loss_pass_memory.py --rows 16 --gradient_checkpointing
"""

from __future__ import annotations

import argparse
import json


def vm_hwm_gb() -> float:
    """This process's peak resident memory (``VmHWM``), GiB."""
    with open("/proc/self/status", encoding="utf-8") as f:
        return int(f.read().split("VmHWM:")[1].split()[0]) / 2**20


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--prompt_tokens", type=int, default=100)
    p.add_argument("--completion_tokens", type=int, default=192)
    p.add_argument("--gradient_checkpointing", action="store_true")
    p.add_argument("--model", default=None, help="model directory (default: the real model's cache)")
    a = p.parse_args(argv)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trl_ext.realmodel import get_real_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model or get_real_model(), dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    loaded = vm_hwm_gb()
    ids = torch.randint(0, model.config.vocab_size, (a.rows, a.prompt_tokens + a.completion_tokens))
    logits = model(input_ids=ids, logits_to_keep=a.completion_tokens + 1).logits[:, :-1, :]
    logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, -a.completion_tokens:].unsqueeze(-1)).squeeze(-1)
    (-logps.mean()).backward()
    print(json.dumps({"rows": a.rows, "prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens,
                      "gradient_checkpointing": a.gradient_checkpointing, "peak_gb": round(vm_hwm_gb(), 2),
                      "after_load_gb": round(loaded, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

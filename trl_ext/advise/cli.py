"""``trl-ext advise``: measure a model's regime on a dataset and say which trainer and settings should pay.

Samples ``--num_samples`` (k) keyed completions of ``--num_prompts`` (N) prompts, scores them with the reward
functions and reports, with confidence intervals: per-prompt pass rates, zero-variance group shares and the tokens
they waste at G = 2, 4, 8, 16, each trainer's signal per generated token, the between/within-prompt variance split,
completion lengths, PAIR's prefix informativeness (``--prefix_heads``) and, with ``--noise_floor``, each reward
function's scorer noise floor; then the recommendation and its reasons (``docs/advise.md``). ``--use_vllm`` samples
with a ``vllm.LLM`` (one seeded ``n=1`` request per sample).

Examples::

    trl-ext advise --model testbed:addition --dataset addition --num_prompts 64 --num_samples 16 --output advice.json
    trl-ext advise --model PATH --dataset train.jsonl --reward my_rewards:accuracy --max_new_tokens 512 \\
        --group_size 8 --output advice.json --plot advice.png

``--model``: a local folder, ``testbed:TASK`` (the cached warm testbed model of TASK, built once), ``smollm2`` (the
cached real model) or ``testbed-warm`` (the warm model of the built-in ``--dataset``). ``--dataset``: a built-in task
(``addition``, ``substitution``, ``scratchpad``, ``sum3``, ``largest``, ``steps``) or a local ``.jsonl`` / ``.json`` / ``.csv`` /
``.parquet`` file or ``save_to_disk`` folder. ``--reward``: ``package.module:function``, ``path/to/file.py:function``
or a built-in task's reward name (default for a built-in task: its accuracy reward). Nothing is downloaded.
Exit status: 0 on success, 2 on bad input (the message says what to change).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings

__all__ = ["add_arguments", "main", "plot_advice"]

PROG = "trl-ext advise"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``advise`` options."""
    a = parser.add_argument
    a("--model", required=True, help="Local model folder, 'testbed:TASK', 'testbed-warm' or 'smollm2'.")
    a("--dataset", required=True, help="A built-in task name, a reasoning-gym spec (reasoning_gym:<task>[:level=N,"
                                       "...]; pip install 'trl-ext[reasoning-gym]') or a local .jsonl/.json/.csv/"
                                       ".parquet file or save_to_disk folder with a prompt column (text or messages).")
    a("--reward", action="append", default=None, metavar="REF",
      help="Reward function f(prompts, completions, **columns) -> list[float | None]: 'package.module:function', "
           "'path/to/file.py:function' or a built-in reward name. Repeatable (weighted sum). Default for a built-in "
           "task: its accuracy reward.")
    a("--reward_weights", "--reward-weights", dest="reward_weights", type=float, nargs="+", default=None,
      help="One weight per --reward (default 1 each).")
    a("--reward_range", "--reward-range", dest="reward_range", type=float, nargs=2, default=None,
      metavar=("LOW", "HIGH"), help="Rescale the combined reward from [LOW, HIGH] to [0, 1] (default: none; rewards "
                                    "must then lie in [0, 1]).")
    a("--prompt_column", "--prompt-column", dest="prompt_column", default="prompt", help="Default: prompt.")
    a("--split", default=None, help="Built-in task: train or test (default train); saved DatasetDict: its split.")
    a("--num_prompts", "--num-prompts", dest="num_prompts", type=int, default=64,
      help="N prompts drawn at random with --seed (all rows if fewer). Default 64.")
    a("--num_samples", "--num-samples", dest="num_samples", type=int, default=16,
      help="k completions per prompt (>= 2; >= 16 for unbiased shares up to G = 16). Default 16.")
    a("--max_new_tokens", "--max-new-tokens", dest="max_new_tokens", type=int, default=None,
      help="Completion cap: use the training max_completion_length (default: a testbed task's longest answer + 2, "
           "else 256).")
    a("--temperature", type=float, default=1.0, help="Sampling temperature (default 1.0, as training).")
    a("--top_p", "--top-p", dest="top_p", type=float, default=1.0, help="Nucleus p (default 1.0).")
    a("--group_size", "--group-size", dest="group_size", type=int, default=8,
      help="The GRPO num_generations you would train with; savings are reported against it. Default 8.")
    a("--confidence", type=float, default=0.95, help="Interval level (default 0.95).")
    a("--interval", choices=("jeffreys", "clopper-pearson"), default="jeffreys",
      help="Per-prompt pass-rate interval (default jeffreys).")
    a("--n_resamples", "--n-resamples", dest="n_resamples", type=int, default=999,
      help="Bootstrap resamples over prompts (default 999).")
    a("--target_width", "--target-width", dest="target_width", type=float, default=0.10,
      help="Warn when the interval of the zero-variance share at --group_size is wider (default 0.10).")
    a("--basis_table_samples", dest="basis_table_samples", type=int, default=32,
      help="BASIS cost model: reference samples per prompt in its table (default 32).")
    a("--basis_table_uses", dest="basis_table_uses", type=float, default=1.0,
      help="BASIS cost model: trainings on each prompt sharing one table, epochs x runs (default 1; inf: the table "
           "exists already).")
    a("--prefix_heads", "--prefix-heads", dest="prefix_heads", choices=("on", "off"), default="on",
      help="Measure PAIR's prefix informativeness: out-of-fold success heads at --probe_lengths (default on).")
    a("--probe_lengths", "--probe-lengths", dest="probe_lengths", type=float, nargs="+", default=[0.5, 1.0, 2.0],
      metavar="F", help="Probe lengths as multiples of PAIR's default tau = min(256, max(1, max_new_tokens // 8)) "
                        "(default 0.5 1 2).")
    a("--prefix_folds", "--prefix-folds", dest="prefix_folds", type=int, default=2,
      help="Held-out folds over prompts for the prefix heads (default 2).")
    a("--head_batch_prompts", "--head-batch-prompts", dest="head_batch_prompts", type=int, default=8,
      help="Prompts per head refresh when feeding the heads, as PAIR per generation batch (default 8).")
    a("--noise_floor", "--noise-floor", dest="noise_floor", action="store_true",
      help="Measure each --reward function's scorer noise floor on the sample (alone vs. in batches of 8 other "
           "completions; trl-ext noise-floor's protocol).")
    a("--noise_floor_items", "--noise-floor-items", dest="noise_floor_items", type=int, default=60,
      help="Completions tracked by --noise_floor (default 60).")
    a("--use_vllm", "--use-vllm", dest="use_vllm", action="store_true",
      help="Sample with a vllm.LLM engine: one SamplingParams(n=1, seed=per_request_seed(key, j)) per sample, one "
           "generate call (needs vLLM; docs/vllm.md). The prefix heads still read a transformers model's hidden "
           "states.")
    a("--vllm_dtype", "--vllm-dtype", dest="vllm_dtype", default="auto",
      help="vllm.LLM dtype (default auto: the checkpoint's; a CPU engine may run float32 checkpoints in bfloat16).")
    a("--vllm_max_model_len", "--vllm-max-model-len", dest="vllm_max_model_len", type=int, default=None,
      help="vllm.LLM max_model_len (default: the model's).")
    a("--vllm_enforce_eager", "--vllm-enforce-eager", dest="vllm_enforce_eager", action="store_true",
      help="vllm.LLM(enforce_eager=True): no graph compilation (a faster start, maybe slower generation).")
    a("--batch_size", "--batch-size", dest="batch_size", type=int, default=64, help="Sequences per generate call.")
    a("--seed", type=int, default=0, help="Prompt draw, sampling keys and bootstrap (default 0).")
    a("--device", default=None, help="torch device (default: cuda if available, else cpu).")
    a("--output", default=None, help="Write the advice as JSON.")
    a("--save_samples", "--save-samples", dest="save_samples", action="store_true",
      help="Include every completion, reward and key in --output.")
    a("--plot", default=None, help="Write a PNG plot (needs matplotlib, the `plots` extra; skipped with a warning otherwise).")


def _check(args) -> str | None:
    if args.num_prompts < 2:
        return f"--num_prompts must be >= 2 (the intervals come from the spread over prompts), got {args.num_prompts}."
    if args.num_samples < 2:
        return f"--num_samples must be >= 2, got {args.num_samples}."
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        return f"--max_new_tokens must be >= 1, got {args.max_new_tokens}."
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        return f"--temperature must be > 0, got {args.temperature}."
    if not 0 < args.top_p <= 1:
        return f"--top_p must be in (0, 1], got {args.top_p}."
    if args.group_size < 2:
        return f"--group_size must be >= 2 (a GRPO group), got {args.group_size}."
    if not 0 < args.confidence < 1:
        return f"--confidence must be in (0, 1), got {args.confidence}."
    if args.n_resamples < 100:
        return f"--n_resamples must be >= 100, got {args.n_resamples}."
    if args.reward_weights is not None and len(args.reward_weights) != len(args.reward or []):
        return (f"--reward_weights has {len(args.reward_weights)} values for {len(args.reward or [])} --reward "
                "function(s); give one weight per --reward.")
    if any(not (f > 0 and math.isfinite(f)) for f in args.probe_lengths):
        return f"--probe_lengths must be positive multiples of tau, got {args.probe_lengths}."
    if not 2 <= args.prefix_folds <= args.num_prompts:
        return f"--prefix_folds must be in [2, --num_prompts], got {args.prefix_folds}."
    if args.noise_floor_items < 1:
        return f"--noise_floor_items must be >= 1, got {args.noise_floor_items}."
    if args.head_batch_prompts < 1:
        return f"--head_batch_prompts must be >= 1, got {args.head_batch_prompts}."
    if args.reward_range is not None and not args.reward_range[1] > args.reward_range[0]:
        return f"--reward_range needs LOW < HIGH, got {args.reward_range}."
    return None


def _resolve_model(name: str, dataset: str | None) -> str:
    """A local folder, or a model name registered in :mod:`trl_ext.registry` (``testbed:TASK``, ``testbed-warm``,
    ``smollm2``: built or fetched once); ``dataset`` is the built-in task it will see."""
    from trl_ext import registry

    if os.path.isdir(name):
        return name
    path = registry.resolve_model(name, dataset_name=dataset)
    if path is None or not os.path.isdir(path):
        raise ValueError(f"--model {name!r} is not a local folder, 'testbed:TASK', 'testbed-warm' or 'smollm2' "
                         "(nothing is downloaded).")
    return path


def load_inputs(args):
    """``(model_path, rows, row_indices, reward_funcs, dataset label, default max_new_tokens)``; raises ValueError.

    Built-in tasks and model names come from :mod:`trl_ext.registry` (``trl-ext`` registers the testbed's and the
    real model's before running), reasoning-gym specs from :mod:`trl_ext.external_tasks`."""
    from trl_ext import registry
    from trl_ext.refs import load_dataset_rows, resolve_reward_funcs

    from .sample import select_rows

    tasks = registry.dataset_names()
    model = _resolve_model(args.model, args.dataset if args.dataset in tasks else None)
    if args.dataset.startswith("reasoning_gym:"):  # reasoning-gym: its split, the task's own scorer
        from trl_ext.external_tasks.reasoning_gym import RG_REWARD_FUNCS, make_rg_dataset

        funcs = resolve_reward_funcs(args.reward, dict(RG_REWARD_FUNCS), args.dataset, flag="--reward")
        split = args.split or "train"
        rows = [dict(r) for r in make_rg_dataset(args.dataset, split, args.num_prompts, seed=args.seed)]
        return model, rows, list(range(len(rows))), funcs, f"{args.dataset}/{split} (seed {args.seed})", 256
    if args.dataset in tasks:
        task = registry.get_dataset(args.dataset)
        funcs = resolve_reward_funcs(args.reward, task.rewards(), args.dataset, flag="--reward")
        split = args.split or "train"
        n = min(args.num_prompts, task.split_size(split))  # drawn by the task's own seeded sampler, as the benchmarks
        rows = [dict(r) for r in task.make(split, n, args.seed)]
        default_cap = 256 if task.max_answer_chars is None else task.max_answer_chars + 2
        return model, rows, list(range(n)), funcs, f"{args.dataset}/{split} (seed {args.seed})", default_cap
    funcs = resolve_reward_funcs(args.reward, {}, None, flag="--reward")
    rows = load_dataset_rows(args.dataset, split=args.split)
    idx, rows = select_rows(rows, args.num_prompts, args.seed)
    return model, rows, idx, funcs, args.dataset + (f" [{args.split}]" if args.split else ""), 256


def load_models(args, model_path: str):
    """``(sampling model, tokenizer, feature model or None, end tokens)``: a transformers model, or with
    ``--use_vllm`` a ``vllm.LLM`` plus (for ``--prefix_heads on``) the transformers model of the same folder.
    Raises ``ImportError`` (vLLM missing, with the install lines), ``OSError`` / ``ValueError`` (cannot load)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from trl_ext.measurement.offline_sampling import eos_ids

    from .vllm_path import build_engine, require_vllm

    if args.use_vllm:
        require_vllm()  # before loading anything: the clear error first
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        hf = None
        if not args.use_vllm or args.prefix_heads == "on":
            hf = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True).to(device)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load --model {args.model!r} ({model_path}): {e}") from e
    if not args.use_vllm:
        return hf, tokenizer, None, None

    class _Gen:  # the end tokens of the folder's generation config, as the transformers path reads them
        try:
            generation_config = GenerationConfig.from_pretrained(model_path, local_files_only=True)
        except OSError:
            generation_config = None

    eos = eos_ids(_Gen, tokenizer)
    llm = build_engine(model_path, seed=args.seed, dtype=args.vllm_dtype, max_model_len=args.vllm_max_model_len,
                       enforce_eager=args.vllm_enforce_eager)
    return llm, tokenizer, hf, eos


def _fmt(e, nd=3) -> str:
    v = e.value if hasattr(e, "value") else e
    if v is None or not math.isfinite(v):
        return "n/a"
    if hasattr(e, "low") and math.isfinite(e.low):
        return f"{v:.{nd}f} [{e.low:.{nd}f}, {e.high:.{nd}f}]"
    return f"{v:.{nd}f}"


def print_summary(adv, label: str) -> None:
    c = adv.counts
    print(f"advise: {adv.config.get('model')} on {label}: {c['n_prompts']} prompts x {c['n_samples']} samples, "
          f"T={adv.config['temperature']}, max_new_tokens {adv.config['max_new_tokens']}")
    print(f"  pass rate mean {_fmt(adv.pass_rates['mean'])}; at 0: {_fmt(adv.pass_rates['share_zero'])}; "
          f"at 1: {_fmt(adv.pass_rates['share_one'])}; histogram {adv.pass_rates['histogram']}")
    print("  G   zero-variance share (unbiased)   plug-in  disjoint check  token waste share")
    for g, z in adv.zero_variance.items():
        chk = z["disjoint_check"]
        print(f"  {g:>2}  {_fmt(z['share']):<32} {_fmt(z['plugin']):<8} {_fmt(chk['share'])} ({chk['groups']:>4} gr.)"
              f"  {_fmt(z['token_waste_share'])}")
    print("  method         informative groups / 1k tok   useful token share       saving vs GRPO "
          f"G={adv.config['user_group_size']}")
    for m, d in adv.methods.items():
        print(f"  {m:<14} {_fmt(d['groups_per_1k'], 2):<29} {_fmt(d['useful_token_share']):<24} "
              f"{_fmt(d['saving_vs_user_grpo'])}")
    v = adv.variance
    if "icc_ci" in v:
        print(f"  variance: between {v['between_variance']:.4f}, within {v['within_variance']:.4f}, ICC "
              f"{_fmt(v['icc_ci'])}")
    ln = adv.lengths
    print(f"  completion tokens: mean {ln['mean']:.1f}, median {ln['median']:.0f}, p90 {ln['p90']:.0f}, max "
          f"{ln['max']}, truncated {ln.get('truncation_share', 0):.3f}")
    print_prefix_heads(adv.prefix_heads)
    for name, nf in (adv.noise_floor.get("per_reward") or {}).items():
        print(f"  scorer noise floor of {name}: " + (f"{nf['floor']:.4g} (3 x p95 spread {nf['p95_spread']:.4g}, "
                                                     f"{nf['n_items']} items)" if nf.get("measured")
                                                     else f"not measured ({nf.get('reason')})"))
    print(f"recommendation: {adv.recommendation} {adv.recommended_config}; predicted token saving vs GRPO "
          f"G={adv.config['user_group_size']}: {_fmt(adv.predicted_token_saving)}")
    for r in adv.reasons:
        print(f"  - {r}")
    for w in adv.warnings:
        print(f"  warning: {w}")


def _fmt_est(e: dict) -> str:
    v, lo, hi = e.get("value"), e.get("low"), e.get("high")
    if v is None or not math.isfinite(v):
        return "n/a"
    if lo is not None and math.isfinite(lo):
        return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"
    return f"{v:.3f}"


def print_prefix_heads(ph: dict) -> None:
    """The ``prefix_heads`` lines of the summary."""
    if not ph.get("measured"):
        print(f"  PAIR prefix heads: not measured ({ph.get('reason', 'n/a')})")
        return
    print(f"  PAIR prefix heads (default tau {ph['default_tau']}, {ph['n_folds']} held-out folds; unfinished "
          "samples): probe  finished  within-prompt AUC         pooled AUC                Brier skill")
    for name, v in ph["probes"].items():
        u = v["unfinished"]
        print(f"    {name:>5} {v['probe_tokens']:>4} tok  {v['share_finished_in_probe']:.3f}  "
              f"{_fmt_est(u['within_prompt_auc']):<25} {_fmt_est(u['auc']):<25} {_fmt_est(u['brier_skill'])}")


def plot_advice(adv, path: str) -> str | None:
    """One PNG: pass-rate histogram, zero-variance share vs G (unbiased with its interval, plug-in, the disjoint
    check, token waste) and each method's useful-token share. Returns ``path``, or None (with a warning) when
    matplotlib is missing."""
    from trl_ext._plots import PLOTS_INSTALL_HINT, pyplot

    try:
        plt = pyplot("--plot")
    except ImportError:
        warnings.warn(f"matplotlib is not installed: --plot skipped ({PLOTS_INSTALL_HINT}).", stacklevel=2)
        return None
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    h = adv.pass_rates["histogram"]
    ax[0].bar(range(len(h)), list(h.values()), color="#4c72b0")
    ax[0].set_xticks(range(len(h)), list(h), rotation=30)
    ax[0].set_title("per-prompt pass rate")
    ax[0].set_ylabel("prompts")
    gs = [int(g) for g in adv.zero_variance]
    z = [adv.zero_variance[str(g)] for g in gs]
    val = [d["share"].value for d in z]
    err = [[v - d["share"].low for v, d in zip(val, z)], [d["share"].high - v for v, d in zip(val, z)]]
    ax[1].errorbar(gs, val, yerr=err, marker="o", capsize=3, label="zero-variance share (unbiased)")
    ax[1].plot(gs, [d["plugin"] for d in z], "s--", label="plug-in p^G + (1-p)^G")
    ax[1].plot(gs, [d["disjoint_check"]["share"] for d in z], "x:", label="disjoint groups of the sample")
    ax[1].plot(gs, [d["token_waste_share"].value for d in z], "^-", label="token share wasted")
    ax[1].set_xscale("log", base=2)
    ax[1].set_xticks(gs, [str(g) for g in gs])
    ax[1].set_xlabel("group size G")
    ax[1].set_ylim(0, 1)
    ax[1].legend(fontsize=7)
    ax[1].set_title("zero-variance groups")
    names = list(adv.methods)
    u = [adv.methods[m]["useful_token_share"] for m in names]
    ax[2].barh(range(len(names)), [e.value for e in u],
               xerr=[[e.value - e.low for e in u], [e.high - e.value for e in u]], color="#55a868")
    ax[2].set_yticks(range(len(names)), names, fontsize=7)
    ax[2].set_xlim(0, 1)
    ax[2].set_title("useful token share (model, docs/advise.md)")
    fig.suptitle(f"trl-ext advise: recommendation {adv.recommendation} {adv.recommended_config}", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(args: argparse.Namespace) -> int:
    err = _check(args)
    if err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    try:
        model_path, rows, idx, funcs, label, default_cap = load_inputs(args)
    except (ValueError, OSError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    from trl_ext._io import write_json

    from .sample import advise

    try:
        model, tokenizer, feature_model, eos = load_models(args, model_path)
    except (OSError, ValueError, ImportError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    cap = args.max_new_tokens or default_cap
    config = {"model": args.model, "model_path": model_path, "dataset": label, "reward": args.reward,
              "args": {k: v for k, v in vars(args).items() if not k.startswith("_") and not callable(v)}}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=UserWarning)  # AdviceWarnings are printed with the summary
            adv, smp = advise(model, tokenizer, rows, funcs, num_prompts=None, num_samples=args.num_samples,
                              max_new_tokens=cap, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                              batch_size=args.batch_size, prompt_column=args.prompt_column,
                              reward_weights=args.reward_weights, reward_range=args.reward_range,
                              group_size=args.group_size, confidence=args.confidence, interval_method=args.interval,
                              n_resamples=args.n_resamples, target_width=args.target_width,
                              basis_table_samples=args.basis_table_samples, basis_table_uses=args.basis_table_uses,
                              prefix_heads=args.prefix_heads == "on", probe_factors=args.probe_lengths,
                              prefix_folds=args.prefix_folds, head_batch_prompts=args.head_batch_prompts,
                              noise_floor=args.noise_floor, noise_floor_items=args.noise_floor_items,
                              feature_model=feature_model, eos_token_ids=eos,
                              config=config, return_sample=True)
    except (ValueError, TypeError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    for rec, i in zip(smp.records, idx):
        rec["row_index"] = int(i)
    print_summary(adv, label)
    if args.output:
        payload = adv.to_dict()
        if args.save_samples:
            payload["samples"] = smp.records
        write_json(args.output, payload)
        print(f"written to {args.output}")
    if args.plot and plot_advice(adv, args.plot):
        print(f"plot written to {args.plot}")
    return 0

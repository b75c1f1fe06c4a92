"""Shared-prefix rollouts vs ordinary sampling: wall time and model forward tokens.

    python benchmarks/shared_prefix_bench.py [--model auto|warm|untrained|both] [--prompts 16] [--repeats 3]
                                             [--max-new-tokens N ...] [--output PATH]

For every model, completion cap, ``G`` in 1 (control), 4, 8, 16 and temperature in 0.7, 1.0, on ``--prompts`` addition prompts of
the testbed (``make_dataset("addition", n, seed=0)``, each repeated ``G`` times, as TRL passes them), three samplers
generate the same rows:

``hf_generate``
    ``model.generate(do_sample=True, temperature=T)`` on the left-padded rows -- TRL 1.16's transformers path.
``loop_unshared``
    :func:`~trl_ext.measurement.shared_prefix.shared_prefix_generate` with ``share=False``: the same Python loop,
    every row its own branch (separates the loop's own cost from the effect of sharing).
``shared``
    ``shared_prefix_generate`` (one branch per distinct prefix).

Per sampler: median wall time over ``--repeats`` runs (the three samplers are interleaved run by run, so load on the
shared cores hits them alike) and model forward tokens counted by a forward pre-hook (positions computed, padding and
finished rows included). Ratios are ``shared / hf_generate`` and ``shared / loop_unshared`` from the same run.
``--model auto`` uses the warm addition model when ``get_warm_model`` finds it in the cache (no training is
started), else the untrained tiny model; the JSON says which. One torch thread. Writes JSON (default
``benchmarks/results/shared_prefix_bench.json``) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from trl_ext.measurement.keyed_sampling import SamplerSettings  # noqa: E402
from trl_ext.measurement.shared_prefix import count_forward_tokens, shared_prefix_generate  # noqa: E402

GS = (1, 4, 8, 16)  # G = 1: control, nothing can be shared
TEMPERATURES = (0.7, 1.0)


def _load_models(which: str):
    from trl_ext.testbed import build_tiny_model, build_tokenizer
    from trl_ext.testbed.warmup import validate_cache, warm_model_dir

    models = {}
    tok = build_tokenizer()
    warm_dir = warm_model_dir("addition", 0)
    warm_ok = validate_cache(warm_dir, "addition", 0) is None
    if which in ("warm", "both") or (which == "auto" and warm_ok):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from trl_ext.testbed import get_warm_model

        path = get_warm_model("addition", seed=0)  # builds it (1-4 min) only for --model warm/both without cache
        models["warm_addition_seed0"] = (AutoModelForCausalLM.from_pretrained(path).float().eval(),
                                         AutoTokenizer.from_pretrained(path), path)  # fmt: skip
    if which in ("untrained", "both") or (which == "auto" and not warm_ok):
        models["untrained_tiny_seed0"] = (build_tiny_model(tok, seed=0), tok, None)
    return models


def _hf_generate(model, rows, settings, generator_seed):
    from trl_ext.measurement.keyed_sampling import left_pad, truncate_at_eos

    ids, mask = left_pad(rows, settings.pad_token_id)
    torch.manual_seed(generator_seed)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=settings.temperature,
                         top_k=0, top_p=1.0, max_new_tokens=settings.max_new_tokens, eos_token_id=settings.eos_token_ids,
                         pad_token_id=settings.pad_token_id, disable_compile=True)  # fmt: skip
    return truncate_at_eos(out[:, ids.shape[1] :], settings.eos_token_ids)


def _one(name, model, rows, settings, seed):
    t0 = time.perf_counter()
    with count_forward_tokens(model) as c:
        if name == "hf_generate":
            comps, st = _hf_generate(model, rows, settings, seed), None
        else:
            gen = torch.Generator().manual_seed(seed)
            comps, st = shared_prefix_generate(model, rows, settings, generator=gen, share=(name == "shared"))
    dt = time.perf_counter() - t0
    return dt, c["tokens"], c["calls"], sum(map(len, comps)), st, c["per_call"][0]


def bench_case(model, rows, settings, repeats: int) -> dict:
    names = ("hf_generate", "loop_unshared", "shared")
    runs = {n: [] for n in names}
    with torch.no_grad():
        for n in names:  # warm-up (not timed)
            _one(n, model, rows[: max(1, len(rows) // 4)], settings, 999)
        for r in range(repeats):
            for n in names:
                runs[n].append(_one(n, model, rows, settings, 1000 + r))
    out = {}
    for n in names:
        times = [x[0] for x in runs[n]]
        rec = {
            "wall_s_median": statistics.median(times),
            "wall_s_min": min(times),
            "forward_tokens_mean": statistics.fmean(x[1] for x in runs[n]),
            "prefill_tokens_mean": statistics.fmean(x[5] for x in runs[n]),
            "decode_forward_tokens_mean": statistics.fmean(x[1] - x[5] for x in runs[n]),
            "forward_calls_mean": statistics.fmean(x[2] for x in runs[n]),
            "generated_tokens_mean": statistics.fmean(x[3] for x in runs[n]),
        }
        if n != "hf_generate":
            for k in ("decode_tokens", "computed_tokens", "independent_tokens", "max_branches", "forks"):
                rec[f"{k}_mean"] = statistics.fmean(x[4][k] for x in runs[n])
            for k in ("shared_fraction", "decode_shared_fraction", "saved_fraction"):
                rec[f"{k}_mean"] = statistics.fmean(x[4][k] for x in runs[n])
        out[n] = rec
    sh, hf, lu = out["shared"], out["hf_generate"], out["loop_unshared"]
    out["ratios"] = {
        "time_shared_over_hf": sh["wall_s_median"] / hf["wall_s_median"],
        "time_shared_over_loop_unshared": sh["wall_s_median"] / lu["wall_s_median"],
        "forward_tokens_shared_over_hf": sh["forward_tokens_mean"] / hf["forward_tokens_mean"],
        "forward_tokens_shared_over_loop_unshared": sh["forward_tokens_mean"] / lu["forward_tokens_mean"],
        "decode_tokens_shared_over_hf": sh["decode_forward_tokens_mean"] / max(hf["decode_forward_tokens_mean"], 1),
        # per generated token: the samplers draw different (independent) completions, so their lengths differ
        "decode_per_token_shared_over_loop_unshared": (
            (sh["decode_forward_tokens_mean"] / sh["generated_tokens_mean"])
            / max(lu["decode_forward_tokens_mean"] / lu["generated_tokens_mean"], 1e-12)
        ),
    }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("auto", "warm", "untrained", "both"), default="auto")
    ap.add_argument("--prompts", type=int, default=16, help="distinct addition prompts per call")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, nargs="+", default=None,
                    help="completion caps (default: the testbed's, answer digits + 2 = 5, and 24)")  # fmt: skip
    ap.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results", "shared_prefix_bench.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from trl_ext.testbed import make_dataset
    from trl_ext.testbed.tasks import TASKS

    caps = args.max_new_tokens or [TASKS["addition"].max_answer_chars() + 2, 24]
    models = _load_models(args.model)
    ds = make_dataset("addition", args.prompts, seed=0)
    result = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["python", os.path.relpath(__file__), *(argv if argv is not None else sys.argv[1:])]),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "prompts": args.prompts,
        "repeats": args.repeats,
        "loadavg_start": list(os.getloadavg()),
        "cases": [],
    }
    t_start = time.perf_counter()
    for mname, (model, tok, path) in models.items():
        prompt_ids = [tok(p)["input_ids"] for p in ds["prompt"]]
        for cap in caps:
            for g in GS:
                for temp in TEMPERATURES:
                    settings = SamplerSettings(temperature=temp, max_new_tokens=cap, eos_token_ids=[tok.eos_token_id],
                                               pad_token_id=tok.pad_token_id)  # fmt: skip
                    rows = [p for p in prompt_ids for _ in range(g)]
                    case = {"model": mname, "model_path": path, "max_new_tokens": cap, "G": g, "temperature": temp,
                            "rows": len(rows), **bench_case(model, rows, settings, args.repeats)}  # fmt: skip
                    result["cases"].append(case)
                    _print_row(case, header=len(result["cases"]) == 1)
    result["total_wall_s"] = time.perf_counter() - t_start
    result["loadavg_end"] = list(os.getloadavg())
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {args.output} ({result['total_wall_s']:.0f} s)")
    return 0


def _print_row(c: dict, header: bool) -> None:
    if header:
        print(f"{'model':<22}{'cap':>4}{'G':>4}{'T':>5} | {'hf ms':>7}{'loop ms':>8}{'shr ms':>8} | "
              f"{'hf fwd':>7}{'loop fwd':>9}{'shr fwd':>8} | {'t shr/hf':>8}{'t shr/loop':>11}{'fwd shr/hf':>11}"
              f"{'dec/tok s/l':>13} | "
              f"{'gen tok':>8}{'dec shared':>11}")  # fmt: skip
    hf, lu, sh, r = c["hf_generate"], c["loop_unshared"], c["shared"], c["ratios"]
    print(f"{c['model']:<22}{c['max_new_tokens']:>4}{c['G']:>4}{c['temperature']:>5} | "
          f"{hf['wall_s_median'] * 1e3:>7.1f}{lu['wall_s_median'] * 1e3:>8.1f}{sh['wall_s_median'] * 1e3:>8.1f} | "
          f"{hf['forward_tokens_mean']:>7.0f}{lu['forward_tokens_mean']:>9.0f}{sh['forward_tokens_mean']:>8.0f} | "
          f"{r['time_shared_over_hf']:>8.2f}{r['time_shared_over_loop_unshared']:>11.2f}"
          f"{r['forward_tokens_shared_over_hf']:>11.3f}{r['decode_per_token_shared_over_loop_unshared']:>13.3f} | "
          f"{sh['generated_tokens_mean']:>8.0f}{sh['decode_shared_fraction_mean']:>11.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())

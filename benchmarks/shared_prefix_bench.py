"""Shared-prefix rollouts vs ordinary sampling: wall time and model forward tokens.

    python benchmarks/shared_prefix_bench.py [--model auto|warm|untrained|both|real] [--prompts 16] [--repeats 3]
                                             [--max-new-tokens N ...] [--samplers NAME ...] [--output PATH]

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

``--model real``: SmolLM2-135M-Instruct from the cache (:func:`trl_ext.realmodel.get_real_model`; built once by
``trl-ext fetch-real-model``), on the real tasks' two-shot chat prompts (test split, half ``sum3`` and half
``largest``, templated with ``add_generation_prompt=True`` as TRL templates a conversational prompt; EOS
``<|im_end|>``). Its preset, sized to finish in about 10 minutes on one thread: ``G`` in 4, 8, 16 (no ``G = 1``
control), ``T`` in 0.7, 1.0, 64 new tokens, 2 prompts (one per task), 2 repeats, samplers ``hf_generate`` and ``shared`` (the
unshared loop costs as much as ``generate`` here; add it with ``--samplers``), one untimed warm-up call per sampler
instead of one per case; any of these can be overridden by its flag. Default output
``benchmarks/results/shared_prefix_bench_real.json``.
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
SAMPLERS = ("hf_generate", "loop_unshared", "shared")
#: ``--model real`` preset (each overridable by its flag): sized for about 10 minutes on one CPU thread.
REAL_PRESET = {"gs": (4, 8, 16), "prompts": 2, "repeats": 2, "max_new_tokens": [64],
               "samplers": ("hf_generate", "shared")}


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


def _load_real():
    """SmolLM2-135M-Instruct from the cache (float32, eval) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.realmodel import get_real_model

    path = get_real_model()  # builds it into the cache the first time (download + conversion, ~1 min)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return {"smollm2_135m_instruct": (model, AutoTokenizer.from_pretrained(path), path)}


def _real_prompt_ids(tok, n: int) -> list[list[int]]:
    """``n`` two-shot chat prompts of the real tasks' test split (first half ``sum3``, second half ``largest``)."""
    from trl_ext.realmodel import make_real_dataset

    rows = (make_real_dataset("sum3", (n + 1) // 2, seed=0, split="test", as_list=True)
            + make_real_dataset("largest", n // 2, seed=0, split="test", as_list=True))  # fmt: skip
    return [list(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]) for r in rows]  # fmt: skip


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


def bench_case(model, rows, settings, repeats: int, names=SAMPLERS, warmup: bool = True) -> dict:
    runs = {n: [] for n in names}
    with torch.no_grad():
        if warmup:
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
    sh, hf, lu = out["shared"], out.get("hf_generate"), out.get("loop_unshared")
    ratios = {}
    if hf is not None:
        ratios.update({
            "time_shared_over_hf": sh["wall_s_median"] / hf["wall_s_median"],
            "forward_tokens_shared_over_hf": sh["forward_tokens_mean"] / hf["forward_tokens_mean"],
            "prefill_tokens_shared_over_hf": sh["prefill_tokens_mean"] / max(hf["prefill_tokens_mean"], 1),
            "decode_tokens_shared_over_hf": sh["decode_forward_tokens_mean"] / max(hf["decode_forward_tokens_mean"], 1),
            "decode_per_token_shared_over_hf": (
                (sh["decode_forward_tokens_mean"] / sh["generated_tokens_mean"])
                / max(hf["decode_forward_tokens_mean"] / hf["generated_tokens_mean"], 1e-12)
            ),
        })  # fmt: skip
    if lu is not None:
        ratios.update({
            "time_shared_over_loop_unshared": sh["wall_s_median"] / lu["wall_s_median"],
            "forward_tokens_shared_over_loop_unshared": sh["forward_tokens_mean"] / lu["forward_tokens_mean"],
            # per generated token: the samplers draw different (independent) completions, so their lengths differ
            "decode_per_token_shared_over_loop_unshared": (
                (sh["decode_forward_tokens_mean"] / sh["generated_tokens_mean"])
                / max(lu["decode_forward_tokens_mean"] / lu["generated_tokens_mean"], 1e-12)
            ),
        })  # fmt: skip
    out["ratios"] = ratios
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("auto", "warm", "untrained", "both", "real"), default="auto")
    ap.add_argument("--prompts", type=int, default=None,
                    help="distinct prompts per call (default 16 addition prompts; real: 2 chat prompts)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per sampler and case (default 3; real: 2)")
    ap.add_argument("--max-new-tokens", type=int, nargs="+", default=None,
                    help="completion caps (default: the testbed's, answer digits + 2 = 5, and 24; real: 64)")
    ap.add_argument("--samplers", nargs="+", choices=SAMPLERS, default=None,
                    help="samplers to time besides shared (default all three; real: hf_generate and shared)")
    ap.add_argument("--output", default=None,
                    help="JSON path (default benchmarks/results/shared_prefix_bench.json; real: "
                         "shared_prefix_bench_real.json)")  # fmt: skip
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    real = args.model == "real"
    results_dir = os.path.join(os.path.dirname(__file__), "results")
    output = args.output or os.path.join(results_dir, "shared_prefix_bench_real.json" if real
                                         else "shared_prefix_bench.json")  # fmt: skip
    n_prompts = args.prompts or (REAL_PRESET["prompts"] if real else 16)
    repeats = args.repeats or (REAL_PRESET["repeats"] if real else 3)
    names = tuple(n for n in SAMPLERS if n == "shared" or n in (args.samplers or (REAL_PRESET["samplers"] if real
                                                                                  else SAMPLERS)))  # fmt: skip
    gs = REAL_PRESET["gs"] if real else GS

    if real:
        caps = args.max_new_tokens or REAL_PRESET["max_new_tokens"]
        models = _load_real()
    else:
        from trl_ext.testbed import make_dataset
        from trl_ext.testbed.tasks import TASKS

        caps = args.max_new_tokens or [TASKS["addition"].max_answer_chars() + 2, 24]
        models = _load_models(args.model)
        ds = make_dataset("addition", n_prompts, seed=0)
    result = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["python", os.path.relpath(__file__), *(argv if argv is not None else sys.argv[1:])]),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "prompts": n_prompts,
        "repeats": repeats,
        "samplers": list(names),
        "loadavg_start": list(os.getloadavg()),
        "cases": [],
    }
    t_start = time.perf_counter()
    for mname, (model, tok, path) in models.items():
        if real:
            prompt_ids = _real_prompt_ids(tok, n_prompts)
            result["prompt_tokens"] = [len(p) for p in prompt_ids]
            # one untimed warm-up call per sampler (a quarter of every case, as for the testbed, would add ~25 %)
            warm = SamplerSettings(temperature=1.0, max_new_tokens=4, eos_token_ids=[tok.eos_token_id],
                                   pad_token_id=tok.pad_token_id)  # fmt: skip
            with torch.no_grad():
                for n in names:
                    _one(n, model, prompt_ids[:1] * 2, warm, 999)
        else:
            prompt_ids = [tok(p)["input_ids"] for p in ds["prompt"]]
        for cap in caps:
            for g in gs:
                for temp in TEMPERATURES:
                    settings = SamplerSettings(temperature=temp, max_new_tokens=cap, eos_token_ids=[tok.eos_token_id],
                                               pad_token_id=tok.pad_token_id)  # fmt: skip
                    rows = [p for p in prompt_ids for _ in range(g)]
                    case = {"model": mname, "model_path": path, "max_new_tokens": cap, "G": g, "temperature": temp,
                            "rows": len(rows),
                            **bench_case(model, rows, settings, repeats, names, warmup=not real)}  # fmt: skip
                    result["cases"].append(case)
                    _print_row(case, header=len(result["cases"]) == 1)
    result["total_wall_s"] = time.perf_counter() - t_start
    result["loadavg_end"] = list(os.getloadavg())
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {output} ({result['total_wall_s']:.0f} s)")
    return 0


def _ms(rec: dict | None, key: str = "wall_s_median", scale: float = 1e3, fmt: str = ".1f") -> str:
    return "-" if rec is None else format(rec[key] * scale, fmt)


def _print_row(c: dict, header: bool) -> None:
    if header:
        print(f"{'model':<22}{'cap':>4}{'G':>4}{'T':>5} | {'hf ms':>7}{'loop ms':>8}{'shr ms':>8} | "
              f"{'hf fwd':>7}{'loop fwd':>9}{'shr fwd':>8} | {'t shr/hf':>8}{'t shr/loop':>11}{'fwd shr/hf':>11}"
              f"{'dec/tok s/l':>13} | "
              f"{'gen tok':>8}{'dec shared':>11}")  # fmt: skip
    hf, lu, sh, r = c.get("hf_generate"), c.get("loop_unshared"), c["shared"], c["ratios"]

    def rat(key, fmt):
        return format(r[key], fmt) if key in r else "-"

    print(f"{c['model']:<22}{c['max_new_tokens']:>4}{c['G']:>4}{c['temperature']:>5} | "
          f"{_ms(hf):>7}{_ms(lu):>8}{_ms(sh):>8} | "
          f"{_ms(hf, 'forward_tokens_mean', 1, '.0f'):>7}{_ms(lu, 'forward_tokens_mean', 1, '.0f'):>9}"
          f"{_ms(sh, 'forward_tokens_mean', 1, '.0f'):>8} | "
          f"{rat('time_shared_over_hf', '.2f'):>8}{rat('time_shared_over_loop_unshared', '.2f'):>11}"
          f"{rat('forward_tokens_shared_over_hf', '.3f'):>11}"
          f"{rat('decode_per_token_shared_over_loop_unshared', '.3f'):>13} | "
          f"{sh['generated_tokens_mean']:>8.0f}{sh['decode_shared_fraction_mean']:>11.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())

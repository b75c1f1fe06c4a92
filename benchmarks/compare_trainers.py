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
    python benchmarks/compare_trainers.py --output_dir /tmp/smoke --smoke --model_name_or_path /tmp/tiny
    python benchmarks/compare_trainers.py --output_dir /tmp/smoke2 --smoke --protocol v2 --task scratchpad \\
        --model_name_or_path /tmp/tiny --tune_lr 1e-4 3e-4 --seeds 0 1
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

import argparse
import functools
import gc
import hashlib
import json
import math
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import import_module

from trl_ext._argtypes import nonneg_int as _nonneg_int
from trl_ext._argtypes import positive_float as _pos_float
from trl_ext._argtypes import positive_int as _pos_int
from trl_ext._io import read_json, resolve_jsonl, write_json_compact
from trl_ext._io import write_json as _write_json

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

TOKEN_METRIC = "ext/generated_tokens_total"
GRPO_REFERENCE = "grpo_g16"
#: Dataset column whose values split the per-difficulty breakdown (``runs.json`` / ``table.json``).
DIFFICULTY_COLUMN = "n_digits"
#: Graded (partial-credit) reward of each testbed task that has one: the scorer of the ``tiebreak`` method.
GRADED_REWARDS: dict[str, str] = {"scratchpad": "trl_ext.testbed.tasks:scratchpad_steps_reward"}
#: Numbers of runs the BASIS value table is amortized over in the table's total-cost columns.
AMORTIZE_OVER = (1, 10)
LR_CHOICE_FILE = "lr_choice.json"


# ------------------------------------------------------------------------------------------------------ methods
BASE_CONFIG = "trl_ext.trainers.base:ExtGRPOConfig"
BASE_TRAINER = "trl_ext.trainers.base:GRPOTrainer"


@dataclass(frozen=True)
class MethodSpec:
    """One configuration of the comparison.

    Attributes
    ----------
    name, label : str
        Registry key and plot / table label.
    family : {"grpo", "baseline", "trl_ext"}
        ``"grpo"``: plain GRPO at one group size, the candidates for the "best GRPO setting" reference;
        ``"baseline"``: other published critic-free recipes; ``"trl_ext"``: the package's own trainers and
        measurement options.
    group_size : int
        Rollouts per prompt decided up front, passed as ``num_generations`` (``v05_k_init`` for V0.5, candidates for
        PAIR, 1 for single-rollout methods, whose sampler then yields unique prompts).
    config_kwargs : dict
        Method-specific config fields on top of the shared ones (e.g. ``advantage_estimator``,
        ``advantage_estimator_kwargs``, ``loss_type``, ``dynamic_sampling``, ``v05_k_init``).
    config, trainer : str
        ``"module:Class"`` of the config and trainer classes, imported when the method runs; default
        ``trl_ext.ExtGRPOConfig`` / ``trl_ext.GRPOTrainer`` (a method that is a configuration of the base trainer
        needs only ``config_kwargs``).
    setup : str or None
        Name of a function ``setup(ctx) -> SetupResult`` in this module (extra config kwargs, training reward
        functions, cost records), run once per invocation; it raises :class:`MethodUnavailable` when the method is
        not defined for the task (the method is then recorded as skipped with the reason).
    """

    name: str
    label: str
    family: str
    group_size: int
    config_kwargs: dict = field(default_factory=dict)
    config: str = BASE_CONFIG
    trainer: str = BASE_TRAINER
    setup: str | None = None


@dataclass
class SetupResult:
    """What a method's ``setup(ctx)`` returns.

    Attributes
    ----------
    config : dict
        Extra config kwargs (precedence: above ``MethodSpec.config_kwargs``, below ``--config_overrides``).
    reward_funcs : list of callables or None
        Training reward functions replacing the task's (evaluation always uses the task's binary reward).
    info : dict
        Cost and provenance records copied into every run record of the method (e.g. the BASIS table's tokens).
    """

    config: dict = field(default_factory=dict)
    reward_funcs: list | None = None
    info: dict = field(default_factory=dict)


class MethodUnavailable(Exception):
    """Raised by a method's setup when the method is not defined for this task (recorded as ``skipped``)."""


_V05 = dict(config="trl_ext.trainers.v05:V05GRPOConfig", trainer="trl_ext.trainers.v05:V05GRPOTrainer")
METHODS: dict[str, MethodSpec] = {
    "grpo_g16": MethodSpec("grpo_g16", "GRPO G=16", "grpo", group_size=16),
    "grpo_g8": MethodSpec("grpo_g8", "GRPO G=8", "grpo", group_size=8),
    "grpo_g4": MethodSpec("grpo_g4", "GRPO G=4", "grpo", group_size=4),
    # num_generations=1: the base trainer's sampler yields unique prompts, one rollout each
    "reinforce_pp": MethodSpec("reinforce_pp", "REINFORCE++ (1 rollout)", "baseline", group_size=1,
                               config_kwargs={"advantage_estimator": "reinforce_pp",
                                              "advantage_estimator_kwargs": {"normalize": True}}),
    "rloo": MethodSpec("rloo", "RLOO G=4", "baseline", group_size=4,
                       config_kwargs={"advantage_estimator": "rloo",
                                      "advantage_estimator_kwargs": {"normalize": False}}),
    "dr_grpo": MethodSpec("dr_grpo", "Dr. GRPO G=16", "baseline", group_size=16,
                          config_kwargs={"advantage_estimator": "dr_grpo", "loss_type": "dr_grpo"}),
    "dapo_dynamic": MethodSpec("dapo_dynamic", "GRPO G=4 +DAPO dynamic sampling", "baseline", group_size=4,
                               config_kwargs={"dynamic_sampling": True}),
    "basis": MethodSpec("basis", "BASIS G=1", "trl_ext", group_size=1, config="trl_ext.trainers.basis:BASISConfig",
                        trainer="trl_ext.trainers.basis:BASISTrainer", setup="setup_basis"),
    "v05_osla": MethodSpec("v05_osla", "V0.5 k_init=4 +OSLA", "trl_ext", group_size=4,
                           config_kwargs={"v05_k_init": 4, "v05_extra_rollout_budget": float("inf")}, **_V05),
    # fixed k = 4 without OSLA: cost c = 1/16 makes the OSLA cap round(1/sqrt(c)) = 4 = v05_k_init, so no prompt can
    # get a further round; the prior fusion of the advantages is unchanged.
    "v05_fixed4": MethodSpec("v05_fixed4", "V0.5 k=4 fixed", "trl_ext", group_size=4,
                             config_kwargs={"v05_k_init": 4, "v05_rollout_cost": 1.0 / 16}, **_V05),
    "pair": MethodSpec("pair", "PAIR G=16", "trl_ext", group_size=16, config="trl_ext.trainers.pair:PAIRConfig",
                       trainer="trl_ext.trainers.pair:PAIRTrainer"),
    # GRPO G=8 whose policy loss is divided only by the tokens of groups with a nonzero advantage
    "signal_only": MethodSpec("signal_only", "GRPO G=8 signal-only denominators", "trl_ext", group_size=8,
                              config_kwargs={"signal_only_denominator": True}),
    # GRPO G=8 on reward = binary grade + 0.1 x within-class rank of the graded reward (setup_tiebreak)
    "tiebreak": MethodSpec("tiebreak", "GRPO G=8 +tie-break blend", "trl_ext", group_size=8,
                           config_kwargs={"tie_break_epsilon": 0.1}, setup="setup_tiebreak"),
}

#: The methods of the real-model benchmark (issue-independent: the baselines and the paper methods).
REAL_METHODS = ["grpo_g8", "grpo_g4", "reinforce_pp", "dapo_dynamic", "basis", "v05_osla", "pair"]
#: Scale presets (the ``addition`` values; the v1 CPU run used them). ``cpu``: the offline testbed on 2 cores;
#: ``gpu``: a larger budget and GPU-friendly trainer defaults; everything else is the same code path.
SCALES: dict[str, dict] = {
    "cpu": dict(task="addition", rollouts_per_step=64, token_budget=40_000, eval_every_tokens=5_000, n_eval=2000,
                n_train=4000, n_val=1000, learning_rate=1e-4, eval_samples=0, value_table_samples=32, use_cpu=True,
                bf16=False, eval_batch_size=250),
    "gpu": dict(task="addition", rollouts_per_step=256, token_budget=400_000, eval_every_tokens=50_000, n_eval=2000,
                n_train=8000, n_val=1000, learning_rate=1e-4, eval_samples=0, value_table_samples=32, use_cpu=False,
                bf16=True, eval_batch_size=250),
    # the real pretrained chat model on CPU (docs/results.md "Real-LLM benchmark"): SmolLM2-135M-Instruct + LoRA
    # r 16 on the sum3 chat task. Sized from a one-off measurement (one thread, fp32, LoRA): a GRPO G=8 step of 16
    # rollouts (~1,000 generated tokens, prompts ~200 tokens) took about 2 minutes, a third of it HF generation, so
    # a 6,000-token run with 3 evaluations of 64 questions is ~20 min (the committed runs' records have the times). One loss pass over
    # the 16 rollouts (vocabulary 49,152, ~330 tokens a row) needed 12 GB, so two workers ran out of the 24 GB:
    # grad_accum = 4 trains each generation batch in 4 micro-batches of 4 rollouts (one optimizer step, one
    # generation, the same gradient), about 3 GB a worker. The BASIS table is built 64 prompts' samples at a
    # time (the builder writes rows per batch and resumes from them; one batch of all 512 samples took over 20
    # minutes with nothing saved until the end).
    "smollm2": dict(task="sum3", rollouts_per_step=16, token_budget=6_000, eval_every_tokens=2_000, n_eval=64,
                    n_train=128, n_val=48, learning_rate=1e-4, eval_samples=1, eval_mode="sampled",
                    checkpoint_outcomes=True, value_table_samples=4, use_cpu=True, bf16=False, eval_batch_size=64,
                    use_peft=True, lora_r=16, lora_alpha=32, methods=REAL_METHODS, grad_accum=4,
                    value_table_batch_size=64),
}
#: Protocol values a scale replaces (applied after :data:`PROTOCOLS`): on the real model every run costs ~20 CPU
#: minutes, so v2 tunes two learning rates on the 1-3-10 ladder, extends once past an edge winner (the first
#: tuning runs put GRPO's best at the upper edge, 3e-4), and runs 3 seeds.
SCALE_PROTOCOL: dict[tuple[str, str], dict] = {
    ("smollm2", "v2"): dict(tune_lr=[1e-4, 3e-4], seeds=[0, 1, 2], tune_extend=1),
}
#: Per-task overrides of a scale preset. ``scratchpad`` (completions of 18-71 tokens, max_completion_length 73 =
#: the longest completion + 2): the CPU budget is sized from a measurement (untrained tiny model, 73-token
#: completions, one thread, the other core busy): GRPO G=8 took 1.21 s per step of 64 rollouts (4,672 tokens) and
#: 2.8 s to evaluate 250 questions greedily (2.77 s per step when the 2 cores were oversubscribed, load ~5). A warm
#: model writes about 47 tokens per completion on average (10 x 4.5 columns + 2), about 3,000 tokens per step at the
#: same step time (the batch still decodes to its longest completion), so 400,000 tokens are about 130 steps (160 s)
#: plus 4 evaluations of 1,000 questions (45 s): 3.5 min per GRPO G=8 run (2.5 min if completions stay at 73 tokens).
TASK_PRESETS: dict[tuple[str, str], dict] = {
    ("scratchpad", "cpu"): dict(token_budget=400_000, eval_every_tokens=100_000, n_eval=1000, n_val=1000,
                                n_train=4000),
    ("scratchpad", "gpu"): dict(token_budget=4_000_000, eval_every_tokens=500_000, n_eval=2000, n_val=1000,
                                n_train=16000),
}
#: Protocol defaults on top of the preset. ``v1``: one learning rate for every method, seeds 0-2 (the documented
#: CPU run); ``v2``: each method's learning rate tuned on a validation split (grid 3e-5, 1e-4, 3e-4, seed 0), then
#: seeds 0-4 at the chosen rates, the threshold set by the best GRPO setting.
PROTOCOLS: dict[str, dict] = {
    "v1": dict(seeds=[0, 1, 2], tune_lr=None, tune_seeds=[0], threshold_reference=GRPO_REFERENCE, tune_extend=0),
    "v2": dict(seeds=[0, 1, 2, 3, 4], tune_lr=[3e-5, 1e-4, 3e-4], tune_seeds=[0], threshold_reference="best_grpo",
               tune_extend=2),
}
SMOKE = dict(methods=["grpo_g16", "grpo_g4"], seeds=[0], token_budget=500, eval_every_tokens=250, n_eval=40,
             n_train=64, n_val=40, rollouts_per_step=32, n_sim=50, n_boot=200)


# ---------------------------------------------------------------------------------------------- budget callback
def _trainer_callback_base():
    try:
        from transformers import TrainerCallback
    except ImportError:  # pragma: no cover - transformers is a hard dependency of the package
        return object
    return TrainerCallback


class TokenBudgetCallback(_trainer_callback_base()):
    """Stop training once the cumulative generated tokens reach ``budget``; fire checkpoints on the way.

    Reads :data:`TOKEN_METRIC` (``ext/generated_tokens_total``, the cumulative count of every generated token that
    ``trl_ext.GRPOTrainer`` logs for every trainer and rollout strategy) from ``logs``; no other metric is read.
    Each time the count crosses the next entry of ``checkpoints`` (sorted; the budget itself is always the last one),
    ``on_checkpoint(nominal, tokens, state)`` is called once per crossed nominal checkpoint with the actual count;
    crossing the budget sets ``control.should_training_stop`` so the run ends after the current step (overshoot
    < one generation batch).

    Parameters
    ----------
    budget : float
        Generated-token budget, > 0.
    checkpoints : sequence of float, optional
        Evaluation points in tokens, each in ``(0, budget]``; ``budget`` is added if missing.
    on_checkpoint : callable, optional
        ``on_checkpoint(nominal: float, tokens: float, state: TrainerState) -> None``.

    Attributes
    ----------
    metric : str
        :data:`TOKEN_METRIC`.
    tokens : float
        Current generated-token count (0 before the first log that has the metric).
    seen : bool
        Whether the metric was logged at least once.
    reached : bool
        Whether the budget was reached.
    fired : list of (nominal, tokens)
        Checkpoints fired so far.

    Raises
    ------
    ValueError
        Non-positive/NaN budget, checkpoints outside ``(0, budget]``.
    RuntimeError
        A logged count that is negative, not finite or lower than the previous one; or a training log (one with
        ``loss``) before the metric was ever logged: the trainer does not report generated tokens and the budget
        cannot be enforced (raised at the first step instead of training on to ``max_steps``).
    """

    metric = TOKEN_METRIC

    def __init__(self, budget: float, checkpoints: Sequence[float] = (), on_checkpoint: Callable | None = None):
        if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not math.isfinite(budget) \
                or budget <= 0:
            raise ValueError(f"budget must be a finite number of tokens > 0, got {budget!r}")
        cps = sorted({float(c) for c in checkpoints} | {float(budget)})
        bad = [c for c in cps if not (0 < c <= budget)]
        if bad:
            raise ValueError(f"checkpoints must lie in (0, budget={budget}]; got {bad}")
        self.budget = float(budget)
        self.checkpoints = cps
        self.on_checkpoint = on_checkpoint
        self.tokens = 0.0
        self.seen = False
        self.reached = False
        self.fired: list[tuple[float, float]] = []

    def _next(self) -> float | None:
        return self.checkpoints[len(self.fired)] if len(self.fired) < len(self.checkpoints) else None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return control
        if self.metric not in logs:
            if "loss" in logs and not self.seen:
                raise RuntimeError(
                    f"training log at step {getattr(state, 'global_step', '?')} without {self.metric}: the trainer "
                    "does not report generated tokens, so the token budget cannot be enforced. Use a trl_ext "
                    f"trainer (every trl_ext.GRPOTrainer subclass logs {self.metric}) with logging_steps=1."
                )
            return control
        value = float(logs[self.metric])
        if not math.isfinite(value) or value < 0:
            raise RuntimeError(f"logged {self.metric} = {value}: a generated-token count must be finite and >= 0")
        if value < self.tokens:
            raise RuntimeError(f"logged {self.metric} decreased from {self.tokens} to {value}: expected a cumulative "
                               "count")
        self.seen = True
        self.tokens = value
        nxt = self._next()
        while nxt is not None and value >= nxt:
            self.fired.append((nxt, value))
            if self.on_checkpoint is not None:
                self.on_checkpoint(nxt, value, state)
            nxt = self._next()
        if value >= self.budget:
            self.reached = True
            control.should_training_stop = True
        return control


# ------------------------------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
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
    p.add_argument("--eval_samples", type=_nonneg_int, default=None,
                   help="also measure sampled accuracy (T=1) with this many samples per question (0 = off)")
    p.add_argument("--threshold", type=float, default=None,
                   help="accuracy for 'tokens to threshold' (default v1: grpo_g16's mean final accuracy; v2: the best "
                        "GRPO setting's; without them the start accuracy + 0.10)")
    p.add_argument("--task", default=None,
                   help="testbed task: addition (default), scratchpad, substitution; or a real-model chat task: "
                        "sum3, largest, steps (trl_ext.realmodel.tasks; the SmolLM2 model unless "
                        "--model_name_or_path)")
    p.add_argument("--eval_mode", choices=("greedy", "sampled"), default=None,
                   help="primary held-out accuracy: greedy (default) or sampled at T = 1 with --eval_samples per "
                        "question (default for --scale smollm2)")
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
                   help="run the methods in this many worker processes side by side (each with --num_threads "
                        "threads; methods are split by their estimated cost), then aggregate every run into one "
                        "set of tables, verdicts and plots (default 1: one process)")
    p.add_argument("--n_sim", type=_pos_int, default=None, help="Monte Carlo reruns for the smallest gap")
    p.add_argument("--n_boot", type=_pos_int, default=None, help="paired bootstrap replicates")
    p.add_argument("--cache_dir", default=None,
                   help="where the BASIS value table is cached "
                        "(default $TRL_EXT_CACHE/bench or ~/.cache/trl_ext/bench)")
    p.add_argument("--no_resume", action="store_true", help="re-run runs whose result.json already exists")
    p.add_argument("--report_only", action="store_true",
                   help="train nothing: tables, verdicts and plots from the finished runs in --output_dir; runs not "
                        "finished yet are recorded as pending, methods with pending tuning runs get no learning "
                        "rate, and lr_choice.json is neither written nor changed (an interim report of a benchmark "
                        "that runs across sessions)")
    p.add_argument("--no_plots", action="store_true", help="skip the PNG plots")
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
                "n_train", "eval_samples", "n_sim", "n_boot", "value_table_samples", "use_peft", "lora_r",
                "lora_alpha", "eval_mode"):
        if getattr(args, key, None) is not None:
            s[key] = getattr(args, key)
    if args.methods is not None:
        s["methods"] = list(dict.fromkeys(args.methods))
    if args.seeds is not None:
        s["seeds"] = list(dict.fromkeys(args.seeds))
    if args.tune_seeds is not None:
        s["tune_seeds"] = list(dict.fromkeys(args.tune_seeds))
    if args.tune_extend is not None:
        s["tune_extend"] = args.tune_extend
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
    if s["temperature"] != 1.0 and task not in REAL_TASK_NAMES and not args.dataset_fn:
        raise SystemExit("--temperature is for the real-model tasks and --dataset_fn datasets (the testbed tasks' "
                         "evaluation samples at T = 1)")
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
    s.update(update_norms=bool(getattr(args, "update_norms", False)), config_overrides=overrides, scale=args.scale, protocol=args.protocol, smoke=bool(args.smoke),
             threshold=args.threshold, model_name_or_path=args.model_name_or_path, warm_seed=args.warm_seed,
             dataset_fn=args.dataset_fn, reward_fn=args.reward_fn, graded_reward_fn=args.graded_reward_fn,
             max_completion_length=args.max_completion_length,
             output_dir=os.path.abspath(args.output_dir), resume=not args.no_resume,
             report_only=bool(getattr(args, "report_only", False)),
             cache_dir=os.path.abspath(args.cache_dir or os.path.join(
                 os.environ.get("TRL_EXT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trl_ext"),
                 "bench")))
    return s


# ------------------------------------------------------------------------------------------------- context
def _load_object(spec: str):
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'module:attribute', got {spec!r}")
    return getattr(import_module(module), attr)


def checkpoint_fingerprint(path: str) -> str:
    """Short sha256 of a local checkpoint's weights and config (``path`` itself for a Hub id).

    Part of the v2 run keys and of the ``lr_choice.json`` settings, so runs and learning-rate choices made from an
    earlier warm model (e.g. a rebuilt testbed checkpoint at the same path) are not reused.
    """
    if not os.path.isdir(path):
        return str(path)
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        if name.endswith((".safetensors", ".bin")) or name == "config.json":
            h.update(name.encode())
            with open(os.path.join(path, name), "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:16]


START_CHECKPOINT_DIR = "start_checkpoint"


def pinned_start_checkpoint(s: dict, build: Callable[[], str]) -> str:
    """The testbed start checkpoint, pinned inside ``--output_dir`` under v2.

    The warm-up is deterministic on one machine but not across machines (CPU kernels change the SFT trajectory), so
    a rebuilt warm model on a fresh clone would differ and none of the committed runs could be reused or extended.
    Under a tuning protocol (v2) the first invocation copies the warm model to ``<output_dir>/start_checkpoint/``
    and every later one (on any machine) starts from that copy; its fingerprint is part of the run keys either way.
    v1 keeps using the cache (``build()``).
    """
    if not s.get("tune_lr"):
        return build()
    pinned = os.path.join(s["output_dir"], START_CHECKPOINT_DIR)
    if os.path.isfile(os.path.join(pinned, "config.json")):
        print(f"start checkpoint pinned in the output directory: {pinned}", flush=True)
        return pinned
    src = build()
    tmp = f"{pinned}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    os.replace(tmp, pinned)
    print(f"start checkpoint {src} pinned as {pinned}", flush=True)
    return pinned


def validation_split(train_pool, train_ds, n_val: int):
    """``n_val`` rows of ``train_pool`` (the task's train split) whose ``question_id`` is not a training prompt.

    The validation set of learning-rate tuning: drawn from the train split (the test split stays untouched) and
    disjoint from the training prompts by construction. Raises ``SystemExit`` when the split has too few rows left.
    """
    used = set(train_ds["question_id"])
    keep = [i for i, q in enumerate(train_pool["question_id"]) if q not in used][:n_val]
    if len(keep) < n_val:
        raise SystemExit(f"--n_val {n_val}: the train split has only {len(keep)} problems outside the {len(used)} "
                         "training prompts; lower --n_val or --n_train")
    return train_pool.select(keep)


class Context:
    """Shared, method-independent state: model path, tokenizer, datasets, rewards, evaluator.

    ``eval_ds`` is the held-out test set of the main runs; ``val_ds`` (built on first use) the validation set of
    learning-rate tuning, from the train split and disjoint from ``train_ds``.
    """

    def __init__(self, s: dict):
        from transformers import AutoTokenizer

        self.s = s
        self._val_ds = None
        self.graded_reward = _load_object(s["graded_reward_fn"]) if s.get("graded_reward_fn") else None
        if s["dataset_fn"]:
            self.task = None
            data = _load_object(s["dataset_fn"])()
            if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
                raise SystemExit("--dataset_fn must return (train_dataset, eval_dataset[, validation_dataset])")
            self.train_ds, self.eval_ds = data[0], data[1]
            self._val_ds = data[2] if len(data) == 3 else None
            self.reward_funcs = [_load_object(s["reward_fn"])]
            if s["model_name_or_path"] is None:
                raise SystemExit("--model_name_or_path is required with --dataset_fn")
            self.model_path = s["model_name_or_path"]
            self.max_new = s["max_completion_length"] or 256
        elif s["task"] in REAL_TASK_NAMES:
            self._init_real_task(s)
        else:
            from trl_ext.testbed import TASKS, get_reward_funcs, get_warm_model, make_dataset, split_size

            self.task = s["task"]
            if self.task not in TASKS:
                raise SystemExit(f"unknown task {self.task!r}; choose from {sorted(TASKS)}")
            n_train = min(s["n_train"], split_size(self.task, "train"))
            self.train_ds = make_dataset(self.task, n_train, seed=0, split="train")
            self.eval_ds = make_dataset(self.task, min(s["n_eval"], split_size(self.task, "test")), seed=0,
                                        split="test")
            self.reward_funcs = get_reward_funcs(self.task)
            if self.graded_reward is None and self.task in GRADED_REWARDS:
                self.graded_reward = _load_object(GRADED_REWARDS[self.task])
            self.model_path = s["model_name_or_path"] or pinned_start_checkpoint(
                s, lambda: get_warm_model(self.task, seed=s["warm_seed"], verbose=True))
            self.max_new = s["max_completion_length"] or TASKS[self.task].max_answer_chars() + 2
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.cache_dir = s["cache_dir"]
        s["start_checkpoint_sha"] = checkpoint_fingerprint(self.model_path)

    def _init_real_task(self, s: dict) -> None:
        """A real-model chat task (:data:`REAL_TASK_NAMES`, ``trl_ext.realmodel.tasks``): conversational two-shot
        prompts, the strict ``accuracy_reward`` (binary; the format is not rewarded), the offline SmolLM2 model
        unless ``--model_name_or_path`` names another chat model. Rows get a ``question_id`` (the question text,
        unique per item) so outcomes pair across runs and the validation set can exclude the training prompts."""
        from trl_ext.realmodel import get_real_model
        from trl_ext.realmodel.tasks import get_real_reward_funcs, split_items

        self.task = s["task"]
        self.train_ds = real_task_dataset(self.task, min(s["n_train"], len(split_items(self.task, "train"))),
                                          split="train", seed=0)
        self.eval_ds = real_task_dataset(self.task, min(s["n_eval"], len(split_items(self.task, "test"))),
                                         split="test", seed=0)
        self.reward_funcs = get_real_reward_funcs(self.task)
        self.model_path = s["model_name_or_path"] or get_real_model()
        self.max_new = s["max_completion_length"] or REAL_TASK_MAX_NEW[self.task]

    @property
    def val_ds(self):
        """Validation set for learning-rate tuning (train split, disjoint from ``train_ds``)."""
        if self._val_ds is None and self.task in REAL_TASK_NAMES:
            pool = real_task_dataset(self.task, None, split="train", seed=1)
            self._val_ds = validation_split(pool, self.train_ds, self.s["n_val"])
        if self._val_ds is None:
            if self.task is None:
                raise SystemExit("learning-rate tuning with --dataset_fn needs a validation set: return (train, "
                                 "eval, validation) from the dataset function")
            from trl_ext.testbed import make_dataset, split_size

            pool = make_dataset(self.task, split_size(self.task, "train"), seed=1, split="train")
            self._val_ds = validation_split(pool, self.train_ds, self.s["n_val"])
        overlap = set(self._val_ds["question_id"]) & set(self.train_ds["question_id"])
        if overlap:
            raise SystemExit(f"the validation set shares {len(overlap)} questions with the training prompts "
                             f"(e.g. {sorted(overlap)[:3]}); they must be disjoint")
        return self._val_ds

    def dataset(self, split: str):
        """``"test"``: the held-out evaluation set; ``"validation"``: the tuning set."""
        return self.eval_ds if split == "test" else self.val_ds

    def load_model(self):
        import torch
        from transformers import AutoModelForCausalLM

        dtype = torch.bfloat16 if self.s["bf16"] else torch.float32
        return AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)

    def evaluate(self, model, *, greedy: bool = True, num_samples: int = 1, seed: int = 0, split: str = "test"):
        """Held-out accuracy with the task's binary reward (whatever a method trains on); returns
        ``trl_ext.testbed.EvalResult`` (records in the outcome JSONL schema)."""
        from trl_ext.testbed import EvalResult, evaluate_model

        bs = self.s["eval_batch_size"]
        ds = self.dataset(split)
        if self.task is not None and self.task not in REAL_TASK_NAMES:
            return evaluate_model(model, self.tokenizer, ds, self.task, greedy=greedy,
                                  num_samples=num_samples, max_new_tokens=self.max_new, seed=seed, batch_size=bs)
        return _generic_evaluate(model, self.tokenizer, ds, self.reward_funcs[0], greedy, num_samples,
                                 self.max_new, seed, bs, EvalResult, temperature=self.s.get("temperature", 1.0))

    @property
    def eval_reward_name(self) -> str:
        """Name of the reward that scores every evaluation (the task's first, binary reward)."""
        from trl_ext.priors.value_table import reward_func_name

        return reward_func_name(self.reward_funcs[0])

    def difficulty_levels(self, split: str = "test") -> dict[str, str] | None:
        """``question_id -> str(n_digits)`` of the split's questions, or ``None`` without that column."""
        ds = self.dataset(split)
        if DIFFICULTY_COLUMN not in getattr(ds, "column_names", []):
            return None
        return {str(q): str(v) for q, v in zip(ds["question_id"], ds[DIFFICULTY_COLUMN])}


#: Real-model chat tasks (``trl_ext.realmodel.tasks``) and their completion caps (the measured regime's, docs/real_model.md).
REAL_TASK_MAX_NEW: dict[str, int] = {"sum3": 128, "largest": 128, "steps": 192, "steps_matched": 192}
REAL_TASK_NAMES = tuple(REAL_TASK_MAX_NEW)


def real_task_dataset(task: str, n: int | None, *, split: str, seed: int):
    """``trl_ext.realmodel.tasks.make_real_dataset`` plus a ``question_id`` column: the question (the last user
    turn), unique per item, so outcome files pair by question across runs."""
    from datasets import Dataset

    from trl_ext.realmodel.tasks import make_real_dataset

    rows = make_real_dataset(task, n, seed=seed, split=split, as_list=True)
    return Dataset.from_list([{**r, "question_id": f"{task}:{r['prompt'][-1]['content']}"} for r in rows])


def _tokenize_prompts(tok, prompts: list, device):
    """Left-padded input ids of plain-text prompts, or of conversations through the chat template (generation
    prompt appended), as TRL's trainers render them."""
    if prompts and isinstance(prompts[0], list):
        enc = tok.apply_chat_template(prompts, add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                      padding=True)
    else:
        enc = tok(prompts, return_tensors="pt", padding=True)
    return {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}


def _prompt_text(prompt) -> str:
    """A prompt as recorded in outcome files: a conversation's last turn (the question), a plain prompt as is."""
    return str(prompt[-1]["content"]) if isinstance(prompt, list) and prompt else str(prompt)


def _generic_evaluate(model, tok, dataset, reward_fn, greedy, num_samples, max_new, seed, batch_size, result_cls,
                      temperature: float = 1.0):
    """Evaluation for ``--dataset_fn`` datasets and the real-model chat tasks (same record schema as
    ``trl_ext.testbed.evaluate_model``); conversational prompts go through the tokenizer's chat template. Sampled
    evaluation uses ``temperature`` (the training temperature), top_k 0, top_p 1."""
    import torch

    rows = [dict(r) for r in dataset]
    if not rows or any(k not in rows[0] for k in ("prompt", "question_id")):
        raise ValueError("the evaluation dataset needs 'prompt' and 'question_id' columns and at least one row")
    was_training = model.training
    model.eval()
    old_side, tok.padding_side = tok.padding_side, "left"
    device = next(model.parameters()).device
    kw = dict(max_new_tokens=max_new, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    kw.update(do_sample=False) if greedy else kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    records, total = [], 0
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            for start in range(0, len(rows), batch_size):
                chunk = rows[start:start + batch_size]
                enc = _tokenize_prompts(tok, [r["prompt"] for r in chunk], device)
                out = model.generate(**enc, num_return_sequences=num_samples, **kw)[:, enc["input_ids"].shape[1]:]
                for i, row in enumerate(chunk):
                    comps, lens = [], []
                    for ids in out[i * num_samples:(i + 1) * num_samples].tolist():
                        n = ids.index(tok.eos_token_id) + 1 if tok.eos_token_id in ids else len(ids)
                        lens.append(n)
                        comps.append(tok.decode(ids[:n], skip_special_tokens=True))
                    extra = {k: [v] * num_samples for k, v in row.items() if k != "prompt"}
                    scores = reward_fn([row["prompt"]] * num_samples, comps, **extra)
                    rate = float(sum(float(x or 0.0) for x in scores)) / num_samples
                    records.append({"question_id": str(row["question_id"]), "correct": int(rate > 0.5),
                                    "pass_rate": rate, "n_samples": num_samples,
                                    "completion_tokens": sum(lens) / len(lens), "prompt": _prompt_text(row["prompt"]),
                                    "answer": str(row.get("answer", "")), "completions": comps})
                    total += sum(lens)
    finally:
        tok.padding_side = old_side
        model.train(was_training)
    rates = [r["pass_rate"] for r in records]
    return result_cls(accuracy=sum(rates) / len(rates), per_prompt_pass_rate=rates, records=records,
                      generated_tokens=int(total))


# -------------------------------------------------------------------------------------------- method setups
def counting_reward(func: Callable, counter: dict) -> Callable:
    """``func`` (a TRL reward function) that also adds the lengths of the ``completion_ids`` it scores to
    ``counter["tokens"]`` and their number to ``counter["completions"]``; name and signature are ``func``'s, so the
    value-table header (which records reward-function names) is unchanged."""
    counter.setdefault("tokens", 0)
    counter.setdefault("completions", 0)

    @functools.wraps(func)
    def wrapped(*args, completion_ids=None, **kwargs):
        if completion_ids is not None:
            counter["tokens"] += int(sum(len(c) for c in completion_ids))
            counter["completions"] += len(completion_ids)
        return func(*args, completion_ids=completion_ids, **kwargs)

    return wrapped


def table_cost_record(counted_tokens: int, n_written: int, n_already_done: int, samples_per_prompt: int,
                      build_wall_s: float) -> dict:
    """Generated tokens of a value-table build from what one builder call counted.

    A build that wrote every row (``n_already_done == 0``) counted every sampled token. A resumed build (rows from an
    interrupted earlier call) counted only its own rows: the total is extrapolated by ``(written + already done) /
    written`` and marked so; with nothing written the total is unknown (``None``).
    """
    n_rows = n_written + n_already_done
    if n_already_done == 0:
        tokens, source = float(counted_tokens), "counted"
    elif n_written > 0:
        tokens = float(counted_tokens) * n_rows / n_written
        source = f"extrapolated: counted {n_written} of {n_rows} prompts (the rest came from an interrupted build)"
    else:
        tokens, source = None, "unknown: every row came from an earlier, uncounted build"
    return {"table_tokens": tokens, "table_tokens_source": source, "table_prompts": n_rows,
            "table_samples_per_prompt": samples_per_prompt, "table_build_wall_s": build_wall_s}


VALUE_TABLE_DIR = "value_table"


def setup_basis(ctx: Context) -> SetupResult:
    """Build (once) the BASIS reference value table for the training pool: cached in ``--cache_dir``, or under a
    tuning protocol (v2) pinned in ``<output_dir>/value_table/`` next to the pinned start checkpoint.

    The pinned table is keyed by the start checkpoint's fingerprint rather than its path, so a fresh clone on another
    machine finds the committed table (and its ``.cost.json``) and neither rebuilds it nor loses its token count; an
    interrupted build left there is resumed by the next invocation.

    ``value_table_samples`` completions per training prompt are sampled at the training temperature (T = 1 unless
    ``--temperature``) from the *starting* checkpoint
    (the frozen reference policy, BASIS Section 4 "Offline value", Appendix 10) and scored with the training reward,
    by the package's own builder :func:`trl_ext.priors.value_table.build_value_table` (the code behind
    ``trl-ext build-value-table``; resumable, so an interrupted build continues). The builder does not report what it
    generated, so its reward function is wrapped by :func:`counting_reward`, which sums the lengths of the sampled
    ``completion_ids`` it scores (EOS included, as ``ext/generated_tokens_total`` counts); the count is cached next
    to the table (``value_table-<key>.cost.json``) and copied into every BASIS run record (``setup_info``).
    """
    from trl_ext.priors.value_table import build_value_table

    n = ctx.s["value_table_samples"]
    if ctx.s.get("tune_lr"):  # v2: pinned with the results, keyed by the weights (not by a machine's path)
        table_dir, model_id = os.path.join(ctx.s["output_dir"], VALUE_TABLE_DIR), ctx.s["start_checkpoint_sha"]
    else:
        table_dir, model_id = ctx.cache_dir, ctx.model_path
    temp = ctx.s.get("temperature", 1.0)
    key = hashlib.sha256(f"{model_id}|{ctx.task}|{ctx.s['dataset_fn']}|{len(ctx.train_ds)}|{n}|"
                         f"{ctx.max_new}|counted{'' if temp == 1.0 else f'|T={temp}'}".encode()).hexdigest()[:12]
    path = os.path.join(table_dir, f"value_table-{key}.jsonl")
    done = os.path.join(table_dir, f"value_table-{key}.done")
    cost_path = os.path.join(table_dir, f"value_table-{key}.cost.json")
    config = {"basis_value_table_path": path}
    if os.path.exists(done) and os.path.exists(cost_path):
        with open(cost_path, encoding="utf-8") as f:
            return SetupResult(config=config, info={**json.load(f), "table_path": path})
    os.makedirs(table_dir, exist_ok=True)
    t0 = time.time()
    model = ctx.load_model()
    counter: dict = {}
    funcs = [counting_reward(ctx.reward_funcs[0], counter), *ctx.reward_funcs[1:]]
    table = build_value_table(model, ctx.tokenizer, ctx.train_ds, funcs, path, num_samples=n,
                              max_new_tokens=ctx.max_new, temperature=temp, batch_size=ctx.s.get("value_table_batch_size", 2048), seed=12345, model_id=ctx.model_path,
                              use_vllm=False if ctx.s["use_cpu"] else "auto", progress=False)
    stats = table.metadata.get("build_stats", {})
    info = table_cost_record(counter.get("tokens", 0), int(stats.get("n_written", len(table))),
                             int(stats.get("n_already_done", 0)), n, time.time() - t0)
    _write_json(cost_path, info)  # without the path: a pinned table is read on other machines too
    info["table_path"] = path
    with open(done, "w", encoding="utf-8") as f:
        f.write(f"{len(table)} rows\n")
    print(f"built BASIS value table {path} ({len(table)} prompts x {n} samples, {info['table_tokens']} generated "
          f"tokens, {time.time() - t0:.0f} s)", flush=True)
    del model
    return SetupResult(config=config, info=info)


def setup_tiebreak(ctx: Context) -> SetupResult:
    """Training rewards of the ``tiebreak`` method: ``[binary task reward(s)..., graded reward]``.

    The trainer's tie-break blend (``ExtGRPOConfig.tie_break_scorer_index`` -> ``trl_ext.estimators.tie_break_blend``)
    then trains on ``grade + epsilon x within-(group, grade) rank of the graded score``: the checker (binary reward)
    decides, the graded reward (e.g. ``scratchpad_steps_reward``) only orders attempts the checker tied. Raises
    :class:`MethodUnavailable` when the task has no graded reward (:data:`GRADED_REWARDS`, ``--graded_reward_fn``).
    Evaluation keeps the binary reward.
    """
    from trl_ext.priors.value_table import reward_func_name

    if ctx.graded_reward is None:
        raise MethodUnavailable(f"the tie-break blend needs a graded reward; task {ctx.task!r} has none (testbed "
                                f"tasks with one: {sorted(GRADED_REWARDS)}; otherwise pass --graded_reward_fn)")
    funcs = [*ctx.reward_funcs, ctx.graded_reward]
    return SetupResult(config={"tie_break_scorer_index": len(funcs) - 1}, reward_funcs=funcs,
                       info={"graded_reward": reward_func_name(ctx.graded_reward)})


def get_setup(ctx: Context, spec: MethodSpec, setup_cache: dict) -> SetupResult | MethodUnavailable | None:
    """The method's setup result, computed once per invocation (a :class:`MethodUnavailable` is cached too)."""
    if not spec.setup:
        return None
    if spec.setup not in setup_cache:
        try:
            setup_cache[spec.setup] = globals()[spec.setup](ctx)
        except MethodUnavailable as e:
            setup_cache[spec.setup] = e
    return setup_cache[spec.setup]


# --------------------------------------------------------------------------------------------------- one run
def _settings_key(s: dict, spec: MethodSpec, seed: int, lr: float | None = None, split: str = "test") -> str:
    """Hash of everything a finished run depends on (reuse check). Fields added after the v1 run enter only when
    they differ from what v1 ran, so v1 results stay reusable."""
    keep = {k: s[k] for k in ("task", "rollouts_per_step", "token_budget", "eval_every_tokens", "n_eval", "n_train",
                              "learning_rate", "eval_samples", "model_name_or_path", "warm_seed", "dataset_fn",
                              "reward_fn", "max_completion_length", "config_overrides", "bf16", "use_cpu")}
    if lr is not None:
        keep["learning_rate"] = lr
    keep.update(method=spec.name, seed=seed, group_size=spec.group_size, config_kwargs=spec.config_kwargs)
    if split != "test":
        keep.update(eval_split=split, n_val=s["n_val"])
        keep.pop("eval_every_tokens")  # tuning runs evaluate once, at the budget
    if spec.setup == "setup_tiebreak":
        keep["graded_reward"] = s.get("graded_reward_fn") or GRADED_REWARDS.get(s["task"])
    if spec.setup == "setup_basis" and s["value_table_samples"] != 32:
        keep["value_table_samples"] = s["value_table_samples"]
    if s.get("grad_accum", 1) != 1:
        keep["grad_accum"] = s["grad_accum"]
    if s.get("eval_mode", "greedy") != "greedy":
        keep["eval_mode"] = s["eval_mode"]
    if s.get("temperature", 1.0) != 1.0:
        keep["temperature"] = s["temperature"]
    if s.get("use_peft"):  # added with the real-model preset: keys of full-model runs are unchanged
        keep["lora"] = (s["lora_r"], s["lora_alpha"])
    if s.get("protocol") == "v2":  # v2 keys also pin the start checkpoint's weights (a rebuilt warm model re-runs)
        keep["start_checkpoint_sha"] = s.get("start_checkpoint_sha")
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_config(ctx: Context, spec: MethodSpec, config_cls, trainer_cls, seed: int, run_dir: str, extra: dict,
                 lr: float | None = None):
    """Shared config + the method's fields. Prompts per step: ``rollouts_per_step / group_size``.

    ``num_generations = group_size``; with ``group_size == 1`` (or a trainer with ``unique_prompt_sampler``) the
    generation batch is ``n_prompts`` unique prompts, one rollout each. ``lr`` (default ``--learning_rate``) is the
    method's learning rate. Precedence of the config fields: shared settings < ``spec.config_kwargs`` < the setup's
    ``extra`` < ``--config_overrides``.
    """
    s = ctx.s
    n_prompts = max(1, s["rollouts_per_step"] // spec.group_size)
    unique = spec.group_size == 1 or bool(getattr(trainer_cls, "unique_prompt_sampler", False))
    per_device = n_prompts if unique else n_prompts * spec.group_size
    budget_steps = int(math.ceil(s["token_budget"] / max(1, n_prompts))) + 2  # >= 1 token per rollout: upper bound
    ga = int(s.get("grad_accum", 1))
    if per_device % ga:
        raise ValueError(f"grad_accum={ga} must divide the {per_device} rollouts of a generation batch")
    kw = dict(
        output_dir=run_dir, seed=seed, max_steps=budget_steps,
        learning_rate=s["learning_rate"] if lr is None else lr,
        lr_scheduler_type="constant", warmup_steps=0, per_device_train_batch_size=per_device // ga,
        gradient_accumulation_steps=ga, steps_per_generation=ga, num_generations=spec.group_size,
        max_completion_length=ctx.max_new, temperature=s.get("temperature", 1.0), beta=0.0, use_cpu=s["use_cpu"], bf16=s["bf16"],
        gradient_checkpointing=False, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0,
    )
    kw.update(spec.config_kwargs)
    kw.update(extra)
    kw.update(s["config_overrides"])
    return config_cls(**kw), kw, n_prompts


def accuracy_by_level(records: Sequence[dict], levels: dict[str, str] | None) -> dict[str, dict] | None:
    """Per-difficulty accuracy of one evaluation: ``{level: {"n": questions, "accuracy": mean pass rate}}``.

    ``levels`` maps ``question_id`` to its level (e.g. ``n_digits``); ``None`` (no such column) gives ``None``.
    Levels are ordered numerically when they are numbers.
    """
    if levels is None:
        return None
    acc: dict[str, list[float]] = {}
    for r in records:
        lv = levels.get(str(r["question_id"]))
        if lv is not None:
            acc.setdefault(lv, []).append(float(r["pass_rate"]))
    return {lv: {"n": len(v), "accuracy": sum(v) / len(v)} for lv, v in sorted(acc.items(), key=_level_order)}


def _level_order(item):
    k = item[0]
    try:
        return (0, float(k), "")
    except ValueError:
        return (1, 0.0, k)


def run_one(ctx: Context, spec: MethodSpec, seed: int, run_dir: str, setup_cache: dict, lr: float | None = None,
            split: str = "test") -> dict:
    """Train one (method, seed) to the token budget at learning rate ``lr``; returns the run record.

    ``split="test"`` (main runs): greedy accuracy on the held-out test set at every ``eval_every_tokens`` checkpoint
    and at the budget. ``split="validation"`` (learning-rate tuning): one evaluation on the validation set at the
    budget; the test set is not touched.
    """
    import torch
    from transformers import PrinterCallback

    from trl_ext.priors.value_table import reward_func_name

    s = ctx.s
    lr = s["learning_rate"] if lr is None else lr
    rec = {"method": spec.name, "label": spec.label, "family": spec.family, "seed": seed, "status": "ok",
           "learning_rate": lr, "eval_split": split, "settings_key": _settings_key(s, spec, seed, lr, split)}
    try:
        config_cls, trainer_cls = _load_object(spec.config), _load_object(spec.trainer)
    except (ImportError, AttributeError) as e:
        rec.update(status="skipped", reason=f"trainer not importable: {type(e).__name__}: {e}")
        return rec
    setup = get_setup(ctx, spec, setup_cache)
    if isinstance(setup, MethodUnavailable):
        rec.update(status="skipped", reason=f"not defined for this task: {setup}")
        return rec
    extra = dict(setup.config) if setup else {}
    reward_funcs = list(setup.reward_funcs) if setup and setup.reward_funcs else list(ctx.reward_funcs)
    try:
        config, cfg_kw, n_prompts = build_config(ctx, spec, config_cls, trainer_cls, seed, run_dir, extra, lr=lr)
    except (TypeError, ValueError) as e:
        rec.update(status="skipped", reason=f"config rejected: {type(e).__name__}: {e}")
        return rec
    rec.update(config={k: v for k, v in cfg_kw.items() if k != "output_dir"}, prompts_per_step=n_prompts,
               trainer_class=f"{trainer_cls.__module__}.{trainer_cls.__name__}",
               reward_funcs=[reward_func_name(f) for f in reward_funcs], eval_reward=ctx.eval_reward_name)
    if setup and setup.info:
        rec["setup_info"] = dict(setup.info)

    curve: list[dict] = []
    timer = {"eval_s": 0.0, "t0": None}
    final: dict = {}
    model_holder: dict = {}

    def train_wall() -> float:
        return 0.0 if timer["t0"] is None else time.perf_counter() - timer["t0"] - timer["eval_s"]

    def evaluate(nominal: float, tokens: float, step: int, is_final: bool) -> None:
        t = time.perf_counter()
        model = model_holder["trainer"].model
        last = model_holder.get("last_eval")
        if last is not None and last[:2] == (step, tokens):  # several checkpoints crossed in one step: same model
            g, sampled = last[2:]
        else:
            g, sampled = evaluate_checkpoint(ctx, model, seed, split)
            model_holder["last_eval"] = (step, tokens, g, sampled)
        sampled_primary = s.get("eval_mode") == "sampled"  # then g holds the sampled evaluation
        point = {"nominal_tokens": nominal, "tokens": tokens, "step": step, "train_wall_s": train_wall(),
                 "accuracy": g.accuracy, ("sampled_accuracy" if sampled_primary else "greedy_accuracy"): g.accuracy}
        if sampled is not None:
            point["sampled_accuracy"] = sampled.accuracy
        from trl_ext.testbed import write_outcomes_jsonl

        if s.get("checkpoint_outcomes") and not is_final:  # per-question outcomes of every checkpoint
            path = os.path.join(run_dir, "checkpoints", f"outcomes_{int(nominal)}.jsonl.gz")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            point["outcomes"] = os.path.relpath(write_outcomes_jsonl(path, g.records), s["output_dir"])
        curve.append(point)
        if is_final:
            # gzip-compressed (the results are committed); the readers also accept an older run's plain .jsonl
            final["outcomes"] = write_outcomes_jsonl(os.path.join(run_dir, "outcomes.jsonl.gz"), g.records)
            if s.get("checkpoint_outcomes"):
                point["outcomes"] = os.path.relpath(final["outcomes"], s["output_dir"])
            if sampled is not None:
                final["outcomes_sampled"] = write_outcomes_jsonl(os.path.join(run_dir, "outcomes_sampled.jsonl.gz"),
                                                                 sampled.records)
            final["point"] = point
            final["by_level"] = accuracy_by_level(g.records, ctx.difficulty_levels(split))
        timer["eval_s"] += time.perf_counter() - t
        print(f"  [{spec.name} seed {seed} lr {lr:g}] {tokens:>9.0f} tokens (step {step}, train "
              f"{point['train_wall_s']:.1f} s): {split} {'sampled' if sampled_primary else 'greedy'} "
              f"{g.accuracy:.3f}" + (f", sampled {sampled.accuracy:.3f}" if sampled else ""), flush=True)

    budget = float(s["token_budget"])
    every = float(s["eval_every_tokens"])
    cps = [every * k for k in range(1, int(budget // every) + 1) if every * k < budget] if split == "test" else []

    def on_checkpoint(nominal, tokens, state):
        evaluate(nominal, tokens, state.global_step, is_final=nominal >= budget)

    cb = TokenBudgetCallback(budget, cps, on_checkpoint)

    class _Clock(_trainer_callback_base()):
        def on_train_begin(self, args, state, control, **kw):
            timer["t0"] = time.perf_counter()

    norms = UpdateNormCallback() if s.get("update_norms") else None
    torch.manual_seed(seed)
    model = ctx.load_model()
    peft_kw = {"peft_config": lora_config(s)} if s.get("use_peft") else {}
    trainer = trainer_cls(model=model, reward_funcs=reward_funcs, args=config, train_dataset=ctx.train_ds,
                          processing_class=ctx.tokenizer, callbacks=[_Clock(), cb] + ([norms] if norms else []),
                          **peft_kw)
    trainer.remove_callback(PrinterCallback)
    model_holder["trainer"] = trainer
    trainer.train()
    if not cb.reached:  # max_steps hit first: evaluate where it stopped, say so
        evaluate(budget, cb.tokens, trainer.state.global_step, is_final=True)
        rec["warning"] = f"stopped at max_steps={config.max_steps} before the token budget ({cb.tokens:.0f} < {budget})"
    logs = [h for h in trainer.state.log_history if TOKEN_METRIC in h]
    rec.update(
        curve=curve, tokens=cb.tokens, token_metric=TOKEN_METRIC if cb.seen else None,
        budget_reached=cb.reached,
        steps=trainer.state.global_step, train_wall_s=train_wall(), eval_wall_s=timer["eval_s"],
        final_accuracy=final["point"]["accuracy"], final_greedy_accuracy=final["point"].get("greedy_accuracy"),
        final_sampled_accuracy=final["point"].get("sampled_accuracy"),
        final_accuracy_by_level=final["by_level"],
        outcomes=os.path.relpath(final["outcomes"], s["output_dir"]),
        outcomes_sampled=(os.path.relpath(final["outcomes_sampled"], s["output_dir"])
                          if "outcomes_sampled" in final else None),
        tokens_per_step=cb.tokens / max(1, trainer.state.global_step),
        rollouts_per_step=(sum(h.get("ext/rollouts", 0.0) for h in logs) / len(logs)) if logs else None,
        last_log={k: v for k, v in (logs[-1] if logs else {}).items() if isinstance(v, (int, float))},
        trace=os.path.relpath(write_json_compact(os.path.join(run_dir, TRACE_FILE),
                                                 step_trace(logs, norms.norms if norms else None)), s["output_dir"]),
    )
    del trainer, model
    gc.collect()
    return rec


def evaluate_checkpoint(ctx: Context, model, seed: int, split: str):
    """``(primary, extra_sampled)`` evaluations of one checkpoint. ``eval_mode="greedy"`` (default): greedy
    accuracy, plus sampled accuracy with ``eval_samples`` samples per question when that is > 0. ``"sampled"``:
    only the sampled evaluation (at the training temperature, T = 1 by default; ``eval_samples`` per question, sampling seed ``1000 + seed``: the same
    noise stream for every method at one seed), which is then the primary accuracy."""
    s = ctx.s
    if s.get("eval_mode") == "sampled":
        return ctx.evaluate(model, greedy=False, num_samples=s["eval_samples"], seed=1000 + seed, split=split), None
    g = ctx.evaluate(model, greedy=True, split=split)
    sampled = None
    if s["eval_samples"]:
        sampled = ctx.evaluate(model, greedy=False, num_samples=s["eval_samples"], seed=1000 + seed, split=split)
    return g, sampled


START_EVAL_FILE = "start_eval.json"


def start_evaluation(ctx: Context):
    """The start checkpoint's primary evaluation on the test set (:func:`evaluate_checkpoint`, seed 0), cached in
    ``<output_dir>/start_eval.json`` with the settings it depends on, so ``--jobs`` workers and resumed invocations
    (minutes per evaluation on the real model) do not repeat it."""
    from types import SimpleNamespace

    s = ctx.s
    key = {k: s.get(k) for k in ("task", "n_eval", "eval_mode", "eval_samples", "model_name_or_path",
                                 "max_completion_length", "start_checkpoint_sha", "dataset_fn")}
    if s.get("temperature", 1.0) != 1.0:  # keys of T = 1 evaluations are unchanged
        key["temperature"] = s["temperature"]
    path = os.path.join(s["output_dir"], START_EVAL_FILE)
    if s["resume"] and os.path.exists(path):
        doc = read_json(path)
        if doc.get("key") == key:
            return SimpleNamespace(accuracy=doc["accuracy"], records=doc["records"])
    g = evaluate_checkpoint(ctx, ctx.load_model(), 0, "test")[0]
    _write_json(path, {"key": key, "accuracy": g.accuracy,
                       "records": [{k: r[k] for k in ("question_id", "correct", "pass_rate")} for r in g.records]})
    return g


def final_accuracy(run: dict) -> float:
    """A run's primary accuracy at the budget (``final_greedy_accuracy`` in runs written before ``eval_mode``)."""
    return float(run["final_accuracy"] if run.get("final_accuracy") is not None else run["final_greedy_accuracy"])


def point_accuracy(point: dict) -> float:
    """A curve point's primary accuracy (``greedy_accuracy`` in runs written before ``eval_mode``)."""
    return float(point["accuracy"] if "accuracy" in point else point["greedy_accuracy"])


def lora_config(s: dict):
    """The LoRA adapter of ``--use_peft`` runs: rank ``lora_r``, ``lora_alpha``, every linear layer, no dropout
    (dropout would make the policy's log-probabilities stochastic between generation and the loss)."""
    from peft import LoraConfig

    return LoraConfig(r=s["lora_r"], lora_alpha=s["lora_alpha"], lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")


#: A run's per-step trace, next to its result.json (deterministic gzip JSON); the record's ``trace`` names it.
TRACE_FILE = "trace.json.gz"
#: Per-step metrics kept in a run's ``trace`` (what the step decided and how large it was).
TRACE_KEYS = ("reward", "grad_norm", "adv/abs_mean", "adv/abs_max", "ext/generated_tokens", "ext/rollouts",
              "pair/completed_per_group", "pair/ess_mean", "pair/pi_min", "pair/pi_mean", "pair/max_weight",
              "pair/finished_in_prefix", "pair/head_brier")


class UpdateNormCallback(_trainer_callback_base()):
    """Records ``||theta_t - theta_{t-1}||_2`` over the trainable parameters after every optimizer step."""

    def __init__(self):
        self.norms: dict[int, float] = {}
        self._prev = None

    @staticmethod
    def _flat(model):
        import torch

        return torch.cat([p.detach().float().reshape(-1).clone() for p in model.parameters() if p.requires_grad])

    def on_train_begin(self, args, state, control, model=None, **kw):
        self._prev = self._flat(model)

    def on_step_end(self, args, state, control, model=None, **kw):
        cur = self._flat(model)
        self.norms[int(state.global_step)] = float((cur - self._prev).norm())
        self._prev = cur


def step_trace(logs: Sequence[dict], update_norms: dict | None = None) -> list[dict]:
    """One record per logged training step: ``step``, the :data:`TRACE_KEYS` present, and ``update_norm``."""
    out = []
    for h in logs:
        rec = {"step": int(h.get("step", 0))}
        rec.update({k: float(h[k]) for k in TRACE_KEYS if isinstance(h.get(k), (int, float))})
        if update_norms and rec["step"] in update_norms:
            rec["update_norm"] = update_norms[rec["step"]]
        out.append(rec)
    return out


def load_trace(rec: dict, base: str) -> list[dict] | None:
    """A run record's per-step trace (``None`` when it has none, e.g. a failed run).

    ``rec["trace"]`` is the list itself (result.json of runs written before traces moved out), or a path relative to
    ``base`` (the output dir) of the ``trace.json.gz`` or of the result.json that holds the list inline (old runs in
    a runs.json). ``base`` may also be the run's own folder: the file name alone is then looked up there.
    """
    ref = rec.get("trace")
    if ref is None or isinstance(ref, list):
        return ref
    path = os.path.join(base, ref)
    if not os.path.exists(path) and os.path.exists(os.path.join(base, os.path.basename(ref))):
        path = os.path.join(base, os.path.basename(ref))
    data = read_json(path)
    if isinstance(data, dict):  # a result.json with the trace inline
        data = data.get("trace")
    if not isinstance(data, list):
        raise ValueError(f"{path} holds no per-step trace list")
    return data


def _trace_by_reference(rec: dict, res_path: str, out_dir: str) -> dict:
    """``rec`` read from ``res_path``, with an inline trace (a run written before traces moved to trace.json.gz)
    replaced by the path of that result.json relative to ``out_dir``, so runs.json never embeds a trace."""
    if isinstance(rec.get("trace"), list):
        rec["trace"] = os.path.relpath(res_path, out_dir)
    return rec


def _skip_record(spec: MethodSpec, seed: int, reason: str, key: str | None = None, **extra) -> dict:
    return {"method": spec.name, "label": spec.label, "family": spec.family, "seed": seed, "status": "skipped",
            "reason": reason, "settings_key": key, **extra}


def run_or_reuse(ctx: Context, spec: MethodSpec, seed: int, run_dir: str, setup_cache: dict, lr: float,
                 split: str = "test") -> dict:
    """Reuse ``run_dir/result.json`` when it finished (status ok) with the same settings key, else train.

    A crash is recorded as ``failed`` with its traceback, never raised. A reused record gains what later versions
    of the harness add (``setup_info`` such as the BASIS table's tokens; the per-difficulty accuracy, recomputed from
    its ``outcomes.jsonl.gz``, or the plain ``outcomes.jsonl`` of an older run).
    """
    s = ctx.s
    res_path = os.path.join(run_dir, "result.json")
    key = _settings_key(s, spec, seed, lr, split)
    if s["resume"] and os.path.exists(res_path):
        with open(res_path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("settings_key") == key and old.get("status") == "ok":
            print(f"[{spec.name} seed {seed} lr {lr:g} {split}] reusing {res_path}", flush=True)
            return _trace_by_reference(_complete_reused(ctx, spec, old, setup_cache, lr, split), res_path,
                                       s["output_dir"])
    if s.get("report_only"):  # an interim report: nothing is trained or written
        return {**_skip_record(spec, seed, "not run yet (--report_only)", key), "status": "pending",
                "learning_rate": lr, "eval_split": split}
    what = "tuning on validation" if split != "test" else "training"
    print(f"[{spec.name} seed {seed} lr {lr:g}] {what} to {s['token_budget']:.0f} tokens", flush=True)
    os.makedirs(run_dir, exist_ok=True)
    t0 = time.time()
    try:
        rec = run_one(ctx, spec, seed, run_dir, setup_cache, lr=lr, split=split)
    except Exception as e:  # a crashing trainer is recorded and reported, never dropped
        rec = {"method": spec.name, "label": spec.label, "family": spec.family, "seed": seed, "status": "failed",
               "learning_rate": lr, "eval_split": split, "reason": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc(), "settings_key": key}
    rec["run_wall_s"] = time.time() - t0
    if rec["status"] != "ok":
        print(f"[{spec.name} seed {seed} lr {lr:g}] {rec['status'].upper()}: {rec['reason']}", flush=True)
    _write_json(res_path, rec)
    return rec


def _complete_reused(ctx: Context, spec: MethodSpec, rec: dict, setup_cache: dict, lr: float, split: str) -> dict:
    rec.setdefault("learning_rate", lr)
    rec.setdefault("eval_split", split)
    if spec.setup and "setup_info" not in rec:
        setup = get_setup(ctx, spec, setup_cache)
        if isinstance(setup, SetupResult) and setup.info:
            rec["setup_info"] = dict(setup.info)
    if "final_accuracy_by_level" not in rec:
        levels = ctx.difficulty_levels(split)
        path = resolve_jsonl(os.path.join(ctx.s["output_dir"], rec.get("outcomes") or ""))
        if levels is not None and rec.get("outcomes") and os.path.exists(path):
            from trl_ext.testbed import read_outcomes_jsonl

            rec["final_accuracy_by_level"] = accuracy_by_level(read_outcomes_jsonl(path), levels)
        else:
            rec["final_accuracy_by_level"] = None
    return rec


# ------------------------------------------------------------------------------------------ learning-rate tuning
LR_SELECTION_RULE = ("highest mean final accuracy (the primary evaluation: greedy, or sampled under eval_mode "
                     "'sampled') on the validation split over the tuning seeds; ties go to "
                     "the lower learning rate; a learning rate with a failed tuning run is not eligible; when the "
                     "best rate is the lowest or highest tried, the next rate beyond it on the 1-3-10 ladder is "
                     "tuned too (at most tune_extend times per method)")
#: Settings that must match for an existing lr_choice.json to apply to this invocation.
TUNING_CONTEXT_KEYS = ("task", "dataset_fn", "reward_fn", "model_name_or_path", "start_checkpoint_sha", "warm_seed",
                       "token_budget", "n_train", "n_val", "rollouts_per_step", "max_completion_length",
                       "config_overrides", "scale", "bf16", "tune_extend")


def lr_key(lr: float) -> str:
    """JSON key and directory tag of a learning rate (``3e-05``, ``0.0001``)."""
    return f"{float(lr):g}"


def lr_scores(tune_runs: Sequence[dict]) -> dict[str, dict[str, dict]]:
    """Validation scores per method and learning rate from tuning-run records.

    Returns ``{method: {lr_key: {"lr", "mean", "sd", "per_seed", "seeds", "n_ok", "n_not_ok", "reasons"}}}``;
    ``mean``/``sd`` over the finished (status ok) runs, ``None`` without any.
    """
    out: dict[str, dict[str, dict]] = {}
    for r in tune_runs:
        lr = float(r["learning_rate"])
        cell = out.setdefault(r["method"], {}).setdefault(lr_key(lr), {
            "lr": lr, "per_seed": [], "seeds": [], "n_ok": 0, "n_not_ok": 0, "reasons": []})
        if r["status"] == "ok":
            cell["per_seed"].append(final_accuracy(r))
            cell["seeds"].append(r["seed"])
            cell["n_ok"] += 1
        else:
            cell["n_not_ok"] += 1
            cell["reasons"].append(f"seed {r['seed']} {r['status']}: {r.get('reason')}")
    for cells in out.values():
        for cell in cells.values():
            cell["mean"], cell["sd"] = _mean_sd(cell["per_seed"])
    return {m: dict(sorted(c.items(), key=lambda kv: kv[1]["lr"])) for m, c in out.items()}


def choose_lr(scores: dict[str, dict]) -> tuple[float | None, str]:
    """Pick one method's learning rate from its :func:`lr_scores` entry (:data:`LR_SELECTION_RULE`).

    Returns ``(lr, reason)``; ``lr`` is ``None`` when no learning rate has all its tuning runs finished.
    """
    eligible = [c for c in scores.values() if c["n_ok"] > 0 and c["n_not_ok"] == 0]
    if not eligible:
        reasons = "; ".join(r for c in scores.values() for r in c["reasons"]) or "no tuning run"
        return None, f"no learning rate finished its tuning runs ({reasons})"
    best = max(eligible, key=lambda c: (c["mean"], -c["lr"]))
    ties = [c["lr"] for c in eligible if c["mean"] == best["mean"]]
    why = f"validation accuracy {best['mean']:.4f} (mean of {best['n_ok']} seed(s))"
    if len(ties) > 1:
        why += f"; tied with {sorted(x for x in ties if x != best['lr'])}, the lower learning rate wins"
    return best["lr"], why


def lr_ladder_neighbour(lr: float, direction: int) -> float:
    """The next learning rate below (``direction=-1``) or above (``+1``) ``lr`` on the 1-3-10 ladder
    (..., 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, ...); ``lr`` need not be on the ladder."""
    import math

    if direction not in (-1, 1):
        raise ValueError("direction must be -1 or +1")
    lo = math.floor(math.log10(lr)) - 1
    ladder = sorted(m * 10.0 ** e for e in range(lo, lo + 4) for m in (1.0, 3.0))
    ladder = [float(f"{x:.1g}") for x in ladder]
    if direction < 0:
        return max(x for x in ladder if x < lr * (1 - 1e-9))
    return min(x for x in ladder if x > lr * (1 + 1e-9))


def edge_extension(scores: dict[str, dict]) -> float | None:
    """The learning rate to try next when tuning ended at an edge, else ``None``.

    ``scores`` is one method's :func:`lr_scores` entry. When the rate :func:`choose_lr` picks is the lowest (highest)
    rate tried and at least two rates were tried, the grid did not bracket the optimum: the next rate below (above)
    it on the 1-3-10 ladder (:func:`lr_ladder_neighbour`) is returned. ``None`` when the pick is interior, when it ties
    with another rate, when nothing finished, or with fewer than two rates.
    """
    lr, _ = choose_lr(scores) if scores else (None, "")
    tried = sorted(c["lr"] for c in scores.values())
    if lr is None or len(tried) < 2:
        return None
    eligible = [c for c in scores.values() if c["n_ok"] > 0 and c["n_not_ok"] == 0]
    best = max(c["mean"] for c in eligible)
    if sum(c["mean"] == best for c in eligible) > 1:  # a tie (e.g. nothing learned anywhere): no direction to go
        return None
    if lr == tried[0]:
        return lr_ladder_neighbour(lr, -1)
    if lr == tried[-1]:
        return lr_ladder_neighbour(lr, +1)
    return None


def build_lr_choice(tune_runs: Sequence[dict], grid: Sequence[float], tune_seeds: Sequence[int],
                    context: dict) -> dict:
    """The ``lr_choice.json`` document: per method the chosen learning rate, the reason, every validation score.

    A method whose tuning runs were all skipped (e.g. ``tiebreak`` on a task without a graded reward) gets
    ``status: "skipped"`` and the reason; one whose runs all failed ``status: "failed"`` and ``chosen_lr: null``.
    """
    methods = {}
    scores = lr_scores(tune_runs)
    for name in dict.fromkeys(r["method"] for r in tune_runs):
        mine = [r for r in tune_runs if r["method"] == name]
        if all(r["status"] == "skipped" for r in mine):
            methods[name] = {"status": "skipped", "chosen_lr": None, "reason": mine[0].get("reason"),
                             "scores": scores[name]}
            continue
        lr, why = choose_lr(scores[name])
        methods[name] = {"status": "ok" if lr is not None else "failed", "chosen_lr": lr, "reason": why,
                         "scores": scores[name],
                         "tuning_tokens": sum(float(r.get("tokens") or 0.0) for r in mine)}
    return {"grid": [float(x) for x in grid], "tune_seeds": list(tune_seeds), "selection_rule": LR_SELECTION_RULE,
            "split": "validation (train split, disjoint from the training prompts; the test split is not used)",
            "context": context, "methods": methods}


def merge_lr_choice(existing: dict | None, new: dict) -> dict:
    """``existing`` with the methods of ``new`` added: an existing chosen learning rate is never replaced; an existing
    entry without one (its tuning failed or was skipped) is replaced by a new entry for the method."""
    if not existing:
        return new
    merged = dict(existing)
    kept = {m: c for m, c in existing.get("methods", {}).items() if c.get("chosen_lr") is not None}
    merged["methods"] = {**existing.get("methods", {}), **new.get("methods", {}), **kept}
    if [float(x) for x in new.get("grid", [])] != [float(x) for x in existing.get("grid", [])]:
        merged.setdefault("notes", []).append(
            f"methods {sorted(set(new.get('methods', {})) - set(existing.get('methods', {})))} were tuned over "
            f"{new.get('grid')}, the others over {existing.get('grid')}")
    return merged


def tuning_context(s: dict) -> dict:
    """The settings an lr choice depends on (:data:`TUNING_CONTEXT_KEYS`)."""
    return {k: s.get(k) for k in TUNING_CONTEXT_KEYS}


def check_lr_choice_context(doc: dict, s: dict, path: str) -> None:
    """``SystemExit`` when ``doc`` (a read ``lr_choice.json``) was tuned under other settings than ``s``."""
    old = doc.get("context") or {}
    now = json.loads(json.dumps(tuning_context(s), default=str))
    diff = [f"{k}: file {old.get(k)!r}, now {now[k]!r}" for k in now if k in old and old[k] != now[k]]
    if diff:
        raise SystemExit(f"{path} was tuned under other settings ({'; '.join(diff)}); delete it to re-tune (finished "
                         "tuning runs with the current settings are reused) or use another --output_dir")


def tune_learning_rates(ctx: Context, setup_cache: dict) -> tuple[dict, list[dict]]:
    """Per-method learning-rate tuning on the validation split; returns ``(lr_choice doc, tuning run records)``.

    ``lr_choice.json`` in ``--output_dir``, when present, is read instead of re-tuning: its methods keep their
    recorded choice (its settings must match, see :func:`check_lr_choice_context`); only methods it lacks, or whose
    tuning gave no learning rate (failed or skipped), are tuned and added. Tuning runs live in
    ``runs/tune/<method>/lr<lr>/seed<k>/`` and are reused like main runs.
    """
    s = ctx.s
    path = os.path.join(s["output_dir"], LR_CHOICE_FILE)
    existing = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            existing = json.load(f)
        check_lr_choice_context(existing, s, path)
        print(f"reading learning-rate choices from {path}", flush=True)
    # methods with a recorded choice are not tuned again; failed or skipped ones are retried (finished runs reused)
    have = {m for m, c in (existing or {}).get("methods", {}).items() if c.get("chosen_lr") is not None}
    tune_runs: list[dict] = []
    for name in s["methods"]:
        spec = METHODS[name]
        base = os.path.join(s["output_dir"], "runs", "tune", name)
        if name in have:  # chosen earlier: report the tuning runs found on disk, train nothing
            tune_runs.extend(_read_results(base, s["output_dir"]))
            continue
        mine: list[dict] = []
        queue, extensions = list(s["tune_lr"]), 0
        while queue:
            lr = queue.pop(0)
            recs = [run_or_reuse(ctx, spec, seed, os.path.join(base, f"lr{lr_key(lr)}", f"seed{seed}"), setup_cache,
                                 lr, split="validation") for seed in s["tune_seeds"][:1]]
            if recs[0]["status"] == "skipped":  # the same reason holds for every learning rate and seed
                mine.extend(recs)
                break
            recs += [run_or_reuse(ctx, spec, seed, os.path.join(base, f"lr{lr_key(lr)}", f"seed{seed}"),
                                  setup_cache, lr, split="validation") for seed in s["tune_seeds"][1:]]
            mine.extend(recs)
            # (an interim report extends only a grid whose runs all exist, as a training invocation would)
            if not queue and extensions < s.get("tune_extend", 0) and all(r["status"] != "pending" for r in mine):
                nxt = edge_extension(lr_scores(mine).get(name, {}))
                if nxt is not None:
                    print(f"[lr] {name}: best learning rate at the edge of those tried; trying {nxt:g}", flush=True)
                    queue.append(nxt)
                    extensions += 1
        tune_runs.extend(mine)
    todo = [m for m in s["methods"] if m not in have]
    new = build_lr_choice([r for r in tune_runs if r["method"] in todo], s["tune_lr"], s["tune_seeds"],
                          json.loads(json.dumps(tuning_context(s), default=str)))
    if s.get("report_only"):  # an interim report: a method is chosen only once all its tuning runs exist
        for name, c in new["methods"].items():
            waiting = [r for r in tune_runs if r["method"] == name and r["status"] == "pending"]
            if waiting:
                c.update(status="pending", chosen_lr=None,
                         reason=f"{len(waiting)} tuning run(s) not finished yet (--report_only)")
        doc = merge_lr_choice(existing, new)
        for name in s["methods"]:
            c = doc["methods"].get(name, {})
            print(f"[lr] {name}: {c.get('chosen_lr')} ({c.get('reason')})", flush=True)
        return doc, tune_runs
    if todo and os.path.exists(path):
        # re-read just before writing: another invocation on this folder (a --jobs worker) may have added its
        # methods while this one tuned, and a merge with the copy read at the start would drop them
        with open(path, encoding="utf-8") as f:
            latest = json.load(f)
        check_lr_choice_context(latest, s, path)
        existing = merge_lr_choice(latest, existing) if existing else latest
    doc = merge_lr_choice(existing, new)
    if todo or existing is None:
        _write_json(path, doc)
    for name in s["methods"]:
        c = doc["methods"].get(name, {})
        print(f"[lr] {name}: {c.get('chosen_lr')} ({c.get('reason')})", flush=True)
    return doc, tune_runs


def _read_results(base: str, out_dir: str | None = None) -> list[dict]:
    """Every result.json under ``base``; with ``out_dir``, inline traces become references (see
    :func:`_trace_by_reference`)."""
    out = []
    for root, _, files in sorted(os.walk(base)):
        if "result.json" in files:
            path = os.path.join(root, "result.json")
            with open(path, encoding="utf-8") as f:
                rec = json.load(f)
            out.append(_trace_by_reference(rec, path, out_dir) if out_dir is not None else rec)
    return out


# ------------------------------------------------------------------------------------------------ summaries
def tokens_to_threshold(curve: Sequence[dict], threshold: float) -> float | None:
    """Actual tokens at the first checkpoint whose greedy accuracy is >= ``threshold`` (``None``: never).

    Coarse by construction (checkpoint resolution); the start point (0 tokens) counts when it already qualifies.
    """
    for p in sorted(curve, key=lambda q: q["tokens"]):
        if point_accuracy(p) >= threshold:
            return float(p["tokens"])
    return None


def _family(run: dict) -> str | None:
    return METHODS[run["method"]].family if run["method"] in METHODS else run.get("family")


def best_grpo_method(runs: Sequence[dict]) -> str | None:
    """The best GRPO setting: the ``grpo``-family method (``grpo_g4/g8/g16``) with the highest mean final greedy
    accuracy over its finished seeds; ties go to the larger group size. ``None`` when none finished.

    Selected on the evaluation set itself, which favours the reference: a conservative bar for the challengers.
    """
    acc: dict[str, list[float]] = {}
    for r in runs:
        if r["status"] == "ok" and _family(r) == "grpo":
            acc.setdefault(r["method"], []).append(final_accuracy(r))
    if not acc:
        return None
    size = {m: METHODS[m].group_size if m in METHODS else 0 for m in acc}
    return max(acc, key=lambda m: (sum(acc[m]) / len(acc[m]), size[m]))


def choose_threshold(runs: Sequence[dict], explicit: float | None, start_accuracy: float,
                     reference: str = GRPO_REFERENCE) -> tuple[float, str]:
    """Accuracy threshold of the "tokens to threshold" column, fixed across methods.

    ``explicit`` (``--threshold``) if given; else the mean final accuracy of ``reference`` at the budget:
    ``grpo_g16`` (protocol v1: the bar of the V0.5 trainer's goal, "reaches the accuracy plain GRPO reaches at
    G = 16 with fewer generated tokens") or ``"best_grpo"`` (protocol v2: :func:`best_grpo_method`); else, when the
    reference did not run, the start accuracy + 0.10.
    """
    if explicit is not None:
        return float(explicit), "--threshold"
    name = best_grpo_method(runs) if reference == "best_grpo" else reference
    ref = [final_accuracy(r) for r in runs if r["method"] == name and r["status"] == "ok"]
    if ref:
        what = f"the best GRPO setting, {name}" if reference == "best_grpo" else name
        return sum(ref) / len(ref), f"mean final accuracy of {what} at the budget"
    return min(1.0, start_accuracy + 0.10), f"start accuracy + 0.10 ({reference} not run)"


def _mean_sd(xs: Sequence[float]) -> tuple[float | None, float | None]:
    xs = [float(x) for x in xs if x is not None]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def amortized_total(online_tokens: float, table_tokens: float, n_runs: int) -> float:
    """Tokens per run when a one-off table cost is shared by ``n_runs`` runs: ``online + table / n_runs``."""
    if n_runs < 1:
        raise ValueError(f"n_runs must be >= 1, got {n_runs}")
    return float(online_tokens) + float(table_tokens) / n_runs


def cost_columns(online_tokens: float | None, table_tokens: float | None,
                 amortize_over: Sequence[int] = AMORTIZE_OVER) -> dict:
    """Cost columns of one method: ``online_tokens`` (training generation, ``ext/generated_tokens_total``),
    ``table_tokens`` (generated once to build a value table; 0 without one), ``total_tokens`` (online + the whole
    table: the cost of a single run) and ``total_tokens_table_over_<n>`` for each ``n`` in ``amortize_over``."""
    if online_tokens is None:
        return {"online_tokens": None, "table_tokens": table_tokens, "total_tokens": None,
                **{f"total_tokens_table_over_{n}": None for n in amortize_over}}
    t = float(table_tokens or 0.0)
    return {"online_tokens": float(online_tokens), "table_tokens": t,
            "total_tokens": amortized_total(online_tokens, t, 1),
            **{f"total_tokens_table_over_{n}": amortized_total(online_tokens, t, n) for n in amortize_over}}


def aggregate_by_level(runs: Sequence[dict]) -> dict[str, dict] | None:
    """Per-difficulty final accuracy over seeds: ``{level: {"mean", "sd", "per_seed", "n_questions"}}`` from the
    runs' ``final_accuracy_by_level``; ``None`` when no run has one."""
    per: dict[str, list[float]] = {}
    n_q: dict[str, int] = {}
    for r in runs:
        for lv, cell in (r.get("final_accuracy_by_level") or {}).items():
            per.setdefault(lv, []).append(float(cell["accuracy"]))
            n_q[lv] = int(cell["n"])
    if not per:
        return None
    out = {}
    for lv, xs in sorted(per.items(), key=_level_order):
        m, sd = _mean_sd(xs)
        out[lv] = {"mean": m, "sd": sd, "per_seed": xs, "n_questions": n_q[lv]}
    return out


def summarize(runs: Sequence[dict], threshold: float, start_accuracy: float,
              tune_runs: Sequence[dict] = ()) -> list[dict]:
    """One table row per method (in run order): accuracy, tokens to threshold, costs, wall time, difficulty."""
    rows = []
    for name in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == name]
        ok = [r for r in mine if r["status"] == "ok"]
        row = {"method": name, "label": mine[0]["label"], "status": "ok" if ok else mine[0]["status"],
               "n_seeds": len(ok), "reason": None if ok else mine[0].get("reason"),
               "learning_rate": mine[0].get("learning_rate"), "lr_source": mine[0].get("lr_source"),
               "tuning_tokens": sum(float(r.get("tokens") or 0.0) for r in tune_runs if r["method"] == name)}
        if ok:
            curves = [[{"tokens": 0.0, "accuracy": start_accuracy}, *r["curve"]] for r in ok]
            ttt = [tokens_to_threshold(c, threshold) for c in curves]
            reached = [t for t in ttt if t is not None]
            acc_m, acc_sd = _mean_sd([final_accuracy(r) for r in ok])
            tokens_m = _mean_sd([r["tokens"] for r in ok])[0]
            table = next(((r.get("setup_info") or {}).get("table_tokens") for r in ok
                          if (r.get("setup_info") or {}).get("table_tokens") is not None), None)
            row.update(
                final_accuracy_mean=acc_m, final_accuracy_sd=acc_sd,
                final_accuracy_per_seed=[final_accuracy(r) for r in ok],
                final_sampled_accuracy_mean=_mean_sd([r.get("final_sampled_accuracy") for r in ok])[0],
                tokens_mean=tokens_m,
                tokens_to_threshold_mean=_mean_sd(reached)[0], tokens_to_threshold_reached=len(reached),
                train_wall_s_mean=_mean_sd([r["train_wall_s"] for r in ok])[0],
                train_wall_s_sd=_mean_sd([r["train_wall_s"] for r in ok])[1],
                table_build_wall_s=next(((r.get("setup_info") or {}).get("table_build_wall_s") for r in ok
                                         if r.get("setup_info")), None),
                steps_mean=_mean_sd([r["steps"] for r in ok])[0],
                rollouts_per_step_mean=_mean_sd([r.get("rollouts_per_step") for r in ok])[0],
                failed_seeds=[r["seed"] for r in mine if r["status"] != "ok"],
                accuracy_by_level=aggregate_by_level(ok),
                **cost_columns(tokens_m, table),
            )
        rows.append(row)
    return rows


def _fmt(x, spec=".3f", none="--"):
    return none if x is None else format(x, spec)


def table_markdown(rows: Sequence[dict], threshold: float, s: dict, rule: str = "") -> str:
    over = [n for n in AMORTIZE_OVER if n != 1]
    head = (f"Token budget {s['token_budget']:.0f} generated training tokens per run; {s['n_eval']} held-out "
            f"questions ({s.get('eval_mode', 'greedy')}); threshold {threshold:.3f}{f' ({rule})' if rule else ''}. Online tokens: "
            f"`{TOKEN_METRIC}`; table: tokens generated to build a value table (BASIS), once per warm model; total: "
            f"online + table (one run), and with the table shared by {', '.join(map(str, over))} runs.\n\n"
            "| method | lr | seeds | final acc (mean +- sd) | per seed | tokens to threshold (seeds reaching) "
            "| online tokens | table tokens | total tokens | "
            + " | ".join(f"total, table / {n}" for n in over)
            + " | train wall s | steps | trained rollouts/step |\n"
            + "|---" * (12 + len(over)) + "|\n")
    lines = []
    for r in rows:
        lr = _fmt(r.get("learning_rate"), "g")
        if r["status"] != "ok":
            lines.append(f"| {r['label']} | {lr} | 0 | {r['status']}: {r['reason']} |" + " |" * (8 + len(over)))
            continue
        per = " ".join(f"{a:.3f}" for a in r["final_accuracy_per_seed"])
        lines.append(
            f"| {r['label']} | {lr} | {r['n_seeds']} | {_fmt(r['final_accuracy_mean'])} +- "
            f"{_fmt(r['final_accuracy_sd'])} | {per} | {_fmt(r['tokens_to_threshold_mean'], '.0f')} "
            f"({r['tokens_to_threshold_reached']}/{r['n_seeds']}) | {_fmt(r.get('online_tokens'), '.0f')} "
            f"| {_fmt(r.get('table_tokens'), '.0f')} | {_fmt(r.get('total_tokens'), '.0f')} | "
            + " | ".join(_fmt(r.get(f"total_tokens_table_over_{n}"), ".0f") for n in over)
            + f" | {_fmt(r['train_wall_s_mean'], '.1f')} | {_fmt(r['steps_mean'], '.0f')} "
              f"| {_fmt(r['rollouts_per_step_mean'], '.1f')} |")
    return head + "\n".join(lines) + "\n"


def difficulty_markdown(rows: Sequence[dict], start_by_level: dict | None) -> str:
    """Final accuracy per ``n_digits`` (mean over seeds) per method; empty without a difficulty column."""
    levels = list(start_by_level or {})
    for r in rows:
        for lv in r.get("accuracy_by_level") or {}:
            if lv not in levels:
                levels.append(lv)
    if not levels:
        return ""
    levels = [lv for lv, _ in sorted(((lv, 0) for lv in levels), key=_level_order)]
    out = [f"Final greedy accuracy by `{DIFFICULTY_COLUMN}` (mean over seeds; questions per level in the header).\n",
           "| method | " + " | ".join(f"{lv} ({(start_by_level or {}).get(lv, {}).get('n', '?')})" for lv in levels)
           + " |", "|---" * (1 + len(levels)) + "|"]
    if start_by_level:
        out.append("| start checkpoint | " + " | ".join(_fmt(start_by_level.get(lv, {}).get("accuracy"))
                                                       for lv in levels) + " |")
    for r in rows:
        by = r.get("accuracy_by_level") or {}
        if r["status"] == "ok":
            out.append(f"| {r['label']} | " + " | ".join(_fmt(by.get(lv, {}).get("mean")) for lv in levels) + " |")
    return "\n".join(out) + "\n"


#: Reference methods of the verdicts: key in verdicts.json -> method name (``"best_grpo"``: :func:`best_grpo_method`).
VERDICT_REFERENCES = {"vs_best_grpo": "best_grpo", "vs_reinforce_pp": "reinforce_pp",
                      "vs_dapo_dynamic": "dapo_dynamic", "vs_grpo_g16": GRPO_REFERENCE}


def verdict_references(runs: Sequence[dict]) -> dict[str, str | None]:
    """Reference method of every verdict column (``None`` where the reference did not finish a run)."""
    done = {r["method"] for r in runs if r["status"] == "ok"}
    out = {}
    for key, name in VERDICT_REFERENCES.items():
        out[key] = best_grpo_method(runs) if name == "best_grpo" else (name if name in done else None)
    return out


def compute_verdicts(runs: Sequence[dict], rows: Sequence[dict], s: dict) -> dict:
    """Two-part-rule reports of every method against each reference of :func:`verdict_references`: the best GRPO
    setting (highest mean final (primary) accuracy among ``grpo_g4/g8/g16``), REINFORCE++, DAPO dynamic sampling, and
    ``grpo_g16`` (the papers' usual baseline). A pair already compared under another reference is not repeated."""
    from trl_ext.stats import compare_outcome_files

    out_dir = s["output_dir"]
    files = {}
    for r in runs:
        if r["status"] == "ok":
            files.setdefault(r["method"], []).append(os.path.join(out_dir, r["outcomes"]))
    refs = verdict_references(runs)
    result = {"references": refs, "comparisons": [],
              "best_grpo_rule": "grpo_* method with the highest mean final primary accuracy (greedy, or sampled "
                                "under eval_mode sampled)"}
    if refs["vs_best_grpo"] is not None and refs["vs_best_grpo"] == refs["vs_grpo_g16"]:
        result["note"] = (f"the best GRPO setting is {refs['vs_best_grpo']} itself: the vs_grpo_g16 comparisons equal "
                          "vs_best_grpo")
    done = set()
    for ref_name, ref in refs.items():
        for method in files:
            if ref is None or method == ref or (method, ref) in done:
                continue
            done.add((method, ref))
            entry = {"reference": ref_name, "a": method, "b": ref}
            try:
                rep = compare_outcome_files(files[method], files[ref], n_sim=s["n_sim"], n_boot=s["n_boot"])
                v = rep["verdict"]
                entry.update(status=v["status"], winner=v["winner"], reason=v["reason"], margin=rep["margin"],
                             margin_ci=rep["margin_ci"], detection_floor=rep["detection_floor"],
                             paired_detection_floor=rep["paired_detection_floor"],
                             margin_to_floor_ratio=rep["margin_to_floor_ratio"], margin_zone=rep["margin_zone"],
                             smallest_detectable_gap=rep["smallest_detectable_gap"], n_seeds=rep["n_seeds"],
                             n_questions=rep["n_questions"], votes_a=v["votes_a"], votes_b=v["votes_b"],
                             pooled_p_value=v["pooled_p_value"], length_note=rep.get("length_note"),
                             length_residualized=(rep.get("length_residualized") or {}).get("difference"),
                             report=_drop_votes(rep, out_dir))
            except (ValueError, RuntimeError) as e:
                entry.update(status="error", reason=f"{type(e).__name__}: {e}")
            result["comparisons"].append(entry)
    return result


def _drop_votes(rep: dict, root: str | None = None) -> dict:
    """The compare report without per-question votes, file paths relative to ``root``."""
    rep = dict(rep)
    rep["verdict"] = {k: v for k, v in rep["verdict"].items() if k != "question_votes"}
    if root is not None:
        rep["pairs"] = [{**p, "a": os.path.relpath(p["a"], root), "b": os.path.relpath(p["b"], root)}
                        for p in rep["pairs"]]
    return rep


def verdicts_markdown(v: dict) -> str:
    refs = ", ".join(f"{k} = `{name}`" for k, name in v["references"].items())
    lines = [f"References: {refs} (best GRPO: {v['best_grpo_rule']})."
             + (f" Note: {v['note']}." if v.get("note") else "") + "\n",
             "| reference | a (challenger) | b (reference) | verdict | margin a-b (pts) | 95% CI (pts) "
             "| detection floor (pts) | margin/floor | paired floor (pts) | smallest gap caught 80% (pts) "
             "| votes a/b, p | length-residualized (pts) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def pts(x):
        return "--" if x is None else f"{100 * x:+.1f}" if x < 0 or x > 0 else "0.0"

    for c in v["comparisons"]:
        if c["status"] == "error":
            lines.append(f"| {c['reference']} | {c['a']} | {c['b']} | error: {c['reason']} | | | | | | | | |")
            continue
        ci = c["margin_ci"]
        gap = c["smallest_detectable_gap"]
        lines.append(
            f"| {c['reference']} | {c['a']} | {c['b']} | {c['status']} | {pts(c['margin'])} | {pts(ci['low'])} .. "
            f"{pts(ci['high'])} | {100 * c['detection_floor']:.1f} | {_fmt(c['margin_to_floor_ratio'], '.2f')} | "
            f"{100 * c['paired_detection_floor']:.1f} | {'--' if gap is None else f'{100 * gap:.1f}'} | "
            f"{c['votes_a']}/{c['votes_b']}, {c['pooled_p_value']:.3g} | {pts(c.get('length_residualized'))} |")
    lines.append("\nLength-residualized: the margin after regressing out completion-length differences (section 5 "
                 "step 4); the primary reading only where the length slope is positive (see verdicts.json "
                 "`length_note`).")
    return "\n".join(lines) + "\n"


def make_plots(runs: Sequence[dict], start_accuracy: float, out_dir: str) -> list[str]:
    """Mean held-out greedy accuracy vs tokens and vs training wall time; shaded band = min..max over seeds."""
    from trl_ext._plots import pyplot

    plt = pyplot("the plots of compare_trainers.py (--no_plots skips them)")
    paths = []
    for xkey, fname, xlabel in (("tokens", "accuracy_vs_tokens.png", "generated training tokens"),
                                ("train_wall_s", "accuracy_vs_walltime.png", "training wall time (s, eval excluded)")):
        fig, ax = plt.subplots(figsize=(8.5, 5.2))
        for name in dict.fromkeys(r["method"] for r in runs):
            ok = [r for r in runs if r["method"] == name and r["status"] == "ok"]
            if not ok:
                continue
            n = min(len(r["curve"]) for r in ok)
            xs = [0.0] + [sum(r["curve"][i][xkey] for r in ok) / len(ok) for i in range(n)]
            accs = [[start_accuracy] + [point_accuracy(r["curve"][i]) for i in range(n)] for r in ok]
            mean = [sum(a[i] for a in accs) / len(accs) for i in range(n + 1)]
            lo = [min(a[i] for a in accs) for i in range(n + 1)]
            hi = [max(a[i] for a in accs) for i in range(n + 1)]
            # one colour per method (tab20's dark hues first, then the light ones: more than the default cycle's
            # 10 colours), line style by family
            i = (list(METHODS).index(name) if name in METHODS else 0) % 20
            color = plt.get_cmap("tab20").colors[(2 * i) % 20 + (2 * i) // 20]
            style = {"grpo": "-", "baseline": "--"}.get(ok[0].get("family"), "-.")
            ax.plot(xs, mean, marker="o", ms=3, color=color, linestyle=style,
                    label=f"{ok[0]['label']} ({len(ok)} seeds)")
            ax.fill_between(xs, lo, hi, color=color, alpha=0.10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out greedy accuracy (band: min..max over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------------------------------- main
#: Relative cost of one run of each method (train wall time of the scratchpad v1 runs at lr 1e-4, GRPO G=8 = 1;
#: BASIS includes a share of its value table), used only to balance ``--jobs`` workers.
METHOD_COST: dict[str, float] = {"pair": 2.0, "rloo": 1.25, "basis": 1.5, "grpo_g4": 1.0, "grpo_g8": 1.0,
                                 "grpo_g16": 0.95, "dr_grpo": 0.95, "signal_only": 1.0, "tiebreak": 1.0,
                                 "v05_osla": 0.8, "v05_fixed4": 0.8, "dapo_dynamic": 0.7, "reinforce_pp": 0.65}


def split_methods(methods: Sequence[str], jobs: int) -> list[list[str]]:
    """Partition ``methods`` into at most ``jobs`` non-empty groups of balanced :data:`METHOD_COST` (longest
    processing time first: each method, costliest first, goes to the group with the least cost so far); each group
    keeps the order of ``methods``."""
    groups: list[list[str]] = [[] for _ in range(min(jobs, len(methods)))]
    load = [0.0] * len(groups)
    for m in sorted(methods, key=lambda m: -METHOD_COST.get(m, 1.0)):
        i = load.index(min(load))
        groups[i].append(m)
        load[i] += METHOD_COST.get(m, 1.0)
    order = {m: k for k, m in enumerate(methods)}
    return [sorted(g, key=order.__getitem__) for g in groups if g]


def run_workers(argv: Sequence[str], methods: Sequence[str], jobs: int, out: str) -> None:
    """``--jobs``: run this script once per method group (:func:`split_methods`) in parallel subprocesses, each
    with ``--jobs 1 --no_plots`` and its ``--methods``, logging to ``<out>/logs/worker<i>.log``. Runs land in the
    shared ``runs/`` tree (disjoint per method) and are reused by the aggregating pass that follows; a failed worker
    stops the invocation with its log named (its finished runs stay reusable)."""
    import subprocess

    groups = split_methods(methods, jobs)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    procs = []
    for i, group in enumerate(groups):
        log = os.path.join(out, "logs", f"worker{i}.log")
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--methods", *group, "--jobs", "1", "--no_plots"]
        print(f"[jobs] worker {i}: {' '.join(group)} (log {log})", flush=True)
        with open(log, "w", encoding="utf-8") as f:
            procs.append((i, log, subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)))
    failed = [(i, log, p.wait()) for i, log, p in procs]
    failed = [(i, log, rc) for i, log, rc in failed if rc != 0]
    if failed:
        raise SystemExit("; ".join(f"worker {i} exited with {rc} (see {log})" for i, log, rc in failed)
                         + ": finished runs are reused when the command is run again")


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
            out[name] = (float(c["chosen_lr"]), f"tuned on validation ({LR_CHOICE_FILE}): {c.get('reason')}")
    return out


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
    if args.jobs > 1 and len(s["methods"]) > 1 and not s["report_only"]:
        # the start checkpoint is pinned above, so every worker trains from the same weights
        run_workers(argv, s["methods"], args.jobs, out)

    setup_cache: dict = {}
    lr_choice, tune_runs = (None, [])
    if s["tune_lr"]:
        lr_choice, tune_runs = tune_learning_rates(ctx, setup_cache)
    lrs = method_learning_rates(s, lr_choice)

    runs = []
    for name in s["methods"]:
        spec = METHODS[name]
        lr, source = lrs[name]
        if lr is None:  # tuning gave no learning rate: recorded, not trained
            runs.extend(_skip_record(spec, seed, f"no learning rate: {source}", lr_source=source)
                        for seed in s["seeds"])
            continue
        for i, seed in enumerate(s["seeds"]):
            rec = run_or_reuse(ctx, spec, seed, os.path.join(out, "runs", name, f"seed{seed}"), setup_cache, lr)
            rec["lr_source"] = source
            runs.append(rec)
            if rec["status"] == "skipped":  # the same reason holds for every seed
                runs.extend({**rec, "seed": other} for other in s["seeds"][i + 1:])
                break

    threshold, threshold_rule = choose_threshold(runs, s["threshold"], start.accuracy, s["threshold_reference"])
    rows = summarize(runs, threshold, start.accuracy, tune_runs)
    verdicts = compute_verdicts(runs, rows, s)
    plots = [] if args.no_plots else make_plots(runs, start.accuracy, out)
    settings = {k: v for k, v in s.items()}
    doc = {"settings": settings, "start_checkpoint": ctx.model_path, "start_accuracy": start.accuracy,
           "start_accuracy_by_level": start_by_level, "difficulty_column": DIFFICULTY_COLUMN,
           "threshold": threshold, "threshold_rule": threshold_rule, "n_eval": len(ctx.eval_ds),
           "n_train": len(ctx.train_ds), "n_val": len(ctx.val_ds) if s["tune_lr"] else None,
           "max_completion_length": ctx.max_new, "runs": runs, "tuning_runs": tune_runs,
           "lr_choice": lr_choice, "plots": [os.path.basename(p) for p in plots],
           "total_wall_s": time.time() - t_all, "command": " ".join(sys.argv),
           "sum_run_wall_s": sum(r.get("run_wall_s", 0.0) for r in [*runs, *tune_runs])}
    _write_json(os.path.join(out, "runs.json"), doc)
    _write_json(os.path.join(out, "table.json"), {
        "threshold": threshold, "threshold_rule": threshold_rule, "start_accuracy": start.accuracy,
        "start_accuracy_by_level": start_by_level, "difficulty_column": DIFFICULTY_COLUMN,
        "amortize_over": list(AMORTIZE_OVER), "token_metric": TOKEN_METRIC, "rows": rows})
    md = table_markdown(rows, threshold, s, threshold_rule)
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

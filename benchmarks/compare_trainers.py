"""Compute-matched comparison of every trl_ext trainer against plain GRPO.

Every method trains from the same warm checkpoint, on the same training prompts, with the same learning rate,
completion length and per-step rollout count, and is stopped when its **cumulative generated training tokens**
reach the same budget (the primary axis: accuracy per generated token). Held-out greedy accuracy is measured on the
same evaluation questions at fixed token checkpoints; the final checkpoint's per-question outcomes are written in
the testbed JSONL format and compared with the project's own rule ("Measurement Discipline for RLVR" section 5:
two-part rule across seeds, detection floor ``2.8016 sqrt(2p(1-p)/N)``, paired floor, smallest detectable gap) via
:func:`trl_ext.stats.compare_outcome_files` -- the engine of ``trl-ext compare``.

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
    dapo_dynamic               GRPO G = 4 (the best GRPO group size of the CPU run) with DAPO dynamic sampling
                               (trl_ext.GRPOTrainer, dynamic_sampling=True, default 3 refill rounds): zero-variance
                               groups are regenerated from fresh prompts; their tokens count against the budget
    basis                      BASISTrainer, G = 1 (BASIS paper); its value table is built
                               once per warm model from 32 reference samples per training prompt
    v05_osla                   V05GRPOTrainer, v05_k_init = 4 with Sequential OSLA (V0.5 paper, arXiv:2603.10848)
    v05_fixed4                 V05GRPOTrainer, fixed k = 4 (prior fusion, no OSLA rounds)
    pair                       PAIRTrainer, G = 16 prefix candidates (pair_prefix_inclusion_reweighting.txt)

A method is a :class:`MethodSpec`: a group size plus config fields on top of the shared ones; the config and trainer
classes default to ``trl_ext.ExtGRPOConfig`` / ``trl_ext.GRPOTrainer``, so the baselines above differ from plain
GRPO by configuration only (``advantage_estimator``, ``loss_type``, ``dynamic_sampling``); only BASIS, V0.5 and
PAIR name their own classes.

Every method draws ``rollouts_per_step`` rollouts per optimizer step where it decides the count up front
(G x prompts = 64 on the CPU scale: 4 x 16, 8 x 8, 16 x 4, 64 x 1); V0.5 uses 64 / v05_k_init prompts and decides
the rest itself, PAIR uses 64 / 16 prompts' worth of candidates and completes a subset, DAPO dynamic sampling trains
on at most 16 kept groups of 4 and generates up to 3 further rounds to fill them. Only the token budget is
matched, as the issue asks; step counts differ by design.

A method whose trainer cannot be imported or configured is **skipped with its reason printed and recorded** in
``runs.json``; a run that crashes is recorded as ``failed`` with its traceback; neither is dropped silently.

Generated tokens are read from the one counter every ``trl_ext.GRPOTrainer`` (and so every trainer here) logs:
``ext/generated_tokens_total`` (:data:`TOKEN_METRIC`), cumulative, counting every generated token -- discarded
V0.5 rounds, PAIR probe prefixes and DAPO's filtered groups included. A run that logs training steps without it
fails with an error instead of ignoring the budget. The run stops after the optimizer step whose generation crosses
the budget, so a run overshoots by less than one generation batch (recorded as ``tokens``).

Outputs in ``--output_dir``::

    runs.json                       every run: status, config, curve, final accuracy, tokens, wall time, paths
    table.md / table.json           final accuracy, tokens to reach the threshold, wall time, per method
    verdicts.json / verdicts.md     two-part-rule reports: each method vs grpo_g16 and vs the best GRPO group size
    accuracy_vs_tokens.png          held-out greedy accuracy against generated training tokens (mean +- range)
    accuracy_vs_walltime.png        the same against training wall time (evaluation time excluded)
    runs/<method>/seed<k>/outcomes.jsonl    per-question outcomes at the final (budget) checkpoint

Usage::

    python benchmarks/compare_trainers.py --output_dir benchmarks/results/compare/full       # CPU default
    python benchmarks/compare_trainers.py --output_dir /tmp/smoke --smoke --model_name_or_path /tmp/tiny
    python benchmarks/compare_trainers.py --scale gpu --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
        --dataset_fn mypkg.data:load --reward_fn mypkg.rewards:correct --use_vllm --vllm_mode colocate

Finished runs are reused when ``--output_dir`` already holds a ``result.json`` with the same run settings
(``--no_resume`` re-runs them), so an interrupted full run can be continued.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import import_module

from trl_ext._argtypes import nonneg_int as _nonneg_int
from trl_ext._argtypes import positive_float as _pos_float
from trl_ext._argtypes import positive_int as _pos_int
from trl_ext._io import write_json as _write_json

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

TOKEN_METRIC = "ext/generated_tokens_total"
GRPO_REFERENCE = "grpo_g16"


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
        ``"grpo"``: plain GRPO at one group size, the candidates for the "best GRPO group size" reference;
        ``"baseline"``: other published critic-free recipes; ``"trl_ext"``: the package's own trainers.
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
        Name of a function ``setup(ctx) -> dict`` in this module returning extra config kwargs (e.g. a value table).
    """

    name: str
    label: str
    family: str
    group_size: int
    config_kwargs: dict = field(default_factory=dict)
    config: str = BASE_CONFIG
    trainer: str = BASE_TRAINER
    setup: str | None = None


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
}

#: Scale presets. ``cpu``: the offline testbed on 2 cores (about an hour for all methods x 3 seeds);
#: ``gpu``: a larger budget and GPU-friendly trainer defaults; everything else is the same code path.
SCALES: dict[str, dict] = {
    "cpu": dict(task="addition", rollouts_per_step=64, token_budget=40_000, eval_every_tokens=5_000, n_eval=2000,
                n_train=4000, learning_rate=1e-4, eval_samples=0, value_table_samples=32, use_cpu=True, bf16=False,
                eval_batch_size=250),
    "gpu": dict(task="addition", rollouts_per_step=256, token_budget=400_000, eval_every_tokens=50_000, n_eval=2000,
                n_train=8000, learning_rate=1e-4, eval_samples=0, value_table_samples=32, use_cpu=False, bf16=True,
                eval_batch_size=250),
}
SMOKE = dict(methods=["grpo_g16", "grpo_g4"], seeds=[0], token_budget=500, eval_every_tokens=250, n_eval=40,
             n_train=64, rollouts_per_step=32, n_sim=50, n_boot=200)


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
    p.add_argument("--methods", nargs="+", default=None, metavar="M",
                   help=f"methods to run (default all): {' '.join(METHODS)}")
    p.add_argument("--seeds", nargs="+", type=_nonneg_int, default=None, help="training seeds (default 0 1 2)")
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu", help="size preset (default cpu)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny end-to-end check: 2 methods, 1 seed, a few hundred tokens (overrides the preset)")
    p.add_argument("--token_budget", type=_pos_float, default=None, help="generated training tokens per run")
    p.add_argument("--eval_every_tokens", type=_pos_float, default=None, help="evaluation checkpoint spacing")
    p.add_argument("--rollouts_per_step", type=_pos_int, default=None,
                   help="rollouts per optimizer step for fixed-G methods (must be divisible by 16)")
    p.add_argument("--learning_rate", type=_pos_float, default=None, help="same for every method")
    p.add_argument("--n_eval", type=_pos_int, default=None, help="held-out evaluation questions")
    p.add_argument("--n_train", type=_pos_int, default=None, help="training prompts (the same pool for all)")
    p.add_argument("--eval_samples", type=_nonneg_int, default=None,
                   help="also measure sampled accuracy (T=1) with this many samples per question (0 = off)")
    p.add_argument("--threshold", type=float, default=None,
                   help="accuracy for 'tokens to threshold' (default: grpo_g16's mean final accuracy; without "
                        "grpo_g16 the start accuracy + 0.10)")
    p.add_argument("--task", default=None, help="testbed task (default addition)")
    p.add_argument("--model_name_or_path", default=None,
                   help="start checkpoint (default: the cached warm testbed model for --task, seed 0)")
    p.add_argument("--warm_seed", type=_nonneg_int, default=0, help="warm-model seed (one checkpoint for all runs)")
    p.add_argument("--dataset_fn", default=None,
                   help="module:function returning (train_dataset, eval_dataset) with prompt/answer/question_id "
                        "columns, replacing the testbed task")
    p.add_argument("--reward_fn", default=None,
                   help="module:function, a TRL reward function (1 = correct); required with --dataset_fn")
    p.add_argument("--max_completion_length", type=_pos_int, default=None,
                   help="default: the task's longest answer + 2")
    p.add_argument("--use_vllm", action="store_true", help="passed to the trainer config")
    p.add_argument("--vllm_mode", default=None, help="passed to the trainer config (colocate / server)")
    p.add_argument("--config_overrides", default=None,
                   help="JSON object of extra config fields applied to every method (same for all)")
    p.add_argument("--num_threads", type=_pos_int, default=1, help="torch threads (default 1)")
    p.add_argument("--n_sim", type=_pos_int, default=None, help="Monte Carlo reruns for the smallest gap")
    p.add_argument("--n_boot", type=_pos_int, default=None, help="paired bootstrap replicates")
    p.add_argument("--cache_dir", default=None,
                   help="where the BASIS value table is cached "
                        "(default $TRL_EXT_CACHE/bench or ~/.cache/trl_ext/bench)")
    p.add_argument("--no_resume", action="store_true", help="re-run runs whose result.json already exists")
    p.add_argument("--no_plots", action="store_true", help="skip the PNG plots")
    return p


def resolve_settings(args: argparse.Namespace) -> dict:
    """Merge preset, ``--smoke`` and explicit arguments into one settings dict; validate it."""
    s = dict(SCALES[args.scale])
    s.update(methods=list(METHODS), seeds=[0, 1, 2], n_sim=400, n_boot=2000)
    if args.smoke:
        s.update(SMOKE)
    for key in ("token_budget", "eval_every_tokens", "rollouts_per_step", "learning_rate", "n_eval", "n_train",
                "eval_samples", "task", "n_sim", "n_boot"):
        if getattr(args, key, None) is not None:
            s[key] = getattr(args, key)
    if args.methods is not None:
        s["methods"] = list(dict.fromkeys(args.methods))
    if args.seeds is not None:
        s["seeds"] = list(dict.fromkeys(args.seeds))
    unknown = [m for m in s["methods"] if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    if s["rollouts_per_step"] % 16:
        raise SystemExit(f"--rollouts_per_step must be divisible by 16 (G = 16, 8, 4 and 1 share it); "
                         f"got {s['rollouts_per_step']}")
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
    if args.use_vllm:
        overrides["use_vllm"] = True
    if args.vllm_mode:
        overrides["vllm_mode"] = args.vllm_mode
    s.update(config_overrides=overrides, scale=args.scale, smoke=bool(args.smoke), threshold=args.threshold,
             model_name_or_path=args.model_name_or_path, warm_seed=args.warm_seed, dataset_fn=args.dataset_fn,
             reward_fn=args.reward_fn, max_completion_length=args.max_completion_length,
             output_dir=os.path.abspath(args.output_dir), resume=not args.no_resume,
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


class Context:
    """Shared, method-independent state: model path, tokenizer, datasets, reward, evaluator."""

    def __init__(self, s: dict):
        from transformers import AutoTokenizer

        self.s = s
        if s["dataset_fn"]:
            self.task = None
            self.train_ds, self.eval_ds = _load_object(s["dataset_fn"])()
            self.reward_funcs = [_load_object(s["reward_fn"])]
            if s["model_name_or_path"] is None:
                raise SystemExit("--model_name_or_path is required with --dataset_fn")
            self.model_path = s["model_name_or_path"]
            self.max_new = s["max_completion_length"] or 256
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
            self.model_path = s["model_name_or_path"] or get_warm_model(self.task, seed=s["warm_seed"],
                                                                        verbose=True)
            self.max_new = s["max_completion_length"] or TASKS[self.task].max_answer_chars() + 2
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.cache_dir = s["cache_dir"]

    def load_model(self):
        import torch
        from transformers import AutoModelForCausalLM

        dtype = torch.bfloat16 if self.s["bf16"] else torch.float32
        return AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)

    def evaluate(self, model, *, greedy: bool = True, num_samples: int = 1, seed: int = 0):
        """Held-out accuracy; returns ``trl_ext.testbed.EvalResult`` (records in the outcome JSONL schema)."""
        from trl_ext.testbed import EvalResult, evaluate_model

        bs = self.s["eval_batch_size"]
        if self.task is not None:
            return evaluate_model(model, self.tokenizer, self.eval_ds, self.task, greedy=greedy,
                                  num_samples=num_samples, max_new_tokens=self.max_new, seed=seed, batch_size=bs)
        return _generic_evaluate(model, self.tokenizer, self.eval_ds, self.reward_funcs[0], greedy, num_samples,
                                 self.max_new, seed, bs, EvalResult)


def _generic_evaluate(model, tok, dataset, reward_fn, greedy, num_samples, max_new, seed, batch_size, result_cls):
    """Evaluation for ``--dataset_fn`` datasets (same record schema as ``trl_ext.testbed.evaluate_model``)."""
    import torch

    rows = [dict(r) for r in dataset]
    if not rows or any(k not in rows[0] for k in ("prompt", "question_id")):
        raise ValueError("the evaluation dataset needs 'prompt' and 'question_id' columns and at least one row")
    was_training = model.training
    model.eval()
    old_side, tok.padding_side = tok.padding_side, "left"
    device = next(model.parameters()).device
    kw = dict(max_new_tokens=max_new, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    kw.update(do_sample=False) if greedy else kw.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    records, total = [], 0
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            for start in range(0, len(rows), batch_size):
                chunk = rows[start:start + batch_size]
                enc = tok([r["prompt"] for r in chunk], return_tensors="pt", padding=True).to(device)
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
                                    "completion_tokens": sum(lens) / len(lens), "prompt": str(row["prompt"]),
                                    "answer": str(row.get("answer", "")), "completions": comps})
                    total += sum(lens)
    finally:
        tok.padding_side = old_side
        model.train(was_training)
    rates = [r["pass_rate"] for r in records]
    return result_cls(accuracy=sum(rates) / len(rates), per_prompt_pass_rate=rates, records=records,
                      generated_tokens=int(total))


# -------------------------------------------------------------------------------------------- method setups
def setup_basis(ctx: Context) -> dict:
    """Build (once, cached in ``--cache_dir``) the BASIS reference value table for the training pool.

    ``value_table_samples`` completions per training prompt are sampled at T = 1 from the *starting* checkpoint
    (the frozen reference policy, BASIS Section 4 "Offline value", Appendix 10) and scored with the training reward,
    by the package's own builder :func:`trl_ext.priors.value_table.build_value_table` (the code behind
    ``trl-ext build-value-table``; resumable, so an interrupted build continues). Returns
    ``{"basis_value_table_path": path}``.
    """
    from trl_ext.priors.value_table import build_value_table

    n = ctx.s["value_table_samples"]
    key = hashlib.sha256(f"{ctx.model_path}|{ctx.task}|{ctx.s['dataset_fn']}|{len(ctx.train_ds)}|{n}|"
                         f"{ctx.max_new}".encode()).hexdigest()[:12]
    path = os.path.join(ctx.cache_dir, f"value_table-{key}.jsonl")
    done = os.path.join(ctx.cache_dir, f"value_table-{key}.done")
    if os.path.exists(done):
        return {"basis_value_table_path": path}
    os.makedirs(ctx.cache_dir, exist_ok=True)
    t0 = time.time()
    model = ctx.load_model()
    table = build_value_table(model, ctx.tokenizer, ctx.train_ds, list(ctx.reward_funcs), path, num_samples=n,
                              max_new_tokens=ctx.max_new, batch_size=2048, seed=12345, model_id=ctx.model_path,
                              use_vllm=False if ctx.s["use_cpu"] else "auto", progress=False)
    with open(done, "w", encoding="utf-8") as f:
        f.write(f"{len(table)} rows\n")
    print(f"built BASIS value table {path} ({len(table)} prompts x {n} samples, {time.time() - t0:.0f} s)",
          flush=True)
    del model
    return {"basis_value_table_path": path}


# --------------------------------------------------------------------------------------------------- one run
def _settings_key(s: dict, spec: MethodSpec, seed: int) -> str:
    keep = {k: s[k] for k in ("task", "rollouts_per_step", "token_budget", "eval_every_tokens", "n_eval", "n_train",
                              "learning_rate", "eval_samples", "model_name_or_path", "warm_seed", "dataset_fn",
                              "reward_fn", "max_completion_length", "config_overrides", "bf16", "use_cpu")}
    keep.update(method=spec.name, seed=seed, group_size=spec.group_size, config_kwargs=spec.config_kwargs)
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_config(ctx: Context, spec: MethodSpec, config_cls, trainer_cls, seed: int, run_dir: str, extra: dict):
    """Shared config + the method's fields. Prompts per step: ``rollouts_per_step / group_size``.

    ``num_generations = group_size``; with ``group_size == 1`` (or a trainer with ``unique_prompt_sampler``) the
    generation batch is ``n_prompts`` unique prompts, one rollout each. Precedence of the config fields: shared
    settings < ``spec.config_kwargs`` < the setup's ``extra`` < ``--config_overrides``.
    """
    s = ctx.s
    n_prompts = max(1, s["rollouts_per_step"] // spec.group_size)
    unique = spec.group_size == 1 or bool(getattr(trainer_cls, "unique_prompt_sampler", False))
    per_device = n_prompts if unique else n_prompts * spec.group_size
    budget_steps = int(math.ceil(s["token_budget"] / max(1, n_prompts))) + 2  # >= 1 token per rollout: upper bound
    kw = dict(
        output_dir=run_dir, seed=seed, max_steps=budget_steps, learning_rate=s["learning_rate"],
        lr_scheduler_type="constant", warmup_steps=0, per_device_train_batch_size=per_device,
        gradient_accumulation_steps=1, num_generations=spec.group_size,
        max_completion_length=ctx.max_new, temperature=1.0, beta=0.0, use_cpu=s["use_cpu"], bf16=s["bf16"],
        gradient_checkpointing=False, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0,
    )
    kw.update(spec.config_kwargs)
    kw.update(extra)
    kw.update(s["config_overrides"])
    return config_cls(**kw), kw, n_prompts


def run_one(ctx: Context, spec: MethodSpec, seed: int, run_dir: str, setup_cache: dict) -> dict:
    """Train one (method, seed) to the token budget, evaluating at the checkpoints. Returns the run record."""
    import torch
    from transformers import PrinterCallback

    s = ctx.s
    rec = {"method": spec.name, "label": spec.label, "family": spec.family, "seed": seed, "status": "ok",
           "settings_key": _settings_key(s, spec, seed)}
    try:
        config_cls, trainer_cls = _load_object(spec.config), _load_object(spec.trainer)
    except (ImportError, AttributeError) as e:
        rec.update(status="skipped", reason=f"trainer not importable: {type(e).__name__}: {e}")
        return rec
    extra = {}
    if spec.setup:
        if spec.setup not in setup_cache:
            setup_cache[spec.setup] = globals()[spec.setup](ctx)
        extra = dict(setup_cache[spec.setup])
    try:
        config, cfg_kw, n_prompts = build_config(ctx, spec, config_cls, trainer_cls, seed, run_dir, extra)
    except (TypeError, ValueError) as e:
        rec.update(status="skipped", reason=f"config rejected: {type(e).__name__}: {e}")
        return rec
    rec.update(config={k: v for k, v in cfg_kw.items() if k != "output_dir"}, prompts_per_step=n_prompts,
               trainer_class=f"{trainer_cls.__module__}.{trainer_cls.__name__}")

    curve: list[dict] = []
    timer = {"eval_s": 0.0, "t0": None}
    final: dict = {}
    model_holder: dict = {}

    def train_wall() -> float:
        return 0.0 if timer["t0"] is None else time.perf_counter() - timer["t0"] - timer["eval_s"]

    def evaluate(nominal: float, tokens: float, step: int, is_final: bool) -> None:
        t = time.perf_counter()
        model = model_holder["trainer"].model
        g = ctx.evaluate(model, greedy=True)
        point = {"nominal_tokens": nominal, "tokens": tokens, "step": step, "train_wall_s": train_wall(),
                 "greedy_accuracy": g.accuracy}
        sampled = None
        if s["eval_samples"]:
            sampled = ctx.evaluate(model, greedy=False, num_samples=s["eval_samples"], seed=1000 + seed)
            point["sampled_accuracy"] = sampled.accuracy
        curve.append(point)
        if is_final:
            from trl_ext.testbed import write_outcomes_jsonl

            final["outcomes"] = write_outcomes_jsonl(os.path.join(run_dir, "outcomes.jsonl"), g.records)
            if sampled is not None:
                final["outcomes_sampled"] = write_outcomes_jsonl(os.path.join(run_dir, "outcomes_sampled.jsonl"),
                                                                 sampled.records)
            final["point"] = point
        timer["eval_s"] += time.perf_counter() - t
        print(f"  [{spec.name} seed {seed}] {tokens:>9.0f} tokens (step {step}, train {point['train_wall_s']:.1f} s):"
              f" greedy {g.accuracy:.3f}" + (f", sampled {sampled.accuracy:.3f}" if sampled else ""), flush=True)

    budget = float(s["token_budget"])
    every = float(s["eval_every_tokens"])
    cps = [every * k for k in range(1, int(budget // every) + 1) if every * k < budget]

    def on_checkpoint(nominal, tokens, state):
        evaluate(nominal, tokens, state.global_step, is_final=nominal >= budget)

    cb = TokenBudgetCallback(budget, cps, on_checkpoint)

    class _Clock(_trainer_callback_base()):
        def on_train_begin(self, args, state, control, **kw):
            timer["t0"] = time.perf_counter()

    torch.manual_seed(seed)
    model = ctx.load_model()
    trainer = trainer_cls(model=model, reward_funcs=list(ctx.reward_funcs), args=config, train_dataset=ctx.train_ds,
                          processing_class=ctx.tokenizer, callbacks=[_Clock(), cb])
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
        final_greedy_accuracy=final["point"]["greedy_accuracy"],
        final_sampled_accuracy=final["point"].get("sampled_accuracy"),
        outcomes=os.path.relpath(final["outcomes"], s["output_dir"]),
        outcomes_sampled=(os.path.relpath(final["outcomes_sampled"], s["output_dir"])
                          if "outcomes_sampled" in final else None),
        tokens_per_step=cb.tokens / max(1, trainer.state.global_step),
        rollouts_per_step=(sum(h.get("ext/rollouts", 0.0) for h in logs) / len(logs)) if logs else None,
        last_log={k: v for k, v in (logs[-1] if logs else {}).items() if isinstance(v, (int, float))},
    )
    del trainer, model
    gc.collect()
    return rec


# ------------------------------------------------------------------------------------------------ summaries
def tokens_to_threshold(curve: Sequence[dict], threshold: float) -> float | None:
    """Actual tokens at the first checkpoint whose greedy accuracy is >= ``threshold`` (``None``: never).

    Coarse by construction (checkpoint resolution); the start point (0 tokens) counts when it already qualifies.
    """
    for p in sorted(curve, key=lambda q: q["tokens"]):
        if p["greedy_accuracy"] >= threshold:
            return float(p["tokens"])
    return None


def choose_threshold(runs: Sequence[dict], explicit: float | None, start_accuracy: float) -> tuple[float, str]:
    """Accuracy threshold of the "tokens to threshold" column, fixed across methods.

    ``explicit`` (``--threshold``) if given; else the mean final accuracy of ``grpo_g16`` at the budget (the bar of
    the V0.5 trainer's goal: "reaches the accuracy plain GRPO reaches at G = 16 with fewer generated tokens"); else, when
    ``grpo_g16`` did not run, the start accuracy + 0.10.
    """
    if explicit is not None:
        return float(explicit), "--threshold"
    ref = [r["final_greedy_accuracy"] for r in runs if r["method"] == GRPO_REFERENCE and r["status"] == "ok"]
    if ref:
        return sum(ref) / len(ref), f"mean final accuracy of {GRPO_REFERENCE} at the budget"
    return min(1.0, start_accuracy + 0.10), "start accuracy + 0.10 (grpo_g16 not run)"


def _mean_sd(xs: Sequence[float]) -> tuple[float | None, float | None]:
    xs = [float(x) for x in xs if x is not None]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def summarize(runs: Sequence[dict], threshold: float, start_accuracy: float) -> list[dict]:
    """One table row per method (in run order)."""
    rows = []
    for name in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == name]
        ok = [r for r in mine if r["status"] == "ok"]
        row = {"method": name, "label": mine[0]["label"], "status": "ok" if ok else mine[0]["status"],
               "n_seeds": len(ok), "reason": None if ok else mine[0].get("reason")}
        if ok:
            curves = [[{"tokens": 0.0, "greedy_accuracy": start_accuracy}, *r["curve"]] for r in ok]
            ttt = [tokens_to_threshold(c, threshold) for c in curves]
            reached = [t for t in ttt if t is not None]
            acc_m, acc_sd = _mean_sd([r["final_greedy_accuracy"] for r in ok])
            row.update(
                final_accuracy_mean=acc_m, final_accuracy_sd=acc_sd,
                final_accuracy_per_seed=[r["final_greedy_accuracy"] for r in ok],
                final_sampled_accuracy_mean=_mean_sd([r.get("final_sampled_accuracy") for r in ok])[0],
                tokens_mean=_mean_sd([r["tokens"] for r in ok])[0],
                tokens_to_threshold_mean=_mean_sd(reached)[0], tokens_to_threshold_reached=len(reached),
                train_wall_s_mean=_mean_sd([r["train_wall_s"] for r in ok])[0],
                steps_mean=_mean_sd([r["steps"] for r in ok])[0],
                rollouts_per_step_mean=_mean_sd([r.get("rollouts_per_step") for r in ok])[0],
                failed_seeds=[r["seed"] for r in mine if r["status"] != "ok"],
            )
        rows.append(row)
    return rows


def _fmt(x, spec=".3f", none="--"):
    return none if x is None else format(x, spec)


def table_markdown(rows: Sequence[dict], threshold: float, s: dict, rule: str = "") -> str:
    head = (f"Token budget {s['token_budget']:.0f} generated training tokens per run; {s['n_eval']} held-out "
            f"questions (greedy); threshold {threshold:.3f}{f' ({rule})' if rule else ''}.\n\n"
            "| method | seeds | final acc (mean +- sd) | per seed | tokens used | tokens to threshold "
            "(seeds reaching) | train wall s | steps | trained rollouts/step |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['label']} | 0 | {r['status']}: {r['reason']} | | | | | | |")
            continue
        per = " ".join(f"{a:.3f}" for a in r["final_accuracy_per_seed"])
        lines.append(
            f"| {r['label']} | {r['n_seeds']} | {_fmt(r['final_accuracy_mean'])} +- {_fmt(r['final_accuracy_sd'])} "
            f"| {per} | {_fmt(r['tokens_mean'], '.0f')} | {_fmt(r['tokens_to_threshold_mean'], '.0f')} "
            f"({r['tokens_to_threshold_reached']}/{r['n_seeds']}) | {_fmt(r['train_wall_s_mean'], '.1f')} "
            f"| {_fmt(r['steps_mean'], '.0f')} | {_fmt(r['rollouts_per_step_mean'], '.1f')} |")
    return head + "\n".join(lines) + "\n"


def compute_verdicts(runs: Sequence[dict], rows: Sequence[dict], s: dict) -> dict:
    """Two-part-rule reports of each method against ``grpo_g16`` and against the best GRPO group size.

    The best GRPO group size is the ``grpo_*`` method with the highest mean final greedy accuracy at the budget
    (selected on the same evaluation set, which favours the reference: a conservative bar for the challengers).
    """
    from trl_ext.stats import compare_outcome_files

    out_dir = s["output_dir"]
    files = {}
    for r in runs:
        if r["status"] == "ok":
            files.setdefault(r["method"], []).append(os.path.join(out_dir, r["outcomes"]))
    grpo = [r for r in rows if r["status"] == "ok" and METHODS[r["method"]].family == "grpo"]
    best = max(grpo, key=lambda r: (r["final_accuracy_mean"], METHODS[r["method"]].group_size))["method"] \
        if grpo else None
    refs = {"vs_grpo_g16": GRPO_REFERENCE if GRPO_REFERENCE in files else None, "vs_best_grpo": best}
    result = {"references": refs, "best_grpo_rule": "grpo_* method with the highest mean final greedy accuracy",
              "comparisons": []}
    if best is not None and best == refs["vs_grpo_g16"]:
        result["note"] = f"the best GRPO group size is {best} itself: the vs_best_grpo comparisons equal vs_grpo_g16"
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
    lines = [f"References: GRPO G=16 = `{v['references']['vs_grpo_g16']}`; best GRPO group size = "
             f"`{v['references']['vs_best_grpo']}` ({v['best_grpo_rule']})."
             + (f" Note: {v['note']}." if v.get("note") else "") + "\n",
             "| a (challenger) | b (reference) | verdict | margin a-b (pts) | 95% CI (pts) | detection floor (pts) "
             "| margin/floor | paired floor (pts) | smallest gap caught 80% (pts) | votes a/b, p "
             "| length-residualized (pts) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def pts(x):
        return "--" if x is None else f"{100 * x:+.1f}" if x < 0 or x > 0 else "0.0"

    for c in v["comparisons"]:
        if c["status"] == "error":
            lines.append(f"| {c['a']} | {c['b']} | error: {c['reason']} | | | | | | | | |")
            continue
        ci = c["margin_ci"]
        gap = c["smallest_detectable_gap"]
        lines.append(
            f"| {c['a']} | {c['b']} | {c['status']} | {pts(c['margin'])} | {pts(ci['low'])} .. {pts(ci['high'])} | "
            f"{100 * c['detection_floor']:.1f} | {_fmt(c['margin_to_floor_ratio'], '.2f')} | "
            f"{100 * c['paired_detection_floor']:.1f} | {'--' if gap is None else f'{100 * gap:.1f}'} | "
            f"{c['votes_a']}/{c['votes_b']}, {c['pooled_p_value']:.3g} | {pts(c.get('length_residualized'))} |")
    lines.append("\nLength-residualized: the margin after regressing out completion-length differences (section 5 "
                 "step 4); the primary reading only where the length slope is positive (see verdicts.json "
                 "`length_note`).")
    return "\n".join(lines) + "\n"


def make_plots(runs: Sequence[dict], start_accuracy: float, out_dir: str) -> list[str]:
    """Mean held-out greedy accuracy vs tokens and vs training wall time; shaded band = min..max over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for xkey, fname, xlabel in (("tokens", "accuracy_vs_tokens.png", "generated training tokens"),
                                ("train_wall_s", "accuracy_vs_walltime.png", "training wall time (s, eval excluded)")):
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        for name in dict.fromkeys(r["method"] for r in runs):
            ok = [r for r in runs if r["method"] == name and r["status"] == "ok"]
            if not ok:
                continue
            n = min(len(r["curve"]) for r in ok)
            xs = [0.0] + [sum(r["curve"][i][xkey] for r in ok) / len(ok) for i in range(n)]
            accs = [[start_accuracy] + [r["curve"][i]["greedy_accuracy"] for i in range(n)] for r in ok]
            mean = [sum(a[i] for a in accs) / len(accs) for i in range(n + 1)]
            lo = [min(a[i] for a in accs) for i in range(n + 1)]
            hi = [max(a[i] for a in accs) for i in range(n + 1)]
            line = ax.plot(xs, mean, marker="o", ms=3, label=f"{ok[0]['label']} ({len(ok)} seeds)")[0]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.12)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out greedy accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    s = resolve_settings(args)
    import torch

    torch.set_num_threads(args.num_threads)
    out = s["output_dir"]
    os.makedirs(out, exist_ok=True)
    t_all = time.time()
    ctx = Context(s)
    print(f"start checkpoint: {ctx.model_path}", flush=True)
    start = ctx.evaluate(ctx.load_model(), greedy=True)
    print(f"start accuracy {start.accuracy:.3f} on {len(ctx.eval_ds)} held-out questions", flush=True)

    runs, setup_cache = [], {}
    for name in s["methods"]:
        spec = METHODS[name]
        for seed in s["seeds"]:
            run_dir = os.path.join(out, "runs", name, f"seed{seed}")
            res_path = os.path.join(run_dir, "result.json")
            key = _settings_key(s, spec, seed)
            if s["resume"] and os.path.exists(res_path):
                with open(res_path, encoding="utf-8") as f:
                    old = json.load(f)
                if old.get("settings_key") == key and old.get("status") == "ok":
                    print(f"[{name} seed {seed}] reusing {res_path}", flush=True)
                    runs.append(old)
                    continue
            print(f"[{name} seed {seed}] training to {s['token_budget']:.0f} tokens", flush=True)
            os.makedirs(run_dir, exist_ok=True)
            t0 = time.time()
            try:
                rec = run_one(ctx, spec, seed, run_dir, setup_cache)
            except Exception as e:  # a crashing trainer is recorded and reported, never dropped
                rec = {"method": name, "label": spec.label, "family": spec.family, "seed": seed, "status": "failed",
                       "reason": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
                       "settings_key": key}
            rec["run_wall_s"] = time.time() - t0
            if rec["status"] != "ok":
                print(f"[{name} seed {seed}] {rec['status'].upper()}: {rec['reason']}", flush=True)
            _write_json(res_path, rec)
            runs.append(rec)
            if rec["status"] == "skipped":  # the same reason holds for every seed
                for other in s["seeds"][s["seeds"].index(seed) + 1:]:
                    runs.append({**rec, "seed": other})
                break

    threshold, threshold_rule = choose_threshold(runs, s["threshold"], start.accuracy)
    rows = summarize(runs, threshold, start.accuracy)
    verdicts = compute_verdicts(runs, rows, s)
    plots = [] if args.no_plots else make_plots(runs, start.accuracy, out)
    settings = {k: v for k, v in s.items()}
    doc = {"settings": settings, "start_checkpoint": ctx.model_path, "start_accuracy": start.accuracy,
           "threshold": threshold, "threshold_rule": threshold_rule, "n_eval": len(ctx.eval_ds),
           "n_train": len(ctx.train_ds),
           "max_completion_length": ctx.max_new, "runs": runs, "plots": [os.path.basename(p) for p in plots],
           "total_wall_s": time.time() - t_all, "command": " ".join(sys.argv),
           "sum_run_wall_s": sum(r.get("run_wall_s", 0.0) for r in runs)}
    _write_json(os.path.join(out, "runs.json"), doc)
    _write_json(os.path.join(out, "table.json"), {"threshold": threshold, "threshold_rule": threshold_rule,
                                                  "start_accuracy": start.accuracy, "rows": rows})
    md = table_markdown(rows, threshold, s, threshold_rule)
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
        f.write(md)
    _write_json(os.path.join(out, "verdicts.json"), verdicts)
    vmd = verdicts_markdown(verdicts)
    with open(os.path.join(out, "verdicts.md"), "w", encoding="utf-8") as f:
        f.write(vmd)
    print("\n" + md + "\n" + vmd, flush=True)
    print(f"total wall time {doc['total_wall_s']:.0f} s; outputs in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One benchmark run: its settings key (the reuse check), its trainer config, training to the token budget with
evaluations at the checkpoints, and reuse of finished runs (a crash is recorded, never raised)."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import math
import os
import time
import traceback

from trl_ext._io import resolve_jsonl, write_json_compact
from trl_ext._io import write_json as _write_json

from .callbacks import (
    TRACE_FILE,
    TokenBudgetCallback,
    UpdateNormCallback,
    _trace_by_reference,
    _trainer_callback_base,
    step_trace,
)
from .context import Context, _load_object
from .evaluation import (
    ENGINE_WAIT_KEYS,
    accuracy_by_level,
    engine_wait_s,
    eval_engine_dtype,
    evaluate_checkpoint,
    worker_rss_during_engine,
)
from .jobs import peak_rss_gb, reset_peak_rss
from .presets import GRADED_REWARDS, TOKEN_METRIC, MethodSpec, MethodUnavailable, SetupResult
from .setups import get_setup


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
    elif s.get("test_eval_samples") and s["test_eval_samples"] != s["eval_samples"]:
        keep["test_eval_samples"] = s["test_eval_samples"]
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
    if split == "test" and s.get("test_eval_backend", "transformers") != "transformers":
        keep["eval_backend"] = (s["test_eval_backend"], eval_engine_dtype(s))  # transformers keys are unchanged
    if s.get("use_peft"):  # added with the real-model preset: keys of full-model runs are unchanged
        keep["lora"] = (s["lora_r"], s["lora_alpha"])
    if s.get("protocol") == "v2":  # v2 keys also pin the start checkpoint's weights (a rebuilt warm model re-runs)
        keep["start_checkpoint_sha"] = s.get("start_checkpoint_sha")
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def memory_key(s: dict, spec: MethodSpec) -> str:
    """Key of the configuration a run's memory depends on: :func:`_settings_key` of a test-split run with the seed
    and learning rate fixed, so every seed and rate of one configuration share it (the ``--jobs`` queue's measured
    estimates, :func:`compare_harness.jobs.measured_peaks`)."""
    return _settings_key(s, spec, seed=-1, lr=-1.0)


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
        max_completion_length=ctx.max_new, temperature=s.get("temperature", 1.0), beta=0.0, use_cpu=s["use_cpu"],
        bf16=s["bf16"],
        gradient_checkpointing=False, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0,
    )
    kw.update(spec.config_kwargs)
    kw.update(extra)
    kw.update(s["config_overrides"])
    return config_cls(**kw), kw, n_prompts


#: The harness's own state of a run in progress, written last into each mid-run trainer checkpoint (so a checkpoint
#: that has it is complete): the curve so far, the token callback, the timers. See :func:`run_one`.
RUN_STATE_FILE = "harness_state.json"


def run_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """``(step, path)`` of the trainer checkpoints (``checkpoint-<step>``) in ``run_dir``, by step."""
    if not os.path.isdir(run_dir):
        return []
    found = []
    for name in os.listdir(run_dir):
        head, _, step = name.partition("-")
        if head == "checkpoint" and step.isdigit():
            found.append((int(step), os.path.join(run_dir, name)))
    return sorted(found)


def resumable_checkpoint(run_dir: str, key: str) -> tuple[str, dict] | None:
    """The newest complete mid-run checkpoint of the run with settings key ``key``: ``(path, harness state)``, or
    ``None``. Complete: its :data:`RUN_STATE_FILE` exists and parses (the harness writes it after the trainer's own
    files); a checkpoint of other settings (another rate, budget, ...) is never resumed."""
    for _step, path in reversed(run_checkpoints(run_dir)):
        try:
            with open(os.path.join(path, RUN_STATE_FILE), encoding="utf-8") as f:
                state = json.load(f)
        except (OSError, ValueError):
            continue
        if state.get("settings_key") == key:
            return path, state
    return None


def remove_run_checkpoints(run_dir: str, keep: str | None = None) -> None:
    """Delete the run's trainer checkpoints (the trained weights with their optimizer state: 60 MB for a SmolLM2
    LoRA run, several times the model for full fine-tuning), but ``keep``."""
    import shutil

    for _step, path in run_checkpoints(run_dir):
        if path != keep:
            shutil.rmtree(path, ignore_errors=True)


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
    # eval_s, engine_wait_s, save_s: totals over the run; *_at_start and train_s_before: what a resumed run brought
    timer = {"eval_s": 0.0, "t0": None, "engine_wait_s": 0.0, "worker_eval_rss_gb": None, "save_s": 0.0,
             "train_s_before": 0.0, "eval_s_at_start": 0.0, "save_s_at_start": 0.0, "save_t0": None}
    final: dict = {}
    model_holder: dict = {}

    def train_wall() -> float:
        """Training seconds of the run, over every session of a resumed one (evaluations and checkpoint saves out)."""
        if timer["t0"] is None:
            return timer["train_s_before"]
        return (timer["train_s_before"] + time.perf_counter() - timer["t0"] - (timer["eval_s"] - timer["eval_s_at_start"])
                - (timer["save_s"] - timer["save_s_at_start"]))

    def evaluate(nominal: float, tokens: float, step: int, is_final: bool) -> None:
        t = time.perf_counter()
        trained_s = train_wall()  # read before this evaluation runs: it is not training time
        model = model_holder["trainer"].model
        last = model_holder.get("last_eval")
        waited = None
        if last is not None and last[:2] == (step, tokens):  # several checkpoints crossed in one step: same model
            g, sampled = last[2:]
        else:
            g, sampled = evaluate_checkpoint(ctx, model, seed, split)
            model_holder["last_eval"] = (step, tokens, g, sampled)
            waited = engine_wait_s(g, sampled)
            timer["engine_wait_s"] += waited or 0.0
            rss = worker_rss_during_engine(g, sampled)
            if rss is not None:
                timer["worker_eval_rss_gb"] = max(rss, timer["worker_eval_rss_gb"] or 0.0)
        sampled_primary = s.get("eval_mode") == "sampled"  # then g holds the sampled evaluation
        point = {"nominal_tokens": nominal, "tokens": tokens, "step": step, "train_wall_s": trained_s,
                 "accuracy": g.accuracy, ("sampled_accuracy" if sampled_primary else "greedy_accuracy"): g.accuracy}
        if sampled is not None:
            point["sampled_accuracy"] = sampled.accuracy
        if waited is not None:  # an engine evaluation: the part of it spent waiting for another worker's engine
            point["eval_engine_wait_s"] = waited
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
            final["engine"] = getattr(g, "backend_settings", None)
            final["by_level"] = accuracy_by_level(g.records, ctx.difficulty_levels(split))
        point["eval_wall_s"] = time.perf_counter() - t
        timer["eval_s"] += point["eval_wall_s"]
        print(f"  [{spec.name} seed {seed} lr {lr:g}] {tokens:>9.0f} tokens (step {step}, train "
              f"{point['train_wall_s']:.1f} s): {split} {'sampled' if sampled_primary else 'greedy'} "
              f"{g.accuracy:.3f}" + (f", sampled {sampled.accuracy:.3f}" if sampled else "")
              + (f" (evaluation {point['eval_wall_s']:.0f} s, {waited:.0f} s of it waiting for another engine)"
                 if waited is not None else ""), flush=True)

    budget = float(s["token_budget"])
    every = float(s["eval_every_tokens"])
    cps = [every * k for k in range(1, int(budget // every) + 1) if every * k < budget] if split == "test" else []

    def on_checkpoint(nominal, tokens, state):
        evaluate(nominal, tokens, state.global_step, is_final=nominal >= budget)

    cb = TokenBudgetCallback(budget, cps, on_checkpoint)
    norms = UpdateNormCallback() if s.get("update_norms") else None

    # Mid-run checkpoints (test runs with intermediate evaluations, unless --no_run_checkpoints): after each
    # evaluation short of the budget the trainer saves a resumable checkpoint (weights, optimizer, RNG, trl_ext
    # state) and the harness its own state; a run cut off (a session's end, a crash) resumes from the newest one
    # instead of starting again. Saved after the evaluation, so the restored RNG is the one training went on with.
    mid_run = split == "test" and bool(cps) and s.get("run_checkpoints", True)
    resume_from = resumable_checkpoint(run_dir, rec["settings_key"]) if mid_run and s["resume"] else None
    resumed = []
    if resume_from is not None:
        path, st = resume_from
        curve.extend(st["curve"])
        cb.tokens, cb.seen = float(st["tokens"]), bool(st["seen"])
        cb.fired = [tuple(x) for x in st["fired"]]
        timer.update(train_s_before=st["train_wall_s"], eval_s=st["eval_wall_s"], eval_s_at_start=st["eval_wall_s"],
                     save_s=st["save_wall_s"], save_s_at_start=st["save_wall_s"], engine_wait_s=st["engine_wait_s"],
                     worker_eval_rss_gb=st["worker_eval_rss_gb"])
        if norms is not None:
            norms.norms.update({int(k): v for k, v in st.get("update_norms", {}).items()})
        resumed = [*st.get("resumed", []), {"step": st["step"], "tokens": st["tokens"],
                                            "num_threads": torch.get_num_threads()}]
        print(f"[{spec.name} seed {seed} lr {lr:g}] resuming at step {st['step']} ({st['tokens']:.0f} tokens) from "
              f"{os.path.basename(path)}", flush=True)

    class _Clock(_trainer_callback_base()):
        def on_train_begin(self, args, state, control, **kw):
            timer["t0"] = time.perf_counter()

    class _SaveAfterEvaluation(_trainer_callback_base()):
        """Asks for a checkpoint in the step whose log fired an evaluation short of the budget (after ``cb``'s
        ``on_log``, before the trainer's save in the same ``_maybe_log_save_evaluate``); writes the harness state
        into it and drops the older ones."""

        def __init__(self):
            self.saved = len(cb.fired)

        def on_log(self, args, state, control, **kw):
            if len(cb.fired) > self.saved and not cb.reached:
                self.saved = len(cb.fired)
                control.should_save = True
                timer["save_t0"] = time.perf_counter()
            return control

        def on_save(self, args, state, control, **kw):
            path = os.path.join(run_dir, f"checkpoint-{state.global_step}")
            timer["save_s"] += time.perf_counter() - timer["save_t0"]
            st = {"settings_key": rec["settings_key"], "step": int(state.global_step), "tokens": cb.tokens,
                  "seen": cb.seen, "fired": [list(x) for x in cb.fired], "curve": curve,
                  "train_wall_s": train_wall(), "eval_wall_s": timer["eval_s"], "save_wall_s": timer["save_s"],
                  "engine_wait_s": timer["engine_wait_s"], "worker_eval_rss_gb": timer["worker_eval_rss_gb"],
                  "update_norms": {str(k): v for k, v in norms.norms.items()} if norms is not None else {},
                  "resumed": resumed}
            _write_json(os.path.join(path, RUN_STATE_FILE), st)  # atomic, and last: a checkpoint with it is complete
            remove_run_checkpoints(run_dir, keep=path)
            return control

    torch.manual_seed(seed)
    model = ctx.load_model()
    peft_kw = {"peft_config": lora_config(s)} if s.get("use_peft") else {}
    callbacks = [_Clock(), cb] + ([_SaveAfterEvaluation()] if mid_run else []) + ([norms] if norms else [])
    trainer = trainer_cls(model=model, reward_funcs=reward_funcs, args=config, train_dataset=ctx.train_ds,
                          processing_class=ctx.tokenizer, callbacks=callbacks, **peft_kw)
    trainer.remove_callback(PrinterCallback)
    model_holder["trainer"] = trainer
    trainer.train(resume_from_checkpoint=resume_from[0] if resume_from else None)
    if not cb.reached:  # max_steps hit first: evaluate where it stopped, say so
        evaluate(budget, cb.tokens, trainer.state.global_step, is_final=True)
        rec["warning"] = f"stopped at max_steps={config.max_steps} before the token budget ({cb.tokens:.0f} < {budget})"
    logs = [h for h in trainer.state.log_history if TOKEN_METRIC in h]
    rec.update(
        curve=curve, tokens=cb.tokens, token_metric=TOKEN_METRIC if cb.seen else None,
        budget_reached=cb.reached,
        steps=trainer.state.global_step, train_wall_s=train_wall(), eval_wall_s=timer["eval_s"],
        eval_engine_wait_s=timer["engine_wait_s"] if any("eval_engine_wait_s" in p for p in curve) else None,
        worker_eval_rss_gb=timer["worker_eval_rss_gb"],  # the worker while its engine ran (<= its peak)
        final_accuracy=final["point"]["accuracy"], final_greedy_accuracy=final["point"].get("greedy_accuracy"),
        final_sampled_accuracy=final["point"].get("sampled_accuracy"),
        final_accuracy_by_level=final["by_level"],
        eval_engine=({k: v for k, v in final["engine"].items() if k not in ("calls", *ENGINE_WAIT_KEYS)}
                     if final.get("engine") else None),
        outcomes=os.path.relpath(final["outcomes"], s["output_dir"]),
        outcomes_sampled=(os.path.relpath(final["outcomes_sampled"], s["output_dir"])
                          if "outcomes_sampled" in final else None),
        tokens_per_step=cb.tokens / max(1, trainer.state.global_step),
        rollouts_per_step=(sum(h.get("ext/rollouts", 0.0) for h in logs) / len(logs)) if logs else None,
        last_log={k: v for k, v in (logs[-1] if logs else {}).items() if isinstance(v, (int, float))},
        trace=os.path.relpath(write_json_compact(os.path.join(run_dir, TRACE_FILE),
                                                 step_trace(logs, norms.norms if norms else None)), s["output_dir"]),
    )
    if mid_run:
        # resumed: where each later session took over (a session with another thread count sums in another order:
        # the rest of the run is another draw of the seed, as a run on another CPU is)
        rec.update(run_checkpoint_wall_s=timer["save_s"], resumed=resumed)
        remove_run_checkpoints(run_dir)  # finished: nothing to resume
        if timer["save_s"] > 0 or resumed:  # a checkpoint was saved: TRL wrote a model card into the run folder
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(run_dir, "README.md"))
    del trainer, model
    gc.collect()
    return rec


def lora_config(s: dict):
    """The LoRA adapter of ``--use_peft`` runs: rank ``lora_r``, ``lora_alpha``, every linear layer, no dropout
    (dropout would make the policy's log-probabilities stochastic between generation and the loss)."""
    from peft import LoraConfig

    return LoraConfig(r=s["lora_r"], lora_alpha=s["lora_alpha"], lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")


def _skip_record(spec: MethodSpec, seed: int, reason: str, key: str | None = None, **extra) -> dict:
    return {"method": spec.name, "label": spec.label, "family": spec.family, "seed": seed, "status": "skipped",
            "reason": reason, "settings_key": key, **extra}


def reusable_record(s: dict, spec: MethodSpec, seed: int, lr: float, run_dir: str, split: str = "test") -> dict | None:
    """The record of ``run_dir/result.json`` when a run with these settings reuses it instead of training (resume on,
    status ok, the same settings key), else ``None`` (absent, cut off mid-write, failed, or other settings). The one
    reuse condition of :func:`run_or_reuse` and of the ``--jobs`` queue's ``finished_main_runs``."""
    if not s["resume"]:
        return None
    try:
        with open(os.path.join(run_dir, "result.json"), encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    return rec if rec.get("status") == "ok" and rec.get("settings_key") == _settings_key(s, spec, seed, lr, split) \
        else None


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
    old = reusable_record(s, spec, seed, lr, run_dir, split)
    if old is not None:
        print(f"[{spec.name} seed {seed} lr {lr:g} {split}] reusing {res_path}", flush=True)
        return _trace_by_reference(_complete_reused(ctx, spec, old, setup_cache, lr, split), res_path,
                                   s["output_dir"])
    if s["resume"] and s.get("report_only") and os.path.exists(res_path):
        with open(res_path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("settings_key") == key and old.get("status") == "skipped":
            # a method not defined for the task (or not importable) was recorded as skipped: it is not pending
            return old
    if s.get("report_only"):  # an interim report: nothing is trained or written
        return {**_skip_record(spec, seed, "not run yet (--report_only)", key), "status": "pending",
                "learning_rate": lr, "eval_split": split}
    what = "tuning on validation" if split != "test" else "training"
    print(f"[{spec.name} seed {seed} lr {lr:g}] {what} to {s['token_budget']:.0f} tokens", flush=True)
    os.makedirs(run_dir, exist_ok=True)
    measures_peak = reset_peak_rss()  # the worker's high-water mark from here: this run's peak
    t0 = time.time()
    try:
        rec = run_one(ctx, spec, seed, run_dir, setup_cache, lr=lr, split=split)
    except Exception as e:  # a crashing trainer is recorded and reported, never dropped
        rec = {"method": spec.name, "label": spec.label, "family": spec.family, "seed": seed, "status": "failed",
               "learning_rate": lr, "eval_split": split, "reason": f"{type(e).__name__}: {e}",
               "traceback": traceback.format_exc(), "settings_key": key}
    rec["run_wall_s"] = time.time() - t0
    rec.update(worker_peak_rss_gb=peak_rss_gb() if measures_peak else None, memory_key=memory_key(s, spec))
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

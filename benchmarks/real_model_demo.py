"""Does GRPO with LoRA improve SmolLM2-135M-Instruct on held-out ``sum3`` questions within a CPU time budget?

    python benchmarks/real_model_demo.py                          # 20 min of training (see docs/examples.md)
    python benchmarks/real_model_demo.py --minutes 1 --n_eval 8   # smoke check, a few minutes in all

1. evaluate the cached real model (``trl_ext.realmodel.get_real_model()``) on ``--n_eval`` questions of the task's
   test split x ``--k`` samples (T=1, top_k 0, top_p 1, ``--max_new_tokens``): sampled accuracy, with
   :func:`trl_ext.realmodel.measure.measure_task`;
2. train ``trl_ext.GRPOTrainer`` with LoRA on the train split through ``examples/scripts/grpo.py`` (its ``main``,
   in this process, with a callback that stops training after ``--minutes`` of wall time);
3. evaluate the adapter on the same questions with the same sampling seed;
4. write ``<output_dir>/demo.json`` (accuracy before/after, per-question success, training reward over the first
   and last 10 steps, steps, generated tokens, the time of each phase, the exact script command) and print a summary.

Defaults for the 20-minute run: LoRA r 16 / alpha 32 on all linear layers; learning rate 5e-5 (the top of the usual
1e-5..5e-5 LoRA range: only ~15-25 steps fit in 20 minutes on one thread, and Adam moves LoRA's zero-initialised B
matrices by about lr per step); 2 prompts x 8 completions = 16 per step; 128-token completions; temperature 1.0;
training reward 0.75 x accuracy + 0.25 x format (both reported; the held-out metric is accuracy only); beta 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRPO_SCRIPT = os.path.join(ROOT, "examples", "scripts", "grpo.py")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20.0, help="training wall-clock budget (default 20)")
    p.add_argument("--task", default="sum3", choices=("sum3", "largest", "steps"), help="real-model task (default sum3)")
    p.add_argument("--n_eval", type=int, default=64, help="held-out questions (default 64, as docs/real_model.md)")
    p.add_argument("--k", type=int, default=4, help="samples per held-out question (default 4)")
    p.add_argument("--max_new_tokens", type=int, default=128, help="completion cap, evaluation and training (128)")
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--lora_r", type=int, default=16)
    p.add_argument("--num_generations", type=int, default=8)
    p.add_argument("--per_device_train_batch_size", type=int, default=16, help="completions per step (default 16)")
    p.add_argument("--seed", type=int, default=0, help="evaluation questions / sampling seed and training seed")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--output_dir", default="outputs/real_model_demo")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.n_eval < 1 or args.k < 1:
        p.error("--minutes, --n_eval and --k must be positive")
    return args


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # progress lines appear as they happen
    import torch
    from transformers import TrainerCallback

    from trl_ext._io import write_json
    from trl_ext.realmodel import get_real_model
    from trl_ext.realmodel.measure import measure_task

    torch.set_num_threads(args.threads)
    t_start = time.monotonic()
    model_dir = get_real_model()
    evaluate = dict(num_prompts=args.n_eval, num_samples=args.k, split="test", max_new_tokens=args.max_new_tokens,
                    seed=args.seed, greedy=False)
    before = measure_task(model_dir, args.task, **evaluate)
    print(f"before: held-out sampled accuracy {before['sampled_success']:.3f} ({before['sampling_seconds']} s)")

    train_dir = os.path.join(args.output_dir, "grpo_lora")
    script_argv = [
        "--model_name_or_path", "smollm2", "--dataset_name", args.task, "--reward_funcs", "accuracy", "format",
        "--reward_weights", "0.75", "0.25", "--use_cpu", "--bf16", "false", "--gradient_checkpointing", "false",
        "--use_peft", "--lora_r", str(args.lora_r), "--lora_alpha", str(2 * args.lora_r), "--lora_dropout", "0.0",
        "--lora_target_modules", "all-linear", "--learning_rate", str(args.learning_rate),
        "--lr_scheduler_type", "constant", "--per_device_train_batch_size", str(args.per_device_train_batch_size),
        "--num_generations", str(args.num_generations), "--max_completion_length", str(args.max_new_tokens),
        "--temperature", "1.0", "--beta", "0.0", "--max_steps", "100000", "--logging_steps", "1",
        "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--seed", str(args.seed),
        "--output_dir", train_dir,
    ]

    class TimeBudget(TrainerCallback):
        """Stop training once ``--minutes`` of wall time have passed since training began."""

        def on_train_begin(self, a, state, control, **kw):
            self.t0 = time.monotonic()

        def on_step_end(self, a, state, control, **kw):
            if time.monotonic() - self.t0 >= args.minutes * 60:
                control.should_training_stop = True

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                print(f"step {state.global_step}: reward {logs['reward']:.3f} "
                      f"({time.monotonic() - self.t0:.0f} s)", flush=True)

    spec = importlib.util.spec_from_file_location("trl_ext_example_script_grpo", GRPO_SCRIPT)
    grpo = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grpo)
    t_train = time.monotonic()
    trainer = grpo.main(*grpo.make_parser().parse_args_and_config(script_argv), callbacks=[TimeBudget()])
    train_s = time.monotonic() - t_train
    hist = trainer.state.log_history
    steps = trainer.state.global_step
    del trainer

    after = measure_task(model_dir, args.task, adapter_path=train_dir, **evaluate)
    print(f"after:  held-out sampled accuracy {after['sampled_success']:.3f} ({after['sampling_seconds']} s)")

    def series(key):
        return [h[key] for h in hist if key in h]

    reward = {k: {"first10": mean(series(key)[:10]), "last10": mean(series(key)[-10:])}
              for k, key in (("total", "reward"), ("accuracy", "rewards/accuracy_reward/mean"),
                             ("format", "rewards/format_reward/mean"))}
    tokens = series("ext/generated_tokens_total")
    step_times = series("step_time")
    summary = {
        "task": args.task, "model": model_dir, "held_out": {"split": "test", "questions": args.n_eval,
                                                            "samples_per_question": args.k, "seed": args.seed},
        "accuracy_before": before["sampled_success"], "accuracy_after": after["sampled_success"],
        "format_before": before["sampled_format"], "format_after": after["sampled_format"],
        "per_question_before": before["per_prompt_success"], "per_question_after": after["per_prompt_success"],
        "train_reward": reward, "steps": steps, "generated_tokens": tokens[-1] if tokens else None,
        "seconds": {"eval_before": before["sampling_seconds"], "train": round(train_s, 1),
                    "train_per_step": round(train_s / steps, 1) if steps else None,
                    "step_time_mean": mean(step_times), "eval_after": after["sampling_seconds"],
                    "total": round(time.monotonic() - t_start, 1)},
        "minutes_budget": args.minutes,
        "command": f"python {os.path.relpath(GRPO_SCRIPT, ROOT)} {shlex.join(script_argv)}",
        "note": "the command ran in-process (grpo.main) with a callback stopping training after minutes_budget",
        "demo_args": vars(args),
    }
    path = write_json(os.path.join(args.output_dir, "demo.json"), summary)
    r = reward["total"]
    print(f"\n{args.task}: held-out sampled accuracy ({args.n_eval} questions x {args.k}) "
          f"{summary['accuracy_before']:.3f} -> {summary['accuracy_after']:.3f}")
    print(f"training: {steps} steps in {train_s:.0f} s ({summary['seconds']['train_per_step']} s/step), "
          f"{summary['generated_tokens']} generated tokens, reward first/last 10 steps {r['first10']} / {r['last10']}")
    print(f"evaluation: {before['sampling_seconds']} s before, {after['sampling_seconds']} s after; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

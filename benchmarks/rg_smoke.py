"""Smoke training on two reasoning-gym tasks named by the regime atlas: GRPO and V0.5 through the example scripts.

Not a benchmark (a few steps, one seed): it shows that a task no one here wrote trains end to end through
``examples/scripts/grpo.py`` and ``examples/scripts/v05_grpo.py`` on SmolLM2-135M-Instruct with LoRA, and records
what each step logged (rewards, generated tokens, V0.5's rollouts per prompt) in ``OUT/smoke.json``::

    python benchmarks/rg_smoke.py --methods_task reasoning_gym:letter_counting:level=0 \\
        --grpo_task reasoning_gym:spell_backward:level=0,size=500 --max_steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "benchmarks", "results", "rg_atlas")
KEYS = ("reward", "rewards/rg_accuracy_reward/mean", "rewards/rg_format_reward/mean", "ext/generated_tokens",
        "frac_reward_zero_std", "v05/rollouts_per_prompt_mean", "v05/rounds", "loss")


def common(task: str, steps: int, out: str) -> list[str]:
    return ["--model_name_or_path", "smollm2", "--dataset_name", task, "--dataset_num_prompts", "64",
            "--reward_funcs", "accuracy", "format", "--reward_weights", "0.75", "0.25", "--use_cpu", "--bf16",
            "false", "--gradient_checkpointing", "false", "--use_peft", "--lora_target_modules", "q_proj", "v_proj",
            "--max_completion_length", "48", "--per_device_train_batch_size", "8", "--num_generations", "4",
            "--learning_rate", "5e-4", "--max_steps", str(steps), "--logging_steps", "1", "--save_strategy", "no",
            "--report_to", "none", "--disable_tqdm", "true", "--seed", "0", "--output_dir", out]


def run(script: str, task: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--v05_extra_rollout_budget", "0.5"] if script == "v05_grpo" else []
        cmd = [sys.executable, os.path.join(ROOT, "examples", "scripts", f"{script}.py"),
               *common(task, steps, tmp), *extra]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            return {"script": script, "task": task, "rc": proc.returncode, "stderr_tail": proc.stderr[-1500:]}
        with open(os.path.join(tmp, "trainer_state.json")) as f:
            state = json.load(f)
    steps_logged = [{k: h[k] for k in KEYS if k in h} | {"step": h["step"]} for h in state["log_history"]
                    if "loss" in h]
    return {"script": script, "task": task, "rc": 0, "wall_s": round(wall, 1), "global_step": state["global_step"],
            "steps": steps_logged}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods_task", required=True)
    p.add_argument("--grpo_task", required=True)
    p.add_argument("--max_steps", type=int, default=4)
    p.add_argument("--out", default=OUT)
    a = p.parse_args(argv)
    runs = [run(script, task, a.max_steps) for task in (a.methods_task, a.grpo_task) for script in ("grpo", "v05_grpo")]
    for r in runs:
        tail = r["steps"][-1] if r.get("steps") else r
        print(f"{r['script']:9s} {r['task']:45s} rc {r['rc']} steps {r.get('global_step')} wall {r.get('wall_s')}s "
              f"last: {tail}")
    with open(os.path.join(a.out, "smoke.json"), "w") as f:
        json.dump({"methods_task": a.methods_task, "grpo_task": a.grpo_task, "max_steps": a.max_steps, "runs": runs},
                  f, indent=1)
    return 0 if all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

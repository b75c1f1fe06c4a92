"""Keyed training steps with and without ``shared_prefix_rollouts``; every rank saves its rollout log and parameters.

Launch::

    torchrun --standalone --nproc_per_node 2 tests/scripts/shared_prefix_two_rank.py OUT_DIR [grpo|dapo|v05]
    python tests/scripts/shared_prefix_two_rank.py OUT_DIR grpo      # one process

Used by ``tests/test_shared_prefix_trainer.py``: the completions must be byte-identical with and without sharing.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def spread_reward(prompts, completions, **kwargs):
    return [float(len(c) % 3) / 2.0 for c in completions]


def run(out_dir: str, trainer: str, shared: bool) -> None:
    import torch
    from accelerate import PartialState

    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset

    torch.set_num_threads(1)
    state = PartialState(cpu=True)
    world, rank = state.num_processes, state.process_index
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0)
    ds = make_dataset("addition", 32, seed=0)
    run_dir = os.path.join(out_dir, f"{trainer}_w{world}_{'shared' if shared else 'plain'}")
    common = dict(output_dir=run_dir, max_steps=2, max_completion_length=6, learning_rate=1e-2, beta=0.0,
                  use_cpu=True, bf16=False, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
                  seed=0, temperature=0.7, keyed_sampling=True, shared_prefix_rollouts=shared)
    if trainer == "v05":
        from trl_ext import V05GRPOConfig, V05GRPOTrainer

        args = V05GRPOConfig(per_device_train_batch_size=8 // world, v05_value_prior="constant", **common)
        tr = V05GRPOTrainer(model=model, reward_funcs=[spread_reward], args=args, train_dataset=ds,
                            processing_class=tok)
    else:
        from trl_ext import ExtGRPOConfig, GRPOTrainer

        args = ExtGRPOConfig(per_device_train_batch_size=8 // world, num_generations=4,
                             dynamic_sampling=trainer == "dapo", **common)
        tr = GRPOTrainer(model=model, reward_funcs=[spread_reward], args=args, train_dataset=ds, processing_class=tok)
    tr.train()
    with open(tr.keyed_sampler.log_path(), encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    logs = [h for h in tr.state.log_history if "ext/generated_tokens" in h]
    torch.save({"rollouts": [(r["step"], r["key"], r["sample_index"], r["completion_ids"]) for r in recs],
                "params": [p.detach().clone() for p in tr.model.parameters()],
                "logs": logs},
               os.path.join(out_dir, f"{trainer}_w{world}_{'shared' if shared else 'plain'}_rank{rank}.pt"))


def main() -> int:
    out_dir = sys.argv[1]
    trainers = sys.argv[2].split(",") if len(sys.argv) > 2 else ["grpo"]
    os.makedirs(out_dir, exist_ok=True)
    for t in trainers:
        for shared in (False, True):
            run(out_dir, t, shared)
    return 0


if __name__ == "__main__":
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))

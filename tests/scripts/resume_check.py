"""Resume bit-identity: 4 uninterrupted steps vs 2 steps, a checkpoint, and a resumed run to step 4.

Launch (one process, or two CPU ranks)::

    python tests/scripts/resume_check.py OUT_DIR grpo,dapo,basis,pair,v05
    torchrun --standalone --nproc_per_node 2 tests/scripts/resume_check.py OUT_DIR grpo,basis,pair

For each trainer every rank writes ``OUT_DIR/{trainer}_world{P}_rank{r}.pt`` with the final parameters of both runs
and the trl_ext counters. Used by ``tests/test_fault_injection.py``. Sampling is real (temperature 1, torch RNG
restored from the checkpoint by Trainer), so bit-identity needs every learned or buffered state to be saved.
"""

from __future__ import annotations

import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def spread_reward(prompts, completions, **kwargs):
    """Graded reward with spread inside groups (so updates are non-zero)."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else c[-1]["content"]
        out.append((zlib.crc32(text.encode()) % 5) / 4.0)
    return out


def build(trainer: str, out_dir: str, world: int, max_steps: int):
    import torch

    from trl_ext.priors.table_format import ValueTable, ValueTableRow
    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset

    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0)
    ds = make_dataset("addition", 64, seed=0)
    common = dict(output_dir=out_dir, max_steps=max_steps, max_completion_length=4, learning_rate=1e-2, lr_scheduler_type="constant", beta=0.0,
                  use_cpu=True, bf16=False, logging_steps=1, save_strategy="steps", save_steps=2, report_to="none",
                  disable_tqdm=True, seed=0, temperature=1.0, dataloader_num_workers=0)
    if trainer in ("grpo", "dapo"):
        from trl_ext import ExtGRPOConfig, GRPOTrainer

        args = ExtGRPOConfig(per_device_train_batch_size=8 // world, num_generations=4,
                             dynamic_sampling=trainer == "dapo", **common)
        return GRPOTrainer(model=model, reward_funcs=[spread_reward], args=args, train_dataset=ds,
                           processing_class=tok)
    if trainer == "basis":
        from trl_ext import BASISConfig, BASISTrainer

        rows = [ValueTableRow.from_rewards(p, [1.0] * (1 + zlib.crc32(p.encode()) % 6) + [0.0] * 2, (0.0, 1.0))
                for p in ds["prompt"]]
        table = ValueTable(rows, {"reward_funcs": ["spread_reward"], "model": None})
        args = BASISConfig(per_device_train_batch_size=8 // world, num_generations=1, **common)
        return BASISTrainer(model=model, reward_funcs=[spread_reward], args=args, train_dataset=ds,
                            processing_class=tok, value_table=table)
    if trainer == "v05":
        from trl_ext import V05GRPOConfig, V05GRPOTrainer

        # default prior (embedding in-context copy of the starting policy), default OSLA budget
        args = V05GRPOConfig(per_device_train_batch_size=8 // world, **common)
        return V05GRPOTrainer(model=model, reward_funcs=[spread_reward], args=args, train_dataset=ds,
                              processing_class=tok)
    if trainer == "pair":
        from trl_ext import PAIRConfig, PAIRTrainer

        args = PAIRConfig(per_device_train_batch_size=16 // world, num_generations=8, pair_prefix_tokens=2,
                          pair_head_min_labels=8, pair_head_fit_steps=5, **common)
        return PAIRTrainer(model=model, reward_funcs=[spread_reward], args=args, train_dataset=ds,
                           processing_class=tok)
    raise ValueError(trainer)


def run(trainer: str, out_dir: str) -> None:
    import torch
    from accelerate import PartialState

    state = PartialState(cpu=True)
    world, rank = state.num_processes, state.process_index
    full_dir = os.path.join(out_dir, f"{trainer}_w{world}_full")
    tr = build(trainer, full_dir, world, 4)
    tr.train()
    full = [p.detach().clone() for p in tr.model.parameters()]
    full_state = tr.ext_state_dict()
    part_dir = os.path.join(out_dir, f"{trainer}_w{world}_part")
    tr = build(trainer, part_dir, world, 2)
    tr.train()
    tr = build(trainer, part_dir, world, 4)
    tr.train(resume_from_checkpoint=True)
    resumed = [p.detach().clone() for p in tr.model.parameters()]
    torch.save({"full": full, "resumed": resumed, "full_state": full_state, "resumed_state": tr.ext_state_dict(),
                "steps": tr.state.global_step},
               os.path.join(out_dir, f"{trainer}_world{world}_rank{rank}.pt"))


def main() -> int:
    out_dir, trainers = sys.argv[1], sys.argv[2].split(",")
    os.makedirs(out_dir, exist_ok=True)
    for t in trainers:
        run(t, out_dir)
    return 0


if __name__ == "__main__":
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))

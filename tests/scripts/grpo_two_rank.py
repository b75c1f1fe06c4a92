"""A few plain-TRL GRPO steps on an untrained tiny model, meant to run under
``torchrun --standalone --nproc_per_node 2 tests/scripts/grpo_two_rank.py OUT_DIR [MAX_STEPS]``.

Each rank writes ``OUT_DIR/rank{r}.json`` with its rank, world size, the steps it completed, the number of
distinct prompts it saw and a checksum of its final weights (DDP must keep the replicas identical).
Used by ``tests/test_multiprocess_grpo.py``; run with ``ACCELERATE_DEBUG_MODE=1`` so unequal-size gathers raise.
"""

import json
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")


def main() -> int:
    out_dir = sys.argv[1]
    max_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    import torch

    torch.set_num_threads(1)
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_ext.testbed import get_reward_funcs, make_dataset, save_tiny_model

    state = PartialState(cpu=True)  # without cpu=True a CPU torchrun rank believes it is alone (rank 0 of 1)
    model_dir = os.path.join(out_dir, "tiny")
    with state.main_process_first():
        if state.is_main_process:
            save_tiny_model(model_dir, seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    seen: set[str] = set()

    def counting_reward(prompts, completions, **kw):
        # an untrained model never answers correctly: add a dense term (share of digit characters) so the
        # groups have reward spread, the gradient is non-zero and DDP really has something to synchronise
        seen.update(prompts)
        exact = get_reward_funcs("addition")[0](prompts, completions, **kw)
        return [e + sum(ch.isdigit() for ch in c) / max(len(c), 1) for e, c in zip(exact, completions)]

    config = GRPOConfig(
        output_dir=os.path.join(out_dir, "run"),
        max_steps=max_steps,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=4,
        learning_rate=1e-3,
        beta=0.0,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[counting_reward], args=config,
                          train_dataset=make_dataset("addition", 64, seed=0), processing_class=tok)
    initial = float(sum(p.detach().double().sum() for p in model.parameters()))
    trainer.train()
    trainer.save_state()
    checksum = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
    record = {"rank": state.process_index, "world_size": state.num_processes, "steps": trainer.state.global_step,
              "n_prompts_seen": len(seen), "weight_checksum": checksum, "initial_checksum": initial,
              "distributed_type": str(trainer.accelerator.distributed_type)}
    with open(os.path.join(out_dir, f"rank{state.process_index}.json"), "w") as f:
        json.dump(record, f)
    return 0


if __name__ == "__main__":
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))

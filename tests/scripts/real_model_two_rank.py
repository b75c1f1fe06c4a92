"""Real-model (SmolLM2-135M-Instruct) trainers with LoRA on conversational prompts; also the two-rank launcher.

``build_trainer(kind, ...)`` is shared with ``tests/test_real_model.py``. Run on two CPU ranks as::

    torchrun --standalone --nproc_per_node 2 tests/scripts/real_model_two_rank.py OUT_DIR MODEL_DIR [KIND]

Each rank trains ``KIND`` (default ``grpo``) for 2 steps with ``save_steps=1``, saves the adapter, then builds a new
trainer with ``max_steps=3`` and resumes from the last checkpoint. It writes ``OUT_DIR/rank{r}.json`` with its rank,
world size, steps, the prompts it scored, and checksums of its LoRA weights after step 2 and after the resumed
step 3 (DDP must keep the replicas identical).
"""

from __future__ import annotations

import functools
import json
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

TASK = "sum3"
KINDS = ("grpo", "dapo", "v05", "basis", "pair")
MAX_COMPLETION_LENGTH = 48
#: 0.75 x accuracy + 0.25 x format: rewards stay in [0, 1] (V0.5's and the value table's declared range) and groups
#: get reward spread from the format term too.
REWARD_WEIGHTS = [0.75, 0.25]


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def reward_funcs():
    from trl_ext.realmodel import get_real_reward_funcs

    return get_real_reward_funcs(TASK, with_format=True)  # accuracy + format: reward spread inside groups


def train_dataset(n: int = 4):
    from trl_ext.realmodel import make_real_dataset

    return make_real_dataset(TASK, n, seed=0, split="train")


def build_trainer(kind: str, model_dir: str, out_dir: str, *, max_steps: int, world: int = 1, dataset=None,
                  value_table: str | None = None, rewards=None, overrides: dict | None = None):
    """A trainer of ``kind`` on the real model with LoRA (r 8, q_proj/v_proj), 2 prompts per step (BASIS: 4 x 1);
    ``overrides``: config fields set on top of the shared ones."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ds = dataset if dataset is not None else train_dataset()
    common = dict(output_dir=out_dir, max_steps=max_steps, max_completion_length=MAX_COMPLETION_LENGTH,
                  learning_rate=5e-4, lr_scheduler_type="constant", beta=0.0, use_cpu=True, bf16=False,
                  logging_steps=1, save_strategy="steps", save_steps=1, report_to="none", disable_tqdm=True, seed=0,
                  dataloader_num_workers=0, gradient_checkpointing=False,
                  reward_weights=REWARD_WEIGHTS)
    common.update(overrides or {})
    kw = dict(model=model, reward_funcs=rewards or reward_funcs(), train_dataset=ds, processing_class=tok,
              peft_config=lora_config())
    if kind in ("grpo", "dapo"):
        from trl_ext import ExtGRPOConfig, GRPOTrainer

        extra = dict(dynamic_sampling=True, dynamic_sampling_max_rounds=1, loss_type="dapo") if kind == "dapo" else {}
        args = ExtGRPOConfig(per_device_train_batch_size=8 // world, num_generations=4, **extra, **common)
        return GRPOTrainer(args=args, **kw)
    if kind == "v05":
        from trl_ext import V05GRPOConfig, V05GRPOTrainer

        # default prior (embedding in-context on the LoRA policy's base weights); a smaller OSLA budget keeps the
        # extra rollouts per step at 4 of TRL's 8
        args = V05GRPOConfig(per_device_train_batch_size=8 // world, num_generations=4,
                             v05_extra_rollout_budget=0.5, **common)
        return V05GRPOTrainer(args=args, **kw)
    if kind == "basis":
        from trl_ext import BASISConfig, BASISTrainer

        if value_table is None:
            raise ValueError("basis needs a value table")
        args = BASISConfig(per_device_train_batch_size=4 // world, num_generations=1, **common)
        return BASISTrainer(args=args, value_table=value_table, **kw)
    if kind == "pair":
        from trl_ext import PAIRConfig, PAIRTrainer

        args = PAIRConfig(per_device_train_batch_size=8 // world, num_generations=4, pair_prefix_tokens=6,
                          pair_head_min_labels=4, pair_head_fit_steps=5, **common)
        return PAIRTrainer(args=args, **kw)
    raise ValueError(f"unknown trainer kind {kind!r}; one of {KINDS}")


def lora_state(model) -> dict:
    """The LoRA tensors of a (PEFT) model, detached, keyed without the adapter name."""
    return {k.replace(".default", ""): v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def checksum(state: dict) -> float:
    return float(sum(v.double().abs().sum() for v in state.values()))


def main() -> int:
    out_dir, model_dir = sys.argv[1], sys.argv[2]
    kind = sys.argv[3] if len(sys.argv) > 3 else "grpo"
    from accelerate import PartialState

    state = PartialState(cpu=True)  # without cpu=True a CPU torchrun rank believes it is alone (rank 0 of 1)
    world = state.num_processes
    seen: set[str] = set()
    run_dir = os.path.join(out_dir, "run")

    def counting(fn):
        @functools.wraps(fn)
        def wrapped(prompts, completions, **kw):
            seen.update(json.dumps(p) for p in prompts)
            return fn(prompts=prompts, completions=completions, **kw)

        return wrapped

    rewards = [counting(f) for f in reward_funcs()]

    tr = build_trainer(kind, model_dir, run_dir, max_steps=2, world=world, rewards=rewards)
    tr.train()
    after2 = lora_state(tr.model)
    tr.save_model(os.path.join(out_dir, "adapter"))
    steps2 = tr.state.global_step
    del tr
    tr = build_trainer(kind, model_dir, run_dir, max_steps=3, world=world, rewards=rewards)
    tr.train(resume_from_checkpoint=True)
    record = {"rank": state.process_index, "world_size": world, "steps_first": steps2,
              "steps_resumed": tr.state.global_step, "n_prompts_seen": len(seen),
              "checksum_after2": checksum(after2), "checksum_after3": checksum(lora_state(tr.model)),
              "distributed_type": str(tr.accelerator.distributed_type)}
    with open(os.path.join(out_dir, f"rank{state.process_index}.json"), "w") as f:
        json.dump(record, f)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))

"""A few BASISTrainer steps (G = 1) on an untrained tiny model, for the gathered-baseline test.

Run under ``torchrun --standalone --nproc_per_node 2 tests/scripts/basis_two_rank.py OUT_DIR [MAX_STEPS]`` (with
``ACCELERATE_DEBUG_MODE=1``) or as a single process with ``python tests/scripts/basis_two_rank.py OUT_DIR``. The
global generation batch is 8 prompts in both cases (``per_device_train_batch_size = 8 / world size``).

The reward depends on the prompt only (a hash), so the global rewards -- and therefore the BASIS baseline -- are a
function of which prompts the sampler put in the global batch, not of the (rank-seeded) completions. Each rank
writes ``OUT_DIR/rank{r}.json`` with, per training generation batch, the gathered prompts, rewards, beta and
advantages, plus a checksum of its final weights. Used by ``tests/test_basis_trainer.py``.
"""

import json
import os
import sys
import zlib

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

GLOBAL_BATCH = 8


def prompt_reward(prompts, completions, **kwargs) -> list[float]:
    """{0, 1} reward from a hash of the prompt (independent of the completion)."""
    return [float(zlib.crc32(("r" + str(p)).encode()) % 3 != 0) for p in prompts]


def reference_rewards(prompt, n: int = 8) -> list[float]:
    """Deterministic per-prompt 'reference samples' with pass rates in {0, 1/8, ..., 1} (0 and 1 included)."""
    k = zlib.crc32(("t" + str(prompt)).encode()) % (n + 1)
    return [1.0] * k + [0.0] * (n - k)


def build_table(prompts):
    from trl_ext.priors.table_format import ValueTable, ValueTableRow

    rows = [ValueTableRow.from_rewards(p, reference_rewards(p), (0.0, 1.0)) for p in prompts]
    return ValueTable(rows, {"reward_funcs": ["prompt_reward"], "model": None})


def main() -> int:
    out_dir = sys.argv[1]
    max_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    import torch

    torch.set_num_threads(1)
    from accelerate import PartialState

    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset
    from trl_ext.trainers.basis import BASISConfig, BASISTrainer

    state = PartialState(cpu=True)  # without cpu=True a CPU torchrun rank believes it is alone
    world = state.num_processes
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0)
    ds = make_dataset("addition", 32, seed=0)
    config = BASISConfig(
        output_dir=os.path.join(out_dir, f"run{world}"),
        max_steps=max_steps,
        per_device_train_batch_size=GLOBAL_BATCH // world,
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
    trainer = BASISTrainer(model=model, reward_funcs=[prompt_reward], args=config, train_dataset=ds,
                           processing_class=tok, value_table=build_table(ds["prompt"]))
    steps = []
    orig = trainer.compute_advantages

    def recording(batch):
        adv = orig(batch)
        if batch.mode == "train":
            steps.append({"prompts": list(batch.prompts), "rewards": batch.rewards.tolist(),
                          "advantages": adv.tolist(), "beta": trainer.rollout_strategy.beta_history[-1],
                          "num_processes": batch.num_processes})
        return adv

    trainer.compute_advantages = recording
    trainer.train()
    checksum = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
    record = {"rank": state.process_index, "world_size": world, "steps": steps, "weight_checksum": checksum,
              "global_step": trainer.state.global_step}
    with open(os.path.join(out_dir, f"world{world}_rank{state.process_index}.json"), "w") as f:
        json.dump(record, f)
    return 0


if __name__ == "__main__":
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))

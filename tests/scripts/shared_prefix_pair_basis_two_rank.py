"""PAIR and BASIS training steps with ``shared_prefix_rollouts``; every rank saves its logs, sampler calls and weights.

Launch::

    torchrun --standalone --nproc_per_node 2 tests/scripts/shared_prefix_pair_basis_two_rank.py OUT_DIR [pair,basis]
    python tests/scripts/shared_prefix_pair_basis_two_rank.py OUT_DIR basis      # one process

* ``pair``: :class:`~trl_ext.PAIRTrainer` (which refuses keyed sampling) with sharing on, two steps; the probes
  (``G`` per prompt) and the continuations both go through the shared-prefix sampler.
* ``basis``: :class:`~trl_ext.BASISTrainer` (one rollout per prompt) with ``keyed_sampling=True``, two steps, once
  without and once with sharing; its rollout log must be byte-identical between the two.

Every run writes ``OUT_DIR/{trainer}_w{world}_{plain|shared}_rank{r}.pt`` with the logged metrics, this rank's own
sampler counters per generation call (recorded before they are summed over ranks), the keyed rollout log (BASIS)
and the parameters. Used by ``tests/test_shared_prefix_trainer.py``.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

GLOBAL_BATCH = {"pair": 16, "basis": 8}


def spread_reward(prompts, completions, **kwargs):
    return [float(len(c) % 3) / 2.0 for c in completions]


def parity_reward(prompts, completions, **kwargs):  # {0, 1}: the value table holds binary statistics
    return [float(len(c) % 2) for c in completions]


def build(trainer: str, out_dir: str, world: int, shared: bool):
    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset

    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0)
    ds = make_dataset("addition", 32, seed=0)
    run_dir = os.path.join(out_dir, f"{trainer}_w{world}_{'shared' if shared else 'plain'}")
    common = dict(output_dir=run_dir, max_steps=2, per_device_train_batch_size=GLOBAL_BATCH[trainer] // world,
                  learning_rate=1e-2, beta=0.0, use_cpu=True, bf16=False, logging_steps=1, save_strategy="no",
                  report_to="none", disable_tqdm=True, seed=0, temperature=0.7, shared_prefix_rollouts=shared)
    if trainer == "pair":
        from trl_ext import PAIRConfig, PAIRTrainer

        args = PAIRConfig(num_generations=8, max_completion_length=6, pair_prefix_tokens=3, **common)
        return PAIRTrainer(model=model, reward_funcs=[spread_reward], args=args, train_dataset=ds,
                           processing_class=tok)
    from basis_two_rank import reference_rewards

    from trl_ext.priors.table_format import ValueTable, ValueTableRow
    from trl_ext.trainers.basis import BASISConfig, BASISTrainer

    table = ValueTable([ValueTableRow.from_rewards(p, reference_rewards(p), (0.0, 1.0)) for p in ds["prompt"]],
                       {"reward_funcs": ["parity_reward"], "model": None})  # fmt: skip
    args = BASISConfig(max_completion_length=6, keyed_sampling=True, **common)
    return BASISTrainer(model=model, reward_funcs=[parity_reward], args=args, train_dataset=ds, processing_class=tok,
                        value_table=table)


def run(out_dir: str, trainer: str, shared: bool) -> None:
    import torch
    from accelerate import PartialState

    torch.set_num_threads(1)
    state = PartialState(cpu=True)
    world, rank = state.num_processes, state.process_index
    tr = build(trainer, out_dir, world, shared)
    calls: list[dict] = []
    record = tr.ext_record_shared_prefix_stats

    def recording(stats):  # this rank's own counters, before the per-batch sum over ranks
        calls.append({k: stats[k] for k in ("rows", "computed_tokens", "independent_tokens", "generated_tokens")})
        record(stats)

    tr.ext_record_shared_prefix_stats = recording
    tr.train()
    rollouts = []
    if getattr(tr.args, "keyed_sampling", False):
        with open(tr.keyed_sampler.log_path(), encoding="utf-8") as f:
            recs = [json.loads(line) for line in f if line.strip()]
        rollouts = [(r["step"], r["key"], r["sample_index"], r["completion_ids"]) for r in recs]
    torch.save({"world": world, "rank": rank, "global_step": tr.state.global_step, "calls": calls,
                "rollouts": rollouts, "logs": [h for h in tr.state.log_history if "ext/generated_tokens" in h],
                "params": [p.detach().clone() for p in tr.model.parameters()]},
               os.path.join(out_dir, f"{trainer}_w{world}_{'shared' if shared else 'plain'}_rank{rank}.pt"))


def main() -> int:
    out_dir = sys.argv[1]
    trainers = sys.argv[2].split(",") if len(sys.argv) > 2 else ["pair", "basis"]
    os.makedirs(out_dir, exist_ok=True)
    for t in trainers:
        for shared in ((True,) if t == "pair" else (False, True)):
            run(out_dir, t, shared)
    return 0


if __name__ == "__main__":
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))

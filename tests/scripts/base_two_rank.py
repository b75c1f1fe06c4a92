"""Two-rank (or one-rank reference) run of the base trainer, used by ``tests/test_base_two_rank.py``.

Launch::

    ACCELERATE_DEBUG_MODE=1 torchrun --standalone --nproc_per_node 2 tests/scripts/base_two_rank.py --out DIR
    python tests/scripts/base_two_rank.py --out DIR_REF          # one process, same global batches

Two scenarios run one after the other, each one SGD step with greedy decoding and position-keyed rewards, so the
global generation batch is identical with 1 and 2 processes:

* ``fixed`` / ``fixed_dapo``: TRL's layout (4 prompts x G=4, signal-only ``grpo`` / ``dapo``).
* ``variable``: unique prompts, 2-4 rollouts per prompt returned by a strategy (a scripted rollout strategy)
  with strategy-computed rewards; ranks get different row counts and are padded (``grpo``, pad-corrected).
* ``rloo``, ``dr_grpo``, ``reinforce_pp``, ``james_stein``: estimators selected by ``advantage_estimator`` only (REINFORCE++ with
  ``num_generations=1``).
* ``dynamic_sampling``: DAPO dynamic sampling (zero-variance groups dropped and refilled).
* ``rank1_none`` (two processes only): rank 1's reward function returns None for all its rollouts.

Each rank writes ``{out}/{scenario}_rank{r}.pt`` with the gathered RolloutBatch fields (pad rows dropped), the
global advantages, this rank's local advantages and the parameter update.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

G = 4
ESTIMATOR_SCENARIOS = {"rloo": ("rloo", G), "dr_grpo": ("dr_grpo", G), "reinforce_pp": ("reinforce_pp", 1),
                       "james_stein": ("james_stein", G)}
ALL_SCENARIOS = ("fixed", "fixed_dapo", "variable", *ESTIMATOR_SCENARIOS, "dynamic_sampling", "rank1_none")


def pattern_reward(prompts, completions, trl_ext_row_idx=None, **kwargs):
    """Even rows: constant 1 (dead group); odd rows: 0,1,0,1 by local position (groups are rank-local)."""
    return [1.0 if ri % 2 == 0 else float(i % 2) for i, ri in enumerate(trl_ext_row_idx)]


def rank1_none_reward(prompts, completions, trl_ext_row_idx=None, **kwargs):
    """0, 1, 0, 1, ... on rank 0; None (unscorable) for every rollout scored on rank 1."""
    if int(os.environ.get("RANK", "0")) == 1:
        return [None] * len(completions)
    return [float(i % 2) for i in range(len(completions))]


def scripted_ids(tok, key: int, j: int) -> list[int]:
    """A deterministic stand-in completion for rollout ``j`` of the prompt with dataset row ``key``.

    Greedy decoding would give identical rollouts per prompt (zero policy gradient under any group baseline), and
    sampling differs per rank (TRL seeds each device differently), so the policy's sampler is replaced by a
    script: the trainer machinery under test (gathers, padding, advantages, loss) is unchanged.
    """
    digits = [tok.convert_tokens_to_ids(str((key * 7 + j * 3 + t) % 10)) for t in range(1 + (key + j) % 4)]
    return digits + [tok.eos_token_id]


def fixed_trainer_cls():
    from trl_ext.trainers.base import GRPOTrainer

    class ScriptedRollouts(GRPOTrainer):
        def ext_generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, *a, **kw):
            keys = [sum((i + 1) * t for i, t in enumerate(p)) % 1000 for p in prompt_ids]
            return [scripted_ids(self.processing_class, k, i % G) for i, k in enumerate(keys)], None

    return ScriptedRollouts


def variable_trainer_cls():
    from trl_ext.trainers.base import GRPOTrainer
    from trl_ext.trainers.rollouts import RolloutGroups, RolloutStrategy

    class ScriptedVariable(RolloutStrategy):
        name = "scripted_variable"

        def __init__(self, tokenizer):
            self.tokenizer = tokenizer

        def rollout(self, api, inputs):
            rows, gids, rpf = [], [], []
            for i, x in enumerate(inputs):
                k = 2 + x["trl_ext_row_idx"] % 3
                for j in range(k):
                    rows.append(x)
                    gids.append(i)
                    rpf.append([1.0 if x["trl_ext_row_idx"] % 2 == 0 else float(j % 2)])
            js = [j for i, x in enumerate(inputs) for j in range(2 + x["trl_ext_row_idx"] % 3)]
            c_ids = [scripted_ids(self.tokenizer, x["trl_ext_row_idx"], j) for x, j in zip(rows, js)]
            return RolloutGroups(rows=rows, completion_ids=c_ids, group_ids=gids, rewards_per_func=torch.tensor(rpf))

    class VariableRollouts(GRPOTrainer):
        unique_prompt_sampler = True

        def create_rollout_strategy(self):
            return ScriptedVariable(self.processing_class)

    return VariableRollouts


def run(scenario: str, out_dir: str, world: int) -> None:
    from base_helpers import make_config, tiny_dataset, tiny_model_and_tokenizer

    torch.set_num_threads(1)
    model, tok = tiny_model_and_tokenizer(0)
    common = dict(optim="sgd", learning_rate=0.1, max_grad_norm=0.0, lr_scheduler_type="constant", max_steps=1,
                  max_completion_length=5)
    if scenario in ("fixed", "fixed_dapo"):
        cls = fixed_trainer_cls()
        args = make_config(os.path.join(out_dir, scenario), per_device_train_batch_size=4 * G // world,
                           num_generations=G, signal_only_denominator=True,
                           loss_type="dapo" if scenario == "fixed_dapo" else "grpo", **common)
    elif scenario in ESTIMATOR_SCENARIOS:
        # estimators selected by configuration only (TRL's fixed layout, or one rollout per prompt)
        cls = fixed_trainer_cls()
        est, g = ESTIMATOR_SCENARIOS[scenario]
        args = make_config(os.path.join(out_dir, scenario), per_device_train_batch_size=4 * G // world,
                           num_generations=g, advantage_estimator=est,
                           loss_type="dr_grpo" if est == "dr_grpo" else "grpo", **common)
    elif scenario == "dynamic_sampling":
        # DAPO dynamic sampling: zero-variance groups are dropped and refilled from the dataset; ranks end up with
        # different numbers of kept groups (padded)
        cls = fixed_trainer_cls()
        args = make_config(os.path.join(out_dir, scenario), per_device_train_batch_size=4 * G // world,
                           num_generations=G, dynamic_sampling=True, dynamic_sampling_max_rounds=2,
                           loss_type="grpo", **common)
    elif scenario == "rank1_none":
        # only one rank's reward function returns None: the unscorable rows are counted over both ranks
        cls = fixed_trainer_cls()
        args = make_config(os.path.join(out_dir, scenario), per_device_train_batch_size=4 * G // world,
                           num_generations=G, loss_type="grpo", **common)
    else:
        cls = variable_trainer_cls()
        args = make_config(os.path.join(out_dir, scenario), per_device_train_batch_size=8 // world,
                           num_generations=2, loss_type="grpo", **common)
    reward = rank1_none_reward if scenario == "rank1_none" else pattern_reward
    tr = cls(model=model, reward_funcs=[reward], args=args, train_dataset=tiny_dataset(16), processing_class=tok)
    locals_seen = []
    orig = tr._ext_finalize

    def spy(out, *args, **kwargs):
        res = orig(out, *args, **kwargs)
        locals_seen.append(res["advantages"].detach().cpu().clone())
        return res

    tr._ext_finalize = spy
    before = torch.cat([p.detach().reshape(-1).clone() for p in tr.model.parameters()])
    tr.train()
    after = torch.cat([p.detach().reshape(-1) for p in tr.model.parameters()])
    b = tr.last_rollout_batch
    real = ~b.is_pad
    rank = tr.accelerator.process_index
    torch.save(
        {
            "world": tr.accelerator.num_processes,
            "rewards": b.rewards[real],
            "row_idx": b.row_idx[real],
            "group_ids": b.group_ids[real],
            "prompts": [p for p, k in zip(b.prompts, real.tolist()) if k],
            "completion_lengths": b.completion_lengths[real],
            "advantages": tr.last_advantages[real],
            "num_rows": b.num_rows,
            "num_pad": int(b.is_pad.sum()),
            "local_advantages": locals_seen[-1],
            "local_slice": (b.local_slice().start, b.local_slice().stop),
            "all_advantages": tr.last_advantages,
            "delta": after - before,
            "log": tr.state.log_history[0],
        },
        os.path.join(out_dir, f"{scenario}_rank{rank}.pt"),
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenarios", default=",".join(ALL_SCENARIOS))
    a = parser.parse_args()
    os.makedirs(a.out, exist_ok=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for scenario in a.scenarios.split(","):
        run(scenario, a.out, world)
    return 0


if __name__ == "__main__":
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))

"""Train one step with the side-input worked example of ``docs/architecture.md`` (one process or under torchrun).

Used by ``tests/test_side_inputs.py``. The code block under ``<!-- worked-example: side-input method -->`` is
executed as written (so the docs cannot drift from what is tested); then a ``trl_ext.GRPOTrainer`` trains one step
with ``advantage_estimator="prior_baseline"`` and ``rollout_strategy="column_prior"`` on the tiny testbed model, and
each rank writes the gathered batch (rewards, row indices, side inputs, advantages) to ``{out}/rank{r}.pt``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
MARKER = "<!-- worked-example: side-input method -->"


def worked_example_source() -> str:
    """The Python block right after the marker in docs/architecture.md."""
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index(MARKER)
    match = re.search(r"```python\n(.*?)```", text[start:], flags=re.S)
    return match.group(1)


def run_example(namespace: dict | None = None) -> dict:
    ns = {"__name__": "trl_ext_docs_worked_example"} if namespace is None else namespace
    exec(compile(worked_example_source(), "docs/architecture.md", "exec"), ns)
    return ns


def pass_rate_of(row_idx: int) -> float:
    return (row_idx % 5) / 4.0


def train(out_dir: str, world: int) -> None:
    from base_helpers import hash_reward, make_config, tiny_dataset, tiny_model_and_tokenizer

    from trl_ext import GRPOTrainer

    run_example()
    torch.set_num_threads(1)
    model, tok = tiny_model_and_tokenizer(0)
    ds = tiny_dataset(16)
    ds = ds.map(lambda _, i: {"pass_rate": pass_rate_of(i)}, with_indices=True)
    args = make_config(os.path.join(out_dir, "run"), advantage_estimator="prior_baseline",
                       rollout_strategy="column_prior", rollout_strategy_kwargs={"column": "pass_rate"},
                       num_generations=1, per_device_train_batch_size=8 // world, max_steps=1)
    tr = GRPOTrainer(model=model, reward_funcs=[hash_reward], args=args, train_dataset=ds, processing_class=tok)
    tr.train()
    b = tr.last_rollout_batch
    torch.save({"rewards": b.rewards, "row_idx": b.row_idx, "is_pad": b.is_pad, "prior": b.side_inputs["prior"],
                "advantages": tr.last_advantages, "world": tr.accelerator.num_processes,
                "strategy": tr.rollout_strategy.name},
               os.path.join(out_dir, f"rank{tr.accelerator.process_index}.pt"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    os.makedirs(a.out, exist_ok=True)
    train(a.out, int(os.environ.get("WORLD_SIZE", "1")))
    return 0


if __name__ == "__main__":
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))

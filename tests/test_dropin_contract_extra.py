"""Drop-in contract, method trainers: the shared base's bad-input and fault behaviour holds for V0.5, BASIS and PAIR.

``tests/test_fault_injection.py`` injects each fault into the base trainer (``trl_ext.GRPOTrainer``); the method
trainers reach the same checks through the base. This module pins that they do (``docs/bad_input.md``):

* a reward function returning strings: ``TypeError`` naming the function, at the first step;
* an ``inf`` reward: ``ValueError`` naming the function, the step not trained on (parameters unchanged);
* all-``None`` / all-NaN rewards: a warning at the batch, counted in ``ext/unscorable_rows``, no update;
* an empty dataset or one without a ``prompt`` column: an early ``ValueError``;
* a stale extension state inside a newer checkpoint: refused on resume (PAIR heads, V0.5 buffer, BASIS beta
  history would otherwise be rewound);
* two processes where only rank 1's reward returns ``None`` (GRPO and BASIS): both ranks log the global count,
  the run warns, rank 0's rows still train.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))

from base_helpers import hash_reward, tiny_dataset, tiny_model_and_tokenizer  # noqa: E402

from trl_ext.trainers.base import EXT_STATE_FILE  # noqa: E402

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
METHODS = ("v05", "basis", "pair")


def make_method(kind, out_dir, reward=None, ds=None, **over):
    """A small V0.5 (constant prior), BASIS (in-memory table) or PAIR trainer on the tiny testbed model."""
    from trl_ext import BASISConfig, BASISTrainer, PAIRConfig, PAIRTrainer, V05GRPOConfig, V05GRPOTrainer
    from trl_ext.priors import ConstantPrior
    from trl_ext.priors.table_format import ValueTable, ValueTableRow

    torch.set_num_threads(1)
    reward = reward or hash_reward
    model, tok = tiny_model_and_tokenizer(0)
    ds = tiny_dataset(32) if ds is None else ds
    common = dict(output_dir=str(out_dir), max_steps=1, max_completion_length=5, learning_rate=1e-2, use_cpu=True,
                  bf16=False, report_to="none", beta=0.0, logging_steps=1, save_strategy="no", seed=0,
                  disable_tqdm=True, dataloader_num_workers=0, lr_scheduler_type="constant")
    if kind == "v05":
        args = V05GRPOConfig(**{"per_device_train_batch_size": 8, "num_generations": 4, **common, **over})
        return V05GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok,
                              prior=ConstantPrior(0.5))
    if kind == "basis":
        prompts = tiny_dataset(32)["prompt"]
        table = ValueTable([ValueTableRow.from_rewards(p, [1.0, 0.0], (0.0, 1.0)) for p in prompts],
                           {"reward_funcs": [reward.__name__]})
        args = BASISConfig(**{"per_device_train_batch_size": 8, "num_generations": 1, **common, **over})
        return BASISTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok,
                            value_table=table)
    args = PAIRConfig(**{"per_device_train_batch_size": 16, "num_generations": 8, "pair_prefix_tokens": 2,
                         "pair_head_min_labels": 8, "pair_head_fit_steps": 5, **common, **over})
    return PAIRTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok)


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _unchanged(before, model):
    return all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


# --------------------------------------------------------------------------------------------------- bad rewards
@pytest.mark.parametrize("kind", METHODS)
def test_reward_returning_strings_names_the_function(tmp_path, kind):
    def stringly(prompts, completions, **kw):
        return ["1.0"] * len(completions)

    tr = make_method(kind, tmp_path, reward=stringly)
    with pytest.raises(TypeError, match="reward function 'stringly' returned '1.0'"):
        tr.train()


@pytest.mark.parametrize("kind", METHODS)
def test_infinite_reward_stops_before_any_update(tmp_path, kind):
    def explode(prompts, completions, **kw):
        return [math.inf] + [0.0] * (len(completions) - 1)

    tr = make_method(kind, tmp_path, reward=explode)
    before = _params(tr.model)
    with pytest.raises(ValueError, match="'explode' returned inf.*not trained on"):
        tr.train()
    assert _unchanged(before, tr.model)


@pytest.mark.parametrize("bad", [None, float("nan")], ids=["none", "nan"])
@pytest.mark.parametrize("kind", METHODS)
def test_all_unscorable_rewards_warn_count_and_do_not_update(tmp_path, kind, bad):
    def nothing(prompts, completions, **kw):
        return [bad] * len(completions)

    tr = make_method(kind, tmp_path, reward=nothing)
    before = _params(tr.model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr.train()
    assert any("Every one of the" in str(w.message) and "unscorable" in str(w.message) for w in caught)
    log = tr.state.log_history[0]
    n = log["ext/rollouts"]
    assert n > 0 and log["ext/unscorable_rows"] == n
    assert tr.ext_state_dict()["unscorable_rows_total"] == n
    assert log["grad_norm"] == 0 and _unchanged(before, tr.model)
    if kind == "v05":
        assert log["v05/unscorable_rollouts"] == n
        # V0.5's own warnings name both kinds of unscorable reward (here: all None, or all NaN)
        v05_msgs = [m for m in map(str, (w.message for w in caught)) if m.startswith("V0.5:") and "scorable" in m]
        assert v05_msgs and all("every reward function returned None or NaN" in m for m in v05_msgs), v05_msgs
    if kind == "pair":
        assert log["pair/nan_rewards"] == n


# --------------------------------------------------------------------------------------------------- bad datasets
@pytest.mark.parametrize("kind", METHODS)
def test_empty_dataset_fails_at_construction(tmp_path, kind):
    with pytest.raises(ValueError, match="train_dataset is empty"):
        make_method(kind, tmp_path, ds=tiny_dataset(8).select([]))


def test_dataset_without_prompt_column_fails_for_pair(tmp_path):
    with pytest.raises(ValueError, match="no 'prompt' column"):
        make_method("pair", tmp_path, ds=tiny_dataset(32).rename_column("prompt", "q"))


# --------------------------------------------------------------------------------------------------- stale state
@pytest.mark.parametrize("kind", METHODS)
def test_stale_ext_state_is_refused(tmp_path, kind):
    """checkpoint-2 holding checkpoint-1's extension state (V0.5 buffer, BASIS beta history, PAIR heads one step
    old) is refused on resume, not loaded."""
    make_method(kind, tmp_path, max_steps=2, save_strategy="steps", save_steps=1).train()
    shutil.copy(tmp_path / "checkpoint-1" / EXT_STATE_FILE, tmp_path / "checkpoint-2" / EXT_STATE_FILE)
    tr = make_method(kind, tmp_path, max_steps=3)
    with pytest.raises(ValueError, match="written at global step 1 but the checkpoint is at step 2"):
        tr.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


# --------------------------------------------------------------------------------------------------- two ranks
_RANK1_NONE = """
import json, os, sys, warnings
sys.path.insert(0, {scripts!r})
sys.path.insert(0, {tests!r})
import torch
from test_dropin_contract_extra import make_method


def rank1_none(prompts, completions, **kw):
    if int(os.environ["RANK"]) == 1:
        return [None] * len(completions)
    return [float(i % 2) for i in range(len(completions))]


def main():
    rank = int(os.environ["RANK"])
    out = {{}}
    for kind in ("grpo", "basis"):
        if kind == "grpo":
            from base_helpers import make_trainer
            tr = make_trainer({out!r} + "/grpo", reward_funcs=[rank1_none], max_steps=1, num_generations=4,
                              per_device_train_batch_size=4, learning_rate=1e-2)
        else:
            tr = make_method("basis", {out!r} + "/basis", reward=rank1_none, per_device_train_batch_size=4)
        before = torch.cat([p.detach().reshape(-1).clone() for p in tr.model.parameters()])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tr.train()
        after = torch.cat([p.detach().reshape(-1) for p in tr.model.parameters()])
        log = tr.state.log_history[0]
        out[kind] = dict(world=tr.accelerator.num_processes, unscorable=log["ext/unscorable_rows"],
                         rollouts=log["ext/rollouts"], total=tr.ext_state_dict()["unscorable_rows_total"],
                         warnings=[str(w.message) for w in caught if "unscorable" in str(w.message)],
                         delta_max=float((after - before).abs().max()), delta_sum=float((after - before).sum()))
    with open(os.path.join({out!r}, f"rank{{rank}}.json"), "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    from _dist_exit import run_and_shutdown
    sys.exit(run_and_shutdown(main))
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_one_rank_unscorable_is_counted_and_warned_on_two_processes(tmp_path):
    """GRPO and BASIS on two CPU ranks, rank 1's reward returns None for all its rollouts: both ranks log the global
    count (half the batch), the run warns about it, and rank 0's rows train (DDP keeps the replicas equal)."""
    script = tmp_path / "rank1_none.py"
    script.write_text(_RANK1_NONE.format(scripts=SCRIPTS, tests=os.path.join(ROOT, "tests"), out=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_DEBUG_MODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for kind in ("grpo", "basis"):
        r0, r1 = ranks[0][kind], ranks[1][kind]
        for r in (r0, r1):
            assert r["world"] == 2, kind
            assert r["rollouts"] == 8 and r["unscorable"] == 4 and r["total"] == 4, (kind, r)
            assert len(r["warnings"]) == 1 and "4 of 8 rollouts" in r["warnings"][0], (kind, r["warnings"])
        assert r0["delta_max"] > 0, kind  # rank 0's scorable rows still train
        assert r0["delta_max"] == r1["delta_max"] and r0["delta_sum"] == r1["delta_sum"], kind

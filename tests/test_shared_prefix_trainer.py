"""``shared_prefix_rollouts`` in the trainers: same tokens under keys, counted savings, refused where unsupported.

The sampler's own exactness (keyed byte-identity against ``keyed_generate``, the exact distribution without keys)
is tested in ``tests/test_shared_prefix.py``; here the option goes through the trainers' generation paths (TRL's
fixed groups, DAPO refills, V0.5's OSLA rounds) on one and two processes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))

from base_helpers import hash_reward, make_config, make_trainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "shared_prefix_two_rank.py")
TRAINERS = ("grpo", "dapo", "v05")


def _run(cmd, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env_extra or {})}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _check(out, world):
    for t in TRAINERS:
        for r in range(world):
            plain = torch.load(os.path.join(out, f"{t}_w{world}_plain_rank{r}.pt"), weights_only=False)
            shared = torch.load(os.path.join(out, f"{t}_w{world}_shared_rank{r}.pt"), weights_only=False)
            assert len(plain["rollouts"]) > 0
            assert plain["rollouts"] == shared["rollouts"], f"{t} rank {r}: completions differ"
            assert all(torch.equal(a, b) for a, b in zip(plain["params"], shared["params"])), t
            for lp, ls in zip(plain["logs"], shared["logs"]):
                assert lp["ext/generated_tokens"] == ls["ext/generated_tokens"]  # tokens generated are unchanged
                assert "ext/shared_prefix/saved_fraction" not in lp
                assert 0 < ls["ext/shared_prefix/saved_fraction"] < 1
                assert ls["ext/shared_prefix/computed_tokens"] < ls["ext/shared_prefix/independent_tokens"]


@pytest.mark.timeout(300)
def test_keyed_completions_byte_identical_with_and_without_sharing_one_process(tmp_path):
    proc = _run([sys.executable, SCRIPT, str(tmp_path), ",".join(TRAINERS)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    _check(str(tmp_path), 1)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_keyed_completions_byte_identical_with_and_without_sharing_two_processes(tmp_path):
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", SCRIPT,
                 str(tmp_path), ",".join(TRAINERS)], env_extra={"ACCELERATE_DEBUG_MODE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    _check(str(tmp_path), 2)


def test_unkeyed_sharing_trains_and_counts(tmp_path):
    tr = make_trainer(tmp_path, max_steps=2, shared_prefix_rollouts=True, reward_funcs=[hash_reward])
    tr.train()
    logs = [h for h in tr.state.log_history if "ext/generated_tokens" in h]
    assert len(logs) == 2
    for log in logs:
        assert log["ext/shared_prefix/computed_tokens"] <= log["ext/shared_prefix/independent_tokens"]
        assert log["ext/shared_prefix/max_branches"] >= 1


def test_refused_with_vllm_and_with_unsupported_sampling(tmp_path):
    from trl_ext.trainers.base import validate_ext_config

    cfg = make_config(tmp_path, shared_prefix_rollouts=True)
    cfg.use_vllm = True
    with pytest.raises(ValueError, match="transformers generation only"):
        validate_ext_config(cfg)
    with pytest.raises(ValueError):
        make_trainer(tmp_path, shared_prefix_rollouts=True, repetition_penalty=1.3)


def test_pair_probes_and_continuations_through_the_shared_sampler(tmp_path):
    from trl_ext import PAIRConfig, PAIRTrainer
    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset

    tok = build_tokenizer()
    args = PAIRConfig(output_dir=str(tmp_path), per_device_train_batch_size=16, num_generations=8,
                      max_completion_length=6, pair_prefix_tokens=3, max_steps=1, use_cpu=True, report_to="none",
                      save_strategy="no", shared_prefix_rollouts=True, disable_tqdm=True)
    tr = PAIRTrainer(model=build_tiny_model(tok, seed=0), reward_funcs=[hash_reward], args=args,
                     train_dataset=make_dataset("addition", 32, seed=0), processing_class=tok)
    tr.train()
    log = tr.state.log_history[0]
    # probes (G per prompt, shared) and continuations (distinct prefixes) both went through the sampler
    assert log["ext/shared_prefix/independent_tokens"] > log["ext/shared_prefix/computed_tokens"] > 0
    assert log["ext/generated_tokens"] == log["pair/prefix_tokens"] + log["pair/realized_suffix_tokens"]

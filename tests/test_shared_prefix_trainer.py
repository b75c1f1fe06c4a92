"""``shared_prefix_rollouts`` in the trainers: same tokens under keys, counted savings, refused where unsupported.

The sampler's own exactness (keyed byte-identity against ``keyed_generate``, the exact distribution without keys)
is tested in ``tests/test_shared_prefix.py``; here the option goes through the trainers' generation paths (TRL's
fixed groups, DAPO refills, V0.5's OSLA rounds, PAIR's probes and continuations, BASIS's one rollout per prompt) on
one and two processes.
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
PAIR_BASIS_SCRIPT = os.path.join(ROOT, "tests", "scripts", "shared_prefix_pair_basis_two_rank.py")
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


# ------------------------------------------------------------------------------------------ BASIS and PAIR, 1 and 2 ranks
def _load(out, name):
    return torch.load(os.path.join(out, name), weights_only=False)


def _check_basis(out, world):
    """BASIS (G = 1) under keyed sampling: same tokens and weights with and without sharing; nothing to share."""
    for r in range(world):
        plain, shared = _load(out, f"basis_w{world}_plain_rank{r}.pt"), _load(out, f"basis_w{world}_shared_rank{r}.pt")
        assert plain["global_step"] == shared["global_step"] == 2
        assert len(shared["rollouts"]) == 16 // world and plain["calls"] == []
        assert plain["rollouts"] == shared["rollouts"], f"BASIS rank {r}: completions differ"
        assert all(torch.equal(a, b) for a, b in zip(plain["params"], shared["params"]))
        assert len(shared["logs"]) == 2 and len(shared["calls"]) == 2
        for lp, ls in zip(plain["logs"], shared["logs"]):
            assert lp["ext/generated_tokens"] == ls["ext/generated_tokens"]
            assert not any(k.startswith("ext/shared_prefix/") for k in lp)
            # one rollout per (distinct) prompt: every position serves one row, so sharing saves nothing
            assert ls["ext/shared_prefix/saved_fraction"] == 0.0 and ls["ext/shared_prefix/shared_fraction"] == 0.0
            assert ls["ext/shared_prefix/computed_tokens"] == ls["ext/shared_prefix/independent_tokens"] > 0
        assert all(c["computed_tokens"] == c["independent_tokens"] for c in shared["calls"])


def test_basis_keyed_sharing_trains_logs_and_is_byte_identical_one_process(tmp_path):
    """BASIS accepts the option (it inherits it from ExtGRPOConfig): it trains, logs ``ext/shared_prefix/*``, draws
    the same keyed tokens as without sharing, and saves nothing (``saved_fraction`` 0: one rollout per prompt)."""
    import shared_prefix_pair_basis_two_rank as script

    for shared in (False, True):
        script.run(str(tmp_path), "basis", shared)
    _check_basis(str(tmp_path), 1)


def _check_pair(out, world):
    ranks = [_load(out, f"pair_w{world}_shared_rank{r}.pt") for r in range(world)]
    assert sorted(d["rank"] for d in ranks) == list(range(world)) and all(d["world"] == world for d in ranks)
    for d in ranks:
        assert d["global_step"] == 2 and len(d["logs"]) == 2
        assert d["calls"], f"rank {d['rank']} never called the shared-prefix sampler"
        # every rank's probe calls (G = 8 rows of one prompt) shared positions; continuations share none
        assert any(c["computed_tokens"] < c["independent_tokens"] for c in d["calls"]), d["calls"]
        for log in d["logs"]:
            assert torch.isfinite(torch.tensor(log["loss"]))
            assert log["ext/generated_tokens"] == log["pair/prefix_tokens"] + log["pair/realized_suffix_tokens"]
            assert 0 < log["ext/shared_prefix/saved_fraction"] < 1
    # the logged counters are the sums over ranks of what each rank's sampler computed and generated
    logs = ranks[0]["logs"]
    for key, stat in (("ext/shared_prefix/computed_tokens", "computed_tokens"),
                      ("ext/shared_prefix/independent_tokens", "independent_tokens"),
                      ("ext/generated_tokens", "generated_tokens")):
        assert sum(h[key] for h in logs) == sum(c[stat] for d in ranks for c in d["calls"]), key
        assert all([h[key] for h in d["logs"]] == [h[key] for h in logs] for d in ranks)
    for d in ranks[1:]:  # DDP kept the replicas identical
        assert all(torch.equal(a, b) for a, b in zip(ranks[0]["params"], d["params"]))


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_pair_and_basis_with_sharing_on_two_processes(tmp_path):
    """PAIR trains with sharing on both ranks (probes and continuations through the sampler on each, counters summed
    over ranks, replicas identical); BASIS keyed is byte-identical with and without sharing on both ranks."""
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                 PAIR_BASIS_SCRIPT, str(tmp_path), "pair,basis"], env_extra={"ACCELERATE_DEBUG_MODE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    _check_pair(str(tmp_path), 2)
    _check_basis(str(tmp_path), 2)

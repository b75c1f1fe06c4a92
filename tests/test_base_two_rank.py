"""Two CPU ranks (torchrun, gloo, ``ACCELERATE_DEBUG_MODE=1``) against a one-process run on the same global batch.

``tests/scripts/base_two_rank.py`` runs two scenarios for one SGD step each (see its docstring): TRL's fixed
layout with signal-only ``grpo`` and ``dapo``, variable rollouts per prompt returned by a rollout strategy where the ranks
hold different row counts and get padded, the estimators selected by configuration (RLOO, Dr. GRPO, REINFORCE++
with one rollout per prompt) and DAPO dynamic sampling. Checked:

* the gathered ``RolloutBatch`` (rewards, dataset rows, groups, prompts, lengths) and the global advantages are
  identical on both ranks and equal to the one-process run (pad rows excluded);
* each rank's local advantages are its slice of the global ones;
* the parameter update after one optimizer step is the same with 1 and 2 processes (signal-only denominators
  and the pad-corrected sequence-level normalizer are world-size invariant).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "base_two_rank.py")

# ~20-25 s on an idle 2-core machine (one torchrun launch plus the one-process reference), so it stays in the default
# run: multi-process correctness is not optional.
pytestmark = [pytest.mark.multiprocess]
SCENARIOS = ("fixed", "fixed_dapo", "variable", "rloo", "dr_grpo", "reinforce_pp", "james_stein", "dynamic_sampling")


def _run(cmd, env_extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **env_extra}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    two = tmp_path_factory.mktemp("two")
    one = tmp_path_factory.mktemp("one")
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", SCRIPT,
          "--out", str(two)], {"ACCELERATE_DEBUG_MODE": "1"})
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import base_two_rank

    for scenario in SCENARIOS:  # the one-process reference runs in this process
        base_two_rank.run(scenario, str(one), world=1)

    def load(d, name):
        return torch.load(os.path.join(d, name), weights_only=False)

    out = {
        sc: (load(two, f"{sc}_rank0.pt"), load(two, f"{sc}_rank1.pt"), load(one, f"{sc}_rank0.pt"))
        for sc in SCENARIOS
    }
    out["rank1_none"] = (load(two, "rank1_none_rank0.pt"), load(two, "rank1_none_rank1.pt"), None)
    return out


KEYS = ("rewards", "row_idx", "group_ids", "completion_lengths", "advantages")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gathered_batch_identical_across_ranks_and_equal_to_one_process(results, scenario):
    r0, r1, ref = results[scenario]
    assert r0["world"] == r1["world"] == 2 and ref["world"] == 1
    for key in KEYS:
        assert torch.equal(r0[key], r1[key]), key
        torch.testing.assert_close(r0[key].float(), ref[key].float(), rtol=0, atol=1e-6, msg=key)
    assert r0["prompts"] == r1["prompts"] == ref["prompts"]
    assert (r0["advantages"] != 0).any()  # a live batch, not a vacuous comparison


def test_variable_scenario_pads_unequal_ranks(results):
    r0, r1, ref = results["variable"]
    assert ref["num_pad"] == 0 and r0["num_pad"] > 0  # the ranks held different row counts
    assert r0["num_rows"] % 2 == 0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_local_advantages_are_the_rank_slice(results, scenario):
    for r in results[scenario][:2]:
        start, stop = r["local_slice"]
        glob = r["all_advantages"][start:stop]
        # (the pad-corrected grpo normalizer is applied in the loss, not to the advantages)
        torch.testing.assert_close(r["local_advantages"], glob)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_parameter_update_is_world_size_invariant(results, scenario):
    r0, r1, ref = results[scenario]
    assert torch.equal(r0["delta"], r1["delta"])  # DDP keeps ranks in sync
    assert ref["delta"].abs().max() > 1e-4
    torch.testing.assert_close(r0["delta"], ref["delta"], rtol=1e-4, atol=1e-7)
    assert r0["log"]["ext/generated_tokens"] == ref["log"]["ext/generated_tokens"]
    assert r0["log"].get("gate/tied_share") == ref["log"].get("gate/tied_share")  # undefined for G = 1


@pytest.mark.parametrize("scenario", ["rloo", "dr_grpo", "reinforce_pp", "james_stein"])
def test_estimator_selected_by_name_is_the_one_used(results, scenario):
    """The trainer's advantages are the registered estimator's, on the gathered batch, on both world sizes."""
    import numpy as np

    from trl_ext.estimators import get_advantage_estimator

    for r in results[scenario]:
        ref = get_advantage_estimator(scenario)(r["rewards"].double().numpy(), r["group_ids"].numpy()).advantages
        np.testing.assert_allclose(r["advantages"].double().numpy(), ref, rtol=1e-5, atol=1e-6)
        assert np.abs(ref).max() > 0
    if scenario == "reinforce_pp":  # one rollout per prompt: every group is a singleton, 16 distinct prompts
        r0 = results[scenario][0]
        assert r0["group_ids"].unique().numel() == r0["group_ids"].numel() == 16
    if scenario == "james_stein":  # its shrinkage diagnostics reach the log, equal on 1 and 2 processes
        lams = [r["log"]["adv/js_lambda"] for r in results[scenario]]
        assert 0.0 <= lams[0] < 1.0 and lams[0] == pytest.approx(lams[1]) == pytest.approx(lams[2])


def test_dynamic_sampling_keeps_only_informative_groups(results):
    r0, r1, ref = results["dynamic_sampling"]
    # pattern_reward: even dataset rows are all-1 groups (no signal), odd rows alternate 0/1
    assert (r0["row_idx"] % 2 == 1).all() and r0["row_idx"].numel() > 0
    for r in (r0, ref):
        log = r["log"]
        assert log["dapo/filtered_groups"] >= 1
        assert log["dapo/kept_groups"] == r0["row_idx"].numel() // 4
        # the one counter counts the filtered groups' tokens too
        assert log["ext/generated_tokens"] > log["ext/trained_tokens"]
    for key in ("dapo/filtered_groups", "dapo/kept_groups", "dapo/rounds", "ext/generated_tokens"):
        assert r0["log"][key] == ref["log"][key], key


def test_one_rank_unscorable_is_counted_on_every_rank(results):
    """Rank 1's reward returns None for all its rollouts: half the global batch is unscorable. Both ranks log the
    global count (not a silent drop), and rank 0's rows still train."""
    r0, r1, _ = results["rank1_none"]
    for r in (r0, r1):
        assert r["log"]["ext/unscorable_rows"] == 8 and r["log"]["ext/rollouts"] == 16
    assert torch.equal(r0["delta"], r1["delta"]) and r0["delta"].abs().max() > 0

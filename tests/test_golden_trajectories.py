"""Golden trajectories: every trainer configuration, 3 real training steps, against the files in ``tests/golden/``.

``tests/scripts/golden_trajectories.py`` builds each scenario on the tiny testbed model with real sampling
(temperature 1, seed 0) and records per generation batch the completion token ids, advantages and rewards, per
logged step every metric, and checksums of the final trainable parameters. A refactor of ``trl_ext/trainers/`` must
leave all of it unchanged: token ids, rewards, metric keys and counts identical; advantages, losses and the other
metrics within ``rtol=1e-5, atol=1e-6``; parameter checksums within ``rtol=1e-5``. A failure names the scenario,
the world size and rank, the generation or logged step and the field.

The one-process scenarios run in this process (~1 s each after the first); the two-rank ones (``grpo``,
``dapo_dynamic``, ``v05_osla``, ``basis``, ``pair``) in one ``torchrun --standalone --nproc_per_node 2`` launch
(~20-25 s on an idle 2-core machine), marked ``multiprocess`` like the other two-rank tests and kept in the default
run. Re-record (only for a documented bug fix, see docs/architecture.md)::

    python tests/scripts/golden_trajectories.py --record
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))

import golden_trajectories as gt  # noqa: E402


def _platform() -> dict:
    import torch
    import transformers
    import trl

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "transformers": transformers.__version__, "trl": trl.__version__}


with open(os.path.join(os.path.dirname(__file__), "golden", "RECORDED_ON.json"), encoding="utf-8") as _f:
    RECORDED_ON = json.load(_f)

# Sampled token ids depend on the last bits of the logits, which depend on the CPU kernels (ISA) and the library
# builds: the goldens are compared only on the platforms listed in RECORDED_ON.json -- where they were recorded
# (AVX-512, transformers 5.24.0) and where every scenario, 1 and 2 ranks, was rerun and matched
# (`python tests/scripts/golden_trajectories.py` printed "all golden trajectories match"): AVX-512 with transformers
# 5.25.0 (what a fresh install resolved on 2026-12-04), and AVX2 (an AMD EPYC, the CI machine class) with transformers
# 5.25.0 on 2026-12-06: identical token ids, floats within the tolerance. Elsewhere they skip with this reason, and
# pytest's summary counts the skips.
pytestmark = pytest.mark.skipif(_platform() not in RECORDED_ON,
                                reason=f"goldens verified on {RECORDED_ON}, this is {_platform()}")


def _check(got: dict, scenario: str, world: int, rank: int) -> None:
    errs = gt.compare(got, gt.load_record(scenario, world, rank))
    assert not errs, (f"golden trajectory {scenario} (world {world}, rank {rank}) changed "
                      f"({len(errs)} differences; re-record only for a documented bug fix):\n" + "\n".join(errs[:40]))


@pytest.mark.parametrize("scenario", gt.SCENARIOS)
def test_single_process_trajectory_matches_golden(scenario, tmp_path):
    _check(gt.run_scenario(scenario, str(tmp_path)), scenario, 1, 0)


@pytest.fixture(scope="module")
def two_rank_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden_two_rank")
    proc = gt.launch_two_ranks(str(out), timeout=500)
    tail = "\n".join(ln for ln in proc.stderr.splitlines() if "Warning" not in ln)[-6000:]
    assert proc.returncode == 0, f"torchrun failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{tail}"
    return str(out)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("scenario", gt.TWO_RANK_SCENARIOS)
def test_two_rank_trajectory_matches_golden(two_rank_dir, scenario, rank):
    _check(gt.load_record(scenario, 2, rank, two_rank_dir), scenario, 2, rank)


def test_goldens_exercise_their_feature():
    """The committed files are not vacuous: each scenario's feature really acted in the recorded steps."""
    def logs(scenario, world=1, rank=0):
        return [e["values"] for e in gt.load_record(scenario, world, rank)["logs"]]

    for scenario in gt.SCENARIOS:
        rec = gt.load_record(scenario, 1, 0)
        assert len(rec["generations"]) == len(rec["logs"]) == rec["global_step"] == gt.MAX_STEPS, scenario
        assert any(a != 0 for g in rec["generations"] for a in g["advantages"]), scenario
    for world, rank in ((1, 0), (2, 0), (2, 1)):
        assert any(v["v05/extra_rollouts"] > 0 for v in logs("v05_osla", world, rank))  # OSLA added rollouts
        assert any(v["dapo/filtered_groups"] > 0 for v in logs("dapo_dynamic", world, rank))
    assert all(v["v05/extra_rollouts"] == 0 for v in logs("v05_fixed"))
    assert {v["ext/signal_row_frac"] for v in logs("signal_only")} & {0.0, 0.5}  # tied groups left the denominator
    assert any(v["tie_break/groups_opened"] > 0 for v in logs("tiebreak"))
    assert all(v["ext/rollouts"] == 8 for v in logs("reinforce_pp"))  # one rollout for each of 8 prompts
    lora = gt.load_record("lora", 1, 0)["checksums"]["trainable_numel"]
    assert lora < gt.load_record("grpo", 1, 0)["checksums"]["trainable_numel"] // 10  # adapters only
    assert "pair_heads_sum" in gt.load_record("pair", 1, 0)["checksums"]

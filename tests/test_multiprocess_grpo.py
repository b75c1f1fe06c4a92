"""Two-process CPU training: ``torchrun --standalone --nproc_per_node 2`` runs plain TRL GRPO for a few steps.

``accelerate launch --cpu --num_processes 2`` silently starts ONE process, so the test asserts that two distinct
ranks each reported ``world_size == 2``, took the same steps, and ended with identical weights (DDP sync).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "grpo_two_rank.py")


def _errors(stderr: str) -> str:
    """The traceback lines of a failed run (progress bars and deprecation warnings removed)."""
    keep = [ln for ln in stderr.splitlines() if "it/s]" not in ln and "FutureWarning" not in ln]
    return "\n".join(keep)[-8000:]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_two_rank_grpo_on_cpu(tmp_path):
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "ACCELERATE_DEBUG_MODE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    steps = 2
    proc = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", SCRIPT, str(tmp_path), str(steps)],
        env=env, capture_output=True, text=True, timeout=220,
    )
    assert proc.returncode == 0, f"torchrun failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{_errors(proc.stderr)}"
    records = []
    for r in range(2):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), f"rank {r} did not finish; stderr:\n{proc.stderr[-3000:]}"
        records.append(json.loads(path.read_text()))
    assert sorted(rec["rank"] for rec in records) == [0, 1]
    assert all(rec["world_size"] == 2 for rec in records)
    assert all(rec["steps"] == steps for rec in records)
    assert all("MULTI_CPU" in rec["distributed_type"] for rec in records), records
    # each rank scored its own 2 prompts x 4 generations per step
    assert all(rec["n_prompts_seen"] >= 2 for rec in records)
    # DDP keeps replicas identical: both ranks end with the same weights
    assert records[0]["weight_checksum"] == pytest.approx(records[1]["weight_checksum"], rel=0, abs=1e-9)
    # ... and training did move them (the dense reward term gives non-zero advantages)
    assert abs(records[0]["weight_checksum"] - records[0]["initial_checksum"]) > 1e-6
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert sum("loss" in h for h in state["log_history"]) == steps

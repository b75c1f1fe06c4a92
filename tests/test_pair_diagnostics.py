"""``benchmarks/pair_diagnostics.py`` runs end to end on the tiny model: the replayed population reaches the loss
(the script asserts every row is a sampled completion of its prompt), the PAIR heads stay frozen during a diagnostic
batch, and PAIR's design log and inclusion weights are read from the strategy."""

from __future__ import annotations

import json
import math

from bench_module import bench_script


def test_quick_run_on_the_tiny_model(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "diag.json"
    diag = bench_script("pair_diagnostics")
    assert diag.main(["--model", "tiny", "--populations", "1", "--noise_populations", "2", "--draws", "3",
                      "--history", "2", "--variants", "heads/default,spread/default", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["variants"]) == {"heads/default", "spread/default"}
    for v in result["variants"].values():
        weights = v["inverse_pair_weight_observed_edges"]
        assert weights and weights["p10"] >= 1.0 and math.isfinite(weights["p100"])  # 1 / (pi_a pi_b) with pi <= 1
        assert 0 < v["grad_norm_ratio_vs_grpo"] < 10
    assert result["setting"]["K"] == 4 and result["setting"]["G"] == 16


def test_heads_that_change_during_a_batch_are_reported(monkeypatch):
    diag = bench_script("pair_diagnostics")

    class Heads:
        def __init__(self):
            import torch

            self.success_head = torch.nn.Linear(2, 1)
            self.cost_head = torch.nn.Linear(2, 1)
            self.temperature = 1.0

    h = Heads()
    before = diag.head_snapshot(h)
    h.temperature = 2.0
    assert not bool((before == diag.head_snapshot(h)).all())

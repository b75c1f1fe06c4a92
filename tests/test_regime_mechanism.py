"""``benchmarks/regime_mechanism.py``: per-method summaries of what the runs decided, from their per-step traces."""

from __future__ import annotations

import gzip
import json
import os

import pytest
from bench_module import bench_script  # tests/ is on sys.path (pytest's rootdir insertion)


def _mod():
    return bench_script("regime_mechanism")


def test_summarize_metric_means_over_steps_then_seeds_and_skips_missing_values():
    m = _mod()
    traces = [[{"basis/beta": 1.0}, {"basis/beta": 3.0}, {"reward": 0.5}],  # run mean 2, first 1, last 3
              [{"basis/beta": 4.0}, {"basis/beta": float("nan")}]]  # run mean 4 (NaN skipped)
    s = m.summarize_metric(traces, "basis/beta")
    assert s == {"mean": 3.0, "seed_min": 2.0, "seed_max": 4.0, "first": 2.5, "last": 3.5, "runs": 2}
    assert m.summarize_metric(traces, "pair/head_auc") is None
    out = m.summarize_method("basis", traces)
    assert out["runs"] == 2 and out["steps"] == [3, 2] and set(out["metrics"]) == {"basis/beta"}


def _write_run(base, method, seed, lr, trace, status="ok", tune=False):
    rel = os.path.join("runs", "tune", method, f"lr{lr:g}", f"seed{seed}") if tune else os.path.join(
        "runs", method, f"seed{seed}")
    os.makedirs(os.path.join(base, rel))
    with gzip.open(os.path.join(base, rel, "trace.json.gz"), "wt", encoding="utf-8") as f:
        json.dump(trace, f)
    with open(os.path.join(base, rel, "result.json"), "w", encoding="utf-8") as f:
        json.dump({"status": status, "seed": seed, "learning_rate": lr, "trace": os.path.join(rel, "trace.json.gz")}, f)


def test_cli_reads_main_runs_and_tuning_runs_at_the_chosen_rate(tmp_path, capsys):
    m = _mod()
    base = str(tmp_path)
    step = {"gate/tied_share": 0.5, "ext/signal_row_frac": 0.5, "v05/rollouts_per_prompt_mean": 6.0}
    _write_run(base, "v05_osla", 0, 3e-4, [step, {**step, "v05/rollouts_per_prompt_mean": 8.0}])
    _write_run(base, "v05_osla", 1, 3e-4, [step])
    _write_run(base, "grpo_g8", 0, 3e-4, [{"gate/tied_share": 0.25}], status="failed")  # not summarized
    assert m.main(["--output_dir", base]) == 0
    doc = json.load(open(tmp_path / "mechanism.json"))
    assert set(doc["methods"]) == {"v05_osla"} and doc["methods"]["v05_osla"]["seeds"] == [0, 1]
    rpp = doc["methods"]["v05_osla"]["metrics"]["v05/rollouts_per_prompt_mean"]
    assert rpp["mean"] == pytest.approx(6.5) and (rpp["seed_min"], rpp["seed_max"]) == (6.0, 7.0)
    assert "v05/rollouts_per_prompt_mean" in capsys.readouterr().out
    _write_run(base, "basis", 0, 1e-3, [{"basis/beta": 0.5}], tune=True)
    _write_run(base, "basis", 0, 3e-4, [{"basis/beta": 9.0}], tune=True)  # not the chosen rate
    with open(tmp_path / "lr_choice.json", "w") as f:
        json.dump({"methods": {"basis": {"status": "ok", "chosen_lr": 1e-3}}}, f)
    assert m.main(["--output_dir", base, "--tuning"]) == 0
    tuned = json.load(open(tmp_path / "mechanism_tuning.json"))["methods"]
    assert tuned["basis"]["metrics"]["basis/beta"]["mean"] == 0.5
    assert m.main(["--output_dir", str(tmp_path / "empty")]) == 1


def test_pair_design_warmup_counts_steps_designed_before_the_heads_were_ready():
    m = _mod()
    # labels after each step: the design of step t sees step t-1's count (step 1 sees 0)
    run_a = [{"pair/head_labels": v} for v in (30.0, 60.0, 64.0, 90.0)]  # steps 1-3 in warm-up, step 4 headed
    run_b = [{"pair/head_labels": v} for v in (4.0, 13.0, 59.0)]  # never leaves warm-up
    w = m.pair_warmup([run_a, run_b], min_labels=64)
    assert w["first_headed_step"] == [4, None] and w["final_labels"] == [90.0, 59.0]
    assert w["warmup_share"] == pytest.approx((3 / 4 + 1.0) / 2)
    assert m.pair_warmup([[{"reward": 1.0}]]) is None
    assert m.pair_warmup([run_a], min_labels=30)["first_headed_step"] == [2]


def test_basis_baseline_mse_ratio_against_the_batch_mean_of_a_binary_reward(tmp_path):
    m = _mod()
    # 4 rows with rewards 1, 0, 0, 0: the batch mean 0.25 has MSE 0.25 * 0.75 = 0.1875 (exact enumeration)
    rewards = [1.0, 0.0, 0.0, 0.0]
    rbar = sum(rewards) / 4
    assert sum((r - rbar) ** 2 for r in rewards) / 4 == pytest.approx(rbar * (1 - rbar))
    baselines = [0.9, 0.1, 0.0, 0.2]  # a table that predicts the rewards better than the batch mean
    msa = sum((r - b) ** 2 for r, b in zip(rewards, baselines)) / 4
    loo = [rewards[i] - (sum(rewards) - rewards[i]) / 3 for i in range(4)]
    loo_mse = sum(a * a for a in loo) / 4  # the leave-one-out batch mean's error, enumerated
    trace = [{"reward": rbar, "basis/mean_sq_advantage": msa, "ext/rollouts": 4.0},
             {"reward": 0.0, "basis/mean_sq_advantage": 0.0},  # no variance to explain: no ratio
             {"reward": 0.5}]  # no baseline error logged: no ratio
    out = m.add_baseline_mse_ratio(trace)
    assert out[0]["basis/mse_vs_batch_mean"] == pytest.approx(msa / 0.1875) and out[0]["basis/mse_vs_batch_mean"] < 1
    assert out[0]["basis/mse_vs_loo_mean"] == pytest.approx(msa / loo_mse)
    assert "basis/mse_vs_batch_mean" not in out[1] and "basis/mse_vs_batch_mean" not in out[2]
    assert "basis/mse_vs_batch_mean" not in trace[0]  # the input trace is not modified
    _write_run(str(tmp_path), "basis", 0, 1e-3, trace)
    assert m.main(["--output_dir", str(tmp_path)]) == 0
    got = json.load(open(tmp_path / "mechanism.json"))["methods"]["basis"]["metrics"]["basis/mse_vs_batch_mean"]
    assert got["mean"] == pytest.approx(msa / 0.1875) and got["runs"] == 1

"""``benchmarks/regime_power.py``: the variance model behind the regime benchmark's design (P1-P4)."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUM3 = os.path.join(ROOT, "benchmarks", "results", "compare", "smollm2", "sum3")


def _mod():
    spec = importlib.util.spec_from_file_location("regime_power", os.path.join(ROOT, "benchmarks", "regime_power.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_auc_weights_reproduce_curve_auc():
    from trl_ext.stats.curves import curve_auc

    rp = _mod()
    tok = np.array([2400.0, 4100.0, 6300.0])
    w = rp.auc_weights(tok, 6000.0)
    acc = np.array([0.5, 0.7, 0.9])
    # linear in the checkpoints' accuracies, the start checkpoint's share excluded
    assert np.dot(w, acc) + curve_auc(tok, np.zeros(3), 6000.0, start_value=0.3) == pytest.approx(
        curve_auc(tok, acc, 6000.0, start_value=0.3))


def test_half_width_and_seed_count_follow_p4():
    rp = _mod()
    cal = {"var_train": 0.002, "var_eval": 0.0015, "n_questions": 64}
    hw = rp.half_width(cal, 5, 64, 1)
    assert hw == pytest.approx(rp.Z * np.sqrt(0.0035 / 5))
    assert rp.half_width(cal, 5, 256, 1) < hw and rp.half_width(cal, 5, None, 1) == pytest.approx(
        rp.Z * np.sqrt(0.002 / 5))
    s = rp.seeds_needed(cal, 0.05, 64, 1)
    assert rp.half_width(cal, s, 64, 1) <= 0.05 < rp.half_width(cal, s - 1, 64, 1)


def test_calibration_on_the_committed_benchmark_matches_its_intervals():
    """The model at the benchmark's own design predicts its committed two-level half-widths (mean) within 25 %."""
    rp = _mod()
    table = [f for f in os.listdir(os.path.join(SUM3, "value_table")) if f.endswith(".jsonl")][0]
    cal = rp.calibrate(os.path.join(SUM3, "runs.json"), "grpo_g8", os.path.join(SUM3, "value_table", table))
    assert 0 < cal["heterogeneity_h"] <= 1 and cal["var_train"] > 0 and 0 < cal["eval_share"] < 1
    curves = json.load(open(os.path.join(SUM3, "curves.json")))
    hws = [(r["auc_diff_ci_two_level"][1] - r["auc_diff_ci_two_level"][0]) / 2
           for m, r in curves["methods"].items() if m != "grpo_g8"]
    assert rp.half_width(cal, cal["n_seeds"], cal["n_questions"], 1) == pytest.approx(np.mean(hws), rel=0.25)
    committed = json.load(open(os.path.join(ROOT, "benchmarks", "results", "compare", "smollm2", "steps_matched_t07",
                                            "power_design.json")))
    # the committed design was written before the start checkpoint's share was counted: reproduced without it
    old = rp.calibrate(os.path.join(SUM3, "runs.json"), "grpo_g8", os.path.join(SUM3, "value_table", table),
                       start_term=False)
    assert committed["calibration"]["var_train"] == pytest.approx(old["var_train"])
    assert cal["var_train"] != pytest.approx(old["var_train"])  # the start's share differs between runs


@pytest.mark.parametrize("task", ["sum3", "steps_matched_t07"])
def test_calibration_auc_per_seed_is_eq_c1_of_every_run(task):
    """P1 with the start term is each run's AUC exactly as ``trl-ext curves`` computes it (eq. C1), for runs whose
    checkpoints fall at different token counts; without it the per-seed AUCs are off by a run-dependent amount."""
    rp = _mod()
    out = os.path.join(ROOT, "benchmarks", "results", "compare", "smollm2", task)
    curves = json.load(open(os.path.join(out, "curves.json")))
    kw = dict(budget=curves["budget"])
    cal = rp.calibrate(os.path.join(out, "runs.json"), "grpo_g8", None, **kw)
    old = rp.calibrate(os.path.join(out, "runs.json"), "grpo_g8", None, start_term=False, **kw)
    for m, rec in curves["methods"].items():
        mine = [cal["auc_per_seed"][m][s] for s in rec["seeds"]]
        assert mine == pytest.approx(rec["auc"], abs=1e-12)
        shift = np.array(rec["auc"]) - [old["auc_per_seed"][m][s] for s in rec["seeds"]]
        assert np.all(shift > 0)  # the start's share, a_0 (1 - sum w) > 0
    assert any(np.ptp(np.array(r["auc"]) - [old["auc_per_seed"][m][s] for s in r["seeds"]]) > 0.01
               for m, r in curves["methods"].items())  # and it is not one constant


def test_seed_components_and_the_unbalanced_design():
    """P5: variances over each method's seeds, covariance over the shared ones; the baseline seeds returned reach
    the target and one fewer does not; none suffice while the method's own term is over the target."""
    rp = _mod()
    auc = {"ref": {s: v for s, v in enumerate([0.3, 0.5, 0.4, 0.6, 0.2])},
           "a": {s: v for s, v in enumerate([0.42, 0.40, 0.44, 0.41, 0.43])},
           "b": {0: 0.1, 1: 0.9},  # two seeds: no covariance (fewer than 3 shared)
           "c": {0: 0.5}}  # one seed: left out
    comp = rp.seed_components(auc, "ref")
    assert set(comp) == {"ref", "a", "b"}
    assert comp["a"]["var"] == pytest.approx(np.var([0.42, 0.40, 0.44, 0.41, 0.43], ddof=1))
    assert comp["a"]["var_baseline"] == pytest.approx(0.025)
    assert comp["a"]["corr_baseline"] == pytest.approx(np.corrcoef(list(auc["a"].values()),
                                                                   list(auc["ref"].values()))[0, 1])
    assert comp["b"]["cov_baseline"] is None
    var_a, var_b = comp["a"]["var"], comp["a"]["var_baseline"]
    n = rp.baseline_seeds_needed(var_a, 5, var_b, 0.05)
    assert rp.unpaired_half_width(var_a, 5, var_b, n) <= 0.05 < rp.unpaired_half_width(var_a, 5, var_b, n - 1)
    assert rp.unpaired_half_width(var_a, 5, var_b, 5) == pytest.approx(rp.Z * np.sqrt(var_a / 5 + var_b / 5))
    assert rp.baseline_seeds_needed(0.02, 5, var_b, 0.05) is None  # 0.02 / 5 > (0.05 / 1.96)^2
    des = rp.unbalanced_designs(comp, "ref", 0.05)
    assert set(des) == {"a", "b"}
    assert des["a"]["baseline_seeds_for_target"] == {"5": n, "10": rp.baseline_seeds_needed(var_a, 10, var_b, 0.05)}
    cov = comp["a"]["cov_baseline"]
    assert des["a"]["paired_half_width"] == pytest.approx(rp.Z * np.sqrt((var_a + var_b - 2 * cov) / 5))
    assert "paired_half_width" not in des["b"]
    own = des["a"]["own_seeds_for_target_with_any_baseline"]
    assert rp.Z * np.sqrt(var_a / own) <= 0.05


def test_method_half_widths_scale_seeds_by_the_squared_ratio():
    rp = _mod()
    curves = {"methods": {
        "grpo_g8": {"seeds": [0, 1, 2], "auc_diff_ci_two_level": [0.0, 0.0]},  # the baseline: left out
        "a": {"seeds": [0, 1, 2], "auc_diff": 0.01, "auc_diff_ci_two_level": [-0.07, 0.09]},  # hw 0.08
        "b": {"seeds": [0, 1, 2, 3, 4], "auc_diff_ci_two_level": [-0.04, 0.05]},  # hw 0.045: met
        "c": {"seeds": [0], "auc_diff_ci_two_level": [float("nan"), float("nan")]},  # no interval: left out
        "d": {"seeds": [0, 1], "auc_diff_ci_two_level": [None, None]},  # no interval: left out
        "e": {"seeds": [0, 1], "auc_diff_ci_two_level": [-0.1, 0.1], "diff_two_level_paired_seeds": False},
    }}
    out = rp.method_half_widths(curves, "grpo_g8", 0.05)
    assert set(out) == {"a", "b", "e"}
    assert out["e"]["seeds_for_target"] is None and not out["e"]["paired_seeds"]  # unpaired: P5, not 1/sqrt(S)
    assert out["a"]["half_width"] == pytest.approx(0.08) and not out["a"]["meets_target"]
    assert out["a"]["seeds_for_target"] == 8  # ceil(3 * (0.08 / 0.05)^2) = ceil(7.68)
    # the count it returns reaches the target under 1/sqrt(S) scaling and one seed fewer does not
    s = out["a"]["seeds_for_target"]
    assert 0.08 * np.sqrt(3 / s) <= 0.05 < 0.08 * np.sqrt(3 / (s - 1))
    assert out["b"]["meets_target"] and out["b"]["seeds_for_target"] == 5


def test_training_variance_removes_the_evaluation_part_at_the_runs_own_samples():
    rp = _mod()
    # var(d) = var_T + var_E1 / M0: with 4 samples per question only a quarter of the per-sample noise is in var(d)
    assert rp.training_variance(0.0066, 0.0016, 1) == pytest.approx(0.0050)
    assert rp.training_variance(0.0066, 0.0016, 4) == pytest.approx(0.0062)
    assert rp.training_variance(0.001, 0.0016, 1) == 0.0  # clipped, never negative
    cal = {"var_train": rp.training_variance(0.0066, 0.0016, 4), "var_eval": 0.0016, "n_questions": 48}
    # the half-width at the runs' own design (S seeds, Q0, M0) reproduces var(d) / S
    assert rp.half_width(cal, 5, 48, 4) == pytest.approx(rp.Z * np.sqrt(0.0066 / 5))


def test_baseline_seed_rule_takes_the_largest_count_within_the_cap():
    """The amended seed rule: the baseline runs to the largest per-method count <= cap; counts over the cap or with
    no number sufficing are named not resolved; no extra seeds when every count is already met."""
    rp = _mod()

    def des(counts):
        return {m: {"baseline_seeds_for_target": {"10": c, "5": 99}} for m, c in counts.items()}

    rule = rp.baseline_seed_rule(des({"dapo": 15, "v05": 17, "g4": 23, "js": 49, "basis": None}), "grpo_g8", 10, 10)
    assert rule["baseline_seeds"] == 23 and rule["extra_seeds"] == list(range(10, 23))
    assert rule["extra_seeds_arg"] == "grpo_g8=10-22"
    assert rule["expected_resolved"] == ["dapo", "g4", "v05"] and rule["not_resolved"] == ["basis", "js"]
    # a count exactly at the cap is within it; one over is not
    assert rp.baseline_seed_rule(des({"a": 30, "b": 31}), "ref", 10, 10)["baseline_seeds"] == 30
    assert rp.baseline_seed_rule(des({"a": 30, "b": 31}), "ref", 10, 10)["not_resolved"] == ["b"]
    # counts below the baseline's own seeds: nothing to add, never fewer seeds than it has
    none = rp.baseline_seed_rule(des({"a": 4, "b": None}), "ref", 10, 10)
    assert none["baseline_seeds"] == 10 and none["extra_seeds"] == [] and none["extra_seeds_arg"] is None
    # the seeds of a method's design are the rule's; a missing design is an error, not a silent default
    assert rp.baseline_seed_rule(des({"a": 12}), "ref", 5, 10)["counts"] == {"a": 99}
    with pytest.raises(ValueError, match="no P5 design at 8 seeds"):
        rp.baseline_seed_rule(des({"a": 12}), "ref", 8, 10)


def test_seed_rule_in_the_cli_output_follows_the_p5_designs(tmp_path):
    """End to end on the committed five-seed regime runs: ``seed_rule`` in the output applies the rule to the
    ``unbalanced`` designs written beside it."""
    rp = _mod()
    out_dir = os.path.join(ROOT, "benchmarks", "results", "compare", "smollm2", "steps_matched_t07")
    dest = tmp_path / "power.json"
    assert rp.main(["--runs_json", os.path.join(out_dir, "runs.json"), "--baseline", "grpo_g8", "--output",
                    str(dest)]) == 0
    rec = json.load(open(dest))
    rule, unb = rec["seed_rule"], rec["unbalanced"]
    counts = {m: u["baseline_seeds_for_target"]["10"] for m, u in unb.items()}
    assert rule["counts"] == counts
    within = [c for c in counts.values() if c is not None and c <= 30]
    assert rule["baseline_seeds"] == max([rec["seed_components"]["grpo_g8"]["seeds"], *within])
    assert set(rule["expected_resolved"]) | set(rule["not_resolved"]) == set(unb)


def test_calibration_pairs_on_the_shared_seeds_when_the_baseline_has_extra_seeds(tmp_path):
    """With the amended rule's extra G = 8 seeds in runs.json, the paired variance model uses the seeds both sides
    have: the same pairs (and so the same variance split) as the runs.json without the extra seeds."""
    rp = _mod()
    out = os.path.join(ROOT, "benchmarks", "results", "compare", "smollm2", "steps_matched_t07")
    doc = json.load(open(os.path.join(out, "runs.json")))
    g8 = sorted(r["seed"] for r in doc["runs"] if r["method"] == "grpo_g8" and r["status"] == "ok")
    assert len(g8) > 10  # the committed report carries the extra seeds
    ten = dict(doc, runs=[r for r in doc["runs"] if not (r["method"] == "grpo_g8" and r["seed"] >= 10)])
    (tmp_path / "runs.json").write_text(json.dumps(ten))
    for name in ("runs", "start_eval.json"):  # outcome files are read relative to runs.json
        os.symlink(os.path.join(out, name), tmp_path / name)
    full = rp.calibrate(os.path.join(out, "runs.json"), "grpo_g8", None, budget=6000.0)
    cut = rp.calibrate(str(tmp_path / "runs.json"), "grpo_g8", None, budget=6000.0)
    assert full["n_seeds"] == cut["n_seeds"] == 10
    assert set(full["pairs"]) == set(cut["pairs"]) and len(full["pairs"]) == 7
    for m in full["pairs"]:
        assert full["pairs"][m]["d_per_seed"] == pytest.approx(cut["pairs"][m]["d_per_seed"], abs=1e-12)
    assert full["var_d_pooled"] == pytest.approx(cut["var_d_pooled"])
    assert len(full["auc_per_seed"]["grpo_g8"]) == len(g8)  # every baseline seed still in the seed components

"""Learning-curve statistics (``trl_ext.stats.curves``, ``trl-ext curves``) against exact values."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_ext.stats.curves import (
    compare_curves,
    curve_auc,
    curve_on_grid,
    tokens_to_target,
    two_level_auc_difference,
    two_level_curve_bootstrap,
)


def test_auc_of_constant_and_linear_curves_is_exact():
    assert curve_auc([100, 200], [0.5, 0.5], 200, start_value=0.5) == pytest.approx(0.5)
    # linear from 0.2 at 0 to 0.6 at 400: mean 0.4
    assert curve_auc([100, 200, 300, 400], [0.3, 0.4, 0.5, 0.6], 400, start_value=0.2) == pytest.approx(0.4)
    # a checkpoint beyond the budget is interpolated at the budget: a(300) = 0.5, mean over [0, 300] = 0.35
    assert curve_auc([100, 400], [0.3, 0.6], 300, start_value=0.2) == pytest.approx(0.35)


def test_auc_errors_say_what_is_missing():
    with pytest.raises(ValueError, match="pass start_value"):
        curve_auc([100, 200], [0.1, 0.2], 200)
    with pytest.raises(ValueError, match="before the budget"):
        curve_auc([100, 200], [0.1, 0.2], 300, start_value=0.0)
    with pytest.raises(ValueError, match="non-decreasing"):
        curve_auc([200, 100], [0.1, 0.2], 100, start_value=0.0)


def test_a_step_that_crosses_two_checkpoints_counts_once():
    """Two evaluations at one token count (one step crossed two nominal checkpoints): the later one is the
    curve's value there, and the statistics equal those of the curve without the repeat."""
    twice, once = ([100, 300, 300, 400], [0.5, 0.6, 0.7, 0.8]), ([100, 300, 400], [0.5, 0.7, 0.8])
    assert curve_auc(*twice, 400, start_value=0.4) == curve_auc(*once, 400, start_value=0.4)
    assert tokens_to_target(*twice, 0.65, start_value=0.4) == tokens_to_target(*once, 0.65, start_value=0.4)
    assert list(curve_on_grid(*twice, [300, 350])) == list(curve_on_grid(*once, [300, 350]))
    o = np.stack([np.array([[1, 0], [0, 0], [1, 1], [1, 1]], float)] * 2)  # (S=2, J=4, Q=2), a repeat at J=1,2
    res = two_level_curve_bootstrap(o, [100, 300, 300, 400], 400, start_outcomes=np.zeros(2), n_resamples=20)
    assert res["auc_mean"] == pytest.approx(curve_auc([100, 300, 400], [0.5, 1.0, 1.0], 400, start_value=0.0))
    with pytest.raises(ValueError, match="equally many"):
        curve_auc([100], [0.1, 0.2], 100, start_value=0.0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=6), st.floats(0, 1))
def test_auc_matches_dense_numerical_integration(values, start):
    tokens = np.arange(1, len(values) + 1) * 100.0
    budget = tokens[-1]
    grid = np.linspace(0, budget, 20001)
    dense = np.interp(grid, np.concatenate([[0], tokens]), np.concatenate([[start], values]))
    assert curve_auc(tokens, values, budget, start_value=start) == pytest.approx(dense.mean(), abs=1e-3)


def test_tokens_to_target_interpolates_the_first_crossing():
    assert tokens_to_target([100, 200, 300], [0.3, 0.5, 0.7], 0.4, start_value=0.2) == pytest.approx(150)
    assert tokens_to_target([100, 200], [0.3, 0.35], 0.4, start_value=0.2) == math.inf
    assert tokens_to_target([100, 200], [0.5, 0.1], 0.4, start_value=0.45) == 0.0  # already there at the start
    assert tokens_to_target([100, 200, 300], [0.5, 0.3, 0.6], 0.45, start_value=0.2) == pytest.approx(250 / 3)


def test_curve_on_grid_is_nan_outside_the_curve():
    out = curve_on_grid([100, 200], [0.2, 0.4], [50, 150, 250])
    assert math.isnan(out[0]) and out[1] == pytest.approx(0.3) and math.isnan(out[2])


def _runs(rng, offsets, seeds=5, noise=0.01):
    tokens = [100.0, 200.0, 300.0, 400.0]
    out = {}
    for m, off in offsets.items():
        out[m] = {s: (tokens, [0.4 + off * (j + 1) / 4 + rng.normal(0, noise) for j in range(4)]) for s in range(seeds)}
    return out


def test_compare_curves_recovers_a_planted_auc_gap_and_pairs_by_seed():
    rng = np.random.default_rng(0)
    runs = _runs(rng, {"base": 0.1, "better": 0.2})
    res = compare_curves(runs, budget=400, baseline="base", start_value=0.4, n_resamples=2000)
    base, better = res["methods"]["base"], res["methods"]["better"]
    # planted: the AUC of 0.4 + off * t / 400 over [0, 400] is 0.4 + off / 2: a gap of 0.05
    assert better["auc_diff_paired"] and better["auc_diff"] == pytest.approx(0.05, abs=0.01)
    lo, hi = better["auc_diff_ci"]
    assert lo < better["auc_diff"] < hi and lo > 0  # a clear gap is resolved
    assert base["auc_diff"] == 0 and base["auc_diff_ci"] == (0.0, 0.0)
    assert res["target"] == pytest.approx(np.mean([v[-1] for _, v in runs["base"].values()]))
    # the better method reaches the baseline's final accuracy about halfway (0.4 + 0.2 t/400 = 0.5 at t = 200)
    assert better["t2t_mean_curve"] == pytest.approx(200, abs=40)
    tlo, thi = better["t2t_ci"]
    assert tlo <= better["t2t_mean_curve"] <= thi


def test_compare_curves_unpaired_when_seed_sets_differ():
    rng = np.random.default_rng(1)
    runs = _runs(rng, {"base": 0.1, "other": 0.1})
    runs["other"] = {s + 10: v for s, v in runs["other"].items()}
    res = compare_curves(runs, budget=400, baseline="base", start_value=0.4, n_resamples=1000)
    other = res["methods"]["other"]
    assert not other["auc_diff_paired"]
    lo, hi = other["auc_diff_ci"]
    assert lo < 0 < hi  # no planted difference: the interval covers 0
    with pytest.raises(ValueError, match="baseline"):
        compare_curves(runs, budget=400, baseline="missing", start_value=0.4)


def test_two_level_bootstrap_sees_question_noise_that_seeds_alone_miss():
    rng = np.random.default_rng(2)
    q = 400
    one_seed = (rng.random((4, q)) < np.array([0.3, 0.4, 0.5, 0.6])[:, None]).astype(float)
    outcomes = np.stack([one_seed] * 3)  # three identical seeds: zero seed-to-seed spread
    res = two_level_curve_bootstrap(outcomes, [100, 200, 300, 400], 400, start_outcomes=np.zeros(q), n_resamples=400)
    lo, hi = res["ci"]
    assert lo < res["auc_mean"] < hi and hi - lo > 0.01  # question resampling alone gives a real width
    runs = {"m": {s: ([100, 200, 300, 400], list(outcomes[s].mean(axis=1))) for s in range(3)}}
    seed_only = compare_curves(runs, budget=400, baseline="m", start_value=0.0, n_resamples=500)["methods"]["m"]
    assert seed_only["auc_mean"] == pytest.approx(res["auc_mean"])
    s_lo, s_hi = seed_only["auc_ci"]
    assert s_hi - s_lo < 1e-9  # identical seeds: the seed bootstrap has no width
    with pytest.raises(ValueError, match="seeds, checkpoints, questions"):
        two_level_curve_bootstrap(outcomes[0], [100, 200, 300, 400], 400)


def test_curves_command_on_a_runs_json(tmp_path, capsys):
    from trl_ext import cli

    rng = np.random.default_rng(3)
    runs = _runs(rng, {"grpo": 0.1, "x": 0.15})
    recs = [{"method": m, "seed": s, "status": "ok",
             "curve": [{"tokens": t, "greedy_accuracy": a} for t, a in zip(*runs[m][s])]}
            for m in runs for s in runs[m]]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": recs, "start_accuracy": 0.4}))
    out = tmp_path / "curves.json"
    assert cli.main(["curves", "--runs_json", str(path), "--baseline", "grpo", "--n_resamples", "500",
                     "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| x | 5 |" in text and "budget 400 tokens" in text
    res = json.loads(out.read_text(), parse_constant=_reject_constant)  # strict JSON: no Infinity / NaN
    assert res["start_accuracy"] == 0.4 and set(res["methods"]) == {"grpo", "x"}
    assert cli.main(["curves", "--runs_json", str(path), "--baseline", "nope"]) == 2
    assert "baseline 'nope' has no runs" in capsys.readouterr().err
    per_run = tmp_path / "r"
    per_run.mkdir()
    for i, r in enumerate(recs):
        (per_run / f"{i}.json").write_text(json.dumps(r))
    assert cli.main(["curves", "--run", f"all={per_run}/*.json", "--baseline", "all", "--start_accuracy", "0.4",
                     "--n_resamples", "200"]) == 2  # ten runs, but five share each seed number: refused


def _reject_constant(name):
    raise AssertionError(f"curves.json holds the non-JSON constant {name}")


def test_json_safe_writes_unreached_targets_and_uncomputed_intervals_as_null():
    from trl_ext._io import json_safe

    doc = {"t2t": math.inf, "ci": (math.nan, 0.5), "nested": [{"x": -math.inf}, 1.0, "s", None, True]}
    assert json_safe(doc) == {"t2t": None, "ci": [None, 0.5], "nested": [{"x": None}, 1.0, "s", None, True]}
    json.dumps(json_safe(doc), allow_nan=False)  # would raise on a non-finite float
    np_doc = {1: np.array([np.inf, 2.0]), "s": np.float64(np.nan)}  # numpy values; the audit files' infinity
    assert json_safe(np_doc, infinity=lambda v: "inf" if v > 0 else "-inf") == {"1": ["inf", 2.0], "s": None}


def test_two_level_difference_finds_a_planted_gap_and_is_zero_against_itself():
    rng = np.random.default_rng(5)
    q, tokens = 300, [100, 200, 300]
    base_p = rng.uniform(0.2, 0.8, q)  # per-question difficulty shared by both methods (pairing removes it)
    def method(shift):
        return np.stack([(rng.random((3, q)) < np.clip(base_p + shift * np.array([1, 2, 3])[:, None], 0, 1))
                         .astype(float) for _ in range(4)])
    a, b = method(0.05), method(0.0)
    start = (rng.random(q) < base_p).astype(float)
    res = two_level_auc_difference(a, tokens, b, tokens, 300, start_outcomes=start, n_resamples=300)
    direct = np.mean([curve_auc(tokens, a[s].mean(axis=1), 300, start_value=start.mean())
                      - curve_auc(tokens, b[s].mean(axis=1), 300, start_value=start.mean()) for s in range(4)])
    assert res["diff_mean"] == pytest.approx(direct, abs=1e-12)
    lo, hi = res["ci"]
    assert 0 < lo < res["diff_mean"] < hi  # the planted gap (AUC +0.067 on the linear ramp) is detected
    same = two_level_auc_difference(a, tokens, a, tokens, 300, n_resamples=50, start_outcomes=np.zeros(q))
    assert same["diff_mean"] == 0 and same["ci"] == (0.0, 0.0)
    with pytest.raises(ValueError, match="same questions and seeds"):
        two_level_auc_difference(a, tokens, b[:3], tokens, 300)


def _seeded_runs(rng, n_seeds, q, seed_sd, level, base_p):
    """Outcomes (seeds, 2 checkpoints, questions): each seed's pass rates are the shared question difficulty moved by
    the method's level and a seed effect of sd ``seed_sd`` (independent across methods: seeds that do not pair)."""
    runs = []
    for _ in range(n_seeds):
        shift = level + seed_sd * rng.standard_normal()
        runs.append(np.stack([(rng.random(q) < np.clip(base_p + f * shift, 0, 1)).astype(float) for f in (0.5, 1.0)]))
    return np.stack(runs)


def test_two_level_difference_with_unpaired_seeds():
    """Unequal seed counts: the point is the difference of the two seed means; each method's seeds are resampled on
    their own, so the interval covers the true gap at about its level when the noisy method's seeds dominate."""
    rng = np.random.default_rng(3)
    q, tokens, z = 200, [100, 200], np.zeros(200)  # a shared start point at 0 accuracy
    base_p = rng.uniform(0.3, 0.7, q)
    a = _seeded_runs(rng, 3, q, 0.02, 0.2, base_p)
    b = _seeded_runs(rng, 8, q, 0.02, 0.0, base_p)
    res = two_level_auc_difference(a, tokens, b, tokens, 200, paired_seeds=False, n_resamples=300, start_outcomes=z)
    auc = [[curve_auc(tokens, x[s].mean(axis=1), 200, start_value=0.0) for s in range(len(x))] for x in (a, b)]
    assert res["diff_mean"] == pytest.approx(np.mean(auc[0]) - np.mean(auc[1]), abs=1e-12)
    assert res["n_seeds"] == 3 and res["n_seeds_b"] == 8 and res["paired_seeds"] is False
    assert 0 < res["ci"][0] < res["diff_mean"] < res["ci"][1]  # the planted gap (AUC +0.1)
    with pytest.raises(ValueError, match=">= 2 seeds a method"):
        two_level_auc_difference(a[:1], tokens, b, tokens, 200, paired_seeds=False)

    # coverage: the reference's seeds are the noisy ones (sd 0.15 vs 0.02); an interval that held them fixed misses
    # the true AUC gap often (a mutant that did so covered it 25 times of these 40; this function, 39)
    q, z = 500, np.zeros(500)  # many questions: the seeds dominate the interval
    base_p = rng.uniform(0.4, 0.6, q)
    true_gap = 0.5 * 0.05  # the gap's ramp (0 at 0, half at 100, all at 200) has AUC 0.5 x level on [0, 200]
    covered = 0
    for _ in range(40):
        a = _seeded_runs(rng, 6, q, 0.02, 0.05, base_p)
        b = _seeded_runs(rng, 12, q, 0.15, 0.0, base_p)
        lo, hi = two_level_auc_difference(a, tokens, b, tokens, 200, paired_seeds=False, n_resamples=150,
                                          start_outcomes=z)["ci"]
        covered += lo <= true_gap <= hi
    assert covered >= 32  # 95 % nominal; a percentile bootstrap on 6 and 12 seeds runs a little narrow


def test_two_level_difference_pairing_removes_a_shared_seed_effect_only():
    """Where seeds share an effect (the same seed moves both methods), the paired interval is narrower than the
    unpaired one; the paired random stream is the one used before unpaired seeds existed."""
    rng = np.random.default_rng(4)
    q, tokens = 400, [100, 200]
    base_p = rng.uniform(0.4, 0.6, q)
    shared = np.array([-0.2, -0.12, -0.04, 0.04, 0.12, 0.2])  # each seed moves both methods alike
    a = np.stack([_seeded_runs(rng, 1, q, 0.0, 0.05 + e, base_p)[0] for e in shared])
    b = np.stack([_seeded_runs(rng, 1, q, 0.0, e, base_p)[0] for e in shared])
    kw = dict(n_resamples=300, start_outcomes=np.zeros(q))
    paired = two_level_auc_difference(a, tokens, b, tokens, 200, **kw)
    unpaired = two_level_auc_difference(a, tokens, b, tokens, 200, paired_seeds=False, **kw)
    assert paired["diff_mean"] == unpaired["diff_mean"]
    assert np.diff(paired["ci"])[0] < 0.5 * np.diff(unpaired["ci"])[0]
    assert paired["paired_seeds"] is True


def test_curves_command_two_level_from_checkpoint_outcomes(tmp_path, capsys):
    from trl_ext import cli
    from trl_ext.testbed import write_outcomes_jsonl

    rng = np.random.default_rng(7)
    q = 60
    qids = [f"q{i}" for i in range(q)]
    recs = []
    for m, p in (("grpo", 0.4), ("x", 0.7)):
        for s in range(3):
            curve = []
            for j, t in enumerate((100, 200)):
                hits = (rng.random(q) < p).astype(int)
                path = write_outcomes_jsonl(tmp_path / f"{m}_{s}_{j}.jsonl.gz",
                                            [{"question_id": qq, "correct": int(h), "pass_rate": float(h), "n_samples": 1,
                                              "completion_tokens": 5.0}
                                             for qq, h in zip(qids, hits)])
                curve.append({"tokens": t + s, "accuracy": float(hits.mean()), "outcomes": path.split("/")[-1]})
            recs.append({"method": m, "seed": s, "status": "ok", "curve": curve})
    (tmp_path / "runs.json").write_text(json.dumps({"runs": recs, "start_accuracy": 0.3}))
    (tmp_path / "start_eval.json").write_text(json.dumps(
        {"accuracy": 0.3, "records": [{"question_id": qq, "correct": 0, "pass_rate": 0.3} for qq in qids]}))
    out = tmp_path / "curves.json"
    assert cli.main(["curves", "--runs_json", str(tmp_path / "runs.json"), "--baseline", "grpo", "--metric",
                     "accuracy", "--questions", "--n_resamples", "300", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Two-level bootstrap" in text and "Accuracy at the budget" in text
    res = json.loads(out.read_text())
    assert res["n_questions_two_level"] == q
    lo, hi = res["methods"]["x"]["auc_diff_ci_two_level"]
    assert 0 < lo < res["methods"]["x"]["auc_diff"] < hi
    assert res["methods"]["grpo"]["auc_diff_ci_two_level"] == [0.0, 0.0]
    lo, hi = res["methods"]["x"]["acc_at_budget_diff_ci_two_level"]
    assert 0 < lo < res["methods"]["x"]["acc_at_budget_diff"] < hi  # 0.7 vs 0.4 at the budget
    assert res["methods"]["x"]["diff_two_level_paired_seeds"] is True
    # a method whose seed set differs from the baseline's: the seeds are resampled on their own, said so
    short = {"runs": [r for r in recs if not (r["method"] == "x" and r["seed"] == 2)], "start_accuracy": 0.3}
    (tmp_path / "runs.json").write_text(json.dumps(short))
    assert cli.main(["curves", "--runs_json", str(tmp_path / "runs.json"), "--baseline", "grpo", "--metric",
                     "accuracy", "--questions", "--n_resamples", "100", "--output", str(out)]) == 0
    assert "unpaired seeds" in capsys.readouterr().out
    res = json.loads(out.read_text(), parse_constant=_reject_constant)
    lo, hi = res["methods"]["x"]["auc_diff_ci_two_level"]
    assert 0 < lo < res["methods"]["x"]["auc_diff"] < hi
    assert res["methods"]["x"]["diff_two_level_paired_seeds"] is False
    # one seed: no seed-level interval, said so, null in the JSON
    one = {"runs": [r for r in recs if not (r["method"] == "x" and r["seed"] > 0)], "start_accuracy": 0.3}
    (tmp_path / "runs.json").write_text(json.dumps(one))
    assert cli.main(["curves", "--runs_json", str(tmp_path / "runs.json"), "--baseline", "grpo", "--metric",
                     "accuracy", "--questions", "--n_resamples", "100", "--output", str(out)]) == 0
    assert "[no interval: a method with one seed]" in capsys.readouterr().out
    res = json.loads(out.read_text(), parse_constant=_reject_constant)
    assert res["methods"]["x"]["auc_diff_ci_two_level"] == [None, None]
    del recs[0]["curve"][0]["outcomes"]
    (tmp_path / "runs.json").write_text(json.dumps({"runs": recs, "start_accuracy": 0.3}))
    assert cli.main(["curves", "--runs_json", str(tmp_path / "runs.json"), "--baseline", "grpo", "--metric",
                     "accuracy", "--questions", "--n_resamples", "100"]) == 2
    assert "no per-question `outcomes` file" in capsys.readouterr().err


def test_accuracy_at_budget_is_equal_token_final_accuracy():
    """Eq. C3: a run that overshoots the budget is read at the budget, not at its last checkpoint; the difference
    to the baseline is paired by seed; the two-level bootstrap resamples the same statistic."""
    # base: checkpoints at 100, 200 (on budget); over: the last step overshoots to 300 and gains there
    runs = {"base": {s: ([100, 200], [0.5, 0.6 + 0.01 * s]) for s in range(4)},
            "over": {s: ([100, 300], [0.5, 0.9 + 0.01 * s]) for s in range(4)}}
    res = compare_curves(runs, budget=200, baseline="base", start_value=0.4, n_resamples=500)
    over = res["methods"]["over"]
    # linear between (100, 0.5) and (300, 0.9 + 0.01 s): at 200 it is 0.7 + 0.005 s, not the final 0.9 + 0.01 s
    assert over["acc_at_budget"] == pytest.approx([0.7 + 0.005 * s for s in range(4)])
    assert over["acc_at_budget_mean"] == pytest.approx(0.7075)
    assert over["acc_at_budget_diff"] == pytest.approx(0.7075 - 0.615)
    lo, hi = over["acc_at_budget_diff_ci"]  # paired differences 0.1 - 0.005 s: the interval is inside them
    assert 0.085 - 1e-9 <= lo <= hi <= 0.1 + 1e-9
    assert res["methods"]["base"]["acc_at_budget_diff_ci"] == (0.0, 0.0)
    # the AUC's intervals do not move when the new statistic is computed (its own random stream)
    auc_only = compare_curves(runs, budget=200, baseline="base", start_value=0.4, n_resamples=500)
    assert auc_only["methods"]["over"]["auc_ci"] == over["auc_ci"]

    rng = np.random.default_rng(11)
    q = 200
    o = (rng.random((3, 2, q)) < np.array([0.5, 0.9])[None, :, None]).astype(float)
    tok = [[100, 300]] * 3
    two = two_level_curve_bootstrap(o, tok, 200, start_outcomes=np.zeros(q), n_resamples=300,
                                    statistic="acc_at_budget")
    direct = np.mean([np.interp(200, [0, 100, 300], [0, *o[s].mean(axis=1)]) for s in range(3)])
    assert two["acc_at_budget_mean"] == pytest.approx(direct, abs=1e-12)
    assert two["ci"][0] < direct < two["ci"][1]
    same = two_level_auc_difference(o, tok, o, tok, 200, n_resamples=20, statistic="acc_at_budget")
    assert same["diff_mean"] == 0 and same["ci"] == (0.0, 0.0)
    with pytest.raises(ValueError, match="statistic must be one of"):
        two_level_curve_bootstrap(o, tok, 200, statistic="final")

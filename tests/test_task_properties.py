"""Tests of ``benchmarks/task_properties.py`` (regime task properties; see ``docs/testbed.md``).

Pure statistics against hand-computed values, the AUC against a brute-force pairwise count, the noise corrections
against their expectation, and one tiny end-to-end run on an untrained testbed model (scratchpad task).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "task_properties.py")


@pytest.fixture(scope="module")
def tp():
    spec = importlib.util.spec_from_file_location("task_properties", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------------------------ spread
def test_histogram_and_spread_hand_computed(tp):
    rates = [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 0.8, 0.1]
    hist = tp.pass_rate_histogram(rates)
    assert list(hist) == list(tp.HIST_LABELS)
    assert hist == {"0": 2, "(0,0.25]": 2, "(0.25,0.5]": 1, "(0.5,0.75]": 1, "(0.75,1)": 1, "1": 1}
    s = tp.pass_rate_spread(rates)
    assert s["n"] == 8
    assert s["share_zero"] == 2 / 8 and s["share_one"] == 1 / 8 and s["share_between"] == 5 / 8
    assert s["mean"] == pytest.approx(3.4 / 8, abs=1e-15)
    # squared deviations from 0.425 sum to 1.08 -> population variance 0.135
    assert s["sd"] == pytest.approx(math.sqrt(0.135), abs=1e-15)
    with pytest.raises(ValueError):
        tp.pass_rate_histogram([0.5, 1.2])
    with pytest.raises(ValueError):
        tp.pass_rate_spread([])


def test_length_summary(tp):
    s = tp.length_summary([3, 5, 10, 10], cap=10)  # the library's (trl_ext.advise.regime), with quantiles too
    want = {"n": 4, "mean": 7.0, "median": 7.5, "min": 3, "max": 10, "share_at_cap": 0.5}
    assert {k: s[k] for k in want} == want and s["p10"] <= s["median"] <= s["p90"]


# ------------------------------------------------------------------------------------------------ variance
def test_variance_decomposition_hand_computed(tp):
    d = tp.variance_decomposition([0.0, 0.5, 1.0, 0.5], k=4)
    # p_bar 0.5; p(1-p) = 0, 1/4, 0, 1/4 -> binomial noise mean(.)/(k-1) = 1/24; var(ddof=1) = 0.5/3 = 1/6
    assert d["mean"] == 0.5 and d["n_prompts"] == 4 and d["k"] == 4
    assert d["binomial_noise"] == pytest.approx(1 / 24, abs=1e-15)
    assert d["raw_variance"] == pytest.approx(1 / 6, abs=1e-15)
    assert d["between_variance"] == pytest.approx(1 / 8, abs=1e-15)
    assert d["total_variance"] == 0.25
    assert d["icc"] == pytest.approx(0.5, abs=1e-15)
    assert d["mean_sq_gap"] == pytest.approx(0.5 / 4 - 3 / 4 / 24, abs=1e-15)  # 3/32
    assert d["rms_gap"] == pytest.approx(math.sqrt(3 / 32), abs=1e-15)
    assert d["within_variance"] == pytest.approx(1 / 6, abs=1e-15)
    flat = tp.variance_decomposition([0.0, 0.0, 0.0], k=8)
    assert flat["total_variance"] == 0 and math.isnan(flat["icc"]) and flat["between_variance"] == 0
    with pytest.raises(ValueError):
        tp.variance_decomposition([0.5, 0.5], k=1)
    with pytest.raises(ValueError):
        tp.variance_decomposition([0.5], k=4)


def test_noise_corrections_are_unbiased(tp):
    """Averaged over binomial draws, the corrected estimators hit their targets for fixed true pass rates:
    ``between`` -> sum (p - p_bar)^2 / (N - 1), ``mean_sq_gap`` -> mean (p - p_bar)^2, ``within`` -> mean p(1 - p),
    ``value_mse`` -> mean (q - p)^2; the uncorrected versions are off by the noise."""
    rng = np.random.default_rng(0)
    p = np.array([0.05, 0.2, 0.2, 0.5, 0.7, 0.9, 0.97, 0.35])
    q = np.full(p.size, 0.4)
    k, reps = 4, 40000
    hats = rng.binomial(k, p, size=(reps, p.size)) / k
    dec = [tp.variance_decomposition(h, k) for h in hats[:20000]]
    ss = ((p - p.mean()) ** 2).sum()
    between = np.mean([d["between_variance"] for d in dec])
    gap = np.mean([d["mean_sq_gap"] for d in dec])
    within = np.mean([d["within_variance"] for d in dec])
    raw = np.mean([d["raw_variance"] for d in dec])
    assert between == pytest.approx(ss / (p.size - 1), abs=1.5e-3)
    assert gap == pytest.approx(ss / p.size, abs=1.5e-3)
    assert within == pytest.approx((p * (1 - p)).mean(), abs=1.5e-3)
    assert raw - ss / (p.size - 1) > 0.03  # the uncorrected variance carries the binomial noise
    mse = np.mean([tp.value_mse(q, h, k)["mse"] for h in hats])
    assert mse == pytest.approx(((q - p) ** 2).mean(), abs=1.5e-3)


def test_value_mse_hand_computed(tp):
    v = tp.value_mse([0.5, 0.5], [0.0, 1.0], k=2)
    assert v == {"n": 2, "raw_mse": 0.25, "mse": 0.25, "rmse": 0.5, "mean_pred": 0.5}
    v = tp.value_mse([0.25], [0.5], k=3)  # raw 1/16, noise 0.25 / 2 = 1/8
    assert v["raw_mse"] == 0.0625 and v["mse"] == -0.0625 and v["rmse"] == 0.0
    with pytest.raises(ValueError):
        tp.value_mse([0.5], [0.5, 0.5], k=4)


# ------------------------------------------------------------------------------------------------ AUC, Brier
def _auc_brute(s, y):
    pos = [a for a, b in zip(s, y) if b == 1]
    neg = [a for a, b in zip(s, y) if b == 0]
    wins = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def test_auc_matches_brute_force_pairwise_count(tp):
    rng = np.random.default_rng(1)
    for trial in range(40):
        n = int(rng.integers(2, 60))
        y = rng.integers(0, 2, size=n)
        if y.min() == y.max():
            y[0] = 1 - y[0]
        # few distinct values -> many ties (as with a 1-token probe); also continuous scores
        s = rng.integers(0, 4, size=n).astype(float) if trial % 2 else rng.random(n)
        assert tp.auc(s, y) == pytest.approx(_auc_brute(s, y), abs=1e-12)
    assert tp.auc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert tp.auc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert tp.auc([0.3, 0.3, 0.3], [0, 1, 1]) == 0.5
    assert math.isnan(tp.auc([0.1, 0.2], [1, 1]))
    with pytest.raises(ValueError):
        tp.auc([0.1, 0.2], [0, 2])


def test_binary_prediction_metrics_hand_computed(tp):
    m = tp.binary_prediction_metrics([0.9, 0.2, 0.6], [1, 0, 0], base_rate=1 / 3)
    assert m["n"] == 3 and m["positives"] == 1 and m["auc"] == 1.0
    assert m["brier"] == pytest.approx(0.41 / 3, abs=1e-15)
    assert m["base_brier"] == pytest.approx(2 / 9, abs=1e-15)
    assert m["brier_skill"] == pytest.approx(1 - (0.41 / 3) / (2 / 9), abs=1e-14)
    assert m["mean_pred"] == pytest.approx(1.7 / 3) and m["mean_label"] == pytest.approx(1 / 3)
    empty = tp.binary_prediction_metrics([], [], base_rate=0.5)
    assert empty["n"] == 0 and math.isnan(empty["brier"])


def test_json_clean(tp):
    out = tp.json_clean({"a": float("nan"), "b": [np.float64(1.5), np.int64(2), float("inf")], 3: "x"})
    assert out == {"a": None, "b": [1.5, 2, None], "3": "x"}
    json.dumps(out, allow_nan=False)


# ------------------------------------------------------------------------------------------------ end to end
def test_end_to_end_tiny_model(tp, tmp_path, capsys):
    """8 prompts x 4 samples of the scratchpad task on an untrained tiny model: every JSON field, the PAIR probe
    lengths of the 73-token budget, the ``n_digits`` breakdown, the Markdown summary, and determinism."""
    from trl_ext.testbed import save_tiny_model

    model_dir = str(tmp_path / "tiny")
    save_tiny_model(model_dir, seed=0)
    argv = ["--task", "scratchpad", "--model_name_or_path", model_dir, "--n_prompts", "8", "--samples", "4",
            "--head_batch_prompts", "2", "--out", str(tmp_path / "a.json")]
    res = tp.main(argv)
    printed = capsys.readouterr().out
    assert "## Regime task properties: `scratchpad`" in printed and "### 3. Prompt values" in printed
    with open(tmp_path / "a.json") as f:
        data = json.load(f)
    assert data == res
    assert data["command"].startswith("OMP_NUM_THREADS=1 python benchmarks/task_properties.py --task scratchpad")
    s = data["setup"]
    assert (s["task"], s["n_prompts"], s["samples"], s["max_new_tokens"], s["group_column"]) == \
        ("scratchpad", 8, 4, 73, "n_digits")
    assert s["temperature"] == 1.0 and s["top_k"] == 0 and s["top_p"] == 1.0
    sp = data["spread"]
    assert sum(sp["all"]["histogram"].values()) == 8
    assert set(sp["by_group"]) <= {str(d) for d in range(2, 8)}
    assert sum(v["n"] for v in sp["by_group"].values()) == 8
    ct = data["completion_tokens"]["all"]
    assert ct["n"] == 32 and 1 <= ct["min"] <= ct["median"] <= ct["max"] <= 73
    h = data["pair_heads"]
    assert h["default_tau"] == 9 and h["max_completion_length"] == 73  # min(256, 73 // 8)
    assert (h["n_fit_prompts"], h["n_eval_prompts"]) == (4, 4)
    assert {name: v["probe_tokens"] for name, v in h["probes"].items()} == {"0.5x": 4, "1x": 9, "2x": 18}
    for v in h["probes"].values():
        assert v["fit_labels"] == 16 and v["refreshes"] == 2
        assert v["all"]["n"] == 16 and 0 <= v["share_finished_in_probe"] <= 1
        assert v["unfinished"]["n"] == round(16 * (1 - v["share_finished_in_probe"]))
        for key in ("auc", "brier", "base_brier", "brier_skill"):
            assert key in v["all"]
    assert set(h["prompt_only"]) == {"prompt_loo_mean", "group_mean"}
    vals = data["values"]
    for key in ("between_variance", "total_variance", "icc", "mean_sq_gap", "within_variance", "binomial_noise"):
        assert key in vals["decomposition"]
    assert set(vals["predictors_eval_half"]) == {"fit_half_mean (batch-mean value)", "fit_half_mean_per_n_digits",
                                                 "v05_default_prior"}
    assert vals["v05_prior"]["context_size"] == 4
    pp = data["per_prompt"]
    assert len(pp) == 8 and all(0 <= r["pass_rate"] <= 1 for r in pp)
    assert np.mean([r["pass_rate"] for r in pp]) == pytest.approx(data["spread"]["all"]["mean"])
    assert {r["group"] for r in pp} <= set(range(2, 8))
    assert data["timing_s"]["total"] > 0

    again = tp.main(argv[:-1] + [str(tmp_path / "b.json")])
    capsys.readouterr()
    for key in ("spread", "completion_tokens", "pair_heads", "values", "per_prompt"):
        assert again[key] == data[key], key


def test_bad_arguments(tp):
    with pytest.raises(SystemExit):
        tp.parse_args(["--samples", "1"])
    with pytest.raises(SystemExit):
        tp.parse_args(["--n_prompts", "2"])

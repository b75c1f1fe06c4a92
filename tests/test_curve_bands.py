"""``benchmarks/curve_bands.py``: the seed mean and band of each method's curve at every checkpoint, by hand."""

from __future__ import annotations

import json

import pytest
from bench_module import bench_script

cb = bench_script("curve_bands")


def _run(method, seed, accs, status="ok"):
    return {"method": method, "seed": seed, "status": status,
            "curve": [{"nominal_tokens": 1000.0 * (i + 1), "tokens": 1000.0 * (i + 1) + 10 * seed, "accuracy": a}
                      for i, a in enumerate(accs)]}


def test_bands_by_hand_and_only_checkpoints_every_seed_has():
    runs = [_run("g8", 0, [0.2, 0.4, 0.6]), _run("g8", 1, [0.4, 0.2, 0.8]), _run("g8", 2, [0.3, 0.3]),  # cut short
            _run("v05", 0, [0.5]), _run("v05", 1, [0.1], status="failed")]
    b = cb.curve_bands(runs, start_accuracy=0.25)
    g8 = b["methods"]["g8"]
    assert g8["seeds"] == [0, 1, 2] and [p["nominal_tokens"] for p in g8["points"]] == [0.0, 1000.0, 2000.0]
    p1, p2 = g8["points"][1:]
    assert p1["mean"] == pytest.approx(0.3) and (p1["min"], p1["max"], p1["n"]) == (0.2, 0.4, 3)
    assert p1["tokens_mean"] == pytest.approx(1010.0)  # 1000, 1010, 1020
    assert p2["mean"] == pytest.approx(0.3) and (p2["min"], p2["max"]) == (0.2, 0.4)
    assert g8["points"][0] == {"nominal_tokens": 0.0, "tokens_mean": 0.0, "mean": 0.25, "min": 0.25, "max": 0.25,
                               "n": 3}
    assert b["methods"]["v05"]["seeds"] == [0] and b["not_ok"] == {"v05": {"failed": 1}}
    table = cb.markdown(b)
    assert "| 1,000 | 30.0 [20.0, 40.0] | 50.0 [50.0, 50.0] |" in table
    assert "| 2,000 | 30.0 [20.0, 40.0] |  |" in table


def test_bad_curves_are_refused():
    bad = _run("g8", 0, [0.2])
    del bad["curve"][0]["accuracy"]
    with pytest.raises(ValueError, match="without 'accuracy'"):
        cb.curve_bands([bad])
    twice = _run("g8", 0, [0.2, 0.3])
    twice["curve"][1]["nominal_tokens"] = 1000.0
    with pytest.raises(ValueError, match="twice"):
        cb.curve_bands([twice])


def test_cli_writes_the_json(tmp_path, capsys):
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"start_accuracy": 0.1, "runs": [_run("g8", 0, [0.2]), _run("g4", 0, [0.6])]}))
    assert cb.main(["--runs_json", str(path), "--methods", "g4", "--output", str(tmp_path / "b.json")]) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert list(doc["methods"]) == ["g4"] and doc["methods"]["g4"]["points"][1]["mean"] == 0.6
    assert "| 1,000 | 60.0 [60.0, 60.0] |" in capsys.readouterr().out

"""Tests for the scorer noise floor (trl_ext.measurement.noise_floor) and ``trl-ext noise-floor``."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_ext.measurement import noise_floor_cli
from trl_ext.measurement.noise_floor import (
    NoiseFloorError,
    batch_positions,
    batch_sensitive_toy_scorer,
    deterministic_toy_scorer,
    measure_noise_floor,
)

ITEMS = [f"question {i}: what is {i} plus {i % 7}?" + " pad" * (i % 5) for i in range(60)]
FILLER = [f"unrelated filler sentence number {j}" + "!" * (j % 9) for j in range(40)]


def test_deterministic_scorer_has_zero_floor_and_keeps_every_score():
    r = measure_noise_floor(deterministic_toy_scorer, ITEMS, FILLER)
    assert r.floor == 0.0 and np.all(r.spreads == 0)
    assert r.scores.shape == (60, 5) and r.positions_used == (0, 2, 5, 7)
    np.testing.assert_allclose(r.scores[:, 0], deterministic_toy_scorer(ITEMS))
    assert r.filler_ids.shape == (60, 4, 7)


def test_batch_sensitive_scorer_has_positive_floor_equal_to_3_p95():
    r = measure_noise_floor(batch_sensitive_toy_scorer, ITEMS, FILLER, seed=3)
    assert r.floor > 0
    assert r.p95_spread == pytest.approx(np.quantile(r.scores.max(1) - r.scores.min(1), 0.95))
    assert r.floor == pytest.approx(3 * r.p95_spread)
    assert r.floor <= 3 * r.spreads.max() + 1e-15
    # column 0 is the item alone; the in-batch columns reproduce by rebuilding each batch from filler_ids
    for i in (0, 17, 59):
        assert r.scores[i, 0] == batch_sensitive_toy_scorer([ITEMS[i]])[0]
        for k, slot in enumerate(r.positions_used):
            batch = [FILLER[j] for j in r.filler_ids[i, k]]
            batch.insert(slot, ITEMS[i])
            assert r.scores[i, 1 + k] == batch_sensitive_toy_scorer(batch)[slot]
    again = measure_noise_floor(batch_sensitive_toy_scorer, ITEMS, FILLER, seed=3)
    np.testing.assert_array_equal(again.scores, r.scores)  # seeded filler draws


def test_floor_tracks_jitter_scale():
    def scaled(scale):
        def fn(texts):
            base = np.array(deterministic_toy_scorer(texts))
            return list(base + scale * np.sin(np.arange(len(texts)) + len(texts)) * (len(texts) > 1))
        return fn

    small = measure_noise_floor(scaled(1e-4), ITEMS, FILLER).floor
    large = measure_noise_floor(scaled(1e-2), ITEMS, FILLER).floor
    assert large == pytest.approx(100 * small, rel=1e-6) and small > 0


@given(st.integers(1, 16), st.data())
@settings(max_examples=40)
def test_batch_positions_property(batch_size, data):
    positions = data.draw(st.integers(1, batch_size))
    slots = batch_positions(positions, batch_size)
    assert len(set(slots)) == positions and slots[0] == 0
    assert all(0 <= s < batch_size for s in slots) and list(slots) == sorted(slots)
    if positions > 1:
        assert slots[-1] == batch_size - 1


def test_dict_items_and_numpy_scalars_accepted():
    def np_scorer(texts):
        return [np.float32(len(t)) for t in texts]

    r = measure_noise_floor(np_scorer, [{"text": t} for t in ITEMS[:10]], FILLER, positions=2, batch_size=4)
    assert r.floor == 0.0 and r.scores.shape == (10, 3)


def test_nan_and_non_numeric_outputs_name_the_item():
    target = ITEMS[7]

    def nan_on_item(texts):
        return [float("nan") if t == target else 1.0 for t in texts]

    with pytest.raises(NoiseFloorError, match=r"non-finite score nan for item 7 .*alone"):
        measure_noise_floor(nan_on_item, ITEMS, FILLER)

    def text_output(texts):
        return ["high" if t == target else 0.5 for t in texts]

    with pytest.raises(NoiseFloorError, match=r"non-numeric score 'high' \(str\) for item 7"):
        measure_noise_floor(text_output, ITEMS, FILLER)

    def nan_on_filler(texts):
        return [float("inf") if t == FILLER[0] else 1.0 for t in texts]

    with pytest.raises(NoiseFloorError, match=r"for filler 0 "):
        measure_noise_floor(nan_on_filler, ITEMS, FILLER)


def test_scorer_shape_errors():
    with pytest.raises(NoiseFloorError, match="returned 1 scores for a batch of 8"):
        measure_noise_floor(lambda texts: [0.0], ITEMS, FILLER)
    with pytest.raises(NoiseFloorError, match="must return a list"):
        measure_noise_floor(lambda texts: 3.0, ITEMS, FILLER)
    with pytest.raises(NoiseFloorError, match="ZeroDivisionError"):
        measure_noise_floor(lambda texts: [1 / 0], ITEMS, FILLER)
    with pytest.raises(NoiseFloorError, match="non-numeric"):
        measure_noise_floor(lambda texts: [True] * len(texts), ITEMS, FILLER)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"items": []}, "items is empty"),
        ({"filler": FILLER[:3]}, "at least batch_size - 1 = 7 filler"),
        ({"positions": 9}, "positions must be in"),
        ({"positions": 0}, "positions must be in"),
        ({"batch_size": 1}, "batch_size must be >= 2"),
        ({"items": [3]}, r"items\[0\] must be a string"),
        ({"multiplier": 0}, "multiplier"),
        ({"quantile": 0}, "quantile"),
    ],
)
def test_bad_settings(kwargs, match):
    args = {"score_fn": deterministic_toy_scorer, "items": ITEMS, "filler": FILLER, **kwargs}
    with pytest.raises(ValueError, match=match):
        measure_noise_floor(**args)


# --------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------


def _jsonl(path, texts, with_ids=False):
    with open(path, "w") as fh:
        for i, t in enumerate(texts):
            fh.write(json.dumps({"text": t, **({"id": f"item-{i}"} if with_ids else {})}) + "\n")
    return str(path)


def _run(argv):
    parser = argparse.ArgumentParser()
    noise_floor_cli.add_arguments(parser)
    return noise_floor_cli.main(parser.parse_args(argv))


@pytest.mark.parametrize("scorer,positive", [("deterministic_toy_scorer", False), ("batch_sensitive_toy_scorer", True)])
def test_cli_end_to_end(tmp_path, capsys, scorer, positive):
    items = _jsonl(tmp_path / "items.jsonl", ITEMS, with_ids=True)
    filler = _jsonl(tmp_path / "filler.jsonl", FILLER)
    out = tmp_path / "floor.json"
    rc = _run(["--scorer", f"trl_ext.measurement.noise_floor:{scorer}", "--items", items, "--filler", filler,
               "--output", str(out)])
    assert rc == 0
    assert "noise floor of" in capsys.readouterr().out
    rep = json.loads(out.read_text())
    assert rep["n_items"] == 60 and len(rep["items"]) == 60 and rep["positions"] == [0, 2, 5, 7]
    assert rep["items"][3]["id"] == "item-3" and set(rep["items"][3]["in_batch"]) == {"0", "2", "5", "7"}
    scores = np.array([[it["alone"], *it["in_batch"].values()] for it in rep["items"]])
    assert rep["floor"] == pytest.approx(3 * np.quantile(scores.max(1) - scores.min(1), 0.95))
    assert (rep["floor"] > 0) == positive


def test_cli_bad_input(tmp_path, capsys, monkeypatch):
    items = _jsonl(tmp_path / "items.jsonl", ITEMS[:10])
    filler = _jsonl(tmp_path / "filler.jsonl", FILLER)
    out = str(tmp_path / "o.json")
    cases = [
        (["--scorer", "no_colon"], "must look like 'package.module:function'"),
        (["--scorer", "not_a_module_xyz:f"], "cannot import module"),
        (["--scorer", "trl_ext.measurement.noise_floor:nope"], "has no attribute 'nope'"),
        (["--scorer", "trl_ext.measurement.noise_floor:__doc__"], "is not callable"),
    ]
    for extra, match in cases:
        assert _run([*extra, "--items", items, "--filler", filler, "--output", out]) == 2
        assert match in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "oops"}\n')
    assert _run(["--scorer", "trl_ext.measurement.noise_floor:deterministic_toy_scorer", "--items", str(bad),
                 "--filler", filler, "--output", out]) == 2
    assert f"{bad}:2: each line must be an object with a string 'text'" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert _run(["--scorer", "trl_ext.measurement.noise_floor:deterministic_toy_scorer", "--items",
                 str(tmp_path / "empty.jsonl"), "--filler", filler, "--output", out]) == 2
    assert "empty file" in capsys.readouterr().err
    # a user scorer module that returns NaN for one item: the error names it
    (tmp_path / "my_scorer.py").write_text(
        "def score(texts):\n    return [float('nan') if 'question 4:' in t else 0.0 for t in texts]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _run(["--scorer", "my_scorer:score", "--items", items, "--filler", filler, "--output", out]) == 2
    assert "non-finite score nan for item 4" in capsys.readouterr().err


def test_cli_scorer_file_form_and_current_directory(tmp_path, capsys, monkeypatch):
    """The same reference forms as every trl-ext command: path/to/file.py:function (this used to crash) and
    package.module:function importable from the current directory without touching sys.path."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    items = _jsonl(tmp_path / "items.jsonl", ITEMS[:8])
    filler = _jsonl(tmp_path / "filler.jsonl", FILLER)
    (tmp_path / "scorers").mkdir()
    (tmp_path / "scorers" / "toy.py").write_text(
        "from trl_ext.measurement.noise_floor import batch_sensitive_toy_scorer\n"
        "def score(texts):\n    return batch_sensitive_toy_scorer(texts)\n"
    )
    (tmp_path / "nf_cwd_scorer_xyz.py").write_text("def score(texts):\n    return [float(len(t)) for t in texts]\n")
    monkeypatch.chdir(tmp_path)
    reports = {}
    for ref in ("scorers/toy.py:score", "./scorers/toy.py:score", f"{tmp_path}/scorers/toy.py:score",
                "trl_ext.measurement.noise_floor:batch_sensitive_toy_scorer", "nf_cwd_scorer_xyz:score"):
        out = tmp_path / "floor.json"
        assert _run(["--scorer", ref, "--items", items, "--filler", filler, "--output", str(out)]) == 0, ref
        reports[ref] = json.loads(out.read_text())
    capsys.readouterr()
    floors = {ref: rep["floor"] for ref, rep in reports.items()}
    assert len({floors[r] for r in list(floors)[:4]}) == 1 and floors["scorers/toy.py:score"] > 0
    assert floors["nf_cwd_scorer_xyz:score"] == 0.0
    # a missing file names the accepted forms instead of crashing
    assert _run(["--scorer", "scorers/missing.py:score", "--items", items, "--filler", filler, "--output",
                 str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and "'package.module:function'" in err and "'path/to/file.py:function'" in err

"""End-to-end tests of ``trl-ext compare`` on synthetic per-question outcome JSONL (3 seeds)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from trl_ext.stats import compare_cli
from trl_ext.stats.outcomes import OutcomeFormatError, align_runs, pair_seed_files, read_outcomes

N_Q = 300


def _write_run(path, correct, tokens, ids=None, extra=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = ids or [f"q{i:04d}" for i in range(len(correct))]
    with open(path, "w") as fh:
        for qid, c, t in zip(ids, correct, tokens):
            rec = {"question_id": qid, "correct": int(c), "pass_rate": float(c), "n_samples": 1,
                   "completion_tokens": float(t), "prompt": f"{qid}?", "answer": "42", "completions": ["42"]}
            fh.write(json.dumps(rec) + "\n")
        if extra:
            fh.write(extra)


def _make_setup(tmp_path, gap, n_seeds=3, seed=0, n_q=N_Q):
    """Configurations a and b over n_seeds seeds; per-question difficulty shared; a's accuracy lifted by ``gap``."""
    rng = np.random.default_rng(seed)
    difficulty = rng.uniform(0.1, 0.9, n_q)
    files_a, files_b = [], []
    for s in range(1, n_seeds + 1):
        pa = np.clip(difficulty + gap, 0, 1)
        ca = rng.random(n_q) < pa
        cb = rng.random(n_q) < difficulty
        ta = rng.integers(3, 8, n_q)
        tb = rng.integers(3, 8, n_q)
        fa = tmp_path / f"run_a_seed{s}" / "outcomes.jsonl"
        fb = tmp_path / f"run_b_seed{s}" / "outcomes.jsonl"
        _write_run(fa, ca, ta)
        _write_run(fb, cb, tb)
        files_a.append(str(fa))
        files_b.append(str(fb))
    return files_a, files_b


def _run(argv):
    parser = argparse.ArgumentParser()
    compare_cli.add_arguments(parser)
    return compare_cli.main(parser.parse_args(argv))


def test_clear_winner_three_seeds(tmp_path, capsys):
    fa, fb = _make_setup(tmp_path, gap=0.25)
    out_json = tmp_path / "report.json"
    rc = _run(["--a", *fa, "--b", *fb, "--json", str(out_json), "--n-sim", "300", "--n-boot", "1000"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "VERDICT: A_WINS -> a" in text
    rep = json.loads(out_json.read_text())
    assert rep["verdict"]["status"] == "a_wins" and rep["n_seeds"] == 3 and rep["n_questions"] == N_Q
    assert [p["label"] for p in rep["pairs"]] == ["seed1", "seed2", "seed3"]
    assert 0.15 < rep["margin"] < 0.35
    assert rep["margin_ci"]["low"] < rep["margin"] < rep["margin_ci"]["high"]
    assert rep["margin_to_floor_ratio"] == pytest.approx(rep["margin"] / rep["detection_floor"])
    assert rep["margin_zone"] == "clears floor"
    assert 0 < rep["smallest_detectable_gap"] < rep["margin"]
    assert "margin-to-floor ratio" in text and "smallest gap the two-part rule catches" in text
    assert rep["length_residualized"]["n"] == 3 * N_Q


def test_null_case_calls_no_winner(tmp_path, capsys):
    fa, fb = _make_setup(tmp_path, gap=0.0, seed=5)
    rc = _run(["--a", *fa, "--b", *fb, "--n-sim", "200", "--n-boot", "500"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "VERDICT: NO_WINNER" in text
    assert "below significance" in text or "significant, below floor" in text


def test_quoted_glob_patterns_and_full_cli_entry(tmp_path, capsys):
    from trl_ext.cli import main as cli_main

    _make_setup(tmp_path, gap=0.25)
    rc = cli_main(["compare", "--a", str(tmp_path / "run_a_seed*" / "outcomes.jsonl"),
                   "--b", str(tmp_path / "run_b_seed*" / "outcomes.jsonl"), "--n-sim", "100", "--n-boot", "200"])
    assert rc == 0
    assert "3 seed(s) x 300 questions" in capsys.readouterr().out


def test_single_seed_cannot_call(tmp_path, capsys):
    fa, fb = _make_setup(tmp_path, gap=0.3, n_seeds=1)
    rc = _run(["--a", *fa, "--b", *fb, "--n-sim", "100", "--n-boot", "200"])
    text = capsys.readouterr().out
    assert rc == 0 and "VERDICT: CANNOT_CALL" in text and "single seed" in text


def test_identical_runs_all_votes_tied(tmp_path, capsys):
    fa, fb = _make_setup(tmp_path, gap=0.2, n_q=40)
    for a, b in zip(fa, fb):
        open(b, "w").write(open(a).read())
    rc = _run(["--a", *fa, "--b", *fb, "--score", "pass_rate", "--n-boot", "200"])
    out = capsys.readouterr().out
    assert rc == 0 and "VERDICT: NO_WINNER" in out and "every question's pooled vote is tied" in out
    assert "no discordant questions" in out and "computed from the 0/1 'correct' field" in out


def test_mismatched_questions_error_names_ids_then_intersect(tmp_path, capsys):
    fa, fb = _make_setup(tmp_path, gap=0.2, n_q=50)
    lines = open(fb[1]).read().splitlines()
    missing = [json.loads(x)["question_id"] for x in lines[:2]]
    open(fb[1], "w").write("\n".join(lines[2:]) + "\n")
    rc = _run(["--a", *fa, "--b", *fb, "--n-sim", "100", "--n-boot", "200"])
    err = capsys.readouterr().err
    assert rc == 2 and all(q in err for q in missing) and fb[1] in err and "--intersect" in err
    rc = _run(["--a", *fa, "--b", *fb, "--intersect", "--n-sim", "100", "--n-boot", "200"])
    out = capsys.readouterr().out
    assert rc == 0 and "kept 48 common questions" in out and "3 seed(s) x 48 questions" in out


@pytest.mark.parametrize(
    "extra,match",
    [
        ("{not json}\n", ":51: not valid JSON"),
        ('["a list"]\n', ":51: each line must be a JSON object"),
        ('{"correct": 1}\n', ":51: missing or non-string 'question_id'"),
        ('{"question_id": "zz", "correct": 2}\n', ":51: field 'correct' must be 0 or 1"),
        ('{"question_id": "zz"}\n', ":51: missing field 'correct'"),
        ('{"question_id": "q0001", "correct": 1}\n', ":51: duplicate question_id 'q0001'"),
        ('{"question_id": "zz", "correct": 1, "pass_rate": 1.5}\n', ":51: field 'pass_rate' must be in"),
        ('{"question_id": "zz", "correct": 1, "n_samples": 2.5}\n', ":51: field 'n_samples' must be an integer"),
        ('{"question_id": "zz", "correct": 1, "completion_tokens": "many"}\n', "must be a number"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, capsys, extra, match):
    fa, fb = _make_setup(tmp_path, gap=0.2, n_q=50)
    with open(fa[0], "a") as fh:
        fh.write(extra)
    rc = _run(["--a", *fa, "--b", *fb])
    err = capsys.readouterr().err
    assert rc == 2 and fa[0] in err and match in err


def test_empty_and_missing_files(tmp_path, capsys):
    fa, fb = _make_setup(tmp_path, gap=0.2, n_q=20)
    open(fa[2], "w").write("\n\n")
    assert _run(["--a", *fa, "--b", *fb]) == 2
    assert "no outcome records (empty file)" in capsys.readouterr().err
    assert _run(["--a", str(tmp_path / "nope.jsonl"), "--b", fb[0]]) == 2
    assert "file not found" in capsys.readouterr().err


def test_seed_pairing_rules(tmp_path):
    # by seedN component: order on the command line does not matter
    pairs = pair_seed_files(["x/a_seed3/o.jsonl", "x/a_seed1/o.jsonl"], ["y/seed-1/o.jsonl", "y/seed_3/o.jsonl"])
    assert [(lab, a, b) for lab, a, b in pairs] == [("seed1", "x/a_seed1/o.jsonl", "y/seed-1/o.jsonl"),
                                                   ("seed3", "x/a_seed3/o.jsonl", "y/seed_3/o.jsonl")]
    with pytest.raises(OutcomeFormatError, match="seed numbers differ"):
        pair_seed_files(["a_seed1/o", "a_seed2/o"], ["b_seed1/o", "b_seed3/o"])
    with pytest.raises(OutcomeFormatError, match="same seed number"):
        pair_seed_files(["a_seed1/o", "a/seed1/o"], ["b_seed1/o", "b_seed2/o"])
    # fallback: sort order
    pairs = pair_seed_files(["r/b.jsonl", "r/a.jsonl"], ["s/2.jsonl", "s/1.jsonl"])
    assert [(a, b) for _, a, b in pairs] == [("r/a.jsonl", "s/1.jsonl"), ("r/b.jsonl", "s/2.jsonl")]
    with pytest.raises(OutcomeFormatError, match="counts must match"):
        pair_seed_files(["r/a.jsonl"], ["s/1.jsonl", "s/2.jsonl"])
    with pytest.raises(OutcomeFormatError, match="same file twice"):
        pair_seed_files(["r/a.jsonl", "r/a.jsonl"], ["s/1.jsonl", "s/2.jsonl"])


def test_align_runs_orders_and_reports(tmp_path):
    p1, p2 = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    _write_run(p1, [1, 0, 1], [1, 2, 3], ids=["x", "y", "z"])
    _write_run(p2, [0, 1, 1], [3, 2, 1], ids=["z", "x", "w"])
    r1, r2 = read_outcomes(p1), read_outcomes(p2)
    with pytest.raises(OutcomeFormatError, match="is missing y"):
        align_runs([r1, r2])
    (a1, a2), rep = align_runs([r1, r2], intersect=True)
    assert a1.question_ids == a2.question_ids == ("x", "z")
    np.testing.assert_array_equal(a2.correct, [1, 0])  # reordered to the first run's order
    assert rep["n_common"] == 2 and rep["dropped"] == {str(p1): ["y"], str(p2): ["w"]}

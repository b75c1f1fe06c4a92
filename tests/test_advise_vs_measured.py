"""``benchmarks/advise_vs_measured.py``: advise's predicted token savings against a comparison's measured ones."""

from __future__ import annotations

import json

import pytest
from bench_module import bench_script  # tests/ is on sys.path (pytest's rootdir insertion)


def _mod():
    return bench_script("advise_vs_measured")


def _saving(v, lo, hi):
    return {"saving_vs_user_grpo": {"value": v, "low": lo, "high": hi}}


ADVICE = {"recommendation": "grpo", "recommended_config": {"num_generations": 8},
          "methods": {"grpo_g8": _saving(0.0, 0.0, 0.0), "reinforce_pp": _saving(0.2, 0.1, 0.3),
                      "v05_osla": _saving(-0.07, -0.1, -0.02), "basis": _saving(-28.0, -29.0, -26.0)},
          "alternatives": {"reinforce_pp": {"pays_here": False}, "v05_osla": {"pays_here": True},
                           "basis": {"pays_here": False}, "pair": {"pays_here": False}}}
TABLE = {"rows": [
    {"method": "grpo_g8", "tokens_to_threshold_mean": 4000.0, "tokens_to_threshold_reached": 5, "final_accuracy_mean": 0.5},
    {"method": "reinforce_pp", "tokens_to_threshold_mean": 3000.0, "tokens_to_threshold_reached": 4,
     "final_accuracy_mean": 0.55},  # saved 25 %: predicted +20 % -> right
    {"method": "v05_osla", "tokens_to_threshold_mean": 3600.0, "tokens_to_threshold_reached": 3,
     "final_accuracy_mean": 0.52},  # saved 10 %: predicted -7 % [-10, -2] -> wrong
    {"method": "basis", "tokens_to_threshold_mean": None, "tokens_to_threshold_reached": 0},  # never reached: untested
    {"method": "pair", "tokens_to_threshold_mean": 5000.0, "tokens_to_threshold_reached": 2},  # no number: untested
    {"method": "james_stein", "status": "failed"}]}


def test_compare_signs_ranks_and_untested_rows():
    m = _mod()
    res = m.compare(ADVICE, TABLE, "grpo_g8")
    rows = {r["method"]: r for r in res["rows"]}
    assert "james_stein" not in rows  # a failed method has no measured row
    assert rows["reinforce_pp"]["measured_saving"] == pytest.approx(0.25) and rows["reinforce_pp"]["verdict"] == "right"
    assert rows["v05_osla"]["measured_saving"] == pytest.approx(0.10) and rows["v05_osla"]["verdict"] == "wrong"
    assert rows["basis"]["verdict"] == rows["pair"]["verdict"] == "untested" and rows["grpo_g8"]["verdict"] == "baseline"
    assert rows["pair"]["pays_here"] is False and rows["v05_osla"]["pays_here"] is True
    # ranks among the methods with both numbers (the baseline's saving is 0 on both sides)
    assert [rows[k]["predicted_rank"] for k in ("reinforce_pp", "grpo_g8", "v05_osla")] == [1, 2, 3]
    assert [rows[k]["measured_rank"] for k in ("reinforce_pp", "v05_osla", "grpo_g8")] == [1, 2, 3]
    assert (res["sign_right"], res["sign_wrong"], res["untested"]) == (1, 1, 2)
    md = m.markdown(res)
    assert "| v05_osla | -7 % [-10 %, -2 %] | yes | +10 % (3) |" in md and "wrong" in md


def test_a_value_table_is_charged_as_advise_charges_it():
    m = _mod()
    advice = {**ADVICE, "methods": {**ADVICE["methods"], "basis": {**_saving(-28.0, -29.0, -26.0),
                                                                  "info": {"table_uses": 2.0}}}}
    table = {"rows": [TABLE["rows"][0], {"method": "basis", "tokens_to_threshold_mean": 2000.0,
                                         "tokens_to_threshold_reached": 1, "table_tokens": 40000.0}]}
    row = {r["method"]: r for r in m.compare(advice, table, "grpo_g8")["rows"]}["basis"]
    assert row["table_tokens_charged"] == 20000.0 and row["tokens_to_threshold"] == 22000.0
    assert row["measured_saving"] == pytest.approx(1 - 22000 / 4000) and row["verdict"] == "right"
    assert row["online_saving"] == pytest.approx(0.5)  # online tokens alone would have read a saving
    assert "online only +50 %, table 20,000 tokens charged" in m.markdown(m.compare(advice, table, "grpo_g8"))


def test_cli_writes_json_and_refuses_a_table_without_the_baseline(tmp_path, capsys):
    m = _mod()
    (tmp_path / "a.json").write_text(json.dumps(ADVICE))
    (tmp_path / "t.json").write_text(json.dumps(TABLE))
    assert m.main(["--advice", str(tmp_path / "a.json"), "--table", str(tmp_path / "t.json"),
                   "--output", str(tmp_path / "o.json")]) == 0
    assert json.load(open(tmp_path / "o.json"))["sign_wrong"] == 1 and "Sign right 1" in capsys.readouterr().out
    assert m.main(["--advice", str(tmp_path / "a.json"), "--table", str(tmp_path / "t.json"),
                   "--baseline", "grpo_g16"]) == 1

"""Tests of benchmark v2 in ``benchmarks/compare_trainers.py`` (the v1 harness is tested in
``tests/test_compare_trainers.py``).

What is checked:

* presets and protocols: the ``scratchpad`` CPU preset, ``--scale gpu`` keeping the GPU preset, v2 defaults (seeds
  0-4, the lr grid), argument conflicts; v1 run keys unchanged (finished v1 runs stay reusable);
* learning-rate choice on synthetic tuning records (best mean validation accuracy, ties to the lower rate, failed
  and skipped methods, merging with an existing ``lr_choice.json``, the settings check);
* the validation split: from the train split, disjoint from the training prompts and from the test split;
* BASIS cost accounting: the counting reward wrapper, counted / extrapolated table tokens, amortization arithmetic
  and the table columns;
* verdict references: the best GRPO setting by mean final accuracy (not by a single seed), REINFORCE++, DAPO;
* the per-difficulty (``n_digits``) aggregation;
* the ``tiebreak`` method's reward wiring (binary checker + graded scorer, scorer index, evaluation on the binary
  reward; skipped with a reason on a task without a graded reward);
* one end-to-end ``--smoke --protocol v2`` run on ``scratchpad`` with an untrained tiny model: ``lr_choice.json``,
  ``runs.json`` and ``table.json`` carry the new fields, tuning never touches the test split, and an existing
  ``lr_choice.json`` is read instead of re-tuning.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bench_module import compare_trainers  # tests/ is on sys.path (pytest's rootdir insertion)
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from trl_ext.testbed import read_outcomes_jsonl

torch.set_num_threads(1)


ct = compare_trainers()
jobs_mod = sys.modules["compare_harness.jobs"]  # loaded by the script above (benchmarks/ on sys.path)


def _settings(*argv):
    return ct.resolve_settings(ct.build_parser().parse_args(["--output_dir", "unused", *argv]))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from trl_ext.testbed import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


# ------------------------------------------------------------------------------------------ presets, protocols
def test_presets_and_protocols():
    from trl_ext.testbed import TASKS

    s = _settings("--task", "scratchpad")
    assert s["task"] == "scratchpad" and s["protocol"] == "v1" and s["tune_lr"] is None and s["seeds"] == [0, 1, 2]
    assert s["token_budget"] == 400_000 and s["eval_every_tokens"] == 100_000 and s["rollouts_per_step"] == 64
    assert s["use_cpu"] and not s["bf16"]
    assert TASKS["scratchpad"].max_answer_chars() + 2 == 73  # the harness's max_completion_length default
    a = _settings()  # addition keeps the v1 preset
    assert a["task"] == "addition" and a["token_budget"] == 40_000 and a["eval_every_tokens"] == 5_000
    assert a["learning_rate"] == 1e-4 and a["threshold_reference"] == ct.GRPO_REFERENCE
    g = _settings("--scale", "gpu", "--task", "scratchpad")
    assert g["rollouts_per_step"] == 256 and g["bf16"] and not g["use_cpu"] and g["token_budget"] == 4_000_000
    v2 = _settings("--protocol", "v2", "--task", "scratchpad")
    assert v2["seeds"] == [0, 1, 2, 3, 4] and v2["tune_lr"] == [3e-5, 1e-4, 3e-4] and v2["tune_seeds"] == [0]
    assert v2["threshold_reference"] == "best_grpo" and v2["token_budget"] == 400_000
    assert set(v2["methods"]) >= {"grpo_g4", "grpo_g8", "grpo_g16", "reinforce_pp", "rloo", "dapo_dynamic", "basis",
                                  "v05_osla", "v05_fixed4", "pair", "signal_only", "tiebreak"}
    assert _settings("--protocol", "v2", "--no_tune", "--learning_rate", "2e-4")["tune_lr"] is None
    assert _settings("--tune_lr", "3e-4", "1e-4", "3e-4")["tune_lr"] == [1e-4, 3e-4]  # v1 + tuning: sorted, unique
    for bad in (["--protocol", "v2", "--learning_rate", "1e-4"], ["--tune_lr", "1e-4", "--learning_rate", "1e-4"],
                ["--tune_lr", "1e-4", "--no_tune"], ["--config_overrides", '{"learning_rate": 0.1}']):
        with pytest.raises(SystemExit):
            _settings(*bad)


def test_v1_run_keys_are_unchanged():
    """A v1 main run's reuse key is the hash of exactly the v1 fields, so finished v1 results stay reusable."""
    s = _settings()
    spec = ct.METHODS["basis"]
    v1 = {k: s[k] for k in ("task", "rollouts_per_step", "token_budget", "eval_every_tokens", "n_eval", "n_train",
                            "learning_rate", "eval_samples", "model_name_or_path", "warm_seed", "dataset_fn",
                            "reward_fn", "max_completion_length", "config_overrides", "bf16", "use_cpu")}
    v1.update(method="basis", seed=1, group_size=1, config_kwargs={})
    expected = hashlib.sha256(json.dumps(v1, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert ct._settings_key(s, spec, 1) == expected == ct._settings_key(s, spec, 1, lr=1e-4)
    # a tuned rate, the validation split and the tiebreak's graded reward all change the key
    keys = {ct._settings_key(s, spec, 1, lr=3e-4), ct._settings_key(s, spec, 1, split="validation"), expected,
            ct._settings_key(s, ct.METHODS["tiebreak"], 1)}
    assert len(keys) == 4


def test_v2_keys_pin_the_start_checkpoint(tiny_model, tmp_path):
    from trl_ext.testbed import save_tiny_model

    other = save_tiny_model(tmp_path / "other", seed=1)
    fp = ct.checkpoint_fingerprint(tiny_model)
    assert fp == ct.checkpoint_fingerprint(tiny_model) != ct.checkpoint_fingerprint(other)
    assert ct.checkpoint_fingerprint("org/hub-id") == "org/hub-id"
    s = _settings("--protocol", "v2")
    spec = ct.METHODS["grpo_g8"]
    s["start_checkpoint_sha"] = fp
    k1 = ct._settings_key(s, spec, 0, lr=1e-4)
    s["start_checkpoint_sha"] = ct.checkpoint_fingerprint(other)
    assert ct._settings_key(s, spec, 0, lr=1e-4) != k1  # a rebuilt warm model is not reused
    assert "start_checkpoint_sha" in ct.tuning_context(s)


# ------------------------------------------------------------------------------------------ learning-rate choice
def _tune(method, lr, seed, acc, status="ok"):
    rec = {"method": method, "learning_rate": lr, "seed": seed, "status": status, "tokens": 100.0}
    if status == "ok":
        rec["final_greedy_accuracy"] = acc
    else:
        rec["reason"] = "boom"
    return rec


def test_lr_choice_best_mean_ties_failed_skipped():
    runs = [
        # grpo_g8: 1e-4 wins on the mean (0.55) although 3e-4 has the best single seed (0.70)
        _tune("grpo_g8", 3e-5, 0, 0.40), _tune("grpo_g8", 3e-5, 1, 0.42),
        _tune("grpo_g8", 1e-4, 0, 0.55), _tune("grpo_g8", 1e-4, 1, 0.55),
        _tune("grpo_g8", 3e-4, 0, 0.70), _tune("grpo_g8", 3e-4, 1, 0.30),
        # basis: exact tie between 1e-4 and 3e-4 -> the lower rate; 3e-5 had a failed seed -> not eligible
        _tune("basis", 3e-5, 0, 0.90), _tune("basis", 3e-5, 1, None, "failed"),
        _tune("basis", 1e-4, 0, 0.5), _tune("basis", 3e-4, 0, 0.5),
        # pair: every run failed; tiebreak: skipped (no graded reward)
        _tune("pair", 1e-4, 0, None, "failed"),
        {"method": "tiebreak", "learning_rate": 3e-5, "seed": 0, "status": "skipped", "reason": "no graded reward"},
    ]
    scores = ct.lr_scores(runs)
    assert list(scores["grpo_g8"]) == ["3e-05", "0.0001", "0.0003"]  # ordered by rate
    assert scores["grpo_g8"]["0.0001"]["mean"] == pytest.approx(0.55)
    assert scores["grpo_g8"]["0.0003"]["per_seed"] == [0.70, 0.30]
    assert ct.choose_lr(scores["grpo_g8"])[0] == 1e-4
    lr, why = ct.choose_lr(scores["basis"])
    assert lr == 1e-4 and "lower learning rate" in why
    assert ct.choose_lr(scores["pair"])[0] is None
    doc = ct.build_lr_choice(runs, [3e-5, 1e-4, 3e-4], [0, 1], {"task": "scratchpad"})
    m = doc["methods"]
    assert m["grpo_g8"]["chosen_lr"] == 1e-4 and m["grpo_g8"]["status"] == "ok"
    assert m["grpo_g8"]["tuning_tokens"] == 600.0
    assert m["basis"]["chosen_lr"] == 1e-4
    assert m["pair"]["status"] == "failed" and m["pair"]["chosen_lr"] is None
    assert m["tiebreak"]["status"] == "skipped" and m["tiebreak"]["reason"] == "no graded reward"
    assert doc["grid"] == [3e-5, 1e-4, 3e-4] and "validation" in doc["split"]
    # main-run learning rates follow the choice; a method without one is not trained
    s = {"methods": ["grpo_g8", "pair", "rloo"], "learning_rate": 1e-4}
    lrs = ct.method_learning_rates(s, doc)
    assert lrs["grpo_g8"][0] == 1e-4 and "tuned" in lrs["grpo_g8"][1]
    assert lrs["pair"][0] is None and lrs["rloo"][0] is None
    assert ct.method_learning_rates(s, None)["rloo"] == (1e-4, "fixed (--learning_rate / preset)")


def test_lr_choice_merge_and_context_check():
    old = ct.build_lr_choice([_tune("grpo_g8", 1e-4, 0, 0.5), _tune("grpo_g8", 3e-4, 0, 0.6)], [1e-4, 3e-4], [0],
                             {"task": "scratchpad", "token_budget": 400000.0})
    new = ct.build_lr_choice([_tune("grpo_g8", 1e-4, 0, 0.9), _tune("rloo", 1e-4, 0, 0.4)], [1e-4], [0],
                             {"task": "scratchpad", "token_budget": 400000.0})
    merged = ct.merge_lr_choice(old, new)
    assert merged["methods"]["grpo_g8"]["chosen_lr"] == 3e-4  # an existing choice is never replaced
    assert merged["methods"]["rloo"]["chosen_lr"] == 1e-4 and merged["notes"]
    assert ct.merge_lr_choice(None, new) is new
    failed = {**old, "methods": {"pair": {"status": "failed", "chosen_lr": None}}}
    retuned = ct.build_lr_choice([_tune("pair", 1e-4, 0, 0.3)], [1e-4], [0], {})
    assert ct.merge_lr_choice(failed, retuned)["methods"]["pair"]["chosen_lr"] == 1e-4  # a failed tuning is retried
    s = _settings("--task", "scratchpad", "--protocol", "v2")
    doc = {"context": json.loads(json.dumps(ct.tuning_context(s)))}
    ct.check_lr_choice_context(doc, s, "lr_choice.json")  # same settings: fine
    doc["context"]["token_budget"] = 1.0
    with pytest.raises(SystemExit, match="token_budget"):
        ct.check_lr_choice_context(doc, s, "lr_choice.json")


def test_validation_split_is_disjoint_from_training_and_test(tiny_model):
    s = _settings("--smoke", "--task", "scratchpad", "--model_name_or_path", tiny_model, "--n_val", "300")
    ctx = ct.Context(s)
    val = ctx.val_ds
    val_q, train_q, test_q = set(val["question_id"]), set(ctx.train_ds["question_id"]), set(ctx.eval_ds["question_id"])
    assert len(val) == len(val_q) == 300
    assert not val_q & train_q and not val_q & test_q
    assert ctx.dataset("validation") is val and ctx.dataset("test") is ctx.eval_ds
    pool = ctx.train_ds.select(range(10))
    with pytest.raises(SystemExit, match="n_val"):
        ct.validation_split(pool, ctx.train_ds, 1)


# ------------------------------------------------------------------------------------------ costs
def test_basis_cost_amortization_and_table_columns():
    assert ct.amortized_total(1000, 5000, 1) == 6000
    assert ct.amortized_total(1000, 5000, 10) == 1500
    with pytest.raises(ValueError):
        ct.amortized_total(1, 1, 0)
    cols = ct.cost_columns(40_000.0, 128_000.0)
    assert cols == {"online_tokens": 40_000.0, "table_tokens": 128_000.0, "total_tokens": 168_000.0,
                    "total_tokens_table_over_1": 168_000.0, "total_tokens_table_over_10": 52_800.0}
    assert ct.cost_columns(500.0, None)["total_tokens_table_over_10"] == 500.0  # no table: total = online
    info = {"table_tokens": 128_000.0, "table_build_wall_s": 12.0}
    runs = [{"method": "basis", "label": "BASIS", "status": "ok", "seed": sd, "final_greedy_accuracy": 0.5,
             "curve": [{"tokens": tok, "greedy_accuracy": 0.5}], "tokens": tok, "train_wall_s": 1.0, "steps": 3,
             "rollouts_per_step": 64.0, "setup_info": info, "learning_rate": 1e-4}
            for sd, tok in enumerate([39_000.0, 41_000.0])]
    tune = [{"method": "basis", "tokens": 40_000.0}] * 3
    row = ct.summarize(runs, 0.6, 0.4, tune)[0]
    assert row["online_tokens"] == 40_000.0 and row["table_tokens"] == 128_000.0
    assert row["total_tokens"] == 168_000.0 and row["total_tokens_table_over_10"] == 52_800.0
    assert row["tuning_tokens"] == 120_000.0 and row["table_build_wall_s"] == 12.0
    md = ct.table_markdown([row], 0.6, {"token_budget": 40_000, "n_eval": 64, "test_eval_samples": 4}, n_eval=48)
    assert "| 40000 | 128000 | 168000 | 52800 |" in md and "table / 10" in md
    # the questions actually evaluated (a test split smaller than --n_eval), not the setting
    assert "48 held-out questions (greedy, 4 samples each)" in md and "64 held-out" not in md


def test_table_cost_record_counted_and_extrapolated():
    full = ct.table_cost_record(3200, n_written=100, n_already_done=0, samples_per_prompt=32, build_wall_s=1.0)
    assert full["table_tokens"] == 3200.0 and full["table_tokens_source"] == "counted"
    assert full["table_prompts"] == 100 and full["table_samples_per_prompt"] == 32
    part = ct.table_cost_record(3200, n_written=100, n_already_done=300, samples_per_prompt=32, build_wall_s=1.0)
    assert part["table_tokens"] == 12800.0 and part["table_tokens_source"].startswith("extrapolated")
    none = ct.table_cost_record(0, n_written=0, n_already_done=5, samples_per_prompt=32, build_wall_s=0.0)
    assert none["table_tokens"] is None


def test_counting_reward_counts_sampled_tokens_and_keeps_the_name():
    from trl_ext.priors.value_table import reward_func_name
    from trl_ext.testbed.tasks import scratchpad_reward

    counter = {}
    f = ct.counting_reward(scratchpad_reward, counter)
    assert reward_func_name(f) == "scratchpad_reward"  # the value-table header and BASIS's check see the same name
    out = f(prompts=["1+2="] * 2, completions=["1+2+0=3|3", "x"], completion_ids=[[5] * 10, [7, 1]],
            answer=["3", "3"])
    assert out == [1.0, 0.0] and counter == {"tokens": 12, "completions": 2}


def test_basis_setup_counts_the_table_tokens(tiny_model, tmp_path):
    """The cached cost equals the generated tokens of an independent regeneration of the same keyed samples."""
    from trl_ext.measurement.keyed_sampling import SamplerSettings, keyed_generate
    from trl_ext.priors.table_format import prompt_key
    from trl_ext.priors.value_table import value_table_seed

    s = _settings("--smoke", "--task", "scratchpad", "--model_name_or_path", tiny_model, "--n_train", "6",
                  "--value_table_samples", "3", "--max_completion_length", "12", "--cache_dir", str(tmp_path))
    ctx = ct.Context(s)
    res = ct.setup_basis(ctx)
    info = res.info
    assert info["table_tokens_source"] == "counted" and info["table_prompts"] == 6
    assert res.config["basis_value_table_path"] == info["table_path"] and os.path.exists(info["table_path"])
    model = ctx.load_model().eval()
    tok = ctx.tokenizer
    settings = SamplerSettings(temperature=1.0, top_p=1.0, max_new_tokens=12, eos_token_ids=[tok.eos_token_id],
                               pad_token_id=tok.pad_token_id)
    prompts = list(ctx.train_ds["prompt"])
    ids = [tok(text=[p])["input_ids"][0] for p in prompts for _ in range(3)]
    keys = [value_table_seed(12345, prompt_key(p)) for p in prompts for _ in range(3)]
    comps = keyed_generate(model, ids, keys, [k for _ in prompts for k in range(3)], settings)
    assert info["table_tokens"] == sum(len(c) for c in comps)
    assert ct.setup_basis(ctx).info == json.loads(json.dumps(info))  # second call: read from the cache


def test_v2_pins_the_value_table_in_the_output_dir_keyed_by_the_weights(tiny_model, tmp_path, monkeypatch):
    """Under v2 the table lives in ``<output_dir>/value_table/`` and is keyed by the start checkpoint's weights: a
    second machine (other cache, the same weights at another path) reuses it with its token count and builds
    nothing."""
    import shutil

    argv = ("--protocol", "v2", "--smoke", "--task", "scratchpad", "--n_train", "5", "--value_table_samples", "2",
            "--max_completion_length", "10")
    out = tmp_path / "out"
    s = ct.resolve_settings(ct.build_parser().parse_args(
        ["--output_dir", str(out), *argv, "--model_name_or_path", tiny_model, "--cache_dir", str(tmp_path / "c1")]))
    first = ct.setup_basis(ct.Context(s))
    table = first.config["basis_value_table_path"]
    assert os.path.dirname(table) == os.path.join(str(out), ct.VALUE_TABLE_DIR) and os.path.exists(table)
    assert first.info["table_tokens_source"] == "counted" and first.info["table_tokens"] > 0
    assert not os.path.exists(tmp_path / "c1") or not os.listdir(tmp_path / "c1")  # nothing in the cache
    cost_files = [f for f in os.listdir(os.path.dirname(table)) if f.endswith(".cost.json")]
    with open(os.path.join(os.path.dirname(table), cost_files[0]), encoding="utf-8") as f:
        assert "table_path" not in json.load(f)  # no machine path in the committed record

    moved = tmp_path / "elsewhere" / "model"
    shutil.copytree(tiny_model, moved)
    monkeypatch.setattr("trl_ext.priors.value_table.build_value_table",
                        lambda *a, **k: pytest.fail("the pinned table was rebuilt"))
    s2 = ct.resolve_settings(ct.build_parser().parse_args(
        ["--output_dir", str(out), *argv, "--model_name_or_path", str(moved), "--cache_dir", str(tmp_path / "c2")]))
    again = ct.setup_basis(ct.Context(s2))
    assert again.config == first.config and again.info == json.loads(json.dumps(first.info))


# ------------------------------------------------------------------------------------------ references, difficulty
def _final(method, accs, family=None):
    return [{"method": method, "seed": i, "status": "ok", "final_greedy_accuracy": a,
             **({"family": family} if family else {})} for i, a in enumerate(accs)]


def test_best_grpo_reference_by_mean_and_verdict_references():
    runs = (_final("grpo_g16", [0.95, 0.40, 0.40])  # best single seed, worst mean (0.583)
            + _final("grpo_g8", [0.62, 0.62, 0.62])  # best mean
            + _final("grpo_g4", [0.60, 0.61, 0.62])
            + _final("reinforce_pp", [0.99, 0.99, 0.99])  # not a GRPO setting: never the best GRPO
            + _final("signal_only", [0.99, 0.99, 0.99]))
    assert ct.best_grpo_method(runs) == "grpo_g8"
    refs = ct.verdict_references(runs)
    assert refs == {"vs_best_grpo": "grpo_g8", "vs_reinforce_pp": "reinforce_pp", "vs_dapo_dynamic": None,
                    "vs_grpo_g16": "grpo_g16"}
    thr, rule = ct.choose_threshold(runs, None, 0.3, "best_grpo")
    assert thr == pytest.approx(0.62) and "grpo_g8" in rule
    assert ct.choose_threshold(runs, None, 0.3)[0] == pytest.approx((0.95 + 0.4 + 0.4) / 3)  # v1: grpo_g16
    # ties go to the larger group size; failed runs do not count
    tie = _final("grpo_g4", [0.5]) + _final("grpo_g16", [0.5]) + [{"method": "grpo_g8", "status": "failed"}]
    assert ct.best_grpo_method(tie) == "grpo_g16"
    assert ct.best_grpo_method(_final("rloo", [0.9])) is None


def test_per_difficulty_aggregation():
    levels = {"q1": "2", "q2": "2", "q3": "10", "q4": "7"}
    records = [{"question_id": "q1", "pass_rate": 1.0}, {"question_id": "q2", "pass_rate": 0.0},
               {"question_id": "q3", "pass_rate": 1.0}, {"question_id": "q4", "pass_rate": 0.5},
               {"question_id": "unknown", "pass_rate": 1.0}]
    by = ct.accuracy_by_level(records, levels)
    assert list(by) == ["2", "7", "10"]  # numeric order, not string order
    assert by["2"] == {"n": 2, "accuracy": 0.5} and by["10"] == {"n": 1, "accuracy": 1.0}
    assert ct.accuracy_by_level(records, None) is None
    runs = [{"final_accuracy_by_level": {"2": {"n": 2, "accuracy": a}, "3": {"n": 4, "accuracy": b}}}
            for a, b in ((0.5, 0.0), (1.0, 0.5))]
    agg = ct.aggregate_by_level(runs)
    assert agg["2"]["mean"] == 0.75 and agg["2"]["per_seed"] == [0.5, 1.0] and agg["3"]["n_questions"] == 4
    assert agg["3"]["mean"] == 0.25 and agg["3"]["sd"] == pytest.approx(0.125 ** 0.5)  # sample sd over seeds
    assert ct.aggregate_by_level([{"final_accuracy_by_level": None}]) is None
    row = {"status": "ok", "label": "X", "accuracy_by_level": agg}
    md = ct.difficulty_markdown([row], {"2": {"n": 2, "accuracy": 0.25}, "3": {"n": 4, "accuracy": 0.0}})
    assert "| X | 0.750 | 0.250 |" in md and "| start checkpoint | 0.250 | 0.000 |" in md
    assert ct.difficulty_markdown([{"status": "ok", "label": "X"}], None) == ""


# ------------------------------------------------------------------------------------------ tiebreak wiring
def test_tiebreak_reward_wiring(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from trl_ext.testbed.tasks import scratchpad_reward, scratchpad_steps_reward
    from trl_ext.trainers.base import ExtGRPOConfig, GRPOTrainer

    s = _settings("--smoke", "--task", "scratchpad", "--model_name_or_path", tiny_model)
    ctx = ct.Context(s)
    spec = ct.METHODS["tiebreak"]
    res = ct.setup_tiebreak(ctx)
    assert res.reward_funcs == [scratchpad_reward, scratchpad_steps_reward]
    assert res.config == {"tie_break_scorer_index": 1} and res.info == {"graded_reward": "scratchpad_steps_reward"}
    assert ctx.eval_reward_name == "scratchpad_reward"  # evaluation keeps the binary reward
    config, kw, _ = ct.build_config(ctx, spec, ExtGRPOConfig, GRPOTrainer, 0, str(tmp_path), res.config)
    assert kw["num_generations"] == 8 and config.tie_break_scorer_index == 1 and config.tie_break_epsilon == 0.1
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model), reward_funcs=res.reward_funcs,
                          args=config, train_dataset=ctx.train_ds, processing_class=ctx.tokenizer)
    assert list(trainer.reward_func_names) == ["scratchpad_reward", "scratchpad_steps_reward"]
    # the checker decides, the graded reward separates attempts the checker tied (right answer, one wrong column)
    sol = "7+5+0=12,4+8+1=13|132"
    comps = [sol, "7+5+0=12,4+8+0=12|132", "7+5+0=12,4+8+0=12|122"]
    assert scratchpad_reward(None, comps, answer=["132"] * 3) == [1.0, 1.0, 0.0]
    assert scratchpad_steps_reward(None, comps, solution=[sol] * 3) == pytest.approx([1.0, 2 / 3, 1 / 3])
    # a task without a graded reward: the method is recorded as skipped with the reason
    actx = SimpleNamespace(graded_reward=None, task="addition")
    with pytest.raises(ct.MethodUnavailable, match="graded reward"):
        ct.setup_tiebreak(actx)
    rec = ct.run_one(SimpleNamespace(s=_settings(), graded_reward=None, task="addition"), spec, 0, str(tmp_path), {})
    assert rec["status"] == "skipped" and "graded reward" in rec["reason"]


# ------------------------------------------------------------------------------------------ smoke end to end
def test_smoke_v2_scratchpad_end_to_end(tiny_model, tmp_path):
    out = tmp_path / "out"
    base = ["--output_dir", str(out), "--smoke", "--protocol", "v2", "--task", "scratchpad", "--model_name_or_path",
            tiny_model, "--cache_dir", str(tmp_path / "cache"), "--value_table_samples", "2", "--n_train", "32"]
    rc = ct.main([*base, "--methods", "grpo_g8", "basis", "tiebreak", "--tune_lr", "1e-4", "3e-4", "--seeds", "0", "1"])
    assert rc == 0
    choice = json.loads((out / "lr_choice.json").read_text())
    assert choice["grid"] == [1e-4, 3e-4] and choice["tune_seeds"] == [0]
    assert choice["context"]["task"] == "scratchpad"
    for m in ("grpo_g8", "basis", "tiebreak"):
        c = choice["methods"][m]
        assert c["status"] == "ok" and c["chosen_lr"] in (1e-4, 3e-4), (m, c)
        assert set(c["scores"]) == {"0.0001", "0.0003"} and all(v["n_ok"] == 1 for v in c["scores"].values())

    doc = json.loads((out / "runs.json").read_text())
    assert doc["settings"]["protocol"] == "v2" and doc["n_val"] == 40 and doc["lr_choice"]["methods"]
    assert set(doc["start_accuracy_by_level"]) <= {"2", "3", "4", "5", "6", "7"}
    test_q = {x["question_id"] for x in read_outcomes_jsonl(out / doc["runs"][0]["outcomes"])}
    tune = doc["tuning_runs"]
    assert len(tune) == 6 and all(r["eval_split"] == "validation" and r["status"] == "ok" for r in tune)
    for r in tune:  # tuning never evaluates on the test split, and evaluates only at the budget
        assert "/tune/" in r["outcomes"] and len(r["curve"]) == 1
        qs = {x["question_id"] for x in read_outcomes_jsonl(out / r["outcomes"])}
        assert len(qs) == 40 and not qs & test_q
    by = {(r["method"], r["seed"]): r for r in doc["runs"]}
    assert set(by) == {(m, sd) for m in ("grpo_g8", "basis", "tiebreak") for sd in (0, 1)}
    for (m, _), r in by.items():
        assert r["status"] == "ok", (m, r.get("reason"))
        assert r["learning_rate"] == choice["methods"][m]["chosen_lr"] == r["config"]["learning_rate"]
        assert r["lr_source"].startswith("tuned") and r["eval_split"] == "test"
        assert r["eval_reward"] == "scratchpad_reward" and r["token_metric"] == ct.TOKEN_METRIC
        assert set(r["final_accuracy_by_level"]) <= {"2", "3", "4", "5", "6", "7"}
        assert sum(c["n"] for c in r["final_accuracy_by_level"].values()) == doc["n_eval"]
    assert by[("tiebreak", 0)]["reward_funcs"] == ["scratchpad_reward", "scratchpad_steps_reward"]
    assert by[("tiebreak", 0)]["last_log"]["tie_break/frac_tied_by_checker"] >= 0  # the blend ran in training
    assert by[("grpo_g8", 0)]["reward_funcs"] == ["scratchpad_reward"]
    info = by[("basis", 0)]["setup_info"]
    assert info["table_tokens_source"] == "counted" and info["table_prompts"] == 32
    assert 32 * 2 <= info["table_tokens"] <= 32 * 2 * doc["max_completion_length"]

    table = json.loads((out / "table.json").read_text())
    assert table["amortize_over"] == [1, 10] and table["threshold_rule"].startswith("mean final accuracy of the best")
    rows = {r["method"]: r for r in table["rows"]}
    b = rows["basis"]
    assert b["table_tokens"] == info["table_tokens"]
    assert b["total_tokens"] == pytest.approx(b["online_tokens"] + b["table_tokens"])
    assert b["total_tokens_table_over_10"] == pytest.approx(b["online_tokens"] + b["table_tokens"] / 10)
    assert b["tuning_tokens"] > 0 and b["learning_rate"] == choice["methods"]["basis"]["chosen_lr"]
    g = rows["grpo_g8"]
    assert g["table_tokens"] == 0 and g["total_tokens"] == g["online_tokens"]
    for r in rows.values():
        assert set(r["accuracy_by_level"]) <= {"2", "3", "4", "5", "6", "7"}
        assert {"final_accuracy_mean", "final_accuracy_sd", "tokens_to_threshold_mean", "train_wall_s_mean"} <= set(r)
    assert "n_digits" in (out / "table.md").read_text()
    v = json.loads((out / "verdicts.json").read_text())
    assert v["references"]["vs_best_grpo"] == "grpo_g8"
    assert {(c["a"], c["b"]) for c in v["comparisons"]} == {("basis", "grpo_g8"), ("tiebreak", "grpo_g8")}
    assert (out / "accuracy_vs_tokens.png").is_file() and (out / "accuracy_vs_walltime.png").is_file()

    # an existing lr_choice.json is read instead of re-tuning: no tuning run trains again, its choice is used
    other = 3e-4 if choice["methods"]["grpo_g8"]["chosen_lr"] == 1e-4 else 1e-4
    choice["methods"]["grpo_g8"]["chosen_lr"] = other
    (out / "lr_choice.json").write_text(json.dumps(choice))
    rc = ct.main([*base, "--methods", "grpo_g8", "--seeds", "0", "--no_plots"])
    assert rc == 0
    again = json.loads((out / "runs.json").read_text())
    assert again["runs"][0]["learning_rate"] == other == again["runs"][0]["config"]["learning_rate"]
    walls = {r["settings_key"]: r["run_wall_s"] for r in tune}
    assert {r["settings_key"]: r["run_wall_s"] for r in again["tuning_runs"]} == {
        r["settings_key"]: walls[r["settings_key"]] for r in tune if r["method"] == "grpo_g8"}


def test_step_trace_and_update_norms():
    logs = [{"step": 1, "reward": 0.5, "grad_norm": 2.0, "adv/abs_mean": 0.7, "pair/pi_min": 0.2, "loss": 0.1,
             "ext/generated_tokens_total": 10.0},
            {"step": 2, "reward": 0.25, "grad_norm": None, "ext/generated_tokens_total": 20.0}]
    tr = ct.step_trace(logs, {1: 0.03, 2: 0.04})
    assert tr == [{"step": 1, "reward": 0.5, "grad_norm": 2.0, "adv/abs_mean": 0.7, "pair/pi_min": 0.2,
                   "update_norm": 0.03},
                  {"step": 2, "reward": 0.25, "update_norm": 0.04}]
    assert ct.step_trace(logs[:1]) == [{"step": 1, "reward": 0.5, "grad_norm": 2.0, "adv/abs_mean": 0.7,
                                        "pair/pi_min": 0.2}]
    # the regime benchmark's mechanism diagnostics are traced per step
    mech = {"v05/rollouts_per_prompt_mean": 5.0, "basis/beta": 0.4, "adv/js_lambda": 0.3, "pair/head_auc": 0.7,
            "dapo/keep_rate": 0.5, "gate/tied_share": 0.25}
    assert ct.step_trace([{"step": 3, **mech}]) == [{"step": 3, **mech}]
    # the callback measures exactly the parameter change of each optimizer step (frozen parameters excluded)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model[1].weight.requires_grad_(False)
    cb = ct.UpdateNormCallback()
    cb.on_train_begin(None, None, None, model=model)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        model[0].weight.add_(0.5)
        model[1].weight.add_(10.0)  # frozen: not counted
    cb.on_step_end(None, SimpleNamespace(global_step=1), None, model=model)
    assert cb.norms == {1: pytest.approx(float((model[0].weight - before[0]).norm()))}
    cb.on_step_end(None, SimpleNamespace(global_step=2), None, model=model)
    assert cb.norms[2] == 0.0


def test_lr_ladder_and_edge_extension():
    """Tuning that ends at an edge of the rates tried extends the grid one 1-3-10 step beyond that edge."""
    assert ct.lr_ladder_neighbour(3e-5, -1) == pytest.approx(1e-5)
    assert ct.lr_ladder_neighbour(3e-4, +1) == pytest.approx(1e-3)
    assert ct.lr_ladder_neighbour(1e-4, -1) == pytest.approx(3e-5)
    assert ct.lr_ladder_neighbour(2e-4, +1) == pytest.approx(3e-4)  # off-ladder input
    with pytest.raises(ValueError):
        ct.lr_ladder_neighbour(1e-4, 0)

    def runs(acc_by_lr):
        return [{"method": "m", "learning_rate": lr, "seed": 0, "status": "ok", "final_greedy_accuracy": a}
                for lr, a in acc_by_lr.items()]

    low = ct.lr_scores(runs({3e-5: 0.7, 1e-4: 0.6, 3e-4: 0.3}))["m"]
    assert ct.edge_extension(low) == pytest.approx(1e-5)
    high = ct.lr_scores(runs({3e-5: 0.3, 1e-4: 0.6, 3e-4: 0.7}))["m"]
    assert ct.edge_extension(high) == pytest.approx(1e-3)
    inner = ct.lr_scores(runs({3e-5: 0.3, 1e-4: 0.7, 3e-4: 0.6}))["m"]
    assert ct.edge_extension(inner) is None
    assert ct.edge_extension(ct.lr_scores(runs({1e-4: 0.7}))["m"]) is None  # one rate: nothing to bracket
    assert ct.edge_extension(ct.lr_scores(runs({3e-5: 0.0, 1e-4: 0.0, 3e-4: 0.0}))["m"]) is None  # all tied
    assert ct.edge_extension(ct.lr_scores(runs({3e-5: 0.5, 1e-4: 0.5, 3e-4: 0.1}))["m"]) is None  # tied best
    failed = runs({3e-5: 0.7, 1e-4: 0.6})
    failed[0]["status"] = "failed"
    assert ct.edge_extension(ct.lr_scores(failed)["m"]) == pytest.approx(3e-4)  # 1e-4 is the only eligible


def test_tuning_loop_extends_at_the_edge_and_stops(monkeypatch, tmp_path):
    """tune_learning_rates runs the grid, then at most ``tune_extend`` extra rates while the best stays at an edge."""
    calls = []

    def fake_run(ctx, spec, seed, run_dir, setup_cache, lr, split="test"):
        calls.append(lr)
        return {"method": spec.name, "learning_rate": lr, "seed": seed, "status": "ok",
                "final_greedy_accuracy": 1.0 - lr * 1e3, "tokens": 10.0}  # lower is always better

    monkeypatch.setattr(ct.harness_runs, "run_or_reuse", fake_run)
    s = {"output_dir": str(tmp_path), "methods": ["grpo_g8"], "tune_lr": [3e-5, 1e-4, 3e-4], "tune_seeds": [0],
         "tune_extend": 2, "task": "addition"}
    ctx = SimpleNamespace(s=s)
    doc, tune_runs = ct.tune_learning_rates(ctx, {})
    assert calls == pytest.approx([3e-5, 1e-4, 3e-4, 1e-5, 3e-6])
    assert doc["methods"]["grpo_g8"]["chosen_lr"] == pytest.approx(3e-6)
    assert len(doc["methods"]["grpo_g8"]["scores"]) == 5
    calls.clear()
    s2 = dict(s, output_dir=str(tmp_path / "b"), tune_extend=0)
    ct.tune_learning_rates(SimpleNamespace(s=s2), {})
    assert calls == pytest.approx([3e-5, 1e-4, 3e-4])


def test_start_checkpoint_is_pinned_in_the_output_dir_under_v2(tmp_path):
    """v2 copies the warm model into --output_dir once and starts every later invocation from that copy."""
    src = tmp_path / "warm"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"weights")
    built = []

    def build():
        built.append(1)
        return str(src)

    s = {"output_dir": str(tmp_path / "out"), "tune_lr": [1e-4]}
    first = ct.pinned_start_checkpoint(s, build)
    assert first == os.path.join(s["output_dir"], ct.START_CHECKPOINT_DIR) and built == [1]
    assert ct.checkpoint_fingerprint(first) == ct.checkpoint_fingerprint(str(src))
    (src / "model.safetensors").write_bytes(b"rebuilt elsewhere")  # a different warm model on another machine
    again = ct.pinned_start_checkpoint(s, build)
    assert again == first and built == [1]
    assert ct.checkpoint_fingerprint(again) != ct.checkpoint_fingerprint(str(src))
    assert ct.pinned_start_checkpoint({"output_dir": str(tmp_path / "v1"), "tune_lr": None}, build) == str(src)
    assert not (tmp_path / "v1" / ct.START_CHECKPOINT_DIR).exists()


def test_trace_lives_in_its_own_file_and_old_inline_traces_still_read(tiny_model, tmp_path):
    """A new run keeps its per-step trace in trace.json.gz (deterministic gzip) and runs.json embeds no trace; a run
    written before that (trace inline in result.json) is reused, and both read back the same trace."""
    from trl_ext._io import write_json_compact

    out = tmp_path / "out"
    argv = ["--output_dir", str(out), "--smoke", "--model_name_or_path", tiny_model, "--methods", "grpo_g4",
            "--seeds", "0", "--update_norms", "--no_plots"]
    assert ct.main(argv) == 0
    run_dir = out / "runs" / "grpo_g4" / "seed0"
    res = json.loads((run_dir / "result.json").read_text())
    assert res["trace"] == os.path.join("runs", "grpo_g4", "seed0", ct.TRACE_FILE)
    assert (run_dir / ct.TRACE_FILE).read_bytes()[:2] == b"\x1f\x8b"  # gzip
    trace = ct.load_trace(res, str(out))
    assert trace and all("update_norm" in t for t in trace) and [t["step"] for t in trace] == list(
        range(1, res["steps"] + 1))
    assert ct.load_trace(res, str(run_dir)) == trace  # the run's own folder as the base works too
    again = write_json_compact(tmp_path / "again.json.gz", trace)
    assert open(again, "rb").read() == (run_dir / ct.TRACE_FILE).read_bytes()  # deterministic bytes
    doc = json.loads((out / "runs.json").read_text())
    assert doc["runs"][0]["trace"] == res["trace"] and '"update_norm"' not in (out / "runs.json").read_text()

    # an old record: the trace inline in result.json, no trace.json.gz; reused, and runs.json names the result.json
    old = {**res, "trace": trace}
    (run_dir / "result.json").write_text(json.dumps(old, indent=2, sort_keys=True))
    (run_dir / ct.TRACE_FILE).unlink()
    assert ct.main(argv) == 0
    reused = json.loads((out / "runs.json").read_text())["runs"][0]
    assert reused["run_wall_s"] == res["run_wall_s"]  # reused, not trained again
    assert reused["trace"] == os.path.join("runs", "grpo_g4", "seed0", "result.json")
    assert '"update_norm"' not in (out / "runs.json").read_text()
    assert json.loads((run_dir / "result.json").read_text()) == old  # the old record is not rewritten
    assert ct.load_trace(reused, str(out)) == ct.load_trace(old, str(out)) == trace
    # tuning records read from disk get the same reference
    assert [r["trace"] for r in ct._read_results(str(out / "runs"), str(out))] == [reused["trace"]]
    assert ct._read_results(str(out / "runs"))[0]["trace"] == trace
    assert ct.load_trace({"status": "failed"}, str(out)) is None


def test_engine_waits_are_recorded_per_checkpoint_and_per_run(tiny_model, tmp_path, monkeypatch):
    """An engine evaluation's wait for another worker (the engine lock plus free memory) is recorded on its
    checkpoint and summed on the run; each checkpoint's evaluation wall adds up to the run's; the per-call waits are
    kept out of ``eval_engine`` (the engine's setup)."""
    runs_mod = sys.modules["compare_harness.runs"]
    real = runs_mod.evaluate_checkpoint
    waits = {"lock_wait_s": 2.0, "memory_wait_s": 0.5, "engine_attempts": 1, "worker_rss_gb": 5.5}

    def on_engine(ctx, model, seed, split):
        g, sampled = real(ctx, model, seed, split)
        for r in (g, sampled):
            if r is not None:
                r.backend_settings = {"backend": "vllm", "dtype": "float32", **waits}
        return g, sampled

    monkeypatch.setattr(runs_mod, "evaluate_checkpoint", on_engine)
    out = tmp_path / "out"
    assert ct.main(["--output_dir", str(out), "--smoke", "--model_name_or_path", tiny_model, "--methods", "grpo_g4",
                    "--seeds", "0", "--no_plots"]) == 0
    res = json.loads((out / "runs" / "grpo_g4" / "seed0" / "result.json").read_text())
    per_eval = 2.5 * (1 + (res["curve"][0].get("sampled_accuracy") is not None and "greedy_accuracy" in
                           res["curve"][0]))  # greedy + sampled: two engine calls a checkpoint
    fresh = [p for p in res["curve"] if "eval_engine_wait_s" in p]
    assert fresh and all(p["eval_engine_wait_s"] == pytest.approx(per_eval) for p in fresh)
    assert res["eval_engine_wait_s"] == pytest.approx(per_eval * len(fresh))
    assert sum(p["eval_wall_s"] for p in res["curve"]) == pytest.approx(res["eval_wall_s"])
    assert res["eval_engine"] == {"backend": "vllm", "dtype": "float32"}
    assert res["worker_eval_rss_gb"] == 5.5  # the worker's memory while its engine ran
    monkeypatch.setattr(runs_mod, "evaluate_checkpoint", real)  # transformers sampling: no wait recorded
    assert ct.main(["--output_dir", str(tmp_path / "hf"), "--smoke", "--model_name_or_path", tiny_model,
                    "--methods", "grpo_g4", "--seeds", "0", "--no_plots"]) == 0
    hf = json.loads((tmp_path / "hf" / "runs" / "grpo_g4" / "seed0" / "result.json").read_text())
    assert hf["eval_engine_wait_s"] is None and not any("eval_engine_wait_s" in p for p in hf["curve"])
    assert hf["worker_eval_rss_gb"] is None


def _job(m, s, gb=8.0):
    return jobs_mod.Job(m, s, gb)


def test_jobs_queue_is_seed_major_costliest_first():
    q = jobs_mod.plan_jobs(["grpo_g8", "pair", "v05_osla"], [1, 0, 1], "smollm2", ct.METHOD_COST)
    assert [(j.method, j.seed) for j in q] == [("pair", 0), ("grpo_g8", 0), ("v05_osla", 0),
                                              ("pair", 1), ("grpo_g8", 1), ("v05_osla", 1)]
    assert {j.method: j.peak_gb for j in q} == {"pair": 8.0, "grpo_g8": 8.0, "v05_osla": 20.0}
    assert jobs_mod.peak_memory_gb("cpu", "v05_osla") == jobs_mod.FALLBACK_PEAK_GB
    assert set(ct.METHOD_COST) == set(ct.METHODS)  # a new method must get a cost estimate


def test_jobs_queue_puts_the_jobs_that_run_alone_first():
    """Under a budget V0.5 (20 GB + a 4.5 GB engine > 22.5 GB) needs an empty machine: its jobs lead the queue, in
    seed order, where the queue's start gives them one; the rest keep the seed-major, costliest-first order."""
    q = jobs_mod.plan_jobs(["grpo_g8", "pair", "v05_osla"], [0, 1], "smollm2", ct.METHOD_COST, budget_gb=22.5,
                           engine_gb=4.5)
    assert [(j.method, j.seed) for j in q] == [("v05_osla", 0), ("v05_osla", 1), ("pair", 0), ("grpo_g8", 0),
                                              ("pair", 1), ("grpo_g8", 1)]
    assert jobs_mod.runs_alone(q[0], 22.5, 4.5) and not jobs_mod.runs_alone(q[2], 22.5, 4.5)
    assert not jobs_mod.runs_alone(q[0], 64.0, 4.5) and not jobs_mod.runs_alone(q[0], None)
    # with room for V0.5 beside another job, nothing moves
    roomy = jobs_mod.plan_jobs(["grpo_g8", "pair", "v05_osla"], [0, 1], "smollm2", ct.METHOD_COST, budget_gb=64.0,
                               engine_gb=4.5)
    assert roomy == jobs_mod.plan_jobs(["grpo_g8", "pair", "v05_osla"], [0, 1], "smollm2", ct.METHOD_COST)


def _stand_in_popen(live, duration, on_start=lambda proc: None):
    """A ``popen`` for :func:`run_jobs` whose processes exit 0 after ``duration(method)`` polls; ``live`` holds the
    running ones, ``on_start(proc)`` sees each start (``proc.job`` is its (method, seed); ``proc.cmd``,
    ``proc.env`` its command and environment)."""
    class Proc:
        def __init__(self, cmd, stdout, stderr, env):
            self.cmd, self.env = cmd, env
            self.job = (cmd[cmd.index("--methods") + 1], int(cmd[cmd.index("--seeds") + 1]))
            self.left = duration(self.job[0])
            live.append(self)
            on_start(self)

        def poll(self):
            self.left -= 1
            if self.left > 0:
                return None
            live.remove(self)
            return 0

    return Proc


def _idle_slot_polls(queue, durations, monkeypatch, slots=2, budget=22.5):
    """Run ``queue`` with stand-in jobs lasting ``durations[method]`` polls: the polls at which a slot stood empty
    while jobs were still waiting to start."""
    live, state = [], {"started": 0, "idle": 0}
    Proc = _stand_in_popen(live, durations.__getitem__, lambda _p: state.update(started=state["started"] + 1))

    def tick(_seconds):  # the runner's wait between polls
        if len(live) < slots and state["started"] < len(queue):
            state["idle"] += 1

    monkeypatch.setattr(jobs_mod.time, "sleep", tick)
    with tempfile.TemporaryDirectory() as tmp:
        jobs_mod.run_jobs([], queue, slots=slots, budget_gb=budget, engine_gb=4.5, out=tmp, script="x.py",
                          poll_s=1.0, popen=Proc)
    return state["idle"]


def test_jobs_alone_first_leaves_no_slot_idle_waiting_for_a_drain(monkeypatch):
    """Seed-major with V0.5 in the middle, a slot stands empty while the machine drains for each V0.5 job; with
    the alone jobs first, only while they run."""
    methods, seeds = ["grpo_g8", "grpo_g4", "reinforce_pp", "v05_osla"], [0, 1, 2]
    durations = {"grpo_g8": 7, "grpo_g4": 5, "reinforce_pp": 6, "v05_osla": 4}
    seed_major = jobs_mod.plan_jobs(methods, seeds, "smollm2", ct.METHOD_COST)
    alone_first = jobs_mod.plan_jobs(methods, seeds, "smollm2", ct.METHOD_COST, budget_gb=22.5, engine_gb=4.5)
    assert sorted(seed_major, key=lambda j: (j.method, j.seed)) == sorted(alone_first,
                                                                          key=lambda j: (j.method, j.seed))
    # alone first: a slot is empty only while each V0.5 job runs (3 x 4 polls); seed-major adds the drains
    assert _idle_slot_polls(alone_first, durations, monkeypatch) == 3 * durations["v05_osla"]
    assert _idle_slot_polls(seed_major, durations, monkeypatch) > 3 * durations["v05_osla"]


def test_jobs_memory_budget_runs_the_big_job_alone():
    big, a, b = _job("v05_osla", 0, 20.0), _job("grpo_g8", 0), _job("grpo_g4", 0)
    kw = dict(slots=2, budget_gb=22.5, engine_gb=4.5)
    assert jobs_mod.startable([a, b, big], [], set(), **kw) == [a, b]  # 8 + 8 + 4.5 fits
    # the big job waits for an empty machine and blocks the jobs behind it (first in, first out: no starvation)
    c = _job("reinforce_pp", 0)
    assert jobs_mod.startable([big, c], [a], {("grpo_g4", 0)}, **kw) == []
    assert jobs_mod.startable([big, c], [], {("grpo_g4", 0), ("grpo_g8", 0)}, **kw) == [big]  # nothing beside it
    assert jobs_mod.startable([c], [big], set(), **kw) == []
    # without a budget (or with room) the slots are the only limit
    assert jobs_mod.startable([big, c, a], [], set(), slots=2, budget_gb=None) == [big, c]
    assert jobs_mod.startable([big, c], [], set(), slots=2, budget_gb=64.0, engine_gb=4.5) == [big, c]
    assert jobs_mod.startable([a], [b, c], set(), slots=2, budget_gb=None) == []  # slots full


def test_memory_gb_must_be_a_nonnegative_number(capsys):
    assert ct.build_parser().parse_args(["--output_dir", "o", "--memory_gb", "0"]).memory_gb == 0.0
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(SystemExit):
            ct.build_parser().parse_args(["--output_dir", "o", "--memory_gb", bad])
        assert "must be a number of GB >= 0" in capsys.readouterr().err


def test_jobs_later_seeds_wait_for_the_methods_first_job():
    """The first job of a method tunes its learning rate when that is still to do: its other seeds wait for it."""
    a0, a1, b0 = _job("grpo_g8", 0), _job("grpo_g8", 1), _job("grpo_g4", 0)
    kw = dict(slots=3, budget_gb=None)
    assert jobs_mod.startable([a1, b0], [a0], set(), **kw) == []  # a1 blocks b0 too (first in, first out)
    assert jobs_mod.startable([a0, a1], [], set(), **kw) == [a0]
    assert jobs_mod.startable([a1, b0], [], {("grpo_g8", 0)}, **kw) == [a1, b0]
    # once the first seed is done, later seeds of a method run side by side
    a2 = _job("grpo_g8", 2)
    assert jobs_mod.startable([a2], [a1], {("grpo_g8", 0)}, **kw) == [a2]


@hyp_settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["grpo_g8", "grpo_g4", "pair", "v05_osla", "basis"]), min_size=1, max_size=5,
                unique=True),
       st.lists(st.integers(0, 4), min_size=1, max_size=4), st.integers(1, 3), st.sampled_from([None, 9.0, 22.5, 40.0]),
       st.lists(st.integers(1, 4), min_size=40, max_size=40))
def test_run_jobs_invariants(methods, seeds, slots, budget, durations):
    """Any queue completes (no deadlock), never runs more than ``slots`` jobs, keeps the estimated peaks within the
    budget unless one job runs alone, and starts a method's seeds only after its first job has finished."""
    live, starts, log, events = [], [], [], []

    class Proc:
        def __init__(self, cmd, stdout, stderr, env):
            self.job = (cmd[cmd.index("--methods") + 1], int(cmd[cmd.index("--seeds") + 1]))
            self.left = durations[len(starts) % len(durations)]
            starts.append(self.job)
            events.append(("start", self.job))
            live.append(self)
            peaks = [jobs_mod.peak_memory_gb("smollm2", p.job[0]) for p in live]
            log.append((len(live), sum(peaks)))

        def poll(self):
            self.left -= 1
            if self.left > 0:
                return None
            live.remove(self)
            events.append(("end", self.job))
            return 0

    q = jobs_mod.plan_jobs(methods, seeds, "smollm2", ct.METHOD_COST, budget_gb=budget, engine_gb=4.5)
    with tempfile.TemporaryDirectory() as tmp:
        jobs_mod.run_jobs([], q, slots=slots, budget_gb=budget, engine_gb=4.5, out=tmp, script="x.py", poll_s=0.0,
                          popen=Proc)
    assert sorted(starts) == sorted((j.method, j.seed) for j in q) and not live  # every job ran once
    for n, total in log:
        assert n <= slots
        assert budget is None or n == 1 or total + 4.5 <= budget
    for m in methods:  # a method's other seeds start only after its first seed's job (which tunes) has ended
        first_end = events.index(("end", (m, min(seeds))))
        assert all(k > first_end for k, (e, (mm, sd)) in enumerate(events) if e == "start" and mm == m
                   and sd != min(seeds))


def test_run_jobs_starts_by_the_queue_and_stops_on_a_failure(tmp_path, monkeypatch):
    """The runner with stand-in processes: each job's command, slot binding and log; a failed job stops new
    starts, lets the running ones finish and names its log."""
    started = []

    class Proc:
        def __init__(self, cmd, stdout, stderr, env):
            self.cmd, self.env, self.polls = cmd, env, 0
            started.append(self)

        def poll(self):
            self.polls += 1
            if self.polls < 2:
                return None
            return 3 if "reinforce_pp" in self.cmd else 0

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(jobs_mod.os, "cpu_count", lambda: 8)
    q = jobs_mod.plan_jobs(["grpo_g8", "reinforce_pp", "v05_osla"], [0, 1], "smollm2", ct.METHOD_COST)
    with pytest.raises(SystemExit, match=r"reinforce_pp seed 0 exited with 3 .*reinforce_pp_seed0\.log"):
        jobs_mod.run_jobs(["--scale", "smollm2"], q, slots=2, budget_gb=22.5, engine_gb=4.5, out=str(tmp_path),
                          script="x.py", bind_vllm=True, poll_s=0.0, popen=Proc)
    # queue g8, v05, rpp (costliest first): V0.5 does not fit beside G = 8, so G = 8 runs alone, then V0.5 alone;
    # then REINFORCE++ beside G = 8's seed 1; its failure stops the rest (V0.5 seed 1 never starts)
    assert [(p.cmd[p.cmd.index("--methods") + 1], p.cmd[p.cmd.index("--seeds") + 1]) for p in started] == [
        ("grpo_g8", "0"), ("v05_osla", "0"), ("reinforce_pp", "0"), ("grpo_g8", "1")]
    # a job alone until it ends gets both slots' cores (torch threads and its engine's binding); a pair one each
    assert [p.env["VLLM_CPU_OMP_THREADS_BIND"] for p in started] == ["0-1", "0-1", "0", "1"]
    threads = [p.cmd[p.cmd.index("--num_threads") + 1] if "--num_threads" in p.cmd else None for p in started]
    assert threads == ["2", "2", None, None]
    assert sorted(os.listdir(tmp_path / "logs" / "jobs")) == [
        "grpo_g8_seed0.log", "grpo_g8_seed1.log", "reinforce_pp_seed0.log", "v05_osla_seed0.log"]
    # each start is marked in its log (the logs are appended to across invocations)
    marks = (tmp_path / "logs" / "jobs" / "v05_osla_seed0.log").read_text().splitlines()
    assert len(marks) == 1 and re.fullmatch(r"\[jobs\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: v05_osla seed 0 started "
                                            r"\(slot 0, 2 thread\(s\)\)", marks[0])
    assert started[0].cmd[:4] == [sys.executable, "x.py", "--scale", "smollm2"]
    assert started[0].cmd[-4:] == ["--jobs", "1", "--no_plots", "--queue_job"]


def test_jobs_runs_workers_then_aggregates_their_runs(tiny_model, tmp_path, capsys):
    out = tmp_path / "out"
    rc = ct.main(["--output_dir", str(out), "--smoke", "--protocol", "v2", "--task", "scratchpad",
                  "--model_name_or_path", tiny_model, "--n_train", "32", "--methods", "grpo_g8", "reinforce_pp",
                  "--tune_lr", "1e-4", "--tune_extend", "0", "--seeds", "0", "--jobs", "2", "--no_plots"])
    assert rc == 0
    logs = sorted(os.listdir(out / "logs" / "jobs"))
    assert logs == ["grpo_g8_seed0.log", "reinforce_pp_seed0.log"]
    assert all("[lr]" in (out / "logs" / "jobs" / f).read_text() for f in logs)  # each job tuned its own method
    # a job writes no report (concurrent jobs would race on runs.json / table.json); the queue's invocation does
    assert not any("| method | lr |" in (out / "logs" / "jobs" / f).read_text() for f in logs)
    assert all("] ok: final accuracy" in (out / "logs" / "jobs" / f).read_text() for f in logs)
    doc = json.loads((out / "runs.json").read_text())
    assert {(r["method"], r["status"]) for r in doc["runs"]} == {("grpo_g8", "ok"), ("reinforce_pp", "ok")}
    assert set(json.loads((out / "lr_choice.json").read_text())["methods"]) == {"grpo_g8", "reinforce_pp"}
    for r in doc["runs"] + doc["tuning_runs"]:  # the aggregating pass reused the workers' runs, trained nothing
        on_disk = json.loads((out / os.path.dirname(r["outcomes"]) / "result.json").read_text())
        assert on_disk["run_wall_s"] == r["run_wall_s"] and on_disk["settings_key"] == r["settings_key"]
    # each run measured its worker's peak; one configuration shares its memory key across learning rates
    main = {r["method"]: r for r in doc["runs"]}
    assert all(0.05 < r["worker_peak_rss_gb"] < 64 for r in doc["runs"] + doc["tuning_runs"])
    assert main["grpo_g8"]["memory_key"] != main["reinforce_pp"]["memory_key"]
    # a second invocation with an extra seed of G = 8 (--extra_seeds) takes its estimates from the measured peaks
    capsys.readouterr()  # what the first invocation printed
    rc = ct.main(["--output_dir", str(out), "--smoke", "--protocol", "v2", "--task", "scratchpad",
                  "--model_name_or_path", tiny_model, "--n_train", "32", "--methods", "grpo_g8", "reinforce_pp",
                  "--tune_lr", "1e-4", "--tune_extend", "0", "--seeds", "0", "--extra_seeds", "grpo_g8=1", "--jobs",
                  "2", "--no_plots"])
    assert rc == 0
    doc = json.loads((out / "runs.json").read_text())
    assert sorted((r["method"], r["seed"], r["status"]) for r in doc["runs"]) == [
        ("grpo_g8", 0, "ok"), ("grpo_g8", 1, "ok"), ("reinforce_pp", 0, "ok")]
    # the paired report stays on --seeds: one seed a method in the table and the verdicts
    assert {r["method"]: r["n_seeds"] for r in json.loads((out / "table.json").read_text())["rows"]} == {
        "grpo_g8": 1, "reinforce_pp": 1}
    assert all(c.get("n_seeds") in (None, 1) for c in json.loads((out / "verdicts.json").read_text())["comparisons"])
    seed1_log = (out / "logs" / "jobs" / "grpo_g8_seed1.log").read_text()
    assert "[grpo_g8 seed 1 lr" in seed1_log and "[grpo_g8 seed 0 lr" not in seed1_log  # the job ran its seed only
    printed = capsys.readouterr().out
    estimate = jobs_mod.peak_memory_gb("cpu", "grpo_g8", {"grpo_g8": main["grpo_g8"]["worker_peak_rss_gb"]})
    assert f"[jobs] grpo_g8: measured peak {main['grpo_g8']['worker_peak_rss_gb']:.1f} GB" in printed
    assert f"[jobs] grpo_g8 seed 1 (slot 0, ~{estimate:g} GB" in printed
    assert estimate != jobs_mod.peak_memory_gb("cpu", "grpo_g8")  # not the table's 2 GB
    # the finished seed-0 runs got no worker the second time (one would only load the model to reuse them)
    assert "[jobs] 2 finished run(s) reused without a worker" in printed
    assert "[jobs] grpo_g8 seed 0 (slot" not in printed and "[jobs] reinforce_pp seed 0 (slot" not in printed
    assert (out / "logs" / "jobs" / "grpo_g8_seed0.log").read_text().count(" started (slot ") == 1


def test_extra_seeds_are_parsed_validated_and_queued(capsys):
    parse = ct.build_parser().parse_args
    s = ct.resolve_settings(parse(["--output_dir", "x", "--protocol", "v2", "--seeds", "0", "1", "--methods",
                                   "grpo_g8", "dapo_dynamic", "--extra_seeds", "grpo_g8=1-3,7", "grpo_g8=9"]))
    assert s["extra_seeds"] == {"grpo_g8": [2, 3, 7, 9]}  # seed 1 is already in --seeds
    assert ct.seeds_of(s, "grpo_g8") == [0, 1, 2, 3, 7, 9] and ct.seeds_of(s, "dapo_dynamic") == [0, 1]
    assert ct.resolve_settings(parse(["--output_dir", "x", "--extra_seeds"]))["extra_seeds"] == {}
    with pytest.raises(SystemExit, match="not among the methods run"):
        ct.resolve_settings(parse(["--output_dir", "x", "--methods", "grpo_g8", "--extra_seeds", "pair=5"]))
    for bad in ("grpo_g8", "grpo_g8=", "=3", "grpo_g8=a-b", "grpo_g8=-1"):
        with pytest.raises(SystemExit):
            parse(["--output_dir", "x", "--extra_seeds", bad])
        assert "must be METHOD=SEEDS" in capsys.readouterr().err
    q = jobs_mod.plan_jobs(["grpo_g8", "pair"], [0], "smollm2", ct.METHOD_COST, extra_seeds={"grpo_g8": [1, 2]})
    assert [(j.method, j.seed) for j in q] == [("pair", 0), ("grpo_g8", 0), ("grpo_g8", 1), ("grpo_g8", 2)]


def test_jobs_estimates_from_the_measured_peaks_of_the_same_configuration(tmp_path):
    """A method's estimate is its largest measured peak of finished runs with its memory key, times the margin;
    other configurations, failed runs and runs without a measured peak do not count."""
    def write(method, seed, **rec):
        d = tmp_path / "runs" / method / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({"status": "ok", "memory_key": "gc", **rec}))

    write("v05_osla", 0, worker_peak_rss_gb=7.0)
    write("v05_osla", 1, worker_peak_rss_gb=8.0)
    write("v05_osla", 2, worker_peak_rss_gb=30.0, memory_key="no-gc")  # another configuration
    write("v05_osla", 3, worker_peak_rss_gb=40.0, status="failed")
    write("v05_osla", 4)  # recorded before the harness measured peaks
    write("grpo_g8", 0, worker_peak_rss_gb=None)
    measured = jobs_mod.measured_peaks(str(tmp_path), {"v05_osla": "gc", "grpo_g8": "gc", "pair": "gc"})
    assert measured == {"v05_osla": 8.0}
    assert jobs_mod.peak_memory_gb("smollm2", "v05_osla", measured) == round(8.0 * jobs_mod.MEASURED_MARGIN, 1)
    assert jobs_mod.peak_memory_gb("smollm2", "grpo_g8", measured) == 8.0  # the table's
    assert jobs_mod.measured_peaks(str(tmp_path), {"v05_osla": "no-gc"}) == {"v05_osla": 30.0}
    # measured at 8 GB, V0.5 no longer needs an empty machine under 22.5 GB: nothing goes first
    q = jobs_mod.plan_jobs(["grpo_g8", "v05_osla"], [0, 1], "smollm2", ct.METHOD_COST, budget_gb=22.5,
                           engine_gb=4.5, measured=measured)
    est = round(8.0 * jobs_mod.MEASURED_MARGIN, 1)
    assert [(j.method, j.seed, j.peak_gb) for j in q] == [("grpo_g8", 0, 8.0), ("v05_osla", 0, est),
                                                         ("grpo_g8", 1, 8.0), ("v05_osla", 1, est)]


def test_measured_estimates_keep_two_smollm2_runs_side_by_side_and_v05_alone():
    """The margin on measured peaks must not serialise the queue: at the SmolLM2 regime runs' worker peaks measured
    when the margin was set (GB, ``worker_peak_rss_gb``) any two of the other methods fit the 22.5 GB budget beside one
    engine, V0.5 + OSLA still runs alone (a margin of 1.25, then 1.1, left pairs over the budget and a core idle)."""
    measured = {"grpo_g8": 8.0, "grpo_g4": 7.76, "reinforce_pp": 8.2, "dapo_dynamic": 7.58, "james_stein": 7.85,
                "pair": 6.51, "basis": 8.74, "v05_osla": 19.49}
    budget, engine = 22.5, jobs_mod.ENGINE_PEAK_GB
    q = jobs_mod.plan_jobs(list(measured), [7], "smollm2", ct.METHOD_COST, budget_gb=budget, engine_gb=engine,
                           measured=measured)
    by = {j.method: j for j in q}
    assert q[0].method == "v05_osla" and jobs_mod.runs_alone(by["v05_osla"], budget, engine)
    others = [m for m in measured if m != "v05_osla"]
    for i, a in enumerate(others):
        for b in others[i + 1:]:  # one method's seeds meet only at the queue's end (seed-major)
            assert jobs_mod._fits([by[a]], by[b], budget, engine), (a, b)
    # every estimate still covers its measured peak
    assert all(j.peak_gb >= measured[j.method] for j in q)


def test_jobs_memory_is_the_worst_moment_with_one_engine():
    """:func:`memory_gb` equals the largest total over the moments the queue allows: every worker at its peak, or
    one worker's engine running (that worker at its evaluation memory, the others at their peaks); an unmeasured
    evaluation memory counts the engine whole, as before it was measured."""
    g8, basis = jobs_mod.Job("grpo_g8", 8, 9.2, 6.2), jobs_mod.Job("basis", 8, 9.7, 6.0)
    assert jobs_mod.memory_gb([g8, basis], 4.5) == pytest.approx(9.2 + 9.7 + 4.5 + 6.2 - 9.2)  # G = 8 evaluating
    assert jobs_mod.memory_gb([g8, basis], 0.0) == pytest.approx(18.9)  # no engines
    assert jobs_mod.memory_gb([_job("grpo_g8", 0, 9.2), basis], 4.5) == pytest.approx(9.2 + 9.7 + 4.5)
    assert jobs_mod.memory_gb([jobs_mod.Job("pair", 0, 9.0, 2.0)], 4.5) == 9.0  # the engine fits under the peak
    assert jobs_mod.memory_gb([], 4.5) == 0.0


@hyp_settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 20.0), st.one_of(st.none(), st.floats(0.1, 1.0))), min_size=1, max_size=4),
       st.sampled_from([0.0, 4.5]))
def test_jobs_memory_matches_enumerated_moments(specs, engine):
    jobs = [jobs_mod.Job(f"m{i}", 0, peak, None if frac is None else peak * frac)
            for i, (peak, frac) in enumerate(specs)]
    peaks = [j.peak_gb for j in jobs]
    moments = [sum(peaks)]  # all training
    if engine > 0:
        for i, j in enumerate(jobs):  # job i's engine runs: its worker at its evaluation memory (peak if unmeasured)
            moments.append(sum(peaks) - peaks[i] + (j.peak_gb if j.eval_gb is None else j.eval_gb) + engine)
    assert jobs_mod.memory_gb(jobs, engine) == pytest.approx(max(moments))
    unmeasured = [jobs_mod.Job(j.method, 0, j.peak_gb) for j in jobs]
    assert jobs_mod.memory_gb(unmeasured, engine) == pytest.approx(sum(peaks) + engine)  # the old plan
    assert jobs_mod.memory_gb(jobs, engine) <= jobs_mod.memory_gb(unmeasured, engine) + 1e-9


def test_jobs_evaluation_memory_lets_the_over_budget_pairs_run_side_by_side(tmp_path):
    """The pairs a whole engine put over the 22.5 GB budget (G = 8 at its seed-7 peak of 8.8 GB beside BASIS at 9.2
    GB, or two G = 8 seeds: 9.2 + 9.7 + 4.5 > 22.5) fit once each method's evaluation memory is measured (the
    SmolLM2 regime runs recorded 4.4-7.3 GB, ``worker_eval_rss_gb``); V0.5 + OSLA still runs alone (no other job
    fits beside it) and leads the queue, on an empty machine."""
    def write(method, seed, **rec):
        d = tmp_path / "runs" / method / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({"status": "ok", "memory_key": "k", **rec}))

    write("grpo_g8", 7, worker_peak_rss_gb=8.8, worker_eval_rss_gb=5.9)
    write("grpo_g8", 6, worker_peak_rss_gb=8.0)  # before the evaluation memory was recorded
    write("basis", 7, worker_peak_rss_gb=9.2, worker_eval_rss_gb=5.6)
    write("v05_osla", 9, worker_peak_rss_gb=19.5, worker_eval_rss_gb=8.0)
    keys = {"grpo_g8": "k", "basis": "k", "v05_osla": "k"}
    measured, measured_eval = (jobs_mod.measured_peaks(str(tmp_path), keys),
                               jobs_mod.measured_peaks(str(tmp_path), keys, field="worker_eval_rss_gb"))
    assert measured == {"grpo_g8": 8.8, "basis": 9.2, "v05_osla": 19.5}
    assert measured_eval == {"grpo_g8": 5.9, "basis": 5.6, "v05_osla": 8.0}
    budget, engine = 22.5, jobs_mod.ENGINE_PEAK_GB
    plan = functools.partial(jobs_mod.plan_jobs, ["grpo_g8", "basis", "v05_osla"], [8, 9], "smollm2",
                             ct.METHOD_COST, budget_gb=budget, engine_gb=engine, measured=measured)
    q = plan(measured_eval=measured_eval)
    by = {(j.method, j.seed): j for j in q}
    assert by[("grpo_g8", 8)] == jobs_mod.Job("grpo_g8", 8, round(8.8 * jobs_mod.MEASURED_MARGIN, 1),
                                              round(5.9 * jobs_mod.MEASURED_MARGIN, 1))
    assert jobs_mod._fits([by[("grpo_g8", 8)]], by[("basis", 8)], budget, engine)
    assert jobs_mod._fits([by[("grpo_g8", 8)]], by[("grpo_g8", 9)], budget, engine)
    # V0.5 fits the budget on its own now, yet nothing fits beside it: it still goes first and runs alone
    assert jobs_mod._fits([], by[("v05_osla", 8)], budget, engine)
    assert [(j.method, j.seed) for j in q[:2]] == [("v05_osla", 8), ("v05_osla", 9)]
    assert jobs_mod.runs_alone(by[("v05_osla", 8)], budget, engine, [by[("grpo_g8", 8)]])
    assert not jobs_mod.runs_alone(by[("v05_osla", 8)], budget, engine)  # on its own it fits
    # without the evaluation memory both pairs are over the budget (the engine counted whole)
    old = {(j.method, j.seed): j for j in plan()}
    assert old[("grpo_g8", 8)].eval_gb is None
    assert not jobs_mod._fits([old[("grpo_g8", 8)]], old[("basis", 8)], budget, engine)
    assert not jobs_mod._fits([old[("grpo_g8", 8)]], old[("grpo_g8", 9)], budget, engine)


def test_run_jobs_gives_a_job_alone_until_it_ends_every_core():
    """A job that starts on an empty machine with nothing startable beside it (here G = 8's seed 1, the queue's
    last, which had to wait for its seed 0) gets every slot's core; jobs started beside another get one each."""
    live, starts = [], []

    def on_start(proc):  # (job, torch threads, engine binding, jobs already running)
        threads = proc.cmd[proc.cmd.index("--num_threads") + 1] if "--num_threads" in proc.cmd else "1"
        starts.append((proc.job, threads, proc.env["VLLM_CPU_OMP_THREADS_BIND"], len(live) - 1))

    Proc = _stand_in_popen(live, {"grpo_g8": 5, "pair": 2}.__getitem__, on_start)

    q = jobs_mod.plan_jobs(["grpo_g8", "pair"], [0, 1], "smollm2", ct.METHOD_COST)
    assert [(j.method, j.seed) for j in q] == [("pair", 0), ("grpo_g8", 0), ("pair", 1), ("grpo_g8", 1)]
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
        mp.setattr(jobs_mod.os, "cpu_count", lambda: 2)
        jobs_mod.run_jobs([], q, slots=2, budget_gb=22.5, engine_gb=4.5, out=tmp, script="x.py", poll_s=0.0,
                          popen=Proc, bind_vllm=True)
    assert starts == [(("pair", 0), "1", "0", 0), (("grpo_g8", 0), "1", "1", 1), (("pair", 1), "1", "0", 1),
                      (("grpo_g8", 1), "2", "0-1", 0)]


def test_run_jobs_counts_runs_finished_before_it_for_the_first_job_rule():
    """Extra seeds of a method whose earlier seeds finished in another invocation (left out of the queue by the
    reuse check) start side by side: the first-job rule waits only for a job that may still tune. Without ``done``
    the first pending seed would hold the others back, one core idle."""
    def starts_with(done):
        live, starts = [], []
        Proc = _stand_in_popen(live, lambda m: 3, lambda p: starts.append((p.job, len(live) - 1)))
        q = [jobs_mod.Job("grpo_g8", s, 9.3, 6.6) for s in (11, 12, 13)]
        with tempfile.TemporaryDirectory() as tmp:
            jobs_mod.run_jobs([], q, slots=2, budget_gb=22.5, engine_gb=4.5, out=tmp, script="x.py", poll_s=0.0,
                              popen=Proc, done=done)
        return starts

    # (job, jobs already running when it started)
    assert starts_with({("grpo_g8", s) for s in range(11)}) == [
        (("grpo_g8", 11), 0), (("grpo_g8", 12), 1), (("grpo_g8", 13), 0)]
    assert starts_with(()) == [(("grpo_g8", 11), 0), (("grpo_g8", 12), 0), (("grpo_g8", 13), 1)]


def test_run_jobs_reestimates_a_method_when_its_job_finishes():
    """V0.5 starts under the table's 20 GB (alone); once its first job has measured 10 GB, its later seeds run
    beside another job."""
    live, together = [], []
    Proc = _stand_in_popen(live, lambda _m: 3, lambda _p: together.append(sorted(p.job for p in live)))

    asked = []

    def reestimate(method):
        asked.append(method)
        return (10.0, None) if method == "v05_osla" else (8.0, None)

    q = jobs_mod.plan_jobs(["grpo_g8", "v05_osla"], [0, 1, 2], "smollm2", ct.METHOD_COST, budget_gb=22.5,
                           engine_gb=4.5)
    assert [j.method for j in q[:3]] == ["v05_osla"] * 3  # the table's 20 GB: alone, first
    with tempfile.TemporaryDirectory() as tmp:
        jobs_mod.run_jobs([], q, slots=2, budget_gb=22.5, engine_gb=4.5, out=tmp, script="x.py", poll_s=0.0,
                          popen=Proc, reestimate=reestimate)
    assert together[0] == [("v05_osla", 0)]  # alone while unmeasured
    assert together[1] == [("v05_osla", 1)]  # 10 + 10 + 4.5 GB is over the budget
    assert [("grpo_g8", 0), ("v05_osla", 2)] in together  # re-estimated: 10 + 8 + 4.5 GB fits, side by side
    assert asked[0] == "v05_osla" and len(asked) == 6


def test_peak_rss_measures_from_the_reset():
    import numpy as np

    block = np.ones(2 ** 26)  # 512 MB resident (mapped on its own: returned to the system when freed)
    block += 1
    before = jobs_mod.peak_rss_gb()
    del block
    if not jobs_mod.reset_peak_rss():
        pytest.skip("this kernel does not allow resetting the peak resident memory")
    after = jobs_mod.peak_rss_gb()
    assert before is not None and after is not None and after < before - 0.4


def test_lr_choice_of_a_concurrent_invocation_is_not_overwritten(monkeypatch, tmp_path):
    """Two invocations on one folder (``--jobs`` workers) tune different methods: the one that writes last merges
    with the file as it is then, not as it was when it started."""
    s = {"output_dir": str(tmp_path), "methods": ["grpo_g8"], "tune_lr": [1e-4], "tune_seeds": [0], "tune_extend": 0,
         "task": "addition"}
    ctx_json = json.loads(json.dumps(ct.tuning_context(s), default=str))

    def fake_run(ctx, spec, seed, run_dir, setup_cache, lr, split="test"):
        # meanwhile, another worker finishes tuning rloo and writes its choice
        other = ct.build_lr_choice([_tune("rloo", 3e-5, 0, 0.7)], [3e-5], [0], ctx_json)
        ct._write_json(os.path.join(str(tmp_path), ct.LR_CHOICE_FILE), other)
        return {"method": spec.name, "learning_rate": lr, "seed": seed, "status": "ok",
                "final_greedy_accuracy": 0.5, "tokens": 10.0}

    monkeypatch.setattr(ct.harness_runs, "run_or_reuse", fake_run)
    doc, _ = ct.tune_learning_rates(SimpleNamespace(s=s), {})
    on_disk = json.loads((tmp_path / ct.LR_CHOICE_FILE).read_text())
    assert on_disk["methods"]["rloo"]["chosen_lr"] == 3e-5 and on_disk["methods"]["grpo_g8"]["chosen_lr"] == 1e-4
    assert set(doc["methods"]) == {"rloo", "grpo_g8"}


def test_tune_only_stops_after_tuning(tiny_model, tmp_path):
    out = tmp_path / "out"
    base = ["--output_dir", str(out), "--smoke", "--protocol", "v2", "--task", "scratchpad", "--model_name_or_path",
            tiny_model, "--n_train", "32", "--methods", "grpo_g8", "--no_plots"]
    rc = ct.main([*base, "--tune_lr", "1e-4", "--tune_extend", "0", "--tune_only"])
    assert rc == 0
    assert json.loads((out / "lr_choice.json").read_text())["methods"]["grpo_g8"]["status"] == "ok"
    assert (out / "runs" / "tune" / "grpo_g8").is_dir()
    assert not (out / "runs" / "grpo_g8").exists() and not (out / "runs.json").exists()  # no main run
    with pytest.raises(SystemExit, match="--tune_only needs"):
        ct.main([*base, "--tune_only", "--no_tune", "--learning_rate", "1e-4"])


def test_checkpoint_fingerprint_ignores_the_writing_transformers_release(tmp_path):
    """The real model's cache is rebuilt by whatever transformers is installed: config.json then names another
    release, the weights are the same, and the fingerprint (part of every v2 run key) must not change."""
    checkpoint_fingerprint = ct.checkpoint_fingerprint
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = '{\n  "hidden_size": 8,\n  "transformers_version": "%s",\n  "vocab_size": 5\n}\n'
    a, b = tmp_path / "a", tmp_path / "b"
    for d, v in ((a, "5.24.0"), (b, "5.25.0")):
        d.mkdir()
        (d / "config.json").write_text(cfg % v)
        (d / "model.safetensors").write_bytes(b"weights")
    assert checkpoint_fingerprint(str(a)) == checkpoint_fingerprint(str(b))
    (b / "model.safetensors").write_bytes(b"other weights")
    assert checkpoint_fingerprint(str(a)) != checkpoint_fingerprint(str(b))
    (b / "model.safetensors").write_bytes(b"weights")
    (b / "config.json").write_text((cfg % "5.24.0").replace('"hidden_size": 8', '"hidden_size": 9'))
    assert checkpoint_fingerprint(str(a)) != checkpoint_fingerprint(str(b))
    # the committed testbed checkpoints keep the fingerprints their runs were keyed with
    for task in ("addition", "scratchpad"):
        d = os.path.join(root, "benchmarks", "results", "compare", "v2", task)
        choice = json.load(open(os.path.join(d, "lr_choice.json")))
        assert checkpoint_fingerprint(os.path.join(d, "start_checkpoint")) == choice["context"]["start_checkpoint_sha"]


def test_test_eval_samples_changes_test_keys_and_evaluations_only():
    """``test_eval_samples``: more samples per test question for the comparison; the tuning runs' keys (and their
    validation evaluations) are those of a design without it, so finished tuning runs stay reusable."""
    from compare_harness.evaluation import eval_samples_for
    from compare_harness.runs import _settings_key

    s = ct.resolve_settings(ct.build_parser().parse_args(
        ["--output_dir", "x", "--scale", "smollm2", "--protocol", "v2", "--task", "sum3"]))
    spec = ct.METHODS["grpo_g8"]
    more = {**s, "test_eval_samples": 4}
    assert _settings_key(more, spec, 0, 3e-4, "validation") == _settings_key(s, spec, 0, 3e-4, "validation")
    assert _settings_key(more, spec, 0, 3e-4, "test") != _settings_key(s, spec, 0, 3e-4, "test")
    assert _settings_key({**s, "test_eval_samples": s["eval_samples"]}, spec, 0, 3e-4, "test") == _settings_key(
        s, spec, 0, 3e-4, "test")
    assert eval_samples_for(more, "test") == 4 and eval_samples_for(more, "validation") == s["eval_samples"] == 1
    regime = ct.resolve_settings(ct.build_parser().parse_args(
        ["--output_dir", "x", "--scale", "smollm2", "--protocol", "v2", "--task", "steps_matched",
         "--temperature", "0.7"]))
    assert regime["test_eval_samples"] == 4 and "james_stein" in regime["methods"]
    # the committed tuning runs of the regime benchmark keep their keys under the preset
    d = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results", "compare",
                     "smollm2", "steps_matched_t07")
    regime["start_checkpoint_sha"] = json.load(open(os.path.join(d, "start_eval.json")))["key"]["start_checkpoint_sha"]
    rec = json.load(open(os.path.join(d, "runs", "tune", "grpo_g8", "lr0.0003", "seed0", "result.json")))
    assert _settings_key(regime, spec, 0, 3e-4, "validation") == rec["settings_key"]


def test_lr_choice_from_another_folder_for_a_longer_horizon(tiny_model, tmp_path):
    """``--lr_choice_from``: main runs at another token budget use the rates tuned at the first one (no tuning run);
    any other tuning setting that differs is refused."""
    short, long_ = tmp_path / "short", tmp_path / "long"
    base = ["--smoke", "--protocol", "v2", "--task", "scratchpad", "--model_name_or_path", tiny_model, "--n_train",
            "32", "--methods", "grpo_g8", "--no_plots", "--tune_extend", "0"]
    assert ct.main([*base, "--output_dir", str(short), "--tune_lr", "1e-4", "3e-4", "--tune_only"]) == 0
    chosen = json.loads((short / "lr_choice.json").read_text())["methods"]["grpo_g8"]["chosen_lr"]
    assert ct.main([*base, "--output_dir", str(long_), "--token_budget", "1000", "--seeds", "0",
                    "--lr_choice_from", str(short / "lr_choice.json")]) == 0
    doc = json.loads((long_ / "runs.json").read_text())
    assert doc["tuning_runs"] == [] and not (long_ / "runs" / "tune").exists()
    run = doc["runs"][0]
    assert run["learning_rate"] == chosen and "tuned at 500 tokens" in run["lr_source"]
    assert doc["lr_choice"]["tuned_at_token_budget"] == 500
    with pytest.raises(SystemExit, match="only token_budget and the weight-neutral overrides"):
        ct.main([*base, "--output_dir", str(long_), "--n_val", "20", "--seeds", "0",
                 "--lr_choice_from", str(short / "lr_choice.json")])
    with pytest.raises(SystemExit, match="config_overrides: file {}, now {'max_grad_norm': 0.5}"):
        ct.main([*base, "--output_dir", str(long_), "--seeds", "0", "--config_overrides", '{"max_grad_norm": 0.5}',
                 "--lr_choice_from", str(short / "lr_choice.json")])
    # gradient checkpointing changes memory, not the weights (tests/test_base_trainer.py): the rates transfer
    gc = tmp_path / "long_gc"
    assert ct.main([*base, "--output_dir", str(gc), "--token_budget", "1000", "--seeds", "0", "--config_overrides",
                    '{"gradient_checkpointing": true}', "--lr_choice_from", str(short / "lr_choice.json")]) == 0
    doc = json.loads((gc / "runs.json").read_text())
    assert doc["lr_choice"]["weight_neutral_overrides"] == ["gradient_checkpointing"]
    assert doc["runs"][0]["learning_rate"] == chosen and doc["runs"][0]["status"] == "ok"
    with pytest.raises(SystemExit, match="drop --tune_lr"):
        ct.main([*base, "--output_dir", str(long_), "--tune_lr", "1e-4", "--lr_choice_from", "x.json"])


def test_start_regime_shares_and_icc():
    """The start regime the harness prints and records (``start_regime``): shares of questions solved in none / all /
    some of the ``k`` samples, and the ICC of ``trl_ext.advise.regime.variance_decomposition`` -- checked by hand on
    four questions and on the committed steps_matched start evaluation (docs/results.md: 42 %, 10 %, ICC 0.41)."""
    from compare_harness.evaluation import start_regime

    recs = [{"pass_rate": p} for p in (0.0, 0.0, 1.0, 0.5)]
    r = start_regime(recs, 4)
    assert (r["share_none"], r["share_all"], r["share_mixed"]) == (0.5, 0.25, 0.25)
    p = np.array([0.0, 0.0, 1.0, 0.5])
    between = p.var(ddof=1) - np.mean(p * (1 - p) / 3)
    assert r["icc"] == pytest.approx(between / (p.mean() * (1 - p.mean())))
    assert start_regime(recs, 1) is None  # one sample per question: no within-question information
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    d = os.path.join(root, "benchmarks/results/compare/smollm2/steps_matched_t07")
    # the documented regime of the start checkpoint (docs/results.md): on the vLLM engine the main runs evaluate
    # with, and on the transformers sampler the first run used
    for name, (none, always, icc) in {"start_eval.json": (0.396, 0.125, 0.415),
                                      "start_eval_transformers.json": (0.417, 0.104, 0.415)}.items():
        committed = start_regime(json.load(open(os.path.join(d, name)))["records"], 4)
        assert committed["n_questions"] == 48
        assert (committed["share_none"], committed["share_all"], committed["icc"]) == pytest.approx(
            (none, always, icc), abs=5e-4)


def test_finished_main_runs_are_exactly_the_runs_a_worker_would_reuse(tmp_path):
    """The queue skips a run only when the worker's reuse check would pass: status ok and the settings key of the
    run at the rate this invocation would train it with; anything else (failed, another rate, a cut-off file, an
    untuned method) still gets its worker."""
    parse = ct.build_parser().parse_args
    base = ["--output_dir", str(tmp_path), "--protocol", "v2", "--seeds", "0", "1", "--methods", "grpo_g8",
            "dapo_dynamic"]
    s = ct.resolve_settings(parse(base + ["--no_tune", "--learning_rate", "1e-4"]))
    s["start_checkpoint_sha"] = "abc"  # set by Context from the start checkpoint; part of every v2 key

    def write(method, seed, **rec):
        d = tmp_path / "runs" / method / f"seed{seed}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "result.json").write_text(rec.pop("text", None) or json.dumps(rec))

    key = lambda m, seed, lr: ct.harness_runs._settings_key(s, ct.METHODS[m], seed, lr)  # noqa: E731
    write("grpo_g8", 0, status="ok", settings_key=key("grpo_g8", 0, 1e-4))
    write("grpo_g8", 1, status="failed", settings_key=key("grpo_g8", 1, 1e-4))
    write("dapo_dynamic", 0, status="ok", settings_key=key("dapo_dynamic", 0, 3e-4))  # another rate
    write("dapo_dynamic", 1, text='{"status": "ok", "settings_')  # cut off mid-write
    assert ct.finished_main_runs(s, str(tmp_path)) == {("grpo_g8", 0)}
    # --no_resume: the worker retrains every run, so the queue skips none
    assert ct.finished_main_runs({**s, "resume": False}, str(tmp_path)) == set()
    assert ct.harness_runs.reusable_record(s, ct.METHODS["grpo_g8"], 0, 1e-4,
                                           str(tmp_path / "runs" / "grpo_g8" / "seed0"))["status"] == "ok"
    # with tuning: the rates come from the recorded lr_choice.json; before it exists, nothing is known
    t = ct.resolve_settings(parse(base + ["--tune_lr", "1e-4", "3e-4"]))
    t["start_checkpoint_sha"] = "abc"
    assert ct.finished_main_runs(t, str(tmp_path)) == set()
    choice = {"context": json.loads(json.dumps(ct.tuning_context(t), default=str)),
              "methods": {"dapo_dynamic": {"chosen_lr": 3e-4}, "grpo_g8": {"chosen_lr": None, "status": "failed"}}}
    (tmp_path / ct.LR_CHOICE_FILE).write_text(json.dumps(choice))
    write("dapo_dynamic", 0, status="ok", settings_key=ct.harness_runs._settings_key(t, ct.METHODS["dapo_dynamic"],
                                                                                     0, 3e-4))
    assert ct.finished_main_runs(t, str(tmp_path)) == {("dapo_dynamic", 0)}  # grpo_g8 has no rate yet: not skipped


def test_runs_json_writes_cache_paths_portably(monkeypatch, tmp_path):
    monkeypatch.setenv("TRL_EXT_CACHE", str(tmp_path / "cache") + os.sep)
    root = str(tmp_path / "cache")
    assert ct.portable_path(os.path.join(root, "bench")) == "<TRL_EXT_CACHE>/bench"
    assert ct.portable_path(root) == "<TRL_EXT_CACHE>"
    # not under the root (a sibling that shares its prefix, a relative path, a non-string): unchanged
    assert ct.portable_path(root + "-other/x") == root + "-other/x"
    assert ct.portable_path("smollm2") == "smollm2" and ct.portable_path(3) == 3 and ct.portable_path(None) is None
    # the output directory given absolute (resolve_settings makes it so) is written relative to the working directory
    monkeypatch.chdir(tmp_path)
    assert ct.portable_path(str(tmp_path / "results" / "x")) == os.path.join("results", "x")
    assert ct.portable_path(str(tmp_path)) == str(tmp_path)  # the working directory itself: not under it


@pytest.mark.parametrize("method,budget", [("grpo_g8", 900), ("v05_osla", 6000)])  # V0.5: ~1,700 tokens a step here
def test_a_run_cut_off_resumes_from_its_last_evaluation_bitwise(tiny_model, tmp_path, monkeypatch, method, budget):
    """Mid-run checkpoints: a main run that dies after its first evaluation (a session's end, a crash) resumes from
    the checkpoint saved after that evaluation and ends bitwise where the uninterrupted run ends (every curve point,
    every step's reward and gradient norm, the final outcomes); the checkpoints are deleted when it finishes, and
    ``--no_run_checkpoints`` saves none."""
    import compare_harness.runs as harness

    base = ["--smoke", "--protocol", "v2", "--task", "scratchpad", "--model_name_or_path", tiny_model, "--n_train", "32",
            "--methods", method, "--no_plots", "--no_tune", "--learning_rate", "1e-3", "--seeds", "0",
            "--token_budget", str(budget), "--eval_every_tokens", str(budget // 3)]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert ct.main([*base, "--output_dir", str(whole)]) == 0
    ref = json.loads((whole / "runs.json").read_text())["runs"][0]
    assert ref["status"] == "ok" and ref["resumed"] == []
    assert len({p["step"] for p in ref["curve"]}) == 3  # three evaluations at three steps: the cut falls between two

    real, calls = harness.evaluate_checkpoint, []

    def dies_at_the_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("cut off")
        return real(*a, **k)

    monkeypatch.setattr(harness, "evaluate_checkpoint", dies_at_the_second)
    run_dir = cut / "runs" / method / "seed0"
    assert ct.main([*base, "--output_dir", str(cut)]) == 0
    assert json.loads((run_dir / "result.json").read_text())["status"] == "failed"
    ckpts = harness.run_checkpoints(str(run_dir))
    assert len(ckpts) == 1 and (run_dir / f"checkpoint-{ckpts[0][0]}" / harness.RUN_STATE_FILE).exists()
    monkeypatch.setattr(harness, "evaluate_checkpoint", real)
    assert ct.main([*base, "--output_dir", str(cut)]) == 0
    rec = json.loads((cut / "runs.json").read_text())["runs"][0]
    assert rec["status"] == "ok" and [r["step"] for r in rec["resumed"]] == [ckpts[0][0]]
    fields = ("nominal_tokens", "tokens", "step", "accuracy", "sampled_accuracy")
    assert [[p.get(f) for f in fields] for p in rec["curve"]] == [[p.get(f) for f in fields] for p in ref["curve"]]
    assert rec["tokens"] == ref["tokens"] and rec["steps"] == ref["steps"]
    from trl_ext._io import read_json

    trace = lambda r, out: [(t.get("reward"), t.get("grad_norm"), t.get("ext/generated_tokens"))  # noqa: E731
                            for t in read_json(out / r["trace"])]
    assert trace(rec, cut) == trace(ref, whole) and len(trace(ref, whole)) == ref["steps"]
    assert read_outcomes_jsonl(cut / rec["outcomes"]) == read_outcomes_jsonl(whole / ref["outcomes"])
    assert harness.run_checkpoints(str(run_dir)) == [] and rec["train_wall_s"] > 0
    assert not (run_dir / "README.md").exists() and rec["run_checkpoint_wall_s"] > 0  # the trainer's model card too
    # without mid-run checkpoints a cut-off run leaves nothing to resume
    calls.clear()
    monkeypatch.setattr(harness, "evaluate_checkpoint", dies_at_the_second)
    none = tmp_path / "none"
    assert ct.main([*base, "--output_dir", str(none), "--no_run_checkpoints"]) == 0
    assert harness.run_checkpoints(str(none / "runs" / method / "seed0")) == []

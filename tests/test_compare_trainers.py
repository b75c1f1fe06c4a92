"""Tests of the compute-matched comparison harness ``benchmarks/compare_trainers.py``.

What is checked:

* ``TokenBudgetCallback`` with fake logs: it reads only ``ext/generated_tokens_total`` (the one counter), stops
  exactly at the first log whose count reaches the budget, fires every evaluation checkpoint once with the actual
  count, and rejects decreasing / non-finite counts and trainers that never report the counter (hypothesis property
  test + edge cases);
* the table helpers (tokens to threshold, per-method summary) on hand-built curves;
* the baselines that are configurations of ``trl_ext.GRPOTrainer`` (REINFORCE++, RLOO, Dr. GRPO, DAPO dynamic
  sampling): the harness builds the base trainer with the right config, and its advantages match the formulas of
  the previous benchmark-only trainers (RLOO unwhitened, REINFORCE++ batch-standardised), pads and NaN rows zeroed;
* ``--smoke`` end to end on an untrained tiny model: JSON, tables, plots, per-run outcomes and the two-part-rule
  verdict structure; a method whose trainer cannot be imported or configured is recorded as skipped; the four
  configured baselines train to the budget on the one counter.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bench_module import compare_trainers  # tests/ is on sys.path (pytest's rootdir insertion)
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_ext.testbed import read_outcomes_jsonl

torch.set_num_threads(1)


ct = compare_trainers()


def _control():
    return SimpleNamespace(should_training_stop=False)


def _state(step=0):
    return SimpleNamespace(global_step=step)


# ------------------------------------------------------------------------------------------ budget callback
def test_budget_callback_stops_at_first_log_reaching_budget_and_fires_checkpoints():
    fired = []
    cb = ct.TokenBudgetCallback(1000, [250, 500, 750], lambda n, t, s: fired.append((n, t, s.global_step)))
    control = _control()
    totals = [120, 260, 240 + 260, 980, 1010, 1300]
    stop_at = None
    for step, tot in enumerate(totals, 1):
        cb.on_log(None, _state(step), control, logs={"loss": 0.1, ct.TOKEN_METRIC: float(tot)})
        if control.should_training_stop and stop_at is None:
            stop_at = step
            break
    assert stop_at == 5  # 1010 is the first count >= 1000; 980 is not
    assert cb.reached and cb.tokens == 1010 and cb.seen
    # every checkpoint once, in order, with the first count that reached it
    assert fired == [(250, 260, 2), (500, 500, 3), (750, 980, 4), (1000, 1010, 5)]


def test_budget_callback_reads_only_the_cumulative_counter():
    assert ct.TOKEN_METRIC == "ext/generated_tokens_total" == ct.TokenBudgetCallback.metric
    others = ("ext/generated_tokens", "v05/generated_tokens", "pair/generated_tokens_total")
    cb = ct.TokenBudgetCallback(100)
    control = _control()
    for step in (1, 2, 3):  # per-batch and removed per-trainer counters are large, the one counter is not
        cb.on_log(None, _state(step), control, logs={"loss": 0.1, ct.TOKEN_METRIC: 30.0 * step,
                                                     **{m: 1000.0 for m in others}})
    assert cb.seen and cb.tokens == 90 and not control.should_training_stop and not cb.reached
    cb.on_log(None, _state(4), control, logs={"loss": 0.1, **{m: 5000.0 for m in others}})  # no total: ignored
    assert cb.tokens == 90 and not control.should_training_stop
    cb.on_log(None, _state(5), control, logs={"loss": 0.1, ct.TOKEN_METRIC: 105.0})
    assert cb.tokens == 105 and control.should_training_stop and cb.reached
    # a trainer that logs only an old per-trainer counter is rejected at its first training log
    legacy = ct.TokenBudgetCallback(100)
    with pytest.raises(RuntimeError, match="ext/generated_tokens_total"):
        legacy.on_log(None, _state(1), _control(), logs={"loss": 0.1, "pair/generated_tokens_total": 500.0})
    assert not legacy.seen and legacy.tokens == 0


def test_budget_callback_crossing_several_checkpoints_in_one_log():
    fired = []
    cb = ct.TokenBudgetCallback(300, [100, 200], lambda n, t, s: fired.append((n, t)))
    cb.on_log(None, _state(1), _control(), logs={ct.TOKEN_METRIC: 350.0})
    assert fired == [(100, 350.0), (200, 350.0), (300, 350.0)]


def test_budget_callback_ignores_non_training_logs_but_errors_on_a_step_without_the_counter():
    cb = ct.TokenBudgetCallback(100)
    control = _control()
    cb.on_log(None, _state(0), control, logs=None)
    cb.on_log(None, _state(0), control, logs={"train_runtime": 3.0})  # end-of-train summary: not a step
    cb.on_log(None, _state(0), control, logs={"eval_loss": 0.3})  # evaluation log: not a step
    cb.on_train_end(None, _state(0), control)  # nothing trained, nothing to complain about
    assert not cb.seen and not control.should_training_stop
    with pytest.raises(RuntimeError, match="does not report generated tokens"):
        cb.on_log(None, _state(1), control, logs={"loss": 0.0, "reward": 0.5})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_budget_callback_rejects_bad_counts(bad):
    cb = ct.TokenBudgetCallback(100)
    with pytest.raises(RuntimeError, match="finite"):
        cb.on_log(None, _state(1), _control(), logs={ct.TOKEN_METRIC: bad})


def test_budget_callback_rejects_decreasing_cumulative_count():
    cb = ct.TokenBudgetCallback(100)
    cb.on_log(None, _state(1), _control(), logs={ct.TOKEN_METRIC: 50.0})
    with pytest.raises(RuntimeError, match="decreased"):
        cb.on_log(None, _state(2), _control(), logs={ct.TOKEN_METRIC: 40.0})


@pytest.mark.parametrize("kwargs", [dict(budget=0), dict(budget=-5), dict(budget=float("nan")), dict(budget=True),
                                    dict(budget=10, checkpoints=[11]), dict(budget=10, checkpoints=[0])])
def test_budget_callback_constructor_validation(kwargs):
    with pytest.raises(ValueError):
        ct.TokenBudgetCallback(**kwargs)


@settings(max_examples=60, deadline=None)
@given(budget=st.integers(1, 5000), incs=st.lists(st.integers(0, 700), min_size=1, max_size=40),
       cps=st.lists(st.integers(1, 5000), max_size=6))
def test_budget_callback_property(budget, incs, cps):
    cps = [c for c in cps if c <= budget]
    fired = []
    cb = ct.TokenBudgetCallback(budget, cps, lambda n, t, s: fired.append((n, t)))
    control = _control()
    total, seen = 0, []
    for inc in incs:
        total += inc
        seen.append(total)
        # the per-batch counter rides along and must not be added on top
        cb.on_log(None, _state(len(seen)), control, logs={"loss": 0.0, ct.TOKEN_METRIC: float(total),
                                                          "ext/generated_tokens": float(inc)})
        if control.should_training_stop:
            break
    # stop exactly at the first log whose count reaches the budget, never before
    first = next((i for i, t in enumerate(np.cumsum(incs)) if t >= budget), None)
    assert control.should_training_stop == (first is not None) == cb.reached
    if first is not None:
        assert len(seen) == first + 1
    assert cb.tokens == seen[-1]
    # fired checkpoints: exactly those <= final count, in order, each with the first count that reached it
    expected = sorted(set(cps) | {budget})
    expected = [c for c in expected if c <= seen[-1]]
    assert [n for n, _ in fired] == expected
    for n, t in fired:
        assert t == next(x for x in seen if x >= n)


# ------------------------------------------------------------------------------------------ table helpers
def test_tokens_to_threshold_and_summary():
    curve = [{"tokens": 0.0, "greedy_accuracy": 0.4}, {"tokens": 110.0, "greedy_accuracy": 0.55},
             {"tokens": 205.0, "greedy_accuracy": 0.62}]
    assert ct.tokens_to_threshold(curve, 0.6) == 205.0
    assert ct.tokens_to_threshold(curve, 0.4) == 0.0
    assert ct.tokens_to_threshold(curve, 0.7) is None
    runs = [
        {"method": "grpo_g16", "label": "G16", "status": "ok", "seed": s, "final_greedy_accuracy": acc,
         "curve": [{"tokens": 100.0 + s, "greedy_accuracy": acc}], "tokens": 101.0 + s, "train_wall_s": 2.0 * (s + 1),
         "steps": 3, "rollouts_per_step": 64.0}
        for s, acc in enumerate([0.5, 0.7])
    ] + [{"method": "pair", "label": "PAIR", "status": "skipped", "seed": 0, "reason": "no module"}]
    rows = ct.summarize(runs, threshold=0.6, start_accuracy=0.45)
    g = rows[0]
    assert g["n_seeds"] == 2 and g["final_accuracy_mean"] == pytest.approx(0.6)
    assert g["final_accuracy_sd"] == pytest.approx(math.sqrt(0.02))
    assert g["tokens_to_threshold_reached"] == 1 and g["tokens_to_threshold_mean"] == 101.0
    assert g["train_wall_s_mean"] == pytest.approx(3.0)
    assert rows[1]["status"] == "skipped" and rows[1]["reason"] == "no module" and rows[1]["n_seeds"] == 0
    md = ct.table_markdown(rows, 0.6, {"token_budget": 100, "n_eval": 10}, n_eval=10)
    assert "skipped: no module" in md and "0.600 +- 0.141" in md


def test_choose_threshold_rules():
    runs = [{"method": "grpo_g16", "status": "ok", "final_greedy_accuracy": a} for a in (0.6, 0.7)]
    runs.append({"method": "grpo_g16", "status": "failed"})
    assert ct.choose_threshold(runs, None, 0.4)[0] == pytest.approx(0.65)
    assert ct.choose_threshold(runs, 0.5, 0.4) == (0.5, "--threshold")
    assert ct.choose_threshold(runs[2:], None, 0.4)[0] == pytest.approx(0.5)
    assert ct.choose_threshold([], None, 0.95)[0] == 1.0


# ------------------------------------------------------------------------------ baselines as base-trainer configs
def _fake_batch(rewards, gids, pad):
    r = torch.tensor(rewards, dtype=torch.float32)
    pad = torch.tensor(pad)
    return SimpleNamespace(rewards=r, group_ids=torch.tensor(gids), is_pad=pad, valid=~pad & ~torch.isnan(r),
                           num_rows=len(r), mode="train", side_inputs={}, estimator_inputs={}, record=None)


def _smoke_ctx():
    s = ct.resolve_settings(ct.build_parser().parse_args(["--output_dir", "unused", "--smoke"]))
    return SimpleNamespace(s=s, max_new=5)


_B_REWARDS = [1.0, 0.0, 1.0, 1.0, float("nan"), 0.0, float("nan")]
_B_GIDS = [0, 0, 0, 1, 1, 2, -1]
_B_PAD = [False, False, False, False, False, False, True]
_B_FIN = np.array([1.0, 0.0, 1.0, 1.0, 0.0])  # the valid rows 0, 1, 2, 3, 5


def _expected(name):
    """Formulas of the previous benchmark-only trainers (and of Dr. GRPO): valid rows 0, 1, 2, 3, 5."""
    out = np.zeros(len(_B_REWARDS))
    if name == "rloo":  # leave-one-out mean, no whitening; singletons (group 1 after its NaN row, group 2) -> 0
        out[[0, 1, 2]] = [0.5, -1.0, 0.5]
    elif name == "reinforce_pp":  # global batch mean and Bessel std of the valid rows
        out[[0, 1, 2, 3, 5]] = (_B_FIN - _B_FIN.mean()) / (_B_FIN.std(ddof=1) + 1e-4)
    elif name == "dr_grpo":  # group mean, no std
        out[[0, 1, 2]] = [1 / 3, -2 / 3, 1 / 3]
    return out


@pytest.mark.parametrize("name", ["reinforce_pp", "rloo", "dr_grpo", "dapo_dynamic"])
def test_harness_builds_configured_baselines_on_the_base_trainer(tmp_path, name):
    from trl_ext.testbed import build_tiny_model, build_tokenizer, get_reward_funcs, make_dataset
    from trl_ext.trainers.base import ExtGRPOConfig, GRPOTrainer

    ctx = _smoke_ctx()
    spec = ct.METHODS[name]
    config_cls, trainer_cls = ct._load_object(spec.config), ct._load_object(spec.trainer)
    assert config_cls is ExtGRPOConfig and trainer_cls is GRPOTrainer  # no benchmark-only trainer class
    config, kw, n_prompts = ct.build_config(ctx, spec, config_cls, trainer_cls, 0, str(tmp_path), {})
    rps = ctx.s["rollouts_per_step"]
    assert config.generation_batch_size == rps and n_prompts == rps // spec.group_size
    # each baseline is plain GRPO (same shared settings, same group size) plus exactly its own config fields
    ref, own = {
        # 4x more prompts per step than G = 4: a lower bound on tokens per step that is 4x higher
        "reinforce_pp": ("grpo_g4", dict(num_generations=1, per_device_train_batch_size=rps,
                                         max_steps=math.ceil(ctx.s["token_budget"] / rps) + 2,
                                         advantage_estimator="reinforce_pp",
                                         advantage_estimator_kwargs={"normalize": True})),
        "rloo": ("grpo_g4", dict(advantage_estimator="rloo", advantage_estimator_kwargs={"normalize": False})),
        "dr_grpo": (ct.GRPO_REFERENCE, dict(advantage_estimator="dr_grpo", loss_type="dr_grpo")),
        "dapo_dynamic": ("grpo_g4", dict(dynamic_sampling=True)),
    }[name]
    ref_spec = ct.METHODS[ref]
    _, ref_kw, _ = ct.build_config(ctx, ref_spec, config_cls, trainer_cls, 0, str(tmp_path), {})
    assert ref_spec.family == "grpo" and not ref_spec.config_kwargs and spec.family == "baseline"
    assert kw == {**ref_kw, **own}
    for k, v in own.items():
        assert getattr(config, k) == v, k

    tok = build_tokenizer()
    trainer = trainer_cls(model=build_tiny_model(tok, seed=0), reward_funcs=get_reward_funcs("addition"), args=config,
                          train_dataset=make_dataset("addition", 64, seed=0), processing_class=tok)
    # reinforce_pp: the sampler yields unique prompts (G = 1), a full generation batch of them per step
    assert trainer.num_generations == (1 if name == "reinforce_pp" else spec.group_size)
    assert trainer.rollout_strategy.name == ("dynamic_sampling" if name == "dapo_dynamic" else "fixed_groups")
    if name == "dapo_dynamic":
        assert trainer.rollout_strategy.max_rounds == config.dynamic_sampling_max_rounds >= 1
        return
    adv = trainer.compute_advantages(_fake_batch(_B_REWARDS, _B_GIDS, _B_PAD))
    np.testing.assert_allclose(adv.double().numpy(), _expected(name), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ smoke end to end
def test_smoke_end_to_end(tmp_path, monkeypatch):
    from trl_ext.testbed import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny")
    monkeypatch.setitem(ct.METHODS, "missing_trainer", ct.MethodSpec(
        "missing_trainer", "not installed", "trl_ext", group_size=4, config="trl_ext.trainers.does_not_exist:Config",
        trainer="trl_ext.trainers.does_not_exist:Trainer"))
    monkeypatch.setitem(ct.METHODS, "bad_config", ct.MethodSpec(
        "bad_config", "bad config", "baseline", group_size=4, config_kwargs={"no_such_field": 1}))
    out = tmp_path / "out"
    rc = ct.main(["--output_dir", str(out), "--smoke", "--model_name_or_path", model_dir,
                  "--methods", "grpo_g16", "grpo_g4", "missing_trainer", "bad_config", "--seeds", "0", "1"])
    assert rc == 0
    for name in ("runs.json", "table.md", "table.json", "verdicts.json", "verdicts.md", "accuracy_vs_tokens.png",
                 "accuracy_vs_walltime.png"):
        assert (out / name).is_file(), name
    for png in ("accuracy_vs_tokens.png", "accuracy_vs_walltime.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((out / "runs.json").read_text())
    s = doc["settings"]
    assert s["smoke"] and s["seeds"] == [0, 1]
    by = {(r["method"], r["seed"]): r for r in doc["runs"]}
    assert set(by) == {(m, sd) for m in ("grpo_g16", "grpo_g4", "missing_trainer", "bad_config") for sd in (0, 1)}
    for m in ("missing_trainer", "bad_config"):
        for sd in (0, 1):
            assert by[(m, sd)]["status"] == "skipped"
    assert "not importable" in by[("missing_trainer", 0)]["reason"]
    assert "config rejected" in by[("bad_config", 0)]["reason"] and "no_such_field" in by[("bad_config", 0)]["reason"]
    for m, g in (("grpo_g16", 16), ("grpo_g4", 4)):
        for sd in (0, 1):
            r = by[(m, sd)]
            assert r["status"] == "ok" and r["budget_reached"] and r["token_metric"] == ct.TOKEN_METRIC
            # stopped right after crossing: the overshoot is less than one generation batch
            assert s["token_budget"] <= r["tokens"] < s["token_budget"] + s["rollouts_per_step"] * doc[
                "max_completion_length"]
            assert r["config"]["num_generations"] == g and r["prompts_per_step"] == s["rollouts_per_step"] // g
            assert [p["nominal_tokens"] for p in r["curve"]] == [250.0, 500.0]
            assert all(p["tokens"] >= p["nominal_tokens"] for p in r["curve"])
            assert r["outcomes"].endswith("outcomes.jsonl.gz")  # stored gzip-compressed
            recs = read_outcomes_jsonl(out / r["outcomes"])
            assert len(recs) == s["n_eval"] and f"seed{sd}" in r["outcomes"]
            assert {"question_id", "correct", "pass_rate"} <= set(recs[0])
    table = json.loads((out / "table.json").read_text())
    assert [r["method"] for r in table["rows"]] == ["grpo_g16", "grpo_g4", "missing_trainer", "bad_config"]
    assert "skipped" in (out / "table.md").read_text()
    v = json.loads((out / "verdicts.json").read_text())
    assert v["references"]["vs_grpo_g16"] == "grpo_g16" and v["references"]["vs_best_grpo"] in ("grpo_g16", "grpo_g4")
    comps = v["comparisons"]
    assert comps and all(c["b"] in ("grpo_g16", "grpo_g4") and c["a"] != c["b"] for c in comps)
    assert {(c["a"], c["b"]) for c in comps} >= {("grpo_g4", "grpo_g16")}
    c = next(c for c in comps if c["a"] == "grpo_g4" and c["b"] == "grpo_g16")
    assert c["n_seeds"] == 2 and c["n_questions"] == s["n_eval"]
    assert c["status"] in ("a_wins", "b_wins", "no_winner")  # two seeds: the rule can be applied
    for key in ("margin", "margin_ci", "detection_floor", "paired_detection_floor", "votes_a", "votes_b",
                "pooled_p_value", "report"):
        assert key in c
    assert len(c["report"]["verdict"]["seeds"]) == 2
    # re-running reuses finished runs (same settings) instead of training again
    rc = ct.main(["--output_dir", str(out), "--smoke", "--model_name_or_path", model_dir,
                  "--methods", "grpo_g4", "--seeds", "0"])
    assert rc == 0
    again = json.loads((out / "runs.json").read_text())["runs"]
    assert len(again) == 1 and again[0]["run_wall_s"] == by[("grpo_g4", 0)]["run_wall_s"]


def test_smoke_configured_baselines_train_to_the_budget_on_the_one_counter(tmp_path):
    from trl_ext.testbed import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    methods = ["reinforce_pp", "rloo", "dr_grpo", "dapo_dynamic"]
    rc = ct.main(["--output_dir", str(out), "--smoke", "--model_name_or_path", model_dir, "--methods", *methods,
                  "--seeds", "0", "--no_plots"])
    assert rc == 0
    doc = json.loads((out / "runs.json").read_text())
    s = doc["settings"]
    by = {r["method"]: r for r in doc["runs"]}
    assert list(by) == methods
    for name, r in by.items():
        assert r["status"] == "ok", (name, r.get("reason"))
        assert r["trainer_class"] == "trl_ext.trainers.base.GRPOTrainer"
        assert r["budget_reached"] and r["token_metric"] == ct.TOKEN_METRIC
        assert r["tokens"] == r["last_log"][ct.TOKEN_METRIC] >= s["token_budget"]
        for k, v in ct.METHODS[name].config_kwargs.items():
            assert r["config"][k] == v, (name, k)
    assert by["reinforce_pp"]["config"]["num_generations"] == 1
    assert by["reinforce_pp"]["last_log"]["ext/rollouts"] == s["rollouts_per_step"]  # 32 prompts x 1 rollout
    # DAPO on an untrained model: every group has reward 0 and is filtered, but its tokens still count
    dapo = by["dapo_dynamic"]["last_log"]
    assert dapo["dapo/filtered_groups"] > 0 and dapo["ext/trained_tokens"] < dapo["ext/generated_tokens"]


def test_settings_validation():
    parser = ct.build_parser()
    with pytest.raises(SystemExit):
        ct.resolve_settings(parser.parse_args(["--output_dir", "x", "--methods", "nope"]))
    with pytest.raises(SystemExit):
        ct.resolve_settings(parser.parse_args(["--output_dir", "x", "--rollouts_per_step", "40"]))
    with pytest.raises(SystemExit):
        ct.resolve_settings(parser.parse_args(["--output_dir", "x", "--token_budget", "100",
                                               "--eval_every_tokens", "200"]))
    with pytest.raises(SystemExit):
        ct.resolve_settings(parser.parse_args(["--output_dir", "x", "--dataset_fn", "a:b"]))
    with pytest.raises(SystemExit):
        ct.resolve_settings(parser.parse_args(["--output_dir", "x", "--config_overrides", "[1]"]))
    s = ct.resolve_settings(parser.parse_args(["--output_dir", "x", "--smoke", "--use_vllm",
                                               "--config_overrides", '{"loss_type": "dapo"}']))
    assert s["methods"] == ct.SMOKE["methods"] and s["seeds"] == [0]
    assert s["config_overrides"] == {"loss_type": "dapo", "use_vllm": True}


def test_checkpoint_train_wall_excludes_its_own_evaluation(tmp_path, monkeypatch):
    """A curve point's ``train_wall_s`` is the training time before that checkpoint's evaluation (it used to include
    the evaluation itself: the final point then read more training time than the whole run)."""
    import sys
    import time

    from trl_ext.testbed import save_tiny_model

    runs_mod = sys.modules["compare_harness.runs"]
    real_eval = runs_mod.evaluate_checkpoint

    def slow_eval(*a, **k):
        time.sleep(1.0)
        return real_eval(*a, **k)

    monkeypatch.setattr(runs_mod, "evaluate_checkpoint", slow_eval)
    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    assert ct.main(["--output_dir", str(out), "--smoke", "--no_plots", "--model_name_or_path", model_dir,
                    "--methods", "grpo_g4", "--seeds", "0"]) == 0
    (run,) = json.loads((out / "runs.json").read_text())["runs"]
    walls = [p["train_wall_s"] for p in run["curve"]]
    assert len(walls) == 2 and run["eval_wall_s"] >= 2.0  # two evaluations of >= 1 s each
    assert walls == sorted(walls) and walls[-1] <= run["train_wall_s"] + 0.05

"""The comparison harness's real-model path (``benchmarks/compare_trainers.py --scale smollm2``), without the model.

What is checked (the real SmolLM2 runs themselves are the committed benchmark, docs/results.md):

* the ``smollm2`` preset and its protocol values (methods, two tuned learning rates, three seeds, sampled
  evaluation, LoRA, gradient accumulation) and their validation;
* run keys: the new settings enter a key only when they differ from what earlier runs used, so the committed
  testbed runs stay reusable, and each of them changes the key when set;
* ``grad_accum`` splits one generation batch into micro-batches without changing what is generated per step;
* the chat-task datasets get unique ``question_id`` values and a validation set disjoint from the training prompts;
* conversational prompts go through the chat template, left-padded, in evaluation;
* ``eval_mode="sampled"`` evaluates by sampling only, and the start evaluation is cached by its settings;
* the primary-accuracy readers fall back to the greedy fields of runs written before ``eval_mode``.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from bench_module import compare_trainers  # tests/ is on sys.path (pytest's rootdir insertion)

ct = compare_trainers()


def _settings(*argv):
    return ct.resolve_settings(ct.build_parser().parse_args(["--output_dir", "unused", *argv]))


def test_smollm2_preset_and_protocol():
    s = _settings("--scale", "smollm2", "--protocol", "v2")
    assert s["task"] == "sum3" and s["methods"] == ct.REAL_METHODS
    assert set(ct.REAL_METHODS) <= set(ct.METHODS)
    assert s["tune_lr"] == [1e-4, 3e-4] and s["seeds"] == [0, 1, 2] and s["tune_extend"] == 1
    assert s["eval_mode"] == "sampled" and s["eval_samples"] >= 1 and s["checkpoint_outcomes"]
    assert s["use_peft"] and (s["lora_r"], s["lora_alpha"]) == (16, 32) and s["grad_accum"] == 4
    assert s["value_table_batch_size"] == 64 and s["value_table_samples"] == 4
    # v1 on the same scale keeps v1's protocol (one learning rate), explicit arguments still win
    s1 = _settings("--scale", "smollm2", "--task", "steps", "--no-use_peft", "--eval_mode", "greedy")
    assert s1["tune_lr"] is None and s1["task"] == "steps" and not s1["use_peft"] and s1["eval_mode"] == "greedy"
    with pytest.raises(SystemExit, match="eval_samples"):
        _settings("--eval_mode", "sampled")  # the cpu preset samples nothing
    assert _settings()["eval_mode"] == "greedy" and not _settings()["use_peft"]


def test_new_settings_enter_run_keys_only_when_not_default():
    spec = ct.METHODS["grpo_g4"]
    s = _settings("--protocol", "v2")
    base = ct._settings_key(s, spec, 0, 1e-4)
    legacy = {k: v for k, v in s.items() if k not in ("eval_mode", "use_peft", "lora_r", "lora_alpha", "grad_accum",
                                                      "checkpoint_outcomes")}
    assert ct._settings_key(legacy, spec, 0, 1e-4) == base  # committed testbed runs keep their keys
    for change in ({"eval_mode": "sampled"}, {"use_peft": True}, {"grad_accum": 4}):
        assert ct._settings_key({**s, **change}, spec, 0, 1e-4) != base, change
    peft = {**s, "use_peft": True}
    assert ct._settings_key({**peft, "lora_r": 8}, spec, 0, 1e-4) != ct._settings_key(peft, spec, 0, 1e-4)


def test_temperature_reaches_training_evaluation_and_keys_only_when_set(tmp_path):
    """``--temperature``: the trainer config, sampled evaluation and the run / start-evaluation keys (only when it
    is not 1, so the committed T = 1 runs keep their keys); refused for the testbed tasks."""
    import torch

    base = _settings("--scale", "smollm2", "--protocol", "v2", "--task", "steps_matched")
    cold = _settings("--scale", "smollm2", "--protocol", "v2", "--task", "steps_matched", "--temperature", "0.7")
    assert base["temperature"] == 1.0 and cold["temperature"] == 0.7
    spec = ct.METHODS["grpo_g4"]
    legacy = {k: v for k, v in base.items() if k != "temperature"}
    assert ct._settings_key(base, spec, 0, 1e-4) == ct._settings_key(legacy, spec, 0, 1e-4)
    assert ct._settings_key(cold, spec, 0, 1e-4) != ct._settings_key(base, spec, 0, 1e-4)
    config_cls, trainer_cls = ct._load_object(spec.config), ct._load_object(spec.trainer)
    config = ct.build_config(SimpleNamespace(s=cold, max_new=192), spec, config_cls, trainer_cls, 0, str(tmp_path),
                             {}, lr=1e-4)[0]
    assert config.temperature == 0.7 and config.max_completion_length == 192
    with pytest.raises(SystemExit, match="--temperature"):
        _settings("--task", "addition", "--temperature", "0.7")

    seen = []

    class _Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def generate(self, input_ids, attention_mask, num_return_sequences, **kw):
            seen.append(kw.get("temperature"))
            return torch.cat([input_ids.repeat_interleave(num_return_sequences, 0),
                              torch.full((input_ids.shape[0] * num_return_sequences, 2), 5)], 1)

    from trl_ext.testbed import EvalResult, build_tokenizer

    tok = build_tokenizer()
    ds = [{"prompt": "1+2=", "question_id": "q"}]
    for temp in (0.7, 1.0):
        ct._generic_evaluate(_Model(), tok, ds, lambda prompts, completions, **k: [0.0] * len(completions), False,
                             2, 2, 0, 1, EvalResult, temperature=temp)
    assert seen == [0.7, 1.0]


@pytest.mark.parametrize("name", ["grpo_g8", "reinforce_pp", "pair"])
def test_grad_accum_keeps_the_generation_batch(tmp_path, name):
    s = _settings("--scale", "smollm2", "--protocol", "v2")
    ctx = SimpleNamespace(s=s, max_new=128)
    spec = ct.METHODS[name]
    config_cls, trainer_cls = ct._load_object(spec.config), ct._load_object(spec.trainer)
    config, kw, n_prompts = ct.build_config(ctx, spec, config_cls, trainer_cls, 0, str(tmp_path), {}, lr=1e-4)
    assert config.gradient_accumulation_steps == config.steps_per_generation == 4
    assert config.per_device_train_batch_size * 4 == config.generation_batch_size
    per_step = n_prompts if spec.group_size == 1 else n_prompts * spec.group_size
    assert config.generation_batch_size == per_step == s["rollouts_per_step"]
    with pytest.raises(ValueError, match="grad_accum=3"):
        ct.build_config(SimpleNamespace(s={**s, "grad_accum": 3}, max_new=128), spec, config_cls, trainer_cls, 0,
                        str(tmp_path), {})


def test_real_task_datasets_have_unique_ids_and_a_disjoint_validation_set():
    train = ct.real_task_dataset("sum3", 128, split="train", seed=0)
    test = ct.real_task_dataset("sum3", 64, split="test", seed=0)
    assert len(set(train["question_id"])) == 128 and len(set(test["question_id"])) == 64
    assert all(q.startswith("sum3:What is") for q in train["question_id"])
    assert not set(train["question_id"]) & set(test["question_id"])
    pool = ct.real_task_dataset("sum3", None, split="train", seed=1)
    val = ct.validation_split(pool, train, 48)
    assert len(val) == 48 and not set(val["question_id"]) & set(train["question_id"])
    assert ct._prompt_text(train[0]["prompt"]) == train[0]["prompt"][-1]["content"]
    assert ct._prompt_text("plain") == "plain"


def test_conversational_prompts_use_the_chat_template_left_padded():
    from trl_ext.testbed import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    tok.padding_side = "left"
    convs = [[{"role": "user", "content": "1+2"}], [{"role": "user", "content": "12+34+5"}]]
    enc = ct._tokenize_prompts(tok, convs, "cpu")
    for row, mask, conv in zip(enc["input_ids"].tolist(), enc["attention_mask"].tolist(), convs):
        ids = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        kept = [t for t, m in zip(row, mask) if m]
        assert kept == list(ids) and mask[-1] == 1  # left padding: the prompt ends at the last position
    plain = ct._tokenize_prompts(tok, ["1+2=", "12+34="], "cpu")
    assert plain["input_ids"].shape[0] == 2


class _FakeCtx:
    def __init__(self, s):
        self.s = s
        self.calls = []

    def evaluate(self, model, *, greedy=True, num_samples=1, seed=0, split="test"):
        self.calls.append((greedy, num_samples, seed, split))
        recs = [{"question_id": "q1", "correct": 1, "pass_rate": 1.0}, {"question_id": "q2", "correct": 0,
                                                                        "pass_rate": 0.0}]
        return SimpleNamespace(accuracy=0.5, records=recs)

    def load_model(self):
        return object()


def test_sampled_eval_mode_and_cached_start_evaluation(tmp_path):
    s = {**_settings("--scale", "smollm2"), "output_dir": str(tmp_path), "start_checkpoint_sha": "abc"}
    ctx = _FakeCtx(s)
    primary, extra = ct.evaluate_checkpoint(ctx, None, 2, "validation")
    assert extra is None and ctx.calls == [(False, s["eval_samples"], 1002, "validation")]
    greedy_ctx = _FakeCtx({**s, "eval_mode": "greedy", "eval_samples": 0})
    ct.evaluate_checkpoint(greedy_ctx, None, 0, "test")
    assert greedy_ctx.calls == [(True, 1, 0, "test")]

    ctx.calls.clear()
    first = ct.start_evaluation(ctx)
    again = ct.start_evaluation(ctx)
    assert len(ctx.calls) == 1 and again.accuracy == first.accuracy == 0.5
    assert [r["question_id"] for r in again.records] == ["q1", "q2"]
    ctx.s["n_eval"] = 7  # another evaluation set: evaluated again
    ct.start_evaluation(ctx)
    assert len(ctx.calls) == 2
    ctx.s["temperature"] = 1.0  # the default temperature leaves the cached key as it was
    ct.start_evaluation(ctx)
    assert len(ctx.calls) == 2
    ctx.s["temperature"] = 0.7  # another sampling temperature: evaluated again
    ct.start_evaluation(ctx)
    assert len(ctx.calls) == 3
    ctx.s["resume"] = False
    ct.start_evaluation(ctx)
    assert len(ctx.calls) == 4


def test_primary_accuracy_readers_fall_back_to_greedy_fields():
    assert ct.final_accuracy({"final_accuracy": 0.25, "final_greedy_accuracy": 0.9}) == 0.25
    assert ct.final_accuracy({"final_accuracy": None, "final_greedy_accuracy": 0.9}) == 0.9
    assert ct.final_accuracy({"final_greedy_accuracy": 0.9}) == 0.9
    assert ct.point_accuracy({"accuracy": 0.1, "greedy_accuracy": 0.7}) == 0.1
    assert ct.point_accuracy({"greedy_accuracy": 0.7}) == 0.7


@pytest.mark.real_model
@pytest.mark.timeout(600)
def test_harness_context_evaluates_the_real_chat_model(tmp_path):
    """The harness's real-task context on SmolLM2: chat-templated greedy evaluation matches the measurement module's
    (``trl_ext.realmodel.measure``) on the same questions, records carry question ids and completions, and the
    cached start evaluation is reused."""
    from trl_ext.realmodel.measure import _sample_completions
    from trl_ext.realmodel.tasks import accuracy_reward

    s = {**_settings("--scale", "smollm2", "--n_eval", "4", "--eval_mode", "greedy"), "output_dir": str(tmp_path)}
    ctx = ct.Context(s)
    assert len(ctx.eval_ds) == 4 and ctx.max_new == 128 and s["start_checkpoint_sha"] != ctx.model_path
    model = ctx.load_model()
    got = ctx.evaluate(model, greedy=True)
    convs = [r["prompt"] for r in ctx.eval_ds]
    texts, _, _ = _sample_completions(model, ctx.tokenizer, convs, num_samples=1, max_new_tokens=128, greedy=True,
                                      batch_size=64, seed=0)
    assert [r["completions"][0] for r in got.records] == texts
    want = accuracy_reward(completions=texts, answer=list(ctx.eval_ds["answer"]))
    assert [r["pass_rate"] for r in got.records] == want
    assert [r["question_id"] for r in got.records] == list(ctx.eval_ds["question_id"])
    first = ct.start_evaluation(ctx)
    assert first.accuracy == got.accuracy and os.path.exists(tmp_path / ct.START_EVAL_FILE)


def test_report_only_trains_nothing_and_chooses_no_rate_from_partial_tuning(tmp_path, monkeypatch):
    """``--report_only`` (the interim report of a benchmark that runs across sessions): finished runs are read,
    the others are recorded as pending without training or writing anything; a method is given a learning rate only
    when all its tuning runs exist, and ``lr_choice.json`` is not written."""
    s = {**_settings("--protocol", "v2", "--smoke", "--methods", "grpo_g4", "grpo_g16", "--tune_lr", "1e-4", "3e-4",
                     "--tune_extend", "0", "--report_only"), "output_dir": str(tmp_path), "start_checkpoint_sha": "abc"}
    assert s["report_only"]
    ctx = SimpleNamespace(s=s)
    monkeypatch.setattr(ct.harness_runs, "run_one", lambda *a, **k: pytest.fail("--report_only must not train"))
    # grpo_g4: both tuning runs finished (0.5 at 1e-4, 0.7 at 3e-4); grpo_g16: only 1e-4 finished
    for name, lrs in (("grpo_g4", {1e-4: 0.5, 3e-4: 0.7}), ("grpo_g16", {1e-4: 0.9})):
        spec = ct.METHODS[name]
        for lr, acc in lrs.items():
            run_dir = tmp_path / "runs" / "tune" / name / f"lr{ct.lr_key(lr)}" / "seed0"
            run_dir.mkdir(parents=True)
            ct._write_json(str(run_dir / "result.json"), {
                "method": name, "label": spec.label, "family": spec.family, "seed": 0, "status": "ok",
                "learning_rate": lr, "eval_split": "validation", "final_accuracy": acc, "tokens": 100.0,
                "settings_key": ct._settings_key(s, spec, 0, lr, "validation"), "final_accuracy_by_level": None})
    doc, runs = ct.tune_learning_rates(ctx, {})
    assert doc["methods"]["grpo_g4"]["chosen_lr"] == 3e-4
    g16 = doc["methods"]["grpo_g16"]
    assert g16["chosen_lr"] is None and g16["status"] == "pending" and "1 tuning run" in g16["reason"]
    assert sorted(r["status"] for r in runs) == ["ok", "ok", "ok", "pending"]
    assert not (tmp_path / ct.LR_CHOICE_FILE).exists()
    assert not (tmp_path / "runs" / "tune" / "grpo_g16" / "lr0.0003").exists()
    # with an edge extension: the complete grid (grpo_g4, best at the upper edge) extends to 1e-3 (pending); the
    # incomplete one (grpo_g16) does not extend yet, as a training invocation would not
    s["tune_extend"] = 1
    _, runs = ct.tune_learning_rates(ctx, {})
    lrs = {(r["method"], r["learning_rate"], r["status"]) for r in runs}
    assert ("grpo_g4", 1e-3, "pending") in lrs and not any(m == "grpo_g16" and lr < 1e-4 for m, lr, _ in lrs)


def test_report_only_reports_a_recorded_skip_as_skipped_not_pending(tmp_path, monkeypatch):
    """A method recorded as not defined for the task (tiebreak without a graded reward) stays ``skipped`` in an
    interim report, with its reason; a missing or stale record is ``pending``."""
    s = {**_settings("--protocol", "v2", "--smoke", "--methods", "tiebreak", "--tune_lr", "1e-4", "--report_only"),
         "output_dir": str(tmp_path), "start_checkpoint_sha": "abc"}
    monkeypatch.setattr(ct.harness_runs, "run_one", lambda *a, **k: pytest.fail("--report_only must not train"))
    spec, ctx = ct.METHODS["tiebreak"], SimpleNamespace(s=s)
    run_dir = tmp_path / "runs" / "tune" / "tiebreak" / "lr0.0001" / "seed0"
    run_dir.mkdir(parents=True)
    key = ct._settings_key(s, spec, 0, 1e-4, "validation")
    ct._write_json(str(run_dir / "result.json"), {**ct._skip_record(spec, 0, "not defined for this task: no grade",
                                                                     key), "learning_rate": 1e-4})
    doc, runs = ct.tune_learning_rates(ctx, {})
    assert [r["status"] for r in runs] == ["skipped"]
    assert doc["methods"]["tiebreak"]["status"] == "skipped" and "no grade" in doc["methods"]["tiebreak"]["reason"]
    ct._write_json(str(run_dir / "result.json"), {**ct._skip_record(spec, 0, "old", "stale-key")})
    assert ct.harness_runs.run_or_reuse(ctx, spec, 0, str(run_dir), {}, 1e-4, "validation")["status"] == "pending"


def test_every_real_task_has_a_completion_cap_in_the_harness():
    """A task added to ``trl_ext.realmodel.REAL_TASKS`` must get its measured completion cap here, else the harness
    would treat it as a testbed task."""
    from trl_ext.realmodel import REAL_TASKS

    assert set(ct.REAL_TASK_MAX_NEW) == set(REAL_TASKS)


def test_plots_name_the_primary_accuracy(tmp_path, monkeypatch):
    """The y axis says which accuracy is plotted: sampled on the real-model preset, greedy on the testbed."""
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    labels = []
    monkeypatch.setattr(Axes, "set_ylabel", lambda self, text, *a, **k: labels.append(text))
    runs = [{"method": "grpo_g4", "label": "GRPO G=4", "family": "grpo", "status": "ok", "seed": s,
             "curve": [{"tokens": 100.0 * k, "train_wall_s": 1.0 * k, "accuracy": 0.5 + 0.1 * k} for k in (1, 2)]}
            for s in (0, 1)]
    for mode in ("sampled", "greedy"):
        paths = ct.make_plots(runs, 0.4, str(tmp_path), mode)
        assert len(paths) == 2 and all(os.path.isfile(p) for p in paths)
    assert [lab.split(" accuracy")[0] for lab in labels] == ["held-out sampled"] * 2 + ["held-out greedy"] * 2

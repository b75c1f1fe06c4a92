"""reasoning-gym datasets and scorers (``trl_ext.external_tasks.reasoning_gym``) in every entry point.

Prompt shape, the task's own scorer wired into TRL's reward signature, splits disjoint and deterministic by seed,
curriculum levels, the missing-extra and unknown-task errors; the example script on SmolLM2 in ``-m real_model``.
"""

from __future__ import annotations

import math
import os
import sys

import pytest

pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra (part of .[dev]) is not installed")

from trl_ext.external_tasks import reasoning_gym as rgt  # noqa: E402

SPEC = "reasoning_gym:chain_sum:level=1,size=60"


def _questions(rows):
    return [r["prompt"][-1]["content"] for r in rows]


def test_prompt_is_a_chat_with_instruction_two_shots_and_the_question():
    rows = rgt.make_rg_dataset(SPEC, "train", 5, as_list=True)
    assert len(rows) == 5
    for r in rows:
        roles = [m["role"] for m in r["prompt"]]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
        assert "Answer: <your answer>" in r["prompt"][0]["content"]
        assert all(m["content"].startswith("Answer: ") for m in r["prompt"] if m["role"] == "assistant")
        assert r["task"] == "chain_sum" and r["rg_split"] == "train" and r["rg_spec"] == rgt.parse_spec(SPEC).canonical
        assert r["answer"] == str(rgt._entry(r["rg_spec"], "train", r["rg_index"])["answer"])


def test_scorer_is_the_tasks_own_and_follows_trls_signature(monkeypatch):
    rows = rgt.make_rg_dataset(SPEC, "test", 3, as_list=True)
    r = rows[0]
    comps = [f"Let me add.\nAnswer: {r['answer']}", "Answer: 123456789", "no answer here",
             f"<answer>{r['answer']}</answer>", [{"role": "assistant", "content": f"Answer: {r['answer']}"}]]
    cols = {k: [r[k]] * len(comps) for k in ("rg_spec", "rg_split", "rg_index")}
    assert rgt.rg_accuracy_reward(prompts=[r["prompt"]] * len(comps), completions=comps, **cols) == \
        [1.0, 0.0, 0.0, 1.0, 1.0]
    assert rgt.rg_format_reward(completions=comps) == [1.0, 1.0, 0.0, 0.0, 1.0]
    import reasoning_gym

    def broken(name):
        def score(answer, entry):
            raise RuntimeError("scorer failed")
        return score

    monkeypatch.setattr(reasoning_gym, "get_score_answer_fn", broken)
    assert rgt.rg_accuracy_reward(completions=comps[:1], **{k: v[:1] for k, v in cols.items()}) == [None]
    with pytest.raises(ValueError, match="needs completions and the dataset's rg_spec"):
        rgt.rg_accuracy_reward(completions=comps)


def test_splits_are_disjoint_and_deterministic_by_seed():
    train = rgt.make_rg_dataset(SPEC, "train", as_list=True)
    val = rgt.make_rg_dataset(SPEC, "validation", as_list=True)
    test = rgt.make_rg_dataset(SPEC, "test", as_list=True)
    shots = {m["content"] for m in train[0]["prompt"][1:5:2]}  # the two few-shot questions
    q_tr, q_va, q_te = set(_questions(train)), set(_questions(val)), set(_questions(test))
    assert len(q_tr) == len(train) == 60 and len(q_va) == len(val) == 200 and len(q_te) == len(test) == 200
    assert not (q_tr & q_va) and not (q_tr & q_te) and not (q_va & q_te)
    assert not (shots & (q_tr | q_va | q_te))  # the worked examples are never asked
    assert _questions(rgt.make_rg_dataset(SPEC, "train", as_list=True)) == _questions(train)  # deterministic
    other = rgt.make_rg_dataset("reasoning_gym:chain_sum:level=1,size=60,seed=7", "train", as_list=True)
    assert _questions(other) != _questions(train)  # the spec's seed picks other questions
    a = rgt.make_rg_dataset(SPEC, "train", 10, seed=0, as_list=True)
    b = rgt.make_rg_dataset(SPEC, "train", 10, seed=1, as_list=True)
    assert _questions(a) != _questions(b) and set(_questions(a)) <= q_tr  # a subset of the same split


def test_curriculum_level_and_config_options_change_the_task():
    def terms(spec):
        rows = rgt.make_rg_dataset(spec, "test", 50, as_list=True)
        return max(rgt._entry(r["rg_spec"], "test", r["rg_index"])["metadata"]["num_terms"] for r in rows)

    assert terms("reasoning_gym:chain_sum:level=1") == 3 < terms("reasoning_gym:chain_sum:level=3") == 5
    assert terms("reasoning_gym:chain_sum:level=1,max_terms=4,min_terms=4") == 4  # fields override the level
    with pytest.raises(ValueError, match="only .* distinct questions for the test split"):  # a tiny problem space
        rgt.make_rg_dataset("reasoning_gym:chain_sum:level=0", "test")


def test_unknown_task_and_option_name_close_names():
    with pytest.raises(ValueError, match=r"unknown reasoning-gym task 'chain_sun'; close names: \['chain_sum'"):
        rgt.make_rg_dataset("reasoning_gym:chain_sun")
    with pytest.raises(ValueError, match=r"unknown option 'max_term' \(did you mean \['max_terms'"):
        rgt.parse_spec("reasoning_gym:chain_sum:max_term=3")
    with pytest.raises(ValueError, match="level must be in 0..9"):
        rgt.make_rg_dataset("reasoning_gym:chain_sum:level=99")
    from reasoning_gym.factory import CURRICULA, DATASETS

    plain = sorted(set(DATASETS) - set(CURRICULA))[0]  # a task without a curriculum
    with pytest.raises(ValueError, match="has no curriculum"):
        rgt.parse_spec(f"reasoning_gym:{plain}:level=1")


def test_missing_extra_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"pip install 'trl-ext\[reasoning-gym\]'"):
        rgt.parse_spec("reasoning_gym:chain_sum")


def test_every_entry_point_resolves_a_spec(tmp_path):
    import argparse

    from trl_ext.advise.cli import load_inputs
    from trl_ext.scripts_support import ExtScriptArguments, builtin_reward_funcs, load_datasets, resolve_reward_funcs

    args = ExtScriptArguments(dataset_name=SPEC, dataset_num_prompts=8)
    train, test = load_datasets(args, argparse.Namespace(eval_strategy="steps"))
    assert len(train) == 8 and len(test) == 64 and "rg_index" in train.column_names
    assert set(builtin_reward_funcs(SPEC)) >= {"accuracy", "format"}
    assert [f.__name__ for f in resolve_reward_funcs(None, SPEC)] == ["rg_accuracy_reward"]
    ns = argparse.Namespace(model="testbed-warm", dataset=SPEC, split="validation", num_prompts=6, seed=0,
                            reward=None)
    from trl_ext.testbed.model import save_tiny_model

    ns.model = str(save_tiny_model(tmp_path / "m", seed=0))
    _, rows, idx, funcs, label, cap = load_inputs(ns)
    assert len(rows) == len(idx) == 6 and rows[0]["rg_split"] == "validation" and label.startswith(SPEC)
    assert funcs[0].__name__ == "rg_accuracy_reward" and cap == 256


@pytest.mark.real_model
@pytest.mark.timeout(900)
def test_example_script_trains_smollm2_on_a_reasoning_gym_task(tmp_path):
    import json
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "out"
    cmd = [sys.executable, os.path.join(root, "examples", "scripts", "grpo.py"), "--model_name_or_path", "smollm2",
           "--dataset_name", "reasoning_gym:basic_arithmetic:size=16", "--dataset_num_prompts", "8",
           "--reward_funcs", "accuracy", "format", "--reward_weights", "0.75", "0.25", "--use_cpu", "--bf16",
           "false", "--gradient_checkpointing", "false", "--use_peft", "--lora_target_modules", "q_proj", "v_proj",
           "--max_completion_length", "32", "--per_device_train_batch_size", "4", "--num_generations", "4",
           "--max_steps", "2", "--learning_rate", "5e-4", "--logging_steps", "1", "--save_strategy", "no",
           "--report_to", "none", "--output_dir", str(out), "--disable_tqdm", "true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stderr[-4000:]
    state = json.loads((out / "trainer_state.json").read_text())
    logs = [h for h in state["log_history"] if "loss" in h]
    assert state["global_step"] == 2 and len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert all("rewards/rg_accuracy_reward/mean" in h and "rewards/rg_format_reward/mean" in h for h in logs)
    assert (out / "adapter_config.json").exists()

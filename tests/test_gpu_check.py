"""CPU smoke test of the GPU readiness check (``benchmarks/gpu_check.py``, see ``docs/gpu.md``).

``gpu_check.py --tiny`` runs every trainer (plain TRL GRPO, trl_ext.GRPOTrainer, DAPO dynamic sampling, BASIS, PAIR,
V0.5) for one warm-up and one timed step on a tiny Qwen2 model on the CPU, with the import shims that stand in for
``datasets``/``pyarrow``/``pandas`` on the GPU image (``--datasets shim``), and the JSON must hold every trainer with
positive step times, a phase split that sums to the step time with no phase larger than the step, and the ratio to
TRL GRPO. A second run checks the real-``datasets`` path on two trainers. Pure helpers are tested in-process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")
ALL = ("trl_grpo", "ext_grpo", "dapo", "basis", "pair", "v05")


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gpu_check = _load()


def _run(tmp_path, *args, timeout=150):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, SCRIPT, "--tiny", "--device", "cpu", "--output", str(out), *args],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, f"gpu_check.py failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text()), proc.stdout, wall


def _check_trainer(name: str, rec: dict, s: dict) -> None:
    assert rec["status"] == "ok", (name, rec.get("error"), rec.get("traceback"))
    steps = rec["steps"]
    assert len(steps) == s["warmup_steps"] + s["steps"] and rec["timed_steps"] == s["steps"]
    for st in steps:
        assert st["step_s"] > 0
        phases = [st[f"{p}_s"] for p in ("generation", "scoring", "estimator", "allocation", "trl_prep")]
        assert min(phases) >= 0, (name, st)
        # the timed phases nest inside the step: what is left (optimisation, TRL's batch prep included) is >= 0
        assert st["unattributed_s"] >= 0 and st["optimisation_s"] >= st["trl_prep_s"] - 1e-9, (name, st)
        split = st["generation_s"] + st["scoring_s"] + st["estimator_allocation_s"] + st["optimisation_s"]
        assert split == pytest.approx(st["step_s"], rel=1e-9, abs=1e-12)
        assert st["generation_s"] > 0 and st["generation_calls"] >= 1 and st["generated_tokens"] > 0
        assert st["scoring_s"] > 0  # the reward function ran and was timed
        assert st["trained_rollouts"] >= 1
    assert rec["seconds_per_step"] > 0
    assert sum(rec["split"].values()) == pytest.approx(rec["seconds_per_step"], rel=1e-9)
    assert 0 <= rec["estimator_allocation_share"] < 1
    assert rec["ratio_to_trl_grpo"] is not None and rec["ratio_to_trl_grpo"] > 0
    assert rec["peak_memory_gib"] is None  # CPU: no CUDA memory statistics
    assert any("loss" in log for log in rec["logs"])


@pytest.mark.timeout(170)
def test_tiny_check_runs_every_trainer_with_import_shims(tmp_path):
    report, stdout, wall = _run(tmp_path, "--datasets", "shim")
    s = report["settings"]
    assert report["finished"] is True and report["schema"] == gpu_check.SCHEMA_VERSION
    assert s["tiny"] is True and s["device"] == "cpu" and s["dtype"] == "torch.float32"
    assert report["environment"]["datasets_mode"] == "shim"
    assert list(report["trainers"]) == list(ALL)
    for name, rec in report["trainers"].items():
        _check_trainer(name, rec, s)
    t = report["trainers"]
    assert t["trl_grpo"]["ratio_to_trl_grpo"] == 1.0
    # plain TRL computes advantages inline: nothing is charged to trl_ext's estimator/allocation phases
    assert all(st["estimator_allocation_s"] == 0 for st in t["trl_grpo"]["steps"])
    for name in ALL[1:]:  # every trl_ext trainer's estimator hook ran and was timed
        assert all(st["estimator_s"] > 0 for st in t[name]["steps"]), name
    R, L = s["rollouts"], s["completion_length"]
    for name in ("trl_grpo", "ext_grpo", "basis"):  # fixed allocation: exactly R completions of exactly L tokens
        assert all(st["generated_tokens"] == R * L and st["trained_rollouts"] == R for st in t[name]["steps"]), name
    for name in ("dapo", "v05"):  # whole completions of L tokens; extra rounds only add
        assert all(st["generated_tokens"] % L == 0 and st["generated_tokens"] >= R * L for st in t[name]["steps"])
    # PAIR: every candidate probed, a subset continued; trained rollouts are the completed ones
    assert all(1 <= st["trained_rollouts"] <= R for st in t["pair"]["steps"])
    assert all(st["generation_calls"] == 2 for st in t["pair"]["steps"])  # probe + continuation
    assert t["v05"]["v05_prior"] == "embedding"
    assert t["v05"]["v05_prior_backbone"]["source"] in ("peft_base_model", "reference_model", "policy_copy")
    # the printed table names every trainer
    table = stdout[stdout.index("trainer "):]
    assert all(name in table for name in ALL)
    print(f"gpu_check --tiny (shims): {wall:.1f} s wall")


@pytest.mark.timeout(120)
def test_tiny_check_with_real_datasets_and_a_subset(tmp_path):
    pytest.importorskip("datasets")
    report, _, _ = _run(tmp_path, "--datasets", "real", "--trainers", "ext_grpo", "trl_grpo",
                        "--v05-prior", "constant")
    assert report["environment"]["datasets_mode"] == "real"
    assert list(report["trainers"]) == ["ext_grpo", "trl_grpo"]  # the order asked for
    for name, rec in report["trainers"].items():
        _check_trainer(name, rec, report["settings"])


# ------------------------------------------------------------------------------------------------ pure helpers
def test_model_configs_count_parameters_like_transformers():
    torch = pytest.importorskip("torch")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    for spec, expected in ((gpu_check.QWEN25_05B, 494_032_768), (gpu_check.TINY_MODEL, None)):
        with torch.device("meta"):  # shapes only, no memory
            model = Qwen2ForCausalLM(Qwen2Config(**spec))
        n = sum(p.numel() for p in model.parameters())
        assert gpu_check.count_parameters(spec) == n
        if expected is not None:  # Qwen2.5-0.5B's published parameter count
            assert n == expected


def test_phase_timer_charges_exclusive_time():
    timer = gpu_check.PhaseTimer(sync=lambda: None)

    def inner():
        time.sleep(0.02)

    def outer():
        time.sleep(0.02)
        timer.run("scoring", inner)

    timer.run("allocation", outer)
    assert timer.calls == {**dict.fromkeys(gpu_check.PHASES, 0), "allocation": 1, "scoring": 1}
    assert 0.015 < timer.seconds["scoring"] < 0.2
    assert 0.015 < timer.seconds["allocation"] < 0.2  # its own sleep only, not the nested call's
    timer.reset()
    assert sum(timer.seconds.values()) == 0 and timer.generated_tokens == 0


def test_settings_validation():
    parser = gpu_check.build_parser()
    s = gpu_check.resolve_settings(parser.parse_args([]))
    assert (s["rollouts"], s["group_size"], s["completion_length"], s["steps"], s["warmup_steps"]) == (64, 8, 128, 3, 1)
    assert s["trainers"] == list(ALL) and s["time_budget"] <= 480
    tiny = gpu_check.resolve_settings(parser.parse_args(["--tiny", "--steps", "2", "--trainers", "pair", "pair"]))
    assert tiny["tiny"] and tiny["steps"] == 2 and tiny["trainers"] == ["pair"]
    for bad in (["--trainers", "nope"], ["--rollouts", "12"], ["--rollouts", "4", "--group-size", "4"],
                ["--completion-length", "1"]):
        with pytest.raises(SystemExit):
            gpu_check.resolve_settings(parser.parse_args(bad))


def test_reward_is_deterministic_and_follows_p_success():
    ids = [[i, i + 1, i * 7 % 5] for i in range(2000)]
    r1 = gpu_check.bernoulli_reward(None, None, completion_ids=ids, p_success=[0.3] * len(ids))
    r2 = gpu_check.bernoulli_reward(None, None, completion_ids=ids, p_success=[0.3] * len(ids))
    assert r1 == r2 and set(r1) <= {0.0, 1.0}
    assert 0.25 < sum(r1) / len(r1) < 0.35
    assert gpu_check.bernoulli_reward(None, None, completion_ids=ids[:50], p_success=[0.0] * 50) == [0.0] * 50
    assert gpu_check.bernoulli_reward(None, None, completion_ids=ids[:50], p_success=[1.0] * 50) == [1.0] * 50


def test_prompts_are_unique_and_value_table_covers_them():
    rows = gpu_check.make_prompts(200, 6, seed=3)
    assert len({r["prompt"] for r in rows}) == 200 and all(len(r["prompt"]) == 6 for r in rows)
    table = gpu_check.build_value_table(rows, seed=3)
    assert len(table) == 200
    assert all(table.lookup(r["prompt"]).n == gpu_check.VALUE_TABLE_SAMPLES for r in rows)


def test_shim_placeholders_and_list_dataset():
    mod = gpu_check._shim_module("fakepkg")
    placeholder = mod.Dataset
    assert placeholder is mod.Dataset and not isinstance([], placeholder)
    with pytest.raises(ImportError, match="import shim"):
        placeholder()
    with pytest.raises(AttributeError):
        mod.__version__  # noqa: B018 - "no version" makes transformers' availability checks say "not installed"
    cls = type("Dataset", (gpu_check._RowsMixin, placeholder), {})
    ds = cls([{"prompt": "a", "x": 1}, {"prompt": "b", "x": 2}])
    assert isinstance(ds, placeholder) and len(ds) == 2 and ds.column_names == ["prompt", "x"]
    assert ds[1] == {"prompt": "b", "x": 2} and ds["prompt"] == ["a", "b"] and ds[0:1] == {"prompt": ["a"], "x": [1]}
    ds2 = ds.add_column("idx", [0, 1]).map(lambda r, i: {"y": i}, with_indices=True)
    assert ds2[1] == {"prompt": "b", "x": 2, "idx": 1, "y": 1} and ds.column_names == ["prompt", "x"]
    assert ds2.select([1])["prompt"] == ["b"] and ds2.cache_files == []

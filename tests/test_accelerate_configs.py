"""The accelerate configs shipped in ``examples/accelerate_configs/`` (see ``docs/gpu.md``).

Every config parses with accelerate's own loader (``load_config_from_file``, the one ``accelerate launch`` uses, which
rejects unknown top-level keys) and has the intended key fields; its DeepSpeed/FSDP keys are options accelerate's
launcher knows (a misspelt key would be ignored silently), the launcher picks the intended back-end, and the
environment it would hand the processes builds the intended DeepSpeed / FSDP2 plugin. ``cpu_two_processes.yaml`` is
launched for real: two CPU ranks train plain TRL GRPO for one step and must report distinct ranks, world size 2, a
multi-CPU accelerator and identical weights afterwards (DDP). GPUs, DeepSpeed and multi-GPU launches are not run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(ROOT, "examples", "accelerate_configs")
SCRIPT = os.path.join(ROOT, "tests", "scripts", "grpo_two_rank.py")

# file -> (distributed_type, num_processes, mixed_precision, use_cpu, launcher)
EXPECTED = {
    "single_gpu.yaml": ("NO", 1, "bf16", False, "simple"),
    "multi_gpu.yaml": ("MULTI_GPU", 8, "bf16", False, "torchrun"),
    "deepspeed_zero2.yaml": ("DEEPSPEED", 8, "bf16", False, "deepspeed"),
    "deepspeed_zero3.yaml": ("DEEPSPEED", 8, "bf16", False, "deepspeed"),
    "fsdp2.yaml": ("FSDP", 8, "bf16", False, "fsdp"),
    "cpu_two_processes.yaml": ("MULTI_GPU", 2, "no", True, "torchrun"),
}


def _path(name: str) -> str:
    return os.path.join(CONFIG_DIR, name)


def test_every_shipped_config_is_checked():
    shipped = {f for f in os.listdir(CONFIG_DIR) if f.endswith((".yaml", ".yml", ".json"))}
    assert shipped == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_parses_with_accelerates_loader(name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import ComputeEnvironment

    dist, nproc, mp, use_cpu, _ = EXPECTED[name]
    cfg = load_config_from_file(_path(name))
    assert isinstance(cfg, ClusterConfig)
    assert cfg.compute_environment == ComputeEnvironment.LOCAL_MACHINE
    assert cfg.distributed_type.value == dist
    assert (cfg.num_processes, cfg.mixed_precision, cfg.use_cpu) == (nproc, mp, use_cpu)
    assert cfg.num_machines == 1 and cfg.machine_rank == 0
    ds, fsdp = cfg.deepspeed_config, cfg.fsdp_config
    if name.startswith("deepspeed_zero"):
        stage = int(name[len("deepspeed_zero"):-len(".yaml")])
        assert ds["zero_stage"] == stage and ds["offload_optimizer_device"] == ds["offload_param_device"] == "none"
        assert ds["zero3_init_flag"] is (stage == 3)
        assert "gradient_accumulation_steps" not in ds  # left to the trainer config (a value here must match it)
        if stage == 3:
            assert ds["zero3_save_16bit_model"] is True  # save_model / push_to_hub get a gathered checkpoint
    else:
        assert ds == {}
    if name == "fsdp2.yaml":
        assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        assert fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT" and fsdp["fsdp_offload_params"] is False
    else:
        assert fsdp == {}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_launcher_and_plugin_from_config(name, monkeypatch):
    """What ``accelerate launch --config_file`` would do with the file, without launching anything."""
    launch = pytest.importorskip("accelerate.commands.launch")
    launch_utils = pytest.importorskip("accelerate.utils.launch")
    if not hasattr(launch, "_validate_launch_command"):
        pytest.skip("this accelerate version has no _validate_launch_command")
    _, nproc, mp, _, launcher = EXPECTED[name]
    parser = launch.launch_command_parser()
    options = {a.dest for a in parser._actions}
    args = parser.parse_args(["--config_file", _path(name), "train.py"])
    args, defaults, _ = launch._validate_launch_command(args)
    unknown = [k for k in [*defaults.deepspeed_config, *defaults.fsdp_config] if k not in options]
    assert not unknown, f"{name}: keys accelerate launch does not know (silently ignored): {unknown}"
    assert int(args.num_processes) == nproc and args.mixed_precision == mp
    picked = ("deepspeed" if args.use_deepspeed else "fsdp" if args.use_fsdp else
              "torchrun" if args.multi_gpu and not args.cpu else "simple")
    assert picked == launcher
    if launcher == "deepspeed":
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = launch_utils.prepare_deepspeed_cmd_env(args)
    elif launcher in ("fsdp", "torchrun"):
        env = launch_utils.prepare_multi_gpu_env(args)
    else:
        _, env = launch_utils.prepare_simple_launcher_cmd_env(args)
    assert env["ACCELERATE_MIXED_PRECISION"] == mp
    for key, value in env.items():
        if key.startswith(("ACCELERATE_", "FSDP_")) and os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin

    if launcher == "deepspeed":  # builds without deepspeed installed; Accelerator() would need it
        plugin = DeepSpeedPlugin()
        assert plugin.zero_stage == defaults.deepspeed_config["zero_stage"]
        assert plugin.deepspeed_config["gradient_accumulation_steps"] == "auto"
    if launcher == "fsdp":
        plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
        assert "FULL_STATE_DICT" in str(plugin.state_dict_type)


def _errors(stderr: str) -> str:
    keep = [ln for ln in stderr.splitlines() if "it/s]" not in ln and "Warning" not in ln]
    return "\n".join(keep)[-6000:]


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_cpu_two_processes_config_starts_two_ranks(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "ACCELERATE_DEBUG_MODE": "1",
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file",
           _path("cpu_two_processes.yaml"), SCRIPT, str(tmp_path), "1"]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=130)
    assert proc.returncode == 0, f"accelerate launch failed (rc {proc.returncode}):\n{_errors(proc.stderr)}"
    records = [json.loads((tmp_path / f).read_text()) for f in sorted(os.listdir(tmp_path)) if f.startswith("rank")]
    assert len(records) == 2, f"expected two processes, got {len(records)}: {records}"
    assert sorted(r["rank"] for r in records) == [0, 1]
    assert all(r["world_size"] == 2 and r["steps"] == 1 for r in records)
    assert all("MULTI_CPU" in r["distributed_type"] for r in records), records
    assert records[0]["weight_checksum"] == pytest.approx(records[1]["weight_checksum"], rel=0, abs=1e-9)
    assert abs(records[0]["weight_checksum"] - records[0]["initial_checksum"]) > 1e-6  # it trained

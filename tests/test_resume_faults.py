"""Resume that never lies: the fault matrix of a preemptible cluster, one test per row (``docs/bad_input.md``).

* a changed configuration on resume: refused by default with old and new values
  (``test_changed_learning_rate_is_refused_with_old_and_new_values``, ``test_changed_group_size_is_refused``,
  ``test_another_value_table_is_refused``), accepted deliberately through ``resume_config_changes`` and then applied
  (``test_accepted_learning_rate_change_trains_at_the_new_rate``), optimizer hyper-parameters refused even when
  listed (``test_optimizer_hyperparameter_change_cannot_be_accepted``), unknown names refused when the config is
  built (``test_unknown_resume_config_change_is_refused_at_construction``);
* a checkpoint whose files do not all parse is skipped with a warning naming the file, and the previous complete one
  is used (``test_damaged_checkpoint_file_is_skipped``: trainer_state.json cut at 4,096 bytes, a truncated
  trl_ext_state.pt, optimizer.pt, model.safetensors); an explicit path is refused naming the file
  (``test_explicit_damaged_checkpoint_is_refused_naming_the_file``);
* a full disk during a save names the path and says the disk is full (``test_full_disk_during_save_says_so``: a
  64 KiB tmpfs where mounting works, and a fault-injecting ``torch.save`` everywhere);
* a read-only or unusable ``output_dir`` is refused at construction (``test_unwritable_output_dir_is_refused``);
* SIGTERM on one and two processes: the step finishes, a complete checkpoint is written, the exit code is 75, all
  ranks agree on the step, and resume is bit-identical to an uninterrupted run
  (``test_sigterm_one_process_saves_and_resume_is_bit_identical``,
  ``test_sigterm_on_one_rank_stops_both_at_the_same_step``);
* an old-format value table cut on a row boundary is refused at construction
  (``test_legacy_table_cut_on_a_row_boundary_is_refused_at_construction``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))

from base_helpers import make_trainer  # noqa: E402

from trl_ext.checkpoints.resume import checkpoint_problem  # noqa: E402
from trl_ext.trainers.base import EXT_STATE_FILE  # noqa: E402

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
CONSTANT = dict(lr_scheduler_type="constant")


def _train(out, steps=2, **kw):
    tr = make_trainer(out, max_steps=steps, save_strategy="steps", save_steps=1, **CONSTANT, **kw)
    tr.train()
    return tr


def _params(tr):
    return [p.detach().clone() for p in tr.model.parameters()]


# ------------------------------------------------------------------------------------------------ config changes
def test_checkpoint_records_the_config_fingerprint(tmp_path):
    _train(tmp_path, steps=1)
    state = torch.load(tmp_path / "checkpoint-1" / EXT_STATE_FILE, weights_only=True)
    fp = json.loads(state["config_fingerprint"])
    assert fp["learning_rate"] == 1e-3 and fp["num_generations"] == 4 and fp["loss_type"] == "dapo"
    assert fp["reward_funcs"] == ["hash_reward"] and fp["num_processes"] == 1 and fp["advantage_estimator"] == "grpo"
    assert "output_dir" not in fp and "max_steps" not in fp and "logging_steps" not in fp  # operational fields


def test_changed_learning_rate_is_refused_with_old_and_new_values(tmp_path):
    _train(tmp_path)
    tr = make_trainer(tmp_path, max_steps=3, learning_rate=5e-3, **CONSTANT)
    with pytest.raises(ValueError) as e:
        tr.train(resume_from_checkpoint=True)
    msg = str(e.value)
    assert "learning_rate: 0.001 (checkpoint) -> 0.005 (now)" in msg
    assert "resume_config_changes=['learning_rate']" in msg and "--resume_config_changes learning_rate" in msg
    assert tr.state.global_step == 2  # refused before any step ran


def test_accepted_learning_rate_change_trains_at_the_new_rate(tmp_path):
    _train(tmp_path / "a")
    tr_same = make_trainer(tmp_path / "a", max_steps=3, **CONSTANT)
    tr_same.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    from safetensors.torch import load_file

    w2 = load_file(str(tmp_path / "a" / "checkpoint-2" / "model.safetensors"))  # the weights both resume from
    names = [n for n, _ in tr_same.model.named_parameters()]
    tr_new = make_trainer(tmp_path / "a", max_steps=3, learning_rate=5e-3, resume_config_changes=["learning_rate"],
                          **CONSTANT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr_new.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    lrs = {h["step"]: h["learning_rate"] for h in tr_new.state.log_history if "learning_rate" in h}
    assert lrs[2] == pytest.approx(1e-3) and lrs[3] == pytest.approx(5e-3), lrs  # logged at the new rate
    assert tr_new.resume_config_changes_applied == {"learning_rate": (1e-3, 5e-3)}
    # same state, data and sampling: Adam's step-3 update scales with the rate, so it is 5x the unchanged one
    same = dict(zip(names, _params(tr_same)))
    new = dict(zip(names, _params(tr_new)))
    moved = 0
    for n in names:
        if n not in w2:
            continue  # tied lm_head
        d_same, d_new = same[n] - w2[n], new[n] - w2[n]
        # atol: a few float32 ulps of the weights (w + d - w rounds); Adam updates here are ~1e-3
        torch.testing.assert_close(d_new, 5 * d_same, rtol=1e-3, atol=5e-7)
        moved += int(d_same.abs().max() > 0)
    assert moved > 0


def test_changed_group_size_is_refused(tmp_path):
    _train(tmp_path)
    tr = make_trainer(tmp_path, max_steps=3, num_generations=2, **CONSTANT)  # same per-device batch (8)
    with pytest.raises(ValueError, match=r"num_generations: 4 \(checkpoint\) -> 2 \(now\)"):
        tr.train(resume_from_checkpoint=True)


def test_optimizer_hyperparameter_change_cannot_be_accepted(tmp_path):
    _train(tmp_path)
    tr = make_trainer(tmp_path, max_steps=3, weight_decay=0.1, resume_config_changes=["weight_decay"], **CONSTANT)
    with pytest.raises(ValueError, match=r"Cannot change on resume.*\n  weight_decay: 0.0 \(checkpoint\) -> 0.1"):
        tr.train(resume_from_checkpoint=True)


def test_unknown_resume_config_change_is_refused_at_construction(tmp_path):
    from base_helpers import make_config

    with pytest.raises(ValueError, match="resume_config_changes names 'learning_rte'.*did you mean 'learning_rate'"):
        make_config(tmp_path, resume_config_changes=["learning_rte"])
    assert make_config(tmp_path, resume_config_changes="learning_rate,beta").resume_config_changes == \
        ["learning_rate", "beta"]


def test_another_value_table_is_refused(tmp_path):
    from base_helpers import hash_reward, tiny_dataset, tiny_model_and_tokenizer

    from trl_ext import BASISConfig, BASISTrainer
    from trl_ext.priors.table_format import ValueTable, ValueTableRow

    ds = tiny_dataset(16)

    def table(p_right):
        rows = [ValueTableRow.from_rewards(p, [1.0] * p_right + [0.0] * 2, (0.0, 1.0)) for p in ds["prompt"]]
        return ValueTable(rows, {"reward_funcs": ["hash_reward"], "model": None})

    def trainer(tab, steps, **kw):
        model, tok = tiny_model_and_tokenizer(0)
        args = BASISConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=1,
                           max_completion_length=5, max_steps=steps, learning_rate=1e-3, use_cpu=True, bf16=False,
                           report_to="none", beta=0.0, logging_steps=1, save_strategy="steps", save_steps=1,
                           seed=0, disable_tqdm=True, dataloader_num_workers=0, **CONSTANT, **kw)
        return BASISTrainer(model=model, reward_funcs=[hash_reward], args=args, train_dataset=ds,
                            processing_class=tok, value_table=tab)

    trainer(table(3), 1).train()
    with pytest.raises(ValueError, match=r"value_table_sha256: '[0-9a-f]+' \(checkpoint\) -> '[0-9a-f]+' \(now\)"):
        trainer(table(1), 2).train(resume_from_checkpoint=True)
    tr = trainer(table(1), 2, resume_config_changes=["value_table_sha256"])
    tr.train(resume_from_checkpoint=True)  # accepted deliberately
    assert tr.state.global_step == 2


# ------------------------------------------------------------------------------------------- checkpoint validity
def _truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def _big_trainer_state(folder):
    """Pad trainer_state.json beyond 4 KiB (a long run's log history) so a 4,096-byte cut leaves invalid JSON."""
    path = folder / "trainer_state.json"
    state = json.loads(path.read_text())
    state["log_history"] = state["log_history"] * 40
    path.write_text(json.dumps(state, indent=2))
    assert path.stat().st_size > 4096


@pytest.mark.parametrize("damage", ["trainer_state.json", EXT_STATE_FILE, "optimizer.pt", "model.safetensors"])
def test_damaged_checkpoint_file_is_skipped(tmp_path, damage):
    _train(tmp_path)
    ck2 = tmp_path / "checkpoint-2"
    if damage == "trainer_state.json":
        _big_trainer_state(ck2)
        _truncate(ck2 / damage, 4096)  # what a disk filling up during the write left
    else:
        _truncate(ck2 / damage, (ck2 / damage).stat().st_size // 2)
    assert damage in checkpoint_problem(str(ck2))
    assert checkpoint_problem(str(tmp_path / "checkpoint-1")) is None
    tr = make_trainer(tmp_path, max_steps=2, **CONSTANT)
    with pytest.warns(UserWarning, match=rf"Skipping unusable checkpoint.*checkpoint-2: {damage}.*Resuming from "
                                         r".*checkpoint-1"):
        tr.train(resume_from_checkpoint=True)
    assert tr.state.global_step == 2  # step 2 trained again from checkpoint-1


def test_explicit_damaged_checkpoint_is_refused_naming_the_file(tmp_path):
    _train(tmp_path, steps=1)
    _big_trainer_state(tmp_path / "checkpoint-1")
    _truncate(tmp_path / "checkpoint-1" / "trainer_state.json", 4096)
    tr = make_trainer(tmp_path, max_steps=2, **CONSTANT)
    with pytest.raises(ValueError, match=r"Cannot resume from .*checkpoint-1: trainer_state.json does not parse"):
        tr.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    with pytest.raises(ValueError, match=r"No complete checkpoint.*trainer_state.json does not parse"):
        tr.train(resume_from_checkpoint=True)


# ----------------------------------------------------------------------------------------------------- full disk
def _mount_tmpfs(path, options):
    path.mkdir(parents=True, exist_ok=True)
    if sys.platform != "linux" or os.geteuid() != 0:
        return False
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    return proc.returncode == 0


def _umount(path):
    subprocess.run(["umount", str(path)], capture_output=True)


def test_full_disk_during_save_says_so(tmp_path, monkeypatch):
    # a real full disk where a tmpfs can be mounted
    disk = tmp_path / "disk"
    if _mount_tmpfs(disk, "size=64k"):
        try:
            tr = make_trainer(disk / "out", max_steps=1, save_strategy="steps", save_steps=1, **CONSTANT)
            with pytest.raises(OSError, match=r"Could not write .*checkpoint-1.*the disk is full"):
                tr.train()
            assert not any(n.endswith(".tmp") for _, _, fs in os.walk(disk) for n in fs)
        finally:
            _umount(disk)
    # everywhere: a torch.save that fails as a short write does (what torch reports on a full disk)
    import trl_ext.checkpoints.resume as resume

    real_save = torch.save

    def short_write(obj, f, *a, **k):
        if str(f).endswith(EXT_STATE_FILE + ".tmp"):
            real_save({"partial": True}, f)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 320 vs 214")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", short_write)
    monkeypatch.setattr(resume, "_disk_full", lambda exc, folder: ("unexpected pos" in str(exc), 0))
    tr = make_trainer(tmp_path / "out", max_steps=1, save_strategy="steps", save_steps=1, **CONSTANT)
    with pytest.raises(OSError, match=rf"Could not write .*checkpoint-1.{EXT_STATE_FILE}: the disk is full"):
        tr.train()
    assert not os.path.exists(tmp_path / "out" / "checkpoint-1" / (EXT_STATE_FILE + ".tmp"))  # no partial file


def test_unwritable_output_dir_is_refused(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match="output_dir=.* exists and is not a directory"):
        make_trainer(afile, max_steps=1)
    with pytest.raises(ValueError, match="cannot be created: .*afile is not a directory"):
        make_trainer(afile / "out", max_steps=1)
    ro = tmp_path / "ro"
    if _mount_tmpfs(ro, "ro,size=64k"):
        try:
            with pytest.raises(ValueError, match=r"output_dir=.* is not writable \(Read-only file system\)"):
                make_trainer(ro, max_steps=1)
            with pytest.raises(ValueError, match=r"cannot be created: .*ro is not writable"):
                make_trainer(ro / "sub" / "out", max_steps=1)
        finally:
            _umount(ro)
    elif os.geteuid() != 0:
        ro.mkdir()
        ro.chmod(0o555)
        with pytest.raises(ValueError, match=r"is not writable"):
            make_trainer(ro, max_steps=1)


# ------------------------------------------------------------------------------------------------------ SIGTERM
def _run_script(args, *, ranks=1, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_DEBUG_MODE": "1"}
    pre = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                "--nproc_per_node", str(ranks)]
    return subprocess.run([*pre, os.path.join(SCRIPTS, "preemption_run.py"), *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _load(out, mode, rank=0):
    return torch.load(os.path.join(out, f"{mode}_rank{rank}.pt"), weights_only=False)


def _assert_resume_bit_identical(out, ranks, steps):
    for r in range(ranks):
        full, resumed = _load(out, "full", r), _load(out, "resume", r)
        assert full["global_step"] == resumed["global_step"] == steps
        for a, b in zip(full["params"], resumed["params"]):
            assert torch.equal(a, b), f"rank {r}: resumed parameters differ by {(a - b).abs().max().item()}"
        for key in ("generated_tokens_total", "global_step"):
            assert full["ext_state"][key] == resumed["ext_state"][key], key


@pytest.mark.timeout(400)
def test_sigterm_one_process_saves_and_resume_is_bit_identical(tmp_path):
    steps = 6
    proc = subprocess.Popen([sys.executable, os.path.join(SCRIPTS, "preemption_run.py"), str(tmp_path), "grpo",
                             "signal", str(steps), "--slow"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    marker = tmp_path / "part" / "step2.marker"
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # from outside, as SLURM / Kubernetes send it
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 75, err[-3000:]
    rec = _load(tmp_path, "signal")
    stopped = rec["global_step"]
    assert rec["exit_code"] == 75 and rec["preempted"] and 2 <= stopped < steps, rec["global_step"]
    assert "received SIGTERM" in err and f"stopped after step {stopped} because this process received" in err
    ck = tmp_path / "part" / f"checkpoint-{stopped}"
    assert checkpoint_problem(str(ck)) is None  # complete: every file parses
    res = _run_script([tmp_path, "grpo", "resume", steps])
    assert res.returncode == 0, res.stderr[-3000:]
    full = _run_script([tmp_path, "grpo", "full", steps])
    assert full.returncode == 0, full.stderr[-3000:]
    _assert_resume_bit_identical(tmp_path, 1, steps)


@pytest.mark.multiprocess
@pytest.mark.timeout(500)
def test_sigterm_on_one_rank_stops_both_at_the_same_step(tmp_path):
    steps, k = 5, 3
    sig = _run_script([tmp_path, "grpo", "signal", steps, "--self_signal_step", k], ranks=2)
    recs = [_load(tmp_path, "signal", r) for r in range(2)]
    assert [r["exit_code"] for r in recs] == [75, 75], sig.stderr[-3000:]
    assert [r["global_step"] for r in recs] == [k, k] and all(r["preempted"] for r in recs)  # both stopped after k
    assert "because another process received a signal" in sig.stderr  # rank 1 was never signalled
    assert checkpoint_problem(str(tmp_path / "part" / f"checkpoint-{k}")) is None
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version("5.18"):
        pytest.skip("the stop agreed on both ranks; the two-rank resume is not run: transformers 5.17 restores a "
                    "multi-process CPU checkpoint with torch.load(map_location='cpu:0'), which torch refuses (a "
                    "transformers bug fixed later, see docs/vllm.md)")
    res = _run_script([tmp_path, "grpo", "resume", steps], ranks=2)
    assert res.returncode == 0, res.stderr[-3000:]
    full = _run_script([tmp_path, "grpo", "full", steps], ranks=2)
    assert full.returncode == 0, full.stderr[-3000:]
    _assert_resume_bit_identical(tmp_path, 2, steps)


def test_preemption_off_keeps_pythons_default(tmp_path):
    tr = make_trainer(tmp_path, max_steps=1, save_on_preemption=False)
    before = signal.getsignal(signal.SIGTERM)
    tr.train()
    assert signal.getsignal(signal.SIGTERM) is before and tr.preempted is False
    tr = make_trainer(tmp_path, max_steps=1)
    tr.train()
    assert signal.getsignal(signal.SIGTERM) is before  # restored after train()


# --------------------------------------------------------------------------------------------- legacy value table
def test_legacy_table_cut_on_a_row_boundary_is_refused_at_construction(tmp_path):
    from base_helpers import hash_reward, tiny_dataset, tiny_model_and_tokenizer

    from trl_ext import BASISConfig, BASISTrainer
    from trl_ext.priors.table_format import ValueTable, ValueTableRow, save_value_table

    ds = tiny_dataset(16)
    rows = [ValueTableRow.from_rewards(p, [1.0, 0.0], (0.0, 1.0)) for p in ds["prompt"]]
    path = tmp_path / "table.jsonl"
    save_value_table(path, ValueTable(rows, {"reward_funcs": ["hash_reward"], "model": None}))
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    header = json.loads(lines[0])
    del header["integrity"]  # the trl_ext 0.1 format
    path.write_text(json.dumps(header) + "\n" + "".join(lines[1:9]), encoding="utf-8")  # cut after 8 of 16 rows
    model, tok = tiny_model_and_tokenizer(0)
    args = BASISConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=1,
                       max_completion_length=5, max_steps=2, use_cpu=True, bf16=False, report_to="none",
                       basis_value_table_path=str(path), disable_tqdm=True)
    with pytest.warns(UserWarning, match="trl_ext 0.1"), \
            pytest.raises(ValueError, match=r"8 of 16 training prompts .* trl_ext 0.1 format.*most likely cut short"):
        BASISTrainer(model=model, reward_funcs=[hash_reward], args=args, train_dataset=ds, processing_class=tok)

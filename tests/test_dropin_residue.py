"""Drop-in residue: what a method changes is said where users see it, every config error at construction, CLIs that
name the file and the fix (``docs/bad_input.md``, ``docs/migrating.md``).

* ``DropInDifferenceWarning`` once at construction for V0.5's prompts per step and extra rollouts and PAIR's
  learning rate, each naming the field that restores TRL's behaviour; none for TRL's own behaviour;
* estimator / strategy / kwargs combinations refused when the config is built (no raw ``TypeError`` at step 1), and
  a property test over random combinations: construction fails with a message, or a real step runs;
* renamed fields accepted for one release with a ``FutureWarning``;
* the multi-process guard suggests only launch commands that work (each one run here);
* CLI errors: ``trl-ext curves`` on malformed JSON, ``trl-ext compare`` with a glob matching nothing,
  ``build-value-table --model`` with a missing local path, ``advise`` naming its own ``--reward`` flag.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))

from base_helpers import hash_reward, make_config, make_trainer, tiny_dataset, tiny_model_and_tokenizer  # noqa: E402

from trl_ext import DropInDifferenceWarning  # noqa: E402
from trl_ext.cli import main as cli  # noqa: E402

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = dict(per_device_train_batch_size=8, max_completion_length=5, max_steps=1, learning_rate=1e-3, use_cpu=True,
              bf16=False, report_to="none", beta=0.0, logging_steps=1, save_strategy="no", seed=0,
              disable_tqdm=True, dataloader_num_workers=0)


def _dropin_warnings(build) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build()
    return [str(w.message) for w in caught if issubclass(w.category, DropInDifferenceWarning)]


def _v05(tmp_path, **kw):
    from trl_ext import V05GRPOConfig, V05GRPOTrainer
    from trl_ext.priors import CallablePrior

    model, tok = tiny_model_and_tokenizer(0)
    args = V05GRPOConfig(output_dir=str(tmp_path), **{**COMMON, **kw})
    return V05GRPOTrainer(model=model, reward_funcs=[hash_reward], args=args, train_dataset=tiny_dataset(16),
                          processing_class=tok, prior=CallablePrior(lambda targets, *_: [0.5] * len(targets)))


def _pair(tmp_path, **kw):
    from trl_ext import PAIRConfig, PAIRTrainer

    model, tok = tiny_model_and_tokenizer(0)
    args = PAIRConfig(output_dir=str(tmp_path), num_generations=4, pair_prefix_tokens=3, **{**COMMON, **kw})
    return PAIRTrainer(model=model, reward_funcs=[hash_reward], args=args, train_dataset=tiny_dataset(16),
                       processing_class=tok)


def test_v05_differences_are_warned_with_the_field_that_restores_trl(tmp_path):
    msgs = _dropin_warnings(lambda: _v05(tmp_path, num_generations=8))  # TRL: 1 prompt x 8; V0.5: 2 prompts x 4
    assert len(msgs) == 2, msgs
    assert "takes 2 prompts per generation batch" in msgs[0] and "set v05_k_init=8" in msgs[0]
    assert "x TRL's rollouts per generation batch" in msgs[1] and "set v05_extra_rollout_budget=0" in msgs[1]
    # the named fields restore TRL's behaviour: nothing left to warn about
    assert _dropin_warnings(lambda: _v05(tmp_path, num_generations=8, v05_k_init=8,
                                         v05_extra_rollout_budget=0.0)) == []


def test_pair_learning_rate_is_warned_and_none_restores_trl(tmp_path):
    msgs = _dropin_warnings(lambda: _pair(tmp_path))
    assert len(msgs) == 1 and "learning_rate x 0.707" in msgs[0] and "pair_lr_scaling='none'" in msgs[0], msgs
    assert _dropin_warnings(lambda: _pair(tmp_path, pair_lr_scaling="none")) == []


def test_trls_own_behaviour_warns_nothing(tmp_path):
    assert _dropin_warnings(lambda: make_trainer(tmp_path)) == []


# -------------------------------------------------------------------------------------- config-time refusals
def test_v05_strategy_without_its_estimator_is_refused_when_the_config_is_built(tmp_path):
    with pytest.raises(ValueError, match=r"rollout_strategy='v05_osla' passes \['floor'.* It feeds "
                                         r"advantage_estimator in \['v05'\]"):
        make_config(tmp_path, rollout_strategy="v05_osla")
    with pytest.raises(ValueError, match=r"rollout_strategy='pair_prefix_probe' passes .*\['pair_draw'\]"):
        make_config(tmp_path, rollout_strategy="pair_prefix_probe", advantage_estimator="rloo")


def test_unknown_estimator_kwarg_is_refused_with_close_names(tmp_path):
    with pytest.raises(ValueError, match=r"'normalise' \(did you mean 'normalize'\?\) that advantage_estimator="
                                         r"'rloo' does not take; it takes \['eps', 'normalize'\]"):
        make_config(tmp_path, advantage_estimator="rloo", advantage_estimator_kwargs={"normalise": True})
    with pytest.raises(ValueError, match="'dr_grpo' does not take; it takes no options"):
        make_config(tmp_path, advantage_estimator="dr_grpo", advantage_estimator_kwargs={"eps": 1e-3})


KWARGS = st.sampled_from([{}, {"normalize": True}, {"eps": 1e-3}, {"scale": "batch"}, {"bogus": 1}])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(estimator=st.sampled_from(["grpo", "dr_grpo", "rloo", "reinforce_pp", "v05", "basis", "pair_draw"]),
       strategy=st.sampled_from([None, "fixed_groups", "dynamic_sampling", "v05_osla"]),
       g=st.sampled_from([1, 2, 4]), kwargs=KWARGS, dynamic=st.booleans())
def test_random_config_combinations_fail_at_construction_or_train(tmp_path_factory, estimator, strategy, g, kwargs,
                                                                   dynamic):
    """Either the config (or the trainer) refuses with a message, or a real step runs: never a crash at step 1."""
    out = tmp_path_factory.mktemp("combo")
    kw = dict(advantage_estimator=estimator, advantage_estimator_kwargs=kwargs, rollout_strategy=strategy,
              num_generations=g, dynamic_sampling=dynamic, max_steps=1)
    try:
        tr = make_trainer(out, n_rows=16, **kw)
    except (ValueError, TypeError) as e:
        assert len(str(e)) > 20, e  # a message that says something
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr.train()
    assert tr.state.global_step == 1, kw


# ------------------------------------------------------------------------------------------- renamed fields
def test_renamed_fields_are_accepted_for_one_release_with_a_future_warning(tmp_path):
    from trl_ext import BASISConfig, V05GRPOConfig

    with pytest.warns(FutureWarning, match=r"V05GRPOConfig\(k_init=...\) is deprecated: the field is now 'v05_k_init'"):
        cfg = V05GRPOConfig(output_dir=str(tmp_path), k_init=8, **COMMON)
    assert cfg.v05_k_init == 8 and "k_init" in V05GRPOConfig.renamed_fields
    with pytest.warns(FutureWarning, match="now 'basis_value_table_path'"):
        cfg = BASISConfig(output_dir=str(tmp_path), num_generations=1, value_table_path="t.jsonl", **COMMON)
    assert cfg.basis_value_table_path == "t.jsonl"
    with pytest.raises(ValueError, match="got both 'k_init' .* and 'v05_k_init'"):
        V05GRPOConfig(output_dir=str(tmp_path), k_init=8, v05_k_init=8, **COMMON)
    with pytest.raises(TypeError):  # a name that never existed still fails as before
        V05GRPOConfig(output_dir=str(tmp_path), k_inti=8, **COMMON)


# ----------------------------------------------------------------------------------- the multi-process guard
_PROBE = """
import os, sys
sys.path.insert(0, {scripts!r})
from base_helpers import make_trainer
rank = os.environ.get("RANK", "0")
tr = make_trainer({out!r} + "/" + rank, use_cpu={use_cpu})
with open({out!r} + f"/seen_{{rank}}.txt", "w") as f:  # a file per rank: printed lines of two ranks interleave
    f.write(str(tr.accelerator.num_processes))
"""


def _launch(cmd: str, script: str) -> subprocess.CompletedProcess:
    argv = cmd.replace("script.py", script).split()
    if argv[0] == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", *argv[1:]]
    elif argv[0] == "accelerate":
        argv = [sys.executable, "-m", "accelerate.commands.launch", *argv[2:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_the_guard_suggests_only_launch_commands_that_work(tmp_path):
    scripts = os.path.join(ROOT, "tests", "scripts")
    bad = tmp_path / "bad.py"
    (tmp_path / "bad").mkdir()
    bad.write_text(_PROBE.format(scripts=scripts, out=str(tmp_path / "bad"), use_cpu=False))
    proc = _launch("torchrun --nproc_per_node 2 script.py", str(bad))
    assert proc.returncode != 0 and "this trainer sees 1" in proc.stderr, proc.stderr[-3000:]
    message = re.search(r"RuntimeError: (The launcher started.*)", proc.stderr).group(1)
    commands = re.findall(r"`([^`]+ script\.py)`", message)
    assert len(commands) == 3 and not any("--cpu" in c for c in commands), commands
    good = tmp_path / "good.py"
    for i, cmd in enumerate(commands):  # each suggestion, with use_cpu=True as the message says, starts two ranks
        out = tmp_path / f"good{i}"
        out.mkdir()
        good.write_text(_PROBE.format(scripts=scripts, out=str(out), use_cpu=True))
        res = _launch(cmd, str(good))
        seen = sorted(p.read_text() for p in out.glob("seen_*.txt"))
        assert res.returncode == 0 and seen == ["2", "2"], (cmd, seen, res.stderr[-3000:])


# ---------------------------------------------------------------------------------------------------- CLIs
def test_curves_on_malformed_json_names_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "runs.json"
    bad.write_text('{"runs": [\n  {"method": "g8",')
    assert cli(["curves", "--runs_json", str(bad), "--baseline", "g8"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: not valid JSON at line 2" in err and "truncated or was edited" in err
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    assert cli(["curves", "--runs_json", str(other), "--baseline", "g8"]) == 2
    assert "not a comparison harness runs.json" in capsys.readouterr().err


def test_compare_with_a_glob_matching_nothing_says_so(tmp_path, capsys):
    assert cli(["compare", "--a", str(tmp_path / "a_*.jsonl"), "--b", str(tmp_path / "b_*.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "--a pattern" in err and "matches no file (nor its .jsonl.gz twin)" in err


def test_build_value_table_with_a_missing_local_model_names_the_path(tmp_path, capsys):
    missing = tmp_path / "no" / "model"
    code = cli(["build-value-table", "--model", str(missing), "--task", "addition", "--num_prompts", "2",
                "--output", str(tmp_path / "t.jsonl"), "--no_progress"])
    err = capsys.readouterr().err
    assert code == 2 and f"--model '{missing}': no such local folder" in err and "Repo id" not in err


def test_advise_names_its_own_reward_flag(tmp_path):
    from trl_ext.scripts_support import resolve_reward_funcs

    with pytest.raises(ValueError, match=r"^--reward is required for dataset"):
        resolve_reward_funcs(None, None, flag="--reward")
    with pytest.raises(ValueError, match=r"^--reward_funcs is required"):  # the example scripts' flag
        resolve_reward_funcs(None, None)


# ------------------------------------------------------------------------------------ value-table sampling settings
def _basis(tmp_path, table, **kw):
    from trl_ext import BASISConfig, BASISTrainer

    model, tok = tiny_model_and_tokenizer(0)
    args = BASISConfig(output_dir=str(tmp_path), num_generations=1, **{**COMMON, **kw})
    return BASISTrainer(model=model, reward_funcs=[hash_reward], args=args, train_dataset=tiny_dataset(16),
                        processing_class=tok, value_table=table)


def test_basis_refuses_a_table_sampled_under_other_settings(tmp_path):
    from trl_ext.priors.table_format import ValueTable, ValueTableRow

    rows = [ValueTableRow.from_rewards(p, [1.0, 0.0], (0.0, 1.0)) for p in tiny_dataset(16)["prompt"]]
    md = {"reward_funcs": ["hash_reward"], "model": None, "temperature": 0.7, "top_p": 1.0, "max_new_tokens": 256}
    table = ValueTable(rows, md)
    with pytest.raises(ValueError, match=r"temperature=0.7 in the table vs temperature=1.0 in training; "
                                         r"max_new_tokens=256 in the table vs max_completion_length=5.*--training_config"
                                         r".*basis_allow_sampling_mismatch=True"):
        _basis(tmp_path, table)
    with pytest.warns(UserWarning, match="sampled under other settings"):
        _basis(tmp_path, table, basis_allow_sampling_mismatch=True)  # the documented override
    assert _basis(tmp_path, table, temperature=0.7, max_completion_length=256) is not None  # same settings: accepted


def test_build_value_table_defaults_follow_the_training_config(tmp_path):
    import json

    from trl_ext.testbed.model import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "m", seed=0)
    cfg = tmp_path / "train.yaml"
    cfg.write_text("max_completion_length: 6\ntemperature: 0.8\nlearning_rate: 1.0e-5\n")
    out = tmp_path / "t.jsonl"
    assert cli(["build-value-table", "--model", str(model_dir), "--task", "addition", "--num_prompts", "2",
                "--num_samples", "2", "--training_config", str(cfg), "--output", str(out), "--no_progress",
                "--use_vllm", "false"]) == 0
    md = json.loads(out.read_text().splitlines()[0])["metadata"]
    assert md["max_new_tokens"] == 6 and md["temperature"] == 0.8 and md["top_p"] == 1.0
    out2 = tmp_path / "t2.jsonl"  # explicit flags win over the config
    assert cli(["build-value-table", "--model", str(model_dir), "--task", "addition", "--num_prompts", "2",
                "--num_samples", "2", "--training_config", str(cfg), "--temperature", "1.0", "--output", str(out2),
                "--no_progress", "--use_vllm", "false"]) == 0
    assert json.loads(out2.read_text().splitlines()[0])["metadata"]["temperature"] == 1.0


def test_value_table_records_the_chat_template_and_basis_compares_it(tmp_path):
    from datasets import Dataset

    from trl_ext.priors.table_format import ValueTable, ValueTableRow, load_value_table
    from trl_ext.priors.value_table import build_value_table, chat_template_sha256

    model, tok = tiny_model_and_tokenizer(0)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i}="}]} for i in range(3)])
    out = tmp_path / "chat_table.jsonl"
    build_value_table(model, tok, ds, [hash_reward], out, num_samples=2, max_new_tokens=5, progress=False)
    md = load_value_table(out).metadata
    assert md["chat_template_sha256"] == chat_template_sha256(tok) and len(md["chat_template_sha256"]) == 64
    # BASIS refuses a table built under another chat template than its tokenizer's (the testbed one has none)
    rows = [ValueTableRow.from_rewards(p, [1.0, 0.0], (0.0, 1.0)) for p in tiny_dataset(16)["prompt"]]
    table = ValueTable(rows, {"reward_funcs": ["hash_reward"], "model": None, "chat_template_sha256": "ab" * 32})
    with pytest.raises(ValueError, match=r"chat template sha256 abababababab\.\.\. in the table vs none"):
        _basis(tmp_path, table)


"""Fault injection: bad input fails early and clearly, nothing is dropped uncounted, state survives crashes.

Each test injects one fault the drop-in-contract review found (or a neighbour of it) and checks the documented
behaviour (``docs/bad_input.md``). Trainer-specific faults of V0.5, BASIS and PAIR live next to their trainers'
tests; this module covers the shared base (every trainer goes through it) plus resume bit-identity for every
trainer on one and two processes.

Index: each bad input and silent failure of the drop-in work -> the tests that cover it. A bare name is in this
module; ``extra`` is ``tests/test_dropin_contract_extra.py`` (the same fault through V0.5, BASIS and PAIR);
``[mp]`` marks a two-process test (``-m multiprocess``).

Bad input (a clear early error, or a documented, counted and warned behaviour):

* dataset without the ``prompt`` column: ``test_dataset_without_prompt_column_fails_at_construction``,
  ``test_dataset_without_prompt_column_fails_for_basis``, ``test_dataset_without_prompt_column_fails_for_v05``,
  ``extra::test_dataset_without_prompt_column_fails_for_pair``;
* empty dataset: ``test_empty_dataset_fails_at_construction``, ``extra::test_empty_dataset_fails_at_construction``;
* reward function returning strings / the wrong number of values:
  ``test_reward_returning_strings_names_the_function``, ``extra::test_reward_returning_strings_names_the_function``,
  ``test_reward_returning_wrong_count_names_the_function``;
* all-NaN / all-None rewards: ``test_all_unscorable_rewards_warn_count_and_do_not_update``,
  ``extra::test_all_unscorable_rewards_warn_count_and_do_not_update``,
  ``tests/test_v05_trainer.py::test_all_unscorable_prompts_fall_back_to_zero_advantage``;
  some rows: ``test_partly_unscorable_rewards_are_counted_and_warned_once``,
  ``tests/test_estimator_selection.py::test_adapter_hides_unscorable_rows_from_the_estimator``,
  ``tests/test_pair_trainer.py::test_unscorable_rows_in_training_are_counted_and_get_no_advantage_or_label``,
  ``tests/test_pair_trainer.py::test_nan_reward_on_completed_vertex_is_an_unobserved_vertex``;
* a plain ``trl.GRPOConfig`` (one rule for every trainer):
  ``tests/test_estimator_selection.py::test_plain_trl_config_is_upgraded``,
  ``tests/test_v05_trainer.py::test_plain_grpo_config_is_upgraded``,
  ``tests/test_basis_trainer.py::test_trls_default_num_generations_is_refused_with_the_fix``,
  ``tests/test_pair_trainer.py::test_config_defaults_and_upgrade_of_a_plain_trl_config``;
* PAIR with a 1-2 token probe: ``tests/test_pair_trainer.py::test_a_one_or_two_token_probe_warns_at_construction``;
* PAIR with ``keyed_sampling=True``: ``tests/test_pair_trainer.py::test_config_validation``;
* ``trl-ext gate`` on a user's dataset and reward:
  ``tests/test_shut_gate.py::test_gate_cli_on_a_user_dataset_and_reward``,
  ``tests/test_shut_gate.py::test_gate_cli_user_dataset_bad_input``;
* reward/scorer references (one form in every command):
  ``tests/test_cli.py::test_every_reference_option_uses_the_shared_resolver``,
  ``tests/test_noise_floor.py::test_cli_scorer_file_form_and_current_directory``;
* ``trl-ext replay`` against another model than the log's:
  ``tests/test_replay.py::test_cli_replay_warns_when_model_is_not_the_logged_one``;
* the launcher starts two processes but the trainer sees one:
  ``test_launcher_with_two_processes_but_trainer_seeing_one_is_refused`` [mp].

Silent failures found by fault injection:

* V0.5 dropping NaN/None rollouts: ``tests/test_v05_dropin.py::test_unscorable_rollouts_are_counted_and_warned_once``;
* one rank's reward returning None on two processes:
  ``tests/test_base_two_rank.py::test_one_rank_unscorable_is_counted_on_every_rank`` [mp] (GRPO),
  ``extra::test_one_rank_unscorable_is_counted_and_warned_on_two_processes`` [mp] (GRPO and BASIS);
* a stale ``trl_ext_state.pt`` in a newer checkpoint: ``test_stale_ext_state_is_refused``,
  ``extra::test_stale_ext_state_is_refused`` (V0.5 buffer, BASIS beta history, PAIR heads);
* a value table cut on a row boundary (or edited):
  ``tests/test_value_table.py::test_table_cut_on_a_row_boundary_is_refused_and_a_rerun_restores_it``,
  ``tests/test_value_table.py::test_modified_or_appended_rows_are_refused``;
* ``kill -9`` during a checkpoint save: ``test_interrupted_save_is_skipped_on_resume``,
  ``test_no_complete_checkpoint_is_a_clear_error``;
* V0.5's default embedding prior not bit-identical after resume or between 1 and 2 processes:
  ``tests/test_priors.py::test_embeddings_are_bitwise_batch_invariant``,
  ``tests/test_v05_dropin.py::test_resume_is_bit_identical_with_the_default_prior``,
  ``tests/test_v05_trainer.py::test_one_and_two_processes_bitwise_with_the_default_embedding_prior`` [mp],
  ``test_resume_is_bit_identical_one_process``, ``test_resume_is_bit_identical_two_processes`` [mp] (all trainers);
* V0.5 updating on all-tied / all-zero batches (the paper's estimator, documented):
  ``tests/test_v05_dropin.py::test_all_tied_batch_follows_the_paper_estimator``;
* an ``inf`` reward (stops training, documented): ``test_infinite_reward_stops_with_a_clear_error``,
  ``extra::test_infinite_reward_stops_before_any_update``;
* the keyed rollout log after crash and resume: ``test_keyed_rollout_log_holds_each_step_once_after_resume``.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))

from base_helpers import hash_reward, make_config, make_trainer, tiny_dataset, tiny_model_and_tokenizer  # noqa: E402

from trl_ext.trainers.base import EXT_STATE_FILE, GRPOTrainer  # noqa: E402

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")


def _transformers_below(version: str) -> bool:
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__) < Version(version)


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _run(cmd, timeout=300, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env_extra or {})}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------------------------------- bad datasets
def test_dataset_without_prompt_column_fails_at_construction(tmp_path):
    ds = tiny_dataset(8).rename_column("prompt", "question")
    model, tok = tiny_model_and_tokenizer(0)
    with pytest.raises(ValueError, match="no 'prompt' column.*rename_column"):
        GRPOTrainer(model=model, reward_funcs=[hash_reward], args=make_config(tmp_path), train_dataset=ds,
                    processing_class=tok)


def test_dataset_without_prompt_column_fails_for_basis(tmp_path):
    from trl_ext import BASISConfig, BASISTrainer
    from trl_ext.priors.table_format import ValueTable, ValueTableRow

    ds = tiny_dataset(8)
    table = ValueTable([ValueTableRow.from_rewards(p, [1.0, 0.0], (0.0, 1.0)) for p in ds["prompt"]],
                       {"reward_funcs": ["hash_reward"]})
    model, tok = tiny_model_and_tokenizer(0)
    args = BASISConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="no 'prompt' column"):
        BASISTrainer(model=model, reward_funcs=[hash_reward], args=args, train_dataset=ds.rename_column("prompt", "q"),
                     processing_class=tok, value_table=table)


def test_dataset_without_prompt_column_fails_for_v05(tmp_path):
    from trl_ext import V05GRPOConfig, V05GRPOTrainer

    model, tok = tiny_model_and_tokenizer(0)
    args = V05GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, use_cpu=True, report_to="none",
                         v05_value_prior="constant")
    with pytest.raises(ValueError, match="no 'prompt' column"):
        V05GRPOTrainer(model=model, reward_funcs=[hash_reward], args=args,
                       train_dataset=tiny_dataset(8).rename_column("prompt", "q"), processing_class=tok)


def test_empty_dataset_fails_at_construction(tmp_path):
    model, tok = tiny_model_and_tokenizer(0)
    with pytest.raises(ValueError, match="train_dataset is empty"):
        GRPOTrainer(model=model, reward_funcs=[hash_reward], args=make_config(tmp_path),
                    train_dataset=tiny_dataset(8).select([]), processing_class=tok)


# --------------------------------------------------------------------------------------------------- bad rewards
def test_reward_returning_strings_names_the_function(tmp_path):
    def stringly(prompts, completions, **kw):
        return ["1.0"] * len(completions)

    tr = make_trainer(tmp_path, reward_funcs=[stringly], max_steps=1)
    with pytest.raises(TypeError, match="reward function 'stringly' returned '1.0'"):
        tr.train()


def test_reward_returning_wrong_count_names_the_function(tmp_path):
    def short(prompts, completions, **kw):
        return [0.0]

    tr = make_trainer(tmp_path, reward_funcs=[short], max_steps=1)
    with pytest.raises(ValueError, match="'short' returned 1 values for 8 completions"):
        tr.train()


def test_infinite_reward_stops_with_a_clear_error(tmp_path):
    def explode(prompts, completions, **kw):
        return [math.inf] + [0.0] * (len(completions) - 1)

    tr = make_trainer(tmp_path, reward_funcs=[explode], max_steps=1)
    before = _params(tr.model)
    with pytest.raises(ValueError, match="'explode' returned inf.*not trained on"):
        tr.train()
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))


@pytest.mark.parametrize("bad", [None, float("nan")])
def test_all_unscorable_rewards_warn_count_and_do_not_update(tmp_path, bad):
    def nothing(prompts, completions, **kw):
        return [bad] * len(completions)

    tr = make_trainer(tmp_path, reward_funcs=[nothing], max_steps=1)
    before = _params(tr.model)
    with pytest.warns(UserWarning, match="Every one of the 8 rollouts .* unscorable"):
        tr.train()
    assert tr.state.log_history[0]["ext/unscorable_rows"] == 8
    assert tr.ext_state_dict()["unscorable_rows_total"] == 8
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))


def test_partly_unscorable_rewards_are_counted_and_warned_once(tmp_path):
    def some_none(prompts, completions, **kw):
        return [None if i % 4 == 0 else float(len(str(c)) % 3) for i, c in enumerate(completions)]

    tr = make_trainer(tmp_path, reward_funcs=[some_none], max_steps=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tr.train()
    assert sum("unscorable" in str(w.message) for w in caught) == 1
    assert [h["ext/unscorable_rows"] for h in tr.state.log_history if "ext/unscorable_rows" in h] == [2, 2]
    assert tr.ext_state_dict()["unscorable_rows_total"] == 4


# --------------------------------------------------------------------------------------------------- checkpoints
def _train_with_checkpoints(tmp_path, steps=2, **kw):
    tr = make_trainer(tmp_path, max_steps=steps, save_strategy="steps", save_steps=1, lr_scheduler_type="constant",
                      **kw)
    tr.train()
    return tr


def test_stale_ext_state_is_refused(tmp_path):
    _train_with_checkpoints(tmp_path)
    shutil.copy(tmp_path / "checkpoint-1" / EXT_STATE_FILE, tmp_path / "checkpoint-2" / EXT_STATE_FILE)
    tr = make_trainer(tmp_path, max_steps=3)
    with pytest.raises(ValueError, match="written at global step 1 but the checkpoint is at step 2"):
        tr.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


def test_interrupted_save_is_skipped_on_resume(tmp_path):
    _train_with_checkpoints(tmp_path)
    # a kill -9 during the save of step 3: the folder holds only the extension state (written first, atomically)
    os.makedirs(tmp_path / "checkpoint-3")
    shutil.copy(tmp_path / "checkpoint-2" / EXT_STATE_FILE, tmp_path / "checkpoint-3" / EXT_STATE_FILE)
    tr = make_trainer(tmp_path, max_steps=3, lr_scheduler_type="constant")  # the checkpoint's schedule
    with pytest.warns(UserWarning, match="Skipping unusable checkpoint.*no trainer_state.json.*Resuming from "
                                         ".*checkpoint-2"):
        tr.train(resume_from_checkpoint=True)
    assert tr.state.global_step == 3
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path / "checkpoint-2"))


def test_no_complete_checkpoint_is_a_clear_error(tmp_path):
    os.makedirs(tmp_path / "checkpoint-5")
    tr = make_trainer(tmp_path, max_steps=1)
    with pytest.raises(ValueError, match="No complete checkpoint"):
        tr.train(resume_from_checkpoint=True)


def test_keyed_rollout_log_holds_each_step_once_after_resume(tmp_path):
    from trl_ext.measurement.replay import load_rollout_log

    ref_dir, crash_dir = tmp_path / "ref", tmp_path / "crash"
    _train_with_checkpoints(ref_dir, steps=3, keyed_sampling=True)
    _train_with_checkpoints(crash_dir, steps=3, keyed_sampling=True)
    shutil.rmtree(crash_dir / "checkpoint-3")
    shutil.rmtree(crash_dir / "checkpoint-2")  # "crash" after step 3 was logged but before its checkpoint
    tr = make_trainer(crash_dir, max_steps=3, save_strategy="no", lr_scheduler_type="constant", keyed_sampling=True)
    tr.train(resume_from_checkpoint=True)
    ref = load_rollout_log(ref_dir / "rollouts" / "rank0.jsonl")
    got = load_rollout_log(crash_dir / "rollouts" / "rank0.jsonl")
    key = [(r["step"], r["key"], r["sample_index"]) for r in got]
    assert len(key) == len(set(key)) == len(ref)
    strip = ("checkpoint", "call")
    assert [{k: v for k, v in r.items() if k not in strip} for r in got] == \
        [{k: v for k, v in r.items() if k not in strip} for r in ref]


# --------------------------------------------------------------------------------------------------- resume bit-identity
def _resume_results(out, world, trainers):
    res = {}
    for t in trainers:
        for r in range(world):
            d = torch.load(os.path.join(out, f"{t}_world{world}_rank{r}.pt"), weights_only=False)
            res[(t, r)] = d
    return res


def _assert_bit_identical(res):
    for (t, r), d in res.items():
        assert d["steps"] == 4, (t, r)
        for a, b in zip(d["full"], d["resumed"]):
            assert torch.equal(a, b), f"{t} rank {r}: resumed parameters differ by {(a - b).abs().max().item()}"
        for key in ("generated_tokens_total", "unscorable_rows_total", "global_step"):
            assert d["full_state"][key] == d["resumed_state"][key], (t, r, key)


TRAINERS = ("grpo", "dapo", "basis", "pair", "v05")


@pytest.mark.timeout(300)
def test_resume_is_bit_identical_one_process(tmp_path):
    proc = _run([sys.executable, os.path.join(SCRIPTS, "resume_check.py"), str(tmp_path), ",".join(TRAINERS)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_bit_identical(_resume_results(str(tmp_path), 1, TRAINERS))


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.skipif(_transformers_below("5.18"), reason="transformers 5.17 resumes a multi-process CPU run with "
                    "torch.load(map_location='cpu:0'), which torch cannot restore (fixed in later releases, 5.24 "
                    "tested); a limitation of transformers on CPU ranks only, see docs/vllm.md")
def test_resume_is_bit_identical_two_processes(tmp_path):
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                 os.path.join(SCRIPTS, "resume_check.py"), str(tmp_path), ",".join(TRAINERS)],
                env_extra={"ACCELERATE_DEBUG_MODE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = _resume_results(str(tmp_path), 2, TRAINERS)
    _assert_bit_identical(res)
    for t in TRAINERS:  # DDP keeps the replicas identical
        assert all(torch.equal(a, b) for a, b in zip(res[(t, 0)]["resumed"], res[(t, 1)]["resumed"]))


# --------------------------------------------------------------------------------------------------- multi-process
_MISCONFIGURED = """
import os, sys
sys.path.insert(0, {scripts!r})
from base_helpers import make_trainer
try:
    make_trainer({out!r} + "/r" + os.environ["RANK"], use_cpu=False, max_steps=1)
except RuntimeError as e:
    print("REFUSED:", e)
    sys.exit(0)
print("NOT REFUSED")
sys.exit(3)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_launcher_with_two_processes_but_trainer_seeing_one_is_refused(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on a CPU machine without use_cpu=True: each process sees
    one process (no GPU backend) and would train alone into one output_dir."""
    script = tmp_path / "misconfigured.py"
    script.write_text(_MISCONFIGURED.format(scripts=SCRIPTS, out=str(tmp_path)))
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)],
                env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("REFUSED:") == 2 and "use_cpu=True" in proc.stdout

"""End-to-end tests: the keyed sampler inside a real trainer (trl_ext.GRPOTrainer over TRL), replay, checkpoint diffs, the
CLI."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import torch

torch.set_num_threads(1)

PROMPTS = ["1+2=", "12+34=", "5+67=", "9+9="]


def _tiny():
    from trl_ext.testbed.model import build_tiny_model
    from trl_ext.testbed.tokenizer import build_tokenizer

    tok = build_tokenizer()
    return tok, build_tiny_model(tok, seed=0)


def _reward_len(completions, **kw):
    return [float(len(c)) for c in completions]


def _reward_sevens(completions, **kw):
    return [float(c.count("7")) for c in completions]


def _train(out_dir, *, reward=_reward_len, steps=2, keyed=True, seed=0, keyed_seed=None, key_column=None,
           save=True):  # fmt: skip
    """Train trl_ext.GRPOTrainer (the base trainer, its keyed_sampler back-end) with the keyed config fields."""
    from datasets import Dataset

    from trl_ext import ExtGRPOConfig, GRPOTrainer

    tok, model = _tiny()
    ds = Dataset.from_dict({"prompt": PROMPTS * 4, "qid": [f"q{i % 4}" for i in range(16)]})
    args = ExtGRPOConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=False, report_to="none", max_completion_length=5,
        per_device_train_batch_size=8, num_generations=4, max_steps=steps, learning_rate=5e-2,
        logging_steps=1, save_strategy="steps" if save else "no", save_steps=1, seed=seed,
        temperature=1.2, top_k=12, disable_tqdm=True,
        keyed_sampling=keyed, keyed_sampling_seed=keyed_seed, keyed_sampling_key_column=key_column,
    )  # fmt: skip
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    trainer.train()
    return trainer, tok


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two GRPO steps with keyed sampling; checkpoint-1 and checkpoint-2 saved; the start model saved too."""
    root = tmp_path_factory.mktemp("keyed")
    tok, model0 = _tiny()
    model0.save_pretrained(root / "init")
    tok.save_pretrained(root / "init")
    trainer, tok = _train(root / "out")
    from trl_ext.measurement.replay import load_rollout_log

    records = load_rollout_log(root / "out" / "rollouts" / "rank0.jsonl")
    return {"root": root, "records": records, "tok": tok, "trainer": trainer}


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)


def _model_for(run, rec):
    return _load(run["root"] / "init" if rec["step"] == 0 else rec["checkpoint"])


def test_log_has_one_record_per_rollout_with_keys(run):
    recs = run["records"]
    assert len(recs) == 16  # 2 generation batches x 8 rollouts
    assert sorted({r["step"] for r in recs}) == [0, 1]
    by_key = defaultdict(list)
    for r in recs:
        by_key[r["key"]].append(r)
        assert len(r["completion_ids"]) <= 5 and r["prompt_ids"] and r["mode"] == "train"
        assert r["sampler"]["temperature"] == 1.2 and r["sampler"]["top_k"] == 12
        assert r["call"]["rows"] == 8 and 0 <= r["call"]["row"] < 8
    # one key per (step, prompt); the G=4 rollouts of a prompt are sample indices 0..3
    assert len(by_key) == 4
    for rs in by_key.values():
        assert sorted(r["sample_index"] for r in rs) == [0, 1, 2, 3]
        assert len({(r["step"], r["prompt_key"]) for r in rs}) == 1
    assert {r["checkpoint"] for r in recs if r["step"] == 1} == {str(run["root"] / "out" / "checkpoint-1")}


def test_every_logged_rollout_regenerates_byte_identically(run):
    from trl_ext.measurement.replay import regenerate, regenerate_batch

    models = {}
    calls = defaultdict(list)
    for r in run["records"]:
        m = models.setdefault(r["step"], _model_for(run, r))
        # alone (batch of one: a different batch shape than at logging time)
        assert regenerate(m, run["tok"], r) == r["completion_ids"]
        calls[r["call"]["id"]].append(r)
    assert len(calls) == 2
    for rs in calls.values():  # the exact logged batch (same rows, same order, same padding)
        rs = sorted(rs, key=lambda r: r["call"]["row"])
        assert regenerate_batch(models[rs[0]["step"]], rs) == [r["completion_ids"] for r in rs]
    # the trainer's current weights (after 2 steps) are a different checkpoint: the step-0 log does not replay
    trained = _load(run["root"] / "out" / "checkpoint-2")
    step0 = [r for r in run["records"] if r["step"] == 0]
    assert any(regenerate(trained, None, r) != r["completion_ids"] for r in step0)


def test_diff_two_checkpoints_reports_first_divergence_and_margins(run):
    from trl_ext.measurement.replay import diff_checkpoints

    step0 = [r for r in run["records"] if r["step"] == 0]
    a, b = _load(run["root"] / "init"), _load(run["root"] / "out" / "checkpoint-2")
    diffs = diff_checkpoints(a, b, run["tok"], step0)
    assert len(diffs) == 8 and all(d.a_matches_log for d in diffs)
    diverged = [d for d in diffs if d.first_divergence is not None]
    assert diverged, "two different checkpoints should diverge somewhere"
    for d in diverged:
        t = d.first_divergence
        assert d.completion_a[:t] == d.completion_b[:t]
        assert d.token_a == d.completion_a[t] != d.token_b == d.completion_b[t]
        assert d.text_a == run["tok"].decode([d.token_a])
        # Each model won its own keyed race at t (recomputed from a cache-free forward pass): the replayed decision
        # and the reported margins agree. Where the filter (top_k=12) kept both tokens, the race margin is the
        # temperature-scaled logit margin plus the shared Gumbel gap.
        assert d.race_margin_a > -1e-4 and d.race_margin_b > -1e-4
        if d.race_margin_a != float("inf"):
            assert d.race_margin_a == pytest.approx(d.logit_margin_a / d.temperature + d.gumbel_gap, abs=1e-4)
        if d.race_margin_b != float("inf"):
            assert d.race_margin_b == pytest.approx(d.logit_margin_b / d.temperature - d.gumbel_gap, abs=1e-4)
    assert any(d.race_margin_a != float("inf") for d in diverged)  # the margin identity was checked at least once
    # a checkpoint never diverges from itself
    same = diff_checkpoints(a, _load(run["root"] / "init"), None, step0)
    assert all(d.first_divergence is None and d.token_a is None for d in same)


def test_paired_runs_share_noise_and_seed_changes_it(run, tmp_path):
    """Two variants that differ only in the reward draw identical step-0 rollouts (same keys)."""
    from trl_ext.measurement.replay import load_rollout_log

    _train(tmp_path / "variant", reward=_reward_sevens, steps=1, save=False)
    other = load_rollout_log(tmp_path / "variant" / "rollouts" / "rank0.jsonl")
    mine = [r for r in run["records"] if r["step"] == 0]
    assert [(r["key"], r["sample_index"], r["completion_ids"]) for r in other] == [
        (r["key"], r["sample_index"], r["completion_ids"]) for r in mine
    ]
    # another keyed seed: different keys and different tokens; a key column: ids in prompt_key
    _train(tmp_path / "seed9", steps=1, save=False, keyed_seed=9, key_column="qid")
    s9 = load_rollout_log(tmp_path / "seed9" / "rollouts" / "rank0.jsonl")
    assert {r["key"] for r in s9}.isdisjoint({r["key"] for r in mine})
    assert [r["completion_ids"] for r in s9] != [r["completion_ids"] for r in mine]
    assert {r["prompt_key"] for r in s9} <= {"qid:q0", "qid:q1", "qid:q2", "qid:q3"}


def test_keyed_off_writes_no_log(tmp_path):
    _train(tmp_path / "plain", steps=1, keyed=False, save=False)
    assert not (tmp_path / "plain" / "rollouts").exists()


def test_unsupported_generation_kwargs_fail_at_construction(tmp_path):
    from datasets import Dataset

    from trl_ext import ExtGRPOConfig
    from trl_ext import GRPOTrainer as KeyedGRPO

    tok, model = _tiny()
    args = ExtGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=2,
                         per_device_train_batch_size=2, max_completion_length=3, generation_kwargs={"typical_p": 0.9},
                         keyed_sampling=True)  # fmt: skip
    with pytest.raises(ValueError, match="typical_p"):
        KeyedGRPO(model=model, reward_funcs=_reward_len, args=args, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                  processing_class=tok)  # fmt: skip


def test_missing_key_column_is_a_clear_error(tmp_path):
    with pytest.raises(KeyError, match="keyed_sampling_key_column='nope'"):
        _train(tmp_path / "bad", steps=1, save=False, key_column="nope")


# ----------------------------------------------------------------------------- log reading and selection
def test_log_and_selection_errors(run, tmp_path):
    from trl_ext.measurement.replay import load_rollout_log, select_records

    with pytest.raises(FileNotFoundError, match="rollouts/rank"):
        load_rollout_log(tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(run["records"][0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        load_rollout_log(bad)
    partial = {k: v for k, v in run["records"][0].items() if k != "sampler"}
    bad.write_text(json.dumps(partial) + "\n")
    with pytest.raises(ValueError, match=r"lacks field\(s\) \['sampler'\]"):
        load_rollout_log(bad)
    bad.write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        load_rollout_log(bad)

    recs = run["records"]
    k = recs[0]["key"]
    assert len(select_records(recs, key=k)) == 4
    assert select_records(recs, key=hex(k), sample_index=2)[0]["sample_index"] == 2
    with pytest.raises(
        KeyError, match=r"not in the log \(16 records, 4 distinct keys\)\. Closest logged keys: \["
    ) as e:
        select_records(recs, key=k + 1)
    assert str(k) in str(e.value)  # the neighbour key is offered
    with pytest.raises(KeyError, match=r"logged sample indices for it: \[0, 1, 2, 3\]"):
        select_records(recs, key=k, sample_index=7)
    with pytest.raises(ValueError, match="not a decimal or 0x-hex"):
        select_records(recs, key="abc")


# ----------------------------------------------------------------------------- CLI
def test_cli_replay_diff_and_missing_key(run, tmp_path, capsys):
    from trl_ext.cli import main

    log = str(run["root"] / "out" / "rollouts" / "rank0.jsonl")
    ck1 = str(run["root"] / "out" / "checkpoint-1")
    out = tmp_path / "replay.json"
    assert main(["replay", "--log", log, "--step", "1", "--model", ck1, "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["n"] == 8 and rep["identical"] == 8
    assert "8/8 rollouts regenerated byte-identically" in capsys.readouterr().out

    # the wrong checkpoint for step 0: mismatches are reported with exit status 1
    assert main(["replay", "--log", log, "--step", "0", "--model", ck1]) == 1
    assert "MISMATCH at position" in capsys.readouterr().out

    out2 = tmp_path / "diff.json"
    init = str(run["root"] / "init")
    ck2 = str(run["root"] / "out" / "checkpoint-2")
    assert main(["replay", "--log", log, "--step", "0", "--model", init, "--model_b", ck2, "--json", str(out2)]) == 0
    diff = json.loads(out2.read_text())
    assert diff["mode"] == "diff" and diff["n"] == 8 and diff["diverged"] >= 1
    assert "first divergence at position" in capsys.readouterr().out

    assert main(["replay", "--log", log, "--key", "12345", "--model", init]) == 2
    err = capsys.readouterr().err
    assert "key 12345 is not in the log (16 records, 4 distinct keys)" in err and "Closest logged keys" in err
    assert main(["replay", "--log", str(tmp_path / "missing.jsonl"), "--model", init]) == 2
    assert main(["replay", "--log", log, "--model", str(tmp_path / "no_model")]) == 2


def test_cli_replay_warns_when_model_is_not_the_logged_one(run, tmp_path, capsys):
    from trl_ext.cli import main

    log = str(run["root"] / "out" / "rollouts" / "rank0.jsonl")
    ck1 = str(run["root"] / "out" / "checkpoint-1")
    ck2 = str(run["root"] / "out" / "checkpoint-2")
    init = str(run["root"] / "init")
    # the logged checkpoint: no warning
    assert main(["replay", "--log", log, "--step", "1", "--model", ck1]) == 0
    assert "warning" not in capsys.readouterr().err
    # another checkpoint than the log's: warned (and named), whatever the replay outcome
    out = tmp_path / "r.json"
    assert main(["replay", "--log", log, "--step", "1", "--model", ck2, "--json", str(out)]) in (0, 1)
    err = capsys.readouterr().err
    assert "warning: the log says 8 selected record(s)" in err and ck1 in err and ck2 in err
    assert any("checkpoint-1" in w for w in json.loads(out.read_text())["warnings"])
    # the step-0 records of this run name no model (the trainer's model had no _name_or_path): said, not hidden
    assert main(["replay", "--log", log, "--step", "0", "--model", init]) == 0
    assert "name no model" in capsys.readouterr().err
    # a log written by another (named) model: warned
    recs = [dict(r, checkpoint="some-org/other-model", model="some-org/other-model")
            for r in run["records"] if r["step"] == 0]
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["replay", "--log", str(other), "--model", init, "--limit", "2"]) == 0
    assert "generated by 'some-org/other-model'" in capsys.readouterr().err
    # token ids outside the model's vocabulary: another model family, a clear error instead of an IndexError
    bad = dict(recs[0], completion_ids=[999])
    other.write_text(json.dumps(bad) + "\n")
    assert main(["replay", "--log", str(other), "--model", init]) == 2
    assert "token id 999 but this model's vocabulary has" in capsys.readouterr().err


def test_check_model_matches_log_rules(run):
    from trl_ext.measurement.replay import _same_model, check_model_matches_log

    assert _same_model("out/checkpoint-20", ["/home/u/out/checkpoint-20"])
    assert _same_model("/a/b/out/checkpoint-20/", ["/a/b/out/checkpoint-20"])
    assert _same_model("Qwen/Qwen2.5-0.5B", ["/models/Qwen2.5-0.5B"])  # a hub id and a local copy of it
    assert not _same_model("runA/checkpoint-20", ["/x/runB/checkpoint-20"])
    assert not _same_model("org/model-a", ["org/model-b"])
    model = _load(run["root"] / "out" / "checkpoint-1")
    both = [r for r in run["records"]]  # steps 0 and 1: two different weights
    msgs = check_model_matches_log([dict(r, checkpoint=f"ck-{r['step']}") for r in both], model, "ck-1")
    assert any("2 different checkpoints" in m and "--step" in m for m in msgs)
    eos = [dict(r, sampler=dict(r["sampler"], eos_token_ids=[7])) for r in both if r["step"] == 1]
    assert any("EOS ids [7]" in m for m in check_model_matches_log(eos, model, str(run["root"] / "out" / "checkpoint-1")))


# ----------------------------------------------------------------------------- two ranks
_TWO_RANK_SCRIPT = """
import sys, torch, trl
from datasets import Dataset
torch.set_num_threads(1)
from trl_ext.testbed.model import build_tiny_model
from trl_ext.testbed.tokenizer import build_tokenizer
from trl_ext import ExtGRPOConfig
from trl_ext import GRPOTrainer as KeyedGRPO

tok = build_tokenizer()
model = build_tiny_model(tok, seed=0)
if int(__import__("os").environ["RANK"]) == 0:
    model.save_pretrained(sys.argv[1] + "/init")
ds = Dataset.from_dict({"prompt": ["1+2=", "12+34=", "5+67=", "9+9="]})
args = ExtGRPOConfig(output_dir=sys.argv[1] + "/out", use_cpu=True, bf16=False, report_to="none",
    max_completion_length=4, per_device_train_batch_size=2, num_generations=4, max_steps=2,
    learning_rate=1e-3, save_strategy="no", seed=0, disable_tqdm=True, keyed_sampling=True)
KeyedGRPO(model=model, reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions], args=args,
          train_dataset=ds, processing_class=tok).train()
import os, torch.distributed as dist  # clean gloo shutdown (see tests/scripts/_dist_exit.py)
if dist.is_initialized():
    dist.barrier()
    dist.destroy_process_group()
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
"""


@pytest.mark.multiprocess
def test_two_ranks_group_split_across_ranks_gets_global_sample_indices(tmp_path):
    """per_device=2, G=4 on 2 ranks: each group spans both ranks; sample indices are 0,1 on rank 0 and 2,3 on rank 1."""
    import os
    import subprocess
    import sys

    from trl_ext.measurement.replay import load_rollout_log, regenerate

    script = tmp_path / "two_rank.py"
    script.write_text(_TWO_RANK_SCRIPT)
    env = {**os.environ, "ACCELERATE_DEBUG_MODE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    proc = subprocess.run([*cmd, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = load_rollout_log(tmp_path / "out" / "rollouts" / "rank0.jsonl")
    r1 = load_rollout_log(tmp_path / "out" / "rollouts" / "rank1.jsonl")
    assert len(r0) == len(r1) == 4  # 2 steps x 2 rows per rank
    for step in (0, 1):
        a = [r for r in r0 if r["step"] == step]
        b = [r for r in r1 if r["step"] == step]
        assert len({r["key"] for r in a + b}) == 1  # one prompt per step, split over the ranks
        assert [r["sample_index"] for r in a] == [0, 1] and [r["sample_index"] for r in b] == [2, 3]
    init = _load(tmp_path / "init")
    for r in [r for r in r0 + r1 if r["step"] == 0]:
        assert regenerate(init, None, r) == r["completion_ids"]


def test_generate_token_ids_keys_the_dummy_rows_of_a_collective_call(tmp_path, monkeypatch):
    """Under ZeRO-3 / FSDP / vLLM TP generation is a collective: ``generate_token_ids`` pads this rank's call with
    dummy rows. With keyed sampling those rows get (marked) requests too, instead of the call refusing to run; the
    real rows keep their tokens and the dummies are discarded."""
    from trl_ext.generation.keyed_sampler import KeyedRequest
    from trl_ext.trainers import _trl_compat as compat

    trainer, tok = _train(tmp_path, steps=1, save=False)
    prompts = [tok("1+2=")["input_ids"], tok("12+34=")["input_ids"]]
    requests = [KeyedRequest(key=11, sample_index=0), KeyedRequest(key=12, sample_index=1)]
    trainer.keyed_sampler.set_requests(list(requests))
    alone, _ = trainer.generate_token_ids(prompts, max_new_tokens=4)
    monkeypatch.setattr(compat, "generation_is_collective", lambda tr: True)
    monkeypatch.setattr(compat, "gather", lambda t: torch.tensor([len(prompts) + 3]))  # another rank has 5 rows
    trainer.keyed_sampler.set_requests(list(requests))
    padded, _ = trainer.generate_token_ids(prompts, max_new_tokens=4)
    assert padded == alone
    with open(trainer.keyed_sampler.log_path(), encoding="utf-8") as f:
        last_call = [json.loads(line) for line in f][-5:]
    assert [r.get("dummy", False) for r in last_call] == [False, False, True, True, True]

"""Tests for the offline BASIS value-table builder (``trl_ext.priors.value_table``) and its CLI."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_ext.measurement import offline_sampling
from trl_ext.priors import TablePrior, load_value_table, prompt_key, value_table_sampling
from trl_ext.priors.value_table import build_value_table, reward_func_name, value_table_seed
from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset

torch.set_num_threads(1)

FAST = {"num_samples": 6, "max_new_tokens": 4, "progress": False}


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, seed=0)


@pytest.fixture(scope="module")
def ds():
    return make_dataset("addition", 5, seed=0, split="train")


def hash_reward(prompts, completions, **kwargs):
    """Non-binary reward in {0, .25, .5, .75, 1} that changes with any change of the completion text."""
    out = []
    for p, c in zip(prompts, completions):
        text = c if isinstance(c, str) else c[-1]["content"]
        out.append(int(hashlib.sha256((str(p) + "|" + text).encode()).hexdigest(), 16) % 5 / 4)
    return out


class Recorder:
    """Reward function that records its calls (and returns hash_reward)."""

    __name__ = "recorder"

    def __init__(self, fail_on_call=None):
        self.calls = []
        self.fail_on_call = fail_on_call

    def __call__(self, prompts, completions, **kwargs):
        self.calls.append({"prompts": list(prompts), "completions": list(completions), **kwargs})
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise KeyboardInterrupt("simulated interruption")
        return hash_reward(prompts, completions)


def rows_of(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    return [json.loads(x) for x in lines[1:] if x]


def header_of(path):
    with open(path, encoding="utf-8") as f:
        h = json.loads(f.readline())
    h["metadata"].pop("created", None)
    return h


def build(model, tok, ds, path, funcs=(hash_reward,), **kw):
    args = {**FAST, **kw}
    return build_value_table(model, tok, ds, list(funcs), path, **args)


# ------------------------------------------------------------------------------------------------ seeds
def test_value_table_seed_stable_and_distinct():
    a = value_table_seed(0, "abc")
    assert a == value_table_seed(0, "abc")
    assert 0 <= a < 2**63
    seeds = {value_table_seed(s, k) for s in range(5) for k in ("a", "b", "c", "d")}
    assert len(seeds) == 20
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            value_table_seed(bad, "a")
    with pytest.raises(ValueError, match="key"):
        value_table_seed(0, "")


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**40), st.text(min_size=1, max_size=20))
def test_value_table_seed_range(seed, key):
    s = value_table_seed(seed, key)
    assert isinstance(s, int) and 0 <= s <= 2**63 - 1


def test_reward_func_name():
    import functools

    assert reward_func_name(hash_reward) == "hash_reward"
    assert reward_func_name(functools.partial(hash_reward, x=1)) == "hash_reward"
    assert reward_func_name(Recorder()) == "recorder"


# ------------------------------------------------------------------------------------------------ scoring
_reward_or_none = st.one_of(st.none(), st.floats(-5, 5, allow_nan=False))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3).flatmap(lambda f: st.tuples(
    st.lists(st.lists(_reward_or_none, min_size=4, max_size=4), min_size=f, max_size=f),
    st.lists(st.floats(-2, 2, allow_nan=False), min_size=f, max_size=f))))
def test_score_is_trl_nansum(data):
    cols, weights = data
    def const(col):
        return lambda prompts, completions, **kw: list(col)

    funcs = [const(c) for c in cols]
    got = offline_sampling.score_completions(funcs, weights, ["p"] * 4, ["c"] * 4, [[1]] * 4, {})
    for j in range(4):
        vals = [w * c[j] for w, c in zip(weights, cols) if c[j] is not None]
        if not vals:
            assert math.isnan(got[j])
        else:
            assert got[j] == pytest.approx(sum(vals), abs=1e-12)


def test_score_bad_outputs():
    with pytest.raises(ValueError, match="returned 1 rewards for 2"):
        offline_sampling.score_completions([lambda prompts, completions, **k: [1.0]], [1.0], ["a", "b"], ["x", "y"], [[1], [1]], {})
    with pytest.raises(ValueError, match="non-numeric"):
        offline_sampling.score_completions([lambda prompts, completions, **k: ["x", 1.0]], [1.0], ["a", "b"], ["x", "y"], [[1], [1]], {})
    with pytest.raises(TypeError, match=r"\*\*kwargs"):
        offline_sampling.score_completions([lambda prompts, completions: [1.0, 1.0]], [1.0], ["a", "b"], ["x", "y"], [[1], [1]], {})

    async def areward(prompts, completions, **kw):
        return [0.5] * len(prompts)

    assert offline_sampling.score_completions([areward], [2.0], ["a"], ["x"], [[1]], {}) == [1.0]


# ------------------------------------------------------------------------------------------------ builder
def test_table_contents_and_reward_call_layout(tmp_path, model, tok, ds):
    rec = Recorder()
    path = tmp_path / "t.jsonl"
    table = build(model, tok, ds, path, funcs=[rec], batch_size=12)
    loaded = load_value_table(path)
    assert len(loaded) == len(table) == len(ds)
    for ex in ds:
        row = loaded.lookup(ex["prompt"])
        assert row is not None and row.prompt_key == prompt_key(ex["prompt"])
        assert row.n == FAST["num_samples"] == len(row.rewards)
        assert row.mean_reward == pytest.approx(float(np.mean(row.rewards)), abs=1e-12)
        assert row.question_id == ex["question_id"]
        assert tuple(row.reward_range) == (0.0, 1.0)
    md = loaded.metadata
    assert md["reward_funcs"] == ["recorder"] and md["n_samples"] == 6 and md["seed"] == 0
    assert md["backend"] == "transformers" and md["sampler"] == "keyed"
    # batch_size 12 with 6 samples -> chunks of 2 prompts; every call has TRL's layout
    assert [len(c["prompts"]) for c in rec.calls] == [12, 12, 6]
    all_completions = []
    for call in rec.calls:
        n = len(call["prompts"])
        for col in ("answer", "question_id", "a", "b"):
            assert len(call[col]) == n
        assert "prompt" not in call
        assert call["trainer_state"].global_step == 0
        assert callable(call["log_extra"]) and callable(call["log_metric"])
        for p, qid, ans in zip(call["prompts"], call["question_id"], call["answer"]):
            ex = next(e for e in ds if e["question_id"] == qid)
            assert p == ex["prompt"] and ans == ex["answer"]
        for i in range(0, n, 6):  # each prompt's 6 samples are contiguous
            assert len(set(call["prompts"][i : i + 6])) == 1
        assert tok.batch_decode(call["completion_ids"], skip_special_tokens=True) == call["completions"]
        assert all(0 < len(ids) <= FAST["max_new_tokens"] for ids in call["completion_ids"])
        all_completions += call["completions"]
    assert len(set(all_completions)) > 5  # sampling, not greedy decoding
    # rows hold the rewards of exactly the recorded completions
    flat = [(p, c) for call in rec.calls for p, c in zip(call["prompts"], call["completions"])]
    for row in loaded:
        mine = [hash_reward([p], [c])[0] for p, c in flat if p == row.prompt]
        assert mine == row.rewards


def test_deterministic_and_batch_independent(tmp_path, model, tok, ds):
    fixed = {"created": "fixed"}
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    build(model, tok, ds, a, batch_size=64, metadata=fixed)
    build(model, tok, ds, b, batch_size=64, metadata=fixed)
    assert a.read_bytes() == b.read_bytes()
    build(model, tok, ds, c, batch_size=4, metadata=fixed)  # prompts split across generate calls
    assert a.read_bytes() == c.read_bytes()
    # a subset of the prompts gets the same rows (no dependence on which prompts share a batch)
    sub = tmp_path / "sub.jsonl"
    build(model, tok, ds.select([3, 1]), sub, batch_size=64)
    full = {r["prompt_key"]: r for r in rows_of(a)}
    for r in rows_of(sub):
        assert r == full[r["prompt_key"]]
    # another seed samples differently
    d = tmp_path / "d.jsonl"
    build(model, tok, ds, d, seed=1)
    assert [r["rewards"] for r in rows_of(d)] != [r["rewards"] for r in rows_of(a)]


def test_multinomial_sampler_deterministic_and_independent(tmp_path, model, tok, ds):
    a, b, sub = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "sub.jsonl"
    rec = Recorder()
    build(model, tok, ds, a, funcs=[rec], sampler="multinomial", batch_size=64)
    torch.manual_seed(123)  # the global RNG must not matter
    build(model, tok, ds, b, sampler="multinomial", batch_size=8)
    assert rows_of(a) == rows_of(b)
    build(model, tok, ds.select([4, 2]), sub, sampler="multinomial")
    full = {r["prompt_key"]: r for r in rows_of(a)}
    for r in rows_of(sub):
        assert r == full[r["prompt_key"]]
    assert header_of(a)["metadata"]["sampler"] == "multinomial"
    assert len(set(rec.calls[0]["completions"])) > 3


def test_resume_after_exception_equals_uninterrupted(tmp_path, model, tok, ds):
    ref = tmp_path / "ref.jsonl"
    build(model, tok, ds, ref, batch_size=12, metadata={"created": "x"})
    part = tmp_path / "part.jsonl"
    with pytest.raises(KeyboardInterrupt):
        build(model, tok, ds, part, funcs=[Recorder(fail_on_call=2)], batch_size=12, metadata={"created": "x"})
    with pytest.raises(ValueError, match="incomplete: its build has not finished.*re-run `trl-ext build-value-table`"):
        load_value_table(part)  # an interrupted build is not a table a trainer may read
    assert len(load_value_table(part, allow_incomplete=True)) == 2  # the first chunk (2 prompts) was written
    # resuming with a different batch size (different batch composition) still gives the same file
    table = build(model, tok, ds, part, funcs=[Recorder()], batch_size=6, metadata={"created": "x"})
    assert table.metadata["build_stats"]["n_already_done"] == 2
    assert table.metadata["build_stats"]["n_written"] == 3
    assert rows_of(part) == rows_of(ref)
    assert header_of(part)["metadata"]["reward_funcs"] == ["recorder"]


def test_resume_max_prompts_and_truncated_tail(tmp_path, model, tok, ds):
    ref = tmp_path / "ref.jsonl"
    build(model, tok, ds, ref, metadata={"created": "x"})
    part = tmp_path / "part.jsonl"
    t1 = build(model, tok, ds, part, max_prompts=2, metadata={"created": "x"})
    assert len(t1) == 2 and t1.metadata["build_stats"]["stopped_early"]
    t2 = build(model, tok, ds, part, max_prompts=1, metadata={"created": "x"})
    assert len(t2) == 3
    # a killed write leaves half a line: the resume repairs it and finishes
    with open(part, "a", encoding="utf-8") as f:
        f.write('{"prompt_key": "dead", "n": 3, "mean_re')
    with pytest.warns(UserWarning, match="truncated"):
        t3 = build(model, tok, ds, part, metadata={"created": "x"})
    assert len(t3) == 5 and not t3.metadata["build_stats"]["stopped_early"]
    assert part.read_bytes() == ref.read_bytes()
    # nothing left to do: a no-op
    t4 = build(model, tok, ds, part)
    assert t4.metadata["build_stats"]["n_written"] == 0 and part.read_bytes() == ref.read_bytes()


# ------------------------------------------------------------------------------------------------ integrity
def _lines(path):
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def test_finished_table_records_count_and_hash_and_loads_cleanly(tmp_path, model, tok, ds):
    import warnings

    path = tmp_path / "t.jsonl"
    table = build(model, tok, ds, path)
    integ = json.loads(_lines(path)[0])["integrity"]
    assert integ["status"] == "complete" and integ["n_rows"] == len(ds) == len(table)
    assert integ["sha256"] == table.content_hash and len(table.content_hash) == 64
    assert table.metadata["build_stats"]["complete"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no legacy / truncation warning for a finished table
        loaded = load_value_table(path)
    assert loaded.content_hash == integ["sha256"] and loaded.integrity == integ
    # the hash is the rows' identity: independent of row order and header metadata, changed by any reward
    from trl_ext.priors.table_format import ValueTable, ValueTableRow

    rows = list(loaded)
    assert ValueTable(rows[::-1], {"other": 1}).content_hash == loaded.content_hash
    edited = ValueTableRow.from_rewards(rows[0].prompt, [1.0 - rows[0].rewards[0], *rows[0].rewards[1:]],
                                        (0.0, 1.0), key=rows[0].prompt_key, question_id=rows[0].question_id)
    assert ValueTable([edited, *rows[1:]]).content_hash != loaded.content_hash
    # TablePrior reads it and exposes the hash
    prior = TablePrior(os.fspath(path))
    assert len(prior.table) == len(ds) and prior.content_hash == integ["sha256"]
    assert TablePrior({"a": 0.5}).content_hash is None


def test_table_cut_on_a_row_boundary_is_refused_and_a_rerun_restores_it(tmp_path, model, tok, ds):
    path = tmp_path / "t.jsonl"
    build(model, tok, ds, path, metadata={"created": "x"})
    full = path.read_bytes()
    lines = _lines(path)
    path.write_text("".join(lines[:-2]), encoding="utf-8")  # cut after a complete line: every line parses
    with pytest.raises(ValueError, match=r"truncated: its header records 5 rows but the file holds 3.*"
                                         r"re-run `trl-ext build-value-table` with the same arguments"):
        load_value_table(path)
    with pytest.raises(ValueError, match="truncated"):
        TablePrior(os.fspath(path))  # the trainers' loaders refuse it too
    with pytest.raises(ValueError, match="truncated"):
        load_value_table(path, allow_truncated_tail=True)  # a whole missing row is not a "truncated tail"
    assert len(load_value_table(path, allow_incomplete=True)) == 3
    # re-running the same build resumes and finishes it: the file is the uninterrupted one again
    t = build(model, tok, ds, path, metadata={"created": "x"})
    assert t.metadata["build_stats"]["n_written"] == 2 and path.read_bytes() == full
    # a header-only file (every row lost) is refused as well
    path.write_text(lines[0], encoding="utf-8")
    with pytest.raises(ValueError, match="holds 0"):
        load_value_table(path)


def test_modified_or_appended_rows_are_refused(tmp_path, model, tok, ds):
    path = tmp_path / "t.jsonl"
    build(model, tok, ds, path)
    lines = _lines(path)
    row = json.loads(lines[2])
    row["rewards"][0] = 1.0 - row["rewards"][0] if row["rewards"][0] in (0.0, 1.0) else 0.0
    row["mean_reward"] = sum(row["rewards"]) / len(row["rewards"])
    bad = tmp_path / "modified.jsonl"
    bad.write_text("".join([lines[0], lines[1], json.dumps(row) + "\n", *lines[3:]]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"corrupted: the SHA-256 of its 5 rows .*a row was modified.*--overwrite"):
        load_value_table(bad)
    with pytest.raises(ValueError, match="corrupted"):
        load_value_table(bad, allow_incomplete=True)  # never loadable
    with pytest.raises(ValueError, match="corrupted"):
        build(model, tok, ds, bad)  # and a resume refuses to bless it
    extra = tmp_path / "extra.jsonl"
    other = json.loads(lines[1])
    other["prompt_key"], other["prompt"] = "0123456789abcdef", "not in the dataset"
    extra.write_text("".join([*lines, json.dumps(other) + "\n"]), encoding="utf-8")
    with pytest.raises(ValueError, match="records 5 rows but the file holds 6"):
        load_value_table(extra)
    # reordering rows does not change the content: still a valid table
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("".join([lines[0], *lines[1:][::-1]]), encoding="utf-8")
    assert len(load_value_table(shuffled)) == 5


def test_partial_build_is_in_progress_until_finished(tmp_path, model, tok, ds, capsys):
    path = tmp_path / "t.jsonl"
    t = build(model, tok, ds, path, max_prompts=2)
    assert len(t) == 2 and t.metadata["build_stats"]["complete"] is False
    assert json.loads(_lines(path)[0])["integrity"] == {"status": "in_progress"}
    with pytest.raises(ValueError, match="incomplete.*2 rows so far"):
        load_value_table(path)
    build(model, tok, ds, path)
    assert len(load_value_table(path)) == 5


def test_legacy_table_loads_with_a_warning_and_a_rerun_upgrades_it(tmp_path, model, tok, ds):
    path = tmp_path / "t.jsonl"
    build(model, tok, ds, path, metadata={"created": "x"})
    finished = path.read_bytes()
    lines = _lines(path)
    header = json.loads(lines[0])
    del header["integrity"]  # what trl_ext 0.1 wrote
    legacy = "".join([json.dumps(header, ensure_ascii=False) + "\n", *lines[1:]])
    path.write_text(legacy, encoding="utf-8")
    with pytest.warns(UserWarning, match="no row count or content hash \\(written by trl_ext 0.1\\)"):
        t = load_value_table(path)
    assert len(t) == 5 and t.integrity is None
    t2 = build(model, tok, ds, path)  # nothing to sample: the re-run only records count and hash
    assert t2.metadata["build_stats"]["n_written"] == 0 and path.read_bytes() == finished


def test_resume_refuses_other_settings(tmp_path, model, tok, ds):
    path = tmp_path / "t.jsonl"
    build(model, tok, ds, path, max_prompts=1)
    for kw, what in (({"num_samples": 5}, "n_samples"), ({"temperature": 0.7}, "temperature"),
                     ({"seed": 3}, "seed"), ({"reward_range": (0, 2)}, "reward_range"),
                     ({"sampler": "multinomial"}, "sampler"), ({"max_new_tokens": 3}, "max_new_tokens")):
        with pytest.raises(ValueError, match=what):
            build(model, tok, ds, path, **kw)
    with pytest.raises(ValueError, match="reward_funcs"):
        build(model, tok, ds, path, funcs=[Recorder()])
    with pytest.raises(FileExistsError):
        build(model, tok, ds, path, resume=False)
    assert len(load_value_table(path, allow_incomplete=True)) == 1  # untouched by the refused attempts


def test_nan_rewards_are_counted_and_excluded(tmp_path, model, tok, ds):
    def sometimes_none(prompts, completions, **kw):
        return [None if i % 3 == 0 else v for i, v in enumerate(hash_reward(prompts, completions))]

    path = tmp_path / "t.jsonl"
    with pytest.warns(UserWarning, match="no reward"):
        table = build(model, tok, ds, path, funcs=[sometimes_none], batch_size=6)  # one prompt per call
    for row in table:
        assert row.n == 4 and row.extra == {"n_nan": 2, "n_generated": 6}
        assert row.mean_reward == pytest.approx(np.mean(row.rewards))
    assert table.metadata["build_stats"]["n_nan_samples"] == 2 * len(ds)
    # a second reward function that scores the NaN rows fills them in (TRL nansum)
    path2 = tmp_path / "t2.jsonl"
    table2 = build(model, tok, ds, path2, funcs=[sometimes_none, lambda prompts, completions, **k: [0.0] * len(prompts)])
    assert all(r.n == 6 and not r.extra for r in table2)


def test_all_nan_prompt_raises(tmp_path, model, tok, ds):
    def none_for_first(prompts, completions, question_id=None, **kw):
        return [None if q == ds[1]["question_id"] else 1.0 for q in question_id]

    with pytest.raises(ValueError, match=r"every one of the 6 samples.*dataset row 1"):
        build(model, tok, ds, tmp_path / "t.jsonl", funcs=[none_for_first])


def test_reward_range_declared_and_enforced(tmp_path, model, tok, ds):
    def big(prompts, completions, **kw):
        return [2.0 * v - 1.0 for v in hash_reward(prompts, completions)]  # in [-1, 1]

    with pytest.raises(ValueError, match=r"outside the declared reward_range \[0.0, 1.0\]"):
        build(model, tok, ds, tmp_path / "a.jsonl", funcs=[big])
    table = build(model, tok, ds, tmp_path / "b.jsonl", funcs=[big], reward_range=(-1, 1))
    assert all(tuple(r.reward_range) == (-1.0, 1.0) for r in table)
    assert table.is_binary is False
    with pytest.raises(ValueError, match="non-finite|outside"):
        build(model, tok, ds, tmp_path / "c.jsonl", funcs=[lambda prompts, completions, **k: [math.inf] * len(prompts)])
    # reward weights scale the reward exactly like TRL
    t_w = build(model, tok, ds, tmp_path / "d.jsonl", reward_weights=[0.5], metadata={"created": "x"})
    t_1 = build(model, tok, ds, tmp_path / "e.jsonl", metadata={"created": "x"})
    for r in t_1:
        assert t_w.get(r.prompt_key).rewards == [0.5 * v for v in r.rewards]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"num_samples": 0}, ValueError, "num_samples"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        ({"batch_size": -1}, ValueError, "batch_size"),
        ({"temperature": 0.0}, ValueError, "temperature"),
        ({"temperature": math.nan}, ValueError, "temperature"),
        ({"top_p": 1.5}, ValueError, "top_p"),
        ({"seed": -1}, ValueError, "seed"),
        ({"sampler": "beam"}, ValueError, "sampler"),
        ({"use_vllm": "yes"}, ValueError, "use_vllm"),
        ({"reward_range": (1, 0)}, ValueError, "low < high"),
        ({"reward_range": (0, math.inf)}, ValueError, "finite"),
        ({"reward_weights": [1.0, 2.0]}, ValueError, "reward_weights"),
        ({"reward_weights": [math.nan]}, ValueError, "reward_weights"),
        ({"prompt_column": "question"}, ValueError, "has no 'question' column"),
        ({"max_prompts": -1}, ValueError, "max_prompts"),
    ],
)
def test_bad_settings(tmp_path, model, tok, ds, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        build(model, tok, ds, tmp_path / "t.jsonl", **kwargs)
    assert not (tmp_path / "t.jsonl").exists()  # validated before anything is written


def test_bad_inputs(tmp_path, model, tok, ds):
    p = tmp_path / "t.jsonl"
    with pytest.raises(ValueError, match="empty"):
        build(model, tok, [], p)
    with pytest.raises(ValueError, match="empty string"):
        build(model, tok, [{"prompt": "1+1=", "answer": "2"}, {"prompt": "", "answer": "0"}], p)
    with pytest.raises(ValueError, match="non-empty str or a list of message dicts"):
        build(model, tok, [{"prompt": 5}], p)
    with pytest.raises(TypeError, match="dict rows"):
        build(model, tok, ["1+1="], p)
    with pytest.raises(ValueError, match="reward_funcs"):
        build(model, tok, ds, p, funcs=[])
    with pytest.raises(TypeError, match="string"):
        build(model, tok, ds, p, funcs=["my/reward-model"])
    with pytest.raises(TypeError, match="Module"):
        build(model, tok, ds, p, funcs=[torch.nn.Linear(2, 1)])
    with pytest.raises(TypeError, match="causal LM"):
        build(object(), tok, ds, p)
    if offline_sampling.import_vllm() is None:  # with vLLM installed the path goes to vllm.LLM (tests/test_vllm_real.py)
        with pytest.raises(ImportError, match="vllm is not installed"):
            build("some/path", tok, ds, p, use_vllm=True)
    with pytest.raises(ValueError, match="returned 1 rewards"):
        build(model, tok, ds, p, funcs=[lambda prompts, completions, **k: [0.0]])
    assert not p.exists() or len(load_value_table(p, allow_incomplete=True)) == 0
    # the same prompt with different reward columns cannot have one value
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "1+1=", "answer": "3"}]
    with pytest.raises(ValueError, match="same prompt"):
        build(model, tok, rows, tmp_path / "u.jsonl")


def test_duplicates_and_column_dict(tmp_path, model, tok):
    cols = {"prompt": ["1+1=", "2+2=", "1+1="], "answer": ["2", "4", "2"]}
    with pytest.warns(UserWarning, match="1 dataset rows repeat"):
        table = build(model, tok, cols, tmp_path / "t.jsonl")
    assert len(table) == 2 and table.metadata["build_stats"]["n_duplicate_prompts"] == 1
    assert sorted(r.question_id for r in table) == [0, 1]  # no question_id column: dataset row index


def test_conversational_prompts(tmp_path, model):
    tok = build_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{a}="}], "answer": str(2 * a)} for a in (3, 7)]
    rec = Recorder()
    table = build(model, tok, rows, tmp_path / "t.jsonl", funcs=[rec])
    assert len(table) == 2
    for r in rows:
        assert table.lookup(r["prompt"]).prompt == r["prompt"]
    comp = rec.calls[0]["completions"][0]
    assert isinstance(comp, list) and comp[0]["role"] == "assistant" and isinstance(comp[0]["content"], str)


def test_model_by_path_and_table_prior(tmp_path):
    from trl_ext.testbed import save_tiny_model

    mpath = save_tiny_model(tmp_path / "m", seed=1)
    ds = make_dataset("addition", 3, seed=2)
    table = build_value_table(mpath, None, ds, [hash_reward], tmp_path / "t.jsonl", **FAST)
    assert table.metadata["model"] == mpath
    assert table.check_compatible(model=mpath, reward_funcs=["hash_reward"], seed=0) == []
    prior = TablePrior(os.fspath(tmp_path / "t.jsonl"))
    np.testing.assert_allclose(prior.predict(list(ds["prompt"])), [table.lookup(p).mean_reward for p in ds["prompt"]])


# ------------------------------------------------------------------------------------------------ vLLM stand-in
def _fake_vllm():
    """A stand-in for the ``vllm`` module: ``SamplingParams(n, seed, ...)`` and ``LLM.generate``."""

    class SamplingParams:
        def __init__(self, n=1, seed=None, temperature=1.0, top_p=1.0, max_tokens=16, **kw):
            self.n, self.seed, self.temperature, self.top_p, self.max_tokens = n, seed, temperature, top_p, max_tokens

    class LLM:
        instances = []

        def __init__(self, model=None, seed=0, **kw):
            self.model, self.seed, self.calls = model, seed, []
            self._tok = build_tokenizer()
            LLM.instances.append(self)

        def get_tokenizer(self):
            return self._tok

        def generate(self, prompts, sampling_params, use_tqdm=True):
            assert isinstance(sampling_params, list) and len(sampling_params) == len(prompts)
            self.calls.append((list(prompts), sampling_params))
            outs = []
            for p, sp in zip(prompts, sampling_params):
                rng = random.Random(sp.seed)  # per-request generator, like vLLM's seeded requests
                comps = []
                for _ in range(sp.n):
                    k = rng.randint(1, sp.max_tokens - 1)
                    ids = [rng.randint(3, 12) for _ in range(k)] + [1]  # digits then <eos>
                    comps.append(types.SimpleNamespace(token_ids=ids, text=self._tok.decode(ids, skip_special_tokens=True)))
                outs.append(types.SimpleNamespace(prompt=p, outputs=comps))
            return outs

    return types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams)


def test_vllm_branch_with_stand_in(tmp_path, monkeypatch, ds):
    fake = _fake_vllm()
    monkeypatch.setattr(offline_sampling, "import_vllm", lambda: fake)
    llm = fake.LLM(model="ref")
    rec = Recorder()
    a = tmp_path / "a.jsonl"
    table = build_value_table(llm, None, ds, [rec], a, num_samples=5, max_new_tokens=6, temperature=0.9, top_p=0.95,
                              batch_size=2, seed=3, progress=False, metadata={"created": "x"})
    assert table.metadata["backend"] == "vllm" and table.metadata["sampler"] == "vllm-seeded"
    assert [len(c[0]) for c in llm.calls] == [2, 2, 1]
    for prompts, params in llm.calls:
        for p, sp in zip(prompts, params):
            assert sp.n == 5 and sp.max_tokens == 6 and sp.temperature == 0.9 and sp.top_p == 0.95
            assert sp.seed == value_table_seed(3, prompt_key(p))
    for row in table:
        assert row.n == 5 and row.mean_reward == pytest.approx(np.mean(row.rewards))
    # completions and their ids reach the reward function, decoded like TRL (skip special tokens)
    call = rec.calls[0]
    assert call["completions"] == build_tokenizer().batch_decode(call["completion_ids"], skip_special_tokens=True)
    assert all(ids[-1] == 1 for ids in call["completion_ids"])
    # deterministic and independent of batch composition / resume point
    b = tmp_path / "b.jsonl"
    build_value_table(fake.LLM(model="ref"), None, ds, [hash_reward], b, num_samples=5, max_new_tokens=6,
                      temperature=0.9, top_p=0.95, batch_size=64, seed=3, progress=False, max_prompts=2,
                      metadata={"created": "x"})
    build_value_table(fake.LLM(model="ref"), None, ds, [hash_reward], b, num_samples=5, max_new_tokens=6,
                      temperature=0.9, top_p=0.95, batch_size=3, seed=3, progress=False)
    assert rows_of(a) == rows_of(b)
    # a path with use_vllm=True constructs vllm.LLM(model=path, seed=seed)
    c = tmp_path / "c.jsonl"
    t = build_value_table("some/model", None, ds.select([0]), [hash_reward], c, use_vllm=True, seed=4,
                          **{**FAST, "max_new_tokens": 3})
    assert fake.LLM.instances[-1].model == "some/model" and fake.LLM.instances[-1].seed == 4
    assert t.metadata["model"] == "some/model"
    # use_vllm=False with a vLLM engine is a user error
    with pytest.raises(TypeError, match="causal LM"):
        build_value_table(llm, None, ds, [hash_reward], tmp_path / "d.jsonl", use_vllm=False, **FAST)


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_testbed_end_to_end(tmp_path, capsys):
    from trl_ext.cli import main
    from trl_ext.testbed import save_tiny_model

    mpath = save_tiny_model(tmp_path / "m", seed=0)
    out = tmp_path / "table.jsonl"
    argv = ["build-value-table", "--model", mpath, "--task", "addition", "--split", "train", "--num_prompts", "4",
            "--num_samples", "4", "--output", os.fspath(out), "--seed", "1", "--batch_size", "8",
            "--max_new_tokens", "4", "--no_progress", "--device", "cpu", "--max_prompts", "3"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "3 prompts (3 new" in printed and "INCOMPLETE (stopped early" in printed
    with pytest.raises(ValueError, match="incomplete"):
        load_value_table(out)
    argv = argv[: argv.index("--max_prompts")]
    assert main(argv) == 0  # resumes
    printed = capsys.readouterr().out
    assert "4 prompts (1 new, 3 already done" in printed
    table = load_value_table(out)
    assert f"complete: 4 rows, content sha256 {table.content_hash}" in printed
    ds = make_dataset("addition", 4, seed=0, split="train")
    assert sorted(r.question_id for r in table) == sorted(ds["question_id"])
    assert all(r.n == 4 for r in table)
    md = table.metadata
    assert md["model"] == mpath and md["seed"] == 1 and md["reward_funcs"] == ["addition_reward"]
    assert md["dataset"] == "testbed:addition/train/n=4/seed=0"
    # the same data as a JSONL file with an explicit reward gives the same table
    data = tmp_path / "data.jsonl"
    with open(data, "w") as f:
        for ex in ds:
            f.write(json.dumps(ex) + "\n")
    out2 = tmp_path / "table2.jsonl"
    assert main(["build-value-table", "--model", mpath, "--dataset", os.fspath(data), "--reward",
                 "trl_ext.testbed.tasks:addition_reward", "--num_samples", "4", "--output", os.fspath(out2),
                 "--seed", "1", "--max_new_tokens", "4", "--no_progress", "--device", "cpu"]) == 0
    assert rows_of(out2) == rows_of(out)
    # ... and so does a parquet file with the reward given as path/to/file.py:function (one resolver everywhere)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([dict(ex) for ex in ds]), tmp_path / "data.parquet")
    (tmp_path / "rw.py").write_text("from trl_ext.testbed.tasks import addition_reward\n")
    out3 = tmp_path / "table3.jsonl"
    assert main(["build-value-table", "--model", mpath, "--dataset", os.fspath(tmp_path / "data.parquet"),
                 "--reward", f"{tmp_path}/rw.py:addition_reward", "--num_samples", "4", "--output", os.fspath(out3),
                 "--seed", "1", "--max_new_tokens", "4", "--no_progress", "--device", "cpu"]) == 0
    assert load_value_table(out3).content_hash == table.content_hash
    # bad input -> exit 2 with a message
    capsys.readouterr()
    assert main(["build-value-table", "--model", mpath, "--dataset", os.fspath(data), "--reward", "nomodule_xyz:f",
                 "--output", os.fspath(tmp_path / "x.jsonl"), "--no_progress"]) == 2
    assert "cannot import module" in capsys.readouterr().err
    assert main(["build-value-table", "--model", mpath, "--dataset", os.fspath(data),
                 "--output", os.fspath(tmp_path / "x.jsonl")]) == 2
    assert main(["build-value-table", "--model", mpath, "--task", "addition", "--num_samples", "3",
                 "--output", os.fspath(out), "--no_progress", "--num_prompts", "4"]) == 2  # other settings
    assert "cannot resume" in capsys.readouterr().err
    assert main(["build-value-table", "--model", mpath, "--task", "addition", "--num_samples", "3",
                 "--output", os.fspath(out), "--no_progress", "--num_prompts", "2", "--overwrite",
                 "--max_new_tokens", "3"]) == 0
    assert len(load_value_table(out)) == 2


def test_cli_reward_from_file(tmp_path):
    from trl_ext.priors.value_table_cli import load_reward

    f = tmp_path / "myreward.py"
    f.write_text("def score(prompts, completions, **kw):\n    return [0.5] * len(prompts)\nNOT_CALLABLE = 3\n")
    assert load_reward(f"{f}:score")(["a"], ["b"]) == [0.5]
    for spec, match in ((f"{f}:missing", "no attribute"), (f"{f}:NOT_CALLABLE", "not callable"),
                        ("nocolon", "must look like 'package.module:function'"), (f"{tmp_path}/nope.py:f", "not found")):
        with pytest.raises(ValueError, match=match):
            load_reward(spec)


def test_progress_fallback_prints_without_tqdm(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # makes `from tqdm.auto import tqdm` raise ImportError
    bar = value_table_sampling.Progress(20, True)
    for _ in range(20):
        bar.update(1)
    bar.close()
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("value table:")]
    assert 2 <= len(lines) <= 12 and lines[-1].startswith("value table: 20/20")
    silent = value_table_sampling.Progress(5, False)
    silent.update(5)
    assert capsys.readouterr().err == ""

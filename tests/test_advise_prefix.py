"""Tests of PAIR prefix informativeness in ``trl-ext advise`` (``trl_ext.advise.prefix``; ``docs/advise.md``, E1-E4).

The metrics against brute force; the settings against the installed ``PAIRConfig`` and the feature function against
PAIR's ``prefix_features`` (``trl_ext.trainers.pair.heads``); out-of-fold heads on synthetic features with a planted informative or prompt-only
signal; end to end on the tiny testbed model with a reward decided by the first completion token (informative
prefix) and with the planted hash reward of ``test_advise_cli`` (uninformative prefix); the PAIR rule.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from trl_ext.advise import prefix as px
from trl_ext.advise.recommend import AdviceWarning


# ------------------------------------------------------------------------------------------------ metrics
def _auc_brute(s, y):
    pos = [a for a, b in zip(s, y) if b == 1]
    neg = [a for a, b in zip(s, y) if b == 0]
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))


def test_within_group_auc_matches_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(30):
        n = int(rng.integers(4, 50))
        g = rng.integers(0, 5, size=n)
        y = rng.integers(0, 2, size=n)
        s = rng.integers(0, 3, size=n).astype(float) if trial % 2 else rng.random(n)
        wins = pairs = 0.0
        for gid in np.unique(g):
            sel = g == gid
            if 0 < y[sel].sum() < sel.sum():
                pp = int(y[sel].sum()) * int((1 - y[sel]).sum())
                wins += _auc_brute(s[sel], y[sel]) * pp
                pairs += pp
        out = px.within_group_auc(s, y, g)
        assert out["pairs"] == pairs
        if pairs:
            assert out["auc"] == pytest.approx(wins / pairs, abs=1e-12)
        else:
            assert math.isnan(out["auc"])
    # a prompt-only score (constant within each group) has within-group AUC exactly 0.5, whatever its pooled AUC
    g = np.repeat(np.arange(6), 4)
    y = np.array([1, 1, 1, 0, 1, 0, 0, 0] * 3)
    s = np.repeat(np.linspace(0.1, 0.9, 6), 4)
    assert px.within_group_auc(s, y, g)["auc"] == 0.5


def test_binary_metrics_with_a_base_rate_per_sample():
    m = px.binary_prediction_metrics([0.9, 0.2, 0.6, 0.4], [1, 0, 0, 1], base_rate=[0.5, 0.5, 0.25, 0.25])
    assert m["brier"] == pytest.approx((0.01 + 0.04 + 0.36 + 0.36) / 4)
    assert m["base_brier"] == pytest.approx((0.25 + 0.25 + 0.0625 + 0.5625) / 4)
    assert m["auc"] == pytest.approx(0.75)


def test_score_predictions_intervals_and_nonbinary():
    rng = np.random.default_rng(3)
    g = np.repeat(np.arange(40), 8)
    y = (rng.random(g.size) < 0.4).astype(float)
    p = np.clip(0.4 + 0.3 * (y - 0.4) + 0.1 * rng.standard_normal(g.size), 0.01, 0.99)
    out = px.score_predictions(p, y, np.full(g.size, 0.4), g, binary=True, n_resamples=300)
    for key in ("auc", "within_prompt_auc", "brier", "base_brier", "brier_skill"):
        e = out[key]
        assert e["low"] <= e["value"] <= e["high"], key
    assert out["auc"]["value"] == pytest.approx(px.auc(p, y))
    assert out["within_prompt_auc"]["low"] > 0.7 and out["brier_skill"]["value"] > 0
    nb = px.score_predictions(p, np.clip(y * 0.8 + 0.1, 0, 1), np.full(g.size, 0.4), g, binary=False,
                              n_resamples=100)
    assert math.isnan(nb["auc"]["value"]) and "binary" in nb["note"] and math.isfinite(nb["brier"]["value"])


# ------------------------------------------------------------------------------------------------ PAIR's settings
def test_settings_are_pair_configs_defaults(tmp_path):
    from trl_ext.trainers.pair import PAIRConfig, PrefixProbeRollouts

    fields = PAIRConfig.__dataclass_fields__
    assert {k: fields[f].default for k, f in (("hidden", "pair_head_hidden"), ("lr", "pair_head_lr"),
                                              ("replay_size", "pair_replay_size"),
                                              ("min_labels", "pair_head_min_labels"),
                                              ("fit_steps", "pair_head_fit_steps"),
                                              ("fit_batch_size", "pair_head_batch_size"),
                                              ("summary_last_k", "pair_summary_last_k"))} == px.HEAD_DEFAULTS
    assert fields["pair_snap_window"].default == 0
    for L in (2, 9, 16, 64, 73, 512, 4096):
        cfg = PAIRConfig(output_dir=str(tmp_path), max_completion_length=L, use_cpu=True, report_to="none",
                         num_generations=2, per_device_train_batch_size=2)
        assert px.default_tau(L) == cfg.pair_tau, L
    assert px.probe_lengths(73) == {"0.5x": 4, "1x": 9, "2x": 18}
    assert px.probe_lengths(12) == {"0.5x": 1, "1x": 1, "2x": 2}
    assert px.probe_lengths(4096, (0.5, 1.0, 32.0)) == {"0.5x": 128, "1x": 256, "32x": 4095}

    for comp in ([1, 2, 3, 4], [1, 7], [1, 2, 7, 3], [7], [1, 2, 3, 7], []):
        for t_len in (1, 2, 3):
            probe, fin, cost = px.probe_split(comp, t_len, [7])
            assert fin == PrefixProbeRollouts.is_finished((7,), comp[:t_len], t_len)
            assert probe == comp[:t_len] and cost == len(comp) - len(probe)
    with pytest.raises(ValueError, match="max_new_tokens >= 2"):
        px.default_tau(1)


def test_features_equal_pair_trainer_features(tmp_path):
    """``hidden_state_features`` is PAIR's ``prefix_features`` (``trl_ext.trainers.pair.heads``) without a trainer (same summary, padding and
    positions)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.testbed import get_reward_funcs, make_dataset, save_tiny_model
    from trl_ext.trainers.pair import PAIRConfig, PAIRTrainer

    torch.set_num_threads(1)
    path = save_tiny_model(str(tmp_path / "m"), seed=0)
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    rows = [dict(r) for r in make_dataset("addition", 4, seed=0)]
    cfg = PAIRConfig(output_dir=str(tmp_path / "o"), num_generations=2, per_device_train_batch_size=2,
                     max_completion_length=16, max_steps=1, use_cpu=True, bf16=False, report_to="none",
                     save_strategy="no", disable_tqdm=True, beta=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = PAIRTrainer(model=model, reward_funcs=get_reward_funcs("addition"), args=cfg,
                              train_dataset=Dataset.from_list(rows), processing_class=tok)
    seqs = [tok(text=t)["input_ids"] for t in ("12+34=46", "7=", "123+456=579\n9+9=18")]
    assert len({len(s) for s in seqs}) == 3
    ours = px.hidden_state_features(model, tok.pad_token_id)(seqs)
    theirs = trainer.rollout_strategy.features(seqs)
    assert ours.shape == theirs.shape == (3, model.config.hidden_size)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    # one forward pass for every probe length gives the per-probe features (causal attention)
    eos = [tok.eos_token_id]
    prompts = [tok(text=r["prompt"])["input_ids"] for r in rows[:3]]
    digits = tok(text="0123456789012345678")["input_ids"]
    comps = [[digits[:17], [digits[2], eos[0]]], [digits[3:6], [digits[1]]], [[digits[4]] * 30, digits[5:7] + eos]]
    shared = px.shared_forward_features(model, tok.pad_token_id, prompts, comps, [1, 2, 17], eos, batch_size=4)
    fn = px.hidden_state_features(model, tok.pad_token_id)
    for t in (1, 2, 17):
        f, fin, cost = px.probe_features(fn, prompts, comps, t, eos, batch_size=5)
        torch.testing.assert_close(shared[t][0], f, rtol=1e-5, atol=1e-5)
        assert shared[t][1].tolist() == fin.tolist() and shared[t][2].tolist() == cost.tolist()


# ------------------------------------------------------------------------------------------------ planted signal
def _synthetic(informative: bool, n=64, k=8, seed=0):
    import torch

    rng = np.random.default_rng(seed)
    p = rng.uniform(0.1, 0.9, size=n)
    r = (rng.random((n, k)) < p[:, None]).astype(float)
    f = np.zeros((n * k, 8))
    f[:, 0] = np.repeat(np.log(p / (1 - p)), k)  # the prompt's difficulty, known to both
    f[:, 1] = (r.reshape(-1) - 0.5) * (2.0 if informative else 0.0) + 0.5 * rng.standard_normal(n * k)
    f[:, 2:] = rng.standard_normal((n * k, 6))
    return torch.tensor(f, dtype=torch.float32), r


@pytest.mark.parametrize("informative", [True, False])
def test_out_of_fold_heads_see_a_planted_prefix_signal(informative):
    feats, r = _synthetic(informative)
    costs = np.full(r.size, 5.0)
    oof = px.out_of_fold_predictions(feats, r, costs, n_folds=2, seed=0, head_batch_prompts=8)
    assert np.all(np.isfinite(oof["p_hat"])) and sorted(set(oof["fold"].tolist())) == [0, 1]
    assert oof["refreshes"] == [4, 4]
    groups = np.repeat(np.arange(r.shape[0]), r.shape[1])
    s = px.score_predictions(oof["p_hat"], r.reshape(-1), oof["base_rate"], groups, binary=True, n_resamples=300)
    w = s["within_prompt_auc"]
    assert s["auc"]["value"] > 0.65  # the prompt's difficulty alone separates prompts
    if informative:
        assert w["low"] > 0.75 and s["brier_skill"]["value"] > 0.1
    else:
        assert w["low"] < 0.5 < w["high"], w


# ------------------------------------------------------------------------------------------------ end to end
def first_token_reward(prompts, completions, **kwargs):
    """1 when the completion starts with a digit 0-4: decided by the first generated token (an informative
    1-token prefix), independent of the prompt."""
    return [float(bool(c) and c[0] in "01234") for c in completions]


@pytest.fixture(scope="module")
def tiny():
    import torch

    from trl_ext.testbed import build_tiny_model, build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    return build_tiny_model(tok, seed=0), tok


def test_advise_measures_an_informative_first_token(tiny):
    from trl_ext.advise import advise
    from trl_ext.testbed import make_dataset

    model, tok = tiny
    rows = [dict(r) for r in make_dataset("addition", 64, seed=0)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AdviceWarning)
        adv = advise(model, tok, rows, [first_token_reward], num_prompts=None, num_samples=16, max_new_tokens=12,
                     seed=0, n_resamples=300)
    ph = adv.prefix_heads
    assert ph["measured"] is True and ph["default_tau"] == 1 and ph["n_folds"] == 2
    assert {n: v["probe_tokens"] for n, v in ph["probes"].items()} == {"0.5x": 1, "1x": 1, "2x": 2}
    one = ph["probes"]["1x"]
    assert one["all"]["n"] == 64 * 16 and one["refreshes"] == [4, 4]
    assert one["unfinished"]["n"] == round(64 * 16 * (1 - one["share_finished_in_probe"]))
    assert 0.0 < adv.pass_rates["mean"].value < 1.0
    assert one["unfinished"]["within_prompt_auc"]["low"] > 0.9, one["unfinished"]
    assert one["unfinished"]["brier_skill"]["value"] > 0.05
    # the reward ignores the prompt: the prompt-only reference knows nothing (its within-prompt AUC is 0 by design)
    ref = ph["prompt_only"]["prompt_loo_mean"]
    assert ref["auc"]["value"] < 0.6 and ref["within_prompt_auc"]["value"] == 0.0
    assert adv.alternatives["pair"]["prefix_informative"] is True
    assert adv.alternatives["pair"]["pays_here"] is False  # completions are a few tokens, not >= 256
    assert adv.alternatives["pair"]["failing"] == ["completions are short"]
    assert any("PAIR is not in its regime here: completions are short." in r for r in adv.reasons)
    assert adv.to_dict()["prefix_heads"]["probes"]["1x"]["all"]["auc"]["value"] is not None


def test_advise_prefix_heads_on_an_uninformative_prefix_and_off(tiny):
    from test_advise_cli import planted_reward, planted_rows

    from trl_ext.advise import advise

    model, tok = tiny
    rows = planted_rows(42)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AdviceWarning)
        adv = advise(model, tok, rows, [planted_reward], num_prompts=None, num_samples=8, max_new_tokens=12, seed=1,
                     n_resamples=300)
        off = advise(model, tok, rows[:6], [planted_reward], num_samples=4, max_new_tokens=6, n_resamples=200,
                     prefix_heads=False)
    w = adv.prefix_heads["probes"]["1x"]["unfinished"]["within_prompt_auc"]
    assert w["low"] < 0.5 < w["high"], w  # the hash reward cannot be read off a 1-token prefix
    assert adv.alternatives["pair"]["prefix_informative"] is False and adv.alternatives["pair"]["prefix_ranks"] is False
    assert any("does not rank a prompt's candidates better than chance" in r for r in adv.reasons)
    assert off.prefix_heads == {"measured": False, "reason": px_reason_off()}
    assert off.alternatives["pair"]["prefix_measured"] is False and "not measured" in off.alternatives["pair"]["why"]


def px_reason_off():
    from trl_ext.advise.sample import PREFIX_HEADS_OFF

    return PREFIX_HEADS_OFF["reason"]


# ------------------------------------------------------------------------------------------------ the PAIR rule
def _advice_with(mean_len: float, within_low: float, skill: float):
    from trl_ext.advise.recommend import measure, recommend

    rng = np.random.default_rng(0)
    r = (rng.random((40, 8)) < rng.uniform(0.1, 0.9, size=(40, 1))).astype(float)
    adv = measure(r, np.full(r.shape, mean_len), max_new_tokens=2048, n_resamples=200)
    est = {"value": within_low + 0.05, "low": within_low, "high": within_low + 0.1}
    adv.prefix_heads = {"measured": True, "default_tau": 256, "probes": {"1x": {
        "probe_tokens": 256, "share_finished_in_probe": 0.1,
        "unfinished": {"within_prompt_auc": est, "auc": est, "brier_skill": {"value": skill, "low": skill - 0.02,
                                                                             "high": skill + 0.02}}}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AdviceWarning)
        return recommend(adv)


def test_pair_rule_needs_long_completions_and_an_informative_prefix():
    yes = _advice_with(600.0, 0.62, 0.05)
    assert yes.alternatives["pair"]["pays_here"] is True
    assert yes.recommendation != "pair"  # an A/B trial, never the recommendation
    assert any("A/B trial of PAIRTrainer" in r for r in yes.reasons)
    assert _advice_with(600.0, 0.48, 0.05).alternatives["pair"]["pays_here"] is False   # within-prompt AUC ~ 0.5
    bad_skill = _advice_with(600.0, 0.62, -0.01).alternatives["pair"]  # ranks, but worse than the base rate
    assert bad_skill["pays_here"] is False and bad_skill["prefix_ranks"] is True
    assert bad_skill["failing"] == ["the head does not beat the base rate (Brier skill <= 0)"]
    assert _advice_with(100.0, 0.62, 0.05).alternatives["pair"]["pays_here"] is False   # short completions

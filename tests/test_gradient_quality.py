"""trl_ext.gradient_quality: exactness on a log-linear policy, the sketch's error against exact gradients of a
small model, each method's own rules and estimators, bad input, the command on 1 and 2 processes."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from trl_ext import estimators as E
from trl_ext.gradient_quality import (
    CountSketch,
    GradientPool,
    MethodHalf,
    cosine_error_bound,
    draw_updates,
    get_method,
    measure_gradient_quality,
    policy_row_weights,
    reference_gradient,
    tokens_to_target,
)
from trl_ext.gradient_quality.synthetic import LogLinearPolicy


# ------------------------------------------------------------------------------------------------ exactness
def test_reference_norm_is_unbiased_and_the_naive_norm_is_not():
    pol = LogLinearPolicy.random(n_prompts=3, n_outcomes=3, dim=5, seed=3)
    g2 = float(pol.gradient() @ pol.gradient())
    est, naive = [], []
    for seed in range(300):
        pool = pol.pool(8, seed=seed)
        try:
            r = reference_gradient(pool.rewards, pool.sketches, seed=seed)
        except ValueError as e:  # a draw whose eq. R3 came out <= 0: refused, never silently used
            assert "too noisy" in str(e) or "tied" in str(e)
            continue
        est.append(r.norm2)
        naive.append(r.naive_norm2)
    est, naive = np.array(est), np.array(naive)
    se = est.std() / np.sqrt(est.size)
    assert est.size > 250
    assert abs(est.mean() - g2) < 3.5 * se + 0.02 * g2
    assert naive.mean() > g2 + 5 * naive.std() / np.sqrt(naive.size)  # the bias eq. R3 removes


def _exact_grpo_g2_cosine(pol: LogLinearPolicy) -> float:
    """E[cos(update, g*)] for GRPO G = 2 at a 4-token budget (two groups, lengths 1), by enumeration."""
    p, s, g = pol.probs(), pol.scores(), pol.gradient()
    n, m = p.shape
    grpo = E.get_advantage_estimator("grpo")
    total = 0.0
    for i1, i2 in itertools.product(range(n), repeat=2):
        prompts = [i1, i1, i2, i2]
        for ys in itertools.product(range(m), repeat=4):
            pr = np.prod([p[a, y] for a, y in zip(prompts, ys)]) / n**2
            adv = grpo(np.array([pol.rewards[a, y] for a, y in zip(prompts, ys)]), np.array([0, 0, 1, 1])).advantages
            v = sum(adv[k] * s[prompts[k], ys[k]] for k in range(4))
            nv = np.linalg.norm(v)
            total += pr * (v @ g / (nv * np.linalg.norm(g)) if nv > 0 else 0.0)
    return total


def test_method_cosine_converges_to_the_enumerated_value():
    pol = LogLinearPolicy.random(n_prompts=3, n_outcomes=3, dim=5, seed=3)
    exact = _exact_grpo_g2_cosine(pol)
    res = measure_gradient_quality(pol.pool(3000, seed=1), ["grpo_g2"], budgets=[4], n_draws=6000,
                                   reference_samples=1500, table_samples=0, n_resamples=0, seed=1)
    cell = res["methods"]["grpo_g2"]["curve"][0]
    assert cell["tokens_mean"] == 4 and cell["decisions"]["groups"] == 2
    assert abs(cell["cosine"]["value"] - exact) < 0.03
    assert res["reference"]["pool_ceiling_cosine"] > 0.99


def test_corrected_cosine_is_unbiased_under_a_noisy_reference():
    pol = LogLinearPolicy.random(n_prompts=3, n_outcomes=3, dim=5, seed=3)
    exact = _exact_grpo_g2_cosine(pol)
    cos, naive = [], []
    for seed in range(40):
        res = measure_gradient_quality(pol.pool(400, seed=seed), ["grpo_g2"], budgets=[4], n_draws=300,
                                       reference_samples=12, table_samples=0, n_resamples=0, seed=seed)
        c = res["methods"]["grpo_g2"]["curve"][0]
        cos.append(c["cosine"]["value"])
        naive.append(c["naive_cosine"]["value"])
    cos, naive = np.array(cos), np.array(naive)
    assert abs(cos.mean() - exact) < 3.5 * cos.std() / np.sqrt(cos.size) + 0.01
    assert naive.mean() < exact - 3 * naive.std() / np.sqrt(naive.size)  # biased towards 0


def test_reference_and_methods_converge_as_the_pool_grows():
    pol = LogLinearPolicy.random(n_prompts=6, n_outcomes=4, dim=8, seed=1, max_length=5)
    ceilings = []
    for k in (24, 96, 768):
        res = measure_gradient_quality(pol.pool(k, seed=0), ["grpo_g4"], budgets=[40], n_draws=64,
                                       reference_samples=k // 3, table_samples=0, n_resamples=0)
        ceilings.append(res["reference"]["pool_ceiling_cosine"])
    err = [abs(1 - c) for c in ceilings]  # the corrected cosine is unbiased, so it may exceed 1 by noise
    assert err[-1] < 0.01 and err[-1] < err[0]


def test_relative_error_parts_add_up_and_intervals_cover_the_point():
    pol = LogLinearPolicy.random(n_prompts=6, n_outcomes=4, dim=8, seed=1, max_length=5)
    res = measure_gradient_quality(pol.pool(200, seed=0), ["grpo_g4", "reinforce_pp"], budgets=[20, 80],
                                   n_draws=200, reference_samples=40, table_samples=0, n_resamples=200)
    for m in ("grpo_g4", "reinforce_pp"):
        for c in res["methods"][m]["curve"]:
            rel, b, v = c["relative_error"]["value"], c["bias_part"]["value"], c["variance_part"]["value"]
            assert rel == pytest.approx(b + v, abs=1e-9)
            assert 0 <= v <= 1
            for key in ("cosine", "relative_error"):  # percentile intervals of a ratio need not hold the point
                lo, hi = c[key]["low"], c[key]["high"]
                assert lo < hi and lo - (hi - lo) <= c[key]["value"] <= hi + (hi - lo)
        cos = [c["cosine"]["value"] for c in res["methods"][m]["curve"]]
        assert cos[1] > cos[0]  # more tokens, a better direction
    assert res["best_grpo"] == "grpo_g4" and res["methods"]["grpo_g4"]["ratio_to_best_grpo"]["value"] == 1.0


def test_tokens_to_target():
    assert tokens_to_target([100, 200, 400], [0.1, 0.3, 0.5], 0.3) == pytest.approx(200)
    assert tokens_to_target([100, 400], [0.2, 0.4], 0.3) == pytest.approx(200)  # the log-token midpoint
    assert tokens_to_target([100, 200], [0.5, 0.6], 0.3) == 100
    assert tokens_to_target([100, 200], [0.1, 0.2], 0.3) == float("inf")
    assert tokens_to_target([200, 100], [0.3, 0.1], 0.3) == pytest.approx(200)  # sorted by tokens


# ------------------------------------------------------------------------------------------------ the sketch
@pytest.fixture(scope="module")
def tiny():
    import torch

    from trl_ext.testbed import build_tiny_model, build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    return build_tiny_model(tok, seed=0), tok


def _rows(tok, n_prompts=4, k=3, seed=0):
    rng = np.random.default_rng(seed)
    prompt_ids = [tok(f"{a}+{b}=")["input_ids"] for a, b in rng.integers(0, 50, size=(n_prompts, 2))]
    comps = [[rng.integers(3, 12, size=int(rng.integers(1, 6))).tolist() for _ in range(k)] for _ in prompt_ids]
    return prompt_ids, comps


def test_sketch_is_seeded_linear_and_within_its_error_bound_on_exact_gradients(tiny):
    from trl_ext.gradient_quality.collect import row_gradient_sketches, trainable_parameters

    model, tok = tiny
    prompt_ids, comps = _rows(tok, 6, 4)
    numels = [p.numel() for _, p in trainable_parameters(model)]
    d = 1024
    sk = CountSketch(d, numels, seed=5)
    z, full = row_gradient_sketches(model, prompt_ids, comps, sk, return_full=True)
    assert z.shape == (24, d) and full.shape == (24, sum(numels))
    np.testing.assert_allclose(CountSketch(d, numels, seed=5).project(
        [__import__("torch").tensor(x) for x in np.split(full[3], np.cumsum(numels)[:-1])]).numpy(), z[3], rtol=1e-9)
    c = np.random.default_rng(0).normal(size=24)  # linear: a weighted sum of sketches is the sketch of the sum
    np.testing.assert_allclose(c @ z, CountSketch(d, numels, seed=5).project(
        [__import__("torch").tensor(x) for x in np.split(c @ full, np.cumsum(numels)[:-1])]).numpy(), rtol=1e-8,
        atol=1e-10)
    fn = full / np.linalg.norm(full, axis=1, keepdims=True)
    zn = z / np.linalg.norm(full, axis=1, keepdims=True)
    iu = np.triu_indices(24, 1)
    err = (zn @ zn.T - fn @ fn.T)[iu]  # sketched minus exact inner products of unit vectors (eq. S1)
    bound = cosine_error_bound(d)
    assert np.sqrt(np.mean(err**2)) <= bound
    assert np.abs(err).max() <= 5 * bound
    norm_ratio = np.linalg.norm(z, axis=1) ** 2 / np.linalg.norm(full, axis=1) ** 2
    assert np.abs(norm_ratio - 1).max() <= 5 * bound
    assert not np.allclose(CountSketch(d, numels, seed=6).project(
        [__import__("torch").tensor(x) for x in np.split(full[3], np.cumsum(numels)[:-1])]).numpy(), z[3])


def test_row_gradients_sum_to_the_gradient_of_the_batch_loss(tiny):
    """sum_k c_k z_k equals the sketched gradient of sum_k c_k log pi(y_k | x_k) from one backward pass: the
    per-row gradients are those of the sequence log-probabilities TRL's loss is built from."""
    import torch

    from trl_ext.gradient_quality.collect import row_gradient_sketches, trainable_parameters

    model, tok = tiny
    prompt_ids, comps = _rows(tok, 3, 2, seed=1)
    params = [p for _, p in trainable_parameters(model)]
    sk = CountSketch(512, [p.numel() for p in params], seed=0)
    z = row_gradient_sketches(model, prompt_ids, comps, sk, temperature=0.7)
    c = np.array([0.5, -1.0, 2.0, 0.3, -0.2, 1.1])
    model.eval()
    total = 0.0
    for k, (p_ids, c_ids) in enumerate((p, x) for p, xs in zip(prompt_ids, comps) for x in xs):
        ids = torch.tensor([p_ids + c_ids])
        logits = model(input_ids=ids).logits[0, len(p_ids) - 1:-1] / 0.7
        total = total + c[k] * torch.log_softmax(logits, -1).gather(1, torch.tensor(c_ids)[:, None]).sum()
    grads = torch.autograd.grad(total, params)
    np.testing.assert_allclose(c @ z, sk.project(grads).numpy(), rtol=1e-4, atol=1e-5)  # float32 model


# ------------------------------------------------------------------------------------------------ the methods
def _half(rewards, lengths=None, table_p=None, loss_type="dapo", pair=None):
    r = np.asarray(rewards, dtype=float)
    l_ = np.full(r.shape, 3) if lengths is None else np.asarray(lengths)
    return MethodHalf(rewards=r, lengths=l_, max_completion_length=8, table_p=table_p, pair=pair,
                      loss_type=loss_type)


def test_policy_row_weights_follow_trl_loss_families():
    from trl_ext.gradient_quality import methods
    from trl_ext.trainers import _trl_compat as compat

    lens = np.array([2, 4])
    np.testing.assert_allclose(policy_row_weights("grpo", lens, 8), [1 / 4, 1 / 8])
    np.testing.assert_allclose(policy_row_weights("dapo", lens, 8), [1 / 6, 1 / 6])
    np.testing.assert_allclose(policy_row_weights("dr_grpo", lens, 8), [1 / 16, 1 / 16])
    with pytest.raises(ValueError, match="loss_type"):
        policy_row_weights("ppo", lens, 8)
    assert set(methods.SEQUENCE_LEVEL_LOSSES) | {"dr_grpo"} == set(compat.SEQUENCE_LEVEL_LOSSES)
    assert set(methods.TOKEN_LEVEL_LOSSES) == set(compat.GLOBAL_TOKEN_LEVEL_LOSSES + compat.LOCAL_TOKEN_LEVEL_LOSSES)


@pytest.mark.parametrize("name,registry", [("grpo_g4", "grpo"), ("dapo_g4", "grpo"), ("reinforce_pp", "reinforce_pp"),
                                           ("basis", "basis"), ("v05", "v05"),
                                           ("james_stein_g4", "james_stein")])
def test_methods_call_the_registered_estimator(monkeypatch, name, registry):
    calls = []
    orig = E.ADVANTAGE_ESTIMATORS[registry]

    def spy(*a, **k):
        calls.append(1)
        return orig(*a, **k)

    monkeypatch.setitem(E.ADVANTAGE_ESTIMATORS, registry, spy)
    rng = np.random.default_rng(0)
    half = _half(rng.integers(0, 2, size=(6, 8)), table_p=np.full(6, 0.5))
    fn, fixed = get_method(name)
    d = fn(half, np.random.default_rng(1), 30, **fixed)
    assert calls and d.tokens >= 30 and d.rows.size > 0


def test_v05_rounds_come_from_osla(monkeypatch):
    steps = []
    orig = E.v05.osla_step

    def spy(*a, **k):
        steps.append(1)
        return orig(*a, **k)

    monkeypatch.setattr(E.v05, "osla_step", spy)
    # a prior that is badly wrong (says 0.95 where every prompt has pass rate 0.5): OSLA adds rollouts
    r = np.tile([0, 1], (4, 8))
    fn, _ = get_method("v05")
    d = fn(_half(r, table_p=np.full(4, 0.95)), np.random.default_rng(0), 10, batch_prompts=4)
    assert steps and d.info["rollouts_per_prompt"] > 4 and d.info["rounds"] >= 1


def test_dapo_pays_and_drops_tied_groups():
    r = np.vstack([np.zeros((3, 8)), np.tile([0, 1], (3, 4))])  # 3 never-solved prompts, 3 mixed ones
    fn, fixed = get_method("dapo_g4")
    d = fn(_half(r), np.random.default_rng(0), 200, **fixed)
    assert d.info["tied_groups"] > 0 and d.info["dropped_tokens"] == 12 * d.info["tied_groups"]
    assert d.tokens == 12 * d.info["groups"] and set((d.rows // 8).tolist()) <= {3, 4, 5}
    d = fn(_half(np.zeros((3, 8))), np.random.default_rng(0), 50, **fixed)
    assert d.rows.size == 0 and d.tokens >= 50  # every group tied: paid for, no update


def test_pair_pays_probes_and_selected_continuations():
    r = np.tile([0.0, 1.0], (4, 4))  # 4 prompts x 8 samples: a group of 8 holds every sample
    lengths = np.full(r.shape, 10)
    lengths[:, 0] = 2  # finished within the probe
    pair = {"p_hat": np.full(r.shape, 0.5), "cost_hat": np.full(r.shape, 6.0), "finished": lengths <= 4,
            "probe_tokens": 4}
    fn, _ = get_method("pair")
    d = fn(_half(r, lengths=lengths, pair=pair), np.random.default_rng(0), 100, group_size=8)
    groups = d.info["groups"]
    probes = groups * (2 + 7 * 4)
    cont = (d.rows.size - groups) * 6  # the finished candidate is always "selected" at no continuation cost
    assert d.tokens == probes + cont
    assert 0 < d.info["inclusion_mean"] <= 1


def test_a_group_larger_than_the_method_half_is_a_clear_error_and_other_methods_still_run():
    pol = LogLinearPolicy.random(n_prompts=4, n_outcomes=3, dim=4, seed=0)
    res = measure_gradient_quality(pol.pool(16, seed=0), ["grpo_g16", "grpo_g2", "basis"], budgets=[4, 8],
                                   n_draws=8, reference_samples=8, table_samples=0, n_resamples=0)
    assert "16 distinct samples" in res["methods"]["grpo_g16"]["error"]
    assert "value table" in res["methods"]["basis"]["error"]
    assert res["methods"]["grpo_g2"]["error"] is None and res["ranking"] == ["grpo_g2"]


def test_bad_pools_are_clear_errors():
    with pytest.raises(ValueError, match="empty"):
        GradientPool(rewards=np.zeros((0, 4)), lengths=np.zeros((0, 4)), sketches=np.zeros((0, 4, 2)),
                     max_completion_length=4)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        GradientPool(rewards=np.full((2, 4), 2.0), lengths=np.ones((2, 4)), sketches=np.zeros((2, 4, 2)),
                     max_completion_length=4)
    tied = GradientPool(rewards=np.ones((3, 16)), lengths=np.ones((3, 16)), sketches=np.ones((3, 16, 2)),
                        max_completion_length=4)
    with pytest.raises(ValueError, match="tied reference rewards"):
        measure_gradient_quality(tied, ["grpo_g2"], budgets=[4], n_draws=4, n_resamples=0)
    pol = LogLinearPolicy.random(n_prompts=3, n_outcomes=3, dim=4, seed=0)
    with pytest.raises(ValueError, match="no method half"):
        measure_gradient_quality(pol.pool(10, seed=0), ["grpo_g2"], reference_samples=8, table_samples=2)
    with pytest.raises(ValueError, match="reference_samples must be >= 4"):
        measure_gradient_quality(pol.pool(10, seed=0), ["grpo_g2"], reference_samples=2)
    with pytest.raises(ValueError, match="unknown method"):
        measure_gradient_quality(pol.pool(20, seed=0), ["grpo_g2", "ppo"], reference_samples=8, table_samples=0,
                                 n_resamples=0, budgets=[4])


def test_unscorable_rollouts_are_left_out_of_the_reference_and_counted():
    pol = LogLinearPolicy.random(n_prompts=4, n_outcomes=3, dim=4, seed=0)
    pool = pol.pool(20, seed=0)
    pool.rewards[0, :] = np.nan  # prompt 0 unscorable
    r = reference_gradient(pool.rewards[:, :8], pool.sketches[:, :8])
    assert r.n_short_prompts == 1 and np.allclose(r.prompt_terms[0], 0)


def test_draw_updates_are_reproducible():
    pol = LogLinearPolicy.random(n_prompts=4, n_outcomes=3, dim=4, seed=0, max_length=4)
    pool = pol.pool(12, seed=0)
    half = _half(pool.rewards, pool.lengths)
    a = draw_updates(half, pool.sketches, "grpo_g4", 20, 5, seed=3)
    b = draw_updates(half, pool.sketches, "grpo_g4", 20, 5, seed=3)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


# ------------------------------------------------------------------------------------------------ the command


def _inputs(tmp_path):
    from test_advise_cli import REWARD_SOURCE  # the planted-difficulty reward of the advise tests

    from trl_ext.testbed import make_dataset, save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model")
    rows = [dict(r) for r in make_dataset("addition", 12, seed=0)]
    for i, r in enumerate(rows):
        r["p_true"] = (0.1, 0.3, 0.5, 0.7)[i % 4]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reward = tmp_path / "rewards.py"
    reward.write_text(REWARD_SOURCE)
    return ["--model", model_dir, "--dataset", str(data), "--reward", f"{reward}:planted_reward",
            "--num_prompts", "12", "--num_samples", "24", "--max_new_tokens", "6", "--draws", "8",
            "--n_resamples", "50", "--budgets", "20", "60", "--no_progress", "--sketch_dim", "256",
            "--pair_group_size", "8", "--methods", "grpo_g2", "grpo_g8", "reinforce_pp", "dapo_g8", "v05", "basis",
            "pair"]


def _stable(d: dict) -> dict:
    d = json.loads(json.dumps(d))
    d.pop("cost"), d.pop("measure_wall_s"), d["pool"].pop("wall_s"), d["pool"].pop("processes")
    d["pool"].pop("command"), d["config"].pop("command"), d["config"].pop("pool_command")  # --output differs
    for m in d["methods"].values():
        m.pop("wall_s", None)
    return d


def test_cli_end_to_end_json_plot_and_bad_input(tmp_path, capsys):
    from trl_ext.cli import main

    args = _inputs(tmp_path)
    out, png, pool = tmp_path / "gq.json", tmp_path / "gq.png", tmp_path / "pool.npz"
    assert main(["gradient-quality", *args, "--output", str(out), "--plot", str(png), "--save_pool", str(pool)]) == 0, \
        capsys.readouterr().err
    d = json.loads(out.read_text())
    assert d["schema"] == "trl_ext.gradient_quality/v1" and d["pool"]["num_prompts"] == 12
    assert d["cost"]["backward_passes"] == 12 * 24 and d["pool"]["tokens"]["total"] > 0
    assert set(d["methods"]) == {"grpo_g2", "grpo_g8", "reinforce_pp", "dapo_g8", "v05", "basis", "pair"}
    for m, r in d["methods"].items():
        assert r["error"] is None, (m, r["error"])
        assert len(r["curve"]) == 2 and r["curve"][0]["tokens_mean"] >= 20
    assert os.path.getsize(png) > 1000
    assert "ranking" in capsys.readouterr().out
    # the saved pool measured again: the same numbers without a model, and other methods / budgets on demand
    again = tmp_path / "again.json"
    meth = args.index("--methods")
    assert main(["gradient-quality", "--pool", str(pool), "--draws", "8", "--n_resamples", "50", "--budgets", "20", "60",
                 "--pair_group_size", "8", "--methods", *args[meth + 1:], "--output", str(again)]) == 0, \
        capsys.readouterr().err
    a2 = json.loads(again.read_text())
    assert a2["config"]["pool_file"] == "pool.npz" and a2["config"]["dataset"] == d["config"]["dataset"]
    for m in d["methods"]:
        assert a2["methods"][m]["curve"][0]["cosine"]["value"] == pytest.approx(
            d["methods"][m]["curve"][0]["cosine"]["value"], rel=1e-4)  # sketches stored in float32
    assert main(["gradient-quality", "--pool", str(tmp_path / "train.jsonl")]) == 2
    assert "cannot read a gradient-quality pool" in capsys.readouterr().err
    assert main(["gradient-quality", "--model", "x"]) == 2
    assert "--pool" in capsys.readouterr().err
    assert main(["gradient-quality", *args, "--reference_samples", "2"]) == 2
    assert "--reference_samples must be >= 4" in capsys.readouterr().err
    assert main(["gradient-quality", *args, "--num_samples", "10"]) == 2
    assert "no method half" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_two_processes_give_the_one_process_result(tmp_path):
    args = _inputs(tmp_path)
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "trl_ext.cli", "gradient-quality", *args]
    p = subprocess.run([*cli, "--output", str(one)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    p = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "trl_ext.cli", "gradient-quality",
                        *args, "--output", str(two)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert b["cost"]["processes"] == 2 and a["cost"]["processes"] == 1
    assert _stable(a) == _stable(b)


def test_batched_linear_per_sample_gradients_equal_the_row_loop_on_a_lora_adapter():
    import torch
    from peft import LoraConfig, get_peft_model

    from trl_ext.gradient_quality.collect import row_gradient_sketches, trainable_parameters
    from trl_ext.testbed import build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = get_peft_model(build_tiny_model(tok, seed=0), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                     lora_dropout=0.0))
    for n, p in model.named_parameters():  # a trained adapter: lora_B away from its zero init
        if "lora_B" in n:
            p.data.normal_(0, 0.05)
    prompt_ids, comps = _rows(tok, 3, 3, seed=2)
    comps[1][2] = []  # an empty completion: a zero row on both paths
    sk = CountSketch(256, [p.numel() for _, p in trainable_parameters(model)], seed=1)
    fast, fast_full = row_gradient_sketches(model, prompt_ids, comps, sk, temperature=0.8, per_sample="linear",
                                            batch_rows=4, pad_token_id=0, return_full=True)
    slow, slow_full = row_gradient_sketches(model, prompt_ids, comps, sk, temperature=0.8, per_sample="loop",
                                            return_full=True)
    np.testing.assert_allclose(fast_full, slow_full, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(fast, slow, rtol=1e-4, atol=1e-6)
    assert np.abs(slow_full[5]).max() == 0 and np.abs(slow_full[0]).max() > 0
    with pytest.raises(ValueError, match="nn.Linear"):
        row_gradient_sketches(build_tiny_model(tok, seed=0), prompt_ids, comps, sk, per_sample="linear")


# ------------------------------------------------------------------------------------------------ validation script
def _validation_module():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                        "gradient_quality_validation.py")
    spec = importlib.util.spec_from_file_location("gradient_quality_validation", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_validation_statistics_and_the_committed_table(tmp_path):
    v = _validation_module()
    s = v.spearman_with_intervals([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    assert s["rho"] == pytest.approx(1.0) and s["p_exact"] == pytest.approx(2 / 120)
    s = v.spearman_with_intervals([1, 2, 3, 4, 5, 6], [3, 1, 2, 6, 4, 5])
    assert -1 < s["ci95"][0] < s["rho"] < s["ci95"][1] < 1
    curve = [{"tokens_mean": 100.0, "budget": 100, "cosine": {"value": 0.2, "low": 0.1, "high": 0.3}},
             {"tokens_mean": 400.0, "budget": 400, "cosine": {"value": 0.4, "low": 0.3, "high": 0.5}}]
    (val, lo, hi), outside = v.at_tokens(curve, "cosine", 200.0)
    assert val == pytest.approx(0.3) and lo == pytest.approx(0.2) and not outside
    assert v.at_tokens(curve, "cosine", 50.0) == ([0.2, 0.1, 0.3], True)
    # the committed results reproduce the committed table
    assert v.main(["--output_dir", str(tmp_path)]) == 0
    committed = os.path.join(v.RES, "validation.md")
    assert (tmp_path / "validation.md").read_text() == open(committed).read()

"""Tests for trl_ext.estimators.pair_heads (PAIR Section 4.2, Eq. 5-7, Appendix C)."""

from __future__ import annotations

import io
import math

import pytest
import torch

from trl_ext.estimators import pair_heads as H

torch.set_num_threads(1)


def synthetic(n: int, dim: int = 8, seed: int = 0):
    """Prefix summaries u; success prob sigmoid(2 u_0); remaining cost exp(5 + 0.5 u_1)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, dim, generator=g)
    p = torch.sigmoid(2.0 * u[:, 0])
    r = (torch.rand(n, generator=g) < p).float()
    c = torch.exp(5.0 + 0.5 * u[:, 1] + 0.1 * torch.randn(n, generator=g))
    pi = 0.2 + 0.8 * torch.rand(n, generator=g)
    return u, r, c, pi, p


def test_head_architecture_and_output_ranges():
    head = H.make_head(12)
    kinds = [type(m) for m in head]
    assert kinds == [torch.nn.LayerNorm, torch.nn.Linear, torch.nn.SiLU, torch.nn.Linear]
    assert head[1].out_features == 256 and head[3].out_features == 1
    heads = H.PrefixHeads(12, seed=0)
    pred = heads.predict(torch.randn(5, 12) * 100)
    assert pred.p_hat.shape == (5,) and pred.cost_hat.shape == (5,)
    assert torch.all((pred.p_hat > 0) & (pred.p_hat < 1)) and torch.all(pred.cost_hat > 0)
    assert pred.n_nonfinite == 0


def test_seed_does_not_touch_global_rng_and_is_reproducible():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = H.PrefixHeads(6, hidden=16, seed=7)
    after = torch.rand(1)
    assert torch.equal(before, after)
    b = H.PrefixHeads(6, hidden=16, seed=7)
    x = torch.randn(3, 6)
    assert torch.equal(a.predict(x).p_hat, b.predict(x).p_hat)


def test_ipw_losses_match_eq6_eq7():
    p = torch.tensor([0.2, 0.9, 0.5])
    r = torch.tensor([0.0, 1.0, 1.0])
    pi = torch.tensor([0.5, 1.0, 0.25])
    expected = (0.2**2 / 0.5 + 0.1**2 / 1.0 + 0.5**2 / 0.25) / 3
    assert float(H.ipw_brier_loss(p, r, pi)) == pytest.approx(expected, rel=1e-6)
    c_hat = torch.tensor([100.0, 10.0, 1.0])
    c = torch.tensor([50.0, 10.0, 0.0])  # 0 remaining tokens is floored at 1
    expected_c = (math.log(2) ** 2 / 0.5 + 0.0 + 0.0) / 3
    assert float(H.ipw_log_cost_loss(c_hat, c, pi)) == pytest.approx(expected_c, rel=1e-6)
    with pytest.raises(ValueError):
        H.ipw_brier_loss(p, r, torch.tensor([0.0, 1.0, 0.5]))


def test_replay_window_is_fifo_with_capacity():
    heads = H.PrefixHeads(4, hidden=8, replay_size=10, min_labels=5)
    assert not heads.ready
    for k in range(4):
        heads.add_labels(torch.full((4, 4), float(k)), torch.zeros(4), torch.ones(4), torch.ones(4))
    assert heads.n_labels == 10 and heads.n_seen == 16 and heads.ready
    # the oldest 6 rows (batch 0 and half of batch 1) were dropped
    assert heads._feat[:, 0].tolist() == [1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rewards=torch.tensor([0.0, float("nan")])), "NaN"),
        (dict(rewards=torch.tensor([0.0, 2.0])), r"\[0, 1\]"),
        (dict(costs=torch.tensor([1.0, -1.0])), ">= 0"),
        (dict(inclusion=torch.tensor([1.0, 0.0])), r"\(0, 1\]"),
        (dict(features=torch.zeros(2, 3)), "expected features"),
        (dict(costs=torch.ones(3)), "expected features"),
    ],
)
def test_add_labels_bad_input(kwargs, match):
    heads = H.PrefixHeads(4, hidden=8)
    args = dict(features=torch.zeros(2, 4), rewards=torch.zeros(2), costs=torch.ones(2), inclusion=torch.ones(2))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        heads.add_labels(**args)


def test_heads_learn_success_and_cost_from_prefix_state():
    u, r, c, pi, p = synthetic(2048, seed=1)
    heads = H.PrefixHeads(8, seed=0, lr=3e-3)
    heads.add_labels(u, r, c, pi)
    before = heads.diagnostics()
    heads.refresh(steps=300, batch_size=256)
    after = heads.diagnostics()
    ut, rt, ct, _, pt = synthetic(2000, seed=2)
    pred = heads.predict(ut)
    const_brier = H.brier_score(torch.full_like(rt, float(r.mean())), rt)
    assert H.brier_score(pred.p_hat, rt) < 0.85 * const_brier
    assert H.brier_score(pred.p_hat, rt) < H.brier_score(pt, rt) + 0.02  # close to the Bayes predictor
    assert H.cost_mape(pred.cost_hat, ct) < 0.2 < H.cost_mape(torch.full_like(ct, float(c.median())), ct)
    assert after["brier"] < before["brier"] and after["cost_mape"] < before["cost_mape"]
    assert 0 < after["ece"] < 0.1


def test_temperature_calibration_repairs_overconfidence():
    u, r, c, pi, _ = synthetic(2048, seed=3)
    heads = H.PrefixHeads(8, seed=0, lr=3e-3)
    heads.add_labels(u, r, c, pi)
    heads.fit(steps=300)
    with torch.no_grad():  # make the success head 4x overconfident
        heads.success_head[3].weight.mul_(4.0)
        heads.success_head[3].bias.mul_(4.0)
    heads.temperature = 1.0
    ece_before = heads.diagnostics()["ece"]
    t = heads.calibrate_temperature()
    assert 2.0 < t < 8.0
    assert heads.diagnostics()["ece"] < 0.5 * ece_before


def test_expected_calibration_error_equal_mass_bins():
    p = torch.tensor([0.1, 0.1, 0.9, 0.9])
    r = torch.tensor([0.0, 0.0, 1.0, 1.0])
    # two equal-mass bins: |0.1 - 0| and |0.9 - 1|
    assert H.expected_calibration_error(p, r, n_bins=2) == pytest.approx(0.1)
    g = torch.Generator().manual_seed(0)
    pp = torch.rand(30000, generator=g)
    rr = (torch.rand(30000, generator=g) < pp).float()
    assert H.expected_calibration_error(pp, rr) < 0.02
    assert H.expected_calibration_error(0.5 * pp, rr) > 0.2
    with pytest.raises(ValueError):
        H.expected_calibration_error(torch.tensor([]), torch.tensor([]))


def test_nonfinite_head_outputs_are_replaced_and_counted():
    heads = H.PrefixHeads(4, hidden=8)
    heads.add_labels(torch.zeros(3, 4), torch.zeros(3), torch.tensor([10.0, 20.0, 30.0]), torch.ones(3))
    x = torch.zeros(3, 4)
    x[1, 2] = float("nan")
    pred = heads.predict(x)
    assert pred.n_nonfinite == 1
    assert float(pred.p_hat[1]) == 0.5 and float(pred.cost_hat[1]) == 20.0
    assert torch.all(torch.isfinite(pred.p_hat)) and torch.all(torch.isfinite(pred.cost_hat))


def test_state_dict_round_trip_restores_heads_optimizer_and_window():
    u, r, c, pi, _ = synthetic(600, seed=4)
    a = H.PrefixHeads(8, hidden=32, seed=0, replay_size=512)
    a.add_labels(u, r, c, pi)
    a.refresh(steps=20, batch_size=64)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = H.PrefixHeads(8, hidden=32, seed=99, replay_size=512)
    b.load_state_dict(torch.load(buf, weights_only=False))
    x = torch.randn(7, 8)
    assert torch.equal(a.predict(x).p_hat, b.predict(x).p_hat)
    assert torch.equal(a._feat, b._feat) and b.n_labels == 512 and b.n_seen == 600
    assert b.temperature == a.temperature
    # identical continuation: same minibatches (generator state) and same Adam moments
    a.fit(steps=5, batch_size=64)
    b.fit(steps=5, batch_size=64)
    assert torch.equal(a.predict(x).cost_hat, b.predict(x).cost_hat)
    with pytest.raises(ValueError, match="input_dim"):
        H.PrefixHeads(9, hidden=32).load_state_dict(a.state_dict())


def test_prefix_summary_mean_of_last_k_real_tokens():
    h = torch.arange(2 * 6 * 1, dtype=torch.float32).reshape(2, 6, 1).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]])  # right- and left-padded
    out = H.prefix_summary(h, mask, last_k=3)
    assert not out.requires_grad
    assert out[:, 0].tolist() == pytest.approx([(1 + 2 + 3) / 3, (9 + 10 + 11) / 3])
    assert H.prefix_summary(h, None, last_k=16)[0, 0].item() == pytest.approx(2.5)
    with pytest.raises(ValueError):
        H.prefix_summary(h, torch.zeros(2, 6))
    with pytest.raises(ValueError):
        H.prefix_summary(h[0], None)


def test_lagged_copy_is_independent():
    heads = H.PrefixHeads(4, hidden=8, seed=0)
    u, r, c, pi, _ = synthetic(64, dim=4)
    heads.add_labels(u, r, c, pi)
    lag = heads.lagged_copy()
    heads.fit(steps=5, use_holdout=False)
    x = torch.randn(3, 4)
    assert not torch.equal(lag.predict(x).p_hat, heads.predict(x).p_hat)


def test_temperature_is_not_fitted_on_a_handful_of_separable_labels():
    # 8 perfectly separated labels: an unguarded Brier fit runs to the smallest T and saturates p_hat at 0/1.
    heads = H.PrefixHeads(4, hidden=8, seed=0)
    feats = torch.cat([torch.full((4, 4), -1.0), torch.full((4, 4), 1.0)])
    heads.add_labels(feats, torch.tensor([0.0] * 4 + [1.0] * 4), torch.ones(8), torch.ones(8))
    heads.temperature = 1.0
    assert heads.calibrate_temperature() == 1.0
    # with enough labels it is fitted, but never sharper than 1/4
    assert 0.25 - 1e-9 <= heads.calibrate_temperature(min_labels=1) <= 8.0


def test_heads_live_in_estimators_without_trl():
    """The heads are pure torch in ``trl_ext.estimators.pair_heads`` (moved from ``trl_ext.trainers``)."""
    import importlib.util
    import subprocess
    import sys

    assert importlib.util.find_spec("trl_ext.trainers.pair_heads") is None
    code = ("import sys; import trl_ext.estimators.pair_heads as h; h.PrefixHeads(4, hidden=8); "
            "assert 'trl' not in sys.modules, sorted(m for m in sys.modules if m.startswith('trl'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_auc_is_the_pairwise_probability_with_half_ties():
    import numpy as np

    from trl_ext.stats.auc import auc as roc_auc

    rng = np.random.default_rng(0)
    for _ in range(10):
        p = rng.integers(0, 5, 40) / 4  # many ties
        r = rng.integers(0, 2, 40)
        pos, neg = p[r == 1], p[r == 0]
        brute = np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg])
        assert roc_auc(p, r) == pytest.approx(brute)
    assert np.isnan(roc_auc([0.2, 0.8], [1, 1])) and roc_auc([0.2, 0.8], [0, 1]) == 1.0

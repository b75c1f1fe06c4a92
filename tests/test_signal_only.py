"""Signal-only loss denominators: gradient checks against the explicit formula (1 process).

For a generation batch with live groups (nonzero advantage) and dead groups (all-tied rewards), the trainer's loss
gradient must equal the gradient of the hand-written objective

* sequence level (``grpo``):   (1 / N_live) sum_{i live} seqmean_t(l_it)  +  beta * mean_i seqmean_t(kl_it)
* sequence level (``dr_grpo``): sum_{i live, t} l_it / (N_live * L_max)  +  beta * sum_{i,t} kl_it / (B * L_max)
* token level (``dapo``, ``bnpo``): sum_{i live, t} l_it / T_live  +  beta * sum_{i, t} kl_it / T_all

with l_it = -ratio_it * A_i (on-policy, ratio = 1 in value) and the KL estimator of TRL; i.e. only the policy term
changes its normalizer, KL keeps TRL's. The same objective with ``signal_only_denominator=False`` (N_live -> B,
T_live -> T_all) is checked too, so the reference itself is validated against TRL. Gradient accumulation: a GA=2
run and a GA=1 run on the same generation batch give the same SGD update. Two processes: ``test_base_two_rank.py``.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))

from base_helpers import make_config, tiny_dataset  # noqa: E402

from trl_ext.trainers.base import GRPOTrainer  # noqa: E402
from trl_ext.trainers.rollouts import RolloutGroups, RolloutStrategy  # noqa: E402

torch.set_num_threads(1)

G = 4


def pattern_reward(prompts, completions, trl_ext_row_idx=None, **kwargs):
    """Even dataset rows: constant 1 (a dead, all-right group). Odd rows: 0,1,0,1 by position (a live group).

    Positions are local to the reward call; groups of G are contiguous and G divides the local rows, so the
    pattern is the same with 1 or 2 processes.
    """
    return [1.0 if ri % 2 == 0 else float(i % 2) for i, ri in enumerate(trl_ext_row_idx)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from trl_ext.testbed import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def build(model_dir, tmp_path, loss_type, beta, signal_only, **kw):
    from transformers import AutoTokenizer

    kw = {"per_device_train_batch_size": 4 * G, "num_generations": G, "max_completion_length": 6, **kw}
    args = make_config(tmp_path, loss_type=loss_type, beta=beta, signal_only_denominator=signal_only, **kw)
    return GRPOTrainer(model=model_dir, reward_funcs=[pattern_reward], args=args, train_dataset=tiny_dataset(8),
                       processing_class=AutoTokenizer.from_pretrained(model_dir))


def flat_grad(model):
    return torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel()) for p in
                      model.parameters()])


def explicit_loss(model, ref_model, out, loss_type, beta, signal_only, max_len, bias_correction_kl=True):
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    att = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    t = out["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=att).logits[:, -t - 1:-1, :].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, out["completion_ids"].unsqueeze(-1)).squeeze(-1)
    m = out["completion_mask"].float()
    a = out["advantages"].unsqueeze(1)
    pol = -torch.exp(logp - logp.detach()) * a
    with torch.no_grad():
        rl = ref_model(input_ids=ids, attention_mask=att).logits[:, -t - 1:-1, :].float() if beta else None
    if beta:
        ref = torch.log_softmax(rl, dim=-1).gather(-1, out["completion_ids"].unsqueeze(-1)).squeeze(-1)
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        if bias_correction_kl:  # TRL's use_bias_correction_kl (default True): kl * ratio
            kl = kl * torch.exp(logp - logp.detach())
    else:
        kl = torch.zeros_like(logp)
    b = a.shape[0]
    live = out["advantages"].view(-1, G).ne(0).any(1).repeat_interleave(G).float().unsqueeze(1)
    if not signal_only:
        live = torch.ones_like(live)
    n_live = live.sum()
    if loss_type == "grpo":
        seq_pol = (pol * m * live).sum(1) / m.sum(1).clamp(min=1)
        seq_kl = (kl * m).sum(1) / m.sum(1).clamp(min=1)
        return seq_pol.sum() / n_live + beta * seq_kl.mean()
    if loss_type == "dr_grpo":
        return (pol * m * live).sum() / (n_live * max_len) + beta * (kl * m).sum() / (b * max_len)
    # dapo / bnpo with one process and one micro-batch
    return (pol * m * live).sum() / (m * live).sum() + beta * (kl * m).sum() / m.sum()


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("signal_only", [True, False])
def test_gradient_matches_explicit_formula(model_dir, tmp_path, loss_type, signal_only):
    beta = 0.05
    tr = build(model_dir, tmp_path, loss_type, beta, signal_only)
    model = tr.model
    model.train()
    tr.current_gradient_accumulation_steps = 1
    with torch.no_grad():  # move the policy away from the reference so the KL term has a gradient
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    ds = tr.train_dataset
    rows = [dict(ds[i]) for i in range(4) for _ in range(G)]  # rows 0, 2 dead; rows 1, 3 live
    out = tr._generate_and_score_completions(rows)
    adv = out["advantages"].view(-1, G)
    assert (adv[[0, 2]] == 0).all() and (adv[[1, 3]] != 0).all()
    if signal_only:
        assert out["ext_num_signal"].item() == 2 * G
    else:
        assert "ext_num_signal" not in out  # off by default: TRL's output is untouched
    model.zero_grad()
    tr._compute_loss(model, out).backward()
    got = flat_grad(model)
    model.zero_grad()
    explicit_loss(model, tr.ref_model, out, loss_type, beta, signal_only, tr.max_completion_length,
                  tr.args.use_bias_correction_kl).backward()
    want = flat_grad(model)
    assert want.abs().max() > 1e-4
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_signal_only_rescales_policy_gradient_by_live_fraction(model_dir, tmp_path):
    """beta = 0: the signal-only gradient is exactly B / N_live times TRL's gradient (here 2x)."""
    grads = {}
    for flag in (False, True):
        tr = build(model_dir, tmp_path / str(flag), "grpo", 0.0, flag)
        tr.model.train()
        tr.current_gradient_accumulation_steps = 1
        ds = tr.train_dataset
        out = tr._generate_and_score_completions([dict(ds[i]) for i in range(4) for _ in range(G)])
        tr.model.zero_grad()
        tr._compute_loss(tr.model, out).backward()
        grads[flag] = flat_grad(tr.model)
    torch.testing.assert_close(grads[True], 2.0 * grads[False], rtol=1e-4, atol=1e-7)


def sgd_update(model_dir, tmp_path, per_device, ga, loss_type):
    tr = build(model_dir, tmp_path, loss_type, 0.0, True, optim="sgd", learning_rate=0.1, max_grad_norm=0.0,
               lr_scheduler_type="constant", max_steps=1, generation_kwargs={"do_sample": False},
               per_device_train_batch_size=per_device, gradient_accumulation_steps=ga)
    assert tr.args.generation_batch_size == 4 * G and tr.args.steps_per_generation == ga
    before = torch.cat([p.detach().reshape(-1).clone() for p in tr.model.parameters()])
    tr.train()
    after = torch.cat([p.detach().reshape(-1) for p in tr.model.parameters()])
    return after - before, tr


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_gradient_accumulation_gives_the_same_update(model_dir, tmp_path, loss_type):
    d1, t1 = sgd_update(model_dir, tmp_path / "ga1", 4 * G, 1, loss_type)
    d2, t2 = sgd_update(model_dir, tmp_path / "ga2", 2 * G, 2, loss_type)
    assert torch.equal(t1.last_rollout_batch.rewards, t2.last_rollout_batch.rewards)
    assert d1.abs().max() > 0
    torch.testing.assert_close(d2, d1, rtol=1e-4, atol=1e-7)


def test_unsupported_loss_type_is_rejected(tmp_path):
    from trl_ext.trainers import _trl_compat as compat
    from trl_ext.trainers.base import validate_ext_config

    cfg = make_config(tmp_path, signal_only_denominator=True)
    cfg.loss_type = "my_new_loss"
    with pytest.raises(ValueError, match="signal_only_denominator supports loss_type"):
        validate_ext_config(cfg)
    assert set(compat.SIGNAL_ONLY_LOSSES) == {"grpo", "sapo", "luspo", "dr_grpo", "dapo", "cispo", "vespo", "bnpo"}


# ------------------------------------------------------------------------------------------------ review fixes
class PadRowsTrainer(GRPOTrainer):
    """Test double: a strategy's rollouts are the generation batch plus ``N_PAD`` rows flagged ``is_pad``."""

    N_PAD = 5


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("signal_only", [False, True])
def test_pad_rows_dilute_neither_policy_nor_kl(model_dir, tmp_path, loss_type, signal_only):
    """Pad rows (equal row counts across ranks, a strategy's ``is_pad`` rows) must not change the objective.

    Sequence-level losses average over all B rows, pads included. The base rescales the advantages so the policy
    term averages over real rows, but the KL term was still divided by B (pads included): its weight shrank by
    n_real / B. The gradient must equal the explicit objective on the real rows alone.
    """
    from transformers import AutoTokenizer

    beta = 0.05
    args = make_config(tmp_path, loss_type=loss_type, beta=beta, signal_only_denominator=signal_only,
                       per_device_train_batch_size=4 * G, num_generations=G, max_completion_length=6)
    tr = PadRowsTrainer(model=model_dir, reward_funcs=[pattern_reward], args=args, train_dataset=tiny_dataset(8),
                        processing_class=AutoTokenizer.from_pretrained(model_dir))
    model = tr.model
    model.train()
    tr.current_gradient_accumulation_steps = 1
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    ds = tr.train_dataset
    rows = [dict(ds[i]) for i in range(4) for _ in range(G)]
    c_ids, _ = tr.generate_rollouts(rows)
    n_pad = PadRowsTrainer.N_PAD
    groups = RolloutGroups(rows=rows + rows[:n_pad], completion_ids=list(c_ids) + list(c_ids[:n_pad]),
                           group_ids=[i // G for i in range(len(rows))] + [0] * n_pad,
                           is_pad=[False] * len(rows) + [True] * n_pad)
    tr.rollout_strategy = type("Given", (RolloutStrategy,), {"rollout": lambda self, api, rows: groups})()
    out = tr._generate_and_score_completions(groups.rows)
    real = ~tr.last_rollout_batch.is_pad
    assert int((~real).sum()) == n_pad
    sub = {k: out[k][real] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    sub["advantages"] = tr.last_advantages[real]
    model.zero_grad()
    tr._compute_loss(model, out).backward()
    got = flat_grad(model)
    model.zero_grad()
    explicit_loss(model, tr.ref_model, sub, loss_type, beta, signal_only, tr.max_completion_length,
                  tr.args.use_bias_correction_kl).backward()
    want = flat_grad(model)
    assert want.abs().max() > 1e-4
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert tr.beta == beta  # restored after the loss

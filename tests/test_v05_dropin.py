"""V0.5's drop-in contract: a TRL user changes the import and the config class only.

* **compute**: for the same TRL arguments round 1 generates exactly TRL's rollouts and the OSLA rounds add at most
  ``v05_extra_rollout_budget x generation_batch_size`` more, served by decreasing bias2 (measured in
  ``ext/generated_tokens`` against ``trl_ext.GRPOTrainer`` with completions of a fixed length);
* **memory**: the default embedding prior shares the trainer's weights under LoRA (base weights, adapter disabled)
  and with ``beta > 0`` (TRL's reference model); otherwise it holds a frozen copy, logged with its size, that really
  is frozen;
* **bit-identical resume** with the default prior (embeddings do not depend on the batch they are computed in);
* **no silent drops**: unscorable rollouts are counted and warned about;
* **all-tied groups**: the documented behaviour of the paper's estimator (nonzero advantage when the prior
  disagrees with the group, zero when it agrees).

Stand-in reward: a fixed success bit per prompt (``truth = row % 2``) unless said otherwise, on the tiny testbed
model (CPU).
"""

from __future__ import annotations

import gc
import logging
import zlib

import numpy as np
import pytest
import torch

from trl_ext.estimators.v05 import equal_prompt_weights, fused_advantages, to_signed_reward
from trl_ext.priors import CallablePrior, ConstantPrior, model_footprint
from trl_ext.trainers.base import ExtGRPOConfig, GRPOTrainer
from trl_ext.trainers.v05 import V05GRPOConfig, V05GRPOTrainer

L = 4  # every completion has exactly L tokens (min_new_tokens = max_completion_length)


def truth(i: int) -> float:
    return float(i % 2)


def prompt_bit_reward(prompts, completions, trl_ext_row_idx, **kw):
    return [truth(i) for i in trl_ext_row_idx]


def zero_reward(prompts, completions, **kw):
    return [0.0] * len(prompts)


def hash_bit_reward(prompts, completions, **kw):
    return [float(zlib.crc32(b"v05" + c.encode()) % 2) for c in completions]


def _dataset(n=32):
    from trl_ext.testbed import make_dataset

    return make_dataset("addition", n, seed=0)


def _common(tmp_path, **overrides):
    kw = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=L,
              generation_kwargs={"min_new_tokens": L}, max_steps=3, learning_rate=1e-3, use_cpu=True, bf16=False,
              report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
              dataloader_num_workers=0)
    kw.update(overrides)
    return kw


def make_v05(tmp_path, *, model=None, prior=None, reward_funcs=None, ds=None, peft_config=None, **overrides):
    from trl_ext.testbed import build_tiny_model, build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0) if model is None else model
    return V05GRPOTrainer(model=model, reward_funcs=reward_funcs or [prompt_bit_reward],
                          args=V05GRPOConfig(**_common(tmp_path, **overrides)), train_dataset=ds or _dataset(),
                          processing_class=tok, prior=prior, peft_config=peft_config)


def per_step(tr, key):
    return [h[key] for h in tr.state.log_history if key in h]


# ------------------------------------------------------------------------------------------------------ compute
@pytest.fixture(scope="module")
def trl_tokens(tmp_path_factory):
    """TRL GRPO (``trl_ext.GRPOTrainer``, default config) with per_device_train_batch_size=8, num_generations=4."""
    from trl_ext.testbed import build_tiny_model, build_tokenizer

    torch.set_num_threads(1)
    tok = build_tokenizer()
    tr = GRPOTrainer(model=build_tiny_model(tok, seed=0), reward_funcs=[prompt_bit_reward],
                     args=ExtGRPOConfig(**_common(tmp_path_factory.mktemp("trl"))), train_dataset=_dataset(),
                     processing_class=tok)
    tr.train()
    tokens = per_step(tr, "ext/generated_tokens")
    assert tokens == [8 * L] * 3  # 2 prompts x 4 rollouts x L tokens
    return tokens


@pytest.mark.parametrize("budget", [None, 0.5, 0.0])
def test_tokens_per_step_within_the_documented_factor_of_trl(tmp_path, trl_tokens, budget, caplog):
    """Same TRL arguments (per_device_train_batch_size=8, num_generations=4), default V0.5 options (default embedding
    prior, budget 1.0): round 1 generates TRL's 8 rollouts (2 prompts x v05_k_init = 4), the OSLA rounds at most
    budget x 8 more. With the stand-in reward every group is tied and the cold-start prior (V = 0) is rejected for
    every prompt, so OSLA wants the cap (16 per prompt) and the budget binds."""
    extra = {} if budget is None else {"v05_extra_rollout_budget": budget}
    b = 1.0 if budget is None else budget
    with caplog.at_level(logging.INFO, logger="trl_ext.trainers.base"):
        tr = make_v05(tmp_path, **extra)
    line = [r.getMessage() for r in caplog.records if "v05_osla" in r.getMessage()]
    assert len(line) == 1
    assert "round 1: 8 rollouts per generation batch (2 prompts x 4; = TRL's for these arguments: 2 prompts x 4)" \
        in line[0]
    assert f"OSLA: at most {int(b * 8)} more" in line[0] and f"i.e. <= {1 + b:.4g}x TRL's" in line[0]
    tr.train()
    v05 = per_step(tr, "ext/generated_tokens")
    assert len(v05) == len(trl_tokens) == 3
    assert per_step(tr, "v05/round1_rollouts") == [8.0] * 3  # exactly TRL's rollouts in round 1
    for mine, theirs in zip(v05, trl_tokens):
        assert theirs <= mine <= (1 + b) * theirs
    assert v05[0] == (1 + b) * trl_tokens[0]  # step 1: every prompt rejected at V = 0, the budget binds
    assert per_step(tr, "v05/budget_exhausted")[0] == float(b < 3)
    assert per_step(tr, "v05/extra_rollouts")[0] == b * 8
    if b == 0:
        assert v05 == trl_tokens and per_step(tr, "v05/rounds") == [0.0] * 3
    assert type(tr.rollout_strategy.prior).__name__ == "EmbeddingInContextPrior"


def test_unbounded_budget_reproduces_the_paper_rounds(tmp_path):
    """``v05_extra_rollout_budget >= (cap - k_init) / k_init`` never binds: both rejected prompts climb to the cap."""
    tr = make_v05(tmp_path, prior=ConstantPrior(0.5), v05_extra_rollout_budget=3.0, max_steps=1)
    assert "does not bind" in tr.rollout_strategy.describe(tr.rollout_api)[0]
    tr.train()
    r = tr.rollout_strategy.last_record
    assert r["k"].tolist() == [16, 16] and not r["budget_exhausted"] and r["extra_rollouts"] == 24


def test_budget_serves_the_largest_bias2_first(tmp_path):
    """Even rows (truth 0) get a flipped prior (p = 1: bias2 = 4 - 1/4 = 3.75), odd rows p = 0.5 (bias2 = 1 - 1/4 =
    0.75); every prompt is rejected and needs more. A budget of 0.25 x 32 = 8 rollouts serves the first four prompts
    in (decreasing bias2, batch order) with +2 each, then the rounds stop, identically on every rank."""
    ds = _dataset(16)
    index = {ds[i]["prompt"]: i for i in range(len(ds))}
    prior = CallablePrior(lambda t, cp, cy: [1.0 if index[x] % 2 == 0 else 0.5 for x in t])
    tr = make_v05(tmp_path, prior=prior, ds=ds, per_device_train_batch_size=32, num_generations=8, max_steps=1,
                  v05_extra_rollout_budget=0.25)
    tr.train()
    r = tr.rollout_strategy.last_record
    rows = r["row_idx"]
    assert len(rows) == 8 and r["rejected_at_init"].all()
    order = sorted(range(8), key=lambda j: (-(3.75 if rows[j] % 2 == 0 else 0.75), j))
    expected = [6 if j in order[:4] else 4 for j in range(8)]
    assert r["k"].tolist() == expected
    assert r["rounds"] == 1 and r["budget_exhausted"] and r["extra_rollouts"] == 8
    assert tr.state.log_history[0]["v05/budget_exhausted"] == 1


# ------------------------------------------------------------------------------------------------------ memory
def _unique_module_bytes() -> int:
    """Bytes of every distinct parameter/buffer storage held by a live ``torch.nn.Module``."""
    gc.collect()
    seen, total = set(), 0
    for obj in gc.get_objects():
        if isinstance(obj, torch.nn.Module):
            for t in list(obj.parameters(recurse=False)) + list(obj.buffers(recurse=False)):
                if t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
    return total


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=4, target_modules="all-linear")


def _delta_bytes(build):
    before = _unique_module_bytes()
    tr = build()
    return tr, _unique_module_bytes() - before


def test_lora_prior_shares_the_base_weights(tmp_path):
    """Under LoRA the default embedding prior embeds with the trainer's own model, adapter disabled: the prior adds no
    parameter storage (same bytes as a trainer with a constant prior), its module is the policy itself, and it
    sees the frozen base weights (bitwise the embeddings of the untouched starting model) after the adapter trained."""
    from trl_ext.priors import hf_mean_pool_embedder
    from trl_ext.testbed import build_tiny_model, build_tokenizer

    tr_c, d_const = _delta_bytes(lambda: make_v05(tmp_path / "c", prior=ConstantPrior(0.5), peft_config=_lora()))
    del tr_c
    tr, d_emb = _delta_bytes(lambda: make_v05(tmp_path / "e", peft_config=_lora(), learning_rate=5e-2,
                                              reward_funcs=[hash_bit_reward], per_device_train_batch_size=16))
    assert d_emb == d_const  # no second copy of the base weights
    assert tr.rollout_strategy.prior_info.get("prior_backbone") == {"source": "peft_base_model", "parameters": 0, "bytes": 0}
    embed = tr.rollout_strategy.prior.embed_fn
    assert embed.backbone["model"] is tr.accelerator.unwrap_model(tr.model) and not embed.backbone["copied"]
    policy_ptrs = {p.data_ptr() for p in tr.model.parameters()}
    assert {p.data_ptr() for p in embed.backbone["model"].parameters()} <= policy_ptrs
    texts = [x["prompt"] for x in _dataset(6)]
    before = embed(texts)
    modes, predict = [], tr.rollout_strategy.prior.predict

    def spy(*args):
        out = predict(*args)
        modes.append(tr.rollout_strategy.prior.last_info["mode"])
        return out

    tr.rollout_strategy.prior.predict = spy
    tr.train()
    assert "head" in modes  # the prior embedded during training (policy in train mode, adapter enabled around it)
    lora = [p for n, p in tr.model.named_parameters() if "lora_B" in n]
    assert lora and any(p.abs().max() > 0 for p in lora)  # the adapter moved: it would change the embeddings
    tr.model.train()
    after = embed(texts)
    assert all(m.training for m in tr.model.modules())  # the prior's call restored the policy's training mode
    np.testing.assert_array_equal(after, before)
    ref = hf_mean_pool_embedder(build_tiny_model(build_tokenizer(), seed=0), build_tokenizer())(texts)
    np.testing.assert_allclose(after, ref, rtol=0, atol=1e-6)


def test_full_finetuning_prior_is_a_frozen_copy_logged_with_its_size(tmp_path, caplog):
    """Without PEFT and without a reference model the prior keeps a frozen copy of the starting policy: its size is
    logged once at construction and it really stays frozen while the policy trains (before, TRL's fused LM head
    patch made the deep copy run the live policy's forward)."""
    with caplog.at_level(logging.WARNING, logger="trl_ext.trainers.v05"):
        tr, delta = _delta_bytes(lambda: make_v05(tmp_path, learning_rate=5e-2, reward_funcs=[hash_bit_reward]))
    foot = model_footprint(tr.accelerator.unwrap_model(tr.model))
    assert tr.rollout_strategy.prior_info.get("prior_backbone") == {"source": "policy_copy", **foot}
    msgs = [r.getMessage() for r in caplog.records if "frozen copy" in r.getMessage()]
    assert len(msgs) == 1 and f"{foot['parameters']} parameters" in msgs[0]
    embed = tr.rollout_strategy.prior.embed_fn
    copy_ = embed.backbone["model"]
    assert copy_ is not tr.model and all(not p.requires_grad for p in copy_.parameters())
    assert not ({p.data_ptr() for p in copy_.parameters()} & {p.data_ptr() for p in tr.model.parameters()})
    assert delta >= 2 * foot["bytes"]  # policy + the copy
    texts = [x["prompt"] for x in _dataset(6)]
    before = embed(texts)
    start = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    assert any(not torch.equal(p, start[n]) for n, p in tr.model.named_parameters())
    np.testing.assert_array_equal(embed(texts), before)


def test_beta_reuses_the_reference_model(tmp_path):
    """beta > 0 (full fine-tuning): TRL's reference model is the frozen starting policy; the prior embeds with it."""
    from trl_ext.testbed import save_tiny_model

    path = save_tiny_model(str(tmp_path / "tiny"), seed=0)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    torch.set_num_threads(1)
    tr = V05GRPOTrainer(model=path, reward_funcs=[hash_bit_reward],
                        args=V05GRPOConfig(**_common(tmp_path / "out", beta=0.1, max_steps=1)),
                        train_dataset=_dataset(), processing_class=tok)
    assert tr.ref_model is not None
    assert tr.rollout_strategy.prior_info.get("prior_backbone") == {"source": "reference_model", "parameters": 0, "bytes": 0}
    assert tr.rollout_strategy.prior.embed_fn.backbone["model"] is tr.accelerator.unwrap_model(tr.ref_model)
    texts = [x["prompt"] for x in _dataset(4)]
    before = tr.rollout_strategy.prior.embed_fn(texts)
    tr.train()
    np.testing.assert_array_equal(tr.rollout_strategy.prior.embed_fn(texts), before)
    # sync_ref_model moves the reference towards the policy: then the prior keeps its own copy
    tr2 = V05GRPOTrainer(model=path, reward_funcs=[hash_bit_reward],
                         args=V05GRPOConfig(**_common(tmp_path / "out2", beta=0.1, sync_ref_model=True)),
                         train_dataset=_dataset(), processing_class=tok)
    assert tr2.rollout_strategy.prior_info.get("prior_backbone")["source"] == "policy_copy" and tr2.rollout_strategy.prior_info.get("prior_backbone")["bytes"] > 0


# ------------------------------------------------------------------------------------------------------ resume
def test_resume_is_bit_identical_with_the_default_prior(tmp_path):
    """4 steps straight vs 2 steps + resume for 2: bitwise equal parameters and prior outputs, with the default
    embedding prior in head mode (its cache is empty after the resume, so every context prompt is re-embedded in a
    different batch than in the straight run). Before the fix the parameters differed (8e-3 on this setup)."""
    def make(steps, **kw):
        return make_v05(tmp_path / "run", reward_funcs=[hash_bit_reward], per_device_train_batch_size=16,
                        max_steps=steps, learning_rate=1e-2, v05_context_size=8, generation_kwargs=None, **kw)

    a = make(4, save_strategy="steps", save_steps=2)
    modes, predict = [], a.rollout_strategy.prior.predict

    def spy(*args):
        out = predict(*args)
        modes.append(a.rollout_strategy.prior.last_info["mode"])
        return out

    a.rollout_strategy.prior.predict = spy
    a.train()
    assert "head" in modes  # the embeddings fed the prior after the resume point
    b = make(4)
    b.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name
    prior_a = per_step(a, "v05/prior_mean")
    assert per_step(b, "v05/prior_mean") == prior_a  # (steps 1-2 come from the checkpoint's log history)


# ------------------------------------------------------------------------------------------------------ silent drops
def test_unscorable_rollouts_are_counted_and_warned_once(tmp_path):
    """Rollouts whose reward functions all return None: counted per step in v05/unscorable_rollouts (also when
    every prompt still has scorable rollouts, where v05/unscorable_prompts stays 0), one warning for the run."""
    seen = []

    def flaky(prompts, completions, **kw):
        out = [None if zlib.crc32(c.encode()) % 3 == 0 else 1.0 for c in completions]
        seen.append(sum(x is None for x in out))
        return out

    tr = make_v05(tmp_path, prior=ConstantPrior(0.5), reward_funcs=[flaky], per_device_train_batch_size=16,
                  generation_kwargs=None, v05_extra_rollout_budget=0.0)
    with pytest.warns(UserWarning, match=r"rollouts were unscorable \(every reward function returned None or NaN\)"
                      ) as rec:
        tr.train()
    assert sum("rollouts were unscorable" in str(w.message) for w in rec) == 1
    assert not any("generation batch are unscorable" in str(w.message) for w in rec)  # no second, generic warning
    counts = per_step(tr, "v05/unscorable_rollouts")
    assert counts == [float(n) for n in seen] and sum(counts) > 0  # budget 0: one scoring call per step
    assert tr.rollout_strategy.last_record["unscorable_rollouts"] == seen[-1]


# ------------------------------------------------------------------------------------------------------ tied groups
@pytest.mark.parametrize("p,nonzero", [(0.5, True), (0.0, False)])
def test_all_tied_batch_follows_the_paper_estimator(tmp_path, p, nonzero):
    """Every rollout fails (reward 0 -> r = -1). The paper's advantage is A_i = (r_i - mu*) / sigma* with the fused
    mu* = w vbar + (1 - w) V (Eq. 9), not the group mean, so a tied group gets

    * p = 0.5 (V = 0, the prior disagrees): bias2 = 1 - 1/k > 0, w = bias2 / (bias2 + 1/k) = 1 - 1/k,
      mu* = -(1 - 1/k), A_i = -(1/k) / sqrt(1 - mu*^2) < 0 for every rollout -- the policy is pushed away from these
      completions and the gradient is nonzero (GRPO's group-mean baseline would give 0);
    * p = 0 (V = -1, the prior agrees): bias2 = 0, w = 0, mu* = -1 = r, A_i = 0 and no gradient.
    """
    tr = make_v05(tmp_path, prior=ConstantPrior(p), reward_funcs=[zero_reward], max_steps=1, beta=0.0)
    tr.train()
    b, adv, r = tr.last_rollout_batch, tr.last_advantages, tr.rollout_strategy.last_record
    signed = to_signed_reward(b.rewards.double().numpy())
    assert (signed == -1).all()
    c = equal_prompt_weights(r["k"])
    for j in range(b.num_groups):
        rows = (b.group_ids == j).numpy()
        ref = fused_advantages(signed[rows], 2 * p - 1)
        np.testing.assert_allclose(adv[rows].numpy(), c[j] * ref.advantages, rtol=1e-6, atol=1e-7)
    rec = tr.state.log_history[0]
    if nonzero:
        k = r["k"].astype(float)
        np.testing.assert_allclose(r["baseline"], -(1 - 1 / k))
        assert (adv[~b.is_pad] < 0).all() and rec["grad_norm"] > 0
    else:
        assert (adv == 0).all() and rec["grad_norm"] == 0 and r["rounds"] == 0

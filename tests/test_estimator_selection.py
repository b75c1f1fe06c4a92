"""Estimators and rollout strategies chosen by configuration of ``trl_ext.GRPOTrainer`` (1 process, tiny model).

* a toy estimator registered with the decorator is selected by name only and trains two steps with the
  advantages it returned (the valid-row adapter hands it only real, scorable rows);
* REINFORCE++ with ``num_generations=1`` (unique prompts), RLOO and Dr. GRPO through the config;
* DAPO dynamic sampling: zero-variance groups are never trained on, every generated token is counted, the
  strategy state is checkpointed and restored;
* the one generated-token counter equals the tokens the generation calls returned;
* construction errors for unknown estimators, too-small groups and bad dynamic-sampling fields.
Two-process versions of the estimator and dynamic-sampling runs live in ``tests/test_base_two_rank.py``.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))

from base_helpers import binary_reward, hash_reward, make_config, make_trainer  # noqa: E402

from trl_ext.estimators import AdvantageResult, register_advantage_estimator  # noqa: E402
from trl_ext.estimators.baselines import ADVANTAGE_ESTIMATORS  # noqa: E402
from trl_ext.trainers.base import EXT_STATE_FILE, ExtGRPOConfig, GRPOTrainer  # noqa: E402

torch.set_num_threads(1)

TOY_CALLS: list[dict] = []


@register_advantage_estimator("toy_rank_sign")
def toy_rank_sign(rewards, group_ids, scale: float = 1.0) -> AdvantageResult:
    """+scale for rows above their group's median reward, -scale below, 0 otherwise (a deliberately odd rule)."""
    r = np.asarray(rewards, dtype=np.float64)
    g = np.asarray(group_ids)
    TOY_CALLS.append({"n": r.size, "finite": bool(np.isfinite(r).all()), "groups": np.unique(g).size})
    adv = np.zeros_like(r)
    for k in np.unique(g):
        idx = g == k
        adv[idx] = scale * np.sign(r[idx] - np.median(r[idx]))
    return AdvantageResult(adv, np.zeros_like(r), np.ones_like(r), 0, int(np.unique(g).size), 0)


class Recording(GRPOTrainer):
    def _ext_finalize(self, out, *args, **kwargs):
        out = super()._ext_finalize(out, *args, **kwargs)
        self.recorded.append((self.last_rollout_batch, self.last_advantages.clone()))
        return out


def _recording(tmp_path, **kw):
    tr = make_trainer(tmp_path, cls=Recording, **kw)
    tr.recorded = []
    return tr


def test_toy_estimator_registered_and_selected_by_name_trains_two_steps(tmp_path):
    TOY_CALLS.clear()
    tr = _recording(tmp_path, advantage_estimator="toy_rank_sign", advantage_estimator_kwargs='{"scale": 0.5}',
                    max_steps=2, reward_funcs=[hash_reward])
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.train()
    assert tr.state.global_step == 2 and len(TOY_CALLS) == 2
    assert all(c["finite"] and c["n"] == 8 and c["groups"] == 2 for c in TOY_CALLS)
    for batch, adv in tr.recorded:
        ref = toy_rank_sign(batch.rewards.double().numpy(), batch.group_ids.numpy(), scale=0.5).advantages
        np.testing.assert_array_equal(adv.double().numpy(), ref)
    assert any((a != 0).any() for _, a in tr.recorded)
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))


def test_adapter_hides_unscorable_rows_from_the_estimator(tmp_path):
    TOY_CALLS.clear()

    def half_none(prompts, completions, **kw):
        return [None if i % 4 == 0 else float(len(str(c)) % 3) for i, c in enumerate(completions)]

    tr = _recording(tmp_path, advantage_estimator="toy_rank_sign", max_steps=1, reward_funcs=[half_none])
    tr.train()
    batch, adv = tr.recorded[0]
    assert TOY_CALLS[0]["n"] == int(batch.valid.sum()) == 6 and TOY_CALLS[0]["finite"]
    assert (adv[~batch.valid] == 0).all()
    assert tr.state.log_history[0]["adv/unscorable_rows"] == 2


@pytest.mark.parametrize("name", ["rloo", "dr_grpo", "reinforce_pp"])
def test_builtin_estimators_selected_by_config(tmp_path, name):
    from trl_ext.estimators import get_advantage_estimator

    kw = {"num_generations": 1, "per_device_train_batch_size": 4} if name == "reinforce_pp" else {}
    tr = _recording(tmp_path, advantage_estimator=name, max_steps=1, reward_funcs=[hash_reward], **kw)
    tr.train()
    batch, adv = tr.recorded[0]
    ref = get_advantage_estimator(name)(batch.rewards.double().numpy(), batch.group_ids.numpy()).advantages
    np.testing.assert_allclose(adv.double().numpy(), ref, rtol=1e-6, atol=1e-7)
    if name == "reinforce_pp":
        assert tr.num_generations == 1 and batch.num_groups == batch.num_rows == 4
        assert len(set(batch.row_idx.tolist())) == 4


def test_config_errors_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="not registered"):
        make_config(tmp_path, advantage_estimator="no_such_estimator")
    with pytest.raises(ValueError, match="num_generations >= 2"):
        make_config(tmp_path, advantage_estimator="rloo", num_generations=1)
    with pytest.raises(ValueError, match="dynamic_sampling_max_rounds"):
        make_config(tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=-1)
    with pytest.raises(ValueError, match="JSON"):
        make_config(tmp_path, advantage_estimator_kwargs="{not json")
    assert "toy_rank_sign" in ADVANTAGE_ESTIMATORS


def test_plain_trl_config_is_upgraded(tmp_path):
    import trl
    from base_helpers import tiny_dataset, tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(0)
    cfg = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_steps=1,
                         max_completion_length=4, use_cpu=True, report_to="none", save_strategy="no")
    tr = GRPOTrainer(model=model, reward_funcs=[hash_reward], args=cfg, train_dataset=tiny_dataset(8),
                     processing_class=tok)
    assert tr.args.advantage_estimator == "grpo" and tr.args.dynamic_sampling is False
    assert tr.args.generation_batch_size == cfg.generation_batch_size
    with pytest.raises(TypeError, match="ExtGRPOConfig"):
        GRPOTrainer(model=model, reward_funcs=[hash_reward], args={"lr": 1}, train_dataset=tiny_dataset(8),
                    processing_class=tok)


def test_generated_token_counter_counts_every_generation_call(tmp_path):
    seen = []

    class Spy(Recording):
        def ext_on_generated(self, completion_ids):
            seen.append(sum(len(c) for c in completion_ids))
            super().ext_on_generated(completion_ids)

    tr = make_trainer(tmp_path, cls=Spy, max_steps=2, reward_funcs=[hash_reward])
    tr.recorded = []
    tr.train()
    logged = [h["ext/generated_tokens"] for h in tr.state.log_history if "ext/generated_tokens" in h]
    assert sum(logged) == sum(seen) > 0
    assert tr.state.log_history[-2]["ext/generated_tokens_total"] == sum(seen)


def test_dynamic_sampling_filters_counts_and_resumes(tmp_path):
    def group_alternating(prompts, completions, trl_ext_row_idx=None, **kw):
        # even dataset rows: every rollout gets 1 (no signal); odd rows: 0/1 alternating inside the call
        return [1.0 if r % 2 == 0 else float(i % 2) for i, r in enumerate(trl_ext_row_idx)]

    tr = _recording(tmp_path / "a", dynamic_sampling=True, dynamic_sampling_max_rounds=3, max_steps=2,
                    reward_funcs=[group_alternating], save_strategy="steps", save_steps=1)
    tr.train()
    logs = [h for h in tr.state.log_history if "dapo/kept_groups" in h]
    assert len(logs) == 2
    for (batch, _adv), log in zip(tr.recorded, logs):
        real = ~batch.is_pad
        assert (batch.row_idx[real] % 2 == 1).all()  # no zero-variance group was trained on
        assert log["dapo/kept_groups"] == batch.num_groups <= 2  # K = 8 rows / G = 4
        assert log["ext/generated_tokens"] >= log["ext/trained_tokens"]
        # kept groups beyond K are dropped after generation, so generated >= kept + filtered
        assert log["dapo/generated_groups"] >= log["dapo/kept_groups"] + log["dapo/filtered_groups"]
    assert sum(h["dapo/filtered_groups"] for h in logs) >= 1
    state = torch.load(os.path.join(tmp_path / "a", "checkpoint-1", EXT_STATE_FILE), weights_only=True)
    assert state["rollout_strategy"]["name"] == "dynamic_sampling"
    assert state["rollout_strategy"]["state"]["generation_index"] == 1
    tr2 = _recording(tmp_path / "a", dynamic_sampling=True, dynamic_sampling_max_rounds=3, max_steps=2,
                     reward_funcs=[group_alternating])
    tr2.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-1"))
    assert tr2.rollout_strategy.generation_index == 2
    assert tr2.rollout_strategy.totals["generated_groups"] == tr.rollout_strategy.totals["generated_groups"]


def test_dynamic_sampling_with_no_informative_group_trains_on_nothing(tmp_path):
    tr = _recording(tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=1, max_steps=1,
                    reward_funcs=[lambda prompts, completions, **kw: [1.0] * len(prompts)])
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.train()
    batch, adv = tr.recorded[0]
    assert batch.is_pad.all() and (adv == 0).all()
    log = tr.state.log_history[0]
    assert log["dapo/kept_groups"] == 0 and log["dapo/batch_fill"] == 0 and log["dapo/rounds"] == 1
    assert log["dapo/filtered_groups"] == 4  # 2 groups + a 2-group refill, all dropped
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))


def test_binary_reward_default_grpo_unchanged_by_strategy_layer(tmp_path):
    """The default config still uses TRL's fixed groups and TRL's advantages (bitwise tests: test_base_trainer)."""
    tr = _recording(tmp_path, max_steps=1, reward_funcs=[binary_reward])
    assert tr.rollout_strategy.name == "fixed_groups"
    tr.train()
    assert tr.recorded[0][0].num_rows == 8


def test_keyed_sampling_installed_only_when_enabled(tmp_path):
    from trl_ext.generation.keyed_sampler import KeyedSampler

    off = make_trainer(tmp_path / "off", max_steps=1)
    assert off.keyed_sampler is None
    on = make_trainer(tmp_path / "on", max_steps=1, keyed_sampling=True)
    assert isinstance(on.keyed_sampler, KeyedSampler) and on.keyed_sampler.trainer is on
    assert type(on) is GRPOTrainer  # a back-end object, not a subclass spliced into the MRO


def test_dynamic_sampling_with_keyed_sampling_replays_every_rollout(tmp_path):
    """Refill rounds go through generate_rollouts: every generated rollout (dropped groups too) is logged with its
    key and regenerates byte-identically from the initial weights."""
    from transformers import AutoModelForCausalLM

    from trl_ext.measurement.replay import load_rollout_log, regenerate

    def group_alternating(prompts, completions, trl_ext_row_idx=None, **kw):
        return [1.0 if r % 2 == 0 else float(i % 2) for i, r in enumerate(trl_ext_row_idx)]

    tr = _recording(tmp_path, dynamic_sampling=True, dynamic_sampling_max_rounds=2, max_steps=1,
                    keyed_sampling=True, temperature=1.3, reward_funcs=[group_alternating])
    tr.model.save_pretrained(tmp_path / "init")
    tr.train()
    recs = load_rollout_log(tmp_path / "rollouts" / "rank0.jsonl")
    log = tr.state.log_history[0]
    assert len(recs) == 4 * log["dapo/generated_groups"]
    assert sum(len(r["completion_ids"]) for r in recs) == log["ext/generated_tokens"]
    m0 = AutoModelForCausalLM.from_pretrained(str(tmp_path / "init"), local_files_only=True)
    assert all(regenerate(m0, tr.processing_class, r) == r["completion_ids"] for r in recs)


def test_dynamic_sampling_is_refused_by_one_rule_for_every_config(tmp_path):
    """``dynamic_sampling=True`` selects DAPO's strategy; every config whose strategy is another one (a method
    config's own, or an explicit ``rollout_strategy``) is refused by the same rule, at construction."""
    import warnings

    from trl_ext.trainers.basis import BASISConfig
    from trl_ext.trainers.pair import PAIRConfig
    from trl_ext.trainers.v05 import V05GRPOConfig

    kw = dict(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=8, report_to="none",
              dynamic_sampling=True)
    cases = ((V05GRPOConfig, dict(num_generations=4), "'v05_osla'; set dynamic_sampling=False"),
             (PAIRConfig, dict(num_generations=4), "'pair_prefix_probe'; set dynamic_sampling=False"),
             (BASISConfig, dict(num_generations=1, basis_value_table_path="t.jsonl"), "'value_table'"),
             (ExtGRPOConfig, dict(num_generations=4, rollout_strategy="fixed_groups"), "'fixed_groups'; set one"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cls, extra, where in cases:
            with pytest.raises(ValueError, match=f"selects DAPO's dynamic_sampling rollout strategy.*{where}"):
                cls(**kw, **extra)
        assert ExtGRPOConfig(**kw, num_generations=4).dynamic_sampling  # the strategy it selects: accepted

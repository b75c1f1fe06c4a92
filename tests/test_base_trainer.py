"""Tests of the shared base trainer ``trl_ext.GRPOTrainer`` (1 process, tiny testbed model, CPU).

What is checked:

* drop-in: with a default config the advantages are bitwise TRL's (several scale_rewards / aggregation settings);
* ``trl_grpo_advantages`` on ragged groups against a direct numpy implementation of the GRPO formula, and the
  uniform (TRL ``view``) path against the ragged path (hypothesis);
* variable rollouts per prompt returned by a rollout strategy as ``RolloutGroups`` (padding, masks,
  ``num_items_in_batch``, ragged advantages, bad input), the unique-prompt sampler, ``rollout_columns``;
* checkpointed ext state and resume; ``log_ext_metric``; the tie-break blend in the trainer and its confidence
  scaling; config validation and bad-input errors.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))

from base_helpers import binary_reward, hash_reward, length_score, make_config, make_trainer  # noqa: E402

from trl_ext.trainers.base import EXT_STATE_FILE, ExtGRPOConfig, GRPOTrainer, trl_grpo_advantages  # noqa: E402
from trl_ext.trainers.batch import RolloutBatch  # noqa: E402
from trl_ext.trainers.rollouts import RolloutGroups, RolloutStrategy  # noqa: E402

torch.set_num_threads(1)


# --------------------------------------------------------------------------------------------------- helpers
class RecordingTrainer(GRPOTrainer):
    """Keeps TRL's own advantages (before the base replaces them) and the final output of each generation."""

    def _ext_finalize(self, out, *args, **kwargs):
        self.trl_advantages.append(out["advantages"].clone())
        out = super()._ext_finalize(out, *args, **kwargs)
        self.outputs.append({k: (v.clone() if torch.is_tensor(v) else v) for k, v in out.items()})
        self.batches.append(self.last_rollout_batch)
        return out


def recording(tmp_path, **kw):
    tr = make_trainer(tmp_path, cls=kw.pop("cls", RecordingTrainer), **kw)
    tr.trl_advantages, tr.outputs, tr.batches = [], [], []
    return tr


def numpy_grpo(rewards, gids, scale="group", eps=1e-4):
    """Direct GRPO formula per group (NaN rewards excluded, Bessel std, NaN advantage -> 0)."""
    r = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(r)
    finite = r[np.isfinite(r)]
    batch_std = np.std(finite, ddof=1) if finite.size > 1 else 0.0
    for g in np.unique(gids[gids >= 0]):
        idx = np.flatnonzero(gids == g)
        x = r[idx]
        ok = np.isfinite(x)
        mean = x[ok].mean() if ok.any() else np.nan
        std = x[ok].std(ddof=1) if ok.sum() > 1 else np.nan
        if scale == "group":
            a = (x - mean) / (std + eps)
        elif scale == "batch":
            a = (x - mean) / (batch_std + eps)
        else:
            a = x - mean
        out[idx] = np.nan_to_num(a, nan=0.0)
    return out


# --------------------------------------------------------------------------------------------------- drop-in
@pytest.mark.parametrize(
    "overrides,funcs",
    [
        ({}, None),
        ({"scale_rewards": "batch"}, None),
        ({"scale_rewards": "none"}, None),
        ({"multi_objective_aggregation": "normalize_then_sum"}, [hash_reward, binary_reward]),
    ],
)
def test_default_config_reproduces_trl_advantages_bitwise(tmp_path, overrides, funcs):
    tr = recording(tmp_path, reward_funcs=funcs, **overrides)
    tr.train()
    assert len(tr.trl_advantages) == 2
    for trl_adv, out in zip(tr.trl_advantages, tr.outputs):
        assert torch.equal(trl_adv, out["advantages"]), (trl_adv, out["advantages"])
    # every generation: 8 rows = 2 prompts x 4 generations, groups keyed by dataset row
    b = tr.batches[-1]
    assert b.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(set(b.row_idx[:4].tolist())) == 1 and b.row_idx[0] != b.row_idx[4]
    logs = tr.state.log_history[0]
    for key in ("ext/generated_tokens", "ext/generated_tokens_total", "gate/eligible_groups", "ext/signal_row_frac"):
        assert key in logs
    assert logs["ext/generated_tokens"] == float(tr.batches[0].completion_lengths.sum())
    # advantage scale of the batch's rows, the same for every estimator
    adv0 = tr.outputs[0]["advantages"].abs()
    assert logs["adv/abs_mean"] == pytest.approx(float(adv0.mean()), rel=1e-5)
    assert logs["adv/abs_max"] == pytest.approx(float(adv0.max()), rel=1e-5)


def test_frac_reward_zero_std_matches_trl_group_reading(tmp_path):
    tr = recording(tmp_path)
    tr.train()
    for rec, b in zip(tr.state.log_history[:2], tr.batches):
        r = b.rewards.view(-1, 4)
        tied = (r.max(1).values == r.min(1).values).float().mean().item()
        assert rec["frac_reward_zero_std"] == pytest.approx(tied)
        if "gate/tied_share" in rec:
            assert rec["gate/tied_share"] == pytest.approx(tied)


# --------------------------------------------------------------------------------------------------- pure advantages
def test_trl_grpo_advantages_ragged_matches_numpy():
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, float("nan"), 0.0, 2.0, 3.0, 7.0])
    gids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 3, 3, 3])
    for scale in ("group", "batch", "none"):
        adv, std = trl_grpo_advantages(rewards, gids, scale_rewards=scale)
        np.testing.assert_allclose(adv.numpy(), numpy_grpo(rewards.numpy(), gids.numpy(), scale), rtol=1e-5,
                                   atol=1e-6)
    # singleton group and tied group -> advantage 0; NaN row -> 0
    adv, std = trl_grpo_advantages(rewards, gids)
    assert adv[6] == 0 and adv[3] == 0 and adv[4] == 0 and adv[5] == 0
    assert torch.isnan(std[6]) and std[3] == 0


def test_trl_grpo_advantages_pad_rows_are_ignored():
    rewards = torch.tensor([0.0, 1.0, 1.0, float("nan")])
    gids = torch.tensor([0, 0, 0, -1])
    adv, _ = trl_grpo_advantages(rewards, gids)
    ref, _ = trl_grpo_advantages(rewards[:3], gids[:3])
    assert adv[3] == 0
    torch.testing.assert_close(adv[:3], ref, rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(1, 6),
    g=st.integers(1, 5),
    data=st.data(),
    scale=st.sampled_from(["group", "batch", "none"]),
)
def test_uniform_path_equals_ragged_path(k, g, data, scale):
    vals = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, float("nan"), -2.0, 3.25]), min_size=k * g,
                              max_size=k * g))
    rewards = torch.tensor(vals, dtype=torch.float32)
    gids = torch.arange(k * g) // g
    uniform, _ = trl_grpo_advantages(rewards, gids, scale_rewards=scale)
    # one pad row forces the ragged (index_add) path
    ragged, _ = trl_grpo_advantages(torch.cat([rewards, torch.tensor([5.0])]), torch.cat([gids, torch.tensor([-1])]),
                                    scale_rewards=scale)
    assert ragged[-1] == 0  # batch std uses valid rows only, so the pad row changes nothing else
    torch.testing.assert_close(ragged[:-1], uniform, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(uniform).all()


def test_trl_grpo_advantages_bad_input():
    with pytest.raises(ValueError, match="scale_rewards"):
        trl_grpo_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), scale_rewards="bad")
    with pytest.raises(ValueError, match=r"\(N,\)"):
        trl_grpo_advantages(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="normalize_then_sum needs"):
        trl_grpo_advantages(torch.zeros(3), torch.tensor([0, 0, 1]), aggregation="normalize_then_sum")


# --------------------------------------------------------------------------------------------------- variable rollouts
class _KPerPrompt(RolloutStrategy):
    """2-4 rollouts per unique prompt decided by the dataset row (a stand-in for V0.5 / PAIR rounds)."""

    name = "k_per_prompt"

    def __init__(self, requested: list):
        self.requested = requested

    def rollout(self, api, inputs):
        if api.mode != "train":
            return RolloutGroups.trl()
        rows, gids = [], []
        for i, x in enumerate(inputs):
            k = VariableRolloutTrainer.rollouts_for(x)
            rows += [x] * k
            gids += [i] * k
        # two "rounds" to exercise repeated generation calls
        half = len(rows) // 2
        c1, _ = api.generate(rows[:half])
        c2, _ = api.generate(rows[half:])
        self.requested.append([VariableRolloutTrainer.rollouts_for(x) for x in inputs])
        return RolloutGroups(rows=rows, completion_ids=c1 + c2, group_ids=gids)


class _Given(RolloutStrategy):
    """Hands the base trainer a fixed RolloutGroups (drives the one replay path directly)."""

    name = "given"

    def __init__(self, groups: RolloutGroups):
        self.groups = groups

    def rollout(self, api, rows):
        return self.groups


def replay(tr, **fields) -> dict:
    """TRL's output for the rollouts ``fields`` describe, through the base's one path (strategy -> replay ->
    batch -> estimator -> update)."""
    tr.rollout_strategy = _Given(RolloutGroups(**fields))
    return tr._generate_and_score_completions(list(fields["rows"]))


class VariableRolloutTrainer(RecordingTrainer):
    """Unique prompts; 2-4 rollouts per prompt through a rollout strategy."""

    unique_prompt_sampler = True

    @staticmethod
    def rollouts_for(row) -> int:
        return 2 + row["trl_ext_row_idx"] % 3

    def create_rollout_strategy(self):
        self.requested = []
        return _KPerPrompt(self.requested)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_variable_rollouts_per_prompt(tmp_path, loss_type):
    tr = recording(tmp_path, cls=VariableRolloutTrainer, per_device_train_batch_size=3,
                   gradient_accumulation_steps=2, num_generations=2, max_steps=2, loss_type=loss_type)
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.train()
    assert tr.num_generations == 1
    assert len(tr.batches) == 2  # 2 optimizer steps x GA 2 / spg 2: one generation per optimizer step
    b, out, ks = tr.batches[0], tr.outputs[0], tr.requested[0]
    n_real = sum(ks)
    assert len(ks) == 6  # 3 x spg 2 unique prompts
    assert len(set(b.row_idx[~b.is_pad].tolist())) == 6
    assert b.num_rows % 2 == 0 and b.num_rows - n_real == int(b.is_pad.sum()) < 2
    assert b.group_sizes.tolist() == ks
    assert (b.group_ids[b.is_pad] == -1).all() and torch.isnan(b.rewards[b.is_pad]).all()
    # pads: no loss tokens, zero advantage, excluded from num_items_in_batch
    assert (out["completion_mask"][b.is_pad] == 0).all()
    assert out["num_items_in_batch"].item() == int(out["completion_mask"].sum())
    assert int(out["completion_mask"][~b.is_pad].sum()) == int(b.completion_lengths.sum())
    assert (out["advantages"][b.is_pad] == 0).all()
    # ragged GRPO advantages equal the direct formula
    ref = numpy_grpo(b.rewards.numpy(), b.group_ids.numpy())
    # sequence-level losses average over all rows: the base rescales by N / n_real so pads do not dilute
    # (applied once, in the loss: the micro-batch's policy denominator B * P * spg rows becomes n_real)
    np.testing.assert_allclose(out["advantages"].numpy(), ref, rtol=1e-5, atol=1e-6)
    micro = {"advantages": out["advantages"][: b.num_rows // 2], "ext_real_rows": out["ext_real_rows"],
             "num_items_in_batch": out["num_items_in_batch"]}
    scale = tr._ext_policy_scale(micro)
    if loss_type == "grpo":
        assert float(scale) == pytest.approx(b.num_rows / n_real)
    else:
        assert scale is None
    # training moved the weights and the token metrics count only real rollouts
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, tr.model.parameters()))
    assert tr.state.log_history[0]["ext/rollouts"] == n_real


def test_local_scoring_equals_trl_scoring(tmp_path):
    tr = make_trainer(tmp_path, reward_funcs=[hash_reward, binary_reward])
    tr.model.train()
    ds = tr.train_dataset
    rows = [dict(ds[0])] * 3 + [dict(ds[1])] * 2
    c_ids, lps = tr.generate_rollouts(rows)
    assert lps is None and len(c_ids) == 5
    local = tr.score_rollouts_local(rows, c_ids)
    texts = tr.processing_class.batch_decode(c_ids, skip_special_tokens=True)
    assert local[:, 0].tolist() == hash_reward(None, texts) and local[:, 1].tolist() == binary_reward(None, texts)
    out_a = replay(tr, rows=rows, completion_ids=c_ids, group_ids=[0, 0, 0, 1, 1], rewards_per_func=local)
    batch_a = tr.last_rollout_batch
    out_b = replay(tr, rows=rows, completion_ids=c_ids, group_ids=[0, 0, 0, 1, 1])  # TRL's _calculate_rewards path
    assert torch.equal(batch_a.rewards_per_func, tr.last_rollout_batch.rewards_per_func)
    assert torch.equal(out_a["advantages"], out_b["advantages"])
    assert tr.generate_rollouts([]) == ([], None)
    assert tr.score_rollouts_local([], []).shape == (0, 2)


def test_strategy_pad_rows(tmp_path):
    tr = make_trainer(tmp_path, loss_type="grpo")
    tr.model.train()
    ds = tr.train_dataset
    rows = [dict(ds[0])] * 2 + [dict(ds[5])] + [dict(ds[1])] * 2
    c_ids, _ = tr.generate_rollouts(rows)
    out = replay(tr, rows=rows, completion_ids=c_ids, group_ids=[0, 0, 99, 1, 1],
                 is_pad=[False, False, True, False, False])
    b = tr.last_rollout_batch
    assert b.is_pad.tolist() == [False, False, True, False, False]
    assert b.group_ids.tolist() == [0, 0, -1, 1, 1] and torch.isnan(b.rewards[2])
    assert out["completion_mask"][2].sum() == 0 and out["advantages"][2] == 0
    assert out["num_items_in_batch"].item() == int(out["completion_mask"].sum())
    # a rank with nothing to contribute: one dummy rollout, entirely masked
    eos = tr.processing_class.eos_token_id
    out = replay(tr, **vars(RolloutGroups.pad_only(rows[0], eos, len(tr.reward_funcs))))
    assert tr.last_rollout_batch.num_groups == 0 and out["num_items_in_batch"].item() == 0
    with pytest.raises(ValueError, match="is_pad has"):
        replay(tr, rows=rows, completion_ids=c_ids, group_ids=[0] * 5, is_pad=[True])


def test_strategy_rollouts_bad_input(tmp_path):
    tr = make_trainer(tmp_path)
    tr.model.train()
    row = dict(tr.train_dataset[0])
    with pytest.raises(ValueError, match="no rollout on this rank"):
        replay(tr, rows=[], completion_ids=[], group_ids=[])
    with pytest.raises(ValueError, match="same length"):
        replay(tr, rows=[row, row], completion_ids=[[1]], group_ids=[0, 0])
    with pytest.raises(ValueError, match="contiguous"):
        replay(tr, rows=[row] * 3, completion_ids=[[1]] * 3, group_ids=[0, 1, 0])
    with pytest.raises(ValueError, match="rewards_per_func must have shape"):
        replay(tr, rows=[row] * 2, completion_ids=[[1]] * 2, group_ids=[0, 0], rewards_per_func=torch.zeros(3, 1))
    with pytest.raises(ValueError, match=r"side_inputs\['p'\] has 1 values"):
        replay(tr, rows=[row] * 2, completion_ids=[[1]] * 2, group_ids=[0, 0], side_inputs={"p": [0.5]})


class SingleRolloutTrainer(RecordingTrainer):
    """G = 1 through the standard TRL path with a batch-mean baseline (a REINFORCE++-style stand-in for BASIS)."""

    unique_prompt_sampler = True
    rollout_columns = ("a", "question_id")

    def compute_advantages(self, batch):
        r = batch.rewards
        return torch.nan_to_num(r - torch.nanmean(r[batch.valid]), nan=0.0)


def test_unique_prompt_sampler_and_rollout_columns(tmp_path):
    tr = recording(tmp_path, cls=SingleRolloutTrainer, per_device_train_batch_size=4, num_generations=2,
                   log_rollout_metadata=True)
    tr.train()
    b = tr.batches[0]
    assert b.num_rows == 4 and b.group_ids.tolist() == [0, 1, 2, 3]
    ds = tr.train_dataset
    assert b.extra["a"].tolist() == [float(ds[int(i)]["a"]) for i in b.row_idx]
    assert b.extra["question_id"] == [ds[int(i)]["question_id"] for i in b.row_idx]
    # TRL alone would give all-zero advantages with G = 1; the subclass baseline does not
    assert torch.equal(tr.trl_advantages[0], torch.zeros(4))
    expected = b.rewards - b.rewards.mean()
    torch.testing.assert_close(tr.outputs[0]["advantages"], expected)
    # gate has no eligible (>= 2 rollout) groups: shares are not logged, frac_reward_zero_std is not a fake 1.0
    rec = tr.state.log_history[0]
    assert rec["gate/eligible_groups"] == 0 and "gate/tied_share" not in rec
    assert rec.get("frac_reward_zero_std") is None
    assert list(tr._logs["extra"]["question_id"])[-4:] == tr.batches[-1].extra["question_id"]


def test_missing_rollout_column_is_a_clear_error(tmp_path):
    class Bad(GRPOTrainer):
        rollout_columns = ("value_prior",)

    tr = make_trainer(tmp_path, cls=Bad)
    with pytest.raises(KeyError, match="value_prior"):
        tr.train()


def test_compute_advantages_contract_is_enforced(tmp_path):
    class WrongShape(GRPOTrainer):
        def compute_advantages(self, batch):
            return torch.zeros(batch.num_rows + 1)

    class NonFinite(GRPOTrainer):
        def compute_advantages(self, batch):
            return torch.full((batch.num_rows,), float("inf"))

    with pytest.raises(ValueError, match="expected"):
        make_trainer(tmp_path, cls=WrongShape).train()
    with pytest.raises(ValueError, match="non-finite"):
        make_trainer(tmp_path, cls=NonFinite).train()


# --------------------------------------------------------------------------------------------------- state / resume
class CountingTrainer(GRPOTrainer):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.batches_seen = 0
        self.loaded = None

    def compute_advantages(self, batch):
        self.batches_seen += 1
        self.log_ext_metric("test/batches_seen", self.batches_seen)
        return super().compute_advantages(batch)

    def ext_state_dict(self):
        state = super().ext_state_dict()
        state["batches_seen"] = self.batches_seen
        state["history"] = torch.arange(self.batches_seen)
        return state

    def load_ext_state_dict(self, state):
        super().load_ext_state_dict(state)
        self.loaded = dict(state)
        self.batches_seen = state["batches_seen"]


def test_checkpoint_saves_and_resume_restores_ext_state(tmp_path):
    run1 = make_trainer(tmp_path / "a", cls=CountingTrainer, max_steps=3, save_strategy="steps", save_steps=1)
    run1.train()
    ck1 = tmp_path / "a" / "checkpoint-1"
    saved = torch.load(ck1 / EXT_STATE_FILE, weights_only=True)
    assert saved["batches_seen"] == 1 and saved["generation_batches"] == 1
    assert torch.equal(saved["history"], torch.arange(1))
    assert [r["test/batches_seen"] for r in run1.state.log_history if "test/batches_seen" in r] == [1, 2, 3]
    run2 = make_trainer(tmp_path / "a", cls=CountingTrainer, max_steps=3, save_strategy="no")
    run2.train(resume_from_checkpoint=str(ck1))
    assert run2.loaded["batches_seen"] == 1
    assert run2.batches_seen == 3
    # the resumed run regenerates the same completions (RNG state restored) and counts the same tokens
    assert run2._ext_totals == run1._ext_totals


def test_load_ext_state_dict_rejects_foreign_state(tmp_path):
    tr = make_trainer(tmp_path)
    with pytest.raises(ValueError, match="trl_ext_version"):
        tr.load_ext_state_dict({"foo": 1})


def test_log_ext_metric_reaches_logs(tmp_path):
    class M(GRPOTrainer):
        def compute_advantages(self, batch):
            self.log_ext_metric("mine/value", torch.tensor(2.5))
            return super().compute_advantages(batch)

    tr = make_trainer(tmp_path, cls=M)
    tr.train()
    assert all(r["mine/value"] == 2.5 for r in tr.state.log_history[:2])


# --------------------------------------------------------------------------------------------------- tie-break
def test_tie_break_blend_in_trainer(tmp_path):
    from trl_ext.estimators import tie_break_blend

    tr = recording(tmp_path, reward_funcs=[binary_reward, length_score], tie_break_scorer_index=1,
                   tie_break_epsilon=0.1, reward_weights=[1.0, 0.0])
    tr.train()
    for b, out in zip(tr.batches, tr.outputs):
        grades = b.rewards_per_func[:, 0]
        assert torch.equal(b.grades, grades)
        expected = tie_break_blend(grades.numpy(), b.rewards_per_func[:, 1].numpy(), b.group_ids.numpy(), 0.1)
        np.testing.assert_allclose(b.rewards.numpy(), expected, rtol=0, atol=1e-6)
        # the blend never overrules the checker: every right rollout beats every wrong one in its group
        for g in range(b.num_groups):
            r, gr = b.rewards[b.group_ids == g], grades[b.group_ids == g]
            if (gr == 1).any() and (gr == 0).any():
                assert r[gr == 1].min() > r[gr == 0].max()
        ref = numpy_grpo(b.rewards.numpy(), b.group_ids.numpy())
        np.testing.assert_allclose(out["advantages"].numpy(), ref, rtol=1e-5, atol=1e-5)
    rec = tr.state.log_history[0]
    assert {"tie_break/groups_opened", "tie_break/frac_opened", "tie_break/frac_tied_by_checker"} <= set(rec)


def test_tie_break_nan_scores_keep_their_grade(tmp_path):
    def flaky_score(prompts, completions, **kw):
        return [None if len(c) % 2 else float(len(c)) for c in completions]

    tr = recording(tmp_path, reward_funcs=[binary_reward, flaky_score], tie_break_scorer_index=1, max_steps=1)
    tr.train()
    b = tr.batches[0]
    nan_rows = torch.isnan(b.rewards_per_func[:, 1])
    assert nan_rows.any() and (~nan_rows).any()
    assert torch.equal(b.rewards[nan_rows], b.grades[nan_rows])  # no rank bonus, grade kept
    assert torch.isfinite(b.rewards).all()
    assert tr.state.log_history[0]["tie_break/nan_scores"] == float(nan_rows.sum())


def test_evaluate_goes_through_the_base(tmp_path):
    from base_helpers import tiny_dataset

    tr = make_trainer(tmp_path, per_device_eval_batch_size=8)
    tr.eval_dataset = tiny_dataset(8, seed=3).add_column("trl_ext_row_idx", list(range(8)))
    metrics = tr.evaluate()
    assert "eval_gate/eligible_groups" in metrics and metrics["eval_ext/rollouts"] == 8
    assert tr.last_rollout_batch.mode == "eval"
    assert tr._ext_totals["generated_tokens_total"] == 0  # eval tokens are not training tokens


def _synthetic_batch(grades, scores, gids):
    n = len(grades)
    from trl_ext.estimators import tie_break_blend

    g = torch.tensor(grades, dtype=torch.float32)
    s = torch.tensor(scores, dtype=torch.float32)
    blended = torch.tensor(tie_break_blend(g.numpy(), s.numpy(), np.array(gids), 0.1), dtype=torch.float32)
    return RolloutBatch(rewards=blended, rewards_per_func=torch.stack([g, s], 1), group_ids=torch.tensor(gids),
                        row_idx=torch.tensor(gids), prompts=["p"] * n, completion_lengths=torch.ones(n, dtype=torch.long),
                        is_pad=torch.zeros(n, dtype=torch.bool), grades=g)


@pytest.mark.parametrize("floor,expected_tied_scale", [(1e-9, 1.0), (4.0, 0.5), (1e6, 2e-6)])
def test_confidence_scaling_by_noise_floor(tmp_path, floor, expected_tied_scale):
    tr = make_trainer(tmp_path, reward_funcs=[binary_reward, length_score], tie_break_scorer_index=1,
                      tie_break_confidence_scaling=True, scorer_noise_floor=floor)
    tr.model.train()
    # group 0: checker-tied, scores spread 2.0 -> opened; group 1: mixed grades -> untouched
    b = _synthetic_batch([0, 0, 0, 0, 1, 0, 1, 0], [1.0, 2.0, 3.0, 2.5, 0.1, 0.2, 0.3, 0.4], [0] * 4 + [1] * 4)
    scale = tr._ext_confidence_scale(b)
    torch.testing.assert_close(scale[:4], torch.full((4,), expected_tied_scale), rtol=1e-5, atol=0)
    assert (scale[4:] == 1).all()


# --------------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kw,match",
    [
        ({"tie_break_epsilon": 0.0}, "tie_break_epsilon"),
        ({"tie_break_epsilon": float("nan")}, "tie_break_epsilon"),
        ({"tie_break_scorer_index": -1}, "tie_break_scorer_index"),
        ({"tie_break_confidence_scaling": True}, "tie_break_scorer_index"),
        ({"tie_break_confidence_scaling": True, "tie_break_scorer_index": 1}, "scorer_noise_floor"),
        ({"scorer_noise_floor": -1.0}, "scorer_noise_floor"),
        ({"gate_atol": -0.1}, "gate_atol"),
        ({"tie_break_scorer_index": 1, "multi_objective_aggregation": "normalize_then_sum"}, "sum_then_normalize"),
    ],
)
def test_config_validation(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        make_config(tmp_path, **kw)


def test_scorer_index_checked_against_reward_funcs(tmp_path):
    with pytest.raises(ValueError, match="out of range"):
        make_trainer(tmp_path, reward_funcs=[binary_reward, length_score], tie_break_scorer_index=2)
    with pytest.raises(ValueError, match="at least one checker"):
        make_trainer(tmp_path, reward_funcs=[binary_reward], tie_break_scorer_index=0)


def test_defaults_are_off_and_plain_grpo_config_is_accepted(tmp_path):
    import trl

    cfg = make_config(tmp_path)
    assert isinstance(cfg, ExtGRPOConfig) and not cfg.signal_only_denominator and cfg.tie_break_scorer_index is None
    from base_helpers import tiny_dataset, tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    plain = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                           max_completion_length=4, max_steps=1, use_cpu=True, bf16=False, report_to="none",
                           save_strategy="no")
    tr = GRPOTrainer(model=model, reward_funcs=[hash_reward], args=plain, train_dataset=tiny_dataset(8),
                     processing_class=tok)
    tr.train()
    assert tr.last_rollout_batch is not None and "gate/eligible_groups" in tr.state.log_history[0]


def test_keyed_sampling_through_variable_rollout_rounds(tmp_path):
    """Keyed sampling on the strategy path (generate_rollouts rounds): every logged rollout replays."""
    from trl_ext.measurement.replay import load_rollout_log, regenerate

    tr = recording(tmp_path, cls=VariableRolloutTrainer, per_device_train_batch_size=3, num_generations=2,
                   gradient_accumulation_steps=2, max_steps=1, keyed_sampling=True, temperature=1.3)  # fmt: skip
    init = tmp_path / "init"
    tr.model.save_pretrained(init)
    tr.train()
    recs = load_rollout_log(tmp_path / "rollouts" / "rank0.jsonl")
    ks = tr.requested[0]
    assert len(recs) == sum(ks)
    # the two rounds of one prompt continue its sample indices instead of reusing noise
    by_key = {}
    for r in recs:
        by_key.setdefault(r["key"], []).append(r["sample_index"])
    assert sorted(len(v) for v in by_key.values()) == sorted(ks)
    assert all(sorted(v) == list(range(len(v))) for v in by_key.values())
    from transformers import AutoModelForCausalLM

    m0 = AutoModelForCausalLM.from_pretrained(str(init), local_files_only=True)
    assert all(regenerate(m0, tr.processing_class, r) == r["completion_ids"] for r in recs)


# --------------------------------------------------------------------------------------------------- review fixes
def test_completions_table_holds_the_whole_variable_batch(tmp_path):
    """The completions table keeps every real rollout of a variable-size batch, with aligned columns.

    TRL sizes ``_logs`` deques to ``generation_batch_size``; a batch of a strategy's own rollouts holds more rows (several
    rollouts per unique prompt), so the table used to keep only the tail, and ``log_rollout_metadata`` columns
    (extended after the pad rows were dropped) ended up longer than ``prompt``: pandas refuses the table.
    """
    def tagged_reward(prompts, completions, log_extra=None, **kw):
        log_extra("completion_echo", list(completions))  # a log_extra column scored on the pad rows too
        return hash_reward(prompts, completions)

    tr = recording(tmp_path, cls=VariableRolloutTrainer, per_device_train_batch_size=3, num_generations=2,
                   gradient_accumulation_steps=2, max_steps=2, log_rollout_metadata=True, log_completions=True,
                   reward_funcs=[tagged_reward])
    tr.train()  # log_completions builds the parquet table at every log: raises on misaligned columns
    b = tr.batches[-1]
    n_real = int((~b.is_pad).sum())
    assert n_real > tr.args.generation_batch_size  # the batch really is larger than TRL's deques
    logs = tr._logs
    assert len(logs["prompt"]) == len(logs["completion"]) == len(logs["advantages"]) == n_real
    assert all(len(v) == n_real for v in logs["rewards"].values())
    assert list(logs["extra"]["row_idx"]) == b.row_idx[~b.is_pad].tolist()
    assert list(logs["extra"]["completion_echo"]) == list(logs["completion"])
    assert any(bb.is_pad.any() for bb in tr.batches)  # pad rows really were dropped from the table
    assert list(logs["prompt"]) == [p for p, pad in zip(b.prompts, b.is_pad.tolist()) if not pad]
    np.testing.assert_allclose(list(logs["advantages"]), tr.last_advantages[~b.is_pad].tolist(), rtol=1e-6)
    assert os.path.exists(tmp_path / "completions")


def test_ext_state_is_in_the_checkpoint_before_it_is_pushed(tmp_path):
    """``push_to_hub`` uploads each checkpoint from inside ``Trainer._save_checkpoint``; the trl_ext state must be
    written before that, or hub checkpoints (and resumes from them) silently lack it."""
    tr = make_trainer(tmp_path, max_steps=1, save_strategy="steps", save_steps=1)
    seen = []
    tr.args.push_to_hub = True  # after __init__: no hub repository is created (offline)
    tr._push_from_checkpoint = lambda folder: seen.append(os.path.exists(os.path.join(folder, EXT_STATE_FILE)))
    tr.train()
    assert seen == [True]


@pytest.mark.parametrize("num_generations", [8, 4])
def test_gradient_checkpointing_trains_the_base_bitwise_the_same(tmp_path, num_generations):
    """Plain GRPO through the base (the benchmark's ``grpo_g8`` / ``grpo_g4``) with gradient checkpointing trains to
    bitwise the same weights on CPU (two steps, two loss micro-batches per generation): the reason the benchmark
    harness lets a longer horizon borrow rates tuned without it (``WEIGHT_NEUTRAL_OVERRIDES``)."""
    weights = {}
    for gc in (False, True):
        tr = make_trainer(tmp_path / str(gc), num_generations=num_generations, per_device_train_batch_size=8,
                          gradient_accumulation_steps=2, steps_per_generation=2, gradient_checkpointing=gc)
        init = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
        tr.train()
        assert tr.args.gradient_checkpointing is gc and tr.model.is_gradient_checkpointing is gc
        weights[gc] = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
    assert all(torch.equal(weights[False][k], weights[True][k]) for k in weights[False])
    assert any(not torch.equal(weights[False][k], init[k]) for k in init)  # training moved the weights

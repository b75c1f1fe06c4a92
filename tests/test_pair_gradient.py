"""PAIR's policy gradient through the trainer's real loss path, against the complete-pair gradient it is
design-unbiased for (Theorem 2 of "Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR",
arXiv:2608.11368), and token alignment of probe + continuation.

Setting: the tiny testbed model (``build_tiny_model(build_tokenizer(), seed=0)``), two prompts, ``G = 4``, and a
frozen candidate population replayed by a stand-in generator (below the base trainer's hooks, like
``tests/scripts/pair_two_rank.py``): every candidate's full completion is fixed, the probe call returns its first
``tau`` tokens (cut after an EOS, as TRL's generation does) and the continuation call (``prompt + prefix``) returns
the rest. The population has a candidate that emits EOS *inside* the probe, one whose EOS is the last probe token
(both finished in the probe: ``pi = 1``), one that ends with EOS in the continuation and ones that run to the cap.

For every selection pattern ``J`` of the unfinished candidates (the design's ``draw_selection`` is forced), one
generation batch goes through the whole trainer path -- probe, design (real ``pair_design`` on fixed head
predictions), continuation, the base's replay, ``compute_advantages``, the base's policy scale and TRL's loss --
and ``backward`` gives the gradient on the policy parameters. The expected gradient over the design,
``sum_J P(J) grad(J)`` with ``P`` from the logged probabilities, must equal the complete-pair gradient
``-(1/(K L)) sum_k (1/M) sum_{i<j} (r_i - r_j)(s_i - s_j) / 2`` (``dapo``, ``s_i = grad sum_t log p``) or
``-(1/K) ...`` with ``s_i = grad mean_t log p`` (``grpo``), computed here independently from the model's
log-probabilities of the intended tokens. The same check with the realized normalizer or without the inclusion
weights fails (the test can fail).

Two settings: ``short`` (``L = 6``, ``tau = 2``) and ``long`` (``L = 32``, PAIR's default ``tau = L // 8 = 4``,
scratchpad-style completions of 3-32 tokens: the regime where PAIR was reported to degrade the policy), so the
gradient identity and the token alignment are checked where the probe and the continuation are both long.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np
import pytest
import torch

from trl_ext.estimators.pair import group_draw as pair_draw  # where design_and_draw looks up draw_selection
from trl_ext.trainers import _trl_compat as compat
from trl_ext.trainers._trl_compat import TRLGlue
from trl_ext.trainers.pair import PAIRConfig, PAIRTrainer

pytestmark = pytest.mark.filterwarnings("ignore::trl_ext.trainers.pair.PAIRShortProbeWarning")

G, L, TAU = 4, 6, 2
"""Candidates per prompt, ``max_completion_length``, probe tokens (the short setting)."""

# Per prompt: (completion as a string of digits, "E" = EOS; reward). Texts are distinct within a prompt.
POPULATION = {
    "12+30=": [("3E", 1.0),         # EOS at the last probe token: finished in the probe
               ("125E", 0.0),       # EOS in the continuation
               ("444444", 0.5),     # runs to the cap (no EOS)
               ("70E", 1.0)],       # EOS as the first continuation token
    "7+5=": [("E", 0.0),            # EOS as the first generated token: finished in the probe
             ("26610E", 1.0),
             ("880000", 0.0),
             ("531E", 1.0)],
}
P_HAT = {"12+30=": [0.9, 0.3, 0.6, 0.8], "7+5=": [0.5, 0.9, 0.2, 0.6]}
COST_HAT = {"12+30=": [1.0, 2.0, 4.0, 1.0], "7+5=": [1.0, 4.0, 4.0, 2.0]}
"""Fixed head predictions (the design is the real ``pair_design`` on these): a non-uniform design."""


class Setting(NamedTuple):
    G: int
    L: int
    TAU: int
    population: dict
    p_hat: dict
    cost_hat: dict


SHORT = Setting(G, L, TAU, POPULATION, P_HAT, COST_HAT)
# The long-completion setting (the regime where PAIR was reported to degrade the policy): scratchpad-style
# completions of 10-32 tokens, ``L = 32`` and PAIR's default probe ``tau = L // 8 = 4``; per prompt one candidate
# finishes inside the probe, one runs to the cap, the others end with EOS in the continuation.
LONG = Setting(4, 32, 4, {
    "12+30=": [("42E", 1.0),
               ("2+0+0=2,1+3+0=4|42E", 1.0),
               ("0+2+0=2,1+3+0=4|4200000000000000000", 0.0),
               ("5+5+0=10,1+3+1=5|50E", 0.0)],
    "7+5=": [("E", 0.0),
             ("7+5+0=12|12E", 1.0),
             ("5+7+0=12|1200000000000000000000000000", 0.0),
             ("1+1+1=3,0+0+0=0|3E", 0.0)],
}, {"12+30=": [0.9, 0.7, 0.6, 0.2], "7+5=": [0.5, 0.9, 0.3, 0.4]},
    {"12+30=": [1.0, 16.0, 28.0, 14.0], "7+5=": [1.0, 9.0, 28.0, 16.0]})
SETTINGS = {"short": SHORT, "long": LONG}


def _tokens(tok, s: str) -> list[int]:
    return [tok.eos_token_id if ch == "E" else tok.convert_tokens_to_ids(ch) for ch in s]


class FrozenBackend(TRLGlue):
    """Replays a fixed population in place of TRL's sampler (below the base's generated-token counter)."""

    population: dict = {}  # prompt token tuple -> list of full completions (token lists)

    def ext_generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                 has_tool_images=False):
        max_new = int(self.generation_config.max_new_tokens)
        self.__dict__.setdefault("generation_calls", []).append((len(prompt_ids), max_new))
        seen: dict = {}
        out = []
        for ids in prompt_ids:
            ids = list(ids)
            hits = [(p, c) for p, cands in self.population.items() if list(p) == ids[:len(p)]
                    for c in cands if c[:len(ids) - len(p)] == ids[len(p):]]
            p = max((h[0] for h in hits), key=len)
            m = len(ids) - len(p)
            cands = [c for q, c in hits if q == p]
            if m == 0:  # a prompt-only call: candidates in order of occurrence
                occ = seen.get(p, 0)
                seen[p] = occ + 1
                comp = cands[occ]
            else:  # a continuation from prompt + prefix: the prefix identifies the candidate
                assert len(cands) == 1, "ambiguous prefix in the frozen population"
                comp = cands[0]
            new = comp[m:m + max_new]
            if self.eos_token_id_ in new:  # what TRL returns: cut after the first EOS
                new = new[:new.index(self.eos_token_id_) + 1]
            out.append(new)
        return out, None


class FrozenPAIR(PAIRTrainer, FrozenBackend):
    pass


def build_trainer(tmp_path, loss_type: str, setting: Setting = SHORT, **over) -> FrozenPAIR:
    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset

    torch.set_num_threads(1)
    tok = build_tokenizer()
    G, L, TAU, POPULATION, P_HAT, COST_HAT = setting
    prompts = list(POPULATION)
    ds = make_dataset("addition", 2, seed=0).select_columns(["question_id"]).add_column("prompt", prompts)
    rewards = {(p, c.split("E")[0][:L]): r for p in prompts for c, r in POPULATION[p]}

    def reward(prompts, completions, **kw):
        return [rewards[(p, c)] for p, c in zip(prompts, completions)]

    kw = dict(output_dir=str(tmp_path), per_device_train_batch_size=2 * G, num_generations=G,
              max_completion_length=L, pair_prefix_tokens=TAU, max_steps=1, learning_rate=1e-3, use_cpu=True,
              bf16=False, report_to="none", beta=0.0, logging_steps=1, save_strategy="no", seed=0, temperature=1.0,
              dataloader_num_workers=0, disable_tqdm=True, pair_head_min_labels=8, pair_solver_warm_start=False,
              pair_budget_ratio=0.25, loss_type=loss_type)
    kw.update(over)
    tr = FrozenPAIR(model=build_tiny_model(tok, seed=0), reward_funcs=[reward], args=PAIRConfig(**kw),
                    train_dataset=ds, processing_class=tok)
    tr.eos_token_id_ = tok.eos_token_id
    tr.setting = setting
    tr.prompt_ids = dict(zip(prompts, compat.tokenize_prompts(tr, prompts)))  # exactly as TRL tokenizes them
    tr.population = {tuple(tr.prompt_ids[p]): [_tokens(tok, c) for c, _ in cands] for p, cands in POPULATION.items()}
    # heads "ready" with fixed predictions: the real pair_design runs on them, nothing is refit
    g = torch.Generator().manual_seed(0)
    h = tr.rollout_strategy.heads.heads.config["input_dim"]
    tr.rollout_strategy.heads.heads.add_labels(torch.randn(16, h, generator=g), torch.ones(16), torch.ones(16), torch.ones(16))
    pred = type(tr.rollout_strategy.heads.heads.predict(torch.zeros(1, h)))
    p_hat = torch.tensor([v for p in prompts for v in P_HAT[p]], dtype=torch.float32)
    c_hat = torch.tensor([v for p in prompts for v in COST_HAT[p]], dtype=torch.float32)
    tr.rollout_strategy.heads.heads.predict = lambda feats: pred(p_hat=p_hat.clone(), cost_hat=c_hat.clone(), n_nonfinite=0)
    tr.model.train()
    tr.current_gradient_accumulation_steps = 1
    tr.rows = [{"prompt": p, "question_id": ds[k]["question_id"], compat.ROW_IDX_COLUMN: k}
               for k, p in enumerate(prompts) for _ in range(G)]
    tr.rewards = {p: np.array([r for _, r in POPULATION[p]]) for p in prompts}
    return tr


def flat_grad(model) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().reshape(-1)
                      for p in model.parameters()])


def trainer_gradient(tr, patterns: list[np.ndarray]):
    """One generation batch through the whole trainer path with ``draw_selection`` forced to ``patterns`` (one per
    prompt, in order); returns (flat gradient of TRL's loss, the pi each draw was made with, the batch)."""
    queue = list(patterns)
    seen_pi = []

    def forced(pi, rng, anchor=None):
        seen_pi.append(np.asarray(pi, dtype=np.float64).copy())
        return np.asarray(queue.pop(0), dtype=bool).copy()

    orig = pair_draw.draw_selection
    pair_draw.draw_selection = forced
    try:
        tr.rollout_strategy.heads.needs_refresh = False
        out = tr._generate_and_score_completions(tr.rows)
    finally:
        pair_draw.draw_selection = orig
    assert not queue
    tr.model.zero_grad(set_to_none=True)
    loss = tr.compute_loss(tr.model, out)
    loss.backward()
    return flat_grad(tr.model), seen_pi, out


def expected_gradient(tr):
    """sum_J P(J) grad(J) over every selection pattern of the unfinished candidates of both prompts."""
    G = tr.setting.G
    _, pis, _ = trainer_gradient(tr, [np.ones(G, bool)] * 2)
    pi = [tr.rollout_strategy.design_log[k]["pi"] for k in range(2)]
    fin = [np.asarray(tr.rollout_strategy.design_log[k]["finished"], bool) for k in range(2)]
    unf = [np.flatnonzero(~f) for f in fin]
    total, expect = 0.0, None
    for bits in itertools.product([False, True], repeat=sum(len(u) for u in unf)):
        pats, prob, pos = [], 1.0, 0
        for k in range(2):
            sel = np.ones(G, bool)
            for i in unf[k]:
                sel[i] = bits[pos]
                prob *= pi[k][i] if bits[pos] else 1.0 - pi[k][i]
                pos += 1
            pats.append(sel)
        grad, seen, _ = trainer_gradient(tr, pats)
        for k in range(2):  # every draw was made with the same, logged design
            np.testing.assert_array_equal(seen[k], pis[k])
            np.testing.assert_array_equal(tr.rollout_strategy.design_log[k]["pi"], pi[k])
        expect = prob * grad if expect is None else expect + prob * grad
        total += prob
    assert total == pytest.approx(1.0, abs=1e-12)
    return expect, pi, fin


def complete_pair_gradient(tr, loss_type: str) -> torch.Tensor:
    """-(1/(K L)) sum_k g_pair,k (dapo) or -(1/K) sum_k g_pair,k (grpo), from the model's own log-probabilities of
    the intended tokens (no trainer code): g_pair = (1/M) sum_{i<j} (r_i - r_j)(s_i - s_j) / 2 (Eq. 3-4)."""
    tok = tr.processing_class
    model = tr.model
    G, L, _, POPULATION = tr.setting[:4]
    K, M = len(POPULATION), G * (G - 1) / 2
    scores = {}
    for p, cands in POPULATION.items():
        p_ids = list(tr.prompt_ids[p])
        for i, (c, _) in enumerate(cands):
            c_ids = _tokens(tok, c)[:L]
            ids = torch.tensor([p_ids + c_ids])
            model.zero_grad(set_to_none=True)
            logits = model(input_ids=ids).logits[0, len(p_ids) - 1:-1] / tr.args.temperature
            lp = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(c_ids)[:, None]).squeeze(1)
            (lp.sum() if loss_type == "dapo" else lp.mean()).backward()
            scores[(p, i)] = flat_grad(model)
    norm = K * L if loss_type == "dapo" else K
    g = torch.zeros_like(next(iter(scores.values())))
    for p, cands in POPULATION.items():
        r = [v for _, v in cands]
        for i, j in itertools.combinations(range(G), 2):
            g += 0.5 * (r[i] - r[j]) * (scores[(p, i)] - scores[(p, j)]) / M
    return -g / norm


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("setting", ["short", "long"])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_expected_gradient_over_the_design_equals_the_complete_pair_gradient(tmp_path, loss_type, setting):
    tr = build_trainer(tmp_path, loss_type, SETTINGS[setting])
    G = tr.setting.G
    target = complete_pair_gradient(tr, loss_type)
    expect, pi, fin = expected_gradient(tr)
    # the design is non-uniform, finished candidates have pi = 1, the smallest pi gives edge weights > 25
    for k in range(2):
        assert np.all(np.asarray(pi[k])[fin[k]] == 1.0) and fin[k].sum() == 1
    pi_unf = np.concatenate([np.asarray(pi[k])[~fin[k]] for k in range(2)])
    assert np.ptp(pi_unf) > 0.15 and 1.0 / pi_unf.min() ** 2 > 25, pi_unf
    assert rel_err(expect, target) < 1e-5, rel_err(expect, target)
    # the trainer's complete design (every candidate continued, weights 1) gives the target draw by draw
    full = build_trainer(tmp_path / "full", loss_type, SETTINGS[setting], pair_budget_ratio=1.0)
    g_full, _, _ = trainer_gradient(full, [np.ones(G, bool)] * 2)
    assert all(np.all(np.asarray(d["pi"]) == 1.0) for d in full.rollout_strategy.design_log)
    assert rel_err(g_full, target) < 1e-5, rel_err(g_full, target)


@pytest.mark.parametrize("mutation", ["realized_normalizer", "unweighted", "sqrt_weights"])
def test_the_expected_gradient_check_can_fail(tmp_path, monkeypatch, mutation):
    """The same enumeration detects a wrong normalizer (TRL's realized token count: ``pair_fixed_normalizer=False``)
    and wrong weights (none: ``pi = 1``; ``1/sqrt(pi_i pi_j)`` instead of ``1/(pi_i pi_j)``). (Editing the source --
    the normalizer ``K`` to ``K + 1``, or the edge weights floored at ``rho >= 0.1``, i.e. clipped at 10 -- makes
    the main test fail with relative errors 0.33 and 0.23-0.29.)"""
    loss_type = "dapo"
    over = {"pair_fixed_normalizer": False} if mutation == "realized_normalizer" else {}
    tr = build_trainer(tmp_path, loss_type, **over)
    target = complete_pair_gradient(tr, loss_type)
    if mutation != "realized_normalizer":
        # training runs Eq. 13 through the registered "pair_draw" estimator, which calls group_draw.draw_advantages
        from trl_ext.estimators.pair import group_draw

        orig = group_draw.draw_advantages
        fix = (lambda pi: np.ones_like(pi)) if mutation == "unweighted" else np.sqrt

        def mutated(rewards, draw, **kw):
            import dataclasses

            return orig(rewards, dataclasses.replace(draw, pi=fix(np.asarray(draw.pi))), **kw)

        monkeypatch.setattr(group_draw, "draw_advantages", mutated)
    expect, _, _ = expected_gradient(tr)
    assert rel_err(expect, target) > 0.1, rel_err(expect, target)


@pytest.mark.parametrize("setting", ["short", "long"])
def test_loss_sees_exactly_the_sampled_tokens_of_probe_and_continuation(tmp_path, setting):
    """Every completed candidate reaches TRL's loss as probe + continuation, token for token: the EOS included and
    nothing after it, the completion mask covering exactly those tokens; candidates that finished inside the probe
    (EOS as the first token, EOS as the last probe token) are never continued; the others are continued once from
    ``prompt + prefix`` with ``L - tau`` new tokens at most."""
    tr = build_trainer(tmp_path, "dapo", SETTINGS[setting])
    G, L, TAU, POPULATION = tr.setting[:4]
    _, _, out = trainer_gradient(tr, [np.ones(G, bool)] * 2)
    assert tr.generation_calls == [(2 * G, TAU), (2 * G - 2, L - TAU)]
    ids, mask = out["completion_ids"], out["completion_mask"]
    prompts = tr.processing_class.batch_decode(out["prompt_ids"], skip_special_tokens=True)
    assert ids.shape[0] == 2 * G and bool(mask.bool().all(dim=0).any())
    for row in range(ids.shape[0]):
        got = ids[row][mask[row].bool()].tolist()
        p = prompts[row]
        want = [t for t in (_tokens(tr.processing_class, c)[:L] for c, _ in POPULATION[p]) if t == got]
        assert len(want) == 1, (p, got)
        n = int(mask[row].sum())
        assert bool(mask[row, :n].all()) and not bool(mask[row, n:].any())  # one contiguous run from the start
        assert tr.eos_token_id_ not in got[:-1]
    # the logged design: finished in the probe <=> EOS within the first TAU tokens
    for k, p in enumerate(POPULATION):
        fin = [tr.eos_token_id_ in _tokens(tr.processing_class, c)[:TAU] for c, _ in POPULATION[p]]
        assert tr.rollout_strategy.design_log[k]["finished"] == fin
        assert tr.rollout_strategy.design_log[k]["realized_suffix_tokens"] == [
            0 if f else len(_tokens(tr.processing_class, c)[:L]) - TAU for f, (c, _) in zip(fin, POPULATION[p])]


def test_real_generator_probe_and_continuation_alignment(tmp_path):
    """With TRL's own transformers sampler (the untrained tiny model, ``tau = 3``, ``L = 12``): the tokens and mask
    of every completed row in the batch are exactly the probe tokens ``generate_token_ids`` returned plus, for
    candidates not finished in the probe, the continuation tokens it returned for ``prompt + probe``; EOS, if any,
    is the last masked token; finished-in-probe candidates (some finish at the first token) are not continued."""
    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset

    torch.set_num_threads(1)
    tok = build_tokenizer()
    args = PAIRConfig(output_dir=str(tmp_path), per_device_train_batch_size=32, num_generations=8,
                      max_completion_length=12, pair_prefix_tokens=3, max_steps=1, use_cpu=True, bf16=False,
                      report_to="none", beta=0.0, save_strategy="no", seed=0, temperature=1.0, disable_tqdm=True,
                      dataloader_num_workers=0, pair_budget_ratio=0.6)
    tr = PAIRTrainer(model=build_tiny_model(tok, seed=0), reward_funcs=[lambda prompts, completions, **kw: [
        float(len(c) % 2) for c in completions]], args=args, train_dataset=make_dataset("addition", 4, seed=0),
        processing_class=tok)
    calls = []
    orig = tr.generate_token_ids

    def spy(prompt_ids, **kw):
        c, lp = orig(prompt_ids, **kw)
        calls.append(([list(p) for p in prompt_ids], kw.get("max_new_tokens"), [list(x) for x in c]))
        return c, lp

    tr.generate_token_ids = spy
    tr.model.train()
    ds = make_dataset("addition", 4, seed=0)
    rows = [{**dict(ds[k]), compat.ROW_IDX_COLUMN: k} for k in range(4) for _ in range(8)]
    torch.manual_seed(0)
    out = tr._generate_and_score_completions(rows)
    (probe_in, probe_cap, probes), (cont_in, cont_cap, conts) = calls
    assert probe_cap == 3 and cont_cap == 12 - 3
    eos = tok.eos_token_id
    finished = [eos in p or len(p) < 3 for p in probes]
    assert sum(finished) >= 2 and any(p[:1] == [eos] for p in probes), probes  # the test exercises both cases
    cont_of = {}
    for ids, c in zip(cont_in, conts):
        j = [j for j, (pi, pr) in enumerate(zip(probe_in, probes)) if pi + pr == ids and not finished[j]]
        assert j and j[0] not in cont_of
        cont_of[j[0]] = c
    assert not any(finished[j] for j in cont_of)
    log = [d for d in tr.rollout_strategy.design_log]
    expected_rows = []
    for k, d in enumerate(log):
        for i in range(8):
            if d["selected"][i]:
                j = k * 8 + i
                assert d["finished"][i] == finished[j]
                expected_rows.append(probes[j] + ([] if finished[j] else cont_of[j]))
    ids, mask = out["completion_ids"], out["completion_mask"]
    assert ids.shape[0] == len(expected_rows)
    for row, want in enumerate(expected_rows):
        got = ids[row][mask[row].bool()].tolist()
        assert got == want[:12], (row, got, want)
        assert eos not in got[:-1]
        n = int(mask[row].sum())
        assert not bool(mask[row, n:].any())

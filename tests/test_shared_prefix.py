"""Exactness tests for trl_ext.measurement.shared_prefix (shared-prefix rollouts).

(a) Keyed: completions are identical to :func:`keyed_generate` (the non-shared keyed path) for the same keys and
    sample indices, over several G, temperatures, top-k/top-p/min-p, early EOS (two EOS ids), repeated prompts in
    shuffled row order, left padding and position offsets, on the testbed model and on a peaked tiny model where
    branches really are shared.
(b) Unkeyed: the law of the completions equals independent sampling, by exact enumeration of the sequence law on a
    tiny model (vocabulary 6, completions of at most 3 tokens) and a chi-square goodness-of-fit test on counts
    pooled over many calls (see ``test_unkeyed_law_matches_exact_enumeration`` for the power).
(c) Deliberately wrong samplers (a fork that does not split, one draw shared by a branch, draws without
    replacement, a wrong cache row, positions ignoring the left padding) are run through the same checks and
    must be caught: the tests can fail.
(d) Counters, settings validation, EOS truncation.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from scipy import stats
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

import trl_ext.measurement.shared_prefix as sp
from trl_ext.measurement.keyed_sampling import SamplerSettings, keyed_generate, prompt_key_of, request_key
from trl_ext.measurement.shared_prefix import (
    KeyedRows,
    build_warpers,
    count_forward_tokens,
    settings_from_generation_config,
    shared_prefix_generate,
)
from trl_ext.testbed import build_tiny_model, build_tokenizer

torch.set_num_threads(1)

ALPHA = 1e-4  # chi-square rejection level (seeded generators: the tests are deterministic)
_REAL_FORK = sp._fork  # the correct fork, kept before any monkeypatching


# ----------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def testbed_model(tok):
    return build_tiny_model(tok, seed=0)


def _peaked_model(seed: int = 0, std: float = 0.3, vocab: int = 6):
    """A 2-layer Llama with vocabulary 6 (0 pad, 1 eos) and large random weights: context-dependent, peaked
    next-token laws, so G rollouts share prefixes and the law of 3-token completions is small enough to enumerate."""
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=0,
        eos_token_id=1, bos_token_id=None,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
        for name, p in model.named_parameters():
            if "norm" not in name:
                torch.nn.init.normal_(p, std=std)
    return model.float().eval()


@pytest.fixture(scope="module")
def peaked_model():
    return _peaked_model()


def _rows_and_keys(prompts, g, *, seed=3, step=7, shuffle=True):
    """Each prompt g times (the first prompt a second time as a second group: sample indices g..2g-1), rows
    shuffled; keys as the trainer builds them."""
    rows, keys, sidx = [], [], []
    for p in prompts:
        k = request_key(seed, step, prompt_key_of(p))
        for j in range(g):
            rows.append(list(p))
            keys.append(k)
            sidx.append(j)
    k0 = request_key(seed, step, prompt_key_of(prompts[0]))
    for j in range(g, 2 * g):
        rows.append(list(prompts[0]))
        keys.append(k0)
        sidx.append(j)
    order = list(range(len(rows)))
    if shuffle:
        random.Random(len(rows)).shuffle(order)
    return [rows[i] for i in order], [keys[i] for i in order], [sidx[i] for i in order]


# ----------------------------------------------------------------------------------------------- (a) keyed
KEYED_CASES = [
    # (G, temperature, top_k, top_p, min_p)
    (1, 1.0, None, None, None),
    (4, 1.0, None, None, None),
    (8, 0.7, None, None, None),
    (16, 1.0, 5, None, None),
    (8, 0.7, None, 0.8, None),
    (16, 0.5, 8, 0.9, 0.05),
]


@pytest.mark.parametrize("g,temperature,top_k,top_p,min_p", KEYED_CASES)
def test_keyed_identical_to_keyed_generate_testbed(tok, testbed_model, g, temperature, top_k, top_p, min_p):
    prompts = [tok(s)["input_ids"] for s in ("12+34=", "7+5=", "99+1=", "3+48=")]  # lengths 6, 4, 5, 5
    rows, keys, sidx = _rows_and_keys(prompts, g)
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids("3")]  # a second EOS id: many rollouts end early
    s = SamplerSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, max_new_tokens=10,
                        eos_token_ids=eos, pad_token_id=tok.pad_token_id)  # fmt: skip
    want = keyed_generate(testbed_model, rows, keys, sidx, s)
    got, st = shared_prefix_generate(testbed_model, rows, s, keyed=KeyedRows(keys, sidx))
    assert got == want
    assert any(len(c) < 10 and c[-1] in eos for c in got)  # early EOS happened
    assert all(c.count(e) <= 1 for c in got for e in eos) and all(1 <= len(c) <= 10 for c in got)
    assert st["unique_prompts"] == len(prompts) and st["generated_tokens"] == sum(map(len, got))


@pytest.mark.parametrize("g,temperature,top_k,top_p", [(4, 1.0, None, None), (16, 0.7, 4, None), (32, 1.0, None, 0.9)])
def test_keyed_identical_to_keyed_generate_peaked(peaked_model, g, temperature, top_k, top_p):
    """On a peaked model most decode positions are shared: the identity then covers real shared branches."""
    prompts = [[2, 3, 4, 5, 3, 2], [4, 2], [5, 5, 3]]
    rows, keys, sidx = _rows_and_keys(prompts, g)
    s = SamplerSettings(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=12, eos_token_ids=[1])
    want = keyed_generate(peaked_model, rows, keys, sidx, s)
    got, st = shared_prefix_generate(peaked_model, rows, s, keyed=KeyedRows(keys, sidx))
    assert got == want
    assert st["decode_shared_fraction"] > 0.05 and st["forks"] > 0
    assert st["computed_tokens"] < st["independent_tokens"]


def test_keyed_position_offsets_and_requests(peaked_model):
    """``position_offsets`` and KeyedRequest-like objects, with num_per_prompt expansion."""

    class Req:
        def __init__(self, key, sample_index, position_offset):
            self.key, self.sample_index, self.position_offset = key, sample_index, position_offset

    prompts = [[2, 3, 4], [5, 2]]
    g = 6
    rows = [p for p in prompts for _ in range(g)]
    reqs = [Req(1234 + i // g, i % g, 3 * (i % 2)) for i in range(len(rows))]
    s = SamplerSettings(temperature=0.9, max_new_tokens=8, eos_token_ids=[1])
    want = keyed_generate(peaked_model, rows, [r.key for r in reqs], [r.sample_index for r in reqs], s,
                          position_offsets=[r.position_offset for r in reqs])  # fmt: skip
    got, _ = shared_prefix_generate(peaked_model, prompts, s, num_per_prompt=g, keyed=reqs)
    assert got == want


def test_keyed_is_row_local(peaked_model):
    """A row's completion depends on its own (key, sample index) only, not on which rows share its call."""
    prompts = [[2, 3, 4, 5], [4, 2]]
    rows, keys, sidx = _rows_and_keys(prompts, 8)
    s = SamplerSettings(temperature=1.0, max_new_tokens=10, eos_token_ids=[1])
    full, _ = shared_prefix_generate(peaked_model, rows, s, keyed=KeyedRows(keys, sidx))
    for i in (0, 5, len(rows) - 1):
        alone, _ = shared_prefix_generate(peaked_model, [rows[i]], s, keyed=KeyedRows([keys[i]], [sidx[i]]))
        assert alone[0] == full[i]
    unshared, _ = shared_prefix_generate(peaked_model, rows, s, keyed=KeyedRows(keys, sidx), share=False)
    assert unshared == full


# ----------------------------------------------------------------------------------------------- (b) unkeyed law
LAW_PROMPTS = ([2, 3, 4, 5, 3], [4, 2])  # the second is left-padded by 3 in the prefill
LAW_SETTINGS = [
    SamplerSettings(temperature=1.0, max_new_tokens=3, eos_token_ids=[1]),
    SamplerSettings(temperature=0.7, top_k=4, top_p=0.9, max_new_tokens=3, eos_token_ids=[1]),
]


@torch.no_grad()
def _exact_law(model, prompt, settings: SamplerSettings) -> dict[tuple[int, ...], float]:
    """Exact law of EOS-truncated completions: product of next-token probabilities computed on the UNPADDED
    prompt + prefix (no cache), warped by transformers' own warpers, enumerating every prefix."""
    warpers = build_warpers(settings)
    eos = set(settings.eos_token_ids)
    law: dict[tuple[int, ...], float] = {}
    frontier = [((), 1.0)]
    for t in range(settings.max_new_tokens):
        if not frontier:
            break
        ids = torch.tensor([list(prompt) + list(pre) for pre, _ in frontier])
        logits = model(input_ids=ids).logits[:, -1, :].float()
        probs = torch.softmax(warpers(ids, logits).double(), dim=-1)
        nxt = []
        for (pre, pp), row in zip(frontier, probs.tolist()):
            for v, q in enumerate(row):
                if q <= 0.0:
                    continue
                seq = pre + (v,)
                if v in eos or t == settings.max_new_tokens - 1:
                    law[seq] = law.get(seq, 0.0) + pp * q
                else:
                    nxt.append((seq, pp * q))
        frontier = nxt
    assert abs(sum(law.values()) - 1.0) < 1e-9
    return law


def _chi_square(counts: Counter, law: dict, n: int) -> tuple[float, int]:
    """Pearson chi-square of ``counts`` against ``law``; cells with expected count < 5 are pooled into one."""
    assert set(counts) <= set(law), f"impossible completions sampled: {sorted(set(counts) - set(law))[:5]}"
    stat, df, rare_o, rare_e = 0.0, -1, 0, 0.0
    for seq, p in law.items():
        e, o = n * p, counts.get(seq, 0)
        if e < 5:
            rare_o, rare_e = rare_o + o, rare_e + e
            continue
        stat += (o - e) ** 2 / e
        df += 1
    if rare_e > 0:
        stat += (rare_o - rare_e) ** 2 / rare_e
        df += 1
    return stat, df


def _law_p_value(model, settings, *, g: int, calls: int, seed: int = 0) -> float:
    """Sample ``calls`` shared-prefix calls of ``g`` rows per prompt (both prompts in every call, rows
    interleaved), pool the counts per prompt and return the p-value of the summed chi-square."""
    gen = torch.Generator().manual_seed(seed)
    rows = [list(LAW_PROMPTS[i % 2]) for i in range(2 * g)]
    counts = [Counter(), Counter()]
    for _ in range(calls):
        comps, _ = shared_prefix_generate(model, rows, settings, generator=gen)
        for i, c in enumerate(comps):
            counts[i % 2][tuple(c)] += 1
    total, dof = 0.0, 0
    for k, prompt in enumerate(LAW_PROMPTS):
        stat, df = _chi_square(counts[k], _exact_law(model, prompt, settings), g * calls)
        total, dof = total + stat, dof + df
    return float(stats.chi2.sf(total, dof))


@pytest.mark.parametrize("settings", LAW_SETTINGS, ids=["T1", "T0.7-k4-p0.9"])
def test_unkeyed_law_matches_exact_enumeration(peaked_model, settings):
    """Empirical completion frequencies vs the exact law (chi-square, alpha = 1e-4).

    300 calls x G = 32 rows per prompt = 9,600 completions per prompt, two prompts (the second left-padded by
    3 in every prefill), pooled into one chi-square: df = 214 (T = 1) / 36 (T = 0.7, top-k 4, top-p 0.9) after
    pooling the cells with expected count < 5. Power at alpha = 1e-4 against a deviation of Cohen's effect size
    ``w`` (noncentrality ``lambda = N w^2``, N = 19,200; ``scipy.stats.ncx2.sf(chi2.isf(1e-4, df), df, N w^2)``):
    w = 0.05 -> 0.07 / 0.66, w = 0.07 -> 0.61 / 0.998, w = 0.1 -> 0.9996 / >0.9999. Draws that are shared by
    (or correlated within) a branch inflate the variance of the pooled counts and are caught too:
    ``test_law_test_catches_wrong_samplers`` runs five deliberately wrong samplers through the same check with a
    third of the samples (100 calls) and each gets p < 1e-300 (measured 2026-12-01; at 30 calls all p < 1e-20).
    """
    p = _law_p_value(peaked_model, settings, g=32, calls=300)
    assert p > ALPHA, f"shared-prefix completions do not follow the exact law (p = {p:.2e})"


def _fork_without_split(branch_of, tokens, vocab):
    """WRONG: members stay in their branch even when they drew different tokens (the branch feeds the first
    member's token)."""
    uniq, inverse = torch.unique(branch_of, sorted=True, return_inverse=True)
    first = torch.zeros(uniq.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(inverse.numel()), reduce="amin", include_self=False)
    return uniq, tokens[first], inverse


def _draw_shared(scores, branch_of, generator):
    """WRONG: one draw per branch, copied to every member."""
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[branch_of, 0]


def _draw_without_replacement(scores, branch_of, generator):
    """WRONG: the members of a branch draw distinct tokens while they can."""
    probs = torch.softmax(scores, dim=-1)
    rank = sp._ranks_within(branch_of, scores.shape[0])
    k = min(int(rank.max()) + 1, int((probs > 0).sum(-1).min()))
    draws = torch.multinomial(probs, k, replacement=False, generator=generator)
    return draws[branch_of, rank % k]


def _fork_wrong_cache_row(branch_of, tokens, vocab):
    """WRONG: after a split the new branches get their cache rows in reverse order."""
    parent, feed, inverse = _REAL_FORK(branch_of, tokens, vocab)
    return parent.flip(0), feed, inverse


def _positions_ignoring_padding(mask):
    """WRONG: decode positions counted from the padded block start."""
    return torch.full((mask.shape[0], 1), mask.shape[1] - 1, dtype=mask.dtype)


WRONG = {
    "fork-without-split": ("_fork", _fork_without_split),
    "shared-draw": ("_draw_unkeyed", _draw_shared),
    "without-replacement": ("_draw_unkeyed", _draw_without_replacement),
    "wrong-cache-row": ("_fork", _fork_wrong_cache_row),
    "positions-ignore-padding": ("_decode_positions", _positions_ignoring_padding),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_law_test_catches_wrong_samplers(peaked_model, monkeypatch, name):
    """The chi-square check of ``test_unkeyed_law_matches_exact_enumeration`` (100 calls) rejects each wrong
    sampler."""
    attr, fn = WRONG[name]
    monkeypatch.setattr(sp, attr, fn)
    p = _law_p_value(peaked_model, LAW_SETTINGS[0], g=32, calls=100)
    assert p < ALPHA, f"the law test did not catch the wrong sampler {name!r} (p = {p:.2e})"


@pytest.mark.parametrize("name", ["fork-without-split", "wrong-cache-row", "positions-ignore-padding"])
def test_keyed_identity_catches_wrong_forks(peaked_model, monkeypatch, name):
    """The keyed identity check fails for a wrong fork / cache row / position."""
    attr, fn = WRONG[name]
    prompts = [[2, 3, 4, 5, 3, 2], [4, 2], [5, 5, 3]]
    rows, keys, sidx = _rows_and_keys(prompts, 16)
    s = SamplerSettings(temperature=1.0, max_new_tokens=12, eos_token_ids=[1])
    want = keyed_generate(peaked_model, rows, keys, sidx, s)
    monkeypatch.setattr(sp, attr, fn)
    got, _ = shared_prefix_generate(peaked_model, rows, s, keyed=KeyedRows(keys, sidx))
    assert got != want


# ----------------------------------------------------------------------------------------------- (d) counters
def test_counters(peaked_model):
    prompts = [[2, 3, 4, 5, 3], [4, 2]]
    g = 16
    s = SamplerSettings(temperature=1.0, max_new_tokens=8, eos_token_ids=[1])
    gen = torch.Generator().manual_seed(1)
    with count_forward_tokens(peaked_model) as hooked:
        comps, st = shared_prefix_generate(peaked_model, prompts, s, num_per_prompt=g, generator=gen)
    assert hooked["tokens"] == st["forward_tokens"] == st["prefill_tokens"] + st["decode_tokens"]
    assert hooked["calls"] == st["forward_calls"]
    assert st["prefill_tokens"] == 2 * 5 and st["prompt_tokens"] == 5 + 2  # two distinct prompts, one padded
    assert st["generated_tokens"] == sum(map(len, comps))
    assert st["independent_tokens"] == g * (5 + 2) + sum(len(c) - 1 for c in comps)
    assert st["computed_tokens"] == st["prompt_tokens"] + st["decode_tokens"]
    assert 0 < st["shared_fraction"] <= 1 and 0 < st["decode_shared_fraction"] <= 1
    assert st["decode_shared_fraction"] == st["decode_shared_positions"] / st["decode_tokens"]
    assert st["shared_positions"] == st["decode_shared_positions"] + 5 + 2  # both prompts serve g >= 2 rows
    assert set(st) == set(sp.STATS_KEYS)
    assert st["saved_fraction"] == pytest.approx(1 - st["computed_tokens"] / st["independent_tokens"])
    # the decode tree: every distinct proper prefix of a continuing completion is computed exactly once
    # (a decode position feeds the t-th token of the rows that continue past it: it serves every such row)
    served = Counter((i // g, tuple(c[:t])) for i, c in enumerate(comps) for t in range(1, len(c)))
    assert st["decode_tokens"] == len(served)
    assert st["decode_shared_positions"] == sum(n >= 2 for n in served.values())
    assert st["max_branches"] <= 2 * g and st["forward_calls"] == max(map(len, comps))

    gen = torch.Generator().manual_seed(1)
    _, un = shared_prefix_generate(peaked_model, prompts, s, num_per_prompt=g, generator=gen, share=False)
    assert un["unique_prompts"] == 2 * g and un["shared_positions"] == 0 and un["shared_fraction"] == 0.0
    assert un["computed_tokens"] == un["independent_tokens"] and un["saved_fraction"] == 0.0


def test_eos_truncation_and_length_cap(peaked_model):
    s = SamplerSettings(temperature=1.0, max_new_tokens=5, eos_token_ids=[1, 3])
    comps, _ = shared_prefix_generate(peaked_model, [[2, 4], [5]], s, num_per_prompt=50,
                                      generator=torch.Generator().manual_seed(0))  # fmt: skip
    for c in comps:
        assert 1 <= len(c) <= 5
        ends = [i for i, x in enumerate(c) if x in (1, 3)]
        assert ends in ([], [len(c) - 1])  # the first EOS is kept and is the last token
        if not ends:
            assert len(c) == 5
    assert any(len(c) < 5 for c in comps) and any(len(c) == 5 for c in comps)


def test_settings_from_generation_config_and_refusals(peaked_model):
    gc = GenerationConfig(do_sample=True, temperature=0.8, top_k=0, top_p=0.95, min_p=None, max_new_tokens=6,
                          eos_token_id=[1], pad_token_id=0, repetition_penalty=1.0)  # fmt: skip
    s = settings_from_generation_config(gc)
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.max_new_tokens, s.eos_token_ids) == (0.8, None, 0.95, None, 6,
                                                                                              [1])  # fmt: skip
    comps, _ = shared_prefix_generate(peaked_model, [[2, 3]], gc, num_per_prompt=4)
    assert len(comps) == 4
    with pytest.raises(ValueError, match="repetition_penalty"):
        settings_from_generation_config(GenerationConfig(do_sample=True, max_new_tokens=4, repetition_penalty=1.2))
    with pytest.raises(ValueError, match="greedy"):
        settings_from_generation_config(GenerationConfig(do_sample=False, max_new_tokens=4))
    with pytest.raises(ValueError, match="repetition_penalty"):
        shared_prefix_generate(peaked_model, [[2]], SamplerSettings(repetition_penalty=1.1))
    with pytest.raises(ValueError, match="one of each per row"):
        shared_prefix_generate(peaked_model, [[2], [3]], SamplerSettings(), keyed=KeyedRows([1], [0]))
    with pytest.raises(ValueError, match="at least one token"):
        shared_prefix_generate(peaked_model, [[]], SamplerSettings())

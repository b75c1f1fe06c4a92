"""Tests for trl_ext.measurement.keyed_sampling (keyed Gumbel-max sampling) and the mixin's guards."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from trl_ext.measurement.keyed_noise import _mul32, _triple32
from trl_ext.measurement.keyed_sampling import (
    HASH_VERSION,
    KeyedGumbelLogitsProcessor,
    SamplerSettings,
    keyed_generate,
    keyed_gumbel,
    keyed_uniform,
    left_pad,
    per_request_seed,
    prompt_key_of,
    request_key,
    truncate_at_eos,
)

torch.set_num_threads(1)

U32 = st.integers(0, 2**32 - 1)
KEY = st.integers(0, 2**63 - 1)
IDX = st.integers(0, 2**32 - 1)


def _py_triple32(x: int) -> int:
    m = 0xFFFFFFFF
    x ^= x >> 17
    x = (x * 0xED5AD4BB) & m
    x ^= x >> 11
    x = (x * 0xAC4C1B51) & m
    x ^= x >> 15
    x = (x * 0x31848BAB) & m
    x ^= x >> 14
    return x


# ----------------------------------------------------------------------------- hash arithmetic
@given(st.lists(U32, min_size=1, max_size=50), U32)
def test_mul32_is_exact_modular_product(xs, c):
    got = _mul32(torch.tensor(xs, dtype=torch.int64), c).tolist()
    assert got == [(x * c) % 2**32 for x in xs]


@given(st.lists(U32, min_size=1, max_size=50))
def test_triple32_matches_python_reference(xs):
    assert _triple32(torch.tensor(xs, dtype=torch.int64)).tolist() == [_py_triple32(x) for x in xs]


def test_triple32_is_injective_on_a_range():
    x = torch.arange(0, 200_000, dtype=torch.int64) * 7919 + 12345
    assert torch.unique(_triple32(x)).numel() == x.numel()


# ----------------------------------------------------------------------------- noise
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(KEY, IDX, IDX), min_size=1, max_size=6), st.integers(1, 40))
def test_uniform_shape_range_dtype(rows, v):
    k, s, p = zip(*rows)
    u = keyed_uniform(list(k), list(s), list(p), v)
    assert u.shape == (len(rows), v) and u.dtype == torch.float64
    assert bool(((u > 0) & (u < 1)).all())
    # within a row the 52-bit words are distinct (triple32 is a bijection)
    for row in u:
        assert torch.unique(row).numel() == v
    g = keyed_gumbel(list(k), list(s), list(p), v)
    assert bool(torch.isfinite(g).all())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(KEY, IDX, IDX), min_size=2, max_size=8), st.data())
def test_row_noise_does_not_depend_on_other_rows(rows, data):
    """Each row's noise equals the noise computed for that row alone (no shared RNG stream)."""
    k, s, p = zip(*rows)
    batch = keyed_gumbel(list(k), list(s), list(p), 17)
    i = data.draw(st.integers(0, len(rows) - 1))
    alone = keyed_gumbel([k[i]], [s[i]], [p[i]], 17)
    assert torch.equal(batch[i : i + 1], alone)
    perm = data.draw(st.permutations(range(len(rows))))
    shuffled = keyed_gumbel([k[j] for j in perm], [s[j] for j in perm], [p[j] for j in perm], 17)
    assert torch.equal(shuffled, batch[list(perm)])


@given(KEY, IDX, IDX)
def test_each_coordinate_changes_the_noise(k, s, p):
    base = keyed_uniform([k], [s], [p], 32)
    k2 = k + 1 if k < 2**63 - 1 else k - 1
    s2 = s + 1 if s < 2**32 - 1 else s - 1
    p2 = p + 1 if p < 2**32 - 1 else p - 1
    for other in (
        keyed_uniform([k2], [s], [p], 32),
        keyed_uniform([k], [s2], [p], 32),
        keyed_uniform([k], [s], [p2], 32),
    ):
        # independent rows: essentially no coordinate coincides
        assert int((other == base).sum()) == 0


def test_uniforms_are_uniform_and_uncorrelated():
    n = 4000
    u = keyed_uniform(list(range(n)), [3] * n, [5] * n, 25)
    assert stats.kstest(u.flatten().numpy(), "uniform").pvalue > 1e-3
    # consecutive keys, consecutive vocab entries, consecutive positions: no linear correlation
    c_vocab = np.corrcoef(u[:, :-1].flatten(), u[:, 1:].flatten())[0, 1]
    c_key = np.corrcoef(u[:-1].flatten(), u[1:].flatten())[0, 1]
    up = keyed_uniform([7] * n, [0] * n, list(range(n)), 25)
    c_pos = np.corrcoef(up[:-1].flatten(), up[1:].flatten())[0, 1]
    bound = 4 / math.sqrt(u.numel())
    assert abs(c_vocab) < bound and abs(c_key) < bound and abs(c_pos) < bound
    g = keyed_gumbel(list(range(n)), [0] * n, [0] * n, 25).flatten().numpy()
    assert stats.kstest(g, "gumbel_r").pvalue > 1e-3


# ----------------------------------------------------------------------------- processor: marginal law
def _winners(logits: torch.Tensor, n: int, position: int = 0, **kw) -> np.ndarray:
    proc = KeyedGumbelLogitsProcessor(list(range(1000, 1000 + n)), [0] * n, prompt_length=3, **kw)
    ids = torch.zeros((n, 3 + position), dtype=torch.long)
    out = proc(ids, logits.float().expand(n, -1).clone())
    assert torch.equal(out.max(dim=1).values, torch.zeros(n))  # one finite entry per row
    assert bool((torch.isfinite(out).sum(dim=1) == 1).all())
    return out.argmax(dim=1).numpy()


def _chi2_pvalue(winners: np.ndarray, probs: np.ndarray) -> float:
    counts = np.bincount(winners, minlength=probs.size)
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a filtered token was sampled"
    return stats.chisquare(counts[keep], probs[keep] / probs[keep].sum() * winners.size).pvalue


LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 1.5])


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_marginal_is_softmax(temperature):
    n = 20000
    w = _winners(LOGITS, n, temperature=temperature)
    probs = torch.softmax(LOGITS.double() / temperature, 0).numpy()
    assert _chi2_pvalue(w, probs) > 1e-3


def test_marginal_with_top_k_top_p_min_p_matches_filtered_softmax():
    n = 20000
    # top-k=3: tokens 0, 7, 1
    p = torch.softmax(LOGITS.double(), 0).numpy()
    pk = np.where(np.isin(np.arange(8), [0, 7, 1]), p, 0.0)
    assert _chi2_pvalue(_winners(LOGITS, n, top_k=3), pk) > 1e-3
    # top-p=0.6: smallest set with mass >= 0.6, HF semantics
    order = np.argsort(-p)
    kept = order[: int(np.searchsorted(np.cumsum(p[order]), 0.6) + 1)]
    pp = np.where(np.isin(np.arange(8), kept), p, 0.0)
    assert _chi2_pvalue(_winners(LOGITS, n, top_p=0.6), pp) > 1e-3
    # min_p=0.2: keep tokens with prob >= 0.2 * max prob
    pm = np.where(p >= 0.2 * p.max(), p, 0.0)
    assert _chi2_pvalue(_winners(LOGITS, n, min_p=0.2), pm) > 1e-3


def test_winner_is_argmax_of_keyed_race_and_position_is_generated_index():
    n = 64
    proc = KeyedGumbelLogitsProcessor(list(range(n)), [1] * n, prompt_length=4, temperature=0.8)
    scores = torch.randn(n, 11, generator=torch.Generator().manual_seed(0))
    ids = torch.zeros((n, 6), dtype=torch.long)  # generated position 2
    race = proc.keyed_scores(ids, scores)
    # temperature is applied by transformers' own warper in the logits' dtype (float32), then the race runs in float64
    expect = (scores / 0.8).double() + keyed_gumbel(list(range(n)), [1] * n, [2] * n, 11)
    assert torch.equal(race, expect)
    assert torch.equal(proc(ids, scores).argmax(1), race.argmax(1))
    # a longer (more padded) prompt block at the same generated position gives the same winner
    proc2 = KeyedGumbelLogitsProcessor(list(range(n)), [1] * n, prompt_length=9, temperature=0.8)
    assert torch.equal(proc2(torch.zeros((n, 11), dtype=torch.long), scores), proc(ids, scores))


def test_processor_bad_input():
    proc = KeyedGumbelLogitsProcessor([1, 2], [0, 1], prompt_length=3)
    with pytest.raises(ValueError, match="NaN in rows \\[1\\]"):
        proc(torch.zeros((2, 3), dtype=torch.long), torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]))
    with pytest.raises(ValueError, match="3 rows but the processor was built for 2 keys"):
        proc(torch.zeros((3, 3), dtype=torch.long), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="fewer than prompt_length"):
        proc(torch.zeros((2, 2), dtype=torch.long), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="one value per row"):
        KeyedGumbelLogitsProcessor([1, 2], [0], prompt_length=3)
    with pytest.raises(ValueError, match="empty"):
        KeyedGumbelLogitsProcessor([], [], prompt_length=3)
    with pytest.raises(ValueError, match=r"keys must lie in"):
        keyed_uniform([-1], [0], [0], 4)
    with pytest.raises(TypeError, match="integers"):
        keyed_uniform([1.5], [0], [0], 4)
    with pytest.raises(ValueError, match="keys must be integers in"):
        keyed_uniform([2**64], [0], [0], 4)
    with pytest.raises(ValueError, match="positions must lie in"):
        keyed_uniform([1], [0], [2**32], 4)
    with pytest.raises(ValueError, match="vocab_size"):
        keyed_uniform([1], [0], [0], 0)
    with pytest.raises(ValueError, match="temperature"):
        KeyedGumbelLogitsProcessor([1], [0], prompt_length=1, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplerSettings(top_p=1.5)


# ----------------------------------------------------------------------------- keys
def test_request_key_range_and_sensitivity():
    base = request_key(42, 3, "q1")
    assert 0 <= base < 2**63
    assert base == request_key(42, 3, "q1")
    others = {request_key(43, 3, "q1"), request_key(42, 4, "q1"), request_key(42, 3, "q2"),
              request_key(42, 3, "q1", mode="eval"), request_key(42, 3, 1)}  # fmt: skip
    assert base not in others and len(others) == 5
    with pytest.raises(ValueError, match="step"):
        request_key(1, -1, "q")
    with pytest.raises(TypeError, match="prompt_key"):
        request_key(1, 1, 1.5)
    with pytest.raises(TypeError, match="seed"):
        request_key("1", 1, "q")


def test_keys_are_stable_across_processes():
    """blake2b keys do not depend on Python's per-process hash randomisation."""
    code = (
        "from trl_ext.measurement.keyed_sampling import request_key, prompt_key_of, per_request_seed;"
        "pk = prompt_key_of([{'role': 'user', 'content': '1+2='}]);"
        "print(pk, request_key(7, 11, pk), per_request_seed(request_key(7, 11, pk), 3))"
    )
    outs = set()
    for hs in ("0", "123"):
        env = {**os.environ, "PYTHONHASHSEED": hs}
        outs.add(
            subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        )
    pk = prompt_key_of([{"content": "1+2=", "role": "user"}])  # key order does not matter
    assert outs == {f"{pk} {request_key(7, 11, pk)} {per_request_seed(request_key(7, 11, pk), 3)}\n"}


def test_per_request_seed_distinct_and_validated():
    seeds = {per_request_seed(k, s) for k in range(50) for s in range(8)}
    assert len(seeds) == 400 and all(0 <= x < 2**63 for x in seeds)
    with pytest.raises(ValueError, match="sample_index"):
        per_request_seed(1, -1)
    with pytest.raises(ValueError, match="key"):
        per_request_seed(2**63, 0)


def test_settings_roundtrip_and_version_guard():
    s = SamplerSettings(temperature=0.7, top_k=5, max_new_tokens=3, eos_token_ids=1, pad_token_id=0)
    assert s.eos_token_ids == [1]
    assert SamplerSettings.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="noise hash"):
        SamplerSettings.from_dict({**s.to_dict(), "hash_version": "other/v0"})
    with pytest.raises(ValueError, match="unknown sampler setting"):
        SamplerSettings.from_dict({**s.to_dict(), "beam": 3})
    assert s.hash_version == HASH_VERSION


def test_left_pad_and_truncate():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=0, pad_to_multiple_of=4)
    assert ids.tolist() == [[0, 5, 6, 7], [0, 0, 0, 8]] and mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    with pytest.raises(ValueError, match="empty"):
        left_pad([[1], []], 0)
    assert truncate_at_eos(torch.tensor([[3, 1, 0, 0], [4, 5, 6, 7]]), [1]) == [[3, 1], [4, 5, 6, 7]]


# ----------------------------------------------------------------------------- generation with a tiny model
@pytest.fixture(scope="module")
def tiny():
    from trl_ext.testbed.model import build_tiny_model
    from trl_ext.testbed.tokenizer import build_tokenizer

    tok = build_tokenizer()
    return tok, build_tiny_model(tok, seed=3)


def _settings(tok, **kw):
    return SamplerSettings(max_new_tokens=kw.pop("max_new_tokens", 8), eos_token_ids=[tok.eos_token_id],
                           pad_token_id=tok.pad_token_id, **kw)  # fmt: skip


PROMPTS = ["1+2=", "12+34=", "99+1=", "7+70=", "0+0=", "55+55="]


def test_byte_identical_regeneration_at_fixed_batch_shape(tiny):
    tok, model = tiny
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    keys = [request_key(0, 0, prompt_key_of(p)) for p in PROMPTS]
    s = _settings(tok, temperature=1.3)  # hot: long, varied completions
    first = keyed_generate(model, ids, keys, [0, 1, 2, 3, 4, 5], s)
    assert len({tuple(c) for c in first}) > 1
    for _ in range(20):
        assert keyed_generate(model, ids, keys, [0, 1, 2, 3, 4, 5], s) == first
    # a different key changes the samples
    assert keyed_generate(model, ids, [k + 1 for k in keys], [0, 1, 2, 3, 4, 5], s) != first


def test_row_output_independent_of_batch_companions_on_cpu(tiny):
    tok, model = tiny
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    keys = list(range(100, 106))
    s = _settings(tok, temperature=1.3, top_k=10)
    full = keyed_generate(model, ids, keys, [0] * 6, s)
    for i in range(6):
        assert keyed_generate(model, [ids[i]], [keys[i]], [0], s) == [full[i]]
    rev = keyed_generate(model, ids[::-1], keys[::-1], [0] * 6, s)
    assert rev == full[::-1]
    # padded to a multiple of 16 (a different prompt block width): same tokens
    assert keyed_generate(model, ids, keys, [0] * 6, s, pad_to_multiple_of=16) == full


def test_continuation_with_position_offset_equals_single_pass(tiny):
    tok, model = tiny
    ids = tok("12+34=")["input_ids"]
    # suppress EOS (an extra generation kwarg, kept under keyed sampling) so every completion has full length
    extra = {"suppress_tokens": [tok.eos_token_id]}
    one = keyed_generate(model, [ids], [9], [2], _settings(tok, temperature=1.5, extra_generation_kwargs=extra))[0]
    assert len(one) == 8 and tok.eos_token_id not in one
    head = keyed_generate(model, [ids], [9], [2],
                          _settings(tok, temperature=1.5, max_new_tokens=3, extra_generation_kwargs=extra))[0]  # fmt: skip
    assert head == one[:3]
    five = _settings(tok, temperature=1.5, max_new_tokens=5, extra_generation_kwargs=extra)
    tail = keyed_generate(model, [ids + head], [9], [2], five, position_offsets=[3])[0]
    assert head + tail == one
    # without the offset the continuation sees position-0 noise: different tokens
    assert keyed_generate(model, [ids + head], [9], [2], five)[0] != tail


# ----------------------------------------------------------------------------- sampler guards (stand-in trainer)
def _standin(**args):
    """A ``KeyedSampler`` over a stand-in trainer (the attributes TRL's __init__ would set)."""
    from transformers import GenerationConfig

    from trl_ext.generation.keyed_sampler import KeyedSampler

    base = dict(seed=0, generation_kwargs=None, keyed_sampling=True, keyed_sampling_seed=None,
                keyed_sampling_key_column=None, keyed_sampling_log=True, shared_prefix_rollouts=False)
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(**{**base, **args}), use_vllm=False,
                                    use_transformers_continuous_batching=False,
                                    generation_config=GenerationConfig(max_new_tokens=4, pad_token_id=0,
                                                                       eos_token_id=1, do_sample=True))
    return KeyedSampler(trainer)


def test_sampler_guards():
    on = _standin()
    with pytest.raises(RuntimeError, match="set_requests"):
        on.generate([[1]], None, {}, 2)
    on.trainer.use_vllm, on.trainer.vllm_mode = True, "server"  # vLLM: colocate with TP 1 only (test_keyed_vllm.py)
    with pytest.raises(NotImplementedError, match="vllm_mode='colocate' only"):
        on.generate([[1]], None, {}, 2)
    on.trainer.use_vllm = False
    with pytest.raises(NotImplementedError, match="multimodal"):
        on.generate([[1]], [["img"]], {}, 2)
    with pytest.raises(TypeError, match="KeyedRequest"):
        on.set_requests([1, 2])
    on.trainer.tools = [print]
    with pytest.raises(NotImplementedError, match="tool-calling"):
        on.check_supported()


def test_sampler_rejects_generation_kwargs_it_cannot_honour():
    from transformers import GenerationConfig

    for gk, msg in (({"do_sample": False}, "do_sample"), ({"typical_p": 0.9}, "typical_p"),
                    ({"num_return_sequences": 2}, "num_return_sequences")):  # fmt: skip
        with pytest.raises(ValueError, match=msg):  # at construction, not at the first generation
            _standin(generation_kwargs=gk)
    obj = _standin()
    obj.trainer.args.generation_kwargs = {"no_repeat_ngram_size": 2, "top_k": 5}
    obj.trainer.generation_config = GenerationConfig(max_new_tokens=4, pad_token_id=0, eos_token_id=1, top_k=5,
                                                     temperature=0.9, do_sample=True)  # fmt: skip
    s = obj.settings()
    assert s.extra_generation_kwargs == {"no_repeat_ngram_size": 2} and s.top_k == 5 and s.temperature == 0.9


def test_sampler_sample_indices_count_occurrences_and_continue_rounds():
    from trl_ext.measurement.keyed_sampling import prompt_key_of as pko

    obj = _standin(keyed_sampling_seed=5)
    t = obj.trainer
    t.model = types.SimpleNamespace(training=True)
    t.state = types.SimpleNamespace(global_step=3)
    t.accelerator = types.SimpleNamespace(num_processes=1, process_index=0)
    rows = [{"prompt": "a"}, {"prompt": "a"}, {"prompt": "b"}, {"prompt": "a"}, {"prompt": "b"}]
    reqs = obj.requests_for_rows(rows)
    assert [r.sample_index for r in reqs] == [0, 1, 0, 2, 1]
    assert [r.key for r in reqs] == [request_key(5, 3, pko(x["prompt"])) for x in rows]
    # a second round at the same step continues the count instead of reusing round one's noise
    more = obj.requests_for_rows(rows[:3])
    assert [r.sample_index for r in more] == [3, 4, 2]
    # an explicit count overrides the internal one and leaves it untouched
    assert [r.sample_index for r in obj.requests_for_rows(rows[:2], already_drawn={pko("a"): 10})] == [10, 11]
    assert [r.sample_index for r in obj.requests_for_rows(rows[:1])] == [5]
    t.state.global_step = 4  # a new step starts from 0 again
    assert [r.sample_index for r in obj.requests_for_rows(rows[:2])] == [0, 1]
    t.model.training = False  # eval keys differ from train keys at the same step, and count separately
    ev = obj.requests_for_rows(rows[:1])[0]
    assert ev.sample_index == 0 and ev.key == request_key(5, 4, pko("a"), mode="eval") != reqs[0].key

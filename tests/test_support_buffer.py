"""Tests for the V0.5 support buffer (FIFO, capacity, deterministic context sampling, checkpoint round trip)."""

import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_ext.priors import SupportBuffer


def _fill(buf, n, start=0):
    prompts = [f"q{i}" for i in range(start, start + n)]
    outcomes = np.linspace(0, 1, n) if n > 1 else np.full(n, 0.5)
    buf.add(prompts, outcomes)
    return prompts, outcomes


def test_fifo_order_and_capacity():
    buf = SupportBuffer(capacity=5, context_size=3, seed=0)
    buf.add(["a", "b", "c"], [0.0, 1.0, 0.5])
    buf.add(["d", "e", "f", "g"], [1.0, 1.0, 0.0, 0.25])
    prompts, outcomes = buf.items()
    assert prompts == ["c", "d", "e", "f", "g"]  # oldest two evicted, order kept
    np.testing.assert_array_equal(outcomes, [0.5, 1.0, 1.0, 0.0, 0.25])
    assert len(buf) == 5 and buf.n_added == 7


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 20),
    batches=st.lists(st.lists(st.floats(0, 1), max_size=12), max_size=8),
)
def test_fifo_matches_last_capacity_items(capacity, batches):
    buf = SupportBuffer(capacity=capacity, context_size=1)
    all_p, all_y = [], []
    for b in batches:
        ps = [f"p{len(all_p) + i}" for i in range(len(b))]
        buf.add(ps, b)
        all_p += ps
        all_y += b
    prompts, outcomes = buf.items()
    assert prompts == all_p[-capacity:] if all_p else prompts == []
    np.testing.assert_array_equal(outcomes, np.asarray(all_y[-capacity:] if all_y else [], dtype=float))
    assert len(buf) == min(capacity, len(all_p)) and buf.n_added == len(all_p)


def test_empty_buffer_gives_empty_context():
    buf = SupportBuffer()
    prompts, outcomes = buf.sample_context(0)
    assert prompts == [] and outcomes.shape == (0,)


def test_small_buffer_returns_everything():
    buf = SupportBuffer(capacity=10, context_size=8)
    prompts, outcomes = _fill(buf, 6)
    cp, co = buf.sample_context(3)
    assert cp == prompts
    np.testing.assert_array_equal(co, outcomes)


def test_context_is_a_subset_without_replacement_and_deterministic():
    buf = SupportBuffer(capacity=512, context_size=256, seed=7)
    _fill(buf, 600)  # 88 evicted
    cp, co = buf.sample_context(11)
    assert len(cp) == 256 and len(set(cp)) == 256
    all_p, all_y = buf.items()
    pos = {p: i for i, p in enumerate(all_p)}
    idx = [pos[p] for p in cp]
    assert idx == sorted(idx)  # oldest first
    np.testing.assert_array_equal(co, all_y[idx])  # outcomes stay paired with their prompts
    cp2, co2 = buf.sample_context(11)
    assert cp2 == cp and np.array_equal(co2, co)
    assert buf.sample_context(12)[0] != cp  # another step, another context


def test_identical_adds_give_identical_contexts_on_every_rank():
    ranks = [SupportBuffer(capacity=64, context_size=16, seed=3) for _ in range(2)]
    rng = np.random.default_rng(0)
    for step in range(10):
        gathered_p = [f"s{step}-{i}" for i in range(12)]
        gathered_y = rng.random(12)
        for r in ranks:
            r.add(gathered_p, gathered_y)
        c0, c1 = ranks[0].sample_context(step), ranks[1].sample_context(step)
        assert c0[0] == c1[0] and np.array_equal(c0[1], c1[1])
        assert ranks[0].fingerprint() == ranks[1].fingerprint()
    other = SupportBuffer(capacity=64, context_size=16, seed=4)
    with pytest.warns(UserWarning, match="seed=3"):  # saved seed 3, current config seed 4 wins
        other.load_state_dict(ranks[0].state_dict())
    assert other.items()[0] == ranks[0].items()[0]
    assert other.sample_context(9)[0] != ranks[0].sample_context(9)[0]  # the seed matters


def test_sampling_is_uniform_over_positions():
    buf = SupportBuffer(capacity=40, context_size=10, seed=0)
    _fill(buf, 40)
    counts = np.zeros(40)
    steps = 2000
    for s in range(steps):
        counts[buf.sample_indices(s)] += 1
    freq = counts / steps
    # each position is included with probability 10/40; binomial sd = sqrt(.25*.75/2000) ~ 0.0097
    assert np.all(np.abs(freq - 0.25) < 0.05)


def test_state_dict_round_trip_through_json():
    buf = SupportBuffer(capacity=8, context_size=4, seed=5)
    buf.add(["a", [{"role": "user", "content": "b"}], "c"], [1.0, 0.0, 0.5])
    _fill(buf, 9, start=10)
    state = json.loads(json.dumps(buf.state_dict()))
    new = SupportBuffer(capacity=8, context_size=4, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same config: no warning
        new.load_state_dict(state)
    assert new.items()[0] == buf.items()[0]
    assert np.array_equal(new.items()[1], buf.items()[1])
    assert new.n_added == buf.n_added == 12
    assert new.fingerprint() == buf.fingerprint()
    for step in (0, 1, 99):
        assert new.sample_context(step)[0] == buf.sample_context(step)[0]
    # resumed buffer continues FIFO the same way
    buf.add(["z"], [1.0])
    new.add(["z"], [1.0])
    assert new.items()[0] == buf.items()[0]


def test_state_with_conversation_prompts_round_trips():
    conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "1+1="}]
    buf = SupportBuffer(capacity=4, context_size=2)
    buf.add([conv, conv], [1.0, 0.0])
    new = SupportBuffer(capacity=4, context_size=2)
    new.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert new.items()[0] == [conv, conv]


def test_load_into_smaller_capacity_warns_and_keeps_newest():
    buf = SupportBuffer(capacity=10, context_size=4)
    prompts, _ = _fill(buf, 10)
    small = SupportBuffer(capacity=4, context_size=4)
    with pytest.warns(UserWarning) as rec:
        small.load_state_dict(buf.state_dict())
    msgs = " ".join(str(w.message) for w in rec)
    assert "capacity" in msgs and "dropping the 6 oldest" in msgs
    assert small.items()[0] == prompts[-4:]


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda s: s.update(version=99), "version"),
        (lambda s: s.pop("outcomes"), "missing keys"),
        (lambda s: s.update(outcomes=[0.1, float("nan"), 0.3]), "NaN"),
        (lambda s: s.update(outcomes=[0.1, 2.0, 0.3]), r"\[0, 1\]"),
        (lambda s: s.update(outcomes=[0.1]), "context outcomes"),
        (lambda s: s.update(n_added=1), "n_added"),
    ],
)
def test_bad_state_is_rejected(mutate, match):
    buf = SupportBuffer(capacity=4, context_size=2)
    buf.add(["a", "b", "c"], [0.1, 0.2, 0.3])
    state = buf.state_dict()
    mutate(state)
    new = SupportBuffer(capacity=4, context_size=2)
    with pytest.raises(ValueError, match=match):
        new.load_state_dict(state)


@pytest.mark.parametrize(
    "prompts, outcomes, exc, match",
    [
        (["a", "b"], [0.5], ValueError, "2 context prompts but 1"),
        (["a"], [float("nan")], ValueError, "NaN"),
        (["a"], [-1.0], ValueError, r"map rewards first"),
        (["a"], [[0.5]], ValueError, "1-D"),
        ("abc", [1, 1, 1], TypeError, "single string"),
        ([3], [1.0], TypeError, "str or a list of message dicts"),
    ],
)
def test_bad_adds_raise_and_add_nothing(prompts, outcomes, exc, match):
    buf = SupportBuffer(capacity=4, context_size=2)
    buf.add(["keep"], [1.0])
    with pytest.raises(exc, match=match):
        buf.add(prompts, outcomes)
    assert buf.items()[0] == ["keep"] and buf.n_added == 1


@pytest.mark.parametrize("kwargs", [{"capacity": 0}, {"context_size": 0}, {"seed": -1}, {"capacity": 2.5}])
def test_bad_config(kwargs):
    with pytest.raises(ValueError, match="must be an int"):
        SupportBuffer(**kwargs)


def test_context_larger_than_capacity_warns():
    with pytest.warns(UserWarning, match="whole buffer"):
        SupportBuffer(capacity=4, context_size=8)


def test_negative_step_rejected():
    buf = SupportBuffer()
    with pytest.raises(ValueError, match="step"):
        buf.sample_context(-1)

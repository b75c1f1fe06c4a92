"""The ``scratchpad`` testbed task: reference solutions, strict and graded rewards, fixed universe and splits."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trl_ext.testbed as tb
from trl_ext.testbed.tasks import scratchpad_reward, scratchpad_solution, scratchpad_steps_reward


def _parse_solution(sol: str) -> tuple[list[tuple[int, int, int, int]], str]:
    steps, answer = sol.split("|")
    out = []
    for blk in steps.split(","):
        lhs, s = blk.split("=")
        x, y, c = lhs.split("+")
        out.append((int(x), int(y), int(c), int(s)))
    return out, answer


@settings(max_examples=200, deadline=None)
@given(a=st.integers(0, 10**8 - 1), b=st.integers(0, 10**8 - 1))
def test_solution_is_long_addition_column_by_column(a, b):
    cols, answer = _parse_solution(scratchpad_solution(a, b))
    assert answer == str(a + b)
    assert len(cols) == max(len(str(a)), len(str(b)))
    carry = 0
    for i, (x, y, c, s) in enumerate(cols):
        assert x == (a // 10**i) % 10 and y == (b // 10**i) % 10  # least significant column first
        assert c == carry and s == x + y + c
        carry = s // 10
    # the column sums rebuild the answer (the last carry becomes its leading digit)
    assert int(answer) == sum((s % 10) * 10**i for i, (_, _, _, s) in enumerate(cols)) + carry * 10 ** len(cols)


def test_solution_example_and_bad_input():
    assert scratchpad_solution(47, 85) == "7+5+0=12,4+8+1=13|132"
    assert scratchpad_solution(5, 123) == "5+3+0=8,0+2+0=2,0+1+0=1|128"
    with pytest.raises(ValueError, match="non-negative"):
        scratchpad_solution(-1, 3)


def test_binary_reward_is_strict_about_the_answer_only():
    ans = ["132"] * 7
    comps = ["7+5+0=12,4+8+1=13|132", "  7+5+0=12,4+8+1=13|132 ", "9+9+9=1|132", "132", "7+5+0=12|132|",
             "7+5+0=12,4+8+1=13|1320", "7+5+0=12,4+8+1=13|13"]
    assert scratchpad_reward(None, comps, answer=ans) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    # conversational completions are read from the last message
    assert scratchpad_reward(None, [[{"role": "assistant", "content": "x|132"}]], answer=["132"]) == [1.0]
    with pytest.raises(ValueError, match="answer"):
        scratchpad_reward(None, comps, answer=None)


def test_graded_reward_counts_columns_and_answer():
    sol = scratchpad_solution(47, 85)  # 2 columns + answer = 3 items
    comps = [sol, "7+5+0=12,4+8+1=14|142", "7+5+0=12", "", "4+8+1=13,7+5+0=12|132", "7+5+0=12,4+8+1=13"]
    got = scratchpad_steps_reward(None, comps, solution=[sol] * len(comps))
    assert got == pytest.approx([1.0, 1 / 3, 1 / 3, 0.0, 1 / 3, 2 / 3])
    # the graded reward orders partial solutions; 1.0 exactly when the binary reward is 1 with a correct scratchpad
    assert max(got) == 1.0 and got.index(1.0) == 0


def test_universe_splits_and_difficulty_spread():
    n_tr, n_te = tb.split_size("scratchpad", "train"), tb.split_size("scratchpad", "test")
    assert n_tr + n_te == 6 * 8000 and n_te == round(0.2 * 6 * 8000)
    tr = tb.make_dataset("scratchpad", 3000, seed=1, split="train")
    te = tb.make_dataset("scratchpad", 3000, seed=2, split="test")
    assert not set(tr["question_id"]) & set(te["question_id"]) and not set(tr["prompt"]) & set(te["prompt"])
    assert len(set(tr["question_id"])) == 3000
    # every operand length 2-7 is present in roughly equal shares (the difficulty spread)
    for ds in (tr, te):
        counts = {n: ds["n_digits"].count(n) for n in range(2, 8)}
        assert set(ds["n_digits"]) == set(range(2, 8))
        assert min(counts.values()) > 0.12 * len(ds)
    # completions span the regime's 20-80 tokens (character tokenizer: one token per character)
    lens = [len(s) for s in tr["solution"]]
    assert 18 <= min(lens) and max(lens) <= tb.TASKS["scratchpad"].max_answer_chars()
    assert max(lens) >= 65


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), seed=st.integers(0, 10**6), split=st.sampled_from(["train", "test"]))
def test_make_dataset_rows_consistent_and_deterministic(n, seed, split):
    ds = tb.make_dataset("scratchpad", n, seed=seed, split=split)
    assert ds["question_id"] == tb.make_dataset("scratchpad", n, seed=seed, split=split)["question_id"]
    for row in ds:
        a, b = map(int, row["prompt"][:-1].split("+"))
        assert row["answer"] == str(a + b) and row["solution"] == scratchpad_solution(a, b)
        assert row["question_id"] == f"pad:{a}+{b}"
        assert len(str(a)) == len(str(b)) == row["n_digits"]
        assert scratchpad_reward(None, [row["solution"]], answer=[row["answer"]]) == [1.0]


def test_parameters_validated_and_tokenizer_covers_task():
    with pytest.raises(ValueError, match="max_digits"):
        tb.make_dataset("scratchpad", 5, max_digits=9)
    with pytest.raises(ValueError, match="max_digits"):
        tb.make_dataset("scratchpad", 5, min_digits=5, max_digits=3)
    with pytest.raises(ValueError, match="per_digit"):
        tb.make_dataset("scratchpad", 5, min_digits=1, max_digits=2, per_digit=200)  # only 100 one-digit pairs
    with pytest.raises(ValueError, match="unknown parameter"):
        tb.make_dataset("scratchpad", 5, digits=3)
    small = tb.make_dataset("scratchpad", 10, min_digits=1, max_digits=2, per_digit=50)
    assert set(small["n_digits"]) <= {1, 2}
    tok = tb.build_tokenizer()
    ids = tok(scratchpad_solution(98765, 43210) + "|")["input_ids"]
    assert tok.unk_token_id not in ids and len(ids) == len(scratchpad_solution(98765, 43210)) + 1

"""The real-model task ``steps`` (word problems in two or three written-out arithmetic steps): fast, no model.

Item generation is deterministic, every answer is recomputed from the question text, the split is disjoint and
balanced over the difficulty levels, the worked examples parse to their answers under the strict reward, and the
two-shot prompt renders with a ChatML chat template (on the testbed's character tokenizer: no download).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from trl_ext.realmodel import REAL_TASKS, make_real_dataset, parse_answer
from trl_ext.realmodel.tasks import accuracy_reward, format_reward, split_items

STEPS = REAL_TASKS["steps"]

# SmolLM2's chat template, reduced to ChatML without its default system prompt.
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _solve(question: str) -> int:
    """The answer recomputed from the question's words alone (not from the item tuple)."""
    has = int(re.search(r"has (\d+) ", question).group(1))
    bags = re.search(r"buys (\d+) bags with (\d+) ", question)
    more = re.search(r"buys (\d+) more ", question)
    finds = re.search(r"finds (\d+) more ", question)
    gives = re.search(r"gives (\d+) ", question)
    total = has + (int(bags.group(1)) * int(bags.group(2)) if bags else int(more.group(1)))
    return total + (int(finds.group(1)) if finds else 0) - (int(gives.group(1)) if gives else 0)


def test_items_are_deterministic_balanced_and_correct():
    items = STEPS.items()
    assert items == STEPS.items() and len(items) == len(set(items)) == 480
    assert Counter(it[0] for it in items) == {0: 160, 1: 160, 2: 160}
    for it in items:
        q = STEPS.question(it)
        assert STEPS.answer(it) == _solve(q) > 0, (it, q)
        level = it[0]
        assert ("bags" in q) == (level == 2) and ("gives" in q) == (level != 1) and ("finds" in q) == (level == 1)
    # level 2 starts from a two-digit number and needs three operations
    assert all(10 <= it[1] <= 19 for it in items if it[0] == 2)


def test_split_is_disjoint_fixed_and_mixes_levels():
    train, test = split_items("steps", "train"), split_items("steps", "test")
    shots = {ex for ex, _ in STEPS.examples}
    assert not set(train) & set(test) and not (set(train) | set(test)) & shots
    assert len(train) + len(test) == 480 and len(test) == 96
    assert split_items("steps", "test") == test
    assert set(Counter(it[0] for it in test)) == {0, 1, 2}  # every level in the test split
    rows = make_real_dataset("steps", 16, seed=0, split="test", as_list=True)
    assert rows == make_real_dataset("steps", 16, seed=0, split="test", as_list=True)
    for r in rows:
        assert r["task"] == "steps" and int(r["answer"]) == _solve(r["prompt"][-1]["content"])


def test_worked_examples_show_the_steps_and_parse():
    assert {ex[0] for ex, _ in STEPS.examples} == {0, 2}  # an easy and a three-step example
    for item, reply in STEPS.examples:
        assert parse_answer(reply) == STEPS.answer(item) == _solve(STEPS.question(item))
        assert reply.splitlines()[-1] == f"Answer: {STEPS.answer(item)}"
        assert len([ln for ln in reply.splitlines() if ln.startswith("Step ")]) == (3 if item[0] == 0 else 4)
        assert format_reward(completions=[reply]) == [1.0]


def test_reward_parses_a_worked_completion():
    q = "Ava has 13 marbles. She buys 4 bags with 6 marbles in each bag, then gives 8 marbles to a friend."
    ans = str(_solve(q))  # 29
    worked = ("Let's solve it step by step.\nStep 1: Ava starts with 13 marbles.\nStep 2: 4 bags with 6 marbles in "
              "each bag are 4 x 6 = 24 marbles.\nStep 3: She buys them, so she has 13 + 24 = 37 marbles.\n"
              "Step 4: She gives away 8, so she has 37 - 8 = 29 marbles.\nSo Ava has 29 marbles now.\nAnswer: 29")
    wrong_step = worked.replace("= 29", "= 28").replace("Answer: 29", "Answer: 28")
    no_line = worked.replace("\nAnswer: 29", "")  # "So Ava has 29 marbles now." alone does not count
    comps = [[{"role": "assistant", "content": c}] for c in (worked, wrong_step, no_line, worked + "user")]
    assert accuracy_reward(completions=comps, answer=[ans] * 4) == [1.0, 0.0, 0.0, 0.0]
    assert format_reward(completions=comps) == [1.0, 1.0, 0.0, 0.0]


def test_two_shot_prompt_renders_with_a_chat_template():
    from trl_ext.testbed.tokenizer import build_tokenizer

    row = make_real_dataset("steps", 1, seed=5, split="test", as_list=True)[0]
    conv = row["prompt"]
    assert [m["role"] for m in conv] == ["user", "assistant", "user", "assistant", "user"]
    chars = sorted({c for m in conv for c in m["content"] if c not in "\n\r\t"} | set("<|>_ima"))
    tok = build_tokenizer("".join(chars))
    tok.chat_template = CHATML
    text = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    assert text.count("<|im_start|>") == 6 and text.endswith("<|im_start|>assistant\n")
    assert text.index(conv[1]["content"]) < text.index(conv[4]["content"])  # the worked examples come first
    ids = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert len(ids) > 300  # two worked solutions plus the question


@pytest.mark.parametrize("name", ["steps"])
def test_registered_everywhere_the_others_are(name):
    from trl_ext.scripts_support import builtin_tasks, resolve_reward_funcs

    assert builtin_tasks()[name] == "real"
    assert resolve_reward_funcs(["accuracy", "format"], name) == [accuracy_reward, format_reward]

"""The real-model task ``steps`` (word problems in one or two written-out arithmetic steps): fast, no model.

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
    gives = re.search(r"gives (\d+) ", question)
    total = has + (int(bags.group(1)) * int(bags.group(2)) if bags else int(more.group(1)))
    return total - (int(gives.group(1)) if gives else 0)


def test_items_are_deterministic_balanced_and_correct():
    items = STEPS.items()
    assert items == STEPS.items() and len(items) == len(set(items)) == 240
    assert Counter(it[0] for it in items) == {0: 80, 1: 80, 2: 80}
    for it in items:
        q = STEPS.question(it)
        assert STEPS.answer(it) == _solve(q) > 0, (it, q)
        level = it[0]
        assert ("bags" in q) == (level == 2) and ("gives" in q) == (level == 1) and ("more" in q) == (level != 2)
    # small numbers: every given number is a digit; level 2 multiplies b in 2..4 by c in 2..5
    assert all(1 <= n <= 9 for it in items for n in it[1:] if n) and max(STEPS.answer(it) for it in items) <= 29
    assert all(2 <= it[2] <= 4 and 2 <= it[3] <= 5 for it in items if it[0] == 2)


def test_split_is_disjoint_fixed_and_mixes_levels():
    train, test = split_items("steps", "train"), split_items("steps", "test")
    shots = {ex for ex, _ in STEPS.examples}
    assert not set(train) & set(test) and not (set(train) | set(test)) & shots
    assert len(train) + len(test) == 240 and len(test) == 48
    assert split_items("steps", "test") == test
    assert set(Counter(it[0] for it in test)) == {0, 1, 2}  # every level in the test split
    rows = make_real_dataset("steps", 16, seed=0, split="test", as_list=True)
    assert rows == make_real_dataset("steps", 16, seed=0, split="test", as_list=True)
    for r in rows:
        assert r["task"] == "steps" and int(r["answer"]) == _solve(r["prompt"][-1]["content"])


def test_worked_examples_show_the_steps_and_parse():
    assert {ex[0] for ex, _ in STEPS.examples} == {1, 2}  # the two two-operation levels; level 0 is their first step
    for item, reply in STEPS.examples:
        assert parse_answer(reply) == STEPS.answer(item) == _solve(STEPS.question(item))
        assert reply.splitlines()[-1] == f"Answer: {STEPS.answer(item)}"
        assert len([ln for ln in reply.splitlines() if ln.startswith("Step ")]) == 3
        assert format_reward(completions=[reply]) == [1.0]


def test_reward_parses_a_worked_completion():
    q = "Ava has 5 marbles. She buys 4 bags with 5 marbles in each bag. How many marbles does Ava have now?"
    ans = str(_solve(q))  # 25
    worked = ("Let's solve it step by step.\nStep 1: Ava starts with 5 marbles.\nStep 2: 4 bags with 5 marbles in "
              "each bag are 4 x 5 = 20 marbles.\nStep 3: She buys them, so she has 5 + 20 = 25 marbles.\n"
              "So Ava has 25 marbles now.\nAnswer: 25")
    wrong_step = worked.replace("= 25", "= 24").replace("has 25", "has 24").replace("Answer: 25", "Answer: 24")
    no_line = worked.replace("\nAnswer: 25", "")  # "So Ava has 25 marbles now." alone does not count
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


def test_matched_variant_shows_the_questions_own_level():
    """``steps_matched``: the same questions, each after two worked examples of its level; all six examples are
    out of both splits; ``steps`` itself is unchanged by the variant (same items, same two examples)."""
    matched = REAL_TASKS["steps_matched"]
    shots = {ex for ex, _ in matched.examples}
    assert len(shots) == 6 and Counter(ex[0] for ex in shots) == {0: 2, 1: 2, 2: 2}
    items = matched.items()
    assert len(items) == 239 and not set(items) & shots and Counter(it[0] for it in items) == {0: 79, 1: 80, 2: 80}
    train, test = split_items("steps_matched", "train"), split_items("steps_matched", "test")
    assert not set(train) & set(test) and len(train) + len(test) == 239 and set(Counter(it[0] for it in test)) == {0, 1, 2}
    for item, reply in matched.examples:
        assert parse_answer(reply) == matched.answer(item) == _solve(matched.question(item))
    for row in make_real_dataset("steps_matched", 24, seed=3, split="train", as_list=True):
        conv = row["prompt"]
        q_level = 2 if "bags" in conv[-1]["content"] else 1 if "gives" in conv[-1]["content"] else 0
        for m in conv[:-1:2]:  # the worked examples' questions
            assert (2 if "bags" in m["content"] else 1 if "gives" in m["content"] else 0) == q_level
        assert int(row["answer"]) == _solve(conv[-1]["content"])
    assert len(STEPS.items()) == 240 and {ex[0] for ex, _ in STEPS.examples} == {1, 2}
    assert STEPS.conversation(items[0])[0] == {"role": "user", "content": STEPS.question(STEPS.examples[0][0])}


@pytest.mark.parametrize("name", ["steps", "steps_matched"])
def test_registered_everywhere_the_others_are(name):
    from trl_ext.scripts_support import builtin_tasks, resolve_reward_funcs

    assert builtin_tasks()[name] == "real"
    assert resolve_reward_funcs(["accuracy", "format"], name) == [accuracy_reward, format_reward]


def test_steps_levels_script_redraws_advises_rows(tmp_path):
    """``benchmarks/steps_levels.py`` maps each saved sample to its question's level through advise's own draw."""
    import importlib.util
    import json
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "steps_levels.py")
    spec = importlib.util.spec_from_file_location("steps_levels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = make_real_dataset("steps_matched", 12, seed=4, split="train", as_list=True)
    levels = [mod.question_level(r["prompt"][-1]["content"]) for r in rows]
    # a sample where level L's prompts get L + 1 of 4 right (a flat list of accuracy rewards, as advise saves them)
    samples = [{"row_index": i, "rewards": [1.0] * (lv + 1) + [0.0] * (3 - lv)} for i, lv in enumerate(levels)]
    payload = {"config": {"args": {"dataset": "steps_matched", "seed": 4, "split": None}}, "samples": samples}
    table = mod.level_table(payload)
    assert set(table) == set(levels)
    for lv, row in table.items():
        assert row["prompts"] == levels.count(lv) and row["correct_counts"] == {lv + 1: levels.count(lv)}
        assert row["mean_pass_rate"] == (lv + 1) / 4 and row["k"] == [4]
    f = tmp_path / "s.json"
    f.write_text(json.dumps(payload))
    assert mod.main(["--samples", str(f), "--output", str(tmp_path / "o.json")]) == 0
    assert json.loads((tmp_path / "o.json").read_text())[str(levels[0])]["prompts"] == levels.count(levels[0])


def test_steps_levels_script_counts_a_value_tables_passes(tmp_path, capsys):
    """``--value_table``: how many prompts had 0..n of their n samples right, from a binary-reward table."""
    import importlib.util
    import os

    from trl_ext.priors.table_file import save_value_table
    from trl_ext.priors.table_rows import ValueTable, ValueTableRow

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "steps_levels.py")
    spec = importlib.util.spec_from_file_location("steps_levels_vt", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rewards = [[0.0] * 4, [1.0, 0.0, 0.0, 0.0], [1.0] * 4, [1.0] * 4, [0.0, 1.0, 1.0, 0.0]]
    rows = [ValueTableRow(prompt_key=f"k{i}", n=4, mean_reward=sum(r) / 4, reward_range=(0.0, 1.0), rewards=r)
            for i, r in enumerate(rewards)]
    f = tmp_path / "t.jsonl"
    save_value_table(str(f), ValueTable(rows))
    res = mod.table_pass_counts(str(f))
    assert res["correct_counts"] == {0: 1, 1: 1, 2: 1, 4: 2} and res["n"] == [4] and res["prompts"] == 5
    assert res["mean_pass_rate"] == pytest.approx(11 / 20)
    assert mod.main(["--value_table", str(f)]) == 0
    assert "0 / 1 / ... / 4 of [4] right: 1 / 1 / 1 / 0 / 2" in capsys.readouterr().out

"""Chat-formatted tasks with verifiable rewards that SmolLM2-135M-Instruct can learn from.

The model is weak: asked "What is 7 + 5? End with 'Answer: <number>'." it rambles and almost never follows the
format when sampled at temperature 1. Every task therefore shows two worked examples as earlier chat turns (a
*two-shot conversation*), which makes the model copy the reasoning line and the final ``Answer: <n>`` line; the
last user turn is the question. Measured sampled success rates (T=1, top_k 0, top_p 1: TRL's GRPO defaults) are
in :data:`MEASURED` and in ``docs/real_model.md``, with the command that measures them
(``python -m trl_ext.realmodel.measure``).

Tasks
-----
``sum3``
    "What is a + b + c?" with digits a, b, c in 1..9 (729 questions, answers 3..27).
``largest``
    "Which number is the largest: a, b or c?" with three distinct digits 1..9 (504 questions; the answer is one
    of the three numbers in the question: a short answer set).
``steps``
    A short word problem ("Mia has 7 apples. She buys 4 more apples. ...") whose worked answer writes out its
    arithmetic one step per line before ``Answer: <n>``. Three difficulty levels mixed within the task (80
    questions each, 240 in all; the level is the item's first field; every given number is a digit): level 0
    ``a + b`` ("buys b more": one step), level 1 ``a + b - c`` ("buys b more, then gives c to a friend": two
    steps), level 2 ``a + b x c`` with b in 2..4, c in 2..5 ("buys b bags with c in each bag": a product, then a
    sum). The worked examples show one level-1 and one level-2 solution (level 0 is their first step), so
    completions copy the working. The first design (levels ``a + b - c`` / ``a + b + c`` / ``a + b x c - d`` with
    a in 10..19) was far too hard at T = 1 (mean pass rate 0.06 on 16 prompts, none above 0.25); this one was
    measured on 32 prompts: see "Regime of the SmolLM2 tasks" in ``docs/real_model.md``.
``steps_matched``
    The same three levels and question texts, but each question is preceded by two worked examples **of its own
    level** (six worked examples in all, kept out of both splits), so a one-step question sees one-step
    solutions. At T = 1 ``steps`` copied the examples' later steps into one-step questions. Measured (32 training
    prompts x 8 samples, docs/real_model.md): at T = 1 mean pass rate 0.17, none at 1; at T = 0.7 mean 0.46, 22 %
    of the prompts at 0 (mostly ``a + b - c``), 12 % at 1 (one-step sums), ICC 0.46: spread.

Each task's questions are split once by a seeded shuffle (:data:`SPLIT_SEED`): 20 % ``test``, the rest
``train``; the questions of the worked examples are in neither. :func:`make_real_dataset` draws ``n`` questions
from a split with its own ``seed``.

Rows are ``{"prompt": [messages...], "answer": "<n>", "task": name}``; ``prompt`` is a conversation (list of
``{"role", "content"}``) that TRL renders with the tokenizer's chat template. Reward functions follow TRL's
signature and accept plain-text or conversational completions.

Answer parsing is strict (:func:`parse_answer`): the **last** ``Answer: <integer>`` in the completion, where the
integer is not followed by more digits or a decimal part (``Answer: 16user`` and ``Answer: 1.5`` do not parse as
16 / 1; ``Answer: 9.`` parses as 9). Nothing else counts: a bare number, "The answer is 9", a boxed value.

This module imports nothing heavy at import time (``datasets`` only inside :func:`make_real_dataset`).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MEASURED", "REAL_TASKS", "SPLIT_SEED", "TEST_FRACTION", "RealTask", "accuracy_reward", "completion_text",
    "format_reward", "get_real_reward_funcs", "make_real_dataset", "parse_answer", "split_items",
]

#: Seed of the one-off shuffle that splits each task's questions into train/test.
SPLIT_SEED = 1234
TEST_FRACTION = 0.2

_ANSWER_RE = re.compile(r"\bAnswer:[ \t]*(-?\d+)(?![.,]?\d)(?![A-Za-z])")
_FINAL_LINE_RE = re.compile(r"^Answer:[ \t]*-?\d+\.?$")


def completion_text(completion: Any) -> str:
    """Text of a completion: a string, or a conversational completion (list of messages; contents joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, Sequence):
        return "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in completion)
    return str(completion)


def parse_answer(completion: Any) -> int | None:
    """The integer of the last ``Answer: <n>`` in ``completion`` (strict; see the module docstring), else None."""
    found = _ANSWER_RE.findall(completion_text(completion))
    return int(found[-1]) if found else None


@dataclass(frozen=True)
class RealTask:
    """A two-shot chat task: how to enumerate its questions, phrase them and answer them."""

    name: str
    description: str
    question: Callable[[tuple[int, ...]], str]
    answer: Callable[[tuple[int, ...]], int]
    items: Callable[[], list[tuple[int, ...]]]
    examples: tuple[tuple[tuple[int, ...], str], ...]  # (item, worked assistant reply)
    notes: dict[str, Any] = field(default_factory=dict)
    #: Optional per-question choice of worked examples (``item -> examples``); ``examples`` then lists every
    #: worked example the task can show (all of them are kept out of both splits).
    examples_for: Callable[[tuple[int, ...]], tuple[tuple[tuple[int, ...], str], ...]] | None = None

    def conversation(self, item: tuple[int, ...]) -> list[dict[str, str]]:
        """The prompt: the worked examples (this question's, with ``examples_for``) as earlier turns, then it."""
        msgs: list[dict[str, str]] = []
        for ex_item, reply in (self.examples_for(item) if self.examples_for else self.examples):
            msgs.append({"role": "user", "content": self.question(ex_item)})
            msgs.append({"role": "assistant", "content": reply})
        msgs.append({"role": "user", "content": self.question(item)})
        return msgs


def _sum3_items() -> list[tuple[int, ...]]:
    return list(itertools.product(range(1, 10), repeat=3))


def _largest_items() -> list[tuple[int, ...]]:
    return list(itertools.permutations(range(1, 10), 3))


# ---------------------------------------------------------------------------------------------- steps (word problems)
_STEPS_NAMES = ("Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Ben")
_STEPS_PRONOUN = {"Mia": "She", "Tom": "He", "Ava": "She", "Leo": "He", "Zoe": "She", "Sam": "He", "Ivy": "She",
                  "Ben": "He"}
_STEPS_OBJECTS = ("apples", "pencils", "stickers", "marbles", "cookies", "stamps")
_STEPS_PER_LEVEL = 80
_STEPS_SEED = 2026
_STEPS_SHOTS = ((1, 6, 5, 3, 0), (2, 7, 3, 4, 0))  # the worked examples' items: never drawn as questions
# ``steps_matched``: two worked examples per level, shown only to questions of that level.
_STEPS_MATCHED_SHOTS = {0: ((0, 6, 5, 0, 0), (0, 3, 8, 0, 0)), 1: ((1, 6, 5, 3, 0), (1, 8, 4, 5, 0)),
                        2: ((2, 7, 3, 4, 0), (2, 5, 2, 3, 0))}


def _steps_answer(t: tuple[int, ...]) -> int:
    level, a, b, c, _ = t
    return a + b if level == 0 else a + b - c if level == 1 else a + b * c


def _steps_who(t: tuple[int, ...]) -> tuple[str, str, str]:
    """(name, pronoun, object) of an item: a fixed function of its numbers."""
    level, a, b, c, _ = t
    name = _STEPS_NAMES[(a + 2 * b + 3 * c + 5 * level) % len(_STEPS_NAMES)]
    return name, _STEPS_PRONOUN[name], _STEPS_OBJECTS[(3 * a + b + 2 * c + level) % len(_STEPS_OBJECTS)]


def _steps_question(t: tuple[int, ...]) -> str:
    level, a, b, c, _ = t
    name, pro, obj = _steps_who(t)
    if level == 0:
        return f"{name} has {a} {obj}. {pro} buys {b} more {obj}. How many {obj} does {name} have now?"
    if level == 1:
        return (f"{name} has {a} {obj}. {pro} buys {b} more {obj}, then gives {c} {obj} to a friend. "
                f"How many {obj} does {name} have now?")
    return (f"{name} has {a} {obj}. {pro} buys {b} bags with {c} {obj} in each bag. "
            f"How many {obj} does {name} have now?")


def _steps_reply(t: tuple[int, ...]) -> str:
    """The worked solution of an item (used for the two worked examples): one step per line, then the answer."""
    level, a, b, c, _ = t
    name, pro, obj = _steps_who(t)
    lines = ["Let's solve it step by step.", f"Step 1: {name} starts with {a} {obj}."]
    if level in (0, 1):
        s = a + b
        lines.append(f"Step 2: {pro} buys {b} more, so {pro.lower()} has {a} + {b} = {s} {obj}.")
        if level == 1:
            lines.append(f"Step 3: {pro} gives away {c}, so {pro.lower()} has {s} - {c} = {s - c} {obj}.")
    else:
        m = b * c
        lines += [f"Step 2: {b} bags with {c} {obj} in each bag are {b} x {c} = {m} {obj}.",
                  f"Step 3: {pro} buys them, so {pro.lower()} has {a} + {m} = {a + m} {obj}."]
    lines += [f"So {name} has {_steps_answer(t)} {obj} now.", f"Answer: {_steps_answer(t)}"]
    return "\n".join(lines)


def _steps_items(shots: Sequence[tuple[int, ...]] = _STEPS_SHOTS) -> list[tuple[int, ...]]:
    """240 items ``(level, a, b, c, 0)``, 80 per level, each level a seeded sample of its full enumeration (the
    worked examples' items ``shots`` excluded): level 0 is 80 of the 81 pairs of digits (79 with two level-0
    shots)."""
    levels = [
        [(0, a, b, 0, 0) for a in range(1, 10) for b in range(1, 10)],
        [(1, a, b, c, 0) for a in range(1, 10) for b in range(1, 10) for c in range(1, min(10, a + b))],
        [(2, a, b, c, 0) for a in range(1, 10) for b in range(2, 5) for c in range(2, 6)],
    ]
    rng = random.Random(_STEPS_SEED)
    out: list[tuple[int, ...]] = []
    for full in levels:
        pool = [it for it in full if it not in shots]
        out += sorted(rng.sample(pool, min(_STEPS_PER_LEVEL, len(pool))))
    return out


_STEPS_LEVELS = {0: "a + b (digits)", 1: "a + b - c (digits, c < a + b)",
                 2: "a + b x c (a a digit, b bags in 2..4 of c in 2..5)"}
_MATCHED_SHOT_ITEMS = tuple(it for level in sorted(_STEPS_MATCHED_SHOTS) for it in _STEPS_MATCHED_SHOTS[level])

REAL_TASKS: dict[str, RealTask] = {
    "sum3": RealTask(
        name="sum3",
        description="What is a + b + c? (digits 1..9)",
        question=lambda t: f"What is {t[0]} + {t[1]} + {t[2]}?",
        answer=lambda t: t[0] + t[1] + t[2],
        items=_sum3_items,
        examples=(
            ((3, 4, 2), "Let's add step by step. First, 3 + 4 = 7. Then, 7 + 2 = 9. So the sum is 9.\nAnswer: 9"),
            ((5, 1, 6), "Let's add step by step. First, 5 + 1 = 6. Then, 6 + 6 = 12. So the sum is 12.\nAnswer: 12"),
        ),
    ),
    "largest": RealTask(
        name="largest",
        description="Which number is the largest: a, b or c? (distinct digits 1..9)",
        question=lambda t: f"Which number is the largest: {t[0]}, {t[1]} or {t[2]}?",
        answer=lambda t: max(t),
        items=_largest_items,
        examples=(
            ((3, 8, 5), "Let's compare them. 3 is less than 8, and 5 is less than 8. So the largest number is 8.\n"
                        "Answer: 8"),
            ((9, 2, 4), "Let's compare them. 2 is less than 9, and 4 is less than 9. So the largest number is 9.\n"
                        "Answer: 9"),
        ),
    ),
    "steps": RealTask(
        name="steps",
        description="A word problem in one to two arithmetic steps, written out (3 mixed difficulty levels)",
        question=_steps_question,
        answer=_steps_answer,
        items=_steps_items,
        examples=tuple((it, _steps_reply(it)) for it in _STEPS_SHOTS),
        notes={"levels": _STEPS_LEVELS, "per_level": _STEPS_PER_LEVEL},
    ),
    "steps_matched": RealTask(
        name="steps_matched",
        description="steps with worked examples of the question's own level (two per level)",
        question=_steps_question,
        answer=_steps_answer,
        items=lambda: _steps_items(_MATCHED_SHOT_ITEMS),
        examples=tuple((it, _steps_reply(it)) for it in _MATCHED_SHOT_ITEMS),
        examples_for=lambda item: tuple((it, _steps_reply(it)) for it in _STEPS_MATCHED_SHOTS[item[0]]),
        notes={"levels": _STEPS_LEVELS, "per_level": _STEPS_PER_LEVEL, "examples": "two of the question's level"},
    ),
}

#: Measured on the cached SmolLM2-135M-Instruct (fp32), test split, 64 questions x 4 samples, T=1, top_k 0,
#: max 128 new tokens: ``python -m trl_ext.realmodel.measure --task NAME`` (see docs/real_model.md).
MEASURED: dict[str, dict[str, float]] = {
    "sum3": {"sampled_success": 0.285, "sampled_format": 0.805, "greedy_success": 0.75,
             "completion_tokens_mean": 53.0, "completion_tokens_median": 46.0, "truncated_share": 0.0625},
    "largest": {"sampled_success": 0.363, "sampled_format": 0.848, "greedy_success": 0.50,
                "completion_tokens_mean": 44.1, "completion_tokens_median": 36.0, "truncated_share": 0.059},
}


def _task(name: str) -> RealTask:
    if name not in REAL_TASKS:
        raise ValueError(f"unknown real-model task {name!r}; valid tasks: {sorted(REAL_TASKS)}")
    return REAL_TASKS[name]


def split_items(task: str, split: str) -> list[tuple[int, ...]]:
    """The questions of ``split`` ("train" or "test"), in the fixed shuffled order; worked examples excluded."""
    t = _task(task)
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    shots = {ex for ex, _ in t.examples}
    items = [it for it in t.items() if it not in shots]
    random.Random(SPLIT_SEED).shuffle(items)
    n_test = round(len(items) * TEST_FRACTION)
    return items[:n_test] if split == "test" else items[n_test:]


def make_real_dataset(task: str, n: int | None = None, seed: int = 0, split: str = "train", as_list: bool = False):
    """``n`` questions of ``task``'s ``split`` (all of them when ``n`` is None), drawn without replacement with ``seed``.

    Returns a ``datasets.Dataset`` with columns ``prompt`` (a conversation), ``answer`` (str) and ``task``, or a
    list of row dicts with ``as_list=True``.
    """
    t = _task(task)
    items = split_items(task, split)
    if n is None:
        n = len(items)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(items):
        raise ValueError(f"n must be an int in 1..{len(items)} (the size of {task}/{split}), got {n!r}")
    chosen = random.Random(seed).sample(items, n)
    rows = [{"prompt": t.conversation(it), "answer": str(t.answer(it)), "task": task} for it in chosen]
    if as_list:
        return rows
    from datasets import Dataset

    return Dataset.from_list(rows)


def accuracy_reward(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    """TRL reward: 1.0 if :func:`parse_answer` of the completion equals the row's ``answer``, else 0.0."""
    if completions is None or answer is None:
        raise ValueError("accuracy_reward needs completions and the dataset's 'answer' column.")
    out = []
    for comp, ans in zip(completions, answer, strict=True):
        pred = parse_answer(comp)
        out.append(float(pred is not None and pred == int(ans)))
    return out


def format_reward(prompts=None, completions=None, **kwargs) -> list[float]:
    """TRL reward: 1.0 if the completion's last non-empty line is exactly ``Answer: <integer>``, else 0.0."""
    if completions is None:
        raise ValueError("format_reward needs completions.")
    out = []
    for comp in completions:
        lines = [ln.strip() for ln in completion_text(comp).splitlines() if ln.strip()]
        out.append(float(bool(lines) and _FINAL_LINE_RE.match(lines[-1]) is not None))
    return out


def get_real_reward_funcs(task: str, with_format: bool = False) -> list[Callable[..., list[float]]]:
    """Reward functions for ``task``: ``[accuracy_reward]`` (+ ``format_reward`` with ``with_format=True``)."""
    _task(task)
    return [accuracy_reward, format_reward] if with_format else [accuracy_reward]

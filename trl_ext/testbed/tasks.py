"""Synthetic verifiable tasks and their TRL-signature reward functions.

Three tasks, all small enough for a ~1M-parameter model and a character tokenizer:

``"addition"``
    ``"a+b="`` -> ``str(a + b)``, with ``a, b`` in ``0 .. 10**digits - 1`` (``digits=2`` by default).
``"substitution"``
    The digit-substitution code of "Measurement Discipline for RLVR" (section "Setup: an invented code the model
    has to learn"): one fixed random derangement of the digits 0-9 (every digit maps to another digit), chosen by
    ``code_seed``; ``n_hidden`` of the ten mappings (default 2) are left out of every prompt, in training and in
    evaluation alike. The model reads a ``length``-digit string (default 2, as in the paper) and must output it
    with every digit swapped. Compact prompt format for a character tokenizer: the revealed mappings as
    ``d>e`` pairs in source order separated by ``,``, then ``|``, the source string and ``=``; e.g. with
    hidden sources 1 and 6::

        0>3,2>7,3>5,4>9,5>0,7>2,8>1,9>4|47=      answer "92"

    Scoring is split into channels as in the paper ("Split the score by channel"): each output position is a
    *slot*; slots whose source digit is hidden form the hidden channel (one sub-channel per hidden source digit),
    the others the revealed channel. See :func:`substitution_channel_scores`.

``"scratchpad"``
    Multi-digit addition with the column work written out, least significant column first: each column as
    ``x+y+c=s`` (the two digits, the carry in, their sum), columns separated by ``,``, then ``|`` and the sum.
    E.g. ``"47+85="`` -> ``"7+5+0=12,4+8+1=13|132"``. Both operands have ``n`` digits, ``n`` drawn uniformly from
    ``min_digits .. max_digits`` (default 2-7), so completions run from 18 to 71 characters and prompt difficulty
    spreads from easy (2 columns) to nearly impossible for the tiny model (7 columns); an early slip (a misread
    digit, a wrong carry) propagates to the answer. The reward (:func:`scratchpad_reward`) is strict: exactly one
    ``|`` and the text after it equal to the sum; the scratchpad itself is not graded.
    :func:`scratchpad_steps_reward` is the graded variant (share of correct columns and answer) used for
    tie-break blends. The universe is a fixed list of ``per_digit`` (default 8,000) distinct problems per ``n``,
    drawn once with a fixed generator.

Splits
------
Every task has a finite universe of distinct problems. Each problem is ranked by a fixed 64-bit hash
(splitmix64 of its index, salted per task); the ``round(test_fraction * U)`` lowest-ranked problems are the
``"test"`` split and the rest the ``"train"`` split. The split therefore does not depend on ``seed``: train and
test are disjoint for every seed, and ``question_id`` (e.g. ``"add:12+34"``, ``"sub:c0h2:47"``) is stable across
runs and machines. ``seed`` only chooses which ``n`` problems are drawn from the split, and their order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "TASKS",
    "TaskSpec",
    "make_dataset",
    "split_indices",
    "split_size",
    "substitution_code",
    "exact_match_reward",
    "addition_reward",
    "substitution_reward",
    "substitution_hidden_reward",
    "substitution_channel_scores",
    "scratchpad_solution",
    "scratchpad_reward",
    "scratchpad_steps_reward",
    "get_reward_funcs",
    "completion_text",
]

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 finaliser on uint64 (wrapping arithmetic; platform independent)."""
    with np.errstate(over="ignore"):
        z = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return z ^ (z >> np.uint64(31))


def split_indices(universe: int, split: str, test_fraction: float, salt: int) -> np.ndarray:
    """Sorted problem indices (into ``range(universe)``) belonging to ``split``.

    Parameters
    ----------
    universe : int
        Number of distinct problems U (>= 2).
    split : {"train", "test"}
    test_fraction : float
        In (0, 1); the test split has exactly ``round(test_fraction * U)`` problems (at least 1, at most U - 1).
    salt : int
        Per-task salt so different tasks do not share a ranking.

    Returns
    -------
    numpy.ndarray of int64, sorted. ``train`` and ``test`` partition ``range(U)``.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not (0.0 < float(test_fraction) < 1.0):
        raise ValueError(f"test_fraction must be strictly between 0 and 1, got {test_fraction!r}")
    idx = np.arange(universe, dtype=np.uint64)
    keys = _splitmix64(idx ^ np.uint64(salt & 0xFFFFFFFFFFFFFFFF))
    order = np.lexsort((idx, keys))  # ties (never in practice) broken by index
    n_test = min(max(int(round(test_fraction * universe)), 1), universe - 1)
    chosen = order[:n_test] if split == "test" else order[n_test:]
    return np.sort(chosen.astype(np.int64))


def _check_int(name: str, value, lo: int, hi: int, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name}={value} is out of range: use {lo} <= {name} <= {hi} ({hint})")
    return int(value)


def _draw(pool: np.ndarray, n: int, seed: int, task: str, split: str, params: str) -> np.ndarray:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if n > len(pool):
        raise ValueError(
            f"n={n} is larger than the {len(pool)} distinct problems in the {split!r} split of task {task!r} "
            f"({params}); ask for n <= {len(pool)} or enlarge the task (more digits / longer strings)"
        )
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    rng = np.random.default_rng(int(seed))
    return rng.choice(pool, size=n, replace=False)


# ----------------------------------------------------------------------------------------------- addition
def _make_addition(n: int, seed: int, split: str, digits: int = 2, test_fraction: float = 0.2) -> dict:
    digits = _check_int("digits", digits, 1, 3, "operands have 1-3 digits; 3 gives a 10**6-problem universe")
    base = 10**digits
    pool = split_indices(base * base, split, test_fraction, salt=0xADD0 + digits)
    chosen = _draw(pool, n, seed, "addition", split, f"digits={digits}, test_fraction={test_fraction}")
    a = (chosen // base).tolist()
    b = (chosen % base).tolist()
    return {
        "prompt": [f"{x}+{y}=" for x, y in zip(a, b)],
        "answer": [str(x + y) for x, y in zip(a, b)],
        "question_id": [f"add:{x}+{y}" for x, y in zip(a, b)],
        "a": a,
        "b": b,
    }


# ------------------------------------------------------------------------------------------- substitution
def substitution_code(code_seed: int = 0, n_hidden: int = 2) -> tuple[str, str]:
    """The secret digit code and its hidden source digits.

    Parameters
    ----------
    code_seed : int
        Chooses the code (a derangement of 0-9: no digit maps to itself, as in the paper) and which mappings
        are hidden.
    n_hidden : int
        Number of hidden mappings, 0..10.

    Returns
    -------
    code : str
        Ten characters; ``code[d]`` is the image of digit ``d``.
    hidden_digits : str
        The hidden source digits, ascending (``""`` when ``n_hidden == 0``).
    """
    code_seed = _check_int("code_seed", code_seed, 0, 2**31 - 1, "any non-negative seed")
    n_hidden = _check_int("n_hidden", n_hidden, 0, 10, "there are only 10 digit mappings")
    rng = np.random.default_rng(1_000_003 + code_seed)
    while True:
        perm = rng.permutation(10)
        if not np.any(perm == np.arange(10)):
            break
    hidden = np.sort(rng.choice(10, size=n_hidden, replace=False)) if n_hidden else np.array([], dtype=int)
    return "".join(str(int(d)) for d in perm), "".join(str(int(d)) for d in hidden)


def _make_substitution(
    n: int,
    seed: int,
    split: str,
    length: int = 2,
    n_hidden: int = 2,
    code_seed: int = 0,
    test_fraction: float = 0.3,
) -> dict:
    length = _check_int("length", length, 1, 6, "source strings have 1-6 digits; the paper uses 2")
    code, hidden = substitution_code(code_seed, n_hidden)
    header = ",".join(f"{d}>{code[d]}" for d in range(10) if str(d) not in hidden)
    universe = 10**length
    pool = split_indices(universe, split, test_fraction, salt=0x5B5 * 1000 + length)
    params = f"length={length}, n_hidden={n_hidden}, code_seed={code_seed}, test_fraction={test_fraction}"
    chosen = _draw(pool, n, seed, "substitution", split, params)
    sources = [str(int(i)).zfill(length) for i in chosen]
    tag = f"c{code_seed}h{n_hidden}"
    return {
        "prompt": [f"{header}|{s}=" for s in sources],
        "answer": ["".join(code[int(c)] for c in s) for s in sources],
        "question_id": [f"sub:{tag}:{s}" for s in sources],
        "source": sources,
        "code": [code] * n,
        "hidden_digits": [hidden] * n,
        "n_hidden_slots": [sum(c in hidden for c in s) for s in sources],
    }


# ------------------------------------------------------------------------------------------------ scratchpad
SCRATCHPAD_MAX_DIGITS = 8  # the longest completion (10 n + 1 characters) plus prompt fits the tiny model's 128 positions


def scratchpad_solution(a: int, b: int) -> str:
    """The scratchpad completion for ``a + b``: columns ``x+y+c=s`` from the least significant, then ``|sum``.

    Operands shorter than the other are read with leading zeros. Example: ``scratchpad_solution(47, 85)`` is
    ``"7+5+0=12,4+8+1=13|132"``.
    """
    if a < 0 or b < 0:
        raise ValueError(f"operands must be non-negative, got {a}, {b}")
    da, db = str(a)[::-1], str(b)[::-1]
    carry, blocks = 0, []
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        total = x + y + carry
        blocks.append(f"{x}+{y}+{carry}={total}")
        carry = total // 10
    return ",".join(blocks) + "|" + str(a + b)


@functools.lru_cache(maxsize=8)
def _scratchpad_universe(min_digits: int, max_digits: int, per_digit: int) -> tuple[np.ndarray, np.ndarray]:
    """The task's fixed universe: ``per_digit`` distinct ``(a, b)`` pairs of ``n``-digit operands for every ``n``.

    Drawn with a fixed generator (independent of any run seed), so the universe, and hence the splits, are the same
    on every machine. For ``n = 1`` the operands are 0-9; for ``n >= 2`` they have exactly ``n`` digits.
    """
    a_all, b_all = [], []
    for n in range(min_digits, max_digits + 1):
        lo, hi = (0 if n == 1 else 10 ** (n - 1)), 10**n
        width = hi - lo
        total = width * width
        if per_digit > total:
            raise ValueError(f"per_digit={per_digit} exceeds the {total} distinct pairs of {n}-digit operands; "
                             f"use per_digit <= {total} or min_digits >= {n + 1}")
        rng = np.random.default_rng([0x5C2A7C, n])
        if total <= 4 * per_digit:
            codes = rng.choice(total, size=per_digit, replace=False)
        else:  # sample with replacement, keep the first per_digit distinct codes (collisions are rare)
            codes = np.empty(0, dtype=np.int64)
            while len(codes) < per_digit:
                extra = rng.integers(0, total, size=2 * per_digit, dtype=np.int64)
                merged = np.concatenate([codes, extra])
                _, first = np.unique(merged, return_index=True)
                codes = merged[np.sort(first)]
            codes = codes[:per_digit]
        a_all.append(lo + codes // width)
        b_all.append(lo + codes % width)
    return np.concatenate(a_all), np.concatenate(b_all)


def _scratchpad_params(min_digits, max_digits, per_digit) -> tuple[int, int, int]:
    min_digits = _check_int("min_digits", min_digits, 1, SCRATCHPAD_MAX_DIGITS,
                            f"operands have 1-{SCRATCHPAD_MAX_DIGITS} digits")
    max_digits = _check_int("max_digits", max_digits, min_digits, SCRATCHPAD_MAX_DIGITS,
                            f"max_digits must lie between min_digits and {SCRATCHPAD_MAX_DIGITS}")
    per_digit = _check_int("per_digit", per_digit, 2, 10**6, "problems per operand length")
    return min_digits, max_digits, per_digit


def _scratchpad_salt(min_digits: int, max_digits: int, per_digit: int) -> int:
    return 0x5C2A7C00 + 100 * min_digits + 10 * max_digits + per_digit


def _make_scratchpad(n: int, seed: int, split: str, min_digits: int = 2, max_digits: int = 7,
                     per_digit: int = 8000, test_fraction: float = 0.2) -> dict:
    min_digits, max_digits, per_digit = _scratchpad_params(min_digits, max_digits, per_digit)
    a_u, b_u = _scratchpad_universe(min_digits, max_digits, per_digit)
    pool = split_indices(len(a_u), split, test_fraction,
                         salt=_scratchpad_salt(min_digits, max_digits, per_digit))
    params = f"min_digits={min_digits}, max_digits={max_digits}, per_digit={per_digit}, test_fraction={test_fraction}"
    chosen = _draw(pool, n, seed, "scratchpad", split, params)
    a = [int(a_u[i]) for i in chosen]
    b = [int(b_u[i]) for i in chosen]
    return {
        "prompt": [f"{x}+{y}=" for x, y in zip(a, b)],
        "answer": [str(x + y) for x, y in zip(a, b)],
        "solution": [scratchpad_solution(x, y) for x, y in zip(a, b)],
        "question_id": [f"pad:{x}+{y}" for x, y in zip(a, b)],
        "n_digits": [max(len(str(x)), len(str(y))) for x, y in zip(a, b)],
    }


# ------------------------------------------------------------------------------------------------ rewards
def completion_text(completion) -> str:
    """Plain text of one TRL completion (a string, or a conversational list of ``{"content": ...}`` messages).

    Surrounding whitespace is stripped.
    """
    if isinstance(completion, str):
        return completion.strip()
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", "")).strip()
    raise TypeError(f"completion must be a str or a list of message dicts, got {type(completion).__name__}")


def _check_lengths(completions: Sequence, **columns: Sequence) -> None:
    for name, col in columns.items():
        if col is None:
            raise ValueError(f"reward function needs the dataset column {name!r}; keep it in the dataset")
        if len(col) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(col)} values in column {name!r}")


def exact_match_reward(prompts, completions, answer=None, **kwargs) -> list[float]:
    """Exact-match reward in {0, 1}: ``1.0`` iff the stripped completion equals ``answer``.

    TRL reward signature ``f(prompts, completions, **kwargs)``; ``answer`` is the dataset column.
    """
    _check_lengths(completions, answer=answer)
    return [float(completion_text(c) == str(a).strip()) for c, a in zip(completions, answer)]


def addition_reward(prompts, completions, answer=None, **kwargs) -> list[float]:
    """Addition task reward: exact match of the decimal sum, in {0, 1} (see :func:`exact_match_reward`)."""
    return exact_match_reward(prompts, completions, answer=answer, **kwargs)


def substitution_reward(prompts, completions, answer=None, **kwargs) -> list[float]:
    """Substitution task reward: exact match of the whole translated string, in {0, 1}.

    This is the paper's "exact-match grader" (1 only if every digit is right).
    """
    return exact_match_reward(prompts, completions, answer=answer, **kwargs)


def scratchpad_reward(prompts, completions, answer=None, **kwargs) -> list[float]:
    """Scratchpad task reward in {0, 1}: the completion has exactly one ``|`` and the text after it is the sum.

    The scratchpad before ``|`` is not graded (a verifiable final-answer check, as in RLVR on math); the strict
    parser refuses anything after the answer (the stripped text must end with it).
    """
    _check_lengths(completions, answer=answer)
    out = []
    for c, a in zip(completions, answer):
        parts = completion_text(c).split("|")
        out.append(float(len(parts) == 2 and parts[1] == str(a).strip()))
    return out


def scratchpad_steps_reward(prompts, completions, solution=None, **kwargs) -> list[float]:
    """Graded scratchpad reward in [0, 1]: share of the ``n + 1`` checkable items that are right.

    The items are the ``n`` column blocks ``x+y+c=s`` (block ``i`` must equal the reference block ``i``) and the
    final answer (as in :func:`scratchpad_reward`). A completion without ``|`` has no answer item right but can
    still earn credit for its correct columns. Used as the tie-break signal of blend rewards
    (:mod:`trl_ext.estimators.tiebreak`); the binary :func:`scratchpad_reward` stays the success criterion.
    """
    _check_lengths(completions, solution=solution)
    out = []
    for c, ref in zip(completions, solution):
        ref_steps, ref_answer = str(ref).split("|")
        ref_blocks = ref_steps.split(",")
        parts = completion_text(c).split("|")
        blocks = parts[0].split(",")
        right = sum(i < len(blocks) and blocks[i] == blk for i, blk in enumerate(ref_blocks))
        right += int(len(parts) == 2 and parts[1] == ref_answer)
        out.append(right / (len(ref_blocks) + 1))
    return out


def substitution_channel_scores(
    completions: Sequence, source: Sequence[str], code: Sequence[str], hidden_digits: Sequence[str]
) -> list[dict[str, tuple[int, int]]]:
    """Per-channel slot scores for the substitution task.

    Output position ``i`` of a completion is a *slot* for source digit ``s = source[i]``; it is correct iff the
    completion has a character at ``i`` equal to ``code[s]`` (a missing character counts as wrong; extra
    trailing characters do not affect slots, only the exact-match reward).

    Parameters
    ----------
    completions : sequence of str (or conversational message lists)
    source, code, hidden_digits : sequences of str
        The dataset columns of the same name, one entry per completion.

    Returns
    -------
    list of dict
        One dict per completion mapping channel -> ``(n_correct, n_slots)``:
        ``"revealed"``, ``"hidden"`` and ``"hidden:<d>"`` for every hidden source digit ``d`` (present even
        with 0 slots, so records have a fixed schema).
    """
    _check_lengths(completions, source=source, code=code, hidden_digits=hidden_digits)
    out = []
    for comp, src, cd, hid in zip(completions, source, code, hidden_digits):
        if len(cd) != 10 or not cd.isdigit():
            raise ValueError(f"code must be 10 digits (code[d] = image of d), got {cd!r}")
        text = completion_text(comp)
        scores = {"revealed": [0, 0], "hidden": [0, 0], **{f"hidden:{d}": [0, 0] for d in hid}}
        for i, s in enumerate(src):
            ok = int(i < len(text) and text[i] == cd[int(s)])
            keys = ("hidden", f"hidden:{s}") if s in hid else ("revealed",)
            for k in keys:
                scores[k][0] += ok
                scores[k][1] += 1
        out.append({k: (v[0], v[1]) for k, v in scores.items()})
    return out


def substitution_hidden_reward(
    prompts, completions, source=None, code=None, hidden_digits=None, no_slot_value: float | None = None, **kwargs
) -> list[float | None]:
    """Reward that scores only the hidden channel: fraction of hidden-mapping slots translated correctly.

    Parameters
    ----------
    no_slot_value : float or None, default None
        Returned for strings with no hidden slot. ``None`` makes TRL treat the row as unscorable for this
        function (NaN, ignored by ``nansum``; rows unscorable by every function get zero advantage).

    Returns
    -------
    list of float in [0, 1] (or ``no_slot_value``).
    """
    scores = substitution_channel_scores(completions, source, code, hidden_digits)
    return [s["hidden"][0] / s["hidden"][1] if s["hidden"][1] else no_slot_value for s in scores]


# ----------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class TaskSpec:
    """A registered task: how to build it, how to score it, and how long answers are."""

    name: str
    description: str
    builder: Callable[..., dict]
    reward_funcs: tuple[Callable, ...]
    max_answer_chars: Callable[..., int]
    defaults: dict = field(default_factory=dict)


TASKS: dict[str, TaskSpec] = {
    "addition": TaskSpec(
        name="addition",
        description="a+b= with a, b in 0..10**digits-1 (default digits=2); exact-match reward",
        builder=_make_addition,
        reward_funcs=(addition_reward,),
        max_answer_chars=lambda digits=2, **_: digits + 1,
        defaults={"digits": 2, "test_fraction": 0.2},
    ),
    "substitution": TaskSpec(
        name="substitution",
        description="secret digit code with n_hidden mappings never shown (Measurement Discipline for RLVR)",
        builder=_make_substitution,
        reward_funcs=(substitution_reward,),
        max_answer_chars=lambda length=2, **_: length,
        defaults={"length": 2, "n_hidden": 2, "code_seed": 0, "test_fraction": 0.3},
    ),
    "scratchpad": TaskSpec(
        name="scratchpad",
        description="n-digit addition (n = 2-7) with the column work written out (18-71 tokens); reward on the sum",
        builder=_make_scratchpad,
        reward_funcs=(scratchpad_reward,),
        max_answer_chars=lambda max_digits=7, **_: 10 * max_digits + 1,
        defaults={"min_digits": 2, "max_digits": 7, "per_digit": 8000, "test_fraction": 0.2},
    ),
}


def _spec(task: str) -> TaskSpec:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {sorted(TASKS)}")
    return TASKS[task]


def make_dataset(task: str, n: int, seed: int = 0, split: str = "train", **task_params):
    """Build ``n`` distinct problems of ``task`` from one split as a :class:`datasets.Dataset`.

    Parameters
    ----------
    task : {"addition", "substitution", "scratchpad"}
    n : int
        Number of distinct problems (<= the split's size).
    seed : int, default 0
        Chooses which problems and their order (the split itself is seed-independent).
    split : {"train", "test"}
    **task_params
        ``addition``: ``digits`` (1-3, default 2), ``test_fraction`` (default 0.2).
        ``substitution``: ``length`` (1-6, default 2), ``n_hidden`` (0-10, default 2), ``code_seed``
        (default 0), ``test_fraction`` (default 0.3, the paper's 70/30).
        ``scratchpad``: ``min_digits`` / ``max_digits`` (1-8, default 2 and 7), ``per_digit`` (problems per operand
        length in the universe, default 8000), ``test_fraction`` (default 0.2).

    Returns
    -------
    datasets.Dataset
        Columns ``prompt`` (str), ``answer`` (str), ``question_id`` (str, stable), plus ``a``, ``b`` (addition)
        or ``source``, ``code``, ``hidden_digits``, ``n_hidden_slots`` (substitution), or ``solution`` (the full
        reference scratchpad) and ``n_digits`` (scratchpad).

    Raises
    ------
    ValueError
        Unknown task (lists valid names), unknown parameter, out-of-range parameter, bad split, or ``n`` larger
        than the split (says the maximum).
    """
    spec = _spec(task)
    unknown = sorted(set(task_params) - set(spec.defaults))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for task {task!r}; valid: {sorted(spec.defaults)}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    from datasets import Dataset

    return Dataset.from_dict(spec.builder(n, seed, split, **task_params))


def split_size(task: str, split: str = "train", **task_params) -> int:
    """Number of distinct problems in ``split`` of ``task`` with ``task_params`` (the largest valid ``n``)."""
    spec = _spec(task)
    p = {**spec.defaults, **task_params}
    if task == "addition":
        digits = _check_int("digits", p["digits"], 1, 3, "operands have 1-3 digits")
        return len(split_indices((10**digits) ** 2, split, p["test_fraction"], salt=0xADD0 + digits))
    if task == "scratchpad":
        lo, hi, per = _scratchpad_params(p["min_digits"], p["max_digits"], p["per_digit"])
        return len(split_indices((hi - lo + 1) * per, split, p["test_fraction"], salt=_scratchpad_salt(lo, hi, per)))
    length = _check_int("length", p["length"], 1, 6, "source strings have 1-6 digits")
    return len(split_indices(10**length, split, p["test_fraction"], salt=0x5B5 * 1000 + length))


def get_reward_funcs(task: str) -> list[Callable]:
    """TRL reward functions for ``task`` (a new list; pass it as ``GRPOTrainer(reward_funcs=...)``)."""
    return list(_spec(task).reward_funcs)

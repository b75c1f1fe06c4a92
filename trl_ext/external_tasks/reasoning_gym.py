"""reasoning-gym tasks as TRL datasets and rewards: ``--dataset_name reasoning_gym:<task>[:option=value,...]``.

`reasoning-gym <https://pypi.org/project/reasoning-gym/>`_ (0.1.25; the optional extra ``trl-ext[reasoning-gym]``)
has ~100 seeded procedural generators, each with its own ``score_answer`` and many with a curriculum of difficulty
levels. This module turns one into what a TRL GRPO script needs:

* :func:`parse_spec` -- ``reasoning_gym:chain_sum``, ``reasoning_gym:chain_sum:level=2``,
  ``reasoning_gym:basic_arithmetic:size=500,seed=3,max_terms=4``. Options: ``level`` (the curriculum's global
  level, via ``reasoning_gym.create_curriculum``), ``size`` (train split size, default 1000), ``seed`` (default 0)
  and any field of the task's config dataclass (they override the level's values);
* :func:`make_rg_dataset` -- a split (``train`` / ``validation`` / ``test``) as a ``datasets.Dataset`` with
  ``prompt`` (a chat: one format instruction as system message, two solved examples of the same task as earlier
  turns, then the question), ``answer``, and the keys the reward needs (``rg_spec``, ``rg_split``, ``rg_index``).
  Splits are generated with seeds derived from ``seed`` and the split name, and are **disjoint by construction**: a
  question whose text appears in an earlier split (test, then validation, then the few-shot examples) is dropped
  from the later one and the split is refilled from further indices of its generator;
* :func:`rg_accuracy_reward` -- TRL's reward signature: the task's own ``score_answer`` on the answer extracted from
  the completion's last ``Answer: ...`` line (else an ``<answer>...</answer>`` tag); a completion with no answer
  scores 0.0 (a wrong answer), ``None`` (unscorable, counted by the trainers) only where ``score_answer`` itself
  raises; :func:`rg_format_reward` -- 1.0 when the last non-empty line is ``Answer: <something>``.

A missing ``reasoning_gym`` package is an ``ImportError`` with the install line; an unknown task or option a
``ValueError`` naming close matches.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import re
from dataclasses import dataclass, fields
from typing import Any

from ..realmodel.tasks import completion_text  # one reader of str / message-list completions

__all__ = ["PREFIX", "RGSpec", "is_rg_spec", "parse_spec", "make_rg_dataset", "rg_accuracy_reward",
           "rg_format_reward", "extract_answer", "SYSTEM_PROMPT", "DEFAULT_SPLIT_SIZES", "RG_REWARD_FUNCS"]

PREFIX = "reasoning_gym:"
#: Sizes of the held-out splits (the train split's size is the spec's ``size``).
DEFAULT_SPLIT_SIZES = {"train": 1000, "validation": 200, "test": 200}
_SPLIT_ORDER = ("test", "validation", "shots", "train")  # earlier splits win a shared question
N_SHOTS = 2
SYSTEM_PROMPT = ("Solve the problem. You may reason briefly first. End your reply with one final line of the form "
                 "'Answer: <your answer>' and nothing after it.")
_ANSWER_LINE = re.compile(r"^\s*Answer:[ \t]*(.+?)\s*$", re.MULTILINE)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _rg():
    try:
        import reasoning_gym
    except ImportError as e:
        raise ImportError("reasoning_gym:<task> datasets need the reasoning-gym package: pip install "
                          "'trl-ext[reasoning-gym]' (or pip install reasoning-gym==0.1.25).") from e
    return reasoning_gym


def is_rg_spec(name: Any) -> bool:
    """Whether ``name`` is a ``reasoning_gym:<task>`` dataset spec."""
    return isinstance(name, str) and name.startswith(PREFIX)


@dataclass(frozen=True)
class RGSpec:
    """A parsed spec: the task, its curriculum ``level`` (or ``None``), config overrides, train ``size`` and ``seed``."""

    task: str
    level: int | None = None
    overrides: tuple[tuple[str, Any], ...] = ()
    size: int = DEFAULT_SPLIT_SIZES["train"]
    seed: int = 0

    @property
    def canonical(self) -> str:
        """The spec as a string with its options in a fixed order (the key the reward rebuilds the data from)."""
        opts = [f"level={self.level}"] if self.level is not None else []
        opts += [f"size={self.size}", f"seed={self.seed}"] + [f"{k}={json.dumps(v)}" for k, v in self.overrides]
        return f"{PREFIX}{self.task}:{','.join(opts)}"


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_spec(spec: str) -> RGSpec:
    """Parse ``reasoning_gym:<task>[:key=value,...]`` (see the module docstring); ``ValueError`` with close names."""
    if not is_rg_spec(spec):
        raise ValueError(f"not a reasoning-gym spec: {spec!r} (expected 'reasoning_gym:<task>[:key=value,...]').")
    rest = spec[len(PREFIX):]
    task, _, opts = rest.partition(":")
    _rg()
    from reasoning_gym.factory import CURRICULA, DATASETS

    if task not in DATASETS:
        close = difflib.get_close_matches(task, sorted(DATASETS), n=5, cutoff=0.5)
        raise ValueError(f"unknown reasoning-gym task {task!r}" + (f"; close names: {close}" if close else "")
                         + f" ({len(DATASETS)} tasks; the list: "
                         "python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))').")
    config_fields = {f.name for f in fields(DATASETS[task][1])} - {"seed", "size"}
    level, size, seed, overrides = None, DEFAULT_SPLIT_SIZES["train"], 0, {}
    for item in filter(None, (o.strip() for o in opts.split(","))):
        key, eq, raw = item.partition("=")
        if not eq:
            raise ValueError(f"{spec}: option {item!r} must be key=value.")
        value = _value(raw)
        if key == "level":
            if task not in CURRICULA:
                raise ValueError(f"{spec}: task {task!r} has no curriculum, so no level; set its config fields "
                                 f"instead ({sorted(config_fields)}).")
            level = int(value)
        elif key in ("size", "seed"):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "size" else 0):
                raise ValueError(f"{spec}: {key} must be an integer {'>= 1' if key == 'size' else '>= 0'}, got {raw!r}.")
            size, seed = (value, seed) if key == "size" else (size, value)
        elif key in config_fields:
            overrides[key] = value
        else:
            close = difflib.get_close_matches(key, sorted(config_fields | {"level", "size", "seed"}), n=3)
            raise ValueError(f"{spec}: unknown option {key!r}" + (f" (did you mean {close}?)" if close else "")
                             + f"; options: level, size, seed and the fields of {task}'s config "
                             f"{sorted(config_fields)}.")
    return RGSpec(task, level, tuple(sorted(overrides.items())), size, seed)


def _split_seed(spec: RGSpec, split: str) -> int:
    digest = hashlib.sha256(f"trl_ext.reasoning_gym/v1|{spec.task}|{spec.seed}|{split}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _config_kwargs(spec: RGSpec) -> dict[str, Any]:
    """The task config's fields at the spec's curriculum level with its overrides (seed and size excluded)."""
    kwargs: dict[str, Any] = {}
    if spec.level is not None:
        from reasoning_gym.factory import create_curriculum

        cur = create_curriculum(spec.task)
        top = min(len(a.levels) for a in cur.attributes.values()) - 1
        if not 0 <= spec.level <= top:
            raise ValueError(f"{spec.canonical}: level must be in 0..{top} for {spec.task!r}.")
        cur.set_global_level(spec.level)
        cfg = cur.generate_configuration({"seed": 0, "size": 1})
        kwargs = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in ("seed", "size")}
    kwargs.update(dict(spec.overrides))
    return kwargs


@functools.lru_cache(maxsize=64)
def _generator(canonical: str, split: str, size: int):
    spec = parse_spec(canonical)
    return _rg().create_dataset(spec.task, seed=_split_seed(spec, split), size=size, **_config_kwargs(spec))


def _size(spec: RGSpec, split: str) -> int:
    return {"train": spec.size, "shots": N_SHOTS}.get(split, DEFAULT_SPLIT_SIZES.get(split, 0))


@functools.lru_cache(maxsize=64)
def _split_indices(canonical: str, split: str) -> tuple[int, ...]:
    """Generator indices of ``split``'s questions: the first ``size`` whose question text no earlier split holds."""
    spec = parse_spec(canonical)
    taken: set[str] = set()
    for earlier in _SPLIT_ORDER[:_SPLIT_ORDER.index(split)]:
        gen = _generator(canonical, earlier, 4 * _size(spec, earlier) + 16)
        taken |= {gen[i]["question"] for i in _split_indices(canonical, earlier)}
    want = _size(spec, split)
    cap = 4 * want + 16  # the generator is procedural: indices past the size are as valid as the first ones
    gen = _generator(canonical, split, cap)
    out, seen = [], set(taken)
    for i in range(cap):
        q = gen[i]["question"]
        if q in seen:
            continue
        seen.add(q)
        out.append(i)
        if len(out) == want:
            return tuple(out)
    raise ValueError(f"{canonical}: only {len(out)} distinct questions for the {split} split out of {cap} draws "
                     f"(the task's problem space is small at these settings); lower size or raise the difficulty.")


def _entry(canonical: str, split: str, index: int) -> dict:
    spec = parse_spec(canonical)
    return _generator(canonical, split, 4 * _size(spec, split) + 16)[index]


def _shot_reply(entry: dict) -> str:
    return f"Answer: {entry['answer']}"


def make_rg_dataset(spec: str | RGSpec, split: str = "train", n: int | None = None, seed: int = 0,
                    as_list: bool = False):
    """``n`` questions (all of the split when ``None``) of a reasoning-gym split, drawn without replacement with
    ``seed``; see the module docstring for the columns.

    Parameters
    ----------
    spec : str or RGSpec
        ``reasoning_gym:<task>[:options]``.
    split : {"train", "validation", "test"}
    n : int, optional
    seed : int
        Which ``n`` of the split (the split itself is fixed by the spec).
    as_list : bool
        Return row dicts instead of a ``datasets.Dataset``.
    """
    import random

    spec = parse_spec(spec) if isinstance(spec, str) else spec
    if split not in DEFAULT_SPLIT_SIZES:
        raise ValueError(f"split must be one of {sorted(DEFAULT_SPLIT_SIZES)}, got {split!r}.")
    canonical = spec.canonical
    idx = list(_split_indices(canonical, split))
    n = len(idx) if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(idx):
        raise ValueError(f"n must be an int in 1..{len(idx)} (the size of {canonical} / {split}), got {n!r}.")
    chosen = idx if n == len(idx) else sorted(random.Random(seed).sample(idx, n))
    shots = [_entry(canonical, "shots", i) for i in _split_indices(canonical, "shots")]
    head = [{"role": "system", "content": SYSTEM_PROMPT}]
    for e in shots:
        head += [{"role": "user", "content": e["question"]}, {"role": "assistant", "content": _shot_reply(e)}]
    rows = []
    for i in chosen:
        e = _entry(canonical, split, i)
        rows.append({"prompt": [*head, {"role": "user", "content": e["question"]}], "answer": str(e["answer"]),
                     "task": spec.task, "rg_spec": canonical, "rg_split": split, "rg_index": int(i)})
    if as_list:
        return rows
    from datasets import Dataset

    return Dataset.from_list(rows)


# --------------------------------------------------------------------------------------------------------- rewards
def extract_answer(completion: Any) -> str | None:
    """The answer a completion gives: the text after its last ``Answer:`` line, else its last ``<answer>`` tag."""
    text = completion_text(completion)
    lines = _ANSWER_LINE.findall(text)
    if lines:
        return lines[-1].strip()
    tags = _ANSWER_TAG.findall(text)
    return tags[-1].strip() if tags else None


def rg_accuracy_reward(prompts=None, completions=None, rg_spec=None, rg_split=None, rg_index=None,
                       **kwargs) -> list[float | None]:
    """TRL reward: the task's ``score_answer`` (in [0, 1]) of the extracted answer; 0.0 without an answer; ``None``
    where the scorer raises (unscorable)."""
    if completions is None or rg_spec is None or rg_split is None or rg_index is None:
        raise ValueError("rg_accuracy_reward needs completions and the dataset's rg_spec, rg_split and rg_index "
                         "columns (build the dataset with make_rg_dataset / --dataset_name reasoning_gym:<task>).")
    out: list[float | None] = []
    for comp, spec, split, idx in zip(completions, rg_spec, rg_split, rg_index, strict=True):
        answer = extract_answer(comp)
        if answer is None:
            out.append(0.0)
            continue
        entry = _entry(spec, split, int(idx))
        score_fn = _rg().get_score_answer_fn(parse_spec(spec).task)
        try:
            out.append(float(score_fn(answer, entry)))
        except Exception:  # noqa: BLE001 - the task's own scorer failed on this output: unscorable, not wrong
            out.append(None)
    return out


def rg_format_reward(prompts=None, completions=None, **kwargs) -> list[float]:
    """TRL reward: 1.0 when the completion's last non-empty line is ``Answer: <something>``, else 0.0."""
    if completions is None:
        raise ValueError("rg_format_reward needs completions.")
    out = []
    for comp in completions:
        lines = [ln for ln in completion_text(comp).splitlines() if ln.strip()]
        out.append(float(bool(lines) and _ANSWER_LINE.fullmatch(lines[-1]) is not None))
    return out


#: The reward functions by name (``--reward_funcs accuracy format``); the first is the default.
RG_REWARD_FUNCS = {"accuracy": rg_accuracy_reward, "format": rg_format_reward}

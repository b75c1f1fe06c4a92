"""Evaluation helpers: greedy / sampled accuracy, per-prompt pass rates, per-question JSONL outcomes.

Outcome JSONL format (read by the comparison tools; documented in ``docs/testbed.md``): one JSON object per
question and line, with keys

``question_id`` (str), ``correct`` (0/1: greedy correctness, or the majority over samples, i.e.
``pass_rate > 0.5``), ``pass_rate`` (float in [0, 1]), ``n_samples`` (int), ``completion_tokens`` (float, mean
generated tokens per sample, counting the ``<eos>`` when one was produced), ``prompt`` (str), ``answer`` (str),
``completions`` (list of str), plus ``channels`` for the substitution task (``{name: [n_correct, n_slots]}``
summed over samples).

A path ending in ``.gz`` is written and read gzip-compressed; reading ``X.jsonl`` when only ``X.jsonl.gz`` exists
reads the latter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# The outcome file format is the comparison tools' (trl_ext.stats.outcomes); its writer and strict reader stay
# importable from here.
from ..stats.outcomes import REQUIRED_KEYS, read_outcomes_jsonl, write_outcomes_jsonl

__all__ = ["EvalResult", "evaluate_model", "write_outcomes_jsonl", "read_outcomes_jsonl", "REQUIRED_KEYS"]


@dataclass
class EvalResult:
    """Result of :func:`evaluate_model`.

    Attributes
    ----------
    accuracy : float
        Mean of ``per_prompt_pass_rate``: the greedy accuracy for greedy decoding, the expected per-sample
        accuracy ("sampled accuracy") for sampling.
    per_prompt_pass_rate : list of float
        Fraction of correct samples per question, in dataset order.
    records : list of dict
        One outcome record per question (the JSONL schema above).
    generated_tokens : int
        Total generated tokens over all questions and samples (each sample counted up to and including its
        first ``<eos>``, or ``max_new_tokens`` if none).
    """

    accuracy: float
    per_prompt_pass_rate: list[float]
    records: list[dict]
    generated_tokens: int
    extras: dict = field(default_factory=dict)

    @property
    def majority_accuracy(self) -> float:
        """Fraction of questions whose ``correct`` flag is 1."""
        return sum(r["correct"] for r in self.records) / max(len(self.records), 1)


def _model_device(model):
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        import torch

        return torch.device("cpu")


def evaluate_model(
    model,
    tokenizer,
    dataset,
    task: str,
    *,
    num_samples: int = 1,
    greedy: bool = True,
    max_new_tokens: int = 8,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 64,
) -> EvalResult:
    """Generate answers for every prompt of ``dataset`` and score them with the task's reward function.

    Parameters
    ----------
    model : PreTrainedModel-like
        Anything with ``generate(input_ids=..., attention_mask=..., max_new_tokens=..., do_sample=...,
        num_return_sequences=..., ...)`` returning ``(B * num_return_sequences, prompt_len + T)`` token ids
        (prompt first), like HF ``generate``. Pass the unwrapped model, not a DDP wrapper. Its train/eval mode
        is restored afterwards.
    tokenizer : PreTrainedTokenizerBase
        Needs pad and eos tokens; prompts are left-padded.
    dataset : datasets.Dataset or sequence of dicts
        Needs ``prompt``, ``answer`` and ``question_id`` (and the columns the task's reward reads).
    task : str
        A key of :data:`trl_ext.testbed.TASKS`; the first of ``get_reward_funcs(task)`` scores (1 = correct).
    num_samples : int, default 1
        Samples per question. Greedy decoding requires ``num_samples == 1`` (the samples would be identical).
    greedy : bool, default True
    max_new_tokens : int, default 8
    temperature : float, default 1.0
        Sampling temperature (> 0); ignored when greedy. Sampling uses the full distribution (``top_k=0``,
        ``top_p=1``), as GRPO rollouts do.
    seed : int, default 0
        Torch seed for sampling; the global RNG state is restored afterwards.
    batch_size : int, default 64
        Prompts per ``generate`` call.

    Returns
    -------
    EvalResult

    Raises
    ------
    ValueError
        Empty dataset, missing columns, unknown task, ``num_samples < 1``, greedy with ``num_samples > 1``,
        non-positive ``temperature`` / ``max_new_tokens`` / ``batch_size``.
    """
    from .tasks import get_reward_funcs

    reward_fn = get_reward_funcs(task)[0]
    _check_eval_args(num_samples=num_samples, greedy=greedy, temperature=temperature, max_new_tokens=max_new_tokens,
                     batch_size=batch_size)
    rows = [dict(r) for r in dataset]
    if not rows:
        raise ValueError("dataset is empty: nothing to evaluate")
    missing = [k for k in ("prompt", "answer", "question_id") if k not in rows[0]]
    if missing:
        raise ValueError(f"dataset lacks column(s) {missing}; build it with trl_ext.testbed.make_dataset")
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError("tokenizer needs pad and eos tokens")
    texts, lengths = _generate_answers(model, tokenizer, rows, num_samples=num_samples, greedy=greedy,
                                       max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                       batch_size=batch_size)
    return _score_answers(rows, texts, lengths, task, reward_fn)


def _check_eval_args(*, num_samples, greedy, temperature, max_new_tokens, batch_size) -> None:
    """The sampling settings of :func:`evaluate_model` (``ValueError`` naming the bad one)."""
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    if greedy and num_samples != 1:
        raise ValueError("greedy decoding gives identical samples: use num_samples=1, or greedy=False to sample")
    if not greedy and not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")


def _generate_answers(model, tokenizer, rows: list[dict], *, num_samples: int, greedy: bool, max_new_tokens: int,
                      temperature: float, seed: int, batch_size: int) -> tuple[list[list[str]], list[list[int]]]:
    """``(texts, lengths)``: the decoded completions of every row and their generated token counts (up to and
    including the first ``<eos>``), under a forked, seeded torch RNG; the model's mode and the tokenizer's padding
    side are restored afterwards."""
    import torch

    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    was_training = bool(getattr(model, "training", False))
    if hasattr(model, "eval"):
        model.eval()
    device = _model_device(model)
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    gen_kwargs = {"max_new_tokens": max_new_tokens, "pad_token_id": pad_id, "eos_token_id": eos_id}
    if greedy:
        gen_kwargs.update(do_sample=False)
    else:
        gen_kwargs.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)
    texts: list[list[str]] = []
    lengths: list[list[int]] = []
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            for start in range(0, len(rows), batch_size):
                chunk = rows[start : start + batch_size]
                enc = tokenizer([r["prompt"] for r in chunk], return_tensors="pt", padding=True)
                out = model.generate(
                    input_ids=enc["input_ids"].to(device),
                    attention_mask=enc["attention_mask"].to(device),
                    num_return_sequences=num_samples,
                    **gen_kwargs,
                )
                gen = out[:, enc["input_ids"].shape[1] :].tolist()
                if len(gen) != len(chunk) * num_samples:
                    raise RuntimeError(f"model.generate returned {len(gen)} rows, expected {len(chunk) * num_samples}")
                for i in range(len(chunk)):
                    t_i, l_i = [], []
                    for ids in gen[i * num_samples : (i + 1) * num_samples]:
                        n = ids.index(eos_id) + 1 if eos_id in ids else len(ids)
                        l_i.append(n)
                        t_i.append(tokenizer.decode([t for t in ids[:n] if t not in (eos_id, pad_id)],
                                                    skip_special_tokens=True))
                    texts.append(t_i)
                    lengths.append(l_i)
    finally:
        tokenizer.padding_side = old_side
        if was_training and hasattr(model, "train"):
            model.train()
    return texts, lengths


def _score_answers(rows: list[dict], texts: list[list[str]], lengths: list[list[int]], task: str,
                   reward_fn) -> EvalResult:
    """Score every row's completions with ``reward_fn`` and build the outcome records of :func:`evaluate_model`."""
    from .tasks import substitution_channel_scores

    records, rates, total = [], [], 0
    for row, comps, lens in zip(rows, texts, lengths):
        kw = {k: [v] * len(comps) for k, v in row.items() if k != "prompt"}
        scores = reward_fn([row["prompt"]] * len(comps), comps, **kw)
        rate = float(sum(scores)) / len(comps)
        rec = {
            "question_id": str(row["question_id"]),
            "correct": int(rate > 0.5),
            "pass_rate": rate,
            "n_samples": len(comps),
            "completion_tokens": sum(lens) / len(lens),
            "prompt": row["prompt"],
            "answer": str(row["answer"]),
            "completions": comps,
        }
        if task == "substitution":
            ch = substitution_channel_scores(comps, [row["source"]] * len(comps), [row["code"]] * len(comps),
                                             [row["hidden_digits"]] * len(comps))
            rec["channels"] = {k: [sum(c[k][0] for c in ch), sum(c[k][1] for c in ch)] for k in ch[0]}
        records.append(rec)
        rates.append(rate)
        total += sum(lens)
    return EvalResult(accuracy=sum(rates) / len(rates), per_prompt_pass_rate=rates, records=records,
                      generated_tokens=int(total))

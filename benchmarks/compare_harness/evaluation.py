"""Held-out evaluation: generation and scoring for chat and ``--dataset_fn`` tasks, one checkpoint's primary (and
extra sampled) evaluation, the cached start evaluation, and accuracy readers for run records."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trl_ext._io import read_json
from trl_ext._io import write_json as _write_json

if TYPE_CHECKING:
    from .context import Context


def _tokenize_prompts(tok, prompts: list, device):
    """Left-padded input ids of plain-text prompts, or of conversations through the chat template (generation
    prompt appended), as TRL's trainers render them."""
    if prompts and isinstance(prompts[0], list):
        enc = tok.apply_chat_template(prompts, add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                      padding=True)
    else:
        enc = tok(prompts, return_tensors="pt", padding=True)
    return {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}


def _prompt_text(prompt) -> str:
    """A prompt as recorded in outcome files: a conversation's last turn (the question), a plain prompt as is."""
    return str(prompt[-1]["content"]) if isinstance(prompt, list) and prompt else str(prompt)


def _generic_evaluate(model, tok, dataset, reward_fn, greedy, num_samples, max_new, seed, batch_size, result_cls,
                      temperature: float = 1.0, vllm: dict | None = None):
    """Evaluation for ``--dataset_fn`` datasets and the real-model chat tasks (same record schema as
    ``trl_ext.testbed.evaluate_model``); conversational prompts go through the tokenizer's chat template. Sampled
    evaluation uses ``temperature`` (the training temperature), top_k 0, top_p 1. ``vllm`` (the keyword arguments of
    :func:`.vllm_eval.generate` but the model's): generate on a vLLM engine instead of ``model.generate``."""
    rows = [dict(r) for r in dataset]
    if not rows or any(k not in rows[0] for k in ("prompt", "question_id")):
        raise ValueError("the evaluation dataset needs 'prompt' and 'question_id' columns and at least one row")
    if vllm is not None:
        from .vllm_eval import generate

        ids, settings = generate(model, tok, [r["prompt"] for r in rows], [r["question_id"] for r in rows],
                                 num_samples=num_samples, temperature=0.0 if greedy else temperature,
                                 max_new_tokens=max_new, eval_seed=seed, **vllm)
    else:
        ids, settings = _hf_generate(model, tok, rows, greedy, num_samples, max_new, seed, batch_size,
                                     temperature), None
    records, total = [], 0
    for row, per in zip(rows, ids):
        lens = [len(c) for c in per]
        comps = [tok.decode(c, skip_special_tokens=True) for c in per]
        extra = {k: [v] * num_samples for k, v in row.items() if k != "prompt"}
        scores = reward_fn([row["prompt"]] * num_samples, comps, **extra)
        rate = float(sum(float(x or 0.0) for x in scores)) / num_samples
        records.append({"question_id": str(row["question_id"]), "correct": int(rate > 0.5),
                        "pass_rate": rate, "n_samples": num_samples,
                        "completion_tokens": sum(lens) / len(lens), "prompt": _prompt_text(row["prompt"]),
                        "answer": str(row.get("answer", "")), "completions": comps})
        total += sum(lens)
    rates = [r["pass_rate"] for r in records]
    result = result_cls(accuracy=sum(rates) / len(rates), per_prompt_pass_rate=rates, records=records,
                        generated_tokens=int(total))
    result.backend_settings = settings
    return result


def _hf_generate(model, tok, rows, greedy, num_samples, max_new, seed, batch_size, temperature):
    """``model.generate`` on left-padded batches of ``batch_size`` prompts, ``num_samples`` sequences each, under a
    forked RNG seeded with ``seed``: completion token ids per row (cut after the first EOS)."""
    import torch

    was_training = model.training
    model.eval()
    old_side, tok.padding_side = tok.padding_side, "left"
    device = next(model.parameters()).device
    kw = dict(max_new_tokens=max_new, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    kw.update(do_sample=False) if greedy else kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    out_ids = []
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            for start in range(0, len(rows), batch_size):
                chunk = rows[start:start + batch_size]
                enc = _tokenize_prompts(tok, [r["prompt"] for r in chunk], device)
                out = model.generate(**enc, num_return_sequences=num_samples, **kw)[:, enc["input_ids"].shape[1]:]
                for i in range(len(chunk)):
                    per = []
                    for ids in out[i * num_samples:(i + 1) * num_samples].tolist():
                        n = ids.index(tok.eos_token_id) + 1 if tok.eos_token_id in ids else len(ids)
                        per.append(ids[:n])
                    out_ids.append(per)
    finally:
        tok.padding_side = old_side
        model.train(was_training)
    return out_ids


def accuracy_by_level(records: Sequence[dict], levels: dict[str, str] | None) -> dict[str, dict] | None:
    """Per-difficulty accuracy of one evaluation: ``{level: {"n": questions, "accuracy": mean pass rate}}``.

    ``levels`` maps ``question_id`` to its level (e.g. ``n_digits``); ``None`` (no such column) gives ``None``.
    Levels are ordered numerically when they are numbers.
    """
    if levels is None:
        return None
    acc: dict[str, list[float]] = {}
    for r in records:
        lv = levels.get(str(r["question_id"]))
        if lv is not None:
            acc.setdefault(lv, []).append(float(r["pass_rate"]))
    return {lv: {"n": len(v), "accuracy": sum(v) / len(v)} for lv, v in sorted(acc.items(), key=_level_order)}


def _level_order(item):
    k = item[0]
    try:
        return (0, float(k), "")
    except ValueError:
        return (1, 0.0, k)


def evaluate_checkpoint(ctx: Context, model, seed: int, split: str):
    """``(primary, extra_sampled)`` evaluations of one checkpoint. ``eval_mode="greedy"`` (default): greedy
    accuracy, plus sampled accuracy with ``eval_samples`` samples per question when that is > 0. ``"sampled"``:
    only the sampled evaluation (at the training temperature, T = 1 by default; ``eval_samples`` per question,
    sampling seed ``1000 + seed``: the same noise stream for every method at one seed), which is then the primary
    accuracy."""
    s = ctx.s
    n = eval_samples_for(s, split)
    if s.get("eval_mode") == "sampled":
        return ctx.evaluate(model, greedy=False, num_samples=n, seed=1000 + seed, split=split), None
    g = ctx.evaluate(model, greedy=True, split=split)
    sampled = None
    if n:
        sampled = ctx.evaluate(model, greedy=False, num_samples=n, seed=1000 + seed, split=split)
    return g, sampled


#: Per-call keys of an engine evaluation's settings (:func:`.vllm_eval.generate`): its waits and the worker's
#: memory, not the engine's setup.
ENGINE_WAIT_KEYS = ("lock_wait_s", "memory_wait_s", "engine_attempts", "worker_rss_gb")


def engine_wait_s(*results) -> float | None:
    """Seconds the engine evaluations among ``results`` (``EvalResult`` or ``None``) waited for another worker
    before their engines ran: the machine's engine lock plus free memory (:func:`.vllm_eval.generate`); ``None``
    when none of them ran on an engine (transformers sampling does not wait)."""
    waits = [float(st.get("lock_wait_s", 0.0)) + float(st.get("memory_wait_s", 0.0))
             for st in (getattr(r, "backend_settings", None) for r in results) if st and "lock_wait_s" in st]
    return sum(waits) if waits else None


def worker_rss_during_engine(*results) -> float | None:
    """The largest resident memory (GB) the worker held while one of the engine evaluations among ``results`` ran
    (``worker_rss_gb`` of :func:`.vllm_eval.generate`); ``None`` when none ran on an engine or none was read."""
    rss = [float(st["worker_rss_gb"]) for st in (getattr(r, "backend_settings", None) for r in results)
           if st and isinstance(st.get("worker_rss_gb"), (int, float))]
    return max(rss) if rss else None


def eval_samples_for(s: dict, split: str) -> int:
    """Samples per question of an evaluation on ``split``: ``test_eval_samples`` on the test split when set (more
    samples where the comparison is read, the validation split of the tuning unchanged), else ``eval_samples``."""
    if split == "test" and s.get("test_eval_samples"):
        return int(s["test_eval_samples"])
    return int(s["eval_samples"])


START_EVAL_FILE = "start_eval.json"


def start_evaluation(ctx: Context):
    """The start checkpoint's primary evaluation on the test set (:func:`evaluate_checkpoint`, seed 0), cached in
    ``<output_dir>/start_eval.json`` with the settings it depends on, so ``--jobs`` workers and resumed invocations
    (minutes per evaluation on the real model) do not repeat it."""
    from types import SimpleNamespace

    s = ctx.s
    key = {k: s.get(k) for k in ("task", "n_eval", "eval_mode", "eval_samples", "model_name_or_path",
                                 "max_completion_length", "start_checkpoint_sha", "dataset_fn")}
    if s.get("temperature", 1.0) != 1.0:  # keys of T = 1 evaluations are unchanged
        key["temperature"] = s["temperature"]
    if s.get("test_eval_samples") and s["test_eval_samples"] != s["eval_samples"]:
        key["test_eval_samples"] = s["test_eval_samples"]
    if s.get("test_eval_backend", "transformers") != "transformers":
        key["eval_backend"] = [s["test_eval_backend"], eval_engine_dtype(s)]
    path = os.path.join(s["output_dir"], START_EVAL_FILE)
    if s["resume"] and os.path.exists(path):
        doc = read_json(path)
        if doc.get("key") == key:
            return SimpleNamespace(accuracy=doc["accuracy"], records=doc["records"])
    g = evaluate_checkpoint(ctx, ctx.load_model(), 0, "test")[0]
    _write_json(path, {"key": key, "accuracy": g.accuracy,
                       "records": [{k: r[k] for k in ("question_id", "correct", "pass_rate")} for r in g.records]})
    return g


def eval_engine_dtype(s: dict) -> str | None:
    """The vLLM evaluation engine's dtype (``--eval_vllm_dtype``, default float32); ``None`` for transformers."""
    if s.get("test_eval_backend", "transformers") != "vllm":
        return None
    from .vllm_eval import DEFAULT_DTYPE

    return s.get("eval_vllm_dtype") or DEFAULT_DTYPE


def start_regime(records: Sequence[dict], k: int) -> dict | None:
    """The regime of the start checkpoint on the test split, from its evaluation's per-question pass rates (``k``
    samples per question): the shares of questions solved in none, all and some of the ``k`` samples, and the
    between-question share of reward variance (``icc``, :func:`trl_ext.advise.regime.variance_decomposition`:
    ``(var(p_hat) - mean p_hat (1 - p_hat) / (k - 1)) / (pbar (1 - pbar))``, binomial noise removed). ``None`` with
    one sample per question (no within-question information). "None of ``k``" over-counts the never-solved share
    (a question with pass rate p is missed ``k`` times with probability ``(1 - p)^k``): an upper bound."""
    from trl_ext.advise.regime import variance_decomposition

    if k < 2 or len(records) < 2:
        return None
    p = [float(r["pass_rate"]) for r in records]
    n = len(p)
    never, always = sum(x == 0.0 for x in p) / n, sum(x == 1.0 for x in p) / n
    return {"k": int(k), "n_questions": n, "mean": sum(p) / n, "share_none": never, "share_all": always,
            "share_mixed": 1.0 - never - always, "icc": float(variance_decomposition(p, k)["icc"])}


def final_accuracy(run: dict) -> float:
    """A run's primary accuracy at the budget (``final_greedy_accuracy`` in runs written before ``eval_mode``)."""
    return float(run["final_accuracy"] if run.get("final_accuracy") is not None else run["final_greedy_accuracy"])


def point_accuracy(point: dict) -> float:
    """A curve point's primary accuracy (``greedy_accuracy`` in runs written before ``eval_mode``)."""
    return float(point["accuracy"] if "accuracy" in point else point["greedy_accuracy"])

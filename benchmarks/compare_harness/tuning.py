"""Learning-rate tuning (protocol v2): validation runs per method and rate, the selection rule, the edge extension
on the 1-3-10 ladder, and ``lr_choice.json``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trl_ext._io import write_json as _write_json

from . import runs as _runs
from .evaluation import final_accuracy
from .presets import LR_CHOICE_FILE, METHODS
from .report import _mean_sd
from .runs import _read_results

if TYPE_CHECKING:
    from .context import Context


LR_SELECTION_RULE = ("highest mean final accuracy (the primary evaluation: greedy, or sampled under eval_mode "
                     "'sampled') on the validation split over the tuning seeds; ties go to "
                     "the lower learning rate; a learning rate with a failed tuning run is not eligible; when the "
                     "best rate is the lowest or highest tried, the next rate beyond it on the 1-3-10 ladder is "
                     "tuned too (at most tune_extend times per method)")
#: Settings that must match for an existing lr_choice.json to apply to this invocation.
TUNING_CONTEXT_KEYS = ("task", "dataset_fn", "reward_fn", "model_name_or_path", "start_checkpoint_sha", "warm_seed",
                       "token_budget", "n_train", "n_val", "rollouts_per_step", "max_completion_length",
                       "config_overrides", "scale", "bf16", "tune_extend")

WEIGHT_NEUTRAL_OVERRIDES = frozenset({"gradient_checkpointing"})
"""``--config_overrides`` keys that change memory and time but not the trained weights, so a rate tuned without them
transfers (:func:`borrowed_lr_choice`): gradient checkpointing recomputes the same activations, bitwise the same
weights on CPU (``tests/test_v05_trainer.py``, ``tests/test_trainer_base.py``)."""


def lr_key(lr: float) -> str:
    """JSON key and directory tag of a learning rate (``3e-05``, ``0.0001``)."""
    return f"{float(lr):g}"


def lr_scores(tune_runs: Sequence[dict]) -> dict[str, dict[str, dict]]:
    """Validation scores per method and learning rate from tuning-run records.

    Returns ``{method: {lr_key: {"lr", "mean", "sd", "per_seed", "seeds", "n_ok", "n_not_ok", "reasons"}}}``;
    ``mean``/``sd`` over the finished (status ok) runs, ``None`` without any.
    """
    out: dict[str, dict[str, dict]] = {}
    for r in tune_runs:
        lr = float(r["learning_rate"])
        cell = out.setdefault(r["method"], {}).setdefault(lr_key(lr), {
            "lr": lr, "per_seed": [], "seeds": [], "n_ok": 0, "n_not_ok": 0, "reasons": []})
        if r["status"] == "ok":
            cell["per_seed"].append(final_accuracy(r))
            cell["seeds"].append(r["seed"])
            cell["n_ok"] += 1
        else:
            cell["n_not_ok"] += 1
            cell["reasons"].append(f"seed {r['seed']} {r['status']}: {r.get('reason')}")
    for cells in out.values():
        for cell in cells.values():
            cell["mean"], cell["sd"] = _mean_sd(cell["per_seed"])
    return {m: dict(sorted(c.items(), key=lambda kv: kv[1]["lr"])) for m, c in out.items()}


def choose_lr(scores: dict[str, dict]) -> tuple[float | None, str]:
    """Pick one method's learning rate from its :func:`lr_scores` entry (:data:`LR_SELECTION_RULE`).

    Returns ``(lr, reason)``; ``lr`` is ``None`` when no learning rate has all its tuning runs finished.
    """
    eligible = [c for c in scores.values() if c["n_ok"] > 0 and c["n_not_ok"] == 0]
    if not eligible:
        reasons = "; ".join(r for c in scores.values() for r in c["reasons"]) or "no tuning run"
        return None, f"no learning rate finished its tuning runs ({reasons})"
    best = max(eligible, key=lambda c: (c["mean"], -c["lr"]))
    ties = [c["lr"] for c in eligible if c["mean"] == best["mean"]]
    why = f"validation accuracy {best['mean']:.4f} (mean of {best['n_ok']} seed(s))"
    if len(ties) > 1:
        why += f"; tied with {sorted(x for x in ties if x != best['lr'])}, the lower learning rate wins"
    return best["lr"], why


def lr_ladder_neighbour(lr: float, direction: int) -> float:
    """The next learning rate below (``direction=-1``) or above (``+1``) ``lr`` on the 1-3-10 ladder
    (..., 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, ...); ``lr`` need not be on the ladder."""
    import math

    if direction not in (-1, 1):
        raise ValueError("direction must be -1 or +1")
    lo = math.floor(math.log10(lr)) - 1
    ladder = sorted(m * 10.0 ** e for e in range(lo, lo + 4) for m in (1.0, 3.0))
    ladder = [float(f"{x:.1g}") for x in ladder]
    if direction < 0:
        return max(x for x in ladder if x < lr * (1 - 1e-9))
    return min(x for x in ladder if x > lr * (1 + 1e-9))


def edge_extension(scores: dict[str, dict]) -> float | None:
    """The learning rate to try next when tuning ended at an edge, else ``None``.

    ``scores`` is one method's :func:`lr_scores` entry. When the rate :func:`choose_lr` picks is the lowest (highest)
    rate tried and at least two rates were tried, the grid did not bracket the optimum: the next rate below (above)
    it on the 1-3-10 ladder (:func:`lr_ladder_neighbour`) is returned. ``None`` when the pick is interior, when it ties
    with another rate, when nothing finished, or with fewer than two rates.
    """
    lr, _ = choose_lr(scores) if scores else (None, "")
    tried = sorted(c["lr"] for c in scores.values())
    if lr is None or len(tried) < 2:
        return None
    eligible = [c for c in scores.values() if c["n_ok"] > 0 and c["n_not_ok"] == 0]
    best = max(c["mean"] for c in eligible)
    if sum(c["mean"] == best for c in eligible) > 1:  # a tie (e.g. nothing learned anywhere): no direction to go
        return None
    if lr == tried[0]:
        return lr_ladder_neighbour(lr, -1)
    if lr == tried[-1]:
        return lr_ladder_neighbour(lr, +1)
    return None


def build_lr_choice(tune_runs: Sequence[dict], grid: Sequence[float], tune_seeds: Sequence[int],
                    context: dict) -> dict:
    """The ``lr_choice.json`` document: per method the chosen learning rate, the reason, every validation score.

    A method whose tuning runs were all skipped (e.g. ``tiebreak`` on a task without a graded reward) gets
    ``status: "skipped"`` and the reason; one whose runs all failed ``status: "failed"`` and ``chosen_lr: null``.
    """
    methods = {}
    scores = lr_scores(tune_runs)
    for name in dict.fromkeys(r["method"] for r in tune_runs):
        mine = [r for r in tune_runs if r["method"] == name]
        if all(r["status"] == "skipped" for r in mine):
            methods[name] = {"status": "skipped", "chosen_lr": None, "reason": mine[0].get("reason"),
                             "scores": scores[name]}
            continue
        lr, why = choose_lr(scores[name])
        methods[name] = {"status": "ok" if lr is not None else "failed", "chosen_lr": lr, "reason": why,
                         "scores": scores[name],
                         "tuning_tokens": sum(float(r.get("tokens") or 0.0) for r in mine)}
    return {"grid": [float(x) for x in grid], "tune_seeds": list(tune_seeds), "selection_rule": LR_SELECTION_RULE,
            "split": "validation (train split, disjoint from the training prompts; the test split is not used)",
            "context": context, "methods": methods}


def merge_lr_choice(existing: dict | None, new: dict) -> dict:
    """``existing`` with the methods of ``new`` added: an existing chosen learning rate is never replaced; an existing
    entry without one (its tuning failed or was skipped) is replaced by a new entry for the method."""
    if not existing:
        return new
    merged = dict(existing)
    kept = {m: c for m, c in existing.get("methods", {}).items() if c.get("chosen_lr") is not None}
    merged["methods"] = {**existing.get("methods", {}), **new.get("methods", {}), **kept}
    if [float(x) for x in new.get("grid", [])] != [float(x) for x in existing.get("grid", [])]:
        merged.setdefault("notes", []).append(
            f"methods {sorted(set(new.get('methods', {})) - set(existing.get('methods', {})))} were tuned over "
            f"{new.get('grid')}, the others over {existing.get('grid')}")
    return merged


def tuning_context(s: dict) -> dict:
    """The settings an lr choice depends on (:data:`TUNING_CONTEXT_KEYS`)."""
    return {k: s.get(k) for k in TUNING_CONTEXT_KEYS}


def check_lr_choice_context(doc: dict, s: dict, path: str) -> None:
    """``SystemExit`` when ``doc`` (a read ``lr_choice.json``) was tuned under other settings than ``s``."""
    old = doc.get("context") or {}
    now = json.loads(json.dumps(tuning_context(s), default=str))
    diff = [f"{k}: file {old.get(k)!r}, now {now[k]!r}" for k in now if k in old and old[k] != now[k]]
    if diff:
        raise SystemExit(f"{path} was tuned under other settings ({'; '.join(diff)}); delete it to re-tune (finished "
                         "tuning runs with the current settings are reused) or use another --output_dir")


def borrowed_lr_choice(s: dict, path: str) -> dict:
    """The ``lr_choice.json`` at ``path`` (another benchmark folder), for runs at another token budget: every tuning
    setting but ``token_budget`` must match (:data:`TUNING_CONTEXT_KEYS`); the document records where it came from
    and the budget its rates were tuned at (a longer horizon reuses the rates tuned at the shorter one)."""
    if not os.path.exists(path):
        raise SystemExit(f"--lr_choice_from {path}: no such file")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    old = doc.get("context") or {}
    now = json.loads(json.dumps(tuning_context(s), default=str))
    neutral = sorted(set(now.get("config_overrides") or {}) & WEIGHT_NEUTRAL_OVERRIDES)

    def comparable(ctx: dict) -> dict:
        return {**ctx, "config_overrides": {k: v for k, v in (ctx.get("config_overrides") or {}).items()
                                            if k not in WEIGHT_NEUTRAL_OVERRIDES}}

    old_c, now_c = comparable(old), comparable(now)
    diff = [f"{k}: file {old_c.get(k)!r}, now {now_c[k]!r}" for k in now_c
            if k != "token_budget" and k in old_c and old_c[k] != now_c[k]]
    if diff:
        raise SystemExit(f"--lr_choice_from {path} was tuned under other settings ({'; '.join(diff)}); only "
                         f"token_budget and the weight-neutral overrides {sorted(WEIGHT_NEUTRAL_OVERRIDES)} may differ")
    return {**doc, "borrowed_from": os.path.relpath(path), "tuned_at_token_budget": old.get("token_budget"),
            "weight_neutral_overrides": neutral}


def tune_learning_rates(ctx: Context, setup_cache: dict) -> tuple[dict, list[dict]]:
    """Per-method learning-rate tuning on the validation split; returns ``(lr_choice doc, tuning run records)``.

    ``lr_choice.json`` in ``--output_dir``, when present, is read instead of re-tuning: its methods keep their
    recorded choice (its settings must match, see :func:`check_lr_choice_context`); only methods it lacks, or whose
    tuning gave no learning rate (failed or skipped), are tuned and added. Tuning runs live in
    ``runs/tune/<method>/lr<lr>/seed<k>/`` and are reused like main runs.
    """
    s = ctx.s
    path = os.path.join(s["output_dir"], LR_CHOICE_FILE)
    existing = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            existing = json.load(f)
        check_lr_choice_context(existing, s, path)
        print(f"reading learning-rate choices from {path}", flush=True)
    # methods with a recorded choice are not tuned again; failed or skipped ones are retried (finished runs reused)
    have = {m for m, c in (existing or {}).get("methods", {}).items() if c.get("chosen_lr") is not None}
    tune_runs: list[dict] = []
    for name in s["methods"]:
        spec = METHODS[name]
        base = os.path.join(s["output_dir"], "runs", "tune", name)
        if name in have:  # chosen earlier: report the tuning runs found on disk, train nothing
            tune_runs.extend(_read_results(base, s["output_dir"]))
            continue
        mine: list[dict] = []
        queue, extensions = list(s["tune_lr"]), 0
        while queue:
            lr = queue.pop(0)
            recs = [_runs.run_or_reuse(ctx, spec, seed, os.path.join(base, f"lr{lr_key(lr)}", f"seed{seed}"),
                                       setup_cache, lr, split="validation") for seed in s["tune_seeds"][:1]]
            if recs[0]["status"] == "skipped":  # the same reason holds for every learning rate and seed
                mine.extend(recs)
                break
            recs += [_runs.run_or_reuse(ctx, spec, seed, os.path.join(base, f"lr{lr_key(lr)}", f"seed{seed}"),
                                        setup_cache, lr, split="validation") for seed in s["tune_seeds"][1:]]
            mine.extend(recs)
            # (an interim report extends only a grid whose runs all exist, as a training invocation would)
            if not queue and extensions < s.get("tune_extend", 0) and all(r["status"] != "pending" for r in mine):
                nxt = edge_extension(lr_scores(mine).get(name, {}))
                if nxt is not None:
                    print(f"[lr] {name}: best learning rate at the edge of those tried; trying {nxt:g}", flush=True)
                    queue.append(nxt)
                    extensions += 1
        tune_runs.extend(mine)
    todo = [m for m in s["methods"] if m not in have]
    new = build_lr_choice([r for r in tune_runs if r["method"] in todo], s["tune_lr"], s["tune_seeds"],
                          json.loads(json.dumps(tuning_context(s), default=str)))
    if s.get("report_only"):  # an interim report: a method is chosen only once all its tuning runs exist
        for name, c in new["methods"].items():
            waiting = [r for r in tune_runs if r["method"] == name and r["status"] == "pending"]
            if waiting:
                c.update(status="pending", chosen_lr=None,
                         reason=f"{len(waiting)} tuning run(s) not finished yet (--report_only)")
        doc = merge_lr_choice(existing, new)
        for name in s["methods"]:
            c = doc["methods"].get(name, {})
            print(f"[lr] {name}: {c.get('chosen_lr')} ({c.get('reason')})", flush=True)
        return doc, tune_runs
    if todo and os.path.exists(path):
        # re-read just before writing: another invocation on this folder (a --jobs worker) may have added its
        # methods while this one tuned, and a merge with the copy read at the start would drop them
        with open(path, encoding="utf-8") as f:
            latest = json.load(f)
        check_lr_choice_context(latest, s, path)
        existing = merge_lr_choice(latest, existing) if existing else latest
    doc = merge_lr_choice(existing, new)
    if todo or existing is None:
        _write_json(path, doc)
    for name in s["methods"]:
        c = doc["methods"].get(name, {})
        print(f"[lr] {name}: {c.get('chosen_lr')} ({c.get('reason')})", flush=True)
    return doc, tune_runs

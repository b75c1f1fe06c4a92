"""Method setups: what a method needs beyond configuration, computed once per invocation (BASIS's value table
with its generated tokens counted; the tie-break method's graded reward)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from trl_ext._io import write_json as _write_json

from .presets import GRADED_REWARDS, MethodSpec, MethodUnavailable, SetupResult

if TYPE_CHECKING:
    from .context import Context


def counting_reward(func: Callable, counter: dict) -> Callable:
    """``func`` (a TRL reward function) that also adds the lengths of the ``completion_ids`` it scores to
    ``counter["tokens"]`` and their number to ``counter["completions"]``; name and signature are ``func``'s, so the
    value-table header (which records reward-function names) is unchanged."""
    counter.setdefault("tokens", 0)
    counter.setdefault("completions", 0)

    @functools.wraps(func)
    def wrapped(*args, completion_ids=None, **kwargs):
        if completion_ids is not None:
            counter["tokens"] += int(sum(len(c) for c in completion_ids))
            counter["completions"] += len(completion_ids)
        return func(*args, completion_ids=completion_ids, **kwargs)

    return wrapped


def table_cost_record(counted_tokens: int, n_written: int, n_already_done: int, samples_per_prompt: int,
                      build_wall_s: float) -> dict:
    """Generated tokens of a value-table build from what one builder call counted.

    A build that wrote every row (``n_already_done == 0``) counted every sampled token. A resumed build (rows from an
    interrupted earlier call) counted only its own rows: the total is extrapolated by ``(written + already done) /
    written`` and marked so; with nothing written the total is unknown (``None``).
    """
    n_rows = n_written + n_already_done
    if n_already_done == 0:
        tokens, source = float(counted_tokens), "counted"
    elif n_written > 0:
        tokens = float(counted_tokens) * n_rows / n_written
        source = f"extrapolated: counted {n_written} of {n_rows} prompts (the rest came from an interrupted build)"
    else:
        tokens, source = None, "unknown: every row came from an earlier, uncounted build"
    return {"table_tokens": tokens, "table_tokens_source": source, "table_prompts": n_rows,
            "table_samples_per_prompt": samples_per_prompt, "table_build_wall_s": build_wall_s}


VALUE_TABLE_DIR = "value_table"


def setup_basis(ctx: Context) -> SetupResult:
    """Build (once) the BASIS reference value table for the training pool: cached in ``--cache_dir``, or under a
    tuning protocol (v2) pinned in ``<output_dir>/value_table/`` next to the pinned start checkpoint.

    The pinned table is keyed by the start checkpoint's fingerprint rather than its path, so a fresh clone on another
    machine finds the committed table (and its ``.cost.json``) and neither rebuilds it nor loses its token count; an
    interrupted build left there is resumed by the next invocation.

    ``value_table_samples`` completions per training prompt are sampled at the training temperature (T = 1 unless
    ``--temperature``) from the *starting* checkpoint
    (the frozen reference policy, BASIS Section 4 "Offline value", Appendix 10) and scored with the training reward,
    by the package's own builder :func:`trl_ext.priors.value_table.build_value_table` (the code behind
    ``trl-ext build-value-table``; resumable, so an interrupted build continues). The builder does not report what it
    generated, so its reward function is wrapped by :func:`counting_reward`, which sums the lengths of the sampled
    ``completion_ids`` it scores (EOS included, as ``ext/generated_tokens_total`` counts); the count is cached next
    to the table (``value_table-<key>.cost.json``) and copied into every BASIS run record (``setup_info``).
    """
    from trl_ext.priors.value_table import build_value_table

    n = ctx.s["value_table_samples"]
    if ctx.s.get("tune_lr"):  # v2: pinned with the results, keyed by the weights (not by a machine's path)
        table_dir, model_id = os.path.join(ctx.s["output_dir"], VALUE_TABLE_DIR), ctx.s["start_checkpoint_sha"]
    else:
        table_dir, model_id = ctx.cache_dir, ctx.model_path
    temp = ctx.s.get("temperature", 1.0)
    key = hashlib.sha256(f"{model_id}|{ctx.task}|{ctx.s['dataset_fn']}|{len(ctx.train_ds)}|{n}|"
                         f"{ctx.max_new}|counted{'' if temp == 1.0 else f'|T={temp}'}".encode()).hexdigest()[:12]
    path = os.path.join(table_dir, f"value_table-{key}.jsonl")
    done = os.path.join(table_dir, f"value_table-{key}.done")
    cost_path = os.path.join(table_dir, f"value_table-{key}.cost.json")
    config = {"basis_value_table_path": path}
    if os.path.exists(done) and os.path.exists(cost_path):
        with open(cost_path, encoding="utf-8") as f:
            return SetupResult(config=config, info={**json.load(f), "table_path": path})
    os.makedirs(table_dir, exist_ok=True)
    t0 = time.time()
    model = ctx.load_model()
    counter: dict = {}
    funcs = [counting_reward(ctx.reward_funcs[0], counter), *ctx.reward_funcs[1:]]
    table = build_value_table(model, ctx.tokenizer, ctx.train_ds, funcs, path, num_samples=n,
                              max_new_tokens=ctx.max_new, temperature=temp,
                              batch_size=ctx.s.get("value_table_batch_size", 2048), seed=12345, model_id=ctx.model_path,
                              use_vllm=False if ctx.s["use_cpu"] else "auto", progress=False)
    stats = table.metadata.get("build_stats", {})
    info = table_cost_record(counter.get("tokens", 0), int(stats.get("n_written", len(table))),
                             int(stats.get("n_already_done", 0)), n, time.time() - t0)
    _write_json(cost_path, info)  # without the path: a pinned table is read on other machines too
    info["table_path"] = path
    with open(done, "w", encoding="utf-8") as f:
        f.write(f"{len(table)} rows\n")
    print(f"built BASIS value table {path} ({len(table)} prompts x {n} samples, {info['table_tokens']} generated "
          f"tokens, {time.time() - t0:.0f} s)", flush=True)
    del model
    return SetupResult(config=config, info=info)


def setup_tiebreak(ctx: Context) -> SetupResult:
    """Training rewards of the ``tiebreak`` method: ``[binary task reward(s)..., graded reward]``.

    The trainer's tie-break blend (``ExtGRPOConfig.tie_break_scorer_index`` -> ``trl_ext.estimators.tie_break_blend``)
    then trains on ``grade + epsilon x within-(group, grade) rank of the graded score``: the checker (binary reward)
    decides, the graded reward (e.g. ``scratchpad_steps_reward``) only orders attempts the checker tied. Raises
    :class:`MethodUnavailable` when the task has no graded reward (:data:`GRADED_REWARDS`, ``--graded_reward_fn``).
    Evaluation keeps the binary reward.
    """
    from trl_ext.priors.value_table import reward_func_name

    if ctx.graded_reward is None:
        raise MethodUnavailable(f"the tie-break blend needs a graded reward; task {ctx.task!r} has none (testbed "
                                f"tasks with one: {sorted(GRADED_REWARDS)}; otherwise pass --graded_reward_fn)")
    funcs = [*ctx.reward_funcs, ctx.graded_reward]
    return SetupResult(config={"tie_break_scorer_index": len(funcs) - 1}, reward_funcs=funcs,
                       info={"graded_reward": reward_func_name(ctx.graded_reward)})


def get_setup(ctx: Context, spec: MethodSpec, setup_cache: dict) -> SetupResult | MethodUnavailable | None:
    """The method's setup result, computed once per invocation (a :class:`MethodUnavailable` is cached too)."""
    if not spec.setup:
        return None
    if spec.setup not in setup_cache:
        try:
            setup_cache[spec.setup] = globals()[spec.setup](ctx)
        except MethodUnavailable as e:
            setup_cache[spec.setup] = e
    return setup_cache[spec.setup]

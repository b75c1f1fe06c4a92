"""Regime task properties: does a task have the regime PAIR, BASIS and V0.5 rely on?

``OMP_NUM_THREADS=1 python benchmarks/task_properties.py [--task scratchpad] [--model_name_or_path DIR]
[--n_prompts 256] [--samples 16] [--seed 0] [--out benchmarks/results/task_properties_<task>.json]``

Samples ``--samples`` (k) completions of each of ``--n_prompts`` (N) train-split prompts of ``--task`` from a model
(default: the cached warm model of the task, ``trl_ext.testbed.get_warm_model(task)``, built if missing) at
temperature 1 with the full distribution (``top_k=0``, ``top_p=1``), ``max_new_tokens`` = the task's longest
completion + 2 (scratchpad: 71 + 2 = 73), scores them with the task's reward (binary) and measures:

1. **Spread of per-prompt pass rates** (what every group method needs: prompts at 0 or 1 give GRPO no signal):
   histogram over the bins ``0, (0,0.25], (0.25,0.5], (0.5,0.75], (0.75,1), 1``, the shares at 0, at 1 and in
   between, mean and sd -- overall and per value of ``n_digits`` (any ``--group_column`` the dataset has) -- and the
   completion-length distribution (tokens up to and including the first ``<eos>``, or the cap).
2. **How well PAIR's heads predict success from the probe.** PAIR's default probe length is
   ``PAIRConfig(max_completion_length=L).pair_tau`` (``min(256, max(1, L // 8))``; scratchpad: 9 tokens). A real
   ``PAIRTrainer`` is built on the model (nothing is trained) and its own pieces are used: prompt ids
   (``trainer.rollout_api.tokenize``), the probe's finished flag and checkpoint (``PrefixProbeRollouts``), the prefix
   features (PAIR's ``trl_ext.trainers.pair.heads.prefix_features``: mean of the last 16 final hidden states of prompt + prefix) and the heads
   (``trainer.rollout_strategy.heads.heads``, refit with ``trainer.rollout_strategy.heads.refresh()``). The probe of a sample is the first ``tau``
   tokens of its full completion (a probe plus its continuation is a sample of the same distribution). Labels of the
   first half of the prompts (all k samples, inclusion probability 1, remaining-token cost) are fed to fresh heads
   in generation batches of ``--head_batch_prompts`` prompts, one refresh after each batch, as the trainer does;
   the other half is scored: AUC and Brier of the success head against the reward, the base-rate Brier (predicting
   the fit half's mean reward) and the Brier skill score ``1 - Brier / base Brier``, on all samples and on the
   samples still unfinished after the probe (the only ones the design decides about; base rate = the fit half's
   unfinished samples' mean), plus the cost head's MAPE on those. Prompt-only references on the
   same samples: the leave-one-out mean of the prompt's other k - 1 samples (a near-oracle for the prompt's pass
   rate; within a prompt it ranks failures above successes, ``s / (k - 1)`` vs ``(s - 1) / (k - 1)``, which pulls
   its AUC down a little) and the fit half's mean per ``n_digits``. Repeated at 0.5x and 2x the probe length.
3. **How far prompt-specific values differ from the batch mean** (what BASIS and V0.5 exploit): from the per-prompt
   pass rates ``p_i`` (k samples each), the between-prompt variance corrected for binomial noise
   (``var(p_hat) - mean(p_hat (1 - p_hat)) / (k - 1)``, ``var`` with ddof 1), the total reward variance
   ``p_bar (1 - p_bar)``, their ratio (the share of reward variance explained by the prompt, an intra-class
   correlation), the mean squared gap ``(p_i - p_bar)^2`` (bias-corrected) and the within-prompt variance
   ``E[p (1 - p)]``; overall and per ``n_digits``. On the second half, the bias-corrected mean squared error
   against ``p_i`` of three value predictors: the fit half's mean (a batch-mean baseline), the fit half's mean per
   ``n_digits``, and V0.5's default prior (``EmbeddingInContextPrior`` over mean-pooled embeddings of the model,
   kernel head, as ``V05GRPOTrainer`` builds it) with a context of the fit half's (prompt, pass rate) pairs sampled
   from a ``SupportBuffer`` of V0.5's default capacity and context size -- no training involved.

Writes JSON (``--out``: every number, the command, the per-prompt pass rates) and prints a Markdown summary.
Deterministic given ``--seed`` (and the batch sizes and thread count). Timing per stage in ``timing_s``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import shlex
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

import numpy as np  # noqa: E402

# One implementation of the PAIR prefix-head pieces (AUC, Brier metrics, probes, head feeding), the pass-rate bins and
# the variance decomposition: the library's (trl-ext advise: trl_ext.advise.prefix, trl_ext.advise.regime).
from trl_ext.advise.prefix import (  # noqa: E402,F401
    PROBE_FACTORS,
    auc,
    binary_prediction_metrics,
    feed_heads,
)
from trl_ext.advise.prefix import probe_features as _probe_features  # noqa: E402
from trl_ext.advise.regime import (  # noqa: E402,F401
    HIST_LABELS,
    length_summary,
    pass_rate_histogram,
    variance_decomposition,
)


# ------------------------------------------------------------------------------------------------ pure statistics
def pass_rate_spread(pass_rates) -> dict:
    """Spread of per-prompt pass rates: histogram, shares at 0 / 1 / in between, mean and sd.

    Parameters
    ----------
    pass_rates : array_like of float in [0, 1]
        One pass rate per prompt (non-empty).

    Returns
    -------
    dict
        ``n`` (prompts), ``histogram`` (:func:`pass_rate_histogram`), ``share_zero``, ``share_one``,
        ``share_between`` (strictly inside (0, 1): the prompts whose group has a reward contrast), ``mean`` and
        ``sd`` (population sd, ddof 0, of the observed rates -- binomial noise included).
    """
    p = np.asarray(pass_rates, dtype=np.float64).ravel()
    if p.size == 0:
        raise ValueError("no pass rates")
    hist = pass_rate_histogram(p)
    n = int(p.size)
    return {
        "n": n,
        "histogram": hist,
        "share_zero": hist["0"] / n,
        "share_one": hist["1"] / n,
        "share_between": (n - hist["0"] - hist["1"]) / n,
        "mean": float(p.mean()),
        "sd": float(p.std()),
    }


def value_mse(pred, pass_rates, k: int) -> dict:
    """Mean squared error of per-prompt value predictions against the true pass rates, corrected for binomial noise.

    ``E[(q_i - p_hat_i)^2] = (q_i - p_i)^2 + p_i (1 - p_i) / k`` for a prediction ``q_i`` made without the ``k``
    samples behind ``p_hat_i``; subtracting ``p_hat_i (1 - p_hat_i) / (k - 1)`` removes the noise term unbiasedly.

    Parameters
    ----------
    pred : array_like of float in [0, 1]
        ``q_i``, one per prompt.
    pass_rates : array_like of float in [0, 1]
        ``p_hat_i`` from ``k`` samples each, same length.
    k : int >= 2

    Returns
    -------
    dict
        ``n``, ``raw_mse`` (against ``p_hat``), ``mse`` (corrected, unbiased for ``mean (q - p)^2``; can be
        slightly negative by chance), ``rmse`` (``sqrt(max(mse, 0))``) and ``mean_pred``.
    """
    q = np.asarray(pred, dtype=np.float64).ravel()
    p = np.asarray(pass_rates, dtype=np.float64).ravel()
    if q.shape != p.shape or q.size == 0:
        raise ValueError(f"pred and pass_rates must be non-empty and of equal length: {q.size} vs {p.size}")
    if int(k) != k or k < 2:
        raise ValueError(f"k must be an int >= 2, got {k!r}")
    raw = float(((q - p) ** 2).mean())
    mse = raw - float((p * (1.0 - p)).mean() / (int(k) - 1))
    return {"n": int(q.size), "raw_mse": raw, "mse": mse, "rmse": math.sqrt(max(mse, 0.0)),
            "mean_pred": float(q.mean())}


def json_clean(obj):
    """Replace NaN / inf by ``None`` and numpy scalars by Python ones, recursively (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_clean(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(float(obj)) else None
    return obj


# ------------------------------------------------------------------------------------------------ setup
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="scratchpad", help="a trl_ext.testbed task (default scratchpad)")
    p.add_argument("--model_name_or_path", default=None,
                   help="model + tokenizer directory; default: get_warm_model(task, seed=--warm_seed) (built if "
                        "missing)")
    p.add_argument("--warm_seed", type=int, default=0, help="seed of the default warm model")
    p.add_argument("--n_prompts", type=int, default=256, help="N train-split prompts")
    p.add_argument("--samples", type=int, default=16, help="k samples per prompt (>= 2)")
    p.add_argument("--seed", type=int, default=0, help="prompt draw, sampling, head initialization, prior context")
    p.add_argument("--group_column", default="n_digits",
                   help="break the numbers down by this dataset column when it exists (default n_digits)")
    p.add_argument("--gen_batch_prompts", type=int, default=32, help="prompts per generate call (x k sequences)")
    p.add_argument("--head_batch_prompts", type=int, default=8,
                   help="prompts per generation batch when feeding the heads (one refresh per batch, as PAIR)")
    p.add_argument("--feature_batch", type=int, default=512, help="sequences per pair_features call")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--no_prior", action="store_true", help="skip the V0.5 default prior")
    p.add_argument("--out", default=None, help="JSON output (default benchmarks/results/task_properties_<task>.json)")
    a = p.parse_args(argv)
    if a.samples < 2:
        p.error("--samples must be >= 2")
    if a.n_prompts < 4:
        p.error("--n_prompts must be >= 4 (half fit the heads, half evaluate them)")
    if a.out is None:
        a.out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"task_properties_{a.task}.json")
    return a


def load_model(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = args.model_name_or_path
    if path is None:
        from trl_ext.testbed import get_warm_model

        path = get_warm_model(args.task, seed=args.warm_seed)
    meta = None
    meta_path = os.path.join(path, "warmup_meta.json")
    if os.path.exists(meta_path):  # a testbed warm model: record its scalar metadata (steps, accuracies, ...)
        with open(meta_path) as f:
            meta = {k: v for k, v in json.load(f).items() if not isinstance(v, (dict, list))}
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    return model, AutoTokenizer.from_pretrained(path), path, meta


def max_new_tokens_for(task: str) -> int:
    """The task's longest completion (default task parameters) + 2."""
    from trl_ext.testbed.tasks import TASKS

    spec = TASKS[task]
    return int(spec.max_answer_chars(**spec.defaults)) + 2


# ------------------------------------------------------------------------------------------------ sampling
def sample_and_score(model, tok, rows, task, k, max_new, seed, batch_prompts):
    """k samples per prompt at T = 1 (full distribution); returns prompt ids, completion ids (cut after the first
    ``<eos>``), decoded texts and binary rewards (N, k)."""
    import torch

    from trl_ext.testbed import get_reward_funcs

    reward_fn = get_reward_funcs(task)[0]
    eos, pad = tok.eos_token_id, tok.pad_token_id
    old_side = tok.padding_side
    tok.padding_side = "left"
    prompt_ids, comps, texts = [], [], []
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            for start in range(0, len(rows), batch_prompts):
                chunk = rows[start:start + batch_prompts]
                enc = tok([r["prompt"] for r in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
                out = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                                     num_return_sequences=k, max_new_tokens=max_new, do_sample=True, temperature=1.0,
                                     top_k=0, top_p=1.0, pad_token_id=pad, eos_token_id=eos)
                gen = out[:, enc["input_ids"].shape[1]:].tolist()
                for i in range(len(chunk)):
                    ids = [int(t) for t, m in zip(enc["input_ids"][i].tolist(), enc["attention_mask"][i].tolist())
                           if m]
                    prompt_ids.append(ids)
                    c_i, t_i = [], []
                    for g in gen[i * k:(i + 1) * k]:
                        g = g[:g.index(eos) + 1] if eos in g else g
                        c_i.append(g)
                        t_i.append(tok.decode([t for t in g if t not in (eos, pad)], skip_special_tokens=True))
                    comps.append(c_i)
                    texts.append(t_i)
    finally:
        tok.padding_side = old_side
    rewards = np.zeros((len(rows), k))
    for i, (row, t_i) in enumerate(zip(rows, texts)):
        kw = {c: [v] * k for c, v in row.items() if c != "prompt"}
        sc = reward_fn([row["prompt"]] * k, t_i, **kw)
        rewards[i] = [float("nan") if s is None else float(s) for s in sc]
    if not np.all((rewards == 0) | (rewards == 1)):
        raise ValueError(f"task {task!r}: this measurement needs binary rewards in {{0, 1}} for every sample")
    return prompt_ids, comps, texts, rewards


# ------------------------------------------------------------------------------------------------ PAIR heads
def build_pair_trainer(model, tok, rows, task, k, max_new, seed, out_dir):
    from datasets import Dataset

    from trl_ext.testbed import get_reward_funcs
    from trl_ext.trainers.pair import PAIRConfig, PAIRShortProbeWarning, PAIRTrainer

    cfg = PAIRConfig(output_dir=out_dir, num_generations=k, per_device_train_batch_size=k,
                     max_completion_length=max_new, max_steps=1, use_cpu=True, bf16=False, report_to="none",
                     save_strategy="no", seed=seed, temperature=1.0, dataloader_num_workers=0, disable_tqdm=True,
                     beta=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PAIRShortProbeWarning)
        trainer = PAIRTrainer(model=model, reward_funcs=get_reward_funcs(task), args=cfg,
                              train_dataset=Dataset.from_list(rows), processing_class=tok)
    short = [str(w.message) for w in caught if issubclass(w.category, PAIRShortProbeWarning)]
    return trainer, short


def probe_features(trainer, prompt_ids, comps, probe_len, batch):
    """Features (``trainer.rollout_strategy.features``), finished flags (the trainer's end tokens) and remaining-token costs of
    every sample's probe of ``probe_len`` tokens (:func:`trl_ext.advise.prefix.probe_features`; the checkpoint is
    the probe's end: ``pair_snap_window = 0``, PAIR's default)."""
    if int(trainer.args.pair_snap_window) != 0:
        raise ValueError("probe_features assumes pair_snap_window = 0 (no checkpoint snapping).")
    return _probe_features(trainer.rollout_strategy.features, prompt_ids, comps, probe_len, trainer.eos_token_ids, batch)


def fit_and_score_heads(trainer, init_heads, feats, finished, costs, rewards, n_fit, head_batch_prompts, k):
    """Fresh heads fed the first ``n_fit`` prompts' labels in generation batches (refresh after each with the
    trainer's fit settings, as the PAIR strategys ``heads.refresh()``; :func:`trl_ext.advise.prefix.feed_heads`),
    scored on the remaining prompts."""
    from trl_ext.estimators.pair_heads import cost_mape, expected_calibration_error

    n, _ = rewards.shape
    r_flat = rewards.reshape(-1)
    heads = copy.deepcopy(init_heads)
    refreshes = feed_heads(heads, feats, rewards, costs, range(n_fit), k, head_batch_prompts,
                           fit_steps=int(trainer.args.pair_head_fit_steps),
                           fit_batch_size=int(trainer.args.pair_head_batch_size))
    trainer.rollout_strategy.heads.heads = heads
    ev = slice(n_fit * k, n * k)
    pred = heads.predict(feats[ev])
    p_hat = pred.p_hat.numpy()
    y = r_flat[ev]
    base_rate = float(r_flat[:n_fit * k].mean())
    fit_unfinished = ~finished[:n_fit * k]
    base_unfinished = float(r_flat[:n_fit * k][fit_unfinished].mean()) if fit_unfinished.any() else base_rate
    unfinished = ~finished[ev]
    return {
        "fit_labels": n_fit * k,
        "refreshes": refreshes,
        "temperature": float(heads.temperature),
        "calibration_slice": heads.diagnostics(),
        "share_finished_in_probe": float(finished[ev].mean()),
        "all": binary_prediction_metrics(p_hat, y, base_rate),
        "unfinished": binary_prediction_metrics(p_hat[unfinished], y[unfinished], base_unfinished),
        "ece": expected_calibration_error(p_hat, y) if y.size else float("nan"),
        "cost_mape_unfinished": (cost_mape(pred.cost_hat.numpy()[unfinished], costs[ev][unfinished])
                                 if unfinished.any() else float("nan")),
        "nonfinite_predictions": int(pred.n_nonfinite),
    }


def prompt_only_predictors(rewards, n_fit, groups):
    """Per-sample success predictions for the eval half from the prompt alone: the leave-one-out mean of the
    prompt's other samples, and the fit half's mean reward of the prompt's group (if any)."""
    n, k = rewards.shape
    ev = rewards[n_fit:]
    y = ev.reshape(-1)
    base_rate = float(rewards[:n_fit].mean())
    loo = ((ev.sum(axis=1, keepdims=True) - ev) / (k - 1)).reshape(-1)
    out = {"prompt_loo_mean": binary_prediction_metrics(loo, y, base_rate)}
    if groups is not None:
        gm = group_means(rewards[:n_fit].mean(axis=1), groups[:n_fit])
        pred = np.repeat([gm.get(g, base_rate) for g in groups[n_fit:]], k)
        out["group_mean"] = binary_prediction_metrics(pred, y, base_rate)
    return out


def group_means(pass_rates, groups) -> dict:
    """Mean pass rate per value of ``groups`` (one group label per prompt)."""
    p = np.asarray(pass_rates, dtype=np.float64)
    return {g: float(p[np.asarray([x == g for x in groups])].mean()) for g in sorted(set(groups))}


# ------------------------------------------------------------------------------------------------ V0.5 prior
def v05_prior_predictions(model, tok, fit_prompts, fit_rates, eval_prompts, seed):
    """V0.5's default prior (embedding prior over the model's mean-pooled hidden states, kernel head), with a
    context sampled from a support buffer (V0.5's default capacity / context size) holding the fit half's
    (prompt, pass rate) pairs. Returns the predictions and the prior's info."""
    from trl_ext.priors import SupportBuffer, build_prior, hf_mean_pool_embedder
    from trl_ext.trainers.v05 import V05GRPOConfig

    fields = V05GRPOConfig.__dataclass_fields__
    capacity, context_size = fields["v05_buffer_capacity"].default, fields["v05_context_size"].default
    # V05GRPOTrainer._build_default_prior's embedder settings; copy=False: nothing trains here
    embed = hf_mean_pool_embedder(model, tok, batch_size=32, max_length=512, pad_to_multiple_of=32, copy=False)
    prior = build_prior("embedding", embed_fn=embed)
    buf = SupportBuffer(capacity, context_size, seed=seed)
    buf.add(list(fit_prompts), [float(x) for x in fit_rates])
    ctx_p, ctx_y = buf.sample_context(0)
    q = prior.predict(list(eval_prompts), ctx_p, ctx_y)
    info = {k: (float(v) if isinstance(v, (np.floating, float)) else v) for k, v in (prior.last_info or {}).items()}
    return np.asarray(q, dtype=np.float64), {"context_size": len(ctx_p), "buffer_capacity": capacity,
                                             "head_info": info}


# ------------------------------------------------------------------------------------------------ report
def _f(x, nd=3):
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}f}"


def markdown_summary(res: dict) -> str:
    s = res["setup"]
    lines = [f"## Regime task properties: `{s['task']}`", "",
             f"Model `{s['model']}`, {s['n_prompts']} train prompts x {s['samples']} samples, T = 1, "
             f"max_new_tokens {s['max_new_tokens']}, seed {s['seed']}.", "",
             "### 1. Pass-rate spread", "",
             "| prompts | n | mean | sd | " + " | ".join(HIST_LABELS) + " | share 0 | share 1 | between |",
             "|---|---|---|---|" + "---|" * len(HIST_LABELS) + "---|---|---|"]
    spread = res["spread"]
    rows = [("all", spread["all"])] + [(f"{s['group_column']}={g}", v) for g, v in spread.get("by_group", {}).items()]
    for name, v in rows:
        lines.append(f"| {name} | {v['n']} | {_f(v['mean'])} | {_f(v['sd'])} | "
                     + " | ".join(str(v["histogram"][h]) for h in HIST_LABELS)
                     + f" | {_f(v['share_zero'])} | {_f(v['share_one'])} | {_f(v['share_between'])} |")
    ln = res["completion_tokens"]["all"]
    lines += ["", f"Completion tokens: mean {_f(ln['mean'], 1)}, median {_f(ln['median'], 1)}, min {ln['min']}, "
              f"max {ln['max']}, at the cap {_f(ln['share_at_cap'])}.", ""]
    h = res["pair_heads"]
    lines += [f"### 2. PAIR heads (default tau = {h['default_tau']} of L = {h['max_completion_length']}; fit on "
              f"{h['n_fit_prompts']} prompts, scored on {h['n_eval_prompts']})", "",
              "| predictor | probe tokens | finished in probe | AUC | Brier | base Brier | skill | AUC unfinished | "
              "skill unfinished |", "|---|---|---|---|---|---|---|---|---|"]
    for name, v in h["probes"].items():
        a, u = v["all"], v["unfinished"]
        lines.append(f"| success head {name} | {v['probe_tokens']} | {_f(v['share_finished_in_probe'])} | "
                     f"{_f(a['auc'])} | {_f(a['brier'])} | {_f(a['base_brier'])} | {_f(a['brier_skill'])} | "
                     f"{_f(u['auc'])} | {_f(u['brier_skill'])} |")
    for name, a in h["prompt_only"].items():
        lines.append(f"| {name} (prompt only) | - | - | {_f(a['auc'])} | {_f(a['brier'])} | {_f(a['base_brier'])} | "
                     f"{_f(a['brier_skill'])} | | |")
    v = res["values"]
    lines += ["", "### 3. Prompt values vs the batch mean", "",
              "| prompts | p_bar | between var | total var | ICC | mean sq gap | rms gap | within var |",
              "|---|---|---|---|---|---|---|---|"]
    drows = [("all", v["decomposition"])] + [(f"{s['group_column']}={g}", d) for g, d in v.get("by_group", {}).items()]
    for name, d in drows:
        lines.append(f"| {name} | {_f(d['mean'])} | {_f(d['between_variance'], 4)} | {_f(d['total_variance'], 4)} | "
                     f"{_f(d['icc'])} | {_f(d['mean_sq_gap'], 4)} | {_f(d['rms_gap'])} | "
                     f"{_f(d['within_variance'], 4)} |")
    lines += ["", f"Value predictors on the {h['n_eval_prompts']} eval prompts (MSE vs p_i, binomial noise removed):",
              "", "| predictor | MSE | RMSE | mean prediction |", "|---|---|---|---|"]
    for name, d in v["predictors_eval_half"].items():
        lines.append(f"| {name} | {_f(d['mse'], 4)} | {_f(d['rmse'])} | {_f(d['mean_pred'])} |")
    lines += ["", f"Runtime {res['timing_s']['total']:.0f} s ({', '.join(f'{k} {x:.0f} s' for k, x in res['timing_s'].items() if k != 'total')})."]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    timing: dict[str, float] = {}
    t_start = t0 = time.time()

    from trl_ext.testbed import make_dataset

    model, tok, model_path, warm_meta = load_model(args)
    ds = make_dataset(args.task, args.n_prompts, seed=args.seed, split="train")
    rows = [dict(r) for r in ds]
    k, n = args.samples, len(rows)
    max_new = max_new_tokens_for(args.task)
    groups = [r[args.group_column] for r in rows] if args.group_column in ds.column_names else None
    timing["load"] = time.time() - t0

    # ---- 1. sampling, spread, lengths
    t0 = time.time()
    prompt_ids, comps, _texts, rewards = sample_and_score(model, tok, rows, args.task, k, max_new, args.seed,
                                                          args.gen_batch_prompts)
    timing["sampling"] = time.time() - t0
    rates = rewards.mean(axis=1)
    lengths = np.asarray([[len(c) for c in c_i] for c_i in comps])
    spread = {"all": pass_rate_spread(rates)}
    comp_tokens = {"all": length_summary(lengths, cap=max_new)}
    decomposition = variance_decomposition(rates, k)
    by_group_dec = {}
    if groups is not None:
        spread["by_group"], comp_tokens["by_group"] = {}, {}
        for g in sorted(set(groups)):
            sel = np.asarray([x == g for x in groups])
            spread["by_group"][g] = pass_rate_spread(rates[sel])
            comp_tokens["by_group"][g] = length_summary(lengths[sel], cap=max_new)
            if sel.sum() >= 2:
                by_group_dec[g] = variance_decomposition(rates[sel], k)

    n_fit = n // 2
    fit_rates, ev_rates = rates[:n_fit], rates[n_fit:]
    predictors = {"fit_half_mean (batch-mean value)": value_mse(np.full(n - n_fit, fit_rates.mean()), ev_rates, k)}
    if groups is not None:
        gm = group_means(fit_rates, groups[:n_fit])
        predictors[f"fit_half_mean_per_{args.group_column}"] = value_mse(
            np.asarray([gm.get(g, float(fit_rates.mean())) for g in groups[n_fit:]]), ev_rates, k)

    # ---- 3b. V0.5 default prior (before the trainer: TRL patches the model's forward)
    prior_info = None
    if not args.no_prior:
        t0 = time.time()
        q, prior_info = v05_prior_predictions(model, tok, [r["prompt"] for r in rows[:n_fit]], fit_rates,
                                              [r["prompt"] for r in rows[n_fit:]], args.seed)
        predictors["v05_default_prior"] = value_mse(q, ev_rates, k)
        prior_info["corr_with_pass_rate"] = (float(np.corrcoef(q, ev_rates)[0, 1])
                                             if q.std() > 0 and ev_rates.std() > 0 else float("nan"))
        timing["v05_prior"] = time.time() - t0

    # ---- 2. PAIR heads
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="task_props_") as tmp:
        trainer, short_warn = build_pair_trainer(model, tok, rows, args.task, k, max_new, args.seed, tmp)
        tau = int(trainer.args.pair_tau)
        trl_ids = trainer.rollout_api.tokenize([r["prompt"] for r in rows])
        if [list(x) for x in trl_ids] != prompt_ids:
            raise RuntimeError("TRL's prompt tokenization differs from the one used for sampling")
        init_heads = copy.deepcopy(trainer.rollout_strategy.heads.heads)
        probes, feat_cache = {}, {}
        for f in PROBE_FACTORS:
            t_len = max(1, min(max_new - 1, int(math.floor(f * tau))))
            if t_len not in feat_cache:
                feat_cache[t_len] = probe_features(trainer, prompt_ids, comps, t_len, args.feature_batch)
                feats, fin, costs = feat_cache[t_len]
                res_t = fit_and_score_heads(trainer, init_heads, feats, fin, costs, rewards, n_fit,
                                            args.head_batch_prompts, k)
                feat_cache[t_len] = (feats, fin, costs, res_t)
            probes[f"{f:g}x"] = {"factor": f, "probe_tokens": t_len, **feat_cache[t_len][3]}
        head_cfg = dict(trainer.rollout_strategy.heads.heads.config)
        fit_steps, fit_batch = int(trainer.args.pair_head_fit_steps), int(trainer.args.pair_head_batch_size)
        last_k = int(trainer.args.pair_summary_last_k)
        del trainer
    timing["pair_heads"] = time.time() - t0

    res = {
        "command": "OMP_NUM_THREADS=1 python " + " ".join(shlex.quote(x) for x in
                                                          ["benchmarks/task_properties.py",
                                                           *(sys.argv[1:] if argv is None else argv)]),
        "setup": {"task": args.task, "model": model_path, "warm_model_meta": warm_meta, "n_prompts": n,
                  "samples": k, "seed": args.seed, "split": "train", "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                  "max_new_tokens": max_new, "group_column": args.group_column if groups is not None else None,
                  "gen_batch_prompts": args.gen_batch_prompts, "threads": args.threads},
        "spread": spread,
        "completion_tokens": comp_tokens,
        "pair_heads": {
            "default_tau": tau, "max_completion_length": max_new, "short_probe_warning": short_warn or None,
            "n_fit_prompts": n_fit, "n_eval_prompts": n - n_fit, "head_batch_prompts": args.head_batch_prompts,
            "head_config": head_cfg, "fit_steps_per_refresh": fit_steps, "fit_batch_size": fit_batch,
            "summary_last_k": last_k, "probes": probes,
            "prompt_only": prompt_only_predictors(rewards, n_fit, groups),
        },
        "values": {"decomposition": decomposition, "by_group": by_group_dec,
                   "predictors_eval_half": predictors, "v05_prior": prior_info},
        "per_prompt": [{"question_id": r["question_id"], "group": (groups[i] if groups is not None else None),
                        "pass_rate": float(rates[i]), "mean_tokens": float(lengths[i].mean())}
                       for i, r in enumerate(rows)],
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "platform": platform.platform()},
    }
    timing["total"] = time.time() - t_start
    res["timing_s"] = timing
    res = json_clean(res)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp_out = args.out + ".tmp"
    with open(tmp_out, "w") as f:
        json.dump(res, f, indent=1, allow_nan=False)
    os.replace(tmp_out, args.out)
    print(markdown_summary(res))
    print(f"\nwrote {args.out}")
    return res


if __name__ == "__main__":
    main()

r"""PAIR prefix informativeness: how well a PAIR success head predicts a completion's reward from its first tokens.

PAIR ("Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR", Section 4.2, Eq. 5-7,
Appendix C) probes ``tau`` tokens of every candidate, predicts success ``p_hat`` and remaining cost from a summary of
the prefix's hidden states, and continues a design-chosen subset. Its design (Eq. 8-11) sees the candidates of one
prompt through the edge proxy ``d_ij = p_i (1 - p_j) + (1 - p_i) p_j`` (Eq. 8): when the head gives every candidate
of a prompt the same ``p_hat``, all ``d_ij`` of the group are equal and the continuation probabilities differ only
through the predicted costs. What the head knows about the *prompt* therefore does not help the design; only what it
knows about one candidate's prefix against its siblings does. This module measures both:

* **E1** pooled AUC (Mann-Whitney, ties one half) and Brier score of the out-of-fold ``p_hat`` against the
  reward, with the base-rate Brier of the constant training-fold mean and the Brier skill score
  ``1 - Brier / base Brier`` (as ``benchmarks/task_properties.py`` reports them);
* **E2** the within-prompt AUC: ``sum_i W_i / sum_i P_i`` with ``P_i`` the (success, failure) pairs of prompt i and
  ``W_i`` those the head orders correctly (ties one half); 0.5 = no information beyond the prompt;
* **E3** held-out folds: prompts are split into ``n_folds`` folds (a seeded permutation); fresh heads are fed the
  other folds' labels in generation batches of ``head_batch_prompts`` prompts with one refresh after each batch
  (:meth:`~trl_ext.estimators.pair_heads.PrefixHeads.refresh`, as PAIR's rollout strategy does) and
  predict the held-out fold; the pooled out-of-fold predictions are scored;
* **E4** intervals: percentile bootstrap over prompts of the pooled out-of-fold metrics (the heads are not refit
  per resample, so the refit's own variability is not in the interval).

The prefix summary is PAIR's (:func:`~trl_ext.estimators.pair_heads.prefix_summary` of the final hidden states of
prompt + probe, left-padded, explicit position ids, as PAIR's ``prefix_features``); a probe of length t is the
first t tokens of a sampled completion (a probe plus its continuation is a sample of the same distribution);
it is *finished* when it ends with an end token or is shorter than t (``PrefixProbeRollouts.is_finished``). The
head settings are ``PAIRConfig``'s defaults (:data:`HEAD_DEFAULTS`; no snapping, ``pair_snap_window = 0``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from .prefix_metrics import auc, binary_prediction_metrics, loo_prompt_reference, score_predictions, within_group_auc

__all__ = ["HEAD_DEFAULTS", "PROBE_FACTORS", "auc", "binary_prediction_metrics", "default_tau", "feed_heads",
           "hidden_state_features", "make_prefix_heads", "measure_prefix_heads", "out_of_fold_predictions",
           "probe_features", "probe_lengths", "probe_split", "score_predictions", "shared_forward_features",
           "within_group_auc"]

#: Probe lengths measured, as multiples of PAIR's default ``tau``.
PROBE_FACTORS: tuple[float, ...] = (0.5, 1.0, 2.0)

#: ``PAIRConfig``'s head defaults (``pair_head_hidden``, ``pair_head_lr``, ``pair_replay_size``,
#: ``pair_head_min_labels``, ``pair_head_fit_steps``, ``pair_head_batch_size``, ``pair_summary_last_k``); a test
#: checks them against the installed ``PAIRConfig``.
HEAD_DEFAULTS = {"hidden": 256, "lr": 1e-3, "replay_size": 2048, "min_labels": 64, "fit_steps": 50,
                 "fit_batch_size": 256, "summary_last_k": 16}


def default_tau(max_new_tokens: int) -> int:
    """PAIR's default probe ``tau`` for ``max_completion_length = max_new_tokens``: ``min(256, max(1, L // 8))``
    (``PAIRConfig.pair_tau`` with ``pair_prefix_tokens=None``)."""
    if int(max_new_tokens) < 2:
        raise ValueError(f"PAIR needs max_new_tokens >= 2 (a prefix and a suffix), got {max_new_tokens}.")
    return int(min(256, max(1, int(max_new_tokens) // 8)))


def probe_lengths(max_new_tokens: int, factors: Sequence[float] = PROBE_FACTORS) -> dict:
    """``{"<f>x": tokens}``: ``max(1, min(L - 1, floor(f * tau)))`` for each factor ``f`` (``tau`` =
    :func:`default_tau`)."""
    tau = default_tau(max_new_tokens)
    out = {}
    for f in factors:
        if not (float(f) > 0 and math.isfinite(float(f))):
            raise ValueError(f"probe factors must be positive, got {f!r}.")
        out[f"{float(f):g}x"] = max(1, min(int(max_new_tokens) - 1, int(math.floor(float(f) * tau))))
    return out


# ------------------------------------------------------------------------------------------------ probes, features
def probe_split(completion: Sequence[int], probe_len: int, eos_ids) -> tuple[list[int], bool, float]:
    """The probe of one sampled completion: ``(probe tokens, finished, remaining cost)``.

    The probe is the first ``probe_len`` tokens; it is finished when it is shorter than ``probe_len`` or ends with
    an end token (``PrefixProbeRollouts.is_finished``); the remaining cost is ``len(completion) - len(probe)``.
    """
    if probe_len < 1:
        raise ValueError(f"probe_len must be >= 1, got {probe_len}.")
    probe = [int(t) for t in completion[:probe_len]]
    eos = {int(e) for e in eos_ids}
    finished = len(probe) < probe_len or (len(probe) > 0 and probe[-1] in eos)
    return probe, bool(finished), float(len(completion) - len(probe))


def hidden_state_features(model, pad_token_id: int | None, last_k: int = HEAD_DEFAULTS["summary_last_k"]):
    """A feature function ``seqs -> Tensor (B, H)``: PAIR's prefix summary of each token sequence.

    Left-pads the sequences, passes explicit position ids (``mask.cumsum - 1``, so padding does not shift
    positions), runs the model in eval mode without a cache and returns
    :func:`~trl_ext.estimators.pair_heads.prefix_summary` of the final hidden states (the mean of the last
    ``last_k`` real positions) on the CPU: the computation of PAIR's ``prefix_features`` without a trainer.
    """
    import torch

    from trl_ext.estimators.pair_heads import model_prefix_summary

    pad = 0 if pad_token_id is None else int(pad_token_id)

    def features(seqs: list[list[int]]) -> torch.Tensor:
        if not seqs or any(len(s) == 0 for s in seqs):
            raise ValueError("hidden_state_features needs non-empty token sequences.")
        return model_prefix_summary(model, seqs, pad, last_k=last_k)

    return features


def shared_forward_features(model, pad_token_id: int | None, prompt_ids, completions, probe_lens, eos_ids, *,
                            batch_size: int = 64, last_k: int = HEAD_DEFAULTS["summary_last_k"]) -> dict:
    """:func:`probe_features` for several probe lengths from ONE forward pass per sample.

    A causal LM's hidden state at a position depends only on the tokens up to it, so the summaries of prompt +
    probe(t) for every ``t`` are read off one forward pass over prompt + the longest probe: the mean of the last
    ``last_k`` final hidden states ending at position ``len(prompt) + len(probe(t))`` (left padding, explicit
    position ids, eval mode, as :func:`hidden_state_features`). Equal to :func:`probe_features` with
    :func:`hidden_state_features` up to floating-point summation order (a test checks 1e-5); ``len(probe_lens)``
    times cheaper.

    Returns
    -------
    dict
        ``{t: (features Tensor (N k, H), finished bool (N k,), costs float (N k,))}`` for each ``t`` in ``probe_lens``.
    """
    import torch

    from trl_ext.estimators.pair_heads import prefix_summary
    from trl_ext.measurement.keyed_sampling import left_pad

    lens = sorted({int(t) for t in probe_lens})
    t_max = lens[-1]
    seqs, ends, fins, costs = [], {t: [] for t in lens}, {t: [] for t in lens}, {t: [] for t in lens}
    for p_ids, comps in zip(prompt_ids, completions):
        for c in comps:
            seqs.append(list(p_ids) + [int(x) for x in c[:t_max]])
            for t in lens:
                probe, fin, cost = probe_split(c, t, eos_ids)
                ends[t].append(len(p_ids) + len(probe))
                fins[t].append(fin)
                costs[t].append(cost)
    pad = 0 if pad_token_id is None else int(pad_token_id)
    feats = {t: [] for t in lens}
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        for s in range(0, len(seqs), batch_size):
            chunk = seqs[s:s + batch_size]
            ids, mask = left_pad(chunk, pad)
            width = ids.shape[1]
            pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
            with torch.no_grad():
                hidden = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                               output_hidden_states=True, use_cache=False).hidden_states[-1]
            for t in lens:
                keep = mask.clone()
                for i, x in enumerate(chunk):  # drop the positions after prompt + probe(t)
                    keep[i, width - len(x) + ends[t][s + i]:] = 0
                feats[t].append(prefix_summary(hidden, keep.to(device), last_k=int(last_k)).cpu())
    finally:
        model.train(was_training)
    return {t: (torch.cat(feats[t]), np.asarray(fins[t], dtype=bool), np.asarray(costs[t], dtype=np.float64))
            for t in lens}


def probe_features(feature_fn: Callable, prompt_ids, completions, probe_len: int, eos_ids, batch_size: int = 64):
    """Features, finished flags and remaining costs of every sample's probe of ``probe_len`` tokens.

    Parameters
    ----------
    feature_fn : callable
        ``list of token lists -> Tensor (B, H)`` (:func:`hidden_state_features`, or PAIR's ``prefix_features``).
    prompt_ids : list of list of int
        One per prompt.
    completions : list of list of list of int
        ``completions[i][j]``: sample ``j`` of prompt ``i`` (up to and including its first end token).
    probe_len : int
    eos_ids : iterable of int
    batch_size : int
        Sequences per ``feature_fn`` call.

    Returns
    -------
    (Tensor (N k, H), numpy bool (N k,), numpy float (N k,))
        Row ``i * k + j`` is sample ``j`` of prompt ``i``.
    """
    import torch

    seqs, finished, costs = [], [], []
    for p_ids, comps in zip(prompt_ids, completions):
        for c in comps:
            probe, fin, cost = probe_split(c, probe_len, eos_ids)
            seqs.append(list(p_ids) + probe)
            finished.append(fin)
            costs.append(cost)
    feats = torch.cat([feature_fn(seqs[s:s + batch_size]) for s in range(0, len(seqs), batch_size)])
    return feats, np.asarray(finished, dtype=bool), np.asarray(costs, dtype=np.float64)


# ------------------------------------------------------------------------------------------------ heads
def make_prefix_heads(input_dim: int, seed: int, **overrides):
    """Fresh :class:`~trl_ext.estimators.pair_heads.PrefixHeads` with ``PAIRConfig``'s defaults
    (:data:`HEAD_DEFAULTS`, overridable: ``hidden``, ``lr``, ``replay_size``, ``min_labels``)."""
    from trl_ext.estimators.pair_heads import PrefixHeads

    cfg = {**HEAD_DEFAULTS, **overrides}
    return PrefixHeads(int(input_dim), int(cfg["hidden"]), replay_size=int(cfg["replay_size"]), lr=float(cfg["lr"]),
                       min_labels=int(cfg["min_labels"]), seed=int(seed))


def feed_heads(heads, feats, rewards, costs, prompt_order, k: int, head_batch_prompts: int = 8, *,
               fit_steps: int = HEAD_DEFAULTS["fit_steps"], fit_batch_size: int = HEAD_DEFAULTS["fit_batch_size"],
               valid=None) -> int:
    """Feed the labels of the prompts ``prompt_order`` to ``heads`` in batches of ``head_batch_prompts`` prompts,
    one :meth:`~trl_ext.estimators.pair_heads.PrefixHeads.refresh` after each batch (eq. E3; inclusion probability
    1: every sample of the sample is completed). Samples with ``valid`` False (unscorable) are left out.
    Returns the number of refreshes."""
    import torch

    r_flat = np.asarray(rewards, dtype=np.float64).reshape(-1)
    ok = np.ones(r_flat.size, dtype=bool) if valid is None else np.asarray(valid, dtype=bool).reshape(-1)
    order = [int(i) for i in prompt_order]
    refreshes = 0
    for s in range(0, len(order), int(head_batch_prompts)):
        rows = np.asarray([i * k + j for i in order[s:s + int(head_batch_prompts)] for j in range(k)], dtype=np.int64)
        rows = rows[ok[rows]]
        if rows.size == 0:
            continue
        t = torch.as_tensor(rows)
        heads.add_labels(feats[t], torch.as_tensor(r_flat[rows]), torch.as_tensor(np.asarray(costs)[rows]),
                         torch.ones(rows.size))
        heads.refresh(steps=int(fit_steps), batch_size=int(fit_batch_size))
        refreshes += 1
    return refreshes


def out_of_fold_predictions(feats, rewards, costs, *, n_folds: int = 2, seed: int = 0, head_batch_prompts: int = 8,
                            head_overrides: dict | None = None, valid=None, finished=None) -> dict:
    """Cross-fitted success predictions (eq. E3).

    Parameters
    ----------
    feats : Tensor (N k, H)
    rewards : array_like (N, k)
        In [0, 1]; NaN = unscorable (pass ``valid``).
    costs : array_like (N k,)
    n_folds : int >= 2
    seed : int
        Fold permutation and head initialization.
    head_batch_prompts : int
    head_overrides : dict, optional
        Passed to :func:`make_prefix_heads`.
    valid : array_like of bool (N, k), optional
    finished : array_like of bool (N k,), optional
        Finished in the probe; adds ``base_rate_unfinished`` (the training folds' unfinished samples' mean).

    Returns
    -------
    dict
        ``p_hat``, ``cost_hat`` and ``base_rate`` (N k,) out of fold (the training folds' mean reward),
        ``base_rate_unfinished``, ``fold`` (N,), ``refreshes`` and ``temperatures`` per fold.
    """
    r = np.asarray(rewards, dtype=np.float64)
    n, k = r.shape
    if not 2 <= n_folds <= n:
        raise ValueError(f"n_folds must be in [2, n_prompts = {n}], got {n_folds}.")
    ok = np.isfinite(r) if valid is None else np.asarray(valid, dtype=bool)
    perm = np.random.default_rng(seed).permutation(n)
    fold = np.empty(n, dtype=np.int64)
    for f, part in enumerate(np.array_split(perm, n_folds)):
        fold[part] = f
    fin = np.zeros(n * k, dtype=bool) if finished is None else np.asarray(finished, dtype=bool).reshape(-1)
    p_hat, cost_hat = np.full(n * k, np.nan), np.full(n * k, np.nan)
    base, base_unf = np.full(n * k, np.nan), np.full(n * k, np.nan)
    refreshes, temps = [], []
    for f in range(n_folds):
        train = [i for i in range(n) if fold[i] != f]
        heads = make_prefix_heads(feats.shape[1], seed, **(head_overrides or {}))
        refreshes.append(feed_heads(heads, feats, r, costs, train, k, head_batch_prompts, valid=ok))
        temps.append(float(heads.temperature))
        test_rows = np.asarray([i * k + j for i in range(n) if fold[i] == f for j in range(k)], dtype=np.int64)
        pred = heads.predict(feats[test_rows])
        p_hat[test_rows], cost_hat[test_rows] = pred.p_hat.numpy(), pred.cost_hat.numpy()
        train_rows = np.asarray([i * k + j for i in train for j in range(k)], dtype=np.int64)
        train_rows = train_rows[ok.reshape(-1)[train_rows]]
        r_tr = r.reshape(-1)[train_rows]
        base[test_rows] = float(r_tr.mean()) if r_tr.size else float("nan")
        unf = ~fin[train_rows]
        base_unf[test_rows] = float(r_tr[unf].mean()) if unf.any() else base[test_rows]
    return {"p_hat": p_hat, "cost_hat": cost_hat, "base_rate": base, "base_rate_unfinished": base_unf,
            "fold": fold, "refreshes": refreshes, "temperatures": temps}


def measure_prefix_heads(feature_fn: Callable | None, prompt_ids, completions, rewards, *, max_new_tokens: int,
                         eos_ids, factors: Sequence[float] = PROBE_FACTORS, n_folds: int = 2, seed: int = 0,
                         head_batch_prompts: int = 8, feature_batch: int = 64, confidence: float = 0.95,
                         n_resamples: int = 999, head_overrides: dict | None = None, model=None,
                         pad_token_id: int | None = None) -> dict:
    """The ``prefix_heads`` section of the advice: out-of-fold PAIR success heads at each probe length.

    Parameters
    ----------
    feature_fn : callable or None
        ``list of token lists -> Tensor (B, H)`` (:func:`hidden_state_features`, PAIR's ``prefix_features``):
        one forward pass per probe length. ``None``: give ``model`` (and ``pad_token_id``) instead, for
        :func:`shared_forward_features` (one forward pass for all probe lengths).
    prompt_ids : list of list of int
    completions : list of list of list of int
        ``completions[i][j]``, cut after the first end token.
    rewards : array_like (N, k)
        In [0, 1]; NaN = unscorable (excluded from fitting and scoring, counted).
    max_new_tokens : int
        The completion cap (PAIR's ``max_completion_length``, which sets ``tau``).
    eos_ids : iterable of int
    factors : sequence of float
        Probe lengths as multiples of the default ``tau`` (:func:`probe_lengths`).
    n_folds, seed, head_batch_prompts, head_overrides
        :func:`out_of_fold_predictions`.
    feature_batch : int
        Sequences per ``feature_fn`` call.
    confidence, n_resamples
        Bootstrap over prompts (eq. E4).

    Returns
    -------
    dict
        ``measured`` (True), the settings, ``probes`` (per ``"<f>x"``: ``probe_tokens``, ``share_finished_in_probe``,
        ``all`` and ``unfinished`` (:func:`score_predictions`), ``cost_mape_unfinished``, ``refreshes``,
        ``temperatures``) and ``prompt_only`` (the leave-one-out reference on all samples).
    """
    from trl_ext.estimators.pair_heads import cost_mape

    r = np.asarray(rewards, dtype=np.float64)
    n, k = r.shape
    if len(prompt_ids) != n or len(completions) != n or any(len(c) != k for c in completions):
        raise ValueError(f"prompt_ids / completions do not match the rewards' shape {r.shape}.")
    valid = np.isfinite(r)
    if valid.sum(axis=1).astype(bool).sum() < n_folds:
        raise ValueError(f"PAIR prefix heads need scorable samples in at least n_folds = {n_folds} prompts.")
    binary = bool(np.all((r[valid] == 0) | (r[valid] == 1)))
    groups = np.repeat(np.arange(n), k)
    flat_ok = valid.reshape(-1)
    r_flat = r.reshape(-1)
    probes, cache = {}, {}
    plens = probe_lengths(max_new_tokens, factors)
    if feature_fn is None:
        if model is None:
            raise ValueError("measure_prefix_heads needs feature_fn or model.")
        shared = shared_forward_features(model, pad_token_id, prompt_ids, completions, plens.values(), eos_ids,
                                         batch_size=feature_batch)
    for name, t_len in plens.items():
        if t_len not in cache:
            feats, fin, costs = (shared[t_len] if feature_fn is None else
                                 probe_features(feature_fn, prompt_ids, completions, t_len, eos_ids, feature_batch))
            oof = out_of_fold_predictions(feats, r, costs, n_folds=n_folds, seed=seed,
                                          head_batch_prompts=head_batch_prompts, head_overrides=head_overrides,
                                          valid=valid, finished=fin)
            sel, unf = flat_ok, flat_ok & ~fin
            kw = dict(binary=binary, confidence=confidence, n_resamples=n_resamples, seed=seed)
            cache[t_len] = {
                "probe_tokens": t_len,
                "share_finished_in_probe": float(fin[sel].mean()),
                "all": score_predictions(oof["p_hat"][sel], r_flat[sel], oof["base_rate"][sel], groups[sel], **kw),
                "unfinished": score_predictions(oof["p_hat"][unf], r_flat[unf], oof["base_rate_unfinished"][unf],
                                                groups[unf], **kw),
                "cost_mape_unfinished": (cost_mape(oof["cost_hat"][unf], costs[unf]) if unf.any() else float("nan")),
                "refreshes": oof["refreshes"],
                "temperatures": oof["temperatures"],
            }
        probes[name] = {"factor": float(name[:-1]), **cache[t_len]}
    loo = loo_prompt_reference(r, valid)
    ref_ok = flat_ok & np.isfinite(loo)
    base = np.full(r_flat.size, float(r_flat[flat_ok].mean()))
    prompt_only = score_predictions(loo[ref_ok], r_flat[ref_ok], base[ref_ok], groups[ref_ok], binary=binary,
                                    confidence=confidence, n_resamples=n_resamples, seed=seed)
    return {
        "measured": True,
        "default_tau": default_tau(max_new_tokens),
        "max_new_tokens": int(max_new_tokens),
        "n_folds": int(n_folds),
        "head_batch_prompts": int(head_batch_prompts),
        "head_config": {**HEAD_DEFAULTS, **(head_overrides or {})},
        "binary": binary,
        "n_samples_scored": int(flat_ok.sum()),
        "n_unscorable_excluded": int((~flat_ok).sum()),
        "probes": probes,
        "prompt_only": {"prompt_loo_mean": prompt_only},
        "interval": "percentile bootstrap over prompts of the pooled out-of-fold predictions (heads not refit)",
    }

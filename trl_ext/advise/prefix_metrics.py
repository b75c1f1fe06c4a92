"""Metrics of PAIR's prefix heads (eq. E1, E2, E4 of :mod:`trl_ext.advise.prefix`): pooled and within-prompt AUC,
Brier score against a base rate, and their percentile-bootstrap intervals over prompts. Pure numpy / scipy (the
Brier score is :func:`trl_ext.estimators.pair_heads.brier_score`).
"""

from __future__ import annotations

import math

import numpy as np

from ..stats.auc import auc  # eq. E1 (the PAIR heads log the same AUC)

__all__ = ["auc", "binary_prediction_metrics", "loo_prompt_reference", "score_predictions", "within_group_auc"]


# ------------------------------------------------------------------------------------------------ metrics


def within_group_auc(scores, labels, groups) -> dict:
    """Within-group AUC (eq. E2): the share of same-group (positive, negative) pairs ordered correctly.

    Parameters
    ----------
    scores : array_like of float
    labels : array_like of {0, 1}
    groups : array_like
        Group (prompt) id of each sample.

    Returns
    -------
    dict
        ``auc`` (``sum W_i / sum P_i``; NaN without a mixed group), ``pairs`` (``sum P_i``), ``mixed_groups``, and
        ``per_group`` arrays ``wins`` / ``pairs`` aligned with ``groups_order`` (for the bootstrap over groups).
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=np.float64).ravel()
    g = np.asarray(groups).ravel()
    if not (s.shape == y.shape == g.shape):
        raise ValueError(f"scores, labels and groups differ in length: {s.size}, {y.size}, {g.size}")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must be 0 or 1")
    order = np.unique(g)
    wins, pairs = np.zeros(order.size), np.zeros(order.size)
    for j, gid in enumerate(order):
        sel = g == gid
        pos, neg = s[sel & (y == 1)], s[sel & (y == 0)]
        if pos.size and neg.size:
            diff = pos[:, None] - neg[None, :]
            wins[j] = float((diff > 0).sum() + 0.5 * (diff == 0).sum())
            pairs[j] = float(pos.size * neg.size)
    total = pairs.sum()
    return {"auc": float(wins.sum() / total) if total > 0 else float("nan"), "pairs": int(total),
            "mixed_groups": int((pairs > 0).sum()), "groups_order": order, "wins": wins, "per_group_pairs": pairs}


def binary_prediction_metrics(pred, labels, base_rate) -> dict:
    """AUC and Brier score of probabilities against binary outcomes, with the base-rate reference (eq. E1).

    Parameters
    ----------
    pred : array_like of float in [0, 1]
        Predicted success probabilities.
    labels : array_like of {0, 1}
        Outcomes.
    base_rate : float or array_like
        The constant prediction of the reference (e.g. the mean reward of the data the predictor was fit on); an
        array gives one reference prediction per sample (out-of-fold: each sample's training-fold mean).

    Returns
    -------
    dict
        ``n``, ``positives``, ``mean_pred``, ``mean_label``, ``auc`` (:func:`auc`), ``brier``, ``base_brier``
        (Brier of ``base_rate``) and ``brier_skill = 1 - brier / base_brier`` (NaN if ``base_brier`` is 0); all
        NaN-valued metrics for an empty input.
    """
    from trl_ext.estimators.pair_heads import brier_score

    p = np.asarray(pred, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=np.float64).ravel()
    if p.shape != y.shape:
        raise ValueError(f"pred and labels differ in length: {p.size} vs {y.size}")
    nan = float("nan")
    if p.size == 0:
        return {"n": 0, "positives": 0, "mean_pred": nan, "mean_label": nan, "auc": nan, "brier": nan,
                "base_brier": nan, "brier_skill": nan}
    base_pred = np.broadcast_to(np.asarray(base_rate, dtype=np.float64), y.shape)
    brier = brier_score(p, y)
    base = brier_score(base_pred, y)
    return {
        "n": int(p.size),
        "positives": int(y.sum()),
        "mean_pred": float(p.mean()),
        "mean_label": float(y.mean()),
        "auc": auc(p, y),
        "brier": brier,
        "base_brier": base,
        "brier_skill": 1.0 - brier / base if base > 0 else nan,
    }


# ------------------------------------------------------------------------------------------------ scoring
def _per_prompt_sums(p, y, base, groups, n):
    """Per-prompt sums for the vectorized bootstrap: squared errors, base squared errors, counts."""
    se = np.bincount(groups, weights=(p - y) ** 2, minlength=n)
    be = np.bincount(groups, weights=(base - y) ** 2, minlength=n)
    cnt = np.bincount(groups, minlength=n).astype(np.float64)
    return se, be, cnt


def _estimate(value, samples, confidence) -> dict:
    s = np.asarray(samples, dtype=np.float64)
    s = s[np.isfinite(s)]
    a = (1.0 - confidence) / 2.0
    if not math.isfinite(value) or s.size < 10:
        return {"value": value, "low": float("nan"), "high": float("nan")}
    return {"value": value, "low": float(np.quantile(s, a)), "high": float(np.quantile(s, 1 - a))}


def score_predictions(p_hat, rewards, base_rate, groups, *, binary: bool, confidence: float = 0.95,
                      n_resamples: int = 999, seed: int = 0) -> dict:
    """Eq. E1, E2 and E4 on one subset of samples (all, or those unfinished after the probe).

    Parameters
    ----------
    p_hat, rewards, base_rate : array_like (n,)
        Out-of-fold predictions, rewards in [0, 1] and the reference prediction of each sample.
    groups : array_like of int (n,)
        Prompt index of each sample (``0 .. N-1``); the bootstrap resamples prompts.
    binary : bool
        Rewards are all 0/1: AUCs are computed (else ``None``: AUC needs binary outcomes).

    Returns
    -------
    dict
        ``n``, ``positives``, ``mean_pred``, ``mean_label``, and ``{"value", "low", "high"}`` for ``auc``,
        ``within_prompt_auc``, ``brier``, ``base_brier``, ``brier_skill``; ``within_prompt_pairs``,
        ``mixed_prompts``.
    """
    p = np.asarray(p_hat, dtype=np.float64).ravel()
    y = np.asarray(rewards, dtype=np.float64).ravel()
    b = np.asarray(base_rate, dtype=np.float64).ravel()
    g = np.asarray(groups, dtype=np.int64).ravel()
    nan_est = {"value": float("nan"), "low": float("nan"), "high": float("nan")}
    out = {"n": int(p.size), "positives": int(y.sum()) if binary else None,
           "mean_pred": float(p.mean()) if p.size else float("nan"),
           "mean_label": float(y.mean()) if p.size else float("nan")}
    if p.size == 0:
        return {**out, **{m: dict(nan_est) for m in ("auc", "within_prompt_auc", "brier", "base_brier",
                                                      "brier_skill")}, "within_prompt_pairs": 0, "mixed_prompts": 0}
    n_groups = int(g.max()) + 1
    se, be, cnt = _per_prompt_sums(p, y, b, g, n_groups)
    brier, base = se.sum() / cnt.sum(), be.sum() / cnt.sum()
    present = np.flatnonzero(cnt > 0)
    rng = np.random.default_rng(seed)
    idx = rng.choice(present, size=(int(n_resamples), present.size), replace=True)
    bs_brier = se[idx].sum(axis=1) / cnt[idx].sum(axis=1)
    bs_base = be[idx].sum(axis=1) / cnt[idx].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        bs_skill = 1.0 - bs_brier / bs_base
    out["brier"] = _estimate(float(brier), bs_brier, confidence)
    out["base_brier"] = _estimate(float(base), bs_base, confidence)
    out["brier_skill"] = _estimate(float(1.0 - brier / base) if base > 0 else float("nan"), bs_skill, confidence)
    if not binary:
        out.update(auc=dict(nan_est), within_prompt_auc=dict(nan_est), within_prompt_pairs=None, mixed_prompts=None,
                   note="rewards are not all 0/1: AUCs need binary outcomes and are not computed")
        return out
    wg = within_group_auc(p, y, g)
    wins, pairs = np.zeros(n_groups), np.zeros(n_groups)
    wins[wg["groups_order"]], pairs[wg["groups_order"]] = wg["wins"], wg["per_group_pairs"]
    with np.errstate(invalid="ignore", divide="ignore"):
        bs_within = wins[idx].sum(axis=1) / pairs[idx].sum(axis=1)
    rows_of = [np.flatnonzero(g == i) for i in range(n_groups)]
    bs_auc = np.empty(int(n_resamples))
    for t in range(int(n_resamples)):
        rows = np.concatenate([rows_of[i] for i in idx[t]])
        bs_auc[t] = auc(p[rows], y[rows])
    out["auc"] = _estimate(auc(p, y), bs_auc, confidence)
    out["within_prompt_auc"] = _estimate(wg["auc"], bs_within, confidence)
    out["within_prompt_pairs"], out["mixed_prompts"] = wg["pairs"], wg["mixed_groups"]
    return out


def loo_prompt_reference(rewards, valid) -> np.ndarray:
    """Leave-one-out mean of each sample's prompt siblings, ``(s_i - r) / (k_i - 1)`` (a prompt-only near-oracle
    for the pooled AUC; within a prompt it ranks failures above successes, so its within-prompt AUC is 0)."""
    r = np.where(valid, np.asarray(rewards, dtype=np.float64), 0.0)
    k = valid.sum(axis=1, keepdims=True).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        loo = (r.sum(axis=1, keepdims=True) - r) / (k - 1)
    return np.where(valid & (k > 1), loo, np.nan).reshape(-1)

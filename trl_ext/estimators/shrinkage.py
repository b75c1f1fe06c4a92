"""James-Stein shrinkage baseline: each prompt's leave-one-out mean shrunk toward the other prompts' mean.

"Shrinking the Variance: Shrinkage Baselines for Reinforcement Learning with Verifiable Rewards" (Zeng, Zhou, Arora,
Zanette; arXiv:2511.03710). With few rollouts per prompt the per-prompt mean is a noisy baseline; Stein's paradox
says a combination of the per-prompt and the across-prompt means estimates all prompts' means better in total
squared error. The paper keeps the policy gradient unbiased by building every rollout's baseline only from the other
rollouts (a two-level leave-one-out) and sets the shrinkage weight from batch statistics, with no hyperparameter.

Equations (numbered here; the docstrings cite them):

* (JS1) leave-one-out mean of prompt i for rollout j: ``b_ij^LOO = (S_i - r_ij) / (n_i - 1)``.
* (JS2) statistics of the *other* prompts k != i (each prompt with >= 1 finite reward counts once):
  ``mu_-i = mean_k m_k``, ``s2_-i = mean_k (m_k - mu_-i)^2`` (spread of the prompt means) and
  ``v2_-i = mean_k s_k^2 / n_k`` over the prompts with ``n_k >= 2`` (``s_k^2`` the Bessel variance: the mean
  sampling variance of a prompt mean).
* (JS3) shrinkage weight ``lambda_i = v2_-i / (v2_-i + s2_-i + eps)`` in [0, 1): 0 when prompt means are far
  apart compared with their noise (plain RLOO), near 1 when they are indistinguishable (a batch baseline).
* (JS4) baseline ``b_ij = (1 - lambda_i) b_ij^LOO + lambda_i mu_-i``, advantage ``A_ij = r_ij - b_ij``.

``b_ij`` is a function of rewards other than ``r_ij`` only, so ``E[(r_ij - b_ij) grad log pi] = E[r_ij grad log
pi]`` (tested by exact enumeration in ``tests/test_estimators_shrinkage.py``). Pure numpy; no TRL import.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._validation import as_float_array, check_nonneg_scalar
from .baselines import AdvantageResult, group_stats, register_advantage_estimator

__all__ = ["james_stein_advantages", "james_stein_lambda"]


def james_stein_lambda(means: Any, counts: Any, variances: Any, eps: float = 1e-6) -> tuple[np.ndarray, ...]:
    """Leave-one-prompt-out shrinkage statistics (JS2-JS3) of every prompt, in O(K).

    Parameters
    ----------
    means, counts, variances : array_like, shape (K,)
        Per prompt: mean of its finite rewards (NaN when it has none), number of finite rewards ``n_k``, and the
        Bessel variance ``s_k^2`` (NaN when ``n_k < 2``).
    eps : float >= 0
        Guard in the denominator of JS3 (the paper's implementation uses 1e-6).

    Returns
    -------
    lam, mu, v2, s2 : ndarray, shape (K,)
        ``lambda_i``, ``mu_-i``, ``v2_-i``, ``s2_-i`` computed from the prompts other than ``i``. A prompt with no
        other prompt holding a finite reward gets ``mu`` NaN and ``lambda`` 0; with no other prompt of
        ``n_k >= 2``, ``v2 = 0`` and ``lambda = 0`` (nothing says the means are noisy).
    """
    eps = check_nonneg_scalar(eps, "eps")
    m = np.asarray(means, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    var = np.asarray(variances, dtype=np.float64)
    has_mean = n >= 1
    has_var = n >= 2
    m0 = np.where(has_mean, m, 0.0)
    v0 = np.where(has_var, var / np.maximum(n, 1.0), 0.0)
    # totals over all prompts minus the prompt's own term: the leave-one-prompt-out sums
    k_mean = has_mean.sum() - has_mean
    k_var = has_var.sum() - has_var
    sum_m = m0.sum() - m0
    sum_m2 = (m0 ** 2).sum() - m0 ** 2
    sum_v = v0.sum() - v0
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = np.where(k_mean > 0, sum_m / k_mean, np.nan)
        s2 = np.where(k_mean > 0, np.maximum(sum_m2 / k_mean - mu ** 2, 0.0), 0.0)
        v2 = np.where(k_var > 0, sum_v / k_var, 0.0)
        lam = np.where(k_mean > 0, v2 / (v2 + s2 + eps), 0.0)
    lam = np.nan_to_num(lam, nan=0.0)  # v2 = s2 = eps = 0: nothing to shrink toward or away from
    return lam, mu, v2, s2


@register_advantage_estimator("james_stein")
def james_stein_advantages(rewards: Any, group_ids: Any, eps: float = 1e-6, normalize: bool = False,
                           norm_eps: float = 1e-4) -> AdvantageResult:
    """James-Stein shrinkage-baseline advantages (JS1-JS4; arXiv:2511.03710), on ragged groups.

    ``A_ij = r_ij - [(1 - lambda_i) (S_i - r_ij) / (n_i - 1) + lambda_i mu_-i]``.

    Parameters
    ----------
    rewards, group_ids : array_like, shape (N,)
        NaN marks an unscorable rollout: excluded from every statistic, advantage 0 (``n_nan``).
    eps : float >= 0
        Guard of JS3.
    normalize : bool, default False
        Whiten the advantages over the batch (``(A - mean) / (std + norm_eps)``), as ``rloo``'s ``normalize``;
        the paper does not (off by default).
    norm_eps : float >= 0

    Returns
    -------
    AdvantageResult
        ``baselines`` holds ``b_ij``. Edge cases, each counted in ``extras``: a prompt with one finite reward has
        no leave-one-out mean (JS1), so its baseline is ``mu_-i`` (``lambda`` = 1 for it; ``n_singleton``); a
        singleton with no other prompt in the batch has no baseline at all and gets advantage 0
        (``n_degenerate``). ``extras["metrics"]``: the batch means of ``lambda`` (over rollouts), ``v2``, ``s2``
        and ``n_singleton``, logged by the trainer as ``adv/<name>``.
    """
    eps = check_nonneg_scalar(eps, "eps")
    norm_eps = check_nonneg_scalar(norm_eps, "norm_eps")
    r = as_float_array(rewards, "rewards", ndim=1)
    st = group_stats(r, group_ids, ddof=1)
    codes, ok, g = st["codes"], ~np.isnan(r), int(st["count"].shape[0])
    cnt, tot = st["count"], st["sum"]
    lam_k, mu_k, v2_k, s2_k = james_stein_lambda(st["mean"], cnt, st["std"] ** 2, eps)
    c, lam, mu = cnt[codes], lam_k[codes], mu_k[codes]
    single = ok & (c == 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        loo = np.where(ok & (c >= 2), (tot[codes] - np.where(ok, r, 0.0)) / (c - 1), np.nan)
        base = np.where(single, mu, (1.0 - lam) * loo + lam * np.nan_to_num(mu, nan=0.0))
    base = np.where(ok, base, np.nan)
    no_base = ok & np.isnan(base)  # a singleton alone in the batch
    adv = np.where(ok & ~no_base, r - base, np.nan)
    s = np.ones_like(r)
    if normalize:
        live = ~np.isnan(adv)
        if live.sum() > 1:
            sd = adv[live].std(ddof=1)
            adv = (adv - adv[live].mean()) / (sd + norm_eps)
            s = np.full(r.shape, sd + norm_eps)
    adv = np.nan_to_num(adv, nan=0.0)
    scored = ok & ~no_base
    metrics = {
        "js_lambda": float(lam[scored & ~single].mean()) if (scored & ~single).any() else float("nan"),
        "js_v2": float(np.mean(v2_k[cnt >= 1])) if (cnt >= 1).any() else float("nan"),
        "js_s2": float(np.mean(s2_k[cnt >= 1])) if (cnt >= 1).any() else float("nan"),
        "js_singletons": float(single.sum() - no_base.sum()),
    }
    tied = int(np.sum((cnt == 1) | ((cnt >= 2) & (np.nan_to_num(st["std"], nan=0.0) <= 1e-12))))
    return AdvantageResult(adv, base, s, int((~ok).sum()), g, tied, n_degenerate=int(no_base.sum()),
                           extras={"lambda": lam_k, "mu": mu_k, "v2": v2_k, "s2": s2_k,
                                   "n_singleton": int(single.sum() - no_base.sum()), "metrics": metrics})

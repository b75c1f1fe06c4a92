r"""Regime statistics of a sampled (prompt x completion) reward matrix: pure numpy / scipy, no TRL, no torch.

Everything here is a function of

* ``rewards``, shape ``(N, k)``: ``k`` sampled rewards for each of ``N`` prompts, each in ``[0, 1]`` or NaN
  (NaN = unscorable: every reward function returned ``None``; counted, excluded from every estimate);
* ``lengths``, shape ``(N, k)``: generated tokens per completion (unscorable ones included: they were generated);
* ``truncated``, shape ``(N, k)``: whether the completion hit the ``max_new_tokens`` cap without an end token.

Notation: for prompt ``i`` with ``k_i`` scorable samples, ``s_i`` successes (sum of rewards) and true pass rate
``p_i``. Equation numbers refer to ``docs/advise.md``.

The central identity (eq. A3): for ``k`` i.i.d. Bernoulli(``p``) draws with ``s`` successes and ``G <= k``,

.. math:: \mathbb E\!\left[\binom{s}{G} \Big/ \binom{k}{G}\right] = p^G,

because ``C(s, G) / C(k, G)`` is the share of size-``G`` subsets of the sample that are all successes, and each
fixed subset is all successes with probability ``p^G``. Hence the probability that a GRPO group of ``G`` rollouts of
the prompt has zero reward variance, ``z(G) = p^G + (1 - p)^G`` (eq. A2), is estimated without bias by
``[C(s, G) + C(k - s, G)] / C(k, G)`` (eq. A4); for rewards that are not binary the same U-statistic
``sum_v C(c_v, G) / C(k, G)`` over the distinct values ``v`` (``c_v`` samples equal to ``v``) is unbiased for the
probability that ``G`` draws are all equal (eq. A5).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable

import numpy as np
from scipy import special, stats

__all__ = [
    "GROUP_SIZES",
    "HIST_LABELS",
    "all_equal_subset_share",
    "bootstrap_ratio_ci",
    "check_rewards",
    "disjoint_group_zero_variance",
    "length_summary",
    "pass_rate_histogram",
    "pass_rate_intervals",
    "plugin_zero_variance",
    "variance_decomposition",
    "wasted_tokens",
    "zero_variance_estimates",
]

#: Group sizes reported by default.
GROUP_SIZES: tuple[int, ...] = (2, 4, 8, 16)

HIST_LABELS: tuple[str, ...] = ("0", "(0,0.25]", "(0.25,0.5]", "(0.5,0.75]", "(0.75,1)", "1")
"""Pass-rate histogram bins: exactly 0, four interior bins, exactly 1 (the bins of ``benchmarks/task_properties.py``)."""


# ------------------------------------------------------------------------------------------------ input
def check_rewards(rewards) -> np.ndarray:
    """Validate a reward matrix and return it as float64 ``(N, k)``; ragged rows are padded with NaN.

    Parameters
    ----------
    rewards : array_like, shape (N, k), or list of lists
        Rewards in ``[0, 1]``; NaN (or ``None``) marks an unscorable sample.

    Returns
    -------
    numpy.ndarray
        Shape ``(N, k_max)``, float64.

    Raises
    ------
    ValueError
        No prompts, a reward outside ``[0, 1]`` or infinite, or every reward unscorable.
    """
    if isinstance(rewards, np.ndarray):
        r = np.asarray(rewards, dtype=np.float64)
    else:
        rows = [[math.nan if v is None else float(v) for v in row] for row in rewards]
        width = max((len(row) for row in rows), default=0)
        r = np.full((len(rows), width), np.nan)
        for i, row in enumerate(rows):
            r[i, : len(row)] = row
    if r.ndim != 2 or r.shape[0] == 0 or r.shape[1] == 0:
        raise ValueError(f"rewards must be a non-empty (prompts x samples) matrix, got shape {r.shape}.")
    finite = np.isfinite(r)
    if np.any(np.isinf(r)):
        raise ValueError("rewards contain +-inf; a reward must be in [0, 1] or NaN/None (unscorable).")
    if not finite.any():
        raise ValueError(f"every one of the {r.size} rewards is unscorable (None/NaN): check that the reward functions "
                         "can parse the model's completions (print a few) and that the dataset columns they read "
                         "are present.")
    bad = finite & ((r < 0) | (r > 1))
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"reward {float(r[i, j])!r} (prompt {i}, sample {j}) is outside [0, 1]: the regime "
                         "statistics are defined for pass/fail or [0, 1] rewards; declare the range to rescale from "
                         "(reward_range=(low, high), --reward_range LOW HIGH).")
    return r


def _counts(rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k_i scorable samples, s_i sum of scorable rewards) per prompt."""
    ok = np.isfinite(rewards)
    return ok.sum(axis=1), np.where(ok, rewards, 0.0).sum(axis=1)


# ------------------------------------------------------------------------------------------------ pass rates
def pass_rate_intervals(rewards, *, method: str = "jeffreys", confidence: float = 0.95) -> dict:
    r"""Per-prompt pass rates with binomial confidence intervals.

    The estimate is ``p_hat_i = s_i / k_i`` (eq. A1). Intervals at level ``1 - alpha``:

    * Clopper-Pearson (exact): ``[B(alpha/2; s, k - s + 1), B(1 - alpha/2; s + 1, k - s)]`` with ``B(q; a, b)``
      the Beta quantile (lower bound 0 at ``s = 0``, upper 1 at ``s = k``);
    * Jeffreys: the ``alpha/2`` and ``1 - alpha/2`` quantiles of ``Beta(s + 1/2, k - s + 1/2)`` (bounds forced to 0
      / 1 at ``s = 0`` / ``s = k``, Brown, Cai and DasGupta 2001).

    For rewards that are not binary ``s_i`` is the (fractional) sum of rewards and the interval is the same Beta
    formula, an approximation (exact only for Bernoulli rewards).

    Parameters
    ----------
    rewards : array_like, shape (N, k)
        See :func:`check_rewards`.
    method : {"jeffreys", "clopper-pearson"}
    confidence : float in (0, 1)

    Returns
    -------
    dict
        ``n_samples`` (``k_i``), ``successes`` (``s_i``), ``rate``, ``low``, ``high`` (arrays, NaN for prompts with no
        scorable sample), ``n_unscorable`` (int, samples), ``n_prompts_unscorable`` (prompts with ``k_i = 0``),
        ``binary`` (bool: every scorable reward is 0 or 1), ``method``, ``confidence``.
    """
    r = check_rewards(rewards)
    if method not in ("jeffreys", "clopper-pearson"):
        raise ValueError(f"method must be 'jeffreys' or 'clopper-pearson', got {method!r}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}.")
    k, s = _counts(r)
    alpha = 1.0 - confidence
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(k > 0, s / np.maximum(k, 1), np.nan)
        if method == "jeffreys":
            low = stats.beta.ppf(alpha / 2, s + 0.5, k - s + 0.5)
            high = stats.beta.ppf(1 - alpha / 2, s + 0.5, k - s + 0.5)
        else:
            low = stats.beta.ppf(alpha / 2, s, k - s + 1)
            high = stats.beta.ppf(1 - alpha / 2, s + 1, k - s)
    low = np.where(s <= 0, 0.0, low)
    high = np.where(s >= k, 1.0, high)
    low, high = np.where(k > 0, low, np.nan), np.where(k > 0, high, np.nan)
    fin = r[np.isfinite(r)]
    return {"n_samples": k, "successes": s, "rate": rate, "low": low, "high": high,
            "n_unscorable": int((~np.isfinite(r)).sum()), "n_prompts_unscorable": int((k == 0).sum()),
            "binary": bool(np.all((fin == 0) | (fin == 1))), "method": method, "confidence": confidence}


def pass_rate_histogram(pass_rates) -> dict:
    """Counts of per-prompt pass rates in the bins :data:`HIST_LABELS`.

    Parameters
    ----------
    pass_rates : array_like of float in [0, 1]
        One pass rate per prompt.

    Returns
    -------
    dict
        ``{label: count}`` for the bins ``0`` (exactly 0), ``(0,0.25]``, ``(0.25,0.5]``, ``(0.5,0.75]``,
        ``(0.75,1)`` and ``1`` (exactly 1), in that order. The counts sum to the number of prompts.

    Raises
    ------
    ValueError
        A pass rate outside [0, 1] or not finite.
    """
    p = np.asarray(pass_rates, dtype=np.float64).ravel()
    if not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("pass rates must be finite and lie in [0, 1]")
    zero, one = p == 0.0, p == 1.0
    mid = ~zero & ~one
    counts = [zero.sum(), (mid & (p <= 0.25)).sum(), (mid & (p > 0.25) & (p <= 0.5)).sum(),
              (mid & (p > 0.5) & (p <= 0.75)).sum(), (mid & (p > 0.75)).sum(), one.sum()]
    return {label: int(c) for label, c in zip(HIST_LABELS, counts)}


# ------------------------------------------------------------------------------------------------ zero variance
def plugin_zero_variance(p, group_size: int) -> np.ndarray:
    """``z(G) = p^G + (1 - p)^G`` (eq. A2): probability that ``G`` Bernoulli(``p``) rewards are all equal.

    Evaluated at an estimate ``p_hat`` this is the *plug-in* estimate, biased upwards for ``G >= 2`` (Jensen:
    ``E[p_hat^G] >= p^G``); :func:`zero_variance_estimates` gives the unbiased one.
    """
    p = np.asarray(p, dtype=np.float64)
    return p ** group_size + (1.0 - p) ** group_size


def _value_classes(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct scorable values of one prompt's samples and their counts."""
    vals = row[np.isfinite(row)]
    return np.unique(vals, return_counts=True)


def _jeffreys_zero_variance(s: float, k: int, m: int) -> float:
    r"""Posterior mean of ``p^m + (1-p)^m`` under ``Beta(s + 1/2, k - s + 1/2)`` (eq. A6):
    ``B(s + 1/2 + m, k - s + 1/2) / B(s + 1/2, k - s + 1/2)`` plus the mirror term."""
    a, b = s + 0.5, k - s + 0.5
    return float(np.exp(special.betaln(a + m, b) - special.betaln(a, b))
                 + np.exp(special.betaln(a, b + m) - special.betaln(a, b)))


def zero_variance_estimates(rewards, group_size: int) -> dict:
    r"""Per-prompt probability that a group of ``G`` rollouts has zero reward variance.

    For a prompt with ``k_i >= G`` scorable samples the estimate is the U-statistic (eq. A4/A5)

    .. math:: \hat z_i(G) = \sum_v \binom{c_{i,v}}{G} \Big/ \binom{k_i}{G},

    unbiased for ``P(G i.i.d. rewards all equal)`` (``p^G + (1-p)^G`` for binary rewards). For ``k_i < G`` no
    unbiased estimator exists (a polynomial of degree ``G > k`` in ``p``); the Jeffreys posterior mean (eq. A6) is
    used instead and the prompt is flagged.

    Parameters
    ----------
    rewards : array_like, shape (N, k)
    group_size : int >= 1

    Returns
    -------
    dict
        ``z`` (array, NaN for prompts with no scorable sample), ``unbiased`` (bool array: ``k_i >= G``),
        ``group_size``.
    """
    r = check_rewards(rewards)
    g = int(group_size)
    if g != group_size or g < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}.")
    k, s = _counts(r)
    z = np.full(r.shape[0], np.nan)
    unbiased = k >= g
    for i in range(r.shape[0]):
        if k[i] == 0:
            continue
        if unbiased[i]:
            _, c = _value_classes(r[i])
            z[i] = float(sum(math.comb(int(cv), g) for cv in c) / math.comb(int(k[i]), g))
        else:
            z[i] = _jeffreys_zero_variance(float(s[i]), int(k[i]), g)
    return {"z": z, "unbiased": unbiased & (k > 0), "group_size": g}


def all_equal_subset_share(row, group_size: int) -> float:
    """Brute force: the share of all size-``G`` subsets of one prompt's scorable samples whose rewards are all equal.

    Equal to eq. A5 by construction; kept as an independent check (enumerates ``C(k, G)`` subsets, so only for
    small ``k``). NaN when there are fewer than ``G`` scorable samples.
    """
    vals = [v for v in np.asarray(row, dtype=np.float64).ravel() if math.isfinite(v)]
    if len(vals) < group_size:
        return math.nan
    hits = total = 0
    for sub in itertools.combinations(vals, group_size):
        total += 1
        hits += all(x == sub[0] for x in sub)
    return hits / total


def disjoint_group_zero_variance(rewards, group_size: int) -> dict:
    """The empirical check: cut each prompt's samples, in sampling order, into ``floor(k / G)`` disjoint groups of
    ``G`` (what a trainer drawing ``G`` rollouts would have seen) and count the groups whose scorable rewards are all
    equal. Groups with an unscorable sample are skipped (counted).

    Returns
    -------
    dict
        ``share`` (tied groups / complete groups, NaN when none), ``groups``, ``tied``, ``skipped_unscorable``.
    """
    r = check_rewards(rewards)
    g = int(group_size)
    groups = tied = skipped = 0
    for row in r:
        for start in range(0, r.shape[1] - g + 1, g):
            grp = row[start:start + g]
            if not np.all(np.isfinite(grp)):
                skipped += 1
                continue
            groups += 1
            tied += bool(np.all(grp == grp[0]))
    return {"share": tied / groups if groups else math.nan, "groups": groups, "tied": tied,
            "skipped_unscorable": skipped}


def wasted_tokens(rewards, lengths, group_size: int) -> dict:
    r"""Per-prompt expected tokens of a ``G``-group, and of a ``G``-group that ties (eq. A7).

    Over all size-``G`` subsets of a prompt's ``k`` scorable samples, a sample of value class ``v`` sits in
    ``C(c_v - 1, G - 1)`` all-equal subsets, so the mean over subsets of ``1{all equal} x (tokens of the subset)`` is

    .. math:: \hat W_i(G) = \sum_v \binom{c_{i,v} - 1}{G - 1} L_{i,v} \Big/ \binom{k_i}{G},

    with ``L_{i,v}`` the total length of the class-``v`` samples: unbiased for the expected tokens of a tied
    ``G``-group. The expected tokens of any ``G``-group are ``T_i = G * mean length_i``. The token share wasted on
    zero-variance groups over a uniform prompt distribution is ``sum_i W_i / sum_i T_i`` (a ratio of unbiased
    estimators: consistent, not unbiased). For ``k_i < G`` (no unbiased estimator) ``W_i = z_i T_i`` with the
    Jeffreys ``z_i`` of :func:`zero_variance_estimates` (length and tie assumed independent).

    Returns
    -------
    dict
        ``waste`` (``W_i``), ``tokens`` (``T_i``), ``share`` (``sum W / sum T``), ``group_size``.
    """
    r = check_rewards(rewards)
    ln = np.asarray(lengths, dtype=np.float64)
    if ln.shape != r.shape:
        raise ValueError(f"lengths has shape {ln.shape}, rewards {r.shape}; one length per sample.")
    g = int(group_size)
    zv = zero_variance_estimates(r, g)
    w = np.full(r.shape[0], np.nan)
    t = np.full(r.shape[0], np.nan)
    for i in range(r.shape[0]):
        ok = np.isfinite(r[i])
        k = int(ok.sum())
        if k == 0:
            continue
        t[i] = g * float(ln[i][ok].mean())
        if k >= g:
            vals, lens = r[i][ok], ln[i][ok]
            w[i] = sum(math.comb(int((vals == v).sum()) - 1, g - 1) * float(lens[vals == v].sum())
                       for v in np.unique(vals)) / math.comb(k, g)
        else:
            w[i] = zv["z"][i] * t[i]
    ok = np.isfinite(w)
    share = float(w[ok].sum() / t[ok].sum()) if ok.any() and t[ok].sum() > 0 else math.nan
    return {"waste": w, "tokens": t, "share": share, "group_size": g}


# ------------------------------------------------------------------------------------------------ variance
def variance_decomposition(pass_rates, k: int) -> dict:
    r"""Split the reward variance into a between-prompt and a within-prompt part, correcting for binomial noise.

    With ``N`` prompts, pass rates ``p_hat_i`` estimated from ``k`` binary samples each, and
    ``v_i = p_hat_i (1 - p_hat_i) / (k - 1)`` (unbiased for the binomial noise ``p_i (1 - p_i) / k`` of
    ``p_hat_i``):

    * ``between_variance = var(p_hat, ddof=1) - mean(v)``: unbiased for the variance of the true pass rate over
      the prompt distribution (what a prompt-specific value can explain; eq. A9);
    * ``total_variance = p_bar (1 - p_bar)``: the variance of one reward of a random prompt;
    * ``icc = between_variance / total_variance``: the share of reward variance explained by the prompt (an
      intra-class correlation; NaN when ``total_variance`` is 0);
    * ``mean_sq_gap = mean((p_hat - p_bar)^2) - (N - 1) / N mean(v)``: unbiased for ``mean_i (p_i - p_bar)^2``
      over these ``N`` prompts (the squared error of a batch-mean value, the gap BASIS and V0.5 close);
      ``rms_gap = sqrt(max(mean_sq_gap, 0))``;
    * ``within_variance = k / (k - 1) mean(p_hat (1 - p_hat))``: unbiased for ``E[p (1 - p)]``, the reward variance
      a prompt-specific value cannot remove (``within + between`` is about ``total``).

    Parameters
    ----------
    pass_rates : array_like of float in [0, 1]
        ``p_hat_i``, one per prompt; at least 2 prompts.
    k : int >= 2, or array_like of int >= 2
        Samples per prompt (one per prompt when they differ, e.g. after unscorable samples: ``v_i`` and the
        within-prompt term then use each prompt's own ``k_i``, which keeps both unbiased).

    Returns
    -------
    dict
        The quantities above plus ``n_prompts``, ``k``, ``mean`` (``p_bar``), ``raw_variance`` (``var(p_hat)``,
        ddof 1) and ``binomial_noise`` (``mean(v)``). The corrected variances can be slightly negative by chance.
    """
    p = np.asarray(pass_rates, dtype=np.float64).ravel()
    ks = np.asarray(k, dtype=np.float64).ravel()
    if ks.size not in (1, p.size) or not np.all(ks == np.round(ks)) or np.any(ks < 2):
        raise ValueError(f"k must be an int >= 2 (or one int >= 2 per prompt), got {k!r}")
    if p.size < 2:
        raise ValueError("need at least 2 prompts")
    if not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("pass rates must be finite and lie in [0, 1]")
    n = int(p.size)
    p_bar = float(p.mean())
    v = p * (1.0 - p) / (ks - 1)
    noise = float(v.mean())
    raw = float(p.var(ddof=1))
    between = raw - noise
    total = p_bar * (1.0 - p_bar)
    gap = float(((p - p_bar) ** 2).mean()) - (n - 1) / n * noise
    return {
        "n_prompts": n,
        "k": int(ks[0]) if ks.size == 1 else float(ks.mean()),
        "mean": p_bar,
        "raw_variance": raw,
        "binomial_noise": noise,
        "between_variance": between,
        "total_variance": total,
        "icc": between / total if total > 0 else float("nan"),
        "mean_sq_gap": gap,
        "rms_gap": math.sqrt(max(gap, 0.0)),
        "within_variance": float((v * ks).mean()),
    }


# ------------------------------------------------------------------------------------------------ lengths
def length_summary(lengths, cap: int | None = None, truncated=None) -> dict:
    """Mean, median, quantiles, min and max of completion lengths, and the share that hit the cap.

    Parameters
    ----------
    lengths : array_like of int
        Generated tokens per sample (non-empty).
    cap : int, optional
        ``max_new_tokens``; adds ``share_at_cap`` (samples that used the whole budget).
    truncated : array_like of bool, optional
        Per-sample flag "hit the cap without an end token"; adds ``truncation_share``.

    Returns
    -------
    dict
        ``n``, ``mean``, ``median``, ``p10``, ``p90``, ``min``, ``max`` (and ``share_at_cap``,
        ``truncation_share``).
    """
    x = np.asarray(lengths, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("no lengths")
    out = {"n": int(x.size), "mean": float(x.mean()), "median": float(np.median(x)),
           "p10": float(np.quantile(x, 0.1)), "p90": float(np.quantile(x, 0.9)), "min": int(x.min()),
           "max": int(x.max())}
    if cap is not None:
        out["share_at_cap"] = float((x >= cap).mean())
    if truncated is not None:
        tr = np.asarray(truncated, dtype=bool).ravel()
        if tr.shape != x.shape:
            raise ValueError(f"truncated has {tr.size} flags for {x.size} lengths.")
        out["truncation_share"] = float(tr.mean())
    return out


# ------------------------------------------------------------------------------------------------ bootstrap
def bootstrap_ratio_ci(numerators: np.ndarray, denominators: np.ndarray, *, confidence: float = 0.95,
                       n_resamples: int = 999, seed: int = 0,
                       transform: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    r"""Percentile bootstrap over prompts of ratio-of-means statistics ``sum_i a_{ij} / sum_i b_{ij}``.

    Every headline number of the advice is such a ratio over prompts (a share is ``b = 1``; informative groups per
    1,000 tokens is ``a = 1000 (1 - z_i)``, ``b = T_i``), so prompts are resampled with replacement
    (``scipy.stats.bootstrap``, percentile method, one resample of prompts shared by every statistic).

    Parameters
    ----------
    numerators, denominators : array, shape (N, m)
        Per-prompt terms of the ``m`` statistics (rows of prompts that are NaN in a column are dropped from it
        by treating both terms as 0 there).
    confidence : float
    n_resamples : int
    seed : int
    transform : callable, optional
        Applied to the ``(m, ...)`` ratios before the quantiles (e.g. a function of several ratios).

    Returns
    -------
    low, high : numpy.ndarray, shape (m,)
        NaN where ``N < 2``.
    """
    a = np.asarray(numerators, dtype=np.float64)
    b = np.asarray(denominators, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"numerators and denominators must be (N, m) of equal shape, got {a.shape} and {b.shape}.")
    bad = ~(np.isfinite(a) & np.isfinite(b))
    a, b = np.where(bad, 0.0, a), np.where(bad, 0.0, b)
    n, m = a.shape
    if n < 2:
        return np.full(m, np.nan), np.full(m, np.nan)

    def stat(idx, axis=-1):
        idx = np.asarray(idx).astype(np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = a[idx].sum(axis=-2) / b[idx].sum(axis=-2)  # (..., m)
        ratio = np.moveaxis(ratio, -1, 0)
        return transform(ratio) if transform is not None else ratio

    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore")  # degenerate resamples (a ratio 0/0) give NaN bounds, reported as such
        res = stats.bootstrap((np.arange(n),), stat, vectorized=True, n_resamples=n_resamples,
                              confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed))
    return np.asarray(res.confidence_interval.low), np.asarray(res.confidence_interval.high)

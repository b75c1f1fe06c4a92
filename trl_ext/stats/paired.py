"""Paired tests on per-question outcomes: exact binomial, McNemar counts, paired bootstrap.

Source: "Measurement Discipline for RLVR" section 5 step 1 (exact two-sided binomial test on decided votes),
section 6 (paired head-to-head trials), section 4 (95 % intervals on checkpoint comparisons).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

__all__ = [
    "exact_binomial_test",
    "McNemarCounts",
    "mcnemar_counts",
    "BootstrapCI",
    "paired_bootstrap_ci",
]

_ALTERNATIVES = ("two-sided", "greater", "less")


def exact_binomial_test(k: int, n: int, p: float = 0.5, alternative: str = "two-sided") -> float:
    """Exact binomial test p-value for ``k`` successes in ``n`` trials.

    The two-sided p-value sums the probabilities of all outcomes no more likely than the observed one (the
    "minlike" definition of ``scipy.stats.binomtest``, relative tolerance ``1e-7``, so extreme p-values such as the
    paper's ``9.44e-29`` are exact rather than floored -- section 5 step 4 records a bug from an absolute tolerance).
    Worked cases (section 4-6): 147 vs 104 -> 0.0079; 114 vs 76 -> 0.0071; 184 vs 53 -> 3.96e-18; 80 vs 86 ->
    0.698.

    Parameters
    ----------
    k : int
        Successes (e.g. wins of one side among decided votes), ``0 <= k <= n``.
    n : int
        Trials (decided votes). ``n = 0`` returns 1.0: no evidence either way (documented fallback, e.g. every
        vote tied).
    p : float
        Null success probability, in [0, 1].
    alternative : {"two-sided", "greater", "less"}
        ``"greater"`` tests ``P(success) > p``.

    Returns
    -------
    float
        p-value in [0, 1].
    """
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be one of {_ALTERNATIVES}; got {alternative!r}")
    if isinstance(k, bool) or isinstance(n, bool) or int(k) != k or int(n) != n:
        raise ValueError(f"k and n must be integers; got k={k!r}, n={n!r}")
    k, n = int(k), int(n)
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n; got k={k}, n={n}")
    if not (0.0 <= float(p) <= 1.0) or not math.isfinite(float(p)):
        raise ValueError(f"p must be in [0, 1]; got {p!r}")
    if n == 0:
        return 1.0
    return float(_st.binomtest(k, n, float(p), alternative=alternative).pvalue)


def _as_binary(name: str, x) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one 0/1 outcome per question); got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: need at least one question")
    if arr.dtype == bool:
        return arr.astype(np.int64)
    arrf = arr.astype(float)
    if np.any(~np.isfinite(arrf)) or np.any((arrf != 0) & (arrf != 1)):
        bad = np.flatnonzero(~np.isin(arrf, (0.0, 1.0)))[:5].tolist()
        raise ValueError(f"{name} must contain only 0/1 (or bool); bad values at indices {bad}")
    return arrf.astype(np.int64)


@dataclass(frozen=True)
class McNemarCounts:
    """Paired 2x2 counts of two configurations on the same questions, with the exact McNemar test.

    Attributes
    ----------
    both, a_only, b_only, neither : int
        Questions both got right / only ``a`` / only ``b`` / neither.
    n : int
        Questions.
    p_value : float
        Exact McNemar p-value: the two-sided binomial test of ``a_only`` out of ``a_only + b_only`` at 1/2 (1.0 when
        there are no discordant pairs).
    """

    both: int
    a_only: int
    b_only: int
    neither: int
    n: int
    p_value: float

    @property
    def discordant(self) -> int:
        return self.a_only + self.b_only

    @property
    def discordance(self) -> float:
        """Share of questions with discordant outcomes."""
        return self.discordant / self.n

    @property
    def difference(self) -> float:
        """Accuracy difference ``acc_a - acc_b = (a_only - b_only) / n``."""
        return (self.a_only - self.b_only) / self.n


def mcnemar_counts(a, b) -> McNemarCounts:
    """McNemar-style paired counts of two 0/1 outcome vectors over the same questions, with the exact p-value.

    Parameters
    ----------
    a, b : array_like of shape (n,)
        0/1 (or bool) correctness per question, aligned by question.

    Returns
    -------
    McNemarCounts
    """
    a = _as_binary("a", a)
    b = _as_binary("b", b)
    if a.shape != b.shape:
        raise ValueError(f"a and b must cover the same questions; got shapes {a.shape} and {b.shape}")
    a_only = int(np.sum((a == 1) & (b == 0)))
    b_only = int(np.sum((a == 0) & (b == 1)))
    both = int(np.sum((a == 1) & (b == 1)))
    neither = int(a.size - a_only - b_only - both)
    p = exact_binomial_test(a_only, a_only + b_only)
    return McNemarCounts(both, a_only, b_only, neither, int(a.size), p)


@dataclass(frozen=True)
class BootstrapCI:
    """A percentile bootstrap interval for a paired statistic."""

    estimate: float
    low: float
    high: float
    level: float
    n_boot: int

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def _mean_difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a) - np.mean(b))


def paired_bootstrap_ci(
    a,
    b,
    n_boot: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
    statistic: Callable[[np.ndarray, np.ndarray], float] | None = None,
) -> BootstrapCI:
    """Percentile bootstrap interval for a paired difference, resampling questions (``scipy.stats.bootstrap``).

    Questions are drawn with replacement; the same draw is applied to ``a`` and ``b`` (and to every seed when the
    inputs are 2-D), so the pairing and the between-seed correlation of a question are kept. The default statistic is
    the mean difference ``mean(a) - mean(b)`` over all cells.

    The resampling is ``scipy.stats.bootstrap`` (percentile method, ``random_state=np.random.default_rng(seed)``,
    batches of 2,048 replicates): with the default statistic it bootstraps the per-question differences averaged over
    seeds, with a custom one it resamples question indices. The interval ends are read from scipy's
    ``bootstrap_distribution`` with ``np.quantile`` at ``(1 - level) / 2`` and ``(1 + level) / 2``, not taken from
    its ``confidence_interval``: scipy places the upper end at ``1 - (1 - level) / 2``, which differs from
    ``(1 + level) / 2`` in the last bit and would move the upper ends committed in ``benchmarks/results`` (and
    quoted in ``docs/results.md``) in their 17th digit. With the default statistic the replicates, hence the
    interval, are bit for bit those of the earlier hand-written resampler (``tests/test_stats.py`` checks it).

    Parameters
    ----------
    a, b : array_like of shape (n,) or (n_seeds, n)
        Per-question values (0/1 correctness, pass rates or scores), aligned by question on the last axis.
    n_boot : int
        Bootstrap replicates, >= 100.
    seed : int
        RNG seed.
    level : float
        Interval coverage, in (0, 1).
    statistic : callable, optional
        ``statistic(a_resampled, b_resampled) -> float``; defaults to the mean difference.

    Returns
    -------
    BootstrapCI
        ``estimate`` is the statistic on the original data; ``low``/``high`` the ``(1-level)/2`` and
        ``(1+level)/2`` percentiles. With a single question every replicate equals the estimate (zero-width
        interval): the bootstrap cannot see variance it has no samples of.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape (paired by question); got {a.shape} and {b.shape}")
    if a.ndim not in (1, 2) or a.shape[-1] == 0:
        raise ValueError(f"a and b must be (n,) or (n_seeds, n) with n >= 1; got shape {a.shape}")
    if np.any(~np.isfinite(a)) or np.any(~np.isfinite(b)):
        raise ValueError("a and b must be finite (found NaN/inf); drop or impute those questions explicitly")
    if int(n_boot) != n_boot or n_boot < 100:
        raise ValueError(f"n_boot must be an integer >= 100; got {n_boot!r}")
    if not (0.0 < level < 1.0):
        raise ValueError(f"level must be in (0, 1); got {level!r}")
    stat = statistic or _mean_difference
    reps = _bootstrap_replicates(a, b, statistic, int(n_boot), seed)
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
    return BootstrapCI(float(stat(a, b)), float(lo), float(hi), float(level), int(n_boot))


def _bootstrap_replicates(a: np.ndarray, b: np.ndarray, statistic, n_boot: int, seed: int) -> np.ndarray:
    """The ``n_boot`` bootstrap replicates of :func:`paired_bootstrap_ci` (``scipy.stats.bootstrap``'s
    ``bootstrap_distribution``; constant with a single question, which scipy does not resample)."""
    n = a.shape[-1]
    d = (a - b).reshape(-1, n).mean(axis=0)  # per-question difference averaged over seeds
    if n == 1:
        one = d[0] if statistic is None else statistic(a, b)
        return np.full(n_boot, float(one))
    boot = dict(n_resamples=n_boot, batch=2048, method="percentile", random_state=np.random.default_rng(seed))
    if statistic is None:
        res = _st.bootstrap((d,), np.mean, vectorized=True, **boot)
    else:
        res = _st.bootstrap((np.arange(n),), lambda i: statistic(a[..., i], b[..., i]), vectorized=False, **boot)
    return res.bootstrap_distribution

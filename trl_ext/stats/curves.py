r"""Learning-curve statistics: accuracy against generated tokens, compared across methods with bootstrap intervals.

Final accuracy at one budget is a blunt instrument (on the testbed's ``scratchpad`` task twelve methods end within
1.5 points); two methods can end level while one got there with fewer tokens. For each run the curve is the
piecewise-linear interpolation of its held-out accuracy at token checkpoints ``(t_j, a_j)``, starting from the
start checkpoint's accuracy ``a_0`` at ``t = 0``:

* **normalized AUC** (eq. C1) on ``[0, B]``: :math:`\mathrm{AUC} = \frac{1}{B}\int_0^B a(t)\,dt`, the mean accuracy
  over the budget (higher = better earlier); the curve must reach ``B`` (the last checkpoint at or beyond ``B``,
  linear interpolation at ``B``);
* **accuracy at the budget** (eq. C3): :math:`a(B)`, the curve interpolated at ``B``: final accuracy at *equal*
  tokens, for runs whose last step overshoots the budget by different amounts (a step's tokens are not divisible:
  at a budget of a few steps, V0.5's OSLA rounds or DAPO's refills can overshoot by a quarter);
* **tokens to target** (eq. C2): :math:`T(\tau) = \min\{t : a(t) \ge \tau\}` on the interpolated curve, ``inf`` if
  never reached by the last checkpoint;

and, over the seeds of a method, the mean AUC and the mean accuracy at the budget, their differences to a baseline
method (paired by seed when both have the same seeds), and the tokens-to-target of the **seed-mean curve** (the mean of the seeds' accuracies on a
common token grid), each with a percentile bootstrap interval: over seeds with ``scipy.stats.bootstrap``; over seeds
*and* questions (two-level: seeds with replacement, then questions with replacement, the same questions for every
checkpoint of a run, which keeps their correlation along the curve) when per-question outcomes at every checkpoint
are given (SciPy has no hierarchical bootstrap, so that one is a plain NumPy percentile bootstrap).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy import stats

__all__ = ["curve_auc", "tokens_to_target", "curve_on_grid", "compare_curves", "two_level_curve_bootstrap",
           "two_level_auc_difference"]


def _curve(tokens, values, start_value: float | None) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(tokens, dtype=np.float64).ravel()
    v = np.asarray(values, dtype=np.float64).ravel()
    if t.shape != v.shape or t.size == 0:
        raise ValueError(f"a curve needs equally many tokens and values (>= 1), got {t.size} and {v.size}.")
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(v))):
        raise ValueError("curve tokens and values must be finite.")
    if np.any(np.diff(t) < 0) or t[0] <= 0:
        raise ValueError("curve token checkpoints must be positive and non-decreasing.")
    # Equal token counts: one step crossed two nominal checkpoints (a V0.5 OSLA step or a DAPO refill can generate
    # more than the checkpoint spacing), so no tokens were generated between the evaluations; the last one is the
    # latest weights at that count and is kept.
    last = np.append(np.diff(t) > 0, True)
    t, v = t[last], v[last]
    if start_value is not None:
        t, v = np.concatenate([[0.0], t]), np.concatenate([[float(start_value)], v])
    return t, v


def curve_on_grid(tokens, values, grid, *, start_value: float | None = None) -> np.ndarray:
    """The piecewise-linear curve evaluated at ``grid`` (NaN beyond the last checkpoint or before the first).

    Parameters
    ----------
    tokens, values : array_like, shape (J,)
        Checkpoints (non-decreasing, > 0; of equal token counts the last evaluation is used) and the accuracy at
        each.
    grid : array_like
        Token positions.
    start_value : float, optional
        Accuracy at ``t = 0`` (the start checkpoint); without it the curve starts at its first checkpoint.
    """
    t, v = _curve(tokens, values, start_value)
    g = np.asarray(grid, dtype=np.float64)
    out = np.interp(g, t, v)
    return np.where((g < t[0] - 1e-9) | (g > t[-1] + 1e-9), np.nan, out)


def curve_auc(tokens, values, budget: float, *, start_value: float | None = None) -> float:
    """Normalized area under the accuracy-vs-tokens curve on ``[0, budget]`` (eq. C1).

    Returns
    -------
    float
        The mean accuracy over the budget, in the units of ``values``.

    Raises
    ------
    ValueError
        ``budget`` not positive, the curve does not reach ``budget``, or (without ``start_value``) does not start
        at 0.
    """
    if not budget > 0:
        raise ValueError(f"budget must be positive, got {budget!r}.")
    t, v = _curve(tokens, values, start_value)
    if t[0] > 0:
        raise ValueError("the curve has no value at t = 0: pass start_value (the start checkpoint's accuracy).")
    if t[-1] < budget * (1 - 1e-9):
        raise ValueError(f"the curve ends at {t[-1]:.0f} tokens, before the budget {budget:.0f}.")
    inside = t < budget
    tt = np.concatenate([t[inside], [budget]])
    vv = np.concatenate([v[inside], [np.interp(budget, t, v)]])
    trapezoid = getattr(np, "trapezoid", None) or np.trapz  # numpy < 2 has only trapz
    return float(trapezoid(vv, tt) / budget)


def tokens_to_target(tokens, values, target: float, *, start_value: float | None = None) -> float:
    """First token count at which the interpolated curve reaches ``target`` (eq. C2); ``inf`` if it never does."""
    t, v = _curve(tokens, values, start_value)
    if v[0] >= target:
        return float(t[0])
    for j in range(1, t.size):
        if v[j] >= target:
            return float(t[j - 1] + (target - v[j - 1]) / (v[j] - v[j - 1]) * (t[j] - t[j - 1]))
    return math.inf


def _mean_curve_t2t(curves: list[tuple[np.ndarray, np.ndarray]], grid: np.ndarray, target: float,
                    start_value: float | None) -> float:
    vals = np.mean([curve_on_grid(t, v, grid, start_value=start_value) for t, v in curves], axis=0)
    ok = np.isfinite(vals)
    return tokens_to_target(grid[ok][grid[ok] > 0], vals[ok][grid[ok] > 0], target,
                            start_value=start_value) if ok.any() else math.inf


def _ci(res) -> tuple[float, float]:
    lo, hi = res.confidence_interval
    return float(lo), float(hi)


def _seed_mean_and_difference(values: dict[int, float], base: dict[int, float], is_baseline: bool,
                              boot: dict) -> dict:
    """Mean over seeds with its bootstrap interval, and the difference to the baseline's mean (paired by seed when
    the seed sets match, else two independent samples) with its interval: ``mean``, ``ci``, ``diff``,
    ``diff_ci``, ``paired``."""
    seeds, b_seeds = sorted(values), sorted(base)
    a, b = np.array([values[k] for k in seeds]), np.array([base[k] for k in b_seeds])
    out = {"mean": float(a.mean()), "diff": float(a.mean() - b.mean()), "paired": seeds == b_seeds}
    out["ci"] = _ci(stats.bootstrap((a,), np.mean, **boot)) if len(a) > 1 else (math.nan, math.nan)
    if is_baseline or len(a) < 2 or len(b) < 2:
        out["diff_ci"] = (0.0, 0.0) if is_baseline else (math.nan, math.nan)
    elif out["paired"]:
        out["diff_ci"] = _ci(stats.bootstrap((a - b,), np.mean, **boot))
    else:
        out["diff_ci"] = _ci(stats.bootstrap((a, b), lambda x, y, axis=-1: np.mean(x, axis) - np.mean(y, axis),
                                             **boot))
    return out


def compare_curves(runs: dict[str, dict[int, tuple[Sequence[float], Sequence[float]]]], *, budget: float,
                   baseline: str, target: float | None = None, start_value: float | None = None,
                   confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0) -> dict:
    """AUC, AUC difference to ``baseline`` and tokens-to-target per method, with seed-bootstrap intervals.

    Parameters
    ----------
    runs : dict
        ``{method: {seed: (tokens, accuracies)}}``: every run's checkpoints.
    budget : float
        Token budget of the AUC (every run must reach it).
    baseline : str
        The method the differences are taken against (a key of ``runs``).
    target : float, optional
        Accuracy target of the tokens-to-target statistic; default: the baseline's mean final accuracy.
    start_value : float, optional
        Accuracy of the start checkpoint (``t = 0``), shared by every run.
    confidence, n_resamples, seed
        Of the percentile bootstrap (``scipy.stats.bootstrap``; seeds resampled with replacement).

    Returns
    -------
    dict
        ``target``, ``budget`` and ``methods``: per method ``seeds``, ``auc`` (per seed), ``auc_mean`` with
        ``auc_ci``, ``auc_diff`` (mean minus the baseline's; paired by seed when the seed sets match) with
        ``auc_diff_ci`` and ``auc_diff_paired``; the same for the accuracy at the budget (eq. C3): ``acc_at_budget``
        (per seed), ``acc_at_budget_mean`` / ``_ci`` / ``_diff`` / ``_diff_ci``; ``t2t_mean_curve`` (tokens at which the seed-mean curve reaches the
        target; ``inf`` if not) with ``t2t_ci``, and ``t2t_per_seed``.
    """
    if baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not among the methods {sorted(runs)}.")
    rng = np.random.default_rng(seed)
    norm = {m: {s: (np.asarray(t, float), np.asarray(v, float)) for s, (t, v) in per.items()} for m, per in runs.items()}
    if target is None:
        target = float(np.mean([v[-1] for _, v in norm[baseline].values()]))
    grid = np.linspace(0.0, budget, 201)[1:]
    auc = {m: {s: curve_auc(t, v, budget, start_value=start_value) for s, (t, v) in per.items()}
           for m, per in norm.items()}
    at_b = {m: {s: float(curve_on_grid(t, v, [budget], start_value=start_value)[0]) for s, (t, v) in per.items()}
            for m, per in norm.items()}
    boot = dict(confidence_level=confidence, n_resamples=n_resamples, method="percentile", random_state=rng)
    boot_at_b = {**boot, "random_state": np.random.default_rng([seed, 1])}
    out = {"target": target, "budget": budget, "baseline": baseline, "confidence": confidence, "methods": {}}
    for m, per in norm.items():
        seeds = sorted(per)
        rec = {"seeds": seeds, "auc": [auc[m][s] for s in seeds], "acc_at_budget": [at_b[m][s] for s in seeds]}
        # the accuracy at the budget draws from its own stream, so the AUC and tokens-to-target intervals are those
        # of the same seed before it was added
        for name, table, bt in (("auc", auc, boot), ("acc_at_budget", at_b, boot_at_b)):
            st = _seed_mean_and_difference(table[m], table[baseline], m == baseline, bt)
            rec.update({f"{name}_mean": st["mean"], f"{name}_ci": st["ci"], f"{name}_diff": st["diff"],
                        f"{name}_diff_ci": st["diff_ci"]})
            rec["auc_diff_paired"] = st["paired"]
        curves = [per[s] for s in seeds]
        rec["t2t_per_seed"] = [tokens_to_target(t, v, target, start_value=start_value) for t, v in curves]
        rec["t2t_mean_curve"] = _mean_curve_t2t(curves, grid, target, start_value)
        if len(curves) > 1:
            def t2t(idx, curves=curves):
                return _mean_curve_t2t([curves[int(i)] for i in idx], grid, target, start_value)

            with warnings.catch_warnings(), np.errstate(invalid="ignore"):  # resamples that never reach: inf
                warnings.simplefilter("ignore", RuntimeWarning)
                res = stats.bootstrap((np.arange(len(curves)),), t2t, vectorized=False,
                                      **{**boot, "n_resamples": min(n_resamples, 1999)})
            rec["t2t_ci"] = _ci(res)
        else:
            rec["t2t_ci"] = (math.nan, math.nan)
        out["methods"][m] = rec
    return out


#: Per-run curve statistics the two-level bootstrap can resample: eq. C1 and eq. C3.
CURVE_STATISTICS = ("auc", "acc_at_budget")


def two_level_curve_bootstrap(outcomes, tokens, budget: float, *, start_outcomes=None, n_resamples: int = 2000,
                              confidence: float = 0.95, seed: int = 0, statistic: str = "auc") -> dict:
    """Mean AUC (or accuracy at the budget) of one method with a percentile interval over seeds **and** questions.

    Parameters
    ----------
    outcomes : array_like, shape (S, J, Q)
        Per seed, checkpoint and held-out question: 1 correct, 0 wrong (or a score in [0, 1]).
    tokens : array_like, shape (S, J) or (J,)
        Token count of every checkpoint.
    budget : float
    start_outcomes : array_like, shape (Q,), optional
        The start checkpoint's per-question outcomes (``t = 0``), resampled with the same questions.
    statistic : {"auc", "acc_at_budget"}
        The per-run statistic: the AUC (eq. C1) or the accuracy interpolated at the budget (eq. C3).

    Returns
    -------
    dict
        ``<statistic>_mean`` (on all seeds and questions), ``ci`` (two-level percentile interval), ``n_seeds``,
        ``n_questions``.
    """
    o = np.asarray(outcomes, dtype=np.float64)
    if o.ndim != 3:
        raise ValueError(f"outcomes must have shape (seeds, checkpoints, questions), got {o.shape}.")
    s_n, j_n, q_n = o.shape
    tok = np.broadcast_to(np.asarray(tokens, dtype=np.float64), (s_n, j_n))
    start = None if start_outcomes is None else np.asarray(start_outcomes, dtype=np.float64)

    _check_statistic(statistic)
    point, ci = _two_level_percentile(lambda si, qi: _mean_curve_stat(o, tok, si, qi, budget, start, statistic),
                                      s_n, q_n, n_resamples, confidence, seed)
    return {f"{statistic}_mean": point, "ci": ci, "n_seeds": s_n, "n_questions": q_n}


def _check_statistic(statistic: str) -> None:
    if statistic not in CURVE_STATISTICS:
        raise ValueError(f"statistic must be one of {CURVE_STATISTICS}, got {statistic!r}.")


def _mean_curve_stat(o: np.ndarray, tok: np.ndarray, seed_idx, q_idx, budget: float, start: np.ndarray | None,
                     statistic: str) -> float:
    """Mean over ``seed_idx`` of the AUC (eq. C1) or the accuracy at the budget (eq. C3) of each seed's curve on the
    questions ``q_idx`` (the start value on the same questions)."""
    sv = None if start is None else float(start[q_idx].mean())
    if statistic == "auc":
        vals = [curve_auc(tok[s], o[s][:, q_idx].mean(axis=1), budget, start_value=sv) for s in seed_idx]
    else:
        vals = [curve_on_grid(tok[s], o[s][:, q_idx].mean(axis=1), [budget], start_value=sv)[0] for s in seed_idx]
    return float(np.mean(vals))


def _two_level_percentile(stat, s_n: int, q_n: int, n_resamples: int, confidence: float, seed: int,
                          s_n_b: int | None = None) -> tuple[float, tuple[float, float]]:
    """``stat(seed_idx, q_idx)`` on all seeds and questions, and its percentile interval over replicates that draw
    seeds with replacement and then questions with replacement (the two-level bootstrap). With ``s_n_b``,
    ``stat(seed_idx, q_idx, seed_idx_b)``: a second method's ``s_n_b`` seeds drawn independently (the paired case's
    random stream is unchanged)."""
    rng = np.random.default_rng(seed)
    if s_n_b is None:
        point = stat(range(s_n), np.arange(q_n))
        draws = [stat(rng.integers(0, s_n, s_n), rng.integers(0, q_n, q_n)) for _ in range(n_resamples)]
    else:
        point = stat(range(s_n), np.arange(q_n), range(s_n_b))
        draws = []
        for _ in range(n_resamples):
            si, si_b = rng.integers(0, s_n, s_n), rng.integers(0, s_n_b, s_n_b)
            draws.append(stat(si, rng.integers(0, q_n, q_n), si_b))
    alpha = 1 - confidence
    lo, hi = np.percentile(draws, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return point, (float(lo), float(hi))


def two_level_auc_difference(outcomes_a, tokens_a, outcomes_b, tokens_b, budget: float, *, start_outcomes=None,
                             n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
                             statistic: str = "auc", paired_seeds: bool = True) -> dict:
    """Mean AUC of method A minus method B with a two-level percentile interval, paired by question and, by
    default, by seed (``statistic="acc_at_budget"``: the accuracy at the budget, eq. C3, instead).

    Each replicate draws seed indices with replacement (paired: the same indices for both methods, seed ``k`` of A
    with seed ``k`` of B, which share the training seed and, in the comparison harness, the evaluation's sampling
    stream; ``paired_seeds=False``: A's and B's seeds drawn independently, each from its own seeds) and then question
    indices with replacement (the same questions for both methods and every checkpoint), and recomputes
    :math:`\\overline{\\mathrm{AUC}}_A - \\overline{\\mathrm{AUC}}_B` (eq. C1 per run).

    Unpaired seeds are the design for unequal seed counts: where seeds do not pair (the per-seed AUCs of two
    methods uncorrelated) the variance of the difference is :math:`\\sigma_A^2/S_A + \\sigma_B^2/S_B`, so seeds of
    the noisier method narrow it most; the questions stay paired (they are shared).

    Parameters
    ----------
    outcomes_a, outcomes_b : array_like, shape (S_a, J_a, Q) and (S_b, J_b, Q)
        Per seed, checkpoint and question (the same question order in both; paired: ``S_a == S_b`` in the same seed
        order), 1/0 or a score in [0, 1].
    tokens_a, tokens_b : array_like, shape (S, J) or (J,)
        Token count of every checkpoint.
    budget : float
    start_outcomes : array_like, shape (Q,), optional
        The shared start checkpoint's per-question outcomes (``t = 0``).
    statistic : {"auc", "acc_at_budget"}
    paired_seeds : bool
        Resample the seeds of A and B together (default) or independently.

    Returns
    -------
    dict
        ``diff_mean`` (on all seeds and questions), ``ci``, ``n_seeds`` (A's), ``n_seeds_b``, ``n_questions``,
        ``paired_seeds``.

    Raises
    ------
    ValueError
        Not three-dimensional, different numbers of questions, or (paired) of seeds; unpaired, a method with one
        seed.
    """
    a, b = np.asarray(outcomes_a, dtype=np.float64), np.asarray(outcomes_b, dtype=np.float64)
    if a.ndim != 3 or b.ndim != 3 or a.shape[2] != b.shape[2] or (paired_seeds and a.shape[0] != b.shape[0]):
        raise ValueError(f"outcomes must have shapes (seeds, checkpoints, questions) with the same questions"
                         f"{' and seeds (paired_seeds=False for unequal seeds)' if paired_seeds else ''}, got "
                         f"{a.shape} and {b.shape}.")
    if not paired_seeds and min(a.shape[0], b.shape[0]) < 2:
        raise ValueError(f"an unpaired seed bootstrap needs >= 2 seeds a method, got {a.shape[0]} and {b.shape[0]}.")
    s_n, q_n = a.shape[0], a.shape[2]
    ta = np.broadcast_to(np.asarray(tokens_a, dtype=np.float64), a.shape[:2])
    tb = np.broadcast_to(np.asarray(tokens_b, dtype=np.float64), b.shape[:2])
    start = None if start_outcomes is None else np.asarray(start_outcomes, dtype=np.float64)

    _check_statistic(statistic)

    def diff(seed_idx, q_idx, seed_idx_b=None):
        return (_mean_curve_stat(a, ta, seed_idx, q_idx, budget, start, statistic)
                - _mean_curve_stat(b, tb, seed_idx if seed_idx_b is None else seed_idx_b, q_idx, budget, start,
                                   statistic))

    point, ci = _two_level_percentile(diff, s_n, q_n, n_resamples, confidence, seed,
                                      s_n_b=None if paired_seeds else b.shape[0])
    return {"diff_mean": point, "ci": ci, "n_seeds": s_n, "n_seeds_b": b.shape[0], "n_questions": q_n,
            "paired_seeds": paired_seeds}

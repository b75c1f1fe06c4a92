"""Tie-break blend: checker grade + epsilon x within-class rank of a scorer's score.

Source: "Measurement Discipline for RLVR", Section 2 ("tie-break blend: reward = checker grade + epsilon x
within-class reward-model rank, where epsilon = 0.1") and the worked eight-attempt example ("The same group,
all the way through the tie-break"): inside each (group, grade) class the attempts are ranked by the scorer,
lowest to highest, and the rank is normalised to [0, 1] (rank / (n_class - 1)), so the lowest adds 0 and the
highest adds the full epsilon.

Properties (tested in ``tests/test_estimators_tiebreak.py``):

* The blend never overrules the checker when epsilon < the smallest gap between two distinct grades inside a
  group (binary 0/1 grades: epsilon < 1): a wrong attempt tops out at 0 + epsilon < 1 = the worst right one.
* Under GRPO group standardisation the epsilon cancels in a checker-tied group: the advantage is
  (rank - mean rank) / std(rank), up to the eps guard (paper: ranks 0..7 give +-1.52 for epsilon = 0.1,
  1.53 for 1.0, 1.48 for 0.01 with guard 1e-4 and the population std).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validation import as_float_array, check_positive_scalar, factorize_groups, to_numpy

__all__ = ["tie_break_blend", "within_class_rank", "blend_opened_groups", "BlendDiagnostics"]


def _class_codes(grades: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense codes of the (group, grade) classes over the finite-grade rows."""
    ok = ~np.isnan(grades)
    pairs = np.stack([codes[ok].astype(np.float64), grades[ok]], axis=1)
    _, cls = np.unique(pairs, axis=0, return_inverse=True)
    return ok, cls.reshape(-1)


def within_class_rank(scores: Any, classes: Any, singleton_rank: float = 0.0) -> np.ndarray:
    """Rank of each score inside its class, normalised to [0, 1] (lowest 0, highest 1).

    Equal scores in a class share their average rank (so identical attempts get identical rewards). A class
    with a single member gets ``singleton_rank`` (default 0: nothing to break, the attempt keeps its grade).

    Parameters
    ----------
    scores : array_like, shape (M,), finite
    classes : array_like of int, shape (M,)
        Integer class labels (e.g. dense codes of the (group, grade) pairs). Float labels must be whole numbers:
        non-integer labels raise instead of being truncated into one class.
    singleton_rank : float in [0, 1]
    """
    s = as_float_array(scores, "scores", ndim=1)
    c = to_numpy(classes)
    if c.shape != s.shape:
        raise ValueError(f"classes shape {c.shape} != scores shape {s.shape}; pass one class label per score.")
    if c.dtype.kind == "f":
        if not np.all(np.isfinite(c)) or np.any(c != np.round(c)):
            raise ValueError("classes must be integer labels; got non-integer or NaN values (they would be truncated "
                             "and merge distinct classes). Use factorized integer codes.")
    elif c.dtype.kind not in "iub":
        raise TypeError(f"classes must be integer labels, got dtype {c.dtype}; factorize them first.")
    c = c.astype(np.int64)
    if np.isnan(s).any():
        raise ValueError("scores contain NaN; the scorer must score every rollout (drop or re-score it).")
    order = np.lexsort((s, c))
    cs, ss = c[order], s[order]
    n = s.size
    # position inside class
    start = np.r_[0, np.flatnonzero(np.diff(cs)) + 1]
    sizes = np.diff(np.r_[start, n])
    cls_start = np.repeat(start, sizes)
    pos = np.arange(n) - cls_start
    # average ranks over runs of equal (class, score)
    brk = np.r_[True, (np.diff(cs) != 0) | (np.diff(ss) != 0)]
    run_id = np.cumsum(brk) - 1
    run_mean = np.bincount(run_id, weights=pos) / np.bincount(run_id)
    avg = run_mean[run_id]
    size_i = np.repeat(sizes, sizes)
    with np.errstate(invalid="ignore", divide="ignore"):
        norm = np.where(size_i > 1, avg / (size_i - 1), float(singleton_rank))
    out = np.empty(n)
    out[order] = norm
    return out


def tie_break_blend(
    grades: Any,
    scores: Any,
    group_ids: Any,
    epsilon: float = 0.1,
    singleton_rank: float = 0.0,
    check_separation: bool = True,
) -> np.ndarray:
    """Blend reward = grade + epsilon x (rank of score within its (group, grade) class, normalised to [0, 1]).

    Parameters
    ----------
    grades : array_like, shape (N,)
        Checker grades (e.g. 0/1). NaN marks an unscorable rollout: its blended reward is NaN (downstream
        baselines exclude and count it) and its score is ignored.
    scores : array_like, shape (N,)
        Scorer (reward-model) scores. Must be finite wherever the grade is finite; NaN there raises.
    group_ids : array_like, shape (N,)
    epsilon : float > 0
        Blend weight (paper: 0.1). Not GRPO's clipping epsilon.
    singleton_rank : float in [0, 1]
        Rank given to a class with one member (default 0).
    check_separation : bool
        If True, raise when epsilon >= the smallest gap between distinct grades inside any group, i.e. when
        the blend could tie with or overrule the checker's ordering.

    Returns
    -------
    ndarray, shape (N,)
    """
    eps = check_positive_scalar(epsilon, "epsilon")
    if not 0.0 <= float(singleton_rank) <= 1.0:
        raise ValueError(f"singleton_rank must be in [0, 1], got {singleton_rank!r}.")
    g = as_float_array(grades, "grades", ndim=1)
    s = _to_scores(scores, g.shape[0])
    codes, _ = factorize_groups(group_ids, g.shape[0])
    ok = ~np.isnan(g)
    if np.isnan(s[ok]).any():
        bad = np.flatnonzero(ok & np.isnan(s))[:10].tolist()
        raise ValueError(f"scores are NaN at graded rows {bad}; score every graded rollout or mark its grade NaN.")
    out = np.full(g.shape, np.nan)
    if not ok.any():
        return out
    if check_separation:
        gap = _min_grade_gap(g[ok], codes[ok])
        if eps >= gap:
            raise ValueError(
                f"epsilon={eps} >= the smallest gap {gap:.6g} between distinct grades in a group: the blend could "
                f"overrule the checker. Use epsilon < {gap:.6g} (or check_separation=False to allow it)."
            )
    _, cls = _class_codes(g, codes)
    rank = within_class_rank(s[ok], cls, singleton_rank)
    out[ok] = g[ok] + eps * rank
    return out


def _to_scores(scores: Any, n: int) -> np.ndarray:
    s = as_float_array(scores, "scores", ndim=1)
    if s.shape[0] != n:
        raise ValueError(f"scores has length {s.shape[0]} but grades has length {n}.")
    return s


def _min_grade_gap(g: np.ndarray, codes: np.ndarray) -> float:
    order = np.lexsort((g, codes))
    gs, cs = g[order], codes[order]
    d = np.diff(gs)
    same = np.diff(cs) == 0
    gaps = d[same & (d > 0)]
    return float(gaps.min()) if gaps.size else np.inf


@dataclass(frozen=True)
class BlendDiagnostics:
    """How the blend changed the group structure.

    Attributes
    ----------
    n_groups : int
    n_tied_by_checker : int, groups whose finite grades are all equal (shut gate under the checker).
    n_opened : int, of those, groups whose blended rewards are no longer all equal.
    n_still_tied : int, = n_tied_by_checker - n_opened (e.g. scorer ties or singleton groups).
    frac_tied_by_checker, frac_opened : float, as fractions of n_groups (frac_opened of the tied ones).
    attempts_in_opened : int, rollouts in opened groups (the slice where epsilon is the entire signal).
    """

    n_groups: int
    n_tied_by_checker: int
    n_opened: int
    n_still_tied: int
    frac_tied_by_checker: float
    frac_opened: float
    attempts_in_opened: int


def blend_opened_groups(grades: Any, blended: Any, group_ids: Any) -> BlendDiagnostics:
    """Count the checker-tied groups that the blend opened (gave a non-zero spread).

    Groups whose grades are all NaN are counted in ``n_groups`` but neither tied nor opened.
    """
    g = as_float_array(grades, "grades", ndim=1)
    b = as_float_array(blended, "blended", ndim=1)
    if b.shape != g.shape:
        raise ValueError(f"blended shape {b.shape} != grades shape {g.shape}.")
    if (np.isnan(g) != np.isnan(b)).any():
        raise ValueError("grades and blended disagree on which rows are NaN; pass the output of tie_break_blend.")
    codes, uniq = factorize_groups(group_ids, g.shape[0])
    n = uniq.shape[0]

    def spread(x: np.ndarray) -> np.ndarray:
        ok = ~np.isnan(x)
        hi = np.full(n, -np.inf)
        lo = np.full(n, np.inf)
        np.maximum.at(hi, codes[ok], x[ok])
        np.minimum.at(lo, codes[ok], x[ok])
        return np.where(np.isfinite(hi), hi - lo, np.nan)

    sg, sb = spread(g), spread(b)
    tied = sg == 0
    opened = tied & (sb > 0)
    n_tied, n_open = int(tied.sum()), int(opened.sum())
    return BlendDiagnostics(
        n_groups=n, n_tied_by_checker=n_tied, n_opened=n_open, n_still_tied=n_tied - n_open,
        frac_tied_by_checker=n_tied / n, frac_opened=(n_open / n_tied) if n_tied else 0.0,
        attempts_in_opened=int(np.isin(codes, np.flatnonzero(opened)).sum()),
    )

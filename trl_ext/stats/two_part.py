"""The two-part rule for calling a winner across seeds.

Source: "Measurement Discipline for RLVR" section 5 step 1 and checklist item 4 ("Call a winner only when both
parts hold"), with the worked example of section 3 of its companion piece "Same RL Recipe, Different Seed,
Different Verdict" (114 vs 76 question votes, ``p = 0.0071``, all three seeds agreeing: a called win) and its
section 4 / 5 (pooled ``p = 0.0079`` but seed 2 dissents: no winner; a seed on an exact 108-108 split does not
agree).

1. **Pooled half.** Each question votes once: the sign of the sum of its per-seed verdicts (``+1`` a better, ``-1``
   b better, ``0`` tie). Questions whose seeds cancel (or all tie) abstain. An exact two-sided binomial test on the
   decided votes must give ``p < alpha``.
2. **Unanimity half.** Every seed's own overall direction (its net ``wins_a - wins_b`` over questions, i.e. the
   sign of its accuracy difference for 0/1 outcomes) must equal the pooled direction. A seed with net 0 agrees with
   nobody.

Both together call a winner. A single seed cannot show agreement across seeds, so the rule reports that it
cannot call a winner (the per-seed and pooled numbers are still returned).

The "sign of the sum" question vote reproduces the paper's Monte Carlo catch rates (0.945 / 0.654 at 1,319
questions, see :func:`trl_ext.stats.floors.two_part_catch_rate`); a strict "two of three seeds" reading does not.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .paired import exact_binomial_test

__all__ = ["SeedSummary", "Verdict", "question_verdicts", "two_part_rule"]


@functools.lru_cache(maxsize=1 << 16)
def _half_p(k: int, n: int) -> float:
    return exact_binomial_test(k, n)


def binom_two_sided_half(k, n):
    """:func:`~trl_ext.stats.paired.exact_binomial_test` ``(k, n)`` (p = 1/2, two-sided) elementwise over arrays.

    Not a second implementation: one ``scipy.stats.binomtest`` per distinct ``(k, n)`` (cached), which is what the
    Monte Carlo of :mod:`.floors` needs (millions of simulated tallies, few distinct ones). Returns an array of the
    broadcast shape of ``k`` and ``n``.
    """
    k, n = np.broadcast_arrays(np.asarray(k, dtype=np.int64), np.asarray(n, dtype=np.int64))
    pairs, inverse = np.unique(np.stack([k.ravel(), n.ravel()]), axis=1, return_inverse=True)
    values = np.array([_half_p(int(a), int(b)) for a, b in pairs.T], dtype=np.float64)
    return values[inverse.reshape(-1)].reshape(k.shape)


@dataclass(frozen=True)
class SeedSummary:
    """One seed's head-to-head tally (section 4's per-seed table)."""

    label: str
    n_questions: int
    a_wins: int
    b_wins: int
    ties: int
    mean_a: float
    mean_b: float
    p_value: float  # exact two-sided binomial test of a_wins among decided questions

    @property
    def net(self) -> int:
        return self.a_wins - self.b_wins

    @property
    def direction(self) -> str | None:
        return "a" if self.net > 0 else "b" if self.net < 0 else None


@dataclass(frozen=True)
class Verdict:
    """Outcome of :func:`two_part_rule`.

    Attributes
    ----------
    status : str
        ``"a_wins"``, ``"b_wins"``, ``"no_winner"`` (the rule ran and at least one half failed) or
        ``"cannot_call"`` (a single seed: agreement across seeds is untestable).
    winner : str or None
        ``"a"``, ``"b"`` or ``None``.
    reason : str
        Plain-language reason for the status.
    votes_a, votes_b, abstain : int
        Pooled per-question votes and abstentions.
    pooled_p_value : float
        Exact two-sided binomial p-value on the decided votes (1.0 when there are none).
    pooled_direction : str or None
        Side the pooled majority favours (``None`` on an exact split).
    pooled_significant, unanimous : bool
        The two halves.
    seeds : tuple of SeedSummary
    alpha : float
    question_votes : ndarray of int, shape (n_questions,)
        Each question's pooled vote in {-1, 0, 1}.
    """

    status: str
    winner: str | None
    reason: str
    votes_a: int
    votes_b: int
    abstain: int
    pooled_p_value: float
    pooled_direction: str | None
    pooled_significant: bool
    unanimous: bool
    seeds: tuple[SeedSummary, ...]
    alpha: float
    question_votes: np.ndarray = field(repr=False)

    @property
    def n_seeds(self) -> int:
        return len(self.seeds)

    @property
    def n_questions(self) -> int:
        return int(self.question_votes.size)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["question_votes"] = self.question_votes.tolist()
        d["seeds"] = [{**asdict(s), "net": s.net, "direction": s.direction} for s in self.seeds]
        return d

    def describe(self) -> str:
        lines = [
            f"verdict: {self.status}" + (f" (winner: {self.winner})" if self.winner else ""),
            f"  reason: {self.reason}",
            f"  pooled question votes: a {self.votes_a} / b {self.votes_b} / abstain {self.abstain}, "
            f"exact binomial p = {self.pooled_p_value:.4g} (alpha {self.alpha})",
        ]
        for s in self.seeds:
            name = s.label if s.label.startswith("seed") else f"seed {s.label}"
            lines.append(
                f"  {name}: a {s.a_wins} / b {s.b_wins} / tie {s.ties}, net {s.net:+d}, "
                f"mean a {s.mean_a:.4f} vs b {s.mean_b:.4f}, p = {s.p_value:.4g}"
            )
        return "\n".join(lines)


def _stack(name: str, x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        arr = x.astype(float) if x.ndim == 2 else None
    else:
        seqs = list(x)
        lens = {len(np.atleast_1d(s)) for s in seqs}
        if len(lens) > 1:
            raise ValueError(f"{name}: every seed must cover the same questions; got lengths {sorted(lens)}")
        arr = np.asarray([np.asarray(s, dtype=float) for s in seqs]) if seqs else np.zeros((0, 0))
    if arr is None or arr.ndim != 2:
        raise ValueError(f"{name} must be a sequence of per-seed 1-D arrays, or an (n_seeds, n_questions) array")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} has no seeds: pass one outcome array per seed")
    if arr.shape[1] == 0:
        raise ValueError(f"{name} has no questions")
    if np.any(~np.isfinite(arr)):
        s, q = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(f"{name} has a non-finite value at seed {s}, question {q}; outcomes must be numbers")
    return arr


def question_verdicts(a, b, tie_margin: float = 0.0) -> np.ndarray:
    """Per-cell verdicts ``sign(a - b)``, with ``|a - b| <= tie_margin`` counted as a tie (0).

    ``tie_margin`` is where a scorer's noise floor enters (section 5 step 1: "unless the two scores fall inside
    the judge's own floor, in which case the prompt is a tie"); for 0/1 correctness leave it at 0.
    """
    if not (tie_margin >= 0) or not math.isfinite(tie_margin):
        raise ValueError(f"tie_margin must be a finite number >= 0; got {tie_margin!r}")
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    return np.where(np.abs(diff) <= tie_margin, 0, np.sign(diff)).astype(np.int64)


def two_part_rule(
    outcomes_a_by_seed,
    outcomes_b_by_seed,
    alpha: float = 0.05,
    *,
    tie_margin: float = 0.0,
    seed_labels: Sequence[str] | None = None,
) -> Verdict:
    """Apply the two-part rule to two configurations evaluated on the same questions over several seeds.

    Parameters
    ----------
    outcomes_a_by_seed, outcomes_b_by_seed : sequence of array_like, or array of shape (n_seeds, n_questions)
        Per-seed, per-question outcomes (0/1 correctness, pass rates or judge scores), aligned by seed (row) and
        question (column). Seed ``i`` of ``a`` is compared with seed ``i`` of ``b``.
    alpha : float
        Significance level of the pooled exact binomial test.
    tie_margin : float
        Differences with ``|a - b| <= tie_margin`` are ties (use the scorer's noise floor for judge scores).
    seed_labels : sequence of str, optional
        Names for the seeds in the report.

    Returns
    -------
    Verdict
        See :class:`Verdict`. Defined edge cases: one seed -> ``"cannot_call"``; every question tied (no decided
        pooled votes) -> ``"no_winner"`` with ``pooled_p_value = 1``; a pooled exact split -> ``"no_winner"``; a
        seed with net 0 breaks unanimity.
    """
    a = _stack("outcomes_a_by_seed", outcomes_a_by_seed)
    b = _stack("outcomes_b_by_seed", outcomes_b_by_seed)
    if a.shape != b.shape:
        raise ValueError(
            f"a and b must have the same (n_seeds, n_questions) shape; got {a.shape} and {b.shape}. "
            "Pair seeds one-to-one and align questions before calling."
        )
    if not (0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be in (0, 1); got {alpha!r}")
    n_seeds, n_q = a.shape
    labels = [str(i) for i in range(n_seeds)] if seed_labels is None else [str(s) for s in seed_labels]
    if len(labels) != n_seeds:
        raise ValueError(f"seed_labels has {len(labels)} entries for {n_seeds} seeds")

    v = question_verdicts(a, b, tie_margin)  # (S, N)
    seeds = []
    for i in range(n_seeds):
        aw, bw = int(np.sum(v[i] > 0)), int(np.sum(v[i] < 0))
        seeds.append(
            SeedSummary(labels[i], n_q, aw, bw, n_q - aw - bw, float(a[i].mean()), float(b[i].mean()),
                        exact_binomial_test(aw, aw + bw))
        )
    qv = np.sign(v.sum(axis=0)).astype(np.int64)
    ka, kb = int(np.sum(qv > 0)), int(np.sum(qv < 0))
    p = exact_binomial_test(ka, ka + kb)
    direction = "a" if ka > kb else "b" if kb > ka else None
    significant = direction is not None and p < alpha
    unanimous = direction is not None and all(s.direction == direction for s in seeds)

    if n_seeds == 1:
        status, winner = "cannot_call", None
        reason = ("a single seed cannot show that seeds agree; the two-part rule needs at least 2 seeds "
                  "(the paper runs 3)")
    elif ka + kb == 0:
        status, winner = "no_winner", None
        reason = "every question's pooled vote is tied: no decided votes, nothing to test"
    elif direction is None:
        status, winner = "no_winner", None
        reason = f"pooled votes split exactly ({ka} vs {kb})"
    elif significant and unanimous:
        status, winner = f"{direction}_wins", direction
        reason = f"pooled majority significant (p = {p:.4g} < {alpha}) and all {n_seeds} seeds agree"
    else:
        failed = []
        if not significant:
            failed.append(f"pooled majority not significant (p = {p:.4g} >= {alpha})")
        if not unanimous:
            dissent = [s.label for s in seeds if s.direction != direction]
            failed.append(f"seed(s) {', '.join(dissent)} do not agree with the pooled direction '{direction}'")
        status, winner = "no_winner", None
        reason = "; ".join(failed)
    return Verdict(status, winner, reason, ka, kb, n_q - ka - kb, p, direction, bool(significant), bool(unanimous),
                   tuple(seeds), float(alpha), qv)

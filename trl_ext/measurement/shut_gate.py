"""Shut-gate diagnostics: how much of a batch of groups carries no learning signal.

GRPO-family updates learn only from groups whose rewards differ: a group whose rollouts all receive the same
reward has zero advantage everywhere ("Measurement Discipline for RLVR", the "shut gate" sections: "the training
method learns only when its sampled attempts at a question receive different grades"; 59.7% of trivia groups
tied a quarter of the way into training). The paper reads the tied share together with its composition:

* **tied share** -- fraction of groups whose rewards all tie;
* split into **tied all-right** (every rollout correct: mastered, "convergence") and **tied all-wrong** (every
  rollout wrong: "ignorance-looking" ties), e.g. "all 121 tied questions out of 250 were tied all-wrong";
* **tied-correct share** -- the fraction of *correct* rollouts that sat in tied groups, i.e. correct answers the
  update discarded ("the model did it and the update discarded it").

Everything here is pure numpy (torch tensors are accepted) and never imports TRL.

Definitions used (documented choices)
-------------------------------------
* A rollout is **scorable** when its reward is finite; NaN rewards are excluded from every count and reported
  in ``num_unscorable``.
* A group is **eligible** when it has at least ``min_group_size`` (default 2) scorable rollouts. A group of one
  rollout (e.g. BASIS, G = 1) ties trivially and says nothing about the gate, so it is excluded from the shares
  and counted in ``num_singleton_groups``.
* An eligible group is **tied** when ``max(r) - min(r) <= atol`` over its scorable rollouts (``atol = 0``: exact
  ties, as a binary checker produces; pass a scorer's noise floor to treat sub-floor gaps as ties, per the
  paper's "any score gap smaller than the floor is a tie").
* A rollout is **correct** when ``reward >= success_threshold`` (default 0.5, right for {0, 1} and {-1, 1}
  checkers), or as given by an explicit ``correct`` mask. A tied group is *all-right* when all its rollouts are
  correct, *all-wrong* when none is; with ``atol > 0`` a tied group can straddle the threshold and is then
  counted as ``tied_mixed``.
* Shares with an empty denominator are ``NaN`` (and left out of :meth:`ShutGateStats.as_metrics`), never 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["ShutGateStats", "shut_gate_stats", "tied_group_mask"]


@dataclass(frozen=True)
class ShutGateStats:
    """Counts and shares of one shut-gate reading (see the module docstring for the definitions).

    Attributes
    ----------
    num_groups : int
        Groups with at least one scorable rollout.
    num_eligible_groups : int
        Groups with at least ``min_group_size`` scorable rollouts (the denominator of the shares).
    num_singleton_groups : int
        Groups with at least one but fewer than ``min_group_size`` scorable rollouts.
    num_tied, num_tied_all_right, num_tied_all_wrong, num_tied_mixed : int
        Tied eligible groups, and their split by correctness.
    num_rollouts : int
        Scorable rollouts in eligible groups.
    num_correct : int
        Correct scorable rollouts in eligible groups.
    num_correct_in_tied : int
        Correct rollouts that sat in tied groups.
    num_unscorable : int
        Rollouts with a NaN reward (all groups).
    tied_share, tied_all_right_share, tied_all_wrong_share : float
        ``num_tied* / num_eligible_groups`` (NaN when no group is eligible).
    tied_correct_share : float
        ``num_correct_in_tied / num_correct`` (NaN when no rollout is correct).
    """

    num_groups: int
    num_eligible_groups: int
    num_singleton_groups: int
    num_tied: int
    num_tied_all_right: int
    num_tied_all_wrong: int
    num_tied_mixed: int
    num_rollouts: int
    num_correct: int
    num_correct_in_tied: int
    num_unscorable: int
    tied_share: float
    tied_all_right_share: float
    tied_all_wrong_share: float
    tied_correct_share: float

    def as_dict(self) -> dict:
        """All fields as a plain dict (JSON-serializable; NaN stays NaN)."""
        return asdict(self)

    def as_metrics(self, prefix: str = "gate/") -> dict[str, float]:
        """Scalar metrics for a logger: the four shares (finite ones only) plus the eligible-group count.

        Returns
        -------
        dict
            ``{prefix + "tied_share": ..., prefix + "tied_all_right_share": ..., prefix + "tied_all_wrong_share":
            ..., prefix + "tied_correct_share": ..., prefix + "eligible_groups": ...}``; a share whose
            denominator is empty is omitted rather than logged as 0 or NaN.
        """
        out = {f"{prefix}eligible_groups": float(self.num_eligible_groups)}
        for name in ("tied_share", "tied_all_right_share", "tied_all_wrong_share", "tied_correct_share"):
            value = getattr(self, name)
            if math.isfinite(value):
                out[prefix + name] = float(value)
        return out


def _as_1d(x, name: str, dtype=None) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x, dtype=dtype)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per rollout), got shape {arr.shape}.")
    return arr


def _factorize(group_ids: np.ndarray) -> tuple[np.ndarray, int]:
    _, inverse = np.unique(group_ids, return_inverse=True)
    inverse = inverse.reshape(-1)
    return inverse, int(inverse.max()) + 1 if inverse.size else 0


def tied_group_mask(rewards, group_ids, *, atol: float = 0.0, min_group_size: int = 2):
    """Per-group tie flags.

    Parameters
    ----------
    rewards : array_like, shape (N,)
        Rewards; NaN marks unscorable rollouts (ignored).
    group_ids : array_like, shape (N,)
        Any hashable-as-integer labels; groups need not be contiguous.
    atol : float, default 0
        A group is tied when ``max - min <= atol`` over its scorable rollouts.
    min_group_size : int, default 2
        Groups with fewer scorable rollouts are not eligible.

    Returns
    -------
    labels : ndarray, shape (K,)
        The sorted unique group labels.
    tied : ndarray of bool, shape (K,)
        True for eligible tied groups.
    eligible : ndarray of bool, shape (K,)
        True for groups with at least ``min_group_size`` scorable rollouts.
    """
    r = _as_1d(rewards, "rewards", np.float64)
    g = _as_1d(group_ids, "group_ids")
    if r.shape != g.shape:
        raise ValueError(f"rewards and group_ids must have the same length, got {r.shape[0]} and {g.shape[0]}.")
    if not np.isfinite(atol) or atol < 0:
        raise ValueError(f"atol must be a finite number >= 0, got {atol!r}.")
    if int(min_group_size) < 1:
        raise ValueError(f"min_group_size must be >= 1, got {min_group_size!r}.")
    labels = np.unique(g)
    inv, k = _factorize(g)
    ok = np.isfinite(r)
    count = np.bincount(inv[ok], minlength=k)
    hi = np.full(k, -np.inf)
    lo = np.full(k, np.inf)
    np.maximum.at(hi, inv[ok], r[ok])
    np.minimum.at(lo, inv[ok], r[ok])
    eligible = count >= int(min_group_size)
    tied = eligible & ((hi - lo) <= atol)
    return labels, tied, eligible


def shut_gate_stats(
    rewards,
    group_ids,
    *,
    success_threshold: float = 0.5,
    correct=None,
    atol: float = 0.0,
    min_group_size: int = 2,
) -> ShutGateStats:
    """Measure the shut gate of one batch of groups.

    Parameters
    ----------
    rewards : array_like, shape (N,)
        One reward per rollout (the checker grade when a tie-break blend is in use). NaN = unscorable.
    group_ids : array_like, shape (N,)
        Group (prompt) label per rollout; ragged and non-contiguous groups are fine.
    success_threshold : float, default 0.5
        ``reward >= success_threshold`` counts as correct (ignored when ``correct`` is given).
    correct : array_like of bool, shape (N,), optional
        Explicit correctness per rollout (e.g. from a separate checker).
    atol : float, default 0
        Tie tolerance (see :func:`tied_group_mask`).
    min_group_size : int, default 2
        Minimum scorable rollouts for a group to count.

    Returns
    -------
    ShutGateStats

    Raises
    ------
    ValueError
        Mismatched lengths, non-1-D input, infinite rewards, a non-finite threshold, or negative ``atol``.

    Examples
    --------
    >>> s = shut_gate_stats([1, 1, 0, 0, 0, 1], [0, 0, 1, 1, 2, 2])
    >>> (s.num_tied, s.num_tied_all_right, s.num_tied_all_wrong, s.tied_correct_share)
    (2, 1, 1, 0.6666666666666666)
    """
    r = _as_1d(rewards, "rewards", np.float64)
    g = _as_1d(group_ids, "group_ids")
    if r.shape != g.shape:
        raise ValueError(f"rewards and group_ids must have the same length, got {r.shape[0]} and {g.shape[0]}.")
    if np.isinf(r).any():
        raise ValueError("rewards contain +/-inf; use NaN to mark unscorable rollouts.")
    if not math.isfinite(float(success_threshold)):
        raise ValueError(f"success_threshold must be finite, got {success_threshold!r}.")
    ok = np.isfinite(r)
    if correct is None:
        corr = ok & (r >= float(success_threshold))
    else:
        corr = _as_1d(correct, "correct").astype(bool)
        if corr.shape != r.shape:
            raise ValueError(f"correct must have one flag per rollout ({r.shape[0]}), got {corr.shape[0]}.")
        corr = corr & ok
    labels, tied, eligible = tied_group_mask(r, g, atol=atol, min_group_size=min_group_size)
    inv, k = _factorize(g)
    n_ok = np.bincount(inv[ok], minlength=k)
    n_corr = np.bincount(inv[corr], minlength=k)
    all_right = tied & (n_corr == n_ok)
    all_wrong = tied & (n_corr == 0)
    mixed = tied & ~all_right & ~all_wrong
    n_elig = int(eligible.sum())
    num_correct = int(n_corr[eligible].sum())
    correct_in_tied = int(n_corr[tied].sum())

    def share(a: int, b: int) -> float:
        return a / b if b else float("nan")

    return ShutGateStats(
        num_groups=int((n_ok > 0).sum()),
        num_eligible_groups=n_elig,
        num_singleton_groups=int(((n_ok > 0) & ~eligible).sum()),
        num_tied=int(tied.sum()),
        num_tied_all_right=int(all_right.sum()),
        num_tied_all_wrong=int(all_wrong.sum()),
        num_tied_mixed=int(mixed.sum()),
        num_rollouts=int(n_ok[eligible].sum()),
        num_correct=num_correct,
        num_correct_in_tied=correct_in_tied,
        num_unscorable=int((~ok).sum()),
        tied_share=share(int(tied.sum()), n_elig),
        tied_all_right_share=share(int(all_right.sum()), n_elig),
        tied_all_wrong_share=share(int(all_wrong.sum()), n_elig),
        tied_correct_share=share(correct_in_tied, num_correct),
    )

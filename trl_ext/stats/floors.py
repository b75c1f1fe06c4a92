"""Detection floors: the smallest gap an evaluation can reliably show.

Source: "Measurement Discipline for RLVR" (the project's measurement-practice paper); section numbers below refer
to it unless its companion piece "Same RL Recipe, Different Seed, Different Verdict" is named.

- Accuracy detection floor, section 1 ("smallest reliable gap = 2.80 x sqrt(2 p (1 - p) / N)") with the unrounded
  constant of section 2, ``z_{0.975} + z_{0.80} = 1.9600 + 0.8416 = 2.8016``.
- Paired win-share floor, section 6: ``D = 2w - 1``, ``SE(D) = 2 sqrt(w (1 - w) / N)``, floor ``= 2.8016 SE(D)``.
- Margin-to-floor ratio and the significance crossing ``1.96 / 2.80 = 0.70`` (section 1).
- The smallest gap the two-part rule catches 80 % of the time, by the Monte Carlo of the companion piece
  "Same RL Recipe, Different Seed, Different Verdict" (section 4, "Simulate a fourth and a fifth seed"): ``N``
  questions x ``S`` seeds, each (question, seed) casts a vote with probability ``d`` (the measured discordance
  rate), a cast vote favours the better side with probability ``q = 1/2 + g / (2 d)`` so that the accuracy gap is
  ``d (2q - 1) = g``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

from .two_part import binom_two_sided_half

__all__ = [
    "DETECTION_Z",
    "detection_z",
    "detection_floor",
    "paired_detection_floor",
    "win_share_floor",
    "margin_to_floor_ratio",
    "significance_crossing",
    "FloorReading",
    "read_margin",
    "two_part_catch_rate",
    "smallest_detectable_gap",
]


def detection_z(alpha: float = 0.05, power: float = 0.8) -> float:
    """Return ``z_{1 - alpha/2} + z_{power}``, the multiplier of a two-sided minimum detectable effect.

    Parameters
    ----------
    alpha : float
        Two-sided false-alarm rate, in (0, 1). Default 0.05 gives ``z = 1.95996``.
    power : float
        Probability that a true gap of the floor's size is detected, in (0, 1). Default 0.8 gives ``0.84162``.

    Returns
    -------
    float
        ``2.80158...`` at the defaults (the paper's 2.8016, section 2).
    """
    if not (0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be in (0, 1); got {alpha!r}")
    if not (0.0 < power < 1.0):
        raise ValueError(f"power must be in (0, 1); got {power!r}")
    return float(_st.norm.ppf(1.0 - alpha / 2.0) + _st.norm.ppf(power))


#: ``z_{0.975} + z_{0.80}`` = 2.80158 (the paper rounds it to 2.8016, and to 2.80 for display).
DETECTION_Z: float = detection_z()


def _z(alpha: float, power: float, z: float | None) -> float:
    if z is None:
        return detection_z(alpha, power)
    z = float(z)
    if not math.isfinite(z) or z <= 0:
        raise ValueError(f"z must be a positive finite number; got {z!r}")
    return z


def _check_prob(name: str, p, *, open_interval: bool = False) -> np.ndarray:
    arr = np.asarray(p, dtype=float)
    if np.any(~np.isfinite(arr)):
        raise ValueError(f"{name} must be finite; got {p!r}")
    if open_interval:
        if np.any((arr <= 0) | (arr >= 1)):
            raise ValueError(f"{name} must lie strictly inside (0, 1); got {p!r}")
    elif np.any((arr < 0) | (arr > 1)):
        raise ValueError(f"{name} must lie in [0, 1]; got {p!r}")
    return arr


def _check_n(name: str, n) -> np.ndarray:
    arr = np.asarray(n, dtype=float)
    if np.any(~np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be a positive count; got {n!r}")
    return arr


def _out(x: np.ndarray):
    return float(x) if np.ndim(x) == 0 else x


def detection_floor(p, n, *, alpha: float = 0.05, power: float = 0.8, z: float | None = None):
    """Detection floor of an accuracy comparison between two independently evaluated scores.

    Implements section 1 / section 2 of "Measurement Discipline for RLVR"::

        floor = (z_{1-alpha/2} + z_{power}) * sqrt(2 p (1 - p) / N)      (= 2.8016 sqrt(2p(1-p)/N) at the defaults)

    the minimum detectable effect for two scores each measured on ``N`` questions at baseline accuracy ``p``.
    Worked case (section 1, DCPO on AIME24): ``p = 0.4, N = 30`` gives ``0.354`` (35.4 points).

    Parameters
    ----------
    p : float or array_like
        Baseline accuracy in [0, 1] (fraction, not percent). Broadcasts against ``n``.
    n : int or array_like
        Number of questions, > 0.
    alpha, power : float
        Two-sided significance level and the rerun-detection probability; together they set ``z``.
    z : float, optional
        Override the multiplier (e.g. ``2.80`` for the paper's display rounding).

    Returns
    -------
    float or ndarray
        The floor as a fraction (multiply by 100 for points). ``p`` in {0, 1} gives 0: a benchmark every model
        aces (or fails) has no binomial wobble, and the formula says so; the caller should read that as
        "the instrument is saturated", not as "any gap is visible".

    Notes
    -----
    The floor treats the two scores as independent (the census setting). Two scores on a shared question set are
    positively correlated, so the true floor runs lower (section 7); :func:`paired_detection_floor` gives the
    paired version when the discordance rate is known.
    """
    p_arr = _check_prob("p", p)
    n_arr = _check_n("n", n)
    return _out(_z(alpha, power, z) * np.sqrt(2.0 * p_arr * (1.0 - p_arr) / n_arr))


def paired_detection_floor(discordance, n, *, alpha: float = 0.05, power: float = 0.8, z: float | None = None):
    """Detection floor of a paired accuracy difference on a shared question set.

    For paired 0/1 outcomes the per-question difference ``a_i - b_i`` takes values in {-1, 0, 1}; its variance is
    ``d - g^2 <= d`` where ``d`` is the discordance rate (share of questions where exactly one side is right) and
    ``g`` the gap. Using the conservative ``d`` (the null variance, as McNemar's test does)::

        floor = z * sqrt(d / N)

    This is the paired analogue of :func:`detection_floor` (section 7 notes the census floor over-states paired
    floors); for independent scores ``d = 2p(1-p)`` and the two formulas coincide.

    Parameters
    ----------
    discordance : float or array_like
        Share of questions with discordant outcomes, in [0, 1].
    n : int or array_like
        Number of questions, > 0.
    alpha, power, z
        As in :func:`detection_floor`.

    Returns
    -------
    float or ndarray
        Floor as a fraction.
    """
    d = _check_prob("discordance", discordance)
    n_arr = _check_n("n", n)
    return _out(_z(alpha, power, z) * np.sqrt(d / n_arr))


def win_share_floor(n_decided, win_share=0.5, *, alpha: float = 0.05, power: float = 0.8, z: float | None = None):
    """Floor of a paired win-share difference ``D = 2w - 1`` over decided head-to-head trials.

    Section 6 of "Measurement Discipline for RLVR": each decided prompt is one paired trial, ``Var(w) =
    w(1-w)/N``, ``SE(D) = 2 sqrt(w(1-w)/N)`` and::

        floor = (z_{1-alpha/2} + z_{power}) * 2 * sqrt(w (1 - w) / N)

    Worked cases: comparison 1, 86 vs 80 wins over ``N = 166`` decided prompts (``w = 86/166``) gives 0.217
    (21.7 points); comparison 2, 137 vs 122 over ``N = 259`` gives 0.174 (17.4 points).

    Parameters
    ----------
    n_decided : int or array_like
        Number of decided (non-tied) paired trials, > 0. McNemar's discordant pairs are exactly these.
    win_share : float or array_like
        One side's share ``w`` of the decided trials, in [0, 1]. Symmetric: ``w`` and ``1 - w`` give the same floor.
        Default 0.5 (the null), which is also the largest floor for a given ``N``.
    alpha, power, z
        As in :func:`detection_floor`.

    Returns
    -------
    float or ndarray
        Floor in win-share-difference units (a fraction; x100 for points).
    """
    w = _check_prob("win_share", win_share)
    n_arr = _check_n("n_decided", n_decided)
    return _out(_z(alpha, power, z) * 2.0 * np.sqrt(w * (1.0 - w) / n_arr))


def margin_to_floor_ratio(margin, floor):
    """Return ``|margin| / floor`` (section 1, section 2's census column).

    Parameters
    ----------
    margin : float or array_like
        Observed gap, same units as ``floor``. The sign is dropped: the ratio measures size, not direction.
    floor : float or array_like
        A detection floor, > 0.

    Returns
    -------
    float or ndarray
        ``>= 1``: the margin clears its floor. ``< significance_crossing()`` (0.70): below even single-run
        significance. Between: significant once, not reliably repeatable (see :func:`read_margin`).

    Raises
    ------
    ValueError
        If ``floor <= 0`` (a saturated benchmark has no finite ratio: report that instead) or inputs are not finite.
    """
    m = np.asarray(margin, dtype=float)
    f = np.asarray(floor, dtype=float)
    if np.any(~np.isfinite(m)) or np.any(~np.isfinite(f)):
        raise ValueError(f"margin and floor must be finite; got margin={margin!r}, floor={floor!r}")
    if np.any(f <= 0):
        raise ValueError(
            f"floor must be > 0; got {floor!r}. A zero floor means the baseline accuracy is 0 or 1 (no wobble): "
            "the ratio is undefined, report the saturation instead."
        )
    return _out(np.abs(m) / f)


def significance_crossing(*, alpha: float = 0.05, power: float = 0.8) -> float:
    """Ratio at which a margin exactly reaches two-sided significance: ``z_{1-alpha/2} / (z_{1-alpha/2} + z_power)``.

    Section 1: ``1.96 / 2.80 = 0.70``.
    """
    za = float(_st.norm.ppf(1.0 - alpha / 2.0))
    return za / detection_z(alpha, power)


@dataclass(frozen=True)
class FloorReading:
    """How a margin reads against its floor (section 1's three zones)."""

    margin: float
    floor: float
    ratio: float
    zone: str  # "clears floor" | "significant, below floor" | "below significance"

    def describe(self) -> str:
        return f"margin {self.margin:+.4f} / floor {self.floor:.4f} = {self.ratio:.2f} ({self.zone})"


def read_margin(margin: float, floor: float, *, alpha: float = 0.05, power: float = 0.8) -> FloorReading:
    """Classify a margin into section 1's zones: ``ratio >= 1`` clears the floor; ``0.70 <= ratio < 1`` is
    significant on the run that produced it but not reliably repeatable; ``ratio < 0.70`` fails both bars.

    The zone is exact only for the normal approximation the floor is built on; an exact test can disagree near a
    boundary.
    """
    ratio = float(margin_to_floor_ratio(margin, floor))
    cross = significance_crossing(alpha=alpha, power=power)
    if ratio >= 1.0:
        zone = "clears floor"
    elif ratio >= cross:
        zone = "significant, below floor"
    else:
        zone = "below significance"
    return FloorReading(float(margin), float(floor), ratio, zone)


# ----------------------------------------------------------------------------------------------------------------
# Two-part-rule catch rate (Monte Carlo)
# ----------------------------------------------------------------------------------------------------------------


def _check_mc_args(n_questions, n_seeds, discordance, n_sim):
    if int(n_questions) != n_questions or n_questions < 1:
        raise ValueError(f"n_questions must be a positive integer; got {n_questions!r}")
    if int(n_seeds) != n_seeds or n_seeds < 1:
        raise ValueError(f"n_seeds must be a positive integer; got {n_seeds!r}")
    if not (0.0 < float(discordance) <= 1.0):
        raise ValueError(
            f"discordance must be in (0, 1]; got {discordance!r}. With no discordant questions no gap can be "
            "detected (and none exists): there is nothing to simulate."
        )
    if int(n_sim) != n_sim or n_sim < 10:
        raise ValueError(f"n_sim must be an integer >= 10; got {n_sim!r}")


def _simulate_calls(gaps, n_questions, n_seeds, discordance, alpha, n_sim, seed, require_unanimity):
    """Catch rate of the two-part rule for each gap, with common random numbers across gaps."""
    d = float(discordance)
    out = []
    # Chunk the simulations to bound memory (at most ~4e6 uniforms alive at once). The uniforms are regenerated from
    # the same seed for every gap (common random numbers) rather than stored: storing every chunk made memory grow as
    # 16 bytes x n_sim x S x N (320 MB at N = 2000, 5 seeds, n_sim = 2000) despite the chunking.
    chunk = max(1, int(4_000_000 // (2 * n_seeds * n_questions)))

    def uniform_chunks():
        rng = np.random.default_rng(seed)
        done = 0
        while done < n_sim:
            m = min(chunk, n_sim - done)
            yield rng.random((m, n_seeds, n_questions)), rng.random((m, n_seeds, n_questions))
            done += m

    for g in np.atleast_1d(np.asarray(gaps, dtype=float)):
        q = 0.5 + g / (2.0 * d)
        if not (0.0 <= q <= 1.0):
            raise ValueError(f"gap {g!r} is impossible at discordance {d!r}: |gap| must be <= discordance")
        calls = 0
        for u1, u2 in uniform_chunks():
            v = np.where(u1 < d, np.where(u2 < q, 1, -1), 0).astype(np.int32)
            net = v.sum(axis=2)  # (m, S) per-seed wins - losses
            qv = np.sign(v.sum(axis=1))  # (m, N) per-question majority vote
            ka = (qv > 0).sum(axis=1)
            kb = (qv < 0).sum(axis=1)
            p = binom_two_sided_half(ka, ka + kb)
            call = (p < alpha) & (ka > kb)
            if require_unanimity:
                call &= (net > 0).all(axis=1)
            calls += int(call.sum())
        out.append(calls / n_sim)
    return np.asarray(out)


def two_part_catch_rate(
    gap,
    n_questions: int,
    n_seeds: int,
    discordance: float,
    *,
    alpha: float = 0.05,
    n_sim: int = 2000,
    seed: int = 0,
    require_unanimity: bool = True,
):
    """Probability that :func:`~trl_ext.stats.two_part.two_part_rule` calls the truly better side.

    Monte Carlo of "Measurement Discipline for RLVR" (sections 3-5 of its companion piece "Same RL Recipe, Different
    Seed, Different Verdict", "Simulate a fourth and a fifth seed"): each of ``n_questions x n_seeds`` (question,
    seed) cells casts a vote with probability ``d`` and, when it does, favours the better side with probability
    ``q = 1/2 + gap / (2 d)`` (so the expected accuracy gap is ``d (2q - 1) = gap``). Each question's vote is the
    sign of the sum of its seeds' votes; the rule calls a win when the exact two-sided binomial test on those votes
    has ``p < alpha`` in the right direction and (if ``require_unanimity``) every seed's net is positive. Reference
    values from the paper, at ``d = 0.226``, ``N = 500``, 3 seeds: catch rate about 0.58 at a 3-point gap; 80 % at
    about 3.8 points; at ``N = 1319``, ``d = 0.2223``: 0.945 (3 points) and 0.654 (2 points).

    Parameters
    ----------
    gap : float or array_like
        True accuracy gap(s) as fractions, ``0 <= gap <= discordance``.
    n_questions, n_seeds : int
        Shape of the comparison.
    discordance : float
        Per-seed share of questions whose verdict differs between the two sides, in (0, 1].
    alpha : float
        Significance level of the pooled test.
    n_sim : int
        Number of simulated reruns (Monte Carlo SE about ``sqrt(r(1-r)/n_sim)``).
    seed : int
        RNG seed; the same uniforms are reused for every gap (common random numbers), so the rate is monotone in
        the gap up to ties.
    require_unanimity : bool
        ``False`` scores pooled significance alone.

    Returns
    -------
    float or ndarray
        Catch rate(s) in [0, 1], shaped like ``gap``.
    """
    _check_mc_args(n_questions, n_seeds, discordance, n_sim)
    rates = _simulate_calls(gap, int(n_questions), int(n_seeds), discordance, alpha, int(n_sim), seed,
                            require_unanimity)
    return float(rates[0]) if np.ndim(gap) == 0 else rates


def smallest_detectable_gap(
    n_questions: int,
    n_seeds: int,
    discordance: float,
    *,
    power: float = 0.8,
    alpha: float = 0.05,
    n_sim: int = 2000,
    seed: int = 0,
    require_unanimity: bool = True,
    tol: float = 5e-4,
) -> float:
    """Smallest true accuracy gap the two-part rule calls with probability ``>= power``.

    Bisection on :func:`two_part_catch_rate` (common random numbers, so the catch rate is a monotone step function
    of the gap). Paper reference (companion piece "Same RL Recipe, Different Seed, Different Verdict", section 4):
    ``N = 500``, ``d = 0.226``: 3.83 points at 3 seeds, 3.79 at 5 seeds. With a single seed the unanimity half is
    trivially satisfied, so the result reduces to a single-run paired test; note that
    :func:`~trl_ext.stats.two_part.two_part_rule` itself refuses to call a winner from one seed.

    Parameters
    ----------
    n_questions, n_seeds, discordance, alpha, n_sim, seed, require_unanimity
        As in :func:`two_part_catch_rate`.
    power : float
        Target catch rate, in (0, 1).
    tol : float
        Absolute tolerance on the gap (fraction).

    Returns
    -------
    float
        The gap as a fraction. ``math.inf`` if even ``gap = discordance`` (every discordant vote for one side) is
        caught less often than ``power``: the setup cannot reach the target power at any gap.
    """
    _check_mc_args(n_questions, n_seeds, discordance, n_sim)
    if not (0.0 < power < 1.0):
        raise ValueError(f"power must be in (0, 1); got {power!r}")
    args = (int(n_questions), int(n_seeds), discordance, alpha, int(n_sim), seed, require_unanimity)
    lo, hi = 0.0, float(discordance)
    if _simulate_calls([hi], *args)[0] < power:
        return math.inf
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if _simulate_calls([mid], *args)[0] >= power:
            hi = mid
        else:
            lo = mid
    return hi

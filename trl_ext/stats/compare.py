"""Compare two configurations' per-question outcomes over several seeds (the engine behind ``trl-ext compare``).

Everything reported, and the section of "Measurement Discipline for RLVR" (the project's measurement-practice
paper) behind it:

- the two-part rule verdict (section 5 step 1, checklist item 4) on per-question ``correct`` (or ``pass_rate``);
- the margin (``mean_a - mean_b`` averaged over seeds) with a question-resampling paired bootstrap interval;
- per-seed McNemar counts with exact p-values;
- the detection floor ``2.8016 sqrt(2p(1-p)/N)`` at ``p`` = configuration b's accuracy (b is the baseline), the
  margin-to-floor ratio and its zone (section 1), and the paired floor ``2.8016 sqrt(d/N)`` at the measured
  discordance ``d``;
- the smallest gap the two-part rule would catch 80 % of the time at this ``N``, seed count and measured ``d``
  (Monte Carlo of section 4 of the paper's companion piece "Same RL Recipe, Different Seed, Different Verdict");
- the length-residualized difference (section 5 step 4) when ``completion_tokens`` is present.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .floors import detection_floor, paired_detection_floor, read_margin, smallest_detectable_gap
from .length import length_residualized_difference
from .outcomes import align_runs, pair_seed_files, read_outcomes
from .paired import mcnemar_counts, paired_bootstrap_ci
from .two_part import two_part_rule

__all__ = ["compare_outcome_files", "format_report"]


def compare_outcome_files(
    files_a: Sequence[str],
    files_b: Sequence[str],
    *,
    intersect: bool = False,
    score: str = "correct",
    alpha: float = 0.05,
    power: float = 0.8,
    n_boot: int = 5000,
    n_sim: int = 1000,
    seed: int = 0,
) -> dict:
    """Read, pair, align and compare two configurations' outcome files. Returns a JSON-serialisable report.

    Parameters
    ----------
    files_a, files_b : sequence of str
        One outcomes JSONL per seed for each configuration (paired by ``seedN`` path component, else by sort order;
        see :func:`~trl_ext.stats.outcomes.pair_seed_files`). ``b`` is treated as the baseline for the floor.
    intersect : bool
        Compare on the common question ids instead of failing on mismatched question sets.
    score : {"correct", "pass_rate"}
        Per-question outcome the verdict uses (``pass_rate`` differences are signed per question).
    alpha, power : float
        Significance level and the power the floors / smallest gap are computed at.
    n_boot, n_sim, seed : int
        Bootstrap replicates, Monte Carlo reruns for the smallest gap, RNG seed.
    """
    if score not in ("correct", "pass_rate"):
        raise ValueError(f"score must be 'correct' or 'pass_rate'; got {score!r}")
    pairs, ra, rb, align_report = _read_aligned(files_a, files_b, intersect)
    labels = [lab for lab, _, _ in pairs]
    n_q, n_s = len(ra[0]), len(pairs)
    sa, sb = _block(ra, score), _block(rb, score)
    if np.any(np.isnan(sa)) or np.any(np.isnan(sb)):
        raise ValueError(f"score {score!r} is missing from some records; use --score correct or add the field")
    ca, cb = _block(ra, "correct"), _block(rb, "correct")
    verdict = two_part_rule(sa, sb, alpha=alpha, seed_labels=labels)
    margin = float(np.mean(sa.mean(axis=1) - sb.mean(axis=1)))
    ci = paired_bootstrap_ci(sa, sb, n_boot=n_boot, seed=seed)
    mcn = [mcnemar_counts(ca[i], cb[i]) for i in range(n_s)]
    discordance = float(np.mean([m.discordance for m in mcn]))
    baseline = float(cb.mean())
    floor = float(detection_floor(baseline, n_q, power=power, alpha=alpha))
    floor_paired = float(paired_detection_floor(discordance, n_q, power=power, alpha=alpha))
    reading = read_margin(margin, floor, alpha=alpha, power=power) if floor > 0 else None
    if discordance > 0:
        gap = smallest_detectable_gap(n_q, n_s, discordance, power=power, alpha=alpha, n_sim=n_sim, seed=seed)
    else:
        gap = math.inf

    report = {
        "n_questions": n_q,
        "n_seeds": n_s,
        "score": score,
        "pairs": [{"label": lab, "a": fa, "b": fb} for lab, fa, fb in pairs],
        "alignment": align_report,
        "verdict": verdict.to_dict(),
        "margin": margin,
        "margin_ci": {"low": ci.low, "high": ci.high, "level": ci.level, "n_boot": ci.n_boot},
        "mean_a": float(sa.mean()),
        "mean_b": float(sb.mean()),
        "per_seed_mcnemar": [
            {"label": lab, "both": m.both, "a_only": m.a_only, "b_only": m.b_only, "neither": m.neither,
             "difference": m.difference, "p_value": m.p_value}
            for lab, m in zip(labels, mcn)
        ],
        "discordance": discordance,
        "baseline_accuracy": baseline,
        "detection_floor": floor,
        "paired_detection_floor": floor_paired,
        "margin_to_floor_ratio": None if reading is None else reading.ratio,
        "margin_zone": None if reading is None else reading.zone,
        "margin_to_paired_floor_ratio": abs(margin) / floor_paired if floor_paired > 0 else None,
        "smallest_detectable_gap": None if math.isinf(gap) else gap,
        # with one seed the two-part rule never calls a winner; the gap is then that of a single-run paired test
        "smallest_detectable_gap_rule": "two_part_rule" if n_s > 1 else "single_seed_paired_test",
        "power": power,
        "alpha": alpha,
    }
    report.update(_length_fields(sa, sb, _block(ra, "completion_tokens"), _block(rb, "completion_tokens")))
    return report


def _read_aligned(files_a: Sequence[str], files_b: Sequence[str], intersect: bool):
    """``(pairs, runs_a, runs_b, alignment report)``: the outcome files paired by seed, read and aligned by
    question (``runs_a[i]`` / ``runs_b[i]`` are seed pair ``i``)."""
    pairs = pair_seed_files(files_a, files_b)
    runs = []
    for _, fa, fb in pairs:
        runs += [read_outcomes(fa), read_outcomes(fb)]
    aligned, align_report = align_runs(runs, intersect=intersect)
    return pairs, aligned[0::2], aligned[1::2], align_report


def _block(runs, attr: str) -> np.ndarray:
    """``(n_seeds, n_questions)`` array of one outcome field of aligned runs."""
    return np.stack([getattr(r, attr) for r in runs])


def _length_fields(sa: np.ndarray, sb: np.ndarray, ta: np.ndarray, tb: np.ndarray) -> dict:
    """The report's ``length_residualized`` and ``length_note`` (section 5 step 4) from the scores ``sa``/``sb``
    and the completion lengths ``ta``/``tb``."""
    out: dict = {}
    if np.any(np.isnan(ta)) or np.any(np.isnan(tb)):
        out["length_residualized"] = None
        out["length_note"] = "completion_tokens missing from some records: length residualization skipped"
    elif sa.size < 3:
        out["length_residualized"] = None
        out["length_note"] = "fewer than 3 question-seed pairs: length residualization skipped"
    else:
        lr = length_residualized_difference(sa, sb, ta, tb)
        out["length_residualized"] = lr.to_dict()
        if not lr.slope_identified:
            out["length_note"] = "length differences are constant across pairs: slope not identifiable"
        elif lr.slope > 0:
            out["length_note"] = "positive length slope: the residualized difference is the primary reading"
        else:
            out["length_note"] = ("length slope <= 0: the paper residualizes only where the slope is positive "
                                  "(section 5 step 4), so the raw margin stays the primary reading")
    return out


def _pts(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f} pts"


def format_report(r: dict) -> str:
    """Human-readable rendering of :func:`compare_outcome_files`'s report."""
    v = r["verdict"]
    out = [f"trl-ext compare: {r['n_seeds']} seed(s) x {r['n_questions']} questions, score = {r['score']}"]
    for side in ("a", "b"):
        files = [p[side] for p in r["pairs"]]
        more = f" (+{len(files) - 1} more)" if len(files) > 1 else ""
        out.append(f"  {side}{' (baseline)' if side == 'b' else ''}: {files[0]}{more}")
    dropped = r["alignment"]["dropped"]
    if dropped:
        out.append(f"  --intersect: kept {r['alignment']['n_common']} common questions; dropped "
                   + ", ".join(f"{len(ids)} from {p}" for p, ids in dropped.items()))
    out.append("")
    out.append(f"VERDICT: {v['status'].upper()}" + (f" -> {v['winner']}" if v["winner"] else ""))
    out.append(f"  {v['reason']}")
    out.append(f"  pooled question votes: a {v['votes_a']} / b {v['votes_b']} / abstain {v['abstain']}, "
               f"exact binomial p = {v['pooled_p_value']:.4g}")
    for s, m in zip(v["seeds"], r["per_seed_mcnemar"]):
        name = s["label"] if s["label"].startswith("seed") else f"seed {s['label']}"
        out.append(f"  {name}: mean a {s['mean_a']:.4f} vs b {s['mean_b']:.4f}, wins a {s['a_wins']} / "
                   f"b {s['b_wins']} / tie {s['ties']} (net {s['net']:+d}), McNemar p = {m['p_value']:.4g}")
    out.append("")
    ci = r["margin_ci"]
    out.append(f"margin (a - b): {_pts(r['margin'])}  [{int(100 * ci['level'])}% paired bootstrap "
               f"{_pts(ci['low'])} .. {_pts(ci['high'])}]")
    out.append(f"detection floor (p = {r['baseline_accuracy']:.3f}, N = {r['n_questions']}): "
               f"{_pts(r['detection_floor'])}")
    if r["margin_to_floor_ratio"] is None:
        out.append("margin-to-floor ratio: undefined (baseline accuracy is 0 or 1: saturated benchmark)")
    else:
        out.append(f"margin-to-floor ratio: {r['margin_to_floor_ratio']:.2f} ({r['margin_zone']})")
    out.append(f"paired floor (discordance {r['discordance']:.3f}): {_pts(r['paired_detection_floor'])}")
    gap = r["smallest_detectable_gap"]
    who = ("the two-part rule catches" if r["n_seeds"] > 1 else
           "a single-seed paired test catches (the two-part rule itself needs >= 2 seeds)")
    out.append(
        f"smallest gap {who} {int(100 * r['power'])}% of the time here "
        f"({r['n_seeds']} seeds, N = {r['n_questions']}, discordance {r['discordance']:.3f}): "
        + (_pts(gap) if gap is not None else "not computable (no discordant questions: the runs never disagree)"
           if r["discordance"] == 0 else "not reachable at any gap")
    )
    if r["score"] != "correct":
        out.append("  (floors, discordance and the smallest gap are computed from the 0/1 'correct' field)")
    lr = r.get("length_residualized")
    if lr is not None:
        out.append(f"length-residualized difference: {_pts(lr['difference'])} (SE {_pts(lr['difference_se'])}), "
                   f"slope {lr['slope']:+.4g} per token, R^2 {lr['r_squared']:.2f}")
    if r.get("length_note"):
        out.append(f"  note: {r['length_note']}")
    return "\n".join(out)

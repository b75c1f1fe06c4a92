"""How many seeds, questions and evaluation samples a comparison needs to resolve a given AUC gap.

The regime benchmark must resolve an equal-token AUC difference against GRPO G = 8 to about +-5 points (two-level
95 % interval half-width). This script calibrates a two-component variance model on a finished benchmark's
per-question outcomes and predicts the half-width of any design (seeds S, held-out questions Q, samples per question
M):

* (P1) a run's AUC is linear in its per-question outcomes, ``AUC = a_0 (1 - sum_j w_j) + sum_j w_j acc_j`` (eq. C1
  of ``trl_ext.stats.curves``; ``w_j`` from the trapezoid over the checkpoints; ``a_0`` the shared start
  checkpoint's accuracy, whose weight depends on where a run's checkpoints fall, so it does not cancel in a
  difference between runs with different checkpoint token counts; it carries no evaluation noise of its own);
* (P2) evaluation noise of one run given its trained checkpoints, with M independent samples per question:
  ``var_E = sum_j w_j^2 sum_q p_jq (1 - p_jq) / (M Q^2)``, with ``sum_q p_jq (1 - p_jq) = h Q pbar_j (1 - pbar_j)``:
  ``h <= 1`` is the heterogeneity factor (the mean unbiased per-question ``p (1 - p)`` over ``pbar (1 - pbar)``,
  read from the benchmark's value table, several samples per prompt; ``h = 1`` is the upper bound);
* (P3) the per-seed paired difference ``d_s = AUC_A,s - AUC_B,s`` has variance ``var_T + var_E,A + var_E,B``;
  ``var_T`` (training randomness, which more evaluation cannot remove) is the pooled across-seed variance of
  ``d_s`` over every method paired with the baseline, minus the evaluation part at the runs' own ``M0`` samples per
  question (``settings.test_eval_samples`` in ``runs.json``, 1 when absent);
* (P4) ``half-width(S, Q, M) = z_0.975 sqrt((var_T + var_E(Q0, 1) (Q0 / Q) / M) / S)``;
* (P5) unpaired seeds (each method's seeds resampled on their own, ``two_level_auc_difference(paired_seeds=False)``)
  with ``S_A`` seeds of a method and ``S_B`` of the baseline: ``half-width = z_0.975 sqrt(var_A / S_A + var_B / S_B)``,
  ``var_A``, ``var_B`` the across-seed variances of each method's AUC at the runs' design (training and evaluation
  noise together). Pairing by seed gains ``2 cov_AB / S`` only where the seeds move both methods alike; where they
  do not (correlation near 0) the noisier method's seeds are the cheap ones: the baseline seeds that reach a target
  at ``S_A`` are ``ceil(var_B / ((target / z)^2 - var_A / S_A))`` (none suffice while ``var_A / S_A`` alone is over).

The calibration's own check: P4 at the benchmark's design against its committed two-level intervals
(``curves.json``). Usage::

    python benchmarks/regime_power.py --runs_json benchmarks/results/compare/smollm2/sum3/runs.json \\
        --baseline grpo_g8 --output benchmarks/results/compare/smollm2/power_design.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

Z = 1.959963984540054


def auc_weights(tokens: np.ndarray, budget: float) -> np.ndarray:
    """P1: the weight of each checkpoint's accuracy in the run's AUC (start checkpoint at t = 0 excluded)."""
    from trl_ext.stats.curves import curve_auc

    w = np.zeros(len(tokens))
    for j in range(len(tokens)):
        e = np.zeros(len(tokens))
        e[j] = 1.0
        w[j] = curve_auc(tokens, e, budget, start_value=0.0)
    return w


def heterogeneity(value_table: str | None) -> tuple[float, int]:
    """``(h, prompts)``: mean unbiased ``p (1 - p)`` per prompt over ``pbar (1 - pbar)`` (1.0 without a table)."""
    if not value_table:
        return 1.0, 0
    from trl_ext.priors.table_file import load_value_table

    t = load_value_table(value_table)
    per, means = [], []
    for k in t.keys():
        r = np.asarray(t.get(k).rewards, dtype=float)
        r = r[np.isfinite(r)]
        n = r.size
        if n < 2:
            continue
        s = r.sum()
        per.append(s * (n - s) / (n * (n - 1)))  # unbiased for p (1 - p) (binary rewards)
        means.append(r.mean())
    pbar = float(np.mean(means))
    return float(np.mean(per) / (pbar * (1 - pbar))), len(per)


def training_variance(var_d: float, var_eval_per_sample: float, eval_samples: int) -> float:
    """P3 solved for ``var_T``: the pooled variance of the paired differences less their evaluation part, which the
    runs' own evaluations averaged over ``eval_samples`` samples per question (clipped at 0)."""
    return max(var_d - var_eval_per_sample / eval_samples, 0.0)


def calibrate(runs_json: str, baseline: str, value_table: str | None, start_term: bool = True,
              budget: float | None = None) -> dict:
    """P1-P3 on a finished benchmark. ``start_term``: each run's AUC includes the start checkpoint's share
    ``a_0 (1 - sum_j w_j)``, which differs between runs whose first checkpoint or last step falls at different token
    counts (a DAPO refill, a V0.5 OSLA step) and so does not cancel in a difference; ``False`` reproduces the
    records written before it was counted (``power_design.json``, the five-seed ``power_check.json``). ``budget``:
    the AUC's token budget (default: the smallest last checkpoint of any run)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from trl_ext.stats.curves_cli import question_level_arrays

    arrays, start, qids = question_level_arrays(runs_json, None)
    a0 = float(np.mean(start)) if start_term and start is not None else 0.0
    q0 = len(qids)
    with open(runs_json, encoding="utf-8") as f:  # samples per question of the runs' evaluations (M0)
        m0 = int((json.load(f).get("settings") or {}).get("test_eval_samples") or 1)
    if budget is None:  # the largest budget every run reaches
        budget = min(float(t[:, -1].min()) for _, t, _ in arrays.values())
    h, n_prompts = heterogeneity(value_table)
    b_o, b_t, b_seeds = arrays[baseline]

    def run_auc_and_var_e(o: np.ndarray, tok: np.ndarray) -> tuple[float, float]:
        w = auc_weights(tok, budget)
        acc = o.mean(axis=1)
        var_e = float(np.sum(w ** 2 * h * acc * (1 - acc)) / q0)  # P2 with M = 1
        return float(np.dot(w, acc) + a0 * (1.0 - w.sum())), var_e  # the start is shared: no evaluation noise

    auc_per_seed = {m: {int(seed): run_auc_and_var_e(o[s], t[s])[0] for s, seed in enumerate(seeds)}
                    for m, (o, t, seeds) in arrays.items()}
    pairs, dev2, dof, var_e_pairs, n_paired = {}, 0.0, 0, [], 0
    b_index = {int(seed): i for i, seed in enumerate(b_seeds)}
    for m, (o, t, seeds) in arrays.items():
        # paired on the seeds both sides have (the baseline may have extra seeds, --extra_seeds: not in the pairs)
        shared = [(s, b_index[int(seed)]) for s, seed in enumerate(seeds) if int(seed) in b_index]
        if m == baseline or len(shared) < 2:
            continue
        d, ve = [], []
        for s, bs in shared:
            a_auc, a_ve = run_auc_and_var_e(o[s], t[s])
            b_auc, b_ve = run_auc_and_var_e(b_o[bs], b_t[bs])
            d.append(a_auc - b_auc)
            ve.append(a_ve + b_ve)
        n_paired = max(n_paired, len(shared))
        d = np.asarray(d)
        pairs[m] = {"d_per_seed": d.tolist(), "d_mean": float(d.mean()), "d_var": float(d.var(ddof=1)),
                    "var_eval": float(np.mean(ve))}
        dev2 += float(((d - d.mean()) ** 2).sum())
        dof += d.size - 1
        var_e_pairs.append(float(np.mean(ve)))
    var_d = dev2 / dof
    var_e = float(np.mean(var_e_pairs))  # per single evaluation sample (P2 with M = 1)
    var_t = training_variance(var_d, var_e, m0)
    return {"runs_json": os.path.relpath(runs_json), "baseline": baseline, "budget": budget, "n_questions": q0,
            "n_seeds": n_paired, "start_term": start_term, "start_accuracy": a0, "heterogeneity_h": h, "heterogeneity_prompts": n_prompts,
            "eval_samples": m0, "var_d_pooled": var_d, "var_d_dof": dof, "var_eval": var_e, "var_train": var_t,
            "eval_share": var_e / m0 / var_d if var_d > 0 else math.nan, "pairs": pairs,
            "auc_per_seed": auc_per_seed}


def half_width(cal: dict, seeds: int, questions: int | None, samples: int) -> float:
    """P4 (``questions=None``: evaluation noise removed entirely)."""
    ve = 0.0 if questions is None else cal["var_eval"] * cal["n_questions"] / questions / samples
    return Z * math.sqrt((cal["var_train"] + ve) / seeds)


def seeds_needed(cal: dict, target: float, questions: int | None, samples: int) -> int:
    ve = 0.0 if questions is None else cal["var_eval"] * cal["n_questions"] / questions / samples
    return int(math.ceil((Z / target) ** 2 * (cal["var_train"] + ve)))


def seed_components(auc_per_seed: dict[str, dict[int, float]], baseline: str) -> dict:
    """Each method's across-seed AUC variance (ddof 1), the baseline's, and their covariance and correlation over the
    seeds both have (P5); methods with fewer than 2 seeds are left out, as are the covariance and correlation where
    fewer than 3 seeds are shared."""
    b = auc_per_seed[baseline]
    var_b = float(np.var(list(b.values()), ddof=1)) if len(b) > 1 else math.nan
    out = {}
    for m, a in auc_per_seed.items():
        if len(a) < 2:
            continue
        shared = sorted(set(a) & set(b))
        rec = {"seeds": len(a), "auc_mean": float(np.mean(list(a.values()))),
               "var": float(np.var(list(a.values()), ddof=1)), "var_baseline": var_b, "baseline_seeds": len(b),
               "shared_seeds": len(shared), "cov_baseline": None, "corr_baseline": None}
        if m != baseline and len(shared) >= 3:
            x, y = np.array([a[s] for s in shared]), np.array([b[s] for s in shared])
            rec["cov_baseline"] = float(np.cov(x, y, ddof=1)[0, 1])
            sd = float(x.std(ddof=1) * y.std(ddof=1))
            rec["corr_baseline"] = rec["cov_baseline"] / sd if sd > 0 else None
        out[m] = rec
    return out


def unpaired_half_width(var_a: float, seeds_a: int, var_b: float, seeds_b: int) -> float:
    """P5: ``z sqrt(var_A / S_A + var_B / S_B)``."""
    return Z * math.sqrt(var_a / seeds_a + var_b / seeds_b)


def baseline_seeds_needed(var_a: float, seeds_a: int, var_b: float, target: float) -> int | None:
    """P5: the fewest baseline seeds whose unpaired half-width with ``seeds_a`` seeds of the method is ``<= target``;
    ``None`` when the method's own term ``var_A / S_A`` alone exceeds ``(target / z)^2``."""
    room = (target / Z) ** 2 - var_a / seeds_a
    if room <= 0:
        return None
    return max(2, int(math.ceil(var_b / room - 1e-9)))


def unbalanced_designs(components: dict, baseline: str, target: float, seeds_a: tuple[int, ...] = (10,)) -> dict:
    """Per method (P5, from :func:`seed_components`): the paired and unpaired half-widths at its own seeds, and the
    baseline seeds that reach ``target`` with its seeds and with each of ``seeds_a``."""
    out = {}
    for m, c in components.items():
        if m == baseline or not math.isfinite(c["var_baseline"]):
            continue
        s = c["seeds"]
        rec = {"seeds": s, "var": c["var"], "var_baseline": c["var_baseline"], "corr_baseline": c["corr_baseline"],
               "unpaired_half_width": unpaired_half_width(c["var"], s, c["var_baseline"], c["baseline_seeds"]),
               "baseline_seeds_for_target": {str(k): baseline_seeds_needed(c["var"], k, c["var_baseline"], target)
                                             for k in sorted({s, *seeds_a})},
               "own_seeds_for_target_with_any_baseline": int(math.ceil(c["var"] * (Z / target) ** 2 - 1e-9))}
        if c["cov_baseline"] is not None and c["shared_seeds"] == s == c["baseline_seeds"]:
            rec["paired_half_width"] = Z * math.sqrt(max(0.0, c["var"] + c["var_baseline"] - 2 * c["cov_baseline"])
                                                     / s)
        out[m] = rec
    return out


def baseline_seed_rule(unbalanced: dict, baseline: str, method_seeds: int, baseline_seeds: int,
                       cap: int = 30) -> dict:
    """The amended seed rule (docs/results.md, fixed before any seed 6-9 result was read), from P5's designs.

    Each method's count is the baseline seeds that bring its unpaired half-width to the target with ``method_seeds``
    seeds of its own (``baseline_seeds_for_target[str(method_seeds)]`` of :func:`unbalanced_designs`). The baseline
    runs to ``N`` seeds, the largest count that is at most ``cap`` (never fewer than it has); a method whose count is
    ``None`` (no number suffices) or over ``cap`` is named not resolved. The rule reads the spreads only: no
    difference's sign or size enters it.

    Returns
    -------
    dict
        ``baseline_seeds`` (``N``), ``extra_seeds`` (the seed indices ``baseline_seeds .. N - 1``, empty when none are
        needed), ``extra_seeds_arg`` (``"<baseline>=<first>-<last>"`` for ``compare_trainers.py --extra_seeds``, or
        ``None``), ``counts`` (method -> count), ``expected_resolved`` and ``not_resolved`` (sorted method lists).

    Raises
    ------
    ValueError
        When a method has no design at ``method_seeds`` seeds (run :func:`unbalanced_designs` with it in
        ``seeds_a``).
    """
    key = str(method_seeds)
    counts = {}
    for m, u in unbalanced.items():
        if key not in u["baseline_seeds_for_target"]:
            raise ValueError(f"{m}: no P5 design at {method_seeds} seeds of its own; pass seeds_a=({method_seeds},) to "
                             "unbalanced_designs")
        counts[m] = u["baseline_seeds_for_target"][key]
    within = {m: c for m, c in counts.items() if c is not None and c <= cap}
    n = max([baseline_seeds, *within.values()])
    extra = list(range(baseline_seeds, n))
    return {"cap": cap, "method_seeds": method_seeds, "baseline": baseline, "baseline_seeds": n,
            "extra_seeds": extra,
            "extra_seeds_arg": f"{baseline}={extra[0]}-{extra[-1]}" if extra else None,
            "counts": counts, "expected_resolved": sorted(within), "not_resolved": sorted(set(counts) - set(within))}


def finite_interval(ci) -> bool:
    """A two-level interval with both ends finite (``trl-ext curves`` writes ``[None, None]`` where the two sides'
    seed sets differ and no paired interval exists)."""
    return bool(ci) and all(x is not None and math.isfinite(x) for x in ci)


def method_half_widths(curves: dict, baseline: str, target: float) -> dict:
    """Each method's realised two-level half-width of its AUC difference against ``baseline`` (``curves``: the JSON
    of ``trl-ext curves --questions``), and the seeds that would bring it to ``target`` at the same spread.

    With ``S`` seeds and half-width ``hw``, the interval shrinks as ``1 / sqrt(S)`` (P4 with the method's own
    variance): ``seeds_for_target = ceil(S (hw / target)^2)`` (``S`` itself when already met). Methods without a
    finite two-level interval (one seed, no question-level outcomes) are left out; where the seed sets differ
    (an unpaired interval) the scaling needs both sides' seeds: ``seeds_for_target`` is ``None`` there (P5 instead).
    """
    out = {}
    for m, rec in curves["methods"].items():
        ci = rec.get("auc_diff_ci_two_level")
        if m == baseline or not finite_interval(ci):
            continue
        seeds = len(rec.get("seeds") or [])
        hw = (ci[1] - ci[0]) / 2
        paired = rec.get("diff_two_level_paired_seeds", True)
        out[m] = {"seeds": seeds, "auc_diff": rec.get("auc_diff"), "ci_two_level": list(ci), "half_width": hw,
                  "meets_target": hw <= target, "paired_seeds": paired,
                  "seeds_for_target": seeds if hw <= target else (
                      int(math.ceil(seeds * (hw / target) ** 2 - 1e-9)) if paired else None)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs_json", required=True)
    p.add_argument("--baseline", default="grpo_g8")
    p.add_argument("--value_table", default=None, help="the benchmark's value table (heterogeneity factor h)")
    p.add_argument("--curves_json", default=None, help="committed two-level intervals to check P4 against")
    p.add_argument("--target", type=float, default=0.05, help="half-width to reach (AUC, fraction)")
    p.add_argument("--without_start_term", action="store_true",
                   help="leave the start checkpoint's share out of each run's AUC, as the records written before it "
                        "was counted did (power_design.json, the five-seed power_check.json)")
    p.add_argument("--method_seeds", type=int, default=10,
                   help="each method's own seeds in the amended seed rule (the baseline's extra seeds, P5)")
    p.add_argument("--seed_cap", type=int, default=30, help="the most baseline seeds the amended seed rule allows")
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    cal = calibrate(args.runs_json, args.baseline, args.value_table, start_term=not args.without_start_term)
    designs = []
    for q, m in ((cal["n_questions"], cal["eval_samples"]), (48, 1), (48, 4), (48, 8), (192, 1), (None, 1)):
        row = {"questions": q, "samples": m, "seeds_needed": seeds_needed(cal, args.target, q, m)}
        row.update({f"hw_S{s}": half_width(cal, s, q, m) for s in (3, 5, 8, 10)})
        designs.append(row)
    check = {}
    if args.curves_json:
        with open(args.curves_json, encoding="utf-8") as f:
            cur = json.load(f)
        pred = half_width(cal, cal["n_seeds"], cal["n_questions"], cal["eval_samples"])
        for m, rec in cur["methods"].items():
            ci = rec.get("auc_diff_ci_two_level")
            if m != args.baseline and finite_interval(ci):
                check[m] = {"committed_half_width": (ci[1] - ci[0]) / 2, "predicted_half_width": pred}
        per_method = method_half_widths(cur, args.baseline, args.target)
        for m, r in per_method.items():
            check[m].update(seeds=r["seeds"], seeds_for_target=r["seeds_for_target"],
                            meets_target=r["meets_target"])
    # the other bound: evaluation noise common to both methods of a seed (the harness samples every method's
    # evaluation with the same seed) cancels in d_s, all of var(d) is training and more evaluation does not help
    pessimistic = {f"hw_S{s}": Z * math.sqrt(cal["var_d_pooled"] / s) for s in (3, 5, 6, 8, 10)}
    components = seed_components(cal["auc_per_seed"], args.baseline)
    unbalanced = unbalanced_designs(components, args.baseline, args.target, seeds_a=(10, args.method_seeds))
    rule = (baseline_seed_rule(unbalanced, args.baseline, args.method_seeds, components[args.baseline]["seeds"],
                               args.seed_cap) if args.baseline in components else None)
    out = {"calibration": cal, "target_half_width": args.target, "designs": designs, "check": check,
           "if_evaluation_noise_cancels": pessimistic, "seed_components": components, "unbalanced": unbalanced,
           "seed_rule": rule,
           "command": "python " + " ".join([os.path.relpath(__file__), *(argv if argv is not None else sys.argv[1:])])}
    print(f"calibration on {cal['runs_json']} ({cal['n_seeds']} seeds, {cal['n_questions']} questions, "
          f"{cal['eval_samples']} sample(s) each): var(d) {cal['var_d_pooled']:.5f} ({cal['var_d_dof']} dof) = train "
          f"{cal['var_train']:.5f} + eval {cal['var_eval'] / cal['eval_samples']:.5f} (per sample {cal['var_eval']:.5f}; "
          f"eval share {cal['eval_share']:.2f}; h = {cal['heterogeneity_h']:.2f})")
    for r in designs:
        q = "no eval noise" if r["questions"] is None else f"Q {r['questions']} x M {r['samples']}"
        print(f"  {q:>16}: half-width S=3 {r['hw_S3']:.3f}  S=5 {r['hw_S5']:.3f}  S=8 {r['hw_S8']:.3f}  "
              f"S=10 {r['hw_S10']:.3f}; seeds for +-{args.target:.2f}: {r['seeds_needed']}")
    print("  if evaluation noise cancelled in the paired difference (any Q, M): " +
          "  ".join(f"S={k[4:]} {v:.3f}" for k, v in pessimistic.items()))
    for m, c in check.items():
        need = "see P5 (unpaired seeds)" if c["seeds_for_target"] is None else c["seeds_for_target"]
        print(f"  check {m}: committed two-level half-width {c['committed_half_width']:.3f} at {c['seeds']} seeds "
              f"(predicted {c['predicted_half_width']:.3f}); seeds for +-{args.target:.2f} at its own spread: "
              f"{need}{' (met)' if c['meets_target'] else ''}")
    b = components.get(args.baseline, {})
    if b:
        print(f"  unpaired seeds (P5): baseline {args.baseline} AUC sd {math.sqrt(b['var']):.3f} over {b['seeds']} "
              "seeds")
    for m, u in unbalanced.items():
        corr = "n/a" if u["corr_baseline"] is None else f"{u['corr_baseline']:+.2f}"
        need = ", ".join(f"{k} seeds: {'none suffice' if v is None else v}"
                         for k, v in u["baseline_seeds_for_target"].items())
        print(f"  {m}: AUC sd {math.sqrt(u['var']):.3f}, corr with baseline {corr}; half-width paired "
              f"{u.get('paired_half_width', math.nan):.3f}, unpaired {u['unpaired_half_width']:.3f}; baseline seeds "
              f"for +-{args.target:.2f} with the method's {need}")
    if rule is not None:
        print(f"  seed rule (cap {rule['cap']}, {rule['method_seeds']} seeds a method): {args.baseline} to "
              f"{rule['baseline_seeds']} seeds"
              + (f" (--extra_seeds {rule['extra_seeds_arg']})" if rule["extra_seeds_arg"] else " (no extra seeds)")
              + f"; expected resolved: {', '.join(rule['expected_resolved']) or 'none'}; not resolved: "
              f"{', '.join(rule['not_resolved']) or 'none'}")
    if args.output:
        from trl_ext._io import write_json

        write_json(args.output, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The report of a finished (or interim) benchmark: thresholds, per-method table rows and costs, the two-part-rule
verdicts against the reference methods, and the plots."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from .evaluation import _level_order, final_accuracy, point_accuracy
from .presets import AMORTIZE_OVER, DIFFICULTY_COLUMN, GRPO_REFERENCE, METHODS, TOKEN_METRIC


def tokens_to_threshold(curve: Sequence[dict], threshold: float) -> float | None:
    """Actual tokens at the first checkpoint whose primary accuracy is >= ``threshold`` (``None``: never).

    Coarse by construction (checkpoint resolution); the start point (0 tokens) counts when it already qualifies.
    """
    for p in sorted(curve, key=lambda q: q["tokens"]):
        if point_accuracy(p) >= threshold:
            return float(p["tokens"])
    return None


def _family(run: dict) -> str | None:
    return METHODS[run["method"]].family if run["method"] in METHODS else run.get("family")


def best_grpo_method(runs: Sequence[dict]) -> str | None:
    """The best GRPO setting: the ``grpo``-family method (``grpo_g4/g8/g16``) with the highest mean final primary
    accuracy over its finished seeds; ties go to the larger group size. ``None`` when none finished.

    Selected on the evaluation set itself, which favours the reference: a conservative bar for the challengers.
    """
    acc: dict[str, list[float]] = {}
    for r in runs:
        if r["status"] == "ok" and _family(r) == "grpo":
            acc.setdefault(r["method"], []).append(final_accuracy(r))
    if not acc:
        return None
    size = {m: METHODS[m].group_size if m in METHODS else 0 for m in acc}
    return max(acc, key=lambda m: (sum(acc[m]) / len(acc[m]), size[m]))


def choose_threshold(runs: Sequence[dict], explicit: float | None, start_accuracy: float,
                     reference: str = GRPO_REFERENCE) -> tuple[float, str]:
    """Accuracy threshold of the "tokens to threshold" column, fixed across methods.

    ``explicit`` (``--threshold``) if given; else the mean final accuracy of ``reference`` at the budget:
    ``grpo_g16`` (protocol v1: the bar of the V0.5 trainer's goal, "reaches the accuracy plain GRPO reaches at
    G = 16 with fewer generated tokens") or ``"best_grpo"`` (protocol v2: :func:`best_grpo_method`); else, when the
    reference did not run, the start accuracy + 0.10.
    """
    if explicit is not None:
        return float(explicit), "--threshold"
    name = best_grpo_method(runs) if reference == "best_grpo" else reference
    ref = [final_accuracy(r) for r in runs if r["method"] == name and r["status"] == "ok"]
    if ref:
        what = f"the best GRPO setting, {name}" if reference == "best_grpo" else name
        return sum(ref) / len(ref), f"mean final accuracy of {what} at the budget"
    return min(1.0, start_accuracy + 0.10), f"start accuracy + 0.10 ({reference} not run)"


def _mean_sd(xs: Sequence[float]) -> tuple[float | None, float | None]:
    xs = [float(x) for x in xs if x is not None]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def amortized_total(online_tokens: float, table_tokens: float, n_runs: int) -> float:
    """Tokens per run when a one-off table cost is shared by ``n_runs`` runs: ``online + table / n_runs``."""
    if n_runs < 1:
        raise ValueError(f"n_runs must be >= 1, got {n_runs}")
    return float(online_tokens) + float(table_tokens) / n_runs


def cost_columns(online_tokens: float | None, table_tokens: float | None,
                 amortize_over: Sequence[int] = AMORTIZE_OVER) -> dict:
    """Cost columns of one method: ``online_tokens`` (training generation, ``ext/generated_tokens_total``),
    ``table_tokens`` (generated once to build a value table; 0 without one), ``total_tokens`` (online + the whole
    table: the cost of a single run) and ``total_tokens_table_over_<n>`` for each ``n`` in ``amortize_over``."""
    if online_tokens is None:
        return {"online_tokens": None, "table_tokens": table_tokens, "total_tokens": None,
                **{f"total_tokens_table_over_{n}": None for n in amortize_over}}
    t = float(table_tokens or 0.0)
    return {"online_tokens": float(online_tokens), "table_tokens": t,
            "total_tokens": amortized_total(online_tokens, t, 1),
            **{f"total_tokens_table_over_{n}": amortized_total(online_tokens, t, n) for n in amortize_over}}


def aggregate_by_level(runs: Sequence[dict]) -> dict[str, dict] | None:
    """Per-difficulty final accuracy over seeds: ``{level: {"mean", "sd", "per_seed", "n_questions"}}`` from the
    runs' ``final_accuracy_by_level``; ``None`` when no run has one."""
    per: dict[str, list[float]] = {}
    n_q: dict[str, int] = {}
    for r in runs:
        for lv, cell in (r.get("final_accuracy_by_level") or {}).items():
            per.setdefault(lv, []).append(float(cell["accuracy"]))
            n_q[lv] = int(cell["n"])
    if not per:
        return None
    out = {}
    for lv, xs in sorted(per.items(), key=_level_order):
        m, sd = _mean_sd(xs)
        out[lv] = {"mean": m, "sd": sd, "per_seed": xs, "n_questions": n_q[lv]}
    return out


def summarize(runs: Sequence[dict], threshold: float, start_accuracy: float,
              tune_runs: Sequence[dict] = ()) -> list[dict]:
    """One table row per method (in run order): accuracy, tokens to threshold, costs, wall time, difficulty."""
    rows = []
    for name in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == name]
        ok = [r for r in mine if r["status"] == "ok"]
        row = {"method": name, "label": mine[0]["label"], "status": "ok" if ok else mine[0]["status"],
               "n_seeds": len(ok), "reason": None if ok else mine[0].get("reason"),
               "learning_rate": mine[0].get("learning_rate"), "lr_source": mine[0].get("lr_source"),
               "tuning_tokens": sum(float(r.get("tokens") or 0.0) for r in tune_runs if r["method"] == name)}
        if ok:
            curves = [[{"tokens": 0.0, "accuracy": start_accuracy}, *r["curve"]] for r in ok]
            ttt = [tokens_to_threshold(c, threshold) for c in curves]
            reached = [t for t in ttt if t is not None]
            acc_m, acc_sd = _mean_sd([final_accuracy(r) for r in ok])
            tokens_m = _mean_sd([r["tokens"] for r in ok])[0]
            table = next(((r.get("setup_info") or {}).get("table_tokens") for r in ok
                          if (r.get("setup_info") or {}).get("table_tokens") is not None), None)
            row.update(
                final_accuracy_mean=acc_m, final_accuracy_sd=acc_sd,
                final_accuracy_per_seed=[final_accuracy(r) for r in ok],
                final_sampled_accuracy_mean=_mean_sd([r.get("final_sampled_accuracy") for r in ok])[0],
                tokens_mean=tokens_m,
                tokens_to_threshold_mean=_mean_sd(reached)[0], tokens_to_threshold_reached=len(reached),
                train_wall_s_mean=_mean_sd([r["train_wall_s"] for r in ok])[0],
                train_wall_s_sd=_mean_sd([r["train_wall_s"] for r in ok])[1],
                table_build_wall_s=next(((r.get("setup_info") or {}).get("table_build_wall_s") for r in ok
                                         if r.get("setup_info")), None),
                steps_mean=_mean_sd([r["steps"] for r in ok])[0],
                rollouts_per_step_mean=_mean_sd([r.get("rollouts_per_step") for r in ok])[0],
                failed_seeds=[r["seed"] for r in mine if r["status"] != "ok"],
                accuracy_by_level=aggregate_by_level(ok),
                **cost_columns(tokens_m, table),
            )
        rows.append(row)
    return rows


def _fmt(x, spec=".3f", none="--"):
    return none if x is None else format(x, spec)


def table_markdown(rows: Sequence[dict], threshold: float, s: dict, rule: str = "", *, n_eval: int) -> str:
    """The comparison table. ``n_eval``: the held-out questions actually evaluated (the test split can hold fewer
    than ``--n_eval`` asks for); ``s["test_eval_samples"]`` samples of each when above 1."""
    over = [n for n in AMORTIZE_OVER if n != 1]
    k = int(s.get("test_eval_samples") or 1)
    per_q = f", {k} samples each" if k > 1 else ""
    head = (f"Token budget {s['token_budget']:.0f} generated training tokens per run; {n_eval} held-out "
            f"questions ({s.get('eval_mode', 'greedy')}{per_q}); threshold {threshold:.3f}{f' ({rule})' if rule else ''}. "
            "Online tokens: "
            f"`{TOKEN_METRIC}`; table: tokens generated to build a value table (BASIS), once per warm model; total: "
            f"online + table (one run), and with the table shared by {', '.join(map(str, over))} runs.\n\n"
            "| method | lr | seeds | final acc (mean +- sd) | per seed | tokens to threshold (seeds reaching) "
            "| online tokens | table tokens | total tokens | "
            + " | ".join(f"total, table / {n}" for n in over)
            + " | train wall s | steps | trained rollouts/step |\n"
            + "|---" * (12 + len(over)) + "|\n")
    lines = []
    for r in rows:
        lr = _fmt(r.get("learning_rate"), "g")
        if r["status"] != "ok":
            lines.append(f"| {r['label']} | {lr} | 0 | {r['status']}: {r['reason']} |" + " |" * (8 + len(over)))
            continue
        per = " ".join(f"{a:.3f}" for a in r["final_accuracy_per_seed"])
        lines.append(
            f"| {r['label']} | {lr} | {r['n_seeds']} | {_fmt(r['final_accuracy_mean'])} +- "
            f"{_fmt(r['final_accuracy_sd'])} | {per} | {_fmt(r['tokens_to_threshold_mean'], '.0f')} "
            f"({r['tokens_to_threshold_reached']}/{r['n_seeds']}) | {_fmt(r.get('online_tokens'), '.0f')} "
            f"| {_fmt(r.get('table_tokens'), '.0f')} | {_fmt(r.get('total_tokens'), '.0f')} | "
            + " | ".join(_fmt(r.get(f"total_tokens_table_over_{n}"), ".0f") for n in over)
            + f" | {_fmt(r['train_wall_s_mean'], '.1f')} | {_fmt(r['steps_mean'], '.0f')} "
              f"| {_fmt(r['rollouts_per_step_mean'], '.1f')} |")
    return head + "\n".join(lines) + "\n"


def difficulty_markdown(rows: Sequence[dict], start_by_level: dict | None) -> str:
    """Final accuracy per ``n_digits`` (mean over seeds) per method; empty without a difficulty column."""
    levels = list(start_by_level or {})
    for r in rows:
        for lv in r.get("accuracy_by_level") or {}:
            if lv not in levels:
                levels.append(lv)
    if not levels:
        return ""
    levels = [lv for lv, _ in sorted(((lv, 0) for lv in levels), key=_level_order)]
    out = [f"Final greedy accuracy by `{DIFFICULTY_COLUMN}` (mean over seeds; questions per level in the header).\n",
           "| method | " + " | ".join(f"{lv} ({(start_by_level or {}).get(lv, {}).get('n', '?')})" for lv in levels)
           + " |", "|---" * (1 + len(levels)) + "|"]
    if start_by_level:
        out.append("| start checkpoint | " + " | ".join(_fmt(start_by_level.get(lv, {}).get("accuracy"))
                                                       for lv in levels) + " |")
    for r in rows:
        by = r.get("accuracy_by_level") or {}
        if r["status"] == "ok":
            out.append(f"| {r['label']} | " + " | ".join(_fmt(by.get(lv, {}).get("mean")) for lv in levels) + " |")
    return "\n".join(out) + "\n"


#: Reference methods of the verdicts: key in verdicts.json -> method name (``"best_grpo"``: :func:`best_grpo_method`).
VERDICT_REFERENCES = {"vs_best_grpo": "best_grpo", "vs_reinforce_pp": "reinforce_pp",
                      "vs_dapo_dynamic": "dapo_dynamic", "vs_grpo_g16": GRPO_REFERENCE}


def verdict_references(runs: Sequence[dict]) -> dict[str, str | None]:
    """Reference method of every verdict column (``None`` where the reference did not finish a run)."""
    done = {r["method"] for r in runs if r["status"] == "ok"}
    out = {}
    for key, name in VERDICT_REFERENCES.items():
        out[key] = best_grpo_method(runs) if name == "best_grpo" else (name if name in done else None)
    return out


def compute_verdicts(runs: Sequence[dict], rows: Sequence[dict], s: dict) -> dict:
    """Two-part-rule reports of every method against each reference of :func:`verdict_references`: the best GRPO
    setting (highest mean final (primary) accuracy among ``grpo_g4/g8/g16``), REINFORCE++, DAPO dynamic sampling, and
    ``grpo_g16`` (the papers' usual baseline). A pair already compared under another reference is not repeated."""
    from trl_ext.stats import compare_outcome_files

    out_dir = s["output_dir"]
    files = {}
    for r in runs:
        if r["status"] == "ok":
            files.setdefault(r["method"], []).append(os.path.join(out_dir, r["outcomes"]))
    refs = verdict_references(runs)
    result = {"references": refs, "comparisons": [],
              "best_grpo_rule": "grpo_* method with the highest mean final primary accuracy (greedy, or sampled "
                                "under eval_mode sampled)"}
    if refs["vs_best_grpo"] is not None and refs["vs_best_grpo"] == refs["vs_grpo_g16"]:
        result["note"] = (f"the best GRPO setting is {refs['vs_best_grpo']} itself: the vs_grpo_g16 comparisons equal "
                          "vs_best_grpo")
    done = set()
    for ref_name, ref in refs.items():
        for method in files:
            if ref is None or method == ref or (method, ref) in done:
                continue
            done.add((method, ref))
            entry = {"reference": ref_name, "a": method, "b": ref}
            try:
                rep = compare_outcome_files(files[method], files[ref], n_sim=s["n_sim"], n_boot=s["n_boot"])
                v = rep["verdict"]
                entry.update(status=v["status"], winner=v["winner"], reason=v["reason"], margin=rep["margin"],
                             margin_ci=rep["margin_ci"], detection_floor=rep["detection_floor"],
                             paired_detection_floor=rep["paired_detection_floor"],
                             margin_to_floor_ratio=rep["margin_to_floor_ratio"], margin_zone=rep["margin_zone"],
                             smallest_detectable_gap=rep["smallest_detectable_gap"], n_seeds=rep["n_seeds"],
                             n_questions=rep["n_questions"], votes_a=v["votes_a"], votes_b=v["votes_b"],
                             pooled_p_value=v["pooled_p_value"], length_note=rep.get("length_note"),
                             length_residualized=(rep.get("length_residualized") or {}).get("difference"),
                             report=_drop_votes(rep, out_dir))
            except (ValueError, RuntimeError) as e:
                entry.update(status="error", reason=f"{type(e).__name__}: {e}")
            result["comparisons"].append(entry)
    return result


def _drop_votes(rep: dict, root: str | None = None) -> dict:
    """The compare report without per-question votes, file paths relative to ``root``."""
    rep = dict(rep)
    rep["verdict"] = {k: v for k, v in rep["verdict"].items() if k != "question_votes"}
    if root is not None:
        rep["pairs"] = [{**p, "a": os.path.relpath(p["a"], root), "b": os.path.relpath(p["b"], root)}
                        for p in rep["pairs"]]
    return rep


def verdicts_markdown(v: dict) -> str:
    refs = ", ".join(f"{k} = `{name}`" for k, name in v["references"].items())
    lines = [f"References: {refs} (best GRPO: {v['best_grpo_rule']})."
             + (f" Note: {v['note']}." if v.get("note") else "") + "\n",
             "| reference | a (challenger) | b (reference) | verdict | margin a-b (pts) | 95% CI (pts) "
             "| detection floor (pts) | margin/floor | paired floor (pts) | smallest gap caught 80% (pts) "
             "| votes a/b, p | length-residualized (pts) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def pts(x):
        return "--" if x is None else f"{100 * x:+.1f}" if x < 0 or x > 0 else "0.0"

    for c in v["comparisons"]:
        if c["status"] == "error":
            lines.append(f"| {c['reference']} | {c['a']} | {c['b']} | error: {c['reason']} | | | | | | | | |")
            continue
        ci = c["margin_ci"]
        gap = c["smallest_detectable_gap"]
        lines.append(
            f"| {c['reference']} | {c['a']} | {c['b']} | {c['status']} | {pts(c['margin'])} | {pts(ci['low'])} .. "
            f"{pts(ci['high'])} | {100 * c['detection_floor']:.1f} | {_fmt(c['margin_to_floor_ratio'], '.2f')} | "
            f"{100 * c['paired_detection_floor']:.1f} | {'--' if gap is None else f'{100 * gap:.1f}'} | "
            f"{c['votes_a']}/{c['votes_b']}, {c['pooled_p_value']:.3g} | {pts(c.get('length_residualized'))} |")
    lines.append("\nLength-residualized: the margin after regressing out completion-length differences (section 5 "
                 "step 4); the primary reading only where the length slope is positive (see verdicts.json "
                 "`length_note`).")
    return "\n".join(lines) + "\n"


def make_plots(runs: Sequence[dict], start_accuracy: float, out_dir: str, eval_mode: str = "greedy") -> list[str]:
    """Mean held-out primary accuracy (``eval_mode``: greedy or sampled, as the y label says) vs tokens and vs
    training wall time; shaded band = min..max over seeds."""
    from trl_ext._plots import pyplot

    plt = pyplot("the plots of compare_trainers.py (--no_plots skips them)")
    paths = []
    for xkey, fname, xlabel in (("tokens", "accuracy_vs_tokens.png", "generated training tokens"),
                                ("train_wall_s", "accuracy_vs_walltime.png", "training wall time (s, eval excluded)")):
        fig, ax = plt.subplots(figsize=(8.5, 5.2))
        for name in dict.fromkeys(r["method"] for r in runs):
            ok = [r for r in runs if r["method"] == name and r["status"] == "ok"]
            if not ok:
                continue
            n = min(len(r["curve"]) for r in ok)
            xs = [0.0] + [sum(r["curve"][i][xkey] for r in ok) / len(ok) for i in range(n)]
            accs = [[start_accuracy] + [point_accuracy(r["curve"][i]) for i in range(n)] for r in ok]
            mean = [sum(a[i] for a in accs) / len(accs) for i in range(n + 1)]
            lo = [min(a[i] for a in accs) for i in range(n + 1)]
            hi = [max(a[i] for a in accs) for i in range(n + 1)]
            # one colour per method (tab20's dark hues first, then the light ones: more than the default cycle's
            # 10 colours), line style by family
            i = (list(METHODS).index(name) if name in METHODS else 0) % 20
            color = plt.get_cmap("tab20").colors[(2 * i) % 20 + (2 * i) // 20]
            style = {"grpo": "-", "baseline": "--"}.get(ok[0].get("family"), "-.")
            ax.plot(xs, mean, marker="o", ms=3, color=color, linestyle=style,
                    label=f"{ok[0]['label']} ({len(ok)} seeds)")
            ax.fill_between(xs, lo, hi, color=color, alpha=0.10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"held-out {eval_mode} accuracy (band: min..max over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths

"""The :class:`Advice` record and the rule set that turns the regime measurements into a recommendation.

:func:`measure` computes every number of the advice from a sampled reward matrix (pure numpy / scipy, no TRL):
pass rates with intervals, zero-variance shares at each group size (unbiased, plug-in and the disjoint-group check),
token waste, each trainer's signal per token (:mod:`trl_ext.advise.rates`), the variance decomposition and the
lengths, with percentile-bootstrap intervals over prompts. :func:`recommend` applies the rules of
``docs/advise.md`` ("The rules"), which are calibrated on the two CPU testbed tasks of ``docs/results.md`` and say
so: on both, with every method's learning rate tuned, no paper method (DAPO, BASIS, V0.5, PAIR) beat the best GRPO
group size by the two-part rule, and on ``addition`` the one-rollout REINFORCE++ control did.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np

from .rates import method_terms
from .regime import (
    GROUP_SIZES,
    all_equal_subset_share,
    bootstrap_ratio_ci,
    check_rewards,
    disjoint_group_zero_variance,
    length_summary,
    pass_rate_histogram,
    pass_rate_intervals,
    plugin_zero_variance,
    variance_decomposition,
    wasted_tokens,
    zero_variance_estimates,
)

__all__ = ["Advice", "AdviceWarning", "Estimate", "measure", "recommend", "RULES"]

#: Thresholds of the rule set (``docs/advise.md``, "The rules"); every one is a heuristic calibrated on two tasks.
RULES = {
    "grpo_candidates": (4, 8, 16),  # group sizes the benchmark compared
    "grpo_extra_waste": 0.10,       # a smaller G is chosen while it wastes at most 10 points more tokens than the largest
    "rpp_max_icc": 0.25,            # REINFORCE++ when the prompt explains little of the reward variance ...
    "rpp_min_waste": 0.25,          # ... and GRPO would waste a quarter of its tokens on tied groups
    "basis_min_icc": 0.40,          # a prompt-specific value (BASIS, V0.5) has something to remove
    "basis_max_table_overhead": 1.0,  # BASIS's table at most doubles the tokens
    "dapo_min_waste": 0.30,         # DAPO's full batches matter when a third of the groups tie
    "v05_min_tie_reduction": 0.15,  # extra rounds resolve ties for at least 15 % of prompts
    "pair_min_mean_length": 256,    # PAIR's probes save tokens only on long completions
    "pair_min_within_auc": 0.50,    # ... and the prefix must rank a prompt's candidates better than chance (lower bound)
    "pair_min_brier_skill": 0.0,    # ... and its head must beat the base rate on the unfinished candidates
    "pair_probe": "1x",             # the probe the rule reads: PAIR's default tau
    "truncation_warn": 0.05,
}


class AdviceWarning(UserWarning):
    """A measurement too imprecise or an input too odd for the advice to be read at face value."""


@dataclass
class Estimate:
    """A measured number and its confidence interval (``low``/``high`` NaN when not computable)."""

    value: float
    low: float = math.nan
    high: float = math.nan

    @property
    def width(self) -> float:
        return self.high - self.low


@dataclass
class Advice:
    """Everything ``trl-ext advise`` measured and concluded. See ``docs/advise.md`` for each field.

    Attributes
    ----------
    config : dict
        How the sample was drawn (model, dataset, prompts, samples, cap, seed, group size, confidence ...).
    counts : dict
        ``n_prompts``, ``n_samples`` (k), ``n_unscorable_samples``, ``n_unscorable_prompts``, ``binary``.
    pass_rates : dict
        ``mean`` / ``share_zero`` / ``share_one`` (:class:`Estimate`), ``histogram``, ``interval_method``,
        ``per_prompt`` (``rate``, ``low``, ``high``, ``k`` per prompt).
    zero_variance : dict
        Per group size ``G``: ``share`` (unbiased, :class:`Estimate`), ``plugin`` (``p_hat^G + (1 - p_hat)^G``),
        ``disjoint_check`` (empirical share of disjoint ``G``-groups of the sample), ``subset_check_max_abs_diff``,
        ``token_waste_share`` (:class:`Estimate`), ``unbiased_prompts``.
    methods : dict
        Per method: ``groups_per_1k``, ``rollouts_per_1k``, ``useful_token_share`` (and DAPO's ``keep_rate``,
        ``tokens_per_kept_group``) as :class:`Estimate`, ``saving_vs_user_grpo`` (:class:`Estimate`), ``info``.
    variance : dict
        :func:`~trl_ext.advise.regime.variance_decomposition` plus ``icc_ci`` (:class:`Estimate`).
    lengths : dict
        :func:`~trl_ext.advise.regime.length_summary` (with ``truncation_share``).
    prefix_heads : dict
        PAIR's prefix informativeness (:func:`trl_ext.advise.prefix.measure_prefix_heads`), or
        ``{"measured": False, "reason": ...}``.
    noise_floor : dict
        Per reward function, its scorer noise floor (:func:`trl_ext.advise.noise.reward_noise_floors`), or
        ``{"measured": False, "reason": ...}``.
    recommendation : str
        ``"grpo"``, ``"reinforce_pp"`` or ``"basis"``.
    recommended_config : dict
        The settings to use (e.g. ``{"trainer": "GRPOTrainer", "num_generations": 8}``).
    reasons : list of str
    alternatives : dict
        Per other method, when it would pay and whether this regime has it.
    predicted_token_saving : Estimate
        ``1 - useful_token_share(GRPO at the user's G) / useful_token_share(recommended)`` (eq. B9): the share of
        generated tokens the recommendation saves for the same number of tokens in rollouts with a signal.
    warnings : list of str
    """

    config: dict
    counts: dict
    pass_rates: dict
    zero_variance: dict
    methods: dict
    variance: dict
    lengths: dict
    prefix_heads: dict = field(default_factory=lambda: {"measured": False})
    noise_floor: dict = field(default_factory=lambda: {"measured": False,
                                                       "reason": "not requested (noise_floor=True / --noise_floor)"})
    recommendation: str = "grpo"
    recommended_config: dict = field(default_factory=dict)
    reasons: list = field(default_factory=list)
    alternatives: dict = field(default_factory=dict)
    predicted_token_saving: Estimate = field(default_factory=lambda: Estimate(math.nan))
    warnings: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """Strict-JSON-ready dict (NaN -> None, numpy scalars -> Python)."""
        return _json_clean(asdict(self))


def _json_clean(obj):
    if isinstance(obj, dict):
        return {str(k): _json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _json_clean(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(float(obj)) else None
    return obj


# ------------------------------------------------------------------------------------------------ measurement
def _stat_columns(r, ln, rates, group_sizes, terms):
    """Per-prompt (a, b) columns of every headline ratio, with their names."""
    names, a_cols, b_cols = [], [], []

    def add(name, a, b):
        names.append(name)
        a_cols.append(np.asarray(a, dtype=np.float64))
        b_cols.append(np.asarray(b, dtype=np.float64))

    ok = np.isfinite(rates)
    one = np.where(ok, 1.0, np.nan)
    add("pass_rate_mean", rates, one)
    add("share_zero", np.where(ok, rates == 0, np.nan), one)
    add("share_one", np.where(ok, rates == 1, np.nan), one)
    for g in group_sizes:
        add(f"z{g}", zero_variance_estimates(r, g)["z"], one)
        w = wasted_tokens(r, ln, g)
        add(f"waste{g}", w["waste"], w["tokens"])
    for m, t in terms.items():
        for stat, (a, b) in t.items():
            add(f"{m}/{stat}", a, b)
    return names, np.stack(a_cols, axis=1), np.stack(b_cols, axis=1)


def _icc_ci(rates, ks, confidence, n_resamples, seed):
    from scipy import stats

    ok = np.isfinite(rates) & (ks >= 2)
    p, k = rates[ok], ks[ok].astype(np.float64)
    if p.size < 3:
        return Estimate(math.nan)

    def icc(idx, axis=-1):
        idx = np.asarray(idx).astype(np.int64)
        pp, kk = p[idx], k[idx]
        noise = (pp * (1 - pp) / (kk - 1)).mean(axis=-1)
        between = pp.var(axis=-1, ddof=1) - noise
        pb = pp.mean(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return between / (pb * (1 - pb))

    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore")  # resamples with every rate 0 or 1 have no ICC (NaN)
        res = stats.bootstrap((np.arange(p.size),), icc, vectorized=True, n_resamples=n_resamples,
                              confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed))
    d = variance_decomposition(p, k)
    return Estimate(d["icc"], float(res.confidence_interval.low), float(res.confidence_interval.high))


def _zero_variance_section(r, ln, rates, group_sizes, est, subset_check_limit):
    out = {}
    for g in group_sizes:
        zv = zero_variance_estimates(r, g)
        ok = np.isfinite(rates)
        diffs = []
        for i in np.flatnonzero(zv["unbiased"]):
            if math.comb(int(np.isfinite(r[i]).sum()), g) <= subset_check_limit:
                diffs.append(abs(all_equal_subset_share(r[i], g) - zv["z"][i]))
        out[str(g)] = {
            "share": est[f"z{g}"],
            "plugin": float(np.mean(plugin_zero_variance(rates[ok], g))),
            "disjoint_check": disjoint_group_zero_variance(r, g),
            "subset_check_max_abs_diff": float(max(diffs)) if diffs else None,
            "subset_check_prompts": len(diffs),
            "token_waste_share": est[f"waste{g}"],
            "unbiased_prompts": int(zv["unbiased"].sum()),
        }
        if zv["unbiased"].sum() < ok.sum():
            out[str(g)]["note"] = (f"{int(ok.sum() - zv['unbiased'].sum())} prompts have fewer than G = {g} scorable "
                                   "samples: Jeffreys posterior mean used for them (not unbiased)")
    return out


def measure(rewards, lengths, truncated=None, *, max_new_tokens: int | None = None, group_sizes=GROUP_SIZES,
            user_group_size: int = 8, confidence: float = 0.95, interval_method: str = "jeffreys",
            n_resamples: int = 999, seed: int = 0, basis_table_samples: int = 32, basis_table_uses: float = 1.0,
            subset_check_limit: int = 20000, config: dict | None = None) -> Advice:
    """Measure the regime of a sampled reward matrix; returns an :class:`Advice` without a recommendation yet.

    Parameters
    ----------
    rewards : array_like, shape (N, k)
        Rewards in ``[0, 1]`` or NaN (unscorable).
    lengths : array_like, shape (N, k)
        Generated tokens per sample.
    truncated : array_like of bool, shape (N, k), optional
        Hit the cap without an end token.
    max_new_tokens : int, optional
        The cap, for ``share_at_cap``.
    group_sizes : sequence of int
        Group sizes reported (the user's is added).
    user_group_size : int
        The GRPO group size the savings are measured against.
    confidence, interval_method, n_resamples, seed
        Interval settings (bootstrap over prompts, percentile method).
    basis_table_samples, basis_table_uses
        BASIS table cost model (:func:`trl_ext.advise.rates.method_terms`).
    subset_check_limit : int
        Enumerate all ``C(k, G)`` subsets of a prompt (the brute-force check) only up to this many.
    config : dict, optional
        Stored as ``Advice.config``.
    """
    r = check_rewards(rewards)
    ln = np.asarray(lengths, dtype=np.float64)
    if ln.shape != r.shape:
        raise ValueError(f"lengths has shape {ln.shape}, rewards {r.shape}; one length per sample.")
    group_sizes = tuple(sorted({int(g) for g in (*group_sizes, user_group_size)}))
    pr = pass_rate_intervals(r, method=interval_method, confidence=confidence)
    rates, ks = pr["rate"], pr["n_samples"]
    terms = method_terms(r, ln, group_sizes=group_sizes, basis_table_samples=basis_table_samples,
                         basis_table_uses=basis_table_uses)
    names, a, b = _stat_columns(r, ln, rates, group_sizes, terms)
    useful = [names.index(f"{m}/useful_token_share") for m in terms]
    ref = names.index(f"grpo_g{user_group_size}/useful_token_share")

    def with_savings(ratios):  # eq. B9 for every method, appended to the ratios
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.concatenate([ratios, 1.0 - ratios[ref][None] / ratios[useful]], axis=0)

    mask = np.isfinite(a) & np.isfinite(b)
    with np.errstate(invalid="ignore", divide="ignore"):
        point = with_savings(np.where(mask, a, 0.0).sum(axis=0) / np.where(mask, b, 0.0).sum(axis=0))
    low, high = bootstrap_ratio_ci(a, b, confidence=confidence, n_resamples=n_resamples, seed=seed,
                                   transform=with_savings)
    names = names + [f"{m}/saving_vs_user_grpo" for m in terms]
    est = {n: Estimate(float(p), float(lo), float(hi)) for n, p, lo, hi in zip(names, point, low, high)}
    methods = {}
    for m, t in terms.items():
        methods[m] = {stat: est[f"{m}/{stat}"] for stat in (*t, "saving_vs_user_grpo")}
        methods[m]["info"] = t.info
    ok = np.isfinite(rates)
    variance = (variance_decomposition(rates[ok], ks[ok]) if ok.sum() >= 2 and np.all(ks[ok] >= 2)
                else {"note": "needs >= 2 prompts with >= 2 scorable samples each"})
    if "note" not in variance:
        variance["icc_ci"] = _icc_ci(rates, ks, confidence, n_resamples, seed)
    per_prompt = [{"rate": rt, "low": lo, "high": hi, "k": int(kk)}
                  for rt, lo, hi, kk in zip(rates.tolist(), pr["low"].tolist(), pr["high"].tolist(), ks.tolist())]
    cfg = dict(config or {})
    cfg.update(group_sizes=list(group_sizes), user_group_size=user_group_size, confidence=confidence,
               interval_method=interval_method, n_resamples=n_resamples, bootstrap_seed=seed,
               basis_table_samples=basis_table_samples, basis_table_uses=basis_table_uses)
    return Advice(
        config=cfg,
        counts={"n_prompts": int(r.shape[0]), "n_samples": int(r.shape[1]), "n_scorable_prompts": int(ok.sum()),
                "n_unscorable_samples": pr["n_unscorable"], "n_unscorable_prompts": pr["n_prompts_unscorable"],
                "binary": pr["binary"]},
        pass_rates={"mean": est["pass_rate_mean"], "share_zero": est["share_zero"], "share_one": est["share_one"],
                    "histogram": pass_rate_histogram(rates[ok]), "interval_method": interval_method,
                    "per_prompt": per_prompt},
        zero_variance=_zero_variance_section(r, ln, rates, group_sizes, est, subset_check_limit),
        methods=methods,
        variance=variance,
        lengths=length_summary(ln[np.isfinite(ln)], cap=max_new_tokens,
                               truncated=None if truncated is None else np.asarray(truncated)[np.isfinite(ln)]),
    )


# ------------------------------------------------------------------------------------------------ rules
def _fmt(x: float, nd: int = 2) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{nd}f}"


def _straddles(e: Estimate, threshold: float) -> bool:
    return math.isfinite(e.low) and math.isfinite(e.high) and e.low < threshold < e.high


def _choose_group_size(adv: Advice, candidates) -> tuple[int, list[str]]:
    """Rule G: the smallest candidate G whose token waste is within ``grpo_extra_waste`` of the largest's."""
    cands = [g for g in candidates if str(g) in adv.zero_variance]
    waste = {g: adv.zero_variance[str(g)]["token_waste_share"].value for g in cands}
    floor = waste[max(cands)]
    chosen = next(g for g in sorted(cands) if waste[g] <= floor + RULES["grpo_extra_waste"])
    table = ", ".join(f"G={g}: {_fmt(waste[g])}" for g in sorted(cands))
    reasons = [f"Token share wasted on zero-variance groups ({table}). G = {chosen} is the smallest group size within "
               f"{RULES['grpo_extra_waste']:.2f} of G = {max(cands)}'s {_fmt(floor)}: a larger group buys little "
               "signal per token and a smaller one means more optimizer steps per token (rule G)."]
    share01 = adv.pass_rates["share_zero"].value + adv.pass_rates["share_one"].value
    if math.isfinite(share01) and share01 > 0.2:
        reasons.append(f"{_fmt(share01)} of the prompts never or always succeeded in {adv.counts['n_samples']} "
                       "samples: no group size gives them a signal; filtering them out of the training set saves "
                       "their tokens under every trainer.")
    return chosen, reasons


def _alternatives(adv: Advice, g_star: int, icc: Estimate) -> dict:
    m = adv.methods
    w = adv.zero_variance[str(g_star)]["token_waste_share"].value
    dapo = m.get(f"dapo_g{g_star}", {})
    overhead = m["basis"]["info"]["table_tokens_per_online_token"]
    v05 = m["v05_osla"]["info"]
    z_init = adv.zero_variance.get(str(v05["k_init"]), {}).get("share", Estimate(math.nan)).value
    zv_cap = [adv.zero_variance[k]["share"].value for k in adv.zero_variance if int(k) >= v05["round_checkpoints"][-1]]
    tie_red = z_init - (min(zv_cap) if zv_cap else math.nan)
    return {
        "dapo": {"pays_here": bool(w >= RULES["dapo_min_waste"]),
                 "why": f"DAPO dynamic sampling drops tied groups and refills: per generated token it has GRPO's "
                        f"signal at the same G; what it buys is full batches of signal per optimizer step, at "
                        f"{_fmt(dapo.get('tokens_per_kept_group', Estimate(math.nan)).value, 0)} generated tokens per "
                        f"kept group (keep rate {_fmt(dapo.get('keep_rate', Estimate(math.nan)).value)}). It pays "
                        f"when optimizer steps, not tokens, are the budget and >= {RULES['dapo_min_waste']:.2f} of the "
                        f"tokens tie (here {_fmt(w)}). Benchmarks: +0.6 (addition), +0.3 (scratchpad) over GRPO G = 4 "
                        "/ G = 8, no winner."},
        "basis": {"pays_here": bool(icc.value >= RULES["basis_min_icc"]
                                    and overhead <= RULES["basis_max_table_overhead"]),
                  "why": f"BASIS needs prompt-specific values far from the batch mean (ICC >= "
                         f"{RULES['basis_min_icc']:.2f}; here {_fmt(icc.value)}) and a value table whose cost is paid "
                         f"(here {_fmt(overhead, 1)} table tokens per online token at "
                         f"{adv.config['basis_table_uses']} training uses per prompt). Benchmarks: highest mean on "
                         "scratchpad (ICC 0.61), +0.8 over the best GRPO, no winner, at 15x the total tokens."},
        "v05_osla": {"pays_here": bool(math.isfinite(tie_red) and tie_red >= RULES["v05_min_tie_reduction"]),
                     "why": f"V0.5's extra rounds pay when groups tie at k_init = {v05['k_init']} but not at the "
                            f"cap (approximate model; tie share {_fmt(z_init)} at k_init, reduction "
                            f"{_fmt(tie_red)}; threshold {RULES['v05_min_tie_reduction']:.2f}) and a value prior "
                            "predicts the prompts (not measured here). Benchmarks: +1.6 (addition), +0.2 "
                            "(scratchpad) over the best GRPO, no winner."},
        "pair": _pair_alternative(adv),
        "reinforce_pp": {"pays_here": bool(icc.value < RULES["rpp_max_icc"] and w >= RULES["rpp_min_waste"]),
                         "why": f"REINFORCE++ (one rollout per prompt, batch-mean baseline) spends no tokens on tied "
                                f"groups; it pays when GRPO wastes >= {RULES['rpp_min_waste']:.2f} of its tokens "
                                f"(here {_fmt(w)}) and the prompt explains < {RULES['rpp_max_icc']:.2f} of the "
                                f"reward variance (ICC here {_fmt(icc.value)}), so a batch-mean baseline loses "
                                "little. Benchmarks: beat the best GRPO by +2.4 on addition (ICC 0.12); -0.7 on "
                                "scratchpad (ICC 0.61)."},
    }


def _pair_probe(ph: dict):
    """The probe the PAIR rule reads (``RULES["pair_probe"]``, else the first measured), or None."""
    probes = ph.get("probes") or {}
    if not ph.get("measured") or not probes:
        return None, None
    name = RULES["pair_probe"] if RULES["pair_probe"] in probes else next(iter(probes))
    return name, probes[name]


def _est_text(e: dict) -> str:
    return f"{_fmt(e.get('value'))} [{_fmt(e.get('low'))}, {_fmt(e.get('high'))}]"


def _pair_alternative(adv: Advice) -> dict:
    """PAIR's regime: long completions and a prefix that ranks a prompt's candidates (within-prompt AUC)."""
    mean_len = adv.lengths["mean"]
    long_enough = bool(mean_len >= RULES["pair_min_mean_length"])
    need = (f"PAIR saves continuation tokens when completions are long (mean >= {RULES['pair_min_mean_length']} "
            f"tokens; here {_fmt(mean_len, 1)}) and the prefix predicts success beyond the prompt. Its design compares "
            "the candidates of one prompt (edge proxy d_ij = p_i (1 - p_j) + (1 - p_i) p_j, PAIR Eq. 8), so a head "
            "that only knows the prompt gives every candidate the same p_hat and a uniform design: PAIR then trains "
            "on a random subset of the candidates after paying the probe for all of them, which GRPO at the smaller "
            "group size does without the probe. Needed: a within-prompt AUC on the candidates still unfinished "
            f"after the probe whose interval lies above {RULES['pair_min_within_auc']:.2f}, and a Brier skill > "
            f"{RULES['pair_min_brier_skill']:.2f} there. Necessary, not sufficient: the one head benchmarked "
            "(scratchpad, pooled AUC 0.835, 18-71-token completions; its within-prompt AUC is 0.50 [0.47, 0.53], "
            "docs/advise.md) tied GRPO (-0.6), and no committed benchmark shows PAIR beating the best GRPO group "
            "size.")
    name, pr = _pair_probe(adv.prefix_heads)
    if pr is None:
        return {"pays_here": False, "prefix_measured": False,
                "why": need + f" Prefix heads not measured: {adv.prefix_heads.get('reason', 'n/a')}"}
    unf = pr["unfinished"]
    w, skill = unf["within_prompt_auc"], unf["brier_skill"]
    low, sk = w.get("low"), skill.get("value")
    ranks = bool(low is not None and math.isfinite(low) and low > RULES["pair_min_within_auc"])
    calibrated = bool(sk is not None and math.isfinite(sk) and sk > RULES["pair_min_brier_skill"])
    failing = [t for ok, t in ((long_enough, "completions are short"),
                               (ranks, "the prefix does not rank a prompt's candidates better than chance"),
                               (calibrated, "the head does not beat the base rate (Brier skill <= 0)")) if not ok]
    here = (f" Here, probe {name} = {pr['probe_tokens']} tokens (PAIR's default tau = "
            f"{adv.prefix_heads['default_tau']}), {pr['share_finished_in_probe']:.2f} of the samples finished in "
            f"the probe; on the unfinished ones: within-prompt AUC {_est_text(w)}, pooled AUC "
            f"{_est_text(unf['auc'])}, Brier skill {_est_text(skill)}.")
    return {"pays_here": not failing, "prefix_measured": True, "prefix_informative": ranks and calibrated,
            "prefix_ranks": ranks, "prefix_calibrated": calibrated, "failing": failing, "probe": name,
            "why": need + here}


def _precision_warnings(adv: Advice, target_width: float) -> list[str]:
    out = []
    c = adv.counts
    if c["n_unscorable_samples"]:
        out.append(f"{c['n_unscorable_samples']} of {c['n_prompts'] * c['n_samples']} samples were unscorable (every "
                   f"reward function returned None) and are excluded; {c['n_unscorable_prompts']} prompts had no "
                   "scorable sample.")
    if not c["binary"]:
        out.append("rewards are not all 0/1: pass-rate intervals use the Beta formula on the sum of rewards (an "
                   "approximation) and 'zero variance' means all G rewards exactly equal.")
    tr = adv.lengths.get("truncation_share", 0.0)
    if tr > RULES["truncation_warn"]:
        out.append(f"{_fmt(tr)} of the completions hit max_new_tokens without ending: raise --max_new_tokens to the "
                   "training max_completion_length, or these rewards (usually failures) bias every number.")
    for name, nf in (adv.noise_floor.get("per_reward") or {}).items():
        if not nf.get("measured"):
            out.append(f"the noise floor of reward function {name!r} was not measured: {nf.get('reason')}")
        elif nf["floor"] > 0:
            out.append(f"reward function {name!r} has a scorer noise floor of {nf['floor']:.4g} (its units; "
                       f"{nf['floor_combined_units']:.4g} of the combined reward): its score of a completion moves "
                       "with the other completions in the batch, so reward gaps below the floor are scorer noise, "
                       "not signal, and a group can look informative without being so. Make the scorer "
                       "batch-independent (fixed padding, no batch statistics) or treat such gaps as ties.")
    g = adv.config["user_group_size"]
    e = adv.zero_variance[str(g)]["share"]
    if math.isfinite(e.width) and e.width > target_width:
        need = int(math.ceil(c["n_scorable_prompts"] * (e.width / target_width) ** 2))
        out.append(f"the {adv.config['confidence']:.0%} interval of the zero-variance share at G = {g} is "
                   f"{_fmt(e.low)}..{_fmt(e.high)} (width {_fmt(e.width)}) with {c['n_scorable_prompts']} prompts, "
                   f"wider than the target {target_width:.2f}: about {need} prompts would reach it (--num_prompts).")
    return out


def recommend(adv: Advice, *, target_width: float = 0.10) -> Advice:
    """Apply the rule set (``docs/advise.md``, "The rules") to a measured :class:`Advice`, in place; returns it.

    Rules, in order (thresholds in :data:`RULES`): (R) REINFORCE++ when the ICC is low and GRPO's best group size
    still wastes many tokens; (B) BASIS when the ICC is high and its table costs at most the online tokens; (G)
    otherwise plain GRPO at the smallest group size whose token waste is within 10 points of G = 16's. Warnings
    (``AdviceWarning``, also in ``adv.warnings``) for unscorable samples, non-binary rewards, truncation and an
    interval wider than ``target_width``.
    """
    g_star, reasons = _choose_group_size(adv, RULES["grpo_candidates"])
    icc = adv.variance.get("icc_ci", Estimate(math.nan))
    alts = _alternatives(adv, g_star, icc)
    w = adv.zero_variance[str(g_star)]["token_waste_share"]
    reasons.append(f"Between-prompt share of the reward variance (ICC, binomial noise removed): {_fmt(icc.value)} "
                   f"[{_fmt(icc.low)}, {_fmt(icc.high)}].")
    if alts["reinforce_pp"]["pays_here"]:
        rec, cfg = "reinforce_pp", {"trainer": "GRPOTrainer", "advantage_estimator": "reinforce_pp",
                                    "num_generations": 1}
        reasons.append(alts["reinforce_pp"]["why"])
        key = "reinforce_pp"
    elif alts["basis"]["pays_here"]:
        rec, cfg, key = "basis", {"trainer": "BASISTrainer", "num_generations": 1}, "basis"
        reasons.append(alts["basis"]["why"])
    else:
        rec, cfg, key = "grpo", {"trainer": "GRPOTrainer", "num_generations": g_star}, f"grpo_g{g_star}"
        reasons.append(f"Plain GRPO at G = {g_star} is the recommendation: no rule for another trainer fires in this "
                       "regime, and on the project's CPU benchmarks (docs/results.md) no paper method (DAPO, BASIS, "
                       "V0.5, PAIR) beat the best GRPO group size once every method's learning rate was tuned.")
    if alts["pair"].get("prefix_measured"):
        pair = alts["pair"]
        verdict = ("PAIR's conditions hold here: an A/B trial of PAIRTrainer against the recommendation is worth "
                   "running; it is not recommended outright because no committed benchmark shows PAIR beating the "
                   "best GRPO group size." if pair["pays_here"] else
                   "PAIR is not in its regime here: " + "; ".join(pair["failing"]) + ".")
        reasons.append(verdict + pair["why"][pair["why"].index(" Here,"):])
    for name, thr, val in (("ICC", RULES["rpp_max_icc"], icc), ("ICC", RULES["basis_min_icc"], icc),
                           ("token waste", RULES["rpp_min_waste"], w)):
        if _straddles(val, thr):
            reasons.append(f"Close call: the interval of the {name} [{_fmt(val.low)}, {_fmt(val.high)}] contains the "
                           f"rule threshold {thr:.2f}; more prompts (--num_prompts) would settle it.")
    adv.recommendation, adv.recommended_config, adv.reasons, adv.alternatives = rec, cfg, reasons, alts
    adv.predicted_token_saving = adv.methods[key]["saving_vs_user_grpo"]
    adv.warnings = _precision_warnings(adv, target_width)
    for msg in adv.warnings:
        warnings.warn(msg, AdviceWarning, stacklevel=2)
    return adv

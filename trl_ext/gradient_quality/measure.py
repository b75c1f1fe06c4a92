r"""Each method's update against the reference gradient, at equal generated tokens, with bootstrap intervals.

For a method ``m`` and a token budget ``T``, ``n`` independent batches are drawn (:mod:`.methods`); batch ``k`` gives
the sketched update ``v_k`` and its generated tokens. With the reference ``ĝ`` and ``\widehat{\|g^*\|^2}`` of
:mod:`.reference` (independent of the method half):

* **cosine** (corrected for the reference's noise), the mean over batches of

  .. math:: c_k = \frac{\langle v_k, \hat g\rangle}{\|v_k\|\, \sqrt{\widehat{\|g^*\|^2}}}          \qquad (M1)

  (``<v_k, ĝ>`` is unbiased for ``<v_k, g*>`` given ``v_k``; the plain cosine ``<v_k, ĝ> / (|v_k| |ĝ|)`` is shown
  as ``naive_cosine``: biased towards 0 because ``|ĝ| > |g*|`` on average). A zero update (every advantage 0) has
  cosine 0 and is counted in ``zero_updates``.
* **relative error at the best scale**, the squared error left after the best single rescaling of the update (the
  learning rate absorbs any scale):

  .. math:: \min_c \frac{\mathbb E\|c\, v - g^*\|^2}{\|g^*\|^2} = 1 - \rho^2,\qquad
            \rho = \frac{\langle \mu, g^*\rangle}{\sqrt{\mathbb E\|v\|^2\, \|g^*\|^2}},\quad \mu = \mathbb E v, \qquad (M2)

  split exactly into a **bias part** (the direction error of the mean update) and a **variance part**:

  .. math:: 1 - \rho^2 = \underbrace{(1 - \cos^2(\mu, g^*))}_{\text{bias}}
            + \underbrace{\cos^2(\mu, g^*)\, \frac{V}{\mathbb E\|v\|^2}}_{\text{variance}},\qquad
            V = \mathbb E\|v - \mu\|^2 .                                                          \qquad (M3)

  ``E|v|²`` is the batches' mean squared norm, ``V`` their sample variance, ``|mu|² = E|v|² - V``. The "bias" is
  the method's expected direction against the pool's: it holds the estimator's own bias (length normalisation, std
  scaling, DAPO's filter, a design-biased option) and the method half's finite-pool noise; ``pool_ceiling`` (the
  cosine of the whole method half's leave-one-out gradient) shows how much of it the pool alone explains.
* **tokens to a target cosine** (linear in log tokens between budgets) and its ratio to the best fixed-``G`` GRPO
  (the ``grpo_g<G>`` with the highest mean cosine at the nominal budgets every GRPO curve covers, each curve
  interpolated in log tokens).

Intervals: a paired percentile bootstrap that resamples the reference's prompts (one set of prompt weights per
replicate, shared by every method and budget, so differences are paired) and each cell's batches. It covers the
reference's noise and the Monte-Carlo error of the batches, not the method half's finite-pool noise (see
``pool_ceiling``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from .methods import MethodHalf, get_method
from .pool import GradientPool, split_pool
from .reference import ReferenceGradient, loo_prompt_terms, reference_gradient

__all__ = ["measure_gradient_quality", "tokens_to_target", "default_budgets", "draw_updates"]


def default_budgets(mean_length: float, multiples=(8, 16, 32, 64, 128)) -> list[int]:
    """Token budgets of ``multiples`` mean-length completions (one optimizer step of that many rollouts)."""
    return [int(max(1, round(m * float(mean_length)))) for m in multiples]


def tokens_to_target(tokens, cosines, target: float) -> float:
    """Tokens at which the curve first reaches ``target``: linear in ``log tokens`` between the two budgets around
    the crossing; the first budget's tokens when it is already reached there; ``inf`` when never reached; ``nan`` for
    a nan curve point before the crossing."""
    order = np.argsort(np.asarray(tokens, dtype=np.float64), kind="stable")
    t = np.asarray(tokens, dtype=np.float64)[order]
    c = np.asarray(cosines, dtype=np.float64)[order]
    for k in range(t.size):
        if not np.isfinite(c[k]):
            return float("nan")
        if c[k] >= target:
            if k == 0:
                return float(t[0])
            lo, hi = math.log(t[k - 1]), math.log(t[k])
            f = (target - c[k - 1]) / (c[k] - c[k - 1])
            return float(math.exp(lo + f * (hi - lo)))
    return float("inf")


def draw_updates(half: MethodHalf, z_method: np.ndarray, name: str, budget: int, n_draws: int, seed: int,
                 options: dict | None = None) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """``n_draws`` batches of method ``name`` at ``budget``: sketched updates (n, d), tokens (n,), infos."""
    fn, fixed = get_method(name)
    rng = np.random.default_rng([int(seed), int(budget), sum(map(ord, name))])
    z = z_method.reshape(-1, z_method.shape[-1])
    vecs, toks, infos = [], [], []
    for _ in range(int(n_draws)):
        d = fn(half, rng, int(budget), **fixed, **(options or {}))
        vecs.append(d.coef @ z[d.rows] if d.rows.size else np.zeros(z.shape[1]))
        toks.append(d.tokens)
        infos.append(d.info)
    return np.asarray(vecs), np.asarray(toks, dtype=np.float64), infos


def _est(value, reps, alpha) -> dict:
    reps = np.asarray(reps, dtype=np.float64)
    reps = reps[~np.isnan(reps)]
    if not np.isfinite(value) and not (isinstance(value, float) and math.isinf(value)):
        return {"value": None, "low": None, "high": None}
    if reps.size == 0:
        return {"value": float(value), "low": None, "high": None}
    lo, hi = np.percentile(reps, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return {"value": float(value), "low": float(lo), "high": float(hi)}


def _cell_stats(v: np.ndarray, ref: ReferenceGradient, W: np.ndarray, cnt: np.ndarray) -> dict:
    """Point estimates (weights all ones) and replicates (rows of ``W`` x rows of ``cnt``) of eq. M1-M3."""
    n, big_n = v.shape[0], ref.num_prompts
    vn = np.linalg.norm(v, axis=1)
    live = vn > 0
    inv = np.where(live, 1.0 / np.where(live, vn, 1.0), 0.0)
    M = v @ ref.prompt_terms.T  # (n, N): <v_k, u_i>
    gram = v @ v.T
    ref_gram = ref.prompt_terms @ ref.prompt_terms.T

    def stats(w, c):
        ip = M @ w / big_n  # <v_k, ĝ_w>
        norm2 = float(w @ ref.cross_gram @ w) / big_n**2
        if not norm2 > 0:
            return dict.fromkeys(("cosine", "naive_cosine", "relative_error", "bias_part", "variance_part"), np.nan)
        g_norm = math.sqrt(norm2)
        naive = math.sqrt(float(w @ ref_gram @ w)) / big_n
        cos = float(c @ (ip * inv)) / n / g_norm
        ncos = float(c @ (ip * inv)) / n / naive if naive > 0 else np.nan
        e2 = float(c @ vn**2) / n
        mu_g = float(c @ ip) / n
        mu2_plug = float(c @ gram @ c) / n**2
        var = (e2 - mu2_plug) * n / (n - 1) if n > 1 else np.nan
        mu2 = e2 - var
        if not e2 > 0:
            return {"cosine": cos, "naive_cosine": ncos, "relative_error": 1.0, "bias_part": 1.0,
                    "variance_part": 0.0}
        rel = 1.0 - mu_g**2 / (e2 * norm2)
        if mu2 > 0:
            cd2 = mu_g**2 / (mu2 * norm2)
            bias, vpart = 1.0 - cd2, cd2 * var / e2
        else:
            bias, vpart = np.nan, np.nan
        return {"cosine": cos, "naive_cosine": ncos, "relative_error": rel, "bias_part": bias, "variance_part": vpart}

    point = stats(np.ones(big_n), np.ones(n))
    reps = [stats(W[b], cnt[b]) for b in range(W.shape[0])]
    return {"point": point, "reps": {k: np.array([r[k] for r in reps]) for k in point}, "zero": int((~live).sum())}


def _summarise_infos(infos: list[dict]) -> dict:
    out = {}
    for key in sorted({k for i in infos for k in i}):
        vals = [i[key] for i in infos if isinstance(i.get(key), int | float) and i.get(key) is not None]
        if vals:
            out[key] = float(np.mean(vals))
    return out


def measure_gradient_quality(pool: GradientPool, methods: list[str], *, budgets: list[int] | None = None,
                             n_draws: int = 64, reference_samples: int = 8, table_samples: int = 4,
                             loss_type: str = "dapo", method_options: dict | None = None, n_resamples: int = 400,
                             confidence: float = 0.95, target_cosine: float | None = None, seed: int = 0,
                             progress: Callable[[str], None] | None = None) -> dict:
    """Run every method at every budget on ``pool`` and measure it against the reference (eq. M1-M3).

    Parameters
    ----------
    pool : GradientPool
    methods : list of str
        Method names (:func:`~trl_ext.gradient_quality.methods.method_names`); a method that cannot run on this
        pool (too few samples per prompt, no table, no PAIR probes) is reported with its ``error`` and skipped.
    budgets : list of int, optional
        Generated-token budgets per batch (default :func:`default_budgets` of the method half's mean length).
    n_draws : int >= 2
        Batches per method and budget.
    reference_samples, table_samples : int
        Columns per prompt of the reference and of the value table (:func:`~.pool.split_pool`).
    loss_type : str
        The TRL ``loss_type`` the user trains with (DAPO always uses ``"dapo"``).
    method_options : dict, optional
        ``{method: {option: value}}`` passed to the method's draw function.
    n_resamples : int
        Bootstrap replicates (0: no intervals).
    confidence : float in (0, 1)
    target_cosine : float, optional
        Cosine for ``tokens_to_target`` (default: the best fixed-G GRPO's cosine at the middle budget).
    seed : int
    progress : callable, optional
        Called with a line of text after each method.

    Returns
    -------
    dict
        Strict-JSON-able result (``docs/gradient_quality.md``, "Output").
    """
    if int(n_draws) < 2:
        raise ValueError(f"n_draws must be >= 2 (the variance part needs two batches), got {n_draws}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
    if not methods:
        raise ValueError("no methods to measure.")
    for name in methods:  # a misspelt name fails before any work; a method that cannot run on the pool is reported
        get_method(name)
    t0 = time.time()
    split = split_pool(pool, reference_samples=reference_samples, table_samples=table_samples, seed=seed)
    ref = reference_gradient(split.take(pool.rewards, "reference"), split.take(pool.sketches, "reference"), seed=seed)
    half, z_m = _method_half(pool, split, loss_type), split.take(pool.sketches, "method")
    budgets = sorted(int(b) for b in (budgets or default_budgets(float(np.mean(half.lengths)))))
    if budgets[0] < 1:
        raise ValueError(f"budgets must be >= 1 token, got {budgets}.")
    # the pool ceiling: the whole method half's leave-one-out gradient against the reference
    g_m = loo_prompt_terms(half.rewards, z_m)[0].mean(0)
    ceiling = float(g_m @ ref.vector / (np.linalg.norm(g_m) * math.sqrt(ref.norm2))) if np.linalg.norm(g_m) > 0 \
        else float("nan")
    alpha = 1.0 - float(confidence)
    rng = np.random.default_rng([int(seed), 0xB007])
    big_n = ref.num_prompts
    W = rng.multinomial(big_n, np.full(big_n, 1.0 / big_n), size=int(n_resamples)).astype(np.float64) \
        if n_resamples else np.zeros((0, big_n))
    results, reps_cos = {}, {}
    for name in methods:
        results[name], reps_cos[name] = _run_method(half, z_m, name, budgets, n_draws, seed,
                                                    (method_options or {}).get(name), ref, W, rng, alpha)
        if progress:
            r = results[name]
            progress(f"{name}: not run ({r['error']})" if r["error"] else f"{name}: cosine " + ", ".join(
                f"{c['cosine']['value']:.3f}@{c['tokens_mean']:.0f}" for c in r["curve"]))
    ran = [m for m in results if results[m]["error"] is None]
    best, target_cosine = _add_targets(results, reps_cos, ran, len(budgets), target_cosine, alpha)
    ranking = sorted(ran, key=lambda m: (results[m].get("tokens_to_target", {}).get("value") or float("inf"),
                                         -np.mean([c["cosine"]["value"] for c in results[m]["curve"]])))
    tok = pool.lengths
    return {
        "schema": "trl_ext.gradient_quality/v1",
        "settings": {"budgets": budgets, "n_draws": int(n_draws), "reference_samples": int(reference_samples),
                     "table_samples": int(table_samples), "method_samples": int(half.num_samples),
                     "loss_type": loss_type, "n_resamples": int(n_resamples), "confidence": float(confidence),
                     "seed": int(seed), "method_options": method_options or {}},
        "pool": {"num_prompts": pool.num_prompts, "num_samples": pool.num_samples,
                 "sketch_dim": int(pool.sketches.shape[-1]), "mean_length": float(tok.mean()),
                 "pass_rate_mean": float(np.nanmean(pool.rewards)),
                 "tokens": {"total": int(tok.sum()), "table": int(split.take(tok, "table").sum()),
                            "reference": int(split.take(tok, "reference").sum()),
                            "method": int(half.lengths.sum())},
                 **pool.info},
        "reference": {"norm2": ref.norm2, "naive_norm2": ref.naive_norm2, "n_signal_prompts": ref.n_signal_prompts,
                      "n_short_prompts": ref.n_short_prompts, "pool_ceiling_cosine": ceiling},
        "target_cosine": target_cosine,
        "best_grpo": best,
        "ranking": ranking,
        "methods": results,
        "measure_wall_s": round(time.time() - t0, 3),
    }


def _method_half(pool: GradientPool, split, loss_type: str) -> MethodHalf:
    """The method columns, the table's per-prompt pass rate (NaN without a scorable table sample) and PAIR's probes."""
    table_p = None
    if split.table.shape[1] > 0:
        r_t = split.take(pool.rewards, "table")
        ok = np.isfinite(r_t)
        table_p = np.where(ok.any(1), np.where(ok, r_t, 0.0).sum(1) / np.maximum(ok.sum(1), 1), np.nan)
    pair = None
    if pool.pair is not None:
        pair = {k: split.take(np.asarray(pool.pair[k]), "method") for k in ("p_hat", "cost_hat", "finished")}
        pair["probe_tokens"] = int(pool.pair["probe_tokens"])
    return MethodHalf(rewards=split.take(pool.rewards, "method"), lengths=split.take(pool.lengths, "method"),
                      max_completion_length=int(pool.max_completion_length), table_p=table_p, pair=pair,
                      loss_type=loss_type)


def _run_method(half, z_m, name, budgets, n_draws, seed, options, ref, W, rng, alpha) -> tuple[dict, np.ndarray]:
    """One method's curve (or its ``error`` when it cannot run on this pool) and its bootstrap cosines
    (replicates x budgets)."""
    t_m = time.time()
    cells, rc = [], []
    try:
        for b in budgets:
            v, toks, infos = draw_updates(half, z_m, name, b, n_draws, seed, options)
            cnt = rng.multinomial(len(v), np.full(len(v), 1.0 / len(v)), size=W.shape[0]).astype(np.float64)
            st = _cell_stats(v, ref, W, cnt)
            rc.append(st["reps"]["cosine"])
            cells.append({"budget": b, "tokens_mean": float(toks.mean()), "tokens_sd": float(toks.std()),
                          "draws": len(v), "zero_updates": st["zero"],
                          **{k: _est(st["point"][k], st["reps"][k], alpha) for k in st["point"]},
                          "decisions": _summarise_infos(infos)})
    except ValueError as e:
        return {"error": str(e), "curve": []}, np.zeros((W.shape[0], 0))
    reps = np.stack(rc, axis=1) if W.shape[0] else np.zeros((0, len(budgets)))
    return {"error": None, "curve": cells, "wall_s": round(time.time() - t_m, 3)}, reps


def _add_targets(results, reps_cos, ran, n_budgets, target_cosine, alpha):
    """Best fixed-G GRPO (highest mean cosine at the nominal budgets that every GRPO curve covers, each curve
    interpolated in log tokens: a larger group's batches overshoot a budget by more), the target cosine (default: its cosine at the middle budget), and each
    method's ``tokens_to_target`` and ``ratio_to_best_grpo`` with bootstrap intervals. Returns ``(best, target)``."""
    grpo = [m for m in ran if m.startswith("grpo_g")]
    budgets = [c["budget"] for c in results[grpo[0]]["curve"]] if grpo else []
    if grpo:  # compare the group sizes only at token counts every GRPO curve covers (no extrapolation)
        lo = max(min(c["tokens_mean"] for c in results[m]["curve"]) for m in grpo)
        hi = min(max(c["tokens_mean"] for c in results[m]["curve"]) for m in grpo)
        common = [b for b in budgets if lo <= b <= hi] or [math.sqrt(lo * hi)]

    def mean_cosine_at_budgets(m):  # equal tokens: each curve read at the same token counts (log-token interpolation)
        t = np.log([c["tokens_mean"] for c in results[m]["curve"]])
        y = [c["cosine"]["value"] for c in results[m]["curve"]]
        order = np.argsort(t)
        return float(np.mean(np.interp(np.log(common), t[order], np.asarray(y)[order])))

    best = max(grpo, key=mean_cosine_at_budgets) if grpo else None
    if target_cosine is None and best is not None:  # its cosine at the middle nominal budget
        c = results[best]["curve"]
        t = np.log([x["tokens_mean"] for x in c])
        order = np.argsort(t)
        target_cosine = float(np.interp(math.log(budgets[n_budgets // 2]), t[order],
                                        np.asarray([x["cosine"]["value"] for x in c])[order]))
    if target_cosine is None:
        return best, None

    def curve(m):
        return [c["tokens_mean"] for c in results[m]["curve"]], [c["cosine"]["value"] for c in results[m]["curve"]]

    for m in ran:
        toks, cos = curve(m)
        reps = np.array([tokens_to_target(toks, r, target_cosine) for r in reps_cos[m]])
        point = tokens_to_target(toks, cos, target_cosine)
        results[m]["tokens_to_target"] = _est(point, np.where(np.isinf(reps), np.nan, reps), alpha) | {
            "replicates_not_reached": int(np.isinf(reps).sum()),
            # reached already at the smallest batch: its tokens are an upper bound on what the target needs
            "upper_bound": bool(point == min(toks))}
    if best is None:
        return best, target_cosine
    tb, cb = curve(best)
    den_pt = tokens_to_target(tb, cb, target_cosine)
    den = np.array([tokens_to_target(tb, b, target_cosine) for b in reps_cos[best]])
    for m in ran:
        toks, cos = curve(m)
        num = np.array([tokens_to_target(toks, a, target_cosine) for a in reps_cos[m]])
        ok = np.isfinite(num) & np.isfinite(den)  # a replicate where either never reaches it is censored
        reps = np.where(ok, num / np.where(ok, den, 1.0), np.nan)
        results[m]["ratio_to_best_grpo"] = _est(tokens_to_target(toks, cos, target_cosine) / den_pt, reps, alpha) | {
            "replicates_censored": int((~ok).sum())}
    return best, target_cosine

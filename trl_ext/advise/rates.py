r"""Signal per generated token for each trainer, from a sampled reward matrix: pure numpy (no TRL, no torch).

Each method is reduced to per-prompt terms ``(a_i, b_i)`` whose ratio of sums over prompts is the headline
number, so the bootstrap over prompts (:func:`trl_ext.advise.regime.bootstrap_ratio_ci`) covers every one of them.
Three numbers per method (eq. B1-B3 in ``docs/advise.md``):

* ``groups_per_1k``: expected *informative* groups (groups with a nonzero advantage) per 1,000 generated tokens;
* ``rollouts_per_1k``: expected rollouts with a nonzero advantage per 1,000 generated tokens;
* ``useful_token_share``: share of generated tokens (value-table tokens included, amortized) that sit in rollouts
  with a nonzero advantage.

They count rollouts that *can* move the policy; they do not weigh how much each moves it (a rollout judged against
a batch-mean baseline carries between-prompt noise that one judged within its group does not). They are a
necessary condition for a method to pay, not a prediction of accuracy: ``docs/results.md`` shows methods with
equal counts ending at different accuracies.

Models, per prompt ``i`` with mean completion length ``l_i`` and zero-variance probability ``z_i(m)`` (eq. A4):

* **GRPO** at group size ``G``: a group costs ``G l_i`` tokens and is informative with probability
  ``1 - z_i(G)`` (eq. B4).
* **DAPO dynamic sampling** ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale") at ``G``: the same
  groups are generated and the tied ones dropped, so the counts *per generated token* equal GRPO's at ``G``; what
  changes is the batch: every kept group is informative, at ``E[G l] / E[1 - z(G)]`` generated tokens per kept
  group (the refill cost, eq. B5; keep rate ``E[1 - z(G)]``; a cap on refill rounds leaves batches short).
* **REINFORCE++** (one rollout per prompt, global batch-mean baseline): every rollout has a nonzero advantage
  unless the whole batch ties (probability ``prod_i z_i(1)``-like, negligible for batches of dozens of prompts;
  assumed 0), so ``rollouts_per_1k = 1000 / E[l]`` (eq. B6). Assumption stated: the between-prompt variance is not
  removed by its baseline (see ``variance_decomposition``'s ICC).
* **BASIS** ("BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM Reasoning"):
  one rollout per prompt; its advantage is zero when the prompt's table value is 0 or 1 and the reward equals it,
  i.e. when the ``n`` table samples and the rollout all agree: probability ``z_i(n + 1)`` (eq. B7; Jeffreys
  posterior mean when ``k < n + 1``). The table costs ``n l_i`` tokens per prompt, amortized over
  ``table_uses`` trainings on that prompt (epochs x runs sharing the table), so a rollout costs
  ``l_i (1 + n / table_uses)``.
* **V0.5 + OSLA** ("V_{0.5}: Generalist Value Model as a Prior for Sparse RL Rollouts") -- an *explicitly
  approximate* model: ``k_init`` rollouts per prompt, then rounds of ``k_step`` more for a prompt whose rollouts
  so far all tie, up to ``cap`` rollouts, with the expected extra rollouts per prompt held to
  ``extra_budget x k_init`` by limiting the number of rounds (eq. B8). The real OSLA rule allocates by the Eq. 7
  bias of the prior, not by ties, and the fused prior baseline gives tied groups a nonzero advantage whenever the
  prior disagrees with them; neither is modelled (no prior is evaluated here), so the informative share is a lower
  bound and the allocation a proxy.
"""

from __future__ import annotations

import math

import numpy as np

from .regime import check_rewards, wasted_tokens, zero_variance_estimates

__all__ = ["MethodTerms", "method_terms", "v05_schedule"]


class MethodTerms(dict):
    """``{statistic: (a, b)}`` per-prompt numerator / denominator arrays of one method, plus ``info`` (scalars)."""

    info: dict


def _mean_lengths(r: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    ok = np.isfinite(r)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok.any(axis=1), np.where(ok, lengths, 0.0).sum(axis=1) / ok.sum(axis=1), np.nan)


def _terms(inform: np.ndarray, rollouts: np.ndarray, tokens: np.ndarray, useful_tokens: np.ndarray) -> MethodTerms:
    """Per-prompt terms: informative probability, rollouts per prompt unit, tokens per unit, useful tokens."""
    t = MethodTerms(groups_per_1k=(1000.0 * inform, tokens), rollouts_per_1k=(1000.0 * rollouts * inform, tokens),
                    useful_token_share=(useful_tokens, tokens))
    t.info = {}
    return t


def v05_schedule(k_init: int, k_step: int, cap: int, extra_budget: float, z_of) -> tuple[list[int], np.ndarray]:
    """Rollout counts after each round of the approximate V0.5 model (eq. B8) and the expected rollouts per prompt.

    ``z_of(m)`` returns the per-prompt ``z_i(m)``. Rounds are added while the *mean* expected extra rollouts stay
    within ``extra_budget x k_init``. Returns ``(checkpoints m_0 = k_init, m_1, ..., m_R)`` and ``E_i``.
    """
    if k_init < 1 or k_step < 1 or cap < k_init:
        raise ValueError(f"need k_init >= 1, k_step >= 1 and cap >= k_init; got {k_init}, {k_step}, {cap}.")
    marks = [k_init]
    expected = np.full(np.shape(z_of(k_init)), float(k_init))
    while marks[-1] + k_step <= cap:
        trial = expected + k_step * np.nan_to_num(z_of(marks[-1]))
        if np.nanmean(trial) - k_init > extra_budget * k_init + 1e-12:
            break
        expected = trial
        marks.append(marks[-1] + k_step)
    return marks, expected


def method_terms(rewards, lengths, *, group_sizes=(2, 4, 8, 16), basis_table_samples: int = 32,
                 basis_table_uses: float = 1.0, v05_k_init: int = 4, v05_k_step: int = 2, v05_cap: int = 16,
                 v05_extra_budget: float = 1.0) -> dict[str, MethodTerms]:
    """Per-prompt terms of every method's signal-per-token numbers (eq. B1-B8; see the module docstring).

    Parameters
    ----------
    rewards : array_like, shape (N, k)
        See :func:`trl_ext.advise.regime.check_rewards`.
    lengths : array_like, shape (N, k)
        Generated tokens per sample.
    group_sizes : sequence of int
        GRPO / DAPO group sizes.
    basis_table_samples : int
        ``n``: reference samples per prompt in BASIS's value table (the paper: 32 or 64).
    basis_table_uses : float > 0
        Trainings on each prompt that share one table (epochs x runs); 0 table cost when the table already exists
        is ``inf``.
    v05_k_init, v05_k_step, v05_cap, v05_extra_budget
        The approximate V0.5 model's settings (``V05GRPOConfig`` defaults: 4, 2, 16, 1.0).

    Returns
    -------
    dict
        ``{"grpo_g<G>", "dapo_g<G>", "reinforce_pp", "basis", "v05_osla"} -> MethodTerms``; each maps
        ``groups_per_1k`` / ``rollouts_per_1k`` / ``useful_token_share`` (and DAPO's ``keep_rate`` /
        ``tokens_per_kept_group``) to ``(a, b)`` arrays, with scalar ``info``.
    """
    r = check_rewards(rewards)
    ln = np.asarray(lengths, dtype=np.float64)
    if ln.shape != r.shape:
        raise ValueError(f"lengths has shape {ln.shape}, rewards {r.shape}; one length per sample.")
    if not basis_table_uses > 0:
        raise ValueError(f"basis_table_uses must be > 0 (inf: the table exists already), got {basis_table_uses!r}.")
    if int(basis_table_samples) < 1:
        raise ValueError(f"basis_table_samples must be >= 1, got {basis_table_samples!r}.")
    ell = _mean_lengths(r, ln)
    z_cache: dict[int, np.ndarray] = {}

    def z_of(m: int) -> np.ndarray:
        if m not in z_cache:
            z_cache[m] = zero_variance_estimates(r, m)["z"]
        return z_cache[m]

    out: dict[str, MethodTerms] = {}
    for g in group_sizes:
        w = wasted_tokens(r, ln, g)
        inform = 1.0 - z_of(g)
        grpo = _terms(inform, np.full_like(ell, g), g * ell, w["tokens"] - w["waste"])
        grpo.info = {"group_size": g, "unbiased_prompts": int(zero_variance_estimates(r, g)["unbiased"].sum())}
        out[f"grpo_g{g}"] = grpo
        dapo = _terms(inform, np.full_like(ell, g), g * ell, w["tokens"] - w["waste"])
        dapo["keep_rate"] = (inform, np.ones_like(ell))
        dapo["tokens_per_kept_group"] = (g * ell, inform)
        dapo.info = {"group_size": g, "note": "per generated token identical to GRPO at this G; every trained group "
                                              "is informative, at tokens_per_kept_group generated tokens each"}
        out[f"dapo_g{g}"] = dapo
    rpp = _terms(np.ones_like(ell), np.ones_like(ell), ell.copy(), ell.copy())
    rpp.info = {"assumption": "every rollout has a nonzero advantage against the global batch mean (the batch "
                              "never ties entirely); between-prompt variance stays in the advantage"}
    out["reinforce_pp"] = rpp
    n = int(basis_table_samples)
    overhead = 0.0 if math.isinf(basis_table_uses) else n / float(basis_table_uses)
    zb = z_of(n + 1)
    basis = _terms(1.0 - zb, np.ones_like(ell), ell * (1.0 + overhead), ell * (1.0 - zb))
    basis.info = {"table_samples": n, "table_uses": basis_table_uses, "table_tokens_per_online_token": overhead,
                  "zero_advantage_group": n + 1,
                  "zero_advantage_unbiased": bool(np.all(zero_variance_estimates(r, n + 1)["unbiased"]))}
    out["basis"] = basis
    marks, expected = v05_schedule(v05_k_init, v05_k_step, v05_cap, v05_extra_budget, z_of)
    zv = z_of(marks[-1])
    v05 = _terms(1.0 - zv, expected, expected * ell, expected * ell * (1.0 - zv))
    v05.info = {"approximate": True, "k_init": v05_k_init, "k_step": v05_k_step, "cap": v05_cap,
                "extra_budget": v05_extra_budget, "round_checkpoints": marks,
                "mean_rollouts_per_prompt": float(np.nanmean(expected)),
                "model": "tie-driven proxy for OSLA; the prior (which can make tied groups informative) is not "
                         "modelled, so the informative share is a lower bound"}
    out["v05_osla"] = v05
    return out

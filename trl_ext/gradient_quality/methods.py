r"""Each method's batch, drawn from the method half of the pool at a token budget, by its own rules.

A method here is a function ``draw(half, rng, budget, **options) -> MethodDraw``: it picks rollouts the way the
trainer's rollout strategy would (prompts uniform over the pool's prompts, a group of distinct samples of a prompt
being a draw of ``G`` i.i.d. completions from the policy), pays each generated token, and computes the advantages with
the registered estimator of :mod:`trl_ext.estimators` (never a second implementation) and the per-row weights of the
TRL loss normalisation (:func:`policy_row_weights`). The update it would apply is ``sum_k coef_k z_{row_k}``, formed
in sketch space.

Why a group of distinct samples: a uniformly random ``G``-subset of ``K`` i.i.d. samples is itself ``G`` i.i.d.
samples, so every statistic of one group (tied or not, its advantages) has exactly the law it has in training.

The built-in methods, with the trainer each mirrors:

* ``grpo_g<G>``: TRL's fixed groups, estimator ``"grpo"``;
* ``reinforce_pp``: one rollout per prompt, estimator ``"reinforce_pp"`` (global batch baseline);
* ``dapo_g<G>``: DAPO dynamic sampling (``dynamic_sampling=True``): groups whose scorable rewards are all equal are
  generated, paid and dropped; ``loss_type="dapo"``;
* ``v05``: V0.5 (arXiv:2603.10848, Workflow Steps 1-5): generation batches of prompts, ``k_init`` rollouts each,
  Sequential OSLA rounds (:func:`trl_ext.estimators.osla_allocate`, Theorem 3.6) from the table prior, estimator
  ``"v05"``;
* ``basis``: BASIS (one rollout per prompt, the table's pass rate as ``p_hat``, estimator ``"basis"`` with its
  per-batch beta calibration);
* ``pair``: PAIR (arXiv:2608.11368): a group of ``G`` candidates is probed (the first ``probe_tokens`` tokens of each
  pooled completion), the convex design draws which to continue (:func:`trl_ext.estimators.simulate_draw`,
  Algorithm 1, heads' out-of-fold predictions as ``p_hat`` / ``cost_hat``), the continuations are the rest of
  those completions; advantages Eq. 13, loss divided by PAIR's fixed normaliser.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from trl_ext import estimators as E

__all__ = [
    "MethodHalf",
    "MethodDraw",
    "METHODS",
    "register_method",
    "get_method",
    "method_names",
    "policy_row_weights",
    "SEQUENCE_LEVEL_LOSSES",
    "TOKEN_LEVEL_LOSSES",
]

#: TRL 1.16 losses normalised per sequence (``trl/trainer/grpo_trainer.py``, ``_compute_loss``: each row's token
#: terms averaged over its length, then the rows averaged). ``trl_ext.trainers._trl_compat`` counts ``dr_grpo`` among
#: them too; here it is apart (its rows are divided by ``max_completion_length``); a test checks the families agree.
SEQUENCE_LEVEL_LOSSES = ("grpo", "sapo", "luspo")
#: TRL 1.16 losses normalised by the batch's completion tokens (``dapo``, ``cispo``, ``vespo``: global; ``bnpo``:
#: local, the same on one process).
TOKEN_LEVEL_LOSSES = ("dapo", "cispo", "vespo", "bnpo")


def policy_row_weights(loss_type: str, lengths, max_completion_length: int) -> np.ndarray:
    r"""Weight of each row's score function in the gradient of TRL's policy loss at :math:`\theta_{old}`.

    At the first step on fresh rollouts the importance ratio is 1 (no clipping acts) and with ``beta = 0`` (TRL's
    default) the gradient of TRL 1.16's loss is :math:`-\sum_i A_i w_i \nabla\log\pi(y_i|x_i)` with

    * ``grpo``, ``sapo``, ``luspo``: :math:`w_i = 1 / (n L_i)` (row-mean of token means);
    * ``dr_grpo``: :math:`w_i = 1 / (n L_{max})` (``max_completion_length``);
    * ``dapo``, ``cispo``, ``vespo``, ``bnpo``: :math:`w_i = 1 / \sum_l L_l` (token mean over the batch).

    Parameters
    ----------
    loss_type : str
    lengths : array_like (n,)
        Completion tokens of the rows in the loss (at least 1 each counts, as TRL's ``clamp(min=1)``).
    max_completion_length : int

    Returns
    -------
    ndarray (n,)
    """
    lens = np.maximum(np.asarray(lengths, dtype=np.float64), 1.0)
    n = lens.size
    if n == 0:
        return lens
    if loss_type in SEQUENCE_LEVEL_LOSSES:
        return 1.0 / (n * lens)
    if loss_type == "dr_grpo":
        return np.full(n, 1.0 / (n * float(max_completion_length)))
    if loss_type in TOKEN_LEVEL_LOSSES:
        return np.full(n, 1.0 / lens.sum())
    raise ValueError(f"loss_type {loss_type!r} is not one of TRL 1.16's: "
                     f"{SEQUENCE_LEVEL_LOSSES + ('dr_grpo',) + TOKEN_LEVEL_LOSSES}.")


@dataclass
class MethodHalf:
    """What a method may read: the method half of the pool plus the table and PAIR's probe predictions.

    Attributes
    ----------
    rewards : ndarray (N, M)
    lengths : ndarray (N, M)
    max_completion_length : int
    table_p : ndarray (N,) or None
        Each prompt's pass rate on the table columns (NaN: no scorable table sample).
    pair : dict or None
        ``p_hat``, ``cost_hat``, ``finished`` (N, M) on the method columns, ``probe_tokens``.
    loss_type : str
        The user's TRL ``loss_type`` (DAPO uses ``"dapo"``).
    """

    rewards: np.ndarray
    lengths: np.ndarray
    max_completion_length: int
    table_p: np.ndarray | None = None
    pair: dict | None = None
    loss_type: str = "dapo"

    @property
    def num_prompts(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_samples(self) -> int:
        return int(self.rewards.shape[1])


@dataclass
class MethodDraw:
    """One batch of a method.

    Attributes
    ----------
    rows : ndarray (m,) int
        Flat indices ``i * M + j`` into the method half of the rows in the loss.
    coef : ndarray (m,)
        ``A_k w_k``: the update is ``sum_k coef_k z_{rows_k}`` (up to the sign and the learning rate).
    tokens : int
        Generated tokens paid, discarded ones (DAPO's dropped groups, PAIR's unselected probes) included.
    info : dict
        The method's decisions (rollouts per prompt, tied groups, beta, inclusion probabilities...).
    """

    rows: np.ndarray
    coef: np.ndarray
    tokens: int
    info: dict = field(default_factory=dict)


MethodFn = Callable[..., MethodDraw]
METHODS: dict[str, MethodFn] = {}


def register_method(name: str) -> Callable[[MethodFn], MethodFn]:
    """Register ``draw(half, rng, budget, **options) -> MethodDraw`` under ``name``."""

    def deco(fn: MethodFn) -> MethodFn:
        if name in METHODS and METHODS[name] is not fn:
            raise ValueError(f"a gradient-quality method named {name!r} is registered already.")
        METHODS[name] = fn
        return fn

    return deco


def method_names(group_sizes=(2, 4, 8, 16), dapo_group_size: int = 8) -> list[str]:
    """The default method list: fixed GRPO groups, REINFORCE++, DAPO, V0.5, BASIS, PAIR."""
    return [f"grpo_g{g}" for g in group_sizes] + ["reinforce_pp", f"dapo_g{dapo_group_size}", "v05", "basis", "pair"]


def get_method(name: str) -> tuple[MethodFn, dict]:
    """``(draw function, fixed options)`` of a method name (``grpo_g<G>``, ``dapo_g<G>`` and ``james_stein_g<G>``
    carry their ``G``)."""
    for prefix in ("grpo_g", "dapo_g", "james_stein_g"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            g = int(name[len(prefix):])
            if g < 2:
                raise ValueError(f"{name}: a group needs G >= 2 (REINFORCE++ is the one-rollout method).")
            return METHODS[prefix[:-2]], {"group_size": g}
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: grpo_g<G>, dapo_g<G>, james_stein_g<G>, "
                         f"{', '.join(sorted(k for k in METHODS if k not in ('grpo', 'dapo', 'james_stein')))}.")
    return METHODS[name], {}


# ------------------------------------------------------------------------------------------------ helpers
def _group(half: MethodHalf, i: int, g: int, rng: np.random.Generator) -> np.ndarray:
    m = half.num_samples
    if g > m:
        raise ValueError(f"a group of {g} needs {g} distinct samples per prompt but the method half has {m}: raise "
                         f"num_samples (or lower reference_samples / table_samples).")
    return i * m + rng.choice(m, size=g, replace=False)


def _finish(half: MethodHalf, rows, adv, tokens: int, loss_type: str, info: dict) -> MethodDraw:
    rows = np.asarray(rows, dtype=np.int64)
    adv = np.nan_to_num(np.asarray(adv, dtype=np.float64), nan=0.0)
    w = policy_row_weights(loss_type, half.lengths.reshape(-1)[rows], half.max_completion_length)
    return MethodDraw(rows=rows, coef=adv * w, tokens=int(tokens), info=info)


def _single_rollouts(half: MethodHalf, rng: np.random.Generator, budget: int) -> tuple[np.ndarray, int]:
    """One rollout per prompt draw until ``budget`` tokens are paid: ``(rows, tokens)``."""
    flat_l = half.lengths.reshape(-1)
    rows, tokens = [], 0
    while tokens < budget:
        idx = _group(half, int(rng.integers(half.num_prompts)), 1, rng)
        rows.append(idx)
        tokens += int(flat_l[idx].sum())
    return np.concatenate(rows), tokens


def _tied(r: np.ndarray) -> bool:
    f = r[np.isfinite(r)]
    return f.size < 2 or bool(f.max() == f.min())


# ------------------------------------------------------------------------------------------------ methods
def _fixed_groups(half: MethodHalf, rng: np.random.Generator, budget: int, group_size: int,
                  estimator: str) -> MethodDraw:
    """Fixed groups of ``group_size``: prompts drawn until the budget is spent (the last group completes it), the
    advantages from the registered ``estimator`` over the whole draw."""
    flat_r, flat_l = half.rewards.reshape(-1), half.lengths.reshape(-1)
    rows, gids, tokens, tied = [], [], 0, 0
    while tokens < budget:
        idx = _group(half, int(rng.integers(half.num_prompts)), group_size, rng)
        rows.append(idx)
        gids.append(np.full(group_size, len(gids)))
        tokens += int(flat_l[idx].sum())
        tied += _tied(flat_r[idx])
    rows, gids = np.concatenate(rows), np.concatenate(gids)
    res = E.get_advantage_estimator(estimator)(flat_r[rows], gids)
    return _finish(half, rows, res.advantages, tokens, half.loss_type,
                   {"groups": len(set(gids.tolist())), "tied_groups": tied, "rollouts_per_prompt": group_size})


@register_method("grpo")
def grpo_draw(half: MethodHalf, rng: np.random.Generator, budget: int, *, group_size: int) -> MethodDraw:
    """TRL's fixed groups of ``group_size`` with GRPO's group-mean advantages."""
    return _fixed_groups(half, rng, budget, group_size, "grpo")


@register_method("james_stein")
def james_stein_draw(half: MethodHalf, rng: np.random.Generator, budget: int, *, group_size: int) -> MethodDraw:
    """Fixed groups with the James-Stein shrinkage baseline (``james_stein`` estimator, arXiv:2511.03710)."""
    return _fixed_groups(half, rng, budget, group_size, "james_stein")


@register_method("dapo")
def dapo_draw(half: MethodHalf, rng: np.random.Generator, budget: int, *, group_size: int) -> MethodDraw:
    """DAPO dynamic sampling: groups of ``group_size``; tied ones (all scorable rewards equal) are paid and dropped."""
    flat_r, flat_l = half.rewards.reshape(-1), half.lengths.reshape(-1)
    rows, gids, tokens, n_groups, dropped_tokens = [], [], 0, 0, 0
    while tokens < budget:
        idx = _group(half, int(rng.integers(half.num_prompts)), group_size, rng)
        n_groups += 1
        t = int(flat_l[idx].sum())
        tokens += t
        if _tied(flat_r[idx]):
            dropped_tokens += t
            continue
        rows.append(idx)
        gids.append(np.full(group_size, len(gids)))
    info = {"groups": n_groups, "kept_groups": len(rows), "tied_groups": n_groups - len(rows),
            "dropped_tokens": dropped_tokens, "rollouts_per_prompt": group_size}
    if not rows:
        return MethodDraw(np.zeros(0, dtype=np.int64), np.zeros(0), tokens, info)
    rows, gids = np.concatenate(rows), np.concatenate(gids)
    res = E.get_advantage_estimator("grpo")(flat_r[rows], gids)
    return _finish(half, rows, res.advantages, tokens, "dapo", info)


@register_method("reinforce_pp")
def reinforce_pp_draw(half: MethodHalf, rng: np.random.Generator, budget: int) -> MethodDraw:
    """REINFORCE++: one rollout per prompt draw, the global batch baseline."""
    flat_r = half.rewards.reshape(-1)
    rows, tokens = _single_rollouts(half, rng, budget)
    res = E.get_advantage_estimator("reinforce_pp")(flat_r[rows], np.arange(rows.size))
    return _finish(half, rows, res.advantages, tokens, half.loss_type, {"rollouts_per_prompt": 1})


def _need_table(half: MethodHalf, method: str) -> np.ndarray:
    if half.table_p is None:
        raise ValueError(f"{method} needs the value table (table_samples >= 1 per prompt).")
    return half.table_p


@register_method("basis")
def basis_draw(half: MethodHalf, rng: np.random.Generator, budget: int) -> MethodDraw:
    """BASIS: one rollout per prompt draw, ``p_hat`` = the table's pass rate of its prompt (NaN -> the estimator's
    fallback), estimator ``"basis"`` (batchwise leave-one-out baseline, per-batch robust beta calibration)."""
    p = _need_table(half, "basis")
    flat_r = half.rewards.reshape(-1)
    rows, tokens = _single_rollouts(half, rng, budget)
    prompt = rows // half.num_samples
    res = E.get_advantage_estimator("basis")(flat_r[rows], prompt, p_hat=p[prompt])
    beta = res.extras.get("beta")
    info = {"rollouts_per_prompt": 1, "beta": float(np.nanmean(beta)) if beta is not None else None,
            "baseline_sq_error": float(np.nanmean((flat_r[rows] - res.baselines) ** 2))}
    return _finish(half, rows, res.advantages, tokens, half.loss_type, info)


@register_method("v05")
def v05_draw(half: MethodHalf, rng: np.random.Generator, budget: int, *, batch_prompts: int = 4,
             k_init: int = E.V05_K_INIT, cost: float = E.V05_PAPER_COST, step: int = 2,
             min_active_frac: float | None = 0.25) -> MethodDraw:
    """V0.5: generation batches of ``batch_prompts`` prompts, ``k_init`` rollouts each, OSLA rounds
    (:func:`~trl_ext.estimators.osla_allocate`, cap ``min(round(1/sqrt(cost)), M)``) from the table prior
    ``V = 2 p - 1``; estimator ``"v05"`` on the whole batch, rewards mapped from [0, 1]."""
    p = _need_table(half, "v05")
    m = half.num_samples
    cap = min(E.osla_cap(cost), m)
    if k_init > m:
        raise ValueError(f"v05 needs k_init = {k_init} samples per prompt, the method half has {m}.")
    flat_r, flat_l = half.rewards.reshape(-1), half.lengths.reshape(-1)
    rows, gids, priors, ks, tokens, rounds = [], [], [], [], 0, 0
    mean_p = float(np.nanmean(p)) if np.isfinite(p).any() else 0.5
    while tokens < budget:
        prompts = rng.integers(half.num_prompts, size=int(batch_prompts))
        order = [rng.permutation(m) for _ in prompts]
        used = np.zeros(len(prompts), dtype=np.int64)

        def sample(idx, n, prompts=prompts, order=order, used=used):
            out = np.empty((len(idx), n))
            for a, j in enumerate(idx):
                cols = order[j][used[j]:used[j] + n]
                used[j] += n
                out[a] = 2.0 * flat_r[prompts[j] * m + cols] - 1.0
            return out

        pri = np.where(np.isfinite(p[prompts]), p[prompts], mean_p)
        alloc = E.osla_allocate(sample, 2.0 * pri - 1.0, cost=cost, k_init=int(k_init), step=int(step), cap=cap,
                                min_active_frac=min_active_frac)
        rounds += alloc.rounds
        for j, i in enumerate(prompts):
            idx = i * m + order[j][:alloc.k[j]]
            rows.append(idx)
            gids.append(np.full(idx.size, len(gids)))
            priors.append(2.0 * pri[j] - 1.0)
            ks.append(int(alloc.k[j]))
            tokens += int(flat_l[idx].sum())
    rows, gids = np.concatenate(rows), np.concatenate(gids)
    res = E.get_advantage_estimator("v05")(flat_r[rows], gids, priors=np.asarray(priors), reward_range=(0.0, 1.0))
    ks = np.asarray(ks)
    tied = sum(_tied(flat_r[rows[gids == g]]) for g in range(len(ks)))
    info = {"rollouts_per_prompt": float(ks.mean()), "rollouts_per_prompt_max": int(ks.max()), "rounds": rounds,
            "tied_groups": int(tied), "groups": int(len(ks))}
    return _finish(half, rows, res.advantages, tokens, half.loss_type, info)


@register_method("pair")
def pair_draw(half: MethodHalf, rng: np.random.Generator, budget: int, *, group_size: int = 16,
              budget_ratio: float = 0.5, pi_min: float = 0.08, batch_prompts: int = 1) -> MethodDraw:
    """PAIR: probe ``group_size`` candidates, draw the continuations by the convex design, Eq. 13 advantages.

    Tokens paid: every candidate's probe (``min(L, probe_tokens)``) plus the rest of each selected unfinished one.
    The loss divides by PAIR's fixed normaliser (prompts probed, times ``max_completion_length`` for token-level
    losses; :func:`trl_ext.estimators.fixed_normalizer`) instead of TRL's realised rows or tokens.
    """
    if half.pair is None:
        raise ValueError("pair needs the prefix heads' predictions (the pool was built with pair probes off).")
    tau = int(half.pair["probe_tokens"])
    flat_r, flat_l = half.rewards.reshape(-1), half.lengths.reshape(-1)
    ph, ch = half.pair["p_hat"].reshape(-1), half.pair["cost_hat"].reshape(-1)
    fin = half.pair["finished"].reshape(-1)
    rows, advs, tokens, probed, incl, n_sel = [], [], 0, 0, [], 0
    while tokens < budget:
        idx = _group(half, int(rng.integers(half.num_prompts)), group_size, rng)
        probed += 1
        tokens += int(np.minimum(flat_l[idx], tau).sum())
        adv, draw, _ = E.simulate_draw(ph[idx], ch[idx], fin[idx], flat_r[idx], rng,
                                       design={"budget_ratio": budget_ratio, "pi_min": pi_min})
        sel = np.asarray(draw.selected, dtype=bool)
        tokens += int(np.maximum(flat_l[idx][sel & ~fin[idx]] - tau, 0).sum())
        n_sel += int(sel.sum())
        incl.extend(np.asarray(draw.pi)[~fin[idx]].tolist())
        rows.append(idx[sel])
        advs.append(adv[sel])
    rows, adv = np.concatenate(rows), np.concatenate(advs)
    tok_level = half.loss_type in TOKEN_LEVEL_LOSSES
    norm = E.fixed_normalizer(probed, int(half.max_completion_length) if tok_level else None)
    inc = np.asarray(incl) if incl else np.zeros(0)
    ess = float(inc.sum() ** 2 / (inc ** 2).sum()) if inc.size and (inc ** 2).sum() > 0 else None
    info = {"groups": probed, "rollouts_per_prompt": n_sel / probed, "candidates_per_prompt": group_size,
            "inclusion_mean": float(inc.mean()) if inc.size else None,
            "inclusion_min": float(inc.min()) if inc.size else None, "inclusion_ess": ess}
    coef = np.nan_to_num(adv, nan=0.0) / norm
    if half.loss_type in SEQUENCE_LEVEL_LOSSES:
        coef = coef / np.maximum(flat_l[rows], 1)  # each row's token mean
    elif half.loss_type == "dr_grpo":
        coef = coef / float(half.max_completion_length)
    return MethodDraw(rows=rows.astype(np.int64), coef=coef, tokens=int(tokens), info=info)

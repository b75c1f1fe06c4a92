"""The ``"pair"`` entry of the advantage-estimator registry: Eq. 13 on a flat batch of ragged candidate groups."""

from __future__ import annotations

import numpy as np

from .._validation import as_float_array, factorize_groups, to_numpy
from ..baselines import AdvantageResult, register_advantage_estimator
from ._checks import check_probabilities, check_selected
from .advantages import pair_advantages, scorable_selection


@register_advantage_estimator("pair", side_inputs={"selected": "row", "inclusion": "row"},
                              used_by="trl_ext.PAIRTrainer")
def pair_group_advantages(rewards, group_ids, selected, inclusion, w_max=None, self_normalize=False) -> AdvantageResult:
    """Eq. 13 PAIR advantages for a flat batch of ragged candidate groups (registry name ``"pair"``).

    Each group is the *full* candidate group (all G prefixes, continued or not), so that M = G(G-1)/2 is the
    complete-pair normalizer. Independent Bernoulli continuation within each group.

    Parameters
    ----------
    rewards : array_like, shape (N,)
        Rewards; unselected rows are ignored (NaN allowed there).
    group_ids : array_like, shape (N,)
    selected : array_like of bool, shape (N,)
    inclusion : array_like, shape (N,)
        Logged marginal continuation probabilities in (0, 1].
    w_max, self_normalize : see :func:`pair_advantages` (biased variants).

    Returns
    -------
    AdvantageResult
        ``advantages`` is 0 for unselected rows. ``baselines`` is NaN (PAIR has no per-rollout baseline) and
        ``scale`` is 1. A *selected* row with a NaN reward (unscorable completion) follows PAIR's one NaN rule
        (:func:`scorable_selection`): it observes no edge, gets advantage 0 and is counted in ``n_nan``; the other
        rows keep their logged weights. Groups with a single candidate get advantage 0 (``n_degenerate``).
        ``extras`` carries per-group ``n_edges``, ``ess``, ``max_weight`` and ``biased``.
    """
    r = as_float_array(rewards, "rewards", ndim=1)
    n = r.shape[0]
    codes, uniq = factorize_groups(group_ids, n)
    sel = to_numpy(selected)
    if sel.shape != (n,):
        raise ValueError(f"`selected` must have shape ({n},), got {sel.shape}.")
    sel = check_selected(sel, n)
    pi = check_probabilities("inclusion", inclusion, n)
    sel_ok, n_nan = scorable_selection(r, sel)
    adv = np.zeros(n)
    n_deg = 0
    extras = {"n_edges": [], "ess": [], "max_weight": [], "biased": self_normalize or w_max is not None}
    for g in range(uniq.shape[0]):
        idx = np.flatnonzero(codes == g)
        if idx.size < 2:
            n_deg += int(idx.size)
            extras["n_edges"].append(0)
            extras["ess"].append(0.0)
            extras["max_weight"].append(0.0)
            continue
        res = pair_advantages(r[idx], sel[idx], pi[idx], w_max=w_max, self_normalize=self_normalize)
        adv[idx] = res.advantages
        extras["n_edges"].append(res.n_edges)
        extras["ess"].append(res.ess)
        extras["max_weight"].append(res.max_weight)
    n_zero_std = 0
    for g in range(uniq.shape[0]):
        rr = r[(codes == g) & sel_ok]
        if rr.size >= 1 and np.all(rr == rr[0]):
            n_zero_std += 1
    extras["n_unselected"] = int((~sel).sum())
    return AdvantageResult(
        advantages=adv,
        baselines=np.full(n, np.nan),
        scale=np.ones(n),
        n_nan=n_nan,
        n_groups=int(uniq.shape[0]),
        n_zero_std_groups=n_zero_std,
        n_degenerate=n_deg,
        extras=extras,
    )


@register_advantage_estimator("pair_draw", side_inputs={"draws": "strategy"}, sees_unscorable=True,
                              used_by="trl_ext.PAIRTrainer")
def pair_draw_group_advantages(rewards, group_ids, draws, w_max=None, self_normalize=False, standardize=False,
                               ) -> AdvantageResult:
    r"""Eq. 13 advantages of the completed vertices of designed candidate groups (registry name ``"pair_draw"``).

    What :class:`~trl_ext.PAIRTrainer` trains on. A batch row is a *completed* candidate; the design's view of the
    whole group -- every candidate's inclusion probability, which were selected, the anchor pair (Appendix B) --
    is not in the batch, so it comes as the estimator keyword ``draws`` (the rollout strategy's
    ``estimator_inputs``): one ``(GroupDraw, completed)`` per group in order of first appearance, ``completed``
    the candidate indices of that group's rows in batch order. Each group's advantages are
    :func:`~trl_ext.estimators.pair.group_draw.draw_advantages` of its full candidate vector (NaN on candidates
    that were not completed):

    .. math:: \tilde A_i = \frac{1}{2M}\sum_{j\ne i} \frac{J_iJ_j}{\rho_{ij}} (r_i - r_j),\qquad M = \binom G2.

    Parameters
    ----------
    rewards : array_like, shape (N,)
        Rewards of the completed vertices; NaN marks an unscorable completion (PAIR's one NaN rule: no edge,
        advantage 0, counted in ``n_nan``). Registered with ``sees_unscorable``, so the trainer passes those rows.
    group_ids : array_like, shape (N,)
    draws : sequence of (GroupDraw, sequence of int)
        One per group, as described above.
    w_max, self_normalize, standardize
        The biased Appendix B variants (:func:`~trl_ext.estimators.pair.group_draw.draw_advantages`).

    Returns
    -------
    AdvantageResult
        ``baselines`` NaN, ``scale`` 1; ``extras["results"]`` the per-group
        :class:`~trl_ext.estimators.pair.PairAdvantages` (edges, ESS, weights) for the diagnostics.

    Raises
    ------
    ValueError
        ``draws`` does not have one entry per group, or a group's row count differs from its ``completed`` list.
    """
    from .group_draw import draw_advantages

    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    n = r.shape[0]
    codes, uniq = factorize_groups(group_ids, n)
    draws = list(draws)
    if len(draws) != uniq.shape[0]:
        raise ValueError(f"pair_draw: {len(draws)} designed groups but the batch has {uniq.shape[0]} groups.")
    adv = np.zeros(n)
    results, n_nan, n_zero_std = [], 0, 0
    for g, (draw, done) in enumerate(draws):
        idx = np.flatnonzero(codes == g)
        done = np.asarray(done, dtype=np.int64)
        if idx.size != done.size:
            raise ValueError(f"pair_draw: group {g} has {idx.size} rows but {done.size} completed candidates.")
        r_full = np.full(np.asarray(draw.pi).shape[0], np.nan)
        r_full[done] = r[idx]
        a_full, res = draw_advantages(r_full, draw, w_max=w_max, self_normalize=self_normalize,
                                      standardize=standardize)
        adv[idx] = a_full[done]
        results.append(res)
        n_nan += int(res.n_unscorable)
        finite = r[idx][np.isfinite(r[idx])]
        n_zero_std += int(finite.size >= 1 and bool(np.all(finite == finite[0])))
    return AdvantageResult(advantages=adv, baselines=np.full(n, np.nan), scale=np.ones(n), n_nan=n_nan,
                           n_groups=int(uniq.shape[0]), n_zero_std_groups=n_zero_std, n_degenerate=0,
                           extras={"results": results})

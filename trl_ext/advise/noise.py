"""Scorer noise floor of each reward function on the advice sample ("Measurement Discipline for RLVR", section 5
step 1 and checklist item 1; :func:`trl_ext.measurement.noise_floor.measure_noise_floor`, ``trl-ext noise-floor``).

For each reward function: ``n_items`` sampled completions (drawn with ``seed`` among those the function scores) are
scored alone and at ``positions`` slots of batches of ``batch_size`` completions whose other members are drawn from
the rest of the sample (the filler); a completion is scored together with its own prompt and dataset columns, as
TRL calls a reward function. Per item, the spread is max - min of its ``1 + positions`` scores; the floor is
``multiplier x quantile(spreads, 0.95)`` (eq. N1), in the function's own units and in the units of the combined,
rescaled reward the advice uses (``floor x |weight| / (high - low)``, eq. N2). A reward that is a pure function of
its own completion has floor exactly 0; a positive floor means a group's rewards can differ by up to that much for
reasons that have nothing to do with the completions, which the zero-variance statistics (exact ties) cannot see.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["reward_noise_floors"]


def _pool_scores(func, prompts, completions, completion_ids, columns) -> np.ndarray:
    """One call of ``func`` on the whole sample; ``None`` -> NaN."""
    from transformers import TrainerState

    from trl_ext.measurement.offline_sampling import call_reward, discard_log, reward_func_name

    out = list(call_reward(func, prompts=prompts, completions=completions, completion_ids=completion_ids,
                            trainer_state=TrainerState(), log_extra=discard_log, log_metric=discard_log, **columns))
    if len(out) != len(completions):
        raise ValueError(f"reward function {reward_func_name(func)!r} returned {len(out)} rewards for "
                         f"{len(completions)} completions.")
    return np.asarray([math.nan if v is None else float(v) for v in out], dtype=np.float64)


def _batch_scorer(func, prompts, completions, completion_ids, columns):
    """``score_fn(list of 'sample:<index>' ids) -> scores`` for :func:`measure_noise_floor`: the ids name samples;
    each batch calls ``func`` once, TRL style."""
    from transformers import TrainerState

    from trl_ext.measurement.offline_sampling import call_reward, discard_log

    def score(ids: list[str]) -> list:
        idx = [int(s.split(":", 1)[1]) for s in ids]
        return list(call_reward(func, prompts=[prompts[i] for i in idx], completions=[completions[i] for i in idx],
                                 completion_ids=[completion_ids[i] for i in idx], trainer_state=TrainerState(),
                                 log_extra=discard_log, log_metric=discard_log,
                                 **{c: [v[i] for i in idx] for c, v in columns.items()}))

    return score


def reward_noise_floors(funcs, prompts, completions, completion_ids, columns, *, weights=None, reward_range=None,
                        n_items: int = 60, positions: int = 4, batch_size: int = 8, multiplier: float = 3.0,
                        seed: int = 0) -> dict:
    """The ``noise_floor`` section of the advice: one noise floor per reward function.

    Parameters
    ----------
    funcs : list of callables
        TRL-signature reward functions.
    prompts, completions, completion_ids : list
        One entry per sample (flattened ``N x k``), in the form the rewards were called with.
    columns : dict of lists
        Dataset columns forwarded to the rewards, one value per sample.
    weights : list of float, optional
        The reward weights (default 1 each), for the floor in combined-reward units (eq. N2).
    reward_range : (low, high), optional
        The rescaling of the combined reward, for eq. N2.
    n_items, positions, batch_size, multiplier, seed
        The protocol of :func:`~trl_ext.measurement.noise_floor.measure_noise_floor` (about 60 items, 4 slots of
        an 8-sequence batch, 3 x p95).

    Returns
    -------
    dict
        ``measured`` (True), the settings, and ``per_reward[name]``: ``floor``, ``p95_spread``, ``max_spread``,
        ``median_spread``, ``n_items``, ``floor_combined_units``, ``item_samples`` (flat sample indices), or
        ``{"measured": False, "reason": ...}`` for a function the protocol cannot score (fewer than ``batch_size``
        scorable samples, or ``None`` / an error inside a batch).
    """
    from trl_ext.measurement.noise_floor import NoiseFloorError, measure_noise_floor
    from trl_ext.measurement.offline_sampling import reward_func_name

    if n_items < 1 or batch_size < 2 or not 1 <= positions <= batch_size:
        raise ValueError(f"noise floor settings: n_items >= 1, batch_size >= 2 and 1 <= positions <= batch_size; got "
                         f"{n_items}, {batch_size}, {positions}.")
    weights = [1.0] * len(funcs) if weights is None else [float(w) for w in weights]
    scale = 1.0 if reward_range is None else 1.0 / (float(reward_range[1]) - float(reward_range[0]))
    per, names = {}, []
    for f, w in zip(funcs, weights):
        name = reward_func_name(f)
        name = name if name not in names else f"{name}#{len(names)}"
        names.append(name)
        pool = _pool_scores(f, prompts, completions, completion_ids, columns)
        ok = np.flatnonzero(np.isfinite(pool))
        if ok.size < batch_size:
            per[name] = {"measured": False, "reason": f"{ok.size} scorable samples; the protocol needs at least "
                                                      f"batch_size = {batch_size}."}
            continue
        rng = np.random.default_rng(seed)
        items = rng.choice(ok, size=min(n_items, ok.size), replace=False)
        filler = np.setdiff1d(ok, items) if ok.size - items.size >= batch_size - 1 else ok
        try:
            res = measure_noise_floor(_batch_scorer(f, prompts, completions, completion_ids, columns),
                                      [f"sample:{i}" for i in items], [f"sample:{i}" for i in filler],
                                      positions=positions, seed=seed, batch_size=batch_size, multiplier=multiplier)
        except NoiseFloorError as e:
            per[name] = {"measured": False, "reason": f"the noise-floor protocol could not score it: {e}"}
            continue
        per[name] = {"measured": True, "floor": res.floor, "p95_spread": res.p95_spread,
                     "max_spread": float(res.spreads.max()), "median_spread": float(np.median(res.spreads)),
                     "n_items": len(res.items), "floor_combined_units": res.floor * abs(w) * scale,
                     "item_samples": [int(i) for i in items]}
    return {"measured": True, "n_items": int(n_items), "positions": int(positions), "batch_size": int(batch_size),
            "multiplier": float(multiplier), "seed": int(seed), "per_reward": per}

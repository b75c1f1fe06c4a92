"""The ``"v05"`` registry entry: V0.5's advantages as its trainer computes them (reward mapping, Eq. 9, Eq. 10).

"V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts" (arXiv:2603.10848), Workflow Steps 1 and 5: rewards
bounded in ``[reward_low, reward_high]`` are mapped onto ``[-1, 1]``, fused with one value prior per prompt by
empirical shrinkage (Eq. 6-9, :func:`~trl_ext.estimators.v05.fused_advantages_batch`), and each prompt's
advantages are multiplied by the Eq. 10 weight ``c_j = kbar / k_j`` (:func:`~trl_ext.estimators.equal_prompt_weights`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import factorize_groups
from ..baselines import AdvantageResult, register_advantage_estimator
from .fusion import DEFAULT_SIGMA_FLOOR, fused_advantages_batch, to_signed_reward
from .weights import equal_prompt_weights

__all__ = ["v05_advantages", "v05_signed_rewards", "PROMPT_WEIGHTINGS"]

PROMPT_WEIGHTINGS = ("equal", "rollout")

REWARD_RANGE_SLACK = 1e-6
"""Relative slack of the declared reward range: weighted sums rounded just past a bound are accepted (and clipped)."""


def v05_signed_rewards(rewards: Any, low: float, high: float) -> np.ndarray:
    """Rewards declared in ``[low, high]`` mapped onto ``[-1, 1]`` (Workflow Step 1's ``V = 2p - 1`` scale).

    :func:`~trl_ext.estimators.to_signed_reward` with a relative slack of 1e-6, and errors in the V0.5 config's
    words. NaN (unscorable) passes through.

    Parameters
    ----------
    rewards : array_like, shape (N,)
    low, high : float
        The declared range (``v05_reward_low``, ``v05_reward_high``).

    Returns
    -------
    ndarray of float64, shape (N,)

    Raises
    ------
    ValueError
        On an infinite reward, or a finite one outside the declared range (beyond the slack).
    """
    r = np.asarray(rewards, dtype=np.float64)
    if np.isinf(r).any():
        raise ValueError("V0.5: a reward function returned an infinite reward; return None for unscorable ones.")
    try:
        return np.asarray(to_signed_reward(r, low, high, rel_tol=REWARD_RANGE_SLACK), dtype=np.float64)
    except ValueError as e:
        fin = r[np.isfinite(r)]
        raise ValueError(
            f"V0.5: rewards must lie in the declared range [v05_reward_low={low}, v05_reward_high={high}] (the "
            f"fusion's noise bound 1/k needs rewards mapped to [-1, 1]); got min={fin.min():.6g}, "
            f"max={fin.max():.6g}. Set v05_reward_low/v05_reward_high in V05GRPOConfig to the range your reward "
            "functions (x weights) produce."
        ) from e


@register_advantage_estimator("v05", side_inputs={"priors": "group"}, used_by="trl_ext.V05GRPOTrainer")
def v05_advantages(rewards: Any, group_ids: Any, priors: Any = None, *, floor: float = DEFAULT_SIGMA_FLOOR,
                   reward_range: tuple[float, float] | None = None, prompt_weighting: str = "rollout") -> AdvantageResult:
    """V0.5 advantages of ragged groups (registry name ``"v05"``): ``c_j (r_i - mu*_j) / max(sqrt(1 - mu*_j^2),
    floor)``.

    Parameters
    ----------
    rewards, group_ids : array_like, shape (N,)
        Rewards (in ``reward_range``, or in [-1, 1] when it is ``None``); NaN = unscorable (advantage 0, excluded
        from the fusion and from ``k_j``).
    priors : array_like, shape (G,)
        One value prior in [-1, 1] per group, in order of first appearance (``V = 2p - 1``). Required.
    floor : float in (0, 1]
        ``v05_sigma_floor``.
    reward_range : (low, high), optional
        Map rewards with :func:`v05_signed_rewards` first; ``None``: they are already in [-1, 1].
    prompt_weighting : {"rollout", "equal"}
        ``"equal"``: multiply group ``j``'s advantages by Eq. 10's ``c_j = kbar / k_j`` (``k_j`` its scorable
        rollouts); ``"rollout"``: ``c_j = 1`` (every rollout weighs the same).

    Returns
    -------
    AdvantageResult
        As :func:`~trl_ext.estimators.v05.fused_advantages_batch` (``extras["fusion"]`` per group), advantages times
        ``c_j``; ``extras["prompt_weight"]`` holds ``c`` per group. With the defaults this is exactly
        ``fused_advantages_batch``.
    """
    if prompt_weighting not in PROMPT_WEIGHTINGS:
        raise ValueError(f"prompt_weighting must be one of {PROMPT_WEIGHTINGS}, got {prompt_weighting!r}.")
    r = np.asarray(rewards, dtype=np.float64) if reward_range is None else v05_signed_rewards(rewards, *reward_range)
    res = fused_advantages_batch(r, group_ids, priors, floor=floor)
    k = res.extras["fusion"].k
    c = equal_prompt_weights(k) if prompt_weighting == "equal" else np.ones(len(k))
    if prompt_weighting == "rollout":
        return AdvantageResult(res.advantages, res.baselines, res.scale, res.n_nan, res.n_groups,
                               res.n_zero_std_groups, res.n_degenerate, {**res.extras, "prompt_weight": c})
    codes, _ = factorize_groups(group_ids, r.shape[0])
    return AdvantageResult(res.advantages * c[codes], res.baselines, res.scale, res.n_nan, res.n_groups,
                           res.n_zero_std_groups, res.n_degenerate, {**res.extras, "prompt_weight": c})

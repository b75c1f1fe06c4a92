"""Equal per-prompt weights of V0.5's surrogate (Eq. 10) for losses that sum over all rollouts of a batch."""

from __future__ import annotations

from typing import Any

import numpy as np

from .osla import check_k


def equal_prompt_weights(k: Any) -> np.ndarray:
    """Per-prompt advantage multipliers ``c_j = kbar / k_j`` that give every prompt the same total weight (Eq. 10).

    The paper's surrogate (Eq. 10) averages ``(1/k) sum_i`` over each prompt's ``k`` rollouts, then over prompts:
    every prompt weighs the same whatever ``k`` OSLA gave it. A loss that sums over all rollouts of the batch with one
    global normalizer (TRL's token-level ``dapo``/``cispo``/``vespo``) weighs a prompt in proportion to its
    ``k``; multiplying prompt ``j``'s advantages by ``c_j`` restores equal weights (for equal completion lengths:
    ``c_j k_j = kbar`` for every prompt). ``kbar`` is the mean of ``k``, so ``sum_j c_j k_j = sum_j k_j``: the
    total advantage mass of the batch, and hence the overall gradient scale, is unchanged. The clipped surrogate is
    positively homogeneous in ``A``, so prompt ``j``'s gradient is multiplied by exactly ``c_j``.

    Parameters
    ----------
    k : array_like of int, shape (G,)
        Rollouts per prompt that carry an advantage (scorable rollouts), each >= 1.

    Returns
    -------
    ndarray of float64, shape (G,)
        ``mean(k) / k``; in ``[k_min / k_max, k_max / k_min]`` (at most ``cap / k_init`` = 4 with the paper's
        defaults, so ``|c_j A_i| <= 4 x 2 / sigma_floor``).
    """
    kk = check_k(k)
    if kk.ndim != 1 or kk.size == 0:
        raise ValueError(f"k must be a non-empty 1-D array of per-prompt rollout counts, got shape {kk.shape}.")
    return float(kk.mean()) / kk.astype(np.float64)

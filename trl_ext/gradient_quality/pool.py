r"""The rollout pool and its three disjoint parts: value table, reference half, method half.

A pool is ``N`` prompts x ``K`` seeded samples drawn at one checkpoint, each scored and carrying the sketch of its
score-function gradient ``z_{ij} = S \nabla_\theta \log \pi_\theta(y_{ij} \mid x_i)`` (the sum over the completion's
tokens, at the sampling temperature; :mod:`.sketch`). Per prompt the ``K`` columns are split at random into

* ``table_samples`` columns: the offline reference samples of BASIS's value table and V0.5's table prior (the
  checkpoint is the reference policy; their tokens are reported as the table's cost, never as online tokens);
* ``reference_samples`` columns: the reference gradient (:mod:`.reference`);
* the rest, the **method half**: the only rollouts the methods' batches are drawn from.

The parts are disjoint samples of the same law, so a method's update and the reference are independent given the
prompts: the inner product of the two is an unbiased estimate of the inner product with the true gradient
(``docs/gradient_quality.md``, "Why the pool is split").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["GradientPool", "PoolSplit", "split_pool"]


@dataclass
class GradientPool:
    """``N`` prompts x ``K`` samples with rewards, lengths and gradient sketches.

    Attributes
    ----------
    rewards : ndarray (N, K) float
        Combined reward in [0, 1]; NaN = unscorable.
    lengths : ndarray (N, K) int
        Generated tokens of each completion (up to and including its end token).
    sketches : ndarray (N, K, d) float
        Sketched score-function gradient of each completion.
    max_completion_length : int
        The generation cap (``dr_grpo``'s and PAIR's token normalizers).
    pair : dict, optional
        PAIR's per-sample probe quantities, arrays (N, K): ``p_hat`` and ``cost_hat`` (the prefix heads'
        out-of-fold predictions), ``finished`` (the completion ended within the probe), and ``probe_tokens`` (int).
    info : dict
        Free-form provenance (model, dataset, sampler, cost counters).
    """

    rewards: np.ndarray
    lengths: np.ndarray
    sketches: np.ndarray
    max_completion_length: int
    pair: dict | None = None
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.rewards = np.asarray(self.rewards, dtype=np.float64)
        self.lengths = np.asarray(self.lengths, dtype=np.int64)
        self.sketches = np.asarray(self.sketches, dtype=np.float64)
        if self.rewards.ndim != 2 or self.rewards.size == 0:
            raise ValueError(f"the pool is empty or not (prompts, samples): rewards have shape {self.rewards.shape}.")
        n, k = self.rewards.shape
        if self.lengths.shape != (n, k):
            raise ValueError(f"lengths have shape {self.lengths.shape}, rewards {self.rewards.shape}.")
        if self.sketches.ndim != 3 or self.sketches.shape[:2] != (n, k):
            raise ValueError(f"sketches must be (prompts, samples, dim) = ({n}, {k}, d), got {self.sketches.shape}.")
        fin = self.rewards[np.isfinite(self.rewards)]
        if fin.size and (fin.min() < -1e-9 or fin.max() > 1 + 1e-9):
            raise ValueError(f"pool rewards must lie in [0, 1] (rescale with reward_range), got [{fin.min():.4g}, "
                             f"{fin.max():.4g}].")
        if (self.lengths < 0).any():
            raise ValueError("pool lengths must be >= 0.")

    @property
    def num_prompts(self) -> int:
        return int(self.rewards.shape[0])

    def save(self, path: str) -> str:
        """Write the pool to ``path`` (``.npz``: sketches in float32, ``info`` as JSON), to measure it again later."""
        import json

        arrays = {"rewards": self.rewards, "lengths": self.lengths, "sketches": self.sketches.astype(np.float32),
                  "max_completion_length": np.int64(self.max_completion_length),
                  "info": np.array(json.dumps(self.info))}
        if self.pair is not None:
            arrays.update({f"pair_{k}": np.asarray(self.pair[k]) for k in ("p_hat", "cost_hat", "finished")})
            arrays["pair_probe_tokens"] = np.int64(self.pair["probe_tokens"])
        tmp = f"{path}.tmp.npz"
        np.savez_compressed(tmp, **arrays)
        import os

        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str) -> GradientPool:
        """A pool written by :meth:`save`; raises ``ValueError`` for a file that is not one."""
        import json

        try:
            with np.load(path, allow_pickle=False) as f:
                d = {k: f[k] for k in f.files}
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read a gradient-quality pool from {path!r}: {e}") from e
        missing = {"rewards", "lengths", "sketches", "max_completion_length"} - set(d)
        if missing:
            raise ValueError(f"{path!r} is not a gradient-quality pool (missing {sorted(missing)}).")
        pair = None
        if "pair_p_hat" in d:
            pair = {"p_hat": d["pair_p_hat"], "cost_hat": d["pair_cost_hat"], "finished": d["pair_finished"],
                    "probe_tokens": int(d["pair_probe_tokens"])}
        return cls(rewards=d["rewards"], lengths=d["lengths"], sketches=d["sketches"],
                   max_completion_length=int(d["max_completion_length"]), pair=pair,
                   info=json.loads(str(d["info"])) if "info" in d else {})

    @property
    def num_samples(self) -> int:
        return int(self.rewards.shape[1])


@dataclass
class PoolSplit:
    """Column indices (per prompt) of the three parts of a pool: arrays of shape ``(N, n_part)``."""

    table: np.ndarray
    reference: np.ndarray
    method: np.ndarray

    def take(self, arr: np.ndarray, part: str) -> np.ndarray:
        """``arr`` (N, K, ...) restricted to ``part``'s columns: shape (N, n_part, ...)."""
        cols = getattr(self, part)
        return np.take_along_axis(arr, cols.reshape(cols.shape + (1,) * (arr.ndim - 2)), axis=1)


def split_pool(pool: GradientPool, *, reference_samples: int, table_samples: int, seed: int = 0) -> PoolSplit:
    """Split each prompt's ``K`` columns at random into table, reference and method parts.

    Parameters
    ----------
    pool : GradientPool
    reference_samples : int >= 4
        Reference columns per prompt (the reference's norm correction bisects them: two of at least two).
    table_samples : int >= 0
        Value-table columns per prompt (0: no table; BASIS and V0.5 then cannot run).
    seed : int

    Raises
    ------
    ValueError
        Too few samples per prompt for the parts asked for (the message says how many are needed).
    """
    n, k = pool.rewards.shape
    r, t = int(reference_samples), int(table_samples)
    if r < 4:
        raise ValueError(f"reference_samples must be >= 4 (the norm correction splits them in two halves of >= 2), "
                         f"got {r}.")
    if t < 0:
        raise ValueError(f"table_samples must be >= 0, got {t}.")
    if k - r - t < 1:
        raise ValueError(f"the pool has {k} samples per prompt: {r} reference + {t} table leave no method half; "
                         f"sample more per prompt (num_samples >= {r + t + 16} for G = 16).")
    rng = np.random.default_rng([int(seed), 0x5EED])
    perm = np.stack([rng.permutation(k) for _ in range(n)])
    return PoolSplit(table=perm[:, :t], reference=perm[:, t:t + r], method=perm[:, t + r:])

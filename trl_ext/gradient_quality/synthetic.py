r"""A log-linear policy with a known policy gradient: the instrument's exact test case.

Each of ``N`` prompts has ``M`` possible completions ``y`` with features ``phi(x, y)`` in ``R^D``, reward
``r(x, y)`` in {0, 1} and a length; ``pi(y | x) = softmax_y(theta . phi(x, y))``. Then

.. math:: \nabla_\theta \log\pi(y|x) = \phi(x, y) - \sum_{y'} \pi(y'|x)\phi(x, y'),\qquad
          \nabla_\theta J_N = \frac1N\sum_i \sum_y \pi(y|x_i)\, r(x_i, y)\, \nabla_\theta\log\pi(y|x_i)   \qquad (X1)

exactly, so a pool sampled from it has exact per-rollout gradients (no sketch needed: ``d = D``) and every quantity
of :mod:`.measure` has a computable target. Used by ``tests/test_gradient_quality.py`` and the docs' worked example.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .pool import GradientPool

__all__ = ["LogLinearPolicy"]


@dataclass
class LogLinearPolicy:
    """``phi`` (N, M, D), ``rewards`` (N, M) in {0, 1}, ``lengths`` (N, M) >= 1, ``theta`` (D,)."""

    phi: np.ndarray
    rewards: np.ndarray
    lengths: np.ndarray
    theta: np.ndarray

    @classmethod
    def random(cls, n_prompts: int = 3, n_outcomes: int = 3, dim: int = 5, seed: int = 0, max_length: int = 1,
               success: tuple[float, float] = (0.2, 0.8)) -> LogLinearPolicy:
        rng = np.random.default_rng(seed)
        phi = rng.normal(size=(n_prompts, n_outcomes, dim))
        rewards = (rng.uniform(size=(n_prompts, n_outcomes)) < rng.uniform(*success, size=(n_prompts, 1))) * 1.0
        rewards[:, 0], rewards[:, 1] = 1.0, 0.0  # every prompt mixed
        lengths = rng.integers(1, max_length + 1, size=(n_prompts, n_outcomes))
        return cls(phi, rewards, lengths, rng.normal(scale=0.5, size=dim))

    def probs(self) -> np.ndarray:
        s = self.phi @ self.theta
        e = np.exp(s - s.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def scores(self) -> np.ndarray:
        """``grad log pi(y | x)``, shape (N, M, D)."""
        p = self.probs()
        return self.phi - np.einsum("nm,nmd->nd", p, self.phi)[:, None, :]

    def gradient(self) -> np.ndarray:
        """Eq. X1."""
        p = self.probs()
        return np.einsum("nm,nm,nmd->d", p, self.rewards, self.scores()) / self.phi.shape[0]

    def pool(self, num_samples: int, seed: int = 0, max_completion_length: int | None = None) -> GradientPool:
        """``num_samples`` i.i.d. completions per prompt with their exact gradients as the "sketches"."""
        rng = np.random.default_rng(seed)
        p, s = self.probs(), self.scores()
        n = p.shape[0]
        ys = np.stack([rng.choice(p.shape[1], size=num_samples, p=p[i]) for i in range(n)])
        idx = np.arange(n)[:, None]
        return GradientPool(rewards=self.rewards[idx, ys], lengths=self.lengths[idx, ys], sketches=s[idx, ys],
                            max_completion_length=int(max_completion_length or self.lengths.max()))

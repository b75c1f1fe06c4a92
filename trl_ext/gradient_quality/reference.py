r"""The reference gradient and an unbiased estimate of its squared norm.

The target is the policy gradient of the mean reward over the pool's ``N`` prompts,

.. math:: g^* = \nabla_\theta J_N = \frac1N \sum_{i=1}^N \mathbb E_{y\sim\pi_\theta(\cdot|x_i)}
          \big[(r(x_i, y) - b_i)\, \nabla_\theta \log \pi_\theta(y \mid x_i)\big] ,            \qquad (R1)

estimated on the reference columns with leave-one-out baselines (RLOO: "Buy 4 REINFORCE Samples, Get a Baseline for
Free!", Kool, van Hoof and Welling, 2019), which are independent of the rollout they centre, so

.. math:: u_i = \frac1{m_i} \sum_{j} \Big(r_{ij} - \frac{1}{m_i - 1}\sum_{l\ne j} r_{il}\Big) z_{ij},\qquad
          \hat g = \frac1N \sum_i u_i                                                          \qquad (R2)

is unbiased for ``S g*`` (``z`` the sketched score functions, ``m_i`` the scorable reference samples of prompt
``i``; a prompt with fewer than two contributes 0 and is counted). The advantages are the registered ``"rloo"``
estimator's (:func:`trl_ext.estimators.rloo_advantages`).

``||ĝ||²`` over-estimates ``||g*||²`` by the reference's variance, which would bias every cosine towards 0. The
reference columns are therefore bisected: two estimates ``ĝ^{(1)}, ĝ^{(2)}`` of (R2) on disjoint halves are
independent and unbiased, so

.. math:: \widehat{\|g^*\|^2} = \frac1B \sum_{s=1}^B \langle \hat g^{(1)}_s, \hat g^{(2)}_s \rangle   \qquad (R3)

(averaged over ``B`` random bisections) is unbiased for ``||S g*||²``. Everything is kept per prompt
(``u_i`` and the ``N x N`` cross-Gram matrix of the halves) so a prompt-level bootstrap only reweights prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trl_ext.estimators import rloo_advantages

__all__ = ["ReferenceGradient", "reference_gradient", "loo_prompt_terms"]


def loo_prompt_terms(rewards: np.ndarray, sketches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt terms ``u_i`` of eq. R2 and each prompt's number of scorable samples.

    Parameters
    ----------
    rewards : ndarray (N, m)
        NaN = unscorable (left out).
    sketches : ndarray (N, m, d)

    Returns
    -------
    (u, m) : ndarray (N, d), ndarray (N,) int
    """
    n, m = rewards.shape
    gid = np.repeat(np.arange(n), m)
    adv = np.asarray(rloo_advantages(rewards.reshape(-1), gid).advantages).reshape(n, m)
    ok = np.isfinite(rewards)
    cnt = ok.sum(axis=1)
    adv = np.where(ok & (cnt[:, None] >= 2), adv, 0.0)
    u = np.einsum("nm,nmd->nd", adv, sketches) / np.maximum(cnt, 1)[:, None]
    return u, cnt


@dataclass
class ReferenceGradient:
    """The reference of eq. R2-R3.

    Attributes
    ----------
    vector : ndarray (d,)
        ``ĝ`` (eq. R2).
    prompt_terms : ndarray (N, d)
        ``u_i``.
    cross_gram : ndarray (N, N)
        ``mean_s U^{(1)}_s U^{(2)T}_s``: ``w^T C w / N^2`` is eq. R3 for prompt weights ``w`` (all ones: the point
        estimate; bootstrap counts: a replicate).
    norm2 : float
        Eq. R3 (unbiased for ``||S g*||²``).
    naive_norm2 : float
        ``||ĝ||²`` (biased upwards by the reference's variance), for contrast.
    n_signal_prompts : int
        Prompts whose reference samples are not all tied (the others contribute 0).
    n_short_prompts : int
        Prompts with fewer than 2 scorable reference samples.
    """

    vector: np.ndarray
    prompt_terms: np.ndarray
    cross_gram: np.ndarray
    norm2: float
    naive_norm2: float
    n_signal_prompts: int
    n_short_prompts: int

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_terms.shape[0])

    def norm2_weighted(self, w: np.ndarray) -> float:
        """Eq. R3 for prompt weights ``w`` (bootstrap counts summing to ``N``)."""
        n = self.num_prompts
        return float(w @ self.cross_gram @ w) / n**2

    def vector_weighted(self, w: np.ndarray) -> np.ndarray:
        return (w @ self.prompt_terms) / self.num_prompts


def reference_gradient(rewards: np.ndarray, sketches: np.ndarray, *, bisections: int = 16,
                       seed: int = 0) -> ReferenceGradient:
    """Eq. R2-R3 on the reference columns.

    Parameters
    ----------
    rewards : ndarray (N, m), m >= 4
    sketches : ndarray (N, m, d)
    bisections : int >= 1
        ``B`` in eq. R3.
    seed : int

    Raises
    ------
    ValueError
        ``m < 4``; no prompt with a reward spread (every reference group tied: no gradient to compare with); a
        reference too noisy for its norm (eq. R3 <= 0), with the numbers to raise.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    sketches = np.asarray(sketches, dtype=np.float64)
    n, m = rewards.shape
    if m < 4:
        raise ValueError(f"the reference needs >= 4 samples per prompt (two halves of >= 2), got {m}.")
    u, cnt = loo_prompt_terms(rewards, sketches)
    fin = np.where(np.isfinite(rewards), rewards, np.nan)
    spread = np.array([np.nanmax(r) > np.nanmin(r) if np.isfinite(r).sum() >= 2 else False for r in fin])
    if not spread.any():
        raise ValueError(f"every one of the {n} prompts has tied reference rewards (all pass or all fail): the "
                         "expected-reward gradient is 0 as far as this pool can tell, and no method has a direction to "
                         "be compared with. Use prompts of mixed difficulty, more samples per prompt, or a higher "
                         "temperature.")
    rng = np.random.default_rng([int(seed), 0xBEEF])
    half = m // 2
    cross = np.zeros((n, n))
    for _ in range(int(bisections)):
        perm = np.stack([rng.permutation(m) for _ in range(n)])
        a, b = perm[:, :half], perm[:, half:]
        ua, _ = loo_prompt_terms(np.take_along_axis(rewards, a, 1), np.take_along_axis(sketches, a[..., None], 1))
        ub, _ = loo_prompt_terms(np.take_along_axis(rewards, b, 1), np.take_along_axis(sketches, b[..., None], 1))
        cross += ua @ ub.T
    cross /= int(bisections)
    cross = 0.5 * (cross + cross.T)  # the two halves play symmetric roles
    vec = u.mean(axis=0)
    norm2 = float(cross.sum()) / n**2
    if not norm2 > 0:
        raise ValueError(f"the reference is too noisy to estimate the gradient's norm (eq. R3 = {norm2:.3g} <= 0 with "
                         f"{n} prompts x {m} reference samples): raise --num_prompts or --reference_samples.")
    return ReferenceGradient(vector=vec, prompt_terms=u, cross_gram=cross, norm2=norm2,
                             naive_norm2=float(vec @ vec), n_signal_prompts=int(spread.sum()),
                             n_short_prompts=int((cnt < 2).sum()))

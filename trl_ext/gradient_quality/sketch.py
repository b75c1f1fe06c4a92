r"""A seeded sparse random projection (CountSketch) for per-rollout gradients.

A per-rollout gradient over the trained parameters has ``D`` entries (about 5 million for a rank-16 LoRA adapter of
SmolLM2-135M on every linear layer); the instrument keeps ``d`` of them per rollout (``d`` a few thousand). The
CountSketch ("Finding frequent items in data streams", Charikar, Chen and Farach-Colton, 2002; as a subspace
embedding, Clarkson and Woodruff, arXiv:1207.6365) sends coordinate ``k`` to bucket ``h(k)`` with sign ``s(k)``:

.. math:: (S a)_b = \sum_{k: h(k) = b} s(k)\, a_k .

It is linear (the sketch of a weighted sum of rollout gradients is the same weighted sum of their sketches, so every
method's update is formed exactly in the sketch space), and for fixed vectors ``a, b`` it preserves inner products in
expectation with a variance bounded by the product of the squared norms:

.. math:: \mathbb E\langle Sa, Sb\rangle = \langle a, b\rangle,\qquad
          \operatorname{Var}\langle Sa, Sb\rangle = \tfrac1d\Big(\|a\|^2\|b\|^2 + \langle a,b\rangle^2
          - 2\sum_k a_k^2 b_k^2\Big) \le \tfrac{2}{d}\,\|a\|^2\|b\|^2 .   \qquad (S1)

So the inner product of two unit vectors (a cosine) is off by a standard deviation of at most ``sqrt(2 / d)``, and a
squared norm by a relative standard deviation of at most ``sqrt(2 / d)`` (S1 with ``a = b``). :data:`cosine_error_bound`
states this; ``tests/test_gradient_quality.py`` checks it against exact gradients of a small model.
"""

from __future__ import annotations

import math

import torch

__all__ = ["CountSketch", "cosine_error_bound"]


def cosine_error_bound(dim: int) -> float:
    """Upper bound ``sqrt(2 / dim)`` on the standard deviation of a sketched cosine's error (eq. S1)."""
    if int(dim) < 1:
        raise ValueError(f"the sketch dimension must be >= 1, got {dim!r}.")
    return math.sqrt(2.0 / int(dim))


class CountSketch:
    """The seeded CountSketch ``R^D -> R^d`` of a list of parameter tensors.

    Bucket and sign of every coordinate come from ``torch.Generator(seed + 7919 * block)``, one stream per parameter
    tensor in the order given, so the same seed, parameter shapes and order give the same projection on every
    process and machine.

    Parameters
    ----------
    dim : int >= 1
        ``d``, the sketch dimension.
    numels : sequence of int
        Number of entries of each parameter tensor (``D = sum(numels)``).
    seed : int
        Projection seed.

    Raises
    ------
    ValueError
        ``dim < 1`` or no parameter entries.
    """

    def __init__(self, dim: int, numels, seed: int = 0):
        self.dim = int(dim)
        if self.dim < 1:
            raise ValueError(f"the sketch dimension must be >= 1, got {dim!r}.")
        self.numels = [int(n) for n in numels]
        if sum(self.numels) == 0:
            raise ValueError("nothing to sketch: the parameter list has no entries (no trainable parameters?).")
        self.seed = int(seed)
        self._buckets, self._signs = [], []
        for b, n in enumerate(self.numels):
            g = torch.Generator().manual_seed(self.seed + 7919 * b)
            self._buckets.append(torch.randint(0, self.dim, (n,), generator=g, dtype=torch.int64))
            self._signs.append(torch.randint(0, 2, (n,), generator=g, dtype=torch.int8) * 2 - 1)

    @property
    def input_dim(self) -> int:
        """``D``, the number of sketched coordinates."""
        return sum(self.numels)

    def project(self, tensors) -> torch.Tensor:
        """``S a`` for ``a`` the concatenation of ``tensors`` (flattened; ``None`` entries count as zeros).

        Returns a float64 tensor of shape ``(dim,)``.
        """
        tensors = list(tensors)
        if len(tensors) != len(self.numels):
            raise ValueError(f"expected {len(self.numels)} tensors, got {len(tensors)}.")
        out = torch.zeros(self.dim, dtype=torch.float64)
        for t, n, bucket, sign in zip(tensors, self.numels, self._buckets, self._signs):
            if t is None:
                continue
            flat = t.detach().reshape(-1).to("cpu", torch.float64)
            if flat.numel() != n:
                raise ValueError(f"a tensor has {flat.numel()} entries where the sketch was built for {n}.")
            out.index_add_(0, bucket, flat * sign)
        return out

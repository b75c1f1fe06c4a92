"""The V0.5 support buffer: a global FIFO of recent (prompt, outcome) pairs from training rollouts.

V0.5 ("V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts", arXiv:2603.10848), "End-to-End
Implementation Workflow": "The system maintains a global Support Buffer of capacity 512 storing recent
prompt-performance pairs (x_i, r_i) from the ongoing RL training", and Step 1: "randomly samples 256 pairs from the
Support Buffer to form the capability context C_pi".

Distributed use: every rank must hold the *same* buffer, so add the *gathered* (all-rank) prompts and outcomes in
the same order on every rank. :meth:`SupportBuffer.sample_context` draws from a generator seeded by
``(seed, step)`` only, so identical buffers give identical contexts on every rank; :meth:`SupportBuffer.fingerprint`
lets a trainer assert that cheaply.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Prompt, validate_context

__all__ = ["SupportBuffer"]

_STATE_VERSION = 1


def _check_int(name: str, v: Any, low: int) -> int:
    if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < low:
        raise ValueError(f"SupportBuffer: {name} must be an int >= {low}, got {v!r}.")
    return int(v)


class SupportBuffer:
    """Global FIFO of (prompt, outcome) pairs with deterministic context sampling.

    Parameters
    ----------
    capacity : int >= 1
        Maximum number of pairs kept; the oldest are evicted first (paper: 512).
    context_size : int >= 1
        Pairs per sampled context (paper: 256). When the buffer holds fewer, the whole buffer is returned.
    seed : int >= 0
        Base seed of the context sampler.

    Notes
    -----
    **What an outcome is.** A success value in ``[0, 1]``. Two conventions work, pick one per run:

    - *per-prompt mean* (recommended, what :class:`~trl_ext.trainers.v05.V05GRPOTrainer` adds): one pair per prompt
      with the group's success rate ``(mean reward - low) / (high - low)``; the buffer then spans ``capacity``
      distinct prompts;
    - *per-rollout* success (0/1), one pair per rollout, as V0's binary labels; a prompt with k rollouts then takes
      k slots.

    Heads that need binary labels (TabPFN, V0) binarize at 0.5. Outcomes must be finite and in ``[0, 1]``; rewards
    in ``[-1, 1]`` must be mapped first (``(r + 1) / 2``).

    **Cold start.** An empty buffer samples an empty context; every prior defines its empty-context behaviour
    (the embedding prior returns its ``empty_context_probability``, 0.5 by default).
    """

    def __init__(self, capacity: int = 512, context_size: int = 256, seed: int = 0):
        self.capacity = _check_int("capacity", capacity, 1)
        self.context_size = _check_int("context_size", context_size, 1)
        self.seed = _check_int("seed", seed, 0)
        if self.context_size > self.capacity:
            warnings.warn(
                f"SupportBuffer: context_size={self.context_size} > capacity={self.capacity}; contexts will be the "
                "whole buffer.", UserWarning, stacklevel=2,
            )
        self._prompts: deque = deque(maxlen=self.capacity)
        self._outcomes: deque = deque(maxlen=self.capacity)
        self.n_added = 0  # total pairs ever added (evicted ones included)

    def __len__(self) -> int:
        return len(self._prompts)

    def add(self, prompts: Sequence[Prompt], outcomes: np.ndarray | Sequence[float]) -> None:
        """Append pairs in order (oldest evicted beyond ``capacity``).

        Parameters
        ----------
        prompts : sequence of Prompt, length n
            Text or conversations; must be JSON-serializable for checkpoints.
        outcomes : array_like, shape (n,)
            Success in ``[0, 1]`` (see class Notes).

        Raises
        ------
        ValueError
            On a length mismatch or NaN/out-of-range outcomes (nothing is added then).
        TypeError
            If a prompt is not a str or a list of message dicts.
        """
        if isinstance(prompts, str):
            raise TypeError("SupportBuffer.add: prompts must be a list of prompts, not a single string.")
        prompts = list(prompts)
        y = validate_context(prompts, outcomes, who="SupportBuffer.add")
        for p in prompts:
            if not (isinstance(p, str) or (isinstance(p, Sequence) and all(isinstance(m, dict) for m in p))):
                raise TypeError(f"SupportBuffer.add: prompt must be a str or a list of message dicts, got {p!r:.80}.")
        for p, o in zip(prompts, y.tolist()):
            self._prompts.append(p)
            self._outcomes.append(float(o))
        self.n_added += len(prompts)

    def items(self) -> tuple[list[Prompt], np.ndarray]:
        """All pairs, oldest first."""
        return list(self._prompts), np.asarray(self._outcomes, dtype=np.float64)

    def sample_indices(self, step: int) -> np.ndarray:
        """Buffer positions (0 = oldest) of the context for ``step``; deterministic in ``(seed, step, len)``.

        Sampling is uniform without replacement from ``numpy.random.default_rng([seed, step])``; the positions are
        returned sorted (oldest first). With ``len(self) <= context_size`` all positions are returned.
        """
        step = _check_int("step", step, 0)
        n = len(self)
        if n <= self.context_size:
            return np.arange(n)
        rng = np.random.default_rng([self.seed, step])
        return np.sort(rng.choice(n, size=self.context_size, replace=False))

    def sample_context(self, step: int) -> tuple[list[Prompt], np.ndarray]:
        """Context set :math:`C_\\pi` for training step ``step`` (Workflow Step 1).

        Returns
        -------
        prompts : list of Prompt, length min(len(self), context_size)
        outcomes : numpy.ndarray, float64, same length (empty arrays when the buffer is empty)
        """
        idx = self.sample_indices(step)
        prompts, outcomes = list(self._prompts), np.asarray(self._outcomes, dtype=np.float64)
        return [prompts[i] for i in idx], outcomes[idx]

    def fingerprint(self) -> str:
        """SHA-256 (16 hex chars) of the buffer contents and config; equal on ranks holding equal buffers."""
        payload = json.dumps(
            [self.capacity, self.context_size, self.seed, list(self._prompts), list(self._outcomes)],
            sort_keys=True, ensure_ascii=False, separators=(",", ":"),
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]

    def state_dict(self) -> dict:
        """JSON-serializable state for checkpoints (``json.dumps(buffer.state_dict())`` works)."""
        return {
            "version": _STATE_VERSION,
            "capacity": self.capacity,
            "context_size": self.context_size,
            "seed": self.seed,
            "n_added": self.n_added,
            "prompts": [p if isinstance(p, str) else [dict(m) for m in p] for p in self._prompts],
            "outcomes": list(self._outcomes),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore pairs and ``n_added`` from :meth:`state_dict`.

        The buffer keeps *its own* ``capacity``, ``context_size`` and ``seed`` (the current config wins); if they
        differ from the saved ones a ``UserWarning`` says so, and if the saved pairs exceed the capacity the oldest
        are dropped (warned, never silently).

        Raises
        ------
        ValueError
            On an unknown version, missing keys, or invalid pairs.
        """
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"SupportBuffer.load_state_dict: expected a dict with version={_STATE_VERSION}, "
                f"got {type(state).__name__} version={getattr(state, 'get', lambda k: None)('version')!r}."
            )
        missing = [k for k in ("capacity", "context_size", "seed", "n_added", "prompts", "outcomes") if k not in state]
        if missing:
            raise ValueError(f"SupportBuffer.load_state_dict: state is missing keys {missing}.")
        changed = [k for k in ("capacity", "context_size", "seed") if state[k] != getattr(self, k)]
        if changed:
            warnings.warn(
                "SupportBuffer.load_state_dict: saved "
                + ", ".join(f"{k}={state[k]}" for k in changed)
                + " differ from the current config; keeping the current config.",
                UserWarning, stacklevel=2,
            )
        prompts, outcomes = list(state["prompts"]), state["outcomes"]
        y = validate_context(prompts, outcomes, who="SupportBuffer.load_state_dict")
        if len(prompts) > self.capacity:
            warnings.warn(
                f"SupportBuffer.load_state_dict: {len(prompts)} saved pairs exceed capacity {self.capacity}; "
                f"dropping the {len(prompts) - self.capacity} oldest.", UserWarning, stacklevel=2,
            )
        self._prompts = deque(prompts, maxlen=self.capacity)
        self._outcomes = deque(y.tolist(), maxlen=self.capacity)
        self.n_added = _check_int("n_added", state["n_added"], len(prompts))

    def __repr__(self) -> str:
        return (f"SupportBuffer(len={len(self)}, capacity={self.capacity}, context_size={self.context_size}, "
                f"seed={self.seed}, n_added={self.n_added})")

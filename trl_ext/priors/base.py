"""The value-prior interface shared by every prior in :mod:`trl_ext.priors`.

A *value prior* answers, before any rollout is generated, "how likely is the current policy to solve this prompt?"
given a *context set* :math:`C_\\pi = \\{(x_i, r_i)\\}_{i=1}^N` of recently observed (prompt, outcome) pairs ("V0.5:
Generalist Value Model as a Prior for Sparse RL Rollouts", arXiv:2603.10848, "End-to-End Implementation Workflow",
Step 1, and the V0 architecture section). It returns success probabilities :math:`p \\in [0, 1]`; V0.5 maps them
linearly to the reward range :math:`[-1, 1]` with :math:`V = 2p - 1` (:func:`to_value`) before the shrinkage fusion
of Eq. 6-9.

Every prior subclasses :class:`ValuePrior` and implements :meth:`ValuePrior._predict`; the public
:meth:`ValuePrior.predict` validates the inputs and the outputs, so a prior returning NaN or values outside
``[0, 1]`` fails loudly with :class:`PriorOutputError` naming the prior.
"""

from __future__ import annotations

import abc
import json
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "Prompt",
    "PriorOutputError",
    "ValuePrior",
    "ConstantPrior",
    "to_value",
    "to_probability",
    "prompt_text",
    "validate_context",
    "validate_probabilities",
]

#: A prompt is either plain text or a conversation (a list of ``{"role": ..., "content": ...}`` messages), the two
#: dataset formats TRL's ``GRPOTrainer`` accepts.
Prompt = str | Sequence[Mapping[str, Any]]

#: Outputs within this distance outside ``[0, 1]`` are treated as float round-off and clipped; beyond it is an error.
_ROUNDOFF = 1e-9


def is_probability(p: Any) -> bool:
    """True for a real number in [0, 1] (numpy scalars included); False for bools, NaN and non-numbers."""
    return (isinstance(p, numbers.Real) and not isinstance(p, bool | np.bool_) and bool(np.isfinite(p))
            and 0.0 <= float(p) <= 1.0)


class PriorOutputError(ValueError):
    """A prior returned something that is not a vector of probabilities (wrong shape, NaN, outside [0, 1])."""


def to_value(p: np.ndarray | float) -> np.ndarray:
    """Map success probabilities to the V0.5 value scale, :math:`V = 2p - 1` (Workflow Step 1).

    Parameters
    ----------
    p : array_like
        Success probabilities in ``[0, 1]``, any shape.

    Returns
    -------
    numpy.ndarray
        ``2 * p - 1`` in ``[-1, 1]``, same shape, float64.

    Raises
    ------
    ValueError
        If any entry is NaN/inf or outside ``[0, 1]``.
    """
    arr = np.asarray(p, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("to_value: probabilities contain NaN or inf; a prior must return finite values in [0, 1].")
    if np.any(arr < 0.0) or np.any(arr > 1.0):
        raise ValueError(
            f"to_value: probabilities must lie in [0, 1], got min={arr.min():.6g}, max={arr.max():.6g}."
        )
    return 2.0 * arr - 1.0


def to_probability(v: np.ndarray | float) -> np.ndarray:
    """Inverse of :func:`to_value`: :math:`p = (V + 1) / 2` for values in ``[-1, 1]``.

    Raises
    ------
    ValueError
        If any entry is NaN/inf or outside ``[-1, 1]``.
    """
    arr = np.asarray(v, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr < -1.0) or np.any(arr > 1.0):
        raise ValueError("to_probability: values must be finite and lie in [-1, 1].")
    return (arr + 1.0) / 2.0


def prompt_text(prompt: Prompt) -> str:
    """Render a prompt as text for embedding.

    Plain strings are returned unchanged. A conversation is rendered as one ``"role: content"`` line per
    message, which is deterministic and model-agnostic (use your own ``text_fn`` to apply a chat template instead).

    Raises
    ------
    TypeError
        If ``prompt`` is neither a string nor a list of mappings with ``role`` and ``content``.
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        lines = []
        for i, m in enumerate(prompt):
            if "content" not in m:
                raise TypeError(f"prompt_text: message {i} has no 'content' key: {m!r}")
            content = m["content"]
            if not isinstance(content, str):  # multimodal content parts: keep it deterministic
                content = json.dumps(content, sort_keys=True, ensure_ascii=False, default=str)
            lines.append(f"{m.get('role', 'user')}: {content}")
        return "\n".join(lines)
    raise TypeError(
        f"prompt_text: a prompt must be a str or a list of {{'role', 'content'}} messages, got {type(prompt).__name__}"
    )


def validate_context(
    context_prompts: Sequence[Prompt], context_outcomes: np.ndarray | Sequence[float], *, who: str = "prior"
) -> np.ndarray:
    """Check a context set and return the outcomes as a float64 vector.

    Parameters
    ----------
    context_prompts : sequence of Prompt, length N
    context_outcomes : array_like, shape (N,)
        Observed success in ``[0, 1]`` (a per-rollout 0/1 outcome or a per-prompt success rate).
    who : str
        Name used in error messages.

    Returns
    -------
    numpy.ndarray, shape (N,), float64

    Raises
    ------
    ValueError
        On a length mismatch, a non-1-D outcome array, NaN/inf, or outcomes outside ``[0, 1]``.
    """
    y = np.asarray(context_outcomes, dtype=np.float64)
    if y.ndim != 1:
        raise ValueError(f"{who}: context_outcomes must be 1-D (one outcome per context prompt), got shape {y.shape}.")
    if len(context_prompts) != y.shape[0]:
        raise ValueError(
            f"{who}: {len(context_prompts)} context prompts but {y.shape[0]} context outcomes; pass one outcome per prompt."
        )
    if not np.all(np.isfinite(y)):
        bad = np.flatnonzero(~np.isfinite(y))[:5].tolist()
        raise ValueError(f"{who}: context_outcomes contain NaN/inf at positions {bad}; drop or score those rollouts.")
    if np.any(y < 0.0) or np.any(y > 1.0):
        raise ValueError(
            f"{who}: context_outcomes must be success rates in [0, 1] (map rewards first, e.g. r01 = (r + 1) / 2 for "
            f"rewards in [-1, 1]); got min={y.min():.6g}, max={y.max():.6g}."
        )
    return y


def validate_probabilities(p: Any, n: int, *, who: str = "prior") -> np.ndarray:
    """Check a prior's output and return it as a float64 vector.

    Values within ``1e-9`` outside ``[0, 1]`` (float round-off) are clipped; anything else is an error.

    Raises
    ------
    PriorOutputError
        If the output is not convertible to floats, has a shape other than ``(n,)`` (``(n, 1)`` is accepted and
        flattened), contains NaN/inf, or lies outside ``[0, 1]``.
    """
    try:
        arr = np.asarray(p, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise PriorOutputError(f"{who} returned a value that is not a numeric array: {e}") from e
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.shape != (n,):
        raise PriorOutputError(f"{who} returned shape {arr.shape}; expected ({n},), one probability per target prompt.")
    if not np.all(np.isfinite(arr)):
        bad = np.flatnonzero(~np.isfinite(arr))[:5].tolist()
        raise PriorOutputError(f"{who} returned NaN/inf probabilities at target positions {bad}.")
    if np.any(arr < -_ROUNDOFF) or np.any(arr > 1.0 + _ROUNDOFF):
        raise PriorOutputError(
            f"{who} returned values outside [0, 1] (min={arr.min():.6g}, max={arr.max():.6g}); a prior must return "
            "success probabilities, not values in [-1, 1] or logits."
        )
    return np.clip(arr, 0.0, 1.0)


class ValuePrior(abc.ABC):
    """Interface: success probabilities for target prompts given a context of observed outcomes.

    Subclasses implement :meth:`_predict`; callers use :meth:`predict` (validated) or :meth:`predict_values`
    (mapped to ``[-1, 1]``). Priors that ignore the context (e.g. :class:`~trl_ext.priors.TablePrior`) still
    accept it so every prior is interchangeable in the trainer.
    """

    #: Human-readable name used in error messages and logs.
    name: str = "prior"

    @abc.abstractmethod
    def _predict(
        self, target_prompts: list[Prompt], context_prompts: list[Prompt], context_outcomes: np.ndarray
    ) -> np.ndarray:
        """Return success probabilities, shape ``(len(target_prompts),)``; inputs are already validated."""

    def predict(
        self,
        target_prompts: Sequence[Prompt],
        context_prompts: Sequence[Prompt] = (),
        context_outcomes: np.ndarray | Sequence[float] = (),
    ) -> np.ndarray:
        """Predict success probabilities :math:`p \\in [0, 1]` for each target prompt.

        Parameters
        ----------
        target_prompts : sequence of Prompt, length M
        context_prompts : sequence of Prompt, length N (may be empty: cold start)
        context_outcomes : array_like, shape (N,)
            Observed success in ``[0, 1]`` for each context prompt.

        Returns
        -------
        numpy.ndarray, shape (M,), float64 in [0, 1]

        Raises
        ------
        ValueError
            On malformed context (see :func:`validate_context`).
        PriorOutputError
            If the prior's output is malformed (see :func:`validate_probabilities`).
        """
        if isinstance(target_prompts, str):
            raise TypeError(f"{self.name}: target_prompts must be a list of prompts, not a single string.")
        targets = list(target_prompts)
        ctx = list(context_prompts)
        y = validate_context(ctx, context_outcomes, who=self.name)
        if not targets:
            return np.zeros(0, dtype=np.float64)
        out = self._predict(targets, ctx, y)
        return validate_probabilities(out, len(targets), who=self.name)

    def predict_values(
        self,
        target_prompts: Sequence[Prompt],
        context_prompts: Sequence[Prompt] = (),
        context_outcomes: np.ndarray | Sequence[float] = (),
    ) -> np.ndarray:
        """:meth:`predict` mapped to the V0.5 value scale, :math:`V = 2p - 1 \\in [-1, 1]`."""
        return to_value(self.predict(target_prompts, context_prompts, context_outcomes))

    def __call__(self, target_prompts, context_prompts=(), context_outcomes=()):
        return self.predict(target_prompts, context_prompts, context_outcomes)


class ConstantPrior(ValuePrior):
    """The "no information" prior: the same probability for every prompt.

    With ``p = 0.5`` (``V = 0``, the midpoint of the reward range) this is the constant-prior ablation that V0.5
    ("V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts", arXiv:2603.10848) does not run: "a fixed
    prior of mu_true ~ 0". With ``use_context_mean=True`` it returns the context success rate (``p`` when the
    context is empty).

    Parameters
    ----------
    p : float in [0, 1]
    use_context_mean : bool
    """

    def __init__(self, p: float = 0.5, *, use_context_mean: bool = False):
        if not is_probability(p):
            raise ValueError(f"ConstantPrior: p must be a probability in [0, 1], got {p!r}.")
        self.p = float(p)
        self.use_context_mean = bool(use_context_mean)
        self.name = f"ConstantPrior(p={self.p:g})"

    def _predict(self, target_prompts, context_prompts, context_outcomes):
        p = float(np.mean(context_outcomes)) if (self.use_context_mean and context_outcomes.size) else self.p
        return np.full(len(target_prompts), p)

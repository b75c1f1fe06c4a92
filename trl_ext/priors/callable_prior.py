"""Wrap a user function (for example the official V0 checkpoint) as a :class:`~trl_ext.priors.ValuePrior`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .base import ValuePrior

__all__ = ["CallablePrior"]


class CallablePrior(ValuePrior):
    """A prior backed by any callable.

    Parameters
    ----------
    fn : callable
        ``fn(target_prompts, context_prompts, context_outcomes) -> array_like (M,)`` of success probabilities
        (the :class:`~trl_ext.priors.ValuePrior` argument order). Outputs are validated: NaN or values outside
        ``[0, 1]`` raise :class:`~trl_ext.priors.PriorOutputError` naming this prior. Torch tensors are accepted.
    name : str, optional
        Used in errors and logs (default: the function's name).
    empty_context_probability : float or None
        If not None, an empty context returns this probability for every target without calling ``fn``
        (useful for models such as V0 that cannot run on an empty context). None (default) calls ``fn`` anyway.

    Examples
    --------
    >>> prior = CallablePrior(lambda t, c, y: [0.7] * len(t), name="seventy")
    >>> prior.predict(["1+1="]).tolist()
    [0.7]
    """

    def __init__(
        self,
        fn: Callable[[list, list, np.ndarray], Any],
        *,
        name: str | None = None,
        empty_context_probability: float | None = None,
    ):
        if not callable(fn):
            raise TypeError(f"CallablePrior: fn must be callable, got {type(fn).__name__}.")
        if empty_context_probability is not None and not (0.0 <= float(empty_context_probability) <= 1.0):
            raise ValueError(
                f"CallablePrior: empty_context_probability must be in [0, 1] or None, got {empty_context_probability}."
            )
        self.fn = fn
        self.empty_context_probability = empty_context_probability
        self.name = f"CallablePrior({name or getattr(fn, '__name__', type(fn).__name__)})"

    @classmethod
    def from_v0(
        cls,
        v0_model: Any,
        *,
        label_threshold: float = 0.5,
        empty_context_probability: float = 0.5,
        text_fn: Callable[[Any], str] | None = None,
    ) -> CallablePrior:
        """Adapt an object with V0's API, ``predict(context_prompts, context_labels, target_prompts)``.

        V0 (``Now-Join-Us/V0``, ``v0_core/models/v0.py``) takes binary labels, so outcomes are binarized as
        ``int(outcome >= label_threshold)``. V0 takes text prompts; conversations are rendered with ``text_fn``
        (default :func:`~trl_ext.priors.base.prompt_text`). Load the checkpoint yourself from local paths (this
        library never downloads weights); an empty context returns ``empty_context_probability``.
        """
        from .base import prompt_text

        render = text_fn or prompt_text

        def v0_predict(targets, ctx, outcomes):
            labels = [int(o >= label_threshold) for o in outcomes]
            out = v0_model.predict(
                context_prompts=[render(p) for p in ctx], context_labels=labels,
                target_prompts=[render(p) for p in targets],
            )
            return _to_numpy(out)

        return cls(v0_predict, name="V0", empty_context_probability=empty_context_probability)

    def _predict(self, target_prompts, context_prompts, context_outcomes):
        if not context_prompts and self.empty_context_probability is not None:
            return np.full(len(target_prompts), float(self.empty_context_probability))
        return _to_numpy(self.fn(target_prompts, context_prompts, context_outcomes))


def _to_numpy(x: Any) -> Any:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor without importing torch
        return x.detach().float().cpu().numpy()
    return x

"""``build_prior(kind, **kwargs)``: construct a value prior from a config string (used by ``V05GRPOConfig``)."""

from __future__ import annotations

import inspect

from .base import ConstantPrior, ValuePrior
from .callable_prior import CallablePrior
from .embedding import EmbeddingInContextPrior
from .table import TablePrior

__all__ = ["PRIOR_KINDS", "build_prior"]

#: kind -> class. ``embedding`` needs ``embed_fn``; ``table`` needs ``table``; ``callable`` needs ``fn``.
PRIOR_KINDS: dict[str, type[ValuePrior]] = {
    "embedding": EmbeddingInContextPrior,
    "table": TablePrior,
    "callable": CallablePrior,
    "constant": ConstantPrior,
}


def build_prior(kind: str, **kwargs) -> ValuePrior:
    """Build a prior by name.

    Parameters
    ----------
    kind : {"embedding", "table", "callable", "constant"}
    **kwargs
        Constructor arguments of the class in :data:`PRIOR_KINDS` (e.g. ``embed_fn=..., head="logistic"``;
        ``table="values.jsonl", missing="default"``; ``fn=...``; ``p=0.5``).

    Returns
    -------
    ValuePrior

    Raises
    ------
    ValueError
        On an unknown kind (the message lists the valid ones).
    TypeError
        On unknown or missing keyword arguments (the message lists the accepted ones).

    Examples
    --------
    >>> build_prior("constant", p=0.25).predict(["x"]).tolist()
    [0.25]
    """
    if not isinstance(kind, str) or kind.lower() not in PRIOR_KINDS:
        raise ValueError(f"build_prior: unknown prior kind {kind!r}; choose one of {sorted(PRIOR_KINDS)}.")
    cls = PRIOR_KINDS[kind.lower()]
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p in params if p != "self"]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(f"build_prior({kind!r}): unknown arguments {unknown}; {cls.__name__} accepts {accepted}.")
    required = [p for p, v in params.items() if p != "self" and v.default is inspect.Parameter.empty
                and v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)]
    absent = [p for p in required if p not in kwargs]
    if absent:
        raise TypeError(f"build_prior({kind!r}): missing required arguments {absent} for {cls.__name__}.")
    return cls(**kwargs)

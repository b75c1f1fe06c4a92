"""Signal per generated token, measured: each method's policy-gradient quality on the user's own model and data.

Pure parts (numpy, no TRL or transformers): :mod:`.sketch` (the CountSketch of per-rollout gradients), :mod:`.pool`
(the pool and its table / reference / method parts), :mod:`.reference` (the reference gradient and its unbiased
norm), :mod:`.methods` (each method's batch by its own rules and estimator), :mod:`.measure` (cosines, relative
error, bias and variance parts, tokens to a target cosine, bootstrap intervals). Model side: :mod:`.collect` (draw
the pool at a checkpoint and sketch each rollout's gradient) and :mod:`.cli` (``trl-ext gradient-quality``).
See ``docs/gradient_quality.md``.
"""

from .measure import default_budgets, draw_updates, measure_gradient_quality, tokens_to_target
from .methods import (
    METHODS,
    MethodDraw,
    MethodHalf,
    get_method,
    method_names,
    policy_row_weights,
    register_method,
)
from .pool import GradientPool, PoolSplit, split_pool
from .reference import ReferenceGradient, loo_prompt_terms, reference_gradient
from .sketch import CountSketch, cosine_error_bound

__all__ = [
    "CountSketch",
    "GradientPool",
    "METHODS",
    "MethodDraw",
    "MethodHalf",
    "PoolSplit",
    "ReferenceGradient",
    "cosine_error_bound",
    "default_budgets",
    "draw_updates",
    "get_method",
    "loo_prompt_terms",
    "measure_gradient_quality",
    "method_names",
    "policy_row_weights",
    "reference_gradient",
    "register_method",
    "split_pool",
    "tokens_to_target",
]

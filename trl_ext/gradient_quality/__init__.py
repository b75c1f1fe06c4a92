"""Signal per generated token, measured: each method's policy-gradient quality on the user's own model and data.

Pure parts (numpy and torch; no TRL or transformers): :mod:`.sketch` (the CountSketch of per-rollout gradients),
:mod:`.pool` (the pool and its table / reference / method parts), :mod:`.reference` (the reference gradient and its
unbiased norm), :mod:`.methods` (each method's batch by its own rules and estimator), :mod:`.measure` (cosines,
relative error, bias and variance parts, tokens to a target cosine, bootstrap intervals), :mod:`.synthetic` (a
log-linear policy with a known gradient). Model side: :mod:`.collect` (draw the pool at a checkpoint and sketch each
rollout's gradient) and :mod:`.cli` (``trl-ext gradient-quality``). See ``docs/gradient_quality.md``.

Names are imported lazily, so ``trl-ext --help`` (which imports :mod:`.cli`) stays free of torch.
"""

from .._lazy import lazy_exports

_LAZY = {
    "build_pool": "collect",
    "row_gradient_sketches": "collect",
    "default_budgets": "measure",
    "draw_updates": "measure",
    "measure_gradient_quality": "measure",
    "tokens_to_target": "measure",
    "METHODS": "methods",
    "MethodDraw": "methods",
    "MethodHalf": "methods",
    "get_method": "methods",
    "method_names": "methods",
    "policy_row_weights": "methods",
    "register_method": "methods",
    "GradientPool": "pool",
    "PoolSplit": "pool",
    "split_pool": "pool",
    "ReferenceGradient": "reference",
    "loo_prompt_terms": "reference",
    "reference_gradient": "reference",
    "CountSketch": "sketch",
    "cosine_error_bound": "sketch",
    "LogLinearPolicy": "synthetic",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

"""The options of the ``"basis"`` estimator a trainer holds, with the paper's defaults, and their validation."""

from __future__ import annotations

import numpy as np

from ._checks import BASIS_VARIANTS, FALLBACKS, OBJECTIVES

__all__ = ["BASIS_OPTION_DEFAULTS", "check_beta_grid", "validate_basis_options"]

BASIS_OPTION_DEFAULTS = {"variant": "unb", "objective": "robust", "fallback": "zero", "eps": 1e-6,
                         "min_active_fraction": 0.0, "scale_advantages": False, "max_missing_fraction": 0.1}
"""The BASIS options the value-table strategy holds (``trl_ext.trainers.basis.strategy.ValueTableLookup``), with
the paper's defaults (Appendix 10: ``eps``; ``fallback="zero"``, the vanilla G = 1 baseline); ``BASISConfig`` sets them
as its ``basis_<name>`` fields, ``rollout_strategy_kwargs`` by ``<name>`` (``docs/basis.md``)."""

_CHOICES = {"variant": BASIS_VARIANTS, "objective": OBJECTIVES, "fallback": FALLBACKS}


def validate_basis_options(options: dict, prefix: str = "") -> dict:
    """Check :data:`BASIS_OPTION_DEFAULTS`-shaped ``options``, plus an optional ``beta_grid`` (:func:`check_beta_grid`);
    ``ValueError`` naming the field ``prefix + name``."""
    unknown = sorted(set(options) - set(BASIS_OPTION_DEFAULTS) - {"beta_grid"})
    if unknown:
        raise ValueError(f"unknown BASIS option(s) {unknown}; known: {sorted(BASIS_OPTION_DEFAULTS)} and beta_grid.")
    for name, choices in _CHOICES.items():
        if options[name] not in choices:
            raise ValueError(f"{prefix}{name} must be one of {choices}, got {options[name]!r}.")
    for name, lo, hi, closed in (("eps", 0.0, 0.5, False), ("min_active_fraction", 0.0, 1.0, True),
                                 ("max_missing_fraction", 0.0, 1.0, True)):
        x = options[name]
        ok = isinstance(x, int | float) and not isinstance(x, bool) and lo <= x and (x <= hi if closed else x < hi)
        if not ok:
            raise ValueError(f"{prefix}{name} must be a number in [{lo:g}, {hi:g}{']' if closed else ')'}, got {x!r}.")
    if not isinstance(options["scale_advantages"], bool):
        raise ValueError(f"{prefix}scale_advantages must be a bool, got {options['scale_advantages']!r}.")
    if options.get("beta_grid") is not None:
        check_beta_grid(options["beta_grid"], f"{prefix}beta_grid")
    return options


def check_beta_grid(grid, name: str = "basis_beta_grid") -> None:
    """``ValueError`` unless ``grid`` is a non-empty, strictly increasing list of finite numbers > 0."""
    try:
        arr = np.asarray(grid, dtype=np.float64)
    except (TypeError, ValueError):
        arr = np.asarray([np.nan])
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0) or np.any(np.diff(arr) <= 0):
        raise ValueError(f"{name} must be a non-empty, strictly increasing list of finite numbers > 0, got "
                         f"{list(np.atleast_1d(grid))[:10]!r}.")

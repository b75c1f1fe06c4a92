"""``BASISConfig``: the BASIS options (one dataclass field each, defaults from the paper) and their validation.

Gong et al., "BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM Reasoning" (May
2026); the trainer is :class:`trl_ext.trainers.basis.BASISTrainer`, the estimator :mod:`trl_ext.estimators.basis`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

from ...estimators.basis import BASIS_OPTION_DEFAULTS, validate_basis_options
from ..config import ExtGRPOConfig, accept_renamed_fields, method_options_class

__all__ = ["BASISConfig", "BASISOptions", "basis_options", "validate_basis_config_options"]


@dataclass
class BASISConfig(ExtGRPOConfig):
    """:class:`~trl_ext.trainers.base.ExtGRPOConfig` for BASIS: one rollout per prompt and a value table.

    Every BASIS option is one dataclass field below whose ``help`` metadata documents it (the command-line help);
    ``docs/basis.md`` tabulates them. ``num_generations`` defaults to (and must be) **1**: TRL's
    ``GRPOConfig.__post_init__`` rejects ``num_generations < 2``, so BASISConfig runs TRL's validation with a
    *placeholder* ``num_generations`` that divides the generation batch and restores 1
    (``trl_ext.trainers._trl_compat.validate_config_with_placeholder_group_size``; ``num_generations_eval`` defaults
    to 1); all of TRL's other checks run unchanged. The generation batch must hold at least 2 prompts (the baseline
    is leave-one-out). TRL's ``scale_rewards`` and ``multi_objective_aggregation`` do not apply (the advantage is
    ``r - b``; use ``basis_scale_advantages`` for std scaling); the reward is TRL's weighted sum of ``reward_funcs``.
    """

    method_route: ClassVar[tuple[str, str] | None] = ("basis", "value_table")

    num_generations: int | None = field(
        default=1,
        metadata={"help": "Rollouts per prompt: BASIS uses exactly 1 (TRL's >= 2 check is bypassed, see docs)."},
    )
    basis_value_table_path: str | None = field(
        default=None,
        metadata={"help": "JSON Lines value table (trl_ext.priors.table_format; build it with trl-ext "
                          "build-value-table). Required unless BASISTrainer(value_table=...) is given."},
    )
    basis_variant: str = field(
        default="unb",
        metadata={"help": "Batchwise refinement rule: unb (Eq. 4, the BLUE of Prop. 1), vop (Eq. 5, least MSE, "
                          "shrinks to 0) or rvg (Eq. 6)."},
    )
    basis_objective: str = field(
        default="robust",
        metadata={"help": "Calibration objective for beta_t: robust (default) = mean squared error of the baseline "
                          "actually used on all prompts with a finite reward (immune to the active-set collapse of "
                          "Eq. 3); paper = Eq. 3 over the beta-dependent active set."},
    )
    basis_fallback: str = field(
        default="zero",
        metadata={"help": "Baseline for prompts outside the active set eps < V < 1 - eps, missing from the table, or "
                          "without any leave-one-out source: zero (the vanilla G = 1 baseline, paper Appendix 10), "
                          "batch_mean (the leave-one-out mean of the other rewards) or value (the prompt's own "
                          "V_beta; 0 when missing). Counted in basis/fallback_count."},
    )
    basis_beta_grid: list[float] | None = field(
        default=None,
        metadata={"help": "Grid of KL strengths (strictly increasing, > 0). Default: the paper's 230 points on "
                          "[0.01, 5.0]."},
    )
    basis_eps: float = field(
        default=1e-6, metadata={"help": "Active-set threshold eps (Appendix 10), in [0, 0.5)."}
    )
    basis_min_active_fraction: float = field(
        default=0.0,
        metadata={"help": "Exclude grid values whose active set is smaller than this share of the batch (the "
                          "constraint is dropped, with constraint_satisfied=False, when no beta qualifies)."},
    )
    basis_scale_advantages: bool = field(
        default=False,
        metadata={"help": "Divide the advantages by their batch std (Bessel, over prompts with a finite reward) plus "
                          "1e-4. Off by default as in the paper; r - b is already on the reward scale."},
    )
    basis_max_missing_fraction: float = field(
        default=0.1,
        metadata={"help": "Raise ValueError when more than this share of a batch's prompts is missing from the table "
                          "(a table built for other data is a user error). Missing prompts below the limit get the "
                          "fallback and are counted."},
    )
    basis_strict_table_check: bool = field(
        default=False,
        metadata={"help": "Raise instead of warning when the table header's reward_funcs / model differ from the "
                          "training setup."},
    )

    basis_allow_sampling_mismatch: bool = field(
        default=False,
        metadata={"help": "Use a value table whose header records other sampling settings (temperature, top_p, "
                          "max_new_tokens) than the training config's temperature, top_p and max_completion_length, "
                          "with a warning instead of the refusal (deliberate reuse)."},
    )

    def __post_init__(self):
        _check_single_rollout(self)
        # ExtGRPOConfig.__post_init__ validates with a placeholder group size (TRL rejects num_generations < 2)
        super().__post_init__()

    def validate_method(self) -> None:
        """The BASIS fields (run once by ``validate_ext_config``; a plain ``trl.GRPOConfig`` upgraded by
        ``as_config`` gets the upgrade's wording for ``num_generations``)."""
        _check_single_rollout(self, upgraded=True)
        validate_basis_config_options(BASISOptions.from_config(self))


# renamed in the one-naming-convention change (method options prefixed); accepted with a FutureWarning for one release
accept_renamed_fields(BASISConfig, {name: f"basis_{name}" for name in (
    "value_table_path", "max_missing_fraction", "strict_table_check")})


def _check_single_rollout(cfg, upgraded: bool = False) -> None:
    g = cfg.num_generations
    if g != 1 or isinstance(g, bool):
        # an upgraded trl.GRPOConfig cannot be fixed in place: trl.GRPOConfig refuses num_generations=1
        fix = ("Pass args=trl_ext.BASISConfig(..., num_generations=1) instead (trl.GRPOConfig refuses "
               "num_generations=1; BASISConfig accepts it)" if upgraded else "Set num_generations=1")
        raise ValueError(
            f"BASISConfig: num_generations must be 1 (BASIS uses one rollout per prompt), got {g!r}. {fix}, or for "
            "several rollouts per prompt use trl_ext.GRPOTrainer / ExtGRPOConfig."
        )
    if cfg.generation_batch_size is not None and int(cfg.generation_batch_size) < 2:
        raise ValueError(
            "BASIS needs at least 2 prompts per generation batch (its baseline is leave-one-out over the batch). "
            "Raise per_device_train_batch_size, steps_per_generation or generation_batch_size."
        )


BASISOptions = method_options_class(BASISConfig, "basis_", "value_table", "BASISOptions")
"""BASIS's typed options (``BASISConfig``'s ``basis_*`` fields without the prefix): what the ``"value_table"``
strategy reads, from a :class:`BASISConfig` or from ``rollout_strategy_kwargs``."""


def basis_options(o) -> dict:
    """The estimator options of :data:`BASISOptions` ``o`` (:data:`BASIS_OPTION_DEFAULTS`' names) as
    :class:`ValueTableLookup` options."""
    return {name: getattr(o, name) for name in BASIS_OPTION_DEFAULTS}


def validate_basis_config_options(o) -> None:
    """Check :data:`BASISOptions` ``o``: the estimator options and beta grid
    (:func:`~trl_ext.estimators.basis.validate_basis_options`) and the table path's type. Raises ``ValueError``."""
    validate_basis_options({**basis_options(o), "beta_grid": o.beta_grid}, prefix="basis_")
    if o.value_table_path is not None and not isinstance(o.value_table_path, str | os.PathLike):
        raise ValueError(f"basis_value_table_path must be a path, got {type(o.value_table_path).__name__}.")

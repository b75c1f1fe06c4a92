"""BASIS: batchwise advantage estimation from single-rollout information sharing.

``BASISTrainer`` trains with **one rollout per prompt** (G = 1) and replaces the group baseline of GRPO by the BASIS
baseline of Gong et al. ("BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM
Reasoning", May 2026):

1. *Offline values* (Section 4, Proposition 2, Appendix 10): a value table built once from the frozen reference
   policy (``trl-ext build-value-table``) gives, for every training prompt, the KL-tilted value
   ``V_beta(x) = E_ref[r e^{r/beta}] / E_ref[e^{r/beta}]`` on the 230-point beta grid -- the binary closed form
   ``p e^{1/beta} / (1 - p + p e^{1/beta})`` from the pass rate ``p``, or the plug-in estimate from the stored
   per-sample rewards for non-binary rewards.
2. *Batchwise refinement* (Eq. 2, Proposition 1, Appendix 8): over the **global** generation batch (gathered across
   ranks, :class:`~trl_ext.trainers.batch.RolloutBatch`), each prompt's baseline is a leave-one-out weighted mean
   of the other prompts' rewards (UNB Eq. 4 default, VOP Eq. 5, RVG Eq. 6).
3. *Online calibration* (Eq. 3): ``beta_t`` is re-selected on the grid at every generation batch. The default
   ``objective="robust"`` scores every beta on all prompts (fallback included) so that the active set cannot
   collapse (see ``docs/estimators_basis.md``); ``"paper"`` is Eq. 3 as written.
4. Advantage ``A_i = r_i - b_i`` (Section 4), optionally divided by the batch std (off by default, as in the paper).

The trainer is a preset of :class:`trl_ext.GRPOTrainer`: the registered ``"basis"`` estimator
(:mod:`trl_ext.estimators.basis`, pure numpy: steps 1-4) fed by the registered ``"value_table"`` rollout strategy
(:class:`~trl_ext.trainers.basis.strategy.ValueTableLookup`: each row's offline value, the estimator options, the
beta history and the ``basis/*`` metrics). This module holds the config, the preset and its model card.
See ``docs/basis.md`` for usage and for the TRL settings that reproduce the paper's GRPO / GPG / GSPO combinations.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..._io import sha256_file
from ...estimators.basis import BASIS_OPTION_DEFAULTS, validate_basis_options
from ...priors.table_format import ValueTable
from .. import model_card
from ..base import ExtGRPOConfig, GRPOTrainer, as_config
from ..config import accept_renamed_fields
from .strategy import ValueTableLookup
from .table_checks import resolve_value_table

__all__ = ["BASISConfig", "BASISTrainer", "BASIS_PAPER", "basis_model_card_details", "card_table_source", "file_sha256"]

BASIS_PAPER = model_card.paper_info(
    title="BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM Reasoning",
    authors=("Gong", "others"), year=2026, bibtex_key="gong2026basis",
)
"""The BASIS paper in TRL's model-card format (no arXiv id known: the card cites it by title)."""


file_sha256 = sha256_file
"""SHA-256 of a file's bytes (:func:`trl_ext._io.sha256_file`, re-exported here)."""


# ---------------------------------------------------------------------------------------------------------- config
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

    uses_advantage_estimator: ClassVar[bool] = False
    method_rollout_strategy: ClassVar[str | None] = "value_table"

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
        _validate_basis_options(self)


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


def basis_options(cfg) -> dict:
    """The ``basis_*`` fields of a config as :class:`ValueTableLookup` options."""
    return {name: getattr(cfg, f"basis_{name}") for name in BASIS_OPTION_DEFAULTS}


def _validate_basis_options(cfg) -> None:
    validate_basis_options({**basis_options(cfg), "beta_grid": cfg.basis_beta_grid}, prefix="basis_")
    if cfg.basis_value_table_path is not None and not isinstance(cfg.basis_value_table_path, str | os.PathLike):
        raise ValueError(f"basis_value_table_path must be a path, got {type(cfg.basis_value_table_path).__name__}.")


# ---------------------------------------------------------------------------------------------------------- trainer
def card_table_source(source: Any) -> str:
    """How a value table's source appears in a model card: a path by its file name only (the card is pushed to the
    Hub, the machine's directories are not; the file hash identifies the table), anything else as is."""
    return os.path.basename(source) if isinstance(source, str) and os.sep in source else str(source)


def basis_model_card_details(trainer) -> dict[str, Any]:
    """What a BASIS run depended on, for the model card: the value table (content hash, file hash, rows, and the
    reference model, reward functions and sample count from its header), the estimator options and the last beta."""
    info = trainer.value_table_info()
    a = trainer.args
    out = {
        "value table sha256 (rows)": f"`{info['rows_sha256']}`",
        "value table": f"{card_table_source(info['source'])} ({info['rows']} rows)",
    }
    if info["file_sha256"] is not None:
        out["value table file sha256"] = f"`{info['file_sha256']}`"
    out["reference model (table header)"] = info["reference_model"] if info["reference_model"] else "not recorded"
    for key in ("reward_funcs", "n_samples", "seed", "created"):
        if key in info["metadata"]:
            out[f"value table {key}"] = info["metadata"][key]
    out["estimator"] = (f"basis_variant = {a.basis_variant}, basis_objective = {a.basis_objective}, basis_fallback = "
                        f"{a.basis_fallback}, beta grid of {len(trainer.basis_beta_grid)} points on "
                        f"[{float(trainer.basis_beta_grid[0]):.4g}, {float(trainer.basis_beta_grid[-1]):.4g}], "
                        f"basis_scale_advantages = {a.basis_scale_advantages}")
    if trainer.beta_history:
        out["beta_t (last training batch)"] = float(trainer.beta_history[-1])
    return out


@model_card.model_card_info(name="BASIS", tags=("trl", model_card.TRL_EXT_TAG, "basis"), paper=BASIS_PAPER,
                        details=(basis_model_card_details,))
class BASISTrainer(GRPOTrainer):
    """GRPO-family trainer with one rollout per prompt and the BASIS baseline (Section 4, Algorithm 1).

    A preset of :class:`trl_ext.GRPOTrainer`: the registered ``"basis"`` estimator (``train_estimator``, on
    evaluation batches too) fed by the registered ``"value_table"`` rollout strategy
    (:class:`~trl_ext.trainers.basis.strategy.ValueTableLookup`), which this class builds from the value table.
    Same constructor as :class:`trl.GRPOTrainer` plus ``value_table``; ``args`` must be a :class:`BASISConfig`.

    Parameters
    ----------
    model, reward_funcs, train_dataset, eval_dataset, **kwargs
        As for :class:`trl.GRPOTrainer` (``peft_config=``, ``processing_class=``, ``callbacks=`` ...). The dataset's
        ``prompt`` column is looked up in the table by :func:`~trl_ext.priors.table_format.prompt_key`.
    args : BASISConfig
    value_table : ValueTable or path, optional
        Overrides ``args.basis_value_table_path``.

    Raises
    ------
    ValueError
        No table; an empty table; rows with different ``reward_range``; the table covers none of the training
        prompts; the table's ``reward_funcs``/``model`` differ and ``basis_strict_table_check=True``. At training time:
        more than ``basis_max_missing_fraction`` of a batch missing, or a reward outside the table's ``reward_range``.

    Warns
    -----
    UserWarning
        Table built with different reward functions or model (header metadata), more than
        ``basis_max_missing_fraction`` of the training prompts missing, non-binary training rewards while the table only
        stores pass rates (the binary closed form is then an approximation), ``scale_rewards="batch"`` or
        ``multi_objective_aggregation="normalize_then_sum"`` (ignored by BASIS).

    Attributes
    ----------
    beta_history : list of float
        ``beta_t`` of every training generation batch (saved in checkpoints, restored on resume).
    beta_history_steps : list of int
        ``global_step`` at which each ``beta_t`` was selected.
    last_calibration : CalibrationResult or None
        Full calibration of the latest batch (grid losses, masks, counts).

    Notes
    -----
    Model card (``create_model_card``, which TRL calls at every checkpoint and ``push_to_hub`` calls): "trained with
    BASIS", the BASIS paper (:data:`BASIS_PAPER`), tags ``trl``, ``trl-ext``, ``basis``, and a ``trl_ext run
    details`` section with the value table's content hash, file hash, reference model and reward functions (table
    header) and the estimator options (:func:`basis_model_card_details`, :meth:`value_table_info`).
    """

    config_class = BASISConfig
    unique_prompt_sampler = True
    train_estimator = "basis"

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, *,
                 value_table: ValueTable | str | os.PathLike | None = None, **kwargs):
        if args is None:
            raise TypeError("BASISTrainer needs args=BASISConfig(...) (num_generations=1 and the value-table options).")
        args = as_config(args, BASISConfig, "BASISTrainer")
        spec = value_table if value_table is not None else args.basis_value_table_path
        is_path = isinstance(spec, str | os.PathLike)
        # the strategy is built before TRL's setup so that a bad table fails first
        self._basis_strategy = ValueTableLookup(resolve_value_table(spec), beta_grid=args.basis_beta_grid,
                                                **basis_options(args))
        self._basis_table_source = {"source": os.fspath(spec) if is_path else "in-memory ValueTable",
                                    "file_sha256": file_sha256(spec) if is_path else None}
        self._basis_table_rows_sha256: str | None = None
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, **kwargs)
        if args.scale_rewards not in ("group", "none", True, False):
            warnings.warn(f"BASISTrainer ignores scale_rewards={args.scale_rewards!r} (the advantage is r - b); use "
                          "basis_scale_advantages=True for batch std scaling.", UserWarning, stacklevel=2)
        if args.multi_objective_aggregation != "sum_then_normalize":
            warnings.warn("BASISTrainer ignores multi_objective_aggregation: the reward is the weighted sum of the "
                          "reward functions.", UserWarning, stacklevel=2)
        # table compatibility (header metadata vs. the training setup) and coverage of the training prompts
        model_id = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", None)
        self.rollout_strategy.check_setup(self, strict=bool(args.basis_strict_table_check), model_id=model_id or "",
                                          allow_sampling_mismatch=bool(args.basis_allow_sampling_mismatch))

    def create_rollout_strategy(self) -> ValueTableLookup:
        """The ``"value_table"`` strategy over this trainer's value table."""
        return self._basis_strategy

    # -------------------------------------------------------------------------------- the strategy's state
    @property
    def value_table(self) -> ValueTable:
        """The value table in use."""
        return self._basis_strategy.table

    @property
    def basis_beta_grid(self) -> np.ndarray:
        """The beta grid in use (``basis_beta_grid`` or the paper's 230 points)."""
        return self._basis_strategy.beta_grid

    @property
    def beta_history(self) -> list[float]:
        return self._basis_strategy.beta_history

    @property
    def beta_history_steps(self) -> list[int]:
        return self._basis_strategy.beta_history_steps

    @property
    def last_calibration(self):
        return self._basis_strategy.last_calibration

    def value_table_info(self) -> dict[str, Any]:
        """What identifies the value table this run uses (recorded in the model card).

        Returns
        -------
        dict
            ``rows_sha256`` (``ValueTable.content_hash``: the rows' canonical JSON, whatever the file's row order
            and header; computed once), ``file_sha256`` (of the file's bytes as read at
            construction; ``None`` for an in-memory table), ``source`` (path or ``"in-memory ValueTable"``),
            ``rows``, ``reference_model`` (the header's ``model``, or ``None``) and ``metadata`` (the header).
        """
        table = self.value_table
        if self._basis_table_rows_sha256 is None:
            self._basis_table_rows_sha256 = table.content_hash
        md = dict(table.metadata)
        return {"rows_sha256": self._basis_table_rows_sha256, "rows": len(table),
                "reference_model": md.get("model"), "metadata": md, **self._basis_table_source}

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

The math lives in :mod:`trl_ext.estimators.basis` (pure numpy); this module only wires it into TRL.
See ``docs/basis.md`` for usage and for the TRL settings that reproduce the paper's GRPO / GPG / GSPO combinations.
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from ..estimators.basis import (
    calibrate_beta,
    default_beta_grid,
    std_scale_advantages,
    v_beta,
    v_beta_from_samples,
)
from ..priors.table_format import ValueTable, load_value_table, prompt_key
from . import model_card
from .base import ExtGRPOConfig, GRPOTrainer, as_config, validate_ext_config
from .batch import RolloutBatch

__all__ = ["BASISConfig", "BASISTrainer", "BASIS_METRICS", "BASIS_PAPER", "file_sha256"]

_VARIANTS = ("unb", "vop", "rvg")
_OBJECTIVES = ("robust", "paper")
_FALLBACKS = ("zero", "batch_mean", "value")
_ADV_EPS = 1e-4  # TRL's guard constant for std scaling
_RANGE_TOL = 1e-6  # rewards this far outside the table's reward_range are clipped, further ones raise

BASIS_METRICS = (
    "basis/beta",
    "basis/calibration_loss",
    "basis/active_fraction",
    "basis/fallback_count",
    "basis/no_source_count",
    "basis/missing_count",
    "basis/missing_fraction",
    "basis/frac_baseline_0_or_1",
    "basis/mean_baseline",
    "basis/mean_sq_advantage",
)
"""Metric names :class:`BASISTrainer` logs every generation batch (train and eval)."""


BASIS_PAPER = model_card.paper_info(
    title="BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM Reasoning",
    authors=("Gong", "others"), year=2026, bibtex_key="gong2026basis",
)
"""The BASIS paper in TRL's model-card format (no arXiv id known: the card cites it by title)."""


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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

    def __post_init__(self):
        _check_single_rollout(self)
        # ExtGRPOConfig.__post_init__ validates with a placeholder group size (TRL rejects num_generations < 2)
        super().__post_init__()
        _validate_basis_options(self)

    @staticmethod
    def validate_method_options(cfg) -> None:
        """Validation of a plain ``trl.GRPOConfig`` upgraded to a ``BASISConfig`` (``as_config``)."""
        _check_single_rollout(cfg, upgraded=True)
        validate_ext_config(cfg)
        _validate_basis_options(cfg)


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


def _validate_basis_options(cfg) -> None:
    if cfg.basis_variant not in _VARIANTS:
        raise ValueError(f"basis_variant must be one of {_VARIANTS}, got {cfg.basis_variant!r}.")
    if cfg.basis_objective not in _OBJECTIVES:
        raise ValueError(f"basis_objective must be one of {_OBJECTIVES}, got {cfg.basis_objective!r}.")
    if cfg.basis_fallback not in _FALLBACKS:
        raise ValueError(f"basis_fallback must be one of {_FALLBACKS}, got {cfg.basis_fallback!r}.")
    eps = cfg.basis_eps
    if not (isinstance(eps, int | float) and not isinstance(eps, bool) and 0.0 <= eps < 0.5):
        raise ValueError(f"basis_eps must be a number in [0, 0.5), got {eps!r}.")
    maf = cfg.basis_min_active_fraction
    if not (isinstance(maf, int | float) and not isinstance(maf, bool) and 0.0 <= maf <= 1.0):
        raise ValueError(f"basis_min_active_fraction must be in [0, 1], got {maf!r}.")
    mmf = cfg.basis_max_missing_fraction
    if not (isinstance(mmf, int | float) and not isinstance(mmf, bool) and 0.0 <= mmf <= 1.0):
        raise ValueError(f"basis_max_missing_fraction must be in [0, 1] (share of a batch), got {mmf!r}.")
    if cfg.basis_beta_grid is not None:
        grid = np.asarray(cfg.basis_beta_grid, dtype=np.float64)
        if grid.ndim != 1 or grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid <= 0) or np.any(
            np.diff(grid) <= 0
        ):
            raise ValueError(
                "basis_beta_grid must be a non-empty, strictly increasing list of finite numbers > 0, got "
                f"{list(cfg.basis_beta_grid)[:10]!r}."
            )
    if cfg.basis_value_table_path is not None and not isinstance(cfg.basis_value_table_path, str | os.PathLike):
        raise ValueError(f"basis_value_table_path must be a path, got {type(cfg.basis_value_table_path).__name__}.")


# ---------------------------------------------------------------------------------------------------------- trainer
@dataclass
class _Lookup:
    """Per-prompt offline value: ``p`` (closed form) or ``v`` (K-vector from samples); both None if missing."""

    p: float | None = None
    v: np.ndarray | None = None
    binary_stats_only: bool = False

    @property
    def missing(self) -> bool:
        return self.p is None and self.v is None


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

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, *,
                 value_table: ValueTable | str | os.PathLike | None = None, **kwargs):
        if args is None:
            raise TypeError("BASISTrainer needs args=BASISConfig(...) (num_generations=1 and the value-table options).")
        args = as_config(args, BASISConfig, "BASISTrainer")
        spec = value_table if value_table is not None else args.basis_value_table_path
        table = _resolve_table(spec)
        self._basis_table = table
        is_path = isinstance(spec, str | os.PathLike)
        self._basis_table_source = {"source": os.fspath(spec) if is_path else "in-memory ValueTable",
                                    "file_sha256": file_sha256(spec) if is_path else None}
        self._basis_table_rows_sha256: str | None = None
        self._basis_range = _common_reward_range(table)
        self._basis_grid = (np.asarray(args.basis_beta_grid, dtype=np.float64) if args.basis_beta_grid is not None
                            else default_beta_grid())
        self._basis_cache: dict[str, _Lookup] = {}
        self.beta_history: list[float] = []
        self.beta_history_steps: list[int] = []
        self.last_calibration = None
        self._basis_totals = {"basis_missing_total": 0, "basis_fallback_total": 0, "basis_rows_total": 0}
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, **kwargs)
        if args.scale_rewards not in ("group", "none", True, False):
            warnings.warn(f"BASISTrainer ignores scale_rewards={args.scale_rewards!r} (the advantage is r - b); use "
                          "basis_scale_advantages=True for batch std scaling.", UserWarning, stacklevel=2)
        if args.multi_objective_aggregation != "sum_then_normalize":
            warnings.warn("BASISTrainer ignores multi_objective_aggregation: the reward is the weighted sum of the "
                          "reward functions.", UserWarning, stacklevel=2)
        # table compatibility (header metadata vs. the training setup)
        model_id = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", None)
        table.check_compatible(reward_funcs=list(self.reward_func_names), model=model_id or None,
                               strict=bool(args.basis_strict_table_check))
        self._basis_check_coverage(self.train_dataset)

    # ----------------------------------------------------------------------------------------------- table
    @property
    def basis_beta_grid(self) -> np.ndarray:
        """The beta grid in use (``basis_beta_grid`` or the paper's 230 points)."""
        return self._basis_grid

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
        if self._basis_table_rows_sha256 is None:
            self._basis_table_rows_sha256 = self._basis_table.content_hash
        md = dict(self._basis_table.metadata)
        return {"rows_sha256": self._basis_table_rows_sha256, "rows": len(self._basis_table),
                "reference_model": md.get("model"), "metadata": md, **self._basis_table_source}

    def _basis_check_coverage(self, dataset) -> None:
        from datasets import Dataset

        if not isinstance(dataset, Dataset) or "prompt" not in dataset.column_names or len(dataset) == 0:
            return  # iterable / custom datasets: checked batch by batch
        prompts = dataset["prompt"]
        n_missing = sum(self._basis_table.lookup(p) is None for p in prompts)  # also detects key collisions
        if n_missing == len(prompts):
            raise ValueError(
                f"The value table ({len(self._basis_table)} rows) covers none of the {len(prompts)} training prompts: "
                "it was built for another dataset or prompt format. Rebuild it with `trl-ext build-value-table` on "
                "this train_dataset."
            )
        frac = n_missing / len(prompts)
        if frac > self.args.basis_max_missing_fraction:
            warnings.warn(
                f"{n_missing} of {len(prompts)} training prompts ({frac:.1%}) are missing from the value table, more "
                f"than basis_max_missing_fraction={self.args.basis_max_missing_fraction}: training stops at the first batch "
                "above the limit. Complete the table (`trl-ext build-value-table` resumes) or raise the limit.",
                UserWarning, stacklevel=3,
            )

    def _basis_lookup(self, prompt: Any) -> _Lookup:
        """Offline value of one prompt, cached by key. Raises on key collisions (``ValueTable.lookup``)."""
        key = prompt_key(prompt)
        hit = self._basis_cache.get(key)
        if hit is not None:
            return hit
        row = self._basis_table.lookup(prompt)
        if row is None:
            out = _Lookup()
        elif row.rewards is not None and not row.is_binary:
            lo, hi = row.reward_range
            u = (np.asarray(row.rewards, dtype=np.float64) - lo) / (hi - lo)
            out = _Lookup(v=np.clip(v_beta_from_samples([u], self._basis_grid)[0], 0.0, 1.0))
        else:
            out = _Lookup(p=row.success_probability, binary_stats_only=row.rewards is None)
        self._basis_cache[key] = out
        return out

    # ------------------------------------------------------------------------------------------- estimator
    def compute_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """BASIS advantages ``A_i = r_i - b_i`` for every row of the global batch (Section 4, Eq. 2-4).

        Steps: map rewards to [0, 1] with the table's ``reward_range``; look every prompt up (missing -> NaN value,
        error above ``basis_max_missing_fraction``); :func:`~trl_ext.estimators.basis.calibrate_beta` selects ``beta_t``
        on the grid and returns the refined baseline (fallback for inactive / missing / source-less prompts); map
        the baseline back to the reward scale; optionally (``basis_scale_advantages``) divide by the batch std
        with :func:`~trl_ext.estimators.basis.std_scale_advantages` (the same function as the ``"basis"``
        registry entry's ``normalize=True``; unscaled when fewer than 2 rewards are finite). Pad rows get 0 and are
        not counted. The result depends only on ``batch`` (identical on every rank).

        Parameters
        ----------
        batch : RolloutBatch
            Global generation batch, one rollout per prompt.

        Returns
        -------
        Tensor, shape (N,), float32
            0 on pad rows and on rows with a NaN reward.

        Raises
        ------
        ValueError
            More than ``basis_max_missing_fraction`` of the (non-pad) rows of a **training** batch missing from the
            table (evaluation batches, normally held-out prompts, get the fallback and a warning); a finite reward
            outside the table's ``reward_range``.
        """
        mode = batch.mode
        real = (~batch.is_pad).numpy()
        out = np.zeros(batch.num_rows, dtype=np.float64)
        n = int(real.sum())
        if n == 0:
            return torch.zeros(batch.num_rows, dtype=torch.float32)
        lo, hi = self._basis_range
        r = batch.rewards.double().numpy()[real]
        u = (r - lo) / (hi - lo)
        fin = np.isfinite(u)
        outside = fin & ((u < -_RANGE_TOL) | (u > 1 + _RANGE_TOL))
        if outside.any():
            bad = r[outside][:5].tolist()
            raise ValueError(
                f"{int(outside.sum())} training reward(s) lie outside the value table's reward_range [{lo}, {hi}] "
                f"(e.g. {bad}): the table was built with different reward functions or weights. Rebuild it with the "
                "training reward_funcs and reward_weights."
            )
        u = np.where(fin, np.clip(u, 0.0, 1.0), np.nan)
        prompts = [p for p, keep in zip(batch.prompts, real.tolist()) if keep]
        looks = [self._basis_lookup(p) for p in prompts]
        missing = np.array([x.missing for x in looks])
        n_missing = int(missing.sum())
        if n_missing / n > self.args.basis_max_missing_fraction and mode == "eval":
            # held-out evaluation prompts are normally absent from the training table: fallback baseline, logged in
            # eval_basis/missing_fraction (the limit guards training against a wrong table)
            self._ext_warn_once(
                "basis_eval_missing",
                f"{n_missing} of the {n} prompts of an evaluation batch are missing from the value table; they get "
                f"the '{self.args.basis_fallback}' fallback baseline (logged as eval_basis/missing_fraction).",
            )
        elif n_missing / n > self.args.basis_max_missing_fraction:
            raise ValueError(
                f"{n_missing} of the {n} prompts of this batch ({n_missing / n:.1%}) are missing from the value table "
                f"(basis_max_missing_fraction={self.args.basis_max_missing_fraction}). The table was probably built for another "
                "dataset or prompt format: rebuild it with `trl-ext build-value-table` on the training dataset, or "
                "raise basis_max_missing_fraction to train with the fallback baseline on missing prompts."
            )
        non_binary = bool(np.any(fin & (u != 0.0) & (u != 1.0)))
        if non_binary and any(x.p is not None for x in looks):
            self._ext_warn_once(
                "basis_non_binary",
                "Training rewards are not binary but the value table holds only binary statistics for some prompts "
                "(pass rates without per-sample non-binary rewards): V_beta uses the binary closed form, an "
                "approximation here. Rebuild the table storing per-sample rewards.",
            )
        if any(x.v is not None for x in looks):  # (N, K) table path: non-binary rows from samples
            k = self._basis_grid.size
            p_hat = np.full((n, k), np.nan)
            for i, x in enumerate(looks):
                if x.v is not None:
                    p_hat[i] = x.v
                elif x.p is not None:
                    p_hat[i] = v_beta(x.p, self._basis_grid)
        else:
            p_hat = np.array([np.nan if x.p is None else x.p for x in looks], dtype=np.float64)
        cfg = self.args
        cal = calibrate_beta(u, p_hat, self._basis_grid, variant=cfg.basis_variant, objective=cfg.basis_objective,
                             eps=float(cfg.basis_eps), fallback=cfg.basis_fallback,
                             min_active_fraction=float(cfg.basis_min_active_fraction))
        res = cal.result
        b_raw = lo + (hi - lo) * cal.baseline
        adv = np.where(fin, r - b_raw, 0.0)
        if cfg.basis_scale_advantages:  # the estimator's implementation, applied on the reward's own scale
            adv, _ = std_scale_advantages(adv, fin, eps=_ADV_EPS)
        out[real] = adv
        self.last_calibration = cal
        # diagnostics
        msq = float(np.mean(adv[fin] ** 2)) if fin.any() else 0.0
        metrics = {
            "basis/beta": cal.beta,
            "basis/calibration_loss": cal.loss,
            "basis/active_fraction": cal.active_fraction,
            "basis/fallback_count": res.n_fallback,
            "basis/no_source_count": res.n_no_source,
            "basis/missing_count": n_missing,
            "basis/missing_fraction": n_missing / n,
            "basis/frac_baseline_0_or_1": res.frac_extreme,
            "basis/mean_baseline": float(np.mean(b_raw)),
            "basis/mean_sq_advantage": msq,
        }
        for name, value in metrics.items():
            self.log_ext_metric(name, value, mode)
        if mode == "train":
            self.beta_history.append(float(cal.beta))
            self.beta_history_steps.append(int(self.state.global_step))
            self._basis_totals["basis_missing_total"] += n_missing
            self._basis_totals["basis_fallback_total"] += int(res.n_fallback)
            self._basis_totals["basis_rows_total"] += n
        return torch.as_tensor(out, dtype=torch.float32)

    # ------------------------------------------------------------------------------------------- state
    def ext_state_dict(self) -> dict:
        """Base state plus the beta trajectory (``basis_beta_history``, ``basis_beta_steps``) and counters."""
        state = super().ext_state_dict()
        state["basis_beta_history"] = [float(b) for b in self.beta_history]
        state["basis_beta_steps"] = [int(s) for s in self.beta_history_steps]
        state.update({k: int(v) for k, v in self._basis_totals.items()})
        return state

    def load_ext_state_dict(self, state: dict) -> None:
        """Restore the beta trajectory and counters saved by :meth:`ext_state_dict`."""
        super().load_ext_state_dict(state)
        if "basis_beta_history" not in state:
            warnings.warn("The checkpoint has no BASIS beta history (written by another trainer?); it starts empty.",
                          UserWarning, stacklevel=2)
            return
        hist, steps = list(state["basis_beta_history"]), list(state.get("basis_beta_steps", []))
        if len(steps) != len(hist) or not all(isinstance(b, int | float) and math.isfinite(b) for b in hist):
            raise ValueError(f"Corrupt BASIS state: {len(hist)} betas and {len(steps)} steps (or non-finite betas).")
        self.beta_history = [float(b) for b in hist]
        self.beta_history_steps = [int(s) for s in steps]
        for k in self._basis_totals:
            if k in state:
                self._basis_totals[k] = int(state[k])


def _resolve_table(spec) -> ValueTable:
    if spec is None:
        raise ValueError(
            "BASISTrainer needs a value table: set BASISConfig(basis_value_table_path=...) or pass value_table=. Build one "
            "with `trl-ext build-value-table` (reference-policy samples per training prompt, paper Appendix 10)."
        )
    if isinstance(spec, ValueTable):
        table = spec
    elif isinstance(spec, str | os.PathLike):
        if not os.path.exists(spec):
            raise FileNotFoundError(f"value table {os.fspath(spec)!r} does not exist; build it with "
                                    "`trl-ext build-value-table`.")
        table = load_value_table(spec)  # corrupt / partial files raise ValueError with the line number
    else:
        raise TypeError(f"value_table must be a ValueTable or a path, got {type(spec).__name__}.")
    if len(table) == 0:
        raise ValueError("The value table has no rows; build it on the training dataset first.")
    return table


def _common_reward_range(table: ValueTable) -> tuple[float, float]:
    ranges = {tuple(row.reward_range) for row in table}
    if len(ranges) != 1:
        raise ValueError(f"The value table mixes reward ranges {sorted(ranges)[:4]}; BASIS maps rewards to [0, 1] "
                         "with one range, so rebuild the table with a single reward_range.")
    lo, hi = ranges.pop()
    return float(lo), float(hi)

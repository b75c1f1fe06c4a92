"""BASIS's rollout strategy: TRL's fixed groups plus each row's offline value ``p_hat`` from a value table.

:class:`ValueTableLookup` (registered as ``"value_table"``) feeds the registered ``"basis"`` estimator
(:mod:`trl_ext.estimators.basis`; Gong et al., "BASIS: Batchwise Advantage Estimation from Single-Rollout Information
Sharing for LLM Reasoning", May 2026): ``p_hat`` per row from the value table (Section 4 "Offline value estimation",
Proposition 2, Appendix 10), its options as estimator arguments, then the missing-row count, the calibrated ``beta_t``
(Eq. 3) and :data:`BASIS_METRICS`. Built by :class:`~trl_ext.trainers.basis.BASISTrainer`, or on any trainer by config:
``rollout_strategy="value_table", rollout_strategy_kwargs={"value_table_path": ...}`` (``docs/basis.md``).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...estimators.basis import (
    BASIS_OPTION_DEFAULTS,
    default_beta_grid,
    rewards_to_unit,
    v_beta,
    v_beta_from_samples,
    validate_basis_options,
)
from ...priors.table_checks import check_table_coverage, check_table_sampling, common_reward_range, resolve_value_table
from ...priors.table_format import ValueTable, prompt_key
from ..rollouts import FixedGroups, RolloutGroups, register_rollout_strategy
from .config import BASISOptions, basis_options, validate_basis_config_options

if TYPE_CHECKING:  # pragma: no cover
    from ..batch import RolloutBatch

__all__ = ["BASIS_METRICS", "ValueTableLookup"]

BASIS_METRICS = (
    "basis/beta", "basis/calibration_loss", "basis/active_fraction", "basis/fallback_count", "basis/no_source_count",
    "basis/missing_count", "basis/missing_fraction", "basis/frac_baseline_0_or_1", "basis/mean_baseline",
    "basis/mean_sq_advantage",
)
"""Metric names :class:`ValueTableLookup` logs every generation batch (train and eval)."""


@dataclass
class _Lookup:
    """Per-prompt offline value: ``p`` (closed form) or ``v`` (K-vector from samples); both None if missing."""

    p: float | None = None
    v: np.ndarray | None = None

    @property
    def missing(self) -> bool:
        return self.p is None and self.v is None


@register_rollout_strategy("value_table")
class ValueTableLookup(FixedGroups):
    """TRL's fixed groups feeding the ``"basis"`` estimator with each row's offline value ``p_hat``.

    Parameters
    ----------
    table : ValueTable
        One row per training prompt (:mod:`trl_ext.priors.table_format`), all with the same ``reward_range``.
    beta_grid : array_like, optional
        The beta grid (strictly increasing, > 0); default the paper's 230 points
        (:func:`~trl_ext.estimators.basis.default_beta_grid`).
    **options
        The estimator options of :data:`~trl_ext.estimators.basis.BASIS_OPTION_DEFAULTS` (variant, objective,
        fallback, eps, min_active_fraction, scale_advantages, max_missing_fraction); paper defaults.

    Attributes
    ----------
    table : ValueTable
    reward_range : tuple of float
        The table's common ``(lo, hi)``: rewards are mapped to [0, 1] with it by the estimator.
    beta_grid : numpy.ndarray, shape (K,)
    beta_history, beta_history_steps : list
        ``beta_t`` of every training generation batch and the ``global_step`` it was selected at (checkpointed).
    last_calibration : CalibrationResult or None
        The full calibration of the latest batch (train or eval).
    totals : dict
        ``missing_total``, ``fallback_total``, ``rows_total`` over the training batches (checkpointed).

    Raises
    ------
    ValueError
        An empty table, or rows with different ``reward_range``.

    Notes
    -----
    ``p_hat`` per row is the reference pass rate (the estimator evaluates the closed form ``V_beta = p e^{1/beta} /
    (1 - p + p e^{1/beta})`` on the grid), or -- for a row that stores non-binary per-sample rewards -- the plug-in
    ``V_beta`` of Proposition 2 on the grid (:func:`~trl_ext.estimators.basis.v_beta_from_samples`), and NaN for a
    prompt missing from the table (the estimator gives it the fallback baseline). When any row of the gathered batch
    has a sample-based value, every row is sent as its ``V_beta`` vector on the grid (pass rates through
    :func:`~trl_ext.estimators.basis.v_beta`); that decision is taken over all ranks.
    """

    provides = frozenset({"p_hat", "beta_grid", "variant", "objective", "eps", "fallback", "min_active_fraction",
                          "normalize", "norm_eps", "reward_range"})

    def __init__(self, table: ValueTable, beta_grid=None, **options):
        if len(table) == 0:
            raise ValueError("The value table has no rows; build it on the training dataset first.")
        self.options = validate_basis_options({**BASIS_OPTION_DEFAULTS, **options})
        self.table = table
        self.reward_range = common_reward_range(table)
        self.beta_grid = default_beta_grid() if beta_grid is None else np.asarray(beta_grid, dtype=np.float64)
        self.beta_history: list[float] = []
        self.beta_history_steps: list[int] = []
        self.last_calibration = None
        self.totals = {"missing_total": 0, "fallback_total": 0, "rows_total": 0}
        self._cache: dict[str, _Lookup] = {}
        self._has_sample_rows: bool | None = None

    @classmethod
    def validate_kwargs(cls, kwargs: dict, config=None) -> None:
        """Config-time check of ``rollout_strategy_kwargs`` (:data:`~trl_ext.trainers.basis.config.BASISOptions`:
        unknown names refused, ``value_table_path`` required; ``ValueError`` saying what to change)."""
        options = BASISOptions.from_kwargs(kwargs)
        if not isinstance(options.value_table_path, str | os.PathLike):
            raise ValueError("rollout_strategy='value_table' needs rollout_strategy_kwargs={'value_table_path': "
                             "<JSON Lines value table>} (build one with `trl-ext build-value-table`).")
        validate_basis_config_options(options)

    @classmethod
    def from_trainer(cls, trainer, table: ValueTable | None = None, **kwargs):
        """The strategy the config selects on any trainer: ``table`` (``BASISTrainer``'s, read before TRL's setup),
        else the table at ``value_table_path`` (of a :class:`~trl_ext.trainers.basis.BASISConfig`, or of
        ``rollout_strategy_kwargs``), checked against the trainer's setup (:meth:`check_setup`)."""
        o = BASISOptions.of(trainer.args, kwargs)
        table = resolve_value_table(o.value_table_path) if table is None else table
        strategy = cls(table, beta_grid=o.beta_grid, **basis_options(o))
        strategy.check_setup(trainer, strict=bool(o.strict_table_check),
                             allow_sampling_mismatch=bool(o.allow_sampling_mismatch))
        return strategy

    def check_setup(self, trainer, strict: bool = False, model_id: str | None = None,
                    allow_sampling_mismatch: bool = False) -> None:
        """The table's header against the trainer's reward functions and model, its sampling settings against the
        training config (:func:`~trl_ext.priors.table_checks.check_table_sampling`), and its coverage of the
        training prompts (:func:`~trl_ext.priors.table_checks.check_table_coverage`); a ``UserWarning`` for each TRL
        field BASIS ignores (``scale_rewards``, ``multi_objective_aggregation``)."""
        args = trainer.args
        if args.scale_rewards not in ("group", "none", True, False):
            warnings.warn(f"BASIS ignores scale_rewards={args.scale_rewards!r} (the advantage is r - b); use "
                          "basis_scale_advantages=True for batch std scaling.", UserWarning, stacklevel=4)
        if args.multi_objective_aggregation != "sum_then_normalize":
            warnings.warn("BASIS ignores multi_objective_aggregation: the reward is the weighted sum of the reward "
                          "functions.", UserWarning, stacklevel=4)
        if model_id is None:
            model_id = getattr(getattr(trainer.model, "config", None), "_name_or_path", None)
        self.table.check_compatible(reward_funcs=list(trainer.reward_func_names), model=model_id or None,
                                    strict=strict)
        check_table_sampling(self.table, trainer.args, allow=allow_sampling_mismatch,
                            tokenizer=getattr(trainer, "processing_class", None))
        check_table_coverage(self.table, trainer.train_dataset, self.options["max_missing_fraction"])

    def describe(self, api):
        lo, hi = self.reward_range
        return (f"rollout strategy value_table: {api.args.generation_batch_size} rollouts per generation batch "
                f"({api.num_generations} per prompt), as TRL; each prompt's offline value p_hat from a value "
                f"table of {len(self.table)} rows (reward range [{lo:g}, {hi:g}], {self.beta_grid.size}-point beta "
                "grid)")

    # ----------------------------------------------------------------------------------------------- the table
    def lookup(self, prompt: Any) -> _Lookup:
        """Offline value of one prompt, cached by key. Raises on key collisions (``ValueTable.lookup``)."""
        key = prompt_key(prompt)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        row = self.table.lookup(prompt)
        if row is None:
            out = _Lookup()
        elif row.rewards is not None and not row.is_binary:  # plug-in V_beta of Proposition 2 from the samples
            u = rewards_to_unit(row.rewards, row.reward_range)
            out = _Lookup(v=np.clip(v_beta_from_samples([u], self.beta_grid)[0], 0.0, 1.0))
        else:
            out = _Lookup(p=row.success_probability)
        self._cache[key] = out
        return out

    def _grid_row(self, x: _Lookup) -> list[float]:
        if x.v is not None:
            return x.v.tolist()
        if x.p is not None:
            return np.asarray(v_beta(x.p, self.beta_grid), dtype=np.float64).tolist()
        return [math.nan] * self.beta_grid.size

    # ------------------------------------------------------------------------------------------ strategy hooks
    def rollout(self, api, rows) -> RolloutGroups:
        """TRL's fixed groups (train and evaluation batches) with ``p_hat`` per row and the estimator options.

        ``p_hat`` is the row's pass rate (NaN when missing), or its ``V_beta`` on the grid when any row of the
        gathered batch has a sample-based value (one collective, only for tables that hold such rows)."""
        return RolloutGroups.trl(side_inputs={"p_hat": self.p_hat(api, rows)},
                                 estimator_inputs=self.estimator_options())

    def p_hat(self, api, rows) -> list:
        """Per-row offline values of ``rows`` (see :meth:`rollout`)."""
        looks = [self.lookup(row["prompt"]) for row in rows]
        if self._has_sample_rows is None:
            self._has_sample_rows = any(r.rewards is not None and not r.is_binary for r in self.table)
        if self._has_sample_rows and any(api.gather_object([any(x.v is not None for x in looks)])):
            return [self._grid_row(x) for x in looks]
        return [math.nan if x.p is None else x.p for x in looks]

    def estimator_options(self) -> dict:
        """The ``basis_*`` options of :class:`~trl_ext.trainers.basis.BASISConfig` as keyword arguments of the
        ``"basis"`` estimator, plus the beta grid and the table's reward range."""
        o = self.options
        return {"beta_grid": self.beta_grid, "variant": o["variant"], "objective": o["objective"],
                "eps": float(o["eps"]), "fallback": o["fallback"],
                "min_active_fraction": float(o["min_active_fraction"]),
                "normalize": bool(o["scale_advantages"]), "norm_eps": 1e-4, "reward_range": self.reward_range}

    def update(self, api, batch: RolloutBatch, result) -> dict[str, float]:
        """Count the batch's prompts missing from the table, record ``beta_t`` and return :data:`BASIS_METRICS`.

        The ``"basis"`` estimator sees every real (non-pad) row, unscorable ones included (``sees_unscorable``):
        the counts and shares run over them as the paper's batch does, and a batch without any scorable row is
        recorded like any other (the largest beta, every prompt on the fallback, advantages 0).

        Raises
        ------
        ValueError
            More than ``basis_max_missing_fraction`` of the (non-pad) rows of a **training** batch missing from the
            table (evaluation batches, normally held-out prompts, keep the fallback and get one warning).
        """
        mode = batch.mode
        real = valid = ~batch.is_pad  # the "basis" estimator sees unscorable rows (sees_unscorable)
        looks = [self.lookup(p) for p, keep in zip(batch.prompts, real.tolist()) if keep]
        n = len(looks)
        if result is None:  # only pad rows (the "basis" estimator sees unscorable rows, so it ran on any real row)
            return {}
        n_missing = sum(x.missing for x in looks)
        limit = self.options["max_missing_fraction"]
        if n_missing / n > limit and mode == "eval":
            # held-out evaluation prompts are normally absent from the training table: fallback baseline, logged in
            # eval_basis/missing_fraction (the limit guards training against a wrong table)
            api.warn_once(
                "basis_eval_missing",
                f"{n_missing} of the {n} prompts of an evaluation batch are missing from the value table; they get "
                f"the '{self.options['fallback']}' fallback baseline (logged as eval_basis/missing_fraction).",
            )
        elif n_missing / n > limit:
            raise ValueError(
                f"{n_missing} of the {n} prompts of this batch ({n_missing / n:.1%}) are missing from the value table "
                f"(max_missing_fraction={limit}). The table was probably built for another dataset or prompt "
                "format: rebuild it with `trl-ext build-value-table` on the training dataset, or raise "
                "max_missing_fraction (basis_max_missing_fraction) to train with the fallback baseline on missing prompts."
            )
        u = rewards_to_unit(batch.rewards[valid].double().numpy(), self.reward_range)
        fin = np.isfinite(u)
        if np.any(fin & (u != 0.0) & (u != 1.0)) and any(x.p is not None for x in looks):
            api.warn_once(
                "basis_non_binary",
                "Training rewards are not binary but the value table holds only binary statistics for some prompts "
                "(pass rates without per-sample non-binary rewards): V_beta uses the binary closed form, an "
                "approximation here. Rebuild the table storing per-sample rewards.",
            )
        cal = result.extras["calibration"]
        res = cal.result
        self.last_calibration = cal
        metrics = {
            "basis/beta": cal.beta,
            "basis/calibration_loss": cal.loss,
            "basis/active_fraction": cal.active_fraction,
            "basis/fallback_count": res.n_fallback,
            "basis/no_source_count": res.n_no_source,
            "basis/missing_count": n_missing,
            "basis/missing_fraction": n_missing / n,
            "basis/frac_baseline_0_or_1": res.frac_extreme,
            "basis/mean_baseline": float(np.mean(result.baselines)),
            "basis/mean_sq_advantage": float(np.mean(result.advantages[fin] ** 2)) if fin.any() else 0.0,
        }
        if mode == "train":
            self.beta_history.append(float(cal.beta))
            self.beta_history_steps.append(api.global_step)
            self.totals["missing_total"] += n_missing
            self.totals["fallback_total"] += int(res.n_fallback)
            self.totals["rows_total"] += n
        return {name: float(value) for name, value in metrics.items()}

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The beta trajectory (``beta_history``, ``beta_steps``) and the :attr:`totals`."""
        return {"beta_history": [float(b) for b in self.beta_history],
                "beta_steps": [int(s) for s in self.beta_history_steps],
                **{k: int(v) for k, v in self.totals.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (``ValueError`` on a corrupt beta trajectory)."""
        hist, steps = list(state.get("beta_history", [])), list(state.get("beta_steps", []))
        if len(steps) != len(hist) or not all(isinstance(b, int | float) and math.isfinite(b) for b in hist):
            raise ValueError(f"Corrupt BASIS state: {len(hist)} betas and {len(steps)} steps (or non-finite betas).")
        self.beta_history = [float(b) for b in hist]
        self.beta_history_steps = [int(s) for s in steps]
        for k in self.totals:
            if k in state:
                self.totals[k] = int(state[k])

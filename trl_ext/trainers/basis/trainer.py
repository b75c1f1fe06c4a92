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
beta history and the ``basis/*`` metrics). This module holds the preset and its model card (the config is
:mod:`.config`).
See ``docs/basis.md`` for usage and for the TRL settings that reproduce the paper's GRPO / GPG / GSPO combinations.
"""

from __future__ import annotations

import os
from typing import Any

from ..._io import sha256_file
from ...priors.table_checks import resolve_value_table
from ...priors.table_format import ValueTable
from .. import model_card
from ..base import GRPOTrainer, as_config
from .config import BASISConfig
from .strategy import ValueTableLookup

__all__ = ["BASISTrainer", "BASIS_PAPER", "basis_model_card_details", "card_table_source", "file_sha256"]

BASIS_PAPER = model_card.paper_info(
    title="BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM Reasoning",
    authors=("Gong", "others"), year=2026, bibtex_key="gong2026basis",
)
"""The BASIS paper in TRL's model-card format (no arXiv id known: the card cites it by title)."""


file_sha256 = sha256_file
"""SHA-256 of a file's bytes (:func:`trl_ext._io.sha256_file`, re-exported here)."""


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
    grid = trainer.rollout_strategy.beta_grid
    out["estimator"] = (f"basis_variant = {a.basis_variant}, basis_objective = {a.basis_objective}, basis_fallback = "
                        f"{a.basis_fallback}, beta grid of {len(grid)} points on [{float(grid[0]):.4g}, "
                        f"{float(grid[-1]):.4g}], basis_scale_advantages = {a.basis_scale_advantages}")
    if trainer.rollout_strategy.beta_history:
        out["beta_t (last training batch)"] = float(trainer.rollout_strategy.beta_history[-1])
    return out


@model_card.model_card_info(name="BASIS", tags=("trl", model_card.TRL_EXT_TAG, "basis"), paper=BASIS_PAPER,
                        details=(basis_model_card_details,))
class BASISTrainer(GRPOTrainer):
    """GRPO-family trainer with one rollout per prompt and the BASIS baseline (Section 4, Algorithm 1).

    A preset of :class:`trl_ext.GRPOTrainer`: the registered ``"basis"`` estimator (the config's
    ``advantage_estimator``, on evaluation batches too) fed by the registered ``"value_table"`` rollout strategy
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
    rollout_strategy : ValueTableLookup
        The value-table strategy and what BASIS learns or records: ``table`` (the value table in use),
        ``beta_history`` (``beta_t`` of every training generation batch, saved in checkpoints and restored on
        resume), ``beta_history_steps`` (the ``global_step`` of each) and ``last_calibration`` (the latest batch's
        grid losses, masks and counts). The trainer adds no state of its own, so
        ``trl_ext.GRPOTrainer(args=BASISConfig(...))`` exposes the same.

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
        is_path = isinstance(spec, str | os.PathLike)
        # read before TRL's setup, so that a bad table fails before the model loads
        self._basis_table = resolve_value_table(spec)
        self._basis_table_source = {"source": os.fspath(spec) if is_path else "in-memory ValueTable",
                                    "file_sha256": file_sha256(spec) if is_path else None}
        self._basis_table_rows_sha256: str | None = None
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, **kwargs)

    def create_rollout_strategy(self) -> ValueTableLookup:
        """The ``"value_table"`` strategy over this trainer's value table (:meth:`ValueTableLookup.from_trainer`)."""
        return ValueTableLookup.from_trainer(self, table=self._basis_table)

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
        table = self.rollout_strategy.table
        if self._basis_table_rows_sha256 is None:
            self._basis_table_rows_sha256 = table.content_hash
        md = dict(table.metadata)
        return {"rows_sha256": self._basis_table_rows_sha256, "rows": len(table),
                "reference_model": md.get("model"), "metadata": md, **self._basis_table_source}

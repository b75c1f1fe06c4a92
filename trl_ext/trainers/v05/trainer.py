"""V0.5 GRPO: value-prior shrinkage fusion with Sequential OSLA rollout allocation, as a TRL 1.16 trainer.

Source: "V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts" (arXiv:2603.10848) -- "End-to-End
Implementation Workflow" (Section 4.1.3, Steps 1-5), "Empirical Shrinkage Fusion" (Eq. 6-9), the surrogate objective
(Eq. 10) and "Sequential OSLA Allocation" (Theorem 3.6, Appendix A.8). The math lives in
:mod:`trl_ext.estimators.v05`; this module wires it into the base trainer as a rollout strategy
(:class:`OSLARounds`: prior, rounds, the ``priors`` side input, the support buffer and the ``v05/*`` diagnostics)
that feeds the registered ``"v05"`` estimator (:func:`~trl_ext.estimators.v05.v05_advantages`, the config's
``advantage_estimator``) through the base trainer's valid-row adapter.

Drop-in contract: a TRL user changes the import and the config class only. For the same TRL arguments every
generation batch first generates exactly TRL's ``generation_batch_size`` rollouts -- TRL's sampler yields each of
``generation_batch_size / v05_k_init`` prompts ``v05_k_init`` times, and the prompts are spread over ranks as whole
prompts -- then the OSLA rounds add at most ``v05_extra_rollout_budget x generation_batch_size`` rollouts (default
1.0: at most 2x TRL's per step). The describe line logged at construction says it in numbers.

Per generation batch (train mode):

1. **Prior** (Step 1): sample a context of ``v05_context_size`` (prompt, success) pairs from the global
   :class:`~trl_ext.priors.SupportBuffer` (identical on every rank, seeded by ``(seed, generation index)``) and query
   the prior once per prompt (the whole batch on every rank): ``p in [0, 1]``, ``V = 2p - 1``. Cold start: an empty buffer gives an empty context and
   each prior's documented empty-context answer (embedding prior: ``p = 0.5``, i.e. ``V = 0``).
2. **Cold start allocation** (Step 2): ``v05_k_init`` (4) rollouts per prompt (``generation_batch_size`` in all),
   generated with :meth:`trl_ext.GRPOTrainer.generate_rollouts` and scored locally with
   :meth:`~trl_ext.GRPOTrainer.score_rollouts_local`, rewards mapped from ``[v05_reward_low, v05_reward_high]`` to
   ``[-1, 1]``.
3. **Test + OSLA rounds** (Steps 3-4): the per-prompt drawn counts and Eq. 7 bias estimates are gathered over ranks
   and :func:`trl_ext.estimators.osla_step` (the library's one OSLA rule) decides the round on the whole batch: a
   prompt needs more while ``k < 1/sqrt(c) - 1/bias2`` and ``k < round(1/sqrt(c))`` (16 for ``c = 0.0039``) and gets
   ``v05_k_step`` (2) more rollouts; the whole batch stops when fewer than ``v05_global_stop_fraction`` (25%) of its
   prompts still need rollouts. The round is then trimmed to the remaining ``v05_extra_rollout_budget`` (prompts
   served by decreasing ``bias2``; ``v05/budget_exhausted``). Every rank therefore runs the same rounds.
4. **Fusion + advantages** (Step 5): ``A_i = (r_i - mu*) / sigma*`` with the fused baseline of Eq. 9 computed by
   :func:`trl_ext.estimators.fused_advantages_batch` on the gathered groups, then (``v05_prompt_weighting="equal"``,
   the default) multiplied by ``c_j = kbar / k_j`` so every prompt carries the same total weight in the loss, as
   Eq. 10's per-prompt mean ``(1/k) sum_i`` does (:func:`trl_ext.estimators.equal_prompt_weights`). The rollouts go
   through TRL's loss via :meth:`trl_ext.GRPOTrainer.replay_rollouts` (pad rows masked out of the loss and the token
   normalizer).
5. **Support buffer**: one pair per scorable prompt, success ``(vbar + 1) / 2``, added in global order on every
   rank and saved in every checkpoint (the strategy's generation index too).

Every generated token -- dispatch padding and the rows that equalize collective calls included -- is counted by the
base trainer's one counter, ``ext/generated_tokens``.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from ...priors import ValuePrior
from .. import model_card
from ..base import GRPOTrainer
from ..rollouts import RolloutStrategy
from .config import V05GRPOConfig, V05Options
from .prior import prior_backbone_choice
from .strategy import OSLARounds

logger = logging.getLogger(__name__)

__all__ = ["V05GRPOTrainer", "v05_model_card_details"]


# ---------------------------------------------------------------------------------------------------------- trainer
class V05GRPOTrainer(GRPOTrainer):
    """Drop-in GRPO trainer running V0.5 (value prior + Sequential OSLA + shrinkage-fused advantages).

    Parameters
    ----------
    model, reward_funcs, args, train_dataset, eval_dataset, **kwargs
        As :class:`trl.GRPOTrainer`; ``args`` is a :class:`V05GRPOConfig` (a plain ``trl.GRPOConfig`` is upgraded
        with the V0.5 defaults, see :func:`~trl_ext.trainers.base.as_config`).
    prior : ValuePrior, optional
        The value prior; default: built from ``args.v05_value_prior`` / ``args.v05_value_prior_kwargs``. The
        ``"embedding"`` default embeds prompts with a frozen view of the **starting** policy
        (:func:`~trl_ext.priors.hf_mean_pool_embedder`), sharing weights where it can (:meth:`prior_backbone_choice`):
        under PEFT the trainer's own model with its adapter disabled (the frozen base weights, no copy); with
        ``beta > 0`` (full fine-tuning) TRL's reference model (no copy, unless ``sync_ref_model=True`` moves it);
        otherwise a frozen deep copy of the policy (one more model in memory, logged at construction). Under
        DeepSpeed ZeRO-3 / FSDP pass a prior with its own embedding model.

    Attributes
    ----------
    rollout_strategy : OSLARounds
        The train-mode rollout allocation (:meth:`create_rollout_strategy`) and everything V0.5 learns or records:
        ``prior``, ``support_buffer`` (the global (prompt, success) FIFO; saved in ``trl_ext_state.pt`` of every
        checkpoint), ``prior_info["prior_backbone"]`` (the default embedding prior's weights) and ``last_record`` (the
        global record of the latest train generation batch); see :class:`OSLARounds`. The trainer adds no state of
        its own, so ``trl_ext.GRPOTrainer(args=V05GRPOConfig(...))`` exposes the same.

    Notes
    -----
    Generation backends: TRL's transformers path and its vLLM paths. Each dispatch goes through
    :meth:`~trl_ext.GRPOTrainer.generate_rollouts` (TRL's single-turn generation, one completion per row); with vLLM
    the sampling log-probs of every rollout are kept next to its completion ids through all rounds and handed to
    the returned :class:`~trl_ext.trainers.rollouts.RolloutGroups` in the same order, so TRL's importance-sampling correction sees
    aligned log-probs. When generation is a collective (vLLM server, vLLM colocate with tensor parallelism,
    DeepSpeed, FSDP) every rank's call in every round is padded to the same length (discarded rollouts, counted);
    otherwise a rank with no active prompt generates nothing in that round.

    Model card (``create_model_card``, which TRL calls at every checkpoint and ``push_to_hub`` calls): "trained with
    V0.5", the V0.5 paper, tags ``trl``, ``trl-ext``, ``v05``, and a ``trl_ext run details`` section with the prior
    options and class, the model the default embedding prior embeds with, and for a table prior the value table's
    content hash, file hash and reference model (:func:`v05_model_card_details`, :meth:`value_table_info`).
    """

    config_class: ClassVar[type] = V05GRPOConfig
    # TRL's sampler with num_generations = v05_k_init (set in __init__): each prompt v05_k_init times, so round 1 is
    # exactly TRL's generation_batch_size rollouts
    unique_prompt_sampler: ClassVar[bool] = False

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, *,
                 prior: ValuePrior | None = None, **kwargs):
        if prior is not None and not isinstance(prior, ValuePrior):
            raise TypeError(f"prior must be a trl_ext.priors.ValuePrior (wrap functions with CallablePrior), got "
                            f"{type(prior).__name__}.")
        self._v05_given_prior = prior
        self._v05_table_rows_sha256: str | None = None
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, **kwargs)

    def create_rollout_strategy(self) -> RolloutStrategy:
        """V0.5's :class:`OSLARounds` over this config, with ``prior=`` or the config's prior (:meth:`OSLARounds.build`)."""
        return OSLARounds.build(self, V05Options.from_config(self.args), prior=self._v05_given_prior)

    # ------------------------------------------------------------------------------------------------ setup
    def prior_backbone_choice(self) -> tuple[Any, str, Any, bool]:
        """The model the default embedding prior embeds with: ``(model, source, context, copy)``
        (:func:`~trl_ext.trainers.v05.prior.prior_backbone_choice`: the PEFT base model, TRL's reference model, or a
        frozen copy of the starting policy)."""
        return prior_backbone_choice(self)

    def value_table_info(self) -> dict[str, Any] | None:
        """What identifies the value table of a table prior (recorded in the model card); ``None`` for any other prior.

        Returns
        -------
        dict or None
            ``rows_sha256`` (``ValueTable.content_hash``, computed once; ``None`` for a plain ``{prompt: p}``
            mapping), ``file_sha256`` (of the file as read at construction, for ``v05_value_prior="table"`` with a
            path; else ``None``), ``source`` (the path, or how the table was given), ``rows``, ``reference_model``
            (the header's ``model``, or ``None``) and ``metadata`` (the header).
        """
        from ...priors import TablePrior

        prior = self.rollout_strategy.prior
        if not isinstance(prior, TablePrior):
            return None
        table = prior.table
        if table is not None and self._v05_table_rows_sha256 is None:
            self._v05_table_rows_sha256 = table.content_hash
        md = dict(table.metadata) if table is not None else {}
        given = "in-memory ValueTable" if table is not None else "in-memory {prompt: p} mapping"
        src = self.rollout_strategy.prior_info.get("table_source") or {"source": given, "file_sha256": None}
        return {"rows_sha256": self._v05_table_rows_sha256, "rows": len(table) if table is not None else
                len(prior._probs), "reference_model": md.get("model"), "metadata": md, **src}


_EMBEDDING_SOURCES = {
    "policy_copy": "a frozen copy of the starting policy",
    "peft_base_model": "the policy's PEFT/LoRA base model with the adapter disabled",
    "reference_model": "TRL's reference model",
}


def v05_model_card_details(trainer) -> dict[str, Any]:
    """What a V0.5 run's prior depended on, for the model card: the prior class; for the default embedding prior the
    model it embeds with (the strategy's ``prior_info["prior_backbone"]``); for a
    :class:`~trl_ext.priors.TablePrior` the value table (content hash, file hash, rows, and the reference model from
    its header, as BASIS records it)."""
    from ...priors import EmbeddingInContextPrior
    from ..basis.trainer import card_table_source

    out: dict[str, Any] = {"value prior class": type(trainer.rollout_strategy.prior).__name__}
    backbone = trainer.rollout_strategy.prior_info.get("prior_backbone")
    if backbone is not None:
        what = _EMBEDDING_SOURCES.get(backbone["source"], backbone["source"])
        model_name = trainer.rollout_strategy.prior_info.get("prior_model_name")
        name = f" `{model_name}`" if model_name else ""
        cost = f"{backbone['parameters']} parameters copied" if backbone["parameters"] else "shared, no copy"
        out["embedding model"] = f"{what}{name} ({backbone['source']}; {cost})"
    elif isinstance(trainer.rollout_strategy.prior, EmbeddingInContextPrior):
        out["embedding model"] = "the prior's own embed_fn (passed by the user)"
    info = trainer.value_table_info()
    if info is not None:
        out["value table sha256 (rows)"] = (f"`{info['rows_sha256']}`" if info["rows_sha256"] is not None
                                            else "none (a plain {prompt: p} mapping)")
        out["value table"] = f"{card_table_source(info['source'])} ({info['rows']} rows)"
        if info["file_sha256"] is not None:
            out["value table file sha256"] = f"`{info['file_sha256']}`"
        out["reference model (table header)"] = info["reference_model"] or "not recorded"
    return out


model_card.set_model_card_info(
    V05GRPOTrainer, name="V0.5", tags=("trl", model_card.TRL_EXT_TAG, "v05"),
    paper=model_card.paper_info(title="V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts", year=2026,
                            arxiv_id="2603.10848", bibtex_key="v05_2026"),
    details=("v05_value_prior", "v05_value_prior_kwargs", v05_model_card_details))

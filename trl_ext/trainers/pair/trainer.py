r"""PAIR trainer: prefix probing, contrast-graph continuation design and pair-inclusion reweighting.

Implements Algorithm 1 of "Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR" (Voss,
Hale and Reyes, arXiv:2608.11368; "PAIR") on top of :class:`trl_ext.GRPOTrainer` (TRL 1.16). Section, equation and
appendix numbers refer to that paper. The generation side is the rollout strategy :class:`PrefixProbeRollouts`
(returned by :meth:`PAIRTrainer.create_rollout_strategy`); the estimator side is the registered estimator
``"pair_draw"`` (:func:`~trl_ext.estimators.pair.pair_draw_group_advantages`, the config's ``advantage_estimator``), fed
the designed draws the strategy returns with its rollouts (``RolloutGroups.estimator_inputs``); the strategy's
``update`` adds the heads' delayed labels, the solver warm start and the ``pair/*`` diagnostics. Per prompt and generation batch:

1. **Prefix probe** (Sec. 3.3, Appendix C "Prefix checkpoint"): the ``G = num_generations`` candidate rows TRL's
   sampler yields for the prompt are generated to a checkpoint of ``tau`` tokens with independent randomness (one
   sampled sequence per row). With ``pair_snap_window = w > 0`` the probe generates ``tau + w`` tokens and the
   checkpoint is the first delimiter token at or after ``tau`` (else ``tau + w``). Candidates that emit EOS inside
   the probe are **complete vertices** (continuation probability 1, suffix cost 0).
2. **Heads** (Sec. 4.2, Eq. 5-7): :class:`~trl_ext.estimators.pair_heads.PrefixHeads` on a stop-gradient summary of
   the prefix hidden states (mean of the last ``pair_summary_last_k = 16`` positions of prompt + prefix up to the
   checkpoint). Labels of completed candidates are added to the replay window when their rewards arrive; the heads
   are **frozen within an RL update** and refreshed (Eq. 6-7 fit + temperature) at the start of the next
   generation, i.e. after the optimizer step(s) of the batch whose labels they learn from.
   **Warm-up**: until the window holds ``pair_head_min_labels`` labels, the design is uniform,
   ``pi_i = max(budget_ratio, pi_min)`` (same expected cost as the budget).
3. **Design** (Sec. 4.3-4.4, Eq. 8-11): edge proxies from ``p_hat`` and :func:`~trl_ext.estimators.pair_design`
   under the expected suffix budget ``C = pair_budget_ratio * sum_i c_hat_i`` (over unfinished candidates), floor
   ``pair_pi_min``, warm-started from the previous step's solutions (Appendix C,
   :class:`~trl_ext.estimators.DesignWarmStart`). Finished candidates enter the program with a negligible cost and
   are then fixed at ``pi = 1``. The probabilities are recorded in :attr:`PrefixProbeRollouts.design_log` **before**
   any continuation is generated or any reward is computed. ``J_i ~ Bernoulli(pi_i)`` with fresh randomness from a
   generator keyed by ``(seed, generation index, dataset row)`` only (never by an outcome). Optional anchor pair
   (Appendix B): two vertices drawn uniformly among the ``M`` pairs and continued with conditional probability one;
   their conditional probabilities are logged and used. All of step 3 is the pure
   :func:`~trl_ext.estimators.pair.design_and_draw`.
4. **Continuation** (Algorithm 1): selected unfinished prefixes are continued to termination from
   ``prompt + prefix`` (transformers: a fresh ``generate`` call on the prefix tokens -- the probe's KV cache is
   *not* reused; vLLM colocate/server: the same call resubmits ``prompt + prefix`` so vLLM's prefix caching
   applies, and the sampling log-probs of both phases are concatenated for TRL's importance-sampling correction).
   Unselected prefixes are dropped from the update. Probe and continuation both go through
   :meth:`~trl_ext.GRPOTrainer.generate_token_ids`, so every generated token is in ``ext/generated_tokens``.
5. **Update** (Sec. 4.5, Eq. 13, Appendix C): for the completed vertices of each prompt

   .. math:: \tilde A_i = \frac{1}{2M}\sum_{j\ne i} \frac{J_iJ_j}{\rho_{ij}} (r_i - r_j),\quad
             \rho_{ij} = \pi_i\pi_j,\quad M = \binom G2,

   in float64 (:func:`~trl_ext.estimators.pair.draw_advantages` per group, through the ``pair_draw`` estimator),
   unstandardized. Only completed vertices enter the
   loss; a completed vertex whose reward is NaN (unscorable) observes no edge
   (:func:`~trl_ext.estimators.scorable_selection`). With ``pair_fixed_normalizer`` (default) the strategy
   returns the global number of prompts ``K`` as ``RolloutGroups.fixed_normalizer``
   (:func:`~trl_ext.estimators.fixed_normalizer`) and the base trainer makes every generation batch's policy loss
   ``(1/K) sum_i A_i mean_t l_it`` (``grpo``/``sapo``/``luspo``; ``dr_grpo``: ``(1/(K L)) sum_i A_i sum_t l_it``)
   or ``(1/(K L)) sum_i A_i sum_t l_it`` (``dapo``/``cispo``/``vespo``; ``L = max_completion_length``), whatever
   the number of completed or pad rows: a normalizer that does
   not depend on the design draw, so the unclipped gradient at ``theta_old`` is design-unbiased for the
   complete-pair gradient (Theorem 2). TRL's data-dependent normalizers (row or token counts of the *realized*
   draw) would make it a ratio estimator.

Labelled biased options (Appendix B): ``pair_standardize`` (divide by the std of the completed rewards,
:func:`~trl_ext.estimators.standardize_pair_advantages`: breaks unbiasedness), ``pair_w_max`` (clip edge
weights), ``pair_self_normalize`` (Hajek).

Evaluation uses TRL's standard full-group path.

Layout: the method math is pure numpy in :mod:`trl_ext.estimators.pair` (design and draw, the anchor's marginal
inclusion, Eq. 13 of a draw: :mod:`trl_ext.estimators.pair.group_draw`; the ``pair_draw`` registry entry:
:mod:`trl_ext.estimators.pair.registry`) and the heads are pure torch in :mod:`trl_ext.estimators.pair_heads`;
:mod:`.config` holds :class:`PAIRConfig` and its validation, :mod:`.strategy` the strategy and the heads
it designs with (:class:`~.heads.DesignHeads`), :mod:`.diagnostics` the ``pair/*`` metrics, and this
module the trainer. The estimator math is imported from :mod:`trl_ext.estimators.pair` (no longer re-exported here).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from .. import model_card
from ..base import GRPOTrainer
from .config import PAIRConfig, PAIROptions, pair_lr_factor
from .strategy import PrefixProbeRollouts

logger = logging.getLogger(__name__)

__all__ = ["PAIRTrainer", "PAIR_PAPER", "pair_model_card_details"]


PAIR_PAPER = model_card.paper_info(
    title="PAIR: Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR",
    authors=("Voss", "Hale", "Reyes"), year=2026, arxiv_id="2608.11368", bibtex_key="voss2026pair",
)
"""The PAIR paper in TRL's model-card format (name, arXiv id, BibTeX)."""


# ---------------------------------------------------------------------------------------------------------- trainer
def pair_model_card_details(trainer) -> dict[str, Any]:
    """What a PAIR run depended on, for the model card: the probe, the design and the head settings, and the
    heads' state when the card is written."""
    a = trainer.args
    heads = trainer.rollout_strategy.heads.heads
    totals = trainer.rollout_strategy.totals
    return {
        "candidate group size G (num_generations)": int(a.num_generations),
        "probe": f"tau = {a.pair_tau} tokens (pair_prefix_tokens={a.pair_prefix_tokens}), "
                 f"pair_snap_window = {a.pair_snap_window}, max_completion_length = {a.max_completion_length}",
        "design": f"pair_budget_ratio = {a.pair_budget_ratio}, pair_pi_min = {a.pair_pi_min}, edge proxy "
                  f"{a.pair_edge_proxy}, anchor pair {a.pair_anchor_pair}, warm start {a.pair_solver_warm_start}, "
                  f"fixed normalizer {a.pair_fixed_normalizer}",
        "policy learning rate": f"learning_rate {a.learning_rate} x {pair_lr_factor(PAIROptions.from_config(a)):.4g} "
                                f"(pair_lr_scaling = {a.pair_lr_scaling!r})",
        "biased options (App. B)": f"pair_standardize = {a.pair_standardize}, pair_w_max = {a.pair_w_max}, "
                                   f"pair_self_normalize = {a.pair_self_normalize}",
        "prefix heads": f"hidden {a.pair_head_hidden}, lr {a.pair_head_lr}, replay window {a.pair_replay_size}, "
                        f"warm-up {a.pair_head_min_labels} labels, {a.pair_head_fit_steps} fit steps x batch "
                        f"{a.pair_head_batch_size}, summary of the last {a.pair_summary_last_k} hidden states, lagged "
                        f"{a.pair_lagged_heads}, seed {a.seed if a.pair_head_seed is None else a.pair_head_seed}",
        "heads at card time": f"{heads.n_labels} labels in the replay window, "
                              f"{'ready' if heads.ready else 'warm-up (uniform design)'}",
        "training tokens (prefix / suffix)": f"{totals['prefix_tokens']} / {totals['suffix_tokens']} over "
                                             f"{totals['groups']} prompts",
    }


@model_card.model_card_info(name="PAIR", tags=("trl", model_card.TRL_EXT_TAG, "pair"), paper=PAIR_PAPER,
                        details=(pair_model_card_details,))
class PAIRTrainer(GRPOTrainer):
    """GRPO with PAIR prefix probing, continuation design and pair-inclusion reweighting (see module docstring).

    Same constructor as :class:`trl_ext.GRPOTrainer`; ``args`` is a :class:`PAIRConfig` (a plain
    ``trl.GRPOConfig`` is upgraded with PAIR's defaults, see :func:`trl_ext.trainers.base.as_config`).

    Attributes
    ----------
    rollout_strategy : PrefixProbeRollouts
        Probe, design, draw and continuation, and what PAIR learns or records: ``heads.heads`` (the success /
        remaining-cost :class:`~trl_ext.estimators.pair_heads.PrefixHeads`, optimizer and replay window, saved in
        every checkpoint), ``design_log`` (per prompt of the latest generation batch on this rank: ``generation``,
        ``row_idx``, ``pi``, ``pi_design``, ``selected``, ``finished``, ``p_hat``, ``cost_hat``, ``anchor``,
        ``reason``, ``n_iter``, ``warm_started``, ``expected_cost``, ``budget``, written after the design and draw;
        ``realized_suffix_tokens`` added after the continuation), ``features`` (the prefix summaries) and ``tau``;
        generation index, warm start and token totals are its checkpointed state. The trainer adds no state or
        behaviour of its own: ``trl_ext.GRPOTrainer(args=PAIRConfig(...))`` trains the same, learning-rate scaling
        included (the config's :meth:`~PAIRConfig.optimizer_lr_factor`, applied by the base trainer's
        ``create_optimizer``).

    Warns
    -----
    PAIRShortProbeWarning
        The probe (``tau + pair_snap_window``) is 1-2 tokens (:func:`short_probe_message` says why PAIR should not
        be used there).

    Notes
    -----
    Model card (``create_model_card``, which TRL calls at every checkpoint and ``push_to_hub`` calls): "trained with
    PAIR", the PAIR paper (:data:`PAIR_PAPER`), tags ``trl``, ``trl-ext``, ``pair``, and a ``trl_ext run details``
    section with the probe, design and head settings (:func:`pair_model_card_details`).
    """

    config_class: ClassVar[type] = PAIRConfig

    def create_rollout_strategy(self) -> PrefixProbeRollouts:
        """PAIR's probe-then-continue allocation over this config (:meth:`PrefixProbeRollouts.build`: the snap
        delimiters, the prefix heads and :func:`~trl_ext.trainers.pair.heads.prefix_features`)."""
        return PrefixProbeRollouts.build(self, PAIROptions.from_config(self.args))


"""V0.5 GRPO: value-prior shrinkage fusion with Sequential OSLA rollout allocation, as a TRL 1.16 trainer.

Source: "V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts" (arXiv:2603.10848) -- "End-to-End
Implementation Workflow" (Section 4.1.3, Steps 1-5), "Empirical Shrinkage Fusion" (Eq. 6-9), the surrogate objective
(Eq. 10) and "Sequential OSLA Allocation" (Theorem 3.6, Appendix A.8). The math lives in
:mod:`trl_ext.estimators.v05`; this module wires it into the base trainer as a rollout strategy
(:class:`OSLARounds`: prior, rounds, the ``priors`` side input, the support buffer and the ``v05/*`` diagnostics)
that feeds the registered ``"v05"`` estimator (:func:`~trl_ext.estimators.v05.v05_advantages`, the preset's
``train_estimator``) through the base trainer's valid-row adapter.

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
   through TRL's loss via :meth:`trl_ext.GRPOTrainer.finish_rollouts` (pad rows masked out of the loss and the token
   normalizer).
5. **Support buffer**: one pair per scorable prompt, success ``(vbar + 1) / 2``, added in global order on every
   rank and saved in every checkpoint (the strategy's generation index too).

Every generated token -- dispatch padding and the rows that equalize collective calls included -- is counted by the
base trainer's one counter, ``ext/generated_tokens``.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from ..estimators import v05 as v05_estimators
from ..estimators.v05 import (
    DEFAULT_SIGMA_FLOOR,
    V05_K_INIT,
    V05_PAPER_COST,
    osla_cap,
    shrinkage_fusion_batch,
    v05_signed_rewards,
)
from ..priors import SupportBuffer, ValuePrior, build_prior
from . import _trl_compat as compat
from . import model_card
from .base import ExtGRPOConfig, GRPOTrainer, parse_kwargs_field, validate_ext_config
from .batch import RolloutBatch
from .rollouts import RolloutStrategy, _block, unique_prompt_rows, weighted_reward

logger = logging.getLogger(__name__)

__all__ = ["V05GRPOConfig", "V05GRPOTrainer", "OSLARounds", "V05_SUPPORTED_LOSS_TYPES", "V05_PROMPT_WEIGHTINGS"]

V05_SUPPORTED_LOSS_TYPES = ("dapo", "cispo", "vespo")
"""Loss types whose normalizer stays exact with variable group sizes and per-rank pad rows.

They divide the summed per-token loss by the *global* count of loss-mask tokens (``num_items_in_batch``), which
:meth:`~trl_ext.GRPOTrainer.finish_rollouts` recomputes after masking pad rows: every real token gets the same weight
whatever the group size or the number of pad rows on its rank (per-prompt weights are then set explicitly by
``v05_prompt_weighting``). The sequence-level losses (``grpo``, ``sapo``, ``luspo``) and ``dr_grpo`` have their
pad-row denominators corrected by the base trainer but are not covered by a V0.5 gradient test yet; ``bnpo``
normalizes by the local micro-batch tokens, so DDP's equal-weight rank average over-weights tokens on ranks with
fewer of them. Those are rejected unless ``v05_allow_unsupported_loss_type=True``.
"""

V05_PROMPT_WEIGHTINGS = ("equal", "rollout")
"""Values of ``v05_prompt_weighting``: ``"equal"`` (Eq. 10: every prompt the same total weight) or ``"rollout"``
(every rollout token the same weight: a prompt's weight grows with its rollout count)."""


# ---------------------------------------------------------------------------------------------------------- config
@dataclass
class V05GRPOConfig(ExtGRPOConfig):
    """:class:`~trl_ext.trainers.base.ExtGRPOConfig` plus the V0.5 options; defaults reproduce the paper's rules.

    Every V0.5 option is one dataclass field below whose ``help`` metadata documents it (the command-line help);
    ``docs/v05.md`` tabulates them, and the trainer reads them from ``self.args``. **Drop-in contract**: every TRL
    field keeps its meaning and TRL's validation (TRL's own ``GRPOConfig.__post_init__`` runs unchanged).
    ``per_device_train_batch_size`` / ``generation_batch_size`` count rollouts as in TRL: the first round of every
    generation batch generates exactly ``generation_batch_size`` rollouts, as TRL does for the same arguments --
    ``generation_batch_size / v05_k_init`` unique prompts, ``v05_k_init`` rollouts each (so ``v05_k_init`` must
    divide ``generation_batch_size``) -- and the OSLA rounds add at most ``v05_extra_rollout_budget x
    generation_batch_size`` more. ``num_generations`` (TRL's default 8) is not used in training (rollout counts are
    chosen per prompt); it is the group size of evaluation (``num_generations_eval`` defaults to it) and, as in TRL,
    must divide ``generation_batch_size``. A plain ``trl.GRPOConfig`` given to :class:`V05GRPOTrainer` is upgraded
    with these defaults and checked by :meth:`validate_method_options`.
    """

    uses_advantage_estimator: ClassVar[bool] = False

    v05_k_init: int = field(
        default=V05_K_INIT,
        metadata={"help": "Rollouts per prompt before the first test (Workflow Step 2; paper: 4). Must divide "
                          "generation_batch_size: round 1 holds generation_batch_size / v05_k_init prompts, i.e. "
                          "generation_batch_size rollouts, as TRL. Values below 4 are rejected unless "
                          "v05_allow_small_k_init=True: Appendix A.8 shows the test rejects good priors too often "
                          "for k < 4 (1/sqrt(k) >= 2/k needs k >= 4)."},
    )
    v05_k_step: int = field(
        default=2,
        metadata={"help": "Rollouts added per OSLA round to each prompt that still needs more (Workflow Step 4; "
                          "paper: 2)."},
    )
    v05_rollout_cost: float = field(
        default=V05_PAPER_COST,
        metadata={"help": "Marginal cost c of one rollout (paper: 0.0039). The cap is round(1/sqrt(c)) (16) and "
                          "Theorem 3.6's target 1/sqrt(c) - 1/bias2; must leave cap >= v05_k_init."},
    )
    v05_extra_rollout_budget: float = field(
        default=1.0,
        metadata={"help": "Per-step compute bound (>= 0): the OSLA rounds of one generation batch generate at most "
                          "floor(v05_extra_rollout_budget x generation_batch_size) rollouts in total (all ranks; the "
                          "padding of v05_dispatch_multiple included, round 1's too), so a step generates at most "
                          "(1 + budget) x TRL's rollouts for the same arguments. Only the discarded dummy rows that "
                          "equalize a collective generation call across ranks (vLLM server, tensor parallel, "
                          "ZeRO-3/FSDP) come on top (v05/discarded_rollouts): they depend on the back-end, and "
                          "charging them would make the allocation depend on the number of processes. 0 = no OSLA "
                          "round (fixed v05_k_init rollouts per prompt; the fusion still applies). When the budget "
                          "cannot serve every prompt that needs more in a round, prompts are served in order of "
                          "decreasing Eq. 7 bias2 (ties: batch order), identically on every rank, and "
                          "v05/budget_exhausted is logged 1. The paper's unbounded rounds: any value >= (cap - "
                          "v05_k_init) / v05_k_init (3 with the defaults), or inf."},
    )
    v05_global_stop_fraction: float = field(
        default=0.25,
        metadata={"help": "Stop the rounds for the whole batch (all ranks) when fewer than this fraction (in [0, 1]) "
                          "of its prompts still need rollouts; 0 disables the early stop (rounds run until no prompt "
                          "needs more)."},
    )
    v05_dispatch_multiple: int = field(
        default=1,
        metadata={"help": "Pad each generation dispatch (per rank, per round) to a multiple of this (>= 1; the paper "
                          "pads to 32 for tensor-parallel generation). The extra rollouts go round-robin to the "
                          "prompts of that dispatch (never past the cap), so a prompt may end slightly above its "
                          "target; slots no prompt can take are generated and discarded (v05/discarded_rollouts). "
                          "When generation is a collective, the base trainer also pads every rank's call to the "
                          "longest one across ranks; those equalizing rows are discarded (and counted) too, so "
                          "per-prompt decisions do not depend on how prompts are spread over ranks (with "
                          "v05_dispatch_multiple=1)."},
    )
    v05_buffer_capacity: int = field(
        default=512, metadata={"help": "Support buffer capacity (Workflow Step 1; paper: 512)."}
    )
    v05_context_size: int = field(
        default=256, metadata={"help": "Context pairs sampled from the support buffer per step (Workflow Step 1; "
                                       "paper: 256)."}
    )
    v05_value_prior: str = field(
        default="embedding",
        metadata={"help": "Prior kind for trl_ext.priors.build_prior when the trainer gets no prior= object: "
                          "embedding (batch-invariant mean-pooled embeddings of the frozen starting policy + "
                          "in-context kernel head, the paper's V0-style default; which weights it uses, shared or "
                          "copied, is V05GRPOTrainer.prior_backbone_choice), constant, or table (needs "
                          "v05_value_prior_kwargs={\"table\": path}). A callable prior is passed as prior=."},
    )
    v05_value_prior_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Constructor options of the prior (dict or JSON string). For embedding these go to "
                          "EmbeddingInContextPrior, plus embed_batch_size / embed_max_length / "
                          "embed_pad_to_multiple_of for trl_ext.priors.hf_mean_pool_embedder."},
    )
    v05_reward_low: float = field(
        default=0.0,
        metadata={"help": "Lower end of the declared range of the weighted summed reward. Rewards are mapped "
                          "linearly to [-1, 1]: r' = 2 (r - low) / (high - low) - 1 ({0, 1} checker -> {-1, 1}; use "
                          "-1, 1 for rewards already on the paper's scale; any bounded non-binary reward is mapped "
                          "the same way, which keeps Eq. 6's variance bound 1/k valid). A finite reward outside the "
                          "range raises ValueError."},
    )
    v05_reward_high: float = field(
        default=1.0,
        metadata={"help": "Upper end of the declared reward range (see v05_reward_low for the mapping to [-1, 1])."},
    )
    v05_sigma_floor: float = field(
        default=DEFAULT_SIGMA_FLOOR,
        metadata={"help": "Floor, in (0, 1], of sigma* = sqrt(1 - mu*^2) in the advantage (see "
                          "trl_ext.estimators.fused_advantages)."},
    )
    v05_prompt_weighting: str = field(
        default="equal",
        metadata={"help": "equal (the paper's Eq. 10): prompt j's advantages are multiplied by c_j = kbar / k_j (k_j "
                          "its scorable rollouts, kbar their mean over the generation batch's scorable prompts), so "
                          "every prompt carries the same total weight in the loss for equal completion lengths and "
                          "the overall scale is unchanged. rollout: no reweighting; the token-level loss weighs every "
                          "rollout token the same, so a prompt with 16 rollouts weighs 4x one with 4.",
                  "choices": list(V05_PROMPT_WEIGHTINGS)},
    )
    v05_allow_small_k_init: bool = field(
        default=False, metadata={"help": "Accept v05_k_init < 4 (ablations only)."}
    )
    v05_allow_unsupported_loss_type: bool = field(
        default=False,
        metadata={"help": "Accept a loss_type outside V05_SUPPORTED_LOSS_TYPES (dapo, cispo, vespo), with a warning "
                          "(not covered by the V0.5 tests)."},
    )
    v05_check_buffer_sync: bool = field(
        default=True,
        metadata={"help": "With several processes, compare the support-buffer fingerprints of all ranks after each "
                          "update and raise if they differ."},
    )

    def __post_init__(self):
        self.advantage_estimator_kwargs = parse_kwargs_field(self.advantage_estimator_kwargs,
                                                             "advantage_estimator_kwargs")
        g = self.num_generations
        if not _is_int(g) or g < 1:  # before TRL's check, which divides by it
            raise ValueError(f"num_generations (V0.5: the evaluation group size, TRL's meaning) must be an int >= 2, "
                             f"got {g!r}.")
        # TRL's GRPOConfig.__post_init__ unchanged, no placeholder group size: generation_batch_size counts rollouts
        # as in TRL and num_generations is TRL's (the eval group size; TRL checks that it divides the generation
        # batch), so a TRL config is valid here exactly when it is valid for TRL (plus v05_k_init | batch).
        super(ExtGRPOConfig, self).__post_init__()
        self.validate_method_options(self)

    @staticmethod
    def validate_method_options(config: Any) -> None:
        """Check the trl_ext and V0.5 fields of ``config`` (also run by ``as_config`` on an upgraded plain config);
        parses ``v05_value_prior_kwargs``. Raises ``ValueError`` saying what to change."""
        validate_ext_config(config)
        config.v05_value_prior_kwargs = parse_kwargs_field(config.v05_value_prior_kwargs, "v05_value_prior_kwargs")
        validate_v05_config(config)


def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def validate_v05_config(args: Any) -> None:
    """Check the V0.5 fields of ``args``; raises ``ValueError`` saying what to change."""
    g = args.num_generations
    if not _is_int(g) or g < 1:
        raise ValueError(f"num_generations (V0.5: the evaluation group size) must be an int >= 1, got {g!r}.")
    if not _is_int(args.v05_k_step) or args.v05_k_step < 1:
        raise ValueError(f"v05_k_step must be an int >= 1, got {args.v05_k_step!r}.")
    if not _is_int(args.v05_k_init) or args.v05_k_init < 1:
        raise ValueError(f"v05_k_init must be an int >= 1, got {args.v05_k_init!r}.")
    if args.v05_k_init < V05_K_INIT and not args.v05_allow_small_k_init:
        raise ValueError(
            f"v05_k_init={args.v05_k_init} < 4: the paper's Appendix A.8 shows the bias test over-rejects below 4 "
            "rollouts (1/sqrt(k) >= 2/k needs k >= 4). Use v05_k_init >= 4, or set v05_allow_small_k_init=True for an "
            "ablation."
        )
    c = args.v05_rollout_cost
    if not (isinstance(c, int | float) and not isinstance(c, bool) and math.isfinite(c) and c > 0):
        raise ValueError(f"v05_rollout_cost must be a finite number > 0, got {c!r}.")
    cap = osla_cap(c)
    if cap < args.v05_k_init:
        raise ValueError(f"v05_rollout_cost={c} gives cap round(1/sqrt(c))={cap} < v05_k_init={args.v05_k_init}; "
                         f"lower the cost (cap >= v05_k_init needs c <= {1.0 / (args.v05_k_init - 0.5) ** 2:.6g}) or "
                         "lower v05_k_init.")
    gbs = getattr(args, "generation_batch_size", None)
    if _is_int(gbs) and gbs % args.v05_k_init:
        raise ValueError(
            f"generation_batch_size={gbs} (per_device_train_batch_size x processes x steps_per_generation) is not "
            f"divisible by v05_k_init={args.v05_k_init}: V0.5's first round generates exactly TRL's "
            f"generation_batch_size rollouts as generation_batch_size / v05_k_init prompts x v05_k_init rollouts. "
            f"Make per_device_train_batch_size (or generation_batch_size) a multiple of {args.v05_k_init}, or choose a "
            "v05_k_init that divides it."
        )
    b = args.v05_extra_rollout_budget
    if isinstance(b, bool) or not isinstance(b, int | float) or math.isnan(b) or b < 0:
        raise ValueError(f"v05_extra_rollout_budget must be a number >= 0 (fraction of generation_batch_size; 0 = no "
                         f"OSLA rounds, inf = the paper's unbounded rounds), got {b!r}.")
    f = args.v05_global_stop_fraction
    if not (isinstance(f, int | float) and not isinstance(f, bool) and 0.0 <= f <= 1.0):
        raise ValueError(f"v05_global_stop_fraction must be in [0, 1] (0 disables the early stop), got {f!r}.")
    if not _is_int(args.v05_dispatch_multiple) or args.v05_dispatch_multiple < 1:
        raise ValueError(f"v05_dispatch_multiple must be an int >= 1, got {args.v05_dispatch_multiple!r}.")
    for name in ("v05_buffer_capacity", "v05_context_size"):
        v = getattr(args, name)
        if not _is_int(v) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}.")
    lo, hi = args.v05_reward_low, args.v05_reward_high
    if not all(isinstance(x, int | float) and math.isfinite(x) for x in (lo, hi)) or hi <= lo:
        raise ValueError(f"need finite v05_reward_low < v05_reward_high, got v05_reward_low={lo!r}, "
                         f"v05_reward_high={hi!r}.")
    s = args.v05_sigma_floor
    if not (isinstance(s, int | float) and 0.0 < s <= 1.0):
        raise ValueError(f"v05_sigma_floor must be in (0, 1], got {s!r}.")
    if args.v05_prompt_weighting not in V05_PROMPT_WEIGHTINGS:
        raise ValueError(f"v05_prompt_weighting must be one of {V05_PROMPT_WEIGHTINGS} ('equal': the paper's Eq. 10, "
                         f"every prompt the same weight), got {args.v05_prompt_weighting!r}.")
    if not isinstance(args.v05_value_prior, str) or not args.v05_value_prior:
        raise ValueError(f"v05_value_prior must be a prior kind string, got {args.v05_value_prior!r}.")
    if args.dynamic_sampling:
        raise ValueError("dynamic_sampling is not available with V05GRPOTrainer (its rollouts are allocated by OSLA "
                         "rounds); set dynamic_sampling=False.")
    if args.loss_type not in V05_SUPPORTED_LOSS_TYPES:
        msg = (f"loss_type={args.loss_type!r}: V0.5 supports {V05_SUPPORTED_LOSS_TYPES}, whose global token normalizer "
               "stays exact with variable rollout counts and per-rank pad rows; other loss types are not covered by "
               "V0.5's tests (see trl_ext.trainers.v05.V05_SUPPORTED_LOSS_TYPES).")
        if not args.v05_allow_unsupported_loss_type:
            raise ValueError(msg + " Use one of them or set v05_allow_unsupported_loss_type=True.")
        warnings.warn(msg, UserWarning, stacklevel=3)
    if args.tie_break_scorer_index is not None:
        raise ValueError("The tie-break blend (tie_break_scorer_index) is not supported by V05GRPOTrainer: the fusion "
                         "needs rewards on a declared bounded range. Unset tie_break_scorer_index.")


# ---------------------------------------------------------------------------------------------------------- strategy
@dataclass
class _PromptState:
    """One local prompt during the OSLA rounds."""

    row: dict
    prior_p: float
    completion_ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    rpf: list = field(default_factory=list)  # rows of (F,) raw rewards (NaN = None)
    signed: list = field(default_factory=list)  # mapped scalar rewards in [-1, 1] (NaN = unscorable)

    @property
    def k(self) -> int:
        return len(self.completion_ids)




class OSLARounds(RolloutStrategy):
    """V0.5's rollout allocation: prior query, ``v05_k_init`` rollouts per prompt, then budgeted Sequential OSLA rounds.

    Workflow Steps 1-4 of "V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts" (arXiv:2603.10848,
    Section 4.1.3). Per generation batch:

    * the rows TRL's sampler yielded on all ranks (each prompt ``v05_k_init`` times, see
      :meth:`V05GRPOTrainer.__init__`) are gathered and deduplicated by ``trl_ext_row_idx``: ``generation_batch_size /
      v05_k_init`` prompts in sampler order, assigned to ranks as **whole prompts in contiguous blocks**
      (:func:`~trl_ext.trainers.rollouts._block`, as :class:`~trl_ext.trainers.rollouts.DynamicSampling` does), so
      each prompt is generated and scored on one rank and nothing depends on the number of processes;
    * the prior is queried once for the whole batch on every rank (identical inputs, identical outputs);
    * round 1 generates ``v05_k_init`` rollouts per prompt -- ``generation_batch_size`` in all, TRL's count for the
      same arguments;
    * each OSLA round is decided by :func:`trl_ext.estimators.osla_step` (Theorem 3.6 plus the 25% global stop) on
      the per-prompt drawn counts and Eq. 7 bias estimates gathered over ranks, then trimmed to the remaining
      ``v05_extra_rollout_budget`` (:meth:`apply_budget`: prompts served by decreasing ``bias2``), identically on
      every rank.

    Every rank calls :meth:`dispatch` once per round (possibly with nothing to generate): generation goes through
    :meth:`trl_ext.GRPOTrainer.generate_rollouts`, which joins the keyed-sampling collective, pads collective calls
    across ranks and counts every generated token in ``ext/generated_tokens``.

    Attributes
    ----------
    generation_index : int
        Train generation batches produced so far (seeds the support-buffer context); saved in every checkpoint
        through :meth:`state_dict`.
    prior, support_buffer
        The value prior and the global (prompt, success) FIFO (:meth:`bind`).
    last_record : dict or None
        The global record of the latest train generation batch (:attr:`V05GRPOTrainer.last_v05`).

    The fused advantages are the registered ``"v05"`` estimator's (:func:`~trl_ext.estimators.v05.v05_advantages`),
    run by the base trainer's valid-row adapter on the priors this strategy provides (side input ``priors``, one per
    group); :meth:`observe_advantages` then fills the support buffer and logs the ``v05/*`` diagnostics.
    """

    name = "v05_osla"
    provides = frozenset({"priors"})

    def __init__(self):
        self.generation_index = 0
        self.prior: ValuePrior | None = None
        self.support_buffer: SupportBuffer | None = None
        self.last_record: dict | None = None
        self._batch: dict | None = None  # the global record of the batch being finished, read by observe_advantages
        self._warned: set[str] = set()

    def bind(self, prior: ValuePrior, support_buffer: SupportBuffer) -> None:
        """Give the strategy the value prior it queries and the support buffer it fills (the preset builds both after
        TRL's constructor, which builds the strategy)."""
        self.prior, self.support_buffer = prior, support_buffer

    def estimator_kwargs(self, trainer) -> dict:
        """The ``"v05"`` estimator's options from the config: sigma floor, reward range, Eq. 10 weighting."""
        a = trainer.args
        return {"floor": a.v05_sigma_floor, "reward_range": (a.v05_reward_low, a.v05_reward_high),
                "prompt_weighting": a.v05_prompt_weighting}

    # ------------------------------------------------------------------------------------------------ compute bounds
    @staticmethod
    def extra_budget(trainer) -> int | None:
        """Rollouts the OSLA rounds of one generation batch may generate: ``floor(v05_extra_rollout_budget x
        generation_batch_size)``, or ``None`` (unbounded) for an infinite budget."""
        b = float(trainer.args.v05_extra_rollout_budget)
        if math.isinf(b):
            return None
        return int(math.floor(b * int(trainer.args.generation_batch_size) + 1e-9))

    @staticmethod
    def round_cost(trainer, per_rank: list[int]) -> int:
        """Rollouts one round charges to the budget when rank ``r`` requests ``per_rank[r]``: the requests, each
        rank's dispatch padded to ``v05_dispatch_multiple`` (with the default 1: exactly the requested rollouts, so
        the charge does not depend on how prompts are spread over ranks).

        Not charged: the dummy rows that equalize a *collective* generation call across ranks (vLLM server, tensor
        parallel, ZeRO-3/FSDP). They depend on the back-end and the layout, are discarded, and are counted in
        ``v05/discarded_rollouts`` and ``ext/generated_tokens``; charging them would make the allocation depend on
        the number of processes.
        """
        m = int(trainer.args.v05_dispatch_multiple)
        return sum(math.ceil(int(n) / m) * m for n in per_rank)

    def apply_budget(self, trainer, add: np.ndarray, bias2: np.ndarray, owner: np.ndarray,
                     remaining: int | None) -> tuple[np.ndarray, bool]:
        """Trim one round's global request ``add`` (from :func:`~trl_ext.estimators.osla_step`) to ``remaining``.

        Prompts that need more are served in order of decreasing ``bias2`` (the prior's estimated squared bias:
        Theorem 3.6's target grows with it), ties in batch order; each gets the largest part of its request whose
        :meth:`round_cost` still fits. Deterministic and computed from global arrays, so identical on every rank.
        Returns ``(served, short)``: the rollouts to draw per prompt and whether some request was not served in full.
        """
        add = np.asarray(add, dtype=np.int64)
        if remaining is None:
            return add, False
        p = trainer.accelerator.num_processes
        served = np.zeros_like(add)
        per_rank = [0] * p
        order = sorted(np.flatnonzero(add > 0).tolist(), key=lambda j: (-float(bias2[j]), j))
        for j in order:
            r = int(owner[j])
            for n in range(int(add[j]), 0, -1):
                per_rank[r] += n
                if self.round_cost(trainer, per_rank) <= remaining:
                    served[j] = n
                    break
                per_rank[r] -= n
        return served, bool((served < add).any())

    def describe(self, trainer) -> str:
        """One line: what each generation batch generates compared with TRL for the same arguments."""
        a = trainer.args
        gbs, k, g = int(a.generation_batch_size), int(a.v05_k_init), int(a.num_generations)
        cap = osla_cap(a.v05_rollout_cost)
        natural = gbs // k * max(cap - k, 0)  # what the paper's unbounded rounds could add at most
        budget = self.extra_budget(trainer)
        most = natural if budget is None else min(budget, natural)
        binds = budget is not None and budget < natural
        stop = f"global stop below {a.v05_global_stop_fraction:.0%} of prompts" if a.v05_global_stop_fraction > 0 \
            else "no global stop"
        pad = (f"; dispatches padded to a multiple of {a.v05_dispatch_multiple} (charged to the budget)"
               if a.v05_dispatch_multiple > 1 else "")
        return (f"rollout strategy v05_osla (V0.5 Sequential OSLA): round 1: {gbs} rollouts per generation batch "
                f"({gbs // k} prompts x {k}; = TRL's for these arguments: {gbs // g} prompts x {g}); OSLA: at most "
                f"{most} more (+{a.v05_k_step} per round to prompts whose prior fails the test, cap {cap}, {stop}, "
                f"v05_extra_rollout_budget={a.v05_extra_rollout_budget:g}"
                f"{'' if binds else ': does not bind, the paper rounds'}), i.e. <= {(gbs + most) / gbs:.4g}x TRL's"
                f"{pad}; prompt weighting {a.v05_prompt_weighting!r}")

    def state_dict(self) -> dict:
        return {"generation_index": int(self.generation_index)}

    def load_state_dict(self, state: dict) -> None:
        self.generation_index = int(state.get("generation_index", 0))


    # ------------------------------------------------------------------------------------------------ after the estimator
    def observe_advantages(self, trainer, batch: RolloutBatch, result, valid: torch.Tensor) -> None:
        """After the ``"v05"`` estimator (Eq. 9 fused baseline ``A_i = (r_i - mu*) / max(sqrt(1 - mu*^2),
        v05_sigma_floor)``, Workflow Step 5, times the Eq. 10 prompt weight): per-prompt record, support buffer
        update, diagnostics.

        Unscorable rollouts (every reward function returned ``None``) got advantage 0 from the base's adapter and are
        counted in ``v05/unscorable_rollouts``; prompts without a scorable rollout got advantage 0, add nothing to the
        support buffer and are counted in ``v05/unscorable_prompts`` (each warned about once). A group whose rewards
        are all equal still gets ``(r - mu*) / sigma*``, nonzero unless ``mu* = r`` (the baseline is the fused one,
        not the group mean; "All-tied groups" in ``docs/v05.md``).
        """
        pend = self._batch
        if pend is None:
            raise RuntimeError("internal: a V0.5 train batch reached the estimator without the OSLA record.")
        g = len(pend["prior_p"])
        if batch.num_groups != g:
            raise RuntimeError(f"internal: batch has {batch.num_groups} groups but {g} priors were queried.")
        gid = batch.group_ids.numpy()
        real = ~batch.is_pad.numpy()
        scorable = np.zeros(g, dtype=bool)
        scorable[np.unique(gid[valid.numpy()])] = True
        bias2, weight, baseline, vbar, prompt_weight = (np.full(g, np.nan) for _ in range(5))
        if result is not None and scorable.any():
            fr = result.extras["fusion"]
            bias2[scorable], weight[scorable], baseline[scorable], vbar[scorable] = \
                fr.bias2, fr.weight, fr.baseline, fr.mean
            prompt_weight[scorable] = result.extras["prompt_weight"]
        n_unscorable = int((~scorable).sum())
        n_bad_rows = int((real & ~valid.numpy()).sum())
        if n_bad_rows:
            # the base trainer's key: one warning about unscorable rows per run, this (more specific) one first
            trainer.warn_once(
                "unscorable_rows",
                f"V0.5: {n_bad_rows} of {int(real.sum())} rollouts were unscorable (every reward function returned "
                "None or NaN); they get advantage 0, are left out of the fusion and of the prompt weights, and still "
                "count as drawn for OSLA (logged every step as v05/unscorable_rollouts; this warning is shown once).",
            )
        if n_unscorable:
            trainer.warn_once(
                "v05_unscorable",
                f"V0.5: {n_unscorable} of {g} prompts had no scorable rollout (every reward function returned None "
                "or NaN); they get advantage 0 and are not added to the support buffer (logged as "
                "v05/unscorable_prompts).",
            )
        # support buffer: identical global update on every rank
        prompts_ok = [pend["prompts"][j] for j in range(g) if scorable[j]]
        if prompts_ok:
            self.support_buffer.add(prompts_ok, np.clip((vbar[scorable] + 1.0) / 2.0, 0.0, 1.0))
        fingerprint = self.support_buffer.fingerprint()
        if trainer.args.v05_check_buffer_sync and trainer.accelerator.num_processes > 1:
            prints = compat.gather_object([fingerprint])
            if len(set(prints)) != 1:
                raise RuntimeError(f"V0.5 support buffers differ across ranks (fingerprints {prints}); the prior "
                                   "contexts would diverge. Are the prompts JSON-serializable and deterministic?")
        self.last_record = {**pend, "bias2": bias2, "weight": weight, "baseline": baseline, "scorable": scorable,
                            "vbar": vbar, "prompt_weight": prompt_weight, "unscorable_rollouts": n_bad_rows,
                            "buffer_fingerprint": fingerprint}
        self._log(trainer, self.last_record, n_unscorable)

    @staticmethod
    def _log(trainer, rec: dict, n_unscorable: int) -> None:
        k = rec["k"].astype(np.float64)
        s = rec["scorable"]
        log = trainer.log_ext_metric
        log("v05/rollouts_per_prompt_mean", k.mean(), "train")
        log("v05/rollouts_per_prompt_max", k.max(), "train")
        for q in (50, 90):
            log(f"v05/rollouts_per_prompt_p{q}", float(np.percentile(k, q)), "train")
        log("v05/frac_prompts_at_k_init", float((rec["k"] == trainer.args.v05_k_init).mean()), "train")
        log("v05/rounds", rec["rounds"], "train")
        log("v05/early_stop", float(rec["early_stop"]), "train")
        log("v05/rejection_rate", float(rec["rejected_at_init"].mean()), "train")
        log("v05/context_size", rec["context_size"], "train")
        log("v05/dispatched_rollouts", rec["dispatched"], "train")
        log("v05/discarded_rollouts", rec["discarded"], "train")
        log("v05/unscorable_prompts", n_unscorable, "train")
        log("v05/unscorable_rollouts", rec["unscorable_rollouts"], "train")
        log("v05/round1_rollouts", rec["round1_rollouts"], "train")
        log("v05/extra_rollouts", rec["extra_rollouts"], "train")
        log("v05/budget_exhausted", float(rec["budget_exhausted"]), "train")
        log("v05/prior_mean", float(rec["prior_p"].mean()), "train")
        if s.any():
            bias2, weight, vbar = rec["bias2"], rec["weight"], rec["vbar"]
            log("v05/rejection_rate_final", float((bias2[s] > 0).mean()), "train")
            log("v05/mean_weight", float(weight[s].mean()), "train")
            log("v05/prompt_weight_max", float(rec["prompt_weight"][s].max()), "train")
            log("v05/prompt_weight_min", float(rec["prompt_weight"][s].min()), "train")
            # Brier score of the prior against the realized group success rates (vbar + 1) / 2
            log("v05/prior_brier", float(np.mean((rec["prior_p"][s] - (vbar[s] + 1.0) / 2.0) ** 2)), "train")
            # plug-in MSE of mu*: (1 - w)^2 bias2 + w^2 / k = w / k; the plain mean's bound is 1 / k
            log("v05/baseline_mse_proxy", float(np.mean(weight[s] / rec["k"][s])), "train")
            log("v05/mean_only_mse_bound", float(np.mean(1.0 / rec["k"][s])), "train")

    # ------------------------------------------------------------------------------------------------ one round
    def dispatch(self, trainer: V05GRPOTrainer, states: list[_PromptState], requests: list[tuple[int, int]],
                 fallback: dict | None = None) -> dict:
        """Generate ``requests`` = [(local prompt index, n rollouts)], padded to ``v05_dispatch_multiple``; score them.

        Every rank must call this in every round (it may request nothing, and may hold no prompt: ``fallback`` is
        the row of the dummy rollouts that equalize collective calls). Returns this rank's counters for the
        diagnostics: ``rollouts`` generated in the call (collective equalizing rows included) and how many of them
        were ``discarded``.
        """
        a = trainer.args
        m, cap = a.v05_dispatch_multiple, osla_cap(a.v05_rollout_cost)
        want = [i for i, n in requests for _ in range(n)]
        # v05_dispatch_multiple padding: the extra slots go round-robin to this dispatch's prompts, never beyond the cap
        extra = math.ceil(len(want) / m) * m - len(want)
        planned = {i: states[i].k + n for i, n in requests}
        while extra > 0:
            takers = [i for i, _ in requests if planned[i] < cap][:extra]
            if not takers:
                break
            for i in takers:
                planned[i] += 1
                want.append(i)
            extra -= len(takers)
        target = math.ceil(len(want) / m) * m if want else 0
        if fallback is None:
            fallback = states[0].row if states else None
        rows = [states[i].row for i in want] + [fallback] * (target - len(want))
        n_call = len(rows)
        if compat.generation_is_collective(trainer):
            # generate_rollouts pads the call to the longest rank with dummy rows (generated, counted, discarded)
            n_call = int(compat.gather(torch.tensor([n_call], device=trainer.accelerator.device)).max().item())
        c_ids, lps = trainer.generate_rollouts(rows, fallback_row=fallback)
        if len(c_ids) != len(rows):
            raise RuntimeError(f"generation returned {len(c_ids)} completions for {len(rows)} rows.")
        if lps is not None and len(lps) != len(rows):
            raise RuntimeError(f"generation returned {len(lps)} log-prob rows for {len(rows)} rows.")
        kept = len(want)
        if kept:
            rpf = trainer.score_rollouts_local(rows[:kept], c_ids[:kept]).detach().float().cpu()
            signed = v05_signed_rewards(weighted_reward(rpf, trainer.reward_weights.detach().cpu()).double().numpy(),
                                        trainer.args.v05_reward_low, trainer.args.v05_reward_high)
            for j, i in enumerate(want):
                st = states[i]
                st.completion_ids.append(list(c_ids[j]))
                st.logprobs.append(None if lps is None else list(lps[j]))
                st.rpf.append(rpf[j])
                st.signed.append(float(signed[j]))
        return {"rollouts": n_call, "discarded": n_call - kept}

    def decide(self, trainer: V05GRPOTrainer, states: list[_PromptState]):
        """One OSLA decision on the whole generation batch (all ranks).

        Computes this rank's drawn counts and Eq. 7 bias estimates (NaN for a prompt without a scorable rollout),
        gathers them over ranks and applies :func:`trl_ext.estimators.osla_step`. Returns ``(step, local, bias2)``:
        the global :class:`~trl_ext.estimators.OslaStep` (identical on every rank), the slice of this rank's prompts
        in it, and the gathered ``bias2``.
        """
        a = trainer.args
        k = np.array([s.k for s in states], dtype=np.int64)
        bias2 = np.full(len(states), np.nan)
        scorable = [i for i, s in enumerate(states) if np.isfinite(s.signed).any()]
        if scorable:
            r = np.concatenate([np.asarray(states[i].signed) for i in scorable])
            gid = np.concatenate([np.full(states[i].k, j) for j, i in enumerate(scorable)])
            v = np.array([2.0 * states[i].prior_p - 1.0 for i in scorable])
            bias2[scorable] = shrinkage_fusion_batch(r, gid, v).bias2
        gathered = compat.gather_object([(k.tolist(), bias2.tolist())])
        rank = trainer.accelerator.process_index
        offset = sum(len(g[0]) for g in gathered[:rank])
        k_all = np.array([x for g in gathered for x in g[0]], dtype=np.int64)
        b2_all = np.array([x for g in gathered for x in g[1]], dtype=np.float64)
        # module attribute lookup: the one OSLA rule, shared with osla_allocate and the audit
        step = v05_estimators.osla_step(k_all, b2_all, a.v05_rollout_cost, step=a.v05_k_step,
                                        cap=osla_cap(a.v05_rollout_cost),
                                        min_active_frac=a.v05_global_stop_fraction or None)
        return step, slice(offset, offset + len(states)), b2_all

    # ------------------------------------------------------------------------------------------------ main
    def generate_and_score(self, trainer: V05GRPOTrainer, inputs: list[dict]) -> dict:
        a = trainer.args
        n_proc, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
        k_init = int(a.v05_k_init)
        # the whole batch's prompts in sampler order (each was yielded v05_k_init times), whole prompts per rank
        batch = unique_prompt_rows(compat.gather_object(list(inputs)), k_init)
        n_prompts = len(batch)
        fallback = dict(batch[0])
        blocks = [_block(n_prompts, n_proc, r) for r in range(n_proc)]
        owner = np.repeat(np.arange(n_proc), [hi - lo for lo, hi in blocks])
        lo, hi = blocks[rank]
        # Step 1: context + prior, once per prompt, before any rollout; the whole batch on every rank (identical
        # inputs give identical numbers whatever the number of processes)
        ctx_prompts, ctx_outcomes = self.support_buffer.sample_context(self.generation_index)
        p_all = np.asarray(self.prior.predict([x["prompt"] for x in batch], ctx_prompts, ctx_outcomes),
                           dtype=np.float64)
        states = [_PromptState(row=dict(batch[j]), prior_p=float(p_all[j])) for j in range(lo, hi)]
        # Step 2: v05_k_init rollouts per prompt = generation_batch_size rollouts in all (TRL's count)
        counters = self.dispatch(trainer, states, [(i, k_init) for i in range(len(states))], fallback)
        round1 = self.round_cost(trainer, [k_init * (h - low) for low, h in blocks])
        budget = self.extra_budget(trainer)
        # round-1 padding beyond TRL's count (v05_dispatch_multiple > 1) is paid from the budget
        remaining = None if budget is None else max(budget - max(round1 - int(a.generation_batch_size), 0), 0)
        # Steps 3-4: OSLA rounds, decided on the gathered batch so every rank runs the same rounds
        rounds, early_stop, need_history, rejected_at_init = 0, False, [], None
        exhausted, extra = False, 0
        while True:
            step, mine, bias2 = self.decide(trainer, states)
            if rejected_at_init is None:
                rejected_at_init = np.nan_to_num(bias2, nan=0.0) > 0
            need_history.append(float(step.need.mean()) if step.need.size else 0.0)
            if step.stop:
                early_stop = bool(step.stopped_globally)
                break
            add, short = self.apply_budget(trainer, step.add, bias2, owner, remaining)
            exhausted |= short
            if not add.any():
                break
            cost = self.round_cost(trainer, np.bincount(owner, weights=add, minlength=n_proc).astype(int).tolist())
            extra += cost
            if remaining is not None:
                remaining -= cost
            c = self.dispatch(trainer, states, [(i, int(n)) for i, n in enumerate(add[mine]) if n > 0], fallback)
            for key in counters:
                counters[key] += c[key]
            rounds += 1
        # flatten (groups contiguous, in local prompt order)
        rows, c_ids, lps, rpf, gids, priors = [], [], [], [], [], []
        for i, s in enumerate(states):
            rows += [s.row] * s.k
            c_ids += s.completion_ids
            lps += s.logprobs
            rpf += s.rpf
            gids += [i] * s.k
            priors += [2.0 * s.prior_p - 1.0] * s.k  # the side input: V = 2p - 1 (Workflow Step 1)
        has_lps = any(lp is not None for lp in lps)
        if has_lps and any(lp is None for lp in lps):
            raise RuntimeError("internal: some rollouts have sampling log-probs and others do not.")
        local = {"k": [s.k for s in states], "dispatched": counters["rollouts"], "discarded": counters["discarded"],
                 "has_lps": has_lps}
        gathered = compat.gather_object([local])
        use_lps = any(g["has_lps"] for g in gathered)
        is_pad = None
        if not rows:  # a rank without a prompt (fewer prompts than processes): one masked pad row
            eos = compat.tokenizer(trainer).eos_token_id
            rows, c_ids, lps, gids, is_pad = [fallback], [[eos]], [[0.0]], [0], [True]
            priors = [2.0 * float(p_all[0]) - 1.0]
            rpf = [torch.full((len(trainer.reward_funcs),), float("nan"))]
        self._batch = {
            "row_idx": [int(x.get(compat.ROW_IDX_COLUMN, -1)) for x in batch],
            "prompts": [x["prompt"] for x in batch],
            "prior_p": p_all,
            "k": np.array([r for g in gathered for r in g["k"]], dtype=np.int64),
            "rejected_at_init": rejected_at_init,
            "dispatched": sum(g["dispatched"] for g in gathered),
            "discarded": sum(g["discarded"] for g in gathered),
            "rounds": rounds, "early_stop": early_stop, "need_history": need_history,
            "context_size": len(ctx_prompts),
            "round1_rollouts": round1, "extra_rollouts": extra, "extra_budget": budget,
            "budget_exhausted": exhausted,
        }
        try:
            return trainer.finish_rollouts(rows, c_ids, group_ids=gids, logprobs=lps if use_lps else None,
                                           rewards_per_func=torch.stack(rpf), is_pad=is_pad,
                                           side_inputs={"priors": priors})
        finally:
            self._batch = None
            self.generation_index += 1


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
        The train-mode rollout allocation (:meth:`create_rollout_strategy`).
    support_buffer : SupportBuffer
        The global (prompt, success) FIFO; saved in ``trl_ext_state.pt`` of every checkpoint.
    prior_backbone : dict or None
        For the default embedding prior: ``{"source": "peft_base_model" | "reference_model" | "policy_copy",
        "parameters": n, "bytes": b}`` (``parameters`` / ``bytes`` of the copy the prior made, 0 when it shares the
        trainer's weights); ``None`` for any other prior.
    last_v05 : dict or None
        Global record of the latest train generation batch (identical on every rank): ``row_idx``, ``prompts``,
        ``prior_p``, ``k`` (final rollouts per prompt), ``rejected_at_init``, ``bias2``, ``weight``, ``baseline``,
        ``vbar``, ``scorable``, ``prompt_weight`` (the Eq. 10 multiplier ``c_j``, NaN for unscorable prompts),
        ``rounds``, ``early_stop``, ``need_history`` (global need fraction before each round), ``context_size``,
        ``dispatched``, ``discarded``, ``round1_rollouts``, ``extra_rollouts`` (charged to the budget by the OSLA
        rounds, all ranks: requested rollouts plus ``v05_dispatch_multiple`` padding), ``extra_budget`` (``None`` =
        unbounded), ``budget_exhausted``, ``unscorable_rollouts``, ``buffer_fingerprint``.

    Notes
    -----
    Generation backends: TRL's transformers path and its vLLM paths. Each dispatch goes through
    :meth:`~trl_ext.GRPOTrainer.generate_rollouts` (TRL's single-turn generation, one completion per row); with vLLM
    the sampling log-probs of every rollout are kept next to its completion ids through all rounds and handed to
    :meth:`~trl_ext.GRPOTrainer.finish_rollouts` in the same order, so TRL's importance-sampling correction sees
    aligned log-probs. When generation is a collective (vLLM server, vLLM colocate with tensor parallelism,
    DeepSpeed, FSDP) every rank's call in every round is padded to the same length (discarded rollouts, counted);
    otherwise a rank with no active prompt generates nothing in that round.

    Model card (``create_model_card``, which TRL calls at every checkpoint and ``push_to_hub`` calls): "trained with
    V0.5", the V0.5 paper, tags ``trl``, ``trl-ext``, ``v05``, and a ``trl_ext run details`` section with the prior
    options and class, the model the default embedding prior embeds with, and for a table prior the value table's
    content hash, file hash and reference model (:func:`v05_model_card_details`, :meth:`value_table_info`).
    """

    config_class: ClassVar[type] = V05GRPOConfig
    train_estimator: ClassVar[str] = "v05"
    # TRL's sampler with num_generations = v05_k_init (set in __init__): each prompt v05_k_init times, so round 1 is
    # exactly TRL's generation_batch_size rollouts
    unique_prompt_sampler: ClassVar[bool] = False

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, *,
                 prior: ValuePrior | None = None, **kwargs):
        if prior is not None and not isinstance(prior, ValuePrior):
            raise TypeError(f"prior must be a trl_ext.priors.ValuePrior (wrap functions with CallablePrior), got "
                            f"{type(prior).__name__}.")
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, **kwargs)
        # the train sampler (built in train()) repeats each prompt v05_k_init times; evaluation keeps TRL's
        # num_generations_eval
        compat.set_sampler_num_generations(self, self.args.v05_k_init)
        self.prior_backbone: dict | None = None
        self._v05_table_source: dict | None = None  # set by _build_default_prior for v05_value_prior="table"
        self._v05_table_rows_sha256: str | None = None
        self._v05_prior_model_name: str | None = None  # name_or_path of the default embedding prior's model
        self.prior = prior if prior is not None else self._build_default_prior()
        self.support_buffer = SupportBuffer(self.args.v05_buffer_capacity, self.args.v05_context_size,
                                            seed=int(self.args.seed))
        self.rollout_strategy.bind(self.prior, self.support_buffer)

    def create_rollout_strategy(self) -> RolloutStrategy:
        """V0.5's :class:`OSLARounds`."""
        return OSLARounds()

    # ------------------------------------------------------------------------------------------------ setup
    def prior_backbone_choice(self) -> tuple[Any, str, Any, bool]:
        """The model the default embedding prior embeds with: ``(model, source, context, copy)``.

        The prior must see the **starting** policy, frozen, for the whole run:

        * PEFT / LoRA policy: the trainer's own model under ``model.disable_adapter()`` (``context``), i.e. the frozen
          base weights, no copy (for a freshly initialized adapter this is exactly the starting policy; TRL's
          reference model under PEFT is the same thing);
        * full fine-tuning with ``beta > 0``: TRL's reference model (frozen, loaded from the policy's model id), no
          copy -- unless ``sync_ref_model=True``, which moves it towards the policy;
        * otherwise: a frozen deep copy of the policy (``copy=True``), the only way to keep the starting weights.
        """
        from accelerate.utils import is_peft_model

        policy = self.accelerator.unwrap_model(self.model)
        if is_peft_model(policy) and hasattr(policy, "disable_adapter"):
            return policy, "peft_base_model", policy.disable_adapter, False
        ref = getattr(self, "ref_model", None)
        if ref is not None and not self.args.sync_ref_model:
            return self.accelerator.unwrap_model(ref), "reference_model", None, False
        return policy, "policy_copy", None, True

    def _build_default_prior(self) -> ValuePrior:
        kind = self.args.v05_value_prior.lower()
        kw = dict(self.args.v05_value_prior_kwargs)
        if kind == "embedding" and "embed_fn" not in kw:
            from ..priors import hf_mean_pool_embedder

            emb_kw = {k: kw.pop(k) for k in ("embed_batch_size", "embed_max_length", "embed_pad_to_multiple_of")
                      if k in kw}
            model, source, context, copy = self.prior_backbone_choice()
            embed = hf_mean_pool_embedder(
                model, compat.tokenizer(self), batch_size=emb_kw.get("embed_batch_size", 32),
                max_length=emb_kw.get("embed_max_length", 512),
                pad_to_multiple_of=emb_kw.get("embed_pad_to_multiple_of", 32), copy=copy, context=context,
            )
            kw["embed_fn"] = embed
            info = embed.backbone
            self.prior_backbone = {"source": source, "parameters": info["parameters"], "bytes": info["bytes"]}
            self._v05_prior_model_name = getattr(getattr(model, "config", None), "_name_or_path", None) or None
            if self.accelerator.is_main_process:
                if copy:
                    logger.warning(
                        "V05GRPOTrainer: the default embedding prior holds a frozen copy of the starting policy: "
                        "%d parameters, %.1f MiB more memory on every process (full fine-tuning without a reference "
                        "model). Train LoRA adapters (peft_config), use beta > 0 (the prior then shares TRL's "
                        "reference model) or pass prior=... to avoid it.", info["parameters"], info["bytes"] / 2**20)
                else:
                    logger.info("V05GRPOTrainer: the default embedding prior shares the trainer's weights (%s): no "
                                "copy.", source)
        if kind == "table" and isinstance(kw.get("table"), str | os.PathLike):
            from .basis import file_sha256

            self._v05_table_source = {"source": os.fspath(kw["table"]), "file_sha256": file_sha256(kw["table"])}
        if kind == "callable" and "fn" not in kw:
            raise ValueError("v05_value_prior='callable' needs your function: pass prior=CallablePrior(fn) to "
                             "V05GRPOTrainer (a function cannot go through the config).")
        return build_prior(kind, **kw)

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
        from ..priors import TablePrior

        prior = self.prior
        if not isinstance(prior, TablePrior):
            return None
        table = prior.table
        if table is not None and self._v05_table_rows_sha256 is None:
            self._v05_table_rows_sha256 = table.content_hash
        md = dict(table.metadata) if table is not None else {}
        given = "in-memory ValueTable" if table is not None else "in-memory {prompt: p} mapping"
        src = self._v05_table_source or {"source": given, "file_sha256": None}
        return {"rows_sha256": self._v05_table_rows_sha256, "rows": len(table) if table is not None else
                len(prior._probs), "reference_model": md.get("model"), "metadata": md, **src}

    # ------------------------------------------------------------------------------------------------ rewards
    def _v05_map_rewards(self, r: np.ndarray) -> np.ndarray:
        """Rewards from ``[v05_reward_low, v05_reward_high]`` onto [-1, 1]
        (:func:`~trl_ext.estimators.v05.v05_signed_rewards`)."""
        return v05_signed_rewards(r, self.args.v05_reward_low, self.args.v05_reward_high)

    @property
    def last_v05(self) -> dict | None:
        """The strategy's global record of the latest train generation batch (:attr:`OSLARounds.last_record`)."""
        return self.rollout_strategy.last_record

    # ------------------------------------------------------------------------------------------------ state
    def ext_state_dict(self) -> dict:
        """Base state (the strategy's generation index included) plus the support buffer (``v05_support_buffer``)."""
        state = super().ext_state_dict()
        state["v05_support_buffer"] = self.support_buffer.state_dict()
        return state

    def load_ext_state_dict(self, state: dict) -> None:
        """Restore the support buffer and the generation index (warns if the checkpoint has no buffer)."""
        super().load_ext_state_dict(state)
        if "rollout_strategy" not in state and "v05_generation_index" in state:  # checkpoints before OSLARounds
            self.rollout_strategy.generation_index = int(state["v05_generation_index"])
        if "v05_support_buffer" not in state:
            warnings.warn("Checkpoint has no V0.5 support buffer; starting with an empty one (cold start).",
                          stacklevel=2)
            return
        self.support_buffer.load_state_dict(state["v05_support_buffer"])


_EMBEDDING_SOURCES = {
    "policy_copy": "a frozen copy of the starting policy",
    "peft_base_model": "the policy's PEFT/LoRA base model with the adapter disabled",
    "reference_model": "TRL's reference model",
}


def v05_model_card_details(trainer) -> dict[str, Any]:
    """What a V0.5 run's prior depended on, for the model card: the prior class; for the default embedding prior the
    model it embeds with (:attr:`V05GRPOTrainer.prior_backbone`); for a :class:`~trl_ext.priors.TablePrior` the value
    table (content hash, file hash, rows, and the reference model from its header, as BASIS records it)."""
    from ..priors import EmbeddingInContextPrior
    from .basis import card_table_source

    out: dict[str, Any] = {"value prior class": type(trainer.prior).__name__}
    backbone = trainer.prior_backbone
    if backbone is not None:
        what = _EMBEDDING_SOURCES.get(backbone["source"], backbone["source"])
        model_name = getattr(trainer, "_v05_prior_model_name", None)
        name = f" `{model_name}`" if model_name else ""
        cost = f"{backbone['parameters']} parameters copied" if backbone["parameters"] else "shared, no copy"
        out["embedding model"] = f"{what}{name} ({backbone['source']}; {cost})"
    elif isinstance(trainer.prior, EmbeddingInContextPrior):
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

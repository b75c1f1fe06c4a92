"""``V05GRPOConfig``: the V0.5 options (one dataclass field each, defaults from the paper) and their validation.

"V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts" (arXiv:2603.10848); the trainer is
:class:`trl_ext.trainers.v05.V05GRPOTrainer`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ...estimators.v05 import DEFAULT_SIGMA_FLOOR, V05_K_INIT, V05_PAPER_COST, osla_cap
from ..config import (
    ExtGRPOConfig,
    accept_renamed_fields,
    method_options_class,
)

__all__ = ["V05GRPOConfig", "V05Options", "validate_v05_options", "V05_SUPPORTED_LOSS_TYPES", "V05_PROMPT_WEIGHTINGS"]

V05_SUPPORTED_LOSS_TYPES = ("dapo", "cispo", "vespo")
"""Loss types whose normalizer stays exact with variable group sizes and per-rank pad rows.

They divide the summed per-token loss by the *global* count of loss-mask tokens (``num_items_in_batch``), which
:meth:`~trl_ext.GRPOTrainer.replay_rollouts` recomputes after masking pad rows: every real token gets the same weight
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
    with these defaults and checked by :meth:`validate_method`.
    """

    method_route: ClassVar[tuple[str, str] | None] = ("v05", "v05_osla")

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
        check_eval_group_size(self.num_generations)  # before TRL's check, which divides by it
        # num_generations >= 2: ExtGRPOConfig runs TRL's GRPOConfig.__post_init__ unchanged (no placeholder group
        # size): generation_batch_size counts rollouts as in TRL and num_generations is TRL's (the eval group size;
        # TRL checks that it divides the generation batch), so a TRL config is valid here exactly when it is valid
        # for TRL (plus v05_k_init | batch)
        super().__post_init__()

    def validate_method(self) -> None:
        """The V0.5 fields (run once by ``validate_ext_config``); ``v05_value_prior_kwargs`` parsed to a dict."""
        options = V05Options.from_config(self)
        validate_v05_options(options, self)
        self.v05_value_prior_kwargs = options.value_prior_kwargs


# renamed in the one-naming-convention change (method options prefixed); accepted with a FutureWarning for one release
accept_renamed_fields(V05GRPOConfig, {name: f"v05_{name}" for name in (
    "k_init", "k_step", "rollout_cost", "global_stop_fraction", "dispatch_multiple", "buffer_capacity", "context_size",
    "value_prior", "value_prior_kwargs", "reward_low", "reward_high", "sigma_floor", "allow_small_k_init",
    "allow_unsupported_loss_type", "check_buffer_sync")})


V05Options = method_options_class(V05GRPOConfig, "v05_", "v05_osla", "V05Options")
"""V0.5's typed options (``V05GRPOConfig``'s ``v05_*`` fields without the prefix): what the ``"v05_osla"`` strategy
reads, from a :class:`V05GRPOConfig` or from ``rollout_strategy_kwargs`` (``{"k_init": 4, "value_prior": "table"}``)."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def check_eval_group_size(g: Any) -> None:
    """V0.5's one rule for ``num_generations``: TRL's meaning (the evaluation group size), an int >= 2."""
    if not _is_int(g) or g < 2:
        raise ValueError(f"num_generations (V0.5: the evaluation group size, TRL's meaning; the train rollouts per "
                         f"prompt are v05_k_init) must be an int >= 2, got {g!r}.")


def validate_v05_options(o: Any, args: Any) -> None:
    """Check V0.5's options ``o`` (a :data:`V05Options`) with the TRL fields of ``args`` they depend on. Raises
    ``ValueError`` saying what to change."""
    check_eval_group_size(args.num_generations)
    if not _is_int(o.k_step) or o.k_step < 1:
        raise ValueError(f"v05_k_step must be an int >= 1, got {o.k_step!r}.")
    if not _is_int(o.k_init) or o.k_init < 1:
        raise ValueError(f"v05_k_init must be an int >= 1, got {o.k_init!r}.")
    if o.k_init < V05_K_INIT and not o.allow_small_k_init:
        raise ValueError(
            f"v05_k_init={o.k_init} < 4: the paper's Appendix A.8 shows the bias test over-rejects below 4 "
            "rollouts (1/sqrt(k) >= 2/k needs k >= 4). Use v05_k_init >= 4, or set v05_allow_small_k_init=True for an "
            "ablation."
        )
    c = o.rollout_cost
    if not (isinstance(c, int | float) and not isinstance(c, bool) and math.isfinite(c) and c > 0):
        raise ValueError(f"v05_rollout_cost must be a finite number > 0, got {c!r}.")
    cap = osla_cap(c)
    if cap < o.k_init:
        raise ValueError(f"v05_rollout_cost={c} gives cap round(1/sqrt(c))={cap} < v05_k_init={o.k_init}; "
                         f"lower the cost (cap >= v05_k_init needs c <= {1.0 / (o.k_init - 0.5) ** 2:.6g}) or "
                         "lower v05_k_init.")
    gbs = getattr(args, "generation_batch_size", None)
    if _is_int(gbs) and gbs % o.k_init:
        raise ValueError(
            f"generation_batch_size={gbs} (per_device_train_batch_size x processes x steps_per_generation) is not "
            f"divisible by v05_k_init={o.k_init}: V0.5's first round generates exactly TRL's "
            f"generation_batch_size rollouts as generation_batch_size / v05_k_init prompts x v05_k_init rollouts. "
            f"Make per_device_train_batch_size (or generation_batch_size) a multiple of {o.k_init}, or choose a "
            "v05_k_init that divides it."
        )
    b = o.extra_rollout_budget
    if isinstance(b, bool) or not isinstance(b, int | float) or math.isnan(b) or b < 0:
        raise ValueError(f"v05_extra_rollout_budget must be a number >= 0 (fraction of generation_batch_size; 0 = no "
                         f"OSLA rounds, inf = the paper's unbounded rounds), got {b!r}.")
    f = o.global_stop_fraction
    if not (isinstance(f, int | float) and not isinstance(f, bool) and 0.0 <= f <= 1.0):
        raise ValueError(f"v05_global_stop_fraction must be in [0, 1] (0 disables the early stop), got {f!r}.")
    if not _is_int(o.dispatch_multiple) or o.dispatch_multiple < 1:
        raise ValueError(f"v05_dispatch_multiple must be an int >= 1, got {o.dispatch_multiple!r}.")
    for name in ("v05_buffer_capacity", "v05_context_size"):
        v = getattr(o, name[len("v05_"):])
        if not _is_int(v) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}.")
    lo, hi = o.reward_low, o.reward_high
    if not all(isinstance(x, int | float) and math.isfinite(x) for x in (lo, hi)) or hi <= lo:
        raise ValueError(f"need finite v05_reward_low < v05_reward_high, got v05_reward_low={lo!r}, "
                         f"v05_reward_high={hi!r}.")
    s = o.sigma_floor
    if not (isinstance(s, int | float) and 0.0 < s <= 1.0):
        raise ValueError(f"v05_sigma_floor must be in (0, 1], got {s!r}.")
    if o.prompt_weighting not in V05_PROMPT_WEIGHTINGS:
        raise ValueError(f"v05_prompt_weighting must be one of {V05_PROMPT_WEIGHTINGS} ('equal': the paper's Eq. 10, "
                         f"every prompt the same weight), got {o.prompt_weighting!r}.")
    if not isinstance(o.value_prior, str) or not o.value_prior:
        raise ValueError(f"v05_value_prior must be a prior kind string, got {o.value_prior!r}.")
    if args.loss_type not in V05_SUPPORTED_LOSS_TYPES:
        msg = (f"loss_type={args.loss_type!r}: V0.5 supports {V05_SUPPORTED_LOSS_TYPES}, whose global token normalizer "
               "stays exact with variable rollout counts and per-rank pad rows; other loss types are not covered by "
               "V0.5's tests (see trl_ext.trainers.v05.V05_SUPPORTED_LOSS_TYPES).")
        if not o.allow_unsupported_loss_type:
            raise ValueError(msg + " Use one of them or set v05_allow_unsupported_loss_type=True.")
        warnings.warn(msg, UserWarning, stacklevel=3)
    if args.tie_break_scorer_index is not None:
        raise ValueError("The tie-break blend (tie_break_scorer_index) is not supported by V05GRPOTrainer: the fusion "
                         "needs rewards on a declared bounded range. Unset tie_break_scorer_index.")

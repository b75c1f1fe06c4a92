r"""PAIR trainer: prefix probing, contrast-graph continuation design and pair-inclusion reweighting.

Implements Algorithm 1 of "Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR" (Voss,
Hale and Reyes, arXiv:2608.11368; "PAIR") on top of :class:`trl_ext.GRPOTrainer` (TRL 1.16). Section, equation and
appendix numbers refer to that paper. The generation side is the rollout strategy :class:`PrefixProbeRollouts`
(returned by :meth:`PAIRTrainer.create_rollout_strategy`); the estimator side is
:meth:`PAIRTrainer.compute_advantages`. Per prompt and generation batch:

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
   are then fixed at ``pi = 1``. The probabilities are recorded in :attr:`PAIRTrainer.pair_design_log` **before**
   any continuation is generated or any reward is computed. ``J_i ~ Bernoulli(pi_i)`` with fresh randomness from a
   generator keyed by ``(seed, generation index, dataset row)`` only (never by an outcome). Optional anchor pair
   (Appendix B): two vertices drawn uniformly among the ``M`` pairs and continued with conditional probability one;
   their conditional probabilities are logged and used.
4. **Continuation** (Algorithm 1): selected unfinished prefixes are continued to termination from
   ``prompt + prefix`` (transformers: a fresh ``generate`` call on the prefix tokens -- the probe's KV cache is
   *not* reused; vLLM colocate/server: the same call resubmits ``prompt + prefix`` so vLLM's prefix caching
   applies, and the sampling log-probs of both phases are concatenated for TRL's importance-sampling correction).
   Unselected prefixes are dropped from the update. Probe and continuation both go through
   :meth:`~trl_ext.GRPOTrainer.generate_token_ids`, so every generated token is in ``ext/generated_tokens``.
5. **Update** (Sec. 4.5, Eq. 13, Appendix C): for the completed vertices of each prompt

   .. math:: \tilde A_i = \frac{1}{2M}\sum_{j\ne i} \frac{J_iJ_j}{\rho_{ij}} (r_i - r_j),\quad
             \rho_{ij} = \pi_i\pi_j,\quad M = \binom G2,

   in float64 (:func:`~trl_ext.estimators.pair_advantages`), unstandardized. Only completed vertices enter the
   loss; a completed vertex whose reward is NaN (unscorable) observes no edge
   (:func:`~trl_ext.estimators.scorable_selection`). With ``pair_fixed_normalizer`` (default) the strategy's
   :meth:`~PrefixProbeRollouts.fixed_policy_normalizer` returns the global number of prompts ``K``
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
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from ..estimators.pair import (
    DesignWarmStart,
    PairAdvantages,
    PairDesign,
    draw_selection,
    fixed_normalizer,
    pair_advantages,
    pair_design,
    standardize_pair_advantages,
)
from ..estimators.pair_heads import PrefixHeads, prefix_summary
from ..measurement.keyed_sampling import left_pad
from . import _trl_compat as compat
from . import model_card
from .base import ExtGRPOConfig, GRPOTrainer, validate_ext_config
from .batch import RolloutBatch
from .rollouts import RolloutStrategy

logger = logging.getLogger(__name__)

__all__ = ["PAIRConfig", "PAIRTrainer", "GroupDraw", "PrefixProbeRollouts", "validate_pair_config",
           "PAIRShortProbeWarning", "short_probe_message", "PAIR_PAPER", "SHORT_PROBE_TOKENS"]

_FINISHED_COST_FRACTION = 1e-9
"""Finished candidates enter ``pair_design`` with cost ``1e-9 * max(c_hat)`` (the solver needs c > 0); their
probability is then fixed at 1. The budget is raised by the same negligible amount."""

_SOLVED = ("optimal", "iteration limit")
"""``PairDesign.reason`` values of a solver answer (the ones the warm start learns from)."""


def _default_tau(max_completion_length: int) -> int:
    return int(min(256, max(1, max_completion_length // 8)))


PAIR_PAPER = model_card.paper_info(
    title="PAIR: Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR",
    authors=("Voss", "Hale", "Reyes"), year=2026, arxiv_id="2608.11368", bibtex_key="voss2026pair",
)
"""The PAIR paper in TRL's model-card format (name, arXiv id, BibTeX)."""

SHORT_PROBE_TOKENS = 2
"""A probe (``tau + pair_snap_window``) of at most this many tokens triggers :class:`PAIRShortProbeWarning`."""


class PAIRShortProbeWarning(UserWarning):
    """The prefix probe is too short for the heads to predict anything (PAIRTrainer construction)."""


def short_probe_message(args) -> str | None:
    """Why PAIR should not be used with these arguments when its probe is 1-2 tokens, else ``None``."""
    L = int(args.max_completion_length)
    tau, w = int(args.pair_tau), int(args.pair_snap_window)
    if tau + w > SHORT_PROBE_TOKENS:
        return None
    how = "pair_prefix_tokens" if args.pair_prefix_tokens is not None else \
        f"the default max_completion_length // 8 with max_completion_length={L}"
    return (
        f"PAIR's prefix probe is only {tau + w} token(s) (tau={tau} from {how}, + pair_snap_window={w}): the "
        "success and cost heads see almost nothing of the completion, so the continuation design is close to uniform "
        "and PAIR trains on a random subset of the candidates for the price of probing all of them. On the project's "
        "compute-matched benchmark with 5-token answers (1-token probe) PAIR lost to GRPO with G = 4 by 7 points. "
        "PAIR is meant for long completions (the paper probes 128-512 tokens of multi-thousand-token traces); for "
        "short answers use trl_ext.GRPOTrainer."
    )


# ---------------------------------------------------------------------------------------------------------- config
@dataclass
class PAIRConfig(ExtGRPOConfig):
    r"""Configuration of :class:`PAIRTrainer` (PAIR options: paper defaults, Appendix C and Table 6).

    Every PAIR option is declared once, below, as a dataclass field whose ``help`` metadata documents it (the text
    ``HfArgumentParser`` shows on the command line); ``docs/pair.md`` tabulates them. TRL's own arguments keep TRL's
    defaults and meaning (a TRL user changes the import and the config class, nothing else): ``num_generations`` is
    the candidate group size ``G`` with TRL's default (8) -- **the paper uses G = 16: set** ``num_generations=16``
    -- and the sampler's batch semantics are TRL's (``per_device_train_batch_size * steps_per_generation`` candidate
    rows per rank, which must be a multiple of ``G`` so every prompt's candidates stay on one rank). A plain
    ``trl.GRPOConfig`` (or ``ExtGRPOConfig``) given to :class:`PAIRTrainer` is upgraded with these defaults and
    validated by :meth:`validate_method_options`. PAIR computes its own advantages (Eq. 13), so
    ``advantage_estimator`` must stay at its default (it then only applies to evaluation batches).
    """

    uses_advantage_estimator: ClassVar[bool] = False

    pair_prefix_tokens: int | None = field(
        default=None,
        metadata={"help": "Prefix checkpoint tau in generated tokens (paper: 128/256/512 with multi-thousand-token "
                          "completions). None: min(256, max(1, max_completion_length // 8)). tau + pair_snap_window "
                          "must be < max_completion_length."},
    )
    pair_snap_window: int = field(
        default=0,
        metadata={"help": "Snap the checkpoint to the first delimiter token within this many tokens after tau "
                          "(paper: 32; 0 = off). The probe then generates tau + window tokens; tokens after the "
                          "checkpoint are kept for the continuation but the heads only see the prefix up to it."},
    )
    pair_snap_delimiters: list[str] = field(
        default_factory=lambda: ["\n", ".", "!", "?"],
        metadata={"help": "Token texts that end a checkpoint (a token qualifies when its decoded text ends with one)."},
    )
    pair_budget_ratio: float = field(
        default=0.5,
        metadata={"help": "Expected suffix budget C as a fraction of the predicted full-group suffix cost, in (0, 1] "
                          "and >= pair_pi_min (Proposition 2). Paper: 0.5."},
    )
    pair_pi_min: float = field(
        default=0.08,
        metadata={"help": "Continuation probability floor in (0, 1] (positivity; caps inverse weights at "
                          "1/pi_min^2). Paper: 0.08."},
    )
    pair_solver_max_iter: int = field(default=50, metadata={"help": "SLSQP iteration cap (Appendix C: 50)."})
    pair_solver_tol: float = field(
        default=1e-6, metadata={"help": "SLSQP stopping rule: relative objective change (Appendix C: 1e-6)."}
    )
    pair_solver_warm_start: bool = field(
        default=True,
        metadata={"help": "Warm-start the design solver from the previous step's probabilities (Appendix C), carried "
                          "over by rank of the first-order allocation priority (trl_ext.estimators.DesignWarmStart); "
                          "checkpointed. Changes only where SLSQP starts, not the optimum."},
    )
    pair_edge_proxy: str = field(
        default="disagreement", metadata={"help": "Edge proxy a_ij: 'disagreement' (Eq. 8, the paper's default)."}
    )
    pair_anchor_pair: bool = field(
        default=False,
        metadata={"help": "Appendix B anchor pair: two uniformly drawn vertices are always continued (every draw "
                          "observes an edge); conditional probabilities are logged and used (unbiased; raises the "
                          "expected cost)."},
    )
    pair_w_max: float | None = field(
        default=None, metadata={"help": "BIASED (Appendix B): clip edge weights at w_max >= 1 (paper: 10/20/50)."}
    )
    pair_self_normalize: bool = field(
        default=False, metadata={"help": "BIASED (Appendix B): Hajek self-normalization of the edge weights."}
    )
    pair_standardize: bool = field(
        default=False,
        metadata={"help": "BIASED (Appendix B): divide each prompt's advantages by the std of its completed, "
                          "scorable rewards (+1e-4), as standardized GRPO does."},
    )
    pair_fixed_normalizer: bool = field(
        default=True,
        metadata={"help": "Normalize the policy loss by the number of prompts K (and max_completion_length for "
                          "token-level losses) instead of the realized row/token counts, so Eq. 13 stays "
                          "design-unbiased. Not available with loss_type='bnpo'."},
    )
    pair_lr_scaling: str = field(
        default="sqrt_budget",
        metadata={"help": "How the optimizer's learning rate relates to learning_rate. PAIR completes about "
                          "pair_budget_ratio of the candidates TRL's GRPO would train on per step, so at the same "
                          "learning_rate and generated tokens it takes ~1/(tau/L + budget_ratio) more Adam steps, each "
                          "from fewer rollouts (noisier), and Adam's step length does not shrink with the batch. "
                          "'sqrt_budget': learning_rate x sqrt(pair_budget_ratio) (Adam's square-root scaling rule for "
                          "a budget_ratio-times smaller batch; 0.71x at the default 0.5); 'linear_budget': "
                          "learning_rate x pair_budget_ratio; 'none': learning_rate as given. Logged at construction; "
                          "not applied to an optimizer passed in through `optimizers`."},
    )
    pair_head_hidden: int = field(default=256, metadata={"help": "Head MLP width (Appendix C: 256)."})
    pair_head_lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate of both heads."})
    pair_replay_size: int = field(
        default=2048, metadata={"help": "Replay window in labels (Appendix C: 2048); >= 4 and >= pair_head_min_labels."}
    )
    pair_head_min_labels: int = field(
        default=64, metadata={"help": "Warm-up: labels in the window before the heads drive the design (uniform "
                                      "design until then)."}
    )
    pair_head_fit_steps: int = field(default=50, metadata={"help": "Head minibatch steps per refresh (>= 0)."})
    pair_head_batch_size: int = field(default=256, metadata={"help": "Head minibatch size."})
    pair_summary_last_k: int = field(
        default=16, metadata={"help": "Prefix summary = mean of the last k final hidden states (Appendix C: 16)."}
    )
    pair_lagged_heads: bool = field(
        default=False, metadata={"help": "Design with the heads from before the latest refresh (lagged predictor, "
                                         "Sec. 4.2)."}
    )
    pair_head_seed: int | None = field(
        default=None, metadata={"help": "Seed of head initialization and minibatches (None: seed)."}
    )

    def __post_init__(self):
        super().__post_init__()
        validate_pair_config(self)

    def validate_method_options(self) -> None:
        """Validation :func:`trl_ext.trainers.base.as_config` runs when it upgrades another config to this class."""
        validate_ext_config(self)
        validate_pair_config(self)

    @property
    def pair_tau(self) -> int:
        """The effective checkpoint ``tau`` (resolves ``pair_prefix_tokens=None``)."""
        if self.pair_prefix_tokens is None:
            return _default_tau(int(self.max_completion_length))
        return int(self.pair_prefix_tokens)


#: ``pair_lr_scaling`` choices: the factor on ``learning_rate`` as a function of ``pair_budget_ratio``.
PAIR_LR_SCALINGS: dict = {"sqrt_budget": math.sqrt, "linear_budget": float, "none": lambda ratio: 1.0}


def pair_lr_factor(args) -> float:
    """The factor PAIR applies to ``learning_rate`` (``pair_lr_scaling`` of ``pair_budget_ratio``)."""
    return float(PAIR_LR_SCALINGS[args.pair_lr_scaling](float(args.pair_budget_ratio)))


def validate_pair_config(args) -> None:
    """Reject PAIR settings that cannot work, saying what to change. Raises ``ValueError``."""
    L = args.max_completion_length
    if L is None or int(L) < 2:
        raise ValueError(f"PAIR needs max_completion_length >= 2 (a prefix and a suffix), got {L}.")
    tau = args.pair_tau
    if isinstance(args.pair_prefix_tokens, bool) or tau < 1:
        raise ValueError(f"pair_prefix_tokens must be a positive int, got {args.pair_prefix_tokens!r}.")
    if args.pair_snap_window < 0:
        raise ValueError(f"pair_snap_window must be >= 0, got {args.pair_snap_window}.")
    if tau + args.pair_snap_window >= L:
        raise ValueError(
            f"pair_prefix_tokens (tau={tau}) + pair_snap_window ({args.pair_snap_window}) must be < "
            f"max_completion_length ({L}): the probe would generate whole completions and there would be no suffix "
            "to save. Lower tau or raise max_completion_length."
        )
    pi_min = float(args.pair_pi_min)
    if not (0.0 < pi_min <= 1.0):
        raise ValueError(f"pair_pi_min must be in (0, 1], got {pi_min}.")
    ratio = float(args.pair_budget_ratio)
    if not (0.0 < ratio <= 1.0) or not math.isfinite(ratio):
        raise ValueError(f"pair_budget_ratio must be in (0, 1], got {ratio}.")
    if ratio < pi_min:
        raise ValueError(
            f"pair_budget_ratio={ratio} is below pair_pi_min={pi_min}: the budget ratio * predicted cost would be "
            "below pi_min * predicted cost, so no design satisfies both the floor and the budget (Proposition 2). "
            "Raise pair_budget_ratio or lower pair_pi_min."
        )
    if args.pair_lr_scaling not in PAIR_LR_SCALINGS:
        raise ValueError(f"pair_lr_scaling must be one of {sorted(PAIR_LR_SCALINGS)}, got {args.pair_lr_scaling!r}.")
    if args.pair_edge_proxy != "disagreement":
        raise ValueError(f'pair_edge_proxy must be "disagreement" (Eq. 8), got {args.pair_edge_proxy!r}.')
    if args.pair_w_max is not None and (not math.isfinite(float(args.pair_w_max)) or float(args.pair_w_max) < 1):
        raise ValueError(f"pair_w_max must be None or a finite number >= 1, got {args.pair_w_max}.")
    if int(args.pair_solver_max_iter) < 1 or not float(args.pair_solver_tol) > 0:
        raise ValueError("pair_solver_max_iter must be >= 1 and pair_solver_tol > 0.")
    for name in ("pair_head_hidden", "pair_head_min_labels", "pair_head_batch_size", "pair_summary_last_k"):
        if int(getattr(args, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}.")
    if int(args.pair_head_fit_steps) < 0:
        raise ValueError(f"pair_head_fit_steps must be >= 0, got {args.pair_head_fit_steps}.")
    if int(args.pair_replay_size) < max(4, int(args.pair_head_min_labels)):
        raise ValueError(f"pair_replay_size ({args.pair_replay_size}) must be >= 4 and >= pair_head_min_labels "
                         f"({args.pair_head_min_labels}), or the heads never leave warm-up.")
    G = args.num_generations
    if not isinstance(G, int) or isinstance(G, bool) or G < 2:
        raise ValueError(f"PAIR needs num_generations (the candidate group size G) >= 2, got {G!r}.")
    local_rows = int(args.per_device_train_batch_size) * int(args.steps_per_generation)
    if local_rows % G:
        raise ValueError(
            f"per_device_train_batch_size * steps_per_generation = {local_rows} candidate rows per rank must be a "
            f"multiple of num_generations (G = {G}) so each prompt's candidate group stays on one rank. Change "
            "per_device_train_batch_size or num_generations."
        )
    if args.signal_only_denominator:
        raise ValueError("signal_only_denominator is not compatible with PAIR (Eq. 13 needs a fixed normalizer); "
                         "use pair_fixed_normalizer instead.")
    if args.tie_break_scorer_index is not None:
        raise ValueError("The tie-break blend is not supported by PAIRTrainer (its rewards are not binary); unset "
                         "tie_break_scorer_index.")
    if args.dynamic_sampling:
        raise ValueError("dynamic_sampling is not available in PAIRTrainer (its rollout strategy is the prefix probe; "
                         "dropping groups after their rewards are known would break the design); set "
                         "dynamic_sampling=False.")
    if args.keyed_sampling:
        raise ValueError("keyed_sampling is not supported by PAIRTrainer: a PAIR rollout is generated in two calls "
                         "(probe, then continuation from prompt + prefix), which the keyed noise and trl-ext replay do "
                         "not model; set keyed_sampling=False.")
    if args.pair_fixed_normalizer and args.loss_type not in (compat.SEQUENCE_LEVEL_LOSSES +
                                                             compat.GLOBAL_TOKEN_LEVEL_LOSSES):
        raise ValueError(f"pair_fixed_normalizer supports loss_type in "
                         f"{compat.SEQUENCE_LEVEL_LOSSES + compat.GLOBAL_TOKEN_LEVEL_LOSSES}, got {args.loss_type!r}. "
                         "Change loss_type or set pair_fixed_normalizer=False (then the normalizer is a ratio).")


# ---------------------------------------------------------------------------------------------------------- draws
@dataclass
class GroupDraw:
    """One prompt's design and continuation draw (everything here is fixed before any reward is seen).

    Attributes
    ----------
    pi : ndarray (G,)
        Logged probabilities used in the weights: the design's ``pi`` with finished candidates at 1 and, with the
        anchor pair, the anchor's conditional probability 1 (Appendix B).
    pi_design : ndarray (G,)
        The design's probabilities before the anchor.
    selected : ndarray of bool (G,)
        Completed vertices ``J`` (finished-in-prefix candidates are always 1).
    finished : ndarray of bool (G,)
    anchor : tuple or None
    expected_cost, budget, full_cost : float
        Predicted expected suffix cost ``sum c_hat pi`` over unfinished candidates, the budget, and the predicted
        full-group suffix cost ``sum c_hat``.
    reason : str
        ``"warm-up (uniform)"``, ``"all finished in prefix"``, ``"invalid head output (uniform)"`` or the
        :class:`~trl_ext.estimators.PairDesign` reason.
    fell_back, degenerate : bool
    n_iter : int
        SLSQP iterations (0 when the solver did not run).
    warm_started : bool
        The solver started from the warm-start point (:class:`~trl_ext.estimators.DesignWarmStart`).
    solution : ndarray (G,) or None
        The solver's ``x = -log(pi)`` over all ``G`` vertices when it answered (``reason`` "optimal" or "iteration
        limit"); what the warm start of the next step learns from.
    """

    pi: np.ndarray
    pi_design: np.ndarray
    selected: np.ndarray
    finished: np.ndarray
    anchor: tuple | None
    expected_cost: float
    budget: float
    full_cost: float
    reason: str
    fell_back: bool = False
    degenerate: bool = False
    n_iter: int = 0
    warm_started: bool = False
    solution: np.ndarray | None = None


# ---------------------------------------------------------------------------------------------------------- strategy
class PrefixProbeRollouts(RolloutStrategy):
    """PAIR's rollout allocation: probe every candidate to a prefix, design, draw, continue the selected ones.

    Train mode only (evaluation uses TRL's full groups). One call of :meth:`generate_and_score` per generation batch
    on every rank: refresh the heads (labels of the previous batch), probe (one
    :meth:`~trl_ext.GRPOTrainer.generate_token_ids` call capped at ``tau + snap_window`` tokens), prefix features
    and head predictions, per-prompt design and draw (:meth:`PAIRTrainer.pair_design_and_draw`, logged in
    :attr:`design_log` before anything else is generated), continuation (a second ``generate_token_ids`` call), and
    :meth:`~trl_ext.GRPOTrainer.finish_rollouts` with the completed vertices. The base's one counter
    ``ext/generated_tokens`` therefore holds every probe and continuation token (unselected prefixes and equalizing
    dummy rows included); ``pair/prefix_tokens`` and ``pair/realized_suffix_tokens`` are its breakdown.

    Attributes
    ----------
    generation_index : int
        Generation batches produced so far (keys the design randomness; checkpointed).
    warm_start : DesignWarmStart
        Profiles of the previous step's solutions (checkpointed).
    design_log : list of dict
        Per prompt of the latest generation batch on this rank (see :attr:`PAIRTrainer.pair_design_log`).
    num_prompts : int
        Global number of prompts ``K`` of the current generation batch (the fixed normalizer).
    pending : dict or None
        Per-prompt records of the draw, handed to :meth:`PAIRTrainer.compute_advantages` during
        :meth:`~trl_ext.GRPOTrainer.finish_rollouts`.
    totals : dict
        Cumulative ``prefix_tokens``, ``suffix_tokens``, ``groups``, ``zero_edge_groups``, ``solver_fallbacks``
        (train mode; checkpointed).
    """

    name = "pair_prefix_probe"

    def __init__(self, delimiter_ids: set[int] | None = None):
        self.delimiter_ids = set(delimiter_ids or ())
        self.generation_index = 0
        self.warm_start = DesignWarmStart()
        self.design_log: list[dict] = []
        self.num_prompts = 0
        self.pending: dict | None = None
        self.totals = {"prefix_tokens": 0, "suffix_tokens": 0, "zero_edge_groups": 0, "solver_fallbacks": 0,
                       "groups": 0}

    # ------------------------------------------------------------------------------------------------ interface
    def describe(self, trainer) -> str:
        """What each step generates, compared with TRL's GRPO on the same arguments (logged at construction)."""
        a = trainer.args
        G, L, n_probe = int(a.num_generations), int(a.max_completion_length), self.probe_len(trainer)
        snap = f" (+ up to {a.pair_snap_window} to a delimiter)" if a.pair_snap_window else ""
        anchor = "; the anchor pair adds up to 2 continuations per prompt" if a.pair_anchor_pair else ""
        return (f"rollout strategy {self.name} (PAIR): {G} candidates per prompt probed to "
                f"tau = {a.pair_tau} tokens{snap}, then a design-chosen subset continued (expected suffix budget "
                f"{a.pair_budget_ratio} x predicted, floor pi_min = {a.pair_pi_min}). Compute vs TRL's GRPO with the "
                f"same arguments ({G} completions of up to L = {L} tokens per prompt): each step generates {G} probes "
                f"of <= {n_probe} tokens per prompt plus continuations with an expected suffix budget of "
                f"{a.pair_budget_ratio} x the predicted remaining tokens, i.e. about {n_probe}/{L} + "
                f"{a.pair_budget_ratio} x (1 - {n_probe}/{L}) = {self.expected_token_factor(trainer):.3g}x TRL's "
                f"generated tokens (<= 1x; ~ tau/L + budget_ratio){anchor}")

    @staticmethod
    def expected_token_factor(trainer) -> float:
        """Expected generated tokens per step relative to TRL's GRPO with the same arguments, for full-length
        completions: ``p + pair_budget_ratio * (1 - p)`` with ``p = (tau + pair_snap_window) / max_completion_length``
        (every candidate probed, a ``pair_budget_ratio`` share of the remaining tokens continued in expectation;
        <= 1, and <= ``p + pair_budget_ratio``). Without the anchor pair and with the predicted costs on target."""
        a = trainer.args
        p = PrefixProbeRollouts.probe_len(trainer) / float(a.max_completion_length)
        return float(min(1.0, p + float(a.pair_budget_ratio) * (1.0 - p)))

    def fixed_policy_normalizer(self, trainer, batch) -> float | None:
        """The global number of prompts ``K`` of the generation batch when ``pair_fixed_normalizer`` is on.

        ``K`` counts every prompt whose candidates were probed, also those that completed no vertex: it is fixed
        before the design draw, so the policy loss ``(1/K) sum ...`` is design-unbiased
        (:func:`~trl_ext.estimators.fixed_normalizer`; the base trainer multiplies by ``max_completion_length`` for
        token-level losses)."""
        if not trainer.args.pair_fixed_normalizer:
            return None
        return fixed_normalizer(int(self.num_prompts))

    def state_dict(self) -> dict:
        return {"generation_index": int(self.generation_index), "totals": dict(self.totals),
                "warm_start": self.warm_start.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.generation_index = int(state.get("generation_index", 0))
        self.totals.update({k: int(v) for k, v in state.get("totals", {}).items()})
        self.warm_start.load_state_dict(state.get("warm_start", {}))

    # ------------------------------------------------------------------------------------------------ helpers
    @staticmethod
    def probe_len(trainer) -> int:
        """Tokens generated by the probe: ``tau + pair_snap_window``."""
        return int(trainer.args.pair_tau) + int(trainer.args.pair_snap_window)

    @staticmethod
    def is_finished(trainer, completion: list[int], probe_len: int) -> bool:
        """Whether a probed candidate ended inside the probe (EOS, or fewer tokens than the cap)."""
        return len(completion) < probe_len or (len(completion) > 0 and completion[-1] in trainer.eos_token_ids)

    def checkpoint(self, trainer, completion: list[int], finished: bool) -> int:
        """Checkpoint position inside the probe tokens (snapping, Appendix C)."""
        if finished or not self.delimiter_ids:
            return len(completion)
        for pos in range(int(trainer.args.pair_tau) - 1, len(completion)):
            if completion[pos] in self.delimiter_ids:
                return pos + 1
        return len(completion)

    def design_rng(self, trainer, row_idx: int) -> np.random.Generator:
        """Fresh design randomness keyed by (seed, generation index, dataset row): never by an outcome, identical
        across process layouts."""
        return np.random.default_rng([int(trainer.args.seed) & 0xFFFFFFFF, 0x9A1, self.generation_index,
                                      int(row_idx) & 0xFFFFFFFF])

    def probe(self, trainer, rows: list[dict]) -> dict:
        """Steps 1-2 for local candidate rows: prompt ids, probe tokens (and vLLM log-probs), finished flags,
        checkpoints and prefix features."""
        prompt_ids = compat.tokenize_prompts(trainer, [x["prompt"] for x in rows])
        n_probe = self.probe_len(trainer)
        probe_ids, probe_lps = trainer.generate_token_ids(prompt_ids, max_new_tokens=n_probe)
        finished = [self.is_finished(trainer, c, n_probe) for c in probe_ids]
        ckpt = [self.checkpoint(trainer, c, f) for c, f in zip(probe_ids, finished)]
        feats = trainer.pair_features([list(p) + list(c[:t]) for p, c, t in zip(prompt_ids, probe_ids, ckpt)])
        return {"prompt_ids": prompt_ids, "probe_ids": probe_ids, "probe_lps": probe_lps, "finished": finished,
                "features": feats}

    # ------------------------------------------------------------------------------------------------ main
    def generate_and_score(self, trainer, inputs):
        tr = trainer
        tr.pair_refresh_heads()
        G = int(tr.num_generations)
        rows = list(inputs)
        if len(rows) % G:
            raise RuntimeError(f"PAIR: {len(rows)} local rows are not a multiple of G = {G}.")
        K = len(rows) // G
        col = compat.ROW_IDX_COLUMN
        for k in range(K):
            keys = {rows[k * G + i].get(col, None) for i in range(G)}
            if len(keys) != 1:
                raise RuntimeError("PAIR: a candidate group spans several dataset rows; rows of a prompt must be "
                                   "contiguous in blocks of G (TRL's RepeatSampler with per-rank rows % G == 0).")
        device = tr.accelerator.device
        self.num_prompts = int(compat.gather(torch.tensor([K], device=device)).sum().item())
        # 1-2. prefix probe, features, frozen heads
        pr = self.probe(tr, rows)
        prompt_ids, probe_ids, probe_lps, finished = pr["prompt_ids"], pr["probe_ids"], pr["probe_lps"], pr["finished"]
        n_probe = self.probe_len(tr)
        warmup = not tr.pair_heads.ready
        pred = tr.pair_design_heads().predict(pr["features"])
        p_hat = pred.p_hat.numpy()
        c_hat = pred.cost_hat.numpy()
        # 3. design + draw per prompt, logged before any continuation or reward
        warm = self.warm_start if tr.args.pair_solver_warm_start else None
        draws: list[GroupDraw] = []
        self.design_log = []
        for k in range(K):
            sl = slice(k * G, (k + 1) * G)
            row_idx = int(rows[k * G].get(col, k))
            draw = tr.pair_design_and_draw(p_hat[sl], c_hat[sl], finished[sl], self.design_rng(tr, row_idx),
                                           warmup=warmup, warm_start=warm)
            draws.append(draw)
            self.design_log.append({
                "generation": self.generation_index, "row_idx": row_idx, "pi": draw.pi.tolist(),
                "pi_design": draw.pi_design.tolist(), "selected": draw.selected.tolist(),
                "finished": draw.finished.tolist(), "p_hat": p_hat[sl].tolist(), "cost_hat": c_hat[sl].tolist(),
                "anchor": draw.anchor, "reason": draw.reason, "n_iter": draw.n_iter,
                "warm_started": draw.warm_started, "expected_cost": draw.expected_cost, "budget": draw.budget,
            })
        # 4. continuation of selected unfinished prefixes from prompt + prefix
        cont_idx = [k * G + i for k, d in enumerate(draws) for i in range(G) if d.selected[i] and not d.finished[i]]
        max_new = int(tr.args.max_completion_length) - n_probe
        cont_ids, cont_lps = tr.generate_token_ids([list(prompt_ids[j]) + list(probe_ids[j]) for j in cont_idx],
                                                   max_new_tokens=max_new)
        full_ids = [list(c) for c in probe_ids]
        full_lps = None if probe_lps is None else [list(lp) for lp in probe_lps]
        suffix_len = [0] * len(rows)
        for n_c, (j, c) in enumerate(zip(cont_idx, cont_ids)):
            full_ids[j] = full_ids[j] + list(c)
            suffix_len[j] = len(c)
            if full_lps is not None:  # vLLM: concatenate both phases' sampling log-probs (TRL's IS correction)
                if cont_lps is None:
                    raise RuntimeError("PAIR: the probe returned sampling log-probs but the continuation did not.")
                full_lps[j] = full_lps[j] + list(cont_lps[n_c])
        for k, entry in enumerate(self.design_log):  # realized costs, appended after the design was logged
            entry["realized_suffix_tokens"] = suffix_len[k * G:(k + 1) * G]
        # 5. completed vertices -> the base's tail (one finish_rollouts call per rank)
        out_rows, out_ids, out_gids, out_lps, records = [], [], [], [], []
        for k, d in enumerate(draws):
            done = [i for i in range(G) if d.selected[i]]
            for i in done:
                out_rows.append(rows[k * G + i])
                out_ids.append(full_ids[k * G + i])
                out_gids.append(k)
                if full_lps is not None:
                    out_lps.append(full_lps[k * G + i])
            records.append({
                "G": G, "row_idx": self.design_log[k]["row_idx"], "pi": d.pi.tolist(),
                "pi_design": d.pi_design.tolist(), "selected": d.selected.tolist(), "finished": d.finished.tolist(),
                "anchor": d.anchor, "completed": done, "features": pr["features"][k * G:(k + 1) * G][done].clone(),
                "suffix_len": [suffix_len[k * G + i] for i in done],
                "probe_len": [len(probe_ids[k * G + i]) for i in range(G)],
                "p_hat": p_hat[k * G:(k + 1) * G].tolist(), "c_hat": c_hat[k * G:(k + 1) * G].tolist(),
                "expected_cost": d.expected_cost, "budget": d.budget, "full_cost": d.full_cost, "reason": d.reason,
                "fell_back": d.fell_back, "degenerate": d.degenerate, "warmup": warmup, "n_iter": d.n_iter,
                "warm_started": d.warm_started,
                "solution": None if d.solution is None else [float(v) for v in d.solution],
                "nonfinite": int(pred.n_nonfinite) if k == 0 else 0,
            })
        is_pad = None
        if not out_rows:  # no completed vertex on this rank: one pad row keeps the collectives aligned
            out_rows, out_ids, out_gids, is_pad = [rows[0]], [full_ids[0]], [0], [True]
            out_lps = [full_lps[0]] if full_lps is not None else []
        self.pending = {"records": records}
        try:
            out = tr.finish_rollouts(out_rows, out_ids, group_ids=out_gids,
                                     logprobs=out_lps if full_lps is not None else None, is_pad=is_pad)
        finally:
            self.pending = None
        self.generation_index += 1
        return out


# ---------------------------------------------------------------------------------------------------------- trainer
def pair_model_card_details(trainer) -> dict[str, Any]:
    """What a PAIR run depended on, for the model card: the probe, the design and the head settings, and the
    heads' state when the card is written."""
    a = trainer.args
    heads = trainer.pair_heads
    totals = trainer.rollout_strategy.totals
    return {
        "candidate group size G (num_generations)": int(a.num_generations),
        "probe": f"tau = {a.pair_tau} tokens (pair_prefix_tokens={a.pair_prefix_tokens}), "
                 f"pair_snap_window = {a.pair_snap_window}, max_completion_length = {a.max_completion_length}",
        "design": f"pair_budget_ratio = {a.pair_budget_ratio}, pair_pi_min = {a.pair_pi_min}, edge proxy "
                  f"{a.pair_edge_proxy}, anchor pair {a.pair_anchor_pair}, warm start {a.pair_solver_warm_start}, "
                  f"fixed normalizer {a.pair_fixed_normalizer}",
        "policy learning rate": f"learning_rate {a.learning_rate} x {pair_lr_factor(a):.4g} "
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
        Probe, design, draw and continuation (generation index, warm start and token totals are its checkpointed
        state).
    pair_heads : PrefixHeads
        Success/remaining-cost heads, optimizer and replay window (saved in every checkpoint).
    pair_needs_refresh : bool
        New labels arrived since the last refresh; the heads are refit at the start of the next generation
        (:meth:`pair_refresh_heads`; checkpointed).
    pair_design_log : list of dict
        Per prompt of the latest generation batch on this rank: ``generation``, ``row_idx``, ``pi``,
        ``pi_design``, ``selected``, ``finished``, ``p_hat``, ``cost_hat``, ``anchor``, ``reason``, ``n_iter``,
        ``warm_started``, ``expected_cost``, ``budget``. Written after the design and draw, before any continuation
        or reward; ``realized_suffix_tokens`` is added after the continuation.
    last_pair_stats : dict
        Global diagnostics of the latest generation batch (the ``pair/*`` metrics).

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

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, **kwargs):
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, **kwargs)
        args = self.args
        cfg = getattr(self.model, "config", None)
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        hidden = getattr(text_cfg, "hidden_size", None)
        if hidden is None:
            raise ValueError("PAIRTrainer needs model.config.hidden_size for the prefix heads.")
        seed = args.seed if args.pair_head_seed is None else args.pair_head_seed
        self.pair_heads = PrefixHeads(
            int(hidden), args.pair_head_hidden, replay_size=args.pair_replay_size, lr=args.pair_head_lr,
            min_labels=args.pair_head_min_labels, seed=int(seed),
        )
        self._pair_lagged: PrefixHeads | None = None
        self.pair_needs_refresh = False
        self._pair_last_refresh: dict = {}
        self.last_pair_stats: dict = {}
        short = short_probe_message(args)
        if short is not None:
            warnings.warn(short, PAIRShortProbeWarning, stacklevel=2)
        # an optimizer passed in through `optimizers` is the caller's: never rescaled
        self._pair_scale_optimizer = self.optimizer is None
        factor = pair_lr_factor(args)
        if factor != 1.0 and self.accelerator.is_main_process:
            logger.info("PAIRTrainer: optimizer learning rate = learning_rate x %.3g = %.3g (pair_lr_scaling=%r: PAIR "
                        "trains on ~pair_budget_ratio = %s of the rollouts per step; set pair_lr_scaling='none' to "
                        "keep learning_rate).", factor, factor * args.learning_rate, args.pair_lr_scaling,
                        args.pair_budget_ratio)

    def create_optimizer(self, model=None):
        """Transformers' optimizer, with every parameter group's learning rate multiplied by
        :func:`pair_lr_factor` (before the scheduler is built, so warm-up and decay follow the scaled rate)."""
        fresh = self.optimizer is None and self._pair_scale_optimizer
        opt = super().create_optimizer(model)
        factor = pair_lr_factor(self.args)
        if fresh and factor != 1.0:
            for group in opt.param_groups:
                group["lr"] = group["lr"] * factor
                if "initial_lr" in group:
                    group["initial_lr"] = group["initial_lr"] * factor
        return opt

    def create_rollout_strategy(self) -> PrefixProbeRollouts:
        """PAIR's probe-then-continue allocation (:class:`PrefixProbeRollouts`)."""
        delims = self._pair_delimiter_ids() if self.args.pair_snap_window > 0 else set()
        return PrefixProbeRollouts(delims)

    @property
    def pair_design_log(self) -> list[dict]:
        """The rollout strategy's design log of the latest generation batch on this rank."""
        return self.rollout_strategy.design_log

    @property
    def pair_tau(self) -> int:
        return self.args.pair_tau

    def _pair_delimiter_ids(self) -> set[int]:
        tok = compat.tokenizer(self)
        delims = tuple(self.args.pair_snap_delimiters)
        ids = set()
        for i in range(len(tok)):
            text = tok.decode([i], skip_special_tokens=False)
            if text and text.endswith(delims):
                ids.add(i)
        return ids

    @torch.no_grad()
    def pair_features(self, seqs: list[list[int]]) -> torch.Tensor:
        """Stop-gradient prefix summaries: mean of the last ``k`` final-layer hidden states (Appendix C).

        The forward runs inside the context TRL's own generation uses (:func:`._trl_compat.generation_model`:
        TRL's ``unwrap_model_for_generation`` and FSDP's full-parameter context), so ZeRO-3/FSDP shards are gathered
        and gradient checkpointing is restored with the trainer's ``gradient_checkpointing_kwargs``; every rank makes
        exactly one such call per generation batch (equal row counts), which keeps those collectives aligned.
        """
        device = self.accelerator.device
        tok = compat.tokenizer(self)
        ids, mask = left_pad(seqs, tok.pad_token_id if tok.pad_token_id is not None else 0)
        # explicit position ids: left padding must not shift positions (layout-independent features)
        pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
        with compat.generation_model(self) as model:
            was_training = model.training
            model.eval()  # no dropout in the summary
            try:
                out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                            output_hidden_states=True, use_cache=False)
            finally:
                model.train(was_training)
        return prefix_summary(out.hidden_states[-1], mask.to(device), last_k=int(self.args.pair_summary_last_k)).cpu()

    # ------------------------------------------------------------------------------------------------ design
    def pair_design_and_draw(self, p_hat, cost_hat, finished, rng: np.random.Generator, *,
                             warmup: bool = False, warm_start: DesignWarmStart | None = None) -> GroupDraw:
        r"""Design and continuation draw for one candidate group (Algorithm 1, "contrast-graph allocation").

        Parameters
        ----------
        p_hat : array_like (G,)
            Predicted success probabilities in [0, 1].
        cost_hat : array_like (G,)
            Predicted remaining suffix tokens (> 0 on unfinished candidates; ignored on finished ones).
        finished : array_like of bool (G,)
            Candidates that emitted EOS inside the probe: continued with probability 1 at zero cost.
        rng : numpy.random.Generator
            Fresh randomness for the anchor and the Bernoulli draw (never derived from outcomes).
        warmup : bool
            Use the uniform design ``pi = max(budget_ratio, pi_min)`` (heads not ready yet).
        warm_start : DesignWarmStart, optional
            Start SLSQP from ``warm_start.initial_point(...)`` (Appendix C) when it has a profile for ``G``.

        Returns
        -------
        GroupDraw
            ``sum_{i unfinished} c_hat_i pi_design_i <= pair_budget_ratio * sum_{i unfinished} c_hat_i`` (up to
            ``1e-9`` relative).

        Notes
        -----
        Invalid head output (NaN/inf ``p_hat``, ``p_hat`` outside [0, 1], ``cost_hat <= 0`` or non-finite on an
        unfinished candidate) falls back to the uniform design (``reason="invalid head output (uniform)"``).
        """
        a = self.args
        p = np.asarray(p_hat, dtype=np.float64).reshape(-1)
        c = np.asarray(cost_hat, dtype=np.float64).reshape(-1)
        fin = np.asarray(finished, dtype=bool).reshape(-1)
        G = p.shape[0]
        if G < 2 or c.shape[0] != G or fin.shape[0] != G:
            raise ValueError(f"pair_design_and_draw: p_hat, cost_hat and finished must all be (G,) with G >= 2; got "
                             f"{p.shape}, {c.shape}, {fin.shape}.")
        unf = ~fin
        ratio, pi_min = float(a.pair_budget_ratio), float(a.pair_pi_min)
        anchor = None
        solution, warm_started = None, False
        if not unf.any():
            pi = np.ones(G)
            reason, fell_back, degenerate, n_iter = "all finished in prefix", False, False, 0
            budget = full = expected = 0.0
        else:
            invalid = bool(np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)) or np.any(~np.isfinite(c[unf]))
                           or np.any(c[unf] <= 0))
            c_unf = np.where(np.isfinite(c) & (c > 0), c, 1.0)
            full = float(c_unf[unf].sum())
            budget = ratio * full
            fell_back, degenerate, n_iter = False, False, 0
            if warmup or invalid:
                pi = np.where(unf, min(1.0, max(ratio, pi_min)), 1.0)
                reason = "invalid head output (uniform)" if invalid else "warm-up (uniform)"
                fell_back = invalid
            else:
                eps = _FINISHED_COST_FRACTION * float(c_unf[unf].max())
                c_design = np.where(unf, c_unf, eps)
                p_design = np.clip(p, 0.0, 1.0)
                budget_design = budget + eps * float(fin.sum())
                x0 = None
                if warm_start is not None:
                    x0 = warm_start.initial_point(p_design, c_design, budget_design, pi_min, kind=a.pair_edge_proxy)
                design: PairDesign = pair_design(
                    p_design, c_design, budget_design, pi_min, x0=x0,
                    max_iter=int(a.pair_solver_max_iter), tol=float(a.pair_solver_tol), kind=a.pair_edge_proxy,
                )
                pi = np.where(unf, np.clip(design.pi, pi_min, 1.0), 1.0)
                reason, fell_back, n_iter = design.reason, bool(design.fell_back), int(design.n_iter)
                degenerate = design.reason.startswith("degenerate")
                warm_started = bool(design.warm_started)
                if design.reason in _SOLVED:
                    solution = np.asarray(design.x, dtype=np.float64).copy()
            expected = float((c_unf * pi)[unf].sum())
        pi_design = pi.copy()
        if a.pair_anchor_pair:
            k, l_ = sorted(int(v) for v in rng.choice(G, size=2, replace=False))
            anchor = (k, l_)
            pi = pi.copy()
            pi[[k, l_]] = 1.0
        selected = draw_selection(pi_design, rng, anchor=anchor)
        selected |= fin
        return GroupDraw(pi=pi, pi_design=pi_design, selected=selected, finished=fin, anchor=anchor,
                         expected_cost=expected, budget=budget, full_cost=full, reason=reason, fell_back=fell_back,
                         degenerate=degenerate, n_iter=n_iter, warm_started=warm_started, solution=solution)

    def pair_group_advantages(self, rewards, draw: GroupDraw) -> tuple[np.ndarray, PairAdvantages]:
        r"""Eq. 13 advantages of one group from its draw (float64); the configured biased variants apply.

        Parameters
        ----------
        rewards : array_like (G,)
            Rewards of the completed vertices (entries of unselected candidates are ignored). A NaN reward on a
            completed vertex marks it unscorable: PAIR's one NaN rule
            (:func:`~trl_ext.estimators.scorable_selection`) -- it observes no edge and gets advantage 0, every
            other weight stays as logged; counted in ``result.n_unscorable`` (``pair/nan_rewards``).
        draw : GroupDraw

        Returns
        -------
        advantages : ndarray (G,), float64
            0 on unselected and unscorable candidates; all 0 when fewer than two scorable vertices were completed
            (unbiased, Appendix B).
        result : PairAdvantages
        """
        a = self.args
        r = np.asarray(rewards, dtype=np.float64).reshape(-1)
        sel = np.asarray(draw.selected, dtype=bool)
        res = pair_advantages(r, sel, draw.pi, w_max=a.pair_w_max, self_normalize=bool(a.pair_self_normalize))
        adv = res.advantages.astype(np.float64)
        if a.pair_standardize:
            adv, _ = standardize_pair_advantages(adv, r, sel)
        return adv, res

    def pair_simulate_group(self, p_hat, cost_hat, finished, rewards, rng: np.random.Generator, *,
                            warmup: bool = False) -> tuple[np.ndarray, GroupDraw, PairAdvantages]:
        """The trainer's per-prompt "design + draw + advantages" step on a frozen, fully generated candidate group
        (``rewards`` known for every candidate): what training would produce for one fresh design draw. Used by
        the design-unbiasedness tests; training calls the same two methods with generation in between."""
        draw = self.pair_design_and_draw(p_hat, cost_hat, finished, rng, warmup=warmup)
        r = np.where(draw.selected, np.asarray(rewards, dtype=np.float64), np.nan)
        adv, res = self.pair_group_advantages(r, draw)
        return adv, draw, res

    # ------------------------------------------------------------------------------------------------ heads
    def pair_design_heads(self) -> PrefixHeads:
        """The heads that drive the design: the lagged copy with ``pair_lagged_heads``, else the current ones."""
        return self._pair_lagged if (self.args.pair_lagged_heads and self._pair_lagged is not None) else \
            self.pair_heads

    def pair_refresh_heads(self) -> None:
        """Refresh after the RL update on the labels gathered so far (Eq. 6-7 fit + temperature, Appendix C).

        A no-op unless new labels arrived since the last refresh (:attr:`pair_needs_refresh`)."""
        if not self.pair_needs_refresh:
            return
        self.pair_needs_refresh = False
        if self.args.pair_lagged_heads:
            self._pair_lagged = self.pair_heads.lagged_copy()
        out = self.pair_heads.refresh(steps=int(self.args.pair_head_fit_steps),
                                      batch_size=int(self.args.pair_head_batch_size))
        self._pair_sync_heads()
        diag = self.pair_heads.diagnostics()
        self._pair_last_refresh = {"loss_p": out.get("loss_p"), "loss_c": out.get("loss_c"),
                                   "temperature": out.get("temperature"), **diag}

    def _pair_sync_heads(self) -> None:
        """Make the heads bitwise identical on every rank (they are fit on identical gathered labels; this removes
        any floating-point drift between processes)."""
        if self.accelerator.num_processes <= 1 or not torch.distributed.is_initialized():
            return
        for head in (self.pair_heads.success_head, self.pair_heads.cost_head):
            for p in head.parameters():
                buf = p.data.to(self.accelerator.device)
                torch.distributed.broadcast(buf, src=0)
                p.data.copy_(buf.cpu())
        t = torch.tensor([self.pair_heads.temperature], dtype=torch.float64, device=self.accelerator.device)
        torch.distributed.broadcast(t, src=0)
        self.pair_heads.temperature = float(t.item())

    # ------------------------------------------------------------------------------------------------ advantages
    def compute_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """Eq. 13 advantages for the completed vertices of every prompt (global, identical on every rank).

        Also adds the delayed labels to the heads' replay window (the heads are refit only at the next
        generation, after this batch's RL update), updates the solver's warm start with this batch's solutions, and
        logs the ``pair/*`` diagnostics.
        """
        pending = self.rollout_strategy.pending if batch.mode == "train" else None
        if pending is None:
            return super().compute_advantages(batch)
        records = compat.gather_object(pending["records"])
        real = ~batch.is_pad
        gid = batch.group_ids
        adv = torch.zeros(batch.num_rows, dtype=torch.float64)
        row_groups = [rec for rec in records if rec["completed"]]
        if len(row_groups) != batch.num_groups:
            raise RuntimeError(f"PAIR internal: {len(row_groups)} groups with completed vertices but the batch has "
                               f"{batch.num_groups} groups.")
        stats = _Stats()
        labels_f, labels_r, labels_c, labels_pi = [], [], [], []
        for g, rec in enumerate(row_groups):
            idx = torch.nonzero((gid == g) & real).flatten()
            if idx.numel() != len(rec["completed"]):
                raise RuntimeError(f"PAIR internal: group {g} has {idx.numel()} rows, expected "
                                   f"{len(rec['completed'])}.")
            G = rec["G"]
            done = rec["completed"]
            r_rows = batch.rewards[idx].double().numpy()
            r_full = np.full(G, np.nan)
            r_full[done] = r_rows
            draw = GroupDraw(pi=np.asarray(rec["pi"]), pi_design=np.asarray(rec["pi_design"]),
                             selected=np.asarray(rec["selected"], dtype=bool),
                             finished=np.asarray(rec["finished"], dtype=bool), anchor=rec["anchor"],
                             expected_cost=rec["expected_cost"], budget=rec["budget"], full_cost=rec["full_cost"],
                             reason=rec["reason"])
            a_full, res = self.pair_group_advantages(r_full, draw)
            adv[idx] = torch.as_tensor(a_full[done], dtype=torch.float64)
            stats.add_result(res)
            # delayed labels (completed, scorable vertices only); marginal inclusion for the IPW losses
            pi_marg = np.asarray(rec["pi_design"], dtype=np.float64)
            if rec["anchor"] is not None:
                pi_marg = pi_marg + (1.0 - pi_marg) * 2.0 / G
            ok = np.isfinite(r_rows) & (r_rows >= 0) & (r_rows <= 1)
            stats.unlabeled += int((np.isfinite(r_rows) & ~ok).sum())
            if ok.any():
                labels_f.append(rec["features"][torch.as_tensor(ok)])
                labels_r.append(torch.as_tensor(r_rows[ok]))
                labels_c.append(torch.as_tensor(np.asarray(rec["suffix_len"], dtype=np.float64)[ok]))
                labels_pi.append(torch.as_tensor(pi_marg[done][ok]))
        for rec in records:
            stats.add_design(rec)
        if labels_r:
            self.pair_heads.add_labels(torch.cat(labels_f), torch.cat(labels_r), torch.cat(labels_c),
                                       torch.cat(labels_pi))
            self.pair_needs_refresh = True
        # warm start of the next step: this step's solver answers, in a layout-independent order
        solved = sorted((rec["row_idx"], rec["solution"]) for rec in records if rec["solution"] is not None)
        if solved:
            self.rollout_strategy.warm_start.update([x for _, x in solved])
        self._pair_log(stats, batch.mode)
        return adv.float()

    def _pair_log(self, s: _Stats, mode: str) -> None:
        n = max(s.groups, 1)
        m = {
            "pair/groups": s.groups,
            "pair/completed_vertices": s.completed,
            "pair/completed_per_group": s.completed / n,
            "pair/continued_from_prefix": s.continued,
            "pair/finished_in_prefix": s.finished,
            "pair/observed_edges": s.edges,
            "pair/ess_mean": s.ess / max(s.groups_with_edges, 1),
            "pair/max_weight": s.max_weight,
            "pair/pi_min": s.pi_min if s.pi_count else float("nan"),
            "pair/pi_mean": s.pi_sum / max(s.pi_count, 1),
            "pair/zero_edge_groups": s.zero_edge,
            "pair/all_finished_groups": s.all_finished,
            "pair/solver_fallbacks": s.fallbacks,
            "pair/degenerate_groups": s.degenerate,
            "pair/solver_iterations": s.solver_iters / s.solved if s.solved else float("nan"),
            "pair/warm_started_groups": s.warm_started,
            "pair/warmup": float(s.warmup),
            "pair/head_nonfinite": s.nonfinite,
            "pair/nan_rewards": s.nan_rewards,
            "pair/unlabeled_rewards": s.unlabeled,
            "pair/budget": s.budget,
            "pair/predicted_full_suffix_cost": s.full_cost,
            "pair/predicted_suffix_cost": s.expected_cost,
            "pair/predicted_cost_selected": s.pred_selected,
            "pair/realized_suffix_tokens": s.suffix_tokens,
            "pair/prefix_tokens": s.prefix_tokens,
            "pair/tokens_saved_vs_full_group": s.saved_est,
            "pair/head_labels": self.pair_heads.n_labels,
        }
        for key in ("brier", "ece", "cost_mape", "loss_p", "loss_c", "temperature"):
            if key in self._pair_last_refresh and self._pair_last_refresh[key] is not None:
                m[f"pair/head_{key}"] = float(self._pair_last_refresh[key])
        for name, value in m.items():
            self.log_ext_metric(name, float(value), mode)
        if mode == "train":
            totals = self.rollout_strategy.totals
            totals["prefix_tokens"] += int(s.prefix_tokens)
            totals["suffix_tokens"] += int(s.suffix_tokens)
            totals["zero_edge_groups"] += int(s.zero_edge)
            totals["solver_fallbacks"] += int(s.fallbacks)
            totals["groups"] += int(s.groups)
        self.last_pair_stats = m

    # ------------------------------------------------------------------------------------------------ state
    def ext_state_dict(self) -> dict:
        state = super().ext_state_dict()
        state["pair"] = {
            "heads": self.pair_heads.state_dict(),
            "lagged_heads": None if self._pair_lagged is None else self._pair_lagged.state_dict(),
            "needs_refresh": bool(self.pair_needs_refresh),
        }
        return state

    def load_ext_state_dict(self, state: dict) -> None:
        super().load_ext_state_dict(state)
        pair = state.get("pair")
        if pair is None:
            self._ext_warn_once("pair_state", "Checkpoint has no PAIR state: the heads and replay window start fresh.")
            return
        self.pair_heads.load_state_dict(pair["heads"])
        if pair.get("lagged_heads") is not None:
            self._pair_lagged = self.pair_heads.lagged_copy()
            self._pair_lagged.load_state_dict(pair["lagged_heads"])
        self.pair_needs_refresh = bool(pair["needs_refresh"])
        if "rollout_strategy" not in state and "generation" in pair:  # written before the strategy refactor
            self.rollout_strategy.load_state_dict({"generation_index": pair["generation"],
                                                   "totals": pair.get("totals", {})})


class _Stats:
    """Accumulates the global per-batch diagnostics."""

    def __init__(self):
        self.groups = self.completed = self.continued = self.finished = self.edges = 0
        self.groups_with_edges = self.zero_edge = self.all_finished = self.fallbacks = self.degenerate = 0
        self.nonfinite = self.nan_rewards = self.unlabeled = 0
        self.solved = self.solver_iters = self.warm_started = 0
        self.ess = self.max_weight = 0.0
        self.pi_min, self.pi_sum, self.pi_count = 1.0, 0.0, 0
        self.budget = self.full_cost = self.expected_cost = self.pred_selected = self.saved_est = 0.0
        self.suffix_tokens = self.prefix_tokens = 0
        self.warmup = False

    def add_result(self, res: PairAdvantages) -> None:
        self.edges += res.n_edges
        self.nan_rewards += int(res.n_unscorable)
        if res.n_edges:
            self.groups_with_edges += 1
            self.ess += res.ess
            self.max_weight = max(self.max_weight, res.max_weight)

    def add_design(self, rec: dict[str, Any]) -> None:
        sel = np.asarray(rec["selected"], dtype=bool)
        fin = np.asarray(rec["finished"], dtype=bool)
        pi = np.asarray(rec["pi_design"], dtype=np.float64)
        c = np.asarray(rec["c_hat"], dtype=np.float64)
        self.groups += 1
        self.completed += int(sel.sum())
        self.continued += int((sel & ~fin).sum())
        self.finished += int(fin.sum())
        if sel.sum() < 2:
            self.zero_edge += 1
        if fin.all():
            self.all_finished += 1
        self.fallbacks += int(rec["fell_back"])
        self.degenerate += int(rec["degenerate"])
        if rec["solution"] is not None:
            self.solved += 1
            self.solver_iters += int(rec["n_iter"])
        self.warm_started += int(rec["warm_started"])
        self.nonfinite += int(rec["nonfinite"])
        self.warmup = self.warmup or bool(rec["warmup"])
        if (~fin).any():
            self.pi_min = min(self.pi_min, float(pi[~fin].min()))
            self.pi_sum += float(pi[~fin].sum())
            self.pi_count += int((~fin).sum())
        self.budget += float(rec["budget"])
        self.full_cost += float(rec["full_cost"])
        self.expected_cost += float(rec["expected_cost"])
        cont = sel & ~fin
        self.pred_selected += float(np.where(np.isfinite(c), c, 0.0)[cont].sum())
        self.saved_est += float(np.where(np.isfinite(c), c, 0.0)[~sel & ~fin].sum())
        self.suffix_tokens += int(sum(rec["suffix_len"]))
        self.prefix_tokens += int(sum(rec["probe_len"]))

"""PAIR's configuration: :class:`PAIRConfig` (every ``pair_*`` option, with its help text), its validation, the
learning-rate scaling, the short-probe warning, and the mapping of the config onto the keyword arguments of the pure
design and estimator functions (:func:`pair_design_options`, :func:`pair_advantage_options`).

Source: "Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR" (Voss, Hale and Reyes,
arXiv:2608.11368, "PAIR"); Appendix C and Table 6 give the defaults. Importable from :mod:`trl_ext.trainers.pair`
too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from .. import _trl_compat as compat
from ..config import ExtGRPOConfig, method_options_class

__all__ = ["PAIRConfig", "PAIROptions", "PAIRShortProbeWarning", "PAIR_LR_SCALINGS", "SHORT_PROBE_TOKENS",
           "pair_advantage_options", "pair_design_options", "pair_kwargs_options", "pair_lr_factor", "pair_tau",
           "short_probe_message", "validate_pair_options"]


def _default_tau(max_completion_length: int) -> int:
    return int(min(256, max(1, max_completion_length // 8)))


SHORT_PROBE_TOKENS = 2
"""A probe (``tau + pair_snap_window``) of at most this many tokens triggers :class:`PAIRShortProbeWarning`."""


class PAIRShortProbeWarning(UserWarning):
    """The prefix probe is too short for the heads to predict anything (PAIRTrainer construction)."""


def short_probe_message(o, max_completion_length: int) -> str | None:
    """Why PAIR should not be used with the options ``o`` (:data:`PAIROptions`) when its probe is 1-2 tokens, else
    ``None``."""
    L = int(max_completion_length)
    tau, w = pair_tau(o, L), int(o.snap_window)
    if tau + w > SHORT_PROBE_TOKENS:
        return None
    how = "pair_prefix_tokens" if o.prefix_tokens is not None else \
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
    r"""Configuration of :class:`~trl_ext.trainers.pair.trainer.PAIRTrainer` (PAIR options: paper defaults, Appendix C and Table 6).

    Every PAIR option is declared once, below, as a dataclass field whose ``help`` metadata documents it (the text
    ``HfArgumentParser`` shows on the command line); ``docs/pair.md`` tabulates them. TRL's own arguments keep TRL's
    defaults and meaning (a TRL user changes the import and the config class, nothing else): ``num_generations`` is
    the candidate group size ``G`` with TRL's default (8) -- **the paper uses G = 16: set** ``num_generations=16``
    -- and the sampler's batch semantics are TRL's (``per_device_train_batch_size * steps_per_generation`` candidate
    rows per rank, which must be a multiple of ``G`` so every prompt's candidates stay on one rank). A plain
    ``trl.GRPOConfig`` (or ``ExtGRPOConfig``) given to :class:`PAIRTrainer` is upgraded with these defaults and
    validated by :meth:`validate_method`. Its ``advantage_estimator`` and ``rollout_strategy`` are PAIR's
    (``method_route``: ``"pair_draw"``, Eq. 13, and ``"pair_prefix_probe"``).
    """

    method_route: ClassVar[tuple[str, str] | None] = ("pair_draw", "pair_prefix_probe")

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

    def validate_method(self) -> None:
        """The PAIR fields (run once by ``validate_ext_config``)."""
        validate_pair_options(PAIROptions.from_config(self), self)

    def optimizer_lr_factor(self) -> tuple[float, str | None]:
        """``learning_rate x`` :func:`pair_lr_factor` in the optimizer (any trainer that builds it), and why."""
        return pair_lr_factor(PAIROptions.from_config(self)), (
            f"pair_lr_scaling={self.pair_lr_scaling!r}: PAIR trains on ~pair_budget_ratio = {self.pair_budget_ratio} of "
            "the rollouts per step; set pair_lr_scaling='none' to train at learning_rate as TRL does")

    @property
    def pair_tau(self) -> int:
        """The effective checkpoint ``tau`` (resolves ``pair_prefix_tokens=None``)."""
        return pair_tau(PAIROptions.from_config(self), int(self.max_completion_length))


PAIROptions = method_options_class(PAIRConfig, "pair_", "pair_prefix_probe", "PAIROptions")
"""PAIR's typed options (``PAIRConfig``'s ``pair_*`` fields without the prefix): what the ``"pair_prefix_probe"``
strategy reads, from a :class:`PAIRConfig` or from ``rollout_strategy_kwargs`` (:func:`pair_kwargs_options`)."""


def pair_tau(o, max_completion_length: int) -> int:
    """The effective checkpoint ``tau`` of the options ``o``: ``prefix_tokens``, or by default
    ``min(256, max(1, max_completion_length // 8))``."""
    return _default_tau(int(max_completion_length)) if o.prefix_tokens is None else int(o.prefix_tokens)


#: ``pair_lr_scaling`` choices: the factor on ``learning_rate`` as a function of ``pair_budget_ratio``.
PAIR_LR_SCALINGS: dict = {"sqrt_budget": math.sqrt, "linear_budget": float, "none": lambda ratio: 1.0}


def pair_lr_factor(o) -> float:
    """The factor PAIR applies to ``learning_rate`` (``lr_scaling`` of ``budget_ratio``; ``o``: :data:`PAIROptions`)."""
    return float(PAIR_LR_SCALINGS[o.lr_scaling](float(o.budget_ratio)))


def validate_pair_options(o, args) -> None:
    """Reject PAIR options ``o`` (:data:`PAIROptions`) that cannot work with the TRL fields of ``args``, saying what
    to change. Raises ``ValueError``."""
    L = args.max_completion_length
    if L is None or int(L) < 2:
        raise ValueError(f"PAIR needs max_completion_length >= 2 (a prefix and a suffix), got {L}.")
    tau = pair_tau(o, int(L))
    if isinstance(o.prefix_tokens, bool) or tau < 1:
        raise ValueError(f"pair_prefix_tokens must be a positive int, got {o.prefix_tokens!r}.")
    if o.snap_window < 0:
        raise ValueError(f"pair_snap_window must be >= 0, got {o.snap_window}.")
    if tau + o.snap_window >= L:
        raise ValueError(
            f"pair_prefix_tokens (tau={tau}) + pair_snap_window ({o.snap_window}) must be < "
            f"max_completion_length ({L}): the probe would generate whole completions and there would be no suffix "
            "to save. Lower tau or raise max_completion_length."
        )
    pi_min = float(o.pi_min)
    if not (0.0 < pi_min <= 1.0):
        raise ValueError(f"pair_pi_min must be in (0, 1], got {pi_min}.")
    ratio = float(o.budget_ratio)
    if not (0.0 < ratio <= 1.0) or not math.isfinite(ratio):
        raise ValueError(f"pair_budget_ratio must be in (0, 1], got {ratio}.")
    if ratio < pi_min:
        raise ValueError(
            f"pair_budget_ratio={ratio} is below pair_pi_min={pi_min}: the budget ratio * predicted cost would be "
            "below pi_min * predicted cost, so no design satisfies both the floor and the budget (Proposition 2). "
            "Raise pair_budget_ratio or lower pair_pi_min."
        )
    if o.lr_scaling not in PAIR_LR_SCALINGS:
        raise ValueError(f"pair_lr_scaling must be one of {sorted(PAIR_LR_SCALINGS)}, got {o.lr_scaling!r}.")
    if o.edge_proxy != "disagreement":
        raise ValueError(f'pair_edge_proxy must be "disagreement" (Eq. 8), got {o.edge_proxy!r}.')
    if o.w_max is not None and (not math.isfinite(float(o.w_max)) or float(o.w_max) < 1):
        raise ValueError(f"pair_w_max must be None or a finite number >= 1, got {o.w_max}.")
    if int(o.solver_max_iter) < 1 or not float(o.solver_tol) > 0:
        raise ValueError("pair_solver_max_iter must be >= 1 and pair_solver_tol > 0.")
    for name in ("head_hidden", "head_min_labels", "head_batch_size", "summary_last_k"):
        if int(getattr(o, name)) < 1:
            raise ValueError(f"pair_{name} must be >= 1, got {getattr(o, name)}.")
    if int(o.head_fit_steps) < 0:
        raise ValueError(f"pair_head_fit_steps must be >= 0, got {o.head_fit_steps}.")
    if int(o.replay_size) < max(4, int(o.head_min_labels)):
        raise ValueError(f"pair_replay_size ({o.replay_size}) must be >= 4 and >= pair_head_min_labels "
                         f"({o.head_min_labels}), or the heads never leave warm-up.")
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
    if args.keyed_sampling:
        raise ValueError("keyed_sampling is not supported by PAIRTrainer: a PAIR rollout is generated in two calls "
                         "(probe, then continuation from prompt + prefix), which the keyed noise and trl-ext replay do "
                         "not model; set keyed_sampling=False.")
    if o.fixed_normalizer and args.loss_type not in (compat.SEQUENCE_LEVEL_LOSSES +
                                                             compat.GLOBAL_TOKEN_LEVEL_LOSSES):
        raise ValueError(f"pair_fixed_normalizer supports loss_type in "
                         f"{compat.SEQUENCE_LEVEL_LOSSES + compat.GLOBAL_TOKEN_LEVEL_LOSSES}, got {args.loss_type!r}. "
                         "Change loss_type or set pair_fixed_normalizer=False (then the normalizer is a ratio).")



def pair_design_options(o) -> dict:
    """Keyword arguments of :func:`trl_ext.estimators.pair.design_and_draw` from :data:`PAIROptions` (read at
    call time: ``budget_ratio``, ``pi_min``, ``anchor_pair``, ``max_iter``, ``tol``, ``kind``)."""
    return {"budget_ratio": float(o.budget_ratio), "pi_min": float(o.pi_min),
            "anchor_pair": bool(o.anchor_pair), "max_iter": int(o.solver_max_iter),
            "tol": float(o.solver_tol), "kind": o.edge_proxy}


def pair_advantage_options(o) -> dict:
    """Keyword arguments of :func:`trl_ext.estimators.pair.draw_advantages` from :data:`PAIROptions`: the
    biased Appendix B variants ``w_max``, ``self_normalize`` and ``standardize``."""
    return {"w_max": o.w_max, "self_normalize": bool(o.self_normalize),
            "standardize": bool(o.standardize)}


def pair_kwargs_options(kwargs: dict):
    """The :data:`PAIROptions` that ``rollout_strategy_kwargs`` (names without ``pair_``, e.g.
    ``{"budget_ratio": 0.5, "prefix_tokens": 16}``) describe for the ``"pair_prefix_probe"`` strategy selected by
    config. The optimizer's rate is ``learning_rate`` there, so ``lr_scaling`` is ``"none"`` (anything else is refused:
    set ``learning_rate`` to the rate you want, e.g. ``sqrt(budget_ratio)`` times GRPO's as a ``PAIRConfig`` does by
    default)."""
    if kwargs.get("lr_scaling", "none") != "none":
        raise ValueError(f"rollout_strategy='pair_prefix_probe' selected by config cannot rescale the optimizer "
                         f"(lr_scaling={kwargs['lr_scaling']!r}): drop lr_scaling and set learning_rate to the rate "
                         "you want, or pass args=PAIRConfig(...) (to PAIRTrainer or trl_ext.GRPOTrainer), which "
                         "rescales it.")
    return PAIROptions.from_kwargs({**kwargs, "lr_scaling": "none"})

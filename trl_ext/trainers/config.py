"""``ExtGRPOConfig``: :class:`trl.GRPOConfig` plus the trl_ext options, and the one rule for accepting configs.

* :class:`ExtGRPOConfig` -- every trl_ext option of the base trainer, one dataclass field each with its help text;
* :func:`as_config` -- which config classes a trainer accepts (upgrade a plain ``trl.GRPOConfig``, refuse a sibling
  method's config);
* :func:`validate_ext_config` -- the checks, each raising ``ValueError`` that says what to change.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

import trl

from ..estimators.baselines import (
    ESTIMATOR_USED_BY,
    estimator_min_group_size,
    estimator_side_inputs,
    get_advantage_estimator,
)
from . import _trl_compat as compat
from .rollouts import get_rollout_strategy, validate_dynamic_sampling

__all__ = ["ExtGRPOConfig", "MethodOptions", "as_config", "check_side_inputs", "method_options_class",
           "parse_kwargs_field", "resolved_rollout_strategy", "validate_ext_config"]


# ---------------------------------------------------------------------------------------------------------- config
@dataclass
class ExtGRPOConfig(trl.GRPOConfig):
    """:class:`trl.GRPOConfig` plus the trl_ext measurement options.

    Every trl_ext option is one dataclass field below; its ``help`` metadata documents it (the text
    ``HfArgumentParser`` shows on the command line, as in TRL's own configs), and ``docs/base_trainer.md`` describes
    them. Every new option is off (or purely additive) by default, so a default ``ExtGRPOConfig`` trains exactly
    like ``trl.GRPOConfig``. Which config classes a trainer accepts (one rule for every trl_ext trainer, see
    :func:`as_config`): its own config class or a subclass of it, or a plain ``trl.GRPOConfig`` or
    ``ExtGRPOConfig``, which is upgraded to the trainer's config class with that class's defaults for the fields it
    lacks. Anything else (another trainer's config class included) is a ``TypeError``.
    """

    advantage_estimator: str = field(
        default="grpo",
        metadata={"help": "Registered advantage estimator: grpo (TRL's advantages, bitwise, honouring scale_rewards "
                          "and multi_objective_aggregation; the default), dr_grpo (group mean, no std; use with "
                          "loss_type='dr_grpo'), rloo (leave-one-out), reinforce_pp (global batch mean and std; "
                          "accepts num_generations=1), james_stein (leave-one-out mean shrunk toward the other "
                          "prompts' mean), or a name registered with "
                          "trl_ext.estimators.register_advantage_estimator."},
    )
    advantage_estimator_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments of the advantage estimator (dict or JSON string), e.g. "
                          "{\"normalize\": true} for rloo."},
    )
    rollout_strategy: str | None = field(
        default=None,
        metadata={"help": "Registered rollout strategy (trl_ext.trainers.rollouts.register_rollout_strategy): "
                          "fixed_groups (TRL's num_generations rollouts per prompt), dynamic_sampling (DAPO), "
                          "value_table (BASIS, with advantage_estimator='basis'), v05_osla (V0.5, with 'v05'), "
                          "pair_prefix_probe (PAIR, with 'pair_draw'), or your own. None: dynamic_sampling when "
                          "dynamic_sampling=True, else fixed_groups. Method configs (V05GRPOConfig, BASISConfig, "
                          "PAIRConfig) set it, and advantage_estimator, to their method's."},
    )
    rollout_strategy_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments of the rollout strategy's from_trainer (dict or JSON string)."},
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "DAPO dynamic sampling (trl_ext.trainers.rollouts.DynamicSampling): drop groups whose "
                          "rewards are all equal and generate more prompts until the batch is full or "
                          "dynamic_sampling_max_rounds extra rounds ran."},
    )
    dynamic_sampling_max_rounds: int = field(
        default=3,
        metadata={"help": "Cap of extra generation rounds per generation batch (dynamic_sampling); each round is at "
                          "most as large as the missing groups."},
    )
    dynamic_sampling_std_atol: float = field(
        default=0.0,
        metadata={"help": "A group is dropped (dynamic_sampling) when max - min of its finite rewards is <= this."},
    )
    shared_prefix_rollouts: bool = field(
        default=False,
        metadata={"help": "Generate with trl_ext.measurement.shared_prefix.shared_prefix_generate: a prompt's "
                          "completions run as one generation while they agree and fork at the first differing "
                          "token (exactly independent sampling; with keyed_sampling the same tokens). "
                          "Transformers generation only (refused with use_vllm); sampling settings only "
                          "(temperature, top-k, top-p, min-p). Off by default so that the default run stays "
                          "bitwise equal to TRL (unkeyed, it draws the same law from a different random stream). "
                          "Recommended on for transformers generation with num_generations >= 4: measured 0.23-0.65 "
                          "of generate's wall time and 0.10-0.33 of its model forward tokens on "
                          "SmolLM2-135M-Instruct (CPU, G = 4-16, T = 0.7-1.0; the larger G, the lower); nothing to "
                          "share with one rollout per prompt (BASIS accepts it, saving 0). See "
                          "docs/shared_prefix.md."},
    )
    signal_only_denominator: bool = field(
        default=False,
        metadata={"help": "Divide the policy loss only by the sequences (sequence-level losses grpo, sapo, luspo, "
                          "dr_grpo) or tokens (token-level losses dapo, cispo, vespo, bnpo) of groups that carry a "
                          "nonzero advantage, instead of all of them (the paper's 'fair-accounting' configuration: a "
                          "tied group contributes no signal and is also dropped from the count it averages over). "
                          "The KL and entropy terms keep TRL's normalizers. For equal-size groups this equals "
                          "dividing by the number of live groups of per-group means. Off by default."},
    )
    tie_break_scorer_index: int | None = field(
        default=None,
        metadata={"help": "Index into reward_funcs of the scorer (any reward function or reward model). When set, "
                          "the other reward functions are checkers whose weighted sum is the grade, and the reward is "
                          "grade + tie_break_epsilon * within-class rank of the score (rank normalized to [0, 1] "
                          "inside each (group, grade) class), computed on the groups gathered across ranks."},
    )
    tie_break_epsilon: float = field(
        default=0.1,
        metadata={"help": "Tie-break blend weight (the paper's epsilon = 0.1; not GRPO's clipping epsilon). Must be "
                          "> 0 and below the smallest gap between distinct grades inside a group (checked at run "
                          "time), so the blend never overrules the checker."},
    )
    tie_break_confidence_scaling: bool = field(
        default=False,
        metadata={"help": "Multiply the advantages of every group the blend opened (checker-tied, scorer-separated) "
                          "by min(1, (max score - min score) / scorer_noise_floor): a group the scorer separated by "
                          "less than its own noise floor is shrunk proportionally instead of getting a full-strength "
                          "update. Requires scorer_noise_floor."},
    )
    scorer_noise_floor: float | None = field(
        default=None,
        metadata={"help": "The scorer's noise floor on its own scale (3 x the 95th percentile of per-item spread; "
                          "measure it with trl-ext noise-floor)."},
    )
    log_shut_gate: bool = field(
        default=True,
        metadata={"help": "Log the shut-gate diagnostics gate/tied_share, gate/tied_all_right_share, "
                          "gate/tied_all_wrong_share and gate/tied_correct_share every generation batch."},
    )
    gate_success_threshold: float = field(
        default=0.5,
        metadata={"help": "A rollout counts as correct for the shut gate when its reward (the grade under the "
                          "tie-break) is >= this."},
    )
    gate_atol: float = field(default=0.0, metadata={"help": "Tie tolerance of the shut gate (max - min <= gate_atol)."})
    log_rollout_metadata: bool = field(
        default=False,
        metadata={"help": "Add row_idx, group_id and the trainer's rollout_columns to the completions table."},
    )
    keyed_sampling: bool = field(
        default=False,
        metadata={"help": "Draw every rollout token with Gumbel noise hashed from (request key, sample index, "
                          "position) so each rollout regenerates byte-identically (transformers generation only; "
                          "see docs/replay.md)."},
    )
    keyed_sampling_seed: int | None = field(
        default=None, metadata={"help": "Run seed of the request keys (None: args.seed). Share it across runs "
                                        "that must draw identical noise."},
    )
    keyed_sampling_key_column: str | None = field(
        default=None, metadata={"help": "Dataset column with a stable question id for the keys (None: hash of "
                                        "the prompt text)."},
    )
    keyed_sampling_log: bool = field(
        default=True, metadata={"help": "With keyed_sampling, log every rollout with its key to "
                                        "<output_dir>/rollouts/rank<r>.jsonl (for trl-ext replay)."},
    )

    resume_config_changes: list[str] = field(
        default_factory=list,
        metadata={"help": "Fields allowed to differ from the configuration a resumed checkpoint was written with "
                          "(e.g. ['learning_rate']). Every checkpoint records the fields that change what training "
                          "means (learning rate and schedule, batch and group sizes, estimator and rollout strategy "
                          "with their options, loss type, sampling settings, value prior and table identity, reward "
                          "functions and weights, model and adapter identity, number of processes); a difference not "
                          "listed here is refused on resume with old and new values. Listed changes take effect from "
                          "the resumed step (a new learning_rate rescales the restored optimizer and schedule) and "
                          "are logged. See docs/bad_input.md."},
    )
    save_on_preemption: bool = field(
        default=True,
        metadata={"help": "On SIGTERM or SIGINT (what SLURM and Kubernetes send before preemption), finish the "
                          "current optimizer step, write a complete checkpoint, log why and exit with "
                          "preemption_exit_code; all ranks agree on the step. A second signal stops at once."},
    )
    preemption_exit_code: int | None = field(
        default=75,
        metadata={"help": "Exit code after a preemption checkpoint (75 = EX_TEMPFAIL, 'try again'; requeue on it). "
                          "None: train() returns instead and trainer.preempted is True."},
    )

    method_route: ClassVar[tuple[str, str] | None] = None
    """Method configs (V0.5, BASIS, PAIR): their ``(advantage_estimator, rollout_strategy)`` -- the defaults of those
    two fields in the method config, and the only values it accepts; the method's options are its prefixed fields.
    A method config is an ``ExtGRPOConfig`` with these defaults: any trl_ext trainer runs it the same way."""

    def __post_init__(self):
        self.advantage_estimator_kwargs = parse_kwargs_field(self.advantage_estimator_kwargs,
                                                             "advantage_estimator_kwargs")
        group_size = self.num_generations if isinstance(self.num_generations, int) else 2
        compat.validate_config_with_placeholder_group_size(self, super().__post_init__, group_size=group_size)
        validate_ext_config(self)

    def optimizer_lr_factor(self) -> tuple[float, str | None]:
        """The factor the trainer applies to ``learning_rate`` in the optimizer it builds, and why (``(1.0, None)``:
        TRL's rate; :class:`~trl_ext.trainers.pair.PAIRConfig` scales it by ``pair_lr_scaling``). An optimizer passed
        in through ``optimizers`` is never rescaled."""
        return 1.0, None

    def validate_method(self) -> None:
        """The rules of a method config's own fields (V0.5, BASIS and PAIR override it): run once per config object,
        by :func:`validate_ext_config` after the shared rules (a method selected by config has its
        ``rollout_strategy_kwargs`` checked by its strategy's ``validate_kwargs``). Raises ``ValueError``."""


def resolved_rollout_strategy(args: Any) -> str:
    """The rollout strategy name a config selects: ``rollout_strategy``, else ``"dynamic_sampling"`` when
    ``dynamic_sampling=True``, else ``"fixed_groups"`` (TRL's)."""
    name = args.rollout_strategy
    if name is not None:
        return str(name)
    return "dynamic_sampling" if args.dynamic_sampling else "fixed_groups"


def check_side_inputs(estimator: str, strategy_cls: type) -> None:
    """Refuse an estimator whose registered side inputs the strategy class does not provide (``ValueError``)."""
    needed = estimator_side_inputs(estimator)

    def offered(cls) -> set:
        return set(getattr(cls, "provides", ()))

    missing = sorted(set(needed) - offered(strategy_cls))
    if not missing:
        return
    from .rollouts import registered_rollout_strategies

    able = sorted(n for n, c in registered_rollout_strategies().items() if set(needed) <= offered(c))
    hint = f" It is served by {ESTIMATOR_USED_BY[estimator]}." if estimator in ESTIMATOR_USED_BY else ""
    choice = f"rollout_strategy in {able}" if able else "a rollout strategy that provides them"
    raise ValueError(
        f"advantage_estimator={estimator!r} needs side input(s) {missing} "
        f"({', '.join(f'{k}: ' + ('from its estimator_inputs' if needed[k] == 'strategy' else f'per {needed[k]}') for k in missing)}), which rollout strategy "
        f"{strategy_cls.name!r} does not provide.{hint} Pick {choice} (declare them in RolloutStrategy.provides), "
        "or another estimator."
    )


def estimator_keywords(name: str) -> set[str] | None:
    """The keyword options the estimator ``name`` takes beyond rewards, group ids and its side inputs (``None``: it
    takes ``**kwargs``, anything goes)."""
    import inspect

    params = inspect.signature(get_advantage_estimator(name)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    named = {n for n, p in params.items() if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                           inspect.Parameter.KEYWORD_ONLY)}
    return named - {"rewards", "group_ids"} - set(estimator_side_inputs(name))


def check_estimator_kwargs(estimator: str, kwargs: dict, strategy_cls: type) -> None:
    """Refuse, when the config is built, keyword arguments the estimator would reject at the first step with a raw
    ``TypeError``: unknown ``advantage_estimator_kwargs`` keys (close names suggested), and the options a rollout
    strategy hands over in its ``estimator_inputs`` (declared in :attr:`RolloutStrategy.provides`) to an
    estimator that does not take them (``rollout_strategy="v05_osla"`` with ``advantage_estimator="grpo"``)."""
    import difflib

    accepted = estimator_keywords(estimator)
    if accepted is None:
        return
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        hints = [f"{k!r} (did you mean {difflib.get_close_matches(k, sorted(accepted), n=1)[0]!r}?)"
                 if difflib.get_close_matches(k, sorted(accepted), n=1) else repr(k) for k in unknown]
        raise ValueError(f"advantage_estimator_kwargs has key(s) {', '.join(hints)} that advantage_estimator="
                         f"{estimator!r} does not take; it takes {sorted(accepted) or 'no options'}.")
    offered = set(getattr(strategy_cls, "provides", ()))
    passed = offered - set(estimator_side_inputs(estimator))
    extra = sorted(passed - accepted)
    if extra:
        from ..estimators.baselines import ADVANTAGE_ESTIMATORS

        def serves(n: str) -> bool:
            keywords = estimator_keywords(n)
            side = set(estimator_side_inputs(n))
            return side <= offered and (keywords is None or passed - side <= keywords)

        fits = sorted(n for n in ADVANTAGE_ESTIMATORS if serves(n))
        hint = f" It feeds advantage_estimator in {fits}." if fits else ""
        raise ValueError(f"rollout_strategy={strategy_cls.name!r} passes {extra} to the advantage estimator, which "
                         f"advantage_estimator={estimator!r} does not take.{hint} Set advantage_estimator to the "
                         "estimator the strategy serves, or pick another rollout strategy.")


@dataclass
class MethodOptions:
    """Base of a method's typed options (:func:`method_options_class`): the ``<prefix>*`` fields of its method config
    without the prefix, read from a method config (:meth:`from_config`) or parsed from ``rollout_strategy_kwargs``
    (:meth:`from_kwargs`, unknown keys refused). A strategy reads its options here and TRL's fields from the
    trainer's ``args``; the method config's fields stay the one definition (type, default, help)."""

    prefix: ClassVar[str] = ""
    config_class: ClassVar[type] = None
    strategy: ClassVar[str] = ""

    def __post_init__(self):
        # dict-valued options (``*_kwargs``) may come as JSON strings (command line): parsed once, here
        for f in fields(self):
            if f.name.endswith("_kwargs"):
                setattr(self, f.name, parse_kwargs_field(getattr(self, f.name), self.prefix + f.name))

    @classmethod
    def from_config(cls, config: Any):
        """The options a method config holds (its ``<prefix>*`` fields)."""
        return cls(**{f.name: getattr(config, cls.prefix + f.name) for f in fields(cls)})

    @classmethod
    def from_kwargs(cls, kwargs: dict):
        """The options ``rollout_strategy_kwargs`` name (without the prefix; the others keep the method config's
        defaults, the paper's). An unknown name is a ``ValueError`` listing the known ones."""
        known = sorted(f.name for f in fields(cls))
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise ValueError(f"rollout_strategy={cls.strategy!r} got unknown rollout_strategy_kwargs {unknown}; "
                             f"known: {known} (the {cls.config_class.__name__} fields without {cls.prefix!r}).")
        return cls(**kwargs)

    @classmethod
    def of(cls, config: Any, kwargs: dict):
        """The options of a trainer's config: its own fields when it is the method config, else ``kwargs``."""
        return cls.from_config(config) if isinstance(config, cls.config_class) else cls.from_kwargs(kwargs)


def method_options_class(config_class: type, prefix: str, strategy: str, name: str) -> type:
    """The :class:`MethodOptions` dataclass ``name`` of ``config_class``'s ``<prefix>*`` fields, prefix dropped
    (same types, defaults and help metadata), for the rollout strategy ``strategy``."""
    from dataclasses import make_dataclass

    specs = []
    for f in fields(config_class):
        if f.name.startswith(prefix):
            default = {"default": f.default} if f.default is not MISSING else {"default_factory": f.default_factory}
            specs.append((f.name[len(prefix):], f.type, field(metadata=f.metadata, **default)))
    cls = make_dataclass(name, specs, bases=(MethodOptions,), namespace={
        "prefix": prefix, "config_class": config_class, "strategy": strategy,
        "__doc__": f"The {config_class.__name__} options (fields without {prefix!r}) as the {strategy!r} rollout "
                   f"strategy reads them (:class:`~trl_ext.trainers.config.MethodOptions`)."})
    cls.__module__ = config_class.__module__
    return cls


def parse_kwargs_field(value: Any, name: str) -> dict:
    """A dict-valued config field given as a dict, a JSON object string (command line) or ``None``."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} must be a dict or a JSON object string, got {value!r}: {e}") from e
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict (or a JSON object string), got {type(value).__name__}.")
    return dict(value)


def as_config(args: Any, config_class: type, trainer_name: str):
    """Return ``args`` as an instance of ``config_class`` (the one rule every trl_ext trainer applies).

    What decides is the config's *library class*: the most derived trl_ext class in its MRO (``None`` for a plain
    ``trl.GRPOConfig`` or a user's own subclass of it).

    * no library class (``trl.GRPOConfig`` or a user's subclass of it, whose extra fields the user's script may
      read), or a library class that is a parent of ``config_class`` (the base :class:`ExtGRPOConfig`, or a user's
      subclass of it, given to a method trainer): upgraded, unless it already is a ``config_class`` -- a
      ``config_class`` object with the same attribute values (the user's extra fields included), the defaults of
      ``config_class`` for the fields it lacks, and ``config_class``'s own validation (TRL's ``__post_init__`` is
      not re-run: its derived fields are kept);
    * a ``config_class`` (the trainer's own config, a user's subclass of it, or a method config given to the base
      ``trl_ext.GRPOTrainer``, which runs the method's estimator and strategy exactly as the method's trainer):
      returned unchanged;
    * any other library class raises ``TypeError``: another trainer's method config (a ``V05GRPOConfig`` given to
      the PAIR trainer), whose method options would otherwise be silently ignored.
    """
    if not isinstance(args, trl.GRPOConfig):
        raise TypeError(f"{trainer_name} needs a {config_class.__name__} (or a trl.GRPOConfig), got "
                        f"{type(args).__name__}.")
    if isinstance(args, config_class):
        return args
    library = next((c for c in type(args).__mro__ if c.__module__.split(".")[0] == "trl_ext"), None)
    if library is not None and not issubclass(config_class, library):
        raise TypeError(
            f"{trainer_name} needs a {config_class.__name__}, got a {type(args).__name__} ({library.__name__}), "
            f"another trainer's config: its method options would be ignored. Pass args={config_class.__name__}(...) "
            "with the same arguments (a plain trl.GRPOConfig or ExtGRPOConfig is upgraded with its defaults), or "
            f"use the trainer that {library.__name__} belongs to."
        )
    new = object.__new__(config_class)
    new.__dict__.update(args.__dict__)
    for f in fields(config_class):
        if f.name in new.__dict__:
            continue
        if f.default is not MISSING:
            setattr(new, f.name, f.default)
        elif f.default_factory is not MISSING:
            setattr(new, f.name, f.default_factory())
    validate_ext_config(new)
    return new


def validate_ext_config(o) -> None:
    """Check the trl_ext fields of a config; raises ``ValueError`` saying what to change."""
    args = o
    o.advantage_estimator_kwargs = parse_kwargs_field(o.advantage_estimator_kwargs, "advantage_estimator_kwargs")
    o.rollout_strategy_kwargs = parse_kwargs_field(o.rollout_strategy_kwargs, "rollout_strategy_kwargs")
    route = getattr(o, "method_route", None)
    if route is not None:
        check_method_route(o, route)
    try:
        min_g = estimator_min_group_size(o.advantage_estimator)
    except KeyError as e:
        raise ValueError(f"advantage_estimator={o.advantage_estimator!r} is not registered: {e.args[0]}. Register it "
                         "with @trl_ext.estimators.register_advantage_estimator(name) before building the config."
                         ) from None
    strategy = resolved_rollout_strategy(o)
    try:
        strategy_cls = get_rollout_strategy(strategy)
    except KeyError as e:
        raise ValueError(f"rollout_strategy={strategy!r} is not registered: {e.args[0]}. Register it with "
                         "@trl_ext.trainers.rollouts.register_rollout_strategy(name) before building the config."
                         ) from None
    check_side_inputs(o.advantage_estimator, strategy_cls)
    check_estimator_kwargs(o.advantage_estimator, o.advantage_estimator_kwargs, strategy_cls)
    if route is None:  # a method config's options are its own fields (its validate_method checks them)
        strategy_cls.validate_kwargs(o.rollout_strategy_kwargs, o)
    if o.dynamic_sampling and strategy != "dynamic_sampling":  # the one rule (method configs included)
        fix = "set dynamic_sampling=False" if route else "set one of them"
        raise ValueError(f"dynamic_sampling=True selects DAPO's dynamic_sampling rollout strategy, but this "
                         f"{type(o).__name__} uses rollout strategy {strategy!r}; {fix}.")
    g = o.num_generations
    if isinstance(g, int) and g < min_g and route is None:
        raise ValueError(f"advantage_estimator={o.advantage_estimator!r} needs num_generations >= {min_g} (it has a "
                         f"per-prompt baseline), got {g}. Raise num_generations or pick an estimator with a "
                         "cross-prompt baseline (reinforce_pp).")
    validate_dynamic_sampling(o)
    if o.shared_prefix_rollouts:
        if o.use_vllm:
            raise ValueError(
                "shared_prefix_rollouts=True is implemented for transformers generation only (use_vllm=False). vLLM "
                "already shares each prompt's KV cache between its samples (prefix caching, n>1 sampling) but does not "
                "expose running samples together until their first differing token. Set use_vllm=False or "
                "shared_prefix_rollouts=False."
            )
        if o.use_transformers_continuous_batching:
            raise ValueError("shared_prefix_rollouts=True replaces transformers' generate loop and cannot be combined "
                             "with use_transformers_continuous_batching; turn one of them off.")
    if o.dynamic_sampling and isinstance(g, int) and g < 2:
        raise ValueError("dynamic_sampling drops groups whose rewards are all equal, which needs num_generations >= 2; "
                         f"got {g}.")
    if o.signal_only_denominator and args.loss_type not in compat.SIGNAL_ONLY_LOSSES:
        raise ValueError(
            f"signal_only_denominator supports loss_type in {compat.SIGNAL_ONLY_LOSSES}, got {args.loss_type!r}. "
            "Use one of those loss types or set signal_only_denominator=False."
        )
    if o.tie_break_scorer_index is not None:
        if isinstance(o.tie_break_scorer_index, bool) or not isinstance(o.tie_break_scorer_index, int) \
                or o.tie_break_scorer_index < 0:
            raise ValueError(
                f"tie_break_scorer_index must be a non-negative int (index into reward_funcs), got "
                f"{o.tie_break_scorer_index!r}."
            )
        if args.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "The tie-break blend needs multi_objective_aggregation='sum_then_normalize' (the blend is the summed "
                "reward); 'normalize_then_sum' would standardize the scorer and checkers separately."
            )
    if not (isinstance(o.tie_break_epsilon, int | float) and math.isfinite(o.tie_break_epsilon)
            and o.tie_break_epsilon > 0):
        raise ValueError(f"tie_break_epsilon must be a finite number > 0, got {o.tie_break_epsilon!r}.")
    if o.scorer_noise_floor is not None and not (
        isinstance(o.scorer_noise_floor, int | float) and math.isfinite(o.scorer_noise_floor)
        and o.scorer_noise_floor > 0
    ):
        raise ValueError(f"scorer_noise_floor must be a finite number > 0 (or None), got {o.scorer_noise_floor!r}.")
    if o.tie_break_confidence_scaling:
        if o.tie_break_scorer_index is None:
            raise ValueError("tie_break_confidence_scaling=True needs tie_break_scorer_index (the blend) to be set.")
        if o.scorer_noise_floor is None:
            raise ValueError(
                "tie_break_confidence_scaling=True needs scorer_noise_floor (measure it with `trl-ext noise-floor`)."
            )
    _validate_resume_options(o)
    if not math.isfinite(float(o.gate_success_threshold)):
        raise ValueError(f"gate_success_threshold must be finite, got {o.gate_success_threshold!r}.")
    if not (math.isfinite(float(o.gate_atol)) and o.gate_atol >= 0):
        raise ValueError(f"gate_atol must be a finite number >= 0, got {o.gate_atol!r}.")
    o.validate_method()


def check_method_route(o, route: tuple[str, str]) -> None:
    """A method config trains with its own estimator and strategy (``method_route``), configured by its prefixed
    fields: unset ones take the route (their ``ExtGRPOConfig`` defaults ``"grpo"`` / ``None`` mean "the method's"),
    anything else is a ``ValueError`` naming the route and ``ExtGRPOConfig`` for other combinations."""
    estimator, strategy = route
    if o.advantage_estimator == "grpo" and not o.advantage_estimator_kwargs:
        o.advantage_estimator = estimator
    if o.rollout_strategy is None and not o.rollout_strategy_kwargs:
        o.rollout_strategy = strategy
    if (o.advantage_estimator, o.rollout_strategy) != route or o.advantage_estimator_kwargs \
            or o.rollout_strategy_kwargs:
        raise ValueError(
            f"{type(o).__name__} trains with advantage_estimator={estimator!r} and rollout_strategy={strategy!r}, "
            f"configured by its own fields; got advantage_estimator={o.advantage_estimator!r} "
            f"(kwargs {o.advantage_estimator_kwargs}), rollout_strategy={o.rollout_strategy!r} (kwargs "
            f"{o.rollout_strategy_kwargs}). Leave those four fields unset, or use ExtGRPOConfig to combine another "
            "estimator or strategy.")


def _validate_resume_options(o) -> None:
    import difflib

    from ..checkpoints.resume import fingerprint_field_names

    changes = o.resume_config_changes
    if changes is None:
        changes = []
    if isinstance(changes, str):  # a single name or a JSON list given as text
        changes = json.loads(changes) if changes.strip().startswith("[") else [c for c in changes.split(",") if c]
    if not isinstance(changes, list | tuple) or not all(isinstance(c, str) for c in changes):
        raise ValueError(f"resume_config_changes must be a list of field names, got {o.resume_config_changes!r}.")
    known = fingerprint_field_names(type(o))
    for name in changes:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            raise ValueError(f"resume_config_changes names {name!r}, which a checkpoint does not record"
                             + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else "")
                             + f". Recorded fields: {sorted(known)}.")
    o.resume_config_changes = list(changes)
    code = o.preemption_exit_code
    if code is not None and (isinstance(code, bool) or not isinstance(code, int) or not 0 < code < 256):
        raise ValueError(f"preemption_exit_code must be an int in 1..255 (or None), got {code!r}.")


def accept_renamed_fields(cls: type, renames: dict[str, str]) -> type:
    """Let ``cls(...)`` take the old names of renamed fields for one minor release: each is mapped to its new name
    with a ``FutureWarning`` naming both (``docs/migrating.md`` lists them); old and new together is a
    ``ValueError``. Returns ``cls`` (its dataclass ``__init__`` wrapped; ``dataclasses.fields`` and the command-line
    parser see the new names only)."""
    import functools
    import warnings

    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        for old, new in renames.items():
            if old not in kwargs:
                continue
            if new in kwargs:
                raise ValueError(f"{cls.__name__} got both {old!r} (its old name) and {new!r}; pass {new!r} only.")
            warnings.warn(f"{cls.__name__}({old}=...) is deprecated: the field is now {new!r} (method options carry "
                          "their method's prefix). The old name is accepted until the next minor release; see "
                          "docs/migrating.md.", FutureWarning, stacklevel=2)
            kwargs[new] = kwargs.pop(old)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    cls.renamed_fields = dict(renames)
    return cls


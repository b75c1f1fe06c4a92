"""Trainer callbacks of a benchmark run: the token budget (:class:`TokenBudgetCallback`, the one stopping rule) and
the per-step trace (:class:`UpdateNormCallback`, :func:`step_trace`, :func:`load_trace`)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

from trl_ext._io import read_json

from .presets import TOKEN_METRIC


def _trainer_callback_base():
    try:
        from transformers import TrainerCallback
    except ImportError:  # pragma: no cover - transformers is a hard dependency of the package
        return object
    return TrainerCallback


class TokenBudgetCallback(_trainer_callback_base()):
    """Stop training once the cumulative generated tokens reach ``budget``; fire checkpoints on the way.

    Reads :data:`TOKEN_METRIC` (``ext/generated_tokens_total``, the cumulative count of every generated token that
    ``trl_ext.GRPOTrainer`` logs for every trainer and rollout strategy) from ``logs``; no other metric is read.
    Each time the count crosses the next entry of ``checkpoints`` (sorted; the budget itself is always the last one),
    ``on_checkpoint(nominal, tokens, state)`` is called once per crossed nominal checkpoint with the actual count;
    crossing the budget sets ``control.should_training_stop`` so the run ends after the current step (overshoot
    < one generation batch).

    Parameters
    ----------
    budget : float
        Generated-token budget, > 0.
    checkpoints : sequence of float, optional
        Evaluation points in tokens, each in ``(0, budget]``; ``budget`` is added if missing.
    on_checkpoint : callable, optional
        ``on_checkpoint(nominal: float, tokens: float, state: TrainerState) -> None``.

    Attributes
    ----------
    metric : str
        :data:`TOKEN_METRIC`.
    tokens : float
        Current generated-token count (0 before the first log that has the metric).
    seen : bool
        Whether the metric was logged at least once.
    reached : bool
        Whether the budget was reached.
    fired : list of (nominal, tokens)
        Checkpoints fired so far.

    Raises
    ------
    ValueError
        Non-positive/NaN budget, checkpoints outside ``(0, budget]``.
    RuntimeError
        A logged count that is negative, not finite or lower than the previous one; or a training log (one with
        ``loss``) before the metric was ever logged: the trainer does not report generated tokens and the budget
        cannot be enforced (raised at the first step instead of training on to ``max_steps``).
    """

    metric = TOKEN_METRIC

    def __init__(self, budget: float, checkpoints: Sequence[float] = (), on_checkpoint: Callable | None = None):
        if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not math.isfinite(budget) \
                or budget <= 0:
            raise ValueError(f"budget must be a finite number of tokens > 0, got {budget!r}")
        cps = sorted({float(c) for c in checkpoints} | {float(budget)})
        bad = [c for c in cps if not (0 < c <= budget)]
        if bad:
            raise ValueError(f"checkpoints must lie in (0, budget={budget}]; got {bad}")
        self.budget = float(budget)
        self.checkpoints = cps
        self.on_checkpoint = on_checkpoint
        self.tokens = 0.0
        self.seen = False
        self.reached = False
        self.fired: list[tuple[float, float]] = []

    def _next(self) -> float | None:
        return self.checkpoints[len(self.fired)] if len(self.fired) < len(self.checkpoints) else None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return control
        if self.metric not in logs:
            if "loss" in logs and not self.seen:
                raise RuntimeError(
                    f"training log at step {getattr(state, 'global_step', '?')} without {self.metric}: the trainer "
                    "does not report generated tokens, so the token budget cannot be enforced. Use a trl_ext "
                    f"trainer (every trl_ext.GRPOTrainer subclass logs {self.metric}) with logging_steps=1."
                )
            return control
        value = float(logs[self.metric])
        if not math.isfinite(value) or value < 0:
            raise RuntimeError(f"logged {self.metric} = {value}: a generated-token count must be finite and >= 0")
        if value < self.tokens:
            raise RuntimeError(f"logged {self.metric} decreased from {self.tokens} to {value}: expected a cumulative "
                               "count")
        self.seen = True
        self.tokens = value
        nxt = self._next()
        while nxt is not None and value >= nxt:
            self.fired.append((nxt, value))
            if self.on_checkpoint is not None:
                self.on_checkpoint(nxt, value, state)
            nxt = self._next()
        if value >= self.budget:
            self.reached = True
            control.should_training_stop = True
        return control


#: A run's per-step trace, next to its result.json (deterministic gzip JSON); the record's ``trace`` names it.
TRACE_FILE = "trace.json.gz"
#: Per-step metrics kept in a run's ``trace`` (what the step decided and how large it was).
TRACE_KEYS = ("reward", "grad_norm", "adv/abs_mean", "adv/abs_max", "ext/generated_tokens", "ext/rollouts",
              "pair/completed_per_group", "pair/ess_mean", "pair/pi_min", "pair/pi_mean", "pair/max_weight",
              "pair/finished_in_prefix", "pair/head_brier",
              # the mechanism diagnostics of the regime benchmark: tied groups, V0.5's allocation, DAPO's filter,
              # BASIS's beta and baseline error, the shrinkage weight, PAIR's heads
              "frac_reward_zero_std", "gate/tied_share", "gate/tied_all_wrong_share", "gate/tied_all_right_share",
              "ext/signal_row_frac", "v05/rollouts_per_prompt_mean", "v05/rollouts_per_prompt_max",
              "v05/extra_rollouts", "v05/rounds", "v05/prior_brier", "v05/rejection_rate", "v05/mean_weight",
              "dapo/keep_rate", "dapo/rounds", "dapo/batch_fill", "basis/beta", "basis/mean_sq_advantage",
              "basis/mean_baseline", "adv/js_lambda", "adv/js_v2", "adv/js_s2", "pair/head_auc", "pair/head_labels",
              "pair/warmup", "pair/tokens_saved_vs_full_group")


class UpdateNormCallback(_trainer_callback_base()):
    """Records ``||theta_t - theta_{t-1}||_2`` over the trainable parameters after every optimizer step."""

    def __init__(self):
        self.norms: dict[int, float] = {}
        self._prev = None

    @staticmethod
    def _flat(model):
        import torch

        return torch.cat([p.detach().float().reshape(-1).clone() for p in model.parameters() if p.requires_grad])

    def on_train_begin(self, args, state, control, model=None, **kw):
        self._prev = self._flat(model)

    def on_step_end(self, args, state, control, model=None, **kw):
        cur = self._flat(model)
        self.norms[int(state.global_step)] = float((cur - self._prev).norm())
        self._prev = cur


def step_trace(logs: Sequence[dict], update_norms: dict | None = None) -> list[dict]:
    """One record per logged training step: ``step``, the :data:`TRACE_KEYS` present, and ``update_norm``."""
    out = []
    for h in logs:
        rec = {"step": int(h.get("step", 0))}
        rec.update({k: float(h[k]) for k in TRACE_KEYS if isinstance(h.get(k), (int, float))})
        if update_norms and rec["step"] in update_norms:
            rec["update_norm"] = update_norms[rec["step"]]
        out.append(rec)
    return out


def load_trace(rec: dict, base: str) -> list[dict] | None:
    """A run record's per-step trace (``None`` when it has none, e.g. a failed run).

    ``rec["trace"]`` is the list itself (result.json of runs written before traces moved out), or a path relative to
    ``base`` (the output dir) of the ``trace.json.gz`` or of the result.json that holds the list inline (old runs in
    a runs.json). ``base`` may also be the run's own folder: the file name alone is then looked up there.
    """
    ref = rec.get("trace")
    if ref is None or isinstance(ref, list):
        return ref
    path = os.path.join(base, ref)
    if not os.path.exists(path) and os.path.exists(os.path.join(base, os.path.basename(ref))):
        path = os.path.join(base, os.path.basename(ref))
    data = read_json(path)
    if isinstance(data, dict):  # a result.json with the trace inline
        data = data.get("trace")
    if not isinstance(data, list):
        raise ValueError(f"{path} holds no per-step trace list")
    return data


def _trace_by_reference(rec: dict, res_path: str, out_dir: str) -> dict:
    """``rec`` read from ``res_path``, with an inline trace (a run written before traces moved to trace.json.gz)
    replaced by the path of that result.json relative to ``out_dir``, so runs.json never embeds a trace."""
    if isinstance(rec.get("trace"), list):
        rec["trace"] = os.path.relpath(res_path, out_dir)
    return rec

"""V0.5 GRPO: value-prior shrinkage fusion with Sequential OSLA rollout allocation, as a TRL 1.16 trainer.

Source: ``/work/shared/papers/v05_value_prior_osla.txt`` -- "End-to-End Implementation Workflow" (Section 4.1.3,
Steps 1-5), "Empirical Shrinkage Fusion" (Eq. 6-9) and "Sequential OSLA Allocation" (Theorem 3.6, Appendix A.8).
The math lives in :mod:`trl_ext.estimators.v05`; this module only wires it into TRL's generation loop.

Per generation batch (train mode; every rank holds ``per_device_train_batch_size * steps_per_generation``
**unique** prompts):

1. **Prior** (Step 1): sample a context of ``context_size`` (prompt, success) pairs from the global
   :class:`~trl_ext.priors.SupportBuffer` (identical on every rank, seeded by ``(seed, generation index)``) and query
   the prior once per prompt: ``p in [0, 1]``, ``V = 2p - 1``. Cold start: an empty buffer gives an empty context and
   each prior's documented empty-context answer (embedding prior: ``p = 0.5``, i.e. ``V = 0``).
2. **Cold start allocation** (Step 2): ``k_init`` (4) rollouts per prompt, scored locally, rewards mapped from
   ``[reward_low, reward_high]`` to ``[-1, 1]``.
3. **Test + OSLA rounds** (Steps 3-4): a prompt needs more while ``k < 1/sqrt(c) - 1/bias2`` and
   ``k < round(1/sqrt(c))`` (16 for ``c = 0.0039``); those get ``k_step`` (2) more rollouts per round. The need
   flags are gathered over ranks; the whole batch stops when fewer than ``global_stop_fraction`` (25%) of its
   prompts still need rollouts. Every rank therefore runs the same number of rounds.
4. **Fusion + advantages** (Step 5): ``A_i = (r_i - mu*) / sigma*`` with the fused baseline of Eq. 9 computed by
   :func:`trl_ext.estimators.fused_advantages_batch` on the gathered groups; the rollouts go through TRL's loss via
   :meth:`trl_ext.GRPOTrainer._finish_rollouts` (pad rows masked out of the loss and the token normalizer).
5. **Support buffer**: one pair per scorable prompt, success ``(vbar + 1) / 2``, added in global order on every
   rank and saved in every checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from ..estimators.v05 import (
    DEFAULT_SIGMA_FLOOR,
    V05_K_INIT,
    V05_PAPER_COST,
    fused_advantages_batch,
    osla_cap,
    osla_need_more,
    osla_should_stop,
    shrinkage_fusion_batch,
)
from ..priors import SupportBuffer, ValuePrior, build_prior
from . import _trl_compat as compat
from .base import ExtGRPOConfig, GRPOTrainer
from .batch import RolloutBatch

__all__ = ["V05GRPOConfig", "V05GRPOTrainer", "V05_SUPPORTED_LOSS_TYPES"]

V05_SUPPORTED_LOSS_TYPES = ("dapo", "cispo", "vespo")
"""Loss types whose normalizer stays exact with variable group sizes and per-rank pad rows.

They divide the summed per-token loss by the *global* count of loss-mask tokens (``num_items_in_batch``), which
``_finish_rollouts`` recomputes after masking pad rows: every real token gets the same weight whatever the group
size or the number of pad rows on its rank. The sequence-level losses (``grpo``, ``sapo``, ``luspo``) average over
the local rows *including* pad rows and ``dr_grpo`` divides by ``local rows x max_completion_length``, so a rank
padded with many pad rows would get its gradient shrunk; ``bnpo`` normalizes by the local micro-batch tokens, so
DDP's equal-weight rank average over-weights tokens on ranks with fewer of them. Those are rejected unless
``allow_unsupported_loss_type=True``.
"""


def _parse_kwargs(value: Any, name: str) -> dict:
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


# ---------------------------------------------------------------------------------------------------------- config
@dataclass
class V05GRPOConfig(ExtGRPOConfig):
    """:class:`~trl_ext.trainers.base.ExtGRPOConfig` plus the V0.5 options; defaults reproduce the paper.

    ``per_device_train_batch_size`` counts **unique prompts** per rank (the sampler yields each prompt once;
    the rollouts per prompt are chosen by OSLA). ``num_generations`` is not used in training; it is only the group
    size of evaluation (``num_generations_eval`` defaults to it) and need not divide the generation batch (TRL's
    check is run with a placeholder when it does not). Its default here is 2.

    Parameters
    ----------
    k_init : int, default 4
        Rollouts per prompt before the first test (Workflow Step 2). Values below 4 are rejected unless
        ``allow_small_k_init=True``: Appendix A.8 shows the test rejects good priors too often for k < 4
        (``1/sqrt(k) >= 2/k`` needs ``k >= 4``).
    k_step : int, default 2
        Rollouts added per OSLA round to each prompt that still needs more (Step 4).
    rollout_cost : float, default 0.0039
        Marginal cost ``c`` of one rollout; the cap is ``round(1/sqrt(c))`` (16) and Theorem 3.6's target
        ``1/sqrt(c) - 1/bias2``. Must leave ``cap >= k_init``.
    global_stop_fraction : float in [0, 1], default 0.25
        Stop the rounds for the whole batch (all ranks) when fewer than this fraction of its prompts still need
        rollouts. 0 disables the early stop (rounds run until no prompt needs more).
    dispatch_multiple : int >= 1, default 1
        Pad each generation dispatch (per rank, per round) to a multiple of this (the paper pads to 32 for
        tensor-parallel generation). The extra rollouts go round-robin to the prompts of that dispatch (never past
        the cap), so a prompt may end slightly above its target; slots no prompt can take are generated and
        discarded (``v05/discarded_rollouts``). When generation is a collective (see the trainer's Notes) every
        rank also pads its dispatch to the longest one across ranks; those equalizing rows are discarded too, so
        per-prompt decisions do not depend on how prompts are spread over ranks (with ``dispatch_multiple=1``).
    buffer_capacity, context_size : int, default 512, 256
        Support buffer capacity and context size (Workflow Step 1).
    value_prior : str, default "embedding"
        Prior kind for :func:`trl_ext.priors.build_prior` when the trainer gets no ``prior=`` object:
        ``"embedding"`` (frozen mean-pooled copy of the starting policy + in-context kernel head, the paper's
        V0-style default), ``"constant"``, ``"table"`` (needs ``value_prior_kwargs={"table": path}``);
        ``"callable"`` needs a ``prior=`` object.
    value_prior_kwargs : dict or JSON str, optional
        Constructor options of the prior (for ``"embedding"`` these go to ``EmbeddingInContextPrior``, plus
        ``embed_batch_size`` / ``embed_max_length`` for :func:`~trl_ext.priors.hf_mean_pool_embedder`).
    reward_low, reward_high : float, default 0.0, 1.0
        Declared range of the weighted summed reward. Rewards are mapped linearly to ``[-1, 1]``:
        ``r' = 2 (r - low) / (high - low) - 1`` ({0, 1} checker -> {-1, 1}; use ``-1, 1`` for rewards already on the
        paper's scale; any bounded non-binary reward is mapped the same way, which keeps Eq. 6's variance bound
        ``1/k`` valid). A finite reward outside the range raises ``ValueError``.
    sigma_floor : float in (0, 1], default 0.2
        Floor of ``sigma* = sqrt(1 - mu*^2)`` in the advantage (see :func:`~trl_ext.estimators.fused_advantages`).
    allow_small_k_init : bool, default False
        Accept ``k_init < 4`` (for ablations).
    allow_unsupported_loss_type : bool, default False
        Accept a ``loss_type`` outside :data:`V05_SUPPORTED_LOSS_TYPES` (with a warning).
    check_buffer_sync : bool, default True
        With several processes, compare the support-buffer fingerprints of all ranks after each update and raise
        if they differ.
    """

    num_generations: int | None = field(
        default=2, metadata={"help": "Unused in V0.5 training (OSLA chooses k); must divide the generation batch; "
                                     "group size for evaluation."},
    )
    k_init: int = field(default=V05_K_INIT, metadata={"help": "Rollouts per prompt before the first test (paper: 4)."})
    k_step: int = field(default=2, metadata={"help": "Rollouts added per OSLA round (paper: 2)."})
    rollout_cost: float = field(default=V05_PAPER_COST,
                                metadata={"help": "Marginal rollout cost c; cap = round(1/sqrt(c)) (paper: 0.0039)."})
    global_stop_fraction: float = field(
        default=0.25, metadata={"help": "Stop the rounds when fewer than this share of prompts need more (0 = off)."}
    )
    dispatch_multiple: int = field(default=1, metadata={"help": "Pad each dispatch to a multiple of this (paper: 32)."})
    buffer_capacity: int = field(default=512, metadata={"help": "Support buffer capacity (paper: 512)."})
    context_size: int = field(default=256, metadata={"help": "Context pairs sampled per step (paper: 256)."})
    value_prior: str = field(
        default="embedding", metadata={"help": "Prior kind: embedding, constant, table (callable: pass prior=)."}
    )
    value_prior_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Options of the prior (dict or JSON string)."}
    )
    reward_low: float = field(default=0.0, metadata={"help": "Lower end of the declared reward range."})
    reward_high: float = field(default=1.0, metadata={"help": "Upper end of the declared reward range."})
    sigma_floor: float = field(default=DEFAULT_SIGMA_FLOOR, metadata={"help": "Floor of sigma* in the advantage."})
    allow_small_k_init: bool = field(default=False, metadata={"help": "Accept k_init < 4 (ablations only)."})
    allow_unsupported_loss_type: bool = field(
        default=False, metadata={"help": "Accept loss types whose normalizer is biased by pad rows."}
    )
    check_buffer_sync: bool = field(default=True, metadata={"help": "Assert equal support buffers on all ranks."})

    def __post_init__(self):
        # TRL's check generation_batch_size % num_generations == 0 (GC 1131) assumes G-fold repeated prompts; here
        # the generation batch counts unique prompts and num_generations is only the eval group size, so when it
        # does not divide the batch, validate with a placeholder that does and restore it (as BASISConfig does).
        g, eval_g = self.num_generations, self.num_generations_eval
        placeholder = _unique_prompt_placeholder(self)
        if placeholder is not None:
            self.num_generations, self.num_generations_eval = placeholder, eval_g or g
        try:
            super().__post_init__()
        finally:
            self.num_generations = g
        self.value_prior_kwargs = _parse_kwargs(self.value_prior_kwargs, "value_prior_kwargs")
        validate_v05_config(self)


def _unique_prompt_placeholder(cfg) -> int | None:
    """A ``num_generations`` >= 2 dividing the unique-prompt generation batch, or None if ``cfg``'s already does."""
    g = cfg.num_generations
    if not _is_int(g) or g < 1:
        return None  # TRL reports it
    if cfg.generation_batch_size is not None:
        known = int(cfg.generation_batch_size)
    else:
        spg = cfg.steps_per_generation if cfg.steps_per_generation is not None else cfg.gradient_accumulation_steps
        known = int(cfg.per_device_train_batch_size) * int(spg)  # divides per_device * world * spg
    if known % g == 0 and g >= 2:
        return None
    if known < 2:
        known *= int(os.environ.get("WORLD_SIZE", "1") or 1)
    if known < 2:
        raise ValueError(
            f"V05GRPOConfig: the generation batch holds {known} unique prompt; TRL needs at least 2 rows per "
            "generation batch. Raise per_device_train_batch_size, steps_per_generation or generation_batch_size."
        )
    return known


def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def validate_v05_config(args: Any) -> None:
    """Check the V0.5 fields of ``args``; raises ``ValueError`` saying what to change."""
    if not _is_int(args.k_step) or args.k_step < 1:
        raise ValueError(f"k_step must be an int >= 1, got {args.k_step!r}.")
    if not _is_int(args.k_init) or args.k_init < 1:
        raise ValueError(f"k_init must be an int >= 1, got {args.k_init!r}.")
    if args.k_init < V05_K_INIT and not args.allow_small_k_init:
        raise ValueError(
            f"k_init={args.k_init} < 4: the paper's Appendix A.8 shows the bias test over-rejects below 4 rollouts "
            "(1/sqrt(k) >= 2/k needs k >= 4). Use k_init >= 4, or set allow_small_k_init=True for an ablation."
        )
    c = args.rollout_cost
    if not (isinstance(c, int | float) and math.isfinite(c) and c > 0):
        raise ValueError(f"rollout_cost must be a finite number > 0, got {c!r}.")
    cap = osla_cap(c)
    if cap < args.k_init:
        raise ValueError(f"rollout_cost={c} gives cap round(1/sqrt(c))={cap} < k_init={args.k_init}; lower the cost "
                         f"(cap >= k_init needs c <= {1.0 / (args.k_init - 0.5) ** 2:.6g}) or lower k_init.")
    f = args.global_stop_fraction
    if not (isinstance(f, int | float) and 0.0 <= f <= 1.0):
        raise ValueError(f"global_stop_fraction must be in [0, 1] (0 disables the early stop), got {f!r}.")
    if not _is_int(args.dispatch_multiple) or args.dispatch_multiple < 1:
        raise ValueError(f"dispatch_multiple must be an int >= 1, got {args.dispatch_multiple!r}.")
    for name in ("buffer_capacity", "context_size"):
        v = getattr(args, name)
        if not _is_int(v) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}.")
    lo, hi = args.reward_low, args.reward_high
    if not all(isinstance(x, int | float) and math.isfinite(x) for x in (lo, hi)) or hi <= lo:
        raise ValueError(f"need finite reward_low < reward_high, got reward_low={lo!r}, reward_high={hi!r}.")
    s = args.sigma_floor
    if not (isinstance(s, int | float) and 0.0 < s <= 1.0):
        raise ValueError(f"sigma_floor must be in (0, 1], got {s!r}.")
    if not isinstance(args.value_prior, str) or not args.value_prior:
        raise ValueError(f"value_prior must be a prior kind string, got {args.value_prior!r}.")
    if args.loss_type not in V05_SUPPORTED_LOSS_TYPES:
        msg = (f"loss_type={args.loss_type!r} is biased by the pad rows that equalize variable rollout counts across "
               f"ranks (see trl_ext.trainers.v05.V05_SUPPORTED_LOSS_TYPES); supported: {V05_SUPPORTED_LOSS_TYPES}.")
        if not args.allow_unsupported_loss_type:
            raise ValueError(msg + " Use one of them or set allow_unsupported_loss_type=True.")
        warnings.warn(msg, UserWarning, stacklevel=3)
    if getattr(args, "tie_break_scorer_index", None) is not None:
        raise ValueError("The tie-break blend (tie_break_scorer_index) is not supported by V05GRPOTrainer: the fusion "
                         "needs rewards on a declared bounded range. Unset tie_break_scorer_index.")


# ---------------------------------------------------------------------------------------------------------- trainer
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


class V05GRPOTrainer(GRPOTrainer):
    """Drop-in GRPO trainer running V0.5 (value prior + Sequential OSLA + shrinkage-fused advantages).

    Parameters
    ----------
    model, reward_funcs, args, train_dataset, eval_dataset, **kwargs
        As :class:`trl.GRPOTrainer`; ``args`` should be a :class:`V05GRPOConfig` (a plain config gets the
        V0.5 defaults).
    prior : ValuePrior, optional
        The value prior; default: built from ``args.value_prior`` / ``args.value_prior_kwargs``. The
        ``"embedding"`` default embeds prompts with a frozen deep copy of the **starting** policy
        (:func:`~trl_ext.priors.hf_mean_pool_embedder`); under DeepSpeed ZeRO-3 / FSDP pass a prior with its own
        embedding model.

    Attributes
    ----------
    support_buffer : SupportBuffer
        The global (prompt, success) FIFO; saved in ``trl_ext_state.pt`` of every checkpoint.
    last_v05 : dict or None
        Global record of the latest train generation batch (identical on every rank): ``row_idx``, ``prompts``,
        ``prior_p``, ``k`` (final rollouts per prompt), ``rejected_at_init``, ``bias2``, ``weight``, ``baseline``,
        ``scorable``, ``rounds``, ``early_stop``, ``need_history`` (global need fraction before each round),
        ``context_size``, ``buffer_fingerprint``.

    Notes
    -----
    Generation backends: TRL's transformers path and its vLLM paths. Each dispatch goes through
    :meth:`~trl_ext.GRPOTrainer._generate_completion_ids` (``_generate_single_turn``, one completion per row); with
    vLLM the sampling log-probs of every rollout are kept next to its completion ids through all rounds and handed
    to ``_finish_rollouts`` in the same order, so TRL's importance-sampling correction sees aligned log-probs. When
    generation is a collective (vLLM server, vLLM colocate with tensor parallelism, DeepSpeed, FSDP) every rank
    dispatches the same number of rows in every round (padded with discarded rollouts); otherwise a rank with no
    active prompt skips the round.
    """

    unique_prompt_sampler: ClassVar[bool] = True

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None, *,
                 prior: ValuePrior | None = None, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "")
            args = V05GRPOConfig(f"{str(name).split('/')[-1] or 'model'}-V05")
        if prior is not None and not isinstance(prior, ValuePrior):
            raise TypeError(f"prior must be a trl_ext.priors.ValuePrior (wrap functions with CallablePrior), got "
                            f"{type(prior).__name__}.")
        self._v05 = _V05Options.from_args(args)
        validate_v05_config(self._v05.as_namespace(args))
        super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, **kwargs)
        self.prior = prior if prior is not None else self._build_default_prior()
        self.support_buffer = SupportBuffer(self._v05.buffer_capacity, self._v05.context_size, seed=int(args.seed))
        self._v05_cap = osla_cap(self._v05.rollout_cost)
        self._v05_generation_index = 0
        self._v05_pending: dict | None = None
        self.last_v05: dict | None = None

    # ------------------------------------------------------------------------------------------------ setup
    def _build_default_prior(self) -> ValuePrior:
        kind = self._v05.value_prior.lower()
        kw = dict(self._v05.value_prior_kwargs)
        if kind == "embedding" and "embed_fn" not in kw:
            from ..priors import hf_mean_pool_embedder

            emb_kw = {k: kw.pop(k) for k in ("embed_batch_size", "embed_max_length") if k in kw}
            kw["embed_fn"] = hf_mean_pool_embedder(
                self.accelerator.unwrap_model(self.model), self._tokenizer,
                batch_size=emb_kw.get("embed_batch_size", 32), max_length=emb_kw.get("embed_max_length", 512),
            )
        if kind == "callable" and "fn" not in kw:
            raise ValueError("value_prior='callable' needs your function: pass prior=CallablePrior(fn) to "
                             "V05GRPOTrainer (a function cannot go through the config).")
        return build_prior(kind, **kw)

    def _v05_generation_is_collective(self) -> bool:
        """True when every rank must call the generation backend with equally long lists in every round."""
        if self.accelerator.num_processes == 1:
            return False
        if getattr(self, "use_vllm", False):
            return self.vllm_mode == "server" or int(getattr(self.args, "vllm_tensor_parallel_size", 1)) > 1
        return bool(getattr(self, "is_deepspeed_enabled", False) or getattr(self, "is_fsdp_enabled", False))

    # ------------------------------------------------------------------------------------------------ scoring
    def _v05_score_local(self, rows: list[dict], completion_ids: list[list[int]]) -> torch.Tensor:
        """Local ``(n, F)`` rewards of this rank's rollouts (no cross-rank gather: ranks hold different counts).

        Delegates to the base trainer's :meth:`~trl_ext.trainers.base.GRPOTrainer._score_rollouts_local`.
        """
        return self._score_rollouts_local(rows, completion_ids).detach().float().cpu()

    def _v05_signed(self, rpf: torch.Tensor) -> np.ndarray:
        """Weighted summed reward (TRL's ``nansum``; NaN when every function returned None) mapped to [-1, 1]."""
        w = self.reward_weights.detach().float().cpu()
        r = (rpf * w.unsqueeze(0)).nansum(dim=1)
        r[torch.isnan(rpf).all(dim=1)] = float("nan")
        return self._v05_map_rewards(r.double().numpy())

    def _v05_map_rewards(self, r: np.ndarray) -> np.ndarray:
        lo, hi = self._v05.reward_low, self._v05.reward_high
        fin = r[np.isfinite(r)]
        tol = 1e-6 * (hi - lo)
        if fin.size and (fin.min() < lo - tol or fin.max() > hi + tol):
            raise ValueError(
                f"V0.5: rewards must lie in the declared range [reward_low={lo}, reward_high={hi}] (the fusion's "
                f"noise bound 1/k needs rewards mapped to [-1, 1]); got min={fin.min():.6g}, max={fin.max():.6g}. "
                "Set reward_low/reward_high in V05GRPOConfig to the range your reward functions (x weights) produce."
            )
        if np.isinf(r).any():
            raise ValueError("V0.5: a reward function returned an infinite reward; return None for unscorable ones.")
        return np.clip(2.0 * (r - lo) / (hi - lo) - 1.0, -1.0, 1.0)

    # ------------------------------------------------------------------------------------------------ generation
    def _v05_dispatch(self, states: list[_PromptState], requests: list[tuple[int, int]]) -> dict:
        """Generate ``requests`` = [(local prompt index, n rollouts)], padded to ``dispatch_multiple``; score them.

        Returns counters for the diagnostics. Every rank must call this in every round (it may dispatch nothing).
        """
        m = self._v05.dispatch_multiple
        want = [i for i, n in requests for _ in range(n)]
        # dispatch_multiple padding: the extra slots go round-robin to this dispatch's prompts, never beyond the cap
        extra = math.ceil(len(want) / m) * m - len(want)
        planned = {i: states[i].k + n for i, n in requests}
        while extra > 0:
            takers = [i for i, _ in requests if planned[i] < self._v05_cap]
            if not takers:
                break
            for i in takers[:extra]:
                planned[i] += 1
                want.append(i)
            extra -= len(takers[:extra])
        target = math.ceil(len(want) / m) * m if want else 0
        if self._v05_generation_is_collective():
            # equal-length dispatch on every rank (vLLM server / TP / sharded models); these extra rows are discarded
            n_max = int(compat.gather(torch.tensor([target], device=self.accelerator.device)).max().item())
            target = max(n_max, 1)
        n_dummy = target - len(want)
        if target == 0:
            if self.keyed_sampling_enabled:
                # building keyed requests is a collective (sample indices count across ranks): a rank with nothing to
                # generate in this round must still join it, or the ranks' gathers mismatch
                self._generate_completion_ids([])
            return {"rollouts": 0, "discarded": 0, "tokens": 0}
        dummy_row = states[0].row
        rows = [states[i].row for i in want] + [dummy_row] * n_dummy
        c_ids, lps = self._generate_completion_ids(rows)
        c_ids = [list(c) for c in c_ids]
        if len(c_ids) != len(rows):
            raise RuntimeError(f"generation returned {len(c_ids)} completions for {len(rows)} rows.")
        if lps is not None and len(lps) != len(rows):
            raise RuntimeError(f"generation returned {len(lps)} log-prob rows for {len(rows)} rows.")
        kept = len(want)
        tokens = sum(len(c) for c in c_ids)
        if kept:
            rpf = self._v05_score_local(rows[:kept], c_ids[:kept])
            signed = self._v05_signed(rpf)
            for j, i in enumerate(want):
                st = states[i]
                st.completion_ids.append(c_ids[j])
                st.logprobs.append(None if lps is None else list(lps[j]))
                st.rpf.append(rpf[j])
                st.signed.append(float(signed[j]))
        return {"rollouts": len(rows), "discarded": n_dummy, "tokens": tokens}

    def _v05_need(self, states: list[_PromptState]) -> tuple[np.ndarray, np.ndarray]:
        """(need more, rejected) per local prompt from the current rollouts (Theorem 3.6 / Eq. 7)."""
        g = len(states)
        need = np.zeros(g, dtype=bool)
        rejected = np.zeros(g, dtype=bool)
        scorable = [i for i, s in enumerate(states) if np.isfinite(s.signed).any()]
        if scorable:
            r = np.concatenate([np.asarray(states[i].signed) for i in scorable])
            gid = np.concatenate([np.full(states[i].k, j) for j, i in enumerate(scorable)])
            v = np.array([2.0 * states[i].prior_p - 1.0 for i in scorable])
            fr = shrinkage_fusion_batch(r, gid, v)
            # the rule counts rollouts drawn (an unscorable one still cost compute), as osla_allocate does
            k_drawn = np.array([states[i].k for i in scorable])
            need[scorable] = osla_need_more(k_drawn, fr.bias2, self._v05.rollout_cost, cap=self._v05_cap)
            rejected[scorable] = fr.bias2 > 0
        return need, rejected

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        o = self._v05
        device = self.accelerator.device
        inputs = list(inputs)
        # Step 1: context + prior, once per prompt, before any rollout
        ctx_prompts, ctx_outcomes = self.support_buffer.sample_context(self._v05_generation_index)
        p = self.prior.predict([x["prompt"] for x in inputs], ctx_prompts, ctx_outcomes)
        states = [_PromptState(row=dict(x), prior_p=float(pi)) for x, pi in zip(inputs, p)]
        # Step 2: k_init rollouts per prompt
        counters = self._v05_dispatch(states, [(i, o.k_init) for i in range(len(states))])
        _, rejected_init = self._v05_need(states)
        # Steps 3-4: OSLA rounds, decided on gathered flags so every rank runs the same rounds
        rounds, early_stop, need_history = 0, False, []
        while True:
            need, _ = self._v05_need(states)
            need_global = compat.gather(torch.as_tensor(need, device=device)).cpu().numpy().astype(bool)
            need_history.append(float(need_global.mean()))
            if not need_global.any():
                break
            if o.global_stop_fraction > 0 and osla_should_stop(need_global, o.global_stop_fraction):
                early_stop = True
                break
            reqs = [(i, min(s.k + o.k_step, self._v05_cap) - s.k) for i, s in enumerate(states) if need[i]]
            c = self._v05_dispatch(states, [(i, n) for i, n in reqs if n > 0])
            for key in counters:
                counters[key] += c[key]
            rounds += 1
        # flatten (groups contiguous, in local prompt order)
        rows, c_ids, lps, rpf, gids = [], [], [], [], []
        for i, s in enumerate(states):
            rows += [s.row] * s.k
            c_ids += s.completion_ids
            lps += s.logprobs
            rpf += s.rpf
            gids += [i] * s.k
        use_lps = any(lp is not None for lp in lps)
        if use_lps and any(lp is None for lp in lps):
            raise RuntimeError("internal: some rollouts have sampling log-probs and others do not.")
        local = {
            "row_idx": [int(s.row.get(compat.ROW_IDX_COLUMN, -1)) for s in states],
            "prompts": [s.row["prompt"] for s in states],
            "prior_p": [s.prior_p for s in states],
            "k": [s.k for s in states],
            "rejected_at_init": [bool(x) for x in rejected_init],
            "tokens": counters["tokens"], "dispatched": counters["rollouts"], "discarded": counters["discarded"],
        }
        gathered = compat.gather_object([local])
        self._v05_pending = {
            "row_idx": [r for g in gathered for r in g["row_idx"]],
            "prompts": [r for g in gathered for r in g["prompts"]],
            "prior_p": np.array([r for g in gathered for r in g["prior_p"]], dtype=np.float64),
            "k": np.array([r for g in gathered for r in g["k"]], dtype=np.int64),
            "rejected_at_init": np.array([r for g in gathered for r in g["rejected_at_init"]], dtype=bool),
            "tokens": sum(g["tokens"] for g in gathered),
            "dispatched": sum(g["dispatched"] for g in gathered),
            "discarded": sum(g["discarded"] for g in gathered),
            "rounds": rounds, "early_stop": early_stop, "need_history": need_history,
            "context_size": len(ctx_prompts),
        }
        return self._finish_rollouts(rows, c_ids, group_ids=gids, logprobs=lps if use_lps else None,
                                     rewards_per_func=torch.stack(rpf))

    # ------------------------------------------------------------------------------------------------ advantages
    def compute_advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """Eq. 9 fused baseline and ``A_i = (r_i - mu*) / max(sqrt(1 - mu*^2), sigma_floor)`` (Workflow Step 5).

        Rewards are ``batch.rewards`` mapped from ``[reward_low, reward_high]`` to ``[-1, 1]``; the prior of group
        ``j`` is the one queried for the ``j``-th prompt in global order. Groups whose rollouts all failed to score
        get advantage 0, add nothing to the support buffer and are counted in ``v05/unscorable_prompts``.
        Evaluation batches (fixed groups of ``num_generations_eval``) use the base GRPO advantages.
        """
        pend, self._v05_pending = self._v05_pending, None
        if batch.mode != "train" or pend is None:
            return super().compute_advantages(batch)
        g = len(pend["prior_p"])
        if batch.num_groups != g:
            raise RuntimeError(f"internal: batch has {batch.num_groups} groups but {g} priors were queried.")
        r = self._v05_map_rewards(batch.rewards.double().numpy())
        gid = batch.group_ids.numpy()
        real = ~batch.is_pad.numpy()
        fin = real & np.isfinite(r)
        scorable = np.zeros(g, dtype=bool)
        scorable[np.unique(gid[fin])] = True
        adv = np.zeros(batch.num_rows, dtype=np.float64)
        v = 2.0 * pend["prior_p"] - 1.0
        bias2 = np.full(g, np.nan)
        weight = np.full(g, np.nan)
        baseline = np.full(g, np.nan)
        vbar = np.full(g, np.nan)
        if scorable.any():
            rows = real & scorable[np.where(gid >= 0, gid, 0)] & (gid >= 0)
            res = fused_advantages_batch(r[rows], gid[rows], v[scorable], floor=self._v05.sigma_floor)
            adv[rows] = res.advantages
            fr = res.extras["fusion"]
            bias2[scorable], weight[scorable], baseline[scorable], vbar[scorable] = \
                fr.bias2, fr.weight, fr.baseline, fr.mean
        n_unscorable = int((~scorable).sum())
        if n_unscorable:
            self._ext_warn_once(
                "v05_unscorable",
                f"V0.5: {n_unscorable} of {g} prompts had no scorable rollout (every reward function returned None); "
                "they get advantage 0 and are not added to the support buffer (logged as v05/unscorable_prompts).",
            )
        # support buffer: identical global update on every rank
        prompts_ok = [pend["prompts"][j] for j in range(g) if scorable[j]]
        if prompts_ok:
            self.support_buffer.add(prompts_ok, np.clip((vbar[scorable] + 1.0) / 2.0, 0.0, 1.0))
        fingerprint = self.support_buffer.fingerprint()
        if self._v05.check_buffer_sync and self.accelerator.num_processes > 1:
            prints = compat.gather_object([fingerprint])
            if len(set(prints)) != 1:
                raise RuntimeError(f"V0.5 support buffers differ across ranks (fingerprints {prints}); the prior "
                                   "contexts would diverge. Are the prompts JSON-serializable and deterministic?")
        self._v05_generation_index += 1
        self._v05_log(batch, pend, scorable, bias2, weight, vbar, n_unscorable)
        self.last_v05 = {**pend, "bias2": bias2, "weight": weight, "baseline": baseline, "scorable": scorable,
                         "vbar": vbar, "buffer_fingerprint": fingerprint}
        return torch.as_tensor(adv, dtype=torch.float32)

    def _v05_log(self, batch, pend, scorable, bias2, weight, vbar, n_unscorable) -> None:
        k = pend["k"].astype(np.float64)
        log = self.log_ext_metric
        log("v05/rollouts_per_prompt_mean", k.mean(), "train")
        log("v05/rollouts_per_prompt_max", k.max(), "train")
        for q in (50, 90):
            log(f"v05/rollouts_per_prompt_p{q}", float(np.percentile(k, q)), "train")
        log("v05/frac_prompts_at_k_init", float((pend["k"] == self._v05.k_init).mean()), "train")
        log("v05/rounds", pend["rounds"], "train")
        log("v05/early_stop", float(pend["early_stop"]), "train")
        log("v05/rejection_rate", float(pend["rejected_at_init"].mean()), "train")
        log("v05/context_size", pend["context_size"], "train")
        log("v05/generated_tokens", pend["tokens"], "train")
        log("v05/dispatched_rollouts", pend["dispatched"], "train")
        log("v05/discarded_rollouts", pend["discarded"], "train")
        log("v05/unscorable_prompts", n_unscorable, "train")
        log("v05/prior_mean", float(pend["prior_p"].mean()), "train")
        if scorable.any():
            s = scorable
            log("v05/rejection_rate_final", float((bias2[s] > 0).mean()), "train")
            log("v05/mean_weight", float(weight[s].mean()), "train")
            # Brier score of the prior against the realized group success rates (vbar + 1) / 2
            log("v05/prior_brier", float(np.mean((pend["prior_p"][s] - (vbar[s] + 1.0) / 2.0) ** 2)), "train")
            # plug-in MSE of mu*: (1 - w)^2 bias2 + w^2 / k = w / k; the plain mean's bound is 1 / k
            log("v05/baseline_mse_proxy", float(np.mean(weight[s] / pend["k"][s])), "train")
            log("v05/mean_only_mse_bound", float(np.mean(1.0 / pend["k"][s])), "train")

    # ------------------------------------------------------------------------------------------------ state
    def ext_state_dict(self) -> dict:
        """Base state plus the support buffer (``v05_support_buffer``) and the generation index."""
        state = super().ext_state_dict()
        state["v05_support_buffer"] = self.support_buffer.state_dict()
        state["v05_generation_index"] = int(self._v05_generation_index)
        return state

    def load_ext_state_dict(self, state: dict) -> None:
        """Restore the support buffer and generation index (warns if the checkpoint has none)."""
        super().load_ext_state_dict(state)
        if "v05_support_buffer" not in state:
            warnings.warn("Checkpoint has no V0.5 support buffer; starting with an empty one (cold start).",
                          stacklevel=2)
            return
        self.support_buffer.load_state_dict(state["v05_support_buffer"])
        self._v05_generation_index = int(state.get("v05_generation_index", 0))


@dataclass(frozen=True)
class _V05Options:
    k_init: int = V05_K_INIT
    k_step: int = 2
    rollout_cost: float = V05_PAPER_COST
    global_stop_fraction: float = 0.25
    dispatch_multiple: int = 1
    buffer_capacity: int = 512
    context_size: int = 256
    value_prior: str = "embedding"
    value_prior_kwargs: Any = None
    reward_low: float = 0.0
    reward_high: float = 1.0
    sigma_floor: float = DEFAULT_SIGMA_FLOOR
    allow_small_k_init: bool = False
    allow_unsupported_loss_type: bool = False
    check_buffer_sync: bool = True

    @classmethod
    def from_args(cls, args) -> _V05Options:
        kw = {f: getattr(args, f, getattr(cls, f)) for f in cls.__dataclass_fields__}
        kw["value_prior_kwargs"] = _parse_kwargs(kw["value_prior_kwargs"], "value_prior_kwargs")
        return cls(**kw)

    def as_namespace(self, args):
        import types

        return types.SimpleNamespace(**self.__dict__, loss_type=args.loss_type,
                                     tie_break_scorer_index=getattr(args, "tie_break_scorer_index", None))

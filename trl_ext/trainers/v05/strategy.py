"""V0.5's rollout strategy: prior query, ``v05_k_init`` rollouts per prompt, then budgeted Sequential OSLA rounds.

"V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts" (arXiv:2603.10848), Section 4.1.3 Steps 1-4
(prior, rollouts, hypothesis test, OSLA rounds); the OSLA rule itself is :func:`trl_ext.estimators.osla_step`
(Theorem 3.6). The strategy returns its rollouts with the ``priors`` side input and the options of the registered
``"v05"`` estimator and, after it, fills the support buffer and logs the ``v05/*`` diagnostics
(:meth:`OSLARounds.update`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ...estimators import v05 as v05_estimators
from ...estimators.v05 import (
    osla_cap,
    osla_extra_budget,
    osla_round_cost,
    osla_trim_to_budget,
    shrinkage_fusion_batch,
    v05_signed_rewards,
)
from ...priors import SupportBuffer, ValuePrior
from .. import _trl_compat as compat
from ..batch import RolloutBatch
from ..rollouts import RolloutGroups, RolloutStrategy, rank_block, register_rollout_strategy, unique_prompt_rows
from .config import V05Options, validate_v05_options
from .diagnostics import v05_description, v05_metrics, v05_unscorable_warnings
from .prior import build_v05_prior

__all__ = ["OSLARounds"]


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




@register_rollout_strategy("v05_osla")
class OSLARounds(RolloutStrategy):
    """V0.5's rollout allocation: prior query, ``v05_k_init`` rollouts per prompt, then budgeted Sequential OSLA rounds.

    Workflow Steps 1-4 of "V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts" (arXiv:2603.10848,
    Section 4.1.3). Per generation batch:

    * the rows TRL's sampler yielded on all ranks (each prompt ``v05_k_init`` times, see
      :meth:`V05GRPOTrainer.__init__`) are gathered and deduplicated by ``trl_ext_row_idx``: ``generation_batch_size /
      v05_k_init`` prompts in sampler order, assigned to ranks as **whole prompts in contiguous blocks**
      (:func:`~trl_ext.trainers.rollouts.rank_block`, as :class:`~trl_ext.trainers.rollouts.DynamicSampling` does), so
      each prompt is generated and scored on one rank and nothing depends on the number of processes;
    * the prior is queried once for the whole batch on every rank (identical inputs, identical outputs);
    * round 1 generates ``v05_k_init`` rollouts per prompt -- ``generation_batch_size`` in all, TRL's count for the
      same arguments;
    * each OSLA round is decided by :func:`trl_ext.estimators.osla_step` (Theorem 3.6 plus the 25% global stop) on
      the per-prompt drawn counts and Eq. 7 bias estimates gathered over ranks, then trimmed to the remaining
      ``v05_extra_rollout_budget`` (:func:`~trl_ext.estimators.v05.osla_trim_to_budget`: prompts served by
      decreasing ``bias2``; :func:`~trl_ext.estimators.v05.osla_round_cost` charges dispatch padding, not the rows
      that equalize a collective generation call, which depend on the back-end), identically on every rank.

    Every rank calls :meth:`dispatch` once per round (possibly with nothing to generate): generation goes through
    ``api.generate`` (:meth:`trl_ext.GRPOTrainer.generate_rollouts`), which joins the keyed-sampling collective, pads collective calls
    across ranks and counts every generated token in ``ext/generated_tokens``.

    Attributes
    ----------
    generation_index : int
        Train generation batches produced so far (seeds the support-buffer context); saved in every checkpoint
        through :meth:`state_dict`.
    options : V05Options
        The typed V0.5 options (from a :class:`V05GRPOConfig`'s ``v05_*`` fields or ``rollout_strategy_kwargs``);
        TRL's fields are read from ``args``, the trainer's config.
    prior, support_buffer
        The value prior and the global (prompt, success) FIFO (:meth:`build`); ``prior_info`` what the model card
        records of a prior built from the options.
    last_record : dict or None
        Global record of the latest train generation batch (identical on every rank): ``row_idx``, ``prompts``,
        ``prior_p``, ``k`` (final rollouts per prompt), ``rejected_at_init``, ``bias2``, ``weight``, ``baseline``,
        ``vbar``, ``scorable``, ``prompt_weight`` (the Eq. 10 multiplier ``c_j``, NaN for unscorable prompts),
        ``rounds``, ``early_stop``, ``need_history`` (global need fraction before each round), ``context_size``,
        ``dispatched``, ``discarded``, ``round1_rollouts``, ``extra_rollouts`` (charged to the budget by the OSLA
        rounds, all ranks: requested rollouts plus ``v05_dispatch_multiple`` padding), ``extra_budget`` (``None`` =
        unbounded), ``budget_exhausted``, ``unscorable_rollouts``, ``buffer_fingerprint``.

    The fused advantages are the registered ``"v05"`` estimator's (:func:`~trl_ext.estimators.v05.v05_advantages`),
    run by the base trainer's valid-row adapter on the priors this strategy returns (side input ``priors``, one per
    group) with its options (estimator inputs ``floor``, ``reward_range``, ``prompt_weighting``); :meth:`update`
    then fills the support buffer and returns the ``v05/*`` diagnostics.
    """

    provides = frozenset({"priors", "floor", "reward_range", "prompt_weighting"})

    def __init__(self, options, args):
        self.options = options  # V05Options
        self.args = args  # the trainer's config: TRL's fields (generation_batch_size, num_generations, seed)
        self.generation_index = 0
        self.prior: ValuePrior | None = None
        self.support_buffer: SupportBuffer | None = None
        self.prior_info: dict = {}
        self.last_record: dict | None = None

    @classmethod
    def validate_kwargs(cls, kwargs: dict, config=None) -> None:
        """The V0.5 options in ``rollout_strategy_kwargs`` (names without ``v05_``) checked with the rest of the
        config as ``V05GRPOConfig`` checks its own fields (:func:`~.config.validate_v05_options`)."""
        validate_v05_options(V05Options.from_kwargs(kwargs), config)

    @classmethod
    def from_trainer(cls, trainer, **kwargs) -> OSLARounds:
        """The strategy the config selects on any trainer: its options are a :class:`V05GRPOConfig`'s own fields,
        or ``rollout_strategy_kwargs`` (:data:`V05Options`, already validated with the config)."""
        return cls.build(trainer, V05Options.of(trainer.args, kwargs))

    @classmethod
    def build(cls, trainer, options, prior: ValuePrior | None = None) -> OSLARounds:
        """The strategy for ``trainer`` with the V0.5 ``options`` (:data:`V05Options`): the train sampler
        yields each prompt ``v05_k_init`` times (round 1 is TRL's ``generation_batch_size`` rollouts), the prior is
        ``prior`` or the one the options describe (:func:`~trl_ext.trainers.v05.prior.build_v05_prior`, what it
        records in :attr:`prior_info`), and the support buffer is the strategy's own (checkpointed with its state)."""
        strategy = cls(options, trainer.args)
        compat.set_sampler_num_generations(trainer, options.k_init)
        if prior is None:
            prior, strategy.prior_info = build_v05_prior(trainer, options)
        strategy.prior = prior
        strategy.support_buffer = SupportBuffer(options.buffer_capacity, options.context_size,
                                                seed=int(trainer.args.seed))
        return strategy

    def describe(self, api) -> tuple[str, list[str]]:
        """The construction line and drop-in differences (:func:`~.diagnostics.v05_description`)."""
        return v05_description(self.options, self.args, self.extra_budget())

    def extra_budget(self) -> int | None:
        """Rollouts the OSLA rounds of one generation batch may add (``None``: unbounded)."""
        return osla_extra_budget(self.options.extra_rollout_budget, self.args.generation_batch_size)

    def state_dict(self) -> dict:
        """The generation index and the support buffer."""
        return {"generation_index": int(self.generation_index), "support_buffer": self.support_buffer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.generation_index = int(state.get("generation_index", 0))
        if "support_buffer" in state:
            self.support_buffer.load_state_dict(state["support_buffer"])

    # ------------------------------------------------------------------------------------------------ after the estimator
    def update(self, api, batch: RolloutBatch, result) -> dict[str, float]:
        """After the ``"v05"`` estimator (Eq. 9 fused baseline ``A_i = (r_i - mu*) / max(sqrt(1 - mu*^2),
        v05_sigma_floor)``, Workflow Step 5, times the Eq. 10 prompt weight): per-prompt record, support buffer
        update, diagnostics.

        Unscorable rollouts (every reward function returned ``None``) got advantage 0 from the base's adapter and are
        counted in ``v05/unscorable_rollouts``; prompts without a scorable rollout got advantage 0, add nothing to the
        support buffer and are counted in ``v05/unscorable_prompts`` (each warned about once). A group whose rewards
        are all equal still gets ``(r - mu*) / sigma*``, nonzero unless ``mu* = r`` (the baseline is the fused one,
        not the group mean; "All-tied groups" in ``docs/v05.md``).
        """
        pend = batch.record
        if pend is None:  # an evaluation batch: TRL's fixed groups, nothing to learn
            return {}
        valid = batch.valid
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
        for key, message in v05_unscorable_warnings(n_bad_rows, int(real.sum()), n_unscorable, g):
            api.warn_once(key, message)
        # support buffer: identical global update on every rank
        prompts_ok = [pend["prompts"][j] for j in range(g) if scorable[j]]
        if prompts_ok:
            self.support_buffer.add(prompts_ok, np.clip((vbar[scorable] + 1.0) / 2.0, 0.0, 1.0))
        fingerprint = self.support_buffer.fingerprint()
        if self.options.check_buffer_sync and api.num_processes > 1:
            prints = api.gather_object([fingerprint])
            if len(set(prints)) != 1:
                raise RuntimeError(f"V0.5 support buffers differ across ranks (fingerprints {prints}); the prior "
                                   "contexts would diverge. Are the prompts JSON-serializable and deterministic?")
        self.last_record = {**pend, "bias2": bias2, "weight": weight, "baseline": baseline, "scorable": scorable,
                            "vbar": vbar, "prompt_weight": prompt_weight, "unscorable_rollouts": n_bad_rows,
                            "buffer_fingerprint": fingerprint}
        return v05_metrics(self.last_record, n_unscorable, self.options.k_init)

    # ------------------------------------------------------------------------------------------------ one round
    def dispatch(self, api, states: list[_PromptState], requests: list[tuple[int, int]],
                 fallback: dict | None = None) -> dict:
        """Generate ``requests`` = [(local prompt index, n rollouts)], padded to ``v05_dispatch_multiple``; score them.

        Every rank must call this in every round (it may request nothing, and may hold no prompt: ``fallback`` is
        the row of the dummy rollouts that equalize collective calls). Returns this rank's counters for the
        diagnostics: ``rollouts`` generated in the call (collective equalizing rows included) and how many of them
        were ``discarded``.
        """
        a = self.options
        m, cap = a.dispatch_multiple, osla_cap(a.rollout_cost)
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
        if api.collective_generation:
            # generation pads the call to the longest rank with dummy rows (generated, counted, discarded)
            n_call = api.all_max(n_call)
        c_ids, lps = api.generate(rows, fallback_row=fallback)
        if len(c_ids) != len(rows):
            raise RuntimeError(f"generation returned {len(c_ids)} completions for {len(rows)} rows.")
        if lps is not None and len(lps) != len(rows):
            raise RuntimeError(f"generation returned {len(lps)} log-prob rows for {len(rows)} rows.")
        kept = len(want)
        if kept:
            rpf = api.score(rows[:kept], c_ids[:kept]).detach().float().cpu()
            signed = v05_signed_rewards(api.reward(rpf).double().numpy(), self.options.reward_low,
                                        self.options.reward_high)
            for j, i in enumerate(want):
                st = states[i]
                st.completion_ids.append(list(c_ids[j]))
                st.logprobs.append(None if lps is None else list(lps[j]))
                st.rpf.append(rpf[j])
                st.signed.append(float(signed[j]))
        return {"rollouts": n_call, "discarded": n_call - kept}

    def decide(self, api, states: list[_PromptState]):
        """One OSLA decision on the whole generation batch (all ranks).

        Computes this rank's drawn counts and Eq. 7 bias estimates (NaN for a prompt without a scorable rollout),
        gathers them over ranks and applies :func:`trl_ext.estimators.osla_step`. Returns ``(step, local, bias2)``:
        the global :class:`~trl_ext.estimators.OslaStep` (identical on every rank), the slice of this rank's prompts
        in it, and the gathered ``bias2``.
        """
        a = self.options
        k = np.array([s.k for s in states], dtype=np.int64)
        bias2 = np.full(len(states), np.nan)
        scorable = [i for i, s in enumerate(states) if np.isfinite(s.signed).any()]
        if scorable:
            r = np.concatenate([np.asarray(states[i].signed) for i in scorable])
            gid = np.concatenate([np.full(states[i].k, j) for j, i in enumerate(scorable)])
            v = np.array([2.0 * states[i].prior_p - 1.0 for i in scorable])
            bias2[scorable] = shrinkage_fusion_batch(r, gid, v).bias2
        gathered = api.gather_object([(k.tolist(), bias2.tolist())])
        rank = api.process_index
        offset = sum(len(g[0]) for g in gathered[:rank])
        k_all = np.array([x for g in gathered for x in g[0]], dtype=np.int64)
        b2_all = np.array([x for g in gathered for x in g[1]], dtype=np.float64)
        # module attribute lookup: the one OSLA rule, shared with osla_allocate and the audit
        step = v05_estimators.osla_step(k_all, b2_all, a.rollout_cost, step=a.k_step,
                                        cap=osla_cap(a.rollout_cost),
                                        min_active_frac=a.global_stop_fraction or None)
        return step, slice(offset, offset + len(states)), b2_all

    # ------------------------------------------------------------------------------------------------ main
    def rollout(self, api, inputs: list[dict]) -> RolloutGroups:
        """One generation batch (Steps 1-4): this rank's rollouts with their ``priors`` and the estimator options;
        evaluation batches are TRL's fixed groups."""
        if api.mode != "train":
            return RolloutGroups.trl()
        a = self.options
        n_proc, rank = api.num_processes, api.process_index
        k_init = int(a.k_init)
        # the whole batch's prompts in sampler order (each was yielded v05_k_init times), whole prompts per rank
        batch = unique_prompt_rows(api.gather_object(list(inputs)), k_init)
        n_prompts = len(batch)
        fallback = dict(batch[0])
        blocks = [rank_block(n_prompts, n_proc, r) for r in range(n_proc)]
        owner = np.repeat(np.arange(n_proc), [hi - lo for lo, hi in blocks])
        lo, hi = blocks[rank]
        # Step 1: context + prior, once per prompt, before any rollout; the whole batch on every rank (identical
        # inputs give identical numbers whatever the number of processes)
        ctx_prompts, ctx_outcomes = self.support_buffer.sample_context(self.generation_index)
        p_all = np.asarray(self.prior.predict([x["prompt"] for x in batch], ctx_prompts, ctx_outcomes),
                           dtype=np.float64)
        states = [_PromptState(row=dict(batch[j]), prior_p=float(p_all[j])) for j in range(lo, hi)]
        # Step 2: v05_k_init rollouts per prompt = generation_batch_size rollouts in all (TRL's count)
        counters = self.dispatch(api, states, [(i, k_init) for i in range(len(states))], fallback)
        round1 = osla_round_cost([k_init * (h - low) for low, h in blocks], a.dispatch_multiple)
        budget = self.extra_budget()
        # round-1 padding beyond TRL's count (v05_dispatch_multiple > 1) is paid from the budget
        remaining = None if budget is None else max(budget - max(round1 - int(self.args.generation_batch_size), 0), 0)
        # Steps 3-4: OSLA rounds, decided on the gathered batch so every rank runs the same rounds
        rounds, early_stop, need_history, rejected_at_init = 0, False, [], None
        exhausted, extra = False, 0
        while True:
            step, mine, bias2 = self.decide(api, states)
            if rejected_at_init is None:
                rejected_at_init = np.nan_to_num(bias2, nan=0.0) > 0
            need_history.append(float(step.need.mean()) if step.need.size else 0.0)
            if step.stop:
                early_stop = bool(step.stopped_globally)
                break
            add, short = osla_trim_to_budget(step.add, bias2, owner, n_proc, remaining, a.dispatch_multiple)
            exhausted |= short
            if not add.any():
                break
            cost = osla_round_cost(np.bincount(owner, weights=add, minlength=n_proc).astype(int).tolist(),
                                   a.dispatch_multiple)
            extra += cost
            if remaining is not None:
                remaining -= cost
            c = self.dispatch(api, states, [(i, int(n)) for i, n in enumerate(add[mine]) if n > 0], fallback)
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
        gathered = api.gather_object([local])
        use_lps = any(g["has_lps"] for g in gathered)
        is_pad = None
        if not rows:  # a rank without a prompt (fewer prompts than processes): one masked pad row
            rows, c_ids, lps, gids, is_pad = [fallback], [[api.eos_token_id]], [[0.0]], [0], [True]
            priors = [2.0 * float(p_all[0]) - 1.0]
            rpf = [torch.full((api.num_reward_funcs,), float("nan"))]
        record = {
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
        self.generation_index += 1
        return RolloutGroups(
            rows=rows, completion_ids=c_ids, group_ids=gids, logprobs=lps if use_lps else None,
            rewards_per_func=torch.stack(rpf), is_pad=is_pad, side_inputs={"priors": priors}, record=record,
            estimator_inputs={"floor": a.sigma_floor, "reward_range": (a.reward_low, a.reward_high),
                              "prompt_weighting": a.prompt_weighting})

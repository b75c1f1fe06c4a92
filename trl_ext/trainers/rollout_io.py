"""Rollout I/O of :class:`trl_ext.GRPOTrainer`: what a rollout strategy may call, and the one replay of its rollouts.

* :class:`RolloutAPI` -- the ``api`` a strategy's ``rollout`` and ``update`` get: generation, scoring, the process
  group, logging (a small surface over the trainer, not the trainer);
* :class:`RolloutIO`, a mixin of the base trainer (it only works inside it): the generation entry points
  (:meth:`RolloutIO.generate_rollouts`, :meth:`RolloutIO.generate_token_ids`), the shared-prefix sampler behind TRL's
  ``_generate_single_turn``, the **one generated-token counter** (:meth:`RolloutIO.ext_on_generated`), local scoring
  between rounds (:meth:`RolloutIO.score_rollouts_local`) and :meth:`RolloutIO.replay_rollouts`: a strategy's
  :class:`~trl_ext.trainers.rollouts.RolloutGroups`, padded to equal row counts on every rank and replayed once
  through TRL's tail (old/ref log-probs, masks, rewards) into a gathered :class:`~trl_ext.trainers.batch.RolloutBatch`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import replace

import torch

from . import _trl_compat as compat
from .batch import RolloutBatch
from .rollouts import RolloutGroups, weighted_reward

__all__ = ["RolloutAPI", "RolloutIO"]


class RolloutAPI:
    """What a rollout strategy may use: generation, scoring, the process group and logging.

    Every call that generates ends in the one generated-token counter; ``generate`` / ``generate_ids`` /
    ``gather_object`` / ``all_sum`` / ``all_max`` are collectives (every rank calls them the same number of times).
    """

    def __init__(self, trainer):
        self._trainer = trainer

    # the process group and the run
    @property
    def mode(self) -> str:
        """``"train"`` or ``"eval"`` (the batch being produced)."""
        return "train" if self._trainer.model.training else "eval"

    @property
    def num_processes(self) -> int:
        return int(self._trainer.accelerator.num_processes)

    @property
    def process_index(self) -> int:
        return int(self._trainer.accelerator.process_index)

    @property
    def args(self):
        """The trainer's config (read only)."""
        return self._trainer.args

    @property
    def num_generations(self) -> int:
        """Rollouts per prompt of TRL's fixed groups in the current mode."""
        t = self._trainer
        return int(t.num_generations if t.model.training else t.num_generations_eval)

    @property
    def num_reward_funcs(self) -> int:
        return len(self._trainer.reward_funcs)

    @property
    def eos_token_id(self) -> int:
        return compat.tokenizer(self._trainer).eos_token_id

    @property
    def eos_token_ids(self):
        return self._trainer.eos_token_ids

    @property
    def global_step(self) -> int:
        return int(self._trainer.state.global_step)

    @property
    def collective_generation(self) -> bool:
        """Whether a generation call needs every rank in it (vLLM server, tensor parallel, ZeRO-3/FSDP)."""
        return compat.generation_is_collective(self._trainer)

    def gather_object(self, obj) -> list:
        """Every rank's ``obj`` (a list: the ranks' lists concatenated in rank order)."""
        return compat.gather_object(obj)

    def all_sum(self, n: int) -> int:
        return int(compat.gather(torch.tensor([int(n)], device=self._trainer.accelerator.device)).sum().item())

    def all_max(self, n: int) -> int:
        return int(compat.gather(torch.tensor([int(n)], device=self._trainer.accelerator.device)).max().item())

    # generation and scoring
    def generate(self, rows, *, max_new_tokens=None, fallback_row=None):
        """One completion per dataset row (:meth:`RolloutIO.generate_rollouts`)."""
        return self._trainer.generate_rollouts(rows, max_new_tokens=max_new_tokens, fallback_row=fallback_row)

    def generate_ids(self, prompt_ids, *, max_new_tokens=None):
        """One continuation per token-id prompt (:meth:`RolloutIO.generate_token_ids`)."""
        return self._trainer.generate_token_ids(prompt_ids, max_new_tokens=max_new_tokens)

    def tokenize(self, prompts) -> list[list[int]]:
        """Prompt token ids as TRL builds them (chat template applied)."""
        return compat.tokenize_prompts(self._trainer, prompts)

    def score(self, rows, completion_ids) -> torch.Tensor:
        """Per-function rewards on this rank, ``(n, F)`` float32, NaN = ``None`` (:meth:`RolloutIO.score_rollouts_local`)."""
        return self._trainer.score_rollouts_local(rows, completion_ids)

    def reward(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """TRL's weighted scalar reward of ``(n, F)`` per-function rewards (NaN where every function gave ``None``)."""
        return weighted_reward(rewards_per_func, self._trainer.reward_weights.detach().cpu())

    # logging
    def log(self, name: str, value: float) -> None:
        """A global scalar into the trainer's metrics of the current mode."""
        self._trainer.log_ext_metric(name, value)

    def warn_once(self, key: str, message: str) -> None:
        self._trainer.warn_once(key, message)


class RolloutIO:
    """Generation, scoring and the variable-rollout replay of the base trainer (mixin of :class:`trl_ext.GRPOTrainer`)."""

    # ------------------------------------------------------------------------------------------ variable rollouts
    def generate_rollouts(self, rows: Sequence[dict], *, max_new_tokens: int | None = None,
                          fallback_row: dict | None = None) -> tuple[list[list[int]], list[list[float]] | None]:
        """Generate one completion per row with TRL's backend (counted in ``ext/generated_tokens``).

        Every rank must call it the same number of times (keyed sampling builds its keys with a collective, and
        collective generation back-ends need every rank in the call); a rank may pass no rows.

        Parameters
        ----------
        rows : sequence of dict
            Local dataset rows, one per wanted rollout (repeat a row to get several rollouts of its prompt).
        max_new_tokens : int, optional
            Cap for this call (default: ``max_completion_length``).
        fallback_row : dict, optional
            Row used for the dummy rollouts that equalize the call across ranks when generation is a collective
            (vLLM server, tensor parallel, ZeRO-3/FSDP) and this rank has no row of its own; dummy rollouts are
            generated (and counted), then discarded.

        Returns
        -------
        completion_ids : list of list of int
            EOS-truncated completion token ids, in row order.
        logprobs : list of list of float or None
            Per-token sampling log-probs (vLLM only; ``None`` with transformers generation).
        """
        rows = list(rows)
        n = len(rows)
        if compat.generation_is_collective(self):
            n_max = int(compat.gather(torch.tensor([n], device=self.accelerator.device)).max().item())
            filler = rows[0] if rows else fallback_row
            if n_max > n and filler is None:
                raise ValueError("generate_rollouts: generation is a collective and this rank has no row; pass "
                                 "fallback_row so it can join the call with a dummy rollout.")
            rows = rows + [filler] * (n_max - n)
        if self.keyed_sampler is not None:
            # Rows generated outside TRL's _generate need their keys set explicitly. Building them is a collective
            # (sample indices count across ranks), so it runs before the empty-rows shortcut.
            requests = self.keyed_sampler.requests_for_rows(rows)
            if rows:
                self.keyed_sampler.set_requests(requests)
        if not rows:
            return [], None
        prompt_ids = compat.tokenize_prompts(self, [x["prompt"] for x in rows])
        c_ids, lps = self.generate_token_ids(prompt_ids, max_new_tokens=max_new_tokens, equalize=False)
        return c_ids[:n], None if lps is None else lps[:n]

    def generate_token_ids(self, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int | None = None,
                           equalize: bool = True) -> tuple[list[list[int]], list[list[float]] | None]:
        """One sampled continuation per token-id prompt (e.g. ``prompt + prefix``), counted in
        ``ext/generated_tokens``.

        With ``equalize`` (default) the call is padded to the same length on every rank when generation is a
        collective (dummy rows are generated, counted and discarded). ``max_new_tokens`` caps this call only.
        """
        seqs = [list(p) for p in prompt_ids]
        n = len(seqs)
        if equalize and compat.generation_is_collective(self):
            n_call = max(1, int(compat.gather(torch.tensor([n], device=self.accelerator.device)).max().item()))
            dummy = seqs[0] if seqs else [compat.tokenizer(self).eos_token_id]
            seqs += [dummy] * (n_call - n)
            pending = None if self.keyed_sampler is None else self.keyed_sampler.pending_requests
            if n_call > n and pending is not None and len(pending) == n:
                # keyed sampling: the dummy rows need requests too (copies of the first one, marked; their
                # completions are discarded like the rows themselves), else the call would see fewer requests
                # than prompts
                from ..generation.keyed_sampler import KeyedRequest

                filler = (replace(pending[0], meta={**pending[0].meta, "dummy": True}) if pending
                          else KeyedRequest(key=0, sample_index=0, meta={"dummy": True}))
                self.keyed_sampler.set_requests(list(pending) + [filler] * (n_call - n))
        if not seqs:
            return [], None
        cap = contextlib.nullcontext() if max_new_tokens is None else compat.max_new_tokens(self, max_new_tokens)
        with cap:
            c_ids, lps = self.ext_generate_single_turn(seqs, None, {}, 1)
        self.ext_on_generated(c_ids)
        c_ids = [list(c) for c in c_ids[:n]]
        return c_ids, None if lps is None else [list(lp) for lp in lps[:n]]

    def shared_prefix_settings(self):
        """Sampler settings of :func:`~trl_ext.measurement.shared_prefix.shared_prefix_generate`, read from the
        generation config at every call (so :func:`~trl_ext.trainers._trl_compat.max_new_tokens` caps apply)."""
        from ..measurement.shared_prefix import settings_from_generation_config

        return settings_from_generation_config(self.generation_config, eos_token_ids=self.eos_token_ids,
                                               pad_token_id=compat.tokenizer(self).pad_token_id)

    def ext_generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """The keyed sampler's generation (``keyed_sampling=True``), else :meth:`generate_unkeyed`."""
        if self.keyed_sampler is not None:
            return self.keyed_sampler.generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        return self.generate_unkeyed(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def generate_unkeyed(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's generation, or the shared-prefix sampler with ``shared_prefix_rollouts=True``."""
        if not self.args.shared_prefix_rollouts:
            return super().ext_generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                    has_tool_images)
        if images is not None or multimodal_fields:
            raise NotImplementedError("shared_prefix_rollouts does not support image/multimodal prompts.")
        from ..measurement.shared_prefix import shared_prefix_generate

        with compat.generation_model(self) as model:
            ids, stats = shared_prefix_generate(model, [list(p) for p in prompt_ids], self.shared_prefix_settings(),
                                                pad_to_multiple_of=self.pad_to_multiple_of)
        self.ext_record_shared_prefix_stats(stats)
        return ids, None

    def ext_record_shared_prefix_stats(self, stats: dict) -> None:
        """Accumulate one shared-prefix generation call's counters (logged per generation batch, all ranks)."""
        for key in ("forward_tokens", "computed_tokens", "independent_tokens", "shared_positions", "decode_tokens",
                    "decode_shared_positions"):
            self._ext_sp_local[key] = self._ext_sp_local.get(key, 0.0) + float(stats.get(key, 0))
        self._ext_sp_local["max_branches"] = max(self._ext_sp_local.get("max_branches", 0.0),
                                                 float(stats.get("max_branches", 0)))

    def ext_on_generated(self, completion_ids) -> None:
        """The one generated-token counter: every generation call ends here (TRL's ``_generate`` and its tool loops
        through :class:`~trl_ext.trainers._trl_compat.TRLGlue`, strategies through :meth:`generate_token_ids`)."""
        self._ext_gen_tokens_local += int(sum(len(c) for c in completion_ids))

    def score_rollouts_local(self, rows: Sequence[dict], completion_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Score rollouts on this rank only (no gather), e.g. between generation rounds.

        Calls every reward function like TRL's ``_calculate_rewards`` does (dataset columns as keyword arguments,
        ``trainer_state``; ``log_extra``/``log_metric`` are no-ops here so intermediate rounds do not pollute the
        completions table), but without the cross-rank gather, so ranks may hold different row counts.

        Parameters
        ----------
        rows : sequence of dict
            Dataset row of each rollout.
        completion_ids : sequence of list of int
            Completion ids aligned with ``rows``.

        Returns
        -------
        Tensor, shape (n, F), float32
            NaN where a reward function returned ``None``. Return it as ``RolloutGroups.rewards_per_func`` to avoid
            scoring twice.

        Raises
        ------
        NotImplementedError
            For async reward functions (score them yourself).
        """
        import inspect

        n, n_funcs = len(rows), len(self.reward_funcs)
        out = torch.full((n, n_funcs), float("nan"))
        if n == 0:
            return out
        if len(completion_ids) != n:
            raise ValueError(f"score_rollouts_local: {n} rows but {len(completion_ids)} completions.")
        prompts = [x["prompt"] for x in rows]
        texts = self.processing_class.batch_decode([list(c) for c in completion_ids], skip_special_tokens=True)
        conversational = isinstance(prompts[0], list)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        keys = [k for k in rows[0] if k not in ("prompt", "completion", "completion_ids")]
        kwargs = {k: [x[k] for x in rows] for k in keys}
        kwargs.update(trainer_state=self.state, log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)
        for i, (func, proc) in enumerate(zip(self.reward_funcs, self.reward_processing_classes)):
            if isinstance(func, torch.nn.Module):
                if conversational:
                    raise NotImplementedError("score_rollouts_local: reward models on conversational prompts are not "
                                              "supported; leave RolloutGroups.rewards_per_func unset instead.")
                enc = proc(text=[p + c for p, c in zip(prompts, texts)], return_tensors="pt", padding=True,
                           padding_side="right", add_special_tokens=False).to(self.accelerator.device)
                with torch.inference_mode():
                    out[:, i] = func(**enc).logits[:, 0].float().cpu()
            elif inspect.iscoroutinefunction(func):
                raise NotImplementedError("score_rollouts_local does not run async reward functions.")
            else:
                values = func(prompts=prompts, completions=completions, completion_ids=[list(c) for c in completion_ids],
                              **kwargs)
                if len(values) != n:
                    raise ValueError(f"reward function {self.reward_func_names[i]!r} returned {len(values)} rewards for "
                                     f"{n} completions.")
                out[:, i] = torch.tensor([float("nan") if v is None else float(v) for v in values])
        return out

    def replay_rollouts(self, groups: RolloutGroups, inputs: list[dict]) -> tuple[dict, RolloutBatch]:
        """The one path from a strategy's :class:`RolloutGroups` to TRL's output dict and the gathered batch.

        TRL's fixed groups (``groups.rows is None``) run TRL's own generation on the sampler's rows. Own rollouts are
        1. checked and padded so every rank holds the same row count ``N* = ceil(max_rank n / spg) * spg`` (copies
           of the rank's last row flagged ``is_pad``; equal sizes are required by TRL's gathers and
           ``split_tensor_dict``), then
        2. replayed once through TRL's ``_generate_and_score_completions``: prompt/completion padding, old/reference
           log-probs, the vLLM importance-sampling ratio when ``logprobs`` is given, the reward functions unless
           ``rewards_per_func`` is given.
        TRL calls ``_generate`` and ``_calculate_rewards`` itself, so the replay reaches them through one scoped
        call context (``self._ext_call``, set and cleared here); the batch is built in ``_calculate_rewards``, the
        one place that sees the gathered rewards.
        """
        if groups.rows is None:
            call = {"replay": None, "side_inputs": groups.side_inputs, "rows": inputs}
            rows = inputs
        else:
            call = self._pad_groups(groups)
            rows = call["rows"]
            # TRL's completions-table deques hold generation_batch_size rows, i.e. exactly the latest generation
            # batch; this batch may hold more (all ranks, pads included). Start the table afresh with room for all
            # of it, so no rollout is evicted and every column TRL extends holds exactly this batch's rows when the
            # pad rows are dropped (_ext_log_batch_metrics).
            compat.resize_completion_logs(self, len(rows) * self.accelerator.num_processes, keep_last=0)
        self._ext_call = call
        try:
            if call["replay"] is None:
                out = super().ext_generate_and_score(rows)
            else:
                with compat.group_size_override(self, 1):  # TRL's view(-1, G) must accept any row count
                    out = super().ext_generate_and_score(rows)
        finally:
            self._ext_call = None
        batch = call["batch"]
        batch.estimator_inputs = dict(groups.estimator_inputs)
        batch.fixed_normalizer = groups.fixed_normalizer
        batch.record = groups.record
        return out, batch

    def _pad_groups(self, groups: RolloutGroups) -> dict:
        """Check a strategy's own rollouts and pad them to the row count of every rank (see
        :meth:`replay_rollouts`); returns the call context TRL's ``_generate`` / ``_calculate_rewards`` read."""
        rows, completion_ids, n = list(groups.rows), list(groups.completion_ids or []), len(groups.rows)
        who = f"rollout strategy {self.rollout_strategy.name!r}"
        if n < 1:
            raise ValueError(f"{who} returned no rollout on this rank; if a rank has nothing to score, return "
                             "RolloutGroups.pad_only(...) (one masked pad row).")
        if len(completion_ids) != n or len(groups.group_ids or []) != n:
            raise ValueError(f"{who}: rows ({n}), completion_ids ({len(completion_ids)}) and group_ids "
                             f"({len(groups.group_ids or [])}) must have the same length.")
        if groups.logprobs is not None and len(groups.logprobs) != n:
            raise ValueError(f"{who}: logprobs has {len(groups.logprobs)} rows, expected {n}.")
        user_pad = [False] * n if groups.is_pad is None else [bool(p) for p in groups.is_pad]
        if len(user_pad) != n:
            raise ValueError(f"{who}: is_pad has {len(user_pad)} flags, expected {n}.")
        gids = [-1 if p else int(g) for g, p in zip(groups.group_ids, user_pad)]
        real_g = [g for g, p in zip(gids, user_pad) if not p]
        runs = [g for i, g in enumerate(real_g) if i == 0 or g != real_g[i - 1]]
        if len(runs) != len(set(runs)):
            raise ValueError(f"{who}: the rollouts of a group must be contiguous (group_ids {gids[:20]}...). Sort "
                             "the rollouts by group first.")
        rpf = groups.rewards_per_func
        if rpf is not None:
            rpf = torch.as_tensor(rpf, dtype=torch.float32)
            if tuple(rpf.shape) != (n, len(self.reward_funcs)):
                raise ValueError(f"{who}: rewards_per_func must have shape ({n}, {len(self.reward_funcs)}), got "
                                 f"{tuple(rpf.shape)}.")
        multiple = self.args.steps_per_generation if self.model.training else 1
        n_max = int(compat.gather(torch.tensor([n], device=self.accelerator.device)).max().item())
        n_pad = math.ceil(n_max / multiple) * multiple - n
        lps = None
        if groups.logprobs is not None:
            lps = [list(lp) for lp in groups.logprobs] + [list(groups.logprobs[-1]) for _ in range(n_pad)]
        if rpf is not None:
            rpf = torch.cat([rpf, torch.full((n_pad, rpf.shape[1]), float("nan"))], dim=0)
        side = {}
        for key, values in groups.side_inputs.items():
            values = list(values)
            if len(values) != n:
                raise ValueError(f"{who}: side_inputs[{key!r}] has {len(values)} values, expected {n}.")
            side[key] = values + values[-1:] * n_pad
        rows = [dict(x) for x in rows] + [dict(rows[-1]) for _ in range(n_pad)]
        c_ids = [list(c) for c in completion_ids] + [list(completion_ids[-1]) for _ in range(n_pad)]
        replay = {"prompt_ids": compat.tokenize_prompts(self, [x["prompt"] for x in rows]), "completion_ids": c_ids,
                  "logprobs": lps, "is_pad": user_pad + [True] * n_pad, "group_ids": gids + [-1] * n_pad,
                  "rewards_per_func": rpf}
        return {"replay": replay, "side_inputs": side, "rows": rows}

    def ext_generate(self, prompts: list):
        replay = self._ext_call["replay"] if self._ext_call is not None else None
        if replay is None:
            return super().ext_generate(prompts)
        mode = "train" if self.model.training else "eval"
        c_ids = replay["completion_ids"]
        completions = self.processing_class.batch_decode(c_ids, skip_special_tokens=True)
        if isinstance(prompts[0], list):  # conversational prompts
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        self._ext_log_generation_metrics(mode, replay["prompt_ids"], c_ids, replay["is_pad"])
        return replay["prompt_ids"], c_ids, None, completions, replay["logprobs"], {}, None, []

    def _ext_log_generation_metrics(self, mode, prompt_ids, completion_ids, is_pad) -> None:
        """TRL's ``_generate`` metrics for replayed rollouts, excluding pad rows."""
        device = self.accelerator.device
        keep = torch.tensor([not p for p in is_pad], device=device)
        p_len = torch.tensor([len(x) for x in prompt_ids], device=device)
        c_len = torch.tensor([len(x) for x in completion_ids], device=device)
        eos_and_pad = [*self.eos_token_ids, compat.tokenizer(self).pad_token_id]
        trunc = torch.tensor([len(x) == 0 or x[-1] not in eos_and_pad for x in completion_ids], device=device)
        keep, p_len, c_len, trunc = (compat.gather(t) for t in (keep, p_len, c_len, trunc))
        p_len, c_len, trunc = p_len[keep], c_len[keep], trunc[keep]
        if mode == "train":
            self.state.num_input_tokens_seen += int((p_len.sum() + c_len.sum()).item())
        m = compat.metrics(self, mode)
        m["num_tokens"] = [self.state.num_input_tokens_seen]
        if c_len.numel() == 0:  # every row is a pad row: nothing generated (NaN is dropped by TRL's `log`)
            c_len = torch.full((1,), float("nan"), device=device)
            trunc = torch.zeros(1, dtype=torch.bool, device=device)
        m["completions/mean_length"].append(c_len.float().mean().item())
        m["completions/min_length"].append(c_len.float().min().item())
        m["completions/max_length"].append(c_len.float().max().item())
        m["completions/clipped_ratio"].append(trunc.float().mean().item())
        term = c_len[~trunc]
        term = term if term.numel() else torch.zeros(1, device=device)
        m["completions/mean_terminated_length"].append(term.float().mean().item())
        m["completions/min_terminated_length"].append(term.float().min().item())
        m["completions/max_terminated_length"].append(term.float().max().item())

    def ext_calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        call = self._ext_call
        if call is None:
            raise RuntimeError("internal: TRL scored rewards outside the base trainer's generation batch.")
        replay = call["replay"]
        device = self.accelerator.device
        if replay is not None and replay["rewards_per_func"] is not None:
            rpf = compat.gather(replay["rewards_per_func"].to(device))
        else:
            rpf = super().ext_calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if replay is not None:
            pad = compat.gather(torch.tensor(replay["is_pad"], device=device))
            if pad.any():
                rpf = rpf.clone()
                rpf[pad] = float("nan")
        call["batch"] = self._ext_build_batch(inputs, prompts, completion_ids_list, rpf, replay, call["side_inputs"])
        return rpf

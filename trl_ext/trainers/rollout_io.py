"""Rollout I/O of :class:`trl_ext.GRPOTrainer`: what a rollout strategy calls to generate, score and hand in rollouts.

:class:`RolloutIO` is a mixin of the base trainer (it only works inside it). It owns

* the generation entry points every strategy uses (:meth:`RolloutIO.generate_rollouts`,
  :meth:`RolloutIO.generate_token_ids`) and the shared-prefix sampler behind TRL's ``_generate_single_turn``;
* the **one generated-token counter** (:meth:`RolloutIO.ext_on_generated`), which every generation call reaches;
* local scoring between rounds (:meth:`RolloutIO.score_rollouts_local`);
* :meth:`RolloutIO.finish_rollouts`: a variable number of rollouts per prompt, padded to equal row counts on every
  rank and replayed through TRL's tail (old/ref log-probs, masks, rewards).

The replayed rollouts reach TRL's ``_generate`` and ``_calculate_rewards`` through ``self._ext_replay``, set and
cleared by :meth:`RolloutIO.finish_rollouts` around one call of TRL's ``_generate_and_score_completions``: TRL calls
those methods itself, so the replay cannot be passed as an argument.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import replace

import torch

from . import _trl_compat as compat

__all__ = ["RolloutIO"]


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
                from .keyed_generation import KeyedRequest

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
            NaN where a reward function returned ``None``. Pass it to :meth:`finish_rollouts` as
            ``rewards_per_func`` to avoid scoring twice.

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
                                              "supported; score them through finish_rollouts instead.")
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

    def _check_finish_args(self, inputs, completion_ids, group_ids, logprobs, rewards_per_func, is_pad):
        """Validate :meth:`finish_rollouts`' arguments; returns ``(user_pad, group ids with -1 on pads,
        rewards_per_func as a float32 tensor or None)``."""
        n = len(inputs)
        if n < 1:
            raise ValueError("finish_rollouts needs at least one rollout on every rank (got 0); if a rank has nothing "
                             "to score, pass one dummy rollout with is_pad=[True].")
        if len(completion_ids) != n or len(group_ids) != n:
            raise ValueError(f"finish_rollouts: inputs ({n}), completion_ids ({len(completion_ids)}) and group_ids "
                             f"({len(group_ids)}) must have the same length.")
        if logprobs is not None and len(logprobs) != n:
            raise ValueError(f"finish_rollouts: logprobs has {len(logprobs)} rows, expected {n}.")
        user_pad = [False] * n if is_pad is None else [bool(p) for p in is_pad]
        if len(user_pad) != n:
            raise ValueError(f"finish_rollouts: is_pad has {len(user_pad)} flags, expected {n}.")
        gids = [-1 if p else int(g) for g, p in zip(group_ids, user_pad)]
        real_g = [g for g, p in zip(gids, user_pad) if not p]
        runs = [g for i, g in enumerate(real_g) if i == 0 or g != real_g[i - 1]]
        if len(runs) != len(set(runs)):
            raise ValueError("finish_rollouts: the rollouts of a group must be contiguous (group_ids "
                             f"{gids[:20]}...). Sort the rollouts by group first.")
        if rewards_per_func is not None:
            rewards_per_func = torch.as_tensor(rewards_per_func, dtype=torch.float32)
            if tuple(rewards_per_func.shape) != (n, len(self.reward_funcs)):
                raise ValueError(f"finish_rollouts: rewards_per_func must have shape ({n}, {len(self.reward_funcs)}),"
                                 f" got {tuple(rewards_per_func.shape)}.")
        return user_pad, gids, rewards_per_func

    def finish_rollouts(
        self,
        inputs: Sequence[dict],
        completion_ids: Sequence[Sequence[int]],
        *,
        group_ids: Sequence[int],
        logprobs: Sequence[Sequence[float]] | None = None,
        rewards_per_func: torch.Tensor | None = None,
        is_pad: Sequence[bool] | None = None,
        side_inputs: dict[str, Sequence[float]] | None = None,
    ) -> dict:
        """Score a variable number of self-generated rollouts through TRL's tail; returns TRL's output dict.

        Call it from an overridden ``_generate_and_score_completions`` (train mode) with the rollouts this rank
        generated. Every rank must call it exactly once per generation batch (it contains collectives). It

        1. pads every rank to the same row count ``N* = ceil(max_rank n / steps_per_generation) *
           steps_per_generation`` with copies of the rank's last row flagged ``is_pad`` (equal sizes are required by
           TRL's gathers and by ``split_tensor_dict``);
        2. replays the rollouts into TRL's ``_generate_and_score_completions``: prompt/completion
           padding, old/reference log-probs, the vLLM importance-sampling ratio when ``logprobs`` is given, and the
           reward functions (unless ``rewards_per_func`` is given);
        3. builds the :class:`RolloutBatch` (pad rows: ``group_ids = -1``, NaN rewards), calls
           :meth:`compute_advantages`, and masks pad rows out of ``completion_mask`` and ``num_items_in_batch``.

        Parameters
        ----------
        inputs : sequence of dict, length n >= 1
            The dataset row of each rollout (a prompt's row repeated once per rollout), in local order.
        completion_ids : sequence of list of int, length n
            EOS-truncated completion ids (as returned by ``_generate_single_turn``).
        group_ids : sequence of int, length n
            Local group label of each rollout; rows of a group must be contiguous. Labels are per rank (the base
            makes them global).
        logprobs : sequence of list of float, optional
            Sampling log-probs per completion token (vLLM), aligned with ``completion_ids``.
        rewards_per_func : Tensor, shape (n, F), optional
            Local rewards already computed by the subclass (e.g. while deciding further rounds); NaN = ``None``.
            When omitted, TRL's ``_calculate_rewards`` scores the (padded) rows.
        is_pad : sequence of bool, length n, optional
            Rows to treat exactly like the base's own pad rows (no reward, no advantage, no loss, not counted in
            any metric; their ``group_ids`` are ignored). Use it when a rank has nothing to contribute: pass one
            dummy rollout with ``is_pad=[True]`` so the collectives stay aligned.
        side_inputs : dict of name -> sequence of float, optional
            Estimator side inputs of these rollouts (one value per rollout; names in the strategy's ``provides``),
            gathered into ``RolloutBatch.side_inputs``; pad rows repeat the last value.

        Returns
        -------
        dict
            TRL's output (``prompt_ids``, ``completion_ids``, ``completion_mask``, ``advantages`` of shape
            (N*,), ``num_items_in_batch``, ...), ready for ``_prepare_inputs``.

        Notes
        -----
        Tool calling, environments and multimodal prompts are not supported on this path.
        """
        n = len(inputs)
        user_pad, gids, rewards_per_func = self._check_finish_args(inputs, completion_ids, group_ids, logprobs,
                                                                   rewards_per_func, is_pad)
        mode = "train" if self.model.training else "eval"
        device = self.accelerator.device
        multiple = self.args.steps_per_generation if mode == "train" else 1
        n_max = int(compat.gather(torch.tensor([n], device=device)).max().item())
        n_star = math.ceil(n_max / multiple) * multiple
        n_pad = n_star - n
        rows = [dict(x) for x in inputs] + [dict(inputs[-1]) for _ in range(n_pad)]
        c_ids = [list(c) for c in completion_ids] + [list(completion_ids[-1]) for _ in range(n_pad)]
        lps = None
        if logprobs is not None:
            lps = [list(lp) for lp in logprobs] + [list(logprobs[-1]) for _ in range(n_pad)]
        is_pad = user_pad + [True] * n_pad
        if rewards_per_func is not None:
            rewards_per_func = torch.cat(
                [rewards_per_func, torch.full((n_pad, rewards_per_func.shape[1]), float("nan"))], dim=0
            )
        side = {}
        for key, values in (side_inputs or {}).items():
            values = [float(v) for v in values]
            if len(values) != n:
                raise ValueError(f"finish_rollouts: side_inputs[{key!r}] has {len(values)} values, expected {n}.")
            side[key] = values + values[-1:] * n_pad
        prompt_ids = compat.tokenize_prompts(self, [x["prompt"] for x in rows])
        self._ext_replay = {"side_inputs": side, "prompt_ids": prompt_ids, "completion_ids": c_ids, "logprobs": lps,
                            "is_pad": is_pad, "group_ids": gids + [-1] * n_pad, "rewards_per_func": rewards_per_func}
        # TRL's completions-table deques hold generation_batch_size rows, i.e. exactly the latest generation batch;
        # this batch may hold more (all ranks, pads included). Start the table afresh with room for all of it, so
        # no rollout is evicted and every column TRL extends (log_extra ones too) holds exactly this batch's rows
        # when the pad rows are dropped (_ext_log_batch_metrics).
        compat.resize_completion_logs(self, n_star * self.accelerator.num_processes, keep_last=0)
        try:
            with compat.group_size_override(self, 1):  # TRL's view(-1, G) must accept any row count
                return self.score_fixed_groups(rows)
        finally:
            self._ext_replay = None

    def ext_generate(self, prompts: list):
        replay = self._ext_replay
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
        replay = self._ext_replay
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
        self._ext_pending = self._ext_build_batch(inputs, prompts, completion_ids_list, rpf)
        return rpf

"""Per-batch accounting of :class:`trl_ext.GRPOTrainer`: the gathered batch, advantages into TRL's output, loss
denominators and the batch metrics.

:class:`BatchAccounting` is a mixin of the base trainer (it only works inside it):

* :meth:`BatchAccounting._ext_build_batch` gathers one generation batch into a :class:`~trl_ext.trainers.batch.RolloutBatch`
  (group ids from the dataset row index, weighted rewards, tie-break blends, ``rollout_columns``);
* :meth:`BatchAccounting._ext_finalize` replaces TRL's advantages with ``compute_advantages(batch)``, zeroes pad and
  unscorable rows, and records the loss denominators (pad rows, signal-only, a strategy's fixed normalizer);
* :meth:`BatchAccounting.ext_compute_loss` / :meth:`BatchAccounting._ext_policy_scale`: the policy-loss denominator
  chosen in one place by rescaling advantages;
* the shut-gate, estimator, generated-token and shared-prefix metrics of every batch.
"""

from __future__ import annotations

import warnings

import torch

from ..estimators.baselines import group_mean_std
from ..measurement.shut_gate import shut_gate_stats
from . import _trl_compat as compat
from .batch import RolloutBatch

__all__ = ["BatchAccounting"]


def _side_value(v):
    """One row's side input: a float, or a list of floats (a row of a 2-D input, e.g. BASIS's ``V_beta`` grid)."""
    if isinstance(v, list | tuple) or getattr(v, "ndim", 0) >= 1:
        return [float(x) for x in v]
    return float(v)


class BatchAccounting:
    """Batch building, advantage finalization, loss denominators and metrics (mixin of :class:`trl_ext.GRPOTrainer`)."""

    def ext_compute_loss(self, model, inputs):
        """TRL's loss with the policy term's denominator chosen in one place (:meth:`_ext_policy_scale`) and the
        KL term averaged over real rows."""
        if self.model.training:
            scale = self._ext_policy_scale(inputs)
            if scale is not None:
                inputs = {**inputs, "advantages": inputs["advantages"] * scale}
        kl_rescale = inputs.get("ext_kl_rescale")
        if kl_rescale is None or self.beta == 0.0:
            return super().ext_compute_loss(model, inputs)
        # Pad rows (sequence-level losses): TRL divides beta * KL by all B rows, pads included; N / n_real restores
        # the mean over real rows (pads have an all-zero loss mask, so they add no KL themselves).
        beta = self.beta
        self.beta = beta * float(kl_rescale)
        try:
            return super().ext_compute_loss(model, inputs)
        finally:
            self.beta = beta

    def _ext_policy_scale(self, inputs) -> torch.Tensor | None:
        """Factor on the advantages that replaces TRL's policy-loss denominator by the wanted one (or ``None``).

        Every TRL 1.16 loss is a sum of ``A_i`` times terms that do not depend on ``A`` (positively homogeneous), so
        changing the denominator is exact by rescaling advantages. TRL's denominators per generation batch:
        ``R = B * P * spg`` rows for sequence-level losses (``B`` local micro-batch rows), ``num_items_in_batch``
        tokens for global token-level losses, local tokens for ``bnpo``. The wanted one is, in order of precedence:

        * the rollout strategy's fixed normalizer ``K`` (``ext_fixed_normalizer``): ``K`` rows, or
          ``K * max_completion_length`` tokens (PAIR);
        * signal-only denominators: the rows / tokens of groups with a nonzero advantage;
        * with pad rows and a sequence-level loss: the real rows ``n_real`` (``ext_real_rows``).
        """
        adv = inputs["advantages"]
        lt = self.loss_type
        rows_trl = adv.shape[0] * self.accelerator.num_processes * self.args.steps_per_generation
        fixed = inputs.get("ext_fixed_normalizer")
        if fixed is not None:
            k = fixed.clamp(min=1).to(adv.dtype)
            if lt in compat.SEQUENCE_LEVEL_LOSSES:
                return rows_trl / k
            if lt in compat.GLOBAL_TOKEN_LEVEL_LOSSES:
                return inputs["num_items_in_batch"].clamp(min=1).to(adv.dtype) / (
                    k * float(self.args.max_completion_length))
            raise ValueError(f"a fixed policy normalizer does not support loss_type={lt!r}.")
        if self.args.signal_only_denominator:
            if lt in compat.SEQUENCE_LEVEL_LOSSES:
                return rows_trl / inputs["ext_num_signal"].clamp(min=1).to(adv.dtype)
            if lt in compat.GLOBAL_TOKEN_LEVEL_LOSSES:
                # the policy term only: the KL term keeps num_items_in_batch
                return inputs["num_items_in_batch"].clamp(min=1).to(adv.dtype) / inputs[
                    "ext_num_signal_tokens"].clamp(min=1).to(adv.dtype)
            if lt in compat.LOCAL_TOKEN_LEVEL_LOSSES:
                mask = inputs["completion_mask"] if "tool_mask" not in inputs else \
                    inputs["completion_mask"] * inputs["tool_mask"]
                live = inputs["ext_signal_mask"].to(mask.dtype).unsqueeze(1)
                return mask.sum().clamp(min=1).to(adv.dtype) / (mask * live).sum().clamp(min=1).to(adv.dtype)
            raise ValueError(f"signal_only_denominator does not support loss_type={lt!r}.")
        real_rows = inputs.get("ext_real_rows")
        if real_rows is not None and lt in compat.SEQUENCE_LEVEL_LOSSES:
            return rows_trl / real_rows.clamp(min=1).to(adv.dtype)
        return None

    def _ext_build_batch(self, inputs, prompts, completion_ids_list, rpf: torch.Tensor, replay: dict | None,
                         side_inputs: dict) -> RolloutBatch:
        """Gather the per-row data of this generation batch into a :class:`RolloutBatch` (all ranks identical)."""
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        n_proc, rank = self.accelerator.num_processes, self.accelerator.process_index
        n_local = len(prompts)
        col = compat.ROW_IDX_COLUMN
        has_idx = all(col in x for x in inputs)
        row_idx_local = torch.tensor([int(x[col]) if has_idx else -1 for x in inputs], dtype=torch.long,
                                     device=device)
        row_idx = compat.gather(row_idx_local).cpu()
        if replay is not None:
            is_pad = compat.gather(torch.tensor(replay["is_pad"], device=device)).cpu()
            lens_local = [0 if p else len(c) for p, c in zip(replay["is_pad"], replay["completion_ids"])]
            local_g = torch.tensor(replay["group_ids"], dtype=torch.long, device=device)
            rank_col = torch.full_like(local_g, rank)
            keys = compat.gather(torch.stack([rank_col, local_g], dim=1)).cpu()
        else:
            is_pad = torch.zeros(n_local * n_proc, dtype=torch.bool)
            lens_local = [len(c) for c in completion_ids_list]
            keys = None
        completion_lengths = compat.gather(torch.tensor(lens_local, dtype=torch.long, device=device)).cpu()
        n = int(row_idx.shape[0])
        group_ids = torch.full((n,), -1, dtype=torch.long)
        if keys is not None:
            key_list = [tuple(k) for k in keys.tolist()]
        elif bool((row_idx >= 0).all()):
            key_list = row_idx.tolist()
        else:
            g = self.num_generations if mode == "train" else self.num_generations_eval
            self.warn_once(
                "no_row_idx",
                f"Dataset rows lack the '{col}' column (custom dataset or remove_unused_columns=True); grouping rows "
                f"in contiguous blocks of {g} as TRL does.",
            )
            key_list = [i // g for i in range(n)]
        next_id, seen, prev = -1, set(), object()
        for i, key in enumerate(key_list):
            if bool(is_pad[i]):
                continue
            if key != prev:
                if key in seen:
                    raise RuntimeError(
                        f"Rows of group {key!r} are not contiguous in the generation batch; trl_ext needs each "
                        "prompt's rollouts next to each other (TRL's RepeatSampler guarantees it for the default "
                        "path; a rollout strategy must sort its rollouts by group)."
                    )
                seen.add(key)
                next_id += 1
                prev = key
            group_ids[i] = next_id
        rpf = rpf.float()
        w = self.reward_weights.to(rpf.device)
        unscorable = torch.isnan(rpf).all(dim=1)
        rewards = (rpf * w.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = float("nan")
        grades = None
        if self.args.tie_break_scorer_index is not None:
            grades, rewards = self._ext_tie_break(rpf, group_ids, is_pad, mode)
        extra = {}
        if self.rollout_columns:
            for name in self.rollout_columns:
                missing = [i for i, x in enumerate(inputs) if name not in x]
                if missing:
                    raise KeyError(
                        f"{type(self).__name__}.rollout_columns asks for dataset column {name!r}, missing from the "
                        f"rows (available: {sorted(inputs[0])}). Add the column to the dataset."
                    )
                values = compat.gather_object([x[name] for x in inputs])
                numeric = all(isinstance(v, int | float) and not isinstance(v, bool) or v is None for v in values)
                extra[name] = torch.tensor([float("nan") if v is None else float(v) for v in values],
                                           dtype=torch.float64) if numeric else values
        return RolloutBatch(
            side_inputs=self._ext_gather_side_inputs(side_inputs, n_local),
            rewards=rewards.cpu(),
            rewards_per_func=rpf.cpu(),
            group_ids=group_ids,
            row_idx=row_idx,
            prompts=compat.gather_object(list(prompts)),
            completion_lengths=completion_lengths,
            is_pad=is_pad.bool(),
            extra=extra,
            num_processes=n_proc,
            process_index=rank,
            local_sizes=[n_local] * n_proc,
            grades=None if grades is None else grades.cpu(),
            mode=mode,
        )

    def _ext_gather_side_inputs(self, side_inputs: dict, n_local: int) -> dict:
        """A strategy's per-row side inputs of this rank's rows, gathered over ranks: ``{name: float64 ndarray
        (N,)}``, or ``(N, K)`` for an input given as one length-``K`` list of numbers per row. No collective when
        the strategy supplies none (every rank supplies the same names)."""
        import numpy as np

        out = {}
        for key in sorted(side_inputs):
            values = side_inputs[key]
            if len(values) != n_local:
                raise ValueError(f"rollout strategy {self.rollout_strategy.name!r}: side input {key!r} has "
                                 f"{len(values)} values for {n_local} rows.")
            parts = compat.gather_object([[_side_value(v) for v in values]])
            out[key] = np.asarray([v for p in parts for v in p], dtype=np.float64)
        return out

    def _ext_tie_break(self, rpf, group_ids, is_pad, mode):
        """Blend = grade + epsilon * within-class rank (``trl_ext.estimators.tie_break_blend``) on gathered groups.

        Rows whose grade is finite but whose score is NaN keep their grade (no rank bonus) and are counted in
        ``tie_break/nan_scores``; the other rows of their class are ranked among themselves.
        """
        import numpy as np

        from ..estimators import blend_opened_groups, tie_break_blend

        s_idx = self.args.tie_break_scorer_index
        w = self.reward_weights.to(rpf.device)
        checkers = [i for i in range(rpf.shape[1]) if i != s_idx]
        chk = rpf[:, checkers]
        grades = (chk * w[checkers].unsqueeze(0)).nansum(dim=1)
        grades[torch.isnan(chk).all(dim=1) | is_pad.to(rpf.device)] = float("nan")
        scores = rpf[:, s_idx]
        g_np = grades.cpu().double().numpy()
        s_np = scores.cpu().double().numpy()
        gid = group_ids.numpy()
        nan_score = np.isfinite(g_np) & ~np.isfinite(s_np)
        blended = g_np.copy()
        rank_rows = np.isfinite(g_np) & np.isfinite(s_np)
        if rank_rows.any():
            blended[rank_rows] = tie_break_blend(g_np[rank_rows], s_np[rank_rows], gid[rank_rows],
                                                 float(self.args.tie_break_epsilon))
        real = ~is_pad.numpy()
        if real.any():
            diag = blend_opened_groups(g_np[real], blended[real], gid[real])
            m = compat.metrics(self, mode)
            m["tie_break/groups_opened"].append(float(diag.n_opened))
            m["tie_break/frac_tied_by_checker"].append(float(diag.frac_tied_by_checker))
            # share of checker-tied groups the blend opened; undefined (NaN -> dropped by TRL's log) without ties
            m["tie_break/frac_opened"].append(float(diag.frac_opened) if diag.n_tied_by_checker else float("nan"))
            m["tie_break/attempts_in_opened_frac"].append(diag.attempts_in_opened / max(int(real.sum()), 1))
            m["tie_break/nan_scores"].append(float(nan_score.sum()))
            if mode == "train":
                self._ext_totals["tie_break_groups_opened_total"] += int(diag.n_opened)
        return grades, torch.as_tensor(blended, dtype=torch.float32)

    def _ext_confidence_scale(self, batch: RolloutBatch) -> torch.Tensor:
        """(N,) multiplier: ``min(1, score range / noise floor)`` on groups the blend opened, 1 elsewhere."""
        import numpy as np

        scale = torch.ones(batch.num_rows, dtype=torch.float32)
        g = batch.grades.double().numpy()
        blended = batch.rewards.double().numpy()
        s = batch.rewards_per_func[:, self.args.tie_break_scorer_index].double().numpy()
        gid = batch.group_ids.numpy()
        floor = float(self.args.scorer_noise_floor)
        applied = []
        for k in range(batch.num_groups):
            rows = (gid == k) & np.isfinite(g)
            if rows.sum() < 2:
                continue
            gg, bb, ss = g[rows], blended[rows], s[rows]
            if gg.max() - gg.min() == 0 and bb.max() - bb.min() > 0:  # formerly tied, opened by the blend
                ss = ss[np.isfinite(ss)]
                c = min(1.0, float(ss.max() - ss.min()) / floor) if ss.size else 0.0
                scale[torch.as_tensor(gid == k)] = c
                applied.append(c)
        if applied:
            self.log_ext_metric("tie_break/confidence_scale_mean", float(np.mean(applied)), batch.mode)
        return scale

    def _ext_finalize(self, out: dict, batch: RolloutBatch, replayed: bool) -> dict:
        """Replace TRL's advantages with :meth:`compute_advantages` and add trl_ext bookkeeping and metrics."""
        mode = batch.mode
        device = out["advantages"].device
        adv = self.compute_advantages(batch)
        if not isinstance(adv, torch.Tensor):
            raise TypeError(f"{type(self).__name__}.compute_advantages must return a torch.Tensor, got "
                            f"{type(adv).__name__}.")
        if adv.ndim not in (1, 2) or adv.shape[0] != batch.num_rows:
            raise ValueError(f"{type(self).__name__}.compute_advantages returned shape {tuple(adv.shape)}; expected "
                             f"({batch.num_rows},) or ({batch.num_rows}, T) (global rows of the RolloutBatch).")
        adv = adv.detach().float().cpu().clone()
        valid = batch.valid
        bad = ~torch.isfinite(adv.reshape(batch.num_rows, -1)).all(dim=1) & valid
        if bad.any():
            raise ValueError(f"{type(self).__name__}.compute_advantages returned non-finite advantages on "
                             f"{int(bad.sum())} valid rows (first: {bad.nonzero()[:5].flatten().tolist()}).")
        shape_tail = (1,) * (adv.ndim - 1)
        adv = torch.where(valid.view(-1, *shape_tail), adv, torch.zeros_like(adv))
        adv = torch.nan_to_num(adv, nan=0.0)
        if self.args.tie_break_confidence_scaling and batch.grades is not None:
            adv = adv * self._ext_confidence_scale(batch).view(-1, *shape_tail)
        local = batch.local_slice()
        if adv.ndim == 2 and adv.shape[1] != out["completion_ids"].shape[1]:
            raise ValueError(f"(N, T) advantages must have T = completion length {out['completion_ids'].shape[1]}, "
                             f"got {adv.shape[1]}.")
        n_real = int((~batch.is_pad).sum())
        out["advantages"] = adv[local].to(device)
        # Denominators for _ext_policy_scale, as 0-dim tensors (they survive TRL's shuffle and split_tensor_dict)
        if bool(batch.is_pad.any()) and n_real > 0:
            # sequence-level losses average over all rows, pads included: the policy term is rescaled to the real
            # rows (independent of how many pads each rank got), and so is the KL term (beta * N / n_real)
            out["ext_real_rows"] = torch.tensor(float(n_real), device=device)
            if self.loss_type in compat.SEQUENCE_LEVEL_LOSSES:
                out["ext_kl_rescale"] = torch.tensor(batch.num_rows / n_real, dtype=torch.float32, device=device)
        if batch.fixed_normalizer is not None:
            if self.args.signal_only_denominator:
                raise ValueError(f"rollout strategy {self.rollout_strategy.name!r} returned a fixed policy normalizer, "
                                 "which cannot be combined with signal_only_denominator; set "
                                 "signal_only_denominator=False.")
            out["ext_fixed_normalizer"] = torch.tensor(float(batch.fixed_normalizer), device=device)
        # pad rows: no loss, excluded from the token normalizer
        pad_local = batch.is_pad[local].to(device)
        if pad_local.any():
            out["completion_mask"] = out["completion_mask"] * (~pad_local).unsqueeze(1).to(out["completion_mask"].dtype)
            if "tool_mask" in out:
                out["tool_mask"] = out["tool_mask"] * (~pad_local).unsqueeze(1).to(out["tool_mask"].dtype)
        loss_mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
        if pad_local.any() or batch.is_pad.any():
            out["num_items_in_batch"] = compat.gather(loss_mask.sum()).sum()
        # signal-only bookkeeping (global counts survive shuffle/split as 0-dim tensors)
        nonzero_row = adv.reshape(batch.num_rows, -1).ne(0).any(dim=1) & valid
        live_groups = torch.zeros(max(batch.num_groups, 1), dtype=torch.bool)
        gid = batch.group_ids
        if nonzero_row.any():
            live_groups[gid[nonzero_row]] = True
        live_row = (gid >= 0) & live_groups[gid.clamp(min=0)] & ~batch.is_pad
        if self.args.signal_only_denominator:
            live_local = live_row[local].to(device)
            out["ext_num_signal"] = live_row.sum().to(device)
            out["ext_num_signal_tokens"] = compat.gather((loss_mask * live_local.unsqueeze(1)).sum()).sum()
            out["ext_signal_mask"] = live_local
        self._ext_log_batch_metrics(batch, adv, live_row, mode, replayed)
        self.last_rollout_batch = batch
        self.last_advantages = adv
        return out

    def _ext_log_shared_prefix(self, m) -> None:
        """Shared-prefix counters summed over ranks (max for ``max_branches``): model positions computed vs what
        independent sampling would compute. Generated tokens are unchanged (``ext/generated_tokens``)."""
        keys = ("forward_tokens", "computed_tokens", "independent_tokens", "shared_positions", "decode_tokens",
                "decode_shared_positions")
        local = torch.tensor([self._ext_sp_local.get(k, 0.0) for k in keys], dtype=torch.float64,
                             device=self.accelerator.device)
        tot = dict(zip(keys, compat.gather(local.unsqueeze(0)).sum(dim=0).tolist()))
        branches = compat.gather(torch.tensor([self._ext_sp_local.get("max_branches", 0.0)], dtype=torch.float64,
                                              device=self.accelerator.device)).max().item()
        self._ext_sp_local = {}
        m["ext/shared_prefix/forward_tokens"].append(tot["forward_tokens"])
        m["ext/shared_prefix/computed_tokens"].append(tot["computed_tokens"])
        m["ext/shared_prefix/independent_tokens"].append(tot["independent_tokens"])
        if tot["independent_tokens"] > 0:
            m["ext/shared_prefix/saved_fraction"].append(1.0 - tot["computed_tokens"] / tot["independent_tokens"])
        if tot["computed_tokens"] > 0:
            m["ext/shared_prefix/shared_fraction"].append(tot["shared_positions"] / tot["computed_tokens"])
        if tot["decode_tokens"] > 0:
            m["ext/shared_prefix/decode_shared_fraction"].append(tot["decode_shared_positions"] / tot["decode_tokens"])
        m["ext/shared_prefix/max_branches"].append(float(branches))

    def _ext_log_batch_metrics(self, batch: RolloutBatch, adv: torch.Tensor, live_row: torch.Tensor, mode: str,
                               replayed: bool):
        m = compat.metrics(self, mode)
        real = ~batch.is_pad
        gid = torch.where(batch.is_pad, torch.full_like(batch.group_ids, -1), batch.group_ids)
        # frac_reward_zero_std: fraction of rows whose group (>= 2 scorable rewards) has zero std, on the reward the
        # estimator used. Fixes TRL's reading for G = 1 (always 1.0), ragged groups and scale_rewards="batch".
        std_row = torch.full((batch.num_rows,), float("nan"))
        if (gid >= 0).any():
            k = int(gid.max()) + 1
            std_row[gid >= 0] = group_mean_std(batch.rewards[gid >= 0].float(), gid[gid >= 0], k)[1][gid[gid >= 0]]
        defined = ~torch.isnan(std_row)
        if defined.any():
            frac = torch.isclose(std_row[defined], torch.zeros_like(std_row[defined])).float().mean().item()
            compat.replace_last_metric(self, mode, "frac_reward_zero_std", frac)
        else:  # no group with >= 2 rewards (e.g. G = 1): undefined -> NaN, which TRL's `log` drops (logs None)
            compat.replace_last_metric(self, mode, "frac_reward_zero_std", float("nan"))
        # completions table: drop pad rows, log the final advantages
        flat_adv = adv.reshape(batch.num_rows, -1)
        adv_log = flat_adv[:, 0] if adv.ndim == 1 else flat_adv.mean(dim=1)
        # advantage scale of the real rows (compares step sizes across estimators: GRPO's z-scores vs Eq.-13 sums)
        if real.any():
            a_abs = adv_log[real].abs().float()
            self.log_ext_metric("adv/abs_mean", float(a_abs.mean()), mode)
            self.log_ext_metric("adv/abs_max", float(a_abs.max()), mode)
        compat.rewrite_completion_logs(self, batch.num_rows, real.tolist(), adv_log.tolist())
        if self.args.log_rollout_metadata:
            from collections import deque

            keep = real.tolist()
            cols = {"row_idx": batch.row_idx.tolist(), "group_id": batch.group_ids.tolist()}
            for name, values in batch.extra.items():
                cols[name] = values.tolist() if isinstance(values, torch.Tensor) else list(values)
            # align each metadata column with the `prompt` column: its older rows (None where the column did not
            # exist yet), then this batch's real rows
            logs = compat.completion_logs(self)
            n_prev = max(len(logs["prompt"]) - int(real.sum()), 0)
            for name, values in cols.items():
                old = list(logs["extra"][name])[-n_prev:] if n_prev else []
                old = [None] * (n_prev - len(old)) + old
                logs["extra"][name] = deque(old + [v for v, k in zip(values, keep) if k],
                                            maxlen=logs["prompt"].maxlen)
        if replayed:
            # variable-size batch: the table holds exactly this generation batch's real rollouts (TRL's fixed-size
            # deques hold exactly the latest generation batch too)
            n_keep = int(real.sum())
            compat.resize_completion_logs(self, max(n_keep, int(self.args.generation_batch_size)), keep_last=n_keep)
        # shut gate on the checker grade (the blend's input) or the reward
        if self.args.log_shut_gate:
            r = batch.grades if batch.grades is not None else batch.rewards
            stats = shut_gate_stats(r[real], batch.group_ids[real], success_threshold=self.args.gate_success_threshold,
                                    atol=self.args.gate_atol)
            for name, value in stats.as_metrics("gate/").items():
                m[name].append(value)
        # signal share and generated tokens
        n_real = int(real.sum())
        m["ext/signal_row_frac"].append(float(live_row.sum()) / max(n_real, 1))
        # the one generated-token counter: every token generated on any rank since the previous batch (discarded
        # rounds, probe prefixes, filtered groups and dummy rows included); trained_tokens: the rows in the loss
        local = torch.tensor([self._ext_gen_tokens_local], dtype=torch.long, device=self.accelerator.device)
        self._ext_gen_tokens_local = 0
        gen_tokens = int(compat.gather(local).sum().item())
        m["ext/generated_tokens"].append(float(gen_tokens))
        if self.args.shared_prefix_rollouts:
            self._ext_log_shared_prefix(m)
        m["ext/trained_tokens"].append(float(batch.completion_lengths[real].sum()))
        m["ext/rollouts"].append(float(n_real))
        # unscorable rollouts (every reward function returned None / NaN), counted over all ranks: they get advantage
        # 0 and no say in any baseline; a whole unscorable batch is a zero-gradient step
        n_unscorable = int((batch.unscorable & real).sum())
        m["ext/unscorable_rows"].append(float(n_unscorable))
        if n_unscorable and mode == "train":
            self._ext_totals["unscorable_rows_total"] += n_unscorable
            if n_unscorable == n_real:
                warnings.warn(f"Every one of the {n_real} rollouts of this generation batch is unscorable (all reward "
                              "functions returned None or NaN): the step trains on nothing.", stacklevel=2)
            else:
                self.warn_once("unscorable_rows", f"{n_unscorable} of {n_real} rollouts of a generation batch are "
                                    "unscorable (every reward function returned None or NaN, on any rank): they get "
                                    "advantage 0 and are counted in ext/unscorable_rows (and the checkpointed "
                                    "unscorable_rows_total).")
        if mode == "train":
            self._ext_totals["generated_tokens_total"] += gen_tokens
            self._ext_totals["generation_batches"] += 1
        if self._ext_totals["generation_batches"]:
            m["ext/generated_tokens_total"] = [float(self._ext_totals["generated_tokens_total"])]

"""Benchmark-only baseline trainers: RLOO and single-rollout REINFORCE++ on top of ``trl_ext.GRPOTrainer``.

They exist so that ``benchmarks/compare_trainers.py`` can put the two classic critic-free baselines on the same
code path (same sampler, generation, loss, logging and generated-token accounting) as every trl_ext trainer.
Both only override the estimator hook :meth:`trl_ext.GRPOTrainer.compute_advantages` (``docs/base_trainer.md``)
with the pure estimators of :mod:`trl_ext.estimators`:

``RLOOBenchTrainer``
    Leave-one-out baseline inside each prompt group, ``A_i = r_i - (sum_g r - r_i) / (n_g - 1)``
    (:func:`trl_ext.estimators.rloo_advantages`, no whitening; TRL's ``RLOOTrainer`` default). A group with a
    single scorable rollout has no leave-one-out baseline and gets advantage 0 (counted in
    ``bench/rloo_degenerate``).
``ReinforcePPBenchTrainer``
    REINFORCE++ with one rollout per prompt: ``unique_prompt_sampler = True`` (every prompt of a generation batch is
    distinct, G = 1) and the *global* batch-mean baseline with batch standardisation,
    ``A_i = (r_i - mean_batch r) / (std_batch r + eps)`` (:func:`trl_ext.estimators.reinforce_pp_advantages`; the
    single-rollout baseline BASIS is compared with in ``basis_batchwise_single_rollout.txt``, Section 5). Keep
    ``args.num_generations`` at a value >= 2 that divides ``generation_batch_size`` so TRL's config check passes;
    the trainer then generates one rollout per prompt.

Pad rows (``batch.is_pad``) and unscorable rows (NaN reward) get advantage 0; the estimators see only the valid
rows. These classes are not part of the public ``trl_ext`` API.
"""

from __future__ import annotations

import numpy as np
import torch

from trl_ext.estimators import reinforce_pp_advantages, rloo_advantages
from trl_ext.trainers.base import GRPOTrainer

__all__ = ["RLOOBenchTrainer", "ReinforcePPBenchTrainer", "valid_rows_advantages"]


def valid_rows_advantages(batch, estimator, **kwargs) -> tuple[torch.Tensor, object | None]:
    """Run a pure ``estimator(rewards, group_ids, **kwargs)`` on the valid rows of ``batch``; zeros elsewhere.

    Parameters
    ----------
    batch : trl_ext.trainers.batch.RolloutBatch
        Global generation batch (``rewards`` (N,), ``group_ids`` (N,), ``valid`` (N,) bool).
    estimator : callable
        Returns an :class:`~trl_ext.estimators.baselines.AdvantageResult`.

    Returns
    -------
    advantages : Tensor, shape (N,), float32
        Estimator advantages on valid rows, 0 on pad / unscorable rows.
    result : AdvantageResult or None
        ``None`` when no row is valid (then every advantage is 0: nothing to learn from this batch).
    """
    valid = batch.valid
    adv = torch.zeros(batch.num_rows, dtype=torch.float32)
    if not bool(valid.any()):
        return adv, None
    r = batch.rewards[valid].double().numpy()
    g = batch.group_ids[valid].numpy()
    res = estimator(r, g, **kwargs)
    adv[valid] = torch.as_tensor(np.asarray(res.advantages), dtype=torch.float32)
    return adv, res


class RLOOBenchTrainer(GRPOTrainer):
    """GRPO sampling (G rollouts per prompt) with the RLOO leave-one-out baseline and no std scaling."""

    def compute_advantages(self, batch):
        adv, res = valid_rows_advantages(batch, rloo_advantages, normalize=False)
        self.log_ext_metric("bench/rloo_degenerate", 0 if res is None else res.n_degenerate, batch.mode)
        return adv


class ReinforcePPBenchTrainer(GRPOTrainer):
    """One rollout per prompt, global batch-mean baseline, batch standardisation (REINFORCE++)."""

    unique_prompt_sampler = True

    def compute_advantages(self, batch):
        adv, res = valid_rows_advantages(batch, reinforce_pp_advantages, normalize=True)
        base = float("nan") if res is None else float(np.nanmean(res.baselines))
        self.log_ext_metric("bench/batch_mean_baseline", base, batch.mode)
        return adv

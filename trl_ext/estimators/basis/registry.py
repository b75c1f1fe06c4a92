"""The ``"basis"`` entry of the advantage-estimator registry: BASIS advantages with per-call beta calibration."""

from __future__ import annotations

import sys

import numpy as np

from ._checks import f64
from .advantages import baseline_on_reward_scale, basis_advantages


def _register():
    from ..baselines import AdvantageResult, group_stats, register_advantage_estimator

    @register_advantage_estimator("basis", min_group_size=1, side_inputs={"p_hat": "row"},
                                  used_by="trl_ext.BASISTrainer", sees_unscorable=True)
    def basis_registry_advantages(
        rewards,
        group_ids=None,
        *,
        p_hat,
        beta_grid=None,
        variant: str = "unb",
        objective: str = "robust",
        eps: float = 1e-6,
        fallback: str = "zero",
        min_active_fraction: float = 0.0,
        normalize: bool = False,
        norm_eps: float = 1e-4,
        reward_range=None,
    ) -> AdvantageResult:
        """BASIS advantages ``r_i - b_i`` with per-call beta calibration (registry name ``"basis"``).

        Parameters
        ----------
        rewards : array_like, shape (N,)
            One reward per rollout, in [0, 1] or in ``reward_range``; NaN = unscorable (advantage 0, counted in
            ``n_nan``).
        group_ids : array_like, shape (N,), optional
            Prompt ids; only used for the ``n_groups`` / ``n_zero_std_groups`` diagnostics. BASIS is designed for
            one rollout per prompt, but repeated prompts are allowed: rollouts are independent given the prompt,
            so the leave-one-out weights of Proposition 1 stay unbiased.
        p_hat : array_like, shape (N,) or (N, K)
            Per-rollout reference pass rate, or V_beta table row (see :func:`calibrate_beta`). Required.
        beta_grid, variant, objective, eps, fallback, min_active_fraction
            See :func:`calibrate_beta`.
        normalize : bool
            Divide by the std of the finite advantages + ``norm_eps`` with :func:`std_scale_advantages` (on the
            reward's own scale; ``BASISTrainer``'s ``basis_scale_advantages``; off by default, the paper uses the
            raw ``r - b``). With fewer than 2 finite rewards nothing is scaled (``scale`` 1).
        norm_eps : float
            Guard added to the std (TRL's 1e-4).
        reward_range : tuple of float, optional
            ``(lo, hi)`` of the value table: rewards are mapped to [0, 1] for the calibration with
            :func:`rewards_to_unit` (a reward further than ``RANGE_TOL`` outside raises ``ValueError``) and the
            baseline is mapped back, so advantages and ``baselines`` are on the reward's scale (see
            :func:`basis_advantages`). ``None``: rewards in [0, 1].

        Returns
        -------
        AdvantageResult
            ``baselines`` on the reward's scale. ``extras``: ``beta``, ``loss``, ``active_fraction``,
            ``n_fallback``, ``n_no_source``, ``frac_extreme`` and the full :class:`CalibrationResult` (on the
            [0, 1] scale) under ``"calibration"``. ``n_degenerate`` is 0 (fallback prompts keep a non-zero
            advantage ``r_i - fallback``).
        """
        adv, cal = basis_advantages(rewards, p_hat, beta_grid=beta_grid, variant=variant, objective=objective,
                                    eps=eps, fallback=fallback, min_active_fraction=min_active_fraction,
                                    reward_range=reward_range)
        ok = cal.result.valid
        n = adv.shape[0]
        divisor = 1.0
        if normalize:
            # looked up on the package at call time: `trl_ext.estimators.basis.std_scale_advantages` is the one
            # implementation the trainer shares, and tests replace that attribute to check the registry uses it
            std_scale = sys.modules[__package__].std_scale_advantages
            adv, divisor = std_scale(adv, ok, eps=norm_eps)
        scale = np.full(n, divisor)
        ids = np.arange(n) if group_ids is None else group_ids
        st = group_stats(f64(rewards), ids)
        cnt, sd_g = st["count"], np.nan_to_num(st["std"], nan=0.0)
        n_zero = int(np.sum((cnt >= 1) & ((cnt == 1) | np.isclose(sd_g, 0.0, atol=1e-12))))
        extras = {"beta": cal.beta, "loss": cal.loss, "active_fraction": cal.active_fraction,
                  "n_fallback": cal.n_fallback, "n_no_source": cal.result.n_no_source,
                  "frac_extreme": cal.frac_extreme, "calibration": cal}
        baseline = baseline_on_reward_scale(cal.baseline, reward_range)
        return AdvantageResult(adv, baseline, scale, cal.result.n_nan_rewards, int(cnt.shape[0]), n_zero, 0, extras)

    return basis_registry_advantages


basis_registry_advantages = _register()

r"""PAIR prefix heads: success and remaining-cost predictors with IPW losses, a replay window and temperature
calibration ("Pairwise-Aware Inclusion Reweighting for Adaptive Rollout Allocation in RLVR", arXiv:2608.11368,
Section 4.2, Eq. 5-7, Appendix C).

Pure torch (no TRL import; moved here from ``trl_ext.trainers`` so any RL stack can use it). Not re-exported by
:mod:`trl_ext.estimators` (which stays numpy-only at import); import it as ``trl_ext.estimators.pair_heads``.
A trainer feeds a stop-gradient summary of each prefix's hidden states
(:func:`prefix_summary`, default the mean of the last 16 positions) to

.. math::
    \hat p_i = \sigma(f_\phi(u_i) / T), \qquad \hat c_i = s\,\mathrm{softplus}(g_\omega(u_i))   \quad\text{(Eq. 5)}

where :math:`T` is a scalar temperature fitted on the newest quarter of the replay window (Appendix C) and
:math:`s` a fixed cost unit (the median remaining cost of the first batch of labels; 1 before any label) so that the
head's output is O(1) whatever the token scale -- an addition to Eq. 5 that only rescales the head. Heads are
trained only on *completed* candidates (delayed labels), which were observed with unequal continuation probabilities
:math:`\pi_i`; the losses are therefore inverse-probability weighted (Eq. 6-7):

.. math::
    \mathcal L_p = \sum_i \frac{J_i}{\pi_i}(\hat p_i - r_i)^2, \qquad
    \mathcal L_c = \sum_i \frac{J_i}{\pi_i}(\log\hat c_i - \log C_i)^2 .

Typical use per RL step: ``pred = heads.predict(u)`` (frozen, no grad) -> design -> continuation -> after the policy
update ``heads.add_labels(u[done], r[done], C[done], pi[done])`` then ``heads.refresh()``. Before ``heads.ready``
(fewer than ``min_labels`` labels) a trainer should use the uniform design (warm-up).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "HeadPrediction",
    "PrefixHeads",
    "brier_score",
    "cost_mape",
    "expected_calibration_error",
    "ipw_brier_loss",
    "ipw_log_cost_loss",
    "make_head",
    "prefix_summary",
]

MIN_COST = 1.0  # remaining-token labels are floored at one token before the log (a candidate may end at the prefix)


def make_head(input_dim: int, hidden: int = 256) -> nn.Sequential:
    """Two-layer MLP head (Appendix C): ``LayerNorm(input) -> Linear(input, hidden) -> SiLU -> Linear(hidden, 1)``.

    The input LayerNorm makes the head insensitive to the scale of the policy's hidden states.
    """
    if input_dim < 1 or hidden < 1:
        raise ValueError(f"input_dim and hidden must be >= 1, got {input_dim}, {hidden}.")
    return nn.Sequential(nn.LayerNorm(input_dim), nn.Linear(input_dim, hidden), nn.SiLU(), nn.Linear(hidden, 1))


@torch.no_grad()
def model_prefix_summary(model, seqs: list[list[int]], pad_token_id: int, last_k: int = 16,
                         device=None) -> torch.Tensor:
    """:func:`prefix_summary` of ``model``'s final hidden states over token sequences ``seqs`` (Appendix C).

    Left-pads the sequences, passes explicit position ids (``mask.cumsum - 1``, so padding does not shift positions)
    and runs the model in eval mode (no dropout) without a cache, restoring its train/eval mode after.

    Returns
    -------
    Tensor (B, H), float32, on the CPU.
    """
    from ..measurement.keyed_sampling import left_pad

    device = next(model.parameters()).device if device is None else device
    ids, mask = left_pad(seqs, int(pad_token_id))
    pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
    was_training = model.training
    model.eval()
    kw = {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": pos.to(device),
          "output_hidden_states": True, "use_cache": False}
    try:
        try:
            # only the hidden states are used: skip the vocabulary projection of every position but the last
            # (transformers' logits_to_keep; on SmolLM2 the full logits are 49,152 floats a position)
            out = model(**kw, logits_to_keep=1)
        except TypeError:  # a model whose forward has no logits_to_keep
            out = model(**kw)
    finally:
        model.train(was_training)
    return prefix_summary(out.hidden_states[-1], mask.to(device), last_k=int(last_k)).cpu()


def prefix_summary(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, last_k: int = 16):
    """Stop-gradient mean of the last ``last_k`` non-padding positions of each prefix (Appendix C).

    Parameters
    ----------
    hidden_states : Tensor (B, T, H)
    attention_mask : Tensor (B, T), optional
        1 for real tokens. Right or left padding both work (the *last* real positions are used).
    last_k : int >= 1

    Returns
    -------
    Tensor (B, H), float32, detached. A row with no real token raises ``ValueError``.
    """
    if hidden_states.ndim != 3:
        raise ValueError(f"hidden_states must be (B, T, H), got {tuple(hidden_states.shape)}.")
    if last_k < 1:
        raise ValueError("last_k must be >= 1.")
    h = hidden_states.detach().float()
    B, T, _ = h.shape
    mask = torch.ones(B, T, device=h.device) if attention_mask is None else attention_mask.detach().float()
    if mask.shape != (B, T):
        raise ValueError(f"attention_mask must be ({B}, {T}), got {tuple(mask.shape)}.")
    if torch.any(mask.sum(dim=1) == 0):
        raise ValueError("a prefix has no real token (all-zero attention_mask row).")
    # rank of each real position counted from the end; keep the last_k
    from_end = torch.flip(torch.cumsum(torch.flip(mask, [1]), dim=1), [1]) * mask
    keep = ((from_end >= 1) & (from_end <= last_k)).float()
    return (h * keep[..., None]).sum(dim=1) / keep.sum(dim=1, keepdim=True)


def _weights(inclusion: torch.Tensor) -> torch.Tensor:
    if torch.any(~torch.isfinite(inclusion)) or torch.any(inclusion <= 0) or torch.any(inclusion > 1):
        raise ValueError("inclusion probabilities must lie in (0, 1].")
    return 1.0 / inclusion


def ipw_brier_loss(p_hat: torch.Tensor, rewards: torch.Tensor, inclusion: torch.Tensor) -> torch.Tensor:
    r"""Eq. 6 divided by the number of labels: :math:`\frac1n\sum_i \pi_i^{-1}(\hat p_i - r_i)^2` over completed
    candidates (pass only completed ones)."""
    return (_weights(inclusion) * (p_hat - rewards) ** 2).sum() / max(p_hat.numel(), 1)


def ipw_log_cost_loss(cost_hat: torch.Tensor, costs: torch.Tensor, inclusion: torch.Tensor) -> torch.Tensor:
    r"""Eq. 7 divided by the number of labels: :math:`\frac1n\sum_i \pi_i^{-1}(\log\hat c_i - \log C_i)^2`;
    ``costs`` are floored at :data:`MIN_COST`."""
    return (_weights(inclusion) * (torch.log(cost_hat) - torch.log(costs.clamp_min(MIN_COST))) ** 2).sum() / max(
        cost_hat.numel(), 1
    )


def brier_score(p_hat, rewards, weights=None) -> float:
    """(Weighted) mean squared error of probabilities against binary outcomes."""
    p, r = torch.as_tensor(p_hat, dtype=torch.float64), torch.as_tensor(rewards, dtype=torch.float64)
    w = torch.ones_like(p) if weights is None else torch.as_tensor(weights, dtype=torch.float64)
    return float((w * (p - r) ** 2).sum() / w.sum())


def expected_calibration_error(p_hat, rewards, n_bins: int = 15) -> float:
    """ECE with ``n_bins`` equal-mass bins (Appendix C: 15): sum_b (n_b/n) |mean(p_b) - mean(r_b)|."""
    p = torch.as_tensor(p_hat, dtype=torch.float64).flatten()
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if p.numel() == 0 or p.shape != r.shape:
        raise ValueError("p_hat and rewards must be non-empty and of equal length.")
    order = torch.argsort(p)
    total = 0.0
    for chunk in torch.tensor_split(order, min(n_bins, p.numel())):
        if chunk.numel():
            total += chunk.numel() * abs(float(p[chunk].mean() - r[chunk].mean()))
    return total / p.numel()


def cost_mape(cost_hat, costs) -> float:
    """Mean absolute percentage error of predicted remaining cost (costs floored at :data:`MIN_COST`)."""
    c_hat = torch.as_tensor(cost_hat, dtype=torch.float64)
    c = torch.as_tensor(costs, dtype=torch.float64).clamp_min(MIN_COST)
    return float(((c_hat - c).abs() / c).mean())


@dataclass
class HeadPrediction:
    """Output of :meth:`PrefixHeads.predict`.

    ``p_hat`` in (0, 1) and ``cost_hat`` > 0, both float64 CPU tensors of shape (B,). Non-finite head outputs
    (e.g. NaN features) are replaced by p = 0.5 and the replay window's median cost (or 1.0 when empty), and counted
    in ``n_nonfinite`` -- the trainer should log it.
    """

    p_hat: torch.Tensor
    cost_hat: torch.Tensor
    n_nonfinite: int


class PrefixHeads:
    """Success and remaining-cost heads with their optimizer, replay window and temperature.

    Parameters
    ----------
    input_dim : int
        Width of the prefix summary (the policy's hidden size).
    hidden : int
        MLP width (paper: 256).
    replay_size : int
        Replay window capacity in labels (paper: 2048); FIFO.
    lr, weight_decay : float
        AdamW settings for both heads.
    min_labels : int
        Labels needed before :attr:`ready` (warm-up; a trainer uses the uniform design until then).
    calib_fraction : float in (0, 1)
        Newest fraction of the window used to fit the temperature (paper: a quarter) and held out from the head
        update in :meth:`refresh`.
    seed : int, optional
        Seeds the head initialization and minibatch sampling.
    """

    def __init__(
        self,
        input_dim: int,
        hidden: int = 256,
        *,
        replay_size: int = 2048,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        min_labels: int = 64,
        calib_fraction: float = 0.25,
        seed: int | None = None,
    ):
        if replay_size < 4:
            raise ValueError("replay_size must be >= 4.")
        if not 0.0 < calib_fraction < 1.0:
            raise ValueError("calib_fraction must be in (0, 1).")
        self.config = dict(
            input_dim=int(input_dim),
            hidden=int(hidden),
            replay_size=int(replay_size),
            lr=float(lr),
            weight_decay=float(weight_decay),
            min_labels=int(min_labels),
            calib_fraction=float(calib_fraction),
            seed=seed,
        )
        self.generator = torch.Generator()
        with torch.random.fork_rng(devices=[]):  # seed the initialization without touching the global RNG
            if seed is not None:
                self.generator.manual_seed(int(seed))
                torch.manual_seed(int(seed))
            self.success_head = make_head(input_dim, hidden)
            self.cost_head = make_head(input_dim, hidden)
        params = list(self.success_head.parameters()) + list(self.cost_head.parameters())
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        self.temperature = 1.0
        self.cost_scale = 1.0
        self.n_seen = 0
        self._feat = torch.zeros(0, input_dim)
        self._reward = torch.zeros(0)
        self._cost = torch.zeros(0)
        self._pi = torch.zeros(0)

    # ------------------------------------------------------------------------------------------ replay window
    @property
    def n_labels(self) -> int:
        return int(self._reward.numel())

    @property
    def ready(self) -> bool:
        """True once the window holds ``min_labels`` labels (before that: warm-up, use the uniform design)."""
        return self.n_labels >= self.config["min_labels"]

    def add_labels(self, features, rewards, costs, inclusion) -> None:
        """Append delayed labels of completed candidates (oldest dropped beyond ``replay_size``).

        Parameters
        ----------
        features : Tensor (n, input_dim)
            Prefix summaries logged at design time (detached).
        rewards : Tensor (n,), in [0, 1]
        costs : Tensor (n,), realized remaining suffix tokens, >= 0
        inclusion : Tensor (n,), the logged continuation probabilities pi_i in (0, 1]
        """
        f = torch.as_tensor(features).detach().float().cpu()
        r = torch.as_tensor(rewards).detach().float().cpu().flatten()
        c = torch.as_tensor(costs).detach().float().cpu().flatten()
        pi = torch.as_tensor(inclusion).detach().float().cpu().flatten()
        n = r.numel()
        if f.ndim != 2 or f.shape != (n, self.config["input_dim"]) or c.numel() != n or pi.numel() != n:
            raise ValueError(
                f"expected features ({n}, {self.config['input_dim']}) and rewards/costs/inclusion of length {n}; got "
                f"{tuple(f.shape)}, {tuple(c.shape)}, {tuple(pi.shape)}."
            )
        for name, t in (("features", f), ("rewards", r), ("costs", c), ("inclusion", pi)):
            if not torch.all(torch.isfinite(t)):
                raise ValueError(f"{name} contain NaN/inf; pass only completed, scored candidates.")
        if torch.any((r < 0) | (r > 1)):
            raise ValueError("rewards must lie in [0, 1] for the success head.")
        if torch.any(c < 0):
            raise ValueError("costs must be >= 0 (remaining suffix tokens).")
        _weights(pi)
        if self.n_seen == 0:  # fix the cost unit once, so the head's output is O(1)
            self.cost_scale = max(float(c.median()), MIN_COST) if n else 1.0
        cap = self.config["replay_size"]
        self._feat = torch.cat([self._feat, f])[-cap:]
        self._reward = torch.cat([self._reward, r])[-cap:]
        self._cost = torch.cat([self._cost, c])[-cap:]
        self._pi = torch.cat([self._pi, pi])[-cap:]
        self.n_seen += n

    # ------------------------------------------------------------------------------------------ prediction
    def _forward(self, features: torch.Tensor):
        logit = self.success_head(features).squeeze(-1)
        raw_cost = self.cost_head(features).squeeze(-1)
        return logit, self.cost_scale * F.softplus(raw_cost) + 1e-6

    @torch.no_grad()
    def predict(self, features) -> HeadPrediction:
        """Frozen predictions (Eq. 5) with the current temperature; see :class:`HeadPrediction`."""
        f = torch.as_tensor(features).detach().float().cpu()
        if f.ndim != 2 or f.shape[1] != self.config["input_dim"]:
            raise ValueError(f"features must be (B, {self.config['input_dim']}), got {tuple(f.shape)}.")
        self.success_head.eval()
        self.cost_head.eval()
        logit, cost = self._forward(f)
        p = torch.sigmoid(logit / self.temperature).double()
        cost = cost.double()
        bad = ~torch.isfinite(p) | ~torch.isfinite(cost)
        if torch.any(bad):
            fallback_cost = float(self._cost.median()) if self.n_labels else 1.0
            p = torch.where(bad, torch.full_like(p, 0.5), p)
            cost = torch.where(bad, torch.full_like(cost, max(fallback_cost, MIN_COST)), cost)
        return HeadPrediction(p, cost, int(bad.sum()))

    # ------------------------------------------------------------------------------------------ training
    def _split(self):
        n = self.n_labels
        n_cal = max(1, int(math.ceil(self.config["calib_fraction"] * n)))
        return slice(0, n - n_cal), slice(n - n_cal, n)

    def fit(self, steps: int = 50, batch_size: int = 256, *, use_holdout: bool = True) -> dict:
        """Minibatch AdamW steps on Eq. 6 + Eq. 7 over the replay window (older part if ``use_holdout``)."""
        train, _ = self._split() if use_holdout else (slice(0, self.n_labels), None)
        f, r, c, pi = self._feat[train], self._reward[train], self._cost[train], self._pi[train]
        if r.numel() == 0:
            return {"steps": 0, "loss_p": float("nan"), "loss_c": float("nan")}
        self.success_head.train()
        self.cost_head.train()
        lp = lc = torch.tensor(float("nan"))
        for _ in range(int(steps)):
            idx = torch.randint(0, r.numel(), (min(batch_size, r.numel()),), generator=self.generator)
            logit, cost = self._forward(f[idx])
            lp = ipw_brier_loss(torch.sigmoid(logit), r[idx], pi[idx])
            lc = ipw_log_cost_loss(cost, c[idx], pi[idx])
            self.optimizer.zero_grad(set_to_none=True)
            (lp + lc).backward()
            self.optimizer.step()
        return {"steps": int(steps), "loss_p": float(lp.detach()), "loss_c": float(lc.detach())}

    @torch.no_grad()
    def calibrate_temperature(
        self, log_t_range: tuple[float, float] = (-math.log(4.0), math.log(8.0)), iters: int = 60,
        min_labels: int = 64,
    ) -> float:
        """Fit the scalar temperature on the newest ``calib_fraction`` of the window by minimizing the IPW Brier
        score over log T (golden-section search). Returns the temperature.

        The temperature is kept unchanged while the calibration slice holds fewer than ``min_labels`` labels: on a
        handful of perfectly separated labels the Brier minimum sits at the smallest allowed T, which drives every
        prediction to exactly 0 or 1 and makes every edge proxy (and so the design) degenerate. For the same reason
        sharpening is limited to T >= 1/4 (softening up to T = 8 is harmless).
        """
        if self.n_labels == 0:
            return self.temperature
        _, cal = self._split()
        if cal.stop - cal.start < min_labels:
            return self.temperature
        self.success_head.eval()
        logit = self.success_head(self._feat[cal]).squeeze(-1).double()
        r, w = self._reward[cal].double(), 1.0 / self._pi[cal].double()

        def loss(log_t: float) -> float:
            return float((w * (torch.sigmoid(logit / math.exp(log_t)) - r) ** 2).sum())

        lo, hi = log_t_range
        g = (math.sqrt(5) - 1) / 2
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        fa, fb = loss(a), loss(b)
        for _ in range(iters):
            if fa < fb:
                hi, b, fb = b, a, fa
                a = hi - g * (hi - lo)
                fa = loss(a)
            else:
                lo, a, fa = a, b, fb
                b = lo + g * (hi - lo)
                fb = loss(b)
        self.temperature = math.exp(0.5 * (lo + hi))
        return self.temperature

    def refresh(self, steps: int = 50, batch_size: int = 256) -> dict:
        """After an RL update: fit the heads on the older part of the window, then the temperature on the newest
        quarter (held out from the fit). Returns the fit losses and the temperature."""
        out = self.fit(steps=steps, batch_size=batch_size)
        out["temperature"] = self.calibrate_temperature()
        return out

    @torch.no_grad()
    def diagnostics(self) -> dict:
        """Brier score, ECE (15 equal-mass bins), ROC AUC and cost MAPE of the current heads on the calibration
        slice."""
        from ..stats.auc import auc

        if self.n_labels == 0:
            return {"brier": float("nan"), "ece": float("nan"), "auc": float("nan"), "cost_mape": float("nan"),
                    "n": 0}
        _, cal = self._split()
        pred = self.predict(self._feat[cal])
        r = self._reward[cal]
        return {
            "brier": brier_score(pred.p_hat, r),
            "ece": expected_calibration_error(pred.p_hat, r),
            "auc": auc(pred.p_hat.double().numpy(), (r > 0.5).double().numpy()),  # the one ROC AUC (stats.auc)
            "cost_mape": cost_mape(pred.cost_hat, self._cost[cal]),
            "n": int(r.numel()),
        }

    def lagged_copy(self) -> PrefixHeads:
        """Deep copy, for the lagged-predictor variant (use the previous checkpoint's heads for the design)."""
        return copy.deepcopy(self)

    # ------------------------------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        """Everything needed to resume: head weights, optimizer state, temperature, replay window, counters."""
        return {
            "config": dict(self.config),
            "success_head": self.success_head.state_dict(),
            "cost_head": self.cost_head.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "temperature": self.temperature,
            "cost_scale": self.cost_scale,
            "n_seen": self.n_seen,
            "replay": {
                "features": self._feat.clone(),
                "rewards": self._reward.clone(),
                "costs": self._cost.clone(),
                "inclusion": self._pi.clone(),
            },
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` (the input width and hidden width must match)."""
        for key in ("input_dim", "hidden"):
            if state["config"][key] != self.config[key]:
                raise ValueError(f"checkpoint {key}={state['config'][key]} does not match {self.config[key]}.")
        self.success_head.load_state_dict(state["success_head"])
        self.cost_head.load_state_dict(state["cost_head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.temperature = float(state["temperature"])
        self.cost_scale = float(state["cost_scale"])
        self.n_seen = int(state["n_seen"])
        rep = state["replay"]
        self._feat = rep["features"].clone()
        self._reward = rep["rewards"].clone()
        self._cost = rep["costs"].clone()
        self._pi = rep["inclusion"].clone()
        self.generator.set_state(state["generator"])

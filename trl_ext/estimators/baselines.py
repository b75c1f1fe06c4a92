"""Classic baselines and advantages on ragged groups, plus the advantage-estimator registry.

Conventions shared by every function here (see ``docs/estimators.md``):

* ``rewards`` is a flat 1-D array of length ``N`` (numpy or torch); ``group_ids`` gives each rollout's prompt
  (any labels; groups may have different sizes and need not be contiguous).
* **NaN rewards** mark unscorable rollouts (TRL 1.16 writes NaN when every reward function returns ``None``).
  They are excluded from every mean/std, their advantage is exactly 0, and they are *counted* in
  :attr:`AdvantageResult.n_nan` -- never silently zeroed.
* Outputs are float64 numpy arrays of shape ``(N,)``.

Formulas
--------
GRPO (group mean):        A_i = (r_i - mean_g) / (std_g + eps)     (``scale="group"``; TRL 1.16 ``scale_rewards``)
RLOO (leave-one-out):     A_i = r_i - (sum_g - r_i) / (n_g - 1)
REINFORCE++ (batch mean): A_i = (r_i - mean_batch) [/ (std_batch + eps)]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

from ._validation import as_float_array, check_nonneg_scalar, factorize_groups

__all__ = [
    "AdvantageResult",
    "ADVANTAGE_ESTIMATORS",
    "register_advantage_estimator",
    "get_advantage_estimator",
    "group_mean_baseline",
    "leave_one_out_baseline",
    "batch_mean_baseline",
    "grpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages",
    "group_stats",
    "trl_grpo_advantages",
    "group_mean_std",
    "dr_grpo_advantages",
    "estimator_min_group_size",
    "ESTIMATOR_MIN_GROUP_SIZE",
    "ESTIMATOR_SIDE_INPUTS",
    "estimator_side_inputs",
    "ESTIMATORS_SEEING_UNSCORABLE",
    "nanstd",
]


@dataclass(frozen=True)
class AdvantageResult:
    """Advantages plus the bookkeeping a trainer must log.

    Attributes
    ----------
    advantages : ndarray, shape (N,)
        Final advantages; exactly 0 for NaN rewards and for documented degenerate cases.
    baselines : ndarray, shape (N,)
        The baseline subtracted from each reward (NaN where undefined, e.g. an all-NaN group).
    scale : ndarray, shape (N,)
        The divisor applied after centring (1.0 when unscaled), including any eps guard.
    n_nan : int
        Number of NaN (unscorable) rewards excluded from the baselines and given advantage 0.
    n_groups : int
        Number of distinct group ids.
    n_zero_std_groups : int
        Groups whose finite rewards are all equal (the shut-gate count; TRL's ``frac_reward_zero_std`` per group).
    n_degenerate : int
        Rollouts whose advantage was set to 0 by a documented fallback other than NaN (e.g. RLOO singletons).
    extras : dict
        Estimator-specific diagnostics (e.g. V0.5 fusion weights); ``extras["metrics"]``, a ``{name: float}``
        dict, is logged by the trainers as ``adv/<name>`` every step.
    """

    advantages: np.ndarray
    baselines: np.ndarray
    scale: np.ndarray
    n_nan: int
    n_groups: int
    n_zero_std_groups: int
    n_degenerate: int = 0
    extras: dict = field(default_factory=dict)

    def __array__(self, dtype=None, copy=None):  # lets np.asarray(result) give the advantages
        return self.advantages if dtype is None else self.advantages.astype(dtype)


# --------------------------------------------------------------------------------------------- registry
ADVANTAGE_ESTIMATORS: dict[str, Callable[..., AdvantageResult]] = {}


ESTIMATOR_MIN_GROUP_SIZE: dict[str, int] = {}
"""Smallest rollouts-per-prompt each registered estimator accepts (1: it has a cross-prompt baseline)."""

ESTIMATOR_SIDE_INPUTS: dict[str, dict[str, str]] = {}
"""Side inputs each registered estimator needs beyond ``rewards`` and ``group_ids``: ``{keyword: level}`` with level
``"row"`` (one value per rollout) or ``"group"`` (one value per group, in order of first appearance)."""

ESTIMATOR_USED_BY: dict[str, str] = {}
"""Where an estimator with side inputs is available ready-made (e.g. ``"trl_ext.BASISTrainer"``), for error messages."""

ESTIMATORS_SEEING_UNSCORABLE: set[str] = set()
"""Estimators registered with ``sees_unscorable=True``: a trainer passes them its unscorable rows (NaN reward) too."""

SIDE_INPUT_LEVELS = ("row", "group", "strategy")


def estimator_min_group_size(name: str) -> int:
    """The ``min_group_size`` ``name`` was registered with (2 unless declared)."""
    get_advantage_estimator(name)
    return ESTIMATOR_MIN_GROUP_SIZE.get(name, 2)


def estimator_side_inputs(name: str) -> dict[str, str]:
    """The side inputs ``name`` was registered with: ``{keyword: "row" | "group"}`` (empty for reward-only ones)."""
    get_advantage_estimator(name)
    return dict(ESTIMATOR_SIDE_INPUTS.get(name, {}))


def register_advantage_estimator(name: str, *, min_group_size: int = 2, side_inputs: dict[str, str] | None = None,
                                 used_by: str | None = None, sees_unscorable: bool = False,
                                 ) -> Callable[[Callable[..., AdvantageResult]], Callable[..., AdvantageResult]]:
    """Decorator registering ``fn(rewards, group_ids, **side_inputs, **kwargs) -> AdvantageResult`` under ``name``.

    Mirrors verl's ``register_adv_est`` (``verl/trainer/ppo/core_algos.py``). Registering a *different* function
    under an existing name raises ``ValueError``; re-registering the same function (module reload) is a no-op.
    A registered estimator is selected in a trainer by name only: ``ExtGRPOConfig(advantage_estimator=name,
    advantage_estimator_kwargs={...})``.

    Parameters
    ----------
    name : str
        Registry key.
    min_group_size : int, default 2
        Smallest ``num_generations`` the estimator accepts; 1 for estimators with a cross-prompt baseline (one
        rollout per prompt, e.g. REINFORCE++).
    side_inputs : dict, optional
        Inputs the estimator needs besides rewards and group labels, ``{keyword: level}``: ``"row"`` -- an array of
        one value per rollout, aligned with ``rewards``; ``"group"`` -- one value per group in order of first
        appearance; ``"strategy"`` -- any object the rollout strategy hands over in its ``estimator_inputs`` (not
        gathered from the batch; e.g. PAIR's designed draws, which describe candidates the batch does not hold).
        The trainer passes them as keyword arguments from the rollout strategy
        (``RolloutStrategy.provides``); a trainer whose strategy does not provide one refuses the configuration at
        construction.
    used_by : str, optional
        The ready-made trainer that serves this estimator (named in the error a trainer gives when it cannot).
    sees_unscorable : bool, default False
        True: a trainer passes the unscorable rows (NaN reward) too, which the estimator must exclude from every
        baseline and give advantage 0 (BASIS: they still count in its batch shares and fallback counts).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"estimator name must be a non-empty string, got {name!r}.")
    if isinstance(min_group_size, bool) or not isinstance(min_group_size, int) or min_group_size < 1:
        raise ValueError(f"min_group_size must be an int >= 1, got {min_group_size!r}.")
    side = dict(side_inputs or {})
    for key, level in side.items():
        if not isinstance(key, str) or not key.isidentifier() or key in ("rewards", "group_ids"):
            raise ValueError(f"side input names must be keyword names other than rewards/group_ids, got {key!r}.")
        if level not in SIDE_INPUT_LEVELS:
            raise ValueError(f"side input {key!r}: level must be one of {SIDE_INPUT_LEVELS}, got {level!r}.")

    def decorator(fn: Callable[..., AdvantageResult]) -> Callable[..., AdvantageResult]:
        old = ADVANTAGE_ESTIMATORS.get(name)

        def ident(f):  # module + qualname: a reload re-registers "the same" function, a namesake elsewhere is not it
            return getattr(f, "__module__", None), getattr(f, "__qualname__", None)

        if old is not None and ident(old) != ident(fn):
            raise ValueError(f"advantage estimator {name!r} is already registered to {old!r}; pick another name.")
        ADVANTAGE_ESTIMATORS[name] = fn
        ESTIMATOR_MIN_GROUP_SIZE[name] = int(min_group_size)
        ESTIMATOR_SIDE_INPUTS[name] = side
        ESTIMATORS_SEEING_UNSCORABLE.discard(name)
        if sees_unscorable:
            ESTIMATORS_SEEING_UNSCORABLE.add(name)
        if used_by is not None:
            ESTIMATOR_USED_BY[name] = str(used_by)
        return fn

    return decorator


def get_advantage_estimator(name: str) -> Callable[..., AdvantageResult]:
    """Return the estimator registered under ``name`` (``KeyError`` listing the known names otherwise)."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise KeyError(f"unknown advantage estimator {name!r}; registered: {sorted(ADVANTAGE_ESTIMATORS)}") from None


# --------------------------------------------------------------------------------------------- helpers
def _prepare(rewards: Any, group_ids: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    r = as_float_array(rewards, "rewards", ndim=1)
    codes, uniq = factorize_groups(group_ids, r.shape[0])
    return r, codes, ~np.isnan(r), int(uniq.shape[0])


def group_stats(rewards: Any, group_ids: Any, ddof: int = 1) -> dict[str, np.ndarray]:
    """Per-group count, mean and std of the finite rewards, in order of first appearance of each group.

    Parameters
    ----------
    rewards : array_like, shape (N,)
    group_ids : array_like, shape (N,)
    ddof : {0, 1}
        Delta degrees of freedom of the std (1 = Bessel, TRL's ``nanstd``). A group with ``count <= ddof``
        gets std NaN.

    Returns
    -------
    dict with ``count`` (G,), ``mean`` (G,) (NaN for all-NaN groups), ``std`` (G,), ``codes`` (N,).
    """
    r, codes, ok, n_groups = _prepare(rewards, group_ids)
    return _group_stats(r, codes, ok, n_groups, ddof)


def _group_stats(r, codes, ok, n_groups, ddof):
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof!r}.")
    rz = np.where(ok, r, 0.0)
    count = np.bincount(codes, weights=ok.astype(np.float64), minlength=n_groups)
    total = np.bincount(codes, weights=rz, minlength=n_groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
        dev2 = np.where(ok, (r - mean[codes]) ** 2, 0.0)
        ss = np.bincount(codes, weights=dev2, minlength=n_groups)
        std = np.sqrt(ss / (count - ddof))
    std = np.where(count > ddof, std, np.nan)
    return {"count": count, "mean": mean, "std": std, "codes": codes, "sum": total}


def _zero_std_groups(stats: dict[str, np.ndarray]) -> int:
    cnt, std = stats["count"], stats["std"]
    # a group with >= 1 finite reward whose finite rewards are all equal
    return int(np.sum((cnt >= 1) & ((cnt == 1) | np.isclose(np.nan_to_num(std, nan=0.0), 0.0, atol=1e-12))))


# --------------------------------------------------------------------------------------------- baselines
def group_mean_baseline(rewards: Any, group_ids: Any) -> np.ndarray:
    """GRPO's group-mean baseline b_i = mean of the finite rewards in i's group.

    Parameters
    ----------
    rewards : array_like, shape (N,)
        NaN marks an unscorable rollout; it is excluded from the mean.
    group_ids : array_like, shape (N,)

    Returns
    -------
    ndarray, shape (N,)
        The baseline of each rollout's group (NaN only for groups whose rewards are all NaN).
    """
    r, codes, ok, g = _prepare(rewards, group_ids)
    return _group_stats(r, codes, ok, g, 1)["mean"][codes]


def leave_one_out_baseline(rewards: Any, group_ids: Any) -> np.ndarray:
    """RLOO baseline b_i = (sum_g - r_i) / (n_g - 1) over the finite rewards of i's group.

    For a NaN reward the baseline is the mean of all finite siblings (it has nothing to leave out).
    A rollout that is the only finite reward in its group has no sibling: its baseline is NaN (and
    :func:`rloo_advantages` gives it advantage 0 and counts it in ``n_degenerate``).
    """
    r, codes, ok, g = _prepare(rewards, group_ids)
    st = _group_stats(r, codes, ok, g, 1)
    cnt, tot = st["count"][codes], st["sum"][codes]
    with np.errstate(invalid="ignore", divide="ignore"):
        loo = np.where(ok, (tot - np.where(ok, r, 0.0)) / (cnt - 1), tot / cnt)
    return np.where(ok & (cnt <= 1), np.nan, loo)


def batch_mean_baseline(rewards: Any) -> np.ndarray:
    """REINFORCE++ global baseline: the mean of all finite rewards in the batch, broadcast to shape (N,).

    Raises ``ValueError`` when every reward is NaN (there is nothing to average).
    """
    r = as_float_array(rewards, "rewards", ndim=1)
    ok = ~np.isnan(r)
    if not ok.any():
        raise ValueError("every reward is NaN; batch_mean_baseline needs at least one scorable reward.")
    return np.full(r.shape, r[ok].mean())


# --------------------------------------------------------------------------------------------- advantages
def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """NaN-ignoring Bessel-corrected std with exactly the operations of TRL 1.16's ``trl.trainer.utils.nanstd``
    (``tests/test_trl_compat.py`` checks bitwise equality), so GRPO advantages match TRL's bit for bit."""
    import torch  # torch is imported lazily: `trl-ext --help` and the numpy estimators stay torch-free
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    variance *= correction
    std = torch.sqrt(variance)
    if keepdim:
        return std
    if dim is None:
        return std.squeeze()
    return std.squeeze(dim)


def group_mean_std(values: torch.Tensor, gid: torch.Tensor, k: int, ddof: int = 1
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """NaN-ignoring per-group mean and std (``ddof=1``: Bessel-corrected, TRL's ``nanstd``), for ragged groups.

    ``values`` is (N,) or (N, F); groups with ``<= ddof`` finite values get std NaN (as TRL's ``nanstd``).
    """
    import torch
    ok = ~torch.isnan(values)
    shape = (k,) + tuple(values.shape[1:])
    cnt = torch.zeros(shape, dtype=values.dtype).index_add_(0, gid, ok.to(values.dtype))
    tot = torch.zeros(shape, dtype=values.dtype).index_add_(0, gid, torch.nan_to_num(values, nan=0.0))
    mean = tot / cnt  # NaN when cnt == 0
    dev = torch.where(ok, (values - mean[gid]) ** 2, torch.zeros_like(values))
    var = torch.zeros(shape, dtype=values.dtype).index_add_(0, gid, dev) / cnt
    if ddof == 1:
        var = torch.where(cnt > 1, var * cnt / (cnt - 1), torch.full_like(var, float("nan")))
    return mean, var.sqrt()


def trl_grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    scale_rewards: str = "group",
    rewards_per_func: torch.Tensor | None = None,
    reward_weights: torch.Tensor | None = None,
    aggregation: str = "sum_then_normalize",
    eps: float = 1e-4,
    ddof: int = 1,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL 1.16's GRPO advantages (``GRPOTrainer._generate_and_score_completions``), generalized to ragged groups.

    ``sum_then_normalize`` (TRL default)::

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)       scale_rewards="group"
        A_i = (r_i - mean_g(r)) / (std_batch(r) + eps)   scale_rewards="batch"
        A_i =  r_i - mean_g(r)                           scale_rewards="none"

    ``normalize_then_sum`` (GDPO): each reward function is standardized within its group, the weighted sum is then
    standardized over the batch. Means/stds ignore NaN rewards, std is Bessel-corrected (TRL's ``nanstd``), NaN
    advantages (unscorable rows, singleton groups under group scaling) become 0 as in TRL.

    When every row belongs to one of ``K`` contiguous groups of equal size ``G`` (TRL's layout) the computation uses
    TRL's own ``view(-1, G)`` operations, so the result is bitwise identical to TRL's.

    Parameters
    ----------
    rewards : Tensor, shape (N,)
        Weighted summed rewards, NaN for unscorable rows (ignored if ``aggregation="normalize_then_sum"``).
    group_ids : Tensor, shape (N,), int64
        Group index ``0..K-1``; rows with ``group_ids < 0`` (pad rows) get advantage 0 and are ignored.
    scale_rewards : {"group", "batch", "none"}
    rewards_per_func : Tensor, shape (N, F), optional
        Needed for ``normalize_then_sum``.
    reward_weights : Tensor, shape (F,), optional
        Needed for ``normalize_then_sum``.
    aggregation : {"sum_then_normalize", "normalize_then_sum"}
    eps : float
        TRL's guard constant 1e-4.
    ddof : {1, 0}
        1 = Bessel-corrected std (TRL); 0 = population std (``sum_then_normalize`` only; never TRL's layout path).
    dtype : torch.dtype, optional
        Computation dtype (default float32, as TRL; :func:`grpo_advantages` uses float64).

    Returns
    -------
    advantages : Tensor, shape (N,), float32
    group_std : Tensor, shape (N,)
        Each row's group std of ``rewards`` (NaN for groups with < 2 finite rewards and for pad rows): TRL's
        ``is_std_zero`` uses it for ``frac_reward_zero_std``.
    """
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards and group_ids must both be (N,), got {tuple(rewards.shape)} and "
                         f"{tuple(group_ids.shape)}.")
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}.")
    if aggregation not in ("sum_then_normalize", "normalize_then_sum"):
        raise ValueError(f"aggregation must be 'sum_then_normalize' or 'normalize_then_sum', got {aggregation!r}.")
    n = rewards.shape[0]
    import torch

    dtype = torch.float32 if dtype is None else dtype
    rewards = rewards.to(dtype)
    valid = group_ids >= 0
    out = torch.zeros(n, dtype=dtype, device=rewards.device)
    std_out = torch.full((n,), float("nan"), dtype=dtype, device=rewards.device)
    if not valid.any():
        return out, std_out
    gid = group_ids[valid]
    k, g_size, uniform = _trl_group_layout(gid, valid, n, ddof)
    r = rewards[valid]
    if aggregation == "sum_then_normalize":
        adv, std_g = _sum_then_normalize(r, gid, k, g_size, uniform, scale_rewards, eps, ddof)
    else:
        adv, std_g = _normalize_then_sum(r, rewards_per_func, reward_weights, valid, gid, k, g_size, uniform, eps)
    out[valid] = torch.nan_to_num(adv, nan=0.0).to(dtype)
    std_out[valid] = std_g.to(dtype)
    return out, std_out


def _trl_group_layout(gid: torch.Tensor, valid: torch.Tensor, n: int, ddof: int) -> tuple[int, int, bool]:
    """``(K, G, uniform)``: the number of groups, the size of group 0, and whether the rows are TRL's layout.

    TRL's layout is ``K`` contiguous groups of equal size ``G`` with no pad row (and the Bessel std TRL uses): there
    :func:`trl_grpo_advantages` runs TRL's own ``view(-1, G)`` operations, so the result is bitwise TRL's.
    """
    import torch
    k = int(gid.max().item()) + 1
    sizes = torch.bincount(gid, minlength=k)
    g_size = int(sizes[0].item())
    uniform = ddof == 1 and bool(valid.all()) and bool((sizes == g_size).all()) and bool(
        torch.equal(gid, torch.arange(n, device=gid.device) // g_size)
    )
    return k, g_size, uniform


def _sum_then_normalize(r: torch.Tensor, gid: torch.Tensor, k: int, g_size: int, uniform: bool, scale_rewards: str,
                        eps: float, ddof: int) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's default aggregation: ``(r_i - mean_g(r)) / (std + eps)`` with the group, batch or no std.

    Returns the advantages of the non-pad rows (NaN where TRL yields NaN) and each row's group std.
    """
    import torch
    if uniform:  # TRL's exact operations
        mean = torch.nanmean(r.view(-1, g_size), dim=1).repeat_interleave(g_size, dim=0)
        if g_size > 1:
            std_g = nanstd(r.view(-1, g_size), dim=1).repeat_interleave(g_size, dim=0)
        else:
            std_g = torch.zeros_like(r)
    else:
        mean_k, std_k = group_mean_std(r.cpu(), gid.cpu(), k, ddof)
        mean, std_g = mean_k.to(r.device)[gid], std_k.to(r.device)[gid]
    if scale_rewards == "batch" and ddof == 0:
        std = group_mean_std(r.cpu(), torch.zeros_like(gid.cpu()), 1, 0)[1].to(r.device).expand_as(r)
    elif scale_rewards == "batch":
        std = nanstd(r).expand_as(r) if r.numel() > 1 else torch.zeros_like(r)
    else:
        std = std_g
    adv = r - mean
    if scale_rewards != "none":
        adv = adv / (std + eps)
    return adv, std_g


def _normalize_then_sum(r: torch.Tensor, rewards_per_func: torch.Tensor | None, reward_weights: torch.Tensor | None,
                        valid: torch.Tensor, gid: torch.Tensor, k: int, g_size: int, uniform: bool,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO's aggregation: each reward function standardized within its group, the weighted sum over the batch.

    Returns the advantages of the non-pad rows and each row's group std of the summed rewards ``r``.
    """
    import torch
    if rewards_per_func is None or reward_weights is None:
        raise ValueError("normalize_then_sum needs rewards_per_func and reward_weights.")
    rpf = rewards_per_func[valid].float()
    w = reward_weights.to(rpf.device, torch.float32)
    unscorable = torch.isnan(rpf).all(dim=1)
    if uniform:
        grouped = rpf.view(-1, g_size, rpf.shape[1])
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if g_size > 1 else torch.zeros_like(mean_k)
        reward_k = ((grouped - mean_k) / (std_k + eps)).view(-1, rpf.shape[1])
    else:
        mk, sk = group_mean_std(rpf.cpu(), gid.cpu(), k)
        reward_k = (rpf - mk.to(rpf.device)[gid]) / (sk.to(rpf.device)[gid] + eps)
    summed = (reward_k * w.unsqueeze(0)).nansum(dim=1)
    summed[unscorable] = torch.nan
    std = nanstd(summed).expand_as(summed) if summed.numel() > 1 else torch.zeros_like(summed)
    adv = (summed - torch.nanmean(summed)) / (std + eps)
    if uniform and g_size > 1:
        std_g = nanstd(r.view(-1, g_size), dim=1).repeat_interleave(g_size, dim=0)
    elif uniform:
        std_g = torch.zeros_like(r)
    else:
        std_g = group_mean_std(r.cpu(), gid.cpu(), k)[1].to(r.device)[gid]
    return adv, std_g


@register_advantage_estimator("grpo")
def grpo_advantages(rewards: Any, group_ids: Any, scale: str = "group", eps: float = 1e-4, ddof: int = 1) -> AdvantageResult:
    """GRPO advantages, as TRL 1.16's ``GRPOTrainer`` computes them, on ragged groups.

    A_i = (r_i - mean_g) / (s + eps), with s = std_g (``scale="group"``), the std of all finite rewards in the
    batch (``"batch"``), or no division (``"none"``).

    Parameters
    ----------
    rewards, group_ids : array_like, shape (N,)
    scale : {"group", "batch", "none"}
    eps : float >= 0
        Guard added to the std (TRL uses 1e-4).
    ddof : {0, 1}
        1 = Bessel-corrected std (TRL's ``nanstd``). The measurement-discipline paper's worked eight-attempt
        example ("The same group, all the way through the tie-break") uses the population std, ``ddof=0``.

    Returns
    -------
    AdvantageResult
        NaN rewards -> advantage 0 (counted in ``n_nan``). A group with a single finite reward has
        r_i - mean_g = 0, so its advantage is 0 under every ``scale``; an all-equal group likewise.
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}.")
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 or 1, got {ddof!r}.")
    eps = check_nonneg_scalar(eps, "eps")
    r, codes, ok, g = _prepare(rewards, group_ids)
    st = _group_stats(r, codes, ok, g, ddof)
    base = st["mean"][codes]
    # the one GRPO implementation: the same function the trainer calls (float64 here)
    import torch

    adv_t, _ = trl_grpo_advantages(torch.from_numpy(r), torch.from_numpy(codes.astype(np.int64)),
                                   scale_rewards=scale, eps=eps, ddof=ddof, dtype=torch.float64)
    adv = adv_t.numpy()
    if scale == "group":
        s = np.nan_to_num(st["std"][codes], nan=0.0) + eps
    elif scale == "batch":
        fin = r[ok]
        s = np.full(r.shape, (fin.std(ddof=ddof) if fin.size > ddof else 0.0) + eps)
    else:
        s = np.ones_like(r)
    return AdvantageResult(adv, base, s, int((~ok).sum()), g, _zero_std_groups(st))


@register_advantage_estimator("dr_grpo")
def dr_grpo_advantages(rewards: Any, group_ids: Any) -> AdvantageResult:
    """Dr. GRPO advantages ("Understanding R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783,
    Section 3.1): the group mean is subtracted and the std division dropped, ``A_i = r_i - mean_g``.

    Pair it with ``loss_type="dr_grpo"`` (the paper's constant length normalizer). Same NaN handling as
    :func:`grpo_advantages`.
    """
    return grpo_advantages(rewards, group_ids, scale="none")


@register_advantage_estimator("rloo")
def rloo_advantages(rewards: Any, group_ids: Any, normalize: bool = False, eps: float = 1e-4) -> AdvantageResult:
    """RLOO advantages A_i = r_i - (sum_g - r_i)/(n_g - 1), optionally whitened over the batch.

    Matches TRL 1.16's ``RLOOTrainer`` (``normalize_advantages`` whitens over the scorable rows with the
    Bessel std + eps). **Singleton fallback:** a rollout that is the only finite reward of its group has no
    leave-one-out baseline; its advantage is 0 and it is counted in ``n_degenerate`` (TRL yields 0/0 = NaN
    and then zeroes it the same way, but without a count).
    """
    eps = check_nonneg_scalar(eps, "eps")
    r, codes, ok, g = _prepare(rewards, group_ids)
    st = _group_stats(r, codes, ok, g, 1)
    cnt, tot = st["count"][codes], st["sum"][codes]
    single = ok & (cnt <= 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        base = np.where(ok & ~single, (tot - np.where(ok, r, 0.0)) / (cnt - 1), np.nan)
    adv = np.where(ok & ~single, r - base, np.nan)
    s = np.ones_like(r)
    if normalize:
        live = ~np.isnan(adv)
        if live.sum() > 1:
            m, sd = adv[live].mean(), adv[live].std(ddof=1)
            adv = (adv - m) / (sd + eps)
            s = np.full(r.shape, sd + eps)
    adv = np.nan_to_num(adv, nan=0.0)
    return AdvantageResult(adv, base, s, int((~ok).sum()), g, _zero_std_groups(st), n_degenerate=int(single.sum()))


@register_advantage_estimator("reinforce_pp", min_group_size=1)
def reinforce_pp_advantages(
    rewards: Any, group_ids: Any = None, normalize: bool = True, eps: float = 1e-4, ddof: int = 1
) -> AdvantageResult:
    """REINFORCE++ advantages: A_i = (r_i - mean_batch) / (std_batch + eps) (``normalize=False`` skips the division).

    ``group_ids`` is optional (used only for the ``n_groups``/``n_zero_std_groups`` diagnostics); the baseline is
    the global mean of the finite rewards. Raises when every reward is NaN.
    """
    eps = check_nonneg_scalar(eps, "eps")
    r = as_float_array(rewards, "rewards", ndim=1)
    if group_ids is None:
        group_ids = np.zeros(r.shape[0], dtype=np.int64)
    r, codes, ok, g = _prepare(r, group_ids)
    base = batch_mean_baseline(r)
    fin = r[ok]
    if normalize:
        sd = fin.std(ddof=ddof) if fin.size > ddof else 0.0
        s = np.full(r.shape, sd + eps)
    else:
        s = np.ones_like(r)
    centred = np.where(ok, r - base, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        adv = np.where(centred == 0.0, 0.0, centred / s)
    st = _group_stats(r, codes, ok, g, 1)
    return AdvantageResult(adv, base, s, int((~ok).sum()), g, _zero_std_groups(st))

"""Scorer noise floor: how far a scorer's output moves on text it has already scored.

Source: "Measurement Discipline for RLVR" -- section 5 step 1 ("scoring each item alone and then at four positions
inside an eight-sequence batch"; "3 times the 95th-percentile spread ... becomes that scorer's noise floor"), the
"Every scoring model should come with its own wobble number" section ("keep the individual repeat-scores, not just
the floor") and checklist item 1 (about 60 held-out items, five scores per item, per-item max - min, p95 x 3).

Protocol implemented by :func:`measure_noise_floor`, for each item ``i``:

1. score ``[item_i]`` alone;
2. for each of ``positions`` slots ``k`` (spread evenly over ``0 .. batch_size - 1``; 0, 2, 5, 7 for 4 slots in a
   batch of 8), score a batch of ``batch_size`` texts with ``item_i`` at slot ``k`` and ``batch_size - 1`` filler
   texts (drawn without replacement, fresh for every batch, from an RNG seeded with ``seed``) elsewhere;
3. spread_i = max - min of its ``1 + positions`` scores.

``floor = multiplier x quantile(spreads, 0.95)`` with numpy's default (linear-interpolation) quantile and
``multiplier = 3``. Any score gap smaller than the floor should be read as a tie.

The mechanism (section 5 step 1): a deterministic scorer is still batch-dependent on accelerators because padding
shape and floating-point summation order change with the company an item keeps. A scorer that is a pure function of
each text alone has floor exactly 0.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "NoiseFloorError",
    "NoiseFloorResult",
    "measure_noise_floor",
    "batch_positions",
    "deterministic_toy_scorer",
    "batch_sensitive_toy_scorer",
]


class NoiseFloorError(ValueError):
    """A scorer returned something unusable (wrong length, non-numeric, NaN/inf); the message names the text."""


@dataclass(frozen=True)
class NoiseFloorResult:
    """Output of :func:`measure_noise_floor`.

    Attributes
    ----------
    floor : float
        ``multiplier x p95``, in the scorer's own units.
    p95_spread : float
        95th percentile (``quantile``) of the per-item spreads.
    spreads : ndarray, shape (n_items,)
        Per-item ``max - min`` over its scores.
    scores : ndarray, shape (n_items, 1 + positions)
        Every per-item score: column 0 alone, column ``1 + k`` at ``positions_used[k]``.
    positions_used : tuple of int
        Batch slots the item occupied.
    items : tuple of str
    batch_size, multiplier, quantile, seed
        The protocol's settings.
    filler_ids : ndarray of int, shape (n_items, positions, batch_size - 1)
        Indices of the filler texts in each batch (so every batch can be rebuilt).
    """

    floor: float
    p95_spread: float
    spreads: np.ndarray
    scores: np.ndarray
    positions_used: tuple[int, ...]
    items: tuple[str, ...]
    batch_size: int
    multiplier: float
    quantile: float
    seed: int
    filler_ids: np.ndarray = field(repr=False)

    def to_dict(self, item_ids: Sequence | None = None) -> dict:
        ids = list(range(len(self.items))) if item_ids is None else list(item_ids)
        return {
            "floor": self.floor,
            "p95_spread": self.p95_spread,
            "multiplier": self.multiplier,
            "quantile": self.quantile,
            "batch_size": self.batch_size,
            "positions": list(self.positions_used),
            "seed": self.seed,
            "n_items": len(self.items),
            "max_spread": float(self.spreads.max()),
            "median_spread": float(np.median(self.spreads)),
            "items": [
                {
                    "id": ids[i],
                    "text": self.items[i],
                    "alone": float(self.scores[i, 0]),
                    "in_batch": {str(p): float(self.scores[i, 1 + k]) for k, p in enumerate(self.positions_used)},
                    "spread": float(self.spreads[i]),
                    "filler_ids": self.filler_ids[i].tolist(),
                }
                for i in range(len(self.items))
            ],
        }


def batch_positions(positions: int, batch_size: int) -> tuple[int, ...]:
    """Slots spread evenly over a batch: ``round(linspace(0, batch_size - 1, positions))`` (0, 2, 5, 7 for 4 / 8)."""
    if positions < 1 or positions > batch_size:
        raise ValueError(f"positions must be in [1, batch_size={batch_size}]; got {positions}")
    slots = tuple(int(x) for x in np.round(np.linspace(0, batch_size - 1, positions)))
    if len(set(slots)) != len(slots):  # pragma: no cover - linspace over >= positions integers is injective
        raise ValueError(f"cannot place {positions} distinct slots in a batch of {batch_size}")
    return slots


def _snippet(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _call(score_fn, batch: list[str], what: list[str]) -> np.ndarray:
    try:
        out = score_fn(batch)
    except Exception as exc:  # re-raised with the context of which batch failed
        raise NoiseFloorError(f"scorer raised {type(exc).__name__}: {exc} (while scoring {what[0]})") from exc
    try:
        out = list(out)
    except TypeError:
        raise NoiseFloorError(f"scorer must return a list of floats, one per text; got {type(out).__name__} "
                              f"(while scoring {what[0]})") from None
    if len(out) != len(batch):
        raise NoiseFloorError(f"scorer returned {len(out)} scores for a batch of {len(batch)} texts "
                              f"(while scoring {what[0]})")
    vals = np.empty(len(out))
    for j, v in enumerate(out):
        if hasattr(v, "item") and getattr(v, "ndim", 0) == 0 and not isinstance(v, numbers.Number):
            v = v.item()  # 0-d numpy / torch scalars
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise NoiseFloorError(f"scorer returned a non-numeric score {v!r} ({type(v).__name__}) for {what[j]}")
        if not math.isfinite(float(v)):
            raise NoiseFloorError(f"scorer returned a non-finite score {float(v)!r} for {what[j]}")
        vals[j] = float(v)
    return vals


def _texts(name: str, xs) -> list[str]:
    out = []
    for i, x in enumerate(xs):
        t = x.get("text") if isinstance(x, dict) else x
        if not isinstance(t, str):
            raise ValueError(f"{name}[{i}] must be a string (or a dict with a 'text' string); got {type(t).__name__}")
        out.append(t)
    return out


def measure_noise_floor(
    score_fn: Callable[[list[str]], Sequence[float]],
    items: Sequence[str],
    filler: Sequence[str],
    positions: int = 4,
    seed: int = 0,
    *,
    batch_size: int = 8,
    multiplier: float = 3.0,
    quantile: float = 0.95,
) -> NoiseFloorResult:
    """Measure a scorer's noise floor by scoring each item alone and inside batches of unrelated filler.

    Parameters
    ----------
    score_fn : callable
        ``score_fn(list_of_texts) -> list of float``, one score per text, in order (a reward function or a reward
        model wrapped to take a batch of texts).
    items : sequence of str (or dicts with ``"text"``)
        The texts whose scores are tracked; the paper uses about 60 (with fewer than 20 the 95th percentile is
        essentially the maximum spread).
    filler : sequence of str (or dicts with ``"text"``)
        Unrelated texts to fill the batches; needs at least ``batch_size - 1`` of them.
    positions : int
        In-batch placements per item (default 4).
    seed : int
        Seed of the filler draws.
    batch_size : int
        Batch size of the in-company scorings (default 8, the paper's eight-sequence batch).
    multiplier : float
        Safety factor on the p95 spread (default 3, a disclosed design constant).
    quantile : float
        Spread quantile (default 0.95).

    Returns
    -------
    NoiseFloorResult
        Floor, p95, per-item spreads and every per-item score.

    Raises
    ------
    NoiseFloorError
        The scorer raised, returned the wrong number of scores, or returned a non-numeric / NaN / inf score (the
        message names the item or filler text and its index).
    ValueError
        Bad settings: no items, too little filler, ``positions`` outside ``[1, batch_size]``, etc.
    """
    items_t = _texts("items", items)
    filler_t = _texts("filler", filler)
    if not items_t:
        raise ValueError("items is empty: pass the texts whose scores should be tracked (about 60)")
    if batch_size < 2:
        raise ValueError(f"batch_size must be >= 2 (an item plus filler); got {batch_size}")
    if len(filler_t) < batch_size - 1:
        raise ValueError(f"need at least batch_size - 1 = {batch_size - 1} filler texts; got {len(filler_t)}. "
                         "Add filler or lower batch_size.")
    if not (0.0 < quantile <= 1.0):
        raise ValueError(f"quantile must be in (0, 1]; got {quantile!r}")
    if not (multiplier > 0) or not math.isfinite(multiplier):
        raise ValueError(f"multiplier must be a positive finite number; got {multiplier!r}")
    slots = batch_positions(positions, batch_size)
    rng = np.random.default_rng(seed)
    n = len(items_t)
    scores = np.empty((n, 1 + len(slots)))
    fids = np.empty((n, len(slots), batch_size - 1), dtype=np.int64)
    for i, text in enumerate(items_t):
        label = f"item {i} {_snippet(text)}"
        scores[i, 0] = _call(score_fn, [text], [label + " (alone)"])[0]
        for k, slot in enumerate(slots):
            fill = rng.choice(len(filler_t), size=batch_size - 1, replace=False)
            fids[i, k] = fill
            batch = [filler_t[j] for j in fill]
            what = [f"filler {j} {_snippet(filler_t[j])} (in item {i}'s batch)" for j in fill]
            batch.insert(slot, text)
            what.insert(slot, f"{label} (batch slot {slot})")
            scores[i, 1 + k] = _call(score_fn, batch, what)[slot]
    spreads = scores.max(axis=1) - scores.min(axis=1)
    p95 = float(np.quantile(spreads, quantile))
    return NoiseFloorResult(multiplier * p95, p95, spreads, scores, slots, tuple(items_t), int(batch_size),
                            float(multiplier), float(quantile), int(seed), fids)


# ----------------------------------------------------------------------------------------------------------------
# Demo scorers (importable as trl_ext.measurement.noise_floor:deterministic_toy_scorer, ...)
# ----------------------------------------------------------------------------------------------------------------


def _base_score(text: str) -> float:
    """A per-text score that depends on the text alone: vowel share plus a small length term."""
    if not text:
        return 0.0
    vowels = sum(ch in "aeiouAEIOU" for ch in text)
    return vowels / len(text) + 0.01 * math.log1p(len(text))


def deterministic_toy_scorer(texts: list[str]) -> list[float]:
    """Scores each text on its own (no batch dependence): its noise floor is exactly 0."""
    return [_base_score(t) for t in texts]


def batch_sensitive_toy_scorer(texts: list[str]) -> list[float]:
    """A deliberately batch-dependent toy scorer that mimics padding / summation-order jitter.

    Each score is ``_base_score(text)`` plus a perturbation that depends on the batch's padded length
    (``max len``), the text's slot and its padding amount -- the same kind of dependence float
    non-associativity produces on accelerators (section 5 step 1), exaggerated to about 1e-3 so tests can see it.
    Deterministic for a given batch, so repeated runs reproduce the same floor.
    """
    if not texts:
        return []
    pad_to = max(len(t) for t in texts)
    out = []
    for slot, t in enumerate(texts):
        pad = pad_to - len(t)
        jitter = 1e-3 * math.sin(1.7 * slot + 0.31 * pad + 0.05 * len(texts))
        out.append(_base_score(t) + (jitter if len(texts) > 1 else 0.0))
    return out

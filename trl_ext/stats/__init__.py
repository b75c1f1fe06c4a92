"""Comparison statistics ("Measurement Discipline for RLVR"): detection floors, exact binomial and paired tests,
paired bootstrap intervals, the two-part rule across seeds, length-residualized comparisons, outcome-file reading.

Pure numpy/scipy; no TRL import. Submodules are loaded lazily so that ``trl-ext --help`` stays fast.

- :mod:`.floors` -- :func:`detection_floor`, :func:`paired_detection_floor`, :func:`win_share_floor`,
  :func:`margin_to_floor_ratio`, :func:`read_margin`, :func:`two_part_catch_rate`, :func:`smallest_detectable_gap`.
- :mod:`.paired` -- :func:`exact_binomial_test`, :func:`mcnemar_counts`, :func:`paired_bootstrap_ci`.
- :mod:`.two_part` -- :func:`two_part_rule` and :class:`Verdict`.
- :mod:`.length` -- :func:`length_residualized_difference`.
- :mod:`.outcomes` -- reading per-question outcome JSONL, pairing seeds, aligning question sets.
- :mod:`.compare` -- the engine behind ``trl-ext compare``.
- :func:`metric_path` -- path of the shipped ``evaluate`` metrics (``accuracy_with_floor``).
"""

from __future__ import annotations

from pathlib import Path

from .._lazy import lazy_exports

_SUBMODULES = ("floors", "paired", "two_part", "length", "outcomes", "compare")
_EXPORTS = {
    "floors": ("DETECTION_Z", "detection_z", "detection_floor", "paired_detection_floor", "win_share_floor",
               "margin_to_floor_ratio", "significance_crossing", "FloorReading", "read_margin",
               "two_part_catch_rate", "smallest_detectable_gap"),
    "paired": ("exact_binomial_test", "McNemarCounts", "mcnemar_counts", "BootstrapCI", "paired_bootstrap_ci"),
    "two_part": ("SeedSummary", "Verdict", "question_verdicts", "two_part_rule"),
    "length": ("LengthResidualized", "length_residualized_difference"),
    "outcomes": ("OutcomeFormatError", "RunOutcomes", "read_outcomes", "pair_seed_files", "align_runs"),
    "compare": ("compare_outcome_files", "format_report"),
}
_LAZY = {name: mod for mod, names in _EXPORTS.items() for name in names}

__all__ = [*_LAZY, "metric_path"]

_METRICS_DIR = Path(__file__).resolve().parent / "metrics"


def metric_path(name: str = "accuracy_with_floor") -> str:
    """Filesystem path of a metric shipped with trl_ext, for ``evaluate.load(metric_path(name))`` (works offline).

    Raises ``ValueError`` listing the available metrics when ``name`` is unknown.
    """
    path = _METRICS_DIR / name
    if not (path / f"{name}.py").is_file():
        available = sorted(p.name for p in _METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())
        raise ValueError(f"unknown metric {name!r}; available: {available}")
    return str(path)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, submodules=_SUBMODULES, cache=False)

"""Accuracy with its bootstrap interval and detection floor, as an ``evaluate`` metric.

Load it offline with::

    import evaluate
    from trl_ext.stats import metric_path

    metric = evaluate.load(metric_path("accuracy_with_floor"))
    metric.compute(predictions=[1, 0, 1], references=[1, 1, 1])

The floor is the section 1 detection floor of "Measurement Discipline for RLVR", ``2.8016 sqrt(2p(1-p)/N)``: the
smallest gap between this score and another independently measured score on the same ``N`` questions that the
benchmark can reliably show (false-alarm 5 %, rerun detection 80 %).
"""

import datasets
import evaluate
import numpy as np

from trl_ext.stats.floors import detection_floor, read_margin

_DESCRIPTION = """Accuracy (share of predictions equal to their references) reported together with a percentile
bootstrap interval over questions and the detection floor 2.8016 x sqrt(2 p (1 - p) / N) of
"Measurement Discipline for RLVR" (p = baseline accuracy, or this accuracy if no baseline is given). When
`baseline_accuracy` is given, the margin, its margin-to-floor ratio and zone are also returned."""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int or str): predicted labels / answers, one per question.
    references (list of int or str): reference labels / answers (same length).
    n_boot (int): bootstrap replicates, default 2000 (>= 100).
    seed (int): bootstrap RNG seed, default 0.
    level (float): interval coverage, default 0.95.
    baseline_accuracy (float, optional): the accuracy this run is compared against; sets p in the floor and adds
        `margin`, `margin_to_floor_ratio` and `margin_zone` to the output.
    alpha (float): significance level of the floor, default 0.05.
    power (float): rerun-detection probability of the floor, default 0.8.
Returns:
    accuracy, ci_low, ci_high, ci_level, detection_floor, n (and margin, margin_to_floor_ratio, margin_zone when a
    baseline is given). The floor is 0 when p is 0 or 1 (saturated: no binomial wobble), and the ratio is then None.
Examples:
    >>> metric = evaluate.load(trl_ext.stats.metric_path("accuracy_with_floor"))
    >>> metric.compute(predictions=[1, 1, 0], references=[1, 1, 1])["accuracy"]
    0.6666666666666666
"""

_CITATION = """Measurement Discipline for RLVR (trl_ext measurement-practice paper), section 1: the detection floor."""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class AccuracyWithFloor(evaluate.Metric):
    """Accuracy + bootstrap interval + detection floor."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
        )

    def compute(self, *, predictions=None, references=None, **kwargs):
        """As ``evaluate.Metric.compute``, but empty inputs get a clear error instead of evaluate's IndexError."""
        if predictions is not None and len(predictions) == 0 and not self._has_pending_batches():
            raise ValueError("accuracy_with_floor: no predictions; pass at least one (prediction, reference) pair")
        return super().compute(predictions=predictions, references=references, **kwargs)

    def _has_pending_batches(self) -> bool:
        return getattr(self, "writer", None) is not None

    def _compute(self, predictions, references, n_boot=2000, seed=0, level=0.95, baseline_accuracy=None,
                 alpha=0.05, power=0.8):
        if len(predictions) == 0:
            raise ValueError("accuracy_with_floor: no predictions; pass at least one (prediction, reference) pair")
        if len(predictions) != len(references):
            raise ValueError(f"accuracy_with_floor: {len(predictions)} predictions vs {len(references)} references")
        if int(n_boot) != n_boot or n_boot < 100:
            raise ValueError(f"accuracy_with_floor: n_boot must be an integer >= 100; got {n_boot!r}")
        if not (0.0 < level < 1.0):
            raise ValueError(f"accuracy_with_floor: level must be in (0, 1); got {level!r}")
        correct = np.fromiter((p == r for p, r in zip(predictions, references)), dtype=float, count=len(predictions))
        n = correct.size
        acc = float(correct.mean())
        rng = np.random.default_rng(seed)
        reps = np.empty(int(n_boot))
        for start in range(0, int(n_boot), 2048):
            m = min(2048, int(n_boot) - start)
            reps[start : start + m] = correct[rng.integers(0, n, size=(m, n))].mean(axis=1)
        lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
        p = acc if baseline_accuracy is None else float(baseline_accuracy)
        floor = float(detection_floor(p, n, alpha=alpha, power=power))
        out = {"accuracy": acc, "ci_low": float(lo), "ci_high": float(hi), "ci_level": float(level),
               "detection_floor": floor, "n": int(n)}
        if baseline_accuracy is not None:
            margin = acc - p
            out["margin"] = margin
            if floor > 0:
                reading = read_margin(margin, floor, alpha=alpha, power=power)
                out["margin_to_floor_ratio"] = reading.ratio
                out["margin_zone"] = reading.zone
            else:
                out["margin_to_floor_ratio"] = None
                out["margin_zone"] = "undefined (saturated baseline)"
        return out

"""The ROC AUC of binary predictions (pure numpy / scipy): used by ``trl-ext advise``'s prefix-head metrics and
by PAIR's heads diagnostics (``pair/head_auc``)."""

from __future__ import annotations

import numpy as np

__all__ = ["auc"]


def auc(scores, labels) -> float:
    """Area under the ROC curve (Mann-Whitney U over average ranks), ties counted one half.

    Parameters
    ----------
    scores : array_like of float
        Predicted scores (higher = more likely positive).
    labels : array_like of {0, 1}
        Outcomes, same length.

    Returns
    -------
    float
        ``P(score of a random positive > score of a random negative) + 0.5 P(tie)``; NaN when a class is empty.
    """
    from scipy.stats import rankdata

    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=np.float64).ravel()
    if s.shape != y.shape:
        raise ValueError(f"scores and labels differ in length: {s.size} vs {y.size}")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must be 0 or 1")
    n_pos, n_neg = int(y.sum()), int((1 - y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(s, method="average")
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))

"""In-context probabilistic heads: fitted on the context set at query time, then applied to the targets.

These play the role of V0's TabPFN head ("V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts",
arXiv:2603.10848, "The V0 Value Model: Architecture and Training", component 3): given embeddings of the N context
prompts with their outcomes and the embeddings of the targets, return a success probability per target. All heads
are pure numpy/scipy (TabPFN optional) and *calibrated on the context itself*: their regularization strength is
chosen by leave-one-out or K-fold log-loss, so a context that carries no usable structure shrinks every prediction
to the context success rate.

Every head assumes a non-degenerate context (at least two distinct outcomes); :class:`EmbeddingInContextPrior`
handles empty and degenerate contexts before calling a head.
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
import numbers
import os
from collections.abc import Sequence

import numpy as np

__all__ = ["InContextHead", "KernelHead", "LogisticHead", "TabPFNHead", "jeffreys_mean", "soft_log_loss"]

_P_EPS = 1e-6


def jeffreys_mean(y: np.ndarray) -> float:
    """Posterior mean of the success rate under a Beta(1/2, 1/2) prior: :math:`(\\sum y + 1/2) / (N + 1)`.

    Strictly inside (0, 1) for any N >= 0 (0.5 for an empty context); used as the shrinkage target and as the
    degenerate-context fallback.
    """
    y = np.asarray(y, dtype=np.float64)
    return float((y.sum() + 0.5) / (y.size + 1.0))


def soft_log_loss(y: np.ndarray, p: np.ndarray) -> float:
    """Mean cross-entropy :math:`-[y \\log p + (1-y) \\log(1-p)]` for soft labels ``y`` in [0, 1]; ``p`` clipped to
    ``[1e-6, 1 - 1e-6]``."""
    p = np.clip(p, _P_EPS, 1.0 - _P_EPS)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


class InContextHead(abc.ABC):
    """Fit on ``(Xc, y)`` and predict for ``Xt`` in one call. :attr:`last_fit` holds the chosen hyperparameters."""

    name = "head"

    def __init__(self):
        self.last_fit: dict = {}

    @abc.abstractmethod
    def fit_predict(self, Xc: np.ndarray, y: np.ndarray, Xt: np.ndarray) -> np.ndarray:
        """Parameters: ``Xc`` (N, d) context embeddings, ``y`` (N,) outcomes in [0, 1] with at least two distinct
        values, ``Xt`` (M, d) target embeddings. Returns (M,) probabilities in [0, 1]."""


def _as_grid(name: str, values: Sequence[float] | float, allow_inf: bool = False) -> tuple[float, ...]:
    vals = (values,) if np.isscalar(values) else tuple(values)
    if not vals:
        raise ValueError(f"{name}: the grid is empty; give at least one value.")
    for v in vals:
        ok = (isinstance(v, numbers.Real) and not isinstance(v, bool | np.bool_) and not np.isnan(v) and v >= 0
              and (allow_inf or np.isfinite(v)))
        if not ok:
            raise ValueError(f"{name}: grid values must be {'non-negative' if allow_inf else 'finite, >= 0'}, got {v!r}.")
    return tuple(float(v) for v in vals)


class KernelHead(InContextHead):
    """Kernel-weighted success rate with Beta-style shrinkage toward the context mean.

    For a target :math:`t` with kernel weights :math:`w_{tj}` to the context prompts,

    .. math::  \\hat p(t) = \\frac{\\sum_j w_{tj} y_j + a\\, m}{\\sum_j w_{tj} + a},
               \\qquad m = \\frac{\\sum_j y_j + 1/2}{N + 1},

    i.e. the posterior mean of a Beta prior with mean :math:`m` and strength :math:`a` updated with kernel-weighted
    pseudo-counts (a Nadaraya-Watson estimate shrunk toward the context success rate). :math:`a = \\infty` gives the
    constant :math:`m`. The bandwidth and :math:`a` are chosen jointly on a grid by **leave-one-out log-loss on the
    context** (each context point predicted from the others, with the leave-one-out mean :math:`m_{-i}`); ties go
    to the stronger shrinkage.

    Parameters
    ----------
    kernel : {"cosine", "rbf"}
        ``cosine``: :math:`w = \\exp((\\cos(t, x_j) - 1) / \\tau)` on embeddings centered at the context mean
        (removes the common direction that makes raw LM hidden states all look alike). ``rbf``:
        :math:`w = \\exp(-\\lVert t - x_j \\rVert^2 / (2 h^2))` with :math:`h` = scale x the median pairwise
        context distance.
    bandwidths : float or sequence
        Grid of :math:`\\tau` (cosine) or of the median-distance scale (rbf).
    strengths : float or sequence
        Grid of :math:`a` (``inf`` allowed).
    center : bool
        Center embeddings at the context mean before the cosine kernel.
    """

    name = "kernel"

    def __init__(
        self,
        kernel: str = "cosine",
        bandwidths: Sequence[float] | float | None = None,
        strengths: Sequence[float] | float = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, float("inf")),
        center: bool = True,
    ):
        super().__init__()
        if kernel not in ("cosine", "rbf"):
            raise ValueError(f"KernelHead: kernel must be 'cosine' or 'rbf', got {kernel!r}.")
        self.kernel = kernel
        if bandwidths is None:
            bandwidths = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0) if kernel == "cosine" else (0.1, 0.2, 0.5, 1.0, 2.0)
        self.bandwidths = _as_grid("KernelHead bandwidths", bandwidths)
        if any(b <= 0 for b in self.bandwidths):
            raise ValueError(f"KernelHead: bandwidths must be > 0, got {self.bandwidths}.")
        self.strengths = tuple(sorted(_as_grid("KernelHead strengths", strengths, allow_inf=True), reverse=True))
        self.center = bool(center)

    def _log_kernel(self, A: np.ndarray, B: np.ndarray, bw: float, med: float) -> np.ndarray:
        if self.kernel == "cosine":
            return (A @ B.T - 1.0) / bw
        d2 = np.maximum((A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * A @ B.T, 0.0)
        return -d2 / (2.0 * (bw * med) ** 2)

    def _prepare(self, Xc: np.ndarray, Xt: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        med = 1.0
        if self.kernel == "cosine":
            if self.center:
                mu = Xc.mean(0, keepdims=True)
                Xc, Xt = Xc - mu, Xt - mu
            Xc = Xc / np.maximum(np.linalg.norm(Xc, axis=1, keepdims=True), 1e-12)
            Xt = Xt / np.maximum(np.linalg.norm(Xt, axis=1, keepdims=True), 1e-12)
        else:
            d2 = np.maximum((Xc * Xc).sum(1)[:, None] + (Xc * Xc).sum(1)[None, :] - 2.0 * Xc @ Xc.T, 0.0)
            iu = np.triu_indices(Xc.shape[0], 1)
            med = float(np.sqrt(np.median(d2[iu]))) if iu[0].size else 1.0
            if not med > 0:
                med = 1.0
        return Xc, Xt, med

    @staticmethod
    def _shrunk(W: np.ndarray, y: np.ndarray, m: np.ndarray | float, a: float) -> np.ndarray:
        num, den = W @ y, W.sum(1)
        if np.isinf(a):
            return np.broadcast_to(np.asarray(m, dtype=np.float64), den.shape).copy()
        with np.errstate(invalid="ignore", divide="ignore"):
            p = (num + a * m) / (den + a)
        return np.where(den + a > 0, p, m)

    def fit_predict(self, Xc, y, Xt):
        Xc, Xt, med = self._prepare(np.asarray(Xc, np.float64), np.asarray(Xt, np.float64))
        y = np.asarray(y, np.float64)
        n = y.size
        m_full = jeffreys_mean(y)
        m_loo = (y.sum() - y + 0.5) / n  # Jeffreys mean without point i
        best = (np.inf, None, None)
        for bw in self.bandwidths:
            L = self._log_kernel(Xc, Xc, bw, med)
            W = np.exp(L)  # L <= 0 for both kernels (up to round-off): no overflow
            np.fill_diagonal(W, 0.0)
            for a in self.strengths:  # strongest shrinkage first: ties keep it
                loss = soft_log_loss(y, self._shrunk(W, y, m_loo, a))
                if loss < best[0] - 1e-12:
                    best = (loss, bw, a)
        loss, bw, a = best
        W_t = np.exp(self._log_kernel(Xt, Xc, bw, med))
        p = self._shrunk(W_t, y, m_full, a)
        self.last_fit = {
            "kernel": self.kernel, "bandwidth": bw, "strength": a, "loo_log_loss": loss,
            "constant_log_loss": soft_log_loss(y, m_loo), "context_mean": m_full,
        }
        return np.clip(p, 0.0, 1.0)


class LogisticHead(InContextHead):
    """L2-regularized logistic regression on (optionally PCA-reduced, standardized) embeddings.

    Minimizes :math:`\\sum_i \\mathrm{CE}(y_i, \\sigma(b + x_i^\\top w)) + \\tfrac{\\lambda}{2}\\lVert w \\rVert^2` with soft
    labels and an unpenalized intercept, so :math:`\\lambda \\to \\infty` predicts the context success rate (the
    shrinkage target). :math:`\\lambda` is chosen from ``l2_grid`` by ``n_folds``-fold cross-validated log-loss on
    the context (folds ``i % n_folds``, deterministic); a single-value grid skips the CV.

    Parameters
    ----------
    l2_grid : float or sequence of float > 0
    n_components : int or None
        Keep this many principal components of the centered context embeddings (None: all features).
    n_folds : int >= 2
    """

    name = "logistic"

    def __init__(
        self,
        l2_grid: Sequence[float] | float = (0.1, 1.0, 10.0, 100.0, 1000.0),
        n_components: int | None = 32,
        n_folds: int = 5,
    ):
        super().__init__()
        self.l2_grid = _as_grid("LogisticHead l2_grid", l2_grid)
        if any(v <= 0 for v in self.l2_grid):
            raise ValueError(f"LogisticHead: l2 values must be > 0, got {self.l2_grid}.")
        if n_components is not None and (not isinstance(n_components, int) or n_components < 1):
            raise ValueError(f"LogisticHead: n_components must be a positive int or None, got {n_components!r}.")
        if not isinstance(n_folds, int) or n_folds < 2:
            raise ValueError(f"LogisticHead: n_folds must be an int >= 2, got {n_folds!r}.")
        self.n_components = n_components
        self.n_folds = n_folds

    @staticmethod
    def _features(Xc: np.ndarray, Xt: np.ndarray, k: int | None) -> tuple[np.ndarray, np.ndarray]:
        mu = Xc.mean(0, keepdims=True)
        Xc, Xt = Xc - mu, Xt - mu
        if k is not None and k < Xc.shape[1]:
            _, _, Vt = np.linalg.svd(Xc, full_matrices=False)
            V = Vt[:k].T
            Xc, Xt = Xc @ V, Xt @ V
        sd = Xc.std(0, keepdims=True)
        sd = np.where(sd > 1e-8, sd, 1.0)
        return Xc / sd, Xt / sd

    @staticmethod
    def _fit(X: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
        from scipy.optimize import minimize
        from scipy.special import expit, log_expit

        m = np.clip(y.mean(), 1e-3, 1 - 1e-3)
        theta0 = np.zeros(X.shape[1] + 1)
        theta0[0] = np.log(m / (1 - m))

        def f(theta):
            z = theta[0] + X @ theta[1:]
            loss = -(y * log_expit(z) + (1 - y) * log_expit(-z)).sum() + 0.5 * lam * theta[1:] @ theta[1:]
            r = expit(z) - y
            grad = np.concatenate(([r.sum()], X.T @ r + lam * theta[1:]))
            return loss, grad

        return minimize(f, theta0, jac=True, method="L-BFGS-B", options={"maxiter": 500}).x

    @staticmethod
    def _proba(theta: np.ndarray, X: np.ndarray) -> np.ndarray:
        from scipy.special import expit

        return expit(theta[0] + X @ theta[1:])

    def fit_predict(self, Xc, y, Xt):
        y = np.asarray(y, np.float64)
        Fc, Ft = self._features(np.asarray(Xc, np.float64), np.asarray(Xt, np.float64), self.n_components)
        n = y.size
        cv = {}
        if len(self.l2_grid) == 1 or n < self.n_folds:
            lam = self.l2_grid[-1] if n < self.n_folds else self.l2_grid[0]
        else:
            folds = np.arange(n) % self.n_folds
            for lam_ in sorted(self.l2_grid, reverse=True):  # strongest first: ties keep it
                p = np.empty(n)
                for k in range(self.n_folds):
                    tr, te = folds != k, folds == k
                    if np.ptp(y[tr]) == 0:  # a fold without both outcomes: predict its training mean
                        p[te] = y[tr].mean()
                        continue
                    p[te] = self._proba(self._fit(Fc[tr], y[tr], lam_), Fc[te])
                cv[lam_] = soft_log_loss(y, p)
            lam = min(cv, key=lambda k: (cv[k], -k))
        theta = self._fit(Fc, y, lam)
        self.last_fit = {"l2": lam, "cv_log_loss": cv.get(lam), "cv": cv, "context_mean": float(y.mean())}
        return np.clip(self._proba(theta, Ft), 0.0, 1.0)


class TabPFNHead(InContextHead):
    """TabPFN classifier as the in-context head (V0's head), from a **local** checkpoint only.

    Outcomes are binarized at ``label_threshold`` (as V0 does) and embeddings are PCA-reduced to
    ``n_components`` features (TabPFN is built for small tables). If the binarized context has a single class the
    head returns the context's :func:`jeffreys_mean`.

    Parameters
    ----------
    model_path : str
        Path to a TabPFN classifier checkpoint on local disk (e.g. ``tabpfn-v2.5-classifier-v2.5_default.ckpt``
        from the V0 release, downloaded by you beforehand). Falls back to the ``TRL_EXT_TABPFN_MODEL_PATH``
        environment variable. Nothing is ever downloaded.
    device : str
    n_components : int
    label_threshold : float
    **tabpfn_kwargs
        Passed to ``tabpfn.TabPFNClassifier``.

    Raises
    ------
    ImportError
        If the ``tabpfn`` package is not installed.
    FileNotFoundError
        If no checkpoint path is configured or the file does not exist.
    """

    name = "tabpfn"

    def __init__(
        self,
        model_path: str | None = None,
        *,
        device: str = "cpu",
        n_components: int = 32,
        label_threshold: float = 0.5,
        **tabpfn_kwargs,
    ):
        super().__init__()
        if importlib.util.find_spec("tabpfn") is None:
            raise ImportError(
                "head='tabpfn' needs the `tabpfn` package (pip install tabpfn) and a local classifier checkpoint; "
                "use head='kernel' or head='logistic' otherwise."
            )
        model_path = model_path or os.environ.get("TRL_EXT_TABPFN_MODEL_PATH")
        if not model_path:
            raise FileNotFoundError(
                "head='tabpfn' needs a local TabPFN classifier checkpoint: pass tabpfn_model_path=/path/to/ckpt or set "
                "TRL_EXT_TABPFN_MODEL_PATH. trl_ext never downloads weights; fetch the file beforehand."
            )
        if not os.path.isfile(model_path):
            raise FileNotFoundError(
                f"TabPFN checkpoint {model_path!r} does not exist; download it yourself and pass its local path "
                "(trl_ext never downloads weights)."
            )
        self.model_path = model_path
        self.device = device
        self.n_components = int(n_components)
        self.label_threshold = float(label_threshold)
        self.tabpfn_kwargs = tabpfn_kwargs

    def fit_predict(self, Xc, y, Xt):
        yb = (np.asarray(y) >= self.label_threshold).astype(np.int64)
        if np.ptp(yb) == 0:
            self.last_fit = {"fallback": "single_class"}
            return np.full(np.asarray(Xt).shape[0], jeffreys_mean(np.asarray(y, np.float64)))
        Fc, Ft = LogisticHead._features(np.asarray(Xc, np.float64), np.asarray(Xt, np.float64), self.n_components)
        tabpfn = importlib.import_module("tabpfn")
        clf = tabpfn.TabPFNClassifier(model_path=self.model_path, device=self.device, **self.tabpfn_kwargs)
        clf.fit(Fc.astype(np.float32), yb)
        proba = np.asarray(clf.predict_proba(Ft.astype(np.float32)), dtype=np.float64)
        classes = list(np.asarray(clf.classes_).tolist())
        self.last_fit = {"n_features": Fc.shape[1]}
        return np.clip(proba[:, classes.index(1)], 0.0, 1.0)

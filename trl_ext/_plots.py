"""matplotlib, an optional dependency (the ``plots`` extra): imported only when a plot is drawn.

Every plot of the package, the benchmarks and the examples goes through :func:`pyplot`; nothing imports matplotlib
at module level, so ``pip install trl-ext`` works without it and only the plotting paths need
``pip install "trl-ext[plots]"``.
"""

from __future__ import annotations

import importlib.util

__all__ = ["PLOTS_INSTALL_HINT", "matplotlib_available", "pyplot"]

#: How to get matplotlib, quoted by every message about it missing.
PLOTS_INSTALL_HINT = "pip install \"trl-ext[plots]\" (or pip install matplotlib)"


def matplotlib_available() -> bool:
    """Whether matplotlib can be imported (checked without importing it)."""
    return importlib.util.find_spec("matplotlib") is not None


def pyplot(purpose: str):
    """``matplotlib.pyplot`` on the non-interactive ``Agg`` backend.

    Raises ``ImportError`` saying that ``purpose`` (e.g. ``"--plot"``) needs matplotlib and how to install it, when
    matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(f"{purpose} needs matplotlib, which is not installed: {PLOTS_INSTALL_HINT}.") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

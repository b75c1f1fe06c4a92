"""Estimator audits on simulated prompt populations.

Each audit module (``basis``, ``v05``, ``pair``) exposes ``run_audit(seed: int = 0, quick: bool = False) -> dict``
(JSON-serialisable) and ``format_table(result: dict) -> str``. Run them with ``trl-ext audit`` or
``python benchmarks/estimator_audit.py``.
"""

AUDITS = ("basis", "v05", "pair")

__all__ = ["AUDITS"]

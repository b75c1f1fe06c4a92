"""Committed results, logs and docs name no machine paths (a reader on another machine cannot follow them)."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MACHINE_PATH = re.compile(r"(?<![\w.<])/(?:work|root|home|Users|tmp)/[\w.-]")
TEXT = (".json", ".jsonl", ".md", ".log", ".txt", ".csv")


def test_committed_results_and_docs_carry_no_machine_paths():
    found = []
    for top in ("benchmarks/results", "docs"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith(TEXT):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for i, line in enumerate(f, 1):
                        if MACHINE_PATH.search(line):
                            found.append(f"{os.path.relpath(path, ROOT)}:{i}")
                            break
    assert not found, f"machine paths (write them repository-relative or as <TRL_EXT_CACHE>/...): {found[:20]}"

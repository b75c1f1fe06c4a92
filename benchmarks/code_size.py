"""Code-size report of the ``trl_ext`` package: the trainer layer's lines, modules over 600 lines, functions over 100.

    python benchmarks/code_size.py            # table on stdout
    python benchmarks/code_size.py --json     # the same as JSON

Targets (the trainer-layer refactor): the trainer layer (``trl_ext/trainers/``) at most 3,500 **code lines** (a
line that holds a Python token outside a docstring: comments, blank lines and docstrings are not counted; the raw
line total is printed beside it), no module of ``trl_ext`` over 600 lines, no function over 100 lines (raw lines).
``tests/test_code_size.py`` holds the ratchet: what is over a target today may not grow, and what meets a target may
not fall back.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import pathlib
import tokenize

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trl_ext"
TRAINER_LAYER = PACKAGE / "trainers"
MODULE_LIMIT = 600
FUNCTION_LIMIT = 100
TRAINER_LAYER_LIMIT = 3500


def line_count(path: pathlib.Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
             tokenize.ENDMARKER}


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Lines of every docstring: a string literal standing alone as a statement (module, class and function
    docstrings, and the attribute docstrings under class attributes and module constants)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.update(range(node.lineno, node.end_lineno + 1))
    return out


def code_lines(path: pathlib.Path) -> set[int]:
    """Line numbers holding a Python token outside a docstring (every line a multi-line token spans counts)."""
    text = path.read_text(encoding="utf-8")
    doc = _docstring_lines(ast.parse(text))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in _NOT_CODE:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines - doc


def code_line_count(path: pathlib.Path) -> int:
    """Lines holding a Python token outside a docstring (see :func:`code_lines`)."""
    return len(code_lines(path))


def code_line_kinds(path: pathlib.Path) -> dict[str, int]:
    """The code lines of ``path`` by kind: ``help`` (inside a dataclass field's ``metadata=`` argument: the
    command-line help text), ``raise`` (inside a ``raise`` statement: the error messages) and ``logic`` (the rest).
    The kinds partition :func:`code_lines`."""
    lines = code_lines(path)
    help_lines: set[int] = set()
    raise_lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.keyword) and node.arg == "metadata":
            help_lines.update(range(node.value.lineno, node.value.end_lineno + 1))
        elif isinstance(node, ast.Raise):
            raise_lines.update(range(node.lineno, node.end_lineno + 1))
    help_lines &= lines
    raise_lines = (raise_lines & lines) - help_lines
    return {"help": len(help_lines), "raise": len(raise_lines),
            "logic": len(lines) - len(help_lines) - len(raise_lines)}


def class_code_line_count(path: pathlib.Path, name: str) -> int:
    """Code lines of the top-level class ``name`` in ``path`` (its decorators included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return len({i for i in code_lines(path) if start <= i <= node.end_lineno})


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
    trainer_code = {k: code_line_count(ROOT / k) for k in trainer}
    kinds = [code_line_kinds(ROOT / k) for k in trainer]
    return {
        "trainer_layer_code_lines_by_kind": {kind: sum(k[kind] for k in kinds) for kind in ("help", "raise", "logic")},
        "trainer_layer_code_lines": sum(trainer_code.values()),
        "trainer_layer_lines": sum(trainer.values()),
        "trainer_layer_limit": TRAINER_LAYER_LIMIT,
        "trainer_layer_modules": trainer,
        "trainer_layer_module_code_lines": trainer_code,
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
    ok = "meets" if rep["trainer_layer_code_lines"] <= TRAINER_LAYER_LIMIT else "over"
    print(f"trainer layer (trl_ext/trainers): {rep['trainer_layer_code_lines']} code lines ({ok} the "
          f"{TRAINER_LAYER_LIMIT} target); {rep['trainer_layer_lines']} lines in all")
    by_kind = rep["trainer_layer_code_lines_by_kind"]
    print(f"  of which: {by_kind['help']} help text (field metadata), {by_kind['raise']} raise statements (error "
          f"messages), {by_kind['logic']} the rest")
    print("    code     raw  module")
    code = rep["trainer_layer_module_code_lines"]
    for k, v in sorted(rep["trainer_layer_modules"].items(), key=lambda kv: -code[kv[0]]):
        print(f"  {code[k]:6d}  {v:6d}  {k}")
    print(f"package: {rep['package_lines']} lines; modules over {MODULE_LIMIT}: {len(rep['modules_over_limit'])}")
    for k, v in rep["modules_over_limit"].items():
        print(f"  {v:6d}  {k}")
    print(f"functions over {FUNCTION_LIMIT} lines: {len(rep['functions_over_limit'])}")
    for k, v in rep["functions_over_limit"].items():
        print(f"  {v:6d}  {k}")


if __name__ == "__main__":
    main()

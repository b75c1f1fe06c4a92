"""Command-line references: reward / scorer functions and datasets.

Every ``trl-ext`` command that takes a function (``gate --reward``, ``build-value-table --reward``,
``noise-floor --scorer``) resolves it with :func:`resolve_callable`, so all of them accept the same forms:

==============================  =====================================================================================
form                            meaning
==============================  =====================================================================================
``package.module:function``     an importable module; the current directory is importable (like ``python -m``)
``path/to/file.py:function``    a Python file, loaded by path; relative to the current directory. The file can
                                import modules next to it and from the current directory
==============================  =====================================================================================

``function`` may be a dotted attribute path (``module:Class.method``, ``module:obj.score``).

Commands that take a dataset (``gate --dataset``, ``build-value-table --dataset``) read it with
:func:`load_dataset_rows`: a ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file or a folder written by
``datasets``' ``save_to_disk``. Nothing is downloaded.

This module imports neither torch nor TRL (``trl-ext --help`` must stay light).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["ACCEPTED_FORMS", "DATASET_FORMS", "RefError", "resolve_callable", "resolve_reward_funcs", "load_dataset_rows"]

#: How a function reference may be written (quoted in every error message).
ACCEPTED_FORMS = "'package.module:function' (importable; the current directory is on the path) or 'path/to/file.py:function'"
#: How a dataset reference may be written.
DATASET_FORMS = "a .jsonl, .json, .csv or .parquet file, or a folder written by datasets' save_to_disk"


class RefError(ValueError):
    """A reference that cannot be resolved; the message says what was tried and which forms are accepted."""


def _ensure_on_path(folder: str) -> None:
    """Make ``folder`` importable (appended, so it never shadows an installed package)."""
    folder = os.path.abspath(folder)
    present = {os.path.abspath(p or os.curdir) for p in sys.path}
    if folder not in present:
        sys.path.append(folder)


def _load_file_module(path: str, option: str, ref: str):
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise RefError(f"{option} {ref!r}: file {os.path.relpath(path)!r} not found. Accepted forms: {ACCEPTED_FORMS}.")
    stem = os.path.splitext(os.path.basename(path))[0]
    digest = hashlib.sha256(path.encode("utf-8")).hexdigest()[:12]
    name = f"_trl_ext_ref_{''.join(c if c.isalnum() else '_' for c in stem)}_{digest}"
    if name in sys.modules:  # the same file named twice (e.g. two --reward functions from it): load it once
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RefError(f"{option} {ref!r}: {path!r} cannot be loaded as a Python module.")
    module = importlib.util.module_from_spec(spec)
    _ensure_on_path(os.getcwd())
    _ensure_on_path(os.path.dirname(path))
    sys.modules[name] = module  # registered before running it, as the import system does (dataclasses, pickling)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise RefError(f"{option} {ref!r}: running {os.path.relpath(path)!r} failed: {type(e).__name__}: {e}") from e
    return module


def _import_module(mod_name: str, option: str, ref: str):
    _ensure_on_path(os.getcwd())
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if mod_name == missing or mod_name.startswith(missing + "."):
            raise RefError(
                f"{option} {ref!r}: cannot import module {mod_name!r} ({e}). Accepted forms: {ACCEPTED_FORMS}."
            ) from e
        raise RefError(f"{option} {ref!r}: importing module {mod_name!r} failed: {e} (a dependency of the module "
                       "is missing)") from e
    except Exception as e:
        raise RefError(f"{option} {ref!r}: importing module {mod_name!r} failed: {type(e).__name__}: {e}") from e


def resolve_callable(ref: str, *, option: str = "reference") -> Callable[..., Any]:
    """Resolve ``package.module:function`` or ``path/to/file.py:function`` to the callable it names.

    Parameters
    ----------
    ref : str
        The reference (see the module docstring for the accepted forms).
    option : str
        The command-line option the reference came from (``"--reward"``, ``"--scorer"``), used in messages.

    Returns
    -------
    callable

    Raises
    ------
    RefError
        (a ``ValueError``) On a malformed reference, a module that cannot be imported, a missing file, a missing
        attribute or a non-callable one. The message names the option, the reference and the accepted forms.
    """
    if not isinstance(ref, str):
        raise RefError(f"{option} must be a string of the form {ACCEPTED_FORMS}; got {type(ref).__name__}.")
    target, sep, attr = ref.strip().rpartition(":")
    if not sep or not target or not attr or not all(part.isidentifier() for part in attr.split(".")):
        raise RefError(f"{option} must look like {ACCEPTED_FORMS}; got {ref!r}.")
    is_file = target.endswith(".py") or os.sep in target or (os.altsep is not None and os.altsep in target)
    if is_file:
        if not target.endswith(".py"):
            raise RefError(f"{option} {ref!r}: {target!r} looks like a path but not a .py file. Accepted forms: "
                           f"{ACCEPTED_FORMS}.")
        module = _load_file_module(target, option, ref)
        where = f"file {target!r}"
    else:
        if not all(part.isidentifier() for part in target.split(".")):
            raise RefError(f"{option} {ref!r}: {target!r} is not a module name. Accepted forms: {ACCEPTED_FORMS}.")
        module = _import_module(target, option, ref)
        where = f"module {target!r}"
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            origin = getattr(module, "__file__", None)
            hint = f" (loaded from {origin})" if origin and not is_file else ""
            raise RefError(f"{option} {ref!r}: {where}{hint} has no attribute {attr!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RefError(f"{option} {ref!r}: {attr!r} is not callable (it is a {type(obj).__name__}).")
    return obj


def resolve_reward_funcs(specs: list[str] | None, builtin: Mapping[str, Callable], dataset_name: str | None, *,
                         flag: str = "--reward_funcs", tasks: Iterable[str] | None = None) -> list[Callable]:
    """Reward functions by name, for the commands that take a built-in task or a user's dataset (``trl-ext advise``,
    the example scripts): a name of ``builtin`` (the task's rewards by name; each also by its function's name),
    ``package.module:function``, ``path/to/file.py:function`` or TRL's dotted ``package.module.function``. With no
    ``specs``, the task's first reward. ``flag`` names the option and ``tasks`` the built-in tasks (default: every
    registered one) in messages; ``ValueError`` on a bad name."""
    from trl_ext.registry import dataset_names

    builtin = {**builtin, **{f.__name__: f for f in builtin.values()}}
    tasks = ", ".join(dataset_names() if tasks is None else tasks)
    if not specs:
        if not builtin:
            raise ValueError(f"{flag} is required for dataset {dataset_name!r} (only the built-in tasks "
                             f"{tasks} have default rewards): pass 'package.module:function' or "
                             "'path/to/file.py:function'.")
        return [next(iter(builtin.values()))]
    funcs = []
    for spec in specs:
        if spec in builtin:
            funcs.append(builtin[spec])
            continue
        ref = spec
        if ":" not in spec and "." in spec and not spec.endswith(".py"):  # TRL's dotted form pkg.module.function
            ref = ":".join(spec.rsplit(".", 1))
        if ":" not in ref:
            names = f"built-in names for {dataset_name!r}: {sorted(builtin)}" if builtin else (
                f"no built-in names for dataset {dataset_name!r} (built-in tasks: {tasks})")
            raise ValueError(f"unknown reward function {spec!r}: {names}; or 'package.module:function', "
                             "'path/to/file.py:function', 'package.module.function'.")
        try:
            funcs.append(resolve_callable(ref, option=flag))
        except RefError as e:
            raise ValueError(str(e)) from e
    return funcs


# ------------------------------------------------------------------------------------------------- datasets
def _rows_from_jsonl(path: str) -> list[dict]:
    """Rows of a JSON Lines dataset (:func:`trl_ext._io.read_jsonl`: one object per line, ``.gz`` gunzipped);
    errors are :class:`RefError` naming ``file:line``."""
    from ._io import read_jsonl

    return read_jsonl(path, error=RefError)


def _rows_from_json(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if "Extra data" in e.msg:  # JSON Lines under a .json name
            return _rows_from_jsonl(path)
        raise RefError(f"{path}: not valid JSON: {e}") from e
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if isinstance(data, list):
        bad = [i for i, r in enumerate(data) if not isinstance(r, dict)]
        if bad:
            raise RefError(f"{path}: item {bad[0]} is not a JSON object; expected a list of row objects.")
        return [dict(r) for r in data]
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        lengths = {k: len(v) for k, v in data.items()}
        if len(set(lengths.values())) != 1:
            raise RefError(f"{path}: the columns have different lengths {lengths}.")
        n = next(iter(lengths.values()))
        return [{k: v[i] for k, v in data.items()} for i in range(n)]
    raise RefError(f"{path}: expected a list of row objects, a dict of equal-length columns, or JSON Lines.")


def _rows_from_csv(path: str) -> list[dict]:
    import csv

    with open(path, encoding="utf-8", newline="") as f:
        return [dict(r) for r in csv.DictReader(f)]


def _rows_from_parquet(path: str) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - pyarrow comes with datasets
        raise RefError(f"{path}: reading parquet needs pyarrow (`pip install pyarrow`).") from e
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:
        raise RefError(f"{path}: cannot read as parquet: {type(e).__name__}: {e}") from e


def _rows_from_disk(path: str, split: str | None) -> tuple[list[dict], str | None]:
    try:
        from datasets import Dataset, DatasetDict, load_from_disk
    except ImportError as e:  # pragma: no cover - datasets is a dependency
        raise RefError(f"{path}: reading a saved dataset folder needs `datasets`.") from e
    try:
        ds = load_from_disk(path)
    except (FileNotFoundError, ValueError, OSError) as e:
        raise RefError(f"{path}: a folder, but not one written by datasets' save_to_disk ({e}). A dataset is "
                       f"{DATASET_FORMS}.") from e
    if isinstance(ds, DatasetDict):
        names = sorted(ds)
        if split is None:
            if len(names) != 1:
                raise RefError(f"{path}: a DatasetDict with splits {names}; choose one with --split.")
            split = names[0]
        if split not in ds:
            raise RefError(f"{path}: no split {split!r}; the saved DatasetDict has {names}.")
        ds = ds[split]
    elif not isinstance(ds, Dataset):  # pragma: no cover - load_from_disk returns one of the two
        raise RefError(f"{path}: unexpected object {type(ds).__name__} from load_from_disk.")
    else:
        split = None
    return [dict(r) for r in ds], split


def load_dataset_rows(path: str | os.PathLike, *, split: str | None = None) -> list[dict]:
    """Rows of a local dataset (never downloads).

    Parameters
    ----------
    path : str or PathLike
        A ``.jsonl`` (one JSON object per line), ``.json`` (a list of objects, ``{"data": [...]}``, a dict of
        equal-length columns, or JSON Lines), ``.csv`` (a header row; values are strings) or ``.parquet`` file, or a
        folder written by ``datasets.Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``.
    split : str, optional
        The split of a saved ``DatasetDict`` (required when it has several); ignored otherwise.

    Returns
    -------
    list of dict
        One dict per row, in file order.

    Raises
    ------
    RefError
        (a ``ValueError``) A missing path, an unsupported extension, unreadable content, or no rows.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        hint = ""
        if not os.path.isabs(path) and path.count("/") == 1 and "." not in path.split("/")[0]:
            hint = (" (hub datasets are not downloaded: save one locally with "
                    "`datasets.load_dataset(...).save_to_disk(DIR)` and pass DIR)")
        raise RefError(f"dataset {path!r} not found{hint}. A dataset is {DATASET_FORMS}.")
    if os.path.isdir(path):
        rows, _ = _rows_from_disk(path, split)
    else:
        ext = os.path.splitext(path)[1].lower()
        readers = {".jsonl": _rows_from_jsonl, ".ndjson": _rows_from_jsonl, ".json": _rows_from_json,
                   ".csv": _rows_from_csv, ".parquet": _rows_from_parquet, ".pq": _rows_from_parquet}
        if ext not in readers:
            raise RefError(f"dataset {path!r}: unsupported file type {ext or '(none)'!r}. A dataset is {DATASET_FORMS}.")
        try:
            rows = readers[ext](path)
        except UnicodeDecodeError as e:
            raise RefError(f"{path}: not UTF-8 text ({e}).") from e
    if not rows:
        raise RefError(f"dataset {path!r} has no rows.")
    return rows

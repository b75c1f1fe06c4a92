"""The ``trl-ext`` command line: every registered subcommand ships, builds its parser, and ``--help`` stays TRL-free."""

import subprocess
import sys

import pytest

from trl_ext import cli


def test_every_registered_command_is_shipped_and_has_the_contract():
    import importlib

    for name, (module, help_text) in cli.COMMANDS.items():
        assert cli._available(module), f"trl-ext {name}: module {module} is missing"
        mod = importlib.import_module(module)
        assert callable(mod.add_arguments) and callable(mod.main), name
        assert help_text


def test_help_lists_every_command(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert name in out


def test_version_and_unknown_command(capsys):
    from trl_ext import __version__

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == __version__
    with pytest.raises(SystemExit):
        cli.main(["no-such-command"])


def test_help_does_not_import_trl_or_torch():
    code = ("import sys; from trl_ext import cli; cli.build_parser(); "
            "bad = [m for m in ('trl', 'torch', 'transformers', 'datasets') if m in sys.modules]; print(bad); "
            "sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_matplotlib_is_optional(monkeypatch):
    """matplotlib is the optional ``plots`` extra: no module imports it at load time, a missing matplotlib is a clear
    ImportError naming the extra, and ``trl-ext advise --plot`` warns and skips as documented."""
    code = ("import sys, trl_ext.advise.cli, trl_ext.stats.curves, trl_ext.stats.compare, trl_ext._plots; "
            "sys.exit(1 if 'matplotlib' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from trl_ext._plots import matplotlib_available, pyplot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    assert not matplotlib_available()
    with pytest.raises(ImportError, match=r"--plot needs matplotlib, which is not installed: pip install "
                                          r"\"trl-ext\[plots\]\""):
        pyplot("--plot")
    from trl_ext.advise.cli import plot_advice

    with pytest.warns(UserWarning, match=r"--plot skipped \(pip install \"trl-ext\[plots\]\""):
        assert plot_advice(None, "never.png") is None


def test_shared_argparse_types():
    import argparse

    from trl_ext._argtypes import nonneg_int, positive_float, positive_int

    assert positive_int("3") == 3 and nonneg_int("0") == 0 and positive_float("0.5") == 0.5
    for fn, bad in ((positive_int, "0"), (nonneg_int, "-1"), (positive_float, "0"), (positive_float, "inf"),
                    (positive_float, "nan")):  # fmt: skip
        with pytest.raises(argparse.ArgumentTypeError):
            fn(bad)


def test_write_json_is_atomic_and_creates_dirs(tmp_path):
    import json

    from trl_ext._io import write_json

    path = tmp_path / "a" / "b.json"
    assert write_json(str(path), {"x": 1}) == str(path)
    assert json.loads(path.read_text()) == {"x": 1}
    assert [p.name for p in path.parent.iterdir()] == ["b.json"]  # no tmp file left behind


# ------------------------------------------------------------------------------------------ references and datasets
@pytest.fixture
def clean_path(monkeypatch):
    """Undo sys.path additions the resolver makes (the current directory, a loaded file's folder)."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_help_names_the_reference_forms(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "package.module:function" in out and "path/to/file.py:function" in out


def test_refs_module_is_light():
    code = ("import sys; import trl_ext.refs; "
            "bad = [m for m in ('trl', 'torch', 'transformers', 'datasets') if m in sys.modules]; print(bad); "
            "sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_resolve_callable_accepted_forms(tmp_path, monkeypatch, clean_path):
    from trl_ext.measurement.noise_floor import deterministic_toy_scorer
    from trl_ext.refs import resolve_callable

    assert resolve_callable("trl_ext.measurement.noise_floor:deterministic_toy_scorer") is deterministic_toy_scorer
    pkg = tmp_path / "proj"
    (pkg / "rw").mkdir(parents=True)
    (pkg / "helper_ref_mod.py").write_text("BONUS = 0.5\n")
    (pkg / "rw" / "neighbour_ref_mod.py").write_text("HALF = 0.5\n")
    (pkg / "rw" / "scores.py").write_text(
        "from helper_ref_mod import BONUS\n"  # a file can import from the current directory ...
        "from neighbour_ref_mod import HALF\n"  # ... and its neighbours
        "assert BONUS == HALF\n"
        "def score(texts):\n    return [BONUS] * len(texts)\n"
        "class K:\n    @staticmethod\n    def m(texts):\n        return [1.0] * len(texts)\n"
    )
    (pkg / "cwd_ref_mod_xyz.py").write_text("def f(texts):\n    return [2.0] * len(texts)\n")
    monkeypatch.chdir(pkg)
    # file form: relative, absolute, and a dotted attribute
    assert resolve_callable("rw/scores.py:score")(["a"]) == [0.5]
    assert resolve_callable(f"{pkg}/rw/scores.py:K.m")(["a", "b"]) == [1.0, 1.0]
    assert resolve_callable("./rw/scores.py:score") is resolve_callable("rw/scores.py:score")  # loaded once
    # module form: the current directory is importable (a console script does not put it on sys.path itself)
    assert resolve_callable("cwd_ref_mod_xyz:f")(["x"]) == [2.0]


@pytest.mark.parametrize(
    ("ref", "match"),
    [
        ("no_colon", "must look like 'package.module:function' .* or 'path/to/file.py:function'"),
        ("mod:", "must look like"),
        ("mod:not an identifier", "must look like"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'.*Accepted forms"),
        ("trl_ext.measurement.noise_floor:nope", "has no attribute 'nope'"),
        ("trl_ext.measurement.noise_floor:__doc__", "is not callable"),
        ("missing_dir/x.py:f", "file 'missing_dir/x.py' not found.*Accepted forms"),
        ("some/dir:f", "looks like a path but not a .py file"),
    ],
)
def test_resolve_callable_errors(ref, match):
    from trl_ext.refs import RefError, resolve_callable

    with pytest.raises(RefError, match=match):
        resolve_callable(ref, option="--reward")
    assert issubclass(RefError, ValueError)


def test_resolve_callable_reports_failures_inside_the_module(tmp_path, clean_path):
    from trl_ext.refs import RefError, resolve_callable

    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(RefError, match="running .*broken.py' failed: SyntaxError"):
        resolve_callable(f"{tmp_path}/broken.py:f")
    (tmp_path / "needs_dep_ref_xyz.py").write_text("import not_installed_dep_xyz\ndef f(t):\n    return t\n")
    sys.path.append(str(tmp_path))
    with pytest.raises(RefError, match="a dependency of the module is missing"):
        resolve_callable("needs_dep_ref_xyz:f")


def test_every_reference_option_uses_the_shared_resolver(tmp_path, monkeypatch, capsys):
    """gate, build-value-table and noise-floor resolve their function references with trl_ext.refs only."""
    from trl_ext import refs

    seen = []

    def spy(ref, *, option="reference"):
        seen.append((option, ref))
        raise refs.RefError(f"SPY {option} {ref}")

    monkeypatch.setattr(refs, "resolve_callable", spy)
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    items = tmp_path / "items.jsonl"
    items.write_text('{"text": "a"}\n')
    out = str(tmp_path / "o.json")
    commands = {
        "gate": ["gate", "--model", str(tmp_path), "--dataset", str(data), "--reward", "x.py:f"],
        "build-value-table": ["build-value-table", "--model", str(tmp_path), "--dataset", str(data), "--reward",
                              "x.py:f", "--output", out, "--no_progress"],
        "noise-floor": ["noise-floor", "--scorer", "x.py:f", "--items", str(items), "--filler", str(items),
                        "--output", out],
    }
    for name, argv in commands.items():
        seen.clear()
        assert cli.main(argv) == 2, name
        assert seen == [("--scorer" if name == "noise-floor" else "--reward", "x.py:f")], name
        assert "SPY" in capsys.readouterr().err, name


def _rows():
    return [{"prompt": "1+2=", "answer": "3"}, {"prompt": "4+5=", "answer": "9"}]


def test_load_dataset_rows_file_forms(tmp_path):
    import json

    from trl_ext.refs import load_dataset_rows

    rows = _rows()
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    (tmp_path / "b.json").write_text(json.dumps(rows))
    (tmp_path / "c.json").write_text(json.dumps({"prompt": ["1+2=", "4+5="], "answer": ["3", "9"]}))
    (tmp_path / "d.json").write_text(json.dumps({"data": rows}))
    (tmp_path / "e.json").write_text("".join(json.dumps(r) + "\n" for r in rows))  # JSON Lines named .json
    (tmp_path / "f.csv").write_text("prompt,answer\n1+2=,3\n4+5=,9\n")
    for name in ("a.jsonl", "b.json", "c.json", "d.json", "e.json", "f.csv"):
        assert load_dataset_rows(tmp_path / name) == rows, name
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "g.parquet")
    assert load_dataset_rows(tmp_path / "g.parquet") == rows


def test_load_dataset_rows_save_to_disk_and_errors(tmp_path):
    from datasets import Dataset, DatasetDict

    from trl_ext.refs import RefError, load_dataset_rows

    rows = _rows()
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    assert load_dataset_rows(tmp_path / "ds") == rows
    DatasetDict({"train": Dataset.from_list(rows), "test": Dataset.from_list(rows[:1])}).save_to_disk(
        str(tmp_path / "dd"))
    assert load_dataset_rows(tmp_path / "dd", split="test") == rows[:1]
    with pytest.raises(RefError, match=r"splits \['test', 'train'\]; choose one with --split"):
        load_dataset_rows(tmp_path / "dd")
    with pytest.raises(RefError, match="no split 'dev'"):
        load_dataset_rows(tmp_path / "dd", split="dev")
    (tmp_path / "plain").mkdir()
    with pytest.raises(RefError, match="not one written by datasets' save_to_disk"):
        load_dataset_rows(tmp_path / "plain")
    with pytest.raises(RefError, match="hub datasets are not downloaded"):
        load_dataset_rows("openai/gsm8k")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(RefError, match="unsupported file type '.txt'"):
        load_dataset_rows(tmp_path / "x.txt")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(RefError, match="has no rows"):
        load_dataset_rows(tmp_path / "empty.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n[1]\n')
    with pytest.raises(RefError, match="bad.jsonl:2: each line must be a JSON object"):
        load_dataset_rows(tmp_path / "bad.jsonl")

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
            "bad = [m for m in ('trl', 'torch', 'transformers') if m in sys.modules]; print(bad); "
            "sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


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

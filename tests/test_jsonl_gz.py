"""Gzip-compressed JSON Lines: per-question outcome files stored as ``.jsonl.gz``.

* the outcome writer compresses by suffix, deterministically; every outcome reader (testbed, ``trl_ext.stats``,
  ``trl-ext compare``) and the generic JSON Lines row reader gunzip by suffix;
* a path ``X.jsonl`` that does not exist falls back to ``X.jsonl.gz`` (committed ``runs.json`` files name
  ``outcomes.jsonl``), also for ``trl-ext compare`` glob patterns; a plain file wins when both exist;
* the comparison harness writes ``outcomes.jsonl.gz`` and still completes reused runs whose outcomes are plain;
* every outcome file named by a committed ``runs.json`` resolves to a file on disk;
* ``trl_ext._io.read_jsonl``, the one JSON Lines reader behind all of these, is strict and names ``file:line``.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from types import SimpleNamespace

import pytest

from trl_ext._io import open_text, read_jsonl, resolve_jsonl, write_text_atomic
from trl_ext.refs import _rows_from_jsonl
from trl_ext.stats import compare_cli
from trl_ext.stats.outcomes import OutcomeFormatError, read_outcomes
from trl_ext.testbed import read_outcomes_jsonl, write_outcomes_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _records(n=6, shift=0):
    return [{"question_id": f"q{i}", "correct": (i + shift) % 2, "pass_rate": ((i + shift) % 3) / 2,
             "n_samples": 2, "completion_tokens": 3.0 + i} for i in range(n)]


def test_writer_compresses_by_suffix_deterministically_and_readers_agree(tmp_path):
    recs = _records()
    gz = write_outcomes_jsonl(tmp_path / "a" / "outcomes.jsonl.gz", recs)
    plain = write_outcomes_jsonl(tmp_path / "b" / "outcomes.jsonl", recs)
    raw = open(gz, "rb").read()
    assert raw[:2] == b"\x1f\x8b" and open(plain, "rb").read()[:1] == b"{"
    assert gzip.decompress(raw) == open(plain, "rb").read()
    # same records -> same bytes (no name or time stamp in the gzip header)
    again = write_outcomes_jsonl(tmp_path / "c" / "outcomes.jsonl.gz", recs)
    assert open(again, "rb").read() == raw
    assert not glob.glob(str(tmp_path / "*" / "*.tmp-*"))
    assert read_outcomes_jsonl(gz) == read_outcomes_jsonl(plain) == recs
    a, b = read_outcomes(gz), read_outcomes(plain)
    assert a.question_ids == b.question_ids and a.path == gz
    assert (a.correct == b.correct).all() and (a.pass_rate == b.pass_rate).all()
    assert _rows_from_jsonl(gz) == recs


def test_reads_files_compressed_by_the_gzip_tool_format(tmp_path):
    """A file gzipped outside Python (any mtime/name header) reads the same."""
    text = "\n".join(json.dumps(r) for r in _records()) + "\n"
    p = tmp_path / "outcomes.jsonl.gz"
    with open(p, "wb") as raw, gzip.GzipFile(filename="outcomes.jsonl", mode="wb", fileobj=raw, mtime=1234567) as f:
        f.write(text.encode())
    assert read_outcomes_jsonl(p) == _records()
    assert read_outcomes(p).question_ids == tuple(f"q{i}" for i in range(6))


def test_missing_jsonl_falls_back_to_jsonl_gz(tmp_path):
    gz = write_outcomes_jsonl(tmp_path / "outcomes.jsonl.gz", _records())
    name = str(tmp_path / "outcomes.jsonl")
    assert not os.path.exists(name) and resolve_jsonl(name) == gz
    assert read_outcomes_jsonl(name) == _records()
    run = read_outcomes(name)
    assert run.path == gz and len(run) == 6
    # a plain file wins when both exist
    write_outcomes_jsonl(name, _records(shift=1))
    assert resolve_jsonl(name) == name and read_outcomes_jsonl(name) == _records(shift=1)
    # nothing to fall back to: the given name is reported
    missing = str(tmp_path / "none" / "outcomes.jsonl")
    assert resolve_jsonl(missing) == missing
    with pytest.raises(OutcomeFormatError, match=r"none/outcomes\.jsonl: file not found"):
        read_outcomes(missing)
    with pytest.raises(FileNotFoundError):
        read_outcomes_jsonl(missing)
    # only .jsonl names fall back
    assert resolve_jsonl(str(tmp_path / "outcomes.json")) == str(tmp_path / "outcomes.json")


def test_bad_gzip_is_an_outcome_format_error(tmp_path):
    bad = tmp_path / "outcomes.jsonl.gz"
    bad.write_bytes(b"not gzip at all\n")
    with pytest.raises(OutcomeFormatError, match="unreadable"):
        read_outcomes(bad)
    trunc = tmp_path / "t" / "outcomes.jsonl.gz"
    write_outcomes_jsonl(trunc, _records(50))
    trunc.write_bytes(trunc.read_bytes()[:-20])
    with pytest.raises(OutcomeFormatError, match="unreadable"):
        read_outcomes(trunc)


def test_invalid_json_inside_gz_names_file_and_line(tmp_path):
    p = write_text_atomic(tmp_path / "outcomes.jsonl.gz", '{"question_id": "q0", "correct": 1}\n{oops\n')
    with pytest.raises(OutcomeFormatError, match=r"outcomes\.jsonl\.gz:2: not valid JSON"):
        read_outcomes(p)
    with open_text(p) as f:
        assert f.readline().startswith('{"question_id"')


def _run_cli(argv):
    import argparse

    parser = argparse.ArgumentParser()
    compare_cli.add_arguments(parser)
    return compare_cli.main(parser.parse_args(argv))


def test_compare_cli_reads_gz_files_and_falls_back_for_paths_and_patterns(tmp_path, capsys):
    for s in (0, 1, 2):
        write_outcomes_jsonl(tmp_path / "a" / f"seed{s}" / "outcomes.jsonl.gz", _records(40, shift=s))
        write_outcomes_jsonl(tmp_path / "b" / f"seed{s}" / "outcomes.jsonl.gz", _records(40, shift=s + 1))
    base = ["--n-sim", "50", "--n-boot", "100"]
    # .gz pattern, .jsonl pattern (no match -> .jsonl.gz), explicit .jsonl names (fallback per file)
    for a, b in ((["a/seed*/outcomes.jsonl.gz"], ["b/seed*/outcomes.jsonl.gz"]),
                 (["a/seed*/outcomes.jsonl"], ["b/seed*/outcomes.jsonl"]),
                 ([f"a/seed{s}/outcomes.jsonl" for s in (0, 1, 2)], [f"b/seed{s}/outcomes.jsonl" for s in (0, 1, 2)])):
        rc = _run_cli(["--a", *[str(tmp_path / x) for x in a], "--b", *[str(tmp_path / x) for x in b], *base])
        out = capsys.readouterr().out
        assert rc == 0 and "3 seed(s) x 40 questions" in out, (a, out)
    # a name matching neither .jsonl nor .jsonl.gz is reported as missing (exit 2)
    rc = _run_cli(["--a", str(tmp_path / "c/seed0/outcomes.jsonl"), "--b", str(tmp_path / "b/seed0/outcomes.jsonl"),
                   *base])
    err = capsys.readouterr().err
    assert rc == 2 and "c/seed0/outcomes.jsonl: file not found" in err, err


def test_expand_prefers_plain_matches_and_refuses_a_pattern_matching_nothing(tmp_path):
    for s in (0, 1):
        write_outcomes_jsonl(tmp_path / f"seed{s}" / "outcomes.jsonl.gz", _records())
    write_outcomes_jsonl(tmp_path / "seed0" / "outcomes.jsonl", _records())
    pat = str(tmp_path / "seed*" / "outcomes.jsonl")
    assert compare_cli._expand([pat]) == [str(tmp_path / "seed0" / "outcomes.jsonl")]
    (tmp_path / "seed0" / "outcomes.jsonl").unlink()
    assert compare_cli._expand([pat]) == [str(tmp_path / f"seed{s}" / "outcomes.jsonl.gz") for s in (0, 1)]
    missing = str(tmp_path / "none*" / "outcomes.jsonl")
    with pytest.raises(ValueError, match="--b pattern .* matches no file"):
        compare_cli._expand([missing], "--b")
    plain = str(tmp_path / "absent.jsonl")  # a plain path is kept: the reader reports it as missing
    assert compare_cli._expand([plain]) == [plain]


def _load_bench():
    from bench_module import compare_trainers  # tests/ is on sys.path (pytest's rootdir insertion)

    return compare_trainers()


@pytest.mark.parametrize("stored", ["outcomes.jsonl", "outcomes.jsonl.gz"])
@pytest.mark.parametrize("named", ["outcomes.jsonl", "outcomes.jsonl.gz"])
def test_harness_completes_reused_runs_with_plain_or_gz_outcomes(tmp_path, stored, named):
    ct = _load_bench()
    recs = _records(4)
    write_outcomes_jsonl(tmp_path / "runs" / "m" / "seed0" / stored, recs)
    levels = {"q0": "2", "q1": "2", "q2": "3", "q3": "3"}
    ctx = SimpleNamespace(s={"output_dir": str(tmp_path)}, difficulty_levels=lambda split: levels)
    spec = SimpleNamespace(setup=None)
    rec = {"outcomes": f"runs/m/seed0/{named}", "status": "ok"}
    out = ct._complete_reused(ctx, spec, rec, {}, 1e-4, "test")
    if stored == named or named == "outcomes.jsonl":  # exact name, or the .jsonl -> .jsonl.gz fallback
        assert out["final_accuracy_by_level"] == ct.accuracy_by_level(recs, levels)
        assert out["final_accuracy_by_level"] is not None
    else:  # a .gz name never falls back to a plain file
        assert out["final_accuracy_by_level"] is None


def test_committed_runs_name_outcome_files_that_exist():
    """Every outcome file a committed ``runs.json`` names (often ``outcomes.jsonl``, now stored as
    ``outcomes.jsonl.gz``) resolves to a file on disk."""
    docs = glob.glob(os.path.join(ROOT, "benchmarks", "results", "**", "runs.json"), recursive=True)
    checked = 0
    for path in docs:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        out_dir = os.path.dirname(path)
        for r in list(doc.get("runs") or []) + list(doc.get("tuning_runs") or []):
            for key in ("outcomes", "outcomes_sampled"):
                if r.get("status") == "ok" and r.get(key):
                    name = os.path.join(out_dir, r[key])
                    assert os.path.isfile(resolve_jsonl(name)), name
                    checked += 1
    if docs:
        assert checked > 0


def test_read_jsonl_is_strict_and_names_the_line(tmp_path):
    """The shared reader: blank lines skipped, ``\r\n`` handled, U+2028 inside a string kept (no splitlines),
    ``.gz`` and the ``.jsonl`` -> ``.jsonl.gz`` fallback, the caller's error class with ``file:line``."""
    class MyError(ValueError):
        pass

    text = '{"a": 1}\r\n\n  \n{"b": "x\u2028y"}\n'
    plain = tmp_path / "p.jsonl"
    plain.write_bytes(text.encode("utf-8"))
    assert read_jsonl(plain) == [{"a": 1}, {"b": "x\u2028y"}]
    assert read_jsonl(plain, numbered=True) == [(1, {"a": 1}), (4, {"b": "x\u2028y"})]
    write_text_atomic(tmp_path / "z.jsonl.gz", text)
    assert read_jsonl(tmp_path / "z.jsonl") == read_jsonl(plain)  # fallback to the .gz twin
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert read_jsonl(tmp_path / "empty.jsonl") == []  # the caller decides whether empty is an error
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(MyError, match=r"bad\.jsonl:2: not valid JSON"):
        read_jsonl(bad, error=MyError)
    bad.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: each line must be a JSON object; got list"):
        read_jsonl(bad)
    assert read_jsonl(bad, objects=False) == [{"a": 1}, [1, 2]]
    bad.write_bytes(b'{"a": "\xff"}\n')
    with pytest.raises(MyError, match="not UTF-8 text"):
        read_jsonl(bad, error=MyError)
    (tmp_path / "c.jsonl.gz").write_bytes(b"not gzip\n")
    with pytest.raises(MyError, match="unreadable"):
        read_jsonl(tmp_path / "c.jsonl.gz", error=MyError)
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "missing.jsonl")

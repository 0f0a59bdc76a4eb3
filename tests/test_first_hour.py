"""What a new, careless or hostile user meets: each is one line naming the file, line or
key, exit code 1, nothing half-written (issue 26's "one line, not a traceback")."""

import sqlite3

import pytest
from typer.testing import CliRunner

from nbx_tune.testing import planted
from nbx_tune.cli.app import app
from nbx_tune.errors import StoreError, TraceError
from nbx_tune.kernels.runtime.registry import register
from nbx_tune.tuner import commands as api
from nbx_tune.tuner.store import Store
from nbx_tune.tuner.store.db import safe_url
from nbx_tune.kernels.trace import parse_trace_text, read_trace

register(planted.SPEC)
HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"
BIG = str(2 ** 63)


def one_line(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    return r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: ")


@pytest.mark.parametrize("body,match", [
    (f"test.double\tfloat32\t{BIG}\t\t1\n", r"line 3: column 3 \(shapes\): dim 9223372036854775808 .* over 2\^63"),
    (f"test.double\tfloat32\t100\t\t{BIG}\n", r"line 3: column 5 \(count\): count 9223372036854775808 is over"),
    (f"test.double\tfloat32\t100\t\t{2 ** 62}\ntest.double\tfloat32\t200\t\t{2 ** 62}\n",
     "line 4: column 5 \\(count\\): the counts add up to more than 2\\^63"),
])
def test_numbers_a_database_cannot_hold_are_trace_errors(body, match):
    with pytest.raises(TraceError, match=match):
        parse_trace_text(HEAD + body, "t.tsv")


def test_a_volume_over_2_63_is_not_servable_and_the_census_goes_on(tmp_path, db_url, monkeypatch):
    """A kernel (a plugin's, say) that makes a problem no database integer can count."""
    from nbx_tune.kernels.spec import Problem, seat_flags

    read = planted.SPEC.problem_from_row

    def huge(row):
        p = read(row)
        return Problem(p.kernel, p.dtypes, seat_flags(), (2 ** 62, 4)) if p.dims[0] == 999 else p

    monkeypatch.setattr(planted.SPEC, "problem_from_row", huge)
    t = tmp_path / "t.tsv"
    t.write_text(HEAD + "test.double\tfloat32\t999\t\t1\ntest.double\tfloat32\t100\t\t1\n")
    rep = api.census(str(t), db_url, isolate=False)
    assert [s.status for s in rep.seats] == ["certified"]
    assert any("2^63" in why for _, _, why, _ in rep.not_servable)


def test_a_byte_order_mark_before_the_header_is_accepted():
    assert len(parse_trace_text("\ufeff" + HEAD + "test.double\tfloat32\t100\t\t1\n").rows) == 1


def test_a_device_file_is_never_read_whole():
    with pytest.raises(TraceError, match="/dev/zero: not a regular file"):
        read_trace("/dev/zero")


def test_a_plugin_whose_row_reader_raises_costs_its_rows_not_the_census(tmp_path, db_url, monkeypatch):
    def broken(row):
        raise RuntimeError("plugin bug")

    monkeypatch.setattr(planted.SPEC, "problem_from_row", broken)
    t = tmp_path / "t.tsv"
    t.write_text(HEAD + "test.double\tfloat32\t100\t\t1\n")
    rep = api.census(str(t), db_url, isolate=False)
    assert rep.seats == [] and "RuntimeError: plugin bug" in rep.not_servable[0][2]


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_database_is_one_line(tmp_path, damage):
    path = tmp_path / "bad.db"
    url = f"sqlite:///{path}"
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 100)
    else:
        t = tmp_path / "t.tsv"
        t.write_text(HEAD + "test.double\tfloat32\t100\t\t1\n")
        api.census(str(t), url, isolate=False)
        with sqlite3.connect(path) as c:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 3])
    r = CliRunner().invoke(app, ["seats", "--db", url])
    assert one_line(r), r.output


def test_a_port_that_is_not_a_number_and_passwords_in_the_query(tmp_path):
    with pytest.raises(StoreError, match="bad database URL"):
        Store("postgresql+psycopg://u@h:abc/db")
    shown = safe_url("postgresql+psycopg://u:pw1@h/db?password=secret&sslmode=require")
    assert "secret" not in shown and "pw1" not in shown and "sslmode=require" in shown


def test_a_failing_migration_is_one_line_and_changes_nothing(tmp_path, monkeypatch):
    from alembic import command

    def fails(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(command, "upgrade", fails)
    url = f"sqlite:///{tmp_path / 'n.db'}"
    r = CliRunner().invoke(app, ["db", "upgrade", "--db", url])
    assert one_line(r) and "migrating to" in r.stderr and "disk on fire" in r.stderr


@pytest.mark.slow
def test_the_compile_pool_leaves_a_broken_plugin_to_the_census_one_line(tmp_path):
    """A plugin that raises on import: the compile pool's processes (on a GPU) used to print
    a traceback before the census's own one-line error."""
    import os
    import subprocess
    import sys

    (tmp_path / "fh_broken_plugin.py").write_text("raise RuntimeError('plugin bug')\n")
    code = ("from nbx_tune.tuner.execution.precompile import _serve_compiles\n"
            "import os\nos.nice = lambda n: 0\n"  # not the test's business
            "_serve_compiles(None, None, None, ['fh_broken_plugin'], dict(os.environ))\n")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-1500:]

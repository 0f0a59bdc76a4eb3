"""The command line through Typer's CliRunner: every command has help, results come as
tables or JSON, a user error is one line with exit code 1, misuse is exit code 2."""

import json
import sys

import pytest
from typer.testing import CliRunner

from nbx_tune.testing import planted
from nbx_tune.cli.app import app
from nbx_tune.kernels.runtime.registry import register

register(planted.SPEC)
HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"
runner = CliRunner()

COMMANDS = [["census"], ["worker"], ["baseline"], ["seats"], ["show"], ["refusals"], ["unscreened"], ["export"], ["import"],
            ["trace"], ["run"], ["profiles"], ["profiles", "list"], ["profiles", "show"], ["profiles", "check"],
            ["db"], ["db", "upgrade"], ["db", "current"]]


def run(*args, env=None):
    return runner.invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c))
def test_every_command_has_help(cmd):
    r = run(*cmd, "--help")
    assert r.exit_code == 0 and "Usage:" in r.output


@pytest.fixture
def trace_file(tmp_path):
    p = tmp_path / "t.tsv"
    p.write_text(HEAD + "test.double\tfloat32\t1000\t\t2\naten.logcumsumexp\tint64\t1x24\tdim=-1\t5\n")
    return p


@pytest.mark.slow
def test_census_json_then_queries(tmp_path, trace_file, db_url):
    r = run("census", "--model", str(trace_file), "--db", db_url, "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["coverage"]["certified"] == {"seats": 1, "launches": 2}
    assert rep["not_covered"] == [{"op": "aten.logcumsumexp", "launches": 5, "reason": "no kernel serves this op"}]
    seat_id = rep["seats"][0]["id"]

    r = run("seats", "--db", db_url, "--json")
    assert [s["status"] for s in json.loads(r.stdout)] == ["certified"]
    r = run("seats", "--db", db_url, "--status", "pending", "--json")
    assert json.loads(r.stdout) == []

    r = run("show", str(seat_id), "--db", db_url, "--json")
    shown = json.loads(r.stdout)
    assert shown["seat"]["label"] == rep["seats"][0]["label"]
    reasons = {x["reason"] for x in shown["refusals"]}
    assert {"unwritten_output", "wrong_answer", "smem_over_budget"} <= reasons
    r = run("show", rep["seats"][0]["label"], "--db", db_url)
    assert r.exit_code == 0 and "certificate (current)" in r.stdout and "screened at" in r.stdout
    assert "search: full" in r.stdout and "sampled regret of ranked searches" in r.stdout

    r = run("refusals", "--db", db_url, "--reason", "wrong_answer", "--json")
    rows = json.loads(r.stdout)
    assert len(rows) == 1 and rows[0]["config"] == planted.WRONG.key() and "> rtol" in rows[0]["detail"]
    r = run("refusals", "--db", db_url, "--kernel", "test_double")
    assert r.exit_code == 0 and "unwritten_output" in r.stdout

    r = run("unscreened", "--db", db_url, "--json")
    assert json.loads(r.stdout) == []

    out = tmp_path / "table.json"
    # Without --profile, or with one the database holds no seat of, one line naming those it
    # holds, nothing written (the second used to write an empty table, exit 0).
    for args, says in ((), "which profile?"), (("--profile", "hopper"), "no seat of profile hopper"):
        r = run("export", *args, "-o", str(out), "--db", db_url)
        assert r.exit_code == 1 and says in r.output and "holds interpreter (1 seats)" in r.output
        assert "--profile interpreter" in r.output and not out.exists()
    r = run("export", "--profile", "interpreter", "-o", str(out), "--db", db_url)
    assert r.exit_code == 0 and "wrote 1 certified configs" in r.stdout
    r = run("import", str(out), "--db", f"sqlite:///{tmp_path / 'b.db'}")
    assert r.exit_code == 0 and "1 certificates added" in r.stdout


@pytest.mark.slow
def test_census_draws_tables_and_progress(trace_file, db_url):
    r = run("census", "--model", str(trace_file), "--db", db_url)
    assert r.exit_code == 0, r.output
    for text in ("Coverage of", "not covered", "Seats after census run 1", "certified", "aten.logcumsumexp"):
        assert text in r.stdout
    r = run("census", "--model", str(trace_file), "--db", db_url, "--dry-run")
    assert r.exit_code == 0 and "dry run: nothing written" in r.stdout


@pytest.mark.parametrize("args,match", [
    (["census", "--model", "/no/such/trace.tsv"], "/no/such/trace.tsv: cannot read"),
    (["census", "--model", "{trace}", "--db", "mysql://x@y/z"], "unsupported backend 'mysql'"),
    (["census", "--model", "{trace}", "--profile", "hopper"], "profile hopper does not claim this device"),
    (["show", "999"], "no database at"),
    (["refusals", "--reason", "bad_luck"], "unknown reason 'bad_luck'"),
    (["seats", "--status", "great"], "unknown status 'great'"),
    (["profiles", "show", "pascal"], "unknown profile 'pascal'"),
    (["import", "/no/such/table.json"], "cannot read"),
    (["census", "--model", "{trace}", "--plugin", "no_such_module_xyz"], "plugin no_such_module_xyz: cannot import"),
])
def test_user_errors_are_one_line_with_exit_code_1(trace_file, args, match):
    r = run(*[a.replace("{trace}", str(trace_file)) for a in args])
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0]


def test_misuse_is_exit_code_2():
    assert run("census").exit_code == 2  # --model missing
    assert run("seats", "--frobnicate").exit_code == 2
    assert run("no-such-command").exit_code == 2


def test_bad_trace_line_is_named(tmp_path, db_url):
    p = tmp_path / "bad.tsv"
    p.write_text(HEAD + "aten.mm\tfloat32,float32\t4x4;4x4\t\t0\n")
    r = run("census", "--model", str(p), "--db", db_url)
    assert r.exit_code == 1
    assert f"{p}: line 3: column 5 (count): count '0' is not a positive integer" in r.stderr


def test_profiles_and_db_commands(tmp_path, db_url):
    r = run("profiles", "list", "--json")
    d = json.loads(r.stdout)
    assert d["device_profile"] == "interpreter" and len(d["profiles"]) >= 12
    r = run("profiles", "show", "hopper", "--json")
    assert json.loads(r.stdout)["memory"]["max_shared_memory_per_block"] == 232448
    assert "hopper.yml: ok" in run("profiles", "check", json.loads(r.stdout)["source"]).stdout
    bad = tmp_path / "bad.yml"
    bad.write_text("vendor: x\n")
    r = run("profiles", "check", str(bad))
    assert r.exit_code == 1 and f"{bad}: " in r.stderr
    assert run("db", "current", "--db", db_url, "--json").exit_code == 1  # no database: not made by a query
    assert "upgraded empty ->" in run("db", "upgrade", "--db", db_url).stdout
    d = json.loads(run("db", "current", "--db", db_url, "--json").stdout)
    assert d["revision"] == d["head"]
    assert "already at head" in run("db", "upgrade", "--db", db_url).stdout


@pytest.mark.parametrize("cmd", [["seats"], ["show", "1"], ["refusals"], ["unscreened"],
                                 ["export", "--profile", "interpreter", "-o", "{tmp}/t.json"], ["db", "current"]])
def test_read_only_commands_refuse_a_database_that_does_not_exist_and_never_create_it(tmp_path, cmd):
    db = tmp_path / "mistyped.db"
    r = run(*[c.replace("{tmp}", str(tmp_path)) for c in cmd], "--db", f"sqlite:///{db}")
    assert r.exit_code == 1 and f"no database at {db}" in r.stderr
    assert not db.exists() and not (tmp_path / "t.json").exists()


def test_show_of_an_unknown_or_huge_seat_id_is_one_line(db_url):
    run("db", "upgrade", "--db", db_url)
    for ref in ("999", "99999999999999999999"):
        r = run("show", ref, "--db", db_url)
        assert r.exit_code == 1 and f"no seat '{ref}'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_bad_strategy_creates_nothing(tmp_path, trace_file):
    db = tmp_path / "new.db"
    r = run("census", "--model", str(trace_file), "--db", f"sqlite:///{db}", "--strategy", "fastest")
    assert r.exit_code == 1 and "unknown strategy 'fastest'" in r.stderr and not db.exists()


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c))
def test_every_command_takes_json(cmd):
    if cmd in (["profiles"], ["db"]):
        return  # groups, not commands
    assert "--json" in run(*cmd, "--help").stdout


@pytest.mark.slow
def test_json_of_export_import_db_upgrade_and_profiles_check(tmp_path, trace_file, db_url):
    assert run("census", "--model", str(trace_file), "--db", db_url).exit_code == 0
    out = tmp_path / "t.json"
    d = json.loads(run("export", "--profile", "interpreter", "-o", str(out), "--db", db_url, "--json").stdout)
    assert d["entries"] == 1 and d["path"] == str(out)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert json.loads(run("db", "upgrade", "--db", other, "--json").stdout)["before"] is None
    d = json.loads(run("import", str(out), "--db", other, "--json").stdout)
    assert (d["added"], d["unchanged"]) == (1, 0)
    d = json.loads(run("import", str(out), "--db", other, "--json").stdout)
    assert (d["added"], d["unchanged"], d["kept_existing"]) == (0, 1, 0)  # not "kept the faster one"
    prof = json.loads(run("profiles", "show", "hopper", "--json").stdout)["source"]
    assert json.loads(run("profiles", "check", prof, "--json").stdout)["profile"] == "hopper"


@pytest.mark.slow
def test_after_a_census_it_says_where_the_results_are_and_what_next(trace_file, db_url):
    r = run("census", "--model", str(trace_file), "--db", db_url)
    text = " ".join(r.stdout.split())
    assert "Next: `nbx-tune seats --db" in text and "from nbx_tune.kernels import mm" in text


def test_refusals_say_how_many_there_are_and_list_every_reason_in_help(tmp_path, db_url):
    from nbx_tune.tuner.certify.reasons import REFUSAL_REASONS

    from nbx_tune.tuner import commands as api

    p = tmp_path / "t.tsv"  # two seats of the planted kernel, each with its refusals
    p.write_text(HEAD + "test.double\tfloat32\t1000\t\t1\ntest.double\tfloat16\t77\t\t1\n")
    api.census(str(p), db_url, isolate=False)
    total = len(api.refusal_rows(db_url))
    assert total > 5
    r = run("refusals", "--db", db_url, "--limit", "5")
    assert f"5 of {total} refusals" in r.stdout and "--limit 0 shows all" in " ".join(r.stdout.split())
    assert f"{total} refusals" in run("refusals", "--db", db_url, "--limit", "0").stdout
    helptext = " ".join(run("refusals", "--help").stdout.split())
    assert all(reason in helptext for reason in REFUSAL_REASONS)


def test_ctrl_c_says_what_was_kept_and_exits_130(monkeypatch, db_url):
    from nbx_tune.tuner import commands as api

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "seat_views", interrupted)
    r = run("seats", "--db", db_url)
    assert r.exit_code == 130 and "interrupted:" in r.stderr and "run the same command again" in r.stderr


def test_the_cli_reaches_the_tuner_only_through_its_api_and_catches_errors_once():
    import ast
    from pathlib import Path

    import nbx_tune.cli as cli

    for f in Path(cli.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nbx_tune.tuner"):
                assert node.module == "nbx_tune.tuner.commands" or (
                    node.module == "nbx_tune.tuner" and [a.name for a in node.names] == ["commands"]), (f, node.module)
        assert f.read_text().count("render.error(") <= 1  # printed in one place: the root group


def test_a_seat_summary_tells_pruned_configs_from_wrong_ones():
    from types import SimpleNamespace as R

    from nbx_tune.cli.render import candidate_summary

    recs = [R(reason="equivalent")] * 7 + [R(reason="wrong_answer"), R(reason=None), R(reason=None)]
    assert candidate_summary(recs) == "10 candidates: 7 pruned unlaunched (equivalent 7), 1 failed (wrong_answer 1), 2 passed"


@pytest.mark.slow
def test_run_is_one_line_for_a_bad_command_and_json_for_a_program(tmp_path):
    r = run("run", "--", "ls")
    assert r.exit_code == 1 and r.stderr.strip().startswith("error: run: ls is not a Python interpreter")
    assert len(r.stderr.strip().splitlines()) == 1
    script = tmp_path / "prog.py"
    script.write_text("import sys\nsys.exit(3)\n")
    r = run("run", "--json", "--", sys.executable, str(script))
    d = json.loads(r.stdout)
    assert r.exit_code == 3 and d["exit_status"] == 3 and isinstance(d["stats"], dict)


@pytest.mark.slow
def test_the_console_entry_exits_with_the_commands_code_and_its_output_whole(tmp_path):
    """main() skips the interpreter's teardown (os._exit): the output piped out is still
    complete, exit handlers still run, and the exit code is the command's."""
    import os
    import subprocess

    env = {**os.environ, "TRITON_INTERPRET": "1", "COLUMNS": "200", "NBX_TUNE_DB": f"sqlite:///{tmp_path / 'x.db'}"}
    r = subprocess.run([sys.executable, "-m", "nbx_tune.cli.app", "profiles", "list", "--json"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and {p["name"] for p in json.loads(r.stdout)["profiles"]} >= {"interpreter", "hopper"}
    r = subprocess.run([sys.executable, "-m", "nbx_tune.cli.app", "show", "nope"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 1 and r.stderr.startswith("error: no database at") and r.stderr.count("\n") == 1
    marker = tmp_path / "handler-ran"
    code = ("import atexit, sys; from nbx_tune.cli.app import main; "
            f"atexit.register(lambda: open({str(marker)!r}, 'w').write('x')); "
            "sys.argv = ['nbx-tune', 'profiles', 'list']; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and marker.read_text() == "x"

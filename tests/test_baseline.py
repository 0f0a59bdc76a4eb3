"""Torch baselines: `nbx-tune baseline` times each certified seat of a trace against torch's
op and records it; the export carries it, an import keeps it, and under serve() a seat whose
baseline on this GPU says torch is faster runs torch, counted with the reason (the rule:
kernels/runtime/torch_rule.py). Outside serve() the kernel always runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import nbx_tune
import nbx_tune.errors
from nbx_tune.cli.app import app
from nbx_tune.errors import TableError
from nbx_tune.kernels.runtime import torch_rule as baseline, certified, launch, table_format
from nbx_tune.kernels.serving import serve as serving
from nbx_tune.kernels.runtime.registry import get_spec
from nbx_tune.kernels.spec import bucket_of, seat_flags
from nbx_tune.profiles import device_info

HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"
ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture(autouse=True)
def fresh_stats():
    serving.reset_stats()
    yield
    assert not serving.active()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def _b(**kw) -> dict:
    b = {"device_name": device_info().name, "torch_version": torch.__version__, "nbx_ms": 2.0, "torch_ms": 1.0,
         "method": "graph replay", "measured_at": "2026-12-05T10:00:00+00:00", "config": "A=1"}
    b.update(kw)
    return b


# ----------------------------------------------------------------------------- the rule

def test_torch_must_be_faster_beyond_the_margin():
    assert baseline.defers(1.0 + 2 * baseline.MARGIN, 1.0)
    assert not baseline.defers(1.0 + baseline.MARGIN / 2, 1.0)  # within the spread: the kernel stays
    assert not baseline.defers(1.0, 1.2)


def test_a_baseline_applies_to_its_config_gpu_and_torch_minor_only_the_newest_deciding():
    here, tv = device_info().name, torch.__version__
    assert baseline.applicable([_b()], "A=1", here, tv)["nbx_ms"] == 2.0
    assert baseline.applicable([_b()], "A=2", here, tv) is None  # measured another config
    assert baseline.applicable([_b(device_name="NVIDIA H200")], "A=1", here, tv) is None
    assert baseline.applicable([_b(torch_version="1.0.0")], "A=1", here, tv) is None
    assert baseline.torch_minor("2.11.0+cu130") == baseline.torch_minor("2.11.1") == "2.11"
    old, new = _b(measured_at="2026-01-01T00:00:00+00:00"), _b(nbx_ms=0.5)
    assert baseline.applicable([new, old], "A=1", here, tv) is new
    assert baseline.applicable([_b()], "A=1", None, tv) is None


@pytest.mark.parametrize("edit,why", [({"nbx_ms": -1.0}, "nbx_ms"), ({"torch_ms": float("nan")}, "torch_ms"),
                                      ({"method": ""}, "method"), ({"measured_at": "yesterday"}, "measured_at"),
                                      ({"extra": 1}, "extra: unknown key")])
def test_a_malformed_baseline_in_a_table_names_its_key(tmp_path, edit, why):
    b = {k: v for k, v in _b(**edit).items() if k != "config"}
    e = _entry([b])
    text = table_format.dumps("interpreter", "interpreter", "x", [e])
    with pytest.raises(TableError, match=rf"entries\[0\]\.provenance\.torch_baselines\[0\]\.{why}"):
        table_format.loads(text, "t.json")


def _entry(baselines, config="BLOCK_SIZE=1024,FILL=1,num_warps=4,num_stages=1") -> dict:
    return {"kernel": "elementwise_unary", "dtypes": "float32", "flags": "fn=relu,layout=flat", "bucket": "N=1..65536",
            "config": config, "median_ms": 1.0, "spread_ms": [0.9, 1.1], "runner_up": None, "runner_up_ms": None,
            "margin": None, "screens": [], "screened_min": None, "screened_max": None, "unscreened": None,
            "timing_method": "wall", "provenance": {
                "device_name": "x", "device_target": "interpreter", "driver": "n/a", "triton_version": "0",
                "torch_version": "0", "kernel_source_hash": "0", "config_space_hash": "0", "profile_hash": "0",
                "certified_at": "2026-12-05T00:00:00+00:00", "torch_baselines": baselines}}


# ----------------------------------------------------------------------------- serve() defers

def _certify_relu(st, n: int):
    """Certify relu's seat for n elements in the loaded state, as a table would."""
    spec = get_spec("elementwise_unary")
    seat = ("elementwise_unary", ("float32",), seat_flags(fn="relu"), bucket_of(st.profile, spec.key, (n,)))
    cfg = spec.default_preference()[0]
    st.entries[seat] = (cfg, "test")
    return seat, cfg


def test_under_serve_a_seat_torch_beats_runs_torch_and_outside_serve_the_kernel():
    x = torch.randn(3, 5)
    st = certified.state()
    seat, cfg = _certify_relu(st, 15)
    st.baselines[seat] = [_b(config=str(cfg), nbx_ms=3.0, torch_ms=1.0)]
    certified._defer(st)
    st.memo.clear()
    with nbx_tune.serve():
        y = torch.relu(x)
    assert torch.equal(y, torch.relu(x))
    assert serving.stats()["aten.relu"] == {"certified": 0, "default": 0, "torch": 1,
                                            "reasons": {baseline.REASON: 1}}
    assert certified.config_for(get_spec("elementwise_unary"), *seat[1:3], (15,)) == cfg  # the kernel, outside
    assert any("elementwise_unary" in s for s in certified.launch_stats()["deferred_to_torch"])


@pytest.mark.parametrize("why", ["slower torch", "another GPU", "another config"])
def test_a_baseline_that_does_not_hold_here_leaves_the_kernel(why, caplog):
    x = torch.randn(3, 5)
    st = certified.state()
    seat, cfg = _certify_relu(st, 15)
    b = {"slower torch": _b(config=str(cfg), nbx_ms=1.0, torch_ms=3.0),
         "another GPU": _b(config=str(cfg), device_name="NVIDIA H200"),
         "another config": _b(config="BLOCK_SIZE=1,num_warps=1,num_stages=1")}[why]
    st.baselines[seat] = [b]
    certified._defer(st)
    st.memo.clear()
    with caplog.at_level("WARNING", logger="nbx_tune"), nbx_tune.serve():
        torch.relu(x)
        torch.relu(torch.randn(3, 7))
    assert serving.stats()["aten.relu"]["certified"] == 2
    # Where the seat's baselines were all measured otherwise, serve() says once how to measure this GPU.
    said = [r.getMessage() for r in caplog.records if "nbx-tune baseline --model" in r.getMessage()]
    held = why == "slower torch"
    assert certified.launch_stats()["baselines_not_here"] == (0 if held else 1)
    assert len(said) == (0 if held else 1)
    assert held or b["device_name"] in said[0]


def test_a_remembered_call_at_a_deferred_seat_asks_again_on_replay(monkeypatch):
    """A replay skips the config read: the call is replayed behind the same check, so under
    serve() it goes to torch and outside it the kernel runs."""
    st = certified.state()
    seat, cfg = _certify_relu(st, 15)
    st.baselines[seat] = [_b(config=str(cfg), nbx_ms=3.0, torch_ms=1.0)]
    certified._defer(st)
    rec = launch._Record(())
    monkeypatch.setattr(launch._tls, "rec", rec, raising=False)
    certified.config_for(get_spec("elementwise_unary"), *seat[1:3], (15,))
    assert rec.guards == [certified.state().checks[seat]]
    ran = []

    def replay(*inputs):
        ran.append(inputs)
        return "out"

    replay.source, replay.values = "src", {}
    guarded = launch._guarded(replay, tuple(rec.guards))
    assert guarded(1) == "out" and ran == [(1,)] and launch.listing(guarded) == "src"
    monkeypatch.setattr(certified.SERVING, "busy", True)
    with pytest.raises(nbx_tune.errors.TorchFaster):
        guarded(2)
    assert ran == [(1,)]


# ----------------------------------------------------------------------------- the command, the database, tables

@pytest.fixture
def certified_db(tmp_path, db_url):
    trace = tmp_path / "t.tsv"
    trace.write_text(HEAD + "aten.relu\tfloat32\t4x40\t\t3\naten.neg\tfloat32\t300\t\t2\naten.logcumsumexp\tint64\t1x24\tdim=-1\t5\n")
    r = cli("census", "--model", trace, "--db", db_url, "--json")
    assert r.exit_code == 0, r.output
    return trace


def test_baseline_times_each_certified_seat_records_it_and_the_table_carries_it(tmp_path, db_url, certified_db):
    r = cli("baseline", "--model", certified_db, "--db", db_url, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["timed"] == d["recorded"] == 2 and d["untimed"] == 0 and d["margin"] == baseline.MARGIN
    by = {s["seat"].split("|")[2]: s for s in d["seats"]}
    relu = by["fn=relu"]
    assert relu["launches"] == 3 and relu["rows"][0]["row"].startswith("aten.relu float32 4x40")
    assert relu["serve_runs"] == ("torch" if baseline.defers(relu["nbx_ms"], relu["torch_ms"]) else "kernel")
    # the table: each entry's provenance holds its seat's baseline, and an import keeps it
    out = tmp_path / "t.json"
    assert cli("export", "--profile", "interpreter", "-o", out, "--db", db_url).exit_code == 0
    entries = table_format.read(out)["entries"]
    carried = {e["flags"]: e["provenance"]["torch_baselines"] for e in entries}
    assert carried["fn=relu"][0]["nbx_ms"] == pytest.approx(relu["nbx_ms"])
    other = f"sqlite:///{tmp_path / 'other.db'}"
    r = cli("import", out, "--db", other)
    assert r.exit_code == 0 and "2 torch baselines recorded" in " ".join(r.stdout.split())
    assert json.loads(cli("import", out, "--db", other, "--json").stdout)["baselines"] == 0  # each kept once
    out2 = tmp_path / "t2.json"
    assert cli("export", "--profile", "interpreter", "-o", out2, "--db", other).exit_code == 0
    assert table_format.read(out2)["entries"] == entries


def test_the_launch_read_takes_baselines_from_the_database_and_from_tables(tmp_path, db_url, certified_db, monkeypatch):
    """The interpreter's wall clock makes torch far faster than the interpreted kernel: a
    deferral either way it is read."""
    assert cli("baseline", "--model", certified_db, "--db", db_url).exit_code == 0
    monkeypatch.setenv("NBX_TUNE_DB", db_url)
    certified.reload()
    from_db = certified.launch_stats()["deferred_to_torch"]
    assert len(from_db) == 2
    out = tmp_path / "t.json"
    cli("export", "--profile", "interpreter", "-o", out, "--db", db_url)
    monkeypatch.setenv("NBX_TUNE_DB", f"sqlite:///{tmp_path / 'none.db'}")
    monkeypatch.setenv("NBX_TUNE_TABLE", str(out))
    certified.reload()
    assert certified.launch_stats()["deferred_to_torch"] == from_db
    with nbx_tune.serve():
        torch.neg(torch.randn(300))
    assert serving.stats()["aten.neg"]["reasons"] == {baseline.REASON: 1}


@pytest.mark.slow
def test_a_new_certificate_drops_its_seats_baseline(tmp_path, db_url, certified_db, monkeypatch):
    assert cli("baseline", "--model", certified_db, "--db", db_url).exit_code == 0
    from nbx_tune.tuner.store import Store

    with Store(db_url) as store:
        cur = store.current_certificates("interpreter")
        seat_id, cert, _ = next(v for k, v in cur.items() if "relu" in k[2])
        assert store.add_baseline(seat_id, "BLOCK_SIZE=1", {"device_name": "x", "torch_version": "2", "nbx_ms": 1.0,
                                                             "torch_ms": 1.0, "method": "m"}) is None
    assert cli("census", "--model", certified_db, "--db", db_url, "--strategy", "exhaustive").exit_code == 0
    monkeypatch.setenv("NBX_TUNE_DB", db_url)
    certified.reload()
    assert len(certified.launch_stats()["deferred_to_torch"]) == 2  # a census of current seats tunes nothing


def test_show_says_what_serve_runs_at_the_seat(db_url, certified_db):
    d = json.loads(cli("baseline", "--model", certified_db, "--db", db_url, "--json").stdout)
    relu = next(s for s in d["seats"] if "relu" in s["seat"])
    shown = json.loads(cli("show", relu["seat_id"], "--db", db_url, "--json").stdout)
    cert = next(h["certificate"] for h in shown["history"] if h.get("certificate", {}).get("current"))
    assert [(b["nbx_ms"], b["torch_faster"]) for b in cert["torch_baselines"]] == [
        (pytest.approx(relu["nbx_ms"]), relu["serve_runs"] == "torch")]
    text = " ".join(cli("show", relu["seat_id"], "--db", db_url).stdout.split())
    assert "against torch" in text and "serve() runs" in text


def test_a_spent_budget_times_no_further_seat_and_says_so(db_url, certified_db):
    d = json.loads(cli("baseline", "--model", certified_db, "--db", db_url, "--budget-s", "0", "--json").stdout)
    assert d["untimed"] == 2 and d["timed"] == d["recorded"] == 0
    assert {s["why_not_recorded"] for s in d["seats"]} == {"not timed: the budget was spent"}


def test_baseline_user_errors_are_one_line(tmp_path, db_url, certified_db):
    r = cli("baseline", "--model", tmp_path / "missing.tsv", "--db", db_url)
    assert r.exit_code == 1 and "missing.tsv" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    db = tmp_path / "mistyped.db"
    r = cli("baseline", "--model", certified_db, "--db", f"sqlite:///{db}")
    assert r.exit_code == 1 and f"no database at {db}" in r.stderr and not db.exists()


def test_baseline_draws_a_table_and_says_what_serve_runs(db_url, certified_db):
    r = cli("baseline", "--model", certified_db, "--db", db_url)
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "serve() runs" in text and "2 seats timed" in text and "2 recorded" in text


@pytest.mark.slow
def test_census_with_baseline_certifies_then_records_each_seats_baseline(tmp_path, db_url):
    trace = tmp_path / "t.tsv"
    trace.write_text(HEAD + "aten.relu\tfloat32\t4x40\t\t3\naten.neg\tfloat32\t300\t\t2\n")
    r = cli("census", "--model", trace, "--db", db_url, "--baseline", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert {s["status"] for s in d["seats"]} == {"certified"}
    assert d["baselines"]["timed"] == d["baselines"]["recorded"] == len(d["seats"]) == 2
    shown = json.loads(cli("show", d["baselines"]["seats"][0]["seat_id"], "--db", db_url, "--json").stdout)
    cert = next(h["certificate"] for h in shown["history"] if h.get("certificate", {}).get("current"))
    assert len(cert["torch_baselines"]) == 1  # recorded against the certificate, as `nbx-tune baseline` does
    text = " ".join(cli("census", "--model", trace, "--db", db_url, "--baseline").stdout.split())
    assert "2 seats timed" in text and "nbx-tune baseline --model" not in text


def test_census_without_baseline_names_the_command_and_refuses_it_beside_dry_run(tmp_path, db_url):
    trace = tmp_path / "t.tsv"
    trace.write_text(HEAD + "aten.neg\tfloat32\t300\t\t2\n")
    text = " ".join(cli("census", "--model", trace, "--db", db_url).stdout.split())
    assert f"nbx-tune baseline --model {trace}" in text
    for flag in ("--dry-run", "--enqueue"):
        r = cli("census", "--model", trace, "--db", db_url, "--baseline", flag)
        assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1 and "--baseline" in r.stderr


@pytest.mark.slow
def test_merge_table_takes_baselines_only_for_the_same_config(tmp_path):
    import subprocess
    import sys

    shipped, export = tmp_path / "shipped.json", tmp_path / "export.json"
    b = {k: v for k, v in _b().items() if k != "config"}
    same, other = _entry([b]), _entry([b], config="BLOCK_SIZE=2048,FILL=1,num_warps=4,num_stages=1")
    plain = _entry(None)
    del plain["provenance"]["torch_baselines"]
    shipped.write_text(table_format.dumps("interpreter", "interpreter", "x", [plain]))
    for e, expect in ((other, None), (same, [b])):
        export.write_text(table_format.dumps("interpreter", "interpreter", "x", [e]))
        r = subprocess.run([sys.executable, str(ROOT / "release/merge_table.py"), str(export), "--table", str(shipped),
                            "--baselines"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        got = table_format.read(shipped)["entries"][0]["provenance"].get("torch_baselines")
        assert got == expect


@pytest.mark.slow
def test_the_baselines_view_reads_alike_on_each_engine(tmp_path, any_db):
    """The launch read takes baselines through the view on SQLite (stdlib) and PostgreSQL
    (SQLAlchemy): only the current certificates' ones."""
    from nbx_tune.kernels.runtime import certified_view

    trace = tmp_path / "t.tsv"
    trace.write_text(HEAD + "aten.relu\tfloat32\t4x40\t\t3\naten.neg\tfloat32\t300\t\t2\n")
    assert cli("census", "--model", trace, "--db", any_db).exit_code == 0
    assert cli("baseline", "--model", trace, "--db", any_db).exit_code == 0
    rows = certified_view.read_view(any_db, "interpreter", certified_view.BASELINES)
    assert sorted(r["flags"] for r in rows) == ["fn=neg", "fn=relu"]
    assert all(r["nbx_ms"] > 0 and r["torch_ms"] > 0 and r["config"] for r in rows)
    assert certified_view.read_view(any_db, "other", certified_view.BASELINES) == []

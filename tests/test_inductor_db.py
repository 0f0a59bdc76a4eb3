"""Certified max-autotune choices in the database (migration 0009, tuner/store/inductor.py):
written whole and read back, one current choice per key, re-certification's rules, the
CLI's inductor commands, export and import in the shipped format, and serving reading the
database first and never a stale entry. Synthetic entries: no GPU."""

import json
import logging

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError
from typer.testing import CliRunner

from nbx_tune.cli.app import app
from nbx_tune.errors import NbxError
from nbx_tune.kernels.serving import inductor_table as it
from nbx_tune.tuner.inductor import choices
from nbx_tune.tuner.store import Store
from nbx_tune.tuner.store import inductor as idb

from conftest import db_count

KEY = "((torch.bfloat16, [512, 4096], [4096, 1]), (torch.bfloat16, [4096, 4096], [1, 4096]))+mm"
KEY2 = "((torch.bfloat16, [512, 4096], [4096, 1]), (torch.bfloat16, [4096, 11008], [1, 4096]))+mm"
H100 = ("2.11.0+cu130", "3.6.0", "NVIDIA H100 80GB HBM3")


def _cfg(bm=128, **kw):
    return {"template_id": "triton::mm", "BLOCK_M": bm, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8,
            "num_stages": 3, "num_warps": 8, **kw}


def _rec(key=KEY, config=None, ms=0.05, at="2026-12-07T18:00:00+00:00", torch_version=H100[0], refusals=(),
         device=H100[2], **prov):
    return {"key": key, "op": "mm", "config": config if config is not None else _cfg(),
            "gemm": {"dtype": "bfloat16", "dims": [1, 512, 4096, 4096], "layout": "nt"},
            "provenance": {"torch_version": torch_version, "triton_version": H100[1], "device_name": device,
                           "driver": "580.159.04", "max_rel_err": 2e-3, "ms": ms, "aten_ms": 0.06,
                           "runner_up_ms": ms * 1.1, "candidates": 3 + len(refusals),
                           "refusals": [{"config": c, "reason": r} for c, r in refusals],
                           "measured_at": at, **prov}}


def _refused(key=KEY, refusals=((_cfg(256), "inaccurate: error 0.5 > 0.0078"),), **kw):
    r = _rec(key, refusals=refusals, **kw)
    r["config"] = None
    r["provenance"].update(ms=None, max_rel_err=None, runner_up_ms=None)
    return r


def _current(url, profile="hopper"):
    with Store(url) as store:
        return {e["key"]: (i, e) for _, i, e in idb.current_entries(store, profile)}


def test_a_certification_is_written_whole_and_read_back_as_an_entry(any_db):
    rec = _rec(refusals=[(_cfg(256), "compile or launch: OutOfResources: shared memory")])
    with Store(any_db) as store:
        [w] = idb.write(store, "hopper", [rec])
        assert (w.outcome, w.current) == ("chosen", True)
        [(profile, cid, entry)] = idb.current_entries(store)
    assert (profile, cid) == ("hopper", w.certification_id)
    assert entry == rec  # every field, the refusals and the problem included
    assert idb.stale(entry, H100) is None
    assert "torch 2.11.0" in idb.stale(entry, ("2.13.0", *H100[1:]))
    assert "H200" in idb.stale(entry, (*H100[:2], "NVIDIA H200"))
    assert db_count(any_db, "inductor_refusals") == 1


def test_one_current_choice_per_key_is_held_by_the_database(any_db):
    with Store(any_db) as store:
        [w] = idb.write(store, "hopper", [_rec()])
    engine = create_engine(any_db)
    try:
        with pytest.raises(IntegrityError), engine.begin() as c:
            c.execute(text("INSERT INTO inductor_choices (certification_id, profile, key, config, ms, max_rel_err, "
                           "created_at) VALUES (:c, 'hopper', :k, '{}', 1.0, 0.0, '2026-12-07')"),
                      {"c": w.certification_id, "k": KEY})
    finally:
        engine.dispose()


def test_recertification_keeps_the_faster_under_the_same_versions_and_records_the_other(any_db):
    with Store(any_db) as store:
        [first] = idb.write(store, "hopper", [_rec(config=_cfg(128), ms=0.050)])
        [slower] = idb.write(store, "hopper", [_rec(config=_cfg(64), ms=0.060, at="2026-12-08T10:00:00+00:00")])
        assert not slower.current and "as fast or faster" in slower.why
        assert _current(any_db)[KEY][0] == first.certification_id
        [faster] = idb.write(store, "hopper", [_rec(config=_cfg(256), ms=0.040, at="2026-12-08T11:00:00+00:00")])
        assert faster.current and "faster" in faster.why
        hist = idb.history(store, KEY)
    assert [h["current"] for h in hist] == [False, False, True]
    assert "is faster" in hist[0]["superseded_reason"] and "as fast or faster" in hist[1]["superseded_reason"]
    assert _current(any_db)[KEY][1]["config"] == _cfg(256)


def test_other_versions_the_newer_wins_and_a_refused_config_is_never_kept(any_db):
    with Store(any_db) as store:
        idb.write(store, "hopper", [_rec(ms=0.040)])
        # torch 2.13, measured later: replaces a faster choice whose times are not comparable
        [new] = idb.write(store, "hopper", [_rec(config=_cfg(64), ms=0.050, torch_version="2.13.0",
                                                 at="2026-12-09T00:00:00+00:00")])
        assert new.current and "newer" in new.why
        # an older table of the other torch, imported later: kept aside, not served
        [old] = idb.write(store, "hopper", [_rec(config=_cfg(32), ms=0.010, at="2026-12-01T00:00:00+00:00")],
                          kind="import")
        assert not old.current and "newer" in old.why
        # a certification where no config passed keeps its refusals; the current choice stands,
        # even where its config was refused by an older screen under other versions...
        [none] = idb.write(store, "hopper", [_refused(refusals=[(_cfg(64), "inaccurate: error 0.5 > 0.0078")])])
        assert (none.outcome, none.current) == ("refused", False) and "stands" in none.why
        assert _current(any_db)[KEY][0] == new.certification_id
        # ... unless a newer one refused the current choice's config
        [gone] = idb.write(store, "hopper", [_refused(refusals=[(_cfg(64), "inaccurate: error 0.3 > 0.0078")],
                                                      torch_version="2.13.1", at="2026-12-10T00:00:00+00:00")])
        assert "gave way" in gone.why
        hist = idb.history(store, str(new.certification_id))  # by id, too
    assert KEY not in _current(any_db)
    assert [h["outcome"] for h in hist] == ["chosen", "chosen", "chosen", "refused", "refused"]
    assert "refused by certification" in hist[1]["superseded_reason"]
    assert db_count(any_db, "inductor_refusals") == 2


def test_a_bad_record_writes_nothing(any_db):
    bad = _rec(KEY2)
    bad["provenance"]["measured_at"] = "yesterday"
    with Store(any_db) as store:
        with pytest.raises(NbxError, match=r"inductor records\[1\]: provenance.measured_at"):
            idb.write(store, "hopper", [_rec(), bad])
    assert db_count(any_db, "inductor_certifications") == 0


def test_migration_0009_goes_down_to_0008_and_up_again(any_db):
    from alembic import command

    from nbx_tune.tuner.store.db import _alembic_config, open_engine

    with Store(any_db) as store:
        idb.write(store, "hopper", [_rec()])
    engine = open_engine(any_db)
    try:
        with engine.begin() as conn:
            command.downgrade(_alembic_config(conn), "0008")
        assert not {"inductor_choices", "inductor_certifications", "inductor_refusals"} & set(
            inspect(engine).get_table_names())
        assert "inductor_current" not in inspect(engine).get_view_names()
        with engine.begin() as conn:
            command.upgrade(_alembic_config(conn), "head")
        assert "inductor_current" in inspect(engine).get_view_names()
    finally:
        engine.dispose()


# ----------------------------------------------------------------------------- the CLI


def _cli(*args):
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})
    return r.exit_code, r.stdout, r.stderr


def test_cli_list_and_show_as_json_and_tables(db_url):
    with Store(db_url) as store:
        idb.write(store, "hopper", [_rec(refusals=[(_cfg(256), "compile or launch: out of resources")]),
                                    _rec(KEY2, torch_version="2.9.1")])
    rc, out, _ = _cli("inductor", "list", "--db", db_url, "--json")
    rows = json.loads(out)
    assert rc == 0 and [r["key"] for r in rows] == sorted([KEY, KEY2])  # the table's order
    rows = {r["key"]: r for r in rows}
    import torch
    from nbx_tune.kernels.runtime.torch_rule import torch_minor

    if torch_minor(torch.__version__) != "2.9":  # judged against this torch: 2.9.1's is stale here
        assert "torch 2.9.1" in rows[KEY2]["stale"]
    rc, out, _ = _cli("inductor", "list", "--db", db_url, "--profile", "hopper")
    assert rc == 0 and "triton::mm 128x128x64 s3 w8" in out and "2 Inductor choices" in out
    rc, out, _ = _cli("inductor", "show", KEY, "--db", db_url, "--json")
    [h] = json.loads(out)
    assert rc == 0 and h["current"] and h["entry"]["provenance"]["refusals"][0]["reason"].startswith("compile")
    rc, out, _ = _cli("inductor", "show", KEY, "--db", db_url)
    assert rc == 0 and "refused" in out and "580.159.04" in out
    rc, _, err = _cli("inductor", "show", "((no such key))+mm", "--db", db_url)
    assert rc == 1 and "no choice for key" in err and len(err.strip().splitlines()) == 1


def test_cli_certify_on_the_cpu_is_one_line_and_nonzero(db_url, tmp_path):
    rc, _, err = _cli("inductor", "certify", "--trace", str(tmp_path / "t.tsv"), "--db", db_url)
    assert rc == 1 and "needs a GPU" in err and len(err.strip().splitlines()) == 1


def test_export_then_import_round_trips_and_reimport_changes_nothing(any_db, tmp_path):
    recs = [_rec(refusals=[(_cfg(256), "compile or launch: out of resources")]), _rec(KEY2, ms=0.11)]
    recs[1].pop("gemm")  # an entry of a table made before problems were kept
    with Store(any_db) as store:
        idb.write(store, "hopper", recs)
    path = tmp_path / "hopper.json"
    rc, out, _ = _cli("inductor", "export", "--profile", "hopper", "-o", str(path), "--db", any_db, "--json")
    assert rc == 0 and json.loads(out)["entries"] == 2
    doc = it.read(path)  # the shipped format, read by serving's own reader
    assert doc["profile"] == "hopper" and doc["entries"] == sorted(recs, key=lambda e: e["key"])
    other = f"sqlite:///{tmp_path / 'other.db'}"
    rc, out, _ = _cli("inductor", "import", str(path), "--db", other, "--json")
    assert rc == 0 and [c["outcome"] for c in json.loads(out)["choices"]] == ["chosen", "chosen"]
    again = tmp_path / "again.json"
    assert _cli("inductor", "export", "--profile", "hopper", "-o", str(again), "--db", other)[0] == 0
    assert again.read_bytes() == path.read_bytes()
    rc, out, _ = _cli("inductor", "import", str(path), "--db", other, "--json")
    assert [c["outcome"] for c in json.loads(out)["choices"]] == ["unchanged", "unchanged"]
    assert db_count(other, "inductor_certifications") == 2


def test_bad_tables_and_exports_are_one_line_and_write_nothing(db_url, tmp_path):
    path = tmp_path / "bad.json"
    good, bad = _rec(), _rec(KEY2)
    bad["gemm"]["dims"] = [512, 4096]
    path.write_text(json.dumps({"format": it.FORMAT, "profile": "hopper", "entries": [good, bad]}))
    rc, _, err = _cli("inductor", "import", str(path), "--db", db_url)
    assert rc == 1 and "bad.json: entries[1]: gemm" in err and len(err.strip().splitlines()) == 1
    path.write_text('{"format": ')
    rc, _, err = _cli("inductor", "import", str(path), "--db", db_url)
    assert rc == 1 and "bad.json:1: not JSON" in err
    path.write_text(json.dumps({"format": it.FORMAT, "profile": "no-such-gpu", "entries": [good]}))
    rc, _, err = _cli("inductor", "import", str(path), "--db", db_url)
    assert rc == 1 and "no-such-gpu" in err
    assert not (tmp_path / "nbx.db").exists()  # each refused before the database was opened
    Store(db_url).close()
    out = tmp_path / "out.json"
    rc, _, err = _cli("inductor", "export", "--profile", "hopper", "-o", str(out), "--db", db_url)
    assert rc == 1 and "none of profile hopper" in err and not out.exists()
    rc, _, err = _cli("inductor", "list", "--db", f"sqlite:///{tmp_path / 'missing.db'}")
    assert rc == 1 and "no database" in err


def test_the_hopper_export_is_untouched_by_inductor_choices(db_url, tmp_path):
    """The kernels' table export writes certificates only: Inductor's choices travel in their own."""
    with Store(db_url) as store:
        idb.write(store, "hopper", [_rec()])
    shipped = next(p for p in (it.TABLE_DIR.parent).glob("hopper.json"))
    assert _cli("import", str(shipped), "--db", db_url)[0] == 0
    out = tmp_path / "hopper.json"
    assert _cli("export", "--profile", "hopper", "-o", str(out), "--db", db_url)[0] == 0
    assert out.read_bytes() == shipped.read_bytes()


# ----------------------------------------------------------------------------- the GPU path's plumbing


def test_certify_traces_writes_each_gemm_through_the_store_with_its_refusals(db_url, tmp_path, monkeypatch):
    trace = tmp_path / "t.tsv"
    trace.write_text("# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"
                     "aten.mm\tbfloat16,bfloat16\t512x4096;4096x4096\tlayout=nt\t8\n"
                     "aten.mm\tbfloat16,bfloat16\t512x4096;4096x11008\tlayout=nt\t2\n")

    def fake_certify(g, rtol):
        if g.dims[2] == 11008:
            raise RuntimeError("Inductor moved\nmore")
        c = choices.Choice(g, KEY, aten_ms=0.06)
        c.measured = [choices.Measured(_cfg(128), 1e-3, 0.05),
                      choices.Measured(_cfg(64), 0.5, None, f"inaccurate: error 0.5 > {rtol:.3g}")]
        return c

    monkeypatch.setattr(choices, "certify", fake_certify)
    from nbx_tune.profiles import get_profile
    from nbx_tune.profiles.detect import DeviceInfo

    seen = []
    with Store(db_url) as store:
        got = choices.certify_traces([str(trace)], store, get_profile("hopper"),
                                     DeviceInfo("cuda:90", H100[2], "580.159.04"), on_gemm=seen.append)
    assert [c.error for c in got] == [None, "RuntimeError: Inductor moved"] and seen == got
    (cid, e), = _current(db_url).values()
    assert cid == got[0].written.certification_id and e["config"] == _cfg(128)
    assert e["gemm"] == {"dtype": "bfloat16", "dims": [1, 512, 4096, 4096], "layout": "nt"}
    rtol = get_profile("hopper").screen_rtol["bfloat16"]  # the profile's tolerance reached the screen
    assert e["provenance"]["refusals"] == [{"config": _cfg(64), "reason": f"inaccurate: error 0.5 > {rtol:.3g}"}]
    assert e["provenance"]["device_name"] == H100[2] and e["provenance"]["driver"] == "580.159.04"


# ----------------------------------------------------------------------------- serving


def _here():
    import torch
    import triton

    from nbx_tune.profiles import device_info

    return torch.__version__, triton.__version__, device_info().name


def test_serving_reads_the_database_first_and_never_a_stale_entry(db_url, tmp_path, monkeypatch):
    torch_v, triton_v, gpu = _here()
    fresh = dict(torch_version=torch_v, device=gpu)
    fresh_triton = {"triton_version": triton_v}
    with Store(db_url) as store:
        idb.write(store, "interpreter", [
            _rec(KEY, config=_cfg(32), **fresh, **fresh_triton),  # the database's: wins over the table's
            _rec(KEY2, config=_cfg(16), torch_version="1.13.0", device=gpu, **fresh_triton)])  # stale: never served
    table = tmp_path / "t.json"
    it.write(table, "interpreter", [
        {k: v for k, v in _rec(KEY, config=_cfg(256), **fresh, **fresh_triton).items() if k != "gemm"},
        _rec(KEY2, config=_cfg(64), **fresh, **fresh_triton)])
    monkeypatch.setenv("NBX_TUNE_DB", db_url)
    monkeypatch.setenv(it.settings.ENV_INDUCTOR_TABLE, str(table))
    served, stale = it.current_table()
    assert served == {KEY: [_cfg(32)], KEY2: [_cfg(64)]}  # KEY2: the table's, the database's is stale
    assert [k for k, why in stale if "torch 1.13.0" in why] == [KEY2]
    if it.hook() is not None:  # install() hands Inductor exactly that table
        import torch._inductor.config as ic

        with it.choices() as on:
            assert on and ic.inductor_choices_class().table == served
    monkeypatch.delenv(it.settings.ENV_INDUCTOR_TABLE)
    assert it.current_table()[0] == {KEY: [_cfg(32)]}


def test_an_unreadable_database_costs_its_choices_not_the_compile(tmp_path, monkeypatch, caplog):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a database at all, but long enough to be read as one" * 100)
    monkeypatch.setenv("NBX_TUNE_DB", f"sqlite:///{bad}")
    with caplog.at_level(logging.WARNING, logger="nbx_tune"):
        assert it.current_table() == ({}, [])
    assert any("cannot read Inductor choices from the database" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("NBX_TUNE_DB", f"sqlite:///{tmp_path / 'none.db'}")
    assert it.current_table() == ({}, []) and not (tmp_path / "none.db").exists()  # never created


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """`inductor_certify` as on a GPU: Inductor's configs for each GEMM made up (one passes,
    one is refused), everything else real. Returns the trace."""
    from nbx_tune.profiles import get_profile
    from nbx_tune.profiles.detect import DeviceInfo
    from nbx_tune.tuner import commands as api
    from nbx_tune.tuner.inductor.commands import CertifyRun

    def fake_certify(g, rtol):
        c = choices.Choice(g, KEY, aten_ms=0.06)
        c.measured = [choices.Measured(_cfg(128), 1e-3, 0.05), choices.Measured(_cfg(64), 0.5, None, "inaccurate")]
        return c

    def on_gpu(traces, db, profile, limit, budget_s, on_gemm):
        with Store(db) as store:
            return CertifyRun("hopper", store.url, choices.certify_traces(
                traces, store, get_profile("hopper"), DeviceInfo("cuda:90", H100[2], "580"), limit, budget_s, on_gemm))

    monkeypatch.setattr(choices, "certify", fake_certify)
    monkeypatch.setattr(api, "inductor_certify", on_gpu)
    trace = tmp_path / "t.tsv"
    trace.write_text("# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"
                     "aten.mm\tbfloat16,bfloat16\t512x4096;4096x4096\tlayout=nt\t8\n")
    return trace


def test_the_bench_says_in_one_line_it_needs_a_gpu(db_url, tmp_path):
    from nbx_tune.bench import inductor_choices as bench

    with pytest.raises(SystemExit, match="^error: inductor certify needs a GPU[^\n]*$"):
        bench.main(["--trace", "t.tsv", "-o", str(tmp_path / "x.json"), "--db", db_url])
    assert not (tmp_path / "x.json").exists()


def test_the_bench_certifies_through_the_store_and_exports_the_profiles_table(db_url, tmp_path, fake_gpu, capsys):
    from nbx_tune.bench import inductor_choices as bench

    out = tmp_path / "hopper.json"
    bench.main(["--trace", str(fake_gpu), "-o", str(out), "--db", db_url])
    printed = capsys.readouterr().out
    assert "1.20" in printed and "1 choices of hopper written" in printed  # aten 0.06 ms / chosen 0.05
    [e] = it.read(out)["entries"]
    assert e["config"] == _cfg(128) and e["provenance"]["refusals"][0]["reason"] == "inaccurate"


def test_cli_certify_reports_each_gemm_and_what_became_current(db_url, fake_gpu):
    rc, out, err = _cli("inductor", "certify", "--trace", str(fake_gpu), "--db", db_url, "--json")
    d = json.loads(out)
    assert rc == 0 and d["profile"] == "hopper" and d["gemms"][0]["written"]["current"]
    rc, out, err = _cli("inductor", "certify", "--trace", str(fake_gpu), "--db", db_url)
    assert rc == 0 and "0 current of 1 GEMMs" in out and "as fast or faster" in err  # the same again: kept


def test_a_write_a_reader_would_not_find_is_never_reported(db_url, monkeypatch):
    real = idb._write

    def claims_another(s, profile, rec, kind):
        w = real(s, profile, rec, kind)
        w.certification_id += 1000  # what the write reports is not what was committed
        return w

    monkeypatch.setattr(idb, "_write", claims_another)
    with Store(db_url) as store, pytest.raises(NbxError, match="not read back"):
        idb.write(store, "hopper", [_rec()])

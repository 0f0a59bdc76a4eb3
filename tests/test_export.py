"""Certified tables: deterministic export, the launch-time read from a table, broken files
refused whole, and imports that merge by keeping the faster certificate."""

import json
import os

import pytest

from nbx_tune.testing import planted
from conftest import database_at, db_count
from nbx_tune.errors import TableError
from nbx_tune.kernels.runtime import certified, table_format
from nbx_tune.kernels.runtime.registry import register
from nbx_tune.tuner import commands as api

register(planted.SPEC)
def census(*args, isolate=False, **kwargs):
    """In-process candidates keep these tests fast; test_isolation.py runs the workers."""
    return api.census(*args, isolate=isolate, **kwargs)


HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"


def _exported(tmp_path, db_url, name, rows):
    """The interpreter's table exported after a census of the trace `rows`."""
    t = tmp_path / f"{name}.tsv"
    t.write_text(HEAD + rows)
    census(str(t), db_url)
    out = tmp_path / f"{name}.json"
    s = api.export("interpreter", str(out), db_url)
    assert s.entries == rows.count("\n") and not s.skipped
    return out


@pytest.fixture
def table(tmp_path, db_url):
    rows = "test.double\tfloat32\t1000\t\t1\ntest.double\tfloat16\t77\t\t1\n"
    return _exported(tmp_path, db_url, "interpreter", rows)


def test_a_table_written_with_the_screened_range_as_text_still_imports(tmp_path, db_url, table):
    legacy = _resigned(table, tmp_path / "legacy.json", lambda d: [
        e.update(screened_min=json.dumps(e["screened_min"]), screened_max=json.dumps(e["screened_max"]))
        for e in d["entries"]])
    assert api.import_(str(legacy), f"sqlite:///{tmp_path / 'l.db'}").added == 2
    assert api.seat_views(f"sqlite:///{tmp_path / 'l.db'}")[0].status == "certified"


def test_an_exported_table_is_readable_by_others_as_the_umask_allows(table):
    import os

    umask = os.umask(0)
    os.umask(umask)
    assert table.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def test_export_is_deterministic_json_with_provenance(tmp_path, db_url, table):
    again = tmp_path / "again.json"
    api.export("interpreter", str(again), db_url)
    assert again.read_bytes() == table.read_bytes()
    # Written whole through a temporary (files.py), with a new file's usual mode, not
    # the temporary's 0600: a table is made to be shipped and read by others.
    mask = os.umask(0)
    os.umask(mask)
    assert again.stat().st_mode & 0o777 == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    doc = json.loads(table.read_text())
    assert doc["format_version"] == table_format.FORMAT_VERSION and doc["profile"] == "interpreter"
    e = doc["entries"][0]
    assert set(table_format.PROVENANCE_KEYS) <= set(e["provenance"])
    assert e["provenance"]["kernel_source_hash"] == planted.SPEC.source_hash
    assert e["screens"] and all(s["err"] <= s["rtol"] for s in e["screens"])
    assert isinstance(e["screened_max"], dict) and e["screened_max"]["kernel"] == "test_double"  # not JSON in a string


def test_kernels_load_an_exported_table_named_by_nbx_tune_table(tmp_path, table, monkeypatch):
    monkeypatch.setenv("NBX_TUNE_DB", f"sqlite:///{tmp_path / 'absent.db'}")  # no database at all
    monkeypatch.setenv("NBX_TUNE_TABLE", str(table))
    certified.reload()
    st = certified.state()
    assert st.sources == [str(table)] and len(st.entries) == 2
    cfg = certified.config_for(planted.SPEC, ("float32",), (), (1000,))
    entry = [e for e in json.loads(table.read_text())["entries"] if e["dtypes"] == "float32"][0]
    assert cfg.key() == entry["config"]
    assert certified.launch_stats()["misses"] == {}
    assert not (tmp_path / "absent.db").exists()  # a launch never creates a database


def _edit(path, fn):
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("damage,match", [
    (lambda p: p.write_text(p.read_text()[:200]), "not valid JSON"),
    (lambda p: _edit(p, lambda d: d["entries"][0].update(config="BLOCK=64,SKIP_TAIL=1,WRONG=0")),
     "sha256 does not match"),
    (lambda p: _edit(p, lambda d: d.update(format_version=99)), "format_version 99"),
    (lambda p: _edit(p, lambda d: d.update(format="something else")), "not an nbx-tune certified table"),
    (lambda p: _edit(p, lambda d: d["entries"][0].pop("provenance")), r"entries\[0\].provenance: missing"),
])
@pytest.mark.slow
def test_broken_tables_are_refused_whole(table, damage, match, monkeypatch):
    damage(table)
    with pytest.raises(TableError, match=match) as e:
        table_format.read(table)
    assert str(e.value).startswith(str(table)) and "\n" not in str(e.value)
    monkeypatch.setenv("NBX_TUNE_TABLE", str(table))
    certified.reload()
    with pytest.raises(TableError):  # a table the user named is never half-used
        certified.state()


@pytest.mark.slow
def test_import_merges_keeping_the_faster_certificate(tmp_path, db_url, table, any_db):
    other = any_db
    s = api.import_(str(table), other)
    assert (s.added, s.kept_existing) == (2, 0)
    s = api.import_(str(table), other)  # the same again: said so, nothing recorded
    assert (s.added, s.kept_existing, s.unchanged) == (0, 0, 2)
    # A faster certificate from elsewhere wins; the slower one is kept as history.
    doc = json.loads(table.read_text())
    for e in doc["entries"]:
        e["median_ms"] = e["median_ms"] / 10
    faster = tmp_path / "faster.json"
    faster.write_text(table_format.dumps(doc["profile"], doc["architecture"], doc["profile_hash"], doc["entries"]))
    assert api.import_(str(faster), other).added == 2
    assert db_count(other, "certificates") == 4
    assert db_count(other, "certificates", "WHERE superseded_at IS NULL") == 2
    from sqlalchemy import create_engine, text

    engine = create_engine(other)
    with engine.connect() as c:
        rows = c.execute(text("SELECT median_ms FROM certified_configs")).all()
    engine.dispose()
    assert sorted(r[0] for r in rows) == sorted(e["median_ms"] for e in doc["entries"])


def test_import_refuses_another_architecture_and_skips_stale_entries(tmp_path, db_url, table, monkeypatch):
    doc = json.loads(table.read_text())
    alien = tmp_path / "alien.json"
    alien.write_text(table_format.dumps("hopper", "hopper", "x", doc["entries"]))
    with pytest.raises(TableError, match="made on device interpreter, which profile hopper does not claim"):
        api.import_(str(alien), f"sqlite:///{tmp_path / 'x.db'}")
    assert not (tmp_path / "x.db").exists()
    mislabelled = tmp_path / "mis.json"
    mislabelled.write_text(table_format.dumps("hopper", "ampere", "x", doc["entries"]))
    with pytest.raises(TableError, match="architecture 'ampere'"):
        api.import_(str(mislabelled), f"sqlite:///{tmp_path / 'x.db'}")
    monkeypatch.setitem(planted.SPEC.__dict__, "source_hash", "edited")
    s = api.import_(str(table), f"sqlite:///{tmp_path / 'y.db'}")
    assert s.added == 0 and len(s.skipped) == 2 and all("stale" in why for _, why in s.skipped)


def _resigned(path, out, fn):
    """The table edited by hand, its checksum recomputed (what a careless or hostile user does)."""
    doc = json.loads(path.read_text())
    fn(doc)
    out.write_text(table_format.dumps(doc["profile"], doc["architecture"], doc["profile_hash"], doc["entries"]))
    return out


@pytest.mark.parametrize("edit,match", [
    (lambda d: d["entries"][0].update(config="BLOCK=0,SKIP_TAIL=0,WRONG=0,num_warps=4,num_stages=2"),
     "not in the kernel's declared config space"),
    (lambda d: d["entries"][0].update(config="BLOCK=32,SKIP_TAIL=0,num_warps=4,num_stages=2"),
     "not in the kernel's declared config space"),  # a constexpr missing
    (lambda d: d["entries"][0].update(config="BLOCK=32,SKIP_TAIL=0,WRONG=0,EXTRA=1,num_warps=4,num_stages=2"),
     "not in the kernel's declared config space"),  # an unknown constexpr
    (lambda d: d["entries"][0].update(config="BLOCK=32,SKIP_TAIL=0,WRONG=0,num_warps=0,num_stages=2"),
     "not in the kernel's declared config space"),
    (lambda d: d["entries"][0].update(config="BLOCK=x"), "not name=integer pairs"),
    (lambda d: d["entries"].append(dict(d["entries"][0])), "the same seat as entries"),
    (lambda d: d["entries"][0].update(median_ms=-1), r"median_ms: -1 is not a positive finite time"),
    (lambda d: d["entries"][0].update(median_ms=float("nan")), r"median_ms: nan is not"),
    (lambda d: d["entries"][0].update(spread_ms=[]), r"spread_ms: expected \[p20, p80\]"),
    (lambda d: d["entries"][0]["provenance"].update(certified_at="yesterday"), "certified_at: not an ISO"),
])
@pytest.mark.slow
def test_edited_and_resigned_tables_are_refused_at_import_and_never_served(tmp_path, table, edit, match,
                                                                           monkeypatch):
    bad = _resigned(table, tmp_path / "bad.json", edit)
    with pytest.raises(TableError, match=match) as e:
        api.import_(str(bad), f"sqlite:///{tmp_path / 'x.db'}")
    assert "\n" not in str(e.value) and not (tmp_path / "x.db").exists()
    monkeypatch.setenv("NBX_TUNE_TABLE", str(bad))
    monkeypatch.setenv("NBX_TUNE_DB", f"sqlite:///{tmp_path / 'absent.db'}")
    certified.reload()
    try:
        st = certified.state()
    except TableError:
        return  # refused whole at launch
    # A config outside the space is never served: the seat falls back to the declared default.
    assert all(cfg in planted.SPEC.configs() for cfg, _ in st.entries.values())
    assert any("declared config space" in why or "integer pairs" in why for _, _, why in st.stale)


def test_deeply_nested_table_is_one_line(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(TableError, match="nested too deeply"):
        table_format.read(p)


def test_an_import_claiming_to_beat_the_current_certificate_is_screened_first(tmp_path, db_url, table):
    """A wrong config (in the declared space, so it passes the field checks) claiming to be
    ten times faster does not replace the census's certificate: it is screened here and fails."""
    doc = json.loads(table.read_text())
    e = [x for x in doc["entries"] if x["dtypes"] == "float32"][0]
    before = e["config"]
    wrong = _resigned(table, tmp_path / "wrong.json", lambda d: [
        x.update(config=planted.WRONG.key(), median_ms=x["median_ms"] / 10) for x in d["entries"]
        if x["dtypes"] == "float32"])
    s = api.import_(str(wrong), db_url)
    assert s.added == 0 and len(s.unscreened) == 1 and "wrong_answer" in s.unscreened[0][1]
    views = [v for v in api.seat_views(db_url) if v.dtypes == "float32"]
    assert views[0].config == before and views[0].status == "certified"
    # A faster config that does pass the screen replaces it.
    good = [c for c in planted.GOOD if c.key() != before][0]
    faster = _resigned(table, tmp_path / "faster.json", lambda d: [
        x.update(config=good.key(), median_ms=x["median_ms"] / 10) for x in d["entries"] if x["dtypes"] == "float32"])
    assert api.import_(str(faster), db_url).added == 1
    assert [v for v in api.seat_views(db_url) if v.dtypes == "float32"][0].config == good.key()


def test_the_launch_read_serves_only_this_compile_target(tmp_path, table, monkeypatch):
    """Another compile target is never served; a sibling device of the same target is."""
    from nbx_tune.kernels.runtime import validity
    from nbx_tune.profiles import builtin_profiles

    monkeypatch.setenv("NBX_TUNE_DB", f"sqlite:///{tmp_path / 'absent.db'}")
    sibling = _resigned(table, tmp_path / "sibling.json", lambda d: [
        x["provenance"].update(device_name="another CPU", driver="other") for x in d["entries"]])
    monkeypatch.setenv("NBX_TUNE_TABLE", str(sibling))
    certified.reload()
    assert len(certified.state().entries) == 2
    other = _resigned(table, tmp_path / "other.json", lambda d: [
        x["provenance"].update(device_target="cuda:80") for x in d["entries"]])
    monkeypatch.setenv("NBX_TUNE_TABLE", str(other))
    certified.reload()
    st = certified.state()
    assert not st.entries and all("does not claim" in why for _, _, why in st.stale)
    # The rule itself, on a profile that claims two targets (ampere: cuda:80 and cuda:87).
    ampere = builtin_profiles()["ampere"]
    prov = {"kernel_source_hash": planted.SPEC.source_hash, "config_space_hash": planted.SPEC.config_space_hash,
            "profile_hash": validity.profile_hash(ampere, planted.SPEC), "triton_version": "t",
            "device_target": "cuda:80"}
    assert validity.stale_reason(prov, planted.SPEC, ampere, "t", "cuda:80") is None
    assert "compile target cuda:80" in validity.stale_reason(prov, planted.SPEC, ampere, "t", "cuda:87")
    assert validity.stale_reason(prov, planted.SPEC, ampere) is None  # an exporter judges the code only


REGRET = {"audits": 3, "median": 0.004, "max": 0.021}


def test_sampled_regret_survives_an_import_then_export_and_show_prints_it(tmp_path, table, any_db):
    from typer.testing import CliRunner

    from nbx_tune.cli.app import app

    with_regret = _resigned(table, tmp_path / "made.json", lambda d: [
        e["provenance"].update(sampled_regret=REGRET, search_detail="re-certified: the old winner held")
        for e in d["entries"]])
    assert api.import_(str(with_regret), any_db).added == 2
    again = tmp_path / "again.json"
    assert api.export("interpreter", str(again), any_db).entries == 2
    for e in json.loads(again.read_text())["entries"]:
        assert e["provenance"]["sampled_regret"] == REGRET
        assert e["provenance"]["search_detail"] == "re-certified: the old winner held"
    seat = api.seat_views(any_db)[0]
    assert api.show_seat(str(seat.id), db=any_db)["history"][-1]["certificate"]["sampled_regret"] == REGRET
    r = CliRunner().invoke(app, ["show", str(seat.id), "--db", any_db], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "median 0.40 %, max 2.10 % over 3 audited seat(s)" in r.output
    assert "the old winner held" in r.output


def test_a_table_without_sampled_regret_still_imports_and_exports_none(tmp_path, table, any_db):
    assert "sampled_regret" not in json.loads(table.read_text())["entries"][0]["provenance"]
    assert api.import_(str(table), any_db).added == 2
    assert db_count(any_db, "certificates", "WHERE sampled_regret IS NULL") == 2
    again = tmp_path / "again.json"
    api.export("interpreter", str(again), any_db)
    assert all("sampled_regret" not in e["provenance"] for e in json.loads(again.read_text())["entries"])


@pytest.mark.parametrize("bad", [{"audits": 0, "median": 0.0, "max": 0.0}, {"median": 0.1, "max": 0.2},
                                 {"audits": 2, "median": -1.0, "max": 0.1}, "3 %"])
def test_a_malformed_sampled_regret_is_refused_before_the_database_opens(tmp_path, table, bad):
    broken = _resigned(table, tmp_path / "bad.json",
                       lambda d: d["entries"][1]["provenance"].update(sampled_regret=bad))
    with pytest.raises(TableError, match=r"entries\[1\]\.provenance\.sampled_regret"):
        api.import_(str(broken), f"sqlite:///{tmp_path / 'never.db'}")
    assert not (tmp_path / "never.db").exists()


def test_a_0004_database_upgrades_with_its_certificates_and_no_regret_or_detail(any_db):
    from alembic import command
    from sqlalchemy import text

    from nbx_tune.tuner.commands import db_upgrade
    from nbx_tune.tuner.store.db import _alembic_config, make_engine

    database_at(any_db, "0004", "test_double", "import")
    db_upgrade(any_db)
    engine = make_engine(any_db)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT config, sampled_regret, search_detail FROM certificates")).all() \
                == [("BLOCK=256", None, None)]
            assert conn.execute(text("SELECT count(*) FROM certified_configs")).scalar() == 1
        with engine.begin() as conn:  # and back down: the columns go, the certificate stays
            command.downgrade(_alembic_config(conn), "0004")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT config FROM certificates")).all() == [("BLOCK=256",)]
    finally:
        engine.dispose()


@pytest.fixture
def relu_table(tmp_path, db_url):
    return _exported(tmp_path, db_url, "relu", "aten.relu\tfloat32\t100\t\t1\n")


def _every_fn(d, fn):
    e = d["entries"][0]
    for k in ("screened_min", "screened_max"):
        e[k]["flags"]["fn"] = fn
    for s in e["screens"]:
        s["problem"]["flags"]["fn"] = fn
    e["flags"] = f"fn={fn}"


@pytest.mark.parametrize("edit,match", [
    (lambda d: _every_fn(d, "no_such_fn"), r"entries\[0\]\.flags: kernel elementwise_unary cannot screen this seat"),
    (lambda d: d["entries"][0].update(flags="fn=no_such_fn"), r"entries\[0\]\.screened_min: a shape of another seat"),
    (lambda d: d["entries"][0].update(dtypes="float128"), r"entries\[0\]\.dtypes: 'float128' is not a dtype"),
    (lambda d: d["entries"][0].update(bucket="N=1.." + "9" * 40), r"entries\[0\]\.bucket: .* is not inside one bucket"),
    (lambda d: d["entries"][0]["screened_max"].update(dims=[10**9]), r"entries\[0\]\.screened_max: a shape of another"),
    (lambda d: d["entries"][0].update(bucket="N=200..100"), r"entries\[0\]\.bucket: 'N=200..100' is not inside one bucket"),
])
def test_an_imported_entry_must_be_a_seat_this_build_can_key_and_screen(tmp_path, relu_table, edit, match):
    """They used to be stored, listed and exported again as certified."""
    bad = _resigned(relu_table, tmp_path / "bad.json", edit)
    with pytest.raises(TableError, match=match) as e:
        api.import_(str(bad), f"sqlite:///{tmp_path / 'x.db'}")
    assert "\n" not in str(e.value) and not (tmp_path / "x.db").exists()


def test_an_imported_config_this_profile_refuses_statically_is_never_stored(tmp_path, table):
    bad = _resigned(table, tmp_path / "bad.json", lambda d: d["entries"][0].update(config=str(planted.HUGE)))
    with pytest.raises(TableError, match=r"entries\[0\]\.config: refused here at its screened_min shape: "
                                         "smem_over_budget") as e:
        api.import_(str(bad), f"sqlite:///{tmp_path / 'x.db'}")
    assert "\n" not in str(e.value) and not (tmp_path / "x.db").exists()


BAD_VALUES = [10**400, -(10**400), -1, 0, 1.5, float("nan"), True, None, "", "x", [], [1, 2], {}, {"a": 1}]


def _paths(node, prefix=()):
    """Every field of an entry, nested ones too (lists by their first item)."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list) and node:
        yield from _paths(node[0], prefix + (0,))


def test_every_field_of_an_imported_table_is_checked_with_a_one_line_error(tmp_path, table):
    """A schema, field by field: an integer median_ms of 10**400 used to raise OverflowError."""
    from nbx_tune.profiles import builtin_profiles
    from nbx_tune.tuner.store.export import check_table

    entry = json.loads(table.read_text())["entries"][0]
    tried = 0
    for path in list(_paths(entry))[1:]:
        for value in BAD_VALUES:
            def edit(d, path=path, value=value):
                node = d["entries"][0]
                for k in path[:-1]:
                    node = node[k]
                node[path[-1]] = value
            doc = json.loads(table.read_text())
            edit(doc)  # re-signed as it stands: a bad kernel name cannot be sorted
            doc["sha256"] = table_format.checksum(doc["entries"])
            bad = tmp_path / "bad.json"
            bad.write_text(json.dumps(doc))
            try:
                check_table(bad, builtin_profiles())  # everything an import checks before the database
            except TableError as e:
                assert "\n" not in str(e)
            tried += 1
    assert tried > 300
    with pytest.raises(TableError, match=r"entries\[0\]\.median_ms: 1000000.* is not a positive finite time"):
        check_table(_resigned(table, tmp_path / "bad.json", lambda d: d["entries"][0].update(median_ms=10**400)),
                    builtin_profiles())


def test_an_import_writes_in_batches_never_a_statement_per_entry(tmp_path):
    """100,000 entries took 303 s one query at a time (bench/import_scale.py times it)."""
    import sys
    from pathlib import Path

    from sqlalchemy import event

    from nbx_tune.profiles import builtin_profiles
    from nbx_tune.tuner.store.export import check_table, import_table
    from nbx_tune.tuner.store import Store

    from nbx_tune.bench import import_scale

    counts = []
    for n in (3, 60):
        t = tmp_path / f"t{n}.json"
        assert import_scale.make_table(n, t) == n
        store = Store(f"sqlite:///{tmp_path / f'{n}.db'}")
        statements = []
        event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        s = import_table(store, check_table(t, builtin_profiles()))
        assert s.added == n
        counts.append(len(statements))
        store.close()
    assert counts[0] == counts[1], counts  # the same statements for 3 entries as for 60

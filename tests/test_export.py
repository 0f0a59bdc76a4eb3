"""Certified tables: deterministic export, the launch-time read from a table, broken files
refused whole, and imports that merge by keeping the faster certificate."""

import json
import os

import pytest

import planted
from conftest import db_count
from nbx_tune.errors import TableError
from nbx_tune.kernels import certified, table_format
from nbx_tune.kernels.registry import register
from nbx_tune.tuner import api

register(planted.SPEC)
def census(*args, isolate=False, **kwargs):
    """In-process candidates keep these tests fast; test_isolation.py runs the workers."""
    return api.census(*args, isolate=isolate, **kwargs)


HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"


@pytest.fixture
def table(tmp_path, db_url):
    t = tmp_path / "t.tsv"
    t.write_text(HEAD + "test.double\tfloat32\t1000\t\t1\ntest.double\tfloat16\t77\t\t1\n")
    census(str(t), db_url)
    out = tmp_path / "interpreter.json"
    s = api.export("interpreter", str(out), db_url)
    assert s.entries == 2 and not s.skipped
    return out


def test_export_is_deterministic_json_with_provenance(tmp_path, db_url, table):
    again = tmp_path / "again.json"
    api.export("interpreter", str(again), db_url)
    assert again.read_bytes() == table.read_bytes()
    # Written whole through a temporary (tuner/files.py), with a new file's usual mode, not
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
def test_broken_tables_are_refused_whole(table, damage, match, monkeypatch):
    damage(table)
    with pytest.raises(TableError, match=match) as e:
        table_format.read(table)
    assert str(e.value).startswith(str(table)) and "\n" not in str(e.value)
    monkeypatch.setenv("NBX_TUNE_TABLE", str(table))
    certified.reload()
    with pytest.raises(TableError):  # a table the user named is never half-used
        certified.state()


def test_import_merges_keeping_the_faster_certificate(tmp_path, db_url, table, any_db):
    other = any_db
    s = api.import_(str(table), other)
    assert (s.added, s.kept_existing) == (2, 0)
    s = api.import_(str(table), other)  # the same again: not faster, recorded but not current
    assert (s.added, s.kept_existing) == (0, 2)
    # A faster certificate from elsewhere wins; the slower one is kept as history.
    doc = json.loads(table.read_text())
    for e in doc["entries"]:
        e["median_ms"] = e["median_ms"] / 10
    faster = tmp_path / "faster.json"
    faster.write_text(table_format.dumps(doc["profile"], doc["architecture"], doc["profile_hash"], doc["entries"]))
    assert api.import_(str(faster), other).added == 2
    assert db_count(other, "certificates") == 6
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

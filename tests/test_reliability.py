"""What happens when things go wrong: a census killed at random moments, two censuses on
one database, certificates whose provenance no longer holds."""

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nbx_tune.testing import planted
from conftest import db_count
from nbx_tune.kernels.runtime import certified
from nbx_tune.kernels.runtime.registry import register
from nbx_tune.tuner import commands as api

register(planted.SPEC)
TESTS = Path(__file__).resolve().parent
HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"
# Ten matmul seats (M is bucketed one by one below 64), one to two seconds each here.
MANY_SEATS = "".join(f"aten.mm\tfloat32,float32\t{m}x16;16x24\t\t1\n" for m in range(17, 27))


def census_proc(trace, db_url, *extra):
    env = {**os.environ, "TRITON_INTERPRET": "1", "COLUMNS": "200",
           # the caller's PYTHONPATH kept: it may name the checkout under test
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "nbx_tune.cli.app", "census", "--model", str(trace),
                             "--db", db_url, "--no-isolate", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def q(db_url, sql):
    with sqlite3.connect(db_url[len("sqlite:///"):], timeout=30) as c:
        return c.execute(sql).fetchall()


@pytest.mark.slow
def test_two_censuses_at_once_tune_each_seat_once(tmp_path, any_db):
    db_url = any_db
    t = tmp_path / "t.tsv"
    t.write_text(HEAD + MANY_SEATS)
    a, b = census_proc(t, db_url, "--json"), census_proc(t, db_url, "--json")
    outs = [p.communicate(timeout=600) for p in (a, b)]
    for p, (out, err) in zip((a, b), outs):
        assert p.returncode == 0, err
        assert "locked" not in err.lower() and "Traceback" not in err
    assert db_count(db_url, "seats") == 10
    # Each seat tuned exactly once, by one census or the other, and certified.
    assert db_count(db_url, "tunings") == 10
    assert db_count(db_url, "(SELECT DISTINCT seat_id FROM tunings) AS t") == 10
    assert db_count(db_url, "certified_configs") == 10
    import json

    for out, _ in outs:
        assert json.loads(out)["coverage"]["certified"]["seats"] == 10
    assert db_count(db_url, "seats", "WHERE claimed_by IS NOT NULL") == 0


@pytest.mark.slow
def test_kill_9_at_random_moments_loses_nothing_and_the_next_census_finishes(tmp_path, db_url):
    t = tmp_path / "t.tsv"
    t.write_text(HEAD + MANY_SEATS)
    rng = random.Random(2026)
    kept = {}
    for _ in range(4):
        p = census_proc(t, db_url)
        time.sleep(rng.uniform(1.5, 6.0))
        p.send_signal(signal.SIGKILL)
        p.wait()
        if not Path(db_url[len("sqlite:///"):]).exists():
            continue
        assert q(db_url, "PRAGMA integrity_check") == [("ok",)]
        tables = {name for (name,) in q(db_url, "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "certificates" not in tables:
            # Killed before the first migration committed (a slow start-up: imports on a busy
            # host): SQLite's DDL is transactional, so the schema is all there or not at all.
            assert not kept and tables <= {"alembic_version"}
            assert not tables or q(db_url, "SELECT COUNT(*) FROM alembic_version") == [(0,)]
            continue
        certs = dict(q(db_url, "SELECT id, config FROM certificates"))
        # No certified row is ever lost or changed.
        assert all(certs.get(k) == v for k, v in kept.items())
        kept = certs
        # No half-written seat: a tuning has all its candidates recorded, and a
        # certificate only beside a complete tuning.
        for tid, cands in q(db_url, "SELECT id, candidates FROM tunings"):
            m = q(db_url, f"SELECT count(*) FROM measurements WHERE tuning_id={tid}")[0][0]
            r = q(db_url, f"SELECT count(*) FROM refusals WHERE tuning_id={tid} AND config IS NOT NULL")[0][0]
            assert m + r == cands
        assert q(db_url, "SELECT count(*) FROM certificates c LEFT JOIN tunings t ON t.id = c.tuning_id "
                         "WHERE t.id IS NULL") == [(0,)]
    p = census_proc(t, db_url, "--json")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    assert q(db_url, "SELECT count(*) FROM certified_configs") == [(10,)]
    assert all(k in dict(q(db_url, "SELECT id, config FROM certificates")) for k in kept)
    assert q(db_url, "SELECT count(*), count(DISTINCT seat_id) FROM tunings")[0][1] == 10


def test_a_dead_holders_claim_expires(db_url):
    from nbx_tune.tuner.store import Store

    t = Path(db_url[len("sqlite:///"):]).parent / "t.tsv"
    t.write_text(HEAD + "test.double\tfloat32\t100\t\t1\n")
    api.census(str(t), db_url, dry_run=True)
    store = Store(db_url)
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.census.census import load_plan

    plan = load_plan(t, get_profile("interpreter"))
    _, ids = store.record_census(plan.trace, plan.sha256, "interpreter", {k: s.problems for k, s in plan.seats.items()})
    (sid,) = ids.values()
    assert store.claim(sid, "elsewhere:1", ttl_s=0.5)
    assert not store.claim(sid, "me:2", ttl_s=60)  # a live claim on another host holds
    time.sleep(0.6)
    assert store.claim(sid, "me:2", ttl_s=60)  # expired
    # A holder on this host whose process is gone loses its claim at once.
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.release(sid, "me:2")
    assert store.claim(sid, f"{socket.gethostname()}:{dead.pid}", ttl_s=600)
    assert store.claim(sid, "me:3", ttl_s=60)


def _set_profile_hash(m, value):
    from nbx_tune.profiles import builtin_profiles

    prof = builtin_profiles()["interpreter"]
    old = prof.base_hash
    object.__setattr__(prof, "base_hash", value)  # frozen: as if the profile file had changed
    m.callback = lambda: object.__setattr__(prof, "base_hash", old)


@pytest.mark.parametrize("what,patch", [
    ("config space", lambda m: m.setitem(planted.SPEC.__dict__, "config_space_hash", "other-space")),
    ("Triton", lambda m: m.setattr("triton.__version__", "9.9.9")),
    ("profile", lambda m: _set_profile_hash(m, "other-profile")),
])
def test_every_provenance_change_makes_a_certificate_stale(tmp_path, db_url, monkeypatch, what, patch):
    t = tmp_path / "t.tsv"
    t.write_text(HEAD + "test.double\tfloat32\t300\t\t1\n")
    assert api.census(str(t), db_url, isolate=False).seats[0].status == "certified"
    with monkeypatch.context() as m:
        patch(m)
        try:
            views = api.seat_views(db_url)
            certified.reload()
            served = certified.state().entries
        finally:
            getattr(m, "callback", lambda: None)()
    assert [v.status for v in views] == ["stale"] and what in views[0].why
    assert not any(k[0] == "test_double" for k in served)  # never served at launch


def test_a_database_lost_under_a_census_is_a_failure_not_a_success(tmp_path):
    """The database deleted under a census (its -wal file too): it used to print "certified
    ... Results are in ..." and exit 0, its own connections reading the deleted files."""
    import pytest

    from nbx_tune.errors import StoreError
    from nbx_tune.tuner import commands as api
    from nbx_tune.tuner.certify.tune import NullReporter

    class DeletesTheWal(NullReporter):
        def seat_done(self, label, result):
            for name in ("c.db", "c.db-wal", "c.db-shm"):
                if (tmp_path / name).exists():
                    (tmp_path / name).unlink()

    t = tmp_path / "t.tsv"
    t.write_text("# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"
                 "test.double\tfloat32\t1000\t\t1\ntest.double\tfloat32\t77\t\t1\n")
    with pytest.raises(StoreError, match=r"census reports \d certified seat.*results are lost") as e:
        api.census(str(t), f"sqlite:///{tmp_path / 'c.db'}", reporter=DeletesTheWal(), isolate=False)
    assert "\n" not in str(e.value)
    # An intact census reads back what it reports.
    rep = api.census(str(t), f"sqlite:///{tmp_path / 'ok.db'}", isolate=False)
    assert rep.seats and all(s.status == "certified" for s in rep.seats)

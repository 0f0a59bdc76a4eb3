"""A pooled PostgreSQL connection is pinged before use only when it has been idle a while
(db.ping_when_idle): a fleet worker's claim, reads and write follow each other within
milliseconds, and a ping before each doubled its transactions; a connection the server
dropped while idle is still found and replaced."""

import time

import pytest
from sqlalchemy import create_engine, select, text

from nbx_tune.tuner.store import Store, db



def test_a_connection_is_pinged_only_after_idling_and_a_dropped_one_is_replaced(any_db, monkeypatch):
    if not any_db.startswith("postgresql"):
        pytest.skip("SQLite connections are files: nothing to ping")
    monkeypatch.setattr(db, "PING_IDLE_S", 0.2)
    store = Store(any_db)
    try:
        pings, ping = [], store.engine.dialect.do_ping
        monkeypatch.setattr(store.engine.dialect, "do_ping", lambda c: pings.append(1) or ping(c))
        with store.session(write=False) as s:
            pid = s.scalar(select(text("pg_backend_pid()")))
        for _ in range(3):  # back to back: no ping (before: one per transaction)
            with store.session(write=False) as s:
                assert s.scalar(select(text("pg_backend_pid()"))) == pid
        assert pings == []
        admin = create_engine(any_db)
        with admin.connect() as c:
            c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            c.commit()
        admin.dispose()
        time.sleep(0.3)  # idle past PING_IDLE_S: pinged, found dropped, replaced
        with store.session(write=False) as s:
            assert s.scalar(select(text("pg_backend_pid()"))) != pid
        assert len(pings) == 1
    finally:
        store.close()


def test_a_heartbeat_is_one_unpinged_statement_and_survives_a_dropped_connection(any_db, monkeypatch):
    """A beat's connection always idled a quarter lease; the beat's UPDATE is its own check,
    so it is sent without a ping (before: ping, BEGIN, UPDATE, COMMIT) and, when the
    server dropped the connection, sent again once on a new one."""
    from nbx_tune.tuner.store.models import Seat

    store = Store(any_db)
    try:
        with store.session() as s:
            seat = Seat(profile="beat", kernel="k", dtypes="d", flags="", bucket="b")
            s.add(seat)
            s.flush()
            sid = seat.id
        assert store.claim(sid, "me", 5.0)
        if not any_db.startswith("postgresql"):
            assert store.extend_claim(sid, "me", 60.0) and not store.extend_claim(sid, "other", 60.0)
            return
        monkeypatch.setattr(db, "PING_IDLE_S", 0.05)
        pings, ping = [], store.engine.dialect.do_ping
        monkeypatch.setattr(store.engine.dialect, "do_ping", lambda c: pings.append(1) or ping(c))
        assert store.extend_claim(sid, "me", 60.0)
        with store.session(write=False) as s:
            pid = s.scalar(select(text("pg_backend_pid()")))
            assert s.scalar(text("SELECT claim_expires FROM seats WHERE id = :i"), {"i": sid}) > time.time() + 50
        pings.clear()
        admin = create_engine(any_db)
        with admin.connect() as c:
            c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            c.commit()
        admin.dispose()
        time.sleep(0.1)  # idled past PING_IDLE_S: a session would ping; the beat does not
        assert store.extend_claim(sid, "me", 90.0)  # dropped, replaced, sent again
        assert pings == []
        assert not store.extend_claim(sid, "other", 90.0)  # only the holder's beat renews
        with store.session(write=False) as s:
            assert s.scalar(text("SELECT claim_expires FROM seats WHERE id = :i"), {"i": sid}) > time.time() + 80
    finally:
        store.close()

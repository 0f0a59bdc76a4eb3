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

"""The fleet's queue at scale: a claim reads a window of the queue, not all of it; a worker
lists the queue when it starts and when its list runs dry, not at every claim; and the
simulated fleet (bench/fleet_sim.py, 20 workers, 400 seats: 50 x 2,000 takes minutes here) on PostgreSQL certifies each
seat exactly once and loses none, a killed worker's seat included."""

import os
import sys
from pathlib import Path

import pytest
from sqlalchemy import event

from nbx_tune.tuner.store import CLAIM_WINDOW, Store
from nbx_tune.tuner.store.models import Seat, Tuning, utcnow


def _seats(store, n):
    with store.session() as s:
        s.add_all([Seat(profile="p", kernel="k", dtypes="f", flags="-", bucket=f"b{i}", created_at=utcnow())
                   for i in range(n)])
    with store.session(write=False) as s:
        return list(s.scalars(Seat.__table__.select().with_only_columns(Seat.id).order_by(Seat.id)))


def test_a_claim_reads_a_window_of_the_queue_not_all_of_it(any_db):
    store = Store(any_db)
    try:
        ids = _seats(store, 10 * CLAIM_WINDOW)
        for sid in ids[:CLAIM_WINDOW + 5]:  # the head of the queue is held by live workers
            assert store.claim(sid, "other:1", 600)
        params = []
        event.listen(store.engine, "before_cursor_execute",
                     lambda conn, cur, stmt, p, ctx, many: params.append(len(p) if p else 0))
        assert store.claim_next(ids, "me:1", 60) == ids[CLAIM_WINDOW + 5]
        # Two windows read (the lock's ORDER BY names each id twice more), never the whole
        # queue in one statement (before: one statement of all 2,560 ids).
        assert max(params) <= 3 * CLAIM_WINDOW + 8, params
        # A seat tuned since the caller listed the queue is skipped and reported finished.
        mark = store.last_tuning_id()
        with store.session() as s:
            s.add(Tuning(seat_id=ids[CLAIM_WINDOW + 6], kind="tune", outcome="certified", started_at=utcnow(),
                         worker="other:2", device_name="d", device_target="t", driver="-", triton_version="-",
                         torch_version="-", kernel_source_hash="-", config_space_hash="-", profile_hash="-"))
        finished = set()
        assert store.claim_next(ids, "me:2", 60, since_tuning=mark, finished=finished) == ids[CLAIM_WINDOW + 7]
        assert finished == {ids[CLAIM_WINDOW + 6]}
    finally:
        store.close()


def test_a_worker_lists_the_queue_at_start_and_when_dry_not_per_claim(db_url):
    from types import SimpleNamespace

    from nbx_tune.tuner.fleet import run_worker

    store = Store(db_url)
    try:
        ids = _seats(store, 30)
        done, listings = set(), []

        class Tuner:
            holder, claim_ttl = "me:1", 60
            profile, device = SimpleNamespace(name="p"), SimpleNamespace(name="d")

            def needing_work(self):
                listings.append(1)
                return [(i, "k", f"seat{i}") for i in ids if i not in done]

            def tune_claimed(self, sid, kernel, label, *a):
                done.add(sid)
                store.release(sid, self.holder)
                return "tuned"

        t = Tuner()
        t.store = store
        rep = run_worker(t)
        assert len(rep.tuned) == 30 and done == set(ids)
        assert len(listings) == 2, len(listings)  # at start, and once dry (before: once per claim, 31)
    finally:
        store.close()


PG = os.environ.get("NBX_TUNE_TEST_PG", "").strip()


@pytest.mark.slow
def test_twenty_simulated_workers_certify_four_hundred_seats_once(tmp_path, monkeypatch):
    if not PG:
        if os.environ.get("NBX_TUNE_REQUIRE_PG") == "1":
            pytest.fail("NBX_TUNE_REQUIRE_PG=1 but NBX_TUNE_TEST_PG is not set")
        pytest.skip("no PostgreSQL server (set NBX_TUNE_TEST_PG)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import fleet_sim

    monkeypatch.setenv("OUT", str(tmp_path))
    rc = fleet_sim.main(["--db", PG, "--workers", "20", "--seats", "400", "--scale", "0.002", "--pool", "4",
                         "--lease", "10", "--kill-after", "0.5"])
    import json

    (row,) = json.loads((tmp_path / "fleet_sim.json").read_text())["rows"]
    assert row["errors"] == []
    assert row["exactly_once"] and row["tunings"] == 400 == row["certified"]
    assert row["no_lost_seat"] and row["left_held"] == 0
    assert row["dead_seat"] is not None and row["reclaim_s"] is not None
    assert rc == 0

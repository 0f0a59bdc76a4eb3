"""The fleet's queue at scale: a claim reads a window of the queue, not all of it; a worker
lists the queue when it starts and when its list runs dry, not at every claim; and the
simulated fleet (bench/fleet_sim.py, 50 workers in 2 host processes, 2,000 seats) on
PostgreSQL certifies each seat exactly once and loses none, a killed worker's seat
included, taken up again within its lease."""

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


def _sim_queue(store, n):
    """n seats of the simulation's mix (the shipped table's), enqueued: (profile, seats)."""
    from nbx_tune.bench import fleet_sim
    from nbx_tune.profiles import get_profile

    profile = get_profile(fleet_sim.PROFILE)
    seats = fleet_sim.seat_mix(n, 1.0, profile)
    fleet_sim.enqueue(store, seats)
    return profile, seats


def test_a_claim_reads_a_window_of_the_queue_not_all_of_it(any_db):
    store = Store(any_db)
    try:
        ids = _seats(store, 10 * CLAIM_WINDOW)
        for sid in ids[:CLAIM_WINDOW + 5]:  # the head of the queue is held by live workers
            assert store.claim(sid, "other:1", 600)
        params = []
        event.listen(store.engine, "before_cursor_execute",
                     lambda conn, cur, stmt, p, ctx, many: params.append(len(p) if p else 0))
        held = {}
        assert store.claim_next(ids, "me:1", 60, held=held) == ids[CLAIM_WINDOW + 5]
        # Two windows read, never the whole queue in one statement (before: one statement of
        # all 2,560 ids), and the seats others hold are handed back with their leases' ends,
        # for the caller's next claim to pass over.
        assert max(params) <= CLAIM_WINDOW, params
        assert set(held) == set(ids[:CLAIM_WINDOW + 5]) and min(held.values()) > utcnow().timestamp() + 500
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

    from nbx_tune.tuner.fleet.workers import run_worker

    store = Store(db_url)
    try:
        ids = _seats(store, 30)
        done, listings = set(), []

        class Tuner:
            holder, claim_ttl = "me:1", 60
            profile, device = SimpleNamespace(name="p"), SimpleNamespace(name="d")

            def needing_work(self, untuned_only=False, tuned_only=False):
                listings.append(tuned_only)
                return [(i, "k", f"seat{i}") for i in ids if i not in done]

            def cost_queue(self):
                pass

            def claim_untuned(self):
                return None  # every seat here needs its status judged: all from the listing

            def untuned_held(self):
                return None

            def tune_claimed(self, sid, kernel, label, *a):
                done.add(sid)
                store.release(sid, self.holder)
                return "tuned"

        t = Tuner()
        t.store = store
        rep = run_worker(t)
        assert len(rep.tuned) == 30 and done == set(ids)
        # Once, at start, the seats whose status needs Python alone (the never-tuned are the
        # server's to order); before: in full per claim, 31.
        assert listings == [True], listings
    finally:
        store.close()


PG = os.environ.get("NBX_TUNE_TEST_PG", "").strip()


@pytest.mark.slow
def test_fifty_simulated_workers_certify_two_thousand_seats_once(tmp_path, monkeypatch):
    if not PG:
        if os.environ.get("NBX_TUNE_REQUIRE_PG") == "1":
            pytest.fail("NBX_TUNE_REQUIRE_PG=1 but NBX_TUNE_TEST_PG is not set")
        pytest.skip("no PostgreSQL server (set NBX_TUNE_TEST_PG)")
    from nbx_tune.bench import fleet_sim

    monkeypatch.setenv("OUT", str(tmp_path))
    # Two host processes of 25 workers, one connection each (50 against the server's 100:
    # no pooler in CI); two, not five: each host's start (imports, the registry, the
    # kernels' source hashes) is CPU the run's 2,000 certificates compete with.
    rc = fleet_sim.main(["--db", PG, "--workers", "50", "--seats", "2000", "--scale", "0.0005", "--hosts", "2",
                         "--pool", "1", "--lease", "10", "--kill-after", "0.5"])
    import json

    (row,) = json.loads((tmp_path / "fleet_sim.json").read_text())["rows"]
    assert row["errors"] == []
    assert row["exactly_once"] and row["tunings"] == 2000 == row["certified"]
    assert row["no_lost_seat"] and row["left_held"] == 0
    assert row["dead_seat"] is not None and row["reclaim_s"] is not None
    assert 0 < row["reclaim_s"] < 10 + 2  # its lease, and a poll of the workers waiting on it
    assert rc == 0


def test_the_listing_reads_never_tuned_seats_in_one_query_and_keeps_their_cost(any_db, monkeypatch):
    from types import SimpleNamespace

    from nbx_tune.kernels.runtime.registry import get_spec
    from nbx_tune.kernels.spec import Problem
    from nbx_tune.tuner.fleet import seat_tuner as runner
    from nbx_tune.tuner.fleet.seat_tuner import SeatTuner, seat_cost

    from conftest import db_count

    store = Store(any_db)
    try:
        profile, seats = _sim_queue(store, 40)
        tuner = SeatTuner(store, profile, SimpleNamespace(name="SimGPU", target="cuda:90", driver="sim"), None, None)
        recs = store.seat_records(profile=profile.name)
        want = [r.seat.id for r in sorted(recs, key=lambda r: (-seat_cost(get_spec(r.seat.kernel), r.problems,
                                                                          profile), r.seat.id))]
        read, whole = [], store.seat_records
        monkeypatch.setattr(store, "seat_records", lambda **kw: read.append(kw) or whole(**kw))
        listed = tuner.needing_work()
        assert [t[0] for t in listed] == want  # longest first, as from the seats' records
        # No never-tuned seat's records were read (before: every seat's, at every listing),
        # and each seat's cost is kept for the next listing, which works none out.
        assert all(kw.get("tuned_only") for kw in read), read
        assert db_count(any_db, "seats", "WHERE queue_cost IS NULL") == 0
        monkeypatch.setattr(runner, "_cost_at", lambda *a: pytest.fail("cost worked out again"))
        assert tuner.needing_work() == listed
        # A census that adds a shape to a seat clears its cost: the next listing sets it anew.
        k, d, f, b, *_ = seats[0]
        store.record_census(SimpleNamespace(path="t.tsv", rows=[1], launches=1), "sha", profile.name,
                            {(k, d, f, b): {Problem.from_json(seats[1][4]): 1}})
        assert db_count(any_db, "seats", "WHERE queue_cost IS NULL") == 1
    finally:
        store.close()


def test_a_claim_at_a_free_head_is_two_statements_and_reads_a_small_window(any_db):
    from nbx_tune.tuner.store import CLAIM_FIRST

    store = Store(any_db)
    try:
        ids = _seats(store, 4 * CLAIM_WINDOW)
        stmts, params = [], []

        def seen(conn, cur, stmt, p, ctx, many):
            stmts.append(stmt)
            params.append(sum(len(v) if isinstance(v, (list, tuple)) else 1 for v in (p.values() if isinstance(
                p, dict) else p)) if p else 0)
        event.listen(store.engine, "before_cursor_execute", seen)
        mark = store.last_tuning_id()
        stmts.clear(), params.clear()
        assert store.claim_next(ids, "me:1", 60, since_tuning=mark, finished=set(), held={}) == ids[0]
        # One read of the window (holders, leases and tunings since the caller's list
        # together), one statement that locks and takes the seat (before: four, each
        # with the whole 256-id window bound).
        mine = [s for s in stmts if s.split()[0] in ("SELECT", "UPDATE")]
        assert len(mine) == 2, stmts
        assert max(params) <= CLAIM_FIRST + 4, params
    finally:
        store.close()


def test_a_seat_never_tuned_plans_its_search_without_its_history_or_every_audit(any_db, monkeypatch):
    from nbx_tune.kernels.runtime.registry import get_spec
    from nbx_tune.tuner.search import seat_search

    store = Store(any_db)
    try:
        profile, _ = _sim_queue(store, 3)
        rec = store.seat_records(profile=profile.name)[0]
        monkeypatch.setattr(store, "history", lambda *a: pytest.fail("a never-tuned seat's history read"))
        monkeypatch.setattr(store, "shortcut_losses", lambda *a: pytest.fail("every audit's loss read"))
        seat_search.for_seat(store, rec, get_spec(rec.seat.kernel), profile)
        assert store.has_audit(profile.name, rec.seat.kernel) is False
    finally:
        store.close()


def test_has_audit_says_what_shortcut_losses_would(any_db):
    from nbx_tune.tuner.store.models import Tuning

    store = Store(any_db)
    try:
        ids = _seats(store, 2)
        prov = dict(worker="w", device_name="d", device_target="t", driver="-", triton_version="-",
                    torch_version="-", kernel_source_hash="-", config_space_hash="-", profile_hash="-")
        with store.session() as s:
            s.add(Tuning(seat_id=ids[0], kind="tune", outcome="certified", started_at=utcnow(), search="audit",
                         shortcut_loss=None, **prov))
        assert not store.has_audit("p", "k") and store.shortcut_losses("p", "k") == []  # no loss measured
        with store.session() as s:
            s.add(Tuning(seat_id=ids[1], kind="tune", outcome="certified", started_at=utcnow(), search="audit",
                         shortcut_loss=0.02, **prov))
        assert store.has_audit("p", "k") and store.shortcut_losses("p", "k") == [0.02]
        assert not store.has_audit("p", "other") and not store.has_audit("q", "k")
    finally:
        store.close()


def test_workers_listing_a_fresh_queue_at_once_work_out_each_cost_once(any_db, monkeypatch):
    import threading
    from types import SimpleNamespace

    from nbx_tune.tuner.fleet import seat_tuner as runner
    from nbx_tune.tuner.fleet.seat_tuner import SeatTuner

    admin = Store(any_db)
    profile, _ = _sim_queue(admin, 60)
    admin.close()
    calls, whole = [], runner.seat_cost
    monkeypatch.setattr(runner, "seat_cost", lambda *a: calls.append(1) or whole(*a))
    stores = [Store(any_db) for _ in range(4)]
    start, lists = threading.Barrier(4), []

    def lister(st):
        start.wait()
        lists.append(SeatTuner(st, profile, SimpleNamespace(name="SimGPU", target="cuda:90", driver="sim"),
                               None, None).needing_work())
    threads = [threading.Thread(target=lister, args=(st,)) for st in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for st in stores:
        st.close()
    # Every lister got the whole queue in one order; the costs were worked out once (before:
    # by each lister that found them unset, up to four times).
    assert len(lists) == 4 and all(x == lists[0] for x in lists) and len(lists[0]) == 60
    assert len(calls) == 60, len(calls)

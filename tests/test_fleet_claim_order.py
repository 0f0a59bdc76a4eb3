"""The server-ordered claim (Store.claim_untuned, migration 0010): a worker takes the longest
free never-tuned seat in one statement, ordered by the server over the partial index of the
seats never tuned; a tuned seat leaves it; a dead holder's seat is free once its lease ends;
`census --enqueue` works out the costs, so a worker works out none. On SQLite and PostgreSQL."""

import time
from types import SimpleNamespace

import pytest
from sqlalchemy import event, update

from conftest import db_count

from nbx_tune.tuner.store import Store
from nbx_tune.tuner.store.models import Seat, utcnow

SIM = SimpleNamespace(name="SimGPU", target="cuda:90", driver="sim")


def _seats(store, costs):
    """Seats of profile "p", kernel "k", with these queue costs: their ids, in that order."""
    with store.session() as s:
        rows = [Seat(profile="p", kernel="k", dtypes="f", flags="-", bucket=f"b{i}", queue_cost=c,
                     created_at=utcnow()) for i, c in enumerate(costs)]
        s.add_all(rows)
        s.flush()
        return [r.id for r in rows]


def test_the_claim_is_one_statement_taking_the_longest_free_seat_first(any_db):
    store = Store(any_db)
    try:
        ids = _seats(store, [3.0, 9.0, 1.0, 9.0, 5.0])
        stmts = []
        event.listen(store.engine, "before_cursor_execute", lambda c, cur, stmt, *a: stmts.append(stmt))
        got = []
        while (one := store.claim_untuned("p", f"w{len(got)}:1", 60, ["k"])) is not None:
            got.append(one)
        # Longest first (ties: the newer seat first), each seat once, to distinct holders.
        assert [g[0] for g in got] == [ids[3], ids[1], ids[4], ids[0], ids[2]]
        assert got[0][1:] == ("k", "k|f|-|b3")
        # One statement a claim (and one that finds none): the server orders and takes it.
        mine = [s for s in stmts if s.split()[0] in ("SELECT", "UPDATE")]
        assert len(mine) == len(got) + 1, mine
        assert store.untuned_held("p", ["k"]) > time.time() + 50 and store.untuned_held("p", ["other"]) is None
        # A kernel this worker cannot tune is not claimed by it.
        assert store.claim_untuned("p", "x:1", 60, ["other"]) is None
    finally:
        store.close()


def test_a_seat_with_no_cost_yet_is_claimed_first(any_db):
    store = Store(any_db)
    try:
        ids = _seats(store, [3.0, None, 9.0])
        assert [store.claim_untuned("p", f"w:{i}", 60, ["k"])[0] for i in range(3)] == [ids[1], ids[2], ids[0]]
    finally:
        store.close()


def test_a_dead_holders_seat_is_claimed_by_the_server_query_once_its_lease_ends(any_db):
    store = Store(any_db)
    try:
        ids = _seats(store, [9.0, 1.0])
        assert store.claim_untuned("p", "deadhost:1:gpu0", 60, ["k"])[0] == ids[0]
        assert store.claim_untuned("p", "live:1", 60, ["k"])[0] == ids[1]  # the dead one's is held
        assert store.claim_untuned("p", "live:2", 60, ["k"]) is None and store.untuned_held("p", ["k"]) is not None
        with store.session() as s:  # its lease ended (no heartbeat since)
            s.execute(update(Seat).where(Seat.id == ids[0]).values(claim_expires=time.time() - 1))
        assert store.claim_untuned("p", "live:2", 60, ["k"])[0] == ids[0]
    finally:
        store.close()


def test_a_tuned_seat_leaves_the_claim_and_a_worker_never_lists_the_untuned(any_db, monkeypatch):
    """Through the fleet's own loop (run_worker -> tune_claimed -> write_result), with the
    simulation's fake benchmarker: each seat tuned once, longest first, marked tuned by the
    write, never claimable again; the worker listed no never-tuned seat and worked out no cost."""
    from nbx_tune.bench import fleet_sim
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.fleet import seat_tuner as runner
    from nbx_tune.tuner.fleet.seat_tuner import SeatTuner, queue_cost
    from nbx_tune.tuner.fleet.workers import run_worker

    store = Store(any_db)
    try:
        profile = get_profile(fleet_sim.PROFILE)
        seats = fleet_sim.seat_mix(12, 1.0, profile)
        ids = fleet_sim.enqueue(store, seats)
        store.fill_queue_costs(profile.name, queue_cost(profile))  # as census --enqueue does
        with store.session(write=False) as s:
            cost = dict(s.execute(Seat.__table__.select().with_only_columns(Seat.id, Seat.queue_cost)).all())
        monkeypatch.setattr(runner, "tune_seat", fleet_sim.Sleeper({x[3]: 0.0 for x in seats},
                                                                   {x[3]: (x[7], x[8]) for x in seats}, 1.0))
        monkeypatch.setattr(store, "untuned_seats", lambda *a: pytest.fail("never-tuned seats listed"))
        monkeypatch.setattr(runner, "_cost_at", lambda *a: pytest.fail("a worker worked out a cost"))
        order = []
        write = store.write_result
        monkeypatch.setattr(store, "write_result", lambda sid, *a: order.append(sid) or write(sid, *a))
        tuner = SeatTuner(store, profile, SIM, None, None, holder="w:1")
        listed_at, whole = [], tuner.needing_work
        monkeypatch.setattr(tuner, "needing_work", lambda **kw: listed_at.append(len(order)) or whole(**kw))
        rep = run_worker(tuner)
        assert len(rep.tuned) == 12 and sorted(order) == sorted(ids.values())
        # The seats needing Python's judgement listed once, at the start: not when the never-tuned
        # ran out, when every worker would read every tuned seat's records.
        assert listed_at == [0], listed_at
        assert [cost[i] for i in order] == sorted((cost[i] for i in order), reverse=True)
        assert db_count(any_db, "seats", "WHERE tuned") == 12 == db_count(any_db, "tunings")
        assert store.claim_untuned(profile.name, "w:2", 60, [k for k, *_ in seats]) is None
    finally:
        store.close()


def test_census_enqueue_works_out_the_queue_costs(tmp_path, any_db):
    from test_fleet import enqueue

    enqueue(tmp_path, any_db)
    assert db_count(any_db, "seats") == 8 and db_count(any_db, "seats", "WHERE queue_cost IS NULL") == 0


def test_a_claimed_seats_reads_are_one_transaction_reading_no_history_it_lacks(any_db, monkeypatch):
    from nbx_tune.bench import fleet_sim
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.certify.tune import NullReporter
    from nbx_tune.tuner.fleet import seat_tuner as runner
    from nbx_tune.tuner.fleet.seat_tuner import SeatTuner, queue_cost

    store = Store(any_db)
    try:
        profile = get_profile(fleet_sim.PROFILE)
        seats = fleet_sim.seat_mix(6, 1.0, profile)
        fleet_sim.enqueue(store, seats)
        store.fill_queue_costs(profile.name, queue_cost(profile))
        monkeypatch.setattr(runner, "tune_seat", fleet_sim.Sleeper({x[3]: 0.0 for x in seats},
                                                                   {x[3]: (x[7], x[8]) for x in seats}, 1.0))
        tuner = SeatTuner(store, profile, SIM, None, None, holder="w:1")
        sid, kernel, label = tuner.claim_untuned()
        tuner.tune_claimed(sid, kernel, label, 0, 1, None, NullReporter())  # the kernel has a tuning now
        sid, kernel, label = tuner.claim_untuned()
        begins, stmts = [], []
        event.listen(store.engine, "begin", lambda conn: begins.append(1))
        event.listen(store.engine, "before_cursor_execute", lambda c, cur, stmt, *a: stmts.append(stmt))
        assert tuner.tune_claimed(sid, kernel, label, 0, 1, None, NullReporter()) == "tuned"
        # Its reads (records, the kernel's measurements, audits) in one transaction, its write
        # in another (before: four); no certificate, tuning or refusal of a never-tuned seat read
        # (the one certificate read is the write's check for a current one).
        assert len(begins) == 2, stmts
        assert sum("FROM certificates" in s for s in stmts) == 1, stmts
    finally:
        store.close()


def test_a_waiting_worker_looks_less_often_and_wakes_at_the_earliest_lease_end(monkeypatch):
    """No seat free, others held: the waiting worker looks again after 0.5 s, doubling to 4 s
    while nothing turns up, or at the earliest held lease's end when that comes sooner
    (before: every 0.5 s, a thousand waiting workers making 4,000 statements a second)."""
    from nbx_tune.tuner.fleet import workers

    pauses, ends = [], [100, 100, 100, 100, 100, 0.2, None]
    monkeypatch.setattr(workers.time, "sleep", lambda s: pauses.append(round(s, 1)))

    class Tuner:
        holder, claim_ttl, profile, device = "w:1", 60, SimpleNamespace(name="p"), SimpleNamespace(name="d")
        store = SimpleNamespace(last_tuning_id=lambda: 0)

        def cost_queue(self):
            pass

        def needing_work(self, **kw):
            return []

        def claim_untuned(self):
            return None

        def untuned_held(self):
            end = ends.pop(0)
            return None if end is None else time.time() + end

    rep = workers.run_worker(Tuner())
    assert rep.tuned == [] and pauses == [0.5, 1.0, 2.0, 4.0, 4.0, 0.2], pauses


def test_the_orm_update_class_is_made_at_import_not_by_racing_threads():
    """SQLAlchemy publishes the annotated Update class before marking it cacheable; a thread
    that meets it half made compiles every ORM update of the process anew from then on.
    The store makes it at import, in one thread (a fresh interpreter, to see import alone)."""
    import subprocess
    import sys

    code = ("from sqlalchemy.sql import annotation; from sqlalchemy.sql.dml import Update\n"
            "import nbx_tune.tuner.store\n"
            "cls = annotation.annotated_classes[Update]\n"
            "from sqlalchemy import update; from nbx_tune.tuner.store.models import Seat\n"
            "assert '_traverse_internals' in cls.__dict__\n"
            "assert update(Seat)._annotate({'x': 1})._generate_cache_key() is not None\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-600:]

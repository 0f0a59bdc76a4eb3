"""A claim's lease: renewed from the moment the seat is claimed, and the only licence to
write the seat's result. A worker that stalls past its lease and loses the seat to another
worker writes nothing when it wakes: each seat is certified once."""

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from conftest import db_count

from nbx_tune.profiles import get_profile
from nbx_tune.tuner.fleet import seat_tuner as runner
from nbx_tune.tuner.fleet.seat_tuner import SeatTuner
from nbx_tune.tuner.store import Store
from nbx_tune.tuner.certify.tune import NullReporter

from nbx_tune.bench import fleet_sim  # noqa: E402  (its seat mix and fake benchmarker)

DEVICE = SimpleNamespace(name="SimGPU", target="cuda:90", driver="sim")


def _queue(store, n):
    profile = get_profile(fleet_sim.PROFILE)
    seats = fleet_sim.seat_mix(n, 1.0, profile)
    ids = fleet_sim.enqueue(store, seats)
    sleeper = fleet_sim.Sleeper({b: 0.0 for _, _, _, b, *_ in seats},
                                {b: (c, ms) for _, _, _, b, _, _, _, c, ms in seats}, 1.0)
    rows = [(ids[b], k, f"{k}|{d}|{f}|{b}") for k, d, f, b, *_ in seats]
    return profile, sleeper, rows


def test_a_worker_that_lost_its_lease_writes_nothing(any_db, monkeypatch):
    store = Store(any_db)
    try:
        profile, sleeper, [(sid, kernel, label), (sid2, kernel2, label2)] = _queue(store, 2)
        a = SeatTuner(store, profile, DEVICE, None, None, holder="hostA:1", claim_ttl=0.3)
        b = SeatTuner(store, profile, DEVICE, None, None, holder="hostB:1", claim_ttl=60)
        # hostA stalls whole (its heartbeat too) past its lease while tuning; hostB takes
        # the seat meanwhile and certifies it.
        monkeypatch.setattr(runner._Heartbeat, "_beat", lambda self: None)

        stalls = [label, label2]  # hostA's tunings, in order (hostB's is not stalled)

        def stalled(spec, profile, label_, *rest, **kw):
            if stalls and label_ == stalls[0]:
                stalls.pop(0)
                time.sleep(0.6)  # past hostA's lease
                if label_ == label:  # hostB takes the seat meanwhile and certifies it
                    assert store.claim(sid, "hostB:1", 60)
                    assert b.tune_claimed(sid, kernel, label, 0, 1, None, NullReporter()) == "tuned"
                # seat 2: nobody took it, so it is still hostA's to write
            return sleeper(spec, profile, label_, *rest, **kw)

        monkeypatch.setattr(runner, "tune_seat", stalled)
        assert store.claim(sid, "hostA:1", 0.3)
        assert a.tune_claimed(sid, kernel, label, 0, 2, None, NullReporter()) is None
        assert a.leases_lost == [label]
        assert db_count(any_db, "tunings", f"WHERE seat_id = {sid}") == 1
        assert db_count(any_db, "tunings", f"WHERE seat_id = {sid} AND worker = 'hostB:1'") == 1
        assert db_count(any_db, "certified_configs", f"WHERE seat_id = {sid}") == 1
        assert db_count(any_db, "seats", "WHERE claimed_by IS NOT NULL") == 0

        assert store.claim(sid2, "hostA:1", 0.3)
        assert a.tune_claimed(sid2, kernel2, label2, 1, 2, None, NullReporter()) == "tuned"
        assert a.leases_lost == [label]
        assert db_count(any_db, "certified_configs", f"WHERE seat_id = {sid2}") == 1
    finally:
        store.close()


def test_the_lease_is_renewed_from_the_claim_through_the_seat_s_reads(any_db, monkeypatch):
    store = Store(any_db)
    try:
        profile, sleeper, [(sid, kernel, label)] = _queue(store, 1)
        a = SeatTuner(store, profile, DEVICE, None, None, holder="hostA:1", claim_ttl=1.0)
        monkeypatch.setattr(runner, "tune_seat", sleeper)
        slow = runner.seat_search.for_seat

        def slow_reads(*args, **kw):  # the seat's reads outlast its lease
            time.sleep(2.5)
            return slow(*args, **kw)

        monkeypatch.setattr(runner.seat_search, "for_seat", slow_reads)
        assert store.claim(sid, "hostA:1", 1.0)
        out = {}
        t = threading.Thread(target=lambda: out.update(action=a.tune_claimed(sid, kernel, label, 0, 1, None, NullReporter())))
        t.start()
        time.sleep(2.0)
        taken = store.claim(sid, "hostB:1", 60)
        t.join()
        assert not taken  # hostA is alive and beating: its seat is not free
        assert out["action"] == "tuned" and a.leases_lost == []
        assert db_count(any_db, "tunings") == 1 == db_count(any_db, "certified_configs")
    finally:
        store.close()

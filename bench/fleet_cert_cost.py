"""What one certificate costs the fleet's own code: one worker on a PostgreSQL queue, its
tuning faked with no sleep (bench/fleet_sim.py's benchmarker), through the fleet's path
(claim -> `SeatTuner.tune_claimed`: the seat's reads, its search planning -> the write).
Prints transactions, statements and the worker's CPU per certificate, and per heartbeat
(`extend_claim` on a connection idle past the ping threshold, as a beat's always is); with
--ref, the same for the code at a git ref (exported to a temporary directory), side by side.

    python3 bench/fleet_cert_cost.py --seats 400 --certs 300 --ref main

The code before the server-ordered claim has no `claim_untuned`: there the worker lists
the queue once and claims from its list (`claim_next`), as its `run_worker` did.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PROFILE = "hopper"


def measure(db: str, n_seats: int, n_certs: int) -> dict:
    from types import SimpleNamespace

    from sqlalchemy import event, text

    from nbx_tune.bench import fleet_sim
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.certify.tune import NullReporter
    from nbx_tune.tuner.fleet import seat_tuner as runner
    from nbx_tune.tuner.store import Store

    url = fleet_sim.fresh_db(db)
    try:
        store, profile = Store(url), get_profile(PROFILE)
        seats = fleet_sim.seat_mix(n_seats, 60.0, profile)
        fleet_sim.enqueue(store, seats)
        if hasattr(runner, "queue_cost"):  # as census --enqueue does
            store.fill_queue_costs(PROFILE, runner.queue_cost(profile))
        runner.tune_seat = fleet_sim.Sleeper({x[3]: 0.0 for x in seats}, {x[3]: (x[7], x[8]) for x in seats}, 0.0)
        tuner = runner.SeatTuner(store, profile, SimpleNamespace(name="SimGPU", target="cuda:90", driver="sim"),
                                 None, None, holder="w:1")
        claim = getattr(tuner, "claim_untuned", None)
        if claim is None:  # the code before: list once, claim from the list
            mark, listed, gone = store.last_tuning_id(), tuner.needing_work(), set()
            labels = {sid: (k, label) for sid, k, label in listed}

            def claim():
                sid = store.claim_next([t[0] for t in listed if t[0] not in gone], tuner.holder, tuner.claim_ttl,
                                       since_tuning=mark, finished=gone, held={})
                gone.add(sid)
                return (sid, *labels[sid])
        for _ in range(10):  # warm: the registry, source hashes, the shipped table
            tuner.tune_claimed(*claim(), 0, 1, None, NullReporter())
        stmts = []
        event.listen(store.engine, "before_cursor_execute", lambda *a: stmts.append(1))
        stat = text("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        with store.engine.connect() as c:
            x0 = c.execute(stat).scalar()
        del stmts[:]
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n_certs):
            tuner.tune_claimed(*claim(), 0, 1, None, NullReporter())
        cpu, wall, n_stmts = time.process_time() - c0, time.perf_counter() - t0, len(stmts)
        time.sleep(1.0)  # PostgreSQL publishes a backend's transaction counts within a second
        with store.engine.connect() as c:
            x1 = c.execute(stat).scalar()
        beat = measure_beats(store, claim(), tuner.holder, n_beats=200)
        store.close()
        return {"certs": n_certs, "tx_per_cert": (x1 - x0 - 1) / n_certs, "stmts_per_cert": n_stmts / n_certs,
                "cpu_ms_per_cert": 1000 * cpu / n_certs, "wall_ms_per_cert": 1000 * wall / n_certs, **beat}
    finally:
        fleet_sim.drop_db(db, url)


def measure_beats(store, claimed, holder: str, n_beats: int) -> dict:
    """A heartbeat's cost: `extend_claim` on a held seat, its connection taken as a real beat
    finds it (idle a quarter lease, past the pool's ping threshold)."""
    from sqlalchemy import text

    from nbx_tune.tuner.store import db

    if hasattr(db, "PING_IDLE_S"):
        db.PING_IDLE_S = -1.0  # every checkout counts as idle, as a beat's always is
    stat = text("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
    with store.engine.connect() as c:
        x0 = c.execute(stat).scalar()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n_beats):
        assert store.extend_claim(claimed[0], holder, 60.0)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    time.sleep(1.0)
    with store.engine.connect() as c:
        x1 = c.execute(stat).scalar()
    return {"tx_per_beat": (x1 - x0 - 1) / n_beats, "cpu_ms_per_beat": 1000 * cpu / n_beats,
            "wall_ms_per_beat": 1000 * wall / n_beats}


def run_child(pythonpath: str, args) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--db", args.db, "--seats",
                          str(args.seats), "--certs", str(args.certs)], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"fleet_cert_cost: the run under {pythonpath} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=os.environ.get("NBX_TUNE_TEST_PG"),
                    help="a PostgreSQL URL whose role may CREATE DATABASE (default $NBX_TUNE_TEST_PG)")
    ap.add_argument("--seats", type=int, default=400)
    ap.add_argument("--certs", type=int, default=300)
    ap.add_argument("--ref", help="also measure the code at this git ref, side by side")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.db or not args.db.startswith("postgresql"):
        print("fleet_cert_cost: --db (or NBX_TUNE_TEST_PG) must name a PostgreSQL database", file=sys.stderr)
        return 2
    if args.child:
        print(json.dumps(measure(args.db, args.seats, args.certs)))
        return 0
    import nbx_tune

    here = os.path.dirname(os.path.dirname(os.path.abspath(nbx_tune.__file__)))
    rows = {"this code": run_child(here, args)}
    if args.ref:
        repo = os.path.dirname(os.path.abspath(nbx_tune.__file__))
        with tempfile.TemporaryDirectory(prefix="fleet_cert_cost-") as tmp:
            os.mkdir(os.path.join(tmp, "nbx_tune"))
            archive = subprocess.run(["git", "-C", repo, "archive", args.ref], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", os.path.join(tmp, "nbx_tune")], input=archive.stdout, check=True)
            rows = {args.ref: run_child(tmp, args), **rows}
    keys = ["tx_per_cert", "stmts_per_cert", "cpu_ms_per_cert", "wall_ms_per_cert", "tx_per_beat",
            "cpu_ms_per_beat", "wall_ms_per_beat"]
    print(f"{'code':>12} " + " ".join(f"{k:>16}" for k in keys))
    for name, r in rows.items():
        print(f"{name:>12} " + " ".join(f"{r[k]:16.2f}" for k in keys))
    if args.ref:
        a, b = rows[args.ref], rows["this code"]
        print(f"{'ratio':>12} " + " ".join(f"{a[k] / b[k]:15.2f}x" for k in keys))
    if os.environ.get("OUT"):
        from nbx_tune.testing.bench import out_dir

        (out_dir() / "fleet_cert_cost.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The fleet's queue at scale, simulated on one machine against a real PostgreSQL.

N simulated workers run the fleet's own loop (`fleet.run_worker` ->
`SeatTuner.tune_claimed` -> `Store.write_result`) on M seats enqueued from the shipped
table's seat mix. The workers are dealt to --hosts host processes (threads there, each
worker with its own Store and a pool of --pool connections, as a worker process has); only
the tuning is faked: a benchmarker that sleeps the seat's duration and returns a
certificate. One extra worker "on another host" claims a seat and stops beating, to time
how long its seat waits.

Seat durations: the shipped table (kernels/tables/hopper.json) records no tuning time, so
each seat's duration is the fleet's own estimate of its tuning time (`runner.seat_cost` at
the entry's largest screened shape), scaled so the mean seat takes --mean-seat-s seconds
of GPU time, and slept for --scale of that (or the scale --wall picks: the one whose ideal
wall time is --wall seconds). The queue's overhead per certificate ("q s/seat") is the
workers' time outside the sleep, plus the heartbeats' round trips, plus the server's CPU;
"queue %" sets it against the scaled sleep, "q % 1x" against the unscaled mean seat.

    python3 bench/fleet_sim.py --db postgresql+psycopg://nbx:nbx@127.0.0.1:5432/nbx_test \\
        --workers 10 50 --seats 2000 --pool 1          # each pair in its own fresh database

    python3 bench/fleet_sim.py --workers 1000 --seats 2000 --wall 60 --hosts 16 --lease 30 \\
        --pooler postgresql+psycopg://nbx:nbx@127.0.0.1:6433   # through PgBouncer (transaction mode)

    python3 bench/fleet_sim.py --workers 1000 --seats 100000 --wall 2500 --stop-after 480 ...
        # a queue too long to finish here: no claim after 480 s, each seat certified at most once

PgBouncer for it: `[databases] * = host=127.0.0.1 port=5432 user=nbx password=nbx`,
`pool_mode = transaction`, `auth_type = any`, `max_client_conn = 5000`,
`default_pool_size = 20`, started with `ulimit -n 20000`. Prints one row per
(workers, seats); writes fleet_sim.json under $OUT when set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from datetime import timezone
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlalchemy.orm import sessionmaker  # noqa: E402

PROFILE = "hopper"
DEAD = "deadhost:1:gpu0"  # another host's worker: only its lease can free its seat


def seat_mix(n: int, mean_s: float, profile):
    """n seats drawn round-robin from the shipped table: (kernel, dtypes, flags, bucket,
    problem JSON, duration s). Buckets get a '#i' suffix so each copy is its own seat."""
    from nbx_tune.kernels.runtime.registry import all_specs
    from nbx_tune.kernels.spec import Problem
    from nbx_tune.tuner.fleet.seat_tuner import seat_cost

    table = json.load(open(os.path.join(os.path.dirname(__file__), "..", "kernels", "tables", f"{PROFILE}.json")))
    specs = all_specs()
    base = []
    for e in table["entries"]:
        spec = specs.get(e["kernel"])
        if spec is None:
            continue
        p = Problem.from_json(json.dumps(e["screened_max"]))
        base.append((e, p.to_json(), p.volume, seat_cost(spec, [p], profile), e["config"], e["median_ms"]))
    mean_cost = statistics.fmean(b[3] for b in base)
    out = []
    for i in range(n):
        e, pj, vol, cost, cfg, ms = base[i % len(base)]
        out.append((e["kernel"], e["dtypes"], e["flags"], f"{e['bucket']}#{i}", pj, vol,
                    mean_s * cost / mean_cost, cfg, ms))
    return out


def fresh_db(admin_url: str) -> str:
    name = f"nbx_sim_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def drop_db(admin_url: str, url: str) -> None:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
    admin.dispose()


def enqueue(store, seats) -> dict:
    """Seats and their shapes, as a census's --enqueue records them (one transaction)."""
    from nbx_tune.tuner.store import insert_ignore_many
    from nbx_tune.tuner.store.models import Seat, SeatShape, utcnow
    from sqlalchemy import select

    with store.session() as s:
        insert_ignore_many(s, Seat, [{"profile": PROFILE, "kernel": k, "dtypes": d, "flags": f, "bucket": b,
                                      "created_at": utcnow()} for k, d, f, b, *_ in seats],
                           ("profile", "kernel", "dtypes", "flags", "bucket"))
        ids = {b: i for i, b in s.execute(select(Seat.id, Seat.bucket).where(Seat.profile == PROFILE))}
        insert_ignore_many(s, SeatShape, [{"seat_id": ids[b], "problem": pj, "volume": v}
                                          for _, _, _, b, pj, v, *_ in seats], ("seat_id", "problem"))
    return ids


class Sleeper:
    """The fake benchmarker: `tune_seat`'s stand-in, sleeping the seat's scaled duration and
    returning a certificate of the table's config."""

    def __init__(self, durations: dict, configs: dict, scale: float):
        self.durations, self.configs, self.scale = durations, configs, scale
        self.slept = 0.0
        self.lock = threading.Lock()

    def __call__(self, spec, profile, label, problems, executor, strategy, device, reporter, search=None):
        from nbx_tune.kernels.spec import Config
        from nbx_tune.tuner.timing.benchmarkers import Timing
        from nbx_tune.tuner.certify.tune import CandidateRecord, SeatResult

        bucket = label.split("|")[3]
        d = self.durations[bucket] * self.scale
        t0 = time.perf_counter()
        time.sleep(d)
        dt = time.perf_counter() - t0
        with self.lock:
            self.slept += dt
        cfg, ms = self.configs[bucket]
        from nbx_tune.tuner.certify.screen import ScreenResult

        w = CandidateRecord(Config.parse(cfg), timing=Timing(ms, ms, ms, "sim"), final=True,
                            screens=[ScreenResult(p, 0.0, 1e-3) for p in problems])
        return SeatResult("certified", [w], winner=w, screened=tuple(problems), total_s=dt, bench_s=dt)


class ClaimClock:
    """Wraps a Store method (claim_next, extend_claim) to record each call's latency."""

    def __init__(self):
        self.lat, self.lock = [], threading.Lock()

    def install(self, store_cls, name="claim_next"):
        orig = getattr(store_cls, name)
        clock = self

        def timed(self_, *a, **kw):
            t0 = time.perf_counter()
            try:
                return orig(self_, *a, **kw)
            finally:
                with clock.lock:
                    clock.lat.append(time.perf_counter() - t0)
        setattr(store_cls, name, timed)
        return lambda: setattr(store_cls, name, orig)


def db_cpu_s(conn) -> float:
    """CPU seconds of the PostgreSQL server so far: the postmaster's finished children and
    its live ones (Linux /proc, loopback server only)."""
    pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
    ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    tick = os.sysconf("SC_CLK_TCK")
    f = open(f"/proc/{ppid}/stat").read().rsplit(")", 1)[1].split()
    total = sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                g = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(g[1]) == ppid:
                total += int(g[11]) + int(g[12])
    return total / tick


def _host_store(url: str, args):
    """A simulated worker's Store: its own connection pool (at most --pool connections),
    straight to the server or through the pooler."""
    from nbx_tune.tuner.store import Store
    from nbx_tune.tuner.store.db import ping_when_idle

    via, extra = url, {}
    if args["pooler"]:  # the hosts reach the database through a pooler (PgBouncer, transaction mode)
        p = make_url(args["pooler"])
        via = make_url(url).set(host=p.host, port=p.port).render_as_string(hide_password=False)
        extra = {"connect_args": {"prepare_threshold": None}}  # no server-side prepared statements
    st = Store.__new__(Store)  # the schema was checked once, by the run's own Store
    st.url = url
    st.engine = create_engine(via, pool_size=args["pool"], max_overflow=0, pool_timeout=600, **extra)
    ping_when_idle(st.engine)  # as Store's own engine
    st._sessions = sessionmaker(st.engine, expire_on_commit=False)
    return st


def host_main(index: int, url: str, workers: list, args: dict, durations: dict, configs: dict,
              ready, go, out_path: str) -> None:
    """One simulated host, in a process of its own: its workers (threads sharing the host's
    pool) run the fleet's loop until the queue is empty; what they measured goes to out_path."""
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.fleet import workers as fleet, seat_tuner as runner
    from nbx_tune.tuner.fleet.seat_tuner import SeatTuner
    from nbx_tune.tuner.store import Store

    profile = get_profile(PROFILE)
    # Each worker its own Store and connection pool, as a worker process has on a real host
    # (its loop and its heartbeat each take a connection); hosts of many workers need the
    # pooler in front of the server.
    stores = {i: _host_store(url, args) for i in workers}
    sleeper = Sleeper(durations, configs, args["scale"])
    clocks = {name: ClaimClock() for name in ("claim_untuned", "claim_next", "extend_claim", "write_result")}
    for name, clock in clocks.items():
        clock.install(Store, name)
    runner.tune_seat = sleeper
    device = SimpleNamespace(name="SimGPU", target="cuda:90", driver="sim")
    reports, errors = [], []

    profs = []

    def work(i):
        tuner = SeatTuner(stores[i], profile, device, None, None, holder=f"simhost{index}:{i}:gpu{i}",
                          claim_ttl=args["lease"])
        if args["stop_after"]:  # a run cut short: past the deadline no seat is free, none held
            claim, held = tuner.claim_untuned, tuner.untuned_held
            tuner.claim_untuned = lambda: None if time.time() > deadline else claim()
            tuner.untuned_held = lambda: None if time.time() > deadline else held()
        try:
            if os.environ.get("FLEET_SIM_PROFILE"):  # where a host's CPU goes (a study's switch)
                import cProfile

                profs.append(cProfile.Profile())
                reports.append(profs[-1].runcall(fleet.run_worker, tuner))
            else:
                reports.append(fleet.run_worker(tuner))
        except BaseException as e:  # noqa: BLE001 (reported, and fails the run's checks)
            import traceback
            errors.append(f"{tuner.holder}: {type(e).__name__}: {e}" + (traceback.format_exc() if args["debug"] else ""))

    # What a worker process works out once (the registry, each kernel's source hash, the
    # shipped table its searches seed from), done before the clock starts: the run measures
    # the queue, not a process's start (a real worker does hundreds of seats after it).
    from nbx_tune.kernels.runtime.registry import all_specs
    from nbx_tune.tuner.certify import provenance
    from nbx_tune.tuner.search.seat_search import shipped

    for spec in all_specs().values():
        provenance.current(spec, profile, device)
    shipped(PROFILE)
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in workers]
    ready.release()
    go.wait()
    cpu0, t_go = sum(os.times()[:2]), time.perf_counter()
    deadline = time.time() + (args["stop_after"] or 0)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for st in stores.values():
        st.close()
    if profs:
        import pstats

        pstats.Stats(*profs).dump_stats(os.path.join(os.environ["FLEET_SIM_PROFILE"], f"host{index}.prof"))
    json.dump({"claims": clocks["claim_untuned"].lat + clocks["claim_next"].lat, "beats": clocks["extend_claim"].lat,
               "writes": clocks["write_result"].lat, "slept": sleeper.slept,
               "busy": [r.seconds for r in reports], "per": [len(r.tuned) for r in reports], "tuned": sum(len(r.tuned) for r in reports),
               "lost": sum(len(r.lost) for r in reports), "errors": errors,
               "cpu_s": sum(os.times()[:2]) - cpu0, "span_s": time.perf_counter() - t_go}, open(out_path, "w"))


def run_one(url: str, workers: int, n_seats: int, args) -> dict:
    import multiprocessing as mp
    import tempfile

    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.fleet.seat_tuner import SeatTuner, queue_cost
    from nbx_tune.tuner.store import Store

    profile = get_profile(PROFILE)
    seats = seat_mix(n_seats, args.mean_seat_s, profile)
    admin = Store(url)
    t_enq = time.perf_counter()
    enqueue(admin, seats)
    admin.fill_queue_costs(PROFILE, queue_cost(profile))  # as census --enqueue does: no worker costs a seat
    enqueue_s = time.perf_counter() - t_enq
    durations = {b: d for _, _, _, b, _, _, d, _, _ in seats}
    configs = {b: (c, ms) for _, _, _, b, _, _, _, c, ms in seats}
    n_hosts = min(workers, args.hosts)
    ctx = mp.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    tmp = tempfile.mkdtemp(prefix="fleet_sim-")
    hargs = {"pooler": args.pooler, "pool": args.pool, "scale": args.scale, "lease": args.lease,
             "debug": args.debug, "stop_after": args.stop_after}
    procs = []
    for h in range(n_hosts):  # workers dealt round-robin to the hosts
        mine = list(range(h, workers, n_hosts))
        p = ctx.Process(target=host_main, args=(h, url, mine, hargs, durations, configs, ready, go,
                                                os.path.join(tmp, f"host{h}.json")), daemon=True)
        p.start()
        procs.append(p)
    for _ in procs:  # every host imported and connected before the clock starts
        ready.acquire()
    mon = create_engine(url, isolation_level="AUTOCOMMIT")
    mc = mon.connect()
    db = make_url(url).database
    stat = text("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = :d")
    x0 = mc.execute(stat, {"d": db}).scalar()
    cpu0 = db_cpu_s(mc)
    peak = {"conns": 0}
    stop = threading.Event()

    def watch():
        while not stop.wait(0.5):
            n = mc.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d"), {"d": db}).scalar()
            peak["conns"] = max(peak["conns"], n - 1)

    death = {}

    def killed():
        """A worker on another host that claims the first free seat after a while and dies."""
        time.sleep(args.kill_after)
        tuner = SeatTuner(admin, profile, SimpleNamespace(name="SimGPU", target="cuda:90", driver="sim"), None,
                          None, holder=DEAD, claim_ttl=args.lease)
        got = tuner.claim_untuned()
        death.update(seat=got and got[0], at=time.time())

    watcher = threading.Thread(target=watch, daemon=True)
    killer = threading.Thread(target=killed, daemon=True)
    t0 = time.perf_counter()
    go.set()
    watcher.start()
    killer.start()
    for p in procs:
        p.join()
    killer.join()
    wall = time.perf_counter() - t0
    stop.set()
    watcher.join()
    time.sleep(1.0)  # PostgreSQL publishes a backend's transaction counts within a second
    cpu = db_cpu_s(mc) - cpu0
    x1 = mc.execute(stat, {"d": db}).scalar()
    hosts = []
    for h in range(n_hosts):
        try:
            hosts.append(json.load(open(os.path.join(tmp, f"host{h}.json"))))
        except (OSError, ValueError):
            hosts.append({"claims": [], "beats": [], "writes": [], "slept": 0.0, "busy": [], "tuned": 0,
                          "per": [], "lost": 0, "errors": [f"host {h} died (exit code {procs[h].exitcode})"], "cpu_s": 0.0})
    q = lambda sql: mc.execute(text(sql)).scalar()  # noqa: E731
    n_tunings = q("SELECT count(*) FROM tunings")
    n_seats_tuned = q("SELECT count(DISTINCT seat_id) FROM tunings")
    twice = q("SELECT count(*) FROM (SELECT seat_id FROM tunings GROUP BY seat_id HAVING count(*) > 1) t")
    n_certs = q("SELECT count(*) FROM certified_configs")
    held = q("SELECT count(*) FROM seats WHERE claimed_by IS NOT NULL"
             + (f" AND claimed_by <> '{DEAD}'" if args.stop_after else ""))  # cut short: the dead one's may wait
    # Each worker's span from its first seat's start to its last seat's write: its time
    # between seats (claims, reads, writes), without its start-up or its wait at the end.
    spans = sum(r[0] for r in mc.execute(text(
        "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM tunings GROUP BY worker")))
    reclaim = None
    if death.get("seat") is not None:
        started = mc.execute(text("SELECT started_at FROM tunings WHERE seat_id = :s"), {"s": death["seat"]}).scalar()
        if started is not None:
            reclaim = started.astimezone(timezone.utc).timestamp() - death["at"]
    mc.close()
    mon.dispose()
    admin.close()
    lat = sorted(x for h in hosts for x in h["claims"])
    beats = [x for h in hosts for x in h["beats"]]
    writes = sorted(x for h in hosts for x in h["writes"])
    slept = sum(h["slept"] for h in hosts)
    busy = sum(sum(h["busy"]) for h in hosts)
    certs = max(1, n_certs)
    pct = lambda xs, f: round(1000 * xs[min(len(xs) - 1, int(f * len(xs)))], 2) if xs else None  # noqa: E731
    # The queue's time per certificate: what a worker spends outside its (scaled) sleep
    # (listing, claiming, the seat's reads and search planning, writing), the heartbeats'
    # round trips (on their own thread, counted anyway) and the server's CPU, against the
    # seat's tuning time: the scaled sleep (what this run's load is) and the unscaled seat.
    worker_q = (busy - slept) / certs
    queue_s = worker_q + sum(beats) / certs + cpu / certs
    mean_sleep = slept / certs
    return {
        "workers": workers, "seats": n_seats, "hosts": n_hosts, "pool_per_host": args.pool,
        "pooler": bool(args.pooler),
        "scale": args.scale, "mean_seat_s": args.mean_seat_s, "lease_s": args.lease,
        "wall_s": round(wall, 2), "enqueue_s": round(enqueue_s, 2), "seats_per_s": round(n_certs / wall, 1),
        "offered_seats_per_s": round(workers / max(mean_sleep, 1e-9), 1),
        "claim_p50_ms": pct(lat, 0.5), "claim_p99_ms": pct(lat, 0.99), "claims": len(lat),
        "write_p50_ms": pct(writes, 0.5), "write_p99_ms": pct(writes, 0.99),
        "tx_per_cert": round((x1 - x0) / certs, 1),
        "db_cpu_s": round(cpu, 1), "db_cpu_ms_per_cert": round(1000 * cpu / certs, 2),
        "sim_cpu_ms_per_cert": round(1000 * sum(h["cpu_s"] for h in hosts) / certs, 1),
        "db_conns_peak": peak["conns"],
        "slept_s": round(slept, 1), "worker_s": round(busy, 1),
        "queue_s_per_seat": round(queue_s, 4), "worker_q_s_per_seat": round(worker_q, 4),
        "between_s_per_seat": round((float(spans) - slept) / certs, 4),
        "queue_overhead_pct": round(100 * queue_s / max(mean_sleep, 1e-9), 2),
        "queue_pct_unscaled": round(100 * queue_s / args.mean_seat_s, 3),
        "ideal_wall_s": round(slept / workers, 1),
        "heartbeats_per_s": round(len(beats) / wall, 1), "leases_lost": sum(h["lost"] for h in hosts),
        "tunings": n_tunings, "seats_tuned": n_seats_tuned, "tuned_twice": twice, "certified": n_certs,
        "left_held": held, "partial": bool(args.stop_after),
        # Cut short (--stop-after): each seat certified at most once, none left held.
        "exactly_once": n_tunings == n_seats_tuned == n_certs and twice == 0 and (
            bool(args.stop_after) or n_certs == n_seats),
        "no_lost_seat": (bool(args.stop_after) or n_certs == n_seats) and held == 0, "dead_seat": death.get("seat"),
        "reclaim_s": round(reclaim, 2) if reclaim is not None else None,
        "errors": [e for h in hosts for e in h["errors"]][:5],
        "host_span_s": [round(h.get("span_s", 0), 1) for h in hosts],
        "seats_per_worker_min_max": [min(x for h in hosts for x in h["per"]), max(x for h in hosts for x in h["per"])]
        if any(h["per"] for h in hosts) else None,
    }


COLS = [("workers", 7), ("seats", 7), ("hosts", 5), ("seats_per_s", 8), ("offered_seats_per_s", 8),
        ("claim_p50_ms", 9), ("claim_p99_ms", 9), ("write_p50_ms", 9), ("tx_per_cert", 7),
        ("db_cpu_ms_per_cert", 8), ("sim_cpu_ms_per_cert", 8), ("db_conns_peak", 5), ("heartbeats_per_s", 6),
        ("queue_s_per_seat", 8), ("between_s_per_seat", 8), ("queue_overhead_pct", 8), ("queue_pct_unscaled", 7), ("leases_lost", 5),
        ("exactly_once", 5), ("no_lost_seat", 6), ("reclaim_s", 7), ("wall_s", 7), ("ideal_wall_s", 6)]
HEADS = ["workers", "seats", "hosts", "seats/s", "offered", "claim p50", "claim p99", "write p50", "tx/cert",
         "dbCPUms", "simCPUms", "conns", "hb/s", "q s/seat", "btw s", "queue %", "q % 1x", "lost", "once", "nolost",
         "reclaim", "wall s", "ideal"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=os.environ.get("NBX_TUNE_TEST_PG"),
                    help="a PostgreSQL URL whose role may CREATE DATABASE (default $NBX_TUNE_TEST_PG)")
    ap.add_argument("--workers", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--seats", type=int, nargs="+", default=[2000])
    ap.add_argument("--scale", type=float, default=0.02, help="slept / simulated tuning time")
    ap.add_argument("--wall", type=float, help="instead of --scale: the scale that makes each run's ideal wall "
                    "time (seats x mean seat x scale / workers) this many seconds")
    ap.add_argument("--mean-seat-s", type=float, default=60.0, help="simulated GPU seconds of the mean seat")
    ap.add_argument("--lease", type=float, default=5.0, help="claim lease, s (the CLI's default is 120)")
    ap.add_argument("--hosts", type=int, default=8, help="simulated hosts: processes of their own, the "
                    "workers dealt among them (threads sharing the host's connection pool)")
    ap.add_argument("--pool", type=int, default=2, help="connections per simulated worker (its loop and its "
                    "heartbeat); above ~40 workers, use --pooler: the server's max_connections is 100")
    ap.add_argument("--pooler", help="the workers connect through this pooler's host:port (PgBouncer in "
                    "transaction mode, its databases entry '* = host=... port=...'), e.g. "
                    "postgresql+psycopg://nbx:nbx@127.0.0.1:6432")
    ap.add_argument("--kill-after", type=float, default=1.0, help="s before the killed worker claims its seat")
    ap.add_argument("--stop-after", type=float, help="cut each run short: no seat is claimed after this many "
                    "seconds (the seats in flight finish); checks each seat certified at most once, none held")
    ap.add_argument("--keep", action="store_true", help="keep each run's database")
    ap.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.db or not args.db.startswith("postgresql"):
        print("fleet_sim: --db (or NBX_TUNE_TEST_PG) must name a PostgreSQL database", file=sys.stderr)
        return 2
    rows = []
    print(" ".join(h.rjust(w) for h, (_, w) in zip(HEADS, COLS)), flush=True)
    for n_seats in args.seats:
        for workers in args.workers:
            url = fresh_db(args.db)
            if args.wall:  # the offered load: workers / (mean seat x scale) seats a second
                args.scale = args.wall * workers / (n_seats * args.mean_seat_s)
            try:
                r = run_one(url, workers, n_seats, args)
            finally:
                if not args.keep:
                    drop_db(args.db, url)
            rows.append(r)
            print(" ".join(str(r[k]).rjust(w) for k, w in COLS), flush=True)
            for e in r["errors"]:
                print("  error:", e, flush=True)
    if os.environ.get("OUT"):
        from nbx_tune.testing.bench import out_dir

        (out_dir() / "fleet_sim.json").write_text(json.dumps({"rows": rows}, indent=1))
    return 0 if all(r["exactly_once"] and r["no_lost_seat"] and not r["errors"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""A tuning fleet on one database, on SQLite and on a real PostgreSQL server: censuses
enqueue, several workers tune every seat exactly once, a worker killed mid-seat loses its
lease and another finishes the seat."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import db_count

from nbx_tune.tuner import commands as api

HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"
# Eight matmul seats (M is bucketed one by one below 64), about a second each here.
SEATS = "".join(f"aten.mm\tfloat32,float32\t{m}x16;16x24\t\t1\n" for m in range(17, 25))


def cli(*args, env=None, **kw):
    e = {**os.environ, "TRITON_INTERPRET": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "nbx_tune.cli.app", *args], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def enqueue(tmp_path, url):
    t = tmp_path / "t.tsv"
    t.write_text(HEAD + SEATS)
    rep = api.census(str(t), url, enqueue=True)
    assert rep.counts()["pending"]["seats"] == 8
    assert db_count(url, "tunings") == 0  # planned, not tuned
    return t


@pytest.mark.slow
def test_several_workers_on_one_queue_tune_every_seat_once(tmp_path, any_db):
    enqueue(tmp_path, any_db)
    p = cli("worker", "--db", any_db, "--gpus", "0,0,0", "--no-isolate", "--json")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    reports = [json.loads(block) for block in _json_objects(out)]
    assert len(reports) == 3
    assert sum(len(r["tuned"]) for r in reports) == 8
    assert db_count(any_db, "tunings") == 8
    assert db_count(any_db, "(SELECT DISTINCT seat_id FROM tunings) AS t") == 8
    assert db_count(any_db, "certified_configs") == 8
    assert db_count(any_db, "seats", "WHERE claimed_by IS NOT NULL") == 0
    holders = {w for r in reports for w in [r["holder"]] if r["tuned"]}
    assert len(holders) >= 2  # the queue was shared, not drained by one worker
    assert all(r["holder"].endswith(":gpu0") for r in reports)


@pytest.mark.slow
def test_a_worker_killed_mid_seat_loses_its_lease_and_another_finishes(tmp_path, any_db):
    enqueue(tmp_path, any_db)
    # A worker on "another host" (its death cannot be seen from here): only its lease ends.
    a = cli("worker", "--db", any_db, "--no-isolate", "--lease", "4", env={"NBX_TUNE_WORKER_ID": "hostA:1"})
    deadline = time.time() + 120
    while db_count(any_db, "seats", "WHERE claimed_by = 'hostA:1'") == 0:
        assert time.time() < deadline and a.poll() is None
        time.sleep(0.05)
    a.send_signal(signal.SIGKILL)
    a.wait()
    held = db_count(any_db, "seats", "WHERE claimed_by = 'hostA:1'")
    done_by_a = db_count(any_db, "tunings", "WHERE worker = 'hostA:1'")
    assert held == 1  # killed mid-seat, holding one claim
    t0 = time.time()
    b = cli("worker", "--db", any_db, "--no-isolate", "--json", env={"NBX_TUNE_WORKER_ID": "hostB:2"})
    out, err = b.communicate(timeout=600)
    assert b.returncode == 0, err
    assert len(json.loads(out)["tuned"]) == 8 - done_by_a
    assert time.time() - t0 >= 2  # it had to wait for the dead worker's lease
    assert db_count(any_db, "certified_configs") == 8
    assert db_count(any_db, "(SELECT DISTINCT seat_id FROM tunings) AS t") == 8
    assert db_count(any_db, "tunings") == 8  # nothing tuned twice, nothing half-written
    assert db_count(any_db, "seats", "WHERE claimed_by IS NOT NULL") == 0


def test_seats_show_who_holds_what(tmp_path, any_db):
    from nbx_tune.tuner.store import Store

    enqueue(tmp_path, any_db)
    with Store(any_db) as store:
        ids = [v.id for v in api.seat_views(any_db)]
        assert store.claim_next(ids, "hostC:7:gpu1", 60) == ids[0]
        assert store.claim_next(ids, "hostD:8:gpu0", 60) == ids[1]  # skips the held seat
        views = {v.id: v for v in api.seat_views(any_db)}
        assert views[ids[0]].claimed_by == "hostC:7:gpu1" and views[ids[2]].claimed_by is None


def test_the_launch_time_read_works_on_either_engine(tmp_path, any_db, monkeypatch):
    import torch

    from nbx_tune.kernels.runtime import certified
    from nbx_tune.kernels import mm

    t = tmp_path / "t.tsv"
    t.write_text(HEAD + "aten.mm\tfloat32,float32\t21x16;16x24\t\t1\n")
    api.census(str(t), any_db, isolate=False)
    monkeypatch.setenv("NBX_TUNE_DB", any_db)
    certified.reload()
    a, b = torch.randn(21, 16), torch.randn(16, 24)
    torch.testing.assert_close(mm(a, b), a @ b, rtol=1e-5, atol=1e-5)
    assert certified.launch_stats()["misses"] == {} and certified.launch_stats()["sources"] == ["database"]


def _json_objects(text: str):
    """Split concatenated pretty-printed JSON objects (one per worker)."""
    depth, start = 0, None
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                yield text[start:i + 1]


# ----------------------------------------------------------------------------- scaling

def test_workers_take_the_longest_seats_first(tmp_path, any_db):
    """The queue hands out seats by their estimated cost, so the last ones are short and
    no GPU idles behind a long seat at the end."""
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.fleet.seat_tuner import SeatTuner
    from nbx_tune.tuner.store import Store

    t = tmp_path / "t.tsv"
    # A tiny GEMM, a large one, and one between: planned in that order.
    t.write_text(HEAD + "aten.mm\tfloat32,float32\t17x16;16x24\t\t1\n"
                 "aten.mm\tfloat32,float32\t300x256;256x320\t\t1\n"
                 "aten.mm\tfloat32,float32\t70x64;64x96\t\t1\n")
    api.census(str(t), any_db, enqueue=True)
    store = Store(any_db)
    try:
        from types import SimpleNamespace
        tuner = SeatTuner(store, get_profile("interpreter"), SimpleNamespace(target="interpreter"), None, None, holder="h:1")
        todo = tuner.needing_work()
        ms = [int(label.split("M=")[1].split(",")[0].split("..")[-1]) for _, _, label in todo]
        assert ms == sorted(ms, reverse=True), todo
        # claim_next follows that order and skips a seat another live worker holds.
        ids = [sid for sid, _, _ in todo]
        assert store.claim(ids[0], "other:1", 60)
        assert store.claim_next(ids, "h:1", 60) == ids[1]
        assert store.claim_next(ids, "h:1", 60) == ids[1]  # its own claim, taken again
        store.release(ids[1], "h:1")
    finally:
        store.close()


def test_one_host_compiles_a_binary_once(tmp_path, monkeypatch):
    """Two workers' compile pools on one host: a job whose binary another process is
    compiling goes back to the queue once, then waits for it (a hit in Triton's cache)."""
    import fcntl

    from nbx_tune.kernels.spec import Config, Problem
    from nbx_tune.tuner.execution import precompile

    compiled = []
    monkeypatch.setattr(precompile, "_compile", lambda k, ps, c, d: compiled.append((k, c)))
    monkeypatch.setattr(precompile.tempfile, "gettempdir", lambda: str(tmp_path))
    cfg = Config((("BLOCK", 64),), 4, 2)
    p1 = Problem("k", ("float32",), (("bias", "0"),), (100,))
    p2 = Problem("k", ("float32",), (("bias", "0"),), (200,))  # another seat, the same binary
    assert precompile._lock_path("k", [p1], cfg) == precompile._lock_path("k", [p2], cfg)
    assert precompile._lock_path("k", [p1], cfg) != precompile._lock_path("k", [p1], Config((("BLOCK", 32),), 4, 2))
    assert precompile._lock_path("k", [p1], cfg) != precompile._lock_path(
        "k", [Problem("k", ("float16",), (("bias", "0"),), (100,))], cfg)

    class Q(list):
        put = list.append

    q = Q()
    with open(precompile._lock_path("k", [p2], cfg), "a+") as held:  # another pool compiling it
        fcntl.flock(held, fcntl.LOCK_EX)
        precompile._take(q, ("k", (p2,), cfg, "cuda"))
        assert compiled == [] and q == [("k", (p2,), cfg, "cuda", True)]
    precompile._take(q, q.pop())  # deferred: waits for the lock, which is free now
    assert compiled == [("k", cfg)]


def test_spawned_workers_share_the_hosts_cores(monkeypatch):
    from nbx_tune.tuner.fleet import workers as fleet
    from nbx_tune.tuner.execution import precompile

    seen = []

    class P:
        def __init__(self, argv, env):
            seen.append(env)

    monkeypatch.setattr(fleet.subprocess, "Popen", P)
    monkeypatch.setattr(fleet.os, "cpu_count", lambda: 32)
    monkeypatch.delenv(precompile.COMPILE_PROCS_ENV, raising=False)
    fleet.spawn_workers(["0", "1"], [])
    assert [e[precompile.COMPILE_PROCS_ENV] for e in seen] == ["15", "15"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in seen] == ["0", "1"]


def test_a_workers_timeline_splits_its_time():
    from nbx_tune.tuner.fleet.workers import worker_timeline

    rows = [("a", 12.0, 20.0, "H200"), ("b", 11.0, 15.0, "H200"), ("a", 21.0, 25.0, "H200"),
            ("b", 15.5, 16.0, "H200")]
    a, b = worker_timeline(rows, t_launch=10.0, t_end=30.0)
    assert (a["worker"], a["n_seats"], a["startup_s"], a["busy_s"], a["between_s"], a["idle_end_s"]) == \
        ("a", 2, 2.0, 12.0, 1.0, 5.0)
    assert (b["n_seats"], b["startup_s"], b["busy_s"], b["between_s"], b["idle_end_s"]) == (2, 1.0, 4.5, 0.5, 14.0)

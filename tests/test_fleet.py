"""A tuning fleet on one database, on SQLite and on a real PostgreSQL server: censuses
enqueue, several workers tune every seat exactly once, a worker killed mid-seat loses its
lease and another finishes the seat."""

import json
import os
import signal
import subprocess
import sys
import time

from conftest import db_count

from nbx_tune.tuner import api

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

    from nbx_tune.kernels import certified, mm

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

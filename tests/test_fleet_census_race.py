"""Two censuses enqueueing overlapping traces at the same instant: every seat recorded once,
neither census fails (no deadlock between their transactions), each seat's shapes whole."""

import json
import threading
from pathlib import Path
from types import SimpleNamespace

from conftest import db_count

from nbx_tune.kernels.spec import Problem
from nbx_tune.tuner.store import Store


def test_two_censuses_of_overlapping_traces_enqueue_at_once(any_db):
    Store(any_db).close()  # the schema, made once
    keys = [("matmul", "float32,float32", "-", f"M={m}") for m in range(300)]
    e = json.loads((Path(__file__).resolve().parents[1] / "kernels" / "tables" / "hopper.json").read_text())["entries"][0]
    shape = Problem.from_json(json.dumps(e["screened_max"]))
    # The two traces share 200 seats, met in opposite orders.
    plans = [{k: {shape: 1} for k in keys[:250]}, {k: {shape: 2} for k in reversed(keys[50:])}]
    errors, go = [], threading.Barrier(2)

    def census(i):
        store = Store(any_db)
        try:
            go.wait()
            store.record_census(SimpleNamespace(path=f"t{i}.tsv", rows=[1], launches=1), f"sha{i}", "p", plans[i])
        except Exception as e:  # noqa: BLE001 (the test's failure)
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            store.close()

    threads = [threading.Thread(target=census, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert db_count(any_db, "seats") == 300
    assert db_count(any_db, "seat_shapes") == 300
    assert db_count(any_db, "trace_needs") == 250 + 250

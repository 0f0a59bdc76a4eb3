"""Shared by the bench scripts: where outputs go, and the header every table carries."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

from nbx_tune.tuner.timing.benchmarkers import side_by_side  # noqa: F401 (the bench scripts' import of it)

# ms each of two picks is timed in one side-by-side repeat when a bench reads one's loss
# against the other: long enough that the same binary reads close to itself
# (lab/certify_cost/pick_noise.py; BENCH_PICK_REP_MS)
PICK_REP_MS = float(os.environ.get("BENCH_PICK_REP_MS", "300"))


def out_dir(default: str = "bench_out") -> Path:
    d = Path(os.environ.get("OUT") or default)
    d.mkdir(parents=True, exist_ok=True)
    return d


def environment() -> dict:
    """Date, GPU, driver, Triton and torch: recorded beside every figure."""
    import torch
    import triton

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "python": platform.python_version(),
           "torch": torch.__version__, "triton": triton.__version__,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none"}
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.strip()
    except OSError:
        env["driver"] = "n/a"
    return env


WARM_IMPORTS = ("torch", "triton", "triton.compiler", "numpy", "sqlalchemy", "alembic", "nbx_tune.cli.app",
                "nbx_tune.tuner.census.census", "nbx_tune.tuner.fleet.seat_tuner", "nbx_tune.tuner.execution.isolation",
                "nbx_tune.tuner.execution.precompile", "nbx_tune.tuner.certify.screen", "nbx_tune.tuner.certify.recertify")


def warm_bytecode(env: dict | None = None) -> float:
    """Import, in a child, what a census's processes import (every kernel module too), and
    return its seconds. Where the bytecode cache starts empty (the device image ships torch
    without .pyc files: release/gpu_session.sh's pycache stage), the first process a bench
    times would otherwise compile it for every later one: one side of a comparison paid
    seconds the other did not (lab/history/gpu_runs/2026-12-05g/CALLS.md)."""
    import sys
    import time

    code = "; ".join(f"import {m}" for m in WARM_IMPORTS) + \
        "; import nbx_tune.kernels.runtime.registry as r; r.all_specs()"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - t0


def save(name: str, data) -> Path:
    p = out_dir() / name
    p.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    return p


def certify_recorded(run, prefix: str, interpreter: bool) -> None:
    """A census of the seats of the ops `run()` calls, recorded as a trace, into a fresh
    database that this process's launches then read (NBX_TUNE_DB)."""
    import tempfile

    from nbx_tune import record
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.tuner import commands as api

    work = Path(tempfile.mkdtemp(prefix=prefix))
    with record(work / "t.tsv"):
        run()
    db = f"sqlite:///{work / 'census.db'}"
    rep = api.census(str(work / "t.tsv"), db, profile="interpreter" if interpreter else None, isolate=not interpreter)
    print(f"census: {rep.counts()['certified']['seats']} of {len(rep.seats)} seats certified")
    os.environ["NBX_TUNE_DB"] = db
    certified.reload()


def report(name: str, header: list[str], rows: list[list], data) -> None:
    """A study's end: the environment line and the table of `rows` printed, and
    {"env", "rows": data} saved as `name` in the output folder."""
    env = environment()
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table(rows, header))
    save(name, {"env": env, "rows": data})


def table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def wall_ms(fn, rep_ms: float) -> float:
    """A `side_by_side` timer for smoke runs on the interpreter: one call's wall time (ms);
    the numbers mean nothing there, the run checks that the script works."""
    import time

    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def per_call_ms(fn, reps: int, sync) -> float:
    """Wall time of one call (ms) over `reps` back-to-back eager calls, synchronized at the
    ends: the host's launch path included, as eager serving pays it."""
    import time

    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps * 1e3


def accumulating(totals: dict, name: str, fn):
    """`fn`, adding the wall seconds each call spends in it to totals[name] (a lab probe's
    split of one phase into the parts it calls)."""
    import time

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - t0
    return timed


def epoch(value) -> float:
    """A DateTime column as read back by SQLite (text, UTC) or another database, in epoch seconds."""
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.timezone.utc)
    return value.timestamp()


def combined_trace(traces, path) -> None:
    """One trace holding the rows of several: one census certifies them all, sharing seats
    and the longest-first order (python testing/bench.py OUT.tsv A.tsv B.tsv ...)."""
    from nbx_tune.kernels.trace import read_trace, write_trace

    rows = [r for t in traces for r in read_trace(t).rows]
    write_trace(path, rows, comments=[f"rows of {', '.join(map(str, traces))}"])


if __name__ == "__main__":
    import sys

    combined_trace(sys.argv[2:], sys.argv[1])


def query(db: str, sql: str, params: dict | None = None):
    from sqlalchemy import create_engine, text

    engine = create_engine(db)
    try:
        with engine.connect() as c:
            return c.execute(text(sql), params or {}).fetchall()
    finally:
        engine.dispose()


def stale_everything(db: str) -> None:
    """What a kernel source change does to every certificate: its tuning's hash no longer matches."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db)
    with engine.begin() as c:
        c.execute(text("UPDATE tunings SET kernel_source_hash = 'was-' || kernel_source_hash"))
    engine.dispose()


def timed_rounds(db: str, search: str | None = None) -> dict:
    """{rounds: seats}: how many turned rounds each tuned seat's winner was timed in (its
    final timing's method, "... xN rounds"), of every search or only `search`; seats timed
    otherwise count under "-"."""
    import re

    out: dict = {}
    for (methods,) in query(db, "SELECT group_concat(m.method, '|') FROM measurements m "
                                "JOIN tunings t ON t.id = m.tuning_id WHERE t.kind = 'tune' AND m.final "
                                + (f"AND t.search = '{search}' " if search else "") + "GROUP BY t.id"):
        n = max((int(x) for x in re.findall(r"x(\d+) rounds", methods or "")), default=None)
        k = str(n) if n is not None else "-"
        out[k] = out.get(k, 0) + 1
    return out


def breakdown(db: str, after: int = 0) -> list:
    """[(search, seats, seconds in seats, screening, timing)] of a census's tunings (those of
    id above `after`: a census into a database that held others)."""
    return [tuple(r) for r in query(db, "SELECT search, count(*), sum(total_s), sum(screen_s), sum(bench_s) "
                                        "FROM tunings WHERE kind = 'tune' AND id > :after GROUP BY search "
                                        "ORDER BY search", {"after": after})]

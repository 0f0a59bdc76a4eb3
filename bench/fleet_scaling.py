"""Fleet scaling on one host: the same queue tuned by one GPU's worker and by N GPUs'
workers, each on a fresh queue and a cold Triton cache, with a timeline of every worker
(start-up before its first seat, busy, idle between seats, idle at the end).

    python3 bench/fleet_scaling.py --gpus 0 0,1 [--db sqlite|postgresql+psycopg://...] TRACE...

For a PostgreSQL URL each run gets a database of its own (the role must be able to create
databases). Prints `N.NNx on K GPUs` against the first --gpus entry and writes
fleet_scaling.json under $OUT. `--smoke` runs it on the CPU interpreter at a tiny size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from nbx_tune.testing.bench import environment, epoch, save, table  # noqa: E402

DEFAULT_TRACES = ["examples/traces/llama2_7b_seq512_bf16.tsv", "examples/traces/gpt2_seq1024_bf16.tsv",
                  "examples/traces/resnet50_b8_bf16.tsv"]


def fresh_db(kind: str, tmp: Path) -> tuple[str, callable]:
    if kind == "sqlite":
        return f"sqlite:///{tmp / f'q-{uuid.uuid4().hex[:8]}.db'}", lambda: None
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"nbx_fleet_{uuid.uuid4().hex[:10]}"
    admin = create_engine(kind, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))

    def drop():
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    return make_url(kind).set(database=name).render_as_string(hide_password=False), drop


def cli(args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nbx_tune.cli.app", *args], env=env,
                          capture_output=True, text=True)


def timeline(url: str, t_launch: float, t_end: float) -> list[dict]:
    """Per worker, from its tunings' start and finish times: seconds before its first seat
    (start-up), busy, idle between seats, idle at the end (waiting for the last seats)."""
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.connect() as c:
        rows = c.execute(text("SELECT worker, started_at, finished_at, device_name FROM tunings "
                              "ORDER BY started_at")).all()
    eng.dispose()
    from nbx_tune.tuner.fleet.workers import worker_timeline

    return worker_timeline([(w, epoch(s), epoch(f), d) for w, s, f, d in rows], t_launch, t_end)




def run_once(gpus: str, traces, db_kind: str, profile: str, tmp: Path, extra_env: dict) -> dict:
    url, drop = fresh_db(db_kind, tmp)
    cache = tempfile.mkdtemp(prefix="triton-cold-", dir=tmp)  # a cold Triton cache per run
    env = {**os.environ, "TRITON_CACHE_DIR": cache, **extra_env}
    try:
        for t in traces:
            r = cli(["census", "--model", t, "--enqueue", "--profile", profile, "--db", url, "--json"], env)
            if r.returncode:
                raise SystemExit(f"enqueue {t}: {r.stderr.strip().splitlines()[-1:]}")
        t0 = time.time()
        r = cli(["worker", "--gpus", gpus, "--db", url, "--json"], env)
        t1 = time.time()
        if r.returncode:
            raise SystemExit(f"worker --gpus {gpus}: {r.stderr.strip().splitlines()[-1:]}")
        return {"gpus": gpus, "wall_s": round(t1 - t0, 2), "workers": timeline(url, t0, t1)}
    finally:
        drop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="*", default=DEFAULT_TRACES)
    ap.add_argument("--gpus", nargs="+", default=["0", "0,1"])
    ap.add_argument("--db", default="sqlite", help="sqlite, or a PostgreSQL admin URL")
    ap.add_argument("--profile", default="hopper")
    ap.add_argument("--smoke", action="store_true", help="the interpreter, a tiny trace")
    a = ap.parse_args()
    extra = {}
    if a.smoke:
        tmp_trace = Path(tempfile.mkdtemp()) / "smoke.tsv"
        tmp_trace.write_text("# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n" +
                             "".join(f"aten.mm\tfloat32,float32\t{m}x16;16x24\t\t1\n" for m in range(17, 21)))
        a.traces, a.profile, extra = [str(tmp_trace)], "interpreter", {"TRITON_INTERPRET": "1"}
    tmp = Path(tempfile.mkdtemp(prefix="fleet-"))
    runs = [run_once(g, a.traces, a.db, a.profile, tmp, extra) for g in a.gpus]
    base = runs[0]["wall_s"]
    rows = []
    for r in runs:
        for w in r["workers"]:
            rows.append([r["gpus"], r["wall_s"], w["worker"], w["n_seats"], w["startup_s"], w["busy_s"],
                         w["between_s"], w["idle_end_s"]])
    print(table(rows, ["gpus", "wall s", "worker", "seats", "start-up s", "busy s", "between s", "idle at end s"]))
    for r in runs[1:]:
        r["speedup"] = round(base / r["wall_s"], 3)
        print(f"{r['speedup']:.2f}x on {len(r['gpus'].split(','))} GPUs ({a.db.split(':')[0]})")
    save("fleet_scaling.json", {"env": environment(), "traces": a.traces, "db": a.db.split("@")[-1], "runs": runs})


if __name__ == "__main__":
    main()

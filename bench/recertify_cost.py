"""Re-certification against a fresh census: every seat of a certified table (the shipped
hopper table by default), imported into a fresh database and then made stale as a kernel
source change makes it, is re-certified by one census of the traces that hold its seats;
the same traces get a fresh census in another fresh database (NBX_TUNE_SEARCH=ranked: no
seat's own history or shipped entry, the ranked search and its audits as usual). Each side
runs in its own process with an empty Triton cache. Then the two picks of every seat where
they differ are timed side by side, three times, and the loss is the median.

    python bench/recertify_cost.py                       hopper: the three example traces
    python bench/recertify_cost.py --traces A.tsv B.tsv  fewer seats
    python bench/recertify_cost.py --smoke               the interpreter, tiny shapes: the
                                                         table is made by a census first

If the table was made under other code or Triton than this checkout's, its provenance is
rewritten to this checkout's before the import (the bench stales it next anyway).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import combined_trace, environment, save, side_by_side, table, wall_ms  # noqa: E402

TRACES = ("examples/traces/llama2_7b_seq512_bf16.tsv", "examples/traces/gpt2_seq1024_bf16.tsv",
          "examples/traces/resnet50_b8_bf16.tsv")
SMOKE_TRACE = ("# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"
               + "".join(f"aten.mm\tfloat32,float32\t{m}x16;16x{n}\t\t1\n" for m, n in ((17, 24), (33, 40), (65, 24)))
               + "aten.add.Tensor\tfloat32,float32\t1000;1000\t\t1\n")


def run(cmd, env) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return wall, r.stdout


def current_table(src: Path, dst: Path, profile) -> int:
    """The table with its provenance set to this checkout's code and Triton."""
    import triton

    from nbx_tune.kernels import table_format
    from nbx_tune.kernels.registry import all_specs

    doc = table_format.read(src)
    specs = all_specs()
    entries = [e for e in doc["entries"] if e["kernel"] in specs]
    for e in entries:
        spec = specs[e["kernel"]]
        e["provenance"].update(kernel_source_hash=spec.source_hash, config_space_hash=spec.config_space_hash,
                               profile_hash=profile.hash, triton_version=triton.__version__)
    dst.write_text(table_format.dumps(doc["profile"], doc["architecture"], profile.hash, entries))
    return len(entries)


def query(db: str, sql: str):
    from sqlalchemy import create_engine, text

    engine = create_engine(db)
    try:
        with engine.connect() as c:
            return c.execute(text(sql)).fetchall()
    finally:
        engine.dispose()


def stale_everything(db: str) -> None:
    """What a kernel source change does to every certificate: its tuning's hash no longer matches."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db)
    with engine.begin() as c:
        c.execute(text("UPDATE tunings SET kernel_source_hash = 'was-' || kernel_source_hash"))
    engine.dispose()


CURRENT = ("SELECT s.kernel, s.dtypes, s.flags, s.bucket, c.config, t.search FROM certificates c "
           "JOIN seats s ON s.id = c.seat_id JOIN tunings t ON t.id = c.tuning_id WHERE c.superseded_at IS NULL")


def largest_problems(db: str) -> dict:
    from nbx_tune.kernels.spec import Problem

    out = {}
    for kernel, dtypes, flags, bucket, problem in query(
            db, "SELECT s.kernel, s.dtypes, s.flags, s.bucket, p.problem FROM seat_shapes p "
                "JOIN seats s ON s.id = p.seat_id"):
        p = Problem.from_json(problem)
        k = (kernel, dtypes, flags, bucket)
        if k not in out or p.order() > out[k].order():
            out[k] = p
    return out


def pick_losses(fresh: dict, recert: dict, problems: dict, smoke: bool) -> list:
    """[(seat, loss)]: the re-certified pick against the fresh census's pick, timed side by
    side at the seat's largest shape, median of three."""
    from nbx_tune.kernels.registry import get_spec
    from nbx_tune.kernels.spec import Config
    from nbx_tune.tuner import screen

    device = "cpu" if smoke else "cuda"
    timer = wall_ms if smoke else None
    out = []
    for k in sorted(fresh.keys() & recert.keys()):
        if fresh[k] == recert[k]:
            out.append((k, 0.0))
            continue
        spec, p = get_spec(k[0]), problems[k]
        case = screen.make_case(spec, p, device, 1, False)
        outs = screen.alloc_outputs(spec, p, device)
        a, b = Config.parse(fresh[k]), Config.parse(recert[k])
        fns = {"fresh": lambda: spec.launch(a, p, case.inputs, outs),
               "recert": lambda: spec.launch(b, p, case.inputs, outs)}
        losses = []
        for _ in range(3):
            t = side_by_side(fns, rep_ms=60, timer=timer)
            losses.append(t["recert"] / t["fresh"] - 1)
        out.append((k, statistics.median(losses)))
    return out


def main(traces, smoke: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="nbx-rc-"))
    base = {**os.environ}
    if smoke:
        base["TRITON_INTERPRET"] = "1"
    else:
        base.pop("TRITON_INTERPRET", None)
    # This process times the picks: on the interpreter only in a smoke run (set before
    # triton is imported).
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    from nbx_tune.profiles import get_profile

    profile = get_profile("interpreter" if smoke else "hopper")
    trace = work / "seats.tsv"
    if smoke:
        trace.write_text(SMOKE_TRACE)
    else:
        combined_trace(traces, trace)
    cli = [sys.executable, "-m", "nbx_tune.cli.app"]
    census = [*cli, "census", "--model", str(trace), "--json"] + (["--no-isolate"] if smoke else [])

    # The table to re-certify: the shipped one, or (smoke) one a census makes here.
    table_src = work / "made.json"
    if smoke:
        made = f"sqlite:///{work / 'made.db'}"
        run(census, {**base, "NBX_TUNE_DB": made, "NBX_TUNE_SEARCH": "full"})
        run([*cli, "export", "--profile", profile.name, "-o", str(table_src), "--db", made], base)
    else:
        from nbx_tune.kernels.certified import TABLE_DIR

        table_src = TABLE_DIR / f"{profile.name}.json"
    entries = current_table(table_src, work / "table.json", profile)

    fresh_db = f"sqlite:///{work / 'fresh.db'}"
    fresh_s, _ = run(census, {**base, "NBX_TUNE_DB": fresh_db, "NBX_TUNE_SEARCH": "ranked",
                              "TRITON_CACHE_DIR": str(work / "cache_fresh")})
    print(f"fresh census: {fresh_s:.1f} s (cold Triton cache)", flush=True)

    recert_db = f"sqlite:///{work / 'recert.db'}"
    run([*cli, "import", str(work / "table.json"), "--db", recert_db], base)
    stale_everything(recert_db)
    recert_s, _ = run(census, {**base, "NBX_TUNE_DB": recert_db, "NBX_TUNE_SEARCH": "auto",
                               "TRITON_CACHE_DIR": str(work / "cache_recert")})
    print(f"re-certification after a source change: {recert_s:.1f} s (cold Triton cache)", flush=True)

    fresh = {r[:4]: r[4] for r in query(fresh_db, CURRENT)}
    # Only the traces' seats: the rest of the imported table stays stale and untouched.
    recert_rows = [r for r in query(recert_db, CURRENT) if r[:4] in fresh]
    recert = {r[:4]: r[4] for r in recert_rows}
    searches = {}
    for r in recert_rows:
        searches[r[5]] = searches.get(r[5], 0) + 1
    fresh_searches = {}
    for (s, n) in query(fresh_db, "SELECT search, count(*) FROM tunings GROUP BY search"):
        fresh_searches[s] = n
    regret = [x for (x,) in query(fresh_db, "SELECT shortcut_loss FROM tunings WHERE search = 'audit' "
                                            "AND shortcut_loss IS NOT NULL")]
    losses = pick_losses(fresh, recert, largest_problems(fresh_db), smoke)
    ls = [x for _, x in losses]
    med = statistics.median(ls) if ls else float("nan")
    worst = max(ls) if ls else float("nan")
    env = environment()
    result = {"env": env, "smoke": smoke, "traces": [str(t) for t in traces], "table_entries": entries,
              "seats_fresh": len(fresh), "seats_recert": len(recert), "fresh_s": fresh_s,
              "recert_s": recert_s, "speedup": fresh_s / recert_s, "recert_searches": searches,
              "fresh_searches": fresh_searches, "fresh_audit_losses": regret,
              "loss_median": med, "loss_max": worst,
              "losses": [{"seat": "|".join(k), "fresh": fresh[k], "recert": recert[k], "loss": x}
                         for k, x in losses]}
    save("recertify_cost-smoke.json" if smoke else "recertify_cost.json", result)
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table([[len(recert), f"{fresh_s:.1f}", f"{recert_s:.1f}", f"{fresh_s / recert_s:.1f}x",
                  ", ".join(f"{k} {v}" for k, v in sorted(searches.items())),
                  f"{100 * med:.2f} %", f"{100 * worst:.2f} %"]],
                ["seats", "fresh census s", "re-certification s", "faster by", "re-certified as",
                 "median loss", "max loss"]))
    differ = [[("|".join(k))[:60], fresh[k], recert[k], f"{100 * x:+.2f} %"] for k, x in losses if fresh[k] != recert[k]]
    if differ:
        print(table(differ, ["seat (picks differ)", "fresh pick", "re-certified pick", "loss"]))
    print(f"fresh census: searches {fresh_searches}; audited shortcut losses "
          + (", ".join(f"{100 * x:.2f} %" for x in regret) or "none"))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    smoke = "--smoke" in args
    traces = TRACES
    if "--traces" in args:
        traces = tuple(a for a in args[args.index("--traces") + 1:] if not a.startswith("--"))
    main(traces, smoke)

"""Tuning cost: a census of a trace's matmul rows against triton.autotune over the same
kernel, config space and shapes. Wall time includes compilation: each side runs in its own
process with an empty Triton cache. Then the configs each picked are timed side by side
under CUDA-graph replay over rotating operands (as bench/torch_compare.py times a model's
rows), with torch.matmul (cuBLAS) beside them; and where the census's seconds went, by search.

Then what a user's upgrade costs each side: the census's table is made stale as a kernel source
change makes it (the stand-in for a Triton upgrade) and re-certified from its own history by a
census in a new process with an empty Triton cache, where triton.autotune would tune the whole
space again (its time above, again). The re-certification's picks are timed beside the others.

    python bench/tuning_cost.py examples/traces/llama2_7b_seq512_bf16.tsv
    BENCH_STRATEGY=exhaustive python bench/tuning_cost.py TRACE    the census with another strategy
    BENCH_SEARCH=full python bench/tuning_cost.py TRACE     every candidate at every seat (the
                                                      default, ranked, is a fresh census: no
                                                      seat's own shipped entry seeds it; the
                                                      shipped table's near seats rank its first
                                                      seats, as for any user; BENCH_SEARCH=cold:
                                                      no shipped table at all, the votes' baseline)
    python bench/tuning_cost.py TRACE --profile DIR   census only: its phases on a timeline
                                                      (bench/census_timeline.py), the worker
                                                      under cProfile (BENCH_WORKER_PROFILE=0:
                                                      the timeline alone, at full speed)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nbx_tune.testing.bench import (PICK_REP_MS, breakdown, environment, epoch, query, save, stale_everything, table,  # noqa: E402
                     timed_rounds, warm_bytecode)
from nbx_tune.bench.torch_compare import graph_times, n_sets  # noqa: E402

HERE = Path(__file__).resolve().parent
MATMUL_OPS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm")


def timed_process(cmd, env) -> tuple[float, str, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env={**env, "NBX_TUNE_LAUNCHED_AT": repr(time.time())}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return wall, r.stdout, r.stderr




def print_profile(path: Path, title: str, n: int = 28) -> None:
    import io
    import pstats

    out = io.StringIO()
    pstats.Stats(str(path), stream=out).sort_stats("cumulative").print_stats(n)
    text = out.getvalue()
    print(f"--- {title}: {path.name}")
    print(text[text.find("ncalls"):] if "ncalls" in text else text)


def census_times(db: str, problem, configs) -> str:
    """What the census measured of each config at the problem's seat: "0.0800 / 0.0742 (quick)",
    "- " where it did not time one (not in its shortlist, or refused): whether a loss against
    autotune's pick is the shortlist's or the timing's."""
    from sqlalchemy import create_engine, text

    from nbx_tune.kernels.matmul import SPEC
    from nbx_tune.kernels.spec import bucket_of, encode_bucket, encode_dtypes, encode_flags
    from nbx_tune.profiles import get_profile

    engine = create_engine(db)
    with engine.connect() as conn:
        (profile,) = conn.execute(text("SELECT profile FROM seats LIMIT 1")).one()
        bucket = encode_bucket(SPEC.key, bucket_of(get_profile(profile), SPEC.key, problem.dims))
        got = {c: (ms, final) for c, ms, final in conn.execute(text(
            "SELECT m.config, m.median_ms, m.final FROM measurements m JOIN tunings t ON t.id = m.tuning_id "
            "JOIN seats s ON s.id = t.seat_id WHERE s.kernel = 'matmul' AND s.dtypes = :d AND s.flags = :f "
            "AND s.bucket = :b ORDER BY m.id"), {"d": encode_dtypes(problem.dtypes),
                                                 "f": encode_flags(problem.flags), "b": bucket})}
    engine.dispose()
    return " / ".join(f"{got[c.key()][0]:.4f}" + ("" if got[c.key()][1] else " (quick)") if c.key() in got else "-"
                      for c in configs)


def main(trace: str, profile_dir: str | None = None) -> None:
    from nbx_tune.kernels.trace import read_trace, write_trace

    work = Path(tempfile.mkdtemp(prefix="nbx-tc-"))
    from nbx_tune.kernels.trace import make_row

    rows = [r for r in read_trace(trace).rows if r.base_op in MATMUL_OPS]
    # Beside the model's shapes, one square size >= 2048 per half dtype for the cuBLAS goal.
    rows += [make_row("aten.mm", [dt, dt], [(4096, 4096), (4096, 4096)]) for dt in ("float16", "bfloat16")]
    mm_trace = work / "matmul_rows.tsv"
    write_trace(mm_trace, rows, comments=[f"matmul rows of {trace}"])
    base_env = {**os.environ}
    base_env.pop("TRITON_INTERPRET", None)

    db = f"sqlite:///{work / 'census.db'}"
    search = os.environ.get("BENCH_SEARCH", "ranked")
    env = {**base_env, "TRITON_CACHE_DIR": str(work / "cache_census"), "NBX_TUNE_DB": db,
           "NBX_TUNE_SEARCH": search}
    prefix = [sys.executable, "-m", "nbx_tune.cli.app"]
    if profile_dir:
        # The parent's phases on a timeline (a cProfile of it mostly shows waiting on children),
        # the worker under cProfile.
        prof = Path(profile_dir)
        prof.mkdir(parents=True, exist_ok=True)
        if os.environ.get("BENCH_WORKER_PROFILE", "1") != "0":
            env["NBX_TUNE_WORKER_PROFILE"] = str(prof)
        prefix = [sys.executable, str(HERE / "census_timeline.py")]
    print(f"bytecode warmed for both sides: {warm_bytecode(base_env):.1f} s", flush=True)
    started = time.time()
    strategy = os.environ.get("BENCH_STRATEGY", "pruned")
    census_s, out, err = timed_process([*prefix, "census", "--model", str(mm_trace), "--json",
                                        "--strategy", strategy], env)
    rep = json.loads(out)
    print(f"census ({strategy}, search {search}) of {len(rows)} matmul rows: {census_s:.1f} s (cold Triton cache)",
          flush=True)
    if profile_dir:
        from sqlalchemy import create_engine, text

        with create_engine(db).connect() as conn:
            # A timeline from the census process's start: where the seats begin and end, so the
            # time before the first and after the last (start-up, shut-down) shows too.
            for row in conn.execute(text("SELECT s.dtypes || ' ' || s.bucket, t.screen_s, t.bench_s, t.total_s, "
                                         "t.started_at, t.finished_at FROM tunings t "
                                         "JOIN seats s ON s.id = t.seat_id ORDER BY t.id")):
                at = [epoch(v) - started for v in row[4:6]]
                print(f"{at[0]:5.1f} .. {at[1]:5.1f} s  {row[0]}: screen {row[1]:.2f} s, timing {row[2]:.2f} s, "
                      f"total {row[3]:.2f} s, other {row[3] - row[1] - row[2]:.2f} s")
        print(f"{census_s:5.1f} s  the census process ended")
        print("\n".join(ln for ln in err.splitlines() if ln.startswith("[timeline]")))
        for p in sorted(prof.glob("*.prof")):
            print_profile(p, "candidate worker")
        return

    # The upgrade: the census's own table staled, then re-certified from its history.
    recert_db = f"sqlite:///{work / 'recert.db'}"
    shutil.copyfile(work / "census.db", work / "recert.db")
    stale_everything(recert_db)
    (census_last,) = query(recert_db, "SELECT coalesce(max(id), 0) FROM tunings")[0]
    recert_s, _, _ = timed_process([*prefix, "census", "--model", str(mm_trace), "--json", "--strategy", strategy],
                                   {**env, "NBX_TUNE_DB": recert_db, "NBX_TUNE_SEARCH": "auto",
                                    "TRITON_CACHE_DIR": str(work / "cache_recert")})
    print(f"re-certification of the census's table after a source change: {recert_s:.1f} s (cold Triton cache)",
          flush=True)

    env = {**base_env, "TRITON_CACHE_DIR": str(work / "cache_autotune")}
    auto_s, _, _ = timed_process([sys.executable, str(HERE / "autotune_baseline.py"), str(mm_trace),
                               str(work / "autotune.json")], env)
    auto = json.loads((work / "autotune.json").read_text())
    print(f"triton.autotune over the same rows: {auto_s:.1f} s (cold Triton cache)", flush=True)

    # The picks, timed side by side in this process.
    import torch

    from nbx_tune.kernels.runtime import certified
    from nbx_tune.kernels.matmul import SPEC, launch_matmul
    from nbx_tune.kernels.spec import Config, Problem
    from nbx_tune.tuner.certify.screen import TORCH_DTYPES

    problems = [Problem.from_json(pick["problem"]) for pick in auto["picks"]]
    os.environ["NBX_TUNE_DB"] = recert_db
    certified.reload()
    recert_picks = [certified.config_for(SPEC, p.dtypes, p.flags, p.dims) for p in problems]
    os.environ["NBX_TUNE_DB"] = db
    certified.reload()
    lines, ratios, losses, recert_losses = [], [], [], []
    for pick, p, re_cert in zip(auto["picks"], problems, recert_picks):
        B, M, N, K = p.dims
        dt = TORCH_DTYPES[p.dtypes[0]]
        k = n_sets((M * K + K * N + M * N) * B * dt.itemsize, "cuda")
        a = [torch.randn(B, M, K, device="cuda", dtype=dt) for _ in range(k)]
        b = [torch.randn(B, K, N, device="cuda", dtype=dt) for _ in range(k)]
        c = [torch.empty(B, M, N, device="cuda", dtype=dt) for _ in range(k)]
        cert = certified.config_for(SPEC, p.dtypes, p.flags, p.dims)
        at = Config.parse(pick["config"])
        # The loss is the median of three repeats: each a side-by-side timing, with
        # the census's pick a second time beside it ("again", the same binary): how far the
        # measure itself moves a config, against which a loss is read.
        fns = {"cert": lambda i: launch_matmul(a[i % k], b[i % k], c[i % k], None, 1.0, 0.0, cert),
               "auto": lambda i: launch_matmul(a[i % k], b[i % k], c[i % k], None, 1.0, 0.0, at),
               "again": lambda i: launch_matmul(a[i % k], b[i % k], c[i % k], None, 1.0, 0.0, cert),
               "recert": lambda i: launch_matmul(a[i % k], b[i % k], c[i % k], None, 1.0, 0.0, re_cert),
               "blas": lambda i: torch.matmul(a[i % k], b[i % k], out=c[i % k])}
        reps = [graph_times(fns, PICK_REP_MS) for _ in range(3)]
        same = statistics.median(abs(r["again"] / r["cert"] - 1) for r in reps)
        t_cert, t_auto, t_blas = (statistics.median(r[n] for r in reps) for n in ("cert", "auto", "blas"))
        ratios.append(t_auto / t_cert)
        # The same config is the same binary: a difference between its two timings is the
        # timing's noise, not a loss of the pick.
        losses.append(0.0 if cert == at else statistics.median(max(0.0, r["cert"] / r["auto"] - 1) for r in reps))
        # Where the re-certification kept the census's pick, that binary's loss is the census's:
        # a second copy's reading would add the measure's own noise (the "again" column).
        recert_losses.append(0.0 if re_cert == at else losses[-1] if re_cert == cert else
                             statistics.median(max(0.0, r["recert"] / r["auto"] - 1) for r in reps))
        seen = census_times(db, p, (cert, at))
        lines.append([f"B={B} M={M} N={N} K={K} {p.dtypes[0]}", f"{t_cert:.4f}", f"{t_auto:.4f}",
                      f"{t_blas:.4f}", f"{t_auto / t_cert:.3f}", f"{t_blas / t_cert:.3f}",
                      f"{100 * losses[-1]:.2f} %", seen, str(cert), str(at), f"{100 * same:.2f} %",
                      f"{100 * recert_losses[-1]:.2f} %", str(re_cert)])
    misses = certified.launch_stats()["misses"]
    from sqlalchemy import create_engine, text

    engine = create_engine(db)
    with engine.connect() as conn:
        searches = dict(conn.execute(text("SELECT search, count(*) FROM tunings GROUP BY search")).fetchall())
        audits = [x for (x,) in conn.execute(text("SELECT shortcut_loss FROM tunings WHERE search = 'audit' "
                                                 "AND shortcut_loss IS NOT NULL"))]
    engine.dispose()
    spent = breakdown(db)
    recert_spent = breakdown(recert_db, census_last)
    rounds = timed_rounds(db)
    env_info = environment()
    result = {"env": env_info, "strategy": strategy, "trace": trace, "matmul_rows": len(rows),
              "seats": len(rep["seats"]),
              "census_s": census_s, "autotune_s": auto_s, "speedup": auto_s / census_s,
              "census_coverage": rep["coverage"], "picks": lines, "misses": misses, "search": search,
              "searches": searches, "audit_losses": audits, "seconds_by_search": spent,
              "timed_rounds": rounds, "loss_median": statistics.median(losses) if losses else None,
              "loss_max": max(losses) if losses else None,
              # The upgrade: the census's table re-certified, against autotune's tune of the whole space.
              "recert_s": recert_s, "recert_vs_autotune": auto_s / recert_s, "recert_vs_census": census_s / recert_s,
              "recert_seconds_by_search": recert_spent,
              "recert_loss_median": statistics.median(recert_losses) if recert_losses else None,
              "recert_loss_max": max(recert_losses) if recert_losses else None}
    save("tuning_cost.json" if (strategy, search) == ("pruned", "ranked") else
         f"tuning_cost-{strategy}-{search}.json", result)
    print(f"{env_info['date']} {env_info['gpu']} driver {env_info['driver']} Triton {env_info['triton']} "
          f"torch {env_info['torch']}")
    print(table([[f"{census_s:.1f}", f"{auto_s:.1f}", f"{auto_s / census_s:.2f}x", len(rows), len(rep["seats"])]],
                ["census s (screens every candidate)", "triton.autotune s", "census faster by",
                 "matmul rows", "seats"]))
    print(table([ln[:8] + ln[10:12] for ln in lines],
                ["shape", "certified ms (graphs)", "autotune pick ms", "cuBLAS ms", "autotune/cert", "cuBLAS/cert",
                 "loss vs autotune (median of 3)", "census ms: its pick / autotune's",
                 "certified against itself (median of 3)", "re-certified pick's loss vs autotune"]))
    print("\n".join(f"{ln[0]}: certified {ln[8]}; autotune {ln[9]}; re-certified {ln[12]}" for ln in lines))
    print(table([[f"{recert_s:.1f}", f"{auto_s:.1f}", f"{auto_s / recert_s:.1f}x", f"{census_s:.1f}",
                  f"{census_s / recert_s:.1f}x"] + [", ".join(f"{srch} {n}" for srch, n, *_ in recert_spent)]],
                ["after an upgrade: re-certification s", "triton.autotune s", "re-certification faster by",
                 "fresh census s", "than the fresh census by", "re-certification searches"]))
    print(table([[srch, n, f"{tot:.1f}", f"{sc:.1f}", f"{bn:.1f}", f"{tot - sc - bn:.1f}"]
                 for srch, n, tot, sc, bn in spent],
                ["census search", "seats", "s in seats", "screening s", "timing s", "inputs, oracles, rest s"]))
    print("contenders timed in " + ", ".join(f"{n} round(s): {k} seats" for n, k in sorted(rounds.items())))
    if losses:
        print(f"pick loss against autotune's exhaustive pick: median {100 * statistics.median(losses):.2f} %, "
              f"max {100 * max(losses):.2f} %; census searches {searches}; audited shortcut losses "
              + (", ".join(f"{100 * x:.2f} %" for x in audits) or "none"))
        print(f"re-certified picks' loss against autotune's: median {100 * statistics.median(recert_losses):.2f} %, "
              f"max {100 * max(recert_losses):.2f} %")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    prof_dir = None
    if "--profile" in args:
        i = args.index("--profile")
        prof_dir = args[i + 1]
        del args[i:i + 2]
    main(args[0] if args else "examples/traces/llama2_7b_seq512_bf16.tsv", prof_dir)

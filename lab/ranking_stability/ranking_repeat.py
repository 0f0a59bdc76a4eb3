"""How stable is the census's pick for a short GEMM, and does a busy host move it?

The same seats (2048^3 in fp16 and bf16: 0.03 ms launches, where the census's pick has read
0.62 to 0.98 of cuBLAS across runs) certified RUNS times, each into a fresh database,
half of the runs with BURNERS niced processes spinning on the CPU as a compile pool does.
After each census, with the host quiet again, the pick is timed side by side with every
screened survivor and with cuBLAS. First, the two timers on one launch: triton's do_bench
and the census's gpu_time (tuner/timing/benchmarkers.py), which queues the timed launches ahead.

    python bench/ranking_repeat.py          # GPU; env RUNS=4, BURNERS=14
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

from nbx_tune.testing.bench import environment, save, side_by_side, table  # noqa: E402

SHAPES = [("float16", 2048, 2048, 2048), ("bfloat16", 2048, 2048, 2048)]


def _burn(stop) -> None:
    os.nice(10)  # as tuner/execution/precompile.py's pool
    x = 0
    while not stop.is_set():
        for i in range(100_000):
            x += i * i


def main() -> None:
    import torch
    from triton.testing import do_bench

    from nbx_tune.kernels.matmul import SPEC, launch_matmul
    from nbx_tune.kernels.spec import Config, bucket_of, seat_label
    from nbx_tune.profiles import current_profile
    from nbx_tune.tuner import commands as api
    from nbx_tune.tuner.timing.benchmarkers import gpu_time
    from nbx_tune.kernels.trace import make_row, write_trace

    def mats(dt, m, n, k):
        t = getattr(torch, dt)
        return (torch.randn(m, k, device="cuda", dtype=t), torch.randn(k, n, device="cuda", dtype=t),
                torch.empty(m, n, device="cuda", dtype=t))

    # The two timers on one launch, quiet host, three times each in turn: do_bench times a
    # launch from an event recorded before the host starts it; gpu_time queues them ahead.
    timers = []
    for dt, m, n, k in SHAPES:
        a, b, c = mats(dt, m, n, k)
        for cfg in (Config.make(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
                    Config.make(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)):
            fn = lambda: launch_matmul(a, b, c, None, 1.0, 0.0, cfg)  # noqa: E731
            host = time.perf_counter()
            for _ in range(200):
                fn()
            host_us = (time.perf_counter() - host) / 200 * 1e6
            torch.cuda.synchronize()
            db_ms = [do_bench(fn, warmup=5, rep=25, return_mode="median") for _ in range(3)]
            gt_ms = [gpu_time(fn, 5, 25, (0.5,))[0] for _ in range(3)]
            timers.append([f"{m}x{n}x{k}", dt, str(cfg), f"{host_us:.1f}", " ".join(f"{x:.4f}" for x in db_ms),
                           " ".join(f"{x:.4f}" for x in gt_ms)])
            print("  timers: " + "  ".join(timers[-1]), flush=True)
    runs, burners = int(os.environ.get("RUNS", 4)), int(os.environ.get("BURNERS", 14))
    profile = current_profile()
    work = Path(tempfile.mkdtemp(prefix="nbx-rank-"))
    trace = work / "t.tsv"
    write_trace(trace, [make_row("aten.mm", [dt, dt], [(m, k), (k, n)]) for dt, m, n, k in SHAPES])
    rows = []
    for r in range(runs):
        busy = r % 2 == 1
        stop = mp.Event()
        procs = [mp.Process(target=_burn, args=(stop,), daemon=True) for _ in range(burners if busy else 0)]
        for p in procs:
            p.start()
        db = f"sqlite:///{work / f'r{r}.db'}"
        t0 = time.perf_counter()
        rep = api.census(str(trace), db, strategy="pruned")
        secs = time.perf_counter() - t0
        stop.set()
        for p in procs:
            p.join()
        for dt, m, n, k in SHAPES:
            a, b, c = mats(dt, m, n, k)
            p = SPEC.problem_from_row(make_row("aten.mm", [dt, dt], [(m, k), (k, n)]))
            label = seat_label("matmul", p.dtypes, p.flags, SPEC.key, bucket_of(profile, SPEC.key, p.dims))
            seat = next(s for s in rep.seats if s.label == label)
            measured = api.show_seat(str(seat.id), db)["history"][-1]["measurements"]
            pick = Config.parse(seat.config)
            survivors = [Config.parse(x["config"]) for x in measured]
            times = side_by_side({s: (lambda s=s: launch_matmul(a, b, c, None, 1.0, 0.0, s)) for s in survivors},
                                 rep_ms=40)
            best = min(times, key=times.get)
            fns = {"pick": lambda: launch_matmul(a, b, c, None, 1.0, 0.0, pick),
                   "best": lambda: launch_matmul(a, b, c, None, 1.0, 0.0, best), "blas": lambda: torch.matmul(a, b)}
            tt = side_by_side(fns, rep_ms=200)
            said = {x["config"]: x["median_ms"] for x in measured}
            rows.append([r, "busy" if busy else "quiet", f"{secs:.1f}", f"{m}x{n}x{k}", dt,
                         f"{tt['blas'] / tt['pick']:.3f}", f"{tt['blas'] / tt['best']:.3f}",
                         f"{said.get(str(pick), float('nan')):.4f}", f"{tt['pick']:.4f}", str(pick)])
            print("  " + "  ".join(map(str, rows[-1])), flush=True)
            save("ranking_repeat.json", {"rows": rows})
    env = environment()
    save("ranking_repeat.json", {"env": env, "burners": burners, "timers": timers, "rows": rows})
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table(timers, ["shape", "dtype", "config", "host us/launch", "do_bench ms (3 runs)",
                         "gpu_time ms (3 runs)"]))
    print(table(rows, ["run", "host", "census s", "shape", "dtype", "cuBLAS/pick", "cuBLAS/best", "census said ms",
                       "pick ms now", "pick"]))


if __name__ == "__main__":
    main()

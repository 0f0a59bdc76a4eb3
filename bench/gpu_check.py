"""Every kernel against its fp64 oracle on the GPU, at the "gpu" example rows of each spec,
in every dtype it claims (bfloat16 included: it cannot be checked on the interpreter), under
several configs each; then a candidate that writes out of bounds, tuned in a worker process,
must cost only itself.

    python bench/gpu_check.py            (writes gpu_check.json under $OUT)
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import environment, save, table  # noqa: E402


# Families never proven on a GPU go first, so that a time limit cuts the proven ones.
ORDER = ("copy", "cat", "embedding", "fill", "batch_norm", "max_pool2d", "softmax", "layer_norm", "rms_norm", "group_norm", "reduce", "elementwise_binary",
         "elementwise_unary", "conv", "attention", "matmul")


def _device() -> str:
    import os

    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"  # cpu: a local smoke run


def _check_task(name: str, index: int, configs_per_row: int, deadline: float, scale: str) -> list[dict] | None:
    """One example row in a pool process; None if the deadline passed before it started."""
    if time.monotonic() > deadline:
        return None
    from nbx_tune.kernels.registry import get_spec
    from nbx_tune.profiles import current_profile
    from nbx_tune.tuner.selfcheck import check_row

    spec = get_spec(name)
    row = spec.example_rows(scale)[index]
    return [{"kernel": name, "op": c.op, "shapes": c.shapes, "dtype": c.dtype, "config": c.config.key(),
             "err": c.err, "rtol": c.rtol, "reason": c.reason, "detail": c.detail}
            for c in check_row(spec, current_profile(), _device(), row, configs_per_row)]


def correctness(deadline: float, configs_per_row: int, jobs: int, scale: str = "gpu",
                kernels: str | None = None) -> tuple[list, bool]:
    """Every "gpu" example row of every kernel, rows spread over `jobs` processes that share
    the GPU (compiling and the fp64 oracles are CPU work); rows not started by the deadline
    are reported as not run, not hidden."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from nbx_tune.kernels.registry import all_specs

    specs = {n: s for n, s in all_specs().items() if not n.startswith(("test_", "bench_"))}
    if kernels:  # --kernels copy,cat: only those families
        wanted = kernels.split(",")
        unknown = sorted(set(wanted) - set(specs))
        if unknown:
            raise SystemExit(f"--kernels: unknown {', '.join(unknown)}; known: {', '.join(sorted(specs))}")
        specs = {n: specs[n] for n in wanted}
    names = sorted(specs, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))
    tasks = [(n, i, configs_per_row * 2 if n == "matmul" else configs_per_row)
             for n in names for i in range(len(specs[n].example_rows(scale)))]
    raw, not_run, failed_tasks = [], defaultdict(int), []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_check_task, n, i, k, deadline, scale): (n, i) for n, i, k in tasks}
        for done, (fut, (n, i)) in enumerate(futures.items(), 1):
            try:
                got = fut.result()
            except Exception as e:  # a dead pool process is a failed row, with its text
                failed_tasks.append((n, i, f"{type(e).__name__}: {e}"))
                continue
            if got is None:
                not_run[n] += 1
            else:
                raw += got
            if done % 25 == 0:
                print(f"  {done}/{len(tasks)} rows, {len(raw)} checks, {time.perf_counter() - t0:.0f} s", flush=True)
    save("gpu_check.json", raw)
    by = defaultdict(list)
    for c in raw:
        by[(c["kernel"], c["op"], c["dtype"])].append(c)
    rows, ok = [], not failed_tasks and not not_run
    for (name, op, dt), cs in sorted(by.items(), key=lambda kv: (names.index(kv[0][0]), kv[0][1:])):
        bad = [c for c in cs if c["reason"] is not None]
        ok &= not bad
        errs = [c["err"] for c in cs if c["err"] is not None]
        rows.append([name, op, dt, len(cs), f"{max(errs):.2e}" if errs else "-", f"{cs[0]['rtol']:.0e}",
                     "PASS" if not bad else f"FAIL {bad[0]['reason']}: {(bad[0]['detail'] or '')[:60]}"])
    for n, i, why in failed_tasks:
        rows.append([n, f"row {i}", "-", 0, "-", "-", f"FAIL pool: {why[:60]}"])
    for n, k in not_run.items():
        rows.append([n, f"{k} rows", "-", 0, "-", "-", "NOT RUN (time)"])
    return rows, ok


def fault(profile) -> tuple[list, bool]:
    import faults

    from nbx_tune.kernels.registry import register
    from nbx_tune.tuner.isolation import Isolated
    from nbx_tune.tuner.strategies import get_strategy
    from nbx_tune.tuner.tune import tune_seat
    from nbx_tune.kernels.spec import Problem, seat_flags

    register(faults.SPEC)
    ex = Isolated(profile, timeout_s=120, precompile=False)
    try:
        p = Problem("bench_oob", ("float32",), seat_flags(), (1_000_003,))
        res = tune_seat(faults.SPEC, profile, "bench_oob", [p], ex, get_strategy("exhaustive"), "cuda")
    finally:
        ex.close()
    rows = [[r.config.key(), r.reason or "timed", (r.detail or "")[:90]] for r in res.records]
    oob = next(r for r in res.records if r.config == faults.OUT_OF_BOUNDS)
    ok = (oob.reason == "crash" and res.outcome == "certified" and res.winner.config in faults.GOOD)
    return rows + [["winner", res.outcome, res.winner.config.key() if res.winner else "-"]], ok


def main() -> int:
    import argparse

    from nbx_tune.profiles import current_profile

    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3600, help="stop starting new kernels after this")
    ap.add_argument("--configs-per-row", type=int, default=3)
    ap.add_argument("--skip-fault", action="store_true")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--scale", default="gpu", help="example rows: gpu (default) or small (a local smoke run)")
    ap.add_argument("--jobs", type=int, default=8, help="processes sharing the GPU for the correctness rows")
    ap.add_argument("--kernels", help="comma-separated kernel names to check (default: all)")
    args = ap.parse_args()
    deadline = time.monotonic() + args.seconds
    env = environment()
    profile = current_profile()
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']} "
          f"profile {profile.name}", flush=True)
    ok1 = ok2 = True
    if not args.skip_fault:
        frows, ok2 = fault(profile)
        print(table(frows, ["config", "outcome", "detail"]), flush=True)
    if not args.skip_correctness:
        rows, ok1 = correctness(deadline, args.configs_per_row, args.jobs, args.scale, args.kernels)
        print(table(rows, ["kernel", "op", "dtype", "checks", "max err", "rtol", "result"]))
    save("gpu_check_env.json", {**env, "correct": ok1, "fault_survived": ok2})
    print(f"correctness: {'PASS' if ok1 else 'FAIL'}; out-of-bounds candidate survived: {'PASS' if ok2 else 'FAIL'}")
    return 0 if ok1 and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Every kernel against its fp64 oracle on the GPU, at the "gpu" example rows of each spec,
in every dtype it claims (bfloat16 included: it cannot be checked on the interpreter), under
several configs each, each launched twice (the outputs must agree bit for bit); no correct
config may fall to the precision gate (tuner/certify/tune.py: its error over 4 times the row's most
accurate config's and over a floor). Then a candidate that writes
out of bounds, tuned in a worker process, must cost only itself; and `--planted` tunes the
planted GEMM of testing/planted.py: an interior-only mask bug, an fp16 accumulator and a racing
split-K must each be refused with its reason, although the benchmarker calls them fastest.

    python proofs/gpu_check.py            (writes gpu_check.json under $OUT)
    python proofs/gpu_check.py --skip-fault --skip-correctness --planted          (a minute)
    python proofs/gpu_check.py --skip-fault --seconds 150 --configs-per-row 4 --jobs 12
                                         (the gate over every kernel: under 4 minutes)
    TRITON_INTERPRET=1 python proofs/gpu_check.py --scale small ...    (a smoke run on the CPU)
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict


from nbx_tune.testing.bench import environment, save, table  # noqa: E402


# Families never proven on a GPU go first, so that a time limit cuts the proven ones.
ORDER = ("add_rms_norm", "add_layer_norm", "rope_cos_sin", "cat_kv", "rotary", "rotary_qk", "silu_mul", "copy", "cat", "embedding", "fill", "batch_norm", "max_pool2d", "softmax", "layer_norm", "rms_norm", "group_norm", "reduce", "elementwise_binary",
         "elementwise_unary", "conv", "attention", "matmul")


def _device() -> str:
    import os

    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"  # cpu: a local smoke run


def _check_task(name: str, index: int, configs_per_row: int, deadline: float, scale: str) -> list[dict] | None:
    """One example row in a pool process; None if the deadline passed before it started."""
    if time.monotonic() > deadline:
        return None
    from nbx_tune.kernels.runtime.registry import get_spec
    from nbx_tune.profiles import current_profile
    from nbx_tune.tuner.certify.selfcheck import check_row

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

    from nbx_tune.kernels.runtime.registry import all_specs

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
    gate(raw)
    save("gpu_check.json", raw)
    by = defaultdict(list)
    for c in raw:
        by[(c["kernel"], c["op"], c["dtype"])].append(c)
    rows, ok = [], not failed_tasks and not not_run
    for (name, op, dt), cs in sorted(by.items(), key=lambda kv: (names.index(kv[0][0]), kv[0][1:])):
        bad = [c for c in cs if c["reason"] is not None]
        ok &= not bad
        errs = [c["err"] for c in cs if c["err"] is not None]
        ratios = [c["ratio"] for c in cs if c.get("ratio") is not None]
        rows.append([name, op, dt, len(cs), f"{max(errs):.2e}" if errs else "-", f"{cs[0]['rtol']:.0e}",
                     f"{max(ratios):.1f}" if ratios else "-",
                     "PASS" if not bad else f"FAIL {bad[0]['reason']}: {(bad[0]['detail'] or '')[:60]}"])
    for n, i, why in failed_tasks:
        rows.append([n, f"row {i}", "-", 0, "-", "-", "-", f"FAIL pool: {why[:60]}"])
    for n, k in not_run.items():
        rows.append([n, f"{k} rows", "-", 0, "-", "-", "-", "NOT RUN (time)"])
    return rows, ok


def gate(raw: list[dict]) -> None:
    """The tuner's precision gate over each row's passing configs: every check gets its
    ratio to the row's most accurate, and a correct config the gate would refuse becomes a
    failure (reason imprecise)."""
    import torch

    from nbx_tune.tuner.certify.tune import imprecise_limit

    rows = defaultdict(list)
    for c in raw:
        if c["reason"] is None:
            rows[(c["kernel"], c["op"], str(c["shapes"]), c["dtype"])].append(c)
    for cs in rows.values():
        best = min(c["err"] for c in cs)
        for c in cs:
            c["ratio"] = c["err"] / best if best > 0 else (1.0 if c["err"] == 0 else float("inf"))
            dt = getattr(torch, c["dtype"], None)
            unit = torch.finfo(dt).eps if dt is not None and dt.is_floating_point else 0.0
            limit = imprecise_limit(best, c["rtol"], unit)
            if c["err"] > limit:
                c["reason"], c["detail"] = "imprecise", f"err {c['err']:.3g} > {limit:.3g} ({c['ratio']:.1f}x the best)"


def planted(profile, scale: str) -> tuple[list, bool]:
    """The planted GEMM's subtle faults, tuned in this process with a benchmarker that calls
    every faulty config fastest: each must be refused with its reason."""
    from nbx_tune.testing import planted as pl

    from nbx_tune.kernels.spec import Problem, seat_flags
    from nbx_tune.tuner.timing.benchmarkers import Timing
    from nbx_tune.tuner.execution.executor import InProcess
    from nbx_tune.tuner.timing.strategies import get_strategy
    from nbx_tune.tuner.certify.tune import tune_seat

    def faulty_first(fn, mode="full"):
        before = dict(pl.LAUNCHES)
        fn()
        key = next(k for k, n in pl.LAUNCHES.items() if n != before.get(k, 0))
        ms = 1.0 if any(f in key for f in ("MASK_BUG=1", "ACC16=1", "SPLIT_K=4")) else 2.0
        return Timing(ms, ms, ms, "fake")

    def gemm(M, N, K, dt):
        return Problem("test_gemm", (dt,), seat_flags(), (M, N, K))

    small = scale == "small"
    M, K = (16, 32) if small else (512, 512)
    cases = [  # (what, configs, edges, shapes, the faulty config, its expected reason)
        ("mask bug, interior shape", (pl.GEMM_GOOD[0], pl.MASK_BUG), False,
         [gemm(M, n, K, "float16") for n in (1056, 1100, 1152)], pl.MASK_BUG, "wrong_answer"),
        ("mask bug, bucket edge", (pl.GEMM_GOOD[0], pl.MASK_BUG), True,
         [gemm(M, n, K, "float16") for n in (1056, 1152)], pl.MASK_BUG, "wrong_answer"),
        ("fp16 accumulator", (*pl.GEMM_GOOD, pl.ACC16), False,
         [gemm(16, 24, 8192, "float16") if small else gemm(256, 256, 4096, "float16")], pl.ACC16, "imprecise"),
        ("split-K atomics", (*pl.GEMM_GOOD, pl.SPLIT_K), False,
         [gemm(16, 16, 64, "float32") if small else gemm(512, 512, 4096, "float32")], pl.SPLIT_K, "nondeterministic"),
    ]
    rows, ok = [], True
    device = _device()
    for what, configs, edges, shapes, fault, want in cases:
        res = tune_seat(pl.GemmSpec(configs, edges), profile, "planted", shapes, InProcess(faulty_first),
                        get_strategy("exhaustive"), device)
        rec = next(r for r in res.records if r.config == fault)
        good = res.winner is not None and res.winner.config in pl.GEMM_GOOD
        passed = rec.reason == want and good
        ok &= passed
        rows.append([what, want, rec.reason or "certified", (rec.detail or "")[:70],
                     res.winner.config.key()[:30] if res.winner else "-", "PASS" if passed else "FAIL"])
    return rows, ok


def fault(profile) -> tuple[list, bool]:
    from nbx_tune.proofs import faults

    from nbx_tune.kernels.runtime.registry import register
    from nbx_tune.tuner.execution.isolation import Isolated
    from nbx_tune.tuner.timing.strategies import get_strategy
    from nbx_tune.tuner.certify.tune import tune_seat
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
    ap.add_argument("--planted", action="store_true", help="the planted GEMM's subtle faults (testing/planted.py)")
    ap.add_argument("--scale", default="gpu", help="example rows: gpu (default) or small (a local smoke run)")
    ap.add_argument("--jobs", type=int, default=8, help="processes sharing the GPU for the correctness rows")
    ap.add_argument("--kernels", help="comma-separated kernel names to check (default: all)")
    args = ap.parse_args()
    deadline = time.monotonic() + args.seconds
    env = environment()
    profile = current_profile()
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']} "
          f"profile {profile.name}", flush=True)
    ok1 = ok2 = ok3 = True
    if args.planted:
        prows, ok3 = planted(profile, args.scale)
        print(table(prows, ["planted fault", "expected", "got", "detail", "winner", "result"]), flush=True)
    if not args.skip_fault:
        frows, ok2 = fault(profile)
        print(table(frows, ["config", "outcome", "detail"]), flush=True)
    if not args.skip_correctness:
        rows, ok1 = correctness(deadline, args.configs_per_row, args.jobs, args.scale, args.kernels)
        print(table(rows, ["kernel", "op", "dtype", "checks", "max err", "rtol", "err/best", "result"]))
    save("gpu_check_env.json", {**env, "correct": ok1, "fault_survived": ok2, "planted_refused": ok3})
    print(f"correctness (tolerance, precision gate, two launches bitwise): {'PASS' if ok1 else 'FAIL'}; "
          f"out-of-bounds candidate survived: {'PASS' if ok2 else 'FAIL'}; "
          f"planted faults refused: {'PASS' if ok3 else 'FAIL' if args.planted else 'not run'}")
    return 0 if ok1 and ok2 and ok3 else 1


if __name__ == "__main__":
    sys.exit(main())

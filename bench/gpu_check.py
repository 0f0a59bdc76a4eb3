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


ORDER = ("matmul", "attention", "conv", "layer_norm", "rms_norm", "group_norm", "softmax", "reduce",
         "elementwise_binary", "elementwise_unary")


def correctness(profile, deadline: float, configs_per_row: int) -> tuple[list, bool]:
    """Kernel by kernel in ORDER until the deadline; what did not run is said, not hidden."""
    from nbx_tune.kernels.registry import all_specs
    from nbx_tune.tuner.selfcheck import check_kernel

    rows, raw, ok = [], [], True
    specs = all_specs()
    for name in sorted(specs, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
        spec = specs[name]
        if name.startswith(("test_", "bench_")):
            continue
        if time.monotonic() > deadline:
            rows.append([name, "-", "-", 0, "-", "-", "NOT RUN (time)"])
            continue
        t0 = time.perf_counter()
        per_row = configs_per_row * 2 if name == "matmul" else configs_per_row
        checks = check_kernel(spec, profile, "cuda", scale="gpu", configs_per_row=per_row,
                              deadline=deadline)
        by = defaultdict(list)
        for c in checks:
            by[(c.op, c.dtype)].append(c)
            raw.append({"kernel": name, "op": c.op, "shapes": c.shapes, "dtype": c.dtype, "config": c.config.key(),
                        "err": c.err, "rtol": c.rtol, "reason": c.reason, "detail": c.detail})
        for (op, dt), cs in sorted(by.items()):
            bad = [c for c in cs if not c.ok]
            ok &= not bad
            errs = [c.err for c in cs if c.err is not None]
            rows.append([name, op, dt, len(cs), f"{max(errs):.2e}" if errs else "-", f"{cs[0].rtol:.0e}",
                         "PASS" if not bad else f"FAIL {bad[0].reason}: {bad[0].detail[:60]}"])
        print(f"  {name}: {len(checks)} checks in {time.perf_counter() - t0:.1f} s, "
              f"{sum(not c.ok for c in checks)} failed", flush=True)
        save("gpu_check.json", raw)
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
        rows, ok1 = correctness(profile, deadline, args.configs_per_row)
        print(table(rows, ["kernel", "op", "dtype", "checks", "max err", "rtol", "result"]))
    save("gpu_check_env.json", {**env, "correct": ok1, "fault_survived": ok2})
    print(f"correctness: {'PASS' if ok1 else 'FAIL'}; out-of-bounds candidate survived: {'PASS' if ok2 else 'FAIL'}")
    return 0 if ok1 and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())

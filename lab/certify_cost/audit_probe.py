"""Where an audit's timing goes: a matmul seat (Llama's 4096^3 bf16 row) prepared in this
process as the census's worker prepares it, every candidate compiled first by the census's
compile pool, then each timed as an audit times it (a quick estimate each, then eight
contenders in four turned rounds), with the wall time of each call and the GPU time the
timing itself asked for. Usage: python3 audit_probe.py   (on a GPU; PYTHONPATH holds the
package as nbx_tune)."""

import statistics
import time

import torch

from nbx_tune.kernels.matmul import SPEC
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.timing import benchmarkers as timing
from nbx_tune.tuner.execution.executor import CandidateRunner
from nbx_tune.tuner.execution.precompile import Precompiler
from nbx_tune.tuner.timing.pruned import within
from nbx_tune.kernels.trace import make_row
from nbx_tune.tuner.certify.tune import seat_job, static_prune

def main() -> None:
    prof = get_profile("hopper")
    p = SPEC.problem_from_row(make_row("aten.mm", ["bfloat16", "bfloat16"], [(4096, 4096), (4096, 4096)]))
    job, _ = seat_job(SPEC, prof, "probe", [p], "cuda")
    cands, refused = static_prune(SPEC, prof, p)
    print(f"{len(cands)} candidates ({len(refused)} refused statically)", flush=True)

    t0 = time.perf_counter()
    pool = Precompiler(())
    pool.submit(SPEC.name, (*job.screen_problems, job.time_problem), cands, "cuda")
    while pool.schedule.waiting or pool.schedule.flying:
        time.sleep(0.05)
    print(f"compiled by the pool in {time.perf_counter() - t0:.1f} s", flush=True)
    pool.close()

    bench = timing.for_profile(prof)
    t0 = time.perf_counter()
    runner = CandidateRunner(SPEC, job, bench)
    print(f"inputs and oracles: {time.perf_counter() - t0:.2f} s", flush=True)

    spent = {"_bursts": 0.0, "_estimate": 0.0}
    for name in spent:
        fn = getattr(timing, name)

        def wrapped(*a, _fn=fn, _name=name, **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                spent[_name] += time.perf_counter() - t

        setattr(timing, name, wrapped)

    screen_s, quick_s, quick = [], [], {}
    for c in cands:
        t = time.perf_counter()
        ok = runner.screen(c).ok
        screen_s.append(time.perf_counter() - t)
        if not ok:
            continue
        t = time.perf_counter()
        out = runner.time(c, "quick")
        quick_s.append(time.perf_counter() - t)
        if out.ok:
            quick[c] = out.timing.median_ms
    torch.cuda.synchronize()
    print(f"screens: {len(screen_s)} x median {statistics.median(screen_s) * 1e3:.1f} ms, total {sum(screen_s):.2f} s")
    print(f"quick: {len(quick_s)} x median {statistics.median(quick_s) * 1e3:.1f} ms, total {sum(quick_s):.2f} s; "
          f"graph captures {spent['_bursts']:.2f} s, estimates {spent['_estimate']:.2f} s", flush=True)
    alive = within(quick)
    spent.update(_bursts=0.0, _estimate=0.0)
    round_s = []
    for r in range(4):
        for c in alive[r % len(alive):] + alive[:r % len(alive)]:
            t = time.perf_counter()
            runner.time(c, "round:4")
            round_s.append(time.perf_counter() - t)
    print(f"rounds: {len(round_s)} x median {statistics.median(round_s) * 1e3:.1f} ms, total {sum(round_s):.2f} s; "
          f"graph captures {spent['_bursts']:.2f} s (evicted rigs), estimates {spent['_estimate']:.2f} s")
    print(f"fastest quick {min(quick.values()):.4f} ms; timing's own budget: quick {bench._budget('quick')}, "
          f"round {bench._budget('round:4')} (warm-up ms, timed ms)")


if __name__ == "__main__":  # the compile pool's processes import this module
    main()

"""What the stream timing's first estimate of a config pays for (audit_probe.py found it
20 ms of a quick estimate's 43 ms at a 4096^3 bf16 GEMM): the same 50 candidates timed
"quick" three times over, each pass with fresh rigs (graphs captured anew):
  A: as the census does it (timing._estimate over 4 bursts);
  B: the estimate over 1 burst;
  C: as A, with each new graph replayed once (and waited for) before the estimate, timed
     apart: a graph's first replay uploads it.
Prints each pass's quick wall time, its estimates' and first replays' share, and how far its
quick times land from pass A's. Usage: python3 estimate_probe.py (on a GPU)."""

import statistics
import time

import torch

from nbx_tune.kernels.matmul import SPEC
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.timing import benchmarkers as timing
from nbx_tune.tuner.execution.executor import CandidateRunner
from nbx_tune.tuner.execution.precompile import Precompiler
from nbx_tune.kernels.trace import make_row
from nbx_tune.tuner.certify.tune import seat_job, static_prune
from nbx_tune.testing.bench import accumulating


def main() -> None:
    prof = get_profile("hopper")
    p = SPEC.problem_from_row(make_row("aten.mm", ["bfloat16", "bfloat16"], [(4096, 4096), (4096, 4096)]))
    job, _ = seat_job(SPEC, prof, "probe", [p], "cuda")
    cands, _ = static_prune(SPEC, prof, p)
    pool = Precompiler(())
    pool.submit(SPEC.name, (*job.screen_problems, job.time_problem), cands, "cuda")
    while pool.schedule.waiting or pool.schedule.flying:
        time.sleep(0.05)
    pool.close()
    bench = timing.for_profile(prof)
    runner = CandidateRunner(SPEC, job, bench)
    ok = [c for c in cands if runner.screen(c).ok]
    torch.cuda.synchronize()

    estimate, bursts = timing._estimate, timing._bursts
    spent = {}

    def one_burst(torch_, sleep, step, n):
        return estimate(torch_, sleep, step, 1)

    def replayed_first(torch_, fns):
        out = bursts(torch_, fns)
        t = time.perf_counter()
        out[0]()
        out[1]()
        torch_.cuda.synchronize()
        spent["first replays"] = spent.get("first replays", 0.0) + time.perf_counter() - t
        return out

    base = None
    for tag, est, bur in (("A", estimate, bursts), ("B", one_burst, bursts), ("C", estimate, replayed_first),
                          ("A again", estimate, bursts)):
        timing._estimate, timing._bursts = accumulating(spent, "estimates", est), bur
        spent.clear()
        runner._rigs.clear()
        walls, quick = [], {}
        for c in ok:
            t = time.perf_counter()
            out = runner.time(c, "quick")
            walls.append(time.perf_counter() - t)
            if out.ok:
                quick[c] = out.timing.median_ms
        base = base or quick
        drift = [abs(quick[c] / base[c] - 1) for c in quick if c in base]
        print(f"{tag:8s} quick {len(walls)} x median {statistics.median(walls) * 1e3:5.1f} ms, total {sum(walls):.2f} s; "
              + ", ".join(f"{k} {v:.2f} s" for k, v in spent.items())
              + f"; |quick / A's - 1| median {100 * statistics.median(drift):.1f} %, max {100 * max(drift):.1f} %",
              flush=True)
    timing._estimate, timing._bursts = estimate, bursts


if __name__ == "__main__":  # the compile pool's processes import this module
    main()

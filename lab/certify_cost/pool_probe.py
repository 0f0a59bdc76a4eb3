"""What the first seat waits for (call 15's timeline: its screen 1.5 s behind the compile
pool): a Precompiler started as the census starts it, handed 30 configs of one seat at
once (512 x 4096 x 11008 bf16: two jobs a process), each process's steps on one clock:
forked (its first line), `_init` done (nice, kernels, the GPU's context), each job started
and done; then a process's first compile against its second. Usage: python3
pool_probe.py [JOBS] (on a GPU; run it twice: the first run pays Python's bytecode; with
POOL_PROBE_CONTEXT=1 each process makes its GPU context right after its init, timed
apart, to tell that cost from the rest of a first job's; not run yet)."""

import os
import statistics
import sys
import tempfile
import time

from nbx_tune.tuner.execution import precompile

LOG = os.path.join(tempfile.gettempdir(), f"pool-probe-{os.getpid()}.log")
T0 = time.time()


def timed_serve(jobs, done, done_lock, plugins, environ):
    """precompile._serve_compiles with its steps written to LOG."""
    log = environ["POOL_PROBE_LOG"]
    t0 = float(environ["POOL_PROBE_T0"])

    def mark(what):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {time.time() - t0:.3f} {what}\n")

    mark("forked")
    precompile._init(plugins, environ)
    mark("init done")
    if environ.get("POOL_PROBE_CONTEXT") == "1":  # the GPU context and a first allocation, timed alone
        import torch

        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        mark("context made")
    from triton.runtime.jit import JITFunction

    def getitem(self, grid):  # precompile._compile_only's, its two steps timed apart
        def compile_(*args, **kwargs):
            t = time.time()
            kernel = self.run(*args, grid=grid, warmup=True, **kwargs)
            t1 = time.time()
            load = getattr(kernel, "_init_handles", None)
            if load is not None:
                load()
            mark(f"compiled {t1 - t:.3f} loaded {time.time() - t1:.3f}")
            return kernel
        return compile_

    JITFunction.__getitem__ = getitem
    while True:
        job = jobs.get()
        if job is None:
            return
        mark("job starts")
        precompile._take(jobs, job)
        mark("job done")
        with done_lock:
            done.send(job[:4])


def main() -> None:
    from nbx_tune.kernels.matmul import SPEC
    from nbx_tune.kernels.rows import make_row
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.certify.tune import seat_job, static_prune

    os.environ["POOL_PROBE_LOG"], os.environ["POOL_PROBE_T0"] = LOG, repr(T0)
    precompile._serve_compiles = timed_serve
    pool = precompile.Precompiler(())
    t_pool = time.time() - T0
    import torch  # as the census's parent does, beside the pool's start

    torch.cuda.init()
    prof = get_profile("hopper")
    p = SPEC.problem_from_row(make_row("aten.mm", ["bfloat16", "bfloat16"], [(512, 4096), (4096, 11008)]))
    job, _ = seat_job(SPEC, prof, "probe", [p], "cuda")
    cands, _ = static_prune(SPEC, prof, p)
    t_submit = time.time() - T0
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    pool.submit(SPEC.name, (*job.screen_problems, job.time_problem), cands[:n], "cuda")
    while pool.schedule.waiting or pool.schedule.flying:
        time.sleep(0.02)
    t_done = time.time() - T0
    pool.close()
    steps, splits = {}, {}
    with open(LOG) as f:
        for line in f:
            pid, at, what = line.split(" ", 2)
            if not what.startswith("compiled"):
                steps.setdefault(pid, []).append((float(at), what.strip()))
            else:
                splits.setdefault(pid, []).append(what.strip())
    print(f"pool made at {t_pool:.2f} s; {n} jobs submitted at {t_submit:.2f} s, all done at {t_done:.2f} s")
    forked = sorted(s[0][0] for s in steps.values())
    inits = [next(a for a, w in s if w == "init done") - s[0][0] for s in steps.values()
             if any(w == "init done" for _, w in s)]
    jobs = [b - a for s in steps.values() for (a, w), (b, w2) in zip(s, s[1:]) if w == "job starts" and w2 == "job done"]
    first_job = [next(a for a, w in s if w == "job starts") for s in steps.values() if any(w == "job starts" for _, w in s)]
    print(f"{len(steps)} processes forked from {forked[0]:.2f} to {forked[-1]:.2f} s; init median "
          f"{statistics.median(inits):.2f} s, max {max(inits):.2f} s")
    made = [next(a for a, w in s if w == "context made") - next(a for a, w in s if w == "init done")
            for s in steps.values() if any(w == "context made" for _, w in s)]
    if made:
        print(f"GPU context and first allocation after init: median {statistics.median(made):.2f} s, "
              f"max {max(made):.2f} s")
    print(f"{len(jobs)} jobs: first started at {min(first_job):.2f} s; compile median {statistics.median(jobs):.2f} s, "
          f"max {max(jobs):.2f} s")
    nth = {}
    for st in steps.values():
        done = [b - a for (a, w), (b, w2) in zip(st, st[1:]) if w == "job starts" and w2 == "job done"]
        for i, d in enumerate(done):
            nth.setdefault(i, []).append(d)
    print("a process's compiles in order: " + "; ".join(
        f"job {i + 1}: median {statistics.median(v):.2f} s over {len(v)}" for i, v in sorted(nth.items())))
    split = {}
    for st in splits.values():
        for i, w in enumerate(st):
            _, c, _, ld = w.split()
            split.setdefault(i, []).append((float(c), float(ld)))
    print("its steps in order: " + "; ".join(
        f"job {i + 1}: compile {statistics.median(c for c, _ in v):.2f} s, load (launcher, module) "
        f"{statistics.median(ld for _, ld in v):.2f} s" for i, v in sorted(split.items())))
    os.unlink(LOG)


if __name__ == "__main__":
    main()

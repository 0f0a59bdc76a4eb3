"""What a screen case's draw pays for (call 14's case probe: 0.13-0.18 s a GEMM case on the
H100's host, 40 % of its inputs and oracle): 45M float32 values (a 4096 x 11008 operand)
drawn as `Sampler.random` draws them, then the steps apart: a fresh array's page faults
(np.empty then a fill), the generators into a buffer already touched, the copy of a block,
and the in-place scaling of `kernels.spec.uniform_inputs`; then the draw right after a torch
op, as a case's draw follows the last case's (torch's threads may still spin). Best of three each. Usage:
python3 draw_probe.py (any host; numbers are the host's)."""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from nbx_tune.tuner.certify.screen import BLOCK, Sampler

N = 4096 * 11008


def best(fn, n=3):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> None:
    threads = Sampler(0).threads
    starts = range(0, N, BLOCK)
    touched = np.empty(N, np.float32)
    touched.fill(0)

    def gens_into(buf):
        def fill(i):
            np.random.default_rng([1, 1, i]).random(dtype=np.float32, out=buf[starts[i]:starts[i] + BLOCK])
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fill, range(len(starts))))

    def fresh_fill():
        x = np.empty(N, np.float32)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda i: x[starts[i]:starts[i] + BLOCK].fill(0), range(len(starts))))

    rows = {
        "Sampler.random (as a case draws)": lambda: Sampler(1).random((4096, 11008), dtype=np.float32),
        "np.empty + fill on threads (page faults)": fresh_fill,
        "generators into a touched buffer": lambda: gens_into(touched),
        "generators into a fresh buffer": lambda: gens_into(np.empty(N, np.float32)),
        "torch copy of a touched buffer": lambda: torch.from_numpy(touched).clone(),
        "uniform_inputs' scaling in place": lambda: torch.from_numpy(touched).mul_(2.0).sub_(1.0),
        "one generator, one thread": lambda: np.random.default_rng(1).random(N, dtype=np.float32),
    }
    # As a case draws: right after torch's threads ran (the last case's rounding, widening),
    # timed from the draw's start only.
    after = []
    for _ in range(3):
        torch.from_numpy(touched).mul_(1.0)
        t = time.perf_counter()
        Sampler(1).random((4096, 11008), dtype=np.float32)
        after.append(time.perf_counter() - t)
    print(f"{os.cpu_count()} cores, {threads} threads, torch threads {torch.get_num_threads()}, {N / 1e6:.0f}M float32")
    for name, fn in rows.items():
        print(f"  {name:44s} {best(fn) * 1e3:7.1f} ms", flush=True)
    print(f"  {'Sampler.random right after a torch op':44s} {min(after) * 1e3:7.1f} ms (max {max(after) * 1e3:.1f})")
    # A GEMM case's whole draw (make_inputs: a, b), as the case probe times it (0.1-0.17 s
    # there), before and after the process has a GPU context and ran a product; the last
    # one under cProfile.
    import cProfile
    import pstats

    from nbx_tune.kernels.matmul import SPEC
    from nbx_tune.kernels.rows import make_row

    p = SPEC.problem_from_row(make_row("aten.mm", ["bfloat16"] * 2, [(496, 3984), (3984, 3984)]))
    print(f"  {'make_inputs (496 x 3984 x 3984), no GPU yet':44s} {best(lambda: SPEC.make_inputs(p, Sampler(5))) * 1e3:7.1f} ms")
    if torch.cuda.is_available():
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.float64)
        (x @ x).cpu()
        print(f"  {'make_inputs, after a GPU product':44s} {best(lambda: SPEC.make_inputs(p, Sampler(5))) * 1e3:7.1f} ms")
    prof = cProfile.Profile()
    prof.runcall(SPEC.make_inputs, p, Sampler(5))
    pstats.Stats(prof).sort_stats("tottime").print_stats(8)
    # The case probe's process holds gigabytes (the oracle's kept float64 buffers): the same
    # draw with 6 GiB held and touched, and the kernel's huge-page settings.
    for f in ("enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{f}") as fh:
                print(f"  transparent_hugepage/{f}: {fh.read().strip()}")
        except OSError:
            pass
    held = np.ones(6 << 27)  # 6 GiB of float64, touched
    print(f"  {'make_inputs, 6 GiB held':44s} {best(lambda: SPEC.make_inputs(p, Sampler(5))) * 1e3:7.1f} ms")
    print(f"  {'np.empty + fill on threads, 6 GiB held':44s} {best(fresh_fill) * 1e3:7.1f} ms")
    del held


if __name__ == "__main__":
    main()

"""How long a census's processes take to import what they need, alone and 17 at once (a
census starts its parent, its worker and 15 compile processes together). Each run is a
fresh interpreter timing its own imports: torch, then triton, then the package's kernels.
Usage: python3 start_probe.py [REPEATS]   (PYTHONPATH must hold the package as nbx_tune)."""

import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, time
t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); import triton; t2 = time.perf_counter()
import nbx_tune.kernels.runtime.registry as r; r.all_specs(); t3 = time.perf_counter()
print(json.dumps([t1 - t0, t2 - t1, t3 - t2]))
"""


def run(n: int) -> list:
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    return [json.loads(p.communicate()[0]) for p in procs]


def show(tag: str, rows: list) -> None:
    cols = list(zip(*rows))
    print(f"{tag:<14} " + "  ".join(f"{name} {statistics.median(c):.2f} s (max {max(c):.2f})"
                                      for name, c in zip(("torch", "triton", "kernels"), cols)))


if __name__ == "__main__":
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    run(1)  # bytecode and page cache warmed
    show("alone", [run(1)[0] for _ in range(repeats)])
    for n in (4, 17):
        show(f"{n} at once", [r for _ in range(repeats) for r in run(n)])

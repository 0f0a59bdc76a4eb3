"""GPU probe for the screen's resident operands (tuner/screen.on_device): GEMM cases of the
Llama-2-7B seq512 rows made as a census makes them, with the product reading the inputs
already on the device, then with every operand uploaded (resident=() as before), in turn;
every GPU product must pass Freivalds' check (a failed check falls back to numpy and would
show here). Prints seconds per case each way."""

import statistics
import time

import torch

from nbx_tune.kernels.matmul import SPEC
from nbx_tune.oracles import products
from nbx_tune.tuner import screen
from nbx_tune.tuner.trace import make_row

checks = []
_agrees = products._agrees
products._agrees = lambda out, want, bound: checks.append(_agrees(out, want, bound)) or checks[-1]

shapes = [((512, 4096), (4096, 4096)), ((512, 4096), (4096, 11008)), ((512, 11008), (11008, 4096)),
          ((512, 4096), (4096, 32000)), ((4096, 4096), (4096, 4096))]
problems = [SPEC.problem_from_row(make_row("aten.mm", ["bfloat16", "bfloat16"], list(s))) for s in shapes]
real = screen.device_product
times = {"resident": [], "uploaded": []}
for rep in range(3):
    for how in ("resident", "uploaded"):
        screen.device_product = real if how == "resident" else (lambda d, resident=(): real(d, ()))
        for p in problems:
            torch.cuda.synchronize()
            phases = {}
            t0 = time.perf_counter()
            screen.make_case(SPEC, p, "cuda", screen.seed_for("probe", p), True, phases)
            torch.cuda.synchronize()
            times[how].append((p.dims, time.perf_counter() - t0, phases.get("oracle", 0.0)))
print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; GPU products checked: {len(checks)}, "
      f"passed: {sum(checks)}")
for how, xs in times.items():
    by = {}
    for dims, t, o in xs:
        by.setdefault(dims, []).append((t, o))
    for dims, v in by.items():
        print(f"{how:9s} {dims}: case {statistics.median(t for t, _ in v):.3f} s, oracle "
              f"{statistics.median(o for _, o in v):.3f} s (median of {len(v)})")

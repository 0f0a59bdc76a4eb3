"""Host microseconds per eager call, one op of every kernel family at a small shape, side by
side in one run: the certified call (a replay of its compiled kernel, kernels/runtime/launch.py),
its own Python work (the same call with the compiled kernel's launcher mocked), the floor
(`CompiledKernel[grid]` called with prebuilt arguments: the addresses a replay passes, and
tensors as Triton's own launch passes them), the compiled kernel's launcher called without
CompiledKernel[grid]'s wrapper, a plain Triton launch of the same kernel and config with
prebuilt arguments, the op's ordinary path (checks, config lookup, allocation,
Triton's launch: every call before the direct launch), and torch's op.

    python bench/launch_overhead.py            # on the GPU, after a census of its ops
    python bench/launch_overhead.py --cpu      # the CPU: own work and ordinary path, mocked kernels

The census certifies the ops' seats first (recorded from the torch ops, about 3 s a seat);
--no-census times the declared defaults instead (a miss counted on every call).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

CPU = "--cpu" in sys.argv
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from nbx_tune.testing.bench import environment, save, table  # noqa: E402

CALLS, RUNS = (300, 5) if CPU else (1000, 7)


def cases(torch, dev, dt):
    """(family, name, nbx op, torch op, args, kwargs): small shapes, a decode step's where
    one fits, each kernel a few microseconds at most so that the loop times the host."""
    import torch.nn.functional as F

    from nbx_tune import kernels as K
    from nbx_tune.kernels.serving import custom_ops
    from nbx_tune.kernels.softmax import softmax

    def r(*shape):
        return torch.randn(*shape, device=dev, dtype=dt)

    x, y = r(1, 11008), r(1, 11008)
    return [
        ("elementwise_unary", "silu 1x11008", K.silu, F.silu, (x,), {}),
        ("elementwise_binary", "mul 1x11008", K.mul, torch.mul, (x, y), {}),
        ("attention", "sdpa decode 1x8x1x64, 128 keys", K.scaled_dot_product_attention,
         F.scaled_dot_product_attention, (r(1, 8, 1, 64), r(1, 8, 128, 64), r(1, 8, 128, 64)), {}),
        ("layer_norm", "layer_norm 4x4096", K.layer_norm, F.layer_norm, (r(4, 4096), (4096,), r(4096), r(4096)), {}),
        ("rms_norm", "rms_norm 1x4096", K.rms_norm, F.rms_norm, (r(1, 4096), (4096,), r(4096)), {}),
        ("softmax", "softmax 8x512", softmax, torch.softmax, (r(8, 512), -1), {}),
        ("reduce", "sum 8x4096 dim -1", K.sum, torch.sum, (r(8, 4096), -1), {}),
        ("conv", "conv2d 1x16x16x16 3x3", K.conv2d, F.conv2d, (r(1, 16, 16, 16), r(16, 16, 3, 3)), {"padding": 1}),
        ("matmul", "mm 64x64x64", K.mm, torch.mm, (r(64, 64), r(64, 64)), {}),
        # torch's side is the pattern as a model writes it (5 launches for rotary, 2 for silu_mul)
        ("rotary", "rotary decode 1x32x1x128", K.rotary, custom_ops.rotary,
         (r(1, 1, 32, 128).transpose(1, 2), r(1, 1, 128), r(1, 1, 128)), {}),
        ("silu_mul", "silu_mul 1x11008", K.silu_mul, custom_ops.silu_mul, (x, y), {}),
    ]


def host_us(fn, sync) -> float:
    for _ in range(20):
        fn()
    sync()
    runs = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        runs.append((time.perf_counter() - t0) / CALLS * 1e6)
        sync()
    return statistics.median(runs)


def calls(pairs):
    """One function making the calls (fn, args) in order; a lone call without a loop."""
    if len(pairs) == 1:
        (fn, args), = pairs
        return lambda: fn(*args)
    return lambda: [fn(*args) for fn, args in pairs]


class Capture:
    """launch.through_triton for the bench: Triton's launch as usual (or none, `mock`), and
    compiled kernels whose runners log what a replay passes them, or do nothing (`noop`)."""

    def __init__(self, real, mock: bool):
        self.real, self.mock = real, mock
        self.launches, self.calls, self.noop = [], [], False

    def __call__(self, kernel, grid, args, kwargs):
        compiled = None if self.mock else self.real(kernel, grid, args, kwargs)
        self.launches.append((kernel, compiled, grid, args, kwargs))
        return _Proxy(self, compiled)


class _Proxy:
    def __init__(self, cap, compiled):
        self.cap, self.compiled = cap, compiled

    def __getitem__(self, grid):
        cap = self.cap
        real = None if self.compiled is None else self.compiled[grid]

        def runner(*args):
            if cap.noop:
                return
            cap.calls.append((real, args))
            real(*args)
        return runner


def leaner(torch, recorded, replayed):
    """What a replay would cost calling each compiled kernel's launcher (`CompiledKernel.run`)
    itself, as CompiledKernel[grid] does but without its device lookup and launch-hook
    metadata (no hooks set here); None where this Triton's launcher takes other arguments."""
    from triton.runtime import driver

    def fn():
        for run, function, meta, g3, args in launches:
            run(g3[0], g3[1], g3[2], stream_of(device), function, meta, None, None, None, *args)
    try:
        stream_of, device = driver.active.get_current_stream, torch.cuda.current_device()
        launches = [(c.run, c.function, c.packed_metadata, tuple((*g, 1, 1)[:3]), args)
                    for (_, c, g, _, _), (_, args) in zip(recorded, replayed)]
        fn()
        torch.cuda.synchronize()
    except Exception as e:  # another Triton: not measured
        print(f"leaner launcher not measured: {type(e).__name__}: {e}")
        return None
    return fn


def certify(torch, all_cases) -> None:
    from nbx_tune import record
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.tuner import commands as api

    work = Path(tempfile.mkdtemp(prefix="nbx-lo-"))
    with record(work / "t.tsv"):
        for _, _, _, ref, args, kw in all_cases:
            ref(*args, **kw)
    db = f"sqlite:///{work / 'lo.db'}"
    api.census(str(work / "t.tsv"), db)
    os.environ["NBX_TUNE_DB"] = db
    certified.reload()


def main() -> None:
    import torch

    from nbx_tune.kernels.runtime import certified, launch

    dev = "cpu" if CPU else "cuda"
    dt = torch.float32 if CPU else torch.bfloat16
    sync = (lambda: None) if CPU else torch.cuda.synchronize
    all_cases = cases(torch, dev, dt)
    if not CPU and "--no-census" not in sys.argv:
        certify(torch, all_cases)
    real_through, real_remember = launch.through_triton, launch.remember
    rows, raw = [], {}
    for family, name, op, ref, args, kw in all_cases:
        call = (lambda op=op, args=args, kw=kw: op(*args, **kw))
        res = {}
        cap = Capture(real_through, mock=CPU)
        cap.noop = CPU
        launch.forget()
        launch.through_triton = cap
        try:
            first = call()  # through Triton, recorded
            second = call()  # the replay, its arguments logged
            if not launch.REMEMBERED:
                print(f"{name}: not remembered: {dict(launch.REFUSED)}")
                continue
            recorded, replayed = list(cap.launches), list(cap.calls)
            if not CPU:
                launch.forget()
                launch.through_triton = real_through
                call()
                res["certified call"] = host_us(call, sync)  # a replay with nothing in its way
                launch.through_triton = cap
            cap.noop = True
            launch.forget()
            call()
            res["  its own work (compiled kernel mocked)"] = host_us(call, sync)
            if not CPU:
                if not torch.equal(first, second):  # proofs/direct_launch_check.py is the proof
                    print(f"{name}: MISMATCH: the replay differs from Triton's launch")
                if not torch.allclose(second.float(), ref(*args, **kw).float(), atol=5e-2, rtol=5e-2):
                    print(f"{name}: MISMATCH against torch's op")
                res["  floor: CompiledKernel[grid], a replay's arguments"] = host_us(calls(replayed), sync)
                floors = [(c[tuple((*g, 1, 1)[:3])], launch._bound(k, a, kw_)) for k, c, g, a, kw_ in recorded]
                res["  floor: CompiledKernel[grid], tensors"] = host_us(calls(floors), sync)
                lean = leaner(torch, recorded, replayed)
                if lean is not None:
                    res["  leaner: the compiled kernel's launcher called directly"] = host_us(lean, sync)
                res["plain Triton launch, same config"] = host_us(
                    lambda: [k[g](*a, **kw_) for k, _, g, a, kw_ in recorded], sync)
                launch.through_triton = real_through
            launch.remember = lambda key, inputs, slow, *a: slow(*a)
            launch.forget()
            res["ordinary path (checks, lookup, allocation, launch)" if not CPU
                else "ordinary path, Triton's launch mocked"] = host_us(call, sync)
        finally:
            launch.through_triton, launch.remember = real_through, real_remember
        if not CPU:
            res["torch"] = host_us(lambda: ref(*args, **kw), sync)
        raw[name] = {"family": family, **res}
        base = res.get("  floor: CompiledKernel[grid], tensors")
        for path, us in res.items():
            rows.append([name, path, f"{us:.2f}", "" if base is None else f"{us - base:+.2f}"])
    launch.forget()
    misses = certified.launch_stats()["misses"]
    env = environment()
    save("launch_overhead_cpu.json" if CPU else "launch_overhead.json",
         {"env": env, "us_per_call": raw, "misses": misses, "calls": CALLS, "runs": RUNS})
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table(rows, [f"op ({str(dt).removeprefix('torch.')})", "path", "host us/call", "vs floor"]))
    if misses and not CPU:
        print(f"seats served uncertified (a miss counted per call): {misses}")


if __name__ == "__main__":
    main()

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
    python bench/launch_overhead.py --serve    # on the GPU: serve()'s path against torch's op, per family
    python bench/launch_overhead.py --serve --smoke   # the same on the CPU interpreter, few calls
    python bench/launch_overhead.py --serve --cpu     # serve()'s own host work, launches mocked
    python bench/launch_overhead.py --serve --only softcap,gelu_mul   # some families only

--serve times what a model under serve() pays per call eager: torch's own op called as a
model calls it, under serve() (the dispatcher's override, serve()'s route, the kernel's
replay; or torch where serve() hands the call back, kernels/runtime/eager_rule.py) against
the same call without serve(), host microseconds per call over back-to-back calls, side by
side, with what serve() ran (certified, default, torch and why) and the host times its
eager rule measured.

--serve --cpu times serve()'s path on the CPU with the compiled kernel's launcher mocked (a
no-op reached through the replay, every seat read as certified, as after a census): the
dispatcher's override, the route, the checks, allocation and the replay, without the
interpreter's milliseconds or a GPU; torch's column there is a CPU kernel, a reference only.

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

SMOKE = "--smoke" in sys.argv
CPU = "--cpu" in sys.argv or SMOKE
MOCKED = CPU and not SMOKE and "--serve" in sys.argv  # serve()'s host work, launches mocked
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from nbx_tune.testing.bench import environment, save, table  # noqa: E402

CALLS, RUNS = (3, 2) if SMOKE else (300, 5) if CPU else (1000, 7)


def cases(torch, dev, dt):
    """(family, name, nbx op, torch op, args, kwargs): small shapes, a decode step's where
    one fits, each kernel a few microseconds at most so that the loop times the host."""
    import torch.nn.functional as F

    from nbx_tune import kernels as K
    from nbx_tune.kernels import fill
    from nbx_tune.kernels.serving import custom_ops, gemma_ops
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
        # Gemma's: torch's side is the pattern (2 launches for gelu_mul, 3 for softcap, 7 for the
        # score chain with a cap and a mask: scale, div, tanh, mul, add, softmax, cast; 10 for the norm)
        ("gelu_mul", "gelu_mul 1x9216", K.gelu_mul, gemma_ops.gelu_mul, (r(1, 9216), r(1, 9216)), {}),
        ("softcap", "softcap 1x2048, cap 30", K.softcap, gemma_ops.softcap, (r(1, 2048), 30.0), {}),
        ("score_softmax", "score chain 1x8x1x1024, cap 50, mask", K.score_softmax, gemma_ops.score_softmax,
         (r(1, 8, 1, 1024), 0.0625, 50.0, torch.zeros(1, 1, 1, 1024, device=dev, dtype=dt)), {}),
        ("offset_rms_norm", "Gemma's rms_norm 1x2304", K.offset_rms_norm, gemma_ops.offset_rms_norm,
         (r(1, 2304), r(2304), 1e-6), {}),
        ("embedding", "embedding 1x8 of 32000x256", lambda i, w: K.embedding(w, i), F.embedding,
         (torch.randint(0, 32000, (1, 8), device=dev), r(32000, 256)), {}),
        # a mask's ops: a comparison with a number, and where with a value
        ("compare", "gt 1x1x8x1024 > 0", K.gt, torch.gt, (r(1, 1, 8, 1024), 0), {}),
        ("where", "where mask 1x1x8x1024, -1e4", K.where, torch.where,
         (r(1, 1, 8, 1024) > 0, r(1, 1, 8, 1024), -1e4), {}),
        # an MoE layer's router: top-2 of 8 experts, and the offsets of its expert counts
        ("row_sort", "topk 4x8, k 2", K.topk, torch.topk, (r(4, 8), 2), {}),
        ("cumsum", "cumsum 8 int64", K.cumsum, torch.cumsum,
         (torch.randint(0, 9, (8,), device=dev), 0), {}),
        # a decode step's keys written into a buffer
        ("copy", "copy_ 1x8x128", K.copy_, torch.Tensor.copy_,
         (r(1, 8, 128), r(1, 8, 128)), {}),
        # a buffer made like another (an MoE layer's output, zeroed)
        ("fill", "zeros_like 1x8x1024", fill.zeros_like, torch.zeros_like, (r(1, 8, 1024),), {}),
        # a model's linear with a bias: torch.addmm on the transposed weight
        ("addmm", "linear 4x256 -> 256 with bias", lambda a, w, b: K.addmm(b, a, w.t()), F.linear,
         (r(4, 256), r(256, 256), r(256)), {}),
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
    # mocked, on a shared CPU: the least run is the steady state, the rest other jobs' time
    return min(runs) if MOCKED else statistics.median(runs)


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


def serve_side_by_side(torch, all_cases, sync) -> None:
    """Per family: host us per call of torch's op as a model calls it, under serve() and
    without, in alternating rounds; what serve() ran and its eager rule's host times."""
    import nbx_tune
    from nbx_tune.kernels.serving import serve as serving

    rows, raw = [], {}
    if MOCKED:
        mock_launches()
    for family, name, _, ref, args, kw in all_cases:
        call = (lambda ref=ref, args=args, kw=kw: ref(*args, **kw))
        with nbx_tune.serve():
            for _ in range(3):  # compile, record, and let the eager rule ask for host times
                call()
        times = {"torch": [], "serve": []}
        for rnd in range(2 if SMOKE else 4):  # turned rounds: drift reaches both alike
            for side in (("torch", "serve") if rnd % 2 == 0 else ("serve", "torch")):
                if side == "serve":
                    with nbx_tune.serve():
                        times[side].append(host_us(call, sync))
                else:
                    times[side].append(host_us(call, sync))
        serving.reset_stats()
        with nbx_tune.serve():
            call()
        ran = serving.stats()
        t, s = (statistics.median(times[k]) for k in ("torch", "serve"))
        what = "; ".join(f"{op}: {d['certified']} certified, {d['default']} default, {d['torch']} torch"
                         + (f" ({', '.join(d['reasons'])})" if d["reasons"] else "") for op, d in ran.items())
        raw[name] = {"family": family, "torch_us": t, "serve_us": s, "ran": ran}
        rows.append([family, name, f"{t:.2f}", f"{s:.2f}", f"{t / s:.2f}", what[:110]])
    clocks = serving.host_clocks()
    save("launch_overhead_serve_smoke.json" if SMOKE else "launch_overhead_serve_cpu.json" if MOCKED
         else "launch_overhead_serve.json",
         {"env": environment(), "us_per_call": raw, "host_clocks_ms": clocks, "calls": CALLS, "runs": RUNS})
    print(table(rows, ["family", "call", "torch us", "serve us", "torch/serve", "serve ran (one call)"]))
    for op, c in clocks.items():
        print(f"eager rule's host times, {op}: served {c['served_ms'] * 1e3:.2f} us, torch {c['torch_ms'] * 1e3:.2f} us")


def mock_launches() -> None:
    """--serve --cpu: Triton's launch returns a compiled kernel whose launcher does nothing,
    and every seat reads as certified (a replay counts no miss, as after the census)."""
    import torch

    from nbx_tune.kernels.runtime import certified, launch

    torch.set_num_threads(1)  # torch's column: no intra-op threads spinning on a shared host
    cap = Capture(launch.through_triton, mock=True)
    cap.noop = True
    launch.through_triton = cap
    resolve = certified._resolve
    certified._resolve = lambda *a: (lambda hit: (hit[0], None, hit[2]))(resolve(*a))  # (config, miss, check)
    certified.reload()


def main() -> None:
    import torch

    from nbx_tune.kernels.runtime import certified, launch

    dev = "cpu" if CPU else "cuda"
    dt = torch.float32 if CPU else torch.bfloat16
    sync = (lambda: None) if CPU else torch.cuda.synchronize
    all_cases = cases(torch, dev, dt)
    only = next((a.split("=", 1)[1] if "=" in a else sys.argv[i + 1] for i, a in enumerate(sys.argv)
                 if a.startswith("--only")), None)
    if only:
        all_cases = [c for c in all_cases if c[0] in only.split(",")]
    if not CPU and "--no-census" not in sys.argv:
        certify(torch, all_cases)
    if "--serve" in sys.argv:
        env = environment()
        print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}, "
              f"{str(dt).removeprefix('torch.')}, host us per call over {CALLS} back-to-back calls"
              + (", launches mocked (serve()'s own host work)" if MOCKED else ""))
        serve_side_by_side(torch, all_cases, sync)
        return
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

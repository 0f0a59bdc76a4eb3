"""Can the compile pool compile with no GPU context (call 23: 15 processes making theirs at
once took 1.8 s each before their first compile)? One seat's configs (512 x 4096 x 11008
bf16, spread over its space) are compiled in a fresh process and a fresh Triton cache three
ways: `meta` (precompile as it is now: meta tensors, the launcher built, nothing loaded),
`device` (as before: empty CUDA tensors, the binary loaded) and `none` (nothing compiled).
Then a second process, as the worker does, launches each config on real tensors over that
cache. Printed: each way's compile time and whether the GPU's primary context was active
after it, and the worker's first launches (time, and files Triton added to the cache: none
means every launch found its binary and launcher there). Usage: python3 meta_probe.py [N]."""

import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

WAYS = ("meta", "device", "none")


def configs(n):
    from nbx_tune.kernels.matmul import SPEC
    from nbx_tune.kernels.rows import make_row
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.certify.tune import static_prune

    p = SPEC.problem_from_row(make_row("aten.mm", ["bfloat16", "bfloat16"], [(512, 4096), (4096, 11008)]))
    cands, _ = static_prune(SPEC, get_profile("hopper"), p)
    step = max(1, len(cands) // n)
    return SPEC, p, cands[::step][:n]


def context_active() -> int:
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuInit(0)
    dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    cu.cuDeviceGet(ctypes.byref(dev), 0)
    cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
    return active.value


def old_compile(spec, p, config):
    """precompile._compile before: the seat's tensors empty on the GPU."""
    import torch

    from nbx_tune.tuner.certify.screen import TORCH_DTYPES

    try:
        inputs = {k: torch.empty(s, dtype=TORCH_DTYPES[d], device="cuda") for k, (s, d) in spec.input_shapes(p).items()}
        outputs = {k: torch.empty(s, dtype=TORCH_DTYPES[d], device="cuda") for k, (s, d) in spec.output_specs(p).items()}
        spec.launch(config, p, inputs, outputs)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def compile_side(way, n):
    import torch

    from nbx_tune.tuner.execution import precompile

    spec, p, cands = configs(n)
    t0 = time.time()
    torch.cuda.init()
    device = "cuda"
    if way == "meta":
        precompile._compile_only()
    else:  # the pool before: every launch compiled and loaded on empty CUDA tensors
        from triton.runtime.jit import JITFunction

        def getitem(self, grid):
            def compile_(*args, **kwargs):
                k = self.run(*args, grid=grid, warmup=True, **kwargs)
                k._init_handles()
                return k
            return compile_
        JITFunction.__getitem__ = getitem
        if way == "device":
            torch.empty(1, device="cuda")
    times, errors = [], []
    for c in cands:
        t = time.time()
        err = (precompile._compile(spec.name, (p,), c, device) if way == "meta"
               else old_compile(spec, p, c) if way == "device" else None)
        times.append(time.time() - t)
        if err:
            errors.append(f"{c.key()}: {err}")
    print(f"{way}: {len(cands)} configs compiled in {sum(times):.2f} s (first {times[0]:.2f} s, median "
          f"{statistics.median(times):.2f} s) after {t0 - T0:.2f} s of imports; primary context active "
          f"after: {context_active()}; errors: {len(errors)}")
    for e in errors[:5]:
        print("   ", e)
    if way == "meta":
        import inspect

        from triton.compiler.compiler import CompiledKernel

        print("    CompiledKernel._init_handles:", " | ".join(
            ln.strip() for ln in inspect.getsource(CompiledKernel._init_handles).splitlines()[:14]))


def launch_side(way, n):
    import torch

    from nbx_tune.tuner.certify.screen import TORCH_DTYPES

    spec, p, cands = configs(n)
    cache = os.environ["TRITON_CACHE_DIR"]
    before = {os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs}
    torch.empty(1, device="cuda")
    inputs = {k: torch.randn(s, device="cuda").to(TORCH_DTYPES[d]) for k, (s, d) in spec.input_shapes(p).items()}
    outputs = {k: torch.empty(s, dtype=TORCH_DTYPES[d], device="cuda") for k, (s, d) in spec.output_specs(p).items()}
    torch.cuda.synchronize()
    times = []
    for c in cands:
        t = time.time()
        spec.launch(c, p, inputs, outputs)
        torch.cuda.synchronize()
        times.append(time.time() - t)
    after = {os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs}
    new = sorted(os.path.basename(f) for f in after - before)
    print(f"  worker over the `{way}` cache: first launches {sum(times):.2f} s (first {times[0]:.2f} s, median "
          f"{statistics.median(times):.3f} s); files added to the cache: {len(new)} {new[:6]}")


T0 = time.time()


def steps():
    """Which step of a meta compile makes the GPU's context: checked after each."""
    import torch

    from nbx_tune.tuner.execution import precompile

    print(f"steps: imported: {context_active()}")
    torch.cuda.init()
    print(f"  torch.cuda.init: {context_active()}")
    from triton.runtime import driver

    d = driver.active
    print(f"  driver.active: {context_active()}")
    dev = d.get_current_device()
    print(f"  get_current_device: {context_active()}")
    d.get_current_stream = precompile._no_stream  # as precompile._compile_only does
    d.get_current_stream(dev)
    print(f"  get_current_stream (none): {context_active()}")
    d.get_current_target()
    print(f"  get_current_target: {context_active()}")
    d.utils
    print(f"  driver.utils: {context_active()}")
    spec, p, cands = configs(2)
    from triton.runtime.jit import JITFunction

    kernels = []

    def getitem(self, grid):
        def compile_(*args, **kwargs):
            k = self.run(*args, grid=grid, warmup=True, **kwargs)
            print(f"  JITFunction.run(warmup=True): {context_active()}")
            kernels.append(k)
            return k
        return compile_
    JITFunction.__getitem__ = getitem
    precompile._compile(spec.name, (p,), cands[0], "cuda")
    print(f"  after the launch: {context_active()}")
    d.launcher_cls(kernels[0].src, kernels[0].metadata)
    print(f"  launcher_cls: {context_active()}")


def main():
    if sys.argv[1:2] == ["steps"]:
        steps()
        return
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    if len(sys.argv) > 1 and sys.argv[1] in ("compile", "launch"):
        (compile_side if sys.argv[1] == "compile" else launch_side)(os.environ["META_PROBE_WAY"], n)
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    for way in WAYS:
        cache = tempfile.mkdtemp(prefix=f"meta-probe-{way}-")
        env = dict(os.environ, TRITON_CACHE_DIR=cache, META_PROBE_WAY=way)
        for side in ("compile", "launch"):
            subprocess.run([sys.executable, __file__, side, str(n)], env=env, check=False)


if __name__ == "__main__":
    main()

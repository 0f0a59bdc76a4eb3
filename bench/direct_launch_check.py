"""GPU proof of matmul's direct launch (kernels/certified.py `direct_launch`): for each case,
the launch through Triton and the direct launch that follows give bit-identical outputs,
and direct launches on new data in the same buffers match the fp64 reference. The cases
cover what Triton specializes a compile on: integers equal to 1 or divisible by 16,
pointers off 16-byte alignment, transposed strides, broadcast biases, integer alpha/beta.

    python bench/direct_launch_check.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment, save, table  # noqa: E402

DEV = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"  # cpu: a smoke run
RTOL = {"float16": 2e-2, "bfloat16": 4e-2, "float32": 1e-4}
WIDE_CASE = "mm 512x4096x11008"


def cases(torch, dt):
    """(name, op, make(buffers) -> args), buffers allocated once so addresses repeat."""
    from nbx_tune.kernels import addmm, baddbmm, bmm, mm

    def buf(*shape, offset=0):
        flat = torch.empty(offset + math.prod(shape), device=DEV, dtype=dt)
        return flat[offset:].view(*shape)

    return [
        ("mm 37x23x45", mm, (buf(37, 23), buf(23, 45)), {}),
        ("mm aligned 64x64x64", mm, (buf(64, 64), buf(64, 64)), {}),
        ("mm a off 16B", mm, (buf(64, 64, offset=1), buf(64, 64)), {}),
        ("mm M=1", mm, (buf(1, 256), buf(256, 512)), {}),
        ("mm N=1", mm, (buf(300, 256), buf(256, 1)), {}),
        ("mm K=1", mm, (buf(33, 1), buf(1, 47)), {}),
        ("mm K=16", mm, (buf(33, 16), buf(16, 47)), {}),
        ("mm transposed", mm, (buf(45, 37).t(), buf(64, 45).t()), {}),
        ("addmm bias (N,)", addmm, (buf(45), buf(37, 23), buf(23, 45)), {"alpha": 2, "beta": 1}),
        ("addmm bias (M,N) alpha=1", addmm, (buf(37, 45), buf(37, 23), buf(23, 45)), {"alpha": 1, "beta": 3}),
        ("addmm bias off", addmm, (buf(45, offset=3), buf(37, 23), buf(23, 45)), {"beta": 0.5}),
        ("bmm 3x19x23x31", bmm, (buf(3, 19, 23), buf(3, 23, 31)), {}),
        ("baddbmm bias (B,1,N)", baddbmm, (buf(3, 1, 31), buf(3, 19, 23), buf(3, 23, 31)), {"alpha": 0.25}),
        ("baddbmm bias (N,)", baddbmm, (buf(31), buf(3, 19, 23), buf(3, 23, 31)), {}),
        # The same ops at aligned shapes (K = 32, N = 48), and with rows 8 elements apart
        # (aligned=8 in fp16/bf16, 4 in fp32: hinted, not copied). Launches at aligned=0 stage
        # padded copies on every call and are never launched directly (kernels/matmul.py).
        ("mm rows of 8 37x24x40", mm, (buf(37, 24), buf(24, 40)), {}),
        ("baddbmm rows of 8 bias (B,1,N)", baddbmm, (buf(3, 1, 40), buf(3, 19, 24), buf(3, 24, 40)), {}),
        ("addmm bias (N,) aligned", addmm, (buf(48), buf(37, 32), buf(32, 48)), {"alpha": 2, "beta": 1}),
        ("baddbmm bias (B,1,N) aligned", baddbmm, (buf(3, 1, 48), buf(3, 19, 32), buf(3, 32, 48)),
         {"alpha": 0.25}),
        ("mm 512x4096x4096", mm, (buf(512, 4096), buf(4096, 4096)), {}),
        # Llama-2-7B's up projection: the shipped hopper table serves bf16 a tile 192 wide
        # (EXTRA_N) loaded through TMA descriptors, made afresh on every direct launch.
        (WIDE_CASE, mm, (buf(512, 4096), buf(4096, 11008)), {}),
    ][: -2 if DEV == "cpu" else None]  # the interpreter takes minutes over the big ones


def reference(torch, op, args, kw):
    d = [t.double() for t in args]
    alpha, beta = float(kw.get("alpha", 1.0)), float(kw.get("beta", 1.0))
    if op.__name__ in ("mm", "bmm"):
        return d[0] @ d[1]
    return beta * d[0] + alpha * (d[1] @ d[2])


def main() -> None:
    import torch

    from nbx_tune.kernels import certified
    from nbx_tune.kernels.matmul import _FLAGS, SPEC, alignment, extra_columns, uses_tma, vector_elems

    g = torch.Generator(device=DEV).manual_seed(0)
    rows, report, failures = [], [], 0
    dtypes = (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32))
    for dtname, dt in dtypes[2:] if DEV == "cpu" else dtypes:  # the interpreter: fp32 only, and quickly
        certified.reload()
        all_cases = cases(torch, dt)
        for t in (t for _, _, args, _ in all_cases for t in args):
            t.copy_(torch.randn(t.shape, device=DEV, generator=g))
        first = [op(*args, **kw) for _, op, args, kw in all_cases]  # through Triton
        aligned = sum(alignment(args[-2].stride(), args[-1].stride(), args[-1].shape[-1], args[-2].shape[-1],
                                vector_elems(dt)) > 0
                      for _, _, args, _ in all_cases)
        n_direct = certified.launch_stats()["direct_launches"]
        # Reverse order, so each direct launch is found among all the remembered ones.
        for i in reversed(range(len(all_cases))):
            name, op, args, kw = all_cases[i]
            same = torch.equal(op(*args, **kw), first[i])
            for t in args:
                t.copy_(torch.randn(t.shape, device=DEV, generator=g))
            got = op(*args, **kw)
            ref = reference(torch, op, args, kw)
            err = ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
            ok = same and err <= RTOL[dtname]
            failures += not ok
            rows.append([dtname, name, "yes" if same else "NO", f"{err:.1e}", "ok" if ok else "FAIL"])
            report.append({"dtype": dtname, "case": name, "bit_identical": same, "err": err, "ok": ok})
        # The interpreter compiles nothing, so a smoke run remembers no direct launch.
        if DEV != "cpu" and (certified.launch_stats()["direct_launches"] != n_direct or n_direct != aligned):
            failures += 1
            print(f"FAIL {dtname}: {n_direct} direct launches remembered for {aligned} aligned cases, "
                  f"{certified.launch_stats()['direct_launches']} after the second pass")
        if DEV != "cpu" and dtname == "bfloat16":
            # The wide case must have run a 192-wide TMA tile, or it proved nothing about them.
            served = certified.config_for(SPEC, (dtname,), _FLAGS[0, 16], (1, 512, 11008, 4096))
            print(f"{WIDE_CASE} bfloat16 served {served}")
            if not (extra_columns(served) and uses_tma(served)):
                failures += 1
                print(f"FAIL {WIDE_CASE}: the shipped table did not serve a TMA tile with EXTRA_N")
    env = environment()
    save("direct_launch_check.json", {"env": env, "checks": report, "failures": failures})
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table(rows, ["dtype", "case", "direct == Triton", "err vs fp64", "result"]))
    print(f"{len(report)} checks, {failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

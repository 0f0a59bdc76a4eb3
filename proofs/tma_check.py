"""Every TMA config of the matmul space against fp64 on the GPU, at odd shapes, in fp16,
bf16 and fp32: one product (2-D descriptors) and batches (3-D), rows that TMA reads in
place and rows it cannot (staged at aligned=0, or copied: a broadcast batch, a base off 16
bytes), with and without a bias. The interpreter proves the index math on the CPU
(tests/test_matmul.py); this is the compiled kernel's proof, bf16 included.

    python proofs/tma_check.py            (writes tma_check.json under $OUT)
"""

from __future__ import annotations

import sys


from nbx_tune.testing.bench import environment, save, table  # noqa: E402

RTOL = {"float16": 2e-2, "bfloat16": 4e-2, "float32": 1e-4}


def cases(torch, dt, dev):
    """(name, a, b, bias or None): bias already expanded to c's shape."""
    g = torch.Generator(device=dev).manual_seed(0)

    def r(*shape):
        return torch.rand(shape, device=dev, generator=g).mul_(2).sub_(1).to(dt)

    off = r(5 * 768 * 1024 + 1)[1:]  # one element past a 16-byte boundary
    return [
        ("mm 2049x3071x1537 (staged)", r(2049, 1537), r(1537, 3071), None),
        ("addmm 1023x1024x768 bias (N,)", r(1023, 768), r(768, 1024), r(1024).expand(1023, 1024)),
        ("bmm 5x515x1024x768", r(5, 515, 768), r(5, 768, 1024), None),
        ("baddbmm 5x515x1000x776 bias (B,1,N)", r(5, 515, 776), r(5, 776, 1000), r(5, 1, 1000).expand(5, 515, 1000)),
        ("bmm a broadcast over 5", r(1, 515, 768).expand(5, 515, 768), r(5, 768, 1024), None),
        ("bmm b off 16 bytes", r(5, 515, 768), off.view(5, 768, 1024), None),
    ]


def main() -> None:
    import torch

    from nbx_tune.kernels.matmul import CONFIGS, SPEC, TORCH_DTYPES, launch_matmul, uses_tma
    from nbx_tune.kernels.spec import Problem, seat_flags
    from nbx_tune.profiles import get_profile

    hopper, dev = get_profile("hopper"), "cuda"
    rows, report, failures = [], [], 0
    for dtname, dt in TORCH_DTYPES.items():
        probe = Problem("matmul", (dtname,), seat_flags(bias=0, aligned=16), (1, 4096, 4096, 4096), ())
        configs = [c for c in CONFIGS if uses_tma(c) and SPEC.static_refusal(hopper, c, probe) is None]
        for name, a, b, x in cases(torch, dt, dev):
            ref = torch.matmul(a.double(), b.double())
            if x is not None:
                ref = 0.5 * x.double() + 1.5 * ref
            for cfg in configs:
                c = torch.full(ref.shape, float("nan"), device=dev, dtype=dt)
                try:
                    _, _, args = launch_matmul(a, b, c, x, 1.5 if x is not None else 1.0,
                                               0.5 if x is not None else 0.0, cfg)
                    torch.cuda.synchronize()
                    err = ((c.double() - ref).abs().max() / ref.abs().max()).item()
                    copied = args[0] is not a or args[1] is not b
                    ok, msg = err <= RTOL[dtname], f"{err:.1e}"
                except Exception as e:  # noqa: BLE001 - reported as a failure of this config
                    ok, msg, copied = False, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}", None
                failures += not ok
                print(f"  {dtname} {name} {cfg}: {msg}", flush=True)
                rows.append([dtname, name, str(cfg).replace("GROUP_M=8,", ""), "yes" if copied else "no",
                             msg, "ok" if ok else "FAIL"])
                report.append({"dtype": dtname, "case": name, "config": str(cfg), "copied": copied,
                               "result": msg, "ok": ok})
    env = environment()
    save("tma_check.json", {"env": env, "checks": report, "failures": failures})
    print(f"{env['date']} {env['gpu']} driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    print(table(rows, ["dtype", "case", "config", "copied/staged", "err vs fp64", "result"]))
    print(f"{len(report)} checks, {failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

"""Thread-block clusters at the mid-size GEMMs (Triton's `num_ctas` launch option): the fifth
lever on the shapes where matmul's space stays below cuBLAS (lab/gemm_midsize/README.md).
cuBLAS's Hopper kernels run clusters of CTAs that share operand loads; Triton 3.6 takes
num_ctas > 1 as experimental. Each tile below is launched with num_ctas 1 and 2 through
`_matmul_kernel` (the one-program-per-tile schedule; the persistent and split-K paths take
no num_ctas), checked against fp64 and bit for bit on a second launch, and timed under CUDA
graphs with weights rotated out of the L2, side by side with torch. Usage (GPU):
    python3 lab/gemm_clusters/sweep.py [--budget-s 300]
writes $OUT/gemm_clusters.json and prints a table.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


# (M, N, K, layout): the rows of lab/gemm_replay_timing still below 0.9 of torch.
SHAPES = [(800, 1536, 1536, "nt"), (800, 1536, 8960, "nt"), (800, 8960, 1536, "nt"), (1024, 2304, 768, "nn"),
          (1024, 768, 3072, "nn"), (1024, 1024, 4096, "nt"), (64, 4096, 4096, "nt")]


def tiles():
    from nbx_tune.kernels.matmul import _c

    return [_c(128, 128, 64, 4, 4, tma=1), _c(128, 128, 64, 8, 4, tma=1), _c(128, 256, 64, 8, 3, tma=1),
            _c(64, 128, 64, 4, 5, tma=1), _c(64, 128, 64, 4, 4, extra_n=64, tma=1), _c(128, 128, 64, 4, 3),
            _c(128, 128, 32, 4, 4), _c(64, 128, 64, 4, 4)]


def launch(a, b, c, config, ctas: int):
    from nbx_tune.kernels import matmul as MM

    a, b, descs, tma, kmajor = MM.tma_descriptors(a, b, config)
    grid, args = MM.matmul_args(a, b, c, c, 1.0, 0.0, False, config, 1, 1, descs, tma, kmajor)
    return MM._matmul_kernel[grid](*args, num_warps=config.num_warps, num_stages=config.num_stages, num_ctas=ctas)


def one_shape(m, n, k, layout, deadline):
    from nbx_tune.bench.torch_compare import graph_times

    sets = max(1, min(4, (96 << 20) // ((m * k + k * n + m * n) * 2)))
    A = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    B = [(torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if layout == "nt"
          else torch.randn(k, n, device="cuda", dtype=torch.bfloat16)) for _ in range(sets)]
    C = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    ref = A[0].double() @ B[0].double()
    fns, bad = {"torch": lambda i: torch.mm(A[i % sets], B[i % sets], out=C[i % sets])}, []
    for cfg in tiles():
        for ctas in (1, 2):
            if time.time() > deadline:
                break
            name = f"{cfg} num_ctas={ctas}"
            f = (lambda i, cfg=cfg, ctas=ctas: launch(A[i % sets], B[i % sets], C[i % sets], cfg, ctas))
            try:
                runs = []
                for _ in range(2):
                    C[0].fill_(float("nan"))
                    f(0)
                    torch.cuda.synchronize()
                    runs.append(C[0].clone())
                err = (runs[0].double() - ref).abs().max().item() / ref.abs().max().item()
                if not err < 4e-2 or not torch.equal(runs[0].view(torch.int16), runs[1].view(torch.int16)):
                    bad.append(f"{name}: err {err:.2e}")
                    continue
                fns[name] = f
            except Exception as e:  # noqa: BLE001 - a study: record and go on
                bad.append(f"{name}: {type(e).__name__} {str(e).splitlines()[0][:100] if str(e) else ''}")
                torch.cuda.synchronize()
    t = graph_times(fns, 8, calls=20)
    return t, bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=300)
    args = ap.parse_args()
    from nbx_tune.testing.bench import environment, save

    deadline = time.time() + args.budget_s
    out = {"env": environment(), "shapes": []}
    for m, n, k, layout in SHAPES:
        if time.time() > deadline:
            break
        t, bad = one_shape(m, n, k, layout, deadline)
        best = {c: min((s for s in t if s.endswith(f"num_ctas={c}")), key=t.get, default=None) for c in (1, 2)}
        row = {"shape": [m, n, k, layout], "torch_us": t["torch"] * 1e3, "bad": bad,
               "times_us": {s: v * 1e3 for s, v in t.items()},
               "best": {c: (s, t["torch"] / t[s]) if s else None for c, s in best.items()}}
        out["shapes"].append(row)
        print(f"{m}x{n}x{k} {layout}: torch {t['torch'] * 1e3:.1f} us; " + "; ".join(
            f"num_ctas={c} {'-' if v is None else f'{v[1]:.3f}'}" for c, v in row["best"].items())
            + f"; {len(bad)} failed", flush=True)
        for c, v in row["best"].items():
            if v:
                print(f"    num_ctas={c}: {v[0]}")
        for b in bad[:3]:
            print("    failed:", b)
        save("gemm_clusters.json", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

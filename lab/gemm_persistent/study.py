"""Study: a persistent GEMM (a fixed grid of one program per SM walking the output tiles,
A and B through TMA descriptors) against torch and the certified non-persistent kernel, at
the GEMM rows of the example traces where nbx-tune is below torch.

Levers: persistence (no tail launch per tile, the next tile's loads overlap this tile's
epilogue when the tile and K loops are flattened), warp specialization where the compiler
takes it. Usage (GPU): python3 lab/gemm_persistent/study.py [--shapes N] [--smoke]
Writes $OUT/gemm_persistent.json."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]

from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402


@triton.jit
def _tile_of(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    group = GROUP_M * num_pid_n
    first_m = (tile // group) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group) % group_m
    pid_n = (tile % group) // group_m
    return pid_m, pid_n


@triton.jit
def persistent_kernel(a_desc, b_desc, c_ptr, M, N, K, stride_cm,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, B_KMAJOR: tl.constexpr,
                      FLATTEN: tl.constexpr, WS: tl.constexpr):
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    # the epilogue's own tile counter: with FLATTEN the compiler pipelines the K loop of the
    # next tile into this one, so the epilogue recomputes where it stores
    tile_c = start - NUM_SMS
    for tile in tl.range(start, num_tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = _tile_of(tile, num_pid_m, num_pid_n, GROUP_M)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_tiles):
            k0 = k * BLOCK_K
            a = a_desc.load([m0, k0])
            if B_KMAJOR:
                b = b_desc.load([n0, k0]).T
            else:
                b = b_desc.load([k0, n0])
            acc = tl.dot(a, b, acc)
        tile_c += NUM_SMS
        pm, pn = _tile_of(tile_c, num_pid_m, num_pid_n, GROUP_M)
        rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


NUM_SMS = 132


def persistent(a, b, c, cfg, kmajor):
    bm, bn, bk, warps, stages, group, flatten, ws = cfg
    M, K = a.shape
    N = c.shape[1]
    da = TensorDescriptor.from_tensor(a, [bm, bk])
    db = TensorDescriptor.from_tensor(b.t() if kmajor else b, [bn, bk] if kmajor else [bk, bn])
    sms = torch.cuda.get_device_properties(0).multi_processor_count if a.is_cuda else 4
    grid = (min(sms, triton.cdiv(M, bm) * triton.cdiv(N, bn)),)
    persistent_kernel[grid](da, db, c, M, N, K, c.stride(0), bm, bn, bk, group, grid[0], kmajor,
                            flatten, ws, num_warps=warps, num_stages=stages)


# the GEMM rows below torch (call 5 of lab/history/gpu_runs/2026-12-04h/), M, N, K and the
# config certified there
SHAPES = [
    (1000, 14336, 4096, "BLOCK_M=128,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,num_warps=8,num_stages=5"),
    (1024, 14336, 4096, "BLOCK_M=128,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,num_warps=8,num_stages=5"),
    (1000, 1024, 4096, "BLOCK_M=64,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,EXTRA_N=64,TMA=1,num_warps=4,num_stages=5"),
    (800, 8960, 1536, "BLOCK_M=128,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,num_warps=4,num_stages=5"),
    (800, 1536, 8960, "BLOCK_M=128,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,num_warps=4,num_stages=5"),
    (800, 151936, 1536, "BLOCK_M=128,BLOCK_N=256,BLOCK_K=64,GROUP_M=8,TMA=1,num_warps=8,num_stages=3"),
    (800, 1536, 1536, "BLOCK_M=64,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,EXTRA_N=64,TMA=1,num_warps=4,num_stages=5"),
    (800, 256, 1536, "BLOCK_M=16,BLOCK_N=128,BLOCK_K=128,GROUP_M=8,num_warps=4,num_stages=4"),
    (1024, 768, 3072, "BLOCK_M=64,BLOCK_N=64,BLOCK_K=128,GROUP_M=8,num_warps=4,num_stages=3"),
    (1024, 2304, 768, "BLOCK_M=64,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,num_warps=4,num_stages=3"),
    (1024, 3072, 768, "BLOCK_M=64,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,num_warps=4,num_stages=3"),
    (512, 32000, 4096, "BLOCK_M=128,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,num_warps=4,num_stages=5"),
    (512, 4096, 4096, "BLOCK_M=128,BLOCK_N=128,BLOCK_K=64,GROUP_M=8,num_warps=8,num_stages=5"),
    (1000, 4096, 14336, "BLOCK_M=128,BLOCK_N=256,BLOCK_K=64,GROUP_M=8,TMA=1,num_warps=8,num_stages=3"),
]

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, GROUP_M, FLATTEN, WS)
CONFIGS = [
    (128, 256, 64, 8, 3, 8, 0, 0), (128, 256, 64, 8, 4, 8, 0, 0), (128, 256, 64, 8, 3, 8, 1, 0),
    (128, 128, 64, 8, 4, 8, 0, 0), (128, 128, 64, 8, 4, 8, 1, 0), (128, 128, 64, 4, 4, 8, 0, 0),
    (128, 128, 64, 4, 4, 8, 1, 0), (128, 128, 64, 4, 5, 8, 1, 0), (64, 128, 64, 4, 5, 8, 0, 0),
    (64, 128, 64, 4, 5, 8, 1, 0), (64, 256, 64, 4, 4, 8, 1, 0), (128, 64, 64, 4, 5, 8, 1, 0),
    (64, 64, 128, 4, 4, 8, 1, 0),
    (128, 256, 64, 8, 3, 8, 0, 1), (128, 128, 64, 8, 4, 8, 0, 1), (128, 128, 64, 4, 4, 8, 1, 1),
]


def name_of(cfg):
    bm, bn, bk, w, s, g, f, ws = cfg
    return f"P{bm}x{bn}x{bk} w{w} s{s}" + (" flat" if f else "") + (" ws" if ws else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", type=int, default=len(SHAPES))
    ap.add_argument("--kmajor", action="store_true", help="B as W.t() (an nn.Linear weight)")
    ap.add_argument("--budget-s", type=float, default=480)
    args = ap.parse_args(argv)
    from nbx_tune.bench.torch_compare import graph_times

    from nbx_tune.kernels import matmul
    from nbx_tune.kernels.spec import Config

    t_start = time.time()
    out = {"env": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__},
           "rows": [], "failed": {}}
    print(f"{'M x N x K':>20} {'torch us':>9} {'cert':>6} {'best P':>6}  best persistent config")
    for m, n, k, cert in SHAPES[:args.shapes]:
        if time.time() - t_start > args.budget_s:
            print("budget spent")
            break
        sets = max(1, min(4, (96 << 20) // ((m * k + k * n + m * n) * 2)))
        g = torch.Generator(device="cuda").manual_seed(0)
        A = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(sets)]
        if args.kmajor:
            B = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g).t() for _ in range(sets)]
        else:
            B = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(sets)]
        C = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        ref = (A[0].double() @ B[0].double())
        tol = 2e-2 * ref.abs().max().item()
        kv = dict(p.split("=") for p in cert.split(","))
        config = Config.make(**{k2: int(v) for k2, v in kv.items() if not k2.startswith("num_")},
                             num_warps=int(kv["num_warps"]), num_stages=int(kv["num_stages"]))
        fns = {"torch": lambda i: torch.mm(A[i % sets], B[i % sets], out=C[i % sets]),
               "cert": lambda i: matmul.launch_matmul(A[i % sets], B[i % sets], C[i % sets], None, 1.0, 0.0, config)}
        for cfg in CONFIGS:
            nm = name_of(cfg)
            f = (lambda i, cfg=cfg: persistent(A[i % sets], B[i % sets], C[i % sets], cfg, int(args.kmajor)))
            try:
                C[0].zero_()
                f(0)
                torch.cuda.synchronize()
                err = (C[0].double() - ref).abs().max().item()
                if err > tol:
                    out["failed"][f"{m}x{n}x{k} {nm}"] = f"wrong: {err:.3g} > {tol:.3g}"
                    continue
                fns[nm] = f
            except Exception as e:  # noqa: BLE001 - a study: record and go on
                out["failed"][f"{m}x{n}x{k} {nm}"] = f"{type(e).__name__}: {str(e)[:160]}"
        calls = 10 if m * n * k > 2e10 else 40
        t = graph_times(fns, 20, calls=calls)
        ps = {s: v for s, v in t.items() if s.startswith("P")}
        best = min(ps, key=ps.get) if ps else None
        row = {"m": m, "n": n, "k": k, "us": {s: v * 1e3 for s, v in t.items()}, "best": best}
        out["rows"].append(row)
        print(f"{m:>6}x{n}x{k:<6} {t['torch']*1e3:9.1f} {t['torch']/t['cert']:6.3f} "
              f"{(t['torch']/ps[best]) if best else 0:6.3f}  {best}", flush=True)
    for key, why in list(out["failed"].items())[:12]:
        print("failed:", key, why)
    od = Path(os.environ.get("OUT", "bench_out"))
    od.mkdir(parents=True, exist_ok=True)
    (od / f"gemm_persistent{'_kmajor' if args.kmajor else ''}.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

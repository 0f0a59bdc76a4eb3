#!/usr/bin/env python3
"""Exploratory: why a GEMM at 3000^3 runs at 0.6 of cuBLAS on the H200 while 3072^3 runs at 0.83.

3000 is a multiple of 8 (a 16-byte row in fp16), so the seat is aligned=8: the kernel is
hinted (ALIGN_AB / ALIGN_C) and loads 16-byte vectors, and no operand is copied. What is
left to tell apart: the hints themselves (Triton's own divisibility-by-16 specialization
against ours), rows that start on 16-byte but not 128-byte boundaries, the K mask at a K
that is not a multiple of BLOCK_K, and C's unaligned stores. Each layout below changes one
of them; every variant is checked against fp32 torch.matmul and timed beside cuBLAS in one
side_by_side call per layout. Writes $OUT/explore_unaligned.json.

Found on 2026-12-04 (docs/benchmarks.md): the rows of A and of B starting on 16- but not
128-byte boundaries cost it all (A alone 0.64, B alone 0.73, both 0.80 of cuBLAS when moved
to 128-byte rows; C's rows and the hints themselves cost nothing), and copying A and B into
128-byte rows costs 25 us of a 98 us product: 0.66, not adopted.

    python bench/explore_unaligned.py        # GPU only
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from nbx_tune.testing.bench import environment, save, side_by_side, table  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

try:
    import nbx_tune  # noqa: F401
except ImportError:  # the repository root is the package: put a link named nbx_tune on the path
    _pkg = Path(tempfile.mkdtemp())
    (_pkg / "nbx_tune").symlink_to(Path(__file__).resolve().parents[2])
    sys.path.insert(0, str(_pkg))

# (name, S, row stride of A, of B, of C, stage): M = N = K = S. stage "torch" copies A and B
# into zero-padded buffers of rows a multiple of 16 (what launch_matmul does for aligned=0);
# "A" / "AB" copy A / A and B with the Triton copy below into rows a multiple of 128 bytes.
# Every copy is timed with the product.
LAYOUTS = [
    ("3072 contiguous", 3072, 3072, 3072, 3072, ""),
    ("3000 contiguous", 3000, 3000, 3000, 3000, ""),
    ("3000, A rows of 3072", 3000, 3072, 3000, 3000, ""),
    ("3000, B rows of 3072", 3000, 3000, 3072, 3000, ""),
    ("3000, A/B rows of 3072", 3000, 3072, 3072, 3000, ""),
    ("3008 contiguous", 3008, 3008, 3008, 3008, ""),
    ("3000 staged (torch, 16)", 3000, 3000, 3000, 3000, "torch"),
    ("3000 A copied", 3000, 3000, 3000, 3000, "A"),
    ("3000 A, B copied", 3000, 3000, 3000, 3000, "AB"),
    ("4096 contiguous", 4096, 4096, 4096, 4096, ""),
    ("4000 contiguous", 4000, 4000, 4000, 4000, ""),
    ("4000 A copied", 4000, 4000, 4000, 4000, "A"),
    ("2048 contiguous", 2048, 2048, 2048, 2048, ""),
    ("2040 contiguous", 2040, 2040, 2040, 2040, ""),
    ("2040 A copied", 2040, 2040, 2040, 2040, "A"),
]
CONFIGS = [(128, 128, 64, 4, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
           (128, 128, 128, 8, 3), (128, 128, 128, 4, 2)]


@triton.jit
def _row_copy_kernel(src, dst, R, C, s_r, d_r, ALIGN: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst[:R, :C] = src[:R, :C]; rows of src are ALIGN-element multiples (hinted)."""
    s_r = s_r // ALIGN * ALIGN
    C = C // ALIGN * ALIGN
    rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rr[:, None] < R) & (cc[None, :] < C)
    x = tl.load(src + rr[:, None].to(tl.int64) * s_r + cc[None, :], mask=mask)
    tl.store(dst + rr[:, None].to(tl.int64) * d_r + cc[None, :], x, mask=mask)


def strided(torch, rows, cols, ld, dtype):
    """A rows x cols matrix whose rows are ld elements apart (a view into a wider buffer)."""
    buf = torch.randn(rows, ld, device="cuda", dtype=dtype) / 8
    return buf[:, :cols]


def row_copy(t, line_bytes=128):
    """t (rows x cols, row-major, rows 16-byte aligned) copied into rows a multiple of
    line_bytes apart; returns the view of the copy with t's shape."""
    R, C = t.shape
    ld = -(-C * t.element_size() // line_bytes) * line_bytes // t.element_size()
    buf = t.new_empty((R, ld))
    grid = (triton.cdiv(R, 32), triton.cdiv(C, 256))
    _row_copy_kernel[grid](t, buf, R, C, t.stride(0), ld, 8, 32, 256, num_warps=4)
    return buf[:, :C]


def _padded(t, rows: int, cols: int):
    """A contiguous copy of t grown to (rows, cols), zeros in the growth, by torch ops: the
    staging of this study's day (kernels/matmul/ has staged by the copy kernel since
    2026-12-04, `stage_operands`)."""
    *batch, r, c = t.shape
    out = t.new_empty((*batch, rows, cols))
    out[..., :r, :c].copy_(t)
    if cols > c:
        out[..., :r, c:].zero_()
    if rows > r:
        out[..., r:, :].zero_()
    return out


def main() -> int:
    import torch

    from nbx_tune.kernels.matmul import _matmul_kernel, launch_matmul, matmul_args
    from nbx_tune.kernels.spec import Config

    dtype = torch.float16
    results = []
    for name, S, lda, ldb, ldc, stage in LAYOUTS:
        a, b = strided(torch, S, S, lda, dtype), strided(torch, S, S, ldb, dtype)
        c = strided(torch, S, S, ldc, dtype).zero_()
        ref = a.float() @ b.float()
        fns = {"cuBLAS": lambda a=a, b=b: torch.matmul(a, b)}
        for bm, bn, bk, w, s in CONFIGS:
            cfg = Config.make(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=w, num_stages=s)
            if stage == "torch":
                P = -(-S // 16) * 16

                def fn(a=a, b=b, c=c, cfg=cfg, P=P):
                    a2, b2 = _padded(a, S, P), _padded(b, P, P)
                    grid, args = matmul_args(a2, b2, c, c, 1.0, 0.0, False, cfg, 1, 8 if S % 8 == 0 else 1)
                    _matmul_kernel[grid](*args, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
            elif stage:
                def fn(a=a, b=b, c=c, cfg=cfg, both=stage == "AB"):
                    launch_matmul(row_copy(a), row_copy(b) if both else b, c, None, 1.0, 0.0, cfg)
            else:
                def fn(a=a, b=b, c=c, cfg=cfg):
                    launch_matmul(a, b, c, None, 1.0, 0.0, cfg)
            c.zero_()
            fn()
            torch.cuda.synchronize()
            err = (c.float() - ref).abs().max().item() / ref.abs().max().item()
            if err > 1e-2:
                print(f"{name} {cfg}: WRONG, relative error {err:.3g}")
                continue
            fns[f"{bm}x{bn}x{bk} w{w} s{s}"] = fn
        ms = side_by_side(fns, rep_ms=120)
        blas = ms.pop("cuBLAS")
        best = min(ms, key=ms.get)
        tflops = 2 * S**3 / (ms[best] * 1e-3) / 1e12
        results.append({"layout": name, "S": S, "lda": lda, "ldb": ldb, "ldc": ldc, "stage": stage,
                        "cublas_ms": blas, "ms": ms, "best": best, "ratio": blas / ms[best],
                        "tflops": tflops})
        print(f"{name}: cuBLAS {blas:.4f} ms, best {best} {ms[best]:.4f} ms ({blas / ms[best]:.3f})", flush=True)
    rows = [[r["layout"], f"{r['cublas_ms']:.4f}", f"{r['ms'][r['best']]:.4f}", f"{r['ratio']:.3f}",
             f"{r['tflops']:.0f}", r["best"]] for r in results]
    print(table(rows, ["layout (fp16)", "cuBLAS ms", "best ms", "cuBLAS/best", "TFLOP/s", "config"]))
    save("explore_unaligned.json", {"env": environment(), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Study: `cat` of two contiguous tensors in one launch instead of one copy per input.

The certified cat (kernels/copy.py) launches the copy kernel once per input; on the small
cats of a Llama step (rotary's halves, 8x32x1x64 twice) torch's single launch takes about
1.5 us against 2-4 us (0.6 of torch, docs/benchmarks.md). Here a kernel writes the whole
output in one pass: output row r, column c reads input 0 where c < inner0, else input 1
(inner_i = the input's size along dim times the sizes after it). Timed side by side with
torch.cat and the certified cat, at the shapes of the example traces.

    python lab/cat_one_launch/one_launch.py                 (the H200)
    TRITON_INTERPRET=1 python lab/cat_one_launch/one_launch.py --smoke
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
from nbx_tune.testing.bench import report, side_by_side, wall_ms  # noqa: E402


@triton.jit
def _cat2_kernel(x0_ptr, x1_ptr, y_ptr, n, inner0, inner1, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    width = inner0 + inner1
    row = offs // width
    col = offs - row * width
    first = col < inner0
    a = tl.load(x0_ptr + row * inner0 + col, mask=mask & first)
    b = tl.load(x1_ptr + row * inner1 + (col - inner0), mask=mask & (col >= inner0))
    tl.store(y_ptr + offs, tl.where(first, a, b), mask=mask)


def cat2(x0, x1, dim: int, block: int, warps: int):
    import torch

    dim = dim % x0.dim()
    shape = list(x0.shape)
    shape[dim] += x1.shape[dim]
    y = torch.empty(shape, dtype=x0.dtype, device=x0.device)
    after = math.prod(x0.shape[dim + 1:])
    n = y.numel()
    _cat2_kernel[(triton.cdiv(n, block),)](x0, x1, y, n, x0.shape[dim] * after, x1.shape[dim] * after,
                                            BLOCK=block, num_warps=warps)
    return y


SHAPES = (  # (first, second, dim): rows of the example traces
    ((8, 32, 1, 64), (8, 32, 1, 64), -1),         # rotary halves, decode batch 8
    ((64, 32, 1, 64), (64, 32, 1, 64), -1),       # decode batch 64
    ((1, 32, 1000, 64), (1, 32, 1000, 64), -1),   # prefill of 1000 tokens
    ((8, 32, 2048, 128), (8, 32, 1, 128), -2),    # the KV cache grows by one token
)
SMOKE = (((2, 3, 1, 4), (2, 3, 1, 4), -1), ((2, 3, 5, 4), (2, 3, 1, 4), -2))
CONFIGS = ((512, 4), (1024, 4), (2048, 8), (4096, 8), (8192, 16))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)

    import torch

    from nbx_tune.kernels import cat as nbx_cat

    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    timer = wall_ms if args.smoke else None
    rep = 1.0 if args.smoke else 24.0
    rows, out = [], []
    for a, b, dim in (SMOKE if args.smoke else SHAPES):
        x0, x1 = torch.randn(a, device=device, dtype=dtype), torch.randn(b, device=device, dtype=dtype)
        ref = torch.cat([x0, x1], dim)
        best, best_ms = None, float("inf")
        for blk, warps in CONFIGS:
            if not torch.equal(cat2(x0, x1, dim, blk, warps), ref):
                print(f"WRONG: BLOCK={blk} at {a} + {b} on {dim}")
                continue
            ms = side_by_side({"c": lambda: cat2(x0, x1, dim, blk, warps)}, rep_ms=rep / 4, rounds=1,
                              timer=timer)["c"]
            if ms < best_ms:
                best, best_ms = (blk, warps), ms
        assert torch.equal(nbx_cat([x0, x1], dim), ref)
        t = side_by_side({"torch": lambda: torch.cat([x0, x1], dim), "certified": lambda: nbx_cat([x0, x1], dim),
                          "one": lambda: cat2(x0, x1, dim, *best)}, rep_ms=rep, timer=timer)
        rows.append([f"{a} + {b} on {dim}", f"{t['torch'] * 1e3:.2f}", f"{t['torch'] / t['certified']:.2f}",
                     f"{t['torch'] / t['one']:.2f}", f"BLOCK={best[0]} w{best[1]}"])
        out.append({"a": a, "b": b, "dim": dim, "ms": t, "best": best})
    report("cat_one_launch.json", ["cat", "torch us", "torch/certified", "torch/one launch", "best"], rows, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Exploratory: does a GEMM's time on the H200 step with waves of tiles?

With explore_gemm_schedules' `_ticket_tail_kernel` (through its `ticket_launch`), times
the first n tiles only of a 3072^3 product (and 4096^3) for n across wave boundaries
(every program a whole tile), the whole product with its tail split into S K slices, and a
tail of 24 tiles alone in S slices, with and without their sum. The partial
grids leave C partly unwritten: this is a timing probe, checked by nothing; the schedules
themselves are checked by explore_gemm_schedules.py. Writes $OUT/probe_waves.json.

    python bench/probe_waves.py        # GPU only
"""

from __future__ import annotations

import sys

import torch
import triton

from nbx_tune.testing.bench import environment, save  # noqa: E402
from explore_gemm_schedules import bench, ticket_launch  # noqa: E402

# The 128x256 TMA tile, one program per SM; and 128x128 at 8 warps.
TILES = (dict(BM=128, BN=256, BK=64, w=8, s=4, TMA=1), dict(BM=128, BN=128, BK=64, w=8, s=4, TMA=1))


def name(tile) -> str:
    return f"{tile['BM']}x{tile['BN']}"


def main() -> int:
    env = environment()
    nsms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{env['date']} {env['gpu']} ({nsms} SMs) driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    rows = []
    for size in (3072, 4096):
        a = torch.randn(size, size, device="cuda", dtype=torch.float16)
        b = torch.randn(size, size, device="cuda", dtype=torch.float16)
        c = torch.empty(size, size, device="cuda", dtype=torch.float16)
        for tile in TILES:
            tiles = triton.cdiv(size, tile["BM"]) * triton.cdiv(size, tile["BN"])
            counts = sorted({1, nsms // 4, nsms // 2, nsms, nsms + 1, 3 * nsms // 2, 2 * nsms, 2 * nsms + 1,
                             3 * nsms, 3 * nsms + 1, 4 * nsms, tiles} - {0})
            for n in (n for n in counts if n <= tiles):
                ms = bench(ticket_launch(a, b, c, tile, n, n, 1))
                rows.append(dict(size=size, tile=name(tile), tiles=n, slices=1, ms=ms))
                print(f"{size}^3 {rows[-1]['tile']:8} first {n:4} tiles (waves {n / nsms:5.2f})  {ms * 1e3:8.1f} us")
            dp = tiles // nsms * nsms
            for slices in (2, 3, 4, 5, 6, 8):
                if dp == 0 or dp == tiles:
                    break
                ms = bench(ticket_launch(a, b, c, tile, tiles, dp, slices))
                rows.append(dict(size=size, tile=name(tile), tiles=tiles, dp=dp, slices=slices, ms=ms))
                print(f"{size}^3 {rows[-1]['tile']:8} all {tiles} tiles, last {tiles - dp} in {slices} K slices  "
                      f"{ms * 1e3:8.1f} us")
        blas = bench(lambda: torch.matmul(a, b, out=c))
        rows.append(dict(size=size, tile="cuBLAS", ms=blas))
        print(f"{size}^3 cuBLAS {blas * 1e3:8.1f} us")
    # The tail alone: 24 tiles of 128x256 (two rows of them) at K=3072, split in S slices,
    # with and without the last slice's sum of the others' partials.
    a = torch.randn(256, 3072, device="cuda", dtype=torch.float16)
    b = torch.randn(3072, 3072, device="cuda", dtype=torch.float16)
    c = torch.empty(256, 3072, device="cuda", dtype=torch.float16)
    for slices in (1, 2, 3, 4, 5):
        for fixup in (True, False):
            if slices == 1 and not fixup:
                continue
            ms = bench(ticket_launch(a, b, c, TILES[0], 24, 0, slices, fixup))
            rows.append(dict(size="256x3072x3072", tile="128x256", tiles=24, dp=0, slices=slices, fixup=fixup, ms=ms))
            print(f"256x3072x3072 128x256  24 tiles in {slices} K slices{'' if fixup else ', no sum'}  {ms * 1e3:8.1f} us")
    print(f"wrote {save('probe_waves.json', {'env': env, 'num_sms': nsms, 'rows': rows})}")
    return 0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: probe_waves times the GPU only")
    sys.exit(main())

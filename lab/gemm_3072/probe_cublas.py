#!/usr/bin/env python3
"""Exploratory: which kernels cuBLAS (torch.matmul) runs at the sizes where ours falls short.

For M=N=K in SIZES and fp16/bf16, runs torch.matmul under torch.profiler and records every
GPU kernel it launched: its name (cuBLAS's names carry the tile, cluster and scheduling
scheme), its grid and block, registers, shared memory and time. The question is how cuBLAS
gets 3072^3's 288 tiles of 128x256 (2.18 waves on 132 SMs) through in about two waves'
time: a persistent grid, a split or stream-K scheme, another tile. Writes
$OUT/probe_cublas.json.

    python bench/probe_cublas.py        # GPU only
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from nbx_tune.testing.bench import environment, save, table  # noqa: E402

SIZES = (2048, 3000, 3072, 4096)
REPS = 20


def kernels_of(fn) -> list[dict]:
    """The GPU kernels of REPS calls of fn, one row per distinct kernel and launch shape."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text()).get("traceEvents", [])
    rows: dict[tuple, dict] = {}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        a = e.get("args", {})
        key = (e["name"], str(a.get("grid")), str(a.get("block")))
        r = rows.setdefault(key, {"name": e["name"], "grid": a.get("grid"), "block": a.get("block"),
                                  "registers": a.get("registers per thread"),
                                  "shared_memory": a.get("shared memory"), "us": []})
        r["us"].append(e.get("dur", 0.0))
    out = []
    for r in rows.values():
        us = sorted(r.pop("us"))
        out.append({**r, "launches": len(us), "median_us": us[len(us) // 2]})
    return out


def main() -> int:
    env = environment()
    nsms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{env['date']} {env['gpu']} ({nsms} SMs) driver {env['driver']} Triton {env['triton']} torch {env['torch']}")
    problems, lines = [], []
    for size in SIZES:
        for dt in (torch.float16, torch.bfloat16):
            a = torch.randn(size, size, device="cuda", dtype=dt)
            b = torch.randn(size, size, device="cuda", dtype=dt)
            c = torch.empty(size, size, device="cuda", dtype=dt)
            ks = kernels_of(lambda: torch.matmul(a, b, out=c))
            problems.append({"size": size, "dtype": str(dt).split(".")[-1], "kernels": ks})
            for k in ks:
                grid = k["grid"] or []
                ctas = 1
                for g in grid:
                    ctas *= int(g)
                lines.append([size, problems[-1]["dtype"], f"{k['median_us']:.1f}", grid, ctas,
                              f"{ctas / nsms:.2f}", k["block"], k["registers"], k["shared_memory"],
                              k["name"][:110]])
    print(table(lines, ["size", "dtype", "us", "grid", "CTAs", "waves", "block", "regs", "smem", "kernel"]))
    save("probe_cublas.json", {"environment": env, "num_sms": nsms, "problems": problems})
    return 0


if __name__ == "__main__":
    sys.exit(main())

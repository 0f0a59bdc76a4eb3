"""Every config of matmul's space at the GEMM shapes still below torch, timed side by side
under CUDA graphs with torch: the best of each schedule (one program per tile, split-K,
persistent, stream-K). Usage (GPU): python3 lab/gemm_persistent/space.py; writes
$OUT/gemm_space.json. Stream-K left matmul's space on 2026-12-04 (README.md): run today,
the script has no stream-K column."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

SHAPES = [(1024, 768, 3072), (800, 1536, 8960), (1024, 1024, 4096), (800, 8960, 1536), (64, 4096, 4096),
          (1024, 2304, 768)]


def family(c) -> str:
    kw = c.kwargs
    if kw.get("SCHEDULE") == 2:
        return "stream-k"
    if kw.get("SCHEDULE") == 1:
        return "persistent"
    if kw.get("SPLIT_K", 1) > 1:
        return "split-k"
    return "tile"


def main() -> int:
    from torch_compare import graph_times

    from nbx_tune.kernels import matmul as MM
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.trace import make_row

    hopper = get_profile("hopper")
    out = []
    for m, n, k in SHAPES:
        p = MM.SPEC.problem_from_row(make_row("aten.mm", ["bfloat16"] * 2, [(m, k), (k, n)]))
        cfgs = [c for c in MM.CONFIGS if MM.SPEC.static_refusal(hopper, c, p) is None]
        sets = max(1, min(4, (96 << 20) // ((m * k + k * n + m * n) * 2)))
        A = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        B = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        C = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        ref = A[0].float() @ B[0].float()
        fns = {"torch": lambda i: torch.mm(A[i % sets], B[i % sets], out=C[i % sets])}
        bad = []
        for c in cfgs:
            f = (lambda i, c=c: MM.launch_matmul(A[i % sets], B[i % sets], C[i % sets], None, 1.0, 0.0, c))
            try:
                f(0)
                torch.cuda.synchronize()
                if (C[0].float() - ref).abs().max().item() > 0.05 * ref.abs().max().item():
                    bad.append(str(c))
                    continue
                fns[str(c)] = f
            except Exception as e:  # noqa: BLE001 - a study: record and go on
                bad.append(f"{c}: {type(e).__name__} {str(e)[:80]}")
        t = graph_times(fns, 8, calls=20)
        best = {}
        for c in cfgs:
            s = str(c)
            if s in t and (family(c) not in best or t[s] < t[best[family(c)]]):
                best[family(c)] = s
        row = {"shape": [m, n, k], "torch_us": t["torch"] * 1e3, "bad": bad,
               "best": {f: {"config": s, "us": t[s] * 1e3, "torch/it": t["torch"] / t[s]} for f, s in best.items()}}
        out.append(row)
        print(f"{m}x{n}x{k} torch {t['torch']*1e3:.1f} us; " + "; ".join(
            f"{f} {v['torch/it']:.3f}" for f, v in sorted(row["best"].items())) + (f"; {len(bad)} bad" if bad else ""),
            flush=True)
        for f, v in sorted(row["best"].items()):
            print(f"    {f:10s} {v['us']:7.1f} us  {v['config']}")
        for b in bad[:3]:
            print("    bad:", b)
    od = Path(os.environ.get("OUT", "bench_out"))
    od.mkdir(parents=True, exist_ok=True)
    (od / "gemm_space.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

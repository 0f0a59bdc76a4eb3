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


def time_shape(m: int, n: int, k: int, cfgs, twice: bool = False):
    """torch.mm and each config at one bf16 shape under CUDA graphs, weights rotated out of
    the L2: ({"torch" or config: ms}, [bad configs]). Bad: wrong against fp64 beyond bf16's
    screen tolerance or (twice) not bit for bit the same on a second launch."""
    from nbx_tune.bench.torch_compare import graph_times

    from nbx_tune.kernels import matmul as MM

    sets = max(1, min(4, (96 << 20) // ((m * k + k * n + m * n) * 2)))
    A = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    B = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    C = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    ref = A[0].double() @ B[0].double()
    fns = {"torch": lambda i: torch.mm(A[i % sets], B[i % sets], out=C[i % sets])}
    bad = []
    for c in cfgs:
        f = (lambda i, c=c: MM.launch_matmul(A[i % sets], B[i % sets], C[i % sets], None, 1.0, 0.0, c))
        try:
            runs = []
            for _ in range(2 if twice else 1):
                C[0].fill_(float("nan"))
                f(0)
                runs.append(C[0].clone())
            err = (runs[0].double() - ref).abs().max().item() / ref.abs().max().item()
            if not err < 4e-2 or not all(torch.equal(r.view(torch.int16), runs[0].view(torch.int16)) for r in runs):
                bad.append(f"{c}: err {err:.2e}")
                continue
            fns[str(c)] = f
        except Exception as e:  # noqa: BLE001 - a study: record and go on
            bad.append(f"{c}: {type(e).__name__} {str(e)[:80]}")
    return graph_times(fns, 8, calls=20), bad


def best_of_each(m: int, n: int, k: int, cfgs, family, twice: bool = False) -> dict:
    """The best config of each family(config) at one shape against torch, printed and returned."""
    t, bad = time_shape(m, n, k, cfgs, twice)
    best = {}
    for c in cfgs:
        s = str(c)
        if s in t and (family(c) not in best or t[s] < t[best[family(c)]]):
            best[family(c)] = s
    row = {"shape": [m, n, k], "torch_us": t["torch"] * 1e3, "bad": bad,
           "best": {f: {"config": s, "us": t[s] * 1e3, "torch/it": t["torch"] / t[s]} for f, s in best.items()}}
    print(f"{m}x{n}x{k} torch {t['torch']*1e3:.1f} us; " + "; ".join(
        f"{f} {v['torch/it']:.3f}" for f, v in sorted(row["best"].items())) + (f"; {len(bad)} bad" if bad else ""),
        flush=True)
    for f, v in sorted(row["best"].items()):
        print(f"    {f:10s} {v['us']:7.1f} us  {v['config']}")
    for b in bad[:4]:
        print("    bad:", b)
    return row


def save(rows, name: str) -> None:
    od = Path(os.environ.get("OUT", "bench_out"))
    od.mkdir(parents=True, exist_ok=True)
    (od / name).write_text(json.dumps(rows, indent=1))


def run(shapes, family, name: str, twice: bool = False) -> int:
    """best_of_each over matmul's space (what the hopper profile admits) at each shape."""
    from nbx_tune.kernels import matmul as MM
    from nbx_tune.profiles import get_profile
    from nbx_tune.kernels.trace import make_row

    hopper = get_profile("hopper")
    out = []
    for m, n, k in shapes:
        p = MM.SPEC.problem_from_row(make_row("aten.mm", ["bfloat16"] * 2, [(m, k), (k, n)]))
        out.append(best_of_each(m, n, k, [c for c in MM.CONFIGS if MM.SPEC.static_refusal(hopper, c, p) is None],
                                family, twice))
    save(out, name)
    return 0


def main() -> int:
    return run(SHAPES, family, "gemm_space.json")


if __name__ == "__main__":
    sys.exit(main())

"""Split-K summed by the last split (SUM_LAST) against split-K with its reduce launch, the
other schedules of matmul's space and torch, at the decode and mid-size GEMM shapes of the
example traces, timed side by side under CUDA graphs. Usage (GPU):
python3 lab/gemm_sum_last/study.py; writes $OUT/gemm_sum_last.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

# (M, N, K): decode rows of Llama-2-7B at batch 1 and 64, then the mid-size prefill rows
# that stayed below torch (Llama-3-8B, Qwen2-1.5B, GPT-2).
SHAPES = [(1, 11008, 4096), (64, 4096, 4096), (1, 4096, 4096), (64, 11008, 4096), (1000, 1024, 4096),
          (800, 1536, 1536), (800, 1536, 8960), (800, 8960, 1536), (1024, 768, 3072), (1024, 2304, 768)]


def family(c) -> str:
    kw = c.kwargs
    if kw.get("SCHEDULE"):
        return "persistent" if kw["SCHEDULE"] == 1 else "stream-k"
    if kw.get("SPLIT_K", 1) > 1:
        return "split-last" if kw.get("SUM_LAST") else "split-k"
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
        sets = max(1, min(4, (96 << 20) // ((m * k + k * n + m * n) * 2)))  # weights leave the L2
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
                for _ in range(2):
                    C[0].fill_(float("nan"))
                    f(0)
                    runs.append(C[0].clone())
                err = (runs[0].double() - ref).abs().max().item() / ref.abs().max().item()
                if not err < 4e-2 or not torch.equal(runs[0].view(torch.int16), runs[1].view(torch.int16)):
                    bad.append(f"{c}: err {err:.2e}")
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
        for b in bad[:4]:
            print("    bad:", b)
    od = Path(os.environ.get("OUT", "bench_out"))
    od.mkdir(parents=True, exist_ok=True)
    (od / "gemm_sum_last.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

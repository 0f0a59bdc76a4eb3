"""Does the census's timing rank GEMM configs as a model under CUDA graphs runs them?

At the GEMM rows of real traces still below torch on the H200, every config of matmul's
space (what the hopper profile admits) is timed three ways:
  census  tuner/timing.gpu_time: one launch at a time behind a 256 MB flush (the census today)
  stream  tuner/timing.stream_time: graph-replayed bursts, warm and rotating operand sets
          (what a kernel declaring `timing = "stream"` gets)
  replay  bench/torch_compare.py's measure: a graph of 20 calls over rotating operand sets,
          side by side with torch.mm and the served op (the shipped table's pick)
and the pick of each of the first two is read under the third. Usage (GPU):
    python3 lab/gemm_replay_timing/rank.py [--budget-s 420] [--rows M,K,N,LAYOUT ...]
writes $OUT/gemm_replay_timing.json and prints a table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

# (M, K, N, layout) of the H200's losing GEMM rows (lab/history/gpu_runs/2026-12-05d/1-torch_compare.json)
ROWS = [(1024, 4096, 1024, "nt"), (1024, 14336, 4096, "nt"), (1024, 3072, 768, "nn"), (1000, 4096, 1024, "nt"),
        (512, 4096, 32000, "nt"), (1024, 768, 2304, "nn"), (1024, 4096, 1024, "nn"), (64, 4096, 4096, "nt"),
        (800, 1536, 1536, "nt"), (16, 4096, 1024, "nt"), (1024, 4096, 4096, "nt"), (800, 8960, 1536, "nt"),
        (800, 1536, 8960, "nt"), (16, 4096, 14336, "nt")]


def operands(m, k, n, layout, sets):
    A = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    if layout == "nt":  # a linear layer's weight, read as W.t()
        B = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() for _ in range(sets)]
    else:
        B = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    C = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    return A, B, C


def one_row(m, k, n, layout, bench, deadline):
    from nbx_tune.bench.torch_compare import graph_times

    from nbx_tune.kernels import matmul as MM
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.timing import benchmarkers as timing
    from nbx_tune.kernels.rows import make_row

    hopper = get_profile("hopper")
    sets = max(1, min(4, (96 << 20) // ((m * k + k * n + m * n) * 2)))
    A, B, C = operands(m, k, n, layout, sets)
    ref = A[0].double() @ B[0].double()
    row = make_row("aten.mm", ["bfloat16"] * 2, [(m, k), (k, n)], {"layout": layout} if layout != "nn" else None)
    p = MM.SPEC.problem_from_row(row)
    cfgs = [c for c in MM.CONFIGS if MM.SPEC.static_refusal(hopper, c, p) is None]
    fns = {"torch": lambda i: torch.mm(A[i % sets], B[i % sets], out=C[i % sets]),
           "served": lambda i: MM.mm(A[i % sets], B[i % sets])}
    census, stream, bad = {}, {}, []
    for c in cfgs:
        if time.time() > deadline:
            break
        f = (lambda i, c=c: MM.launch_matmul(A[i % sets], B[i % sets], C[i % sets], None, 1.0, 0.0, c))
        try:
            C[0].fill_(float("nan"))
            f(0)
            err = (C[0].double() - ref).abs().max().item() / ref.abs().max().item()
            if not err < 4e-2:
                bad.append(f"{c}: err {err:.2e}")
                continue
            census[str(c)] = bench(lambda f=f: f(0), "full").median_ms
            stream[str(c)] = bench.stream([lambda f=f, i=i: f(i) for i in range(sets)], "full").median_ms
            fns[str(c)] = f
        except Exception as e:  # noqa: BLE001 - a study: record and go on
            bad.append(f"{c}: {type(e).__name__} {str(e)[:80]}")
    rep = graph_times(fns, 8, calls=20)
    del A, B, C
    torch.cuda.empty_cache()
    return {"row": [m, k, n, layout], "sets": sets, "census": census, "stream": stream, "replay": rep, "bad": bad,
            "timed": len(census), "space": len(cfgs), "method": timing.family(bench.method)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--rows", nargs="*", metavar="M,K,N,LAYOUT",
                    help="rows to time instead of ROWS, e.g. 512,4096,32000,nn")
    args = ap.parse_args()
    rows = ROWS if not args.rows else [(*map(int, r.split(",")[:3]), r.split(",")[3]) for r in args.rows]
    from nbx_tune.testing.bench import environment, save

    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.timing import benchmarkers as timing

    bench = timing.for_profile(get_profile("hopper"))
    t0 = time.time()
    deadline = t0 + args.budget_s
    out, lines = {"env": environment(), "rows": []}, []
    for m, k, n, layout in rows:
        if time.time() > deadline:
            break
        r = one_row(m, k, n, layout, bench, deadline)
        out["rows"].append(r)
        rep = r["replay"]
        pick_c = min(r["census"], key=r["census"].get)
        pick_s = min(r["stream"], key=r["stream"].get)
        best = min((s for s in rep if s not in ("torch", "served")), key=rep.get)
        t = rep["torch"]
        line = (f"{m}x{k}->{n} {layout}  torch {t*1e3:6.1f} us  served {t/rep['served']:.3f}  census-pick "
                f"{t/rep[pick_c]:.3f}  stream-pick {t/rep[pick_s]:.3f}  replay-best {t/rep[best]:.3f}  "
                f"({r['timed']}/{r['space']} timed, {len(r['bad'])} bad, {time.time()-t0:.0f} s)")
        print(line, flush=True)
        print(f"    census pick {pick_c}\n    stream pick {pick_s}\n    replay best {best}", flush=True)
        lines.append(line)
        save("gemm_replay_timing.json", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

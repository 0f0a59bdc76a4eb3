"""How much of the stage cost's pick loss is the measure's own noise?

`bench/tuning_cost.py` takes a row's loss as the median of three side-by-side graph
replays (60 ms each) of the census's pick against autotune's. The picks at the large GEMM
rows bounce between three or four configs from run to run on both sides (calls 23-30),
and the loss reached 4.59 % (call 29) and 7.45 % (call 30) between configs that other runs
found equal. Here the picks of the given tuning_cost.json files are timed as the bench
times them, with a third graph of the census's pick beside them (the same binary: an A/A
control), in TRIALS trials at each replay length. Usage (GPU):

    python3 lab/certify_cost/pick_noise.py A-tuning_cost.json [B-tuning_cost.json ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TRIALS = 5
REPS_MS = (60, 300)


def main(paths):
    import torch
    from nbx_tune.bench.torch_compare import graph_times, n_sets

    from nbx_tune.kernels.matmul import launch_matmul
    from nbx_tune.kernels.spec import Config

    rows = {}
    for path in paths:
        for line in json.loads(Path(path).read_text())["picks"]:
            shape, cert, auto = line[0], line[8], line[9]
            if cert != auto:
                rows.setdefault((shape, cert, auto), Path(path).name)
    print(f"{torch.cuda.get_device_name()}; {len(rows)} differing pick pairs; {TRIALS} trials, "
          f"each the bench's median of 3 side-by-side repeats", flush=True)
    out = []
    for (shape, cert, auto), src in rows.items():
        f = dict(kv.split("=") for kv in shape.split()[:4])
        B, M, N, K = (int(f[k]) for k in ("B", "M", "N", "K"))
        dt = getattr(torch, shape.split()[4])
        k = n_sets((M * K + K * N + M * N) * B * dt.itemsize, "cuda")
        a = [torch.randn(B, M, K, device="cuda", dtype=dt) for _ in range(k)]
        b = [torch.randn(B, K, N, device="cuda", dtype=dt) for _ in range(k)]
        c = [torch.empty(B, M, N, device="cuda", dtype=dt) for _ in range(k)]
        cc, ca = Config.parse(cert), Config.parse(auto)
        fns = {"cert": lambda i: launch_matmul(a[i % k], b[i % k], c[i % k], None, 1.0, 0.0, cc),
               "auto": lambda i: launch_matmul(a[i % k], b[i % k], c[i % k], None, 1.0, 0.0, ca),
               "again": lambda i: launch_matmul(a[i % k], b[i % k], c[i % k], None, 1.0, 0.0, cc)}
        for rep in REPS_MS:
            losses, aas, ratios = [], [], []
            for _ in range(TRIALS):
                reps = [graph_times(fns, rep) for _ in range(3)]
                losses.append(statistics.median(max(0.0, r["cert"] / r["auto"] - 1) for r in reps))
                aas.append(statistics.median(abs(r["again"] / r["cert"] - 1) for r in reps))
                ratios.append(statistics.median(r["cert"] / r["auto"] for r in reps))
            rec = {"shape": shape, "from": src, "cert": cert, "auto": auto, "rep_ms": rep,
                   "losses": losses, "aa": aas, "cert_over_auto": ratios}
            out.append(rec)
            print(f"{shape:34s} {rep:4d} ms  loss " + " ".join(f"{100 * x:5.2f}" for x in losses)
                  + "  | A/A " + " ".join(f"{100 * x:5.2f}" for x in aas)
                  + "  | cert/auto " + " ".join(f"{x:.3f}" for x in ratios), flush=True)
        fns = None
        torch.cuda.empty_cache()
    import os
    Path(os.environ.get("OUT", "."), "pick_noise.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])

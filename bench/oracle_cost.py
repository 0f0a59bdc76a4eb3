"""What making a seat's screen cases costs (seeded inputs and their fp64 oracle) at the
shapes of the example traces, and whether every seat of every example trace is screened on
a profile (no shape over its byte budget, at the shapes seen or the tile edges).

    python bench/oracle_cost.py                      (hopper; every screen shape, in trace order)
    python bench/oracle_cost.py --top 3              (only the 3 largest shapes)
    python bench/oracle_cost.py --top 1 --max-gib 0.3   (a CPU smoke run: smaller shapes only)

Cases are made as a census makes them (`screen.make_case`), one after another in one
process, so buffers kept from case to case count as they would. For each shape, the
seconds of each step: drawing the inputs, rounding them to the dtype, widening them to
fp64 for the oracle, moving them to the device, and the oracle (its large products on the
GPU); then the totals per step and the slowest shapes. Writes oracle_cost.json under $OUT.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from pathlib import Path


from nbx_tune.testing.bench import environment, save, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="hopper")
    ap.add_argument("--top", type=int, default=0, help="time only this many of the largest shapes")
    ap.add_argument("--as-before", action="store_true",
                    help="fresh fp64 buffers every case and every large product on the GPU (the ablation)")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="start no shape after this")
    ap.add_argument("--max-gib", type=float, default=None, help="time only shapes under this many GiB")
    args = ap.parse_args()

    import numpy as np
    import torch

    from nbx_tune.kernels.runtime.registry import all_specs
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner.certify import screen as screening
    from nbx_tune.tuner.census.census import load_plan
    from nbx_tune.tuner.certify.screen_shapes import screen_shapes

    profile, specs = get_profile(args.profile), all_specs()
    if args.as_before:
        from nbx_tune.oracles import products
        screening.SCRATCH_KEEP_BYTES, products.MIN_INTENSITY = 0, 0
    env = environment()
    print(f"{env['date']} {env['gpu']} {env.get('cpu', '')} profile {profile.name}"
          f"{' (as before)' if args.as_before else ''}, THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', '')}, budget "
          f"{profile.screen_max_bytes / 2**30:.2f} GiB", flush=True)
    seats, shapes = [], {}
    for path in sorted(glob.glob(str(ROOT / "examples" / "traces" / "*.tsv"))):
        pl = load_plan(path, profile)
        for sp in pl.seats.values():
            spec = specs[sp.kernel]
            sh = screen_shapes(spec, profile, list(sp.problems))
            seats.append([Path(path).stem, sp.label[:70], len(sh.base) + len(sh.confirm), len(sh.skipped)])
            for p in (*sh.base, *sh.confirm):
                shapes[p] = (spec, spec.operand_bytes(p), Path(path).stem)
    over = [s for s in seats if s[3]]
    print(f"{len(seats)} seats of {len({s[0] for s in seats})} traces: {len(over)} with a shape over the budget")
    for s in over:
        print(f"  over: {s[0]} {s[1]}")

    device = "cuda" if torch.cuda.is_available() else "cpu"
    limit = args.max_gib * 2**30 if args.max_gib else float("inf")
    timed = [(b, p, spec, t) for p, (spec, b, t) in shapes.items() if b <= limit]
    if args.top:
        timed = sorted(timed, key=lambda x: -x[0])[: args.top]
    steps = ("draw", "round", "widen", "move", "oracle")
    rows, totals, t_start = [], dict.fromkeys(steps, 0.0), time.perf_counter()
    for nbytes, p, spec, trace in timed:
        if time.perf_counter() - t_start > args.budget_s:
            print(f"budget spent: {len(rows)} of {len(timed)} shapes timed")
            break
        phases = {}
        t0 = time.perf_counter()
        case = screening.make_case(spec, p, device, 1, True, phases)
        if device != "cpu":
            torch.cuda.synchronize()
        total = time.perf_counter() - t0
        for k in steps:
            totals[k] += phases.get(k, 0.0)
        dims = ",".join(f"{d.name}={v}" for d, v in zip(spec.key, p.dims))
        rows.append([trace, f"{spec.name} {p.dtypes[0]} {dims}", f"{nbytes / 2**20:.0f}",
                     *(f"{phases.get(k, 0.0):.2f}" for k in steps), f"{total:.2f}"])
        del case
    head = ["trace", "shape", "MiB", *(f"{k} s" for k in steps), "total s"]
    print(f"{len(rows)} shapes, {sum(float(r[-1]) for r in rows):.1f} s: "
          + ", ".join(f"{k} {v:.1f}" for k, v in totals.items()))
    print(table(sorted(rows, key=lambda r: -float(r[-1]))[:15], head))
    save("oracle_cost.json", {"env": env, "profile": profile.name, "budget": profile.screen_max_bytes,
                              "seats": len(seats), "over_budget": over, "header": head, "timed": rows,
                              "totals_s": totals})
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())

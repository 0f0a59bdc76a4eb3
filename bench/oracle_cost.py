"""What the screen's fp64 oracle costs at the largest shapes of the example traces, and
whether every seat of every example trace is screened on a profile (no shape over its
byte budget, at the shapes seen or the tile edges).

    python bench/oracle_cost.py                      (hopper; times the 3 largest shapes)
    python bench/oracle_cost.py --top 1 --max-gib 0.3   (a CPU smoke run: smaller shapes only)

For each timed shape: seconds to make the seeded inputs, to round them to the dtype and
move them to the device, and to run the numpy fp64 oracle; the bytes of the operands and of
the oracle's fp64 copies. Writes oracle_cost.json under $OUT.
"""

from __future__ import annotations

import argparse
import glob
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import environment, save, table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="hopper")
    ap.add_argument("--top", type=int, default=3, help="time the oracle at this many of the largest shapes")
    ap.add_argument("--max-gib", type=float, default=None, help="time only shapes under this many GiB")
    args = ap.parse_args()

    import numpy as np
    import torch

    from nbx_tune.kernels.registry import all_specs
    from nbx_tune.profiles import get_profile
    from nbx_tune.tuner import screen as screening
    from nbx_tune.tuner.census import load_plan
    from nbx_tune.tuner.screen_shapes import screen_shapes

    profile, specs = get_profile(args.profile), all_specs()
    env = environment()
    print(f"{env['date']} {env['gpu']} {env.get('cpu', '')} profile {profile.name}, budget "
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
    timed = sorted(((b, p, spec, t) for p, (spec, b, t) in shapes.items() if b <= limit),
                   key=lambda x: -x[0])[: args.top]
    rows = []
    for nbytes, p, spec, trace in timed:
        rng = screening.Sampler(1)  # as the screen draws them: large draws in blocks on threads
        t0 = time.perf_counter()
        made = spec.make_inputs(p, rng)
        t1 = time.perf_counter()
        rounded = {}
        for name, (values, dt) in made.items():
            t = torch.from_numpy(np.ascontiguousarray(values)).to(screening.TORCH_DTYPES[dt])
            rounded[name] = t.to(torch.float64).numpy() if t.is_floating_point() else t.numpy()
            t.to(device)
        if device != "cpu":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        ref = spec.oracle(p, rounded)
        t3 = time.perf_counter()
        fp64 = sum(a.nbytes for a in rounded.values()) + sum(np.asarray(a).nbytes for a in ref.values())
        dims = ",".join(f"{d.name}={v}" for d, v in zip(spec.key, p.dims))
        rows.append([trace, f"{spec.name} {p.dtypes[0]} {dims}", f"{nbytes / 2**20:.0f}", f"{fp64 / 2**30:.2f}",
                     f"{t1 - t0:.2f}", f"{t2 - t1:.2f}", f"{t3 - t2:.2f}", f"{t3 - t0:.2f}"])
        print(table(rows[-1:], ["trace", "shape", "MiB", "fp64 GiB", "inputs s", "round+move s", "oracle s", "total s"]),
              flush=True)
        del made, rounded, ref
    save("oracle_cost.json", {"env": env, "profile": profile.name, "budget": profile.screen_max_bytes,
                              "seats": len(seats), "over_budget": over, "timed": rows})
    print(table(rows, ["trace", "shape", "MiB", "fp64 GiB", "inputs s", "round+move s", "oracle s", "total s"]))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())

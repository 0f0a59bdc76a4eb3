"""Certify Inductor's max-autotune GEMM choices for a trace's GEMMs, on a GPU, into a table
that `compile + nbx table` (bench/compile_serve.py) and `inductor_table.install()` serve.

    python3 bench/inductor_choices.py --trace examples/traces/llama2_7b_seq512_bf16.tsv \\
        -o $OUT/inductor_hopper.json [--limit 8]
    NBX_TUNE_INDUCTOR_TABLE=$OUT/inductor_hopper.json python3 bench/compile_serve.py --models llama

Per GEMM (tuner/inductor/choices.py): Inductor's Triton template configs, each compiled alone,
screened against the fp64 oracle at the profile's tolerance and timed beside aten's kernel;
the fastest survivor is the entry, the refusals kept with it. Prints per GEMM the configs
tried, refused, the chosen one's time over aten's (>= 1: the template is as fast) and the
seconds it took. --limit stops after that many GEMMs (most launched first), --budget-s when
a GEMM would start past it; the table is written after each GEMM, whole.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", required=True, action="append", help="trace file (repeatable)")
    p.add_argument("-o", "--output", required=True, help="the table to write (JSON)")
    p.add_argument("--limit", type=int, default=0, help="at most this many GEMMs (0: all)")
    p.add_argument("--budget-s", type=float, default=1e9, help="start no GEMM after this many seconds")
    args = p.parse_args(argv)

    import torch
    import triton

    from nbx_tune.kernels.serving import inductor_table
    from nbx_tune.profiles import current_profile, device_info
    from nbx_tune.testing.bench import table
    from nbx_tune.tuner.inductor.choices import certify, entry, gemm_problems

    if inductor_table.hook() is None:
        raise SystemExit(inductor_table.NO_HOOK.format(version=torch.__version__))
    profile = current_profile()
    gemms = list(dict.fromkeys(g for t in args.trace for g in gemm_problems(t)))
    if args.limit:
        gemms = gemms[:args.limit]
    prov = {"torch_version": torch.__version__, "triton_version": triton.__version__,
            "device_name": device_info().name}
    entries, rows, t0 = [], [], time.time()
    for g in gemms:
        if time.time() - t0 > args.budget_s:
            print(f"{g}: not started, past --budget-s")
            continue
        t1 = time.time()
        try:
            choice = certify(g, profile.screen_rtol[g.dtype])
        except Exception as e:  # Inductor's API moved, a GEMM it cannot compile: a row, not a crash
            print(f"{g}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            choice = None
        took = time.time() - t1
        e = entry(choice, prov) if choice else None
        refused = sum(1 for m in choice.measured if m.refusal) if choice else 0
        tried = len(choice.measured) if choice else 0
        if e:
            entries.append(e)
            inductor_table.write(Path(args.output), profile.name, entries)
        B, M, N, K = g.dims
        rows.append([g.op, g.dtype, f"{B}x{M}x{N}x{K}", g.layout, tried, refused,
                     f"{e['provenance']['aten_ms'] / e['provenance']['ms']:.2f}" if e else "none passed",
                     f"{took:.0f}"])
    print(table(rows, ["op", "dtype", "BxMxNxK", "layout", "configs", "refused", "aten/chosen", "s"]))
    print(f"{len(entries)} choices written to {args.output}")


if __name__ == "__main__":
    main()

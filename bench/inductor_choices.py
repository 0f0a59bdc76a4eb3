"""Certify Inductor's max-autotune GEMM choices for a trace's GEMMs, on a GPU, into the
database, and export them as the table `compile + nbx table` (bench/compile_serve.py) and
`inductor_table.install()` serve.

    python3 bench/inductor_choices.py --trace examples/traces/llama2_7b_seq512_bf16.tsv \\
        --db sqlite:///$OUT/inductor.db -o $OUT/inductor_hopper.json [--limit 8]
    NBX_TUNE_INDUCTOR_TABLE=$OUT/inductor_hopper.json python3 bench/compile_serve.py --models llama

The same as `nbx-tune inductor certify` then `nbx-tune inductor export`. Per GEMM
(tuner/inductor/choices.py): Inductor's Triton template configs, each compiled alone,
screened against the fp64 oracle at the profile's tolerance and timed beside aten's kernel;
the fastest survivor is the choice, written with the refusals to the database as each GEMM
finishes (tuner/store/inductor.py). Prints per GEMM the configs tried, refused, the chosen
one's time over aten's (>= 1: the template is as fast), whether it is now the current choice
and the seconds it took. --limit stops after that many GEMMs (most launched first),
--budget-s when a GEMM would start past it. Without a GPU (or a torch without Inductor's
lookup table) it says so in one line and exits 1.
"""

from __future__ import annotations

import argparse


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", required=True, action="append", help="trace file (repeatable)")
    p.add_argument("-o", "--output", required=True, help="the profile's table to write from the database (JSON)")
    p.add_argument("--db", default=None, help="database URL (else NBX_TUNE_DB, else the user cache's)")
    p.add_argument("--limit", type=int, default=0, help="at most this many GEMMs (0: all)")
    p.add_argument("--budget-s", type=float, default=None, help="start no GEMM after this many seconds")
    args = p.parse_args(argv)

    from nbx_tune.errors import NbxError
    from nbx_tune.testing.bench import table
    from nbx_tune.tuner import commands as api

    def row(c):
        prov = (c.record or {}).get("provenance", {})
        w = c.written
        B, M, N, K = c.gemm.dims
        return [c.gemm.op, c.gemm.dtype, f"{B}x{M}x{N}x{K}", c.gemm.layout, prov.get("candidates", 0),
                len(prov.get("refusals", [])),
                f"{prov['aten_ms'] / prov['ms']:.2f}" if prov.get("ms") and prov.get("aten_ms") else (
                    c.error or "none passed"), ("yes" if w.current else w.why) if w else "-", f"{c.seconds:.0f}"]

    try:
        run = api.inductor_certify(args.trace, args.db, None, args.limit, args.budget_s,
                                   on_gemm=lambda c: print(" | ".join(map(str, row(c))), flush=True))
    except NbxError as e:
        raise SystemExit(f"error: {e}") from None
    try:  # the database's current choices of the profile, this run's and any earlier
        exported = api.inductor_export(run.profile, args.output, args.db)
    except NbxError as e:
        exported, why = None, str(e)
    print(table([row(c) for c in run.gemms], ["op", "dtype", "BxMxNxK", "layout", "configs", "refused", "aten/chosen",
                                         "current", "s"]))
    print(f"{exported['entries']} choices of {exported['profile']} written to {exported['path']}" if exported
          else f"no table written: {why}")


if __name__ == "__main__":
    main()

"""How long `nbx-tune import` takes for a large certified table (issue 61: 100,000 entries
took 303 s on a 2-core CPU).

    TRITON_INTERPRET=1 python bench/import_scale.py [--entries 100000] [--db sqlite:///x.db]

Makes a table of N distinct matmul seats for the interpreter profile (rows `aten.mm`
MxK;KxN mapped to seats as a census does; the first declared config; provenance of this
checkout), then imports it into a fresh database, timing the check and the write.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")


def make_table(n: int, out: Path) -> int:
    from nbx_tune.kernels.runtime import table_format, validity
    from nbx_tune.kernels.runtime.registry import all_specs
    from nbx_tune.profiles import builtin_profiles
    from nbx_tune.tuner.census.census import plan
    from nbx_tune.kernels.trace import parse_trace_text

    profile = builtin_profiles()["interpreter"]
    spec = all_specs()["matmul"]
    sizes = [v for v in range(1, 64)] + list(range(64, 256, 16)) + list(range(256, 1024, 32))
    lines, m_i = [], 0
    while len(lines) < n:
        m = sizes[m_i % len(sizes)]
        k = sizes[(m_i // len(sizes)) % len(sizes)]
        nn = sizes[(m_i // len(sizes) ** 2) % len(sizes)]
        lines.append(f"aten.mm\tfloat32,float32\t{m}x{k};{k}x{nn}\t\t1")
        m_i += 1
    trace = parse_trace_text("# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n" + "\n".join(lines) + "\n")
    p = plan(trace, "bench", profile)
    config = str(spec.configs()[0])
    prov = {"device_name": "Triton interpreter", "device_target": "interpreter", "driver": "n/a",
            "triton_version": "bench", "torch_version": "bench", "kernel_source_hash": spec.source_hash,
            "config_space_hash": spec.config_space_hash, "profile_hash": validity.profile_hash(profile, spec),
            "certified_at": "2026-01-01T00:00:00+00:00", "search": "full"}
    entries = []
    for sp in p.seats.values():
        probs = sorted(sp.problems, key=lambda q: q.order())
        entries.append({"kernel": sp.kernel, "dtypes": sp.dtypes, "flags": sp.flags, "bucket": sp.bucket,
                        "config": config, "median_ms": 1.0, "spread_ms": [0.9, 1.1], "runner_up": None,
                        "runner_up_ms": None, "margin": None, "screens": [],
                        "screened_min": json_of(probs[0]), "screened_max": json_of(probs[-1]),
                        "unscreened": None, "timing_method": "bench", "provenance": dict(prov)})
    out.write_text(table_format.dumps(profile.name, profile.architecture, profile.hash, entries))
    return len(entries)


def json_of(problem) -> dict:
    import json

    return json.loads(problem.to_json())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--db", default=None, help="default: a fresh SQLite file in a temporary folder")
    args = ap.parse_args(argv)
    from nbx_tune.tuner import commands as api

    with tempfile.TemporaryDirectory() as d:
        table = Path(d) / "interpreter.json"
        t0 = time.perf_counter()
        made = make_table(args.entries, table)
        t1 = time.perf_counter()
        s = api.import_(str(table), args.db or f"sqlite:///{Path(d) / 'import.db'}")
        t2 = time.perf_counter()
    print(f"table of {made:,} entries made in {t1 - t0:.1f} s; import: {t2 - t1:.1f} s "
          f"({s.added:,} added, {len(s.skipped)} skipped)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Merge a re-certified export into the shipped table, keeping every other entry as shipped.

    python3 release/merge_table.py EXPORT.json [--table kernels/tables/hopper.json] [--kernels matmul,attention] [--drop-stale]
    python3 release/merge_table.py EXPORT.json --baselines     only the torch baselines (`nbx-tune baseline`)
                                                              of the export's entries, onto the shipped
                                                              entries of the same seat and config

An export made after `import` + census (the gpu_session `refresh` stage) holds the imported
entries too, without the `sampled_regret` the importing database never measured; only the
entries the census certified there (their certificates are newer than the shipped ones, or
their source hash differs) replace the shipped ones, or those of the named kernels."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from nbx_tune.kernels.runtime import table_format


def seat(e: dict) -> tuple:
    return table_format.seat_sort_key(e)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export")
    ap.add_argument("--table", default=str(ROOT / "kernels/tables/hopper.json"))
    ap.add_argument("--kernels", default="", help="take these kernels' entries from the export (default: changed ones)")
    ap.add_argument("--baselines", action="store_true",
                    help="take only the export's torch baselines, for shipped entries of the same config")
    ap.add_argument("--drop-stale", action="store_true",
                    help="leave out shipped entries this checkout judges stale (a re-keyed bucket, an edited kernel)")
    args = ap.parse_args(argv)
    new = table_format.read(args.export)
    old = table_format.read(args.table)
    if (new["profile"], new["architecture"]) != (old["profile"], old["architecture"]):
        print(f"{args.export}: profile {new['profile']} does not match {args.table}'s {old['profile']}")
        return 2
    kernels = {k for k in args.kernels.split(",") if k}
    shipped = {seat(e): e for e in old["entries"]}
    taken = 0
    if args.baselines:
        return _baselines(args, new, shipped)
    for e in new["entries"]:
        was = shipped.get(seat(e))
        changed = (was is None or was["provenance"]["kernel_source_hash"] != e["provenance"]["kernel_source_hash"]
                   or was["provenance"]["config_space_hash"] != e["provenance"]["config_space_hash"]
                   or was["provenance"]["certified_at"] < e["provenance"]["certified_at"])
        if (e["kernel"] in kernels) if kernels else changed:
            shipped[seat(e)] = e
            taken += 1
    dropped = 0
    if args.drop_stale:
        from nbx_tune.kernels.runtime import validity
        from nbx_tune.kernels.runtime.registry import all_specs
        from nbx_tune.profiles import get_profile

        specs, profile = all_specs(), get_profile(new["profile"])
        for k, e in list(shipped.items()):
            if validity.stale_reason(e["provenance"], specs.get(e["kernel"]), profile) is not None:
                del shipped[k]
                dropped += 1
    entries = sorted(shipped.values(), key=seat)
    # The header names the profile the export was made under: this checkout's.
    Path(args.table).write_text(table_format.dumps(new["profile"], new["architecture"], new["profile_hash"], entries))
    print(f"{args.table}: {taken} entries from {args.export}, {len(entries) - taken} kept as shipped"
          + (f", {dropped} stale ones dropped" if args.drop_stale else ""))
    return 0


def _baselines(args, new: dict, shipped: dict) -> int:
    from nbx_tune.tuner.store.export import newest_baselines

    taken = 0
    for e in new["entries"]:
        was = shipped.get(seat(e))
        found = e["provenance"].get("torch_baselines")
        if was is None or not found or was["config"] != e["config"]:
            continue
        was["provenance"]["torch_baselines"] = newest_baselines(
            [*was["provenance"].get("torch_baselines", ()), *found])
        taken += 1
    entries = sorted(shipped.values(), key=seat)
    Path(args.table).write_text(table_format.dumps(new["profile"], new["architecture"], new["profile_hash"], entries))
    print(f"{args.table}: torch baselines of {taken} entries from {args.export}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

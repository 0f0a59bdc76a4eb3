"""The re-certification's judge replayed on a GPU run's records, no GPU: for every seat whose
picks differed in a `bench/recertify_cost.py` run (its JSON keeps what the re-certification
timed there), the verdict with and without the explored configs' moves (tuner/certify/recertify.py).
The records keep medians only: every timing is read as exact (no noise allowed for), so a
bound here is the widest the judge could have drawn from those medians.

    python lab/certify_cost/judge_replay.py lab/history/gpu_runs/2026-12-06/36-recertify_cost.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace


def main(paths) -> None:
    from nbx_tune.kernels.runtime.certified import TABLE_DIR
    from nbx_tune.kernels.spec import Config
    from nbx_tune.tuner.certify import recertify
    from nbx_tune.tuner.timing.benchmarkers import Timing

    table = {(e["kernel"], e["dtypes"], e["flags"], e["bucket"]): e
             for e in json.loads((TABLE_DIR / "hopper.json").read_text())["entries"]}
    print(f"{'run':<22} {'seat':<64} {'without explored':<18} {'with explored':<18} held in the run")
    for path in paths:
        for row in json.loads(Path(path).read_text())["losses"]:
            entry = table.get(tuple(row["seat"].split("|")))
            if "seen" not in row or entry is None:
                continue
            seed = recertify.seed_from_entry(entry, "shipped table")
            ms = row["seen"]["recert"]["ms"]
            method = seed.timing or "do_bench"  # the old ranking's family: the judge compares within it
            got = [SimpleNamespace(config=Config.parse(k), final=True, timing=Timing(v, v, v, method))
                   for k, v in ms.items()]
            explored = tuple(k for k in ms if k not in seed.old_ms)
            verdicts = [recertify.judge(seed, got), recertify.judge(seed, got, explored)]
            said = ["holds" if v.holds else "falls back" if v.bound is None else f"falls back ({v.bound:.1%})"
                    for v in verdicts]
            said = [s if v.holds or v.bound is not None else f"{s}: {v.why[:20]}" for s, v in zip(said, verdicts)]
            held = not row["seen"]["recert"]["why"].startswith("tuned in full")
            print(f"{Path(path).name:<22} {row['seat'][:64]:<64} {said[0]:<18} {said[1]:<18} {'yes' if held else 'no'}")


if __name__ == "__main__":
    main(sys.argv[1:])

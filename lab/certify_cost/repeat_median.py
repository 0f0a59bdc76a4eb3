"""The goal's losses "taken as the median of three repeats", read from runs already made: each
seat's loss is the median over three runs of the same seats (recertify_cost.json files of one
seeded sample, or tuning_cost.json files, whose rows are the trace's matmul shapes), then the
median and the maximum over seats. One run's maximum is
one draw of each seat's pick noise; a seat that loses in most repeats keeps its loss here.
No GPU. Usage: python3 repeat_median.py RUN.json RUN.json RUN.json [...] (every three-run
combination of the files given is read; they must share the sample: same seats)."""

import itertools
import json
import statistics
import sys
from pathlib import Path


def losses(run: dict) -> dict:
    """{seat: loss} of one run: a re-certification's seats, or the stage cost's rows."""
    if "losses" in run:
        return {x["seat"]: x["loss"] for x in run["losses"]}
    return {row[0]: float(row[6].rstrip(" %")) / 100 for row in run["picks"]}  # bench/tuning_cost.py's line


def per_seat(paths) -> dict:
    """{seat: [loss per run]} over the seats every run has."""
    runs = [losses(json.loads(Path(p).read_text())) for p in paths]
    seats = set.intersection(*(set(r) for r in runs))
    return {s: [r[s] for r in runs] for s in sorted(seats)}


def main(paths) -> None:
    print(f"{'runs':36s} {'seats':>5s} {'median':>7s} {'max':>7s} {'>3 %':>4s}  worst seat")
    for combo in itertools.combinations(paths, 3):
        med = {s: statistics.median(ls) for s, ls in per_seat(combo).items()}
        worst = max(med, key=med.get)
        names = " ".join(Path(p).name.split("-")[0] for p in combo)
        print(f"{names:36s} {len(med):5d} {100 * statistics.median(med.values()):6.2f}% "
              f"{100 * med[worst]:6.2f}% {sum(v > 0.03 for v in med.values()):4d}  {worst[:70]}")


if __name__ == "__main__":
    main(sys.argv[1:])

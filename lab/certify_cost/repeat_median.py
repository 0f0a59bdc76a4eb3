"""The goal's losses "taken as the median of three repeats", read from runs already made: each
seat's loss is the median over three re-certification runs of the same seeded sample (their
recertify_cost.json files), then the median and the maximum over seats. One run's maximum is
one draw of each seat's pick noise; a seat that loses in most repeats keeps its loss here.
No GPU. Usage: python3 repeat_median.py RUN.json RUN.json RUN.json [...] (every three-run
combination of the files given is read; they must share the sample: same seats)."""

import itertools
import json
import statistics
import sys
from pathlib import Path


def per_seat(paths) -> dict:
    """{seat: [loss per run]} over the seats every run has."""
    runs = [{x["seat"]: x["loss"] for x in json.loads(Path(p).read_text())["losses"]} for p in paths]
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

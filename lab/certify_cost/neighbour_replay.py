"""Would timing the shipped winner's neighbours have caught the fresh census's pick? Reads
recertify_cost.json files with no GPU. A neighbour is a config of the kernel's space one step
from the shipped winner: one parameter moved to the next value the space has for it (so a
block size doubled or halved, a flag turned on or off). For each seat whose picks differ
by more than MIN_LOSS, prints where its shipped entry was certified, whether the fresh pick
was timed by the re-certification, and whether it is a neighbour of the shipped winner; then
how many neighbours the re-certification did not time, per seat (what the lever would cost).
Usage: PYTHONPATH=<dir holding nbx_tune> python3 neighbour_replay.py FILE..."""

import json
import statistics
import sys
from collections import Counter
from pathlib import Path

from nbx_tune.kernels.runtime.certified import TABLE_DIR
from nbx_tune.kernels.runtime.registry import get_spec
from nbx_tune.kernels.spec import Config

MIN_LOSS = 0.01


def parse(text: str) -> dict:
    return Config.parse(text).kwargs


def neighbours(winner: str, space: list[str]) -> set[str]:
    """Configs of `space` one step from `winner`: one key's value moved to the adjacent value
    among those the space has for it, or the key added or dropped (a flag)."""
    w = parse(winner)
    values: dict[str, list] = {}
    for c in space:
        for k, v in parse(c).items():
            values.setdefault(k, set()).add(v)
    values = {k: sorted(v) for k, v in values.items()}
    out = set()
    for c in space:
        p = parse(c)
        diff = [k for k in set(w) | set(p) if w.get(k) != p.get(k)]
        if len(diff) != 1:
            continue
        k = diff[0]
        if k not in w or k not in p:
            out.add(c)
        elif abs(values[k].index(w[k]) - values[k].index(p[k])) == 1:
            out.add(c)
    return out


def main(paths) -> None:
    table = {"|".join((e["kernel"], e["dtypes"], e["flags"], e["bucket"])): e
             for e in json.loads((TABLE_DIR / "hopper.json").read_text())["entries"]}
    spaces: dict[str, list[str]] = {}
    caught, missed, cost = Counter(), Counter(), []
    for p in paths:
        run = json.loads(Path(p).read_text())
        for x in run["losses"]:
            entry = table.get(x["seat"])
            if entry is None:
                continue
            kernel = entry["kernel"]
            if kernel not in spaces:
                spaces[kernel] = [str(c) for c in get_spec(kernel).configs()]
            near = neighbours(entry["config"], spaces[kernel])
            origin = "H200" if "H200" in entry["provenance"]["device_name"] else "H100"
            timed = set(x.get("seen", {}).get("recert", {}).get("ms", {})) or {x["recert"]}
            cost.append((origin, len(near - timed)))
            if x["loss"] <= MIN_LOSS:
                continue
            is_near = x["fresh"] in near
            (caught if is_near and x["fresh"] not in timed else missed)[origin] += 1
            print(f"{Path(p).name.split('-')[0]:>3s} {origin} {100 * x['loss']:6.2f} % "
                  f"fresh pick {'timed' if x['fresh'] in timed else 'untimed'}, "
                  f"{'a neighbour' if is_near else 'not a neighbour'} of the shipped winner  {x['seat'][:70]}")
    print(f"seats over {100 * MIN_LOSS:.0f} % whose fresh pick an untimed neighbour is: {dict(caught)}; the others: {dict(missed)}")
    for origin in ("H100", "H200"):
        extra = [n for o, n in cost if o == origin]
        if extra:
            print(f"{origin}-made seats: untimed neighbours a seat, median {statistics.median(extra)}, max {max(extra)}, "
                  f"mean {statistics.mean(extra):.1f} ({len(extra)} seat-runs)")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Would keeping the old winner have lost less? Reads recertify_cost.json files (calls 36-40
of lab/history/gpu_runs/2026-12-06/) with no GPU: where the re-certification switched away
from the shipped winner to a config its own timings put at most L ahead, the loss had it
kept the old winner is estimated as 0 where the fresh census picked that winner too, and
otherwise as the fresh census's own reading of it against its pick (an overestimate: the
fresh pick is the minimum of noisy timings). Usage: python3 incumbent_replay.py FILE..."""

import json
import statistics
import sys
from pathlib import Path

from nbx_tune.kernels.runtime.certified import TABLE_DIR


def replay(run: dict, old: dict, lead: float) -> dict:
    before, after, changed = [], [], 0
    for x in run["losses"]:
        w, loss = old.get(x["seat"]), x["loss"]
        kept = loss
        if "seen" in x and x["recert"] != w:
            rm, fm = x["seen"]["recert"]["ms"], x["seen"]["fresh"]["ms"]
            if w in rm and rm[w] / rm[x["recert"]] - 1 <= lead:
                changed += 1
                kept = 0.0 if x["fresh"] == w else (fm[w] / fm[x["fresh"]] - 1 if w in fm else None)
        before.append(loss)
        if kept is not None:
            after.append(kept)
    return {"changed": changed, "max": (max(before), max(after)), "over_3": (
        sum(b > 0.03 for b in before), sum(a > 0.03 for a in after)),
        "mean": (statistics.mean(before), statistics.mean(after))}


def main(paths) -> None:
    old = {"|".join((e["kernel"], e["dtypes"], e["flags"], e["bucket"])): e["config"]
           for e in json.loads((TABLE_DIR / "hopper.json").read_text())["entries"]}
    print(f"{'file':28s} {'lead':>5s} {'kept':>4s} {'max loss: as run / kept':>24s} {'over 3 %':>9s} {'mean loss':>16s}")
    for p in paths:
        run = json.loads(Path(p).read_text())
        for lead in (0.005, 0.01, 0.02, 0.03):
            r = replay(run, old, lead)
            print(f"{Path(p).name:28s} {100 * lead:4.1f}% {r['changed']:4d} {100 * r['max'][0]:11.2f} / {100 * r['max'][1]:5.2f} %"
                  f" {r['over_3'][0]:4d} / {r['over_3'][1]:2d} {100 * r['mean'][0]:7.2f} / {100 * r['mean'][1]:5.2f} %")


if __name__ == "__main__":
    main(sys.argv[1:])

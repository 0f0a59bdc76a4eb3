"""Where the cases of the re-certification bench's seats go: the inputs and fp64 oracles a
seat's worker makes before its first candidate (tuner/executor.CandidateRunner), 14-24 s of
both sides of `bench/recertify_cost.py` (calls 27-46), the largest share of the
re-certification. For the bench's seeded sample of shipped seats, each seat's screen,
confirm and time cases are made as the worker makes them (screen.make_case with its
phases: draw, round, widen, move, oracle), then summed by kernel and by phase, with the
slowest seats. Each case is made twice (the first pays one-time costs: CUDA kernels'
first loads, numpy's thread pools) and the second is reported beside it.

    python3 lab/certify_cost/case_phases.py [--seats N] [--seed S]   (on a GPU, about 1 min)
    python3 lab/certify_cost/case_phases.py --seats 3 --device cpu    the probe's own check
"""

from __future__ import annotations

import argparse
import time

import torch

from nbx_tune.bench import recertify_cost as rc  # noqa: E402

from nbx_tune.kernels.runtime import table_format  # noqa: E402
from nbx_tune.kernels.runtime.certified import TABLE_DIR  # noqa: E402
from nbx_tune.kernels.runtime.registry import all_specs  # noqa: E402
from nbx_tune.oracles import products  # noqa: E402
from nbx_tune.profiles import get_profile  # noqa: E402
from nbx_tune.tuner.certify import screen  # noqa: E402
from nbx_tune.tuner.census.census import plan  # noqa: E402
from nbx_tune.kernels.trace import Trace  # noqa: E402
from nbx_tune.tuner.certify.tune import seat_job  # noqa: E402
from nbx_tune.testing.bench import accumulating  # noqa: E402


def cases_of(job) -> list:
    """(problem, with an oracle) of each case the worker makes for the seat."""
    out = [(p, True) for p in job.screen_problems] + [(p, True) for p in job.confirm_problems]
    if job.time_problem not in job.screen_problems:
        out.append((job.time_problem, False))
    return out


_inner: dict = {}  # seconds inside the oracle phase: the GPU product, the check's two sides


def _timed(name, fn):
    return accumulating(_inner, name, fn)


def _split_the_oracle() -> None:
    """The oracle phase's parts, timed where they run (the product and the check's numpy
    side overlap on two threads, so their sum can exceed the phase)."""
    products._expected = _timed("check: a@(b@x) on the host", products._expected)
    products._agrees = _timed("check: out@x", products._agrees)
    made = screen.device_product

    def device_product(*a, **kw):
        fn = made(*a, **kw)
        return None if fn is None else _timed("GPU product (upload, product, download)", fn)
    screen.device_product = device_product


def main(seats: int, seed: int, device: str) -> None:
    _split_the_oracle()
    profile = get_profile("hopper")
    shipped = {(e["kernel"], e["dtypes"], e["flags"], e["bucket"])
               for e in table_format.read(TABLE_DIR / "hopper.json")["entries"]}
    _, held = rc.seat_rows(rc.TRACES, profile, shipped)
    chosen = set(rc.sample(held, seats, seed))
    rows, _ = rc.seat_rows(rc.TRACES, profile, chosen)
    planned = plan(Trace("sample", tuple(rows)), "", profile).seats
    specs = all_specs()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.zeros(1, device=device)
    sync()
    by_kernel: dict = {}
    by_phase: dict = {}
    per_seat = []
    first_total = second_total = 0.0
    for key in sorted(planned):
        sp = planned[key]
        spec = specs[sp.kernel]
        label = "|".join(key)
        job, _ = seat_job(spec, profile, label, list(sp.problems), device)
        cases = cases_of(job)
        walls = []
        for attempt in range(2):
            phases: dict = {}
            t0 = time.perf_counter()
            made = [screen.make_case(spec, p, device, screen.seed_for(job.label, p), oracle, phases)
                    for p, oracle in cases]
            sync()
            walls.append(time.perf_counter() - t0)
            del made
            if attempt == 1:
                for k, v in phases.items():
                    by_phase[k] = by_phase.get(k, 0.0) + v
                seat_phases = ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
        first_total += walls[0]
        second_total += walls[1]
        k = by_kernel.setdefault(sp.kernel, [0, 0.0, 0.0, 0])
        k[0] += 1
        k[1] += walls[0]
        k[2] += walls[1]
        k[3] += len(cases)
        per_seat.append((walls[0], walls[1], len(cases), label, seat_phases))
    print(f"{len(planned)} seats; cases made first {first_total:.2f} s, again {second_total:.2f} s")
    print("by phase (second making): " + ", ".join(f"{k} {v:.2f} s" for k, v in by_phase.items()))
    print("inside the oracle (both makings): " + ", ".join(f"{k} {v:.2f} s" for k, v in _inner.items()))
    print(f"{'kernel':20s} {'seats':>5s} {'cases':>5s} {'first s':>8s} {'again s':>8s}")
    for name, (n, a, b, c) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:20s} {n:5d} {c:5d} {a:8.2f} {b:8.2f}")
    print("slowest seats (first, again, cases):")
    for a, b, c, label, ph in sorted(per_seat, reverse=True)[:12]:
        print(f"  {a:6.3f} {b:6.3f} {c:3d}  {label[:100]}\n{'':24s}{ph}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seats", type=int, default=rc.SEATS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the probe itself (numpy's products)")
    a = ap.parse_args()
    main(a.seats, a.seed, a.device)

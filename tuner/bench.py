"""Benchmarkers: how a screened survivor is timed. The tuner is handed one, so tests can
pass a fake and the interpreter a wall clock.

A benchmarker is `bench(fn, mode) -> Timing`, mode "quick" (a short first estimate, used
to drop candidates far behind), "full" (the profile's timing settings) or "round:N" (one
of N interleaved shares of a full timing: strategies/pruned.py times every contender once
per round, so a drift of the GPU's clocks over a seat reaches all of them alike).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Protocol


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    method: str


class Benchmarker(Protocol):
    method: str

    def __call__(self, fn: Callable[[], None], mode: str = "full") -> Timing: ...


class DoBench:
    """triton.testing.do_bench: CUDA/HIP events around the call, median of the repeats."""

    method = "do_bench"

    def __init__(self, warmup_ms: float, rep_ms: float):
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms

    def __call__(self, fn, mode="full"):
        from triton.testing import do_bench

        if mode == "quick":
            # Only to drop what is far behind (strategies/pruned.py): 10 ms of repeats after
            # 2 ms of warm-up, a tenth of a full timing's cost. 5 ms after 1 ms (with the
            # narrower net of pruned.py) certified a 2048^3 GEMM at 0.58 of cuBLAS on the H200.
            warmup, rep = min(self.warmup_ms, 2.0), min(self.rep_ms, 10.0)
        elif mode.startswith("round:"):
            # The GPU is already warm from the contender timed just before; a short warm-up
            # covers this kernel's own first launches.
            n = rounds_of(mode)
            warmup, rep = min(self.warmup_ms, 2.0), self.rep_ms / n
        else:
            warmup, rep = self.warmup_ms, self.rep_ms
        med, p20, p80 = do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5, 0.2, 0.8])
        return Timing(float(med), float(p20), float(p80), f"{self.method}(rep={rep:g}ms)")


class WallClock:
    """Host wall clock, median of `repeats` calls after one warm-up (the interpreter)."""

    method = "wall"

    def __init__(self, repeats: int = 3, sync: Callable[[], None] | None = None):
        self.repeats, self.sync = repeats, sync or (lambda: None)

    def __call__(self, fn, mode="full"):
        if mode.startswith("round:"):
            # The quick estimate ran it already: no warm-up, and the repeats shared out.
            n = max(1, self.repeats // rounds_of(mode))
        else:
            n = 1 if mode == "quick" else self.repeats
            fn()
            self.sync()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        return Timing(statistics.median(times), _quantile(times, 0.2), _quantile(times, 0.8),
                      f"wall(n={n})")


def rounds_of(mode: str) -> int:
    n = int(mode.split(":", 1)[1])
    if n < 1:
        raise ValueError(f"bad timing mode {mode!r}: rounds must be >= 1")
    return n


def combine(rounds: list[Timing]) -> Timing:
    """One contender's timing from its interleaved rounds: the median of each statistic
    across rounds, so one round hit by a neighbour's burst does not move it."""
    return Timing(statistics.median(t.median_ms for t in rounds), statistics.median(t.p20_ms for t in rounds),
                  statistics.median(t.p80_ms for t in rounds), f"{rounds[0].method} x{len(rounds)} rounds")


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[round(q * (len(sorted_values) - 1))]


def for_profile(profile) -> Benchmarker:
    return for_timing(profile.timing)


def for_timing(t) -> Benchmarker:
    if t.method == "do_bench":
        return DoBench(t.warmup_ms, t.rep_ms)
    return WallClock(t.repeats)

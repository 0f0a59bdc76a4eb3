"""Benchmarkers: how a screened survivor is timed. The tuner is handed one, so tests can
pass a fake and the interpreter a wall clock.

A benchmarker is `bench(fn, mode) -> Timing`, mode "quick" (a short first estimate, used
to drop candidates far behind), "full" (the profile's timing settings), "round:N" (one
of N interleaved shares of a full timing: strategies/pruned.py times every contender once
per round, so a drift of the GPU's clocks over a seat reaches all of them alike) or "warm"
(the profile's whole warm-up before a short timing, to be thrown away: it brings an idle GPU
to the clocks and power it holds under load before rounds whose own warm-ups are short).

On a GPU the timing is `gpu_time`: triton.testing.do_bench's method (CUDA/HIP events
around each launch, L2 flushed by a 256 MB memset before it, median of the repeats) with
one change. do_bench times a launch from an event recorded before the host starts the
launch, so where the host's launch path takes longer than the GPU's flush and kernel
together (a GEMM of a few tens of microseconds behind a Triton launch), every sample reads
the host's time, which varies from run to run and mis-ranks the candidates
(bench/ranking_repeat.py shows it). Here the GPU first sleeps for as long as the host needs
to queue the timed launches, so each is queued before the GPU reaches it.
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
    rounds_spread: float | None = None  # (max - min) / median of the rounds' medians (`combine`)


# The smallest difference a timing method can tell apart: CUDA/HIP events tick at about
# half a microsecond, which is 10-25 % of a small element-wise kernel's time.
# A stream timing divides a burst's pair of events by its launches (hundreds): far finer.
RESOLUTION_MS = {"do_bench": 5e-4, "stream": 1e-5, "wall": 1e-4}


def family(method: str) -> str:
    """A timing method's name without its settings ("do_bench+lead(rep=25ms)" -> "do_bench"):
    times of one family rank configs alike; across families they do not."""
    return method.split("+")[0].split("(")[0].split(" ")[0]


def resolution_ms(method: str) -> float:
    return next((ms for name, ms in RESOLUTION_MS.items() if method.startswith(name)), 0.0)


def noise(t: Timing) -> float:
    """How far a re-timing of the same config in the same conditions may plausibly land
    from this one, relative: the larger of half the p20..p80 band of its launches, half
    the range of its rounds' medians, and the timer's resolution."""
    med = max(t.median_ms, 1e-12)
    return max((t.p80_ms - t.p20_ms) / (2 * med), (t.rounds_spread or 0.0) / 2,
               resolution_ms(t.method) / med, 0.0)


class Benchmarker(Protocol):
    method: str

    def __call__(self, fn: Callable[[], None], mode: str = "full") -> Timing: ...


# The timed launches' lead is capped at this many times the timing's own length (plus 10 ms):
# a host that slow is timed partly host-bound rather than the GPU kept asleep for seconds.
LEAD_CAP = 4.0
_flush_buffers: dict = {}
_cycles_per_ms: dict = {}


def lead_ms(n: int, host_ms: float, gpu_ms: float, rep_ms: float, margin: float = 1.5) -> float:
    """How long the GPU must wait so that the host has queued each of `n` timed launches
    (rep_ms of GPU time) before the GPU gets to it: the host falls behind by host_ms - gpu_ms
    a launch (nothing when it is the faster), and needs one launch's time to queue the
    first. With `margin` for the host's own jitter, and capped (LEAD_CAP)."""
    return min(margin * (n * max(0.0, host_ms - gpu_ms) + 2 * host_ms), LEAD_CAP * rep_ms + 10)


def _sleeper(torch):
    """A function queuing a GPU sleep of so many ms on the current stream (None where torch
    has no torch.cuda._sleep): cycles per ms measured once per device."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    dev = torch.cuda.current_device()
    if dev not in _cycles_per_ms:
        cycles = 1_000_000
        sleep(cycles)  # the first call loads the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        sleep(cycles)
        end.record()
        end.synchronize()
        _cycles_per_ms[dev] = cycles / max(start.elapsed_time(end), 1e-3)
    rate = _cycles_per_ms[dev]
    return lambda ms: sleep(max(1, int(ms * rate)))


def _estimate(torch, sleep, step, n: int) -> tuple[float, float]:
    """(host ms, GPU ms) of one `step`, from n steps queued behind a 1 ms sleep (n steps
    take a host 0.5 ms at worst seen): the GPU time sets the launch counts, the host
    time the lead."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if sleep is not None:
        sleep(1.0)
    t0 = time.perf_counter()
    start.record()
    for _ in range(n):
        step()
    end.record()
    host_ms = (time.perf_counter() - t0) * 1e3 / n
    end.synchronize()
    return host_ms, max(start.elapsed_time(end) / n, 1e-4)


def gpu_time(fn, warmup_ms: float, rep_ms: float, quantiles=(0.5, 0.2, 0.8)) -> list[float]:
    """`fn`'s GPU time in ms at `quantiles`, timed as triton.testing.do_bench times it (a
    launch count from a first estimate, warm-up launches, then each timed launch after an L2
    flush between its own pair of events), every timed launch queued ahead of the GPU."""
    import torch

    fn()
    torch.cuda.synchronize()
    dev = torch.cuda.current_device()
    flush = _flush_buffers.get(dev)
    if flush is None:  # as do_bench's: 256 MB, larger than any GPU's L2 today
        flush = _flush_buffers[dev] = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")
    sleep = _sleeper(torch)

    def flushed():  # the estimate's step: flush and launch
        flush.zero_()
        fn()

    host_ms, gpu_ms = _estimate(torch, sleep, flushed, 5)
    n_warmup, n = max(1, int(warmup_ms / gpu_ms)), max(1, int(rep_ms / gpu_ms))
    for _ in range(n_warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    if sleep is not None:
        sleep(lead_ms(n, host_ms, gpu_ms, rep_ms))
    for i in range(n):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(starts, ends))
    return [_quantile(times, q) for q in quantiles]


# Streaming seats (kernel.timing == "stream"): their operand sets rotate through about this
# much, at most MAX_SETS sets, as bench/torch_compare.py rotates a model's rows.
ROTATE_BYTES = 96 << 20
MAX_SETS = 4
# Pairs of bursts in one stream timing (their spread gives p20 and p80), and the most
# launches in one burst queued eagerly: two bursts stay well inside the driver's queue.
# A kernel whose single-call bursts outrun the timing's budget (a GEMM of 100 us and more)
# gets fewer pairs, MIN_BURSTS at least: eight took it 2-4 times its budget.
BURSTS = 8
MIN_BURSTS = 3
MAX_BURST = 200


def n_sets(nbytes: int) -> int:
    return max(1, min(MAX_SETS, -(-ROTATE_BYTES // max(nbytes, 1))))


class Rig(list):
    """A streaming kernel's launchers (fn i on operand set i) with what `stream_time` sets
    up for them, kept for the next timing of the same launchers: the bursts (two CUDA graphs
    captured, milliseconds each) and the first estimate of a burst's host and GPU time. A
    contender is timed several times in a seat (a quick estimate, then its rounds); a plain
    list sets up afresh each time."""

    bursts: tuple | None = None
    estimate: tuple[float, float] | None = None
    first_ms: float = 0.0  # a launch's GPU time on the first call, before the bursts were captured


def stream_time(fns: list, warmup_ms: float, rep_ms: float, quantiles=(0.5, 0.2, 0.8)) -> list[float]:
    """ms per launch at `quantiles` for a kernel that streams its operands (element-wise,
    copies), timed as a model served under CUDA graphs runs it: launches back to back with
    no flush between, replayed from a graph (queued eagerly where capture fails), in pairs
    of bursts, one on one operand set (warm in the L2, as an op reading what the previous
    one wrote) and one rotating through `fns` (fn i launches on set i: read from HBM where
    the sets outgrow the L2); each sample is a pair's mean, since the best config of each
    way lost up to 26 % in the other (lab/stream_timing/NOTES.md). Queued eagerly, the same
    bursts ranked GPT-2's large element-wise ops otherwise than graph replay does."""
    import torch

    rig = fns if isinstance(fns, Rig) else Rig(fns)
    if rig.bursts is None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for f in fns:
            f()
        end.record()
        torch.cuda.synchronize()
        rig.first_ms = start.elapsed_time(end) / len(fns)
        rig.bursts = _bursts(torch, fns)
    warm, rot, launches, queued = rig.bursts
    sleep = _sleeper(torch)
    warmed_ms = 0.0
    if rig.estimate is None:
        # A burst of ESTIMATE_MS or more is estimate enough on its own (four of a large GEMM's
        # are milliseconds of GPU time every config pays); shorter ones are estimated over four.
        steps = 1 if rig.first_ms * launches >= ESTIMATE_MS else ESTIMATE_STEPS
        rig.estimate = _estimate(torch, sleep, rot, steps)
        warmed_ms = steps * rig.estimate[1]  # the estimate's bursts warmed the GPU just now
    host_ms, gpu_ms = rig.estimate
    pace = max(gpu_ms, host_ms)  # a call of a burst function, whichever is the slower
    for _ in range(max(0 if warmed_ms else 1, int((warmup_ms - warmed_ms) / pace))):
        rot()
    # The bursts together about rep_ms, and no more launches queued at once than the
    # driver queues without blocking the host (a blocked host would be timed instead).
    calls = max(1, min(int(rep_ms / pace / (2 * BURSTS)), max(1, MAX_BURST // queued)))
    ms = []
    for _ in range(max(MIN_BURSTS, min(BURSTS, int(rep_ms / pace / (2 * calls))))):
        pair = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(2)]
        if sleep is not None:
            sleep(lead_ms(2 * calls, host_ms, gpu_ms, 2 * calls * gpu_ms))
        for burst, (s, e) in zip((warm, rot), pair):
            s.record()
            for _ in range(calls):
                burst()
            e.record()
        torch.cuda.synchronize()
        ms.append(sum(s.elapsed_time(e) for s, e in pair) / (2 * calls * launches))
    ms.sort()
    return [_quantile(ms, q) for q in quantiles]


# Launches in one captured burst: a whole number of rotations of 1 to MAX_SETS sets.
GRAPH_LAUNCHES = 12
# A rig's first estimate of a burst's host and GPU time: ESTIMATE_STEPS bursts, or one where
# a burst holds ESTIMATE_MS of GPU time (events read it to far better than 1 %).
ESTIMATE_STEPS = 4
ESTIMATE_MS = 0.5


def _bursts(torch, fns: list):
    """(warm, rotating, launches a call, items queued a call): functions launching a burst
    on set 0 and one rotating through the sets, each a CUDA graph's replay (one item), or
    the launches queued eagerly where a launch cannot be captured."""
    k = len(fns)
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graphs = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        for g, pick in zip(graphs, (lambda i: 0, lambda i: i % k)):
            with torch.cuda.graph(g, stream=stream):
                for i in range(GRAPH_LAUNCHES):
                    fns[pick(i)]()
        torch.cuda.synchronize()
        return graphs[0].replay, graphs[1].replay, GRAPH_LAUNCHES, 1
    except RuntimeError:
        torch.cuda.synchronize()
        return (lambda: [fns[0]() for _ in range(k)]), (lambda: [f() for f in fns]), k, k


class DoBench:
    """`gpu_time`: do_bench's events, flush and median, each timed launch queued ahead;
    `stream`: streaming kernels back to back, warm and rotating (`stream_time`)."""

    method = "do_bench"

    def __init__(self, warmup_ms: float, rep_ms: float):
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms

    def __call__(self, fn, mode="full"):
        warmup, rep = self._budget(mode)
        med, p20, p80 = gpu_time(fn, warmup, rep)
        return Timing(float(med), float(p20), float(p80), f"{self.method}+lead(rep={rep:g}ms)")

    def _budget(self, mode: str) -> tuple[float, float]:
        """(warm-up ms, timed ms) of a timing in `mode`."""
        if mode == "quick":
            # Only to drop what is far behind (strategies/pruned.py): a tenth of a full
            # timing's cost. Shorter estimates were too noisy to rank short GEMMs by.
            warmup, rep = min(self.warmup_ms, 2.0), min(self.rep_ms, 10.0)
        elif mode == "warm":
            warmup, rep = self.warmup_ms, min(self.rep_ms, 10.0)
        elif mode.startswith("round:"):
            # The GPU is already warm from the contender timed just before; a short warm-up
            # covers this kernel's own first launches.
            n = rounds_of(mode)
            warmup, rep = min(self.warmup_ms, 2.0), self.rep_ms / n
        else:
            warmup, rep = self.warmup_ms, self.rep_ms
        return warmup, rep

    def stream(self, fns: list, mode="full") -> Timing:
        warmup, rep = self._budget(mode)
        med, p20, p80 = stream_time(fns, warmup, rep)
        return Timing(float(med), float(p20), float(p80), f"stream({len(fns)} sets)+lead(rep={rep:g}ms)")


def time_sets(bench, fns: list, mode: str = "full") -> Timing:
    """A streaming kernel's timing over its operand sets (fn i launches on set i): the
    benchmarker's `stream` where it has one (a test's fake need not), else `fns[0]` timed
    as any kernel."""
    stream = getattr(bench, "stream", None)
    return stream(fns, mode) if stream is not None else bench(fns[0], mode)


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
            n = 1 if mode in ("quick", "warm") else self.repeats
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
    meds = [t.median_ms for t in rounds]
    mid = statistics.median(meds)
    return Timing(mid, statistics.median(t.p20_ms for t in rounds),
                  statistics.median(t.p80_ms for t in rounds), f"{rounds[0].method} x{len(rounds)} rounds",
                  (max(meds) - min(meds)) / mid if mid > 0 else None)


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[round(q * (len(sorted_values) - 1))]


def for_profile(profile) -> Benchmarker:
    return for_timing(profile.timing)


def for_timing(t) -> Benchmarker:
    if t.method == "do_bench":
        return DoBench(t.warmup_ms, t.rep_ms)
    return WallClock(t.repeats)


def side_by_side(fns: dict, rep_ms: float, rounds: int = 4, timer=None) -> dict:
    """Each callable's median GPU time (ms), timed in `rounds` turned rounds of rep_ms/rounds
    each: what is compared shares the GPU's drift over the measurement (the census times
    its contenders the same way, tuner/timing/pruned.py; so do `nbx-tune baseline` and
    the bench scripts). `timer(fn, rep_ms)` defaults to the census's own (gpu_time:
    do_bench's method, every launch queued ahead of the GPU, so a slow host launch path is
    not read as the kernel's time)."""
    if timer is None:
        def timer(fn, rep):
            return gpu_time(fn, 5, rep, (0.5,))[0]
    names = list(fns)
    got = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            got[n].append(timer(fns[n], rep_ms / rounds))
    return {n: statistics.median(v) for n, v in got.items()}

"""Certifying one seat: candidates -> static prune -> screen -> time -> certify.

    1. every declared config of the kernel is a candidate;
    2. the profile prunes statically (num_stages over the maximum, estimated shared memory
       over the budget) and configs that compile to the same code on this profile collapse
       to one: refused with that reason, never launched;
    3. survivors are screened against the fp64 oracle at the largest and the smallest
       shapes the census saw in the bucket (a shape over the byte budget is skipped,
       announced, and makes the seat unscreened);
    4. what passed is timed at the largest shape by the strategy with the benchmarker;
    5. the fastest is certified, with the runner-up and the margin.

Nothing here touches the database: the result is a `SeatResult` the caller writes in one
transaction, so a seat is either recorded whole or not at all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nbx_tune.kernels.spec import Config, KernelSpec, Problem
from nbx_tune.tuner.timing import Timing
from nbx_tune.tuner import screen as screening
from nbx_tune.tuner.executor import SeatJob, SeatPrepareError
from nbx_tune.tuner.screen import ScreenResult


@dataclass
class CandidateRecord:
    config: Config
    reason: str | None = None  # refusal reason, None for a timed survivor
    detail: str = ""
    problem: Problem | None = None
    screens: list[ScreenResult] = field(default_factory=list)
    timing: Timing | None = None
    final: bool = False


@dataclass
class SeatResult:
    outcome: str  # certified | unscreened | refused
    records: list[CandidateRecord]
    winner: CandidateRecord | None = None
    runner_up: CandidateRecord | None = None
    margin: float | None = None
    seat_refusal: tuple[str, str] | None = None
    unscreened: str | None = None
    screened: tuple[Problem, ...] = ()
    screen_s: float = 0.0
    bench_s: float = 0.0
    total_s: float = 0.0


class NullReporter:
    """What a census tells its user as it goes; the CLI draws it with Rich."""

    def coverage(self, report) -> None:
        pass

    def seat_start(self, label: str, index: int, total: int, candidates: int) -> None:
        pass

    def candidate(self, label: str, config: Config, status: str) -> None:
        pass

    def seat_done(self, label: str, result: "SeatResult") -> None:
        pass

    def notice(self, text: str) -> None:
        pass


def static_prune(spec: KernelSpec, profile, problem: Problem):
    """(candidates to launch, refused records): profile limits, then duplicates."""
    keep, refused, seen = [], [], {}
    for c in spec.configs():
        why = spec.static_refusal(profile, c, problem)
        if why:
            refused.append(CandidateRecord(c, why[0], why[1], problem))
            continue
        ident = c.project(profile.launch_options)
        if ident in seen:
            refused.append(CandidateRecord(
                c, "equivalent",
                f"same code as {seen[ident]} on {profile.name} (launch options that matter here: "
                f"{', '.join(profile.launch_options) or 'none'})", problem))
            continue
        seen[ident] = c
        keep.append(c)
    return keep, refused


def unscreenable(spec: KernelSpec, profile, problems: list[Problem]) -> tuple[str, str] | None:
    """(dtype, why) when the profile cannot screen a dtype of the seat (bf16 under the
    interpreter): such a seat is refused, never tuned."""
    largest = max(problems, key=Problem.order)
    for dt in largest.dtypes:
        why = profile.screen_unsupported.get(dt)
        if why:
            return dt, why
    return None


def seat_job(spec: KernelSpec, profile, label: str, problems: list[Problem], device: str):
    """(the job a seat's candidates run, the shapes whose screen is skipped and why): screened
    at the largest and the smallest shapes, each only within the byte budget; timed at the
    largest."""
    ordered = sorted(set(problems), key=Problem.order)
    largest, smallest = ordered[-1], ordered[0]
    screen_at, skipped = [], []
    for p in dict.fromkeys((largest, smallest)):
        nbytes = spec.operand_bytes(p)
        if nbytes > profile.screen_max_bytes:
            skipped.append((p, nbytes))
        else:
            screen_at.append(p)
    job = SeatJob(spec.name, profile.name, label, tuple(screen_at), largest,
                  screening.output_rtols(spec, largest, profile), device)
    return job, skipped


def tune_seat(spec: KernelSpec, profile, label: str, problems: list[Problem], executor,
              strategy, device: str, reporter=None) -> SeatResult:
    reporter = reporter or NullReporter()
    t0 = time.perf_counter()
    bad = unscreenable(spec, profile, problems)
    if bad:
        reporter.notice(f"{label}: not certified: profile {profile.name} cannot screen {bad[0]}")
        return SeatResult("refused", [], seat_refusal=("dtype_unscreenable", bad[1]),
                          total_s=time.perf_counter() - t0)

    job, skipped_at = seat_job(spec, profile, label, problems, device)
    screen_at, largest, skipped = list(job.screen_problems), job.time_problem, []
    for p, nbytes in skipped_at:
        skipped.append(f"{_dims(spec, p)}: {nbytes} bytes > autotune_screen_max_bytes "
                       f"{profile.screen_max_bytes}")
        reporter.notice(f"{label}: screen skipped at {_dims(spec, p)} ({nbytes / 2**20:.0f} MiB of "
                        f"operands > the profile's {profile.screen_max_bytes / 2**20:.0f} MiB budget): "
                        "the seat will be unscreened")

    keep, records = static_prune(spec, profile, largest)
    for r in records:
        reporter.candidate(label, r.config, r.reason)

    by_config: dict[Config, CandidateRecord] = {}
    judged_in: dict[Config, int] = {}  # the worker generation whose screen passed it
    try:
        executor.start_seat(spec, job, keep)
        ts = time.perf_counter()

        def screen(c: Config) -> bool:
            out = executor.screen(c)
            rec = by_config.setdefault(c, CandidateRecord(c))
            if out.ok:
                rec.screens, judged_in[c] = out.screens, executor.generation
                reporter.candidate(label, c, "screened")
                return True
            rec.reason, rec.detail, rec.problem, rec.screens = out.reason, out.detail, out.problem, out.screens or []
            reporter.candidate(label, c, out.reason)
            return False

        survivors = [c for c in keep if screen(c)]
        # A worker that died may have been corrupted before it died: what it passed is
        # screened again in the worker that replaced it.
        survivors = [c for c in survivors if judged_in[c] == executor.generation or screen(c)]
        records += by_config.values()
        screen_s = time.perf_counter() - ts

        tb = time.perf_counter()

        def measure(config: Config, mode: str):
            out = executor.time(config, mode)
            if not out.ok:
                rec = by_config[config]
                rec.reason, rec.detail, rec.problem = out.reason, out.detail, out.problem
                reporter.candidate(label, config, out.reason)
                return None
            return out.timing

        measured = strategy(survivors, measure)
        for m in measured:
            rec = by_config[m.config]
            if rec.reason is None:
                rec.timing, rec.final = m.timing, m.final

        def finals():
            return sorted((r for r in records if r.reason is None and r.final and r.timing),
                          key=lambda r: r.timing.median_ms)

        # The winner and runner-up must stand on the word of a worker that never died.
        while any(judged_in[r.config] != executor.generation and not screen(r.config) for r in finals()[:2]):
            pass
        ranked = finals()
        bench_s = time.perf_counter() - tb
    except SeatPrepareError as e:  # at the start, or in a worker that replaced a dead one
        reporter.notice(f"{label}: not certified: {e}")
        kept = {id(r) for r in records}  # the candidates judged before it, with their reasons
        return SeatResult("refused", records + [r for r in by_config.values() if id(r) not in kept],
                          seat_refusal=("prepare_error", str(e)), total_s=time.perf_counter() - t0)
    finally:
        executor.end_seat()

    total = time.perf_counter() - t0
    if not ranked:
        return SeatResult("refused", records, seat_refusal=(
            "all_refused", f"all {len(spec.configs())} candidates refused"),
            screened=tuple(screen_at), screen_s=screen_s, bench_s=bench_s, total_s=total)
    winner = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    margin = (runner.timing.median_ms - winner.timing.median_ms) / winner.timing.median_ms if runner else None
    unscreened = "; ".join(skipped) or None
    return SeatResult("unscreened" if unscreened else "certified", records, winner, runner, margin,
                      unscreened=unscreened, screened=tuple(screen_at),
                      screen_s=screen_s, bench_s=bench_s, total_s=total)


def _dims(spec: KernelSpec, p: Problem) -> str:
    return ",".join(f"{d.name}={v}" for d, v in zip(spec.key, p.dims))

"""Certifying one seat: candidates -> static prune -> screen -> time -> certify.

    1. every declared config of the kernel is a candidate;
    2. the profile prunes statically (num_stages over the maximum, estimated shared memory
       over the budget) and configs that compile to the same code on this profile collapse
       to one: refused with that reason, never launched;
    3. survivors are screened against the fp64 oracle at the largest and the smallest
       shapes the census saw in the bucket (a shape over the byte budget is skipped,
       announced, and makes the seat unscreened), launched twice at the largest (outputs
       that differ bit for bit are refused `nondeterministic` unless the kernel allows it);
    4. a survivor whose error is far above the most accurate one's on the same inputs is
       refused `imprecise`;
    5. what passed is timed at the largest shape by the strategy with the benchmarker;
    6. the fastest is screened at every other shape seen in the bucket and at tile-edge
       shapes (the bucket's bottom and top), and so is the runner-up; one that fails there
       is refused and the next fastest takes its place;
    7. the fastest that stands is certified, with the runner-up and the margin.

Nothing here touches the database: the result is a `SeatResult` the caller writes in one
transaction, so a seat is either recorded whole or not at all.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field, replace

from nbx_tune.kernels.spec import Config, KernelSpec, Problem
from nbx_tune.tuner.timing.benchmarkers import Timing
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.execution.executor import SeatJob, SeatPrepareError, WorkerLost
from nbx_tune.tuner.certify.screen import ScreenResult
from nbx_tune.tuner.certify.screen_shapes import edge_problems, screen_shapes
from nbx_tune.tuner.timing.strategies import quick_first
from nbx_tune.tuner.search.searches import Full, SearchNote


@dataclass
class CandidateRecord:
    config: Config
    reason: str | None = None  # refusal reason, None for a timed survivor
    detail: str = ""
    problem: Problem | None = None
    screens: list[ScreenResult] = field(default_factory=list)
    timing: Timing | None = None
    final: bool = False

    @property
    def failed_screen(self) -> ScreenResult | None:
        """The screen that refused it (its shape, error and tolerance), if one did."""
        last = self.screens[-1] if self.screens else None
        return last if self.reason and last is not None and not last.ok else None


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
    note: SearchNote = field(default_factory=SearchNote)  # how the winner was searched for


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


# The precision gate: a survivor is `imprecise` when its error at a shape is over
# IMPRECISE_FACTOR times the most accurate survivor's there, and over a floor: IMPRECISE_FLOOR
# of the tolerance and IMPRECISE_ULPS ulps of the output dtype. Correct configs' errors
# differ by up to 150x where they are small (a long fp32 softmax row summed in another
# order), so the ratio alone refuses correct configs; the floor sits between the largest
# correct error measured (1/15 of the tolerance) and an fp16 accumulator's (1/5 at K 4096):
# docs/benchmarks.md, "The precision gate".
IMPRECISE_FACTOR = 4.0
IMPRECISE_FLOOR = 1 / 8
IMPRECISE_ULPS = 2


def imprecise_limit(best: float, rtol: float, unit: float) -> float:
    """The largest error the precision gate lets pass, given the most accurate candidate's
    error on the same inputs (unit: the output dtype's epsilon)."""
    return max(IMPRECISE_FACTOR * best, IMPRECISE_FLOOR * rtol, IMPRECISE_ULPS * unit)


def seat_job(spec: KernelSpec, profile, label: str, problems: list[Problem], device: str, search=None):
    """(the job a seat's candidates run, the seen shapes whose screen is skipped with their
    bytes): timed at the largest shape."""
    shapes = screen_shapes(spec, profile, problems)
    job = SeatJob(spec.name, profile.name, label, shapes.base, shapes.largest,
                  screening.output_rtols(spec, shapes.largest, profile), device,
                  confirm_problems=shapes.confirm, variation_allowed=spec.run_to_run_variation,
                  compile_confirm=getattr(search, "compile_confirm", False))
    return job, list(shapes.skipped)


class _Candidates:
    """One seat's candidates as they are judged: each screened, timed, confirmed, or
    refused with its reason. A worker that died may have been corrupted before it died,
    so what it passed counts only once a live worker passes it again."""

    def __init__(self, executor, reporter, label: str, confirming: bool = False):
        self.executor, self.reporter, self.label = executor, reporter, label
        self.confirming = confirming  # the seat has confirm shapes
        self.records: dict[Config, CandidateRecord] = {}
        self.passed_in: dict[Config, int] = {}  # the worker generation whose screen passed it
        self.confirmed_in: dict[Config, int] = {}
        self.compiling: set[Config] = set()
        self.quick: dict[Config, tuple[int, Timing]] = {}  # taken as screened: (worker generation, estimate)
        self.screen_s = self.bench_s = 0.0

    def evaluate(self, configs, strategy) -> list:
        """What a search asks for (tuner/search/searches.py): screen those of `configs`
        not screened yet, refuse the imprecise, time the survivors; their measurements.
        For a strategy that starts with quick estimates, each is taken as its config is
        screened: the worker would otherwise wait on the compile pool for the next config
        with the GPU idle, then take them all after the last."""
        more = [c for c in configs if c not in self.compiling]
        if more and hasattr(self.executor, "precompile"):
            self.executor.precompile(more)
        self.compiling.update(more)
        ts = time.perf_counter()
        quick_s = self.screen_all([c for c in configs if c not in self.records], quick=quick_first(strategy))
        survivors = [c for c in configs if self.records[c].reason is None]
        survivors = [c for c in survivors if self.passed_in[c] == self.executor.generation or self.screen(c)]
        kept = set(self.refuse_imprecise([c for c, r in self.records.items() if r.reason is None]))
        tb = time.perf_counter()
        self.screen_s += tb - ts - quick_s
        measured = [m for m in strategy([c for c in survivors if c in kept], self.measure)
                    if self.records[m.config].reason is None]
        for m in measured:
            self.records[m.config].timing, self.records[m.config].final = m.timing, m.final
        self.bench_s += time.perf_counter() - tb + quick_s
        return measured

    def _refuse(self, config: Config, out) -> bool:
        rec = self.records[config]
        rec.reason, rec.detail, rec.problem = out.reason, out.detail, out.problem
        if out.screens:
            rec.screens = list(out.screens)
        self.reporter.candidate(self.label, config, out.reason)
        return False

    def screen(self, config: Config) -> bool:
        out = self.executor.screen(config)
        rec = self.records.setdefault(config, CandidateRecord(config))
        if not out.ok:
            return self._refuse(config, out)
        rec.screens, self.passed_in[config] = out.screens, self.executor.generation
        self.reporter.candidate(self.label, config, "screened")
        return True

    def screen_all(self, configs, quick: bool = False) -> float:
        """Screen each config (again where a worker died since it passed); with `quick`,
        take each survivor's quick estimate right after its screen. Returns the seconds
        those estimates took."""
        spent = 0.0
        for c in configs:
            if self.screen(c) and quick:
                t0 = time.perf_counter()
                t = self.measure(c, "quick")
                if t is not None:
                    self.quick[c] = (self.executor.generation, t)
                spent += time.perf_counter() - t0
        for c in configs:
            if self.records[c].reason is None and self.passed_in[c] != self.executor.generation:
                self.screen(c)
        return spent

    def refuse_imprecise(self, survivors: list[Config]) -> list[Config]:
        best: dict[Problem, float] = {}
        for c in survivors:
            for s in self.records[c].screens:
                best[s.problem] = min(best.get(s.problem, float("inf")), s.err or 0.0)
        kept = []
        for c in survivors:
            bad = next((s for s in self.records[c].screens
                        if (s.err or 0.0) > imprecise_limit(best[s.problem], s.rtol, s.unit)), None)
            if bad is None:
                kept.append(c)
                continue
            limit = imprecise_limit(best[bad.problem], bad.rtol, bad.unit)
            ratio = bad.err / best[bad.problem] if best[bad.problem] else float("inf")
            failed = replace(bad, reason="imprecise", rtol=limit, detail=(
                f"err {bad.err:.3g} is {ratio:.1f}x the most accurate candidate's {best[bad.problem]:.3g} "
                f"on the same inputs (limit {limit:.3g})"))
            self._refuse(c, _Refused(failed))
        return kept

    def measure(self, config: Config, mode: str):
        if mode == "quick":  # an estimate taken as it was screened, by a worker still alive
            gen, t = self.quick.pop(config, (None, None))
            if gen == self.executor.generation:
                return t
        out = self.executor.time(config, mode)
        if not out.ok:
            self._refuse(config, out)
            return None
        return out.timing

    def ranked(self) -> list[CandidateRecord]:
        return sorted((r for r in self.records.values() if r.reason is None and r.final and r.timing),
                      key=lambda r: r.timing.median_ms)

    def stands(self, config: Config) -> bool:
        """Passed by a live worker at the screen shapes and at the confirm shapes."""
        gen = self.executor.generation
        if self.passed_in[config] != gen and not self.screen(config):
            return False
        if self.confirming and self.confirmed_in.get(config) != gen:
            out = self.executor.confirm(config)
            if not out.ok:
                return self._refuse(config, out)
            self.records[config].screens += out.screens
            self.confirmed_in[config] = gen
        return True

    def top(self, n: int) -> list[CandidateRecord]:
        """The n fastest that stand, refusing those that do not; again from the start
        whenever a worker died meanwhile (what it judged is judged again)."""
        while True:
            gen, top = self.executor.generation, []
            for rec in self.ranked():
                if len(top) == n:
                    break
                if self.stands(rec.config):
                    top.append(rec)
            if self.executor.generation == gen:
                return top


@dataclass
class _Refused:
    """A refusal made here rather than by the executor, in the shape of its outcomes."""

    screen: ScreenResult

    ok = False

    @property
    def reason(self):
        return self.screen.reason

    @property
    def detail(self):
        return self.screen.detail

    @property
    def problem(self):
        return self.screen.problem

    @property
    def screens(self):
        return [self.screen]


def first_compiles(spec: KernelSpec, profile, label: str, problems: list[Problem], device: str, search=None):
    """(the seat's job, the configs its search has the compile pool start on), or (None,
    []) for a seat that is refused unlaunched: what `tune_seat` hands the executor, and
    what a census queues ahead for the seats coming next (tuner/fleet/seat_tuner.py)."""
    if unscreenable(spec, profile, problems):
        return None, []
    job, _ = seat_job(spec, profile, label, problems, device, search)
    keep, _ = static_prune(spec, profile, job.time_problem)
    return job, (search or Full()).compile_first(keep)


def tune_seat(spec: KernelSpec, profile, label: str, problems: list[Problem], executor,
              strategy, device: str, reporter=None, search=None) -> SeatResult:
    """Certify one seat from the shapes a census saw in it (the steps of this module's
    docstring), with the executor running candidates and the strategy timing them.
    `search` (tuner/search/searches.py) picks which candidates are screened and timed:
    all of them by default."""
    reporter = reporter or NullReporter()
    t0 = time.perf_counter()
    bad = unscreenable(spec, profile, problems)
    if bad:
        reporter.notice(f"{label}: not certified: profile {profile.name} cannot screen {bad[0]}")
        return SeatResult("refused", [], seat_refusal=("dtype_unscreenable", bad[1]),
                          total_s=time.perf_counter() - t0)

    job, skipped_at = seat_job(spec, profile, label, problems, device, search)
    skipped = [_announce_skip(spec, profile, label, p, nbytes, reporter) for p, nbytes in skipped_at]
    keep, pruned = static_prune(spec, profile, job.time_problem)
    for r in pruned:
        reporter.candidate(label, r.config, r.reason)

    search = search or Full()
    cands = _Candidates(executor, reporter, label, confirming=bool(job.confirm_problems))
    try:
        first = search.compile_first(keep)
        executor.start_seat(spec, job, first)
        cands.compiling.update(first)
        note = search.run(keep, lambda configs, timing=None, settle=False: cands.evaluate(
            configs, timing or (functools.partial(strategy, settle=True) if settle else strategy)))
        if note.detail:
            reporter.notice(f"{label}: {note.detail}")
        tc = time.perf_counter()
        top = cands.top(2)
        cands.screen_s += time.perf_counter() - tc
    except SeatPrepareError as e:  # at the start, or in a worker that replaced a dead one
        reporter.notice(f"{label}: not certified: {e}" + (
            "; not the seat's fault: the next census tries it again" if isinstance(e, WorkerLost) else ""))
        reason = "worker_lost" if isinstance(e, WorkerLost) else "prepare_error"
        return SeatResult("refused", pruned + list(cands.records.values()),
                          seat_refusal=(reason, str(e)), total_s=time.perf_counter() - t0)
    finally:
        executor.end_seat()

    records = pruned + list(cands.records.values())
    screened = tuple(dict.fromkeys((*job.screen_problems, *job.confirm_problems)))
    spent = dict(screen_s=cands.screen_s, bench_s=cands.bench_s, total_s=time.perf_counter() - t0)
    lost = [r for r in records if r.reason == "worker_lost"]
    # Candidates whose worker was killed from outside were not judged: the seat is marked
    # so the next census tunes it again (tuner/census/status.py), certified or not.
    lost_note = ("worker_lost", f"{len(lost)} candidate(s) not judged: their worker was killed from "
                 f"outside twice (out of memory?): the next census tunes the seat again") if lost else None
    if not top:
        return SeatResult("refused", records, seat_refusal=lost_note or (
            "all_refused", f"all {len(spec.configs())} candidates refused"),
            screened=screened, note=note, **spent)
    winner, runner = top[0], (top[1] if len(top) > 1 else None)
    margin = (runner.timing.median_ms - winner.timing.median_ms) / winner.timing.median_ms if runner else None
    unscreened = "; ".join(skipped) or None
    return SeatResult("unscreened" if unscreened else "certified", records, winner, runner, margin,
                      seat_refusal=lost_note, unscreened=unscreened, screened=screened, note=note, **spent)


def screen_configs(spec: KernelSpec, profile, label: str, configs, problems: list[Problem], executor,
                   device: str, edges: bool = False) -> list[CandidateRecord]:
    """Screen the given configs at the given shapes (with `edges`, at the tile edges of the
    largest one's bucket too), each within the byte budget (a shape over it is left out),
    launched twice at the largest: each record passed (reason None, with its screens) or
    refused with its reason. A certificate's winner at shapes a census saw after it was
    made; a seat's earlier winners when it is certified again."""
    ordered = sorted(set(problems), key=Problem.order)
    extra = edge_problems(spec, profile, ordered[-1]) if edges and ordered else []
    shapes = tuple(p for p in dict.fromkeys((*reversed(ordered), *extra))
                   if spec.operand_bytes(p) <= profile.screen_max_bytes)
    if not shapes:
        return [CandidateRecord(c) for c in configs]
    job = SeatJob(spec.name, profile.name, label, shapes, shapes[0],
                  screening.output_rtols(spec, shapes[0], profile), device,
                  variation_allowed=spec.run_to_run_variation)
    cands = _Candidates(executor, NullReporter(), label)
    executor.start_seat(spec, job, list(configs))
    try:
        cands.screen_all(list(configs))
    finally:
        executor.end_seat()
    return [cands.records[c] for c in configs]


def renewed(cert, new_screens: list[ScreenResult], seconds: float) -> SeatResult:
    """A certificate again, its winner's screens extended by `new_screens` (shapes seen
    after it was made): what a passed re-screen writes, superseding the old one."""
    old = [ScreenResult(Problem.from_json(json.dumps(d["problem"])), d["err"], d["rtol"], repeat=d.get("repeat"))
           for d in json.loads(cert.screens or "[]")]

    def rec(config: str, median, p20, p80, screens=()):
        return CandidateRecord(Config.parse(config), screens=list(screens), final=True,
                               timing=Timing(median, p20, p80, cert.timing_method))

    winner = rec(cert.config, cert.median_ms, cert.p20_ms, cert.p80_ms, old + list(new_screens))
    runner = rec(cert.runner_up, cert.runner_up_ms, cert.runner_up_ms, cert.runner_up_ms) if cert.runner_up else None
    note = SearchNote(getattr(cert, "search", None) or "full",
                      recertified_from=getattr(cert, "recertified_from", None),
                      detail=getattr(cert, "search_detail", None) or "",
                      sampled_regret=getattr(cert, "sampled_regret", None))
    return SeatResult("unscreened" if cert.unscreened else "certified", [], winner, runner, cert.margin,
                      unscreened=cert.unscreened, screened=tuple(dict.fromkeys(s.problem for s in winner.screens)),
                      screen_s=seconds, total_s=seconds, note=note)


def _announce_skip(spec, profile, label, p: Problem, nbytes: int, reporter) -> str:
    reporter.notice(f"{label}: screen skipped at {_dims(spec, p)} ({nbytes / 2**20:.0f} MiB of "
                    f"operands > the profile's {profile.screen_max_bytes / 2**20:.0f} MiB budget): "
                    "the seat will be unscreened")
    return f"{_dims(spec, p)}: {nbytes} bytes > autotune_screen_max_bytes {profile.screen_max_bytes}"


def _dims(spec: KernelSpec, p: Problem) -> str:
    return ",".join(f"{d.name}={v}" for d, v in zip(spec.key, p.dims))

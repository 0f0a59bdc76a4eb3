"""Where candidates run. The tuner asks an executor to screen a config or time it and gets
a result back, never an exception: a config that fails to compile, runs out of resources
or crashes becomes a refusal with the error text.

`InProcess` runs in this process (the interpreter, tests, a trusted kernel). The
subprocess executor (`tuner/execution/isolation.py`) runs the same `CandidateRunner` in a worker process
so that a candidate that kills its process or hangs costs only itself.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from nbx_tune.kernels.spec import Config, KernelSpec, Problem
from nbx_tune.tuner.timing import benchmarkers as timing
from nbx_tune.tuner.timing.benchmarkers import Benchmarker, Timing


@dataclass
class SeatJob:
    """Everything needed to run a seat's candidates, in any process."""

    kernel: str
    profile_name: str
    label: str
    screen_problems: tuple[Problem, ...]  # every candidate is screened here (within the byte budget)
    time_problem: Problem  # the largest shape seen in the bucket
    rtol: dict  # output name -> tolerance of its dtype
    device: str
    # The seat's other shapes (every one seen in the bucket, and tile-edge shapes): the
    # contenders for the certificate are screened here too, once timed (tuner/certify/tune.py).
    confirm_problems: tuple[Problem, ...] = ()
    variation_allowed: bool = False  # the kernel declares run-to-run variation (float atomics)
    # The compile pool starts the first configs at the confirm shapes too (a search whose few
    # configs all reach them: tuner/certify/recertify.py), so the worker does not compile them there.
    compile_confirm: bool = False


@dataclass
class Outcome:
    """What one screen or timing call produced: a value, or a refusal."""

    screens: list | None = None  # [ScreenResult] for screen calls
    timing: Timing | None = None
    reason: str | None = None
    detail: str = ""
    problem: Problem | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


# Errors after which a process's GPU context is unusable: every later call in it fails.
FATAL_GPU_ERRORS = ("illegal memory access", "illegal address", "device-side assert",
                    "unspecified launch failure", "misaligned address", "an illegal instruction",
                    "CUDA error", "HIP error", "hipError")


class ContextPoisoned(Exception):
    """A candidate left the GPU context unusable: its process must not run another."""


def is_fatal(e: BaseException) -> bool:
    text = f"{type(e).__name__}: {e}"
    return any(p in text for p in FATAL_GPU_ERRORS)


class SeatPrepareError(Exception):
    """A seat's inputs or oracle could not be made: the whole seat is refused."""


class WorkerLost(SeatPrepareError):
    """The worker died while it prepared the seat (killed from outside, out of memory): not
    the seat's own failure, so the seat is recorded `worker_lost` and the next census
    tries it again."""


def classify_exception(e: BaseException) -> tuple[str, str]:
    """A failure of a candidate's launch as a refusal reason with its text."""
    name = type(e).__name__
    text = f"{name}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}".rstrip(": ")
    if name == "OutOfResources":
        return "out_of_resources", text
    if name in ("CompilationError", "CompileTimeAssertionFailure") or "Compilation" in name:
        return "compile_error", text
    return "launch_error", text


# Rigs kept per seat: more than the contenders of a seat's rounds (strategies/pruned.py's
# TOP_K), far fewer than an audit's candidates, whose captured graphs may each hold a
# workspace (split-K partials).
RIGS = 12


class CandidateRunner:
    """Holds one seat's prepared cases (inputs and oracles, made once) and runs
    candidates against them."""

    def __init__(self, spec: KernelSpec, job: SeatJob, bench: Benchmarker):
        # The screen imports torch, which takes seconds: this module is imported without it
        # by a census that starts its worker before importing torch (tuner/commands.py).
        from nbx_tune.tuner.certify import screen

        self.screening = screen
        self.spec, self.job, self.bench = spec, job, bench
        # Each screened problem with its oracle; the timed one reuses its screen case, or
        # gets inputs of its own when it is not screened (over the byte budget).
        self.cases = [screen.make_case(spec, p, job.device, screen.seed_for(job.label, p), True)
                      for p in job.screen_problems]
        self.confirm_cases = [screen.make_case(spec, p, job.device, screen.seed_for(job.label, p), True)
                              for p in job.confirm_problems]
        timed = [c for c in self.cases if c.problem == job.time_problem]
        self.time_case = timed[0] if timed else screen.make_case(
            spec, job.time_problem, job.device, screen.seed_for(job.label, job.time_problem), False)
        self._sets: list | None = None  # a streaming seat's operand sets, shared by its configs
        self._rigs: OrderedDict = OrderedDict()  # config -> timing.Rig, the RIGS last timed

    def _operands(self, case) -> tuple[dict, dict]:
        return (self.screening.fresh_inputs(case),
                self.screening.alloc_outputs(self.spec, case.problem, self.job.device))

    def screen(self, config: Config) -> Outcome:
        """At the seat's screen shapes; launched twice at the first (the largest), whose two
        outputs must agree bit for bit unless the kernel allows run-to-run variation."""
        return self._screen(config, self.cases, repeat_first=True)

    def confirm(self, config: Config) -> Outcome:
        """At the seat's other shapes (seen in the bucket, tile edges)."""
        return self._screen(config, self.confirm_cases, repeat_first=False)

    def _screen(self, config: Config, cases, repeat_first: bool) -> Outcome:
        results = []
        for i, case in enumerate(cases):
            try:
                r = self.screening.screen(self.spec, config, case, self.job.rtol, self.job.device,
                                          repeat=repeat_first and i == 0,
                                          variation_allowed=self.job.variation_allowed)
            except Exception as e:
                if is_fatal(e):
                    raise ContextPoisoned(classify_exception(e)[1]) from e
                reason, detail = classify_exception(e)
                return Outcome(screens=results, reason=reason, detail=detail, problem=case.problem)
            results.append(r)
            if not r.ok:
                return Outcome(screens=results, reason=r.reason, detail=r.detail, problem=case.problem)
        return Outcome(screens=results)

    def time(self, config: Config, mode: str) -> Outcome:
        case = self.time_case
        try:
            # Operand sets to rotate through (tuner/timing/benchmarkers.py); a benchmarker that cannot
            # time a stream (the interpreter's wall clock) times one set, so only one is made.
            stream = self.spec.timing == "stream" and getattr(self.bench, "stream", None) is not None
            if not stream:
                ins, outs = self._operands(case)
                return Outcome(timing=self.bench(lambda: self.spec.launch(config, case.problem, ins, outs), mode))
            return Outcome(timing=self.bench.stream(self._rig(config, case), mode))
        except Exception as e:
            if is_fatal(e):
                raise ContextPoisoned(classify_exception(e)[1]) from e
            reason, detail = classify_exception(e)
            return Outcome(reason=reason, detail=detail, problem=case.problem)

    def _rig(self, config: Config, case) -> timing.Rig:
        """The config's launchers over the seat's operand sets, kept for its next timing (a
        quick estimate, then rounds) with the graphs and estimate its first one set up. The
        sets are made once a seat: what a timed launch writes is never read."""
        if self._sets is None:
            self._sets = [self._operands(case) for _ in range(timing.n_sets(self.spec.operand_bytes(case.problem)))]
        rig = self._rigs.pop(config, None)
        if rig is None:
            rig = timing.Rig((lambda ins=ins, outs=outs: self.spec.launch(config, case.problem, ins, outs))
                             for ins, outs in self._sets)
        self._rigs[config] = rig
        while len(self._rigs) > RIGS:
            self._rigs.popitem(last=False)
        return rig


class InProcess:
    """Runs candidates in this process."""

    def __init__(self, bench: Benchmarker):
        self.bench = bench
        self.runner: CandidateRunner | None = None

    generation = 0  # never replaced: see tuner/execution/isolation.py

    def start_seat(self, spec: KernelSpec, job: SeatJob, configs=()) -> None:
        try:
            self.runner = CandidateRunner(spec, job, self.bench)
        except Exception as e:
            raise SeatPrepareError(f"{type(e).__name__}: {e}") from e

    def screen(self, config: Config) -> Outcome:
        try:
            return self.runner.screen(config)
        except ContextPoisoned as e:  # in-process there is no fresh context to move to
            return Outcome(reason="crash", detail=f"{e} (in-process: later candidates may fail; use isolation)")

    def confirm(self, config: Config) -> Outcome:
        try:
            return self.runner.confirm(config)
        except ContextPoisoned as e:
            return Outcome(reason="crash", detail=f"{e} (in-process: later candidates may fail; use isolation)")

    def time(self, config: Config, mode: str = "full") -> Outcome:
        try:
            return self.runner.time(config, mode)
        except ContextPoisoned as e:
            return Outcome(reason="crash", detail=f"{e} (in-process: later candidates may fail; use isolation)")

    def end_seat(self) -> None:
        self.runner = None

    def close(self) -> None:
        self.runner = None

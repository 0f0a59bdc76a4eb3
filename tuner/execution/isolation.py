"""Candidates in worker processes: a fault costs the candidate, never the tuner.

The parent sends a worker one seat's job, then one candidate at a time, and waits at most
the profile's `candidate_timeout_s` for each answer. A worker that dies (an illegal
address, a trap, `tl.device_assert`, a compiler crash) or hangs is killed and replaced,
and the candidate in flight is refused with reason crash or timeout and the worker's last
words. A GPU fault that leaves the CUDA context poisoned is reported by the worker, which
then exits: nothing else runs in a poisoned context.

Every replacement bumps `generation`; the tuner re-screens anything a dead worker judged
before it certifies it (tuner/certify/tune.py), so nothing of a dead worker's seat is certified
on its word alone.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import traceback

from nbx_tune.tuner.execution.executor import (    ContextPoisoned,
    Outcome,
    SeatJob,
    SeatPrepareError,
    CandidateRunner,
    WorkerLost,
    classify_exception,
    is_fatal,
)
from nbx_tune.tuner.execution.precompile import LATER, NEXT, NOW, let_go

PREPARE_TIMEOUT_FACTOR = 10  # making a seat's inputs and fp64 oracles may take longer than one candidate
STOP_WAIT_S = 10  # a stopped worker writes its profile, if asked, then says so
# The worker's thread pools (numpy's OpenBLAS, torch's OpenMP) sleep as soon as they are
# idle instead of spinning for a while: spinning, they held the cores on which a seat's next
# case drew its inputs on its own threads. A setting of the user's wins.
QUIET_THREADS = {"OPENBLAS_THREAD_TIMEOUT": "4", "OMP_WAIT_POLICY": "PASSIVE"}


def _worker_main(conn, plugins, stderr_path):
    # The parent reads these last words when the worker dies.
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    # Where a seat's time goes inside the worker (bench/tuning_cost.py --profile): a cProfile
    # dump per worker, written when it is stopped.
    profile_dir = os.environ.get("NBX_TUNE_WORKER_PROFILE")
    if profile_dir:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        try:
            _serve(conn, plugins)
        finally:
            prof.disable()
            prof.dump_stats(os.path.join(profile_dir, f"worker-{os.getpid()}.prof"))
    else:
        _serve(conn, plugins)
    # Stopped: nothing is left to write (the parent waits for this word, not for the exit),
    # and the interpreter's own shut-down (torch's included) is slow enough that the census
    # would wait for it.
    sys.stderr.flush()
    try:
        conn.send(("stopped",))
    except (BrokenPipeError, OSError):
        pass
    os._exit(0)


def _serve(conn, plugins):
    # This process may start before its parent has looked for a GPU (tuner/commands.py): it
    # looks for itself, the same way, before anything imports triton.
    from nbx_tune.tuner.commands import ensure_device

    ensure_device()
    import threading

    from nbx_tune.tuner.execution import warmup

    # The device's one-time costs, paid on a thread while this one imports Triton and the
    # kernels and waits for its first seat.
    triton_imported = threading.Event()
    warming = warmup.start(triton_imported)
    from nbx_tune.kernels.runtime.registry import all_specs, get_spec, load_plugin
    from nbx_tune.tuner.timing.benchmarkers import for_timing

    try:  # every kernel imported now (Triton with them), not when the first seat names one
        all_specs()
    except Exception:  # a broken plugin: the seat that names a kernel says so (below)
        pass
    for p in plugins:
        load_plugin(p)
    triton_imported.set()
    runner = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        kind = msg[0]
        if warming is not None and kind != "stop":  # nothing is screened or timed beside it
            warming.join()
            warming = None
        try:
            if kind == "stop":
                return
            if kind == "seat":
                _, kernel, job, timing = msg
                runner = CandidateRunner(get_spec(kernel), job, for_timing(timing))
                conn.send(("ready",))
            elif kind == "screen":
                conn.send(("outcome", runner.screen(msg[1])))
            elif kind == "confirm":
                conn.send(("outcome", runner.confirm(msg[1])))
            elif kind == "time":
                conn.send(("outcome", runner.time(msg[1], msg[2])))
        except BaseException as e:
            # A poisoned context (or a seat that cannot be prepared) ends this worker: the
            # candidate in flight is refused as a crash and the parent starts a fresh one.
            reason, detail = classify_exception(e)
            if kind == "seat" and not is_fatal(e):  # the seat's inputs or oracle raised: its own error
                conn.send(("fatal", "prepare_error", detail, traceback.format_exc(limit=4)))
                os._exit(3)
            if isinstance(e, ContextPoisoned) or is_fatal(e) or kind == "seat":
                conn.send(("fatal", "crash", str(e) if isinstance(e, ContextPoisoned) else detail,
                           traceback.format_exc(limit=4)))
                os._exit(3)
            conn.send(("outcome", Outcome(reason=reason, detail=detail)))


@contextlib.contextmanager
def _environ(defaults: dict):
    """os.environ with `defaults` for the variables it does not set, within the block."""
    added = [k for k in defaults if k not in os.environ]
    os.environ.update({k: defaults[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


class Isolated:
    """Runs a seat's candidates in a worker process, replacing it after a crash or hang.

    Made without a profile (`Isolated(plugins=...)`, then `use_profile` before the first
    seat), it can start before this process has imported torch: the worker's and the
    compile pool's imports and device set-up then overlap this process's (tuner/commands.py).
    It imports nothing heavy itself, so that it can."""

    def __init__(self, profile=None, timeout_s: float | None = None, precompile: bool | None = None,
                 plugins=()):
        from nbx_tune.kernels.runtime.registry import plugin_modules
        from nbx_tune.profiles import interpreter_enabled

        self.timing = self.timeout = None
        self.timeout_s = timeout_s
        self.plugins = sorted({*plugin_modules(load=profile is not None), *plugins})
        self.ctx = mp.get_context("spawn")
        self.proc = None
        self.conn = None
        self.stderr_path = None
        self.generation = 0
        self.spec = self.job = None
        self.broken = None  # the SeatPrepareError of a replacement worker, raised at the next request
        self.restarts = 0
        self.served = False  # whether any request reached a worker
        # The interpreter compiles nothing; on a GPU, candidates compile on the CPU cores
        # ahead of the worker (tuner/execution/precompile.py).
        self.on_a_bet = precompile is None and profile is None  # that there is a GPU: see use_profile
        if precompile is None:
            precompile = (not interpreter_enabled() if profile is None else
                          profile.name != "interpreter" and profile.architecture != "interpreter")
        self.precompiler = None
        if precompile:
            from nbx_tune.tuner.execution.precompile import Precompiler

            self.precompiler = Precompiler(self.plugins)
        self._start()
        if profile is not None:
            self.use_profile(profile)

    def use_profile(self, profile) -> None:
        """The timing method and the per-candidate time limit of the profile tuned for."""
        self.timing = profile.timing
        self.timeout = self.timeout_s or profile.candidate_timeout_s
        interpreter = profile.name == "interpreter" or profile.architecture == "interpreter"
        if self.precompiler is not None and self.on_a_bet and interpreter:
            self.precompiler.close()  # started on a bet that there was a GPU: there is none
            self.precompiler = None

    # -- worker lifecycle
    def _start(self) -> None:
        fd, self.stderr_path = tempfile.mkstemp(prefix="nbx-tune-worker-", suffix=".log")
        os.close(fd)
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker_main, daemon=True,
                                     args=(child, self.plugins, self.stderr_path))
        with _environ(QUIET_THREADS):  # read by the libraries as the new process loads them
            self.proc.start()
        child.close()
        self.conn = parent

    def _kill(self, wait: bool = True) -> None:
        """The worker gone, with its pipe and its stderr log; waited for unless not `wait`."""
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            if wait:
                self.proc.join(timeout=10)
            else:
                let_go(self.proc)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None
        if self.stderr_path:
            try:
                os.unlink(self.stderr_path)
            except OSError:
                pass

    def _last_words(self) -> str:
        try:
            with open(self.stderr_path, errors="replace") as f:
                lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
        except (OSError, TypeError):
            return ""
        return " | ".join(lines[-3:])[-600:]

    def _replace(self, prepare: bool = True) -> None:
        """A fresh worker for a dead one; it is given the seat in progress unless `prepare`
        is False (the seat's preparation is what killed the last one)."""
        self._kill()
        self.generation += 1
        self.restarts += 1
        self._start()
        if prepare and self.job is not None:
            try:
                self._prepare()
            except SeatPrepareError as e:
                self.broken = e

    def _call(self, msg, timeout: float):
        """Send one request; (reply, None) or (None, (reason, detail)) when the worker died
        or hung (it has been replaced by then)."""
        if self.proc is None:
            self._start()
            if self.job is not None and msg[0] != "seat":
                self._prepare()
        self.served = True
        try:
            self.conn.send(msg)
            if self.conn.poll(timeout):
                reply = self.conn.recv()
                if reply[0] != "fatal":
                    return reply, None
                self.proc.join(timeout=10)
                failure = (reply[1], reply[2] if reply[1] == "prepare_error" else
                           f"{reply[2]} (the worker's GPU context was unusable after it; replaced)")
            else:
                failure = ("timeout", f"no answer within {timeout:g} s (candidate_timeout_s); worker killed")
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            self.proc.join(timeout=10)
            code = self.proc.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            # SIGKILL is what the out-of-memory killer and `kill -9` send; no fault of a
            # candidate ends a process that way (a GPU fault is SIGSEGV or SIGABRT).
            outside = code == -signal.SIGKILL
            failure = ("worker_lost" if outside else "crash",
                       f"worker died ({how}{', killed from outside: out of memory?' if outside else ''}): "
                       f"{self._last_words() or 'no output'}", True)
        # Preparing the seat again in the fresh worker may kill it too: this candidate keeps
        # its own refusal, and the next request refuses the seat (tuner/certify/tune.py), never a loop.
        self._replace(prepare=msg[0] != "seat")
        return None, failure

    def _prepare(self) -> None:
        reply, failure = self._call(("seat", self.spec.name, self.job, self.timing),
                                    self.timeout * PREPARE_TIMEOUT_FACTOR)
        if failure is not None:
            self.job = None
            if len(failure) > 2:  # the worker died: not an error of the seat's own
                raise WorkerLost(f"the worker died while making the seat's inputs and oracle: {failure[1]}")
            raise SeatPrepareError(f"making the seat's inputs and oracle failed: {failure[1]}")

    # -- the executor interface
    def _precompile(self, spec, job: SeatJob, configs, confirm: bool = False, priority: int = NOW) -> None:
        if self.precompiler is not None and configs:
            more = job.confirm_problems if confirm else ()
            problems = tuple(dict.fromkeys((*job.screen_problems, job.time_problem, *more)))
            self.precompiler.submit(spec.name, problems, configs, job.device, priority)

    def prefetch(self, spec, job: SeatJob, configs, later: bool = False) -> None:
        """Queue a seat's first configs before its turn (tuner/fleet/seat_tuner.py): compiled while
        the seats before it are screened and timed; `later` (a deferred audit's whole
        space) only where no seat nearer its turn waits for a compile."""
        self._precompile(spec, job, configs, job.compile_confirm, LATER if later else NEXT)

    def precompile(self, configs) -> None:
        """Queue more of this seat's configs (a search that widens: tuner/certify/recertify.py)."""
        if self.spec is not None and self.job is not None:
            self._precompile(self.spec, self.job, configs)

    def start_seat(self, spec, job: SeatJob, configs=()) -> None:
        self.spec, self.job, self.broken = spec, job, None
        self._precompile(spec, job, configs, job.compile_confirm)
        # The next seat's inputs and oracles are not made while this one is timed: on a
        # thread of the worker or in the pool's niced processes, that work held up the
        # launches being timed and mis-ranked candidates. The timer's lead covers the
        # host's usual pace, not a launch held up that long.
        self._prepare()

    def _request(self, msg) -> Outcome:
        # A worker killed from outside is given the candidate once more, in its replacement.
        for attempt in range(2):
            if self.broken is not None:
                raise self.broken
            reply, failure = self._call(msg, self.timeout)
            if failure is None:
                return reply[1]
            if failure[0] != "worker_lost":
                break
        return Outcome(reason=failure[0], detail=failure[1])

    def screen(self, config) -> Outcome:
        return self._request(("screen", config))

    def confirm(self, config) -> Outcome:
        if self.broken is not None:
            raise self.broken
        reply, failure = self._call(("confirm", config), self.timeout)
        if failure is not None:
            return Outcome(reason=failure[0], detail=failure[1])
        return reply[1]

    def time(self, config, mode: str = "full") -> Outcome:
        return self._request(("time", config, mode))

    def end_seat(self) -> None:
        self.spec = self.job = self.broken = None

    def close(self) -> None:
        # No process is waited for to exit: each exit waits on its GPU context's teardown,
        # which nothing here needs. The worker is waited for only to say it stopped (it has
        # written what it writes, a profile); one never sent a seat (every seat already
        # certified) may still be importing: it has nothing to finish and is killed.
        told = False
        if self.proc is not None and self.proc.is_alive() and self.served:
            try:
                self.conn.send(("stop",))
                told = True
            except (BrokenPipeError, OSError):
                pass
        if self.precompiler is not None:
            self.precompiler.close()
        if told:
            try:
                if self.conn.poll(STOP_WAIT_S):
                    self.conn.recv()
            except (EOFError, OSError):
                pass
        self._kill(wait=False)

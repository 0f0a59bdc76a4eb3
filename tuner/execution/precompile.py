"""Compile a seat's candidates in parallel on the CPU cores, ahead of the worker that
screens and times them.

Triton compiles a config on its first launch, one at a time, while the GPU waits: for a
GEMM config space that is most of a seat's tuning time. Here a pool of processes runs each
candidate's launcher with Triton's launches turned into warm-ups (compile, do not launch),
on meta tensors of the seat's shapes, so every specialization the worker will need is
already in Triton's on-disk cache when it gets there; no process makes a GPU context. A
compile that crashes or fails here costs nothing: the worker compiles that config itself
and the tuner refuses it there, with the error text. Nothing compiled here is trusted for
anything but speed.

Jobs go out by priority, not in the order queued: the seat being tuned (NOW) before the
next seats' first configs (NEXT) before a later audit's whole space (LATER). This process
hands the pool a job only as a process frees up, so a seat's own configs never wait
behind a queue of background compiles, and LATER keeps RESERVED processes free for them.
"""

from __future__ import annotations

import fcntl
import hashlib
import heapq
import itertools
import multiprocessing as mp
import os
import tempfile
import threading


COMPILE_PROCS_ENV = "NBX_TUNE_COMPILE_PROCS"
NOW, NEXT, LATER = 0, 1, 2  # job priorities: the seat being tuned, the next seats, a later audit
RESERVED = 3  # processes a LATER job never takes (of pools larger than that)
DONE_POLL_S = 0.25  # how soon the thread counting done jobs sees the pool stopped

from nbx_tune.errors import NbxError


def _compile_only():
    """Make every `kernel[grid](...)` in this process compile without launching, and build
    its launcher (a C compile where Triton makes one per signature, cached for the worker),
    without loading the binary: loading needs a GPU context, which costs a process more than
    its first compile when the whole pool makes one at once (lab/certify_cost/NOTES.md)."""
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    def getitem(self, grid):
        def compile_(*args, **kwargs):
            # Nothing is launched on a stream, and asking torch for one makes the context.
            driver.active.get_current_stream = _no_stream
            kernel = self.run(*args, grid=grid, warmup=True, **kwargs)
            make_launcher = getattr(driver.active, "launcher_cls", None)
            if make_launcher is not None and hasattr(kernel, "metadata"):
                make_launcher(kernel.src, kernel.metadata)
            return kernel

        return compile_

    JITFunction.__getitem__ = getitem


def _no_stream(device=None) -> int:
    """The stream a compile-only launch is given: the null one (none is ever used)."""
    return 0


def _init(plugins, environ):
    # The census's environment as it is now (the fork server's dates from its own start).
    os.environ.clear()
    os.environ.update(environ)
    # Compiling is background work: the worker timing candidates on the same cores must not
    # wait for a compile to be descheduled (a late launch is counted in its timing).
    try:
        os.nice(10)
    except OSError:
        pass
    _compile_only()
    from nbx_tune.kernels.runtime.registry import all_specs, load_plugin

    # Torch, Triton and the kernels imported now (where the fork server has not), while
    # nothing waits for this process (a broken plugin is the census's to report: the job
    # that needs it fails here silently); torch's CUDA state set up before the first job
    # (which makes no context: see _compile_only and _compile).
    import torch
    try:
        all_specs()
    except Exception:
        pass
    for p in plugins:
        load_plugin(p)
    try:
        if torch.cuda.is_available():
            torch.cuda.init()
    except Exception:
        pass


def _compile(kernel: str, problems, config, device: str) -> str | None:
    import torch

    from nbx_tune.kernels.runtime.registry import get_spec
    from nbx_tune.tuner.certify.screen import TORCH_DTYPES

    spec = get_spec(kernel)
    # A GPU seat's tensors live on the meta device: Triton specializes on dtypes, constexprs
    # and the alignment of sizes and addresses (a meta tensor's is 0), and compiling needs no
    # GPU context, which would cost each process more than its first compile.
    where = "meta" if device.startswith("cuda") else device
    try:
        for p in problems:
            inputs = {n: torch.empty(s, dtype=TORCH_DTYPES[d], device=where)
                      for n, (s, d) in spec.input_shapes(p).items()}
            outputs = {n: torch.empty(s, dtype=TORCH_DTYPES[d], device=where)
                       for n, (s, d) in spec.output_specs(p).items()}
            spec.launch(config, p, inputs, outputs)
    except Exception as e:  # the worker meets it again and refuses the config there
        return f"{type(e).__name__}: {e}"
    return None


def _lock_path(kernel: str, problems, config) -> str:
    """One lock file per (kernel, config, dtypes, flags): the seats of one kind share their
    compiled binaries (Triton specializes on dtypes, constexprs and divisibility, which
    these carry), so the workers of one host compile each such binary once."""
    p = problems[0]
    key = repr((kernel, config.key(), tuple(p.dtypes), tuple(p.flags)))
    name = hashlib.sha256(key.encode()).hexdigest()[:24]
    root = os.path.join(tempfile.gettempdir(), f"nbx-tune-compile-locks-{os.getuid()}")
    os.makedirs(root, exist_ok=True)
    return os.path.join(root, name)


def _serve_compiles(jobs, done, done_lock, plugins, environ) -> None:
    try:
        _init(plugins, environ)
    except NbxError:  # a plugin that cannot be imported: the census says so on one line
        return
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            finished = _take(jobs, job)
        except Exception:  # a job this process cannot even start: the worker meets it again
            finished = True
        if finished:
            with done_lock:
                done.send(job[:4])


def _take(jobs, job) -> bool:
    """Compile one job under its host-wide lock; whether it is done. While another
    worker's pool on this host compiles the same binary, the job goes back to the queue
    once (this process compiles something else meanwhile) and then waits for the lock: the
    compile is then a hit in Triton's cache."""
    kernel, problems, config, device, deferred = (*job, False)[:5]
    with open(_lock_path(kernel, problems, config), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if deferred else fcntl.LOCK_NB))
        except BlockingIOError:
            jobs.put((kernel, problems, config, device, True))
            return False
        try:
            _compile(kernel, problems, config, device)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return True


class Schedule:
    """Which compile jobs go to the pool next: the most urgent first, first queued first
    among equals, no more in flight than the pool has processes, and a LATER job only
    while RESERVED of them stay free for seats that may come to need one."""

    def __init__(self, procs: int):
        self.procs = procs
        self.waiting: list = []  # heap of (priority, order, job); an entry outranked since is skipped
        self.rank: dict = {}  # job -> its best priority while it waits
        self.flying: set = set()  # handed out and not done
        self.seen: set = set()
        self.order = itertools.count()

    def add(self, job, priority: int) -> bool:
        """Queue `job`, or raise a waiting one to a more urgent priority; False where it
        was queued before at this priority or a more urgent one, or handed out."""
        if job in self.seen and (job not in self.rank or self.rank[job] <= priority):
            return False
        self.seen.add(job)
        self.rank[job] = priority
        heapq.heappush(self.waiting, (priority, next(self.order), job))
        return True

    def take(self) -> list:
        """The jobs to hand out now, marked in flight."""
        out = []
        while self.waiting and len(self.flying) < self.procs:
            priority, _, job = self.waiting[0]
            if self.rank.get(job) != priority:
                heapq.heappop(self.waiting)
                continue
            if priority == LATER and self.procs > RESERVED and len(self.flying) >= self.procs - RESERVED:
                break
            heapq.heappop(self.waiting)
            del self.rank[job]
            self.flying.add(job)
            out.append(job)
        return out

    def finished(self, job) -> None:
        self.flying.discard(job)


class Precompiler:
    """Processes that compile configs ahead of the worker; one set per census. They start
    (and import torch and Triton) when it is made, take compile jobs as `Schedule` hands
    them out, and are killed when it is closed: a compile cut short costs nothing (Triton
    writes its cache entries whole), and nothing waits on a job's result."""

    def __init__(self, plugins, workers: int | None = None):
        # One core is left to the worker that screens and times; workers sharing a host
        # share its cores (COMPILE_PROCS_ENV, set by fleet.spawn_workers).
        n = workers or int(os.environ.get(COMPILE_PROCS_ENV, 0)) or max(1, min(16, (os.cpu_count() or 2) - 1))
        ctx = _context()
        self.jobs = ctx.SimpleQueue()
        # Done jobs come back on a pipe only the processes write: this process never takes
        # its lock, which a process killed mid-write would hold for good.
        self.done, done = ctx.Pipe(duplex=False)
        self.done_lock = ctx.Lock()  # kept: its semaphore goes with the object
        self.procs: list = []
        self.schedule = Schedule(n)
        self.stopped = False
        self.lock = threading.Lock()
        args = (self.jobs, done, self.done_lock, plugins, dict(os.environ))
        # Started on a thread: a fork server answers only once it has imported what it
        # preloads, and this process has its own imports to make meanwhile.
        self.starter = threading.Thread(target=self._start, args=(ctx, n, args, done), daemon=True)
        self.starter.start()
        threading.Thread(target=self._count_done, daemon=True).start()

    def _start(self, ctx, n: int, args, done) -> None:
        try:
            for _ in range(n):
                proc = ctx.Process(target=_serve_compiles, args=args, daemon=True)
                with self.lock:
                    if self.stopped:
                        break
                    self.procs.append(proc)
                try:
                    proc.start()
                except Exception:  # never started (stopped meanwhile: its queue closed)
                    with self.lock:
                        self.procs.remove(proc)
                    raise
                if self.stopped:  # stopped while it started: stop() may have missed it
                    proc.kill()
                    let_go(proc)
        except Exception:  # no compile process: the worker compiles what it needs itself
            pass
        finally:
            done.close()

    @property
    def submitted(self) -> set:
        return self.schedule.seen

    def submit(self, kernel: str, problems, configs, device: str, priority: int = NOW) -> None:
        """Queue compiles at `priority`; a (kernel, problems, config) already submitted in
        this census is not queued again, only raised to a more urgent priority while it
        waits. Nothing is queued once stopped."""
        if self.stopped:
            return
        with self.lock:
            for c in configs:
                self.schedule.add((kernel, tuple(problems), c, device), priority)
            self._hand_out()

    def _hand_out(self) -> None:  # under the lock
        if not self.stopped:
            for job in self.schedule.take():
                self.jobs.put(job)

    def _count_done(self) -> None:
        try:
            while not self.stopped:
                if self.done.poll(DONE_POLL_S):
                    job = self.done.recv()
                    with self.lock:
                        self.schedule.finished(job)
                        self._hand_out()
        except Exception:  # every process gone (EOF), or one killed mid-write: nothing more comes
            pass
        finally:
            self.done.close()

    def stop(self) -> None:
        """Kill every process, without waiting for them to go (see join)."""
        with self.lock:
            self.stopped = True
            procs = list(self.procs)
        for proc in procs:
            if getattr(proc, "_popen", None) is not None and proc.is_alive():
                proc.kill()

    def join(self) -> None:
        """Wait until every process is gone (after stop())."""
        self.starter.join()
        for proc in self.procs:
            if getattr(proc, "_popen", None) is not None:
                proc.join()
        self.jobs.close()  # the counting thread sees `stopped` and closes its pipe

    def close(self) -> None:
        """Kill every process and wait for none: nothing here needs them gone (one that
        holds a GPU context, as a plugin's launch may make, goes only once the driver has
        torn it down)."""
        self.stop()
        for proc in list(self.procs):
            let_go(proc)
        self.jobs.close()


PRELOAD = "nbx_tune.tuner.execution.preload"


def _context():
    """The pool's processes are forked from a server that imported PRELOAD once, where the
    platform has one; else each is spawned and imports what it needs."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])  # taken when this process's server starts, once
    return ctx


def let_go(proc) -> None:
    """Leave a child process that was killed or told to exit to finish on its own: reaped
    on a daemon thread, and out of multiprocessing's list of children, which it joins at
    interpreter exit."""
    import threading

    from multiprocessing import process

    getattr(process, "_children", set()).discard(proc)
    popen = getattr(proc, "_popen", None)
    if popen is not None:
        threading.Thread(target=popen.wait, daemon=True).start()

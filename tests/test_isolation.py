"""Candidates in worker processes: a candidate that kills its process or hangs is refused
with reason crash / timeout, the tuner replaces the worker and goes on, and what the dead
worker passed is screened again before anything is certified."""

import os
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from nbx_tune.testing import planted
from nbx_tune.kernels.runtime.registry import register
from nbx_tune.profiles import builtin_profiles, load_profile_file
from nbx_tune.tuner import commands as api
from nbx_tune.tuner.execution.isolation import Isolated
from nbx_tune.tuner.timing.strategies import get_strategy
from nbx_tune.tuner.certify.tune import tune_seat

for s in planted.SPECS:
    register(s)


def quick_timeout_profile(tmp_path, seconds=8):
    data = yaml.safe_load(Path(builtin_profiles()["interpreter"].source).read_text())
    data["autotune"]["candidate_timeout_s"] = seconds
    p = tmp_path / "quick_timeout.yml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.slow
def test_crash_and_hang_are_refused_and_the_tuner_goes_on(tmp_path, monkeypatch):
    log = tmp_path / "launches.log"
    monkeypatch.setenv("NBX_TEST_LAUNCH_LOG", str(log))
    res, ex = tune_isolated(load_profile_file(quick_timeout_profile(tmp_path)), planted.FAULTY, 1000)
    reasons = {r.config: (r.reason, r.detail) for r in res.records}
    assert reasons[planted.CRASH][0] == "crash" and "signal 11" in reasons[planted.CRASH][1]
    assert reasons[planted.HANG][0] == "timeout" and "8 s" in reasons[planted.HANG][1]
    assert res.outcome == "certified" and res.winner.config in planted.GOOD
    assert ex.restarts == 2
    # GOOD[0] was passed by the worker that later crashed: it was screened again, by a new
    # worker, before it could win. Three workers ran in all.
    runs = [line.split() for line in log.read_text().splitlines()]
    pids = list(dict.fromkeys(pid for pid, _ in runs))
    assert len(pids) == 3
    screened_by = Counter((pid, block) for pid, block in runs)
    assert screened_by[(pids[0], "32")] >= 1 and any(screened_by[(p, "32")] for p in pids[1:])


def tune_isolated(profile, spec, n):
    """One seat of `spec` at size n, its candidates in worker processes: (result, executor)."""
    from nbx_tune.kernels.spec import Problem, seat_flags

    ex = Isolated(profile)
    try:
        res = tune_seat(spec, profile, spec.name, [Problem(spec.name, ("float32",), seat_flags(), (n,))], ex,
                        get_strategy("exhaustive"), "cpu")
    finally:
        ex.close()
    return res, ex


@pytest.mark.slow
def test_census_with_isolation_records_crash_refusals(tmp_path, db_url):
    t = tmp_path / "t.tsv"
    t.write_text("# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\ntest.faulty\tfloat32\t333\t\t1\n")
    rep = api.census(str(t), db_url, profile=str(quick_timeout_profile(tmp_path, 6)), isolate=True)
    assert rep.seats[0].status == "certified"
    rows = api.refusal_rows(db_url, kernel="test_faulty")
    assert {r["reason"] for r in rows} == {"crash", "timeout"}


def test_a_candidate_that_poisons_the_gpu_context_is_the_one_refused(tmp_path):
    """Seen on an H200 (2026-12-02): after an illegal memory access every later call in the
    process fails. The candidate that caused it is refused as a crash; the others are
    screened again in a fresh worker and one of them is certified."""
    res, ex = tune_isolated(load_profile_file(quick_timeout_profile(tmp_path, 60)), planted.POISONING, 999)
    reasons = {r.config: r.reason for r in res.records}
    assert reasons[planted.POISON] == "crash"
    assert reasons[planted.GOOD[0]] is None and reasons[planted.GOOD[1]] is None
    assert res.outcome == "certified" and res.winner.config in planted.GOOD
    assert ex.restarts == 1


def _seat(spec, n):
    from nbx_tune.kernels.spec import Problem, seat_flags

    return [Problem(spec.name, ("float32",), seat_flags(), (n,))]


def test_a_seat_whose_preparation_kills_the_worker_is_refused_and_the_next_seat_certifies(tmp_path):
    profile = load_profile_file(quick_timeout_profile(tmp_path, 60))
    ex = Isolated(profile)
    try:
        bad = tune_seat(planted.UNPREPARABLE, profile, "bad", _seat(planted.UNPREPARABLE, 13), ex,
                        get_strategy("exhaustive"), "cpu")
        good = tune_seat(planted.SPEC, profile, "good", _seat(planted.SPEC, 77), ex,
                         get_strategy("exhaustive"), "cpu")
    finally:
        ex.close()
    # Not the seat's own failure: recorded worker_lost, which the next census tries again.
    assert bad.outcome == "refused" and bad.seat_refusal[0] == "worker_lost"
    assert "worker died" in bad.seat_refusal[1] and "signal 11" in bad.seat_refusal[1]
    assert ex.restarts == 1  # one worker lost, not one per retry: the seat is not prepared again
    assert good.outcome == "certified" and good.winner.config in planted.GOOD


@pytest.mark.slow
def test_a_replacement_worker_that_cannot_prepare_the_seat_refuses_it_without_looping(tmp_path, monkeypatch):
    """A candidate kills the worker; its replacement dies preparing the seat again. The
    seat is refused (prepare_error) once, where the executor used to recurse forever."""
    monkeypatch.setenv("NBX_TEST_PREPARE_LOG", str(tmp_path / "prepared.log"))
    profile = load_profile_file(quick_timeout_profile(tmp_path, 60))
    ex = Isolated(profile)
    try:
        res = tune_seat(planted.UNPREPARABLE, profile, "seat", _seat(planted.UNPREPARABLE, 200), ex,
                        get_strategy("exhaustive"), "cpu")
    finally:
        ex.close()
    assert res.outcome == "refused" and res.seat_refusal[0] == "worker_lost"
    assert "worker died" in res.seat_refusal[1]
    assert ex.restarts == 2  # the candidate's crash, then the failed preparation
    assert {r.config: r.reason for r in res.records}[planted.CRASH] == "crash"  # still on record
    assert len((tmp_path / "prepared.log").read_text().split()) == 2


@pytest.mark.slow
def test_a_worker_killed_from_outside_while_preparing_is_retried_by_the_next_census(tmp_path, db_url,
                                                                                     monkeypatch):
    """SIGKILL (the out-of-memory killer, kill -9) while the worker makes a seat's inputs:
    the seat is pending with the reason, and the next census tunes it, where it used to
    stay refused (prepare_error) for good."""
    marker = tmp_path / "kill-prepare"
    marker.write_text("x")
    monkeypatch.setenv("NBX_TEST_KILL_PREPARE", str(marker))
    t = tmp_path / "t.tsv"
    t.write_text("# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\ntest.killed\tfloat32\t300\t\t1\n")
    prof = str(quick_timeout_profile(tmp_path, 60))
    first = api.census(str(t), db_url, profile=prof, isolate=True).seats[0]
    assert first.status == "pending" and "worker_lost" in first.why and "SIGKILL" not in first.why
    assert "signal 9" in first.why and "tried again by the next census" in first.why
    marker.unlink()
    second = api.census(str(t), db_url, profile=prof, isolate=True).seats[0]
    assert second.status == "certified" and second.action == "tuned"


def test_a_candidate_whose_worker_is_killed_from_outside_is_tried_again_not_refused(tmp_path, monkeypatch):
    marker = tmp_path / "kill-once"
    marker.write_text("x")
    monkeypatch.setenv("NBX_TEST_KILL_ONCE", str(marker))
    res, ex = tune_isolated(load_profile_file(quick_timeout_profile(tmp_path, 60)), planted.KILLED, 300)
    assert ex.restarts == 1 and not marker.exists()  # it was killed once, in the first worker
    reasons = {r.config: r.reason for r in res.records}
    assert reasons[planted.KILLED_ONCE] is None  # judged in the replacement, never refused `crash`
    assert res.outcome == "certified" and res.seat_refusal is None


def test_an_oracle_that_raises_is_the_seats_prepare_error_not_a_gpu_fault(tmp_path):
    res, _ = tune_isolated(load_profile_file(quick_timeout_profile(tmp_path, 60)), planted.BAD_ORACLE, 300)
    assert res.outcome == "refused" and res.seat_refusal[0] == "prepare_error"
    assert "ValueError: oracle bug" in res.seat_refusal[1] and "GPU context" not in res.seat_refusal[1]


def test_a_worker_profile_is_written_when_asked_and_names_the_screen(tmp_path, monkeypatch):
    import pstats

    monkeypatch.setenv("NBX_TUNE_WORKER_PROFILE", str(tmp_path))
    res, _ = tune_isolated(builtin_profiles()["interpreter"], planted.SPEC, 300)
    assert res.outcome == "certified"
    dumps = list(tmp_path.glob("worker-*.prof"))
    assert len(dumps) == 1
    names = {fn for (_, _, fn) in pstats.Stats(str(dumps[0])).stats}
    assert {"screen", "time"} <= names  # CandidateRunner's two entry points were profiled


def _job(spec, n, label="seat"):
    from nbx_tune.kernels.spec import Problem, seat_flags
    from nbx_tune.tuner.certify.tune import seat_job

    problems = [Problem(spec.name, ("float32",), seat_flags(), (k,)) for k in (n // 3, n)]
    return seat_job(spec, builtin_profiles()["interpreter"], label, problems, "cpu")[0], problems


class _FakePool:
    def __init__(self):
        self.events = []

    def submit(self, kernel, problems, configs, device, priority):
        self.events.append(("submit", len(configs), priority))

    def stop(self):
        self.events.append(("stop",))

    def join(self):
        self.events.append(("join",))

    def close(self):
        self.events.append(("close",))


def test_a_seat_queues_its_own_compiles_only_and_close_closes_the_pool():
    """A seat's candidates are queued once for compiling ahead of the worker (the one the
    static prune refuses is not), and the executor's close closes the pool."""
    from nbx_tune.tuner.execution.precompile import NOW

    profile = builtin_profiles()["interpreter"]
    spec = planted.SPEC
    _, seat_a = _job(spec, 300, "a")
    ex = Isolated(profile, precompile=False)
    ex.precompiler = pool = _FakePool()
    try:
        res = tune_seat(spec, profile, "a", seat_a, ex, get_strategy("exhaustive"), "cpu")
        assert res.outcome == "certified"
        assert pool.events == [("submit", len(spec.configs()) - 1, NOW)]  # a's compiles, once, first
    finally:
        ex.close()
    assert pool.events[1:] == [("close",)]


def test_the_compile_schedule_hands_out_the_seat_being_tuned_first_and_keeps_processes_from_a_later_audit():
    from nbx_tune.tuner.execution.precompile import LATER, NEXT, NOW, RESERVED, Schedule

    sched = Schedule(RESERVED + 2)
    for i in range(6):
        assert sched.add(("audit", i), LATER)
    assert sched.take() == [("audit", 0), ("audit", 1)]  # RESERVED processes stay free
    assert sched.add(("next", 0), NEXT) and sched.add(("now", 0), NOW)
    assert not sched.add(("now", 0), NEXT)  # queued already, at a more urgent priority
    assert sched.take() == [("now", 0), ("next", 0)]  # the seat being tuned first
    assert sched.add(("audit", 4), NOW)  # a later seat's config now needed: raised, not repeated
    assert sched.take() == [("audit", 4)] and sched.take() == []  # every process busy
    sched.finished(("audit", 0))
    sched.finished(("now", 0))
    assert sched.take() == []  # four in flight: a LATER job waits while a process is reserved
    for job in (("audit", 1), ("next", 0), ("audit", 4)):
        sched.finished(job)
    assert sched.take() == [("audit", 2), ("audit", 3)]
    assert not sched.add(("audit", 2), NOW)  # handed out already: not queued again
    for job in (("audit", 2), ("audit", 3)):
        sched.finished(job)
    assert sched.take() == [("audit", 5)] and sched.take() == []
    small = Schedule(2)  # a pool no larger than RESERVED runs LATER jobs on every process
    small.add(("a",), LATER), small.add(("b",), LATER), small.add(("c",), LATER)
    assert small.take() == [("a",), ("b",)]


def test_a_precompiler_hands_its_processes_jobs_as_they_finish():
    """More jobs than processes: each goes out once a process says one is done, and every
    job is compiled once."""
    import time

    from nbx_tune.kernels.spec import Config, Problem
    from nbx_tune.tuner.execution.precompile import LATER, NOW, Precompiler

    configs = [Config((("BLOCK", b),), 4, 2) for b in (16, 32, 64, 128)]
    pool = Precompiler([], workers=2)
    try:  # a kernel no process knows: each job fails at once, and is done
        pool.submit("no_such_kernel", (Problem("k", ("float32",), (), (1,)),), configs, "cpu", LATER)
        pool.submit("no_such_kernel", (Problem("k", ("float32",), (), (1,)),), configs[3:], "cpu", NOW)
        deadline = time.monotonic() + 120
        while (pool.schedule.waiting or pool.schedule.flying) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pool.schedule.flying and not pool.schedule.rank
        assert len(pool.submitted) == 4
    finally:
        pool.close()


def test_a_stopped_precompiler_queues_nothing_and_its_processes_are_gone():
    from nbx_tune.tuner.execution.precompile import Precompiler

    pool = Precompiler([], workers=1)
    pool.stop()
    pool.submit("matmul", (), [planted.GOOD[0]], "cpu")
    assert pool.submitted == set()
    pool.join()
    assert not any(p.is_alive() for p in pool.procs)


def test_a_closed_precompiler_and_worker_are_left_to_exit_and_reaped_without_a_join():
    """close() waits for no exit (a GPU context's teardown), yet leaves no child for
    multiprocessing to join at exit and no zombie: each is reaped on its own."""
    import multiprocessing
    import time

    from nbx_tune.tuner.execution.precompile import Precompiler

    pool = Precompiler([], workers=2)
    ex = Isolated(builtin_profiles()["interpreter"], precompile=False)
    ex._start()
    worker = ex.proc
    ex.close()
    pool.close()
    pool.starter.join()  # a process it started after the close is killed and let go too
    procs = [*pool.procs, worker]
    assert not set(procs) & set(multiprocessing.active_children())
    deadline = time.monotonic() + 30
    while any(p._popen.returncode is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(p._popen.returncode is not None for p in procs)  # reaped by the daemon threads


def test_the_compile_pools_fork_server_preloads_the_kernels_and_touches_no_gpu():
    """The pool's processes are forked from a server that imported tuner/execution/preload.py: it must
    load torch, Triton and the kernels, and leave the GPU alone (a process forked after a
    GPU context is made cannot use the GPU)."""
    import subprocess
    import sys

    from nbx_tune.tuner.execution import precompile

    ctx = precompile._context()
    assert ctx.get_start_method() == "forkserver"
    code = ("import sys, nbx_tune.tuner.execution.preload, torch; "
            "assert 'nbx_tune.kernels.matmul' in sys.modules and 'triton' in sys.modules; "
            "assert not torch.cuda.is_initialized()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_compile_pools_fork_server_holds_none_of_the_census_output():
    """The fork server outlives the census by its own shut-down: it must not hold the
    census's stdout or stderr, or a pipe reading them stays open that long."""
    import time

    from nbx_tune.tuner.execution import precompile

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc")
    pool = precompile.Precompiler((), workers=1)
    try:
        pool.starter.join(timeout=120)
        import multiprocessing.forkserver as fs

        pid = fs._forkserver._forkserver_pid
        assert pid
        deadline = time.monotonic() + 60
        while os.readlink(f"/proc/{pid}/fd/1") != os.devnull and time.monotonic() < deadline:
            time.sleep(0.1)  # the preload runs as the server starts
        assert os.readlink(f"/proc/{pid}/fd/1") == os.devnull
        assert os.readlink(f"/proc/{pid}/fd/2") == os.devnull
        assert os.readlink("/proc/self/fd/1") != os.devnull  # this process's own are untouched
    finally:
        pool.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/environ"), reason="reads a process's environment in /proc")
def test_the_worker_starts_with_quiet_thread_pools_and_the_parents_environment_is_left_as_it_was(monkeypatch):
    from nbx_tune.tuner.execution.isolation import QUIET_THREADS

    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # a user's own setting wins
    ex = Isolated(builtin_profiles()["interpreter"], precompile=False)
    try:
        # /proc shows a process's environment as its program started: read it once the
        # worker runs its own (until then a forked copy shows this process's).
        deadline = time.monotonic() + 30
        while b"spawn_main" not in Path(f"/proc/{ex.proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(f"/proc/{ex.proc.pid}/environ") as f:
            env = dict(kv.split("=", 1) for kv in f.read().split("\0") if "=" in kv)
    finally:
        ex.close()
    assert env["OPENBLAS_THREAD_TIMEOUT"] == QUIET_THREADS["OPENBLAS_THREAD_TIMEOUT"]
    assert env["OMP_WAIT_POLICY"] == "ACTIVE"
    assert "OPENBLAS_THREAD_TIMEOUT" not in os.environ and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"

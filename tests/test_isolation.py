"""Candidates in worker processes: a candidate that kills its process or hangs is refused
with reason crash / timeout, the tuner replaces the worker and goes on, and what the dead
worker passed is screened again before anything is certified."""

from collections import Counter
from pathlib import Path

import yaml

import planted
from nbx_tune.kernels.registry import register
from nbx_tune.profiles import builtin_profiles, load_profile_file
from nbx_tune.tuner import api
from nbx_tune.tuner.isolation import Isolated
from nbx_tune.tuner.strategies import get_strategy
from nbx_tune.tuner.tune import tune_seat

for s in planted.SPECS:
    register(s)


def quick_timeout_profile(tmp_path, seconds=8):
    data = yaml.safe_load(Path(builtin_profiles()["interpreter"].source).read_text())
    data["autotune"]["candidate_timeout_s"] = seconds
    p = tmp_path / "quick_timeout.yml"
    p.write_text(yaml.safe_dump(data))
    return p


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


def test_a_worker_profile_is_written_when_asked_and_names_the_screen(tmp_path, monkeypatch):
    import pstats

    monkeypatch.setenv("NBX_TUNE_WORKER_PROFILE", str(tmp_path))
    res, _ = tune_isolated(builtin_profiles()["interpreter"], planted.SPEC, 300)
    assert res.outcome == "certified"
    dumps = list(tmp_path.glob("worker-*.prof"))
    assert len(dumps) == 1
    names = {fn for (_, _, fn) in pstats.Stats(str(dumps[0])).stats}
    assert {"screen", "time"} <= names  # SeatRunner's two entry points were profiled


def _job(spec, n, label="seat"):
    from nbx_tune.kernels.spec import Problem, seat_flags
    from nbx_tune.tuner.tune import seat_job

    problems = [Problem(spec.name, ("float32",), seat_flags(), (k,)) for k in (n // 3, n)]
    return seat_job(spec, builtin_profiles()["interpreter"], label, problems, "cpu")[0], problems


def test_cases_made_by_the_pool_are_the_cases_the_worker_would_make(tmp_path):
    import numpy as np

    from nbx_tune.tuner.executor import host_cases
    from nbx_tune.tuner.isolation import _load_cases
    from nbx_tune.tuner.precompile import _make_cases

    job, _ = _job(planted.SPEC, 301)
    path = str(tmp_path / "cases.pkl")
    _make_cases(planted.SPEC.name, job, path)
    made, direct = _load_cases(path, job), host_cases(planted.SPEC, job)
    assert not (tmp_path / "cases.pkl").exists()  # taken once
    assert [c.problem for c in made] == [c.problem for c in direct] == list(job.screen_problems)
    for a, b in zip(made, direct):  # same seeds: the same inputs and the same oracle
        assert all(bool((a.inputs[k] == b.inputs[k]).all()) for k in b.inputs)
        assert all(np.array_equal(a.ref[k], b.ref[k]) for k in b.ref)
    # Another seat's file is not taken for this one, and a missing file is no error.
    other, _ = _job(planted.SPEC, 302)
    _make_cases(planted.SPEC.name, other, path)
    assert _load_cases(path, job) is None and _load_cases(path, job) is None
    # Cases that cannot be made leave no file: the worker meets the error itself.
    _make_cases("no_such_kernel", job, path)
    assert list(tmp_path.iterdir()) == []


def test_the_upcoming_seat_is_made_while_the_current_one_runs(tmp_path, monkeypatch):
    """The pool makes the upcoming seat's cases: the worker (profiled) makes only the first
    seat's, and both seats certify exactly as they do alone."""
    import pstats
    import time

    from nbx_tune.tuner.bench import for_profile
    from nbx_tune.tuner.executor import InProcess

    monkeypatch.setenv("NBX_TUNE_WORKER_PROFILE", str(tmp_path))
    profile = builtin_profiles()["interpreter"]
    spec, strategy = planted.SPEC, get_strategy("exhaustive")
    (job_a, seat_a), (job_b, seat_b) = _job(spec, 300, "a"), _job(spec, 700, "b")
    ex = Isolated(profile, precompile=True, prefetch=True)
    try:
        ex.expect(spec, job_b)
        got = [tune_seat(spec, profile, "a", seat_a, ex, strategy, "cpu")]
        path = ex.prepared[1]
        deadline = time.time() + 120  # the pool's process may still be importing torch
        while not Path(path).exists() and time.time() < deadline:
            time.sleep(0.1)
        got.append(tune_seat(spec, profile, "b", seat_b, ex, strategy, "cpu"))
        assert not Path(path).exists()  # the worker took it
    finally:
        ex.close()
    alone = [tune_seat(spec, profile, label, seat, InProcess(for_profile(profile)), strategy, "cpu")
             for label, seat in (("a", seat_a), ("b", seat_b))]
    for g, a in zip(got, alone):
        assert g.outcome == a.outcome == "certified"
        errs = lambda res: {r.config: [s.err for s in r.screens] for r in res.records}  # noqa: E731
        assert errs(g) == errs(a)  # the same inputs and oracles, whichever process made them
    calls = {fn: st[1] for (_, _, fn), st in pstats.Stats(str(next(tmp_path.glob("worker-*.prof")))).stats.items()}
    assert calls.get("host_cases") == 1 and calls.get("_load_cases") == 2


class _FakePool:
    def __init__(self):
        self.events = []

    def submit(self, kernel, problems, configs, device):
        self.events.append(("submit", len(configs)))

    def make_cases(self, kernel, job, path):
        self.events.append(("cases", job.label))

    def stop(self):
        self.events.append(("stop",))

    def join(self):
        self.events.append(("join",))

    def close(self):
        self.stop()
        self.join()


def test_the_pool_makes_the_upcoming_seats_cases_then_compiles_it_when_asked(monkeypatch):
    profile = builtin_profiles()["interpreter"]
    spec = planted.SPEC
    (job_a, seat_a), (job_b, seat_b) = _job(spec, 300, "a"), _job(spec, 700, "b")
    for asked in ("1", ""):
        monkeypatch.setenv("NBX_TUNE_PREFETCH", asked)
        ex = Isolated(profile, precompile=False)
        ex.precompiler = pool = _FakePool()
        try:
            ex.expect(spec, job_b, [planted.GOOD[0]])
            tune_seat(spec, profile, "a", seat_a, ex, get_strategy("exhaustive"), "cpu")
            assert pool.events[0] == ("submit", len(spec.configs()) - 1)  # a's own compiles first
            if asked:  # then b's cases, then b's compiles
                assert pool.events[1:3] == [("cases", "b"), ("submit", 1)] and ex.prepared[0] == job_b
            else:  # off by default: nothing of b's runs while a is timed
                assert pool.events[1:] == [] and ex.prepared is None
        finally:
            ex.close()
        assert pool.events[-2:] == [("stop",), ("join",)]


def test_a_stopped_precompiler_queues_nothing_and_its_processes_are_gone():
    from nbx_tune.tuner.precompile import Precompiler

    pool = Precompiler([], workers=1)
    pool.stop()
    pool.submit("matmul", (), [planted.GOOD[0]], "cpu")
    assert pool.submitted == set()
    pool.join()
    assert not any(p.is_alive() for p in pool.procs)

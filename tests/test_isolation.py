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


def test_a_prefetch_makes_the_same_cases_and_only_for_its_own_job():
    import numpy as np
    import pytest

    from nbx_tune.tuner.executor import host_cases
    from nbx_tune.tuner.isolation import _Prefetch

    job, _ = _job(planted.SPEC, 301)
    made = _Prefetch(planted.SPEC, job).take(job)
    direct = host_cases(planted.SPEC, job)
    assert [c.problem for c in made] == [c.problem for c in direct] == list(job.screen_problems)
    for a, b in zip(made, direct):  # same seeds: the same inputs and the same oracle
        assert all(bool((a.inputs[k] == b.inputs[k]).all()) for k in b.inputs)
        assert all(np.array_equal(a.ref[k], b.ref[k]) for k in b.ref)
    other, _ = _job(planted.SPEC, 302)
    assert _Prefetch(planted.SPEC, job).take(other) is None

    class Broken(type(planted.SPEC)):
        def make_inputs(self, problem, rng):
            raise MemoryError("no room for the inputs")

    with pytest.raises(MemoryError, match="no room"):
        _Prefetch(Broken(), job).take(job)


def test_the_upcoming_seat_is_made_while_the_current_one_runs(tmp_path, monkeypatch):
    """The worker makes the upcoming seat's cases on a side thread: its main thread (the
    one profiled) makes only the first seat's, and both seats certify as they do alone."""
    import pstats

    from nbx_tune.tuner.executor import InProcess
    from nbx_tune.tuner.bench import for_profile
    from nbx_tune.tuner.tune import static_prune

    monkeypatch.setenv("NBX_TUNE_WORKER_PROFILE", str(tmp_path))
    profile = builtin_profiles()["interpreter"]
    spec, strategy = planted.SPEC, get_strategy("exhaustive")
    (job_a, seat_a), (job_b, seat_b) = _job(spec, 300, "a"), _job(spec, 700, "b")
    ex = Isolated(profile)
    try:
        ex.expect(spec, job_b, static_prune(spec, profile, job_b.time_problem)[0])
        got = [tune_seat(spec, profile, "a", seat_a, ex, strategy, "cpu"),
               tune_seat(spec, profile, "b", seat_b, ex, strategy, "cpu")]
    finally:
        ex.close()
    alone = [tune_seat(spec, profile, label, seat, InProcess(for_profile(profile)), strategy, "cpu")
             for label, seat in (("a", seat_a), ("b", seat_b))]
    for g, a in zip(got, alone):
        assert g.outcome == a.outcome == "certified"
        errs = lambda res: {r.config: [s.err for s in r.screens] for r in res.records}  # noqa: E731
        assert errs(g) == errs(a)  # the same inputs and oracles, whichever thread made them
    calls = {fn: st[1] for (_, _, fn), st in pstats.Stats(str(next(tmp_path.glob("worker-*.prof")))).stats.items()}
    assert calls.get("host_cases") == 1 and calls.get("take") == 1

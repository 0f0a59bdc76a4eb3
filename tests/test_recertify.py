"""Re-certification and ranked searches, replayed: a fake executor answers screens and
timings from recorded measurements (no GPU, no launch), and records what it was asked, so
the tests see which configs were screened and timed.

A stale seat re-certified from its history times only its contenders when their new times
keep the old ranking, falls back to every candidate when they do not (or when none
survives), and never certifies a config it did not screen here. A ranked census times a
shortlist, audits a sample of seats in full and records the shortcut's loss there."""

import json
from types import SimpleNamespace

import pytest
from sqlalchemy import create_engine, text

from conftest import database_at
from nbx_tune.testing import planted
from nbx_tune.kernels.runtime.registry import register
from nbx_tune.kernels.spec import Config, Problem, seat_flags
from nbx_tune.profiles import DeviceInfo, get_profile
from nbx_tune.tuner.certify import recertify
from nbx_tune.tuner.timing.benchmarkers import Timing
from nbx_tune.tuner.execution.executor import Outcome
from nbx_tune.tuner.certify.recertify import Recertify, Seed
from nbx_tune.tuner.fleet.seat_tuner import SeatTuner
from nbx_tune.tuner.certify.screen import ScreenResult
from nbx_tune.tuner.store import Store
from nbx_tune.tuner.timing.strategies import Measured, get_strategy
from nbx_tune.tuner.search.ranked import AUDIT_RATE, Ranked, distance, label_fraction, shortcut_loss
from nbx_tune.tuner.certify.tune import NullReporter, tune_seat

PROFILE = get_profile("interpreter")
DEVICE = DeviceInfo("interpreter", "Triton interpreter (test)", "n/a")
CONFIGS = tuple(Config.make(BLOCK=b, V=v, num_warps=4, num_stages=1)
                for b in (16, 32, 64, 128, 256, 512, 1024, 2048) for v in (0, 1, 2))


class ReplaySpec(planted.DoubleSpec):
    """A kernel whose configs are only ever replayed, never launched."""

    name = "test_replay"
    ops = ("test.replay",)


SPEC = ReplaySpec(CONFIGS)
register(SPEC)


def key(block, v=0):
    return Config.make(BLOCK=block, V=v, num_warps=4, num_stages=1).key()


class Replay:
    """The executor interface, answered from `times` (config key -> ms, or a function of the
    seat's label); `fails` (config key -> reason) fail their screen."""

    generation = 0

    def __init__(self, times, fails=()):
        self.times, self.fails = times, dict(fails)
        self.compiled, self.screened, self.timed = [], [], []

    def start_seat(self, spec, job, configs=()):
        self.job = job
        self.compiled += [c.key() for c in configs]

    def precompile(self, configs):
        self.compiled += [c.key() for c in configs]

    def screen(self, config):
        self.screened.append(config.key())
        if config.key() in self.fails:
            return Outcome(screens=[], reason=self.fails[config.key()], detail="planted",
                           problem=self.job.time_problem)
        return Outcome(screens=[ScreenResult(p, 0.0, 1e-5) for p in self.job.screen_problems])

    def time(self, config, mode="full"):
        assert config.key() in self.screened, "timed before it was screened"
        self.timed.append(config.key())
        t = self.times(self.job.label) if callable(self.times) else self.times
        ms = t[config.key()]
        return Outcome(timing=Timing(ms, ms, ms, "replay"))

    def end_seat(self):
        pass


def base_times(scale=1.0):
    """Config key -> ms: BLOCK=256 fastest, then its neighbours; V adds a little."""
    out = {}
    for c in CONFIGS:
        b, v = c["BLOCK"], c["V"]
        out[c.key()] = scale * (1.0 + 0.25 * abs((b.bit_length() - 9)) + 0.02 * v)
    return out


def problem(n):
    return Problem("test_replay", ("float32",), seat_flags(), (n,))


PROBLEMS = [problem(1000), problem(900)]


# ----------------------------------------------------------------------------- unit level

def seed_of(times, contenders, gap):
    return Seed(7, "tuning 7 (test)", {k: times[k] for k in contenders}, tuple(contenders), gap,
                frozenset(c.key() for c in CONFIGS), SPEC.config_space_hash)


def test_ranking_holds_only_the_contenders_are_screened_and_timed():
    old = base_times()
    seed = seed_of(old, [key(256), key(256, 1), key(128)], gap=0.2)
    ex = Replay(base_times(0.7))  # a sibling device: everything 30 % faster, same order
    res = tune_seat(SPEC, PROFILE, "s", PROBLEMS, ex, get_strategy("pruned"), "cpu",
                    search=Recertify(seed, SPEC.config_space_hash))
    assert res.note.search == "recertified" and res.note.seeded_from == 7
    assert set(ex.screened) == set(ex.timed) == {key(256), key(256, 1), key(128)}
    assert set(ex.compiled) == {key(256), key(256, 1), key(128)}  # the pool compiles no other
    assert res.winner.config.key() == key(256)
    assert res.winner.timing.median_ms == pytest.approx(0.7)
    # Screened at every screen shape of the seat before it was certified.
    assert {s.problem for s in res.winner.screens} == set(PROBLEMS)


class Rounds(Replay):
    """Replay whose n-th timing of a config reads `series[key][n]` (else its replayed time),
    recording each timing's mode."""

    def __init__(self, times, series=None):
        super().__init__(times)
        self.series, self.modes, self.warmed = series or {}, [], []

    def time(self, config, mode="full"):
        if mode == "warm":  # thrown away: kept apart, it takes no reading of the series
            self.warmed.append((config.key(), len(self.modes)))
            return super().time(config, mode)
        self.modes.append((config.key(), mode))
        out = super().time(config, mode)
        n = sum(1 for k, _ in self.modes if k == config.key()) - 1
        ms = self.series.get(config.key(), [out.timing.median_ms] * 9)[n]
        return Outcome(timing=Timing(ms, ms, ms, "replay"))


def test_contenders_are_timed_in_rounds_that_stop_once_two_agree():
    # No quick estimates: one warm-up of the first contender, then two rounds each when
    # both put the same contender first.
    old = base_times()
    seed = seed_of(old, [key(256), key(128)], gap=0.2)
    ex = Rounds(base_times())
    res = tune_seat(SPEC, PROFILE, "s", PROBLEMS, ex, get_strategy("pruned"), "cpu",
                    search=Recertify(seed, SPEC.config_space_hash))
    assert res.note.search == "recertified" and "in 2 round(s)" in res.note.detail
    assert ex.warmed == [(key(256), 0)]  # the first contender, before the first round
    assert sorted(ex.modes) == sorted([(k, f"round:{recertify.ROUNDS}") for k in (key(256), key(128))] * 2)
    assert res.winner.timing.method.endswith("x2 rounds")
    # Rounds that disagree on the first (by more than a near tie) go on to ROUNDS, and the
    # medians decide.
    seed = seed_of(old, [key(256), key(256, 1)], gap=0.2)  # 1.0 and 1.02 then
    ex = Rounds(base_times(), {key(256): [1.0, 1.06, 1.0, 1.06], key(256, 1): [1.02] * 4})
    res = tune_seat(SPEC, PROFILE, "s", PROBLEMS, ex, get_strategy("pruned"), "cpu",
                    search=Recertify(seed, SPEC.config_space_hash))
    assert len(ex.modes) == 2 * recertify.ROUNDS and "in 4 round(s)" in res.note.detail
    assert res.note.search == "recertified"
    assert res.winner.config.key() == key(256, 1)  # the faster median: 1.02 against 1.03
    # Rounds that agree on a verdict that does not hold go on to ROUNDS before the fallback.
    ex = Rounds(base_times(), {key(256): [1.2] * 9, key(256, 1): [1.0] * 9})
    res = tune_seat(SPEC, PROFILE, "s", PROBLEMS, ex, get_strategy("pruned"), "cpu",
                    search=Recertify(seed, SPEC.config_space_hash))
    assert res.note.search == "fallback" and "faster than the old winner" in res.note.detail
    assert [m for _, m in ex.modes[:2 * recertify.ROUNDS]] == [f"round:{recertify.ROUNDS}"] * 2 * recertify.ROUNDS
    assert ex.modes[2 * recertify.ROUNDS][1] == "quick"  # then the census's own strategy, over every candidate
    # A contender far behind after the first round (over SLACK) is timed no more.
    seed = seed_of(old, [key(256), key(256, 1), key(64)], gap=0.2)  # BLOCK=64: 50 % behind
    ex = Rounds(base_times())
    res = tune_seat(SPEC, PROFILE, "s", PROBLEMS, ex, get_strategy("pruned"), "cpu",
                    search=Recertify(seed, SPEC.config_space_hash))
    assert [k for k, _ in ex.modes].count(key(64)) == 1 and [k for k, _ in ex.modes].count(key(256)) == 2
    far = next(r for r in res.records if r.config.key() == key(64))
    assert not far.final and far.timing.median_ms == pytest.approx(1.5) and res.note.search == "recertified"


class Events(Replay):
    """Replay that records screens and timings in one list, in the order asked."""

    def __init__(self, times, fails=()):
        super().__init__(times, fails)
        self.events = []

    def screen(self, config):
        self.events.append(("screen", config.key()))
        return super().screen(config)

    def time(self, config, mode="full"):
        self.events.append((mode, config.key()))
        return super().time(config, mode)


def test_a_full_tuning_takes_each_quick_estimate_as_its_config_is_screened():
    # While the compile pool builds the next configs, the worker estimates the last one it
    # screened; the strategy then uses those estimates, taking none again.
    ex = Events(base_times(), fails={key(16): "mismatch"})
    res = tune_seat(SPEC, PROFILE, "s", PROBLEMS, ex, get_strategy("pruned"), "cpu")
    quick = [k for m, k in ex.events if m == "quick"]
    assert sorted(quick) == sorted(c.key() for c in CONFIGS if c.key() != key(16))  # each once
    assert all(ex.events[i - 1] == ("screen", k) for i, (m, k) in enumerate(ex.events) if m == "quick")
    assert ex.events.index(("quick", key(2048, 2))) < ex.events.index(("screen", key(2048, 2))) + 2
    assert res.winner.config.key() == key(256) and res.winner.final
    assert {r.config.key() for r in res.records if r.reason == "mismatch"} == {key(16)}
    # A strategy with no quick estimates (exhaustive) is handed none: every timing is its own.
    ex = Events(base_times())
    tune_seat(SPEC, PROFILE, "s", PROBLEMS, ex, get_strategy("exhaustive"), "cpu")
    assert {m for m, _ in ex.events} == {"screen", "full"}
    assert ex.events.index(("full", key(16))) > ex.events.index(("screen", key(2048, 2)))


def test_a_quick_estimate_from_a_worker_that_died_since_is_taken_again():
    from nbx_tune.tuner.certify.tune import _Candidates, seat_job

    ex = Events(base_times())
    ex.start_seat(SPEC, seat_job(SPEC, PROFILE, "s", PROBLEMS, "cpu")[0])
    cands = _Candidates(ex, NullReporter(), "s")
    cands.screen_all([CONFIGS[0]], quick=True)
    ex.generation = 1  # the worker was replaced after the estimate
    assert cands.measure(CONFIGS[0], "quick") is not None
    assert [m for m, _ in ex.events] == ["screen", "quick", "quick"]


def test_a_recertifications_contenders_are_compiled_ahead_at_the_confirm_shapes_too():
    # The worker would otherwise compile the winner and runner-up at the seat's other shapes
    # (other specializations: a bucket's odd bottom edge) itself, one after the other.
    from nbx_tune.tuner.execution.isolation import Isolated
    from nbx_tune.tuner.search.searches import Full
    from nbx_tune.tuner.certify.tune import first_compiles

    class Pool:
        def __init__(self):
            self.jobs = []

        def submit(self, kernel, problems, configs, device, priority):
            self.jobs += [(tuple(problems), c.key()) for c in configs]

    seen = [problem(1000), problem(950), problem(900)]
    seed = seed_of(base_times(), [key(256), key(128)], gap=0.2)
    job, first = first_compiles(SPEC, PROFILE, "s", seen, "cpu", Recertify(seed, SPEC.config_space_hash))
    assert job.compile_confirm and problem(950) in job.confirm_problems
    iso = Isolated.__new__(Isolated)
    iso.precompiler, iso.spec, iso.job = Pool(), SPEC, job
    iso.prefetch(SPEC, job, first)
    assert {k for _, k in iso.precompiler.jobs} == {key(256), key(128)}
    assert all(set(job.confirm_problems) <= set(ps) for ps, _ in iso.precompiler.jobs)
    # A search widening to the whole space (a fallback) compiles the rest at the screen shapes only,
    iso.precompiler.jobs.clear()
    iso.precompile([c for c in CONFIGS if c.key() not in (key(256), key(128))])
    assert len(iso.precompiler.jobs) == len(CONFIGS) - 2
    assert not any(problem(950) in ps for ps, _ in iso.precompiler.jobs)
    # and so does every other search.
    job, first = first_compiles(SPEC, PROFILE, "s", seen, "cpu", Full())
    iso.precompiler.jobs.clear()
    iso.prefetch(SPEC, job, first)
    assert not job.compile_confirm and not any(problem(950) in ps for ps, _ in iso.precompiler.jobs)


def test_each_shapes_fp64_oracle_is_computed_once_a_seat_whatever_the_contenders():
    # Launched for real (the interpreter): the oracle is made once per screen shape, when
    # the seat's cases are, and every contender and both screens (base, confirm) reuse it.
    from nbx_tune.tuner.execution.executor import InProcess

    def same_time(fn, mode="full"):
        fn()
        return Timing(1.0, 1.0, 1.0, "fixed")

    class Counted(planted.DoubleSpec):
        calls = []

        def oracle(self, problem, inputs):
            self.calls.append(problem)
            return super().oracle(problem, inputs)

    spec = Counted(configs=(planted.cfg(32), planted.cfg(64), planted.cfg(128), planted.cfg(256)))
    seen = [Problem("test_double", ("float32",), seat_flags(), (n,)) for n in (300, 290, 280)]
    keys = [c.key() for c in spec.configs()[:3]]
    seed = Seed(None, "t", {k: 1.0 + 0.01 * i for i, k in enumerate(keys)}, tuple(keys), 0.5,
                None, spec.config_space_hash)
    res = tune_seat(spec, PROFILE, "double", seen, InProcess(same_time), get_strategy("pruned"), "cpu",
                    search=Recertify(seed, spec.config_space_hash))
    job, _ = recertify_job(spec, seen)
    shapes = (*job.screen_problems, *job.confirm_problems)
    assert res.note.search == "recertified" and len(set(shapes)) == len(shapes) == 3
    assert sorted(Counted.calls, key=Problem.order) == sorted(shapes, key=Problem.order)
    # ... though three contenders were screened, and two confirmed at every other shape.
    assert sum(1 for r in res.records if r.screens) == 3
    assert {s.problem for s in res.winner.screens} == set(shapes)


def recertify_job(spec, seen):
    from nbx_tune.tuner.certify.tune import seat_job

    return seat_job(spec, PROFILE, "double", seen, "cpu")


def test_the_compile_pool_builds_launchers_and_loads_nothing(monkeypatch):
    # The pool builds Triton's per-signature launcher where it has one (cached, so the
    # worker's first launch of a contender finds it) but loads no binary and asks for no
    # stream: either makes a GPU context, which costs a process more than its first compile.
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from nbx_tune.tuner.execution import precompile

    loaded, built, warmups = [], [], []

    class Compiled:
        src, metadata = "the source", "its metadata"

        def _init_handles(self):
            loaded.append(self)

    class Driver:
        def launcher_cls(self, src, metadata):
            built.append((src, metadata))

    def run(self, *args, grid, warmup, **kwargs):
        warmups.append(warmup)
        return Compiled()

    def kernel(x):
        pass

    monkeypatch.setattr(JITFunction, "__getitem__", JITFunction.__getitem__)  # restored after the test
    monkeypatch.setattr(JITFunction, "run", run)
    fake = Driver()
    fake.get_current_stream = lambda device: 1234  # torch's: asking makes the GPU's context
    monkeypatch.setattr(driver, "_active", fake, raising=False)
    monkeypatch.setattr(type(driver), "active", property(lambda self: self._active), raising=False)
    precompile._compile_only()
    got = JITFunction(kernel)[(4,)](1)
    assert warmups == [True] and isinstance(got, Compiled)
    assert built == [("the source", "its metadata")] and loaded == []
    assert fake.get_current_stream(0) == 0  # nothing launches, so no stream is asked for


def test_the_compile_pool_puts_a_gpu_seat_on_meta_tensors(monkeypatch):
    # Triton specializes on dtypes and alignments, which meta tensors carry: no GPU memory,
    # and no GPU context, is needed to compile a GPU seat's configs.
    import torch

    from nbx_tune.kernels.runtime import registry
    from nbx_tune.tuner.execution import precompile

    seen = []

    class Spec:
        def input_shapes(self, p):
            return {"a": ((3, 5), "float16")}

        def output_specs(self, p):
            return {"c": ((3,), "float32")}

        def launch(self, config, p, inputs, outputs):
            seen.append({k: (t.device.type, tuple(t.shape), t.dtype) for k, t in {**inputs, **outputs}.items()})

    monkeypatch.setattr(registry, "get_spec", lambda name: Spec())
    assert precompile._compile("k", ["p"], None, "cuda") is None
    assert precompile._compile("k", ["p"], None, "cpu") is None
    want = {"a": ((3, 5), torch.float16), "c": ((3,), torch.float32)}
    assert [{k: v[0] for k, v in s.items()} for s in seen] == [{"a": "meta", "c": "meta"}, {"a": "cpu", "c": "cpu"}]
    assert all({k: v[1:] for k, v in s.items()} == want for s in seen)


def test_ranking_broken_falls_back_to_every_candidate():
    old = base_times()
    seed = seed_of(old, [key(256), key(256, 1), key(128)], gap=0.2)
    new = base_times()
    new[key(256)] *= 1.6  # the old winner slowed down far more than its neighbours
    new[key(1024, 2)] = 0.5  # and a config left out is now the fastest
    ex = Replay(new)
    res = tune_seat(SPEC, PROFILE, "s", PROBLEMS, ex, get_strategy("pruned"), "cpu",
                    search=Recertify(seed, SPEC.config_space_hash))
    assert res.note.search == "fallback" and "no longer holds" in res.note.detail
    assert set(ex.screened) == {c.key() for c in CONFIGS}  # everything screened, once each
    assert len(ex.screened) == len(CONFIGS)
    assert res.winner.config.key() == key(1024, 2)


def test_no_contender_survives_the_screen_falls_back_and_certifies_only_screened():
    old = base_times()
    seed = seed_of(old, [key(256), key(128)], gap=0.2)
    ex = Replay(base_times(), fails={key(256): "wrong_answer", key(128): "unwritten_output"})
    res = tune_seat(SPEC, PROFILE, "s", PROBLEMS, ex, get_strategy("exhaustive"), "cpu",
                    search=Recertify(seed, SPEC.config_space_hash))
    assert res.note.search == "fallback" and "survived" in res.note.detail
    assert res.winner.config.key() not in (key(256), key(128))
    assert res.winner.config.key() in ex.screened
    reasons = {r.config.key(): r.reason for r in res.records}
    assert reasons[key(256)] == "wrong_answer" and reasons[key(128)] == "unwritten_output"


def test_new_configs_in_the_space_are_contenders_and_too_many_mean_a_full_tune():
    old = base_times()
    known = frozenset(c.key() for c in CONFIGS[:-2])  # two configs joined the space since
    seed = Seed(7, "t", {key(256): old[key(256)], key(128): old[key(128)]}, (key(256), key(128)),
                0.2, known, "old-space")
    first, why = Recertify(seed, SPEC.config_space_hash).plan(list(CONFIGS))
    assert why is None and {c.key() for c in first} == {key(256), key(128)} | {c.key() for c in CONFIGS[-2:]}
    seed = Seed(7, "t", seed.old_ms, seed.contenders, 0.2, frozenset(c.key() for c in CONFIGS[:5]), "old")
    first, why = Recertify(seed, SPEC.config_space_hash).plan(list(CONFIGS))
    assert first == [] and "new since the seed" in why


def test_loss_bound_reads_the_pace_of_the_contenders():
    seed = Seed(1, "t", {"a": 1.0, "b": 1.05}, ("a", "b"), 0.10, None, "h")
    assert recertify.loss_bound(seed, {"a": 0.7, "b": 0.735}) == pytest.approx(1 / 1.1 - 1)
    # a got 20 % slower against b: a config left out 10 % behind could have moved as much.
    assert recertify.loss_bound(seed, {"a": 1.2, "b": 1.05}) == pytest.approx(1.05 * 1.2 / 1.1 - 1)
    assert recertify.loss_bound(seed, {"a": 1.2, "b": 1.05}) > recertify.TOLERANCE
    assert recertify.loss_bound(seed, {"c": 1.0}) is None  # nothing comparable was timed


def test_shortcut_loss_and_ranking_distance():
    a, b, c = (Config.make(X=i) for i in range(3))

    def m(cfg, ms, final=True):
        return SimpleNamespace(config=cfg, timing=Timing(ms, ms, ms, "r"), final=final)

    assert shortcut_loss([b, c], [m(a, 1.0), m(b, 1.1), m(c, 2.0, False)]) == pytest.approx(0.1)
    assert shortcut_loss([a], [m(a, 1.0), m(b, 1.1)]) == 0.0
    near = distance(("float32", "", "n=993..1024"), ("float32", "", "n=993..1024"))
    far = distance(("float32", "", "n=993..1024"), ("float16", "", "n=16001..16384"))
    assert near == 0 and far > 4


# ----------------------------------------------------------------------------- with a store

def plan_seats(store, sizes):
    trace = SimpleNamespace(path="t.tsv", rows=[None] * len(sizes), launches=len(sizes))
    seats = {}
    for n in sizes:
        bucket = f"n={n}"
        seats[("test_replay", "float32", "", bucket)] = {problem(n): 1}
    run_id, ids = store.record_census(trace, f"sha-{sizes}", PROFILE.name, seats)
    return run_id, [ids[("test_replay", "float32", "", f"n={n}")] for n in sizes]


def tune(tuner, run_id, sid, n):
    assert tuner.store.claim(sid, tuner.holder, 60)
    return tuner.tune_claimed(sid, "test_replay", f"test_replay|float32||n={n}", 0, 1, run_id, NullReporter())


def last(url, sql):
    with create_engine(url).connect() as c:
        return c.execute(text(sql)).fetchall()


def test_stale_seat_is_recertified_from_its_history_and_the_table_carries_it(db_url, tmp_path):
    from nbx_tune.tuner.store.export import check_table, export_table, import_table

    store = Store(db_url)
    run_id, (sid,) = plan_seats(store, [1000])
    ex = Replay(base_times())
    tuner = SeatTuner(store, PROFILE, DEVICE, ex, get_strategy("pruned"))
    assert tune(tuner, run_id, sid, 1000) == "tuned"
    assert last(db_url, "SELECT search FROM tunings") == [("full",)]
    assert len(set(ex.screened)) == len(CONFIGS)
    # The kernel's source changes: every certificate of it goes stale.
    with create_engine(db_url).begin() as c:
        c.execute(text("UPDATE tunings SET kernel_source_hash = 'before'"))
    ex.screened.clear(), ex.timed.clear()
    # The census's report says so, and from which tuning (as `show` does): it said "tuned".
    assert tune(tuner, run_id, sid, 1000) == "re-certified"
    assert tuner.recertified_from[sid].startswith("tuning 1 ")
    (search, seeded), = last(db_url, "SELECT search, seeded_from FROM tunings ORDER BY id DESC LIMIT 1")
    assert search == "recertified" and seeded == 1
    assert 2 <= len(set(ex.screened)) <= recertify.MAX_CONTENDERS + 1 < len(CONFIGS)
    (cfg, csearch, frm), = last(db_url, "SELECT config, search, recertified_from FROM certificates "
                                        "WHERE superseded_at IS NULL")
    assert cfg == key(256) and csearch == "recertified" and frm.startswith("tuning 1 ")
    assert cfg in ex.screened
    # An exported table carries it, and an import keeps it.
    summary = export_table(store, PROFILE, tmp_path / "t.json")
    assert summary.entries == 1
    prov = json.loads((tmp_path / "t.json").read_text())["entries"][0]["provenance"]
    assert prov["search"] == "recertified" and prov["recertified_from"].startswith("tuning 1 ")
    other = Store(f"sqlite:///{tmp_path / 'other.db'}")
    import_table(other, check_table(tmp_path / "t.json", {PROFILE.name: PROFILE}))
    assert last(other.url, "SELECT search, recertified_from FROM certificates")[0][0] == "recertified"
    store.close(), other.close()


def test_a_sibling_devices_table_is_served_then_recertified_with_this_devices_timings(db_url, tmp_path):
    from nbx_tune.tuner.census.census import SeatLine
    from nbx_tune.tuner.store.export import check_table, export_table, import_table

    made = Store(f"sqlite:///{tmp_path / 'made.db'}")
    run_id, (sid,) = plan_seats(made, [1000])
    sibling = DeviceInfo("interpreter", "a sibling device", "n/a")
    assert tune(SeatTuner(made, PROFILE, sibling, Replay(base_times()), get_strategy("pruned")), run_id, sid, 1000)
    export_table(made, PROFILE, tmp_path / "sibling.json")
    store = Store(db_url)
    import_table(store, check_table(tmp_path / "sibling.json", {PROFILE.name: PROFILE}))
    run_id, (sid,) = plan_seats(store, [1000])
    ex = Replay(base_times(0.5))
    tuner = SeatTuner(store, PROFILE, DEVICE, ex, get_strategy("pruned"))
    line = SeatLine(sid, "test_replay|float32||n=1000", "test_replay", "certified", "", 1, 1)
    assert tuner.todo([line]) == [line]  # served (certified), and wanted for re-timing here
    assert tune(tuner, run_id, sid, 1000)
    rows = last(db_url, "SELECT c.median_ms, c.search, t.device_name FROM certificates c "
                        "JOIN tunings t ON t.id = c.tuning_id WHERE c.superseded_at IS NULL")
    assert rows == [(pytest.approx(0.5), "recertified", DEVICE.name)]
    assert set(ex.screened) < {c.key() for c in CONFIGS}
    assert tuner.todo([line]) == []  # timed here now: nothing more to do
    made.close(), store.close()


def test_a_ranked_census_times_a_shortlist_and_audits_a_sample(db_url, tmp_path):
    from nbx_tune.tuner import commands as api
    from nbx_tune.tuner.store.export import export_table

    store = Store(db_url)
    sizes = [1000, 1100, 1200, 1300]
    run_id, sids = plan_seats(store, sizes)
    ex = Replay(base_times())
    tuner = SeatTuner(store, PROFILE, DEVICE, ex, get_strategy("pruned"))
    screened = []
    for sid, n in zip(sids, sizes):
        ex.screened.clear()
        assert tune(tuner, run_id, sid, n)
        screened.append(len(ex.screened))
    searches = [r[0] for r in last(db_url, "SELECT search FROM tunings ORDER BY id")]
    # No history: in full; then the first audit (every candidate, the shortcut's loss kept);
    # then shortlists, unless the label's hash draws an audit.
    assert searches[0] == "full" and searches[1] == "audit"
    assert screened[0] == screened[1] == len(CONFIGS)
    for s, n in zip(searches[2:], screened[2:]):
        assert (s, n) in (("ranked", 12), ("audit", len(CONFIGS)))
    assert "ranked" in searches
    losses = [r[0] for r in last(db_url, "SELECT shortcut_loss FROM tunings WHERE search = 'audit'")]
    assert losses and all(x == 0.0 for x in losses)  # the same ranking at every seat
    certs = last(db_url, "SELECT config FROM certificates WHERE superseded_at IS NULL")
    assert {c for (c,) in certs} == {key(256)}
    shown = api.show_seat(str(sids[-1]), db=db_url)
    assert shown["sampled_regret"]["audits"] == len(losses) and shown["sampled_regret"]["max"] == 0.0
    assert shown["history"][-1]["search"] in ("ranked", "audit")
    export_table(store, PROFILE, tmp_path / "t.json")
    for e in json.loads((tmp_path / "t.json").read_text())["entries"]:
        assert e["provenance"]["sampled_regret"] == shown["sampled_regret"]
    store.close()


def test_full_mode_turns_the_shortcuts_off(db_url, monkeypatch):
    monkeypatch.setenv("NBX_TUNE_SEARCH", "full")
    store = Store(db_url)
    run_id, sids = plan_seats(store, [1000, 1100])
    ex = Replay(base_times())
    tuner = SeatTuner(store, PROFILE, DEVICE, ex, get_strategy("exhaustive"))
    for sid, n in zip(sids, [1000, 1100]):
        assert tune(tuner, run_id, sid, n)
    assert last(db_url, "SELECT search FROM tunings") == [("full",), ("full",)]
    assert len(ex.screened) == 2 * len(CONFIGS)
    store.close()


def test_ranked_prior_prefers_what_won_nearby():
    prior = [(("float32", "", "n=1000"), [(key(256), 1.0), (key(128), 1.2), (key(16), 3.0), (key(32), 2.0)],
              [(key(2048), "wrong_answer")]),
             (("float32", "", "n=1000000"), [(key(16), 1.0), (key(256), 2.0), (key(128), 2.0), (key(32), 2.0)], [])]
    r = Ranked("x", ("float32", "", "n=1100"), prior, audit=False)
    order = [c.key() for c in r.order(list(CONFIGS))]
    assert order[0] == key(256) and order.index(key(2048)) == 4  # refused nearby: last of the known
    short = r.shortlist(list(CONFIGS))
    assert len(short) == 5 + 4 and short[:2] == [Config.parse(key(256)), Config.parse(key(128))]


def test_only_near_seats_rank_and_a_seat_with_none_is_tuned_in_full():
    # A decode GEMM must not be ranked by prefill GEMMs alone: their tiles lose 2x there.
    far = [(("float32", "", "n=1000"), [(key(256), 1.0), (key(128), 1.2), (key(16), 3.0), (key(32), 2.0)], [])]
    assert not Ranked("x", ("float32", "", "n=8"), far, audit=False).informed
    near = far + [(("float32", "", "n=16"), [(key(16), 1.0), (key(32), 1.1), (key(128), 2.0), (key(256), 3.0)], [])]
    r = Ranked("x", ("float32", "", "n=8"), near, audit=False)
    assert r.informed and r.order(list(CONFIGS))[0].key() == key(16)


def test_a_shipped_tables_near_seats_rank_a_seat_the_database_knows_nothing_near():
    # Shipped entries name a winner and a runner-up: votes, the most voted first.
    table = [(("float32", "", "n=1000"), key(128), key(256)), (("float32", "", "n=1200"), key(128), key(64)),
             (("float32", "", "n=900"), key(32), None), (("float32", "", "n=1000000"), key(16), key(2048))]
    r = Ranked("x", ("float32", "", "n=1100"), [], audit=False, shipped=table)
    assert r.informed and "shipped table" in r.source
    assert r.best(3) == (key(128), key(32), key(64))  # n=1000000 is too far to vote
    short = r.shortlist(list(CONFIGS))
    assert short[:4] == [Config.parse(k) for k in (key(128), key(32), key(64), key(256))]
    assert Config.parse(key(16)) not in short[:4] and len(short) == 4 + 4
    assert not Ranked("x", ("float32", "", "n=8"), [], audit=False, shipped=table[3:]).informed


def test_the_databases_ranking_leads_and_the_shipped_tables_adds_a_few():
    from nbx_tune.tuner.search.ranked import SHIPPED_EXTRA, TOP

    prior = [(("float32", "", "n=1000"), [(key(b), 1.0 + i / 10) for i, b in enumerate((256, 128, 64, 32, 16))], [])]
    # BLOCK=32 scored outside the top 3 and got a runner-up's vote: the most voted go first.
    table = [(("float32", "", "n=1100"), key(512), None), (("float32", "", "n=1100"), key(2048), None),
             (("float32", "", "n=1000"), key(1024), key(32))]
    r = Ranked("x", ("float32", "", "n=1100"), prior, audit=False, shipped=table)
    short = r.shortlist(list(CONFIGS), top_n=3)
    assert short[:3] == [Config.parse(key(b)) for b in (256, 128, 64)]  # the database's scores first
    assert short[3:3 + SHIPPED_EXTRA] == [Config.parse(key(b)) for b in (512, 2048, 1024)][:SHIPPED_EXTRA]
    assert TOP >= 3


def test_a_fresh_census_is_ranked_by_the_shipped_table_but_never_by_its_own_entry(db_url, monkeypatch):
    from nbx_tune.tuner.search import seat_search

    own = {"config": key(16), "runner_up": key(32)}
    near = {"config": key(256), "runner_up": key(128)}
    monkeypatch.setattr(seat_search, "shipped", lambda name: {("test_replay", "float32", "", "n=1000"): own,
                                                              ("test_replay", "float32", "", "n=1100"): near})
    monkeypatch.setenv("NBX_TUNE_SEARCH", "ranked")
    store = Store(db_url)
    _, (sid,) = plan_seats(store, [1000])
    rec = store.seat_records(seat_ids=[sid])[0]
    search = seat_search.for_seat(store, rec, SPEC, PROFILE)
    assert search.name == "ranked" and search.votes.keys() == {key(256), key(128)}
    # A cold census (the votes' baseline) knows only its database: nothing near, every candidate.
    monkeypatch.setenv("NBX_TUNE_SEARCH", "cold")
    assert seat_search.for_seat(store, rec, SPEC, PROFILE).name == "full"
    store.close()


def test_a_shipped_tables_entry_seeds_a_seat_the_database_never_saw(db_url, monkeypatch):
    from nbx_tune.tuner.search import seat_search

    old = base_times(2.0)  # made on a slower sibling, under another Triton
    entry = {"config": key(256), "median_ms": old[key(256)], "runner_up": key(256, 1),
             "runner_up_ms": old[key(256, 1)], "margin": 0.02,
             "provenance": {"device_name": "a sibling", "triton_version": "0.0", "kernel_source_hash": "x",
                            "config_space_hash": SPEC.config_space_hash}}
    monkeypatch.setattr(seat_search, "shipped", lambda name: {("test_replay", "float32", "", "n=1000"): entry})
    store = Store(db_url)
    run_id, (sid,) = plan_seats(store, [1000])
    ex = Replay(base_times())
    assert tune(SeatTuner(store, PROFILE, DEVICE, ex, get_strategy("pruned")), run_id, sid, 1000)
    assert set(ex.screened) == {key(256), key(256, 1)}
    (search, frm), = last(db_url, "SELECT search, recertified_from FROM certificates")
    assert search == "recertified" and frm.startswith("shipped table interpreter.json (a sibling")
    # The same seat under NBX_TUNE_SEARCH=ranked (a fresh census) ignores the table.
    monkeypatch.setenv("NBX_TUNE_SEARCH", "ranked")
    assert seat_search.for_seat(store, store.seat_records(seat_ids=[sid])[0], SPEC, PROFILE).name != "recertified"
    store.close()


def test_a_shortlists_ranking_is_recertified_beside_what_won_at_near_seats(db_url, monkeypatch):
    # A shipped entry found by a ranked search never timed most of the space: if its
    # shortlist missed the best config, re-timing its pair would keep the miss for ever.
    from nbx_tune.tuner.search import seat_search

    # BLOCK=16 wins everywhere, the entry never saw it; it is only a little ahead, so the
    # ranking is kept, with it (far ahead, the seat is tuned in full: the judge's tests).
    times = {**base_times(), key(16): 0.995}
    entry = {"config": key(256), "median_ms": 1.0, "runner_up": key(256, 1), "runner_up_ms": 1.02,
             "margin": 0.02,
             "provenance": {"device_name": "a sibling", "triton_version": "0.0", "kernel_source_hash": "x",
                            "config_space_hash": SPEC.config_space_hash, "search": "ranked"}}
    monkeypatch.setattr(seat_search, "shipped", lambda name: {("test_replay", "float32", "", "n=1000"): entry})
    store = Store(db_url)
    run_id, (near, sid) = plan_seats(store, [1100, 1000])
    tuner = SeatTuner(store, PROFILE, DEVICE, Replay(times), get_strategy("pruned"))
    assert tune(tuner, run_id, near, 1100)  # no history, not shipped: every candidate
    ex = Replay(times)
    assert tune(SeatTuner(store, PROFILE, DEVICE, ex, get_strategy("pruned")), run_id, sid, 1000)
    assert key(16) in ex.screened and len(set(ex.screened)) <= 2 + recertify.EXPLORE < len(CONFIGS)
    (cfg, search), = last(db_url, "SELECT c.config, c.search FROM certificates c JOIN seats s ON s.id = c.seat_id "
                                  "WHERE s.bucket = 'n=1000'")
    assert (cfg, search) == (key(16), "recertified")
    # A ranking of the whole space is trusted: its contenders alone are timed.
    assert not recertify.seed_from_entry(entry, "t").complete
    entry["provenance"]["search"] = "full"
    assert recertify.seed_from_entry(entry, "t").complete
    rec = seat_search.for_seat(store, store.seat_records(seat_ids=[near])[0], SPEC, PROFILE)
    assert rec.name == "recertified" and rec.explore == ()  # its history: a full tuning
    store.close()


def test_upgrading_a_0002_database_keeps_its_certificates_as_found_by_full_searches(db_url):
    from nbx_tune.tuner.commands import db_upgrade

    database_at(db_url, "0002", "test_replay", "tune")
    db_upgrade(db_url)
    assert last(db_url, "SELECT c.config, c.search, c.recertified_from, t.search, t.seeded_from FROM certificates c "
                        "JOIN tunings t ON t.id = c.tuning_id") == [("BLOCK=256", "full", None, "full", None)]
    assert last(db_url, "SELECT count(*) FROM certified_configs") == [(1,)]


def test_configs_that_failed_wherever_they_ran_are_never_sampled():
    timed = [(key(b, v), 1.0 + 0.1 * i) for i, (b, v) in enumerate([(256, 0), (128, 0), (512, 0), (64, 0)])]
    failed = [(c.key(), "compile_error") for c in CONFIGS if c["BLOCK"] >= 1024]
    r = Ranked("x", ("float32", "", "n=1000"), [(("float32", "", "n=1000"), timed, failed)], audit=False)
    short = {c.key() for c in r.shortlist(list(CONFIGS), top_n=4, sample_n=50)}
    assert not any(Config.parse(k)["BLOCK"] >= 1024 for k in short)
    assert len(short) == len(CONFIGS) - len(failed)  # every other config fits in the sample
    assert len(r.order(list(CONFIGS))) == len(CONFIGS)  # an audit still evaluates them all



def test_a_ranked_shortlist_may_settle_early_but_an_audit_runs_every_round():
    timed = [(key(b, v), 1.0 + 0.1 * i) for i, (b, v) in enumerate([(256, 0), (128, 0), (512, 0), (64, 0)])]
    prior = [(("float32", "", "n=1000"), timed, [])]
    asked = []

    def evaluate(configs, timing=None, settle=False):
        asked.append((len(configs), settle))
        return [Measured(c, Timing(1.0, 1.0, 1.0, "t"), True) for c in configs]

    Ranked("x", ("float32", "", "n=1000"), prior, audit=False).run(list(CONFIGS), evaluate)
    Ranked("x", ("float32", "", "n=1000"), prior, audit=True).run(list(CONFIGS), evaluate)
    assert asked[0][1] is True and asked[0][0] < len(CONFIGS)  # the shortlist: settles
    assert asked[1] == (len(CONFIGS), False)  # the audit: the whole space, every round

# ----------------------------------------------------------------------------- noise-aware verdicts
# Synthetic timings as do_bench gives them: a median, the p20..p80 band of its launches and
# the spread of its rounds; CUDA events tick at RESOLUTION_MS["do_bench"].

def timed(cfg, ms, band=0.0, rounds=0.0, final=True):
    return SimpleNamespace(config=Config.parse(cfg), final=final,
                           timing=Timing(ms, ms * (1 - band), ms * (1 + band), "do_bench+lead(rep=25ms) x4 rounds",
                                         rounds))


def shipped_seed(w_ms, r_ms, band=None):
    """A seed as a shipped entry gives it: its winner (W) and runner-up (R), the margin the gap."""
    e = {"config": key(256), "median_ms": w_ms, "runner_up": key(128), "runner_up_ms": r_ms,
         "margin": r_ms / w_ms - 1,
         "spread_ms": [w_ms * (1 - band), w_ms * (1 + band)] if band is not None else [w_ms, w_ms],
         "provenance": {"device_name": "H200", "triton_version": "3.6.0", "kernel_source_hash": "x",
                        "config_space_hash": SPEC.config_space_hash, "search": "full"}}
    return recertify.seed_from_entry(e, "shipped table")


def test_timing_noise_is_the_widest_of_band_rounds_and_the_timers_resolution():
    from nbx_tune.tuner.timing.benchmarkers import RESOLUTION_MS, combine, noise

    assert noise(Timing(1.0, 0.98, 1.04, "do_bench")) == pytest.approx(0.03)
    assert noise(Timing(1.0, 1.0, 1.0, "do_bench", rounds_spread=0.1)) == pytest.approx(0.05)
    # A 4 us kernel timed with no spread at all is still only known to the events' tick.
    assert noise(Timing(0.004, 0.004, 0.004, "do_bench")) == pytest.approx(RESOLUTION_MS["do_bench"] / 0.004)
    assert noise(Timing(1.0, 1.0, 1.0, "replay")) == 0.0
    t = combine([Timing(m, m, m, "do_bench") for m in (1.0, 1.1, 0.9, 1.0)])
    assert t.median_ms == pytest.approx(1.0) and t.rounds_spread == pytest.approx(0.2)


def test_sub_noise_moves_on_a_microsecond_seat_do_not_break_the_ranking():
    # A 4 us element-wise seat: W 4.0 us, R 4.2 us then; now W reads 4.6 us and R 4.3 us,
    # each +-4 % between launches and the events tick at 0.5 us.
    seed = shipped_seed(0.0040, 0.0042, band=0.04)
    got = [timed(key(256), 0.0046, 0.04, 0.05), timed(key(128), 0.0043, 0.04, 0.05)]
    finals = {m.config.key(): m.timing.median_ms for m in got}
    assert recertify.loss_bound(seed, finals) > recertify.TOLERANCE  # read without noise: broken
    v = recertify.judge(seed, got)
    assert v.holds and v.bound <= recertify.TOLERANCE and "within noise" in v.why


def test_a_real_rank_change_falls_back_though_noise_is_allowed_for():
    # A 1 ms GEMM timed to +-0.3 %: R is now 12 % faster than the old winner. That is no noise.
    seed = shipped_seed(1.00, 1.02, band=0.003)
    v = recertify.judge(seed, [timed(key(256), 1.10, 0.003), timed(key(128), 0.98, 0.003)])
    assert not v.holds and "faster than the old winner" in v.why
    # The same move on the microsecond seat above is within what its timer can tell apart.
    seed = shipped_seed(0.0040, 0.00408, band=0.04)
    assert recertify.judge(seed, [timed(key(256), 0.0044, 0.04), timed(key(128), 0.0039, 0.04)]).holds


def test_moves_beyond_noise_still_bound_what_a_config_left_out_could_gain():
    # W stays, R (30 % behind then) closes up to 1 %: configs left out 30 % behind could
    # have closed up as much and now beat W. Precise timings: the move counts in full.
    seed = shipped_seed(1.0, 1.3, band=0.002)
    v = recertify.judge(seed, [timed(key(256), 1.0, 0.002), timed(key(128), 1.01, 0.002)])
    assert not v.holds and v.bound > recertify.TOLERANCE and "a config left out" in v.why
    # Nothing comparable timed (the old pair failed its screen): no verdict but a full tune.
    v = recertify.judge(seed, [timed(key(64), 1.0)])
    assert not v.holds and "no old contender survived" in v.why


def test_an_explored_config_well_ahead_says_the_old_ranking_missed_configs():
    # A shortlist ranked elsewhere: W and R 0.1 % apart then, and still level here; a near
    # seat's winner X, which the old ranking left out, now reads 5 % ahead of them. Configs
    # it left out can move that far: others may be as far ahead again.
    seed = shipped_seed(1.0, 1.001, band=0.002)
    pair = [timed(key(256), 1.0, 0.002), timed(key(128), 1.0, 0.002)]
    ahead = pair + [timed(key(64), 0.95, 0.002)]
    v = recertify.judge(seed, ahead, explored=(key(64),))
    assert not v.holds and v.bound > 0.04 and "a config left out" in v.why
    # A config the space gained (not explored) says nothing of the old ranking: it is picked.
    assert recertify.judge(seed, ahead).holds
    # X ahead within tolerance: picked, and the bound says how far the old ranking moved.
    v = recertify.judge(seed, pair + [timed(key(64), 0.98, 0.002)], explored=(key(64),))
    assert v.holds and 0.005 < v.bound <= recertify.TOLERANCE and key(64) in v.why
    # X behind: how far behind it was then is not known, so it bounds nothing.
    behind = pair + [timed(key(64), 1.5, 0.002)]
    assert recertify.judge(seed, behind, explored=(key(64),)).bound == pytest.approx(recertify.judge(seed, behind).bound)
    # The old runner-up 50 % behind, X 1 % behind the old winner: the shortlist never
    # timed X, so the old gap says nothing of it, and X has not moved ahead.
    wide = shipped_seed(1.0, 1.5, band=0.002)
    v = recertify.judge(wide, [timed(key(256), 1.0, 0.002), timed(key(128), 1.5, 0.002),
                               timed(key(64), 1.01, 0.002)], explored=(key(64),))
    assert v.holds and v.bound <= 0
    # X 5 % ahead but timed +-4 % on a microsecond seat: within what the timer can tell apart.
    seed = shipped_seed(0.0040, 0.004004, band=0.04)
    noisy = [timed(key(256), 0.0040, 0.04), timed(key(128), 0.0040, 0.04), timed(key(64), 0.0038, 0.04)]
    assert recertify.judge(seed, noisy, explored=(key(64),)).holds


def test_a_noisy_seat_is_recertified_and_the_certificate_says_why(db_url):
    # Whole-seat level: the seat's history is a full tuning; after a source change its
    # contenders re-time within noise of each other but in another order.
    class Noisy(Replay):
        def time(self, config, mode="full"):
            out = super().time(config, mode)
            ms = out.timing.median_ms
            return Outcome(timing=Timing(ms, ms * 0.93, ms * 1.07, "do_bench+lead(rep=25ms)"))

    small = {k: v * 0.005 for k, v in base_times().items()}  # 5 us and up
    store = Store(db_url)
    run_id, (sid,) = plan_seats(store, [1000])
    tuner = SeatTuner(store, PROFILE, DEVICE, Noisy(small), get_strategy("pruned"))
    assert tune(tuner, run_id, sid, 1000)
    with create_engine(db_url).begin() as c:
        c.execute(text("UPDATE tunings SET kernel_source_hash = 'before'"))
    again = dict(small)
    again[key(256)] *= 1.06  # the old winner reads 6 % slower: behind its runner-up (2 % then)
    ex = Noisy(again)
    tuner.executor = ex
    assert tune(tuner, run_id, sid, 1000)
    assert len(set(ex.screened)) < len(CONFIGS)  # no full tune
    (search, detail), = last(db_url, "SELECT search, search_detail FROM certificates WHERE superseded_at IS NULL")
    assert search == "recertified" and "within noise" in detail and "worst case" in detail
    # The same move timed precisely is a real rank change: the seat falls back, and says why.
    with create_engine(db_url).begin() as c:
        c.execute(text("UPDATE tunings SET kernel_source_hash = 'before'"))
    class Precise(Replay):  # the same method, no spread, on a GPU 1000x slower: far above its tick
        def time(self, config, mode="full"):
            ms = super().time(config, mode).timing.median_ms * 1000
            return Outcome(timing=Timing(ms, ms, ms, "do_bench+lead(rep=25ms)"))

    tuner.executor = Precise(again)
    assert tune(tuner, run_id, sid, 1000)
    (search, detail), = last(db_url, "SELECT search, search_detail FROM certificates WHERE superseded_at IS NULL")
    assert search == "fallback" and "no longer holds" in detail
    store.close()


def test_a_clear_history_times_fewer_configs_beside_its_pair(db_url, monkeypatch):
    from nbx_tune.tuner.search import seat_search

    entry = {"config": key(256), "median_ms": 1.0, "runner_up": key(256, 1), "runner_up_ms": 1.02, "margin": 0.02,
             "provenance": {"device_name": "a sibling", "triton_version": "0.0", "kernel_source_hash": "x",
                            "config_space_hash": SPEC.config_space_hash, "search": "ranked"}}
    monkeypatch.setattr(seat_search, "shipped", lambda name: {("test_replay", "float32", "", "n=1000"): entry})
    store = Store(db_url)
    run_id, (near, sid) = plan_seats(store, [1100, 1000])
    assert tune(SeatTuner(store, PROFILE, DEVICE, Replay(base_times()), get_strategy("pruned")), run_id, near, 1100)
    rec = store.seat_records(seat_ids=[sid])[0]
    assert len(seat_search.for_seat(store, rec, SPEC, PROFILE).explore) == recertify.EXPLORE
    entry.update(runner_up_ms=1.25, margin=0.25)  # the runner-up far behind: the history is clear
    assert len(seat_search.for_seat(store, rec, SPEC, PROFILE).explore) == recertify.EXPLORE_CLEAR
    # From a seat's own history too: a clear winner is re-timed with its runner-up only.
    hist = store.history(near)
    seed = recertify.seed_from_history(hist, store.judged_configs)
    assert seed.margin < recertify.CLEAR and len(seed.contenders) > 2
    cert = hist[-1][1]
    cert.margin = 0.3
    assert recertify.seed_from_history(hist, store.judged_configs).contenders == (cert.config, cert.runner_up)
    store.close()


class Queued(Replay):
    """Replay that records what a census queues for compiling ahead and each seat's start."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.events = []

    def prefetch(self, spec, job, configs, later=False):
        self.events.append(("later" if later else "prefetch", job.label, [c.key() for c in configs]))

    def start_seat(self, spec, job, configs=()):
        self.events.append(("start", job.label, [c.key() for c in configs]))
        super().start_seat(spec, job, configs)


def test_a_census_queues_the_next_seats_first_configs_while_this_one_is_tuned(db_url, monkeypatch):
    from nbx_tune.tuner.fleet import seat_tuner as runner
    from nbx_tune.tuner.census.census import SeatLine

    store = Store(db_url)
    sizes = [1000, 1100, 1200, 1300]
    run_id, sids = plan_seats(store, sizes)
    labels = [f"test_replay|float32||n={n}" for n in sizes]
    lines = [SeatLine(sid, lb, "test_replay", "pending", "", 1, 1) for sid, lb in zip(sids, labels)]
    # Histories of full tunings: each seat's contenders are its own (a shortlist's would be
    # joined by what won at near seats, which the seats before it may change).
    monkeypatch.setenv("NBX_TUNE_SEARCH", "full")
    SeatTuner(store, PROFILE, DEVICE, Replay(base_times()), get_strategy("pruned")).run(lines, None, None, run_id)
    monkeypatch.delenv("NBX_TUNE_SEARCH")
    with create_engine(db_url).begin() as c:  # every seat stale: each re-certified from its contenders
        c.execute(text("UPDATE tunings SET kernel_source_hash = 'before'"))
    monkeypatch.setattr(runner, "PREFETCH_CONFIGS", 5)
    ex = Queued(base_times())
    SeatTuner(store, PROFILE, DEVICE, ex, get_strategy("pruned")).run(lines, None, None, run_id)
    starts = [e for e in ex.events if e[0] == "start"]
    assert [e[1] for e in starts] == labels
    # The first seat's own configs are queued before the next seats' (it starts on them).
    assert ex.events[0][:2] == ("prefetch", labels[0]) and ex.events[0][2] == starts[0][2][:5]
    whole = 0
    for i, (_, label, first) in enumerate(starts[1:], 1):
        # Queued once, before the seat ahead of it started: the configs it starts on, as
        # many as fit PREFETCH_CONFIGS ahead.
        queued = [e[2] for e in ex.events[:ex.events.index(starts[i - 1])] if e[0] == "prefetch" and e[1] == label]
        assert len(queued) == 1 and 1 <= len(queued[0]) <= 5 and queued[0] == first[:len(queued[0])]
        assert 2 <= len(first) < len(CONFIGS)
        whole += queued[0] == first
    assert whole >= 1
    assert not any(e[0] == "later" for e in ex.events)  # every seat re-certified: no audit is due
    store.close()


def test_a_census_audits_a_kernels_smallest_seat_last_and_compiles_its_space_while_the_seats_before_are_timed(
        db_url):
    from nbx_tune.tuner.census.census import SeatLine

    store = Store(db_url)
    sizes = [1200, 1000, 1300, 1100]
    run_id, sids = plan_seats(store, sizes)
    labels = [f"test_replay|float32||n={n}" for n in sizes]
    lines = [SeatLine(sid, lb, "test_replay", "pending", "", 1, 1) for sid, lb in zip(sids, labels)]
    ex = Queued(base_times())
    SeatTuner(store, PROFILE, DEVICE, ex, get_strategy("pruned")).run(lines, None, None, run_id)
    # No audit is on record: it falls on the seat of the smallest shape (each of its timings
    # the cheapest), moved to the kernel's last place in the census; the first seat knows
    # nothing near (in full), the seats between are shortlists.
    order = [labels[i] for i in (0, 2, 3, 1)]
    assert [e[1] for e in ex.events if e[0] == "start"] == order
    rows = last(db_url, "SELECT search, shortcut_loss, seat_id FROM tunings ORDER BY id")
    assert [r[0] for r in rows] == ["full", "ranked", "ranked", "audit"] and rows[-1][2] == sids[1]
    assert rows[-1][1] == 0.0 and all(r[1] is None for r in rows[:-1])
    # Its whole space was queued, at the lowest priority, as the kernel's first seat started,
    # behind that seat's own configs: it compiles while the seats between are timed.
    starts = {e[1]: ex.events.index(e) for e in ex.events if e[0] == "start"}
    later = [i for i, e in enumerate(ex.events) if e[0] == "later"]
    assert [ex.events[i][1] for i in later] == [labels[1]] and later[0] < starts[order[0]]
    assert {*ex.events[later[0]][2]} == {c.key() for c in CONFIGS}
    assert ex.events[0][:2] == ("prefetch", order[0])
    # A census whose kernel has an audit on record audits only where the label's hash draws one.
    run_id, more = plan_seats(store, [1400, 1500])
    ex = Queued(base_times())
    SeatTuner(store, PROFILE, DEVICE, ex, get_strategy("pruned")).run(
        [SeatLine(sid, f"test_replay|float32||n={n}", "test_replay", "pending", "", 1, 1)
         for sid, n in zip(more, [1400, 1500])], None, None, run_id)
    drawn = [label_fraction(f"test_replay|float32||n={n}") < AUDIT_RATE for n in (1400, 1500)]
    assert [r[0] for r in last(db_url, "SELECT search FROM tunings ORDER BY id")][4:] == \
        ["audit" if d else "ranked" for d in drawn]
    store.close()


def test_an_imported_shortlists_ranking_is_not_taken_for_the_whole_space():
    # The same entry seeds alike whether it is read from the shipped table or imported first.
    t = SimpleNamespace(id=3, kind="import", search="full", device_name="H200", triton_version="3.6.0",
                        kernel_source_hash="x", config_space_hash=SPEC.config_space_hash)

    def cert(search):
        return SimpleNamespace(config=key(256), median_ms=1.0, p20_ms=1.0, p80_ms=1.0, runner_up=key(128),
                               runner_up_ms=1.02, margin=0.02, search=search)

    assert not recertify.seed_from_history([(t, cert("ranked"), [])]).complete
    assert not recertify.seed_from_history([(t, cert("recertified"), [])]).complete
    assert recertify.seed_from_history([(t, cert("full"), [])]).complete
    tuned = SimpleNamespace(**{**t.__dict__, "kind": "tune", "search": "ranked"})
    assert not recertify.seed_from_history([(tuned, cert("ranked"), [])]).complete

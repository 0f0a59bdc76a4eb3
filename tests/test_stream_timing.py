"""Streaming kernels (element-wise, copies) are timed as a model runs them: back to back on
warm and rotating operand sets (tuner/timing.stream_time, which needs a GPU; its inputs,
the set count and the method's bookkeeping are checked here), and a re-certification
does not carry a ranking over from another timing method."""

import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from nbx_tune.kernels.runtime.registry import get_spec
from nbx_tune.kernels.spec import Config, Problem, code_hash, seat_flags
from nbx_tune.profiles import builtin_profiles
from nbx_tune.tuner.timing import benchmarkers as timing
from nbx_tune.tuner.execution.executor import RIGS, CandidateRunner
from nbx_tune.tuner.certify.recertify import Recertify, Seed, judge, seed_from_entry
from nbx_tune.tuner.timing.strategies import Measured
from nbx_tune.tuner.timing.benchmarkers import Timing, family
from nbx_tune.tuner.certify.tune import seat_job

INTERP = builtin_profiles()["interpreter"]


def test_method_families():
    assert family("do_bench+lead(rep=25ms)") == "do_bench"
    assert family("do_bench+lead(rep=6.25ms) x4 rounds") == "do_bench"
    assert family("stream(4 sets)+lead(rep=6.25ms) x4 rounds") == "stream"
    assert family("wall(n=3)") == "wall"


def test_sets_rotate_through_about_the_rotation_bytes_and_never_more_than_max_sets():
    assert timing.n_sets(timing.ROTATE_BYTES) == 1  # one set outgrows the L2 alone
    assert timing.n_sets(timing.ROTATE_BYTES // 2) == 2
    assert timing.n_sets(timing.ROTATE_BYTES // 3 + 1) == 3
    assert timing.n_sets(1000) == timing.MAX_SETS
    assert timing.n_sets(0) == timing.MAX_SETS


class StreamBench:
    """Records what a stream timing was handed, and launches each set once."""

    method = "fake"

    def __init__(self):
        self.sets, self.plain = [], 0

    def __call__(self, fn, mode="full"):
        self.plain += 1
        fn()
        return Timing(1.0, 1.0, 1.0, "fake")

    def stream(self, fns, mode="full"):
        self.sets.append(len(fns))
        for f in fns:
            f()
        return Timing(2.0, 2.0, 2.0, "stream(fake)")


def _runner(kernel, n, bench):
    spec = get_spec(kernel)
    flags = seat_flags(fn="neg") if kernel == "elementwise_unary" else seat_flags(layout="flat")
    dtypes = ("float32",) if kernel == "elementwise_unary" else ("float32", "float32")
    p = Problem(kernel, dtypes, flags, (n,), (("shape", (n,)),))
    job = seat_job(spec, INTERP, "s", [p], "cpu")[0]
    return spec, CandidateRunner(spec, job, bench)


@pytest.fixture
def streaming(monkeypatch):
    """Element-wise and copy kernels declared as timed by stream (in the package only matmul
    is: lab/gemm_replay_timing/NOTES.md)."""
    for name in ("elementwise_unary", "copy"):
        monkeypatch.setattr(type(get_spec(name)), "timing", "stream")


@pytest.mark.parametrize("kernel", ["elementwise_unary", "copy"])
def test_a_streaming_kernel_is_timed_over_operand_sets_each_launch_on_its_own(kernel, streaming, monkeypatch):
    bench = StreamBench()
    spec, runner = _runner(kernel, 300, bench)
    writes = []
    real = spec.launch

    def launch(config, problem, inputs, outputs):
        writes.append((id(next(iter(inputs.values()))), id(next(iter(outputs.values())))))
        return real(config, problem, inputs, outputs)

    monkeypatch.setattr(spec, "launch", launch)
    out = runner.time(spec.default_config(INTERP, runner.time_case.problem), "full")
    assert out.ok and out.timing.median_ms == 2.0 and bench.plain == 0
    assert bench.sets == [timing.MAX_SETS]  # 300 elements: every set fits, MAX_SETS of them
    assert len(set(writes)) == timing.MAX_SETS  # each fn its own inputs and outputs


def test_a_benchmarker_without_stream_times_the_first_set(streaming, monkeypatch):
    class Plain(StreamBench):
        stream = None

    bench = Plain()
    spec, runner = _runner("elementwise_unary", 64, bench)
    made = []
    real = runner._operands
    monkeypatch.setattr(runner, "_operands", lambda case: made.append(case) or real(case))
    out = runner.time(spec.default_config(INTERP, runner.time_case.problem), "full")
    assert out.ok and out.timing.median_ms == 1.0 and bench.plain == 1
    assert len(made) == 1  # the interpreter's wall clock: no operand sets it would not rotate


def test_a_launch_timed_kernel_is_timed_once_per_call_on_one_set():
    bench = StreamBench()
    spec, runner = _runner("elementwise_unary", 300, bench)
    assert spec.timing == "launch"
    out = runner.time(spec.default_config(INTERP, runner.time_case.problem), "full")
    assert out.ok and out.timing.median_ms == 1.0 and bench.plain == 1 and bench.sets == []


def test_the_stream_timing_is_part_of_the_source_hash(monkeypatch):
    spec = get_spec("elementwise_unary")
    assert spec.source_hash == code_hash(spec.source_parts())  # "launch" moved no hash
    cls = type(spec)
    monkeypatch.setattr(cls, "timing", "stream")
    assert cls().source_hash != code_hash(spec.source_parts())


def _measured(times: dict, method: str):
    return [Measured(Config.make(X=x), Timing(ms, ms, ms, method), True) for x, ms in times.items()]


def test_a_ranking_timed_by_another_method_does_not_hold_and_is_settled():
    key = {x: Config.make(X=x).key() for x in range(3)}
    seed = Seed(None, "t", {key[0]: 1.0, key[1]: 1.05}, (key[0], key[1]), 0.1, None, "space", True, {},
                0.05, "do_bench")
    same = judge(seed, _measured({0: 1.0, 1: 1.05}, "do_bench+lead(rep=25ms) x2 rounds"))
    assert same.holds and not same.settled
    other = judge(seed, _measured({0: 1.0, 1: 1.05}, "stream(4 sets)+lead(rep=25ms) x1 rounds"))
    assert not other.holds and other.settled and "do_bench" in other.why and "stream" in other.why
    # An old ranking of unknown method is judged on what it measures.
    assert judge(replace(seed, timing=None), _measured({0: 1.0, 1: 1.05}, "stream(4 sets)")).holds


def test_a_method_change_falls_back_after_one_round():
    configs = [Config.make(X=x) for x in range(4)]
    keys = [c.key() for c in configs]
    seed = Seed(None, "t", {keys[0]: 1.0, keys[1]: 1.05}, (keys[0], keys[1]), 0.1, frozenset(keys), "space",
                True, {}, 0.05, "do_bench")
    search = Recertify(seed, "space")
    calls = []

    def evaluate(cands, strategy=None):
        calls.append(len(cands))
        if strategy is None:
            return []
        return strategy(cands, lambda c, mode: Timing(1.0, 1.0, 1.0, "stream(4 sets)"))

    note = search.run(configs, evaluate)
    assert note.search == "fallback" and "timed by do_bench" in note.detail
    assert search.rounds == 1 and calls == [2, 4]


def test_a_shipped_entry_says_how_it_was_timed():
    e = {"config": "A=1", "median_ms": 1.0, "runner_up": "A=2", "runner_up_ms": 1.1, "margin": 0.1,
         "timing_method": "do_bench+lead(rep=6.25ms) x4 rounds",
         "provenance": {"device_name": "d", "triton_version": "3", "kernel_source_hash": "s",
                        "config_space_hash": "h", "search": "full"}}
    assert seed_from_entry(e, "t").timing == "do_bench"
    del e["timing_method"]
    assert seed_from_entry(e, "t").timing is None


class FakeCuda:
    """Enough of torch.cuda for `_bursts`: a graph records the launches made while it is
    captured and replays them; `fail` makes every capture raise as an uncapturable launch does."""

    def __init__(self, fail=False):
        self.fail, self.capturing, self.synced = fail, None, 0

    class Stream:
        def wait_stream(self, other):
            pass

    def current_stream(self):
        return None

    def synchronize(self):
        self.synced += 1

    def CUDAGraph(self):
        class Graph:
            def __init__(self):
                self.calls = []

            def replay(self):
                for f in self.calls:
                    f(replay=True)
        return Graph()

    def graph(self, g, stream=None):
        cuda = self

        class Capture:
            def __enter__(self):
                if cuda.fail:
                    raise RuntimeError("operation not permitted when stream is capturing")
                cuda.capturing = g

            def __exit__(self, *exc):
                cuda.capturing = None
        return Capture()


def _launchers(cuda, n, seconds=0.0):
    """n launchers (launcher i on set i), each taking `seconds` when run, not captured."""
    log = []

    def make(i):
        def fn(replay=False):
            if cuda.capturing is not None and not replay:
                cuda.capturing.calls.append(fn)
            else:
                log.append(i)
                if seconds:
                    time.sleep(seconds)
        return fn
    return [make(i) for i in range(n)], log


@pytest.mark.parametrize("fail", [False, True])
def test_bursts_launch_warm_on_one_set_and_rotate_through_all(fail):
    cuda = FakeCuda(fail)
    fns, log = _launchers(cuda, 3)
    warm, rot, launches, queued = timing._bursts(SimpleNamespace(cuda=cuda), fns)
    assert log == []  # capturing launches nothing
    warm()
    assert log == [0] * launches
    log.clear()
    rot()
    assert log == [i % 3 for i in range(launches)] and launches % 3 == 0
    # A graph is one item in the driver's queue; launches queued eagerly are one each.
    assert (launches, queued) == ((3, 3) if fail else (timing.GRAPH_LAUNCHES, 1))


class FakeEvent:
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def _fake_torch(fail_capture=False):
    cuda = FakeCuda(fail_capture)
    cuda.Event, cuda.current_device = FakeEvent, (lambda: 0)
    flush = SimpleNamespace(zero_=lambda: None)
    return SimpleNamespace(cuda=cuda, int32="int32", empty=lambda *a, **k: flush)


@pytest.mark.parametrize("fail", [False, True])
def test_the_gpu_timers_run_their_course_on_a_fake_device(fail, monkeypatch):
    """The timers' bookkeeping (estimate, warm-up, bursts, quantiles) on a fake torch whose
    events read the host's clock: each launch sleeps 20 us, so a launch reads about that."""
    fake = _fake_torch(fail)
    monkeypatch.setitem(sys.modules, "torch", fake)
    fns, log = _launchers(fake.cuda, 2, 2e-5)
    med, p20, p80 = timing.stream_time(fns, warmup_ms=1, rep_ms=4)
    assert p20 <= med <= p80 and 0.02 <= med < 0.5
    assert set(log) == {0, 1}  # both sets launched
    med, p20, p80 = timing.gpu_time(fns[0], warmup_ms=1, rep_ms=4)
    assert p20 <= med <= p80 and 0.02 <= med < 0.5


def test_a_rig_captures_its_bursts_and_estimates_once_for_all_its_timings(monkeypatch):
    fake = _fake_torch()
    captures = []
    graph = fake.cuda.graph
    fake.cuda.graph = lambda g, stream=None: captures.append(g) or graph(g, stream)
    monkeypatch.setitem(sys.modules, "torch", fake)
    estimates = []
    real = timing._estimate
    monkeypatch.setattr(timing, "_estimate", lambda *a: estimates.append(1) or real(*a))
    fns, _ = _launchers(fake.cuda, 2, 2e-5)
    rig = timing.Rig(fns)
    for rep in (1, 2, 2):
        assert 0.02 <= timing.stream_time(rig, warmup_ms=1, rep_ms=rep)[0] < 0.5
    assert len(captures) == 2 and len(estimates) == 1  # the warm and the rotating graph, once
    timing.stream_time(list(fns), warmup_ms=1, rep_ms=1)
    assert len(captures) == 4 and len(estimates) == 2  # a plain list sets up afresh


def test_a_seat_times_each_config_on_its_kept_rig_over_shared_operand_sets(streaming):
    bench = StreamBench()
    handed = []
    stream = bench.stream
    bench.stream = lambda fns, mode="full": handed.append(fns) or stream(fns, mode)
    spec, runner = _runner("elementwise_unary", 300, bench)
    space = list(dict.fromkeys(spec.configs()))
    assert len(space) > RIGS
    a, b = space[0], space[1]
    for c, mode in ((a, "quick"), (b, "quick"), (a, "round:4"), (b, "round:4")):
        assert runner.time(c, mode).ok
    assert handed[0] is handed[2] and handed[1] is handed[3] and handed[0] is not handed[1]
    assert all(isinstance(r, timing.Rig) and len(r) == timing.MAX_SETS for r in handed)
    made = []
    real = runner._operands
    runner._operands = lambda case: made.append(case) or real(case)
    for c in space[:RIGS + 1]:
        runner.time(c, "quick")
    assert made == []  # the seat's sets were made once, at its first timing
    assert len(runner._rigs) == RIGS and a not in runner._rigs  # the least recent left


@pytest.mark.parametrize("seconds, steps", [(2e-5, timing.ESTIMATE_STEPS), (2e-3, 1)])
def test_a_rig_is_estimated_over_one_burst_where_a_burst_is_long_enough(seconds, steps, monkeypatch):
    # 12 launches of 20 us (a host's sleep: 1 ms or so a burst) are estimated over four
    # bursts; of 2 ms (24 ms a burst) over one.
    monkeypatch.setattr(timing, "ESTIMATE_MS", 5.0)
    fake = _fake_torch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    taken = []
    real = timing._estimate
    monkeypatch.setattr(timing, "_estimate", lambda torch, sleep, step, n: taken.append(n) or real(torch, sleep, step, n))
    fns, log = _launchers(fake.cuda, 2, seconds)
    rig = timing.Rig(fns)
    med = timing.stream_time(rig, warmup_ms=1, rep_ms=4)[0]
    # A host's 20 us sleep overshoots by 0.1 ms or so on a loaded machine: the bound above
    # is the longer of 5x the sleep and 0.5 ms.
    assert taken == [steps] and seconds * 1e3 * 0.8 <= med < max(seconds * 1e3 * 5, 0.5)
    assert rig.first_ms >= seconds * 1e3


def test_each_mode_warms_and_times_for_its_own_share_of_the_profile():
    bench = timing.DoBench(warmup_ms=25.0, rep_ms=100.0)
    assert bench._budget("full") == (25.0, 100.0)
    assert bench._budget("quick") == (2.0, 10.0)
    assert bench._budget("round:4") == (2.0, 25.0)
    assert bench._budget("warm") == (25.0, 10.0)  # the whole warm-up: the GPU is idle before it
    calls = []
    wall = timing.WallClock(repeats=3)
    for mode, launches in (("full", 4), ("quick", 2), ("warm", 2)):
        calls.clear()
        wall(lambda: calls.append(1), mode)
        assert len(calls) == launches, mode

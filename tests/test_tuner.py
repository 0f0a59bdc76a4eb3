"""The tuner on planted faults: wrong and unwritten configs are refused with their reason
and never certified; a config over the shared-memory budget is refused without a launch;
the screen tells an unwritten element from a computed NaN; strategies replay recorded
measurements."""

import numpy as np
import pytest
import torch

from nbx_tune.testing import planted
from nbx_tune.kernels.runtime.registry import register
from nbx_tune.kernels.spec import Config, Problem, seat_flags
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.timing.benchmarkers import Timing, WallClock
from nbx_tune.tuner.execution.executor import InProcess
from nbx_tune.tuner.timing.strategies import get_strategy
from nbx_tune.tuner.timing import pruned
from nbx_tune.tuner.certify.tune import tune_seat

register(planted.SPEC)
PROFILE = get_profile("interpreter")


def problem(n, dtype="float32"):
    return Problem("test_double", (dtype,), seat_flags(), (n,))


def test_planted_faults_are_refused_and_never_certified():
    planted.LAUNCHES.clear()
    res = tune_seat(planted.SPEC, PROFILE, "double", [problem(1001), problem(203)],
                    InProcess(WallClock(3)), get_strategy("exhaustive"), "cpu")
    reasons = {r.config: r.reason for r in res.records}
    assert res.outcome == "certified"
    assert res.winner.config in planted.GOOD
    assert reasons[planted.UNWRITTEN] == "unwritten_output"
    assert reasons[planted.WRONG] == "wrong_answer"
    assert reasons[planted.NO_COMPILE] in ("compile_error", "launch_error")
    assert reasons[planted.HUGE] == "smem_over_budget"
    assert planted.LAUNCHES[planted.HUGE.key()] == 0  # refused statically, never launched
    wrong = next(r for r in res.records if r.config == planted.WRONG)
    assert "err" in wrong.detail and "> rtol" in wrong.detail
    unwritten = next(r for r in res.records if r.config == planted.UNWRITTEN)
    assert "7 of 1001 elements never written" in unwritten.detail
    # The runner-up is the other good config, and the margin is measured between them.
    assert res.runner_up.config in planted.GOOD and res.margin >= 0


def test_wrong_config_faster_than_every_correct_one_is_still_refused():
    # A benchmarker that reports the wrong config as fastest: speed never overrides the screen.
    def fast_wrong(fn, mode="full"):
        return Timing(0.001, 0.001, 0.001, "fake")

    res = tune_seat(planted.SPEC, PROFILE, "double", [problem(500)], InProcess(fast_wrong),
                    get_strategy("exhaustive"), "cpu")
    assert res.winner.config in planted.GOOD
    assert all(r.timing is None for r in res.records if r.config in (planted.WRONG, planted.UNWRITTEN))


def test_screen_tells_unwritten_from_computed_nan():
    p = problem(10)
    ref = {"y": np.arange(10, dtype=np.float64)}
    out = screening.alloc_outputs(planted.SPEC, p, "cpu")["y"]
    assert screening.compare("y", out, ref["y"], 1e-4, p).reason == "unwritten_output"
    out[:] = torch.arange(10, dtype=torch.float32)
    out[3] = float("nan")
    assert screening.compare("y", out, ref["y"], 1e-4, p).reason == "non_finite"
    out[3] = 3.0
    r = screening.compare("y", out, ref["y"], 1e-4, p)
    assert r.ok and r.err == 0.0
    out[9] = 9.01  # 0.01 / 9 = 1.1e-3 > 1e-4
    r = screening.compare("y", out, ref["y"], 1e-4, p)
    assert r.reason == "wrong_answer" and r.err == pytest.approx(0.01 / 9, rel=1e-3)


def test_screen_integers_are_bit_exact_and_bool_poison_is_detected():
    p = problem(4)
    ints = torch.tensor([1, 2, 3, 2**40], dtype=torch.int64)
    assert screening.compare("s", ints, np.array([1, 2, 3, 2**40]), 0.0, p).ok
    assert screening.compare("s", ints, np.array([1, 2, 3, 2**40 + 1]), 0.0, p).reason == "wrong_answer"
    b = torch.empty(4, dtype=torch.bool)
    b.view(torch.uint8).fill_(0xA5)
    assert screening.compare("b", b, np.array([True, False, True, True]), 0.0, p).reason == "unwritten_output"


def test_where_the_oracle_is_nan_or_inf_the_kernel_must_agree():
    p = problem(4)
    ref = np.array([1.0, np.nan, np.inf, 4.0])
    out = torch.tensor([1.0, float("nan"), float("inf"), 4.0])
    r = screening.compare("y", out, ref, 1e-4, p)
    assert r.ok and r.err == 0.0  # judged on the finite elements only
    out[2] = -float("inf")
    assert screening.compare("y", out, ref, 1e-4, p).reason == "wrong_answer"
    out[2], out[3] = float("inf"), float("nan")  # NaN where the oracle is finite
    assert screening.compare("y", out, ref, 1e-4, p).reason == "non_finite"


def test_the_reference_moves_to_the_device_once_per_case_and_judges_every_candidate():
    case = screening.make_case(planted.SPEC, problem(300), "cpu", 7, True)
    first = screening.screen(planted.SPEC, planted.GOOD[0], case, 1e-4, "cpu")
    kept = case.on_device[("y", torch.float32, torch.device("cpu"))]
    wrong = screening.screen(planted.SPEC, planted.WRONG, case, 1e-4, "cpu")
    assert first.ok and wrong.reason == "wrong_answer"
    assert len(case.on_device) == 1 and next(iter(case.on_device.values())) is kept  # reused, not rebuilt


def test_oracle_sees_the_rounded_inputs():
    case = screening.make_case(planted.SPEC, problem(300, "float16"), "cpu", 7, True)
    x = case.inputs["x"]
    assert x.dtype == torch.float16
    np.testing.assert_array_equal(case.ref["y"], 2.0 * x.double().numpy())
    assert np.count_nonzero(case.ref["y"]) > 290  # random, never zeros


def test_a_case_keeps_its_oracle_when_the_next_case_reuses_the_widening_buffers(monkeypatch):
    # The oracle's fp64 inputs live in buffers kept from case to case (tuner/certify/screen.py): an
    # oracle that hands back its input itself (a copy's) must not see the next case's values.
    monkeypatch.setattr(planted.SPEC, "oracle", lambda problem, inputs: {"y": inputs["x"]})
    phases = {}
    first = screening.make_case(planted.SPEC, problem(300), "cpu", 7, True, phases)
    kept = first.ref["y"].copy()
    np.testing.assert_array_equal(kept, first.inputs["x"].double().numpy())
    later = screening.make_case(planted.SPEC, problem(300), "cpu", 8, True)
    np.testing.assert_array_equal(first.ref["y"], kept)
    assert not np.array_equal(later.ref["y"], kept)
    assert set(phases) == {"draw", "round", "widen", "move", "oracle"} and all(v >= 0 for v in phases.values())


def test_large_draws_are_sampled_in_blocks_alike_on_any_number_of_threads(monkeypatch):
    # A seat's largest inputs are drawn in parallel blocks (tuner/certify/screen.py): the values
    # must not depend on the threads, must keep each method's distribution, and small
    # draws stay the seeded generator's own.
    monkeypatch.setattr(screening, "PARALLEL_MIN", 4000)
    monkeypatch.setattr(screening, "BLOCK", 1000)

    def draws(threads):
        s = screening.Sampler(11, threads)
        out = (s.standard_normal((3, 2001)), s.random(5000, dtype=np.float32), s.uniform(0.5, 2.0, (4, 1500)),
               s.integers(-7, 8, 4500), s.choice([-1.0, 1.0], 4100), s.standard_normal(10))
        return out, s.blocks

    (a, b, c, d, e, small), blocks = draws(1)
    again, blocks4 = draws(4)
    assert all(np.array_equal(x, y) for x, y in zip((a, b, c, d, e, small), again))
    assert blocks == blocks4 == 7 + 5 + 6 + 5 + 5  # every large draw went by blocks
    assert a.shape == (3, 2001) and a.dtype == np.float64 and abs(a.mean()) < 0.1 and 0.9 < a.std() < 1.1
    assert b.dtype == np.float32 and 0 <= b.min() and b.max() < 1
    assert 0.5 <= c.min() and c.max() < 2.0 and d.min() == -7 and d.max() == 7 and set(np.unique(e)) == {-1.0, 1.0}
    assert len(np.unique(a)) == a.size  # no block repeats another
    # Written in place (random, standard_normal), each block holds its own generator's draw.
    assert np.array_equal(b, np.concatenate([np.random.default_rng([11, 2, i]).random(1000, dtype=np.float32)
                                             for i in range(5)]))
    np.testing.assert_array_equal(small, np.random.default_rng(11).standard_normal(10))
    # The case a screen is made of: the same inputs and oracle from the same seed.
    p = problem(5000)
    one, two = (screening.make_case(planted.SPEC, p, "cpu", 3, True) for _ in range(2))
    assert torch.equal(one.inputs["x"], two.inputs["x"]) and np.array_equal(one.ref["y"], two.ref["y"])


def test_bf16_seat_is_refused_on_the_interpreter_without_launching():
    planted.LAUNCHES.clear()
    p = Problem("test_double", ("bfloat16",), seat_flags(), (100,))
    res = tune_seat(planted.SPEC, PROFILE, "double", [p], InProcess(WallClock()),
                    get_strategy("exhaustive"), "cpu")
    assert res.outcome == "refused" and res.seat_refusal[0] == "dtype_unscreenable"
    assert sum(planted.LAUNCHES.values()) == 0


def _t(ms):
    return Timing(ms, ms * 0.98, ms * 1.02, "replay")


# Recorded quick/full medians of six configs (ms): a replay, no device needed.
RECORDED = {f"B={b}": {"quick": q, "full": f} for b, q, f in [
    (1, 1.00, 0.98), (2, 1.05, 1.01), (3, 1.20, 1.19), (4, 2.50, 2.40), (5, 9.0, 8.8), (6, None, None)]}


def replay(config, mode):
    v = RECORDED[config.key().split(",")[0]]["quick" if mode == "quick" else "full"]
    return None if v is None else _t(v)


CANDS = [Config.make(B=i) for i in range(1, 7)]


def test_strategy_exhaustive_times_everything_with_full_settings():
    out = get_strategy("exhaustive")(CANDS, replay)
    assert {m.config["B"] for m in out} == {1, 2, 3, 4, 5} and all(m.final for m in out)


def test_strategy_pruned_drops_far_behind_candidates_but_keeps_two_finalists():
    calls = []

    def measure(c, mode):
        calls.append((c["B"], mode))
        return replay(c, mode)

    out = get_strategy("pruned")(CANDS, measure)
    finals = sorted(m.config["B"] for m in out if m.final)
    assert finals == [1, 2, 3]  # within 30 % of the quick best
    assert {b for b, m in calls if m != "quick"} == {1, 2, 3}
    assert {m.config["B"] for m in out if not m.final} == {4, 5}  # kept on record, cannot win
    # Even when one candidate is far ahead, the runner-up is timed in full.
    lone = get_strategy("pruned")(CANDS[2:], replay)
    assert sorted(m.config["B"] for m in lone if m.final) == [3, 4]


def test_strategy_pruned_times_contenders_in_turned_rounds_and_drops_a_failure():
    calls = []
    fails_in_round = {3: 2}  # B=3 fails in its third round

    def measure(c, mode):
        calls.append((c["B"], mode))
        if mode.startswith("round:"):
            if fails_in_round.get(c["B"]) == sum(1 for b, m in calls if b == c["B"] and m == mode) - 1:
                return None
            # Each round slower than the last (a GPU warming up): the order must not decide.
            # B=2 is first in the second round, so the rounds do not settle at two.
            r = sum(1 for b, m in calls if m == mode) / 3
            second = c["B"] == 2 and sum(1 for b, m in calls if b == 2 and m == mode) == 2
            return _t(RECORDED[f"B={c['B']}"]["full"] * (1 + 0.01 * r) * (0.9 if second else 1.0))
        return replay(c, mode)

    out = get_strategy("pruned")(CANDS, measure)
    rounds = [b for b, m in calls if m == "round:4"]
    # Contenders 1, 2, 3 (within 30 % of the quick best); each round starts one further on.
    assert rounds[:3] == [1, 2, 3] and rounds[3:6] == [2, 3, 1] and rounds[6:9] == [3, 1, 2]
    assert rounds[9:] == [2, 1]  # B=3 failed in round 3 and leaves the rest
    finals = {m.config["B"]: m.timing for m in out if m.final}
    assert sorted(finals) == [1, 2]
    assert finals[1].median_ms < finals[2].median_ms and "x4 rounds" in finals[1].method
    assert {m.config["B"] for m in out if not m.final} == {4, 5}


def test_strategy_pruned_stops_once_two_rounds_agree_when_asked_to_settle():
    calls = []

    def measure(c, mode):
        calls.append((c["B"], mode))
        return replay(c, mode)

    out = get_strategy("pruned")(CANDS, measure, settle=True)
    rounds = [b for b, m in calls if m == "round:4"]
    assert rounds == [1, 2, 3, 2, 3, 1]  # B=1 first in both rounds: two rounds, not four
    finals = {m.config["B"]: m.timing for m in out if m.final}
    assert min(finals, key=lambda b: finals[b].median_ms) == 1 and "x2 rounds" in finals[1].method
    # A whole-space tuning (an audit, a full tuning) is not asked to settle: every round runs.
    calls.clear()
    get_strategy("pruned")(CANDS, measure)
    assert len([b for b, m in calls if m == "round:4"]) == 12

    def second_round_of_b2(ms):
        """`measure`, but B=2's second timed round reads ms(what it replays)."""
        def measured(c, mode):
            calls.append((c["B"], mode))
            t = replay(c, mode)
            second = c["B"] == 2 and sum(1 for b, m in calls if b == 2 and m == mode) == 2
            return _t(ms(t.median_ms)) if mode.startswith("round:") and second else t
        return measured

    # Rounds that disagree on the first go on: B=2 first in the second round, so all four run.
    calls.clear()
    get_strategy("pruned")(CANDS, second_round_of_b2(lambda ms: ms * 0.9), settle=True)
    assert len([b for b, m in calls if m == "round:4"]) == 12
    # Near-equals (B=2 half a tie ahead of B=1 in the second round) settle in two.
    calls.clear()
    best = RECORDED["B=1"]["full"]
    get_strategy("pruned")(CANDS, second_round_of_b2(lambda ms: best * (1 - pruned.NEAR_TIE / 2)), settle=True)
    assert len([b for b, m in calls if m == "round:4"]) == 6
    a, b = {1: 1.0, 2: 1.1}, {1: 1.0, 2: 1.05}
    assert pruned.settled([a, b]) and not pruned.settled([a]) and not pruned.settled([a, {1: 1.1, 2: 1.0}])
    assert pruned.settled([{1: 1.0, 2: 1.1}, {1: 1.0 + pruned.NEAR_TIE / 2, 2: 1.0}])
    assert not pruned.settled([{1: 1.0, 2: 1.1}, {1: 1.0 + 2 * pruned.NEAR_TIE, 2: 1.0}])

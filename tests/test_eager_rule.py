"""Eager routing (kernels/runtime/eager_rule.py): outside a CUDA graph's capture, serve() runs
torch at a seat where torch's eager time max(host, device) is lower; under capture the
device rule stays. Host times are injected or measured by serve()'s own clock; nothing here
asserts a timing."""

from __future__ import annotations

import pytest
import torch

import nbx_tune
from nbx_tune.errors import TorchFaster
from nbx_tune.kernels.runtime import certified, eager_rule, launch, torch_rule
from nbx_tune.kernels.runtime.registry import get_spec
from nbx_tune.kernels.serving import serve as serving
from nbx_tune.kernels.spec import bucket_of, seat_flags
from nbx_tune.profiles import device_info


@pytest.fixture(autouse=True)
def fresh():
    serving.reset_stats()
    serving._clocks.clear()
    yield
    serving._clocks.clear()
    assert not serving.active()


def _seat_with_baseline(nbx_ms: float, torch_ms: float, n: int = 15):
    """relu's seat for n elements certified in the loaded state, with a baseline that holds here."""
    st = certified.state()
    spec = get_spec("elementwise_unary")
    seat = ("elementwise_unary", ("float32",), seat_flags(fn="relu"), bucket_of(st.profile, spec.key, (n,)))
    cfg = spec.default_preference()[0]
    st.entries[seat] = (cfg, "test")
    st.baselines[seat] = [{"device_name": device_info().name, "torch_version": torch.__version__,
                           "nbx_ms": nbx_ms, "torch_ms": torch_ms, "method": "graph replay",
                           "measured_at": "2026-12-07T10:00:00+00:00", "config": str(cfg)}]
    certified._defer(st)
    st.memo.clear()
    return seat


def _clock(op: str, served_ms: float, torch_ms: float) -> eager_rule.HostClock:
    clock = serving._clocks.setdefault(op, eager_rule.HostClock())
    clock.inject(served_ms, torch_ms)
    return clock


# ----------------------------------------------------------------------------- the model

def test_eager_time_is_the_larger_of_host_and_device():
    # host-bound: torch's cheaper launch wins although its kernel is slower
    assert eager_rule.eager_defers(0.010, 0.003, 0.004, 0.004)
    # device-bound: the queue hides the host, the faster kernel stays
    assert not eager_rule.eager_defers(0.010, 0.050, 0.004, 0.060)
    # within the margin: the kernel stays
    assert not eager_rule.eager_defers(0.010, 0.003, 0.010 / (1 + torch_rule.MARGIN / 2), 0.001)


def test_only_short_kernels_or_deferring_seats_are_checked_per_call():
    assert eager_rule.checked(0.005, 0.004) and eager_rule.checked(0.005, 0.010)
    assert eager_rule.checked(1.0, 0.5)  # the device rule defers
    assert not eager_rule.checked(1.0, 2.0)  # long and faster: nothing can send it to torch
    _seat_with_baseline(1.0, 2.0)
    assert not certified.state().checks


def test_the_rule_without_a_clock_or_under_capture_is_the_device_rule(monkeypatch):
    clock = eager_rule.HostClock()
    clock.inject(0.010, 0.004)
    assert eager_rule.torch_runs(clock, 0.003, 0.004) == eager_rule.REASON
    assert eager_rule.torch_runs(True, 0.003, 0.004) is None  # no clock: device time alone
    assert eager_rule.torch_runs(True, 0.004, 0.003) == torch_rule.REASON
    monkeypatch.setattr(eager_rule, "_capturing", lambda: True)
    assert eager_rule.torch_runs(clock, 0.003, 0.004) is None
    # eager torch would lose on host time, but under capture its faster kernel counts
    clock.inject(0.004, 0.010)
    assert eager_rule.torch_runs(clock, 0.004, 0.003) == torch_rule.REASON
    monkeypatch.setattr(eager_rule, "_capturing", lambda: False)
    assert eager_rule.torch_runs(clock, 0.004, 0.003) is None


def test_unmeasured_host_times_leave_the_device_rule_and_ask_for_timing():
    clock = eager_rule.HostClock()
    assert eager_rule.torch_runs(clock, 0.003, 0.004) is None and clock.wanted
    assert eager_rule.torch_runs(clock, 0.004, 0.003) == torch_rule.REASON


# ----------------------------------------------------------------------------- under serve()

def test_host_bound_seat_runs_torch_eager_and_says_why(monkeypatch):
    _seat_with_baseline(0.003, 0.004)
    _clock("aten.relu", 0.010, 0.004)
    x = torch.randn(3, 5)
    with nbx_tune.serve():
        y = torch.relu(x)
    assert torch.equal(y, torch.relu(x))
    assert serving.stats()["aten.relu"] == {"certified": 0, "default": 0, "torch": 1,
                                            "reasons": {eager_rule.REASON: 1}}
    assert "host time" in serving.format_stats()
    serving.reset_stats()
    monkeypatch.setattr(eager_rule, "_capturing", lambda: True)  # under capture: the kernel
    with nbx_tune.serve():
        assert torch.equal(torch.relu(x), y)
    assert serving.stats()["aten.relu"]["certified"] == 1


def test_device_bound_seat_keeps_the_kernel_eager():
    _seat_with_baseline(0.003, 0.004)
    _clock("aten.relu", 0.002, 0.001)  # both hosts below the device times
    with nbx_tune.serve():
        torch.relu(torch.randn(3, 5))
    assert serving.stats()["aten.relu"]["certified"] == 1


def test_serve_times_both_sides_of_an_op_once_then_decides():
    _seat_with_baseline(0.003, 0.004)
    x = torch.randn(3, 5)
    want = torch.relu(x)
    calls = 2 * eager_rule.SAMPLES + 5
    with nbx_tune.serve():
        for _ in range(calls):
            assert torch.equal(torch.relu(x), want)
        # another op's seat has no baseline: no clock asked for, nothing timed
        torch.neg(x)
    clock = serving._clocks["aten.relu"]
    assert clock.ready and len(clock.served_ms) == len(clock.torch_ms) == eager_rule.SAMPLES
    assert not serving._clocks["aten.neg"].wanted and not serving._clocks["aten.neg"].served_ms
    s = serving.stats()["aten.relu"]
    assert s["reasons"].get(eager_rule.SAMPLING) == eager_rule.SAMPLES
    # the rest: the measured host times decide, the same way each call
    served, torch_host = clock.host_ms()
    rest = calls - 1 - 2 * eager_rule.SAMPLES  # the first call asked; the timed calls follow
    to_torch = eager_rule.eager_defers(served, 0.003, torch_host, 0.004)
    assert s["reasons"].get(eager_rule.REASON, 0) == (rest if to_torch else 0)
    assert s["certified"] == 1 + eager_rule.SAMPLES + (0 if to_torch else rest)
    assert set(serving.host_clocks()) == {"aten.relu"}


def test_a_replay_asks_the_eager_rule_again(monkeypatch):
    seat = _seat_with_baseline(0.003, 0.004)
    rec = launch._Record(())
    monkeypatch.setattr(launch._tls, "rec", rec, raising=False)
    certified.config_for(get_spec("elementwise_unary"), *seat[1:3], (15,))
    assert rec.guards == [certified.state().checks[seat]]

    def replay(*inputs):
        return "out"

    replay.source, replay.values = "src", {}
    guarded = launch._guarded(replay, tuple(rec.guards))
    clock = eager_rule.HostClock()
    clock.inject(0.002, 0.001)
    monkeypatch.setattr(certified.SERVING, "busy", clock)
    assert guarded(1) == "out"
    host_bound = eager_rule.HostClock()  # another op's clock at the same seat
    host_bound.inject(0.010, 0.004)
    monkeypatch.setattr(certified.SERVING, "busy", host_bound)
    with pytest.raises(TorchFaster, match="host time"):
        guarded(2)
    with pytest.raises(TorchFaster, match="host time"):
        guarded(3)  # the measured clock's verdict, remembered
    monkeypatch.setattr(eager_rule, "_capturing", lambda: True)
    assert guarded(4) == "out"  # under capture: the device rule, the kernel

"""serve()'s aten.native_layer_norm and aten.native_group_norm replay their launch
(kernels/runtime/launch.py) like the public ops, under keys of their own: each key holds
everything the result depends on (the op, shapes, strides, dtype, normalized shape or group
sizes, eps, which of weight and bias are there), so a call that differs in one of them is
never served another's replay. testing/fake_compiled.py stands in for Triton's compiled kernels.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from nbx_tune.testing.fake_compiled import FakeTriton

import nbx_tune
from nbx_tune.kernels import layer_norm
from nbx_tune.kernels.runtime import certified, launch
from nbx_tune.kernels.serving import serve as serving

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fresh():
    serving.reset_stats()
    launch.forget()
    yield
    launch.forget()
    assert not serving.active()


@pytest.fixture
def fake(monkeypatch):
    f = FakeTriton()
    monkeypatch.setattr(launch, "through_triton", f)
    return f


def _close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_native_layer_norm_replays_out_mean_and_rstd_on_new_data(fake):
    x, w, b = torch.randn(3, 4, 40), torch.randn(40), torch.randn(40)
    for seed in range(3):  # new values in the same buffers: the replay reads them
        torch.manual_seed(seed)
        x.copy_(torch.randn(3, 4, 40) * (seed + 1))
        want = aten.native_layer_norm(x, [40], w, b, 1e-5)
        with nbx_tune.serve():
            got = aten.native_layer_norm(x, [40], w, b, 1e-5)
        _close(got, want)
    assert fake.log == ["triton", "direct", "direct"]
    assert serving.stats()["aten.native_layer_norm"]["torch"] == 0


def test_native_layer_norm_is_never_served_the_public_ops_replay(fake):
    """The public op's call with the very same arguments returns one tensor; the native op
    three: a key without the op would hand the native op the public op's replay."""
    x, w, b = torch.randn(6, 32), torch.randn(32), torch.randn(32)
    layer_norm(x, [32], w, b, 1e-5)
    layer_norm(x, [32], w, b, 1e-5)  # the public op's replay is remembered
    with nbx_tune.serve():
        got = aten.native_layer_norm(x, [32], w, b, 1e-5)
    _close(got, aten.native_layer_norm(x, [32], w, b, 1e-5))


@pytest.mark.parametrize("second", ["eps", "no weight", "no bias", "two dims", "strided", "float16"])
def test_a_call_that_differs_in_one_key_part_gets_its_own_replay(fake, second):
    x, w, b = torch.randn(4, 6, 16), torch.randn(16), torch.randn(16)
    first = (x, [16], w, b, 1e-5)
    other = {"eps": (x, [16], w, b, 0.5), "no weight": (x, [16], None, b, 1e-5),
             "no bias": (x, [16], w, None, 1e-5), "two dims": (x, [6, 16], torch.randn(6, 16), None, 1e-5),
             "strided": (x.transpose(0, 1), [16], w, b, 1e-5),
             "float16": (x.half(), [16], w.half(), b.half(), 1e-5)}[second]
    calls = (first, first, other, other)
    with nbx_tune.serve():
        got = [aten.native_layer_norm(*args) for args in calls]
    # the other call is recorded (a strided x is staged by a copy launch first), then replayed
    n = 2 if second == "strided" else 1
    assert fake.log == ["triton", "direct"] + ["triton"] * n + ["direct"] * n
    tol = 2e-3 if second == "float16" else 1e-5
    for args, out in zip(calls, got):  # torch's result in fp32, computed outside serve()
        want = aten.native_layer_norm(*(a.float() if isinstance(a, torch.Tensor) else a for a in args))
        for g, w_ in zip(out, want):
            torch.testing.assert_close(g.float(), w_, atol=tol, rtol=tol)


def test_layer_norm_through_the_functional_call_is_replayed(fake):
    x, w, b = torch.randn(2, 24), torch.randn(24), torch.randn(24)
    with nbx_tune.serve():
        got = [F.layer_norm(x, (24,), w, b) for _ in range(3)]
    assert fake.log == ["triton", "direct", "direct"]
    for g in got:
        torch.testing.assert_close(g, F.layer_norm(x, (24,), w, b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("groups", [(2, 4), (4, 2)])
def test_native_group_norm_replays_and_a_group_count_is_its_own_key(fake, groups):
    x, w, b = torch.randn(2, 8, 3, 3), torch.randn(8), torch.randn(8)
    calls = (groups[0], groups[0], groups[1], groups[1])
    with nbx_tune.serve():
        got = [aten.native_group_norm(x, w, b, 2, 8, 9, g, 1e-5) for g in calls]
    for g, out in zip(calls, got):
        _close(out, aten.native_group_norm(x, w, b, 2, 8, 9, g, 1e-5))
    assert fake.log == ["triton", "direct", "triton", "direct"]


def test_reload_forgets_the_native_replays(fake):
    x, w = torch.randn(3, 16), torch.randn(16)
    with nbx_tune.serve():
        aten.native_layer_norm(x, [16], w, None, 1e-5)
        aten.native_layer_norm(x, [16], w, None, 1e-5)
        certified.reload()  # a new certificate may serve the seat: no replay of before
        got = aten.native_layer_norm(x, [16], w, None, 1e-5)
    assert fake.log == ["triton", "direct", "triton"]
    _close(got, aten.native_layer_norm(x, [16], w, None, 1e-5))

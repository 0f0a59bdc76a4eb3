"""Replay keys (kernels/runtime/launch.py) of what serve() runs eager: each key holds
everything the call's result depends on, so a call that differs in one key part is never
served another call's replay. serve()'s aten.native_layer_norm and aten.native_group_norm
replay like the public ops under keys of their own (the op, shapes, strides, dtype,
normalized shape or group sizes, eps, which of weight and bias are there); the compare and
where ops replay, a value operand keyed by its repr (type, value and the sign of a zero);
the element-wise binary op's Python-number operand likewise (x / -0.0 is not x / 0.0);
topk, cumsum, copy_ and the *_like fills under keys of their parameters and layouts, with
the checks that read each call's data (topk's ties on the CPU, copy_'s overlaps) still run.
testing/fake_compiled.py stands in for Triton's compiled kernels (the `fake_triton`
fixture); each result is checked against torch outside serve().
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nbx_tune
from nbx_tune.errors import KernelError
from nbx_tune.kernels import compare, div, layer_norm, mul, select
from nbx_tune.kernels.runtime import certified
from nbx_tune.kernels.serving import serve as serving

aten = torch.ops.aten


@pytest.fixture
def fake(fake_triton):
    serving.reset_stats()
    yield fake_triton
    assert not serving.active()


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


# ----------------------------------------------------------------------------- compare, where, numbers

def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)
    if got.is_floating_point():  # the sign of a zero and of an infinity too
        assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_a_negative_zero_operand_is_not_served_the_replay_of_zero(fake):
    x = torch.tensor([1.0, -2.0, 3.0])
    _same(div(x, 0.0), x / 0.0)
    _same(div(x, 0.0), x / 0.0)  # replayed
    _same(div(x, -0.0), x / -0.0)  # -inf where 0.0's replay would give inf
    _same(mul(x, -0.0), x * -0.0)
    assert fake.log == ["triton", "direct", "triton", "triton"]


def test_a_negative_zero_under_serve_is_torchs(fake):
    x = torch.tensor([1.0, -2.0, 4.0])
    with nbx_tune.serve():
        got = [torch.div(x, v) for v in (0.0, 0.0, -0.0, -0.0)]
    for g, v in zip(got, (0.0, 0.0, -0.0, -0.0)):
        _same(g, torch.div(x, v))
    assert fake.log == ["triton", "direct", "triton", "direct"]


def test_compare_ops_replay_and_key_op_operand_and_value(fake):
    a, b = torch.randn(5, 7), torch.randn(5, 7)
    calls = [(compare.gt, a, b), (compare.gt, a, b), (compare.lt, a, b), (compare.gt, a, b.t().t()),
             (compare.gt, a, 0.5), (compare.gt, a, 0.5), (compare.gt, a, -0.25), (compare.gt, a, a),
             (compare.ge, a, a)]
    want = [torch.gt(a, b), torch.gt(a, b), torch.lt(a, b), torch.gt(a, b), torch.gt(a, 0.5), torch.gt(a, 0.5),
            torch.gt(a, -0.25), torch.gt(a, a), torch.ge(a, a)]
    for (op, x, y), w in zip(calls, want):
        _same(op(x, y), w)
    # lt is another op, -0.25 another value, a vs a one operand twice: each its own record
    assert fake.log == ["triton", "direct", "triton", "direct", "triton", "direct", "triton", "triton", "triton"]
    m = torch.tensor([True, False, True])
    _same(compare.logical_not(m), ~m)
    _same(compare.logical_not(m), ~m)
    _same(compare.bitwise_not(torch.tensor([1, 2, 3])), ~torch.tensor([1, 2, 3]))  # another dtype and op
    assert fake.log[-3:] == ["triton", "direct", "triton"]


def test_compare_new_data_in_the_same_buffers_is_read_by_the_replay(fake):
    a, b = torch.randn(4, 9), torch.randn(1, 9)
    first = compare.le(a, b)
    b.copy_(torch.randn(1, 9))
    _same(compare.le(a, b), torch.le(a, b))
    assert not torch.equal(first, torch.le(a, b)) and fake.log == ["triton", "direct"]


def test_where_keys_a_value_operand_by_type_and_value(fake):
    m = torch.rand(6, 5) > 0.5
    xi, xf = torch.randint(-9, 9, (6, 5)), torch.randn(6, 5)
    f64 = torch.float64
    calls = [(m, xf, 1.0), (m, xf, 1.0), (m, xf, 2.0), (m, xi, 1), (m, xi, 1.0),
             (m, 3.0, xf), (m, xf, torch.tensor(1.0, dtype=f64)), (m, xf, torch.tensor(2.0, dtype=f64))]
    for c, s, o in calls:
        _same(select.where(c, s, o), torch.where(c, s, o))
    # a float and an int value, a value in the other slot, a float64 0-d value: each its own record
    assert fake.log == ["triton", "direct", "triton", "triton", "triton", "triton", "triton", "triton"]


def test_where_and_compare_under_serve_are_replayed_and_torchs(fake):
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    with nbx_tune.serve():
        got = [torch.where(x > 0, x, y) for _ in range(3)]
    want = torch.where(x > 0, x, y)
    for g in got:
        _same(g, want)
    assert fake.log == ["triton"] * 2 + ["direct"] * 4  # gt and where, recorded once each
    st = serving.stats()
    assert st["aten.where.self"]["certified"] + st["aten.where.self"]["default"] == 3


# ----------------------------------------------------------------------------- fills

def test_full_and_scalar_tensor_replay_keyed_by_size_dtype_and_value(fake):
    from nbx_tune.kernels import fill

    cpu = torch.device("cpu")
    calls = [("full", (2, 3), 1.5, torch.float32), ("full", (2, 3), 1.5, torch.float32),
             ("full", (2, 3), -1.5, torch.float32), ("full", (2, 3), 1, torch.float32),
             ("full", (3, 2), 1.5, torch.float32), ("full", (2, 3), 1.5, torch.float16),
             ("full", (2, 3), 1, torch.int64), ("scalar_tensor", (), 2.5, torch.float32),
             ("scalar_tensor", (), -2.5, torch.float32)]
    for what, size, v, dt in calls:
        got = fill.full(size, v, dtype=dt, device=cpu) if what == "full" else \
            fill.scalar_tensor(v, dtype=dt, device=cpu)
        _same(got, torch.full(size, v, dtype=dt))
    assert fake.log == ["triton", "direct"] + ["triton"] * 7


def test_zeros_follow_a_changed_default_dtype(fake):
    from nbx_tune.kernels import fill

    cpu = torch.device("cpu")
    first = [fill.zeros((4,), device=cpu) for _ in range(2)]
    was = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        half = fill.zeros((4,), device=cpu)
    finally:
        torch.set_default_dtype(was)
    assert [t.dtype for t in first] == [torch.float32] * 2 and half.dtype == torch.float16
    assert fake.log == ["triton", "direct", "triton"]


def test_fill_and_zero_in_place_replay_on_each_calls_tensor(fake):
    a, b = torch.randn(3, 5), torch.randn(3, 5)
    with nbx_tune.serve():
        a.fill_(2.0)
        b.fill_(2.0)  # the replay writes b, not a
        a.fill_(-3.0)
        b.zero_()
    _same(a, torch.full((3, 5), -3.0))
    _same(b, torch.zeros(3, 5))
    assert fake.log == ["triton", "direct", "triton", "triton"]


def test_where_with_a_value_under_serve_replays_both_launches(fake):
    m, x = torch.rand(2, 9) > 0.5, torch.randn(2, 9)
    with nbx_tune.serve():
        got = [torch.where(m, x, -1e4) for _ in range(3)]
    for g in got:
        _same(g, torch.where(m, x, -1e4))
    assert fake.log == ["triton"] * 2 + ["direct"] * 4  # the wrapped value's scalar_tensor and where


def test_a_negative_zero_fill_or_where_value_runs_torch_under_serve(fake):
    """The fill and where launches pass a value of -0.0 as +0.0: serve() hands those calls
    to torch, whose result keeps the sign."""
    m, x = torch.rand(2, 9) > 0.5, torch.randn(2, 9)
    with nbx_tune.serve():
        full, where = torch.full((2, 3), -0.0), torch.where(m, x, -0.0)
        twice = torch.where(m, x, 0.0)  # +0.0 is served
    _same(full, torch.full((2, 3), -0.0))
    _same(where, torch.where(m, x, -0.0))
    _same(twice, torch.where(m, x, 0.0))
    st = serving.stats()  # where's wrapped -0.0 is a scalar_tensor, which torch makes
    assert st["aten.full"]["torch"] == 1 and st["aten.scalar_tensor"]["torch"] == 1
    with pytest.raises(KernelError, match="-0.0"):  # a value -0.0 given to where itself
        select.where(m, x, -0.0)


def test_a_fills_key_holds_the_device_it_lands_on(monkeypatch):
    """"cuda" is the current device, which may change between calls: the key holds the
    device resolved, so a replay never allocates on the device of an earlier call."""
    from nbx_tune.kernels import fill

    for index in (0, 1):
        monkeypatch.setattr(torch.cuda, "current_device", lambda index=index: index)
        assert fill._resolved("cuda") == torch.device("cuda", index)
        assert fill._resolved(torch.device("cuda")) == torch.device("cuda", index)
    assert fill._resolved("cuda:1") == torch.device("cuda", 1) and fill._resolved("cpu") == torch.device("cpu")
    with pytest.raises(TypeError):  # another kind's current device: the ordinary path
        fill._resolved("xpu")


def test_an_arange_on_cuda_is_keyed_by_the_current_device(fake, monkeypatch):
    """arange(n, device="cuda") lands on the current device: a replay recorded while it was
    another must not be served (the key holds the device resolved)."""
    from nbx_tune.kernels import fill

    keys = []
    monkeypatch.setattr(fill.launch, "remember", lambda key, inputs, slow, *a: keys.append(key) or slow(*a))
    monkeypatch.setattr(fill, "_arange_call", lambda *a: torch.arange(3))
    for index in (0, 1):
        monkeypatch.setattr(torch.cuda, "current_device", lambda index=index: index)
        fill.arange(3, device="cuda")
    assert [k[-1] for k in keys] == [torch.device("cuda", 0), torch.device("cuda", 1)]


# ----------------------------------------------------------------------------- topk, cumsum

def test_topk_replays_keyed_by_k_dim_and_order(fake):
    """A router's top-k: each call differing in k, dim or largest gets its own replay; the
    same call again is replayed on the new data."""
    x = torch.randn(4, 8)
    calls = [(2, -1, True), (2, -1, True), (3, -1, True), (2, -1, False), (2, 0, True)]
    with nbx_tune.serve():
        got = [torch.topk(x, k, dim=d, largest=lg) for k, d, lg in calls]
        x2 = torch.randn(4, 8)
        again = torch.topk(x2, 2)
    for (k, d, lg), g in zip(calls, got):
        w = torch.topk(x, k, dim=d, largest=lg)
        _same(g.values, w.values)
        _same(g.indices, w.indices)
    _same(again.values, torch.topk(x2, 2).values)
    _same(again.indices, torch.topk(x2, 2).indices)
    assert fake.log == ["triton", "direct", "triton", "triton", "triton", "direct"]
    assert serving.stats()["aten.topk"]["torch"] == 0


def test_a_replayed_topk_still_hands_ties_to_torch_on_the_cpu(fake):
    """The CPU refuses ties (torch's order of them is its own): the flag is read after a
    replay as after the ordinary path."""
    x = torch.randn(4, 8)
    tied = torch.randn(4, 8)
    tied[:, 0] = tied[:, 1] = 10.0  # the top two equal
    import importlib

    row_sort = importlib.import_module("nbx_tune.kernels.topk")

    row_sort.topk(x, 2)
    row_sort.topk(x, 2)  # remembered and replayed
    with pytest.raises(KernelError, match="equal values"):
        row_sort.topk(tied, 2)
    assert fake.log == ["triton", "direct", "direct"]


def test_cumsum_replays_keyed_by_dim_and_dtype(fake):
    x = torch.randint(-5, 5, (3, 6), dtype=torch.int32)
    calls = [(1, None), (1, None), (0, None), (1, torch.float32), (1, torch.int32)]
    with nbx_tune.serve():
        got = [torch.cumsum(x, d, dtype=dt) for d, dt in calls]
    for (d, dt), g in zip(calls, got):
        _same(g, torch.cumsum(x, d, dtype=dt))
    assert fake.log == ["triton", "direct", "triton", "triton", "triton"]


# ----------------------------------------------------------------------------- copy_

def test_copy_replays_keyed_by_both_layouts(fake):
    """copy_ into the same destination from sources of one shape but other strides, a
    broadcast row or another dtype: each its own replay; the same call again replays."""
    src = torch.randn(4, 6)
    srcs = [src, torch.randn(4, 6), src.t().contiguous().t(), src[:1], src[0], src.half()]
    outs = []
    with nbx_tune.serve():
        for s in srcs:
            dst = torch.empty(4, 6)
            dst.copy_(s)
            outs.append(dst)
    for s, got in zip(srcs, outs):
        _same(got, torch.empty(4, 6).copy_(s))
    assert fake.log[:2] == ["triton", "direct"] and fake.log.count("direct") == 1
    assert serving.stats()["aten.copy_"]["torch"] == 0


def test_a_replayed_copy_still_refuses_an_overlapping_source(fake):
    """The overlap checks (issue 60) run on every call: a source overlapping the destination
    under a key already replayed is still refused (torch's copy_ then runs)."""
    from nbx_tune.kernels import copy_

    other = torch.randn(8)
    for _ in range(2):  # the key: 4 floats, aligned, from 4 floats 8 bytes off alignment
        copy_(torch.empty(4), other[2:6])
    assert fake.log == ["triton", "direct"]
    buf = torch.arange(8.0)
    with pytest.raises(KernelError, match="overlaps"):
        copy_(buf[0:4], buf[2:6])
    assert torch.equal(buf, torch.arange(8.0))  # nothing written


# ----------------------------------------------------------------------------- *_like fills

def test_like_fills_replay_keyed_by_self_dtype_format_and_value(fake):
    """zeros_like, ones_like and full_like: the output's dtype is the one asked, its strides
    follow self's and the memory format, its values the value's."""
    x = torch.randn(3, 5)
    cpu = torch.device("cpu")
    calls = [("zeros_like", x, {}), ("zeros_like", x, {}), ("ones_like", x, {}),
             ("zeros_like", x.t(), {}), ("zeros_like", x, {"dtype": torch.int32}),
             ("zeros_like", x.t(), {"memory_format": torch.contiguous_format}), ("zeros_like", x.t(), {}),
             ("full_like", x, {"fill_value": 2.5}), ("full_like", x, {"fill_value": -2.5}),
             ("full_like", x, {"fill_value": 0.0}), ("full_like", x, {"fill_value": -0.0}),
             ("zeros_like", x, {"device": "cpu"}), ("zeros_like", x, {"device": cpu})]
    with nbx_tune.serve():
        got = [getattr(torch, what)(t, **kw) for what, t, kw in calls]
    for (what, t, kw), g in zip(calls, got):
        want = getattr(torch, what)(t, **kw)
        _same(g, want)
        assert g.stride() == want.stride()
    # each distinct call recorded once (a device named "cpu" is self's: replayed); torch runs
    # a transposed output (the fill serves contiguous ones: never the contiguous call's
    # replay) and -0.0 (the launch writes +0.0: never 0.0's replay)
    assert fake.log == ["triton", "direct"] + ["triton"] * 6 + ["direct"] * 2
    st = serving.stats()
    assert st["aten.full_like"]["torch"] == 1 and st["aten.zeros_like"]["torch"] == 2

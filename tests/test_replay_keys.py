"""The replay keys of the compare and where ops (now replayed like the other families) and
of the element-wise binary op's Python-number operand: a call that differs in one key part
(the op, an operand's layout, a value passed to the launch, its type, its sign) is never
served another call's replay. testing/fake_compiled.py stands in for Triton's compiled
kernels (kernels/runtime/launch.py); each result is checked against torch outside serve().
"""

from __future__ import annotations

import pytest
import torch
from nbx_tune.testing.fake_compiled import FakeTriton

import nbx_tune
from nbx_tune.kernels import compare, div, mul, select
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.serving import serve as serving


@pytest.fixture(autouse=True)
def fresh():
    serving.reset_stats()
    launch.forget()
    yield
    launch.forget()


@pytest.fixture
def fake(monkeypatch):
    f = FakeTriton()
    monkeypatch.setattr(launch, "through_triton", f)
    return f


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

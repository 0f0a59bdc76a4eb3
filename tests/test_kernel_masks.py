"""The mask-construction ops on the interpreter: comparisons and bitwise/logical ops
(kernels/compare.py), `where` (kernels/select.py), the fills shaped like a tensor
(`new_ones`, `scalar_tensor`, ... in kernels/fill.py): every example row through the exact
screen, the ops under serve() equal to torch bit for bit (dtype, promotion, NaN), refusals
where torch refuses, and a trace of a sliding-window mask and a strided clone that a census
certifies, after which serve() launches nothing on a default config."""

from __future__ import annotations

import pytest
import torch

import nbx_tune
from nbx_tune.kernels import compare, fill, select
from nbx_tune.kernels import copy as cp
from nbx_tune.kernels.runtime import certified
from nbx_tune.kernels.serving import serve as serving
from nbx_tune.kernels.spec import NotServable
from nbx_tune.kernels.trace import make_row
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify.selfcheck import check_kernel

PROFILE = get_profile("interpreter")


@pytest.mark.parametrize("spec", [compare.SPEC, select.SPEC], ids=lambda s: s.name)
def test_selfcheck_small_rows_pass_the_exact_screen(spec):
    checks = check_kernel(spec, PROFILE, "cpu", "small", configs_per_row=2)
    bad = [(c.op, c.shapes, c.dtype, str(c.config), c.reason, c.detail) for c in checks if not c.ok]
    assert not bad
    assert len(checks) >= 2 * len(spec.example_rows("small")) - 2 and all(c.err == 0.0 for c in checks)


@pytest.mark.parametrize("spec", [compare.SPEC, select.SPEC], ids=lambda s: s.name)
def test_gpu_rows_are_servable(spec):
    problems = [spec.problem_from_row(r) for r in spec.example_rows("gpu")]
    assert not [p for p in problems if isinstance(p, NotServable)]
    assert {dt for p in problems for dt in p.dtypes} >= {"bool", "int64", "float16", "bfloat16", "float32"}


def test_the_strided_copy_rows_pass_the_screen_on_the_strided_seat():
    rows = [r for r in cp.COPY_SPEC.example_rows("small") if r.params.str("layout") == "strided"]
    assert len(rows) == 2
    for row in rows:
        p = cp.COPY_SPEC.problem_from_row(row)
        assert dict(p.flags)["layout"] == "strided"
    checks = [c for row in rows for c in __import__("nbx_tune.tuner.certify.selfcheck", fromlist=["x"])
              .check_row(cp.COPY_SPEC, PROFILE, "cpu", row, 2)]
    assert checks and all(c.ok for c in checks), [(c.reason, c.detail) for c in checks if not c.ok]


def _vals(dt, shape, g):
    if dt == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dt.is_floating_point:
        return torch.randint(-3, 4, shape, generator=g).to(dt)
    x = (torch.randint(-3, 4, shape, generator=g) * 0.5).to(dt)
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    return x


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.nan_to_num(7.0) if a.is_floating_point() else a, b.nan_to_num(7.0) if b.is_floating_point() else b)


def _served(fn, *args):
    """fn under serve(): (result, stats); each call launched a kernel or the test says why not."""
    serving.reset_stats()
    with nbx_tune.serve(fuse=False):
        out = fn(*args)
    return out, serving.stats()


DTYPES = (torch.bool, torch.int32, torch.int64, torch.float16, torch.float32)


@pytest.mark.parametrize("fn", [torch.gt, torch.le, torch.eq, torch.ne, torch.bitwise_and, torch.logical_xor],
                         ids=lambda f: f.__name__)
def test_binary_ops_equal_torch_with_promotion_broadcast_strides_and_nan(fn):
    g = torch.Generator().manual_seed(0)
    for da in DTYPES:
        for other in [*(_vals(db, (1, 5), g) for db in DTYPES), 0.5, 2, True, torch.tensor(0.5, dtype=torch.float64),
                      torch.tensor(1.0, dtype=torch.float32)]:
            a = _vals(da, (5, 3), g).t()  # strided
            try:
                ref = fn(a, other)
            except (RuntimeError, TypeError):  # torch refuses (bitwise ops on floats): serve() must too
                with pytest.raises((RuntimeError, TypeError)):
                    _served(fn, a, other)
                continue
            got, stats = _served(fn, a, other)
            assert _same(got, ref), (fn.__name__, da, other)
            launched = sum(s["certified"] + s["default"] for s in stats.values())
            fell = {why for s in stats.values() for why in s["reasons"]}
            # only float64 compute (an int or bool tensor against a 0-d float64 tensor) is torch's
            assert launched or all("float64" in why for why in fell), (da, other, fell)


def test_unary_and_where_equal_torch():
    g = torch.Generator().manual_seed(1)
    for da in DTYPES:
        x = _vals(da, (4, 7), g)
        assert _same(_served(torch.logical_not, x)[0], torch.logical_not(x))
        if not da.is_floating_point:
            assert _same(_served(torch.bitwise_not, x)[0], torch.bitwise_not(x))
        c = _vals(torch.bool, (2, 1, 7), g)
        for other in [*(_vals(db, (1, 7), g) for db in DTYPES), float("-inf"), -1, False]:
            for args in ((c, x, other), (c, other, x)):
                got, stats = _served(torch.where, *args)
                assert _same(got, torch.where(*args)), (da, other)
                assert stats["aten.where.self"]["torch"] == 0


def test_torchs_refusals_stay_torchs():
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError):
        _served(torch.bitwise_and, x, x)  # floats
    with pytest.raises(RuntimeError):
        _served(torch.where, x > 0, x, torch.randn(5))  # shapes
    with pytest.raises(RuntimeError):
        _served(torch.where, torch.ones(3, 4, dtype=torch.int64), x, x)  # a non-bool condition
    i = torch.tensor([1, -2], dtype=torch.int32)
    for fn in (lambda: torch.where(i > 0, i, 2**40), lambda: torch.scalar_tensor(2**40, dtype=torch.int32),
               lambda: torch.full((2,), 1e39)):
        with pytest.raises(RuntimeError):  # "value cannot be converted to type int without overflow"
            _served(fn)
    assert _same(_served(lambda: torch.scalar_tensor(-1e30, dtype=torch.float16))[0],
                 torch.scalar_tensor(-1e30, dtype=torch.float16))  # torch's -inf
    assert _same(_served(torch.gt, i, 2**40)[0], i > 2**40)  # a comparison wraps it, as torch does
    _, stats = _served(torch.gt, x, torch.randn(3, 4, dtype=torch.float64))
    assert "float64 is not served" in next(iter(stats["aten.gt.Tensor"]["reasons"]))


def test_rows_map_to_the_seats_serve_launches():
    # a wrapped number is a 0-d float64 operand in a trace, a Python float under serve()
    p = compare.SPEC.problem_from_row(make_row("aten.lt.Tensor", ["int64", "float64"], [(3, 5), ()]))
    assert p.dtypes == ("bool", "int64", "float64") and p.get("ct") == "float32"
    assert dict(p.flags) == {"fn": "lt", "layout": "same"}
    p = compare.SPEC.problem_from_row(make_row("aten.bitwise_and.Tensor", ["bool", "bool"], [(), (1, 1, 7, 7)]))
    assert dict(p.flags)["layout"] == "same" and p.dims == (49,)
    p = compare.SPEC.problem_from_row(make_row("aten.gt.Tensor", ["float16", "float32"], [(3, 5), ()]))
    assert p.get("ct") == "float16"
    assert isinstance(compare.SPEC.problem_from_row(make_row("aten.bitwise_or.Tensor", ["float32", "float32"],
                                                             [(3,), (3,)])), NotServable)
    p = select.SPEC.problem_from_row(make_row("aten.where.self", ["bool", "float16", "float64"], [(2, 1, 9), (2, 3, 9), ()]))
    assert p.dtypes == ("float16", "float16", "float64") and dict(p.flags) == {"layout": "bcast"}
    assert isinstance(select.SPEC.problem_from_row(make_row("aten.where.self", ["int64", "float32", "float32"],
                                                            [(3,), (3,), (3,)])), NotServable)
    p = fill.SPEC.problem_from_row(make_row("aten.new_ones", ["int64"], [(1, 1, 7, 1)], {"size": "()", "dtype": "bool"}))
    assert p.dtypes == ("bool",) and dict(p.flags) == {"fn": "full"} and p.get("value") == 1


def test_fills_shaped_by_a_tensor_equal_torch():
    x = torch.randn(3, 4)
    cases = [lambda: x.new_ones(()), lambda: x.new_ones((2, 3), dtype=torch.bool), lambda: x.new_zeros((5,)),
             lambda: x.new_full((2,), 7.5), lambda: torch.full_like(x, 3), lambda: torch.ones_like(x, dtype=torch.int64),
             lambda: torch.scalar_tensor(3), lambda: torch.scalar_tensor(True, dtype=torch.bool)]
    for c in cases:
        got, stats = _served(c)
        ref = c()
        assert _same(got, ref) and got.stride() == ref.stride()
        assert sum(s["certified"] + s["default"] for s in stats.values()) == 1


def _mask_program(x, kv):
    """A sliding-window causal mask as transformers builds it (new_ones, gt, le, bitwise_and,
    where with a Python number, scalar_tensor), and a repeat_kv's clone of expanded keys."""
    n = x.shape[-2]
    pos = torch.arange(n)
    q, k = pos.view(1, 1, n, 1), pos.view(1, 1, 1, n)
    ok = x.new_ones((), dtype=torch.bool) & (k <= q) & (q - k < 3)
    bias = torch.where(ok, 0.0, torch.finfo(x.dtype).min)
    fill_ = torch.scalar_tensor(0.0)
    keys = kv[:, :, None].expand(2, 2, 3, n, 8).reshape(2, 6, n, 8)  # a strided clone
    return (x + bias) * (ok != fill_), keys


def test_every_seat_serve_launches_is_a_seat_of_the_recorded_trace():
    # What a census of the trace certifies is what serve() then reads: new_ones' fill of
    # bool and the strided clone were seats no trace row mapped to.
    from nbx_tune.testing.model_zoo import missed_seats, trace_seats
    from nbx_tune.tuner.trace.recorder import Recorder

    x, kv = torch.randn(2, 1, 7, 7), torch.randn(2, 2, 7, 8)
    with Recorder() as rec:
        _mask_program(x, kv)
    launched = missed_seats(lambda: _mask_program(x, kv))
    assert any(s.startswith("copy|float32,float32|layout=strided") for s in launched)
    assert any(s.startswith("fill|bool|fn=full") for s in launched)
    assert launched - trace_seats(rec.rows, PROFILE) == set()


@pytest.mark.slow
def test_a_census_of_the_recorded_trace_leaves_no_default_launch_under_serve(tmp_path, db_url, monkeypatch):
    from nbx_tune.tuner import commands as api
    from nbx_tune.tuner.trace.recorder import record

    monkeypatch.setenv("NBX_TUNE_DB", db_url)
    x, kv = torch.randn(2, 1, 7, 7), torch.randn(2, 2, 7, 8)
    path = tmp_path / "mask.tsv"
    with record(str(path)):
        _mask_program(x, kv)
    rep = api.census(str(path), db_url, isolate=False)
    assert not [s for s in rep.seats if s.status != "certified"], [(s.label, s.status) for s in rep.seats]
    certified.reload()
    serving.reset_stats()
    with nbx_tune.serve(fuse=False):
        got = _mask_program(x, kv)
    ref = _mask_program(x, kv)
    assert all(_same(g, r) for g, r in zip(got, ref))
    stats = serving.stats()
    for op in ("aten.new_ones", "aten.le.Tensor", "aten.bitwise_and.Tensor", "aten.where.self", "aten.clone",
               "aten.scalar_tensor"):
        assert stats[op]["certified"] >= 1, (op, stats.get(op))
    assert {op: s["default"] for op, s in stats.items() if s["default"]} == {}
    assert "aten.fill_.Scalar" not in stats  # new_ones served whole, as recorded
    assert "layout=strided" in path.read_text()  # the clone's row says what serve() launches


def test_casts_to_bool_are_served_as_torch_casts():
    # an attention mask's .bool(): every family handed it to torch before
    m = torch.tensor([[0, 1, 5], [-3, 0, 0]])
    x = torch.tensor([0.0, -0.0, float("nan"), float("inf"), 1e-45, -2.5])
    for t in (m, x, x.half(), m.t()):
        got, stats = _served(lambda: t.bool())
        assert _same(got, t.bool()) and stats["aten._to_copy"]["torch"] == 0

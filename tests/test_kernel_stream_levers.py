"""The stream levers of the element-wise and copy kernels on the interpreter: every config of
their spaces (persistent grids, evict-first loads, unmasked full blocks, large blocks,
blocks shrunk to fill the SMs)
against fp64 oracles at odd sizes and at whole blocks, the unary kernel's strided input
(rotary's x[..., 64:] read in place, no staging copy) and the one-launch cat of two
halves of a contiguous tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import registered_here
from nbx_tune.kernels import copy as cp
from nbx_tune.kernels import elementwise as ew
from nbx_tune.kernels.spec import Config, Problem, seat_flags
from nbx_tune.oracles import elementwise as oracle
from nbx_tune.oracles import movement as moracle
from nbx_tune.profiles import get_profile

RTOL = {torch.float16: 2e-2, torch.float32: 1e-5}
# Small blocks on a one-SM stand-in: a persistent grid of 2 programs loops over many blocks.
LOOPING = (Config.make(BLOCK_SIZE=64, num_warps=2, num_stages=1, PERSIST=2),
           Config.make(BLOCK_SIZE=32, num_warps=1, num_stages=1, PERSIST=1, EVICT=1),
           Config.make(BLOCK_SIZE=1024, num_warps=1, num_stages=1, FILL=3))


@pytest.fixture(autouse=True)
def _registered():
    with registered_here(ew.SPECS + cp.SPECS):
        yield


@pytest.fixture
def one_sm(monkeypatch):
    monkeypatch.setattr(cp, "INTERPRETER_SMS", 1)
    monkeypatch.setattr(cp, "_sms", {})
    monkeypatch.setattr(cp, "_stream_memo", {})


def _launches(monkeypatch) -> list:
    from nbx_tune.kernels.runtime import launch

    names, real = [], launch.through_triton

    def logged(kernel, grid, args, kwargs):
        names.append(kernel.fn.__name__)
        return real(kernel, grid, args, kwargs)

    monkeypatch.setattr(launch, "through_triton", logged)
    return names


def _err(got: torch.Tensor, ref: np.ndarray) -> float:
    got = got.to(torch.float64).numpy()
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-300))


def _inputs(dtype, g):
    """(name, x): contiguous odd and whole-block sizes, rotary's half of a contiguous
    tensor, a transpose, a 1-D step, and six unmergeable dims (staged by a copy)."""
    base = torch.randn(3, 5, 2 * 37, generator=g, dtype=torch.float64).to(dtype)
    six = torch.randn(2, 3, 2, 3, 2, 3, generator=g, dtype=torch.float64).to(dtype).permute(5, 4, 3, 2, 1, 0)
    return [("odd", torch.randn(1001, generator=g, dtype=torch.float64).to(dtype)),
            ("whole", torch.randn(4, 512, generator=g, dtype=torch.float64).to(dtype)),
            ("half", base[..., 37:]), ("first_half", base[..., :37]),
            ("transposed", base[0].t()), ("step", base.flatten()[::3]),
            ("six_dims", six)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_every_unary_config_contiguous_and_strided_against_fp64(dtype, one_sm):
    g = torch.Generator().manual_seed(0)
    cases = [("neg", (0.0, 0.0, 0.0), oracle.neg), ("silu", (0.0, 0.0, 0.0), oracle.silu),
             ("pow", ew.pow_params(2), lambda v: oracle.pow(v, 2))]
    for name, x in _inputs(dtype, g):
        ref_x = x.to(torch.float64).numpy()
        for i, config in enumerate(ew.CONFIGS + LOOPING):
            fn, params, ref = cases[i % len(cases)]
            y = torch.full(x.shape, float("nan"), dtype=dtype)
            try:
                plan = ew.unary_plan(x)
            except ValueError:  # more merged dims than the kernel takes: the caller stages
                assert name == "six_dims"
                plan, x_in = None, x.contiguous()
            else:
                assert name != "six_dims" and (plan[0] == 0) == (name in ("odd", "whole"))
                x_in = x
            ew.launch_unary(x_in, y, fn, params, config, plan)
            assert _err(y, ref(ref_x)) <= RTOL[dtype], (name, str(config), fn)


def test_strided_neg_is_one_launch_and_exact(monkeypatch):
    launched = _launches(monkeypatch)
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(2, 3, 5, 2 * 9, generator=g).to(dtype)
        for half in (x[..., 9:], x[..., :9], x.transpose(1, 2)):
            launched.clear()
            y = ew.neg(half)
            assert y.is_contiguous() and torch.equal(y, -half)
            assert launched == ["_unary_kernel"]  # read in place: no staging copy
    six = torch.randn(2, 3, 2, 3, 2, 3, generator=g).permute(5, 4, 3, 2, 1, 0)
    launched.clear()
    assert torch.equal(ew.neg(six), -six)
    assert launched == ["_unary_kernel"]  # six merged dims: staged by `dense` (torch's copy there)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_every_binary_config_every_layout_against_fp64(dtype, one_sm):
    g = torch.Generator().manual_seed(2)

    def t(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    cases = [("add", lambda a, b: oracle.add(a, b, 0.5), t(7, 143), t(7, 143), 0.5),  # odd, same
             ("mul", oracle.mul, t(4, 512), t(512), 1.0),  # whole blocks, a row broadcast
             ("sub", lambda a, b: oracle.sub(a, b), t(1001), None, 1.0),  # a Python number
             ("maximum", oracle.maximum, t(3, 5, 37)[..., 1:], t(3, 5, 36), 1.0)]  # strided a
    for i, config in enumerate(ew.CONFIGS + LOOPING):
        fn, ref, a, b, alpha = cases[i % len(cases)]
        out = torch.full(torch.broadcast_shapes(a.shape, () if b is None else b.shape), float("nan"), dtype=dtype)
        ew.launch_binary(a, b, out, fn, 1.5, alpha, config)
        want = ref(a.double().numpy(), 1.5 if b is None else b.double().numpy())
        assert _err(out, want) <= RTOL[dtype], (fn, str(config))


def test_every_binary_config_integers_exact(one_sm):
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-1000, 1000, (1037,), generator=g)
    b = torch.randint(-1000, 1000, (1037,), generator=g)
    for config in ew.CONFIGS + LOOPING:
        out = torch.zeros(1037, dtype=torch.int64)
        ew.launch_binary(a, b, out, "sub", 0, 3, config)
        assert np.array_equal(out.numpy(), a.numpy().astype(np.int64) - 3 * b.numpy().astype(np.int64)), str(config)


def test_every_flat_copy_config_casts_bit_for_bit(one_sm):
    g = torch.Generator().manual_seed(4)
    pairs = [(torch.float32, torch.float16), (torch.float16, torch.float32), (torch.int64, torch.float32)]
    for src, dst in pairs:
        for n in (1001, 2048):  # a masked tail; whole blocks
            if src.is_floating_point:
                x = (torch.randn(n, generator=g, dtype=torch.float64) * 2.0 ** 12).to(src)
            else:
                x = torch.randint(-2**40, 2**40, (n,), generator=g)
            want = moracle.cast(x.numpy(), str(dst).removeprefix("torch."))
            for config in cp.FLAT_CONFIGS + LOOPING:
                y = torch.full((n,), float("nan"), dtype=dst)
                cp.launch_copy(x, y, config)
                assert np.array_equal(y.numpy(), want.astype(y.numpy().dtype)), (src, dst, n, str(config))


def test_stream_levers_are_the_flat_copys_only():
    profile = get_profile("interpreter")
    strided = Problem("copy", ("float32", "float16"), seat_flags(layout="strided"), (100,), (("shape", (100,)),))
    flat = Problem("copy", ("float32", "float16"), seat_flags(layout="flat"), (100,), (("shape", (100,)),))
    levers = [c for c in cp.FLAT_CONFIGS if cp._base(c) is not c]
    assert levers and all(c not in cp.CAT_SPEC.configs() for c in levers)
    for c in cp.FLAT_CONFIGS:
        refused = cp.COPY_SPEC.static_refusal(profile, c, strided)
        assert (refused is not None and refused[0] == "not_applicable") == (c in levers)
        assert cp.COPY_SPEC.static_refusal(profile, c, flat) is None
    assert cp._base(levers[0]).key() == f"BLOCK_SIZE={levers[0]['BLOCK_SIZE']},num_warps={levers[0].num_warps},num_stages=1"


def test_stream_launch_persistent_grid_fill_and_masks(one_sm):
    cpu = torch.device("cpu")

    def launch(n, **meta):
        grid, kw = cp.stream_launch(n, Config.make(num_warps=1, num_stages=1, **meta), cpu)
        return grid[0], kw["BLOCK_SIZE"], kw["MASKED"], kw.get("PERSIST"), "FILL" in kw

    assert launch(1001, BLOCK_SIZE=64) == (16, 64, True, None, False)
    assert launch(1024, BLOCK_SIZE=64) == (16, 64, False, None, False)  # whole blocks: no mask
    assert launch(1024, BLOCK_SIZE=64, PERSIST=3) == (3, 64, False, 3, False)  # 3 programs per SM, one SM
    assert launch(100, BLOCK_SIZE=64, PERSIST=3) == (2, 64, True, 3, False)  # never more programs than blocks
    # FILL: the block halves until the grid has FILL programs per SM, down to 128 a warp
    assert launch(1000, BLOCK_SIZE=1024, FILL=2) == (2, 512, True, None, False)
    assert launch(4096, BLOCK_SIZE=1024, FILL=8) == (8, 512, False, None, False)
    assert launch(256, BLOCK_SIZE=1024, FILL=8) == (2, 128, False, None, False)  # the floor
    assert launch(1 << 20, BLOCK_SIZE=1024, FILL=8) == (1024, 1024, False, None, False)


def test_row_stride_of_halves_transposes_and_expands():
    x = torch.empty(2, 3, 5, 18)
    assert cp.row_stride(x.shape, x.stride(), 3) == 18
    assert cp.row_stride(x[..., 9:].shape, x[..., 9:].stride(), 3) == 18  # a half: the full row apart
    assert cp.row_stride(x[:, 1:].shape, x[:, 1:].stride(), 1) == 270  # one outer dim
    assert cp.row_stride(x[:, 1:].shape, x[:, 1:].stride(), 2) is None  # outer dims that do not merge
    assert cp.row_stride(x.transpose(2, 3).shape, x.transpose(2, 3).stride(), 3) is None
    e = torch.empty(1, 7).expand(4, 7)
    assert cp.row_stride(e.shape, e.stride(), 1) == 0  # every row the same one


@pytest.mark.parametrize("dt", (torch.float32, torch.float16, torch.int64), ids=str)
def test_cat_of_strided_halves_is_one_launch(dt, monkeypatch):
    """rotate_half: cat((-x2, x1), -1) with x1 = x[..., :d] a strided half of x."""
    launched = _launches(monkeypatch)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 3, 5, 2 * 7, generator=g) * 100).to(dt)
    x1, x2 = x[..., :7], x[..., 7:]
    for xs, dim in (([-x2.contiguous(), x1], -1), ([x2, x1], -1), ([x1, x2], 3), ([x[:, 1:], x[:, :2]], 1)):
        launched.clear()
        got = cp.cat(xs, dim)
        assert torch.equal(got, torch.cat(xs, dim)) and got.dtype == dt
        assert np.array_equal(got.numpy(), moracle.cat([t.numpy() for t in xs], dim))
        assert launched == ["_cat2_kernel"], (dim, launched)
    # every config, and small tiles: many programs, a row split over column blocks, 1-D
    small = [Config.make(BLOCK_SIZE=b, num_warps=1, num_stages=1) for b in (4, 32)]
    v = (torch.randn(37, generator=g) * 100).to(dt)
    for cfg in (*cp.CAT_SPEC.configs(), *small):
        out = torch.zeros(2, 3, 5, 14, dtype=dt)
        cp.launch_cat([x2, x1], out, -1, cfg)
        assert torch.equal(out, torch.cat([x2, x1], -1)), str(cfg)
        out = torch.zeros(37 + 30, dtype=dt)
        cp.launch_cat([v, v[3:33]], out, 0, cfg)
        assert torch.equal(out, torch.cat([v, v[3:33]], 0)), str(cfg)
    assert cp.cat2_tile(96, 128, 8192) == (64, 128) and cp.cat2_tile(1, 10**6, 1024) == (1, 1024)
    assert cp.cat2_tile(5, 3, 4) == (1, 4)

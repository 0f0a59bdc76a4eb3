"""Reductions on the interpreter: sum / mean / amax / amin over odd shapes and dim sets
against the fp64 oracle (integers bit-exactly) under several configs, the split (two-pass)
path, the public ops against torch, trace rows to problems, refusals, planted faults."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import registered_here
from nbx_tune.errors import KernelError
from nbx_tune.kernels import reduce as rd
from nbx_tune.kernels.runtime.registry import spec_for_op
from nbx_tune.kernels.spec import Config, NotServable, Problem, seat_flags
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.certify.selfcheck import check_kernel
from nbx_tune.kernels.trace import make_row

PROFILE = get_profile("interpreter")
SPEC = rd.SPEC


@pytest.fixture(autouse=True)
def _registered():
    with registered_here(rd.SPECS):
        yield


def _err(got: torch.Tensor, ref) -> float:
    got = got.to(torch.float64).numpy()
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-300))


# ----------------------------------------------------------------------------- self-check

@pytest.mark.slow
def test_selfcheck_small_rows_pass_the_screen():
    checks = check_kernel(SPEC, PROFILE, "cpu", "small", configs_per_row=3)
    bad = [(c.op, c.shapes, c.dtype, str(c.config), c.reason, c.detail) for c in checks if not c.ok]
    assert not bad
    assert all(c.err is not None and c.err <= c.rtol for c in checks)
    assert {c.dtype for c in checks} >= {"float16", "float32", "int32", "int64"}  # outputs
    ints = [c for c in checks if c.dtype in ("int32", "int64")]
    assert ints and all(c.rtol == 0 and c.err == 0 for c in ints)  # bit-exact
    problems = [SPEC.problem_from_row(r) for r in SPEC.example_rows("small")]
    assert {p.dtypes[1] for p in problems} == set(rd.TORCH_DTYPES)  # inputs
    assert {dict(p.flags)["fn"] for p in problems} == {"sum", "mean", "amax", "amin"}
    assert {dict(p.flags)["inner"] for p in problems} == {"0", "1"}
    assert len({str(c.config) for c in checks}) >= 4


def test_gpu_rows_are_servable_and_claim_every_dtype():
    problems = [SPEC.problem_from_row(r) for r in SPEC.example_rows("gpu")]
    assert not [p for p in problems if isinstance(p, NotServable)]
    assert {p.dtypes[1] for p in problems} == set(rd.TORCH_DTYPES)
    assert ("int64", "int64") in {p.dtypes for p in problems}


SPLIT_ROWS = [
    make_row("aten.sum.dim_IntList", ["float32"], [(2, 3001)], {"dim": "-1"}),
    make_row("aten.sum", ["int64"], [(1000,)]),
    make_row("aten.mean.dim", ["float16"], [(1500, 7)], {"dim": "0", "keepdim": "True"}),
    make_row("aten.sum.dim_IntList", ["int32"], [(700, 3)], {"dim": "0"}),
]


@pytest.mark.parametrize("row", SPLIT_ROWS, ids=lambda r: f"{r.op}:{r.dtypes[0]}:{r.shapes[0]}")
def test_split_configs_reduce_partials_correctly(row):
    p = SPEC.problem_from_row(row)
    case = screening.make_case(SPEC, p, "cpu", 11, True)
    rtol = PROFILE.rtol(p.dtypes[0])
    split = [c for c in SPEC.configs() if c["SPLIT"] > 1 and rd._split_of(p.dims[1], c["BLOCK_R"], c["SPLIT"])[0] > 1]
    assert split  # the row does take the two-pass path
    for c in split[:3]:
        r = screening.screen(SPEC, c, case, rtol, "cpu")
        assert r.ok, (str(c), r.reason, r.detail)


def test_config_space_and_defaults():
    cs = SPEC.configs()
    assert 15 <= len(cs) <= 40 and len(set(cs)) == len(cs)
    assert {c["SPLIT"] for c in cs} > {1}
    assert all(c.num_stages == 1 for c in cs)

    def prob(O, R, inner, dt="float32"):
        return Problem("reduce", (dt, dt), seat_flags(fn="sum", inner=inner), (O, R))

    assert SPEC.default_config(PROFILE, prob(4096, 4096, 1))["BLOCK_O"] == 1
    assert SPEC.default_config(PROFILE, prob(4096, 4096, 0))["BLOCK_O"] >= 64
    assert SPEC.default_config(PROFILE, prob(1, 1 << 20, 1))["SPLIT"] > 1
    for c in cs:
        smem = SPEC.smem_bytes(c, prob(1000, 1000, 1, "int64"))
        assert 0 < smem <= PROFILE.memory.max_shared_memory_per_block
        assert smem > SPEC.smem_bytes(c, prob(1000, 1000, 1))  # int64 partials are wider


# ----------------------------------------------------------------------------- public ops

@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_public_ops_against_torch(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(3, 5, 7, generator=g, dtype=torch.float64) * 3 - 1).to(dtype)
    xd = x.double()
    rtol = 2e-2 if dtype == torch.float16 else 1e-4
    cases = [
        (rd.sum(x, -1), xd.sum(-1), x.sum(-1)),
        (rd.sum(x, (0, 2), keepdim=True), xd.sum((0, 2), keepdim=True), x.sum((0, 2), keepdim=True)),
        (rd.sum(x), xd.sum(), x.sum()),
        (rd.mean(x, (0, 2)), xd.mean((0, 2)), x.mean((0, 2))),
        (rd.mean(x, 1, keepdim=True), xd.mean(1, keepdim=True), x.mean(1, keepdim=True)),
        (rd.amax(x, -1), xd.amax(-1), x.amax(-1)),
        (rd.amax(x), xd.amax(), x.amax()),
        (rd.amin(x, (0, 1)), xd.amin((0, 1)), x.amin((0, 1))),
        (rd.sum(x, -2, dtype=torch.float32), xd.sum(-2), x.sum(-2, dtype=torch.float32)),
    ]
    for i, (got, ref, want) in enumerate(cases):
        assert got.shape == want.shape and got.dtype == want.dtype, i
        assert _err(got, ref.numpy()) <= rtol, i
    # a non-contiguous view, reduced through its strides
    xt = x.permute(2, 0, 1)
    assert _err(rd.sum(xt, (1, 2)), xd.permute(2, 0, 1).sum((1, 2)).numpy()) <= rtol
    assert _err(rd.amax(xt, 0), xd.permute(2, 0, 1).amax(0).numpy()) == 0


def test_integer_sums_are_exact_and_int64():
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-2**31, 2**31 - 1, (37, 45), generator=g, dtype=torch.int32)
    b = torch.randint(-2**62, 2**62, (3, 5, 7), generator=g, dtype=torch.int64)
    assert rd.sum(a, -1).dtype == torch.int64 and torch.equal(rd.sum(a, -1), a.sum(-1))
    assert torch.equal(rd.sum(a), a.sum())
    assert torch.equal(rd.sum(b, (0, 2)), b.sum((0, 2)))  # wraps like torch
    assert torch.equal(rd.sum(a, 0, dtype=torch.int32), a.sum(0, dtype=torch.int32))
    assert torch.equal(rd.amax(b, 1), b.amax(1)) and torch.equal(rd.amin(a, 0), a.amin(0))
    m = torch.rand(37, 45, generator=g) < 0.3
    assert torch.equal(rd.sum(m, 0), m.sum(0)) and rd.sum(m).dtype == torch.int64
    assert _err(rd.mean(a, 1, dtype=torch.float32), a.double().mean(1).numpy()) <= 1e-6


def test_nan_propagates_through_amax_amin():
    x = torch.randn(4, 9)
    x[1, 3] = float("nan")
    assert torch.equal(rd.amax(x, 1).isnan(), torch.tensor([False, True, False, False]))
    assert torch.equal(rd.amin(x, 1).isnan(), torch.tensor([False, True, False, False]))
    assert torch.isnan(rd.amax(x))


def test_public_op_errors():
    with pytest.raises(KernelError):
        rd.mean(torch.ones(3, 4, dtype=torch.int32), 1)
    with pytest.raises(KernelError):
        rd.sum(torch.ones(3, 4), 2)
    with pytest.raises(KernelError):
        rd.sum(torch.ones(3, 4), (1, 1))
    with pytest.raises(KernelError):
        rd.amax(torch.ones(3, 4, dtype=torch.float64), 1)
    with pytest.raises(KernelError):
        rd.sum(torch.ones(3, 4), 1, dtype=torch.float16)


# ----------------------------------------------------------------------------- trace rows

def test_recorded_rows_map_to_the_public_ops_seats(monkeypatch):
    from nbx_tune.tuner.trace.recorder import Recorder

    x = torch.randn(4, 6, 5, 7, dtype=torch.float16)
    i = torch.randint(0, 5, (4, 5), dtype=torch.int32)
    with Recorder() as rec:
        x.sum(-1); x.sum(); x.mean((2, 3), keepdim=True); x.amax(-1); x.amax(); i.sum(); i.sum(0)  # noqa: E702
        x.sum(dtype=torch.float32); x.amin(0)  # noqa: E702
    rows = [r for r in rec.rows if spec_for_op(r.op) is SPEC]
    assert len(rows) == 9
    problems = [SPEC.problem_from_row(r) for r in rows]
    assert not [p for p in problems if isinstance(p, NotServable)]
    got = [(p.dtypes, dict(p.flags), p.dims) for p in problems]
    assert got == [
        (("float16", "float16"), {"fn": "sum", "inner": "1"}, (120, 7)),
        (("float16", "float16"), {"fn": "sum", "inner": "1"}, (1, 840)),
        (("float16", "float16"), {"fn": "mean", "inner": "1"}, (24, 35)),
        (("float16", "float16"), {"fn": "amax", "inner": "1"}, (120, 7)),
        (("float16", "float16"), {"fn": "amax", "inner": "1"}, (1, 840)),
        (("int64", "int32"), {"fn": "sum", "inner": "1"}, (1, 20)),
        (("int64", "int32"), {"fn": "sum", "inner": "0"}, (5, 4)),
        (("float32", "float16"), {"fn": "sum", "inner": "1"}, (1, 840)),
        (("float16", "float16"), {"fn": "amin", "inner": "0"}, (210, 4)),
    ]
    # The public ops land on the same seats.
    seen = []
    real = rd.config_for
    monkeypatch.setattr(rd, "config_for", lambda spec, dt, fl, dims:
                        seen.append((spec.name, dt, fl, dims)) or real(spec, dt, fl, dims))
    rd.sum(x, -1); rd.sum(x); rd.mean(x, (2, 3), keepdim=True); rd.amax(x, -1); rd.amax(x)  # noqa: E702
    rd.sum(i); rd.sum(i, 0); rd.sum(x, dtype=torch.float32); rd.amin(x, 0)  # noqa: E702
    assert seen == [(p.kernel, p.dtypes, p.flags, p.dims) for p in problems]


def test_problem_dims_for_strided_patterns():
    # (3, 5, 7) over (0, 2): kept 5 in the middle, 21 reduced in two groups
    p = SPEC.problem_from_row(make_row("aten.sum.dim_IntList", ["float32"], [(3, 5, 7)], {"dim": "0x-1"}))
    assert p.dims == (5, 21) and dict(p.flags)["inner"] == "1" and p.get("dims") == (0, 2)
    # size-1 dims vanish; reducing only them is R = 1, a copy across rows
    p = SPEC.problem_from_row(make_row("aten.amax", ["float16"], [(4, 1, 6)], {"dim": "1", "keepdim": "True"}))
    assert p.dims == (24, 1) and dict(p.flags)["inner"] == "0"
    assert SPEC.output_specs(p)["out"] == ((4, 1, 6), "float16")
    # a 0-d input
    p = SPEC.problem_from_row(make_row("aten.sum", ["int32"], [()]))
    assert p.dims == (1, 1) and SPEC.output_specs(p)["out"] == ((), "int64")


BAD_ROWS = [
    make_row("aten.sum.dim_IntList", ["float16", "float16"], [(5, 7), (5, 7)], {"dim": "1"}),
    make_row("aten.sum.dim_IntList", ["float64"], [(5, 7)], {"dim": "1"}),
    make_row("aten.sum.dim_IntList", ["complex64"], [(5, 7)], {"dim": "1"}),
    make_row("aten.sum.dim_IntList", ["float16"], [(5, 7)], {"dim": "2"}),
    make_row("aten.sum.dim_IntList", ["float16"], [(5, 7)], {"dim": "-3"}),
    make_row("aten.sum.dim_IntList", ["float16"], [(5, 7)], {"dim": "1x-1"}),
    make_row("aten.sum.dim_IntList", ["float16"], [(5, 7)], {"dim": "one"}),
    make_row("aten.sum.dim_IntList", ["float16"], [(5, 7)], {"dim": "1", "keepdim": "maybe"}),
    make_row("aten.sum.dim_IntList", ["float16"], [(5, 0)], {"dim": "1"}),
    make_row("aten.sum.dim_IntList", ["float32"], [(5, 7)], {"dim": "1", "dtype": "float16"}),
    make_row("aten.sum.dim_IntList", ["float16"], [(5, 7)], {"dim": "1", "dtype": "int64"}),
    make_row("aten.sum.dim_IntList", ["float16"], [(5, 7)], {"dim": "1", "foo": "1"}),
    make_row("aten.sum.dim_DimnameList", ["float16"], [(5, 7)], {"dim": "N"}),
    make_row("aten.mean.dim", ["int32"], [(5, 7)], {"dim": "1"}),
    make_row("aten.mean.dim", ["float16"], [(5, 7)], {"dim": "1", "dtype": "int64"}),
    make_row("aten.amax", ["bool"], [(5, 7)], {"dim": "1"}),
    make_row("aten.amax", ["float16"], [(5, 7)], {"dim": "1", "dtype": "float32"}),
    make_row("aten.sum", ["float16"], [(5, 7)], {"dim": "1"}),
    make_row("aten.amin.out", ["float16", "float16"], [(5, 7), (5,)], {"dim": "1"}),
    # 4 kept groups between reduced dims: more than the kernel decomposes
    make_row("aten.sum.dim_IntList", ["float16"], [(2, 3, 2, 3, 2, 3, 2, 3)], {"dim": "1x3x5x7"}),
]


@pytest.mark.parametrize("row", BAD_ROWS, ids=lambda r: f"{r.op}:{r.dtypes}:{r.shapes}:{dict(r.params)}")
def test_bad_rows_are_not_servable(row):
    spec = spec_for_op(row.op)
    assert spec is SPEC
    p = SPEC.problem_from_row(row)
    assert isinstance(p, NotServable) and p.reason


# ----------------------------------------------------------------------------- planted faults

class _ShortRows(rd.ReduceSpec):
    """Reduces one element fewer per output than asked: a loop-bound fault."""

    name = "reduce_short"

    def launch(self, config, problem, inputs, outputs):
        x = inputs["x"].reshape(tuple(problem.get("shape")))
        rd.launch_reduce(x[..., :-1], outputs["out"], tuple(problem.get("dims")),
                         dict(problem.flags)["fn"], config)


def test_the_screen_catches_planted_faults():
    spec = _ShortRows()
    cfg = Config.make(BLOCK_O=4, BLOCK_R=256, SPLIT=1, num_warps=4, num_stages=1)
    for row in (make_row("aten.sum.dim_IntList", ["int64"], [(37, 45)], {"dim": "-1"}),
                make_row("aten.sum.dim_IntList", ["float32"], [(37, 45)], {"dim": "-1"})):
        p = spec.problem_from_row(row)
        case = screening.make_case(spec, p, "cpu", 5, True)
        rtol = PROFILE.rtol(p.dtypes[0])
        assert screening.screen(spec, cfg, case, rtol, "cpu").reason == "wrong_answer"
        assert screening.screen(SPEC, cfg, case, rtol, "cpu").ok


def test_int64_offsets_path(monkeypatch):
    """Past INDEX_LIMIT elements the kernel indexes in int64: forced here at a small size."""
    monkeypatch.setattr(rd, "INDEX_LIMIT", 16)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(37, 45, generator=g)
    i = torch.randint(-2**40, 2**40, (3, 5, 7), generator=g)
    assert _err(rd.sum(x, -1), x.double().sum(-1).numpy()) <= 1e-5
    assert _err(rd.mean(x, 0), x.double().mean(0).numpy()) <= 1e-5
    assert torch.equal(rd.sum(i, (0, 2)), i.sum((0, 2)))
    cfg = Config.make(BLOCK_O=1, BLOCK_R=256, SPLIT=32, num_warps=4, num_stages=1)  # two passes
    out = torch.empty((), dtype=torch.int64)
    rd.launch_reduce(i, out, (0, 1, 2), "sum", cfg)
    assert out.item() == i.sum().item()

"""Element-wise kernels on the interpreter: every unary and binary op against its fp64 oracle
at odd shapes under several configs, the public ops against the oracle and torch's dtypes,
trace rows (as the recorder writes them) to problems, refusals, and planted wrong results."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import registered_here
from nbx_tune.kernels import elementwise as ew
from nbx_tune.kernels.runtime.registry import spec_for_op
from nbx_tune.kernels.spec import Config, NotServable
from nbx_tune.oracles import elementwise as oracle
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.certify.selfcheck import check_kernel
from nbx_tune.kernels.trace import make_row

PROFILE = get_profile("interpreter")
RTOL = {torch.float16: 2e-2, torch.float32: 1e-4}


@pytest.fixture(autouse=True)
def _registered():
    with registered_here(ew.SPECS):
        yield


def _err(got: torch.Tensor, ref: np.ndarray) -> float:
    got = got.to(torch.float64).numpy()
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-300))


# ----------------------------------------------------------------------------- self-check

@pytest.mark.parametrize("spec", ew.SPECS, ids=lambda s: s.name)
def test_selfcheck_small_rows_pass_the_screen(spec):
    checks = check_kernel(spec, PROFILE, "cpu", "small", configs_per_row=3)
    bad = [(c.op, c.shapes, c.dtype, str(c.config), c.reason, c.detail) for c in checks if not c.ok]
    assert not bad
    assert all(c.err is not None and c.err <= c.rtol for c in checks)
    # every op in fp16 and fp32, and several distinct configs
    rows = [spec.problem_from_row(r) for r in spec.example_rows("small")]
    fns = {dict(p.flags)["fn"] for p in rows if p.dtypes[0] != "bfloat16"}
    assert fns == set(ew.UNARY_FNS if spec is ew.UNARY_SPEC else ew.BINARY_FNS)
    assert {c.dtype for c in checks} >= {"float16", "float32"}
    assert len({c.config["BLOCK_SIZE"] for c in checks}) >= 3
    if spec is ew.BINARY_SPEC:
        assert {dict(p.flags)["layout"] for p in rows} == {"same", "scalar", "bcast"}


def test_gpu_rows_are_servable_and_claim_every_dtype():
    for spec in ew.SPECS:
        problems = [spec.problem_from_row(r) for r in spec.example_rows("gpu")]
        assert not [p for p in problems if isinstance(p, NotServable)]
        floats = {"float16", "bfloat16", "float32"}
        assert {p.dtypes[0] for p in problems} - {"int32", "int64"} == floats


def test_config_space():
    for spec in ew.SPECS:
        cs = spec.configs()
        assert 10 <= len(cs) <= 26 and len(set(cs)) == len(cs)
        assert all(c.num_stages == 1 for c in cs)
        # the stream levers of mid-size launches: a persistent grid, evict-first loads
        metas = [dict(c.meta) for c in cs]
        assert any(m.get("PERSIST") for m in metas) and any(m.get("EVICT") for m in metas)
        assert len({c["BLOCK_SIZE"] for c in cs}) >= 5 and len({c.num_warps for c in cs}) >= 3
        assert spec.default_config(PROFILE, None) in cs
        assert all(spec.smem_bytes(c, None) == 0 for c in cs)


# ----------------------------------------------------------------------------- public ops

UNARY_CASES = [
    ("relu", ew.relu, (), lambda x: oracle.relu(x), "normal"),
    ("gelu", ew.gelu, (), lambda x: oracle.gelu(x), "normal"),
    ("gelu_tanh", lambda x: ew.gelu(x, approximate="tanh"), (), lambda x: oracle.gelu(x, "tanh"), "normal"),
    ("silu", ew.silu, (), oracle.silu, "normal"),
    ("sigmoid", ew.sigmoid, (), oracle.sigmoid, "normal"),
    ("tanh", ew.tanh, (), oracle.tanh, "normal"),
    ("exp", ew.exp, (), oracle.exp, "normal"),
    ("log", ew.log, (), oracle.log, "positive"),
    ("neg", ew.neg, (), oracle.neg, "normal"),
    ("rsqrt", ew.rsqrt, (), oracle.rsqrt, "positive"),
    ("sqrt", ew.sqrt, (), oracle.sqrt, "positive"),
    ("sin", ew.sin, (), oracle.sin, "normal"),
    ("cos", ew.cos, (), oracle.cos, "normal"),
    ("pow3", lambda x: ew.pow(x, 3), (), lambda x: oracle.pow(x, 3), "normal"),
    ("pow-2", lambda x: ew.pow(x, -2), (), lambda x: oracle.pow(x, -2), "positive"),
    ("pow1.5", lambda x: ew.pow(x, 1.5), (), lambda x: oracle.pow(x, 1.5), "positive"),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_unary_public_ops(dtype):
    g = torch.Generator().manual_seed(0)
    for name, op, _, ref, dist in UNARY_CASES:
        x = torch.randn(3, 37, 5, generator=g) * 1.5
        if dist == "positive":
            x = x.abs() + 0.1
        x = x.to(dtype)
        y = op(x)
        assert y.dtype == dtype and y.shape == x.shape, name
        assert _err(y, ref(x.to(torch.float64).numpy())) <= RTOL[dtype], name


def test_pow_by_a_small_integer_is_products():
    # Square and cube (RMS norm's x.pow(2), GPT-2's gelu x**3) run as products: exactly
    # torch's x * x, specials included; other exponents keep the exp2/log2 path.
    x = torch.tensor([1.1, -3.7, 1e-3, 0.0, float("inf"), -float("inf"), float("nan"), 7.3e18])
    for e in (1, 2, 3):
        assert torch.equal(ew.pow(x, e).nan_to_num(123.0), (x ** e).nan_to_num(123.0)), e
    assert [ew.small_int_pow("pow", ew.pow_params(e)) for e in (2, 3.0, 4, 2.5, -2, 0)] == [2, 3, 0, 0, 0, 0]
    assert ew.small_int_pow("exp", (2.0, 1.0, 0.0)) == 0


def test_unary_special_values_and_non_contiguous_input():
    x = torch.tensor([float("nan"), 0.0, -0.0, -3.0, 2.0, float("inf"), -float("inf")])
    assert torch.isnan(ew.relu(x)[0]) and ew.relu(x)[3] == 0
    assert torch.equal(ew.tanh(torch.tensor([50.0, -50.0, 0.0])), torch.tensor([1.0, -1.0, 0.0]))
    assert ew.pow(torch.tensor([-2.0, 0.0, 3.0]), 0).tolist() == [1.0, 1.0, 1.0]
    assert ew.pow(torch.tensor([-2.0, 2.0]), 3).tolist() == pytest.approx([-8.0, 8.0], rel=1e-6)
    assert torch.isnan(ew.pow(torch.tensor([-2.0]), 0.5)[0])
    assert ew.pow(torch.tensor([0.0]), 2).item() == 0.0 and math.isinf(ew.pow(torch.tensor([0.0]), -1).item())
    xt = torch.randn(45, 37).t()  # non-contiguous
    assert _err(ew.exp(xt), np.exp(xt.double().numpy())) <= 1e-5
    assert ew.relu(torch.empty(0, 3)).shape == (0, 3)


BINARY_CASES = [
    ("add", lambda a, b: ew.add(a, b), lambda a, b: oracle.add(a, b)),
    ("add_alpha", lambda a, b: ew.add(a, b, alpha=-2), lambda a, b: oracle.add(a, b, -2)),
    ("sub", lambda a, b: ew.sub(a, b, alpha=0.5), lambda a, b: oracle.sub(a, b, 0.5)),
    ("rsub", lambda a, b: ew.rsub(a, b), lambda a, b: oracle.rsub(a, b)),
    ("mul", ew.mul, oracle.mul),
    ("div", ew.div, oracle.div),
    ("maximum", ew.maximum, oracle.maximum),
    ("minimum", ew.minimum, oracle.minimum),
]


def _operand(shape, g, dtype, away_from_zero=False):
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    if away_from_zero:
        t = torch.sign(t) * (t.abs() + 0.5)
    return t.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_binary_public_ops_broadcasting_and_scalars(dtype):
    g = torch.Generator().manual_seed(1)
    layouts = [((3, 37, 5), (3, 37, 5)), ((7, 1, 5), (1, 9, 5)), ((37, 45), (45,)),
               ((2, 3, 4, 5, 6), (1, 3, 1, 5, 1)), ((2, 3, 4, 5, 6, 7), (1, 1, 4, 5, 6, 7)),
               ((3, 37, 5), ()), ((), (3, 37, 5))]
    for name, op, ref in BINARY_CASES:
        for sa, sb in layouts:
            a, b = _operand(sa, g, dtype), _operand(sb, g, dtype, name == "div")
            out = op(a, b)
            want = torch.add(a, b)  # torch's result shape and dtype
            assert out.shape == want.shape and out.dtype == want.dtype, (name, sa, sb)
            assert _err(out, ref(a.double().numpy(), b.double().numpy())) <= RTOL[dtype], (name, sa, sb)
        # a Python number as the second operand
        a = _operand((1000,), g, dtype)
        for s in (2.5, -3):
            out = op(a, s)
            assert out.dtype == dtype and _err(out, ref(a.double().numpy(), float(s))) <= RTOL[dtype], (name, s)


def test_binary_strided_operands_and_promotion():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(45, 37, generator=g).t()  # strided, (37, 45)
    b = torch.randn(37, 45, generator=g)[:, ::1]
    c = torch.randn(37, 90, generator=g)[:, ::2]  # a step-2 slice
    assert _err(ew.add(a, c), a.double().numpy() + c.double().numpy()) <= 1e-6
    assert _err(ew.mul(b, a), a.double().numpy() * b.double().numpy()) <= 1e-6
    # torch's promotion: dimensioned operands widen; a 0-d tensor or a number does not
    h = torch.randn(5, 7, generator=g).half()
    f = torch.randn(5, 7, generator=g)
    bf = torch.randn(5, 7, generator=g).bfloat16()
    assert ew.add(h, f).dtype == torch.float32 == torch.add(h, f).dtype
    assert ew.mul(h, torch.tensor(0.5)).dtype == torch.float16 == (h * torch.tensor(0.5)).dtype
    assert ew.sub(torch.tensor(2.0), h).dtype == torch.float16
    h0 = torch.tensor(1.5, dtype=torch.float16)
    assert ew.add(h0, 2.25).dtype == torch.float16 == (h0 + 2.25).dtype and ew.add(h0, 2.25).item() == 3.75
    assert ew.add(h, torch.tensor(3, dtype=torch.int64)).dtype == torch.float16
    assert _err(ew.add(h, f), h.double().numpy() + f.double().numpy()) <= 1e-6
    # (bf16 does not run on the interpreter: the rule itself, against torch's)
    assert ew.result_dtype("float16", False, "bfloat16", False) == "float32"
    assert torch.maximum(h, bf).dtype == torch.float32
    assert ew.result_dtype("bfloat16", False, "float32", True) == "bfloat16"
    assert (bf * torch.tensor(2.0)).dtype == torch.bfloat16
    # NaN propagates through maximum/minimum like torch's
    x = torch.tensor([1.0, float("nan"), 3.0])
    y = torch.tensor([float("nan"), 2.0, 1.0])
    assert torch.equal(ew.maximum(x, y).isnan(), torch.tensor([True, True, False]))
    assert torch.equal(ew.minimum(x, y).isnan(), torch.tensor([True, True, False]))


def test_public_op_errors():
    from nbx_tune.errors import KernelError

    with pytest.raises(KernelError):
        ew.add(torch.ones(3, 4), torch.ones(5))
    with pytest.raises(KernelError):  # integers are served, but not their true division
        ew.div(torch.ones(3, dtype=torch.int32), 2)
    with pytest.raises(KernelError):  # nor an integer tensor with a float (a float32 result)
        ew.mul(torch.ones(3, dtype=torch.int64), 2.5)
    with pytest.raises(KernelError):
        ew.relu(torch.ones(3, dtype=torch.float64))
    with pytest.raises(KernelError):
        ew.gelu(torch.ones(3), approximate="erf")
    with pytest.raises(KernelError):
        ew.add(torch.ones(3), "2")


# ----------------------------------------------------------------------------- trace rows

def _recorded_rows():
    from nbx_tune.tuner.trace.recorder import Recorder
    import torch.nn.functional as F

    x = torch.randn(4, 6, 5, 7, dtype=torch.float16)
    y = torch.randn(6, 1, 7, dtype=torch.float16)
    with Recorder() as rec:
        x * 0.5; x + 1; 1 - x; x / 3; x - y; torch.maximum(x, y); torch.add(x, y, alpha=2)  # noqa: E702
        x * torch.tensor(2.0); x + x.float()  # noqa: E702
        F.gelu(x); F.gelu(x, approximate="tanh"); F.silu(x); torch.relu(x); x.pow(2); x ** 0.5  # noqa: E702
        x.sigmoid(); x.tanh(); x.exp(); x.neg(); x.sin(); torch.sub(x, 2, alpha=3)  # noqa: E702
    return [r for r in rec.rows if spec_for_op(r.op) in ew.SPECS]


def test_recorded_rows_map_to_the_public_ops_seats(monkeypatch):
    rows = _recorded_rows()
    assert len(rows) >= 18
    by_op = {}
    for r in rows:
        p = spec_for_op(r.op).problem_from_row(r)
        assert not isinstance(p, NotServable), (r, p)
        by_op.setdefault(r.op, []).append(p)
    mul_half = by_op["aten.mul.Tensor"][0]
    assert mul_half.dtypes == ("float16", "float16", "float64")
    assert dict(mul_half.flags) == {"fn": "mul", "layout": "scalar"} and mul_half.dims == (840,)
    assert dict(by_op["aten.sub.Tensor"][0].flags) == {"fn": "sub", "layout": "bcast"}
    assert by_op["aten.add.Tensor"][0].dtypes == ("float16", "float16", "int64")
    assert [dict(p.flags)["fn"] for p in by_op["aten.gelu"]] == ["gelu", "gelu_tanh"]
    assert by_op["aten.rsub.Scalar"][0].get("b_value") == 1.0
    assert by_op["aten.sub.Tensor"][-1].get("alpha") == 3.0
    mixed = [p for p in by_op["aten.add.Tensor"] if p.dtypes[2] == "float32"]
    assert mixed and mixed[0].dtypes == ("float32", "float16", "float32")

    # The public ops land on the same seats as the recorded rows.
    seen = []
    real = ew.ops.config_for
    monkeypatch.setattr(ew.ops, "config_for", lambda spec, dt, fl, dims:
                        seen.append((spec.name, dt, fl, dims)) or real(spec, dt, fl, dims))
    x = torch.randn(4, 6, 5, 7, dtype=torch.float16)
    y = torch.randn(6, 1, 7, dtype=torch.float16)
    ew.mul(x, 0.5)
    ew.add(x, 1)
    ew.sub(x, y)
    ew.gelu(x, approximate="tanh")
    ew.pow(x, 2)
    ew.add(x, x.float())
    want = [
        by_op["aten.mul.Tensor"][0], by_op["aten.add.Tensor"][0], by_op["aten.sub.Tensor"][0],
        by_op["aten.gelu"][1], by_op["aten.pow.Tensor_Scalar"][0], mixed[0],
    ]
    assert seen == [(p.kernel, p.dtypes, p.flags, p.dims) for p in want]


BAD_ROWS = [
    make_row("aten.relu", ["int32"], [(5, 7)]),
    make_row("aten.relu", ["float64"], [(5, 7)]),
    make_row("aten.relu", ["float16", "float16"], [(5, 7), (5, 7)]),
    make_row("aten.relu", ["float16"], [(0, 7)]),
    make_row("aten.relu.out", ["float16", "float16"], [(5, 7), (5, 7)]),
    make_row("aten.exp", ["float16"], [(5, 7)], {"foo": "1"}),
    make_row("aten.gelu", ["float16"], [(5, 7)], {"approximate": "erf"}),
    make_row("aten.pow.Tensor_Scalar", ["float16"], [(5, 7)]),
    make_row("aten.pow.Tensor_Scalar", ["float16"], [(5, 7)], {"exponent": "two"}),
    make_row("aten.pow.Tensor_Scalar", ["float16"], [(5, 7)], {"exponent": "inf"}),
    make_row("aten.add.Tensor", ["float16", "float16"], [(5, 7), (6,)]),
    make_row("aten.add.Tensor", ["float16"], [(5, 7)]),
    make_row("aten.div.Tensor", ["int64", "int64"], [(5, 7), (5, 7)]),  # true division of integers
    make_row("aten.add.Tensor", ["float16", "int64"], [(5, 7), (5, 7)]),
    make_row("aten.add.Tensor", ["float64", "float16"], [(5, 7), (5, 7)]),
    make_row("aten.mul.Tensor", ["float16", "bool"], [(5, 7), ()]),
    make_row("aten.mul.Tensor", ["float64", "float16"], [(), ()]),
    make_row("aten.add.Tensor", ["float16", "float16"], [(5, 7), (5, 7)], {"alpha": "x"}),
    make_row("aten.add.Tensor", ["float16", "float16"], [(5, 7), (5, 7)], {"alpha": "nan"}),
    make_row("aten.mul.Tensor", ["float16", "float16"], [(5, 7), (5, 7)], {"alpha": "2"}),
    make_row("aten.add.Tensor", ["float16", "float16"], [(0, 7), (7,)]),
    make_row("aten.add.Scalar", ["float16"], [(5, 7)]),
    make_row("aten.add.Scalar", ["float16"], [(5, 7)], {"other": "True"}),
    make_row("aten.div.Tensor_mode", ["float16", "float16"], [(5, 7), (5, 7)], {"rounding_mode": "floor"}),
    # 6 dims that cannot merge: more than the kernel decomposes
    make_row("aten.add.Tensor", ["float16", "float16"], [(2, 1, 2, 1, 2, 1), (1, 2, 1, 2, 1, 2)]),
]


@pytest.mark.parametrize("row", BAD_ROWS, ids=lambda r: f"{r.op}:{r.dtypes}:{r.shapes}:{dict(r.params)}")
def test_bad_rows_are_not_servable(row):
    spec = spec_for_op(row.op)
    assert spec in ew.SPECS
    p = spec.problem_from_row(row)
    assert isinstance(p, NotServable) and p.reason


# ----------------------------------------------------------------------------- planted faults

class _ShortUnary(ew.ElementwiseUnarySpec):
    """Launches over one element fewer than the output holds: a masking fault."""

    name = "elementwise_unary_short"

    def launch(self, config, problem, inputs, outputs):
        y = outputs["y"].view(-1)
        ew.launch_unary(inputs["x"].view(-1)[:-1], y[:-1], dict(problem.flags)["fn"], (0.0, 0.0, 0.0), config)


class _WrongFn(ew.ElementwiseBinarySpec):
    """Computes a - b where a + b is asked for."""

    name = "elementwise_binary_wrong"

    def launch(self, config, problem, inputs, outputs):
        ew.launch_binary(inputs["a"], inputs["b"], outputs["out"], "sub", 0.0, 1.0, config)


def test_the_screen_catches_planted_faults():
    cfg = Config.make(BLOCK_SIZE=256, num_warps=2, num_stages=1)
    row = make_row("aten.sigmoid", ["float32"], [(37, 27)])
    spec = _ShortUnary()
    p = spec.problem_from_row(row)
    case = screening.make_case(spec, p, "cpu", 3, True)
    r = screening.screen(spec, cfg, case, 1e-4, "cpu")
    assert r.reason == "unwritten_output"
    assert screening.screen(ew.UNARY_SPEC, cfg, case, 1e-4, "cpu").ok

    spec = _WrongFn()
    p = spec.problem_from_row(make_row("aten.add.Tensor", ["float16", "float16"], [(37, 27), (27,)]))
    case = screening.make_case(spec, p, "cpu", 3, True)
    assert screening.screen(spec, cfg, case, 2e-2, "cpu").reason == "wrong_answer"
    assert screening.screen(ew.BINARY_SPEC, cfg, case, 2e-2, "cpu").ok


def test_plan_merges_dims_and_classifies_operands():
    c = ew._contiguous_strides
    # same shape, contiguous: one flat dim
    assert ew.binary_plan((4, 5, 6), (4, 5, 6), c((4, 5, 6)), (4, 5, 6), c((4, 5, 6))) == \
        (120, ew.FLAT, ew.FLAT, (120,), (1,), (1,))
    # a row broadcast: 2 dims, b strided with a zero stride
    n, ak, bk, sizes, sa, sb = ew.binary_plan((7, 9, 5), (7, 9, 5), c((7, 9, 5)), (5,), (1,))
    assert (n, ak, bk, sizes, sa, sb) == (315, ew.FLAT, ew.STRIDED, (63, 5), (5, 1), (0, 1))
    # a 0-d operand and a value
    assert ew.binary_plan((3, 4), (3, 4), (4, 1), (), ())[1:3] == (ew.FLAT, ew.SCALAR)
    assert ew.binary_plan((3, 4), (3, 4), (4, 1), None, None)[1:3] == (ew.FLAT, ew.VALUE)
    assert ew.layout_of(ew.FLAT, ew.VALUE) == "scalar" and ew.layout_of(ew.SCALAR, ew.STRIDED) == "bcast"


def test_int64_offsets_path(monkeypatch):
    """Past INDEX_LIMIT elements the kernels index in int64: forced here at a small size."""
    monkeypatch.setattr(ew.kernel, "INDEX_LIMIT", 16)  # where the launchers read it
    g = torch.Generator().manual_seed(4)
    x = torch.randn(37, 27, generator=g)
    y = torch.randn(27, generator=g)
    assert _err(ew.sigmoid(x), oracle.sigmoid(x.double().numpy())) <= 1e-5
    assert _err(ew.add(x, y), x.double().numpy() + y.double().numpy()) <= 1e-6
    assert _err(ew.mul(x, 3.0), 3.0 * x.double().numpy()) <= 1e-6

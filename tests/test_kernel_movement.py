"""Data-movement kernels on the interpreter (copies and casts, cat, embedding, arange and
fills): every example row through the screen bit for bit under several configs, the public
ops equal to torch's bit for bit at odd shapes and strides, recorded rows to problems,
refusals, and planted wrong answers (a truncating cast, a shifted slice) that the exact
screen catches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nbx_tune.errors import KernelError
from nbx_tune.kernels import copy as cp
from nbx_tune.kernels import embed as emb
from nbx_tune.kernels import fill
from nbx_tune.kernels.runtime.registry import spec_for_op
from nbx_tune.kernels.spec import Config, NotServable
from nbx_tune.oracles import movement as oracle
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.certify.selfcheck import check_kernel
from nbx_tune.kernels.trace import make_row

PROFILE = get_profile("interpreter")
SPECS = (*cp.SPECS, *emb.SPECS, *fill.SPECS)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal in shape, dtype and every bit."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_selfcheck_small_rows_pass_the_exact_screen(spec):
    checks = check_kernel(spec, PROFILE, "cpu", "small", configs_per_row=3)
    bad = [(c.op, c.shapes, c.dtype, str(c.config), c.reason, c.detail) for c in checks if not c.ok]
    assert not bad
    assert checks and all(c.err == 0.0 and c.rtol == 0.0 for c in checks)  # bit for bit
    assert {c.dtype for c in checks} >= {"float16", "float32"}
    assert len({c.config for c in checks}) >= 2


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_gpu_rows_are_servable_and_claim_every_float_dtype(spec):
    problems = [spec.problem_from_row(r) for r in spec.example_rows("gpu")]
    assert not [p for p in problems if isinstance(p, NotServable)]
    assert {p.dtypes[0] for p in problems} >= {"float16", "bfloat16", "float32"}
    assert spec.exact and 3 <= len(spec.configs()) <= 12
    assert spec.default_config(PROFILE, problems[0]) in spec.configs()


def test_cast_oracle_rounds_like_torch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4099, generator=g, dtype=torch.float32) * 2.0 ** torch.randint(-20, 14, (4099,), generator=g)
    for dt in (torch.float16, torch.bfloat16):
        want = x.to(dt).to(torch.float64).numpy()
        got = oracle.cast(x.double().numpy(), str(dt).removeprefix("torch."))
        assert np.array_equal(got, want), dt


def test_planted_wrong_cast_fails_the_exact_screen():
    """A cast that is off by one unit in the last place somewhere passes a tolerance but not
    the exact screen: a truncating fp32 -> fp16 cast."""
    problem = cp.COPY_SPEC.problem_from_row(make_row("aten._to_copy", ["float32"], [(1000,)], {"dtype": "float16"}))
    case = screening.make_case(cp.COPY_SPEC, problem, "cpu", 7, True)
    rtol = screening.output_rtols(cp.COPY_SPEC, problem, PROFILE)
    assert rtol == {"y": 0.0}
    y = torch.empty(1000, dtype=torch.float16)
    x = case.inputs["x"]
    # Round toward zero: nearest fp16 below |x|.
    t = x.to(torch.float16)
    t = torch.where(t.float().abs() > x.abs(), torch.nextafter(t, torch.zeros_like(t)), t)
    y.copy_(t)
    r = screening.compare("y", y, case.reference("y", y), rtol["y"], problem)
    assert r.reason == "wrong_answer"
    assert screening.compare("y", x.to(torch.float16), case.reference("y", y), 0.0, problem).ok


# ----------------------------------------------------------------------------- public ops

@pytest.mark.parametrize("src,dst", [(torch.float32, torch.float16), (torch.float16, torch.float32),
                                     (torch.int64, torch.float32), (torch.bool, torch.int64),
                                     (torch.float32, torch.float32), (torch.int32, torch.int64)])
def test_to_copy_clone_copy_equal_torch(src, dst):
    g = torch.Generator().manual_seed(3)
    base = (torch.randn(45, 37, generator=g) * 300)
    x = base.to(src) if src.is_floating_point else (base > 0 if src == torch.bool else base.to(src))
    for t in (x, x.t(), x[:, ::3], x.t()[::2]):  # contiguous, transposed, sliced
        assert same(cp._to_copy(t, dtype=dst), t.to(dst).clone() if dst == t.dtype else t.to(dst))
        out = cp.clone(t)
        assert same(out, t.clone()) and out.stride() == t.clone().stride()
        assert same(cp.clone(t, memory_format=torch.contiguous_format), t.contiguous())
    y = torch.empty(37, 45, dtype=dst)
    cp.copy_(y, x.t())
    assert same(y, torch.empty(37, 45, dtype=dst).copy_(x.t()))
    z = torch.empty(5, 37, dtype=dst)
    cp.copy_(z, x[0, :37])  # broadcast source
    assert same(z, x[0, :37].to(dst).expand(5, 37).contiguous())


def test_cat_equals_torch():
    g = torch.Generator().manual_seed(4)
    for dt in (torch.float16, torch.float32, torch.int64):
        a = (torch.randn(1, 3, 7, 5, generator=g) * 9).to(dt)
        b = (torch.randn(1, 3, 7, 5, generator=g) * 9).to(dt)
        assert same(cp.cat([a, b], -1), torch.cat([a, b], -1))
        assert same(cp.cat([torch.empty(0, dtype=dt), a], -2), torch.cat([torch.empty(0, dtype=dt), a], -2))
        assert same(cp.cat([a, b[:, :, :2], a.transpose(2, 3).transpose(2, 3)], 2),
                    torch.cat([a, b[:, :, :2], a], 2))
        c = (torch.randn(5, 9, generator=g) * 9).to(dt)
        assert same(cp.cat([c.t(), c.t()[:1]]), torch.cat([c.t(), c.t()[:1]]))  # strided inputs
    with pytest.raises(KernelError):
        cp.cat([torch.ones(2, 3), torch.ones(2, 4)], 0)
    with pytest.raises(KernelError):
        cp.cat([torch.ones(2), torch.ones(2, dtype=torch.float16)])


def _launches(monkeypatch) -> list:
    """The names of the kernels launched from now on (through launch.through_triton)."""
    from nbx_tune.kernels.runtime import launch

    names, real = [], launch.through_triton

    def logged(kernel, grid, args, kwargs):
        names.append((kernel.fn.__name__, kwargs.get("INT64")))
        return real(kernel, grid, args, kwargs)

    monkeypatch.setattr(launch, "through_triton", logged)
    return names


def _cat_input(shape, dt, g):
    if dt is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return (torch.randn(shape, generator=g) * 2.0 ** torch.randint(-12, 12, shape, generator=g)).to(dt)


CAT2_CASES = (  # (first shape, second shape, dim): odd sizes, dims first, middle, last, negative
    ((3, 5, 7), (2, 5, 7), 0),
    ((3, 5, 7), (3, 1, 7), 1),
    ((3, 5, 7), (3, 5, 9), 2),
    ((1, 3, 1, 5), (1, 3, 1, 5), -1),   # rotary's halves
    ((2, 3, 6, 5), (2, 3, 1, 5), -2),   # a KV cache grown by one token
    ((37,), (1,), -1),
)


@pytest.mark.parametrize("dt", (torch.float32, torch.float16, torch.int64, torch.bool), ids=str)
def test_two_input_cat_is_one_launch_equal_to_torch_and_the_oracle(dt, monkeypatch):
    g = torch.Generator().manual_seed(7)
    launched = _launches(monkeypatch)
    for sa, sb, dim in CAT2_CASES:
        a, b = _cat_input(sa, dt, g), _cat_input(sb, dt, g)
        for xs in ([a, b], [a, a], [torch.empty(0, dtype=dt), a, b]):
            launched.clear()
            got = cp.cat(xs, dim)
            assert same(got, torch.cat(xs, dim)), (sa, sb, dim)
            assert np.array_equal(got.numpy(), oracle.cat([x.numpy() for x in xs], dim))
            assert launched == [("_cat2_kernel", False)], (sa, sb, dim, launched)
    # A zero-size input leaves one to copy (the copy kernel); three inputs: one copy each.
    a, z = _cat_input((3, 4, 5), dt, g), torch.empty(3, 0, 5, dtype=dt)
    launched.clear()
    assert same(cp.cat([z, a], 1), torch.cat([z, a], 1)) and same(cp.cat([a, z, a], 1), torch.cat([a, a], 1))
    assert [k for k, _ in launched] == ["_copy_kernel", "_cat2_kernel"]  # [z, a]: one copy
    launched.clear()
    assert same(cp.cat([a, a, a], -1), torch.cat([a, a, a], -1))
    assert [k for k, _ in launched] == ["_copy_kernel"] * 3


def test_two_input_cat_of_a_strided_input_copies_each_input(monkeypatch):
    """The one-launch kernel reads its inputs flat: a strided input keeps the copies."""
    g = torch.Generator().manual_seed(8)
    launched = _launches(monkeypatch)
    c = torch.randn(5, 9, generator=g)
    assert same(cp.cat([c.t(), c.t()[:2]], 0), torch.cat([c.t(), c.t()[:2]], 0))
    assert [k for k, _ in launched] == ["_copy_kernel", "_copy_kernel"]


def test_two_input_cat_takes_64_bit_offsets_over_the_index_limit(monkeypatch):
    g = torch.Generator().manual_seed(9)
    launched = _launches(monkeypatch)
    monkeypatch.setattr(cp, "INDEX_LIMIT", 100)  # 3 * 13 * 5 = 195 elements: over it
    a, b = torch.randn(3, 7, 5, generator=g), torch.randn(3, 6, 5, generator=g)
    assert same(cp.cat([a, b], 1), torch.cat([a, b], 1))
    assert launched == [("_cat2_kernel", True)]
    cfg = Config.make(BLOCK_SIZE=64, num_warps=4, num_stages=1)  # several programs
    out = torch.full((3, 13, 5), float("nan"))
    cp.launch_cat([a, b], out, 1, cfg)
    assert same(out, torch.cat([a, b], 1))


def test_embedding_equals_torch():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(37, 45, generator=g)
    for dt in (torch.float16, torch.float32):
        for idx in (torch.randint(0, 37, (1, 13), generator=g), torch.randint(0, 37, (2, 7, 3), generator=g).int(),
                    torch.tensor([36])):
            assert same(emb.embedding(w.to(dt), idx), torch.nn.functional.embedding(idx, w.to(dt)))
    table = torch.randn(37, 90, generator=g)[:, ::2]  # rows not contiguous: made so
    idx = torch.tensor([[3, 0, 36]])
    assert same(emb.embedding(table, idx), table[idx])
    big = torch.randn(64, 300, generator=g)[:, 10:270]  # a slice of a wider table: its row stride
    assert same(emb.embedding(big, idx), big[idx])


def test_arange_and_fills_equal_torch():
    assert same(fill.arange(24), torch.arange(24))
    assert same(fill.arange(7, -3000, -3), torch.arange(7, -3000, -3))
    assert same(fill.arange(-5, 2000, dtype=torch.float32), torch.arange(-5, 2000, dtype=torch.float32))
    assert same(fill.arange(250, dtype=torch.float16), torch.arange(250, dtype=torch.float16))
    assert same(fill.arange(1), torch.arange(1))
    with pytest.raises(KernelError):
        fill.arange(0, 1, 0.1)  # fractional: not exact
    with pytest.raises(KernelError):
        fill.arange(5000, dtype=torch.float16)  # beyond 2^11 in fp16
    for dt in (torch.float16, torch.float32, torch.int64, torch.bool):  # bf16: on the GPU
        v = True if dt == torch.bool else 3 if dt == torch.int64 else 1e-06
        assert same(fill.full((3, 37, 5), v, dtype=dt), torch.full((3, 37, 5), v, dtype=dt))
    assert same(fill.full((2, 3), 7), torch.full((2, 3), 7))
    assert same(fill.zeros((3, 5), dtype=torch.float16), torch.zeros(3, 5, dtype=torch.float16))
    assert same(fill.ones((1001,)), torch.ones(1001))
    x = torch.randn(1001)
    assert same(fill.fill_(x, -0.3333), torch.full((1001,), -0.3333)) and x[0] == torch.tensor(-0.3333)
    assert same(fill.zero_(x), torch.zeros(1001))


@pytest.mark.parametrize("value", [0.1, 1 / 3, 65519.0, 1e-8, 3.0000001])
def test_fill_value_rounds_as_torch_does(value):
    """Values rounded once to float32, then to the half type: what c10 does (and numpy's
    direct double -> half rounding does not always match)."""
    for dt in ("float16", "bfloat16", "float32"):
        want = torch.full((1,), value, dtype=getattr(torch, dt)).item()
        assert fill.value_in(value, dt) == want, (value, dt)


# ----------------------------------------------------------------------------- trace rows

def _recorded_rows():
    from nbx_tune.tuner.trace.recorder import Recorder

    w = torch.randn(320, 64)
    ids = torch.randint(0, 320, (1, 24))
    x = torch.randn(1, 4, 24, 8)
    with Recorder() as rec:
        torch.nn.functional.embedding(ids, w)
        torch.arange(24)
        x.to(torch.float16)
        torch.cat([x, x], dim=-1)
        x.transpose(1, 2).contiguous()
        torch.zeros(3, 5)
        torch.full((1, 24), False)
        torch.empty(7).fill_(2.5)
    return rec.rows


def test_recorded_rows_map_to_the_new_kernels():
    rows = _recorded_rows()
    kernels = []
    for r in rows:
        spec = spec_for_op(r.op)
        assert spec is not None, r.op
        p = spec.problem_from_row(r)
        assert not isinstance(p, NotServable), (r.op, p)
        kernels.append(spec.name)
    assert set(kernels) == {"embedding", "fill", "copy", "cat"}


@pytest.mark.parametrize("row,why", [
    (make_row("aten._to_copy", ["float32"], [(5, 7)], {"dtype": "int16"}), "int16"),
    (make_row("aten._to_copy", ["float64"], [(5, 7)], {"dtype": "float32"}), "float64"),
    (make_row("aten.cat", ["float32", "float16"], [(5, 7), (5, 7)]), "mixed dtypes"),
    (make_row("aten.cat", ["float32", "float32"], [(5, 7), (5, 8)]), "do not concatenate"),
    (make_row("aten.embedding", ["float32", "float32"], [(5, 7), (3,)]), "index dtype"),
    (make_row("aten.arange", [], [], {"end": "1.5", "start": "0.5", "step": "0.25"}), "unsupported params"),
    (make_row("aten.arange.start_step", [], [], {"start": "0", "end": "1", "step": "0.1"}), "fractional"),
    (make_row("aten.arange", [], [], {"end": "100000", "dtype": "float16"}), "not exact"),
    (make_row("aten.full", [], [], {"size": "3", "fill_value": "0.5", "dtype": "int64"}), "fractional"),
])
def test_rows_not_served_say_why(row, why):
    p = spec_for_op(row.op).problem_from_row(row)
    assert isinstance(p, NotServable) and why in p.reason, p


def test_planted_shifted_cat_slice_is_caught():
    """A cat whose second input lands one column late leaves poison and moves values: the
    screen says unwritten output."""
    spec = cp.CAT_SPEC
    problem = spec.problem_from_row(make_row("aten.cat", ["float32"] * 2, [(3, 5), (3, 4)], {"dim": "1"}))
    case = screening.make_case(spec, problem, "cpu", 1, True)
    out = screening.alloc_outputs(spec, problem, "cpu")["out"]
    x0, x1 = case.inputs["x0"].reshape(3, 5), case.inputs["x1"].reshape(3, 4)
    cfg = Config.make(BLOCK_SIZE=512, num_warps=4, num_stages=1)
    cp.launch_copy(x0, out[:, :5], cfg)
    cp.launch_copy(x1[:, :3], out[:, 6:], cfg)
    r = screening.compare("out", out, case.reference("out", out), 0.0, problem)
    assert r.reason == "unwritten_output"


def test_public_ops_stay_functions_once_every_kernel_module_is_imported():
    """A module named like an op (`kernels/embedding.py`) would replace the op on the package
    once imported: the new families' modules are named apart from their ops."""
    import importlib
    import types

    import nbx_tune.kernels as k
    from nbx_tune.kernels.runtime.registry import BUILTIN_MODULES

    for m in BUILTIN_MODULES:
        importlib.import_module(m)
    for name in ("cat", "_to_copy", "clone", "copy_", "embedding", "arange", "full", "zeros", "ones", "fill_",
                 "zero_", "batch_norm", "_native_batch_norm_legit_no_training", "max_pool2d_with_indices"):
        op = getattr(k, name)
        assert callable(op) and not isinstance(op, types.ModuleType), name

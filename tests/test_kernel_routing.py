"""The mixture-of-experts routing families on the interpreter (topk and sort, index /
index_put_ / gather, cumsum, histc, floor_divide): every example row through the screen
against its oracle, the public ops equal to torch at odd shapes, ties, NaN, negative and
out-of-range indices, and what they hand to torch (with torch's error where torch raises)."""

from __future__ import annotations

import importlib

import pytest
import torch

from nbx_tune.errors import KernelError
from nbx_tune.kernels.rows import make_row
from nbx_tune.kernels.spec import NotServable
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.certify.selfcheck import check_kernel

PROFILE = get_profile("interpreter")
topk_mod = importlib.import_module("nbx_tune.kernels.topk")
index_mod = importlib.import_module("nbx_tune.kernels.index")
scan = importlib.import_module("nbx_tune.kernels.scan")
histc_mod = importlib.import_module("nbx_tune.kernels.histc")
fdiv = importlib.import_module("nbx_tune.kernels.floor_divide")
stack_mod = importlib.import_module("nbx_tune.kernels.stack")
index_nd_mod = importlib.import_module("nbx_tune.kernels.index_nd")
all_any_mod = importlib.import_module("nbx_tune.kernels.all_any")
SPECS = (*topk_mod.SPECS, *index_mod.SPECS, *scan.SPECS, *histc_mod.SPECS, *fdiv.SPECS, *stack_mod.SPECS)
# screened here too: advanced indexing and the truth reductions (their other tests: test_kernel_index_nd_all_any.py)
SCREENED = (*SPECS, *index_nd_mod.SPECS, *all_any_mod.SPECS)


def same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("spec", SCREENED, ids=lambda s: s.name)
def test_selfcheck_small_rows_pass_the_screen(spec):
    checks = check_kernel(spec, PROFILE, "cpu", "small", configs_per_row=2)
    bad = [(c.op, c.shapes, c.dtype, str(c.config), c.reason, c.detail) for c in checks if not c.ok]
    assert not bad
    assert checks and len({c.config for c in checks}) >= 2
    if spec.exact:
        assert all(c.err == 0.0 for c in checks)  # bit for bit


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_gpu_rows_are_servable_and_claim_the_dtypes(spec):
    problems = [spec.problem_from_row(r) for r in spec.example_rows("gpu")]
    assert not [p for p in problems if isinstance(p, NotServable)]
    assert {p.dtypes[0] for p in problems} >= set(spec.dtypes) - {"bool"}
    assert spec.default_config(PROFILE, problems[0]) in spec.configs()


def test_a_non_stable_tie_order_fails_the_sort_screen():
    """The oracle pins ties to index order: torch's CPU sort(stable=False), which orders
    them otherwise, is a wrong answer."""
    spec = topk_mod.SPEC
    problem = spec.problem_from_row(make_row("aten.sort", ["int64"], [(300,)]))
    case = screening.make_case(spec, problem, "cpu", 5, True)
    got = torch.sort(case.inputs["x"])
    stable = torch.sort(case.inputs["x"], stable=True)
    assert not torch.equal(got.indices, stable.indices)
    assert screening.compare("indices", got.indices, case.reference("indices", got.indices), 0.0, problem).reason \
        == "wrong_answer"
    assert screening.compare("indices", stable.indices, case.reference("indices", got.indices), 0.0, problem).ok


# ----------------------------------------------------------------------------- topk, sort

@pytest.mark.parametrize("shape,k,dim", [((13, 8), 2, -1), ((5, 60), 7, 1), ((3, 37, 2), 3, 1), ((26,), 26, 0), ((), 1, 0)])
def test_topk_equals_torch_without_ties(shape, k, dim):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g)
    for largest in (True, False):
        v, i = topk_mod.topk(x, k, dim, largest)
        want = torch.topk(x, k, dim, largest)
        assert same(v, want.values) and same(i, want.indices)


def test_sort_is_torchs_stable_sort_with_ties_nan_and_signed_zeros():
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan"), -0.0, 0.0, 1.0, -float("inf")]])
    ints = torch.randint(-3, 4, (3, 41), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    for t in (x, ints, x.t().contiguous()):
        for desc in (False, True):
            dim = 0 if t.shape[0] > 1 and t.shape[1] == 1 else -1
            v, i = topk_mod.sort_stable(t, stable=True, dim=dim, descending=desc)
            want = torch.sort(t, stable=True, dim=dim, descending=desc)
            assert torch.equal(i, want.indices) and torch.equal(v.isnan(), want.values.isnan())
            assert torch.equal(torch.nan_to_num(v), torch.nan_to_num(want.values))


def test_ties_whose_order_torch_leaves_open_go_to_torch_on_the_cpu():
    with pytest.raises(KernelError, match="ties"):
        topk_mod.sort(torch.tensor([2, 1, 2]))
    with pytest.raises(KernelError, match="ties"):
        topk_mod.topk(torch.tensor([[0.5, 0.9, 0.5]]), 2)  # the second place is a tie
    # a tie below the k kept does not change what topk returns
    v, i = topk_mod.topk(torch.tensor([[0.5, 0.9, 0.5, 0.7]]), 2)
    assert i.tolist() == [[1, 3]]


def test_topk_refuses_what_it_does_not_serve():
    with pytest.raises(KernelError, match="sorted=False"):
        topk_mod.topk(torch.randn(4, 8), 3, sorted=False)
    with pytest.raises(KernelError, match="not served"):
        topk_mod.topk(torch.randn(4, 8, dtype=torch.float64), 2)
    with pytest.raises(KernelError, match="out of range"):
        topk_mod.topk(torch.randn(4, 8), 9)


# ----------------------------------------------------------------------------- index family

def test_index_take_rows_equals_torch_with_negative_and_int32_indices():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 5, 3, generator=g)
    idx = torch.randint(-37, 37, (4, 6), generator=g)
    assert same(index_mod.index(x, [idx]), x[idx])
    b = torch.rand(9, generator=g) > 0.5
    i32 = torch.tensor([0, -1, 3], dtype=torch.int32)
    assert same(index_mod.index(b, [i32]), b[i32])
    with pytest.raises(KernelError, match="out of range"):
        index_mod.index(x, [torch.tensor([37])])
    with pytest.raises(KernelError, match="mask"):
        index_mod.index(x, [torch.ones(37, dtype=torch.bool)])


@pytest.mark.parametrize("values_shape", [(7, 4), (4,), (1, 4), ()])
def test_index_put_equals_torch_with_broadcast_values(values_shape):
    g = torch.Generator().manual_seed(4)
    y = torch.randn(20, 4, generator=g)
    p = torch.randperm(20, generator=g)[:7] - 20 * (torch.arange(7) % 2)  # some negative
    v = torch.randn(values_shape, generator=g)
    a, b = y.clone(), y.clone()
    index_mod.index_put_(a, [p], v)
    b.index_put_((p,), v)
    assert same(a, b)


def test_index_put_accumulate_with_repeats_and_a_permutation_inverse():
    g = torch.Generator().manual_seed(5)
    q = torch.randint(0, 20, (30,), generator=g)
    for dt in (torch.float32, torch.int64):
        y = (torch.randn(20, 4, generator=g) * 100).to(dt)
        v = (torch.randn(30, 4, generator=g) * 100).to(dt)
        a, b = y.clone(), y.clone()
        index_mod.index_put_(a, [q], v, True)
        b.index_put_((q,), v, True)
        assert torch.allclose(a.double(), b.double(), rtol=1e-6, atol=0) if dt.is_floating_point else same(a, b)
    # the MoE layer's inverse permutation: inv[perm] = arange
    perm = torch.randperm(14, generator=g)
    inv, want = torch.empty_like(perm), torch.empty_like(perm)
    index_mod.index_put_(inv, [perm], torch.arange(14))
    want[perm] = torch.arange(14)
    assert same(inv, want)
    with pytest.raises(KernelError, match="repeated"):
        index_mod.index_put_(torch.zeros(5), [torch.tensor([1, 1])], torch.ones(2))


@pytest.mark.parametrize("shape,ishape,dim", [((3, 4, 5), (2, 7, 5), 1), ((3, 4, 5), (3, 2, 9), -1), ((6,), (11,), 0),
                                              ((2, 3, 4, 5), (2, 3, 4, 2), 3)])
def test_gather_equals_torch(shape, ishape, dim):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(shape, generator=g)
    idx = torch.randint(0, shape[dim], ishape, generator=g)
    assert same(index_mod.gather(x, dim, idx), torch.gather(x, dim, idx))
    assert same(index_mod.gather(x.to(torch.int32), dim, idx), torch.gather(x.to(torch.int32), dim, idx))
    with pytest.raises(KernelError, match="out of range"):
        index_mod.gather(x, dim, torch.full(ishape, -1))


def test_out_of_range_indices_raise_torchs_error_under_serve():
    import nbx_tune

    x = torch.randn(5, 3)
    for fn in (lambda: x[torch.tensor([5])], lambda: torch.gather(x, 1, torch.tensor([[3]])),
               lambda: x.clone().index_put_((torch.tensor([-6]),), torch.ones(3))):
        with pytest.raises(Exception) as want:
            fn()
        with nbx_tune.serve(), pytest.raises(Exception) as got:
            fn()
        assert type(got.value) is type(want.value)


# ----------------------------------------------------------------------------- cumsum, histc, floor_divide

@pytest.mark.parametrize("x,dim,dtype", [
    (torch.randn(9, 70, generator=torch.Generator().manual_seed(7)) * 4, 0, None),
    (torch.randn(3, 1000, generator=torch.Generator().manual_seed(8)), 1, None),
    (torch.tensor([1.7, 2.6, -3.9, 0.0, 8.0]), 0, torch.int32),  # truncated first, as torch casts
    (torch.tensor([[True, False, True]] * 2), -1, None),  # bool -> int64
    (torch.arange(-40, 20, dtype=torch.int32).view(5, 4, 3), 1, None),  # int32 -> int64
])
def test_cumsum_equals_torch_bit_for_bit(x, dim, dtype):
    assert same(scan.cumsum(x, dim, dtype=dtype), torch.cumsum(x, dim, dtype=dtype))


def test_histc_equals_torch_at_the_edges_outside_and_nan():
    g = torch.Generator().manual_seed(9)
    for n, bins, lo, hi in ((28, 4, 0, 3), (1000, 60, 0, 59), (63, 5, -1.5, 2.25), (5000, 7, -0.3, 0.77)):
        x = torch.where(torch.rand(n, generator=g) < 0.5, torch.randint(int(lo), int(hi) + 1, (n,), generator=g).float(),
                        torch.rand(n, generator=g) * (hi - lo) * 1.3 + lo - 0.1 * (hi - lo))
        x[:3] = torch.tensor([lo, hi, float("nan")])
        assert same(histc_mod.histc(x, bins, lo, hi), torch.histc(x, bins, lo, hi))
    with pytest.raises(KernelError, match="min >= max"):
        histc_mod.histc(torch.randn(10), 4)  # the data's range: torch's
    with pytest.raises(KernelError, match="not served"):
        histc_mod.histc(torch.arange(10), 4, 0, 9)  # torch's CPU kernel refuses integers


def test_floor_divide_rounds_toward_negative_infinity_as_torch():
    g = torch.Generator().manual_seed(10)
    for dt in (torch.int64, torch.int32):
        a = torch.randint(-50, 50, (5, 1, 3), generator=g, dtype=dt)
        b = torch.randint(1, 9, (4, 1), generator=g, dtype=dt) * torch.tensor([[1], [-1], [1], [-1]], dtype=dt)
        assert same(fdiv.floor_divide(a, b), torch.floor_divide(a, b))
        for other in (2, -3, torch.tensor(3)):
            assert same(fdiv.floor_divide(a, other), torch.floor_divide(a, other))
    with pytest.raises(KernelError, match="zero divisor"):
        fdiv.floor_divide(torch.tensor([3, 4]), torch.tensor([1, 0]))
    with pytest.raises(KernelError, match="not served"):
        fdiv.floor_divide(torch.randn(3), 2)


def test_a_zero_divisor_raises_torchs_error_under_serve():
    import nbx_tune

    with nbx_tune.serve(), pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.tensor([7, -7]) // 0


# ----------------------------------------------------------------------------- float -> int casts

@pytest.mark.parametrize("dst", [torch.int64, torch.int32])
@pytest.mark.parametrize("src", [torch.float32, torch.float16])
def test_float_to_int_casts_truncate_as_torch_with_its_nan_and_overflow(src, dst):
    from nbx_tune.kernels import copy as cp

    g = torch.Generator().manual_seed(11)
    x = (torch.randn(37, 5, generator=g) * 300).to(src)
    special = torch.tensor([0.0, -0.0, 2.7, -2.7, 0.5, -0.5, 65504.0, float("nan"), float("inf"),
                            -float("inf"), 3e9, -3e9, 1e-40], dtype=torch.float32).to(src)
    for t in (x, x.t(), special):
        assert same(cp._to_copy(t, dtype=dst), t.to(dst))


@pytest.mark.parametrize("shape,n,dim", [((3, 7, 5), 2, -1), ((13,), 3, 0), ((2, 9), 2, 1), ((4, 6), 2, -3)])
def test_stack_equals_torch(shape, n, dim):
    g = torch.Generator().manual_seed(12)
    xs = [torch.randn(shape, generator=g) for _ in range(n)]
    if len(shape) == 2:
        xs[0] = torch.randn(shape[::-1], generator=g).t()  # a strided operand
    assert same(stack_mod.stack(xs, dim), torch.stack(xs, dim))
    with pytest.raises(KernelError, match="shapes"):
        stack_mod.stack([xs[0], torch.randn(1)], 0)


def test_a_traced_moe_layers_routing_rows_map_to_the_seats_serve_launches():
    """The rows a recorder writes for a MoE layer's routing (tests/test_moe_routing_serve.py's
    models, 2 x 7 tokens, 4 experts, top-2) land on the seats the public ops look up:
    `perm // top_k`'s 0-d divisor is the scalar seat serve() launches."""
    from nbx_tune.kernels.runtime.registry import spec_for_op
    rows = [make_row("aten.topk", ["float32"], [(14, 4)], {"k": "2"}),
            make_row("aten.sort", ["int64"], [(28,)]),
            make_row("aten.floor_divide", ["int64", "int64"], [(28,), ()]),
            make_row("aten.index.Tensor", ["float32", "int64"], [(14, 32), (28,)], {"indices": "Tensor"}),
            make_row("aten.histc", ["float32"], [(28,)], {"bins": "4", "max": "3"}),
            make_row("aten.cumsum", ["float32"], [(4,)], {"dim": "0", "dtype": "int32"}),
            make_row("aten.index_put_", ["int64"] * 3, [(28,)] * 3, {"indices": "Tensor"})]
    import nbx_tune
    from nbx_tune.kernels import launch_stats
    from nbx_tune.kernels.spec import bucket_of, seat_label

    g = torch.Generator().manual_seed(13)
    probs = torch.softmax(torch.randn(14, 4, generator=g), -1)
    with nbx_tune.serve():
        _, top = torch.topk(probs, 2)
        ids, perm = torch.sort(top.reshape(-1))
        hidden = torch.randn(14, 32, generator=g)[perm // 2]
        counts = torch.histc(ids.float(), bins=4, min=0, max=3)
        torch.cumsum(counts, dim=0, dtype=torch.int32)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(28)
    assert hidden.shape == (28, 32)
    missed = launch_stats()["misses"]
    for r in rows:
        spec = spec_for_op(r.op)
        p = spec.problem_from_row(r)
        assert not isinstance(p, NotServable), (r.op, p)
        label = seat_label(p.kernel, p.dtypes, p.flags, spec.key, bucket_of(PROFILE, spec.key, p.dims))
        assert label in missed, (r.op, label, sorted(missed))

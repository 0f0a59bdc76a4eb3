"""Advanced indexing by several tensors (`index_nd`: x[i0, i1], a padded batch's mask read)
and the truth reductions (`all_any`: torch.all / torch.any) on the interpreter: example rows
through the screen against their fp64 oracles, the public ops equal to torch at odd shapes in
fp32 / int64 / bool with negative, broadcast and out-of-range indices, what they hand to
torch (torch's own error where torch raises), and a recorded trace naming the seats serve()
launches (a census of it leaves no default launch)."""

from __future__ import annotations

import importlib

import pytest
import torch

from nbx_tune.errors import KernelError
from nbx_tune.kernels.rows import make_row
from nbx_tune.kernels.spec import NotServable
from nbx_tune.profiles import get_profile

PROFILE = get_profile("interpreter")
index_mod = importlib.import_module("nbx_tune.kernels.index")
nd = importlib.import_module("nbx_tune.kernels.index_nd")
aa = importlib.import_module("nbx_tune.kernels.all_any")
SPECS = (nd.SPEC, aa.SPEC)  # their screens run with the routing families (tests/test_kernel_routing.py)


def same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_gpu_rows_are_servable_and_claim_the_dtypes(spec):
    problems = [spec.problem_from_row(r) for r in spec.example_rows("gpu")]
    assert not [p for p in problems if isinstance(p, NotServable)]
    assert {p.dtypes[0] if spec is nd.SPEC else p.dtypes[1] for p in problems} == set(spec.dtypes)
    assert spec.default_config(PROFILE, problems[0]) in spec.configs()


def test_the_oracles_give_torchs_answer():
    """The screens' references, against torch on the same inputs (an oracle that agreed
    with a wrong kernel would pass the screen)."""
    import numpy as np

    rng = np.random.default_rng(3)
    for spec, row in ((nd.SPEC, make_row("aten.index.Tensor", ["float32", "int64", "int64", "int64"],
                                         [(5, 4, 3, 2), (7, 1), (1, 3), (7, 3)])),
                      (aa.SPEC, make_row("aten.any.dims", ["float32"], [(3, 5, 7)], {"dim": "0x2"})),
                      (aa.SPEC, make_row("aten.all.dim", ["int64"], [(37, 45)], {"dim": "-1"}))):
        p = spec.problem_from_row(row)
        inputs = spec.make_inputs(p, rng)
        ref = spec.oracle(p, {k: v for k, (v, _) in inputs.items()})["out"]
        t = {k: torch.as_tensor(np.asarray(v)) for k, (v, _) in inputs.items()}
        if spec is nd.SPEC:
            want = t["x"][tuple(t[f"indices{j}"] for j in range(3))]
        else:
            want = getattr(torch, dict(p.flags)["fn"])(t["x"], *(() if row.op.endswith("dims") else (-1,)),
                                                       **({"dim": (0, 2)} if row.op.endswith("dims") else {}))
        assert np.array_equal(ref, want.numpy())
        if spec is aa.SPEC:
            assert ref.any() and not ref.all()  # both answers occur in the screen's inputs


# ----------------------------------------------------------------------------- index_nd

def test_a_padded_batchs_mask_read_equals_torch():
    mask = torch.rand(2, 7, generator=torch.Generator().manual_seed(1)) < 0.5
    b, k = torch.arange(2)[:, None, None, None], torch.arange(7)[None, None, None, :]
    assert same(index_mod.index(mask, [b, k]), mask[b, k])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_several_index_tensors_equal_torch_with_negative_broadcast_and_int32_indices(dtype):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(13, 9, 5, 4, generator=g) * 50).to(dtype)
    i0, i1 = torch.randint(-13, 13, (6,), generator=g), torch.randint(-9, 9, (6,), generator=g)
    i2 = torch.randint(-4, 4, (6, 1), generator=g)
    cases = [(i0, i1), (i0[:, None], i1[None, :3]), (i0[:, None], i1[None, :3], i2), (i0, i1, i2[:, 0], i2[:, 0] % 4),
             (i0.to(torch.int32), i1.to(torch.int32)), (torch.tensor(-1), torch.tensor(3)),
             (i0[::2], i1[::2])]  # strided indices
    for t in (x, x.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3), x[:, :, 1]):  # strided self
        for idx in cases:
            if len(idx) > t.dim():
                continue
            assert same(index_mod.index(t, list(idx)), t[idx]), (t.shape, [i.shape for i in idx])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_indices_after_sliced_dims_equal_torch(dtype):
    """x[:, i] and x[:, :, i0, i1]: the sliced dims stay first (torch's None entries)."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 4, 7, 5, 2, generator=g) * 50).to(dtype)
    i0, i1 = torch.randint(-6, 6, (6, 1), generator=g), torch.randint(-5, 5, (1, 3), generator=g)
    j = torch.tensor([-1, 2, 0, -4, 1])  # negative ones wrap
    transposed = x.permute(1, 0, 2, 3, 4).contiguous().permute(1, 0, 2, 3, 4)  # one sliced dim: any stride
    for t, cases in ((x, 3), (x[:, :, 1:], 3), (transposed, 2)):  # x[:, :, 1:]: strided, each side one run
        for key, indices in (((slice(None), j), [None, j]), ((slice(None), j.view(5, 1)), [None, j.view(5, 1)]),
                             ((slice(None), slice(None), i0, i1), [None, None, i0, i1]))[:cases]:
            assert same(index_mod.index(t, indices), t[key]), (t.shape, key)


def test_index_nd_refuses_what_torch_answers_otherwise():
    x = torch.randn(5, 4, 3)
    i = torch.tensor([0, 1])
    for indices, why in (([i, torch.tensor([4])], "out of range"), ([i, torch.tensor([-5])], "out of range"),
                         ([None, torch.tensor([4])], "out of range"),
                         ([i, torch.tensor([0, 1, 2])], "broadcast"), ([i, None, i], "None"),
                         ([torch.tensor([True, False, True, False, True]), i[:1]], "mask"),
                         ([i, i.to(torch.int32)], "dtype"), ([i, i, i, i], "indices for 3 dims"),
                         ([None, None, i, i], "indices for 3 dims"),
                         ([i.view(1, 1, 1, 1, 2), i], "rank 5")):
        with pytest.raises(KernelError, match=why):
            index_mod.index(x, indices)
    with pytest.raises(KernelError, match="collapse"):
        index_mod.index(torch.randn(3, 4, 5, 6).transpose(2, 3), [i, i])
    with pytest.raises(KernelError, match="collapse"):
        index_mod.index(torch.randn(3, 4, 5).transpose(0, 1), [None, None, i])  # the sliced dims transposed


def test_out_of_range_indices_raise_torchs_index_error_under_serve():
    import nbx_tune

    x = torch.randn(5, 3)
    for fn in (lambda: x[torch.tensor([5]), torch.tensor([0])], lambda: x[torch.tensor([0]), torch.tensor([-4])],
               lambda: x[torch.tensor([0, 1]), torch.tensor([0, 1, 2])]):
        with pytest.raises(IndexError) as want:
            fn()
        with nbx_tune.serve(), pytest.raises(IndexError) as got:
            fn()
        assert str(got.value) == str(want.value)
    with nbx_tune.serve():
        y = x[torch.tensor([-5, 4]), torch.tensor([-1, 2])]  # negative indices wrap
    assert same(y, x[torch.tensor([-5, 4]), torch.tensor([-1, 2])])
    stats = nbx_tune.serve_stats()["aten.index.Tensor"]
    assert stats["certified"] + stats["default"] == 1 and stats["torch"] == 3


def test_multi_index_and_sliced_rows_go_to_index_nd_and_a_none_between_is_refused():
    spec = index_mod.INDEX_SPEC
    p = spec.problem_from_row(make_row("aten.index.Tensor", ["bool", "int64", "int64"],
                                       [(2, 7), (2, 1, 1, 1), (1, 1, 1, 7)]))
    assert p.kernel == "index_nd" and p.dims == (14, 1) and dict(p.flags) == {"k": "2", "outer": "0"}
    assert spec.problem_from_row(make_row("aten.index.Tensor", ["float32", "int64"], [(9, 4), (3,)])).kernel \
        == "index_rows"
    sliced = spec.problem_from_row(make_row("aten.index.Tensor", ["float32", "int64", "int64"], [(9, 4, 3, 2), (3,), (3,)],
                                            {"indices": "NonexTensorxTensor"}))
    assert sliced.kernel == "index_nd" and sliced.dims == (27, 2) and dict(sliced.flags) == {"k": "2", "outer": "1"}
    apart = spec.problem_from_row(make_row("aten.index.Tensor", ["float32", "int64", "int64"], [(9, 4, 3), (3,), (3,)],
                                           {"indices": "TensorxNonexTensor"}))
    assert isinstance(apart, NotServable) and "None" in apart.reason


# ----------------------------------------------------------------------------- all, any

@pytest.mark.parametrize("fn", ["all", "any"])
def test_all_any_equal_torch_over_every_dim_with_nan_and_signed_zeros(fn):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(37, 45, generator=g)
    x[x.abs() < 0.4] = 0.0
    x[3, :] = -0.0
    x[:, 5] = float("nan")  # true
    x[7, :] = 1.0
    b = torch.rand(3, 5, 7, generator=g) < 0.8
    ours, theirs, op = getattr(aa, fn), getattr(torch, fn), getattr(torch.ops.aten, fn)
    for t in (x, x.t(), (x * 10).to(torch.int64), (x * 10).to(torch.int32), b, b.permute(2, 0, 1), x.half(),
              torch.tensor(0.0), torch.tensor(True)):
        assert same(ours(t), theirs(t))
        for d in range(-t.dim(), t.dim()):
            for keep in (False, True):
                assert same(ours(t, d, keep), theirs(t, d, keep)), (t.shape, d, keep)
        assert same(ours(t, []), op.dims(t, []))  # an empty list reduces nothing
        assert same(ours(t, None, True), op.dims(t, None, True))
        if t.dim() == 3:
            assert same(ours(t, [0, -1], True), op.dims(t, [0, -1], True))


def test_all_any_long_rows_and_split_configs_find_the_one_odd_element():
    """One zero (all) or one non-zero (any) among 5000: a config that splits the row over
    programs (SPLIT > 1: bool partials, reduced again) finds it as a whole-row one does."""
    from nbx_tune.kernels.spec import Config

    for fn, fill, odd in (("all", 1.0, 0.0), ("any", 0.0, 1.0)):
        for config in (Config.make(BLOCK_O=1, BLOCK_R=256, SPLIT=1, num_warps=4, num_stages=1),
                       Config.make(BLOCK_O=1, BLOCK_R=256, SPLIT=8, num_warps=4, num_stages=1)):
            for at in (0, 2999, 4999):
                x = torch.full((2, 5000), fill)
                x[1, at] = odd
                plan = aa._reduce.reduce_plan((2, 5000), x.stride(), (1,))
                out = torch.empty(2, dtype=torch.bool)
                aa.launch_all_any(x, out, plan, fn, config)
                assert out.tolist() == getattr(torch, fn)(x, 1).tolist(), (fn, config, at)


def test_all_any_refuse_what_they_do_not_serve():
    with pytest.raises(KernelError, match="not served"):
        aa.all(torch.ones(3, dtype=torch.uint8))  # torch answers in uint8
    with pytest.raises(KernelError, match="empty"):
        aa.any(torch.ones(0, 3))
    with pytest.raises(KernelError, match="out of range"):
        aa.all(torch.ones(3, 4), 2)
    assert isinstance(aa.SPEC.problem_from_row(make_row("aten.all", ["uint8"], [(4,)])), NotServable)


def test_a_recorded_trace_names_the_seats_serve_launches():
    """A padded batch's mask read, its `.all()` (an encoder's) and x[:, i], recorded: the rows
    map to the index_nd and all_any seats serve() launches; before, the mask read fell
    through ("one index tensor on dim 0") and aten.all had no route."""
    import nbx_tune
    from nbx_tune.kernels.serving import serve as serving
    from nbx_tune.testing import model_zoo
    from nbx_tune.tuner.trace.recorder import Recorder

    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0

    def forward():
        m = mask.bool()
        b, k = torch.arange(2)[:, None, None, None], torch.arange(7)[None, None, None, :]
        return m[b, k], m.all(), m.any(dim=-1), m[:, torch.tensor([6, 0, -1])]

    with torch.no_grad(), Recorder() as rec:
        forward()
    seats = model_zoo.trace_seats(rec.rows, PROFILE)
    assert {s.split("|")[0] for s in seats} >= {"index_nd", "all_any"}
    missed = model_zoo.missed_seats(forward)
    assert {s.split("|")[0] for s in missed} >= {"index_nd", "all_any"}
    assert missed <= seats, missed - seats
    serving.reset_stats()
    with nbx_tune.serve():
        got = forward()
    for g, w in zip(got, forward()):
        assert same(g, w)
    stats = nbx_tune.serve_stats()
    for op, calls in (("aten.index.Tensor", 2), ("aten.all", 1), ("aten.any.dim", 1)):
        assert stats[op]["torch"] == 0 and stats[op]["certified"] + stats[op]["default"] == calls, (op, stats[op])
    assert {"outer=0", "outer=1"} <= {f for s in missed if s.startswith("index_nd") for f in s.split("|")[2].split(",")}

"""serve() returns what torch returns, or torch's own error, in the five cases issue 60
found it did not (each fails without its fix)."""

import pytest
import torch
import torch.nn.functional as F

from nbx_tune.kernels.serving.fusions import engine as fusions
from nbx_tune.kernels.serving import serve as serve_mod
from nbx_tune.kernels.serving.serve import serve


def test_integer_true_division_after_an_add_of_the_same_shapes_is_torchs():
    a, b = torch.tensor([7, -7, 5]), torch.tensor([2, 2, 3])
    with serve(fuse=False):
        a + b  # plans an int64 binary launch of these shapes
        got = a / b
    assert got.dtype == torch.float32 and torch.equal(got, a / b)


@pytest.mark.parametrize("idx", [[0, 5], [-1, 2], [1 << 40]])
def test_embedding_with_an_index_out_of_range_raises_torchs_index_error(idx):
    table = torch.arange(20.0).view(5, 4)
    with pytest.raises(IndexError):
        F.embedding(torch.tensor(idx), table)
    with serve(fuse=False), pytest.raises(IndexError, match="index out of range"):
        F.embedding(torch.tensor(idx), table)
    with serve(fuse=False):  # in range: still served, and right
        assert torch.equal(F.embedding(torch.tensor([4, 0]), table), table[[4, 0]])


@pytest.mark.parametrize("case", ["add_", "copy_", "expanded"])
def test_in_place_ops_whose_input_overlaps_the_output_are_refused_as_torch_does(case):
    def run(t):
        if case == "add_":
            return t[1:].add_(t[:-1])
        if case == "copy_":
            return t[1:].copy_(t[:-1])
        return t[:1].expand(4).add_(t[:4])

    with pytest.raises(RuntimeError, match="memory location"):
        run(torch.arange(8.0))
    t = torch.arange(8.0)
    serve_mod.reset_stats()
    with serve(fuse=False), pytest.raises(RuntimeError, match="memory location"):
        run(t)
    assert torch.equal(t, torch.arange(8.0))  # nothing written before the refusal
    reasons = {r for s in serve_mod.stats().values() for r in s["reasons"]}
    assert any("overlap" in r for r in reasons)  # handed to torch, with the reason counted
    def allowed(t):  # the tensor itself, and disjoint halves: torch computes these
        t.add_(t)
        t[:4].add_(t[4:])
        return t

    with serve(fuse=False):
        got = allowed(torch.arange(8.0))
    assert torch.equal(got, allowed(torch.arange(8.0)))


def test_a_strided_slot_is_written_and_an_overlapping_view_torch_cannot_judge_is_refused():
    """torch cannot tell whether a non-contiguous output overlaps itself; the strides can:
    a KV cache's slot `buf[:, :, 3]` is disjoint and served (it used to go to torch), a view
    whose rows share elements (stride 2 over rows of 3) is handed to torch."""
    src = torch.arange(24.0).view(2, 3, 4)
    ref = torch.zeros(2, 3, 5, 4)
    ref[:, :, 3].copy_(src)
    serve_mod.reset_stats()
    with serve(fuse=False):
        buf = torch.zeros(2, 3, 5, 4)
        buf[:, :, 3].copy_(src)
        buf[:, :, 1].add_(src)
    assert torch.equal(buf[:, :, 3], ref[:, :, 3]) and torch.equal(buf[:, :, 1], src)
    st = serve_mod.stats()
    assert not {r for s in st.values() for r in s["reasons"] if "overlap" in r}, st
    assert sum(s["torch"] for k, s in st.items() if "copy" in k or "add" in k) == 0, st
    shared = torch.zeros(10).as_strided((3, 3), (2, 1))  # element 2 is row 0's last and row 1's first
    assert torch._debug_has_internal_overlap(shared) == 2  # torch: too hard to tell
    serve_mod.reset_stats()
    with serve(fuse=False):
        shared.copy_(torch.ones(3, 3))
    reasons = {r for s in serve_mod.stats().values() for r in s["reasons"]}
    assert any("may overlap itself" in r for r in reasons), reasons


@pytest.mark.parametrize("e", [-1, -3, 5, 0.5, -0.5, 1.5])
def test_pow_keeps_the_sign_of_zero_and_infinity_as_torch_does(e):
    x = torch.tensor([-0.0, 0.0, float("-inf"), float("inf"), -2.0])
    ref = torch.pow(x, e)
    with serve(fuse=False):
        got = torch.pow(x, e)
    assert torch.equal(torch.signbit(got), torch.signbit(ref))
    assert torch.allclose(got, ref, equal_nan=True) and torch.equal(got.isinf(), ref.isinf())


def test_exiting_a_serve_object_twice_is_a_no_op_that_leaves_no_state():
    s = serve(fuse=True)
    s.__enter__()
    s.__exit__(None, None, None)
    s.__exit__(None, None, None)  # raised AttributeError and left fusions' count at -1
    assert fusions._active == 0 and not serve_mod.active()
    with serve(fuse=True):
        assert fusions._active == 1 and serve_mod.active()
    assert fusions._active == 0 and not serve_mod.active()


@pytest.mark.parametrize("args", [(0.0, -8.000001, -4.0), (3.1,), (0, -3, 2)])
def test_arange_in_int64_with_float_bounds_or_a_contrary_step_is_torchs(args):
    # found by the full OpInfo run (NBX_TUNE_OPINFO_FULL=1): shapes (3,) and (4,) for torch's (2,) and (3,)
    try:
        ref, err = torch.arange(*args, dtype=torch.int64), None
    except RuntimeError as e:
        ref, err = None, e
    with serve(fuse=False):
        if err is not None:
            with pytest.raises(RuntimeError):
                torch.arange(*args, dtype=torch.int64)
        else:
            assert torch.equal(torch.arange(*args, dtype=torch.int64), ref)

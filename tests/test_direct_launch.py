"""The direct launch (kernels/runtime/launch.py): the first call of a public op under a key goes through
Triton and is recorded; later calls replay the compiled kernels Triton returned.

The interpreter compiles nothing, so testing/fake_compiled.py stands in for Triton's compiled
kernels: a replay's launch runs the real kernel under the interpreter on exactly the
addresses and arguments the replay passes, and is refused if Triton would have compiled
for other arguments. Every family is checked: a replay is bit-identical to Triton's launch
on the same data, and a call that differs in strides, dtype, alignment or device is never
served a replay recorded for another. The GPU half is proofs/direct_launch_check.py.
"""

import gc
import math
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from nbx_tune.testing.fake_compiled import FakeTriton, lean_launcher

from nbx_tune.errors import KernelError
from nbx_tune.kernels import (    addmm,
    baddbmm,
    bmm,
    conv1d,
    conv2d,
    group_norm,
    layer_norm,
    mm,
    mul,
    rms_norm,
    scaled_dot_product_attention,
    silu,
)
from nbx_tune.kernels.runtime import certified, launch
from nbx_tune.kernels import _to_copy, arange, batch_norm, cat, embedding, max_pool2d_with_indices
from nbx_tune.kernels import add_layer_norm, add_rms_norm, cat_kv, rope_cos_sin, rotary, rotary_qk, silu_mul
from nbx_tune.kernels import matmul as matmul_module
from nbx_tune.kernels import sum as nbx_sum
from nbx_tune.kernels.softmax import softmax
from nbx_tune.oracles import matmul as oracle


@pytest.fixture
def fake(monkeypatch):
    f = FakeTriton()
    monkeypatch.setattr(launch, "through_triton", f)
    return f


class OtherDevice(torch.Tensor):
    """A CPU tensor that says it lives on cpu:0: another device, as far as a key can tell."""
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):
        return torch.device("cpu", 0)


def buf(*shape, dtype=torch.float32, offset=0, transposed=False):
    """An empty tensor of `shape`; `offset` elements past a 16-byte boundary, or with its last
    two dims' strides swapped."""
    if transposed:
        return buf(*shape[:-2], shape[-1], shape[-2], dtype=dtype, offset=offset).transpose(-1, -2)
    flat = torch.empty(offset + math.prod(shape), dtype=dtype)
    return flat[offset:].view(*shape)


def fill(args, seed):
    g = torch.Generator().manual_seed(seed)
    for t in args:
        if isinstance(t, torch.Tensor):
            t.copy_(torch.randn(t.shape, generator=g))


# family -> (op, argument builder (tensors made with `buf`), keyword arguments). Small odd
# shapes; one launch per call.
FAMILIES = {
    "elementwise_unary": (silu, lambda b: (b(37, 16),), {}),
    "elementwise_binary": (mul, lambda b: (b(37, 16), b(16)), {}),
    "attention": (scaled_dot_product_attention, lambda b: (b(1, 2, 5, 16), b(1, 2, 7, 16), b(1, 2, 7, 16)),
                  {"is_causal": True}),
    "layer_norm": (layer_norm, lambda b: (b(5, 48), (48,), b(48), b(48)), {}),
    "rms_norm": (rms_norm, lambda b: (b(5, 48), [48], b(48)), {}),
    "group_norm": (group_norm, lambda b: (b(2, 4, 5), 2, b(4), b(4)), {}),
    "softmax": (softmax, lambda b: (b(5, 37), -1), {}),
    "reduce": (nbx_sum, lambda b: (b(5, 37), 1), {}),
    "conv": (conv2d, lambda b: (b(1, 3, 8, 8), b(4, 3, 3, 3)), {"padding": 1}),
    "conv_pointwise": (conv2d, lambda b: (b(2, 6, 5, 7), b(4, 6, 1, 1), b(4)), {}),  # a 1x1: its own kernel
    "matmul": (mm, lambda b: (b(37, 32), b(32, 48)), {}),
    "copy": (_to_copy, lambda b: (b(37, 16),), {"dtype": torch.float16}),
    "cat": (lambda x, dim: cat([x], dim), lambda b: (b(3, 5, 7),), {"dim": 1}),  # one input, one launch
    # eps keeps var + eps positive for any filled value
    "batch_norm": (lambda x, m, v, w, c, **kw: batch_norm(x, w, c, m, v, **kw),
                   lambda b: (b(2, 4, 5), b(4), b(4), b(4), b(4)), {"training": False, "momentum": 0.1, "eps": 100.0}),
    "max_pool2d": (lambda x, **kw: max_pool2d_with_indices(x, **kw)[1], lambda b: (b(1, 3, 9, 7),),
                   {"kernel_size": 3, "stride": 2, "padding": 1}),
    "rotary": (rotary, lambda b: (b(2, 3, 5, 16), b(1, 5, 16), b(1, 5, 16)), {}),
    # k's output: the rows of the grid's second region
    "rotary_qk": (lambda *a: rotary_qk(*a)[1], lambda b: (b(2, 3, 5, 16), b(2, 1, 5, 16), b(1, 5, 16), b(1, 5, 16)),
                  {}),
    "silu_mul": (silu_mul, lambda b: (b(37, 16), b(37, 16)), {}),
    # the sum's output (the norm's is the other store of the same launch)
    "add_rms_norm": (lambda *a, **kw: add_rms_norm(*a, **kw)[1], lambda b: (b(5, 48), b(5, 48), b(48)),
                     {"eps": 1e-5}),
    "add_layer_norm": (lambda *a, **kw: add_layer_norm(*a, **kw)[0],
                       lambda b: (b(5, 48), b(5, 48), b(48), b(48)), {"eps": 1e-5}),
    # a decode step's cache grown (the values' output: the grid's second region)
    "cat_kv": (lambda *a, **kw: cat_kv(*a, **kw)[1], lambda b: (b(2, 3, 6, 8), b(2, 3, 1, 8), b(2, 3, 6, 8),
                                                               b(2, 3, 1, 8)), {"dim": -2}),
}
# Families that read strided inputs in place or stage them through the copy kernel
# (copy.dense): a call on a strided input is remembered under its strides.
REPLAYS_STRIDES = ("attention", "elementwise_binary", "reduce", "conv", "matmul", "elementwise_unary", "softmax",
                   "layer_norm", "rms_norm", "group_norm", "batch_norm", "max_pool2d", "rotary", "rotary_qk",
                   "silu_mul", "add_rms_norm", "add_layer_norm", "cat_kv")


@pytest.mark.parametrize("lean", [False, True], ids=["runner", "lean"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_a_replay_is_bit_identical_to_the_launch_through_triton(fake, family, lean, monkeypatch):
    if lean:  # replays call the compiled launcher itself (launch._lean_launcher)
        monkeypatch.setattr(launch, "_lean_launcher", lean_launcher)
    op, make, kw = FAMILIES[family]
    args = make(buf)
    fill(args, 1)
    first, second = op(*args, **kw), op(*args, **kw)
    assert torch.equal(first, second)
    assert first.data_ptr() != second.data_ptr()  # every call gets its own output
    fill(args, 2)  # new data in the same buffers: a replay reading stale addresses cannot pass
    third = op(*args, **kw)
    launch.forget()
    assert torch.equal(third, op(*args, **kw))  # Triton's launch on the same data
    replayed = ["lean", "direct"] if lean else ["direct"]
    assert fake.log == ["triton", *replayed, *replayed, "triton"]


def _c_launches(form):
    """launch._c_launch for FakeCompiled kernels: a stand-in for Triton's C launch of `form`
    that checks the arguments are laid out as that release's CudaLauncher.__call__ lays them
    out, then runs the fake's launcher with them."""
    def c_launch(compiled):
        if form == "flat":  # 3.6: grid, stream, function, coop, pdl, scratch x2, then run's own
            def fn(g0, g1, g2, stream, function, coop, pdl, scratch, profile, meta, lm, enter, exit_, *args):
                assert (coop, pdl, scratch, profile) == (False, True, None, None)
                compiled.log.append("c")
                compiled.run(g0, g1, g2, stream, function, meta, lm, enter, exit_, *args)
            return fn, "flat", False, True

        def fn(g0, g1, g2, stream, function, coop, pdl, meta, lm, enter, exit_, scratch, profile,
               annotations, signature, args):  # 3.9: the kernel's arguments as one tuple
            assert (coop, pdl, scratch, profile, annotations, signature) == (True, False, None, None, "ann", b"sig")
            assert isinstance(args, tuple)
            compiled.log.append("c")
            compiled.run(g0, g1, g2, stream, function, meta, lm, enter, exit_, *args)
        return fn, "packed", True, False, "ann", b"sig"
    return c_launch


@pytest.mark.parametrize("form", ["flat", "packed"])
@pytest.mark.parametrize("family", ["elementwise_unary", "matmul", "cat"])
def test_a_replay_through_tritons_c_launch_passes_what_its_launcher_would(fake, family, form, monkeypatch):
    monkeypatch.setattr(launch, "_lean_launcher", lean_launcher)
    monkeypatch.setattr(launch, "_c_launch", _c_launches(form))
    op, make, kw = FAMILIES[family]
    args = make(buf)
    fill(args, 1)
    first, second = op(*args, **kw), op(*args, **kw)
    assert torch.equal(first, second)
    assert fake.log[0] == "triton" and fake.log[1:4] == ["c", "lean", "direct"]


@pytest.mark.parametrize("version,attrs,form", [
    ("3.6.0", {}, "flat"),
    ("3.9.0", {"arg_annotations": "ann", "kernel_signature": b"sig"}, "packed"),
    ("3.7.1", {}, None),  # a release whose C launch this was not checked against
    ("3.6.0", {"global_scratch_size": 64}, None),  # scratch memory: the launcher allocates it
])
def test_the_c_launch_is_taken_only_where_its_call_is_known(version, attrs, form, monkeypatch):
    import triton

    CudaLauncher = type("CudaLauncher", (), {})
    run = CudaLauncher()
    run.launch, run.launch_cooperative_grid, run.launch_pdl = len, 0, 0  # a builtin, as the C launch is
    run.global_scratch_size = run.profile_scratch_size = 0
    for k, v in attrs.items():
        setattr(run, k, v)
    monkeypatch.setattr(triton, "__version__", version)
    got = launch._c_launch(SimpleNamespace(run=run))
    assert (got and got[1]) == form
    if form == "packed":
        assert got[4:] == ("ann", b"sig")


def test_an_empty_hook_chain_counts_as_no_hook(fake, monkeypatch):
    """Newer Triton keeps its launch hooks in a chain that is never None: an empty one
    must still let a replay call the compiled launcher itself."""
    from types import SimpleNamespace

    def with_empty_chains(compiled):
        run, fn, meta, _, stream, device = lean_launcher(compiled)
        chains = SimpleNamespace(launch_enter_hook=SimpleNamespace(calls=[]),
                                 launch_exit_hook=SimpleNamespace(calls=[]))
        return run, fn, meta, chains, stream, device

    monkeypatch.setattr(launch, "_lean_launcher", with_empty_chains)
    x = buf(37, 16)
    fill([x], 1)
    assert torch.equal(silu(x), silu(x))
    assert fake.log == ["triton", "lean", "direct"]


def test_a_lean_replay_still_calls_launch_hooks(fake, monkeypatch):
    """With a launch hook set (a profiler), a replay goes through CompiledKernel[grid]."""
    def with_hook(compiled):
        run, fn, meta, hooks, stream, device = lean_launcher(compiled)
        hooks.launch_enter_hook = lambda *a: None
        return run, fn, meta, hooks, stream, device

    monkeypatch.setattr(launch, "_lean_launcher", with_hook)
    x = buf(37, 16)
    fill([x], 1)
    assert torch.equal(silu(x), silu(x))
    assert fake.log == ["triton", "direct"]


def _variants(family, make):
    """(what changed, arguments): the same call with one thing Triton compiles for changed."""
    first = lambda **kw: (lambda *shape: buf(*shape, **kw))  # noqa: E731
    out = [("dtype", make(lambda *s: buf(*s, dtype=torch.float16))),
           ("alignment", make(first(offset=1))),
           ("device", tuple(t.as_subclass(OtherDevice) if isinstance(t, torch.Tensor) else t for t in make(buf)))]
    if family in REPLAYS_STRIDES:
        n = iter(range(99))
        out.append(("strides", make(lambda *s: buf(*s, transposed=len(s) >= 2 and next(n) == 0))))
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_a_changed_dtype_alignment_device_or_stride_is_never_served_another_replay(fake, family):
    op, make, kw = FAMILIES[family]
    base = make(buf)
    fill(base, 3)
    op(*base, **kw), op(*base, **kw)
    for what, args in _variants(family, make):
        fill(args, 4)
        fake.clear()
        got = op(*args, **kw)
        assert set(fake.log) == {"triton"}, f"{what}: served a replay recorded for another call"
        assert torch.equal(op(*args, **kw), got)  # its own replay (checked by the fake) gives the same
        if what == "device":  # one device here, really: the base call's replay computes the same
            plain = tuple(t.as_subclass(torch.Tensor) if isinstance(t, torch.Tensor) else t for t in args)
            assert torch.equal(op(*plain, **kw), got)


def test_an_embedding_and_an_arange_replay(fake):
    w, ids = fresh(37, 16, seed=20), torch.tensor([[3, 0, 36, 5]])
    first, second = embedding(w, ids), embedding(w, ids)
    ids.copy_(torch.tensor([[1, 2, 3, 4]]))  # new indices in the same buffer
    assert torch.equal(first, second) and torch.equal(embedding(w, ids), w[ids])
    assert torch.equal(arange(37), torch.arange(37)) and torch.equal(arange(37), torch.arange(37))
    assert fake.log == ["triton", "direct", "direct", "triton", "direct"]
    fake.clear()
    x, y = fresh(3, 5, 7, seed=21), fresh(3, 2, 7, seed=22)
    assert torch.equal(cat([x, y], 1), torch.cat([x, y], 1))
    y.copy_(fresh(3, 2, 7, seed=23))
    assert torch.equal(cat([x, y], 1), torch.cat([x, y], 1))  # two inputs: one launch, replayed
    assert fake.log == ["triton", "direct"]
    fake.clear()
    z = fresh(3, 1, 7, seed=24)  # three inputs: one copy launch per input, replayed
    assert torch.equal(cat([x, y, z], 1), torch.cat([x, y, z], 1))
    z.copy_(fresh(3, 1, 7, seed=25))
    assert torch.equal(cat([x, y, z], 1), torch.cat([x, y, z], 1))
    assert fake.log == ["triton"] * 3 + ["direct"] * 3


def test_a_rope_tables_replay_reads_new_positions_and_a_new_scaling_is_another_call(fake):
    pos, inv = torch.tensor([[0, 7, 4095]]), torch.rand(8)
    first = rope_cos_sin(pos, inv, 1.0, torch.float32)
    pos.copy_(torch.tensor([[1, 2, 3]]))  # new positions in the same buffer
    second = rope_cos_sin(pos, inv, 1.0, torch.float32)
    assert not torch.equal(first[0], second[0])
    assert all(torch.equal(a, b) for a, b in zip(second, rope_cos_sin(pos.clone(), inv, 1.0, torch.float32)))
    scaled = rope_cos_sin(pos, inv, 0.5, torch.float32)  # a scalar the replay holds: its own record
    assert torch.equal(scaled[1], second[1] * 0.5)
    assert fake.log == ["triton", "direct", "direct", "triton"]


def test_the_interpreter_compiles_nothing_so_every_call_goes_through_triton():
    x = torch.randn(37, 16)
    silu(x), silu(x)
    assert certified.launch_stats()["direct_launches"] == 0
    assert certified.launch_stats()["not_remembered"]["nothing compiled (the interpreter)"] == 2


def test_calls_that_copy_an_input_with_torch_or_alias_inputs_are_never_remembered(fake, monkeypatch):
    from nbx_tune.kernels.spec import Config

    sq = fresh(32, 32, seed=8)
    for _ in range(2):
        mm(sq, sq.t())
    assert fake.log == ["triton"] * 2 and set(launch.REFUSED) == {"inputs at one address"}
    # Under a TMA tile an operand staged at aligned=0 goes into a descriptor: a replay makes
    # descriptors around inputs only, so the call (a zero fill, two copies, the GEMM) takes
    # its ordinary path every time.
    tma = Config.make(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, TMA=1, num_warps=1, num_stages=1)
    monkeypatch.setattr(matmul_module.SPEC, "default_configs", (tma,))
    certified.reload()
    fake.clear()
    a, b = fresh(37, 23, seed=6), fresh(23, 45, seed=7)  # K = 23: matmul stages padded copies
    for _ in range(2):
        assert rel_err(mm(a, b), oracle.mm(a.double().numpy(), b.double().numpy())) < 1e-5
    assert fake.log == ["triton"] * 8 and launch.REMEMBERED == {}
    assert set(launch.REFUSED) == {"a descriptor of no input"}  # the staged copies


def test_a_cat_of_one_tensor_twice_is_replayed_and_not_served_to_two_tensors(fake):
    x = fresh(3, 4, seed=11)
    first = cat([x, x], -1)
    x.copy_(fresh(3, 4, seed=12))
    assert torch.equal(cat([x, x], -1), torch.cat([x, x], -1))  # replayed on the new data
    y = fresh(3, 4, seed=13)  # the same layout, another tensor: not the alias's replay
    assert torch.equal(cat([x, y], -1), torch.cat([x, y], -1))
    # One launch of the two-input kernel, both pointers at x's address: one input of the replay.
    assert fake.log == ["triton", "direct", "triton"]
    assert not torch.equal(first, cat([x, x], -1))
    fake.clear()
    assert torch.equal(cat([x, y, x], 0), torch.cat([x, y, x], 0))  # a repeat after another tensor
    assert torch.equal(cat([x, y, x], 0), torch.cat([x, y, x], 0))
    assert fake.log == ["triton"] * 3 + ["direct"] * 3
    fake.clear()
    v = x.view(3, 4)  # another tensor at x's address: never remembered, served right each call
    assert torch.equal(cat([x, v], 0), torch.cat([x, x], 0)) and torch.equal(cat([x, v], 0), torch.cat([x, x], 0))
    assert fake.log == ["triton", "triton"] and launch.REFUSED["inputs at one address"] == 2
    with pytest.raises(KernelError, match="cat: the operands must be tensors"):
        cat([x, [1, 2]], 0)


def test_a_strided_input_is_staged_by_the_copy_kernel_and_the_call_replayed(fake):
    # rotary's rotate_half negates a strided slice in every layer: a torch copy would send
    # each such call through Triton's full launch path every time.
    base = fresh(16, 74, seed=5)
    x = base[:, 37:].t()  # neither contiguous nor at its storage's start
    first = silu(x), softmax(x, -1)
    base.copy_(fresh(16, 74, seed=9))  # new data in the same buffer
    second = silu(x), softmax(x, -1)
    # silu reads x in place (one kernel); softmax stages it (a copy and its kernel)
    assert fake.log == ["triton"] * 3 + ["direct"] * 3
    launch.forget()
    assert all(torch.equal(r, t) for r, t in zip(second, (silu(x), softmax(x, -1))))
    ref = x.double()
    assert rel_err(second[0], (ref * torch.sigmoid(ref)).numpy()) < 1e-5
    assert not torch.equal(first[0], second[0])


def test_an_operand_used_twice_is_one_input_and_does_not_serve_two_operands(fake):
    x, y = fresh(37, 16, seed=9), fresh(37, 16, seed=10)
    assert torch.equal(mul(x, x), mul(x, x))
    assert torch.equal(mul(x, y), x * y)  # the same layout, two tensors: not x * x's replay
    assert fake.log == ["triton", "direct", "triton"]


def test_scalars_are_keyed_by_type_and_value(fake):
    x = fresh(37, 16, seed=11)
    xo = x.as_subclass(OtherDevice)  # so that a 0-d CPU tensor is passed as a number, as with a GPU x
    results = [mul(x, 2), mul(x, 2.0), mul(x, 3.0), mul(xo, torch.tensor(2.0)), mul(xo, torch.tensor(3.0))]
    assert fake.log == ["triton"] * 5  # int and float are different seats; values are baked in
    for got, want in zip(results, (2, 2, 3, 2, 3)):
        assert torch.equal(got, x * want)
    assert torch.equal(mul(xo, torch.tensor(3.0)), x * 3) and fake.log[-1] == "direct"


def test_write_only_scratch_is_shared_and_an_outgrown_buffer_stays_valid(fake):
    small, w = fresh(3, 48, seed=12), fresh(48, seed=13)
    first = layer_norm(small, (48,), w)
    big = fresh(4096, 48, seed=14)  # its statistics outgrow the scratch buffer
    layer_norm(big, (48,), w)
    assert torch.equal(layer_norm(small, (48,), w), first)  # the replay names the first buffer
    assert fake.log == ["triton", "triton", "direct"]
    assert next(iter(launch.REMEMBERED.values())).source.count("torch.empty") == 1  # y only: no statistics


def test_an_unbatched_convolution_returns_a_view_of_its_output(fake):
    x, w = fresh(3, 11, seed=15), fresh(4, 3, 3, seed=16)
    first = conv1d(x, w)
    assert first.shape == (4, 9) and torch.equal(conv1d(x, w), first)
    assert fake.log == ["triton", "direct"]


# ----------------------------------------------------------------------------- matmul

def rel_err(got, ref):
    return np.abs(got.double().numpy() - ref).max() / np.abs(ref).max()


def fresh(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_anything_triton_specializes_on_gets_its_own_compiled_kernel(fake):
    buf_ = fresh(48 * 32 + 1, seed=2)
    b = fresh(32, 48, seed=3)
    B = b.double().numpy()
    cases = [
        buf_[:37 * 32].view(37, 32),  # aligned
        buf_[1:1 + 37 * 32].view(37, 32),  # the same shape and strides, a 4-byte offset
        buf_[:1 * 32].view(1, 32),  # M = 1: Triton makes it a constant
        buf_[:32 * 32].view(32, 32),  # M = 32: divisible by 16
        buf_[:48 * 32].view(32, 48).t(),  # transposed strides
    ]
    for a in cases * 2:
        assert rel_err(mm(a, b), oracle.mm(a.double().numpy(), B)) < 1e-5
    assert fake.log == ["triton"] * len(cases) + ["direct"] * len(cases)


def test_alpha_and_beta_are_keyed_and_passed_as_floats(fake):
    x, a, b = fresh(48, seed=4), fresh(37, 32, seed=5), fresh(32, 48, seed=6)
    X, A, B = (t.double().numpy() for t in (x, a, b))
    for alpha, beta in [(1, 1), (2, 1), (1, 3), (-1.5, 0.5), (2, 1)]:
        assert rel_err(addmm(x, a, b, alpha=alpha, beta=beta), oracle.addmm(X, A, B, alpha, beta)) < 1e-5
    assert fake.log == ["triton"] * 4 + ["direct"]


def test_a_broadcast_bias_replays_from_its_own_address(fake):
    a3, b3 = fresh(3, 19, 32, seed=7), fresh(3, 32, 48, seed=8)
    A3, B3 = a3.double().numpy(), b3.double().numpy()
    biases = (torch.empty(3, 1, 48), torch.empty(48), torch.empty(3, 19, 48))
    for seed in range(2):
        for x3 in biases:
            x3.copy_(fresh(*x3.shape, seed=20 + seed))
            got = baddbmm(x3, a3, b3, alpha=0.25)
            assert rel_err(got, oracle.baddbmm(x3.double().numpy(), A3, B3, 0.25, 1.0)) < 1e-5
    assert fake.log == ["triton"] * 3 + ["direct"] * 3
    assert rel_err(bmm(a3, b3), oracle.bmm(A3, B3)) < 1e-5  # no bias: another call


def test_reload_forgets_replays_and_replays_still_count_misses(fake):
    a, b = fresh(37, 32, seed=9), fresh(32, 48, seed=10)
    for _ in range(3):
        mm(a, b)
    assert sum(certified.launch_stats()["misses"].values()) == 3  # no certificate: every call a miss
    certified.reload()
    mm(a, b)
    assert fake.log == ["triton", "direct", "direct", "triton"]


def test_a_tile_with_a_second_accumulator_replays_right(fake, monkeypatch):
    # A certificate may name a tile BLOCK_N + EXTRA_N wide (kernels/matmul/): its grid and
    # its extra constexpr must be what the replay passes. N = 48 makes two tile columns of
    # 32, the second one's extra block wholly past the edge.
    from nbx_tune.kernels.spec import Config

    wide = Config.make(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, EXTRA_N=16, num_warps=1, num_stages=1)
    monkeypatch.setattr(matmul_module.SPEC, "default_configs", (wide,))  # what a seat with no certificate gets
    certified.reload()
    x, a, b = torch.empty(48), torch.empty(37, 32), fresh(32, 48, seed=14)
    for seed in range(3):
        x.copy_(fresh(48, seed=40 + seed))
        a.copy_(fresh(37, 32, seed=50 + seed))
        got = addmm(x, a, b, alpha=2.0, beta=0.5)
        ref = oracle.addmm(x.double().numpy(), a.double().numpy(), b.double().numpy(), 2.0, 0.5)
        assert rel_err(got, ref) < 1e-5
    assert fake.log == ["triton", "direct", "direct"]
    assert [hit[0] for hit in certified.state().memo.values()] == [wide]
    assert ", 16, 0)" in launch.listing(next(iter(launch.REMEMBERED.values())))  # EXTRA_N and TMA, the last constexprs


def test_a_tma_tile_replays_with_descriptors_of_each_calls_operands(fake, monkeypatch):
    # The descriptors hold the operands' addresses, so a replay must make them around each
    # call's tensors. Fresh tensors every call (same key: shapes, strides, low address
    # bits) would read the first call's data otherwise.
    from nbx_tune.kernels.spec import Config

    tma = Config.make(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, TMA=1, num_warps=1, num_stages=1)
    monkeypatch.setattr(matmul_module.SPEC, "default_configs", (tma,))
    certified.reload()
    for seed in range(3):
        a, b = fresh(37, 32, seed=60 + seed), fresh(32, 48, seed=70 + seed)
        assert rel_err(mm(a, b), oracle.mm(a.double().numpy(), b.double().numpy())) < 1e-5
        if seed == 0:
            first = weakref.ref(a)
    assert fake.log == ["triton", "direct", "direct"]
    gc.collect()
    assert first() is None  # the replay's descriptors do not hold the first call's operand
    assert next(iter(launch.REMEMBERED.values())).source.count("(d") == 2  # a's and b's descriptors


def test_two_kernels_through_a_workspace_replay_right(fake, monkeypatch):
    # Split-K GEMMs and split decode attention: a partials workspace (launch.empty) written
    # by one kernel and read by the next. A replay makes a fresh workspace and both launches.
    from nbx_tune.kernels import attention as attention_module
    from nbx_tune.kernels.spec import Config

    split = Config.make(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, SPLIT_K=2, num_warps=1, num_stages=1)
    decode = Config.make(BLOCK_M=16, BLOCK_N=16, SPLIT_KV=2, num_warps=1, num_stages=1)
    monkeypatch.setattr(matmul_module.SPEC, "default_configs", (split,))
    monkeypatch.setattr(attention_module.SPEC, "default_configs", (decode,))
    certified.reload()
    a, b = buf(5, 64), buf(64, 48)
    q, k, v = buf(1, 4, 1, 16), buf(1, 2, 37, 16), buf(1, 2, 37, 16)
    for seed in range(3):
        fill((a, b, q, k, v), 80 + seed)
        got = (mm(a, b), scaled_dot_product_attention(q, k, v))
        launch.forget()
        want = (mm(a, b), scaled_dot_product_attention(q, k, v))  # through Triton
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert fake.log == ["triton"] * 8 + (["direct"] * 4 + ["triton"] * 4) * 2  # 2 + 2 launches a round
    assert [hit[0] for hit in certified.state().memo.values()] == [split, decode]


def test_a_split_summed_by_its_last_split_replays_with_its_streams_counters(fake, monkeypatch):
    # SUM_LAST: per-tile counters (launch.counters) instead of a second launch. A replay
    # looks up the current stream's counters on every call, so two streams never share them.
    from nbx_tune.kernels.spec import Config

    last = Config.make(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, SPLIT_K=2, SUM_LAST=1, num_warps=1, num_stages=1)
    monkeypatch.setattr(matmul_module.SPEC, "default_configs", (last,))
    certified.reload()
    a, b = buf(5, 64), buf(64, 48)
    for seed in range(3):
        fill((a, b), 90 + seed)
        got = mm(a, b)
        launch.forget()
        assert torch.equal(got, mm(a, b))  # through Triton
    assert fake.log == ["triton"] * 2 + (["direct"] + ["triton"]) * 2  # one launch a call
    seen = []
    real = launch._counters_at
    monkeypatch.setattr(launch, "_counters_at", lambda n, device: seen.append(real(n, device)) or seen[-1])
    assert not seen
    launch.forget()
    mm(a, b)  # recorded through Triton, then replayed:
    mm(a, b)
    assert len(seen) == 1
    monkeypatch.setattr(launch, "_stream_of", lambda device: 12345)  # another stream
    mm(a, b)
    assert len(seen) == 2 and seen[1] != seen[0]
    assert not launch.counters(6, a.device).any()


# ----------------------------------------------------------------------------- matmul staging
# At aligned=0 matmul copies operands into zero-padded buffers (kernels/matmul/kernel.py's
# stage_operands) with the copy and fill kernels into `launch.empty`, so the call is
# remembered; rotary's inv_freq @ positions, a float32 [B, 64, 1] @ [B, 1, N] product, is
# one in every decode step.

STAGED = {  # name -> (op, operand builder, the oracle)
    "rotary decode 1x64x1 @ 1x1x1": (bmm, lambda: (fresh(1, 64, 1, seed=1), fresh(1, 1, 1, seed=2)), oracle.bmm),
    "rotary 3x64x1 (batch broadcast) @ 3x1x7": (
        bmm, lambda: (fresh(1, 64, 1, seed=3).expand(3, 64, 1), fresh(3, 1, 7, seed=4)), oracle.bmm),
    "mm K=23": (mm, lambda: (fresh(37, 23, seed=5), fresh(23, 45, seed=6)), oracle.mm),
    "mm K=23, C's rows aligned": (mm, lambda: (fresh(37, 23, seed=17), fresh(23, 48, seed=18)), oracle.mm),
    "mm N=45, b staged only": (mm, lambda: (fresh(37, 32, seed=7), fresh(32, 45, seed=8)), oracle.mm),
    "mm W.t() with odd K": (mm, lambda: (fresh(37, 23, seed=9), fresh(45, 23, seed=10).t()), oracle.mm),
    "baddbmm bias (B,1,N)": (lambda a, b, x: baddbmm(x, a, b, alpha=0.25),
                             lambda: (fresh(3, 19, 23, seed=11), fresh(3, 23, 31, seed=12), fresh(3, 1, 31, seed=13)),
                             lambda a, b, x: oracle.baddbmm(x, a, b, 0.25, 1.0)),
    "addmm bias (N,)": (lambda a, b, x: addmm(x, a, b, beta=0.5),
                        lambda: (fresh(37, 23, seed=14), fresh(23, 45, seed=15), fresh(45, seed=16)),
                        lambda a, b, x: oracle.addmm(x, a, b, 1.0, 0.5)),
}


def _refill(tensors, seed):
    for t in tensors:  # a view's new data goes into its base (an expanded operand's included)
        base = t if t._base is None else t._base
        base.copy_(fresh(*base.shape, seed=seed))


@pytest.mark.parametrize("case", STAGED)
def test_a_staged_matmul_is_remembered_and_its_replay_is_bit_identical(fake, case):
    op, make, ref = STAGED[case]
    args = make()
    assert matmul_module.alignment(args[0].stride(), args[1].stride(), args[1].shape[-1], args[0].shape[-1], 4) == 0
    first, second = op(*args), op(*args)
    assert torch.equal(first, second) and first.data_ptr() != second.data_ptr()
    staging = fake.log.index("direct")  # the first call's launches: zero fill?, copies, the GEMM
    assert fake.log == ["triton"] * staging + ["direct"] * staging and staging >= 2
    assert len(launch.REMEMBERED) == 1 and not launch.REFUSED
    _refill(args, 99)  # new data in the same buffers: a replay reading a stale copy cannot pass
    third = op(*args)
    launch.forget()
    assert torch.equal(third, op(*args))  # Triton's launch on the same data
    assert rel_err(third, ref(*(t.double().numpy() for t in args))) < 1e-5


def test_a_staged_matmul_with_another_address_stride_or_alignment_is_served_its_own(fake):
    a, b = fresh(1, 64, 1, seed=1), fresh(1, 1, 1, seed=2)
    bmm(a, b), bmm(a, b)
    raw = fresh(2 * 64 + 1, seed=3)
    others = [
        (fresh(1, 64, 1, seed=4), fresh(1, 1, 1, seed=5)),  # other addresses, the same key: the replay
        (raw[1:65].view(1, 64, 1), b),  # a 4 bytes past 16-byte alignment
        (raw[:128].view(1, 64, 2)[..., :1], b),  # a's rows 2 apart
        (fresh(1, 1, 64, seed=6).transpose(1, 2), b),  # transposed
    ]
    for i, (x, y) in enumerate(others):
        fake.clear()
        got = bmm(x, y)
        assert fake.log[-1] == ("direct" if i == 0 else "triton")
        assert rel_err(got, oracle.bmm(x.double().numpy(), y.double().numpy())) < 1e-5
        assert torch.equal(bmm(x, y), got)  # its own replay


def test_a_padded_pointwise_convolution_is_remembered_and_its_replay_is_bit_identical(fake, monkeypatch):
    # A PAD config (7 x 7 maps): the copies into and out of padded pixel rows are kernels
    # into `launch.empty`, so the whole call replays, on the data of each call.
    from nbx_tune.kernels import conv as cv
    from nbx_tune.oracles import conv as conv_oracle

    pad = next(c for c in cv.POINTWISE_CONFIGS if c.kwargs.get("PAD") and c.kwargs.get("SPLIT_K", 1) == 1)
    monkeypatch.setattr(cv.ops, "config_for", lambda spec, d, f, dims: pad)
    x, w = fresh(2, 24, 7, 7, seed=1), fresh(5, 24, 1, 1, seed=2)
    first, second = cv.conv2d(x, w), cv.conv2d(x, w)
    assert torch.equal(first, second)
    n = fake.log.index("direct")  # copy in, the GEMM, copy out
    assert fake.log == ["triton"] * n + ["direct"] * n and n == 3
    _refill([x], 99)
    third = cv.conv2d(x, w)
    assert rel_err(third, conv_oracle.conv2d(x.double().numpy(), w.double().numpy())) < 1e-5


def test_a_call_at_a_new_length_reuses_the_compiled_replay_code(fake):
    # A growing KV cache makes a new shape every step: its replay differs from the last
    # one's in values only (sizes, strides, the grid), which are closure constants, so the
    # source is the same and is compiled once (launch._CODE).
    launch._CODE.clear()
    outs = {}
    for n in (37, 38, 75):
        x = fresh(n, 16, seed=n)
        outs[n] = (silu(x), silu(x), x)
    replays = list(launch.REMEMBERED.values())
    assert len(replays) == 3 and len({r.source for r in replays}) == 1 and len(launch._CODE) == 1
    assert {r.values[k] for r in replays for k in r.values} >= {37 * 16, 38 * 16, 75 * 16}
    for n, (first, second, x) in outs.items():
        assert torch.equal(first, second) and first.shape == (n, 16)
        ref = x.double() * torch.sigmoid(x.double())
        assert rel_err(second, ref.numpy()) < 1e-5

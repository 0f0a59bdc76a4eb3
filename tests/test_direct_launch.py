"""The direct launch of matmul: after the first launch of an exact argument set through
Triton, later ones call the compiled kernel Triton returned, skipping its argument binding.

The interpreter compiles nothing, so a fake stands in for Triton's compiled kernel here. It
runs the real kernel under the interpreter with exactly the arguments the direct path
passes (so their order is checked against the oracle), and it refuses a call whose
arguments Triton would have compiled differently: integer values 1, divisibility by 16,
32/64-bit range, pointer alignment, dtypes. The GPU half of the proof is
bench/direct_launch_check.py.
"""

import numpy as np
import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from nbx_tune.kernels import addmm, baddbmm, bmm, certified, mm
from nbx_tune.kernels import matmul as matmul_module
from nbx_tune.oracles import matmul as oracle


def specialization(args) -> tuple:
    """What Triton's JIT keys a compile on, per argument (runtime/jit.py, specialize_impl)."""
    out = []
    for v in args:
        if isinstance(v, torch.Tensor):
            out.append((v.dtype, v.data_ptr() % 16 == 0))
        elif isinstance(v, bool) or isinstance(v, str):
            out.append(v)
        elif isinstance(v, int):
            out.append(("int", v == 1, v % 16 == 0, -2**31 <= v < 2**31))
        elif isinstance(v, float):
            out.append("fp32")
        elif v is None:  # a constexpr None: the descriptors of a config without TMA
            out.append(None)
        elif isinstance(v, TensorDescriptor):  # compiled for its dtype and box
            out.append(("desc", v.base.dtype, tuple(v.block_shape), len(v.shape)))
        else:
            raise TypeError(type(v))
    return tuple(out)


class FakeCompiled:
    def __init__(self, real, spec, options, log):
        self.real, self.spec, self.options, self.log = real, spec, options, log

    def __getitem__(self, grid):
        # Triton's launcher reads grid[0], grid[1] and grid[2] (an IndexError on 3.6 otherwise).
        assert len(grid) == 3, grid

        def runner(*args):
            assert specialization(args) == self.spec, "a direct launch Triton would have compiled differently"
            self.log.append("direct")
            self.real[grid](*args, **self.options)
        return runner


class FakeJit:
    """Triton's JITFunction as launch_matmul uses it, returning a FakeCompiled."""

    def __init__(self, real):
        self.real, self.log = real, []

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.log.append("triton")
            self.real[grid](*args, **options)
            return FakeCompiled(self.real, specialization(args), options, self.log)
        return launch


@pytest.fixture
def jit(monkeypatch):
    fake = FakeJit(matmul_module._matmul_kernel)
    monkeypatch.setattr(matmul_module, "_matmul_kernel", fake)
    return fake


def rel_err(got, ref):
    return np.abs(got.double().numpy() - ref).max() / np.abs(ref).max()


def fresh(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# K = 32 and N = 48: aligned seats (strides multiples of 16), launched without staging
# copies; M stays odd. Unaligned launches are the last test's.
def test_the_second_launch_of_the_same_arguments_is_direct_and_right(jit):
    a, b = torch.empty(37, 32), fresh(32, 48, seed=1)
    for seed in range(3):  # new data in the same buffer each time: a stale output cannot pass
        a.copy_(fresh(37, 32, seed=10 + seed))
        assert rel_err(mm(a, b), oracle.mm(a.double().numpy(), b.double().numpy())) < 1e-5
    assert jit.log == ["triton", "direct", "direct"]
    assert certified.launch_stats()["direct_launches"] == 1


def test_anything_triton_specializes_on_gets_its_own_compiled_kernel(jit):
    buf = fresh(48 * 32 + 1, seed=2)
    b = fresh(32, 48, seed=3)
    B = b.double().numpy()
    cases = [
        buf[:37 * 32].view(37, 32),  # aligned
        buf[1:1 + 37 * 32].view(37, 32),  # the same shape and strides, a 4-byte offset
        buf[:1 * 32].view(1, 32),  # M = 1: Triton makes it a constant
        buf[:32 * 32].view(32, 32),  # M = 32: divisible by 16
        buf[:48 * 32].view(32, 48).t(),  # transposed strides
    ]
    for a in cases * 2:
        assert rel_err(mm(a, b), oracle.mm(a.double().numpy(), B)) < 1e-5
    assert jit.log == ["triton"] * len(cases) + ["direct"] * len(cases)


def test_alpha_and_beta_pass_as_floats_so_integer_values_share_a_kernel(jit):
    x, a, b = fresh(48, seed=4), fresh(37, 32, seed=5), fresh(32, 48, seed=6)
    X, A, B = (t.double().numpy() for t in (x, a, b))
    for alpha, beta in [(1, 1), (2, 1), (1, 3), (-1.5, 0.5)]:
        assert rel_err(addmm(x, a, b, alpha=alpha, beta=beta), oracle.addmm(X, A, B, alpha, beta)) < 1e-5
    assert jit.log == ["triton", "direct", "direct", "direct"]


def test_a_broadcast_bias_launches_directly_from_its_own_address(jit):
    a3, b3 = fresh(3, 19, 32, seed=7), fresh(3, 32, 48, seed=8)
    A3, B3 = a3.double().numpy(), b3.double().numpy()
    biases = (torch.empty(3, 1, 48), torch.empty(48), torch.empty(3, 19, 48))
    for seed in range(2):
        for x3 in biases:
            x3.copy_(fresh(*x3.shape, seed=20 + seed))
            got = baddbmm(x3, a3, b3, alpha=0.25)
            assert rel_err(got, oracle.baddbmm(x3.double().numpy(), A3, B3, 0.25, 1.0)) < 1e-5
    assert jit.log == ["triton"] * 3 + ["direct"] * 3
    assert rel_err(bmm(a3, b3), oracle.bmm(A3, B3)) < 1e-5  # no bias: another launch


def test_reload_forgets_direct_launches_and_misses_are_still_counted(jit):
    a, b = fresh(37, 32, seed=9), fresh(32, 48, seed=10)
    for _ in range(3):
        mm(a, b)
    assert sum(certified.launch_stats()["misses"].values()) == 3  # no certificate: every call a miss
    certified.reload()
    mm(a, b)
    assert jit.log == ["triton", "direct", "direct", "triton"]


def test_the_interpreter_compiles_nothing_so_every_launch_goes_through_triton():
    a, b = fresh(37, 23, seed=11), fresh(23, 45, seed=12)
    mm(a, b)
    mm(a, b)
    assert certified.launch_stats()["direct_launches"] == 0


def test_an_unaligned_launch_is_staged_every_time_and_never_direct(jit):
    # N = 45 and K = 23: b's and a's rows are not multiples of 16 elements, so each launch
    # copies them into padded buffers (fresh addresses): a remembered launch would be wrong.
    a, b = torch.empty(37, 23), fresh(23, 45, seed=13)
    for seed in range(3):
        a.copy_(fresh(37, 23, seed=30 + seed))
        assert rel_err(mm(a, b), oracle.mm(a.double().numpy(), b.double().numpy())) < 1e-5
    assert jit.log == ["triton"] * 3
    assert certified.launch_stats()["direct_launches"] == 0


def test_a_tile_with_a_second_accumulator_launches_directly_and_right(jit, monkeypatch):
    # A certificate may name a tile BLOCK_N + EXTRA_N wide (kernels/matmul.py): its grid and
    # its extra constexpr must be what the direct launch remembers. N = 48 makes two tile
    # columns of 32, the second one's extra block wholly past the edge.
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
    assert jit.log == ["triton", "direct", "direct"]
    assert [cfg for cfg, _ in certified.state().memo.values()] == [wide]
    (fixed, consts, tma_config), = [v[1] for v in certified.state().direct.values()]
    assert consts[-2:] == (16, 0)  # EXTRA_N and TMA, the kernel's last constexprs, on every direct launch
    assert tma_config is None


def test_a_tma_tile_launches_directly_with_descriptors_of_each_calls_operands(jit, monkeypatch):
    # A TMA certificate: the descriptors hold the operands' addresses, so a direct launch
    # must make them afresh from each call's tensors. Fresh tensors every call (same key:
    # shapes, strides, low address bits) would read the first call's data otherwise.
    from nbx_tune.kernels.spec import Config

    tma = Config.make(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, TMA=1, num_warps=1, num_stages=1)
    monkeypatch.setattr(matmul_module.SPEC, "default_configs", (tma,))
    certified.reload()
    for seed in range(3):
        a, b = fresh(37, 32, seed=60 + seed), fresh(32, 48, seed=70 + seed)
        assert rel_err(mm(a, b), oracle.mm(a.double().numpy(), b.double().numpy())) < 1e-5
    assert jit.log == ["triton", "direct", "direct"]
    (fixed, consts, tma_config), = [v[1] for v in certified.state().direct.values()]
    assert tma_config == tma and consts[-1] == 2  # 2-D descriptors for one product

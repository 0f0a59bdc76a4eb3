"""Matmul: the kernel against its fp64 oracle at odd shapes in every dtype the interpreter
can check, the trace rows it serves and refuses, and its public ops."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from nbx_tune.errors import KernelError
from nbx_tune.kernels import addmm, baddbmm, bmm, mm
from nbx_tune.kernels.matmul import CONFIGS, SPEC, TORCH_DTYPES, launch_matmul
from nbx_tune.kernels.spec import Config, NotServable
from nbx_tune.oracles import matmul as oracle
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify.selfcheck import check_kernel
from nbx_tune.kernels.trace import make_row

INTERP = get_profile("interpreter")


def test_every_example_row_matches_the_oracle_under_several_configs():
    checks = check_kernel(SPEC, INTERP, "cpu", scale="small", configs_per_row=3)
    assert {c.dtype for c in checks} == {"float16", "float32"}  # bf16 is proven on a GPU
    assert len(checks) == 30 and len({c.config for c in checks}) >= 3
    bad = [c for c in checks if not c.ok]
    assert not bad, bad[0]
    assert max(c.err for c in checks if c.dtype == "float32") < 1e-5


@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_public_ops_against_the_oracle_at_odd_shapes(dtype, rtol):
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(41, 23, generator=g).to(dtype), torch.randn(23, 57, generator=g).to(dtype)
    x = torch.randn(57, generator=g).to(dtype)
    A, B, X = (t.double().numpy() for t in (a, b, x))

    def err(got, ref):
        return np.abs(got.double().numpy() - ref).max() / np.abs(ref).max()

    assert err(mm(a, b), oracle.mm(A, B)) < rtol
    assert err(addmm(x, a, b, beta=0.5, alpha=-2.0), oracle.addmm(X, A, B, -2.0, 0.5)) < rtol
    a3, b3 = torch.randn(3, 19, 23, generator=g).to(dtype), torch.randn(3, 23, 31, generator=g).to(dtype)
    x3 = torch.randn(3, 1, 31, generator=g).to(dtype)
    A3, B3, X3 = (t.double().numpy() for t in (a3, b3, x3))
    assert err(bmm(a3, b3), oracle.bmm(A3, B3)) < rtol
    assert err(baddbmm(x3, a3, b3, alpha=0.25), oracle.baddbmm(X3, A3, B3, 0.25, 1.0)) < rtol
    # Transposed (non-contiguous) operands go through strides.
    assert err(mm(b.t(), a.t()), oracle.mm(B.T, A.T)) < rtol


def test_beta_zero_ignores_nan_in_the_input_as_torch_does():
    a, b = torch.randn(9, 5), torch.randn(5, 7)
    out = addmm(torch.full((7,), float("nan")), a, b, beta=0.0)
    torch.testing.assert_close(out, a @ b, rtol=1e-5, atol=1e-5)


def test_bf16_refuses_to_run_on_the_interpreter():
    a = torch.randn(8, 8).bfloat16()
    with pytest.raises(KernelError, match="bfloat16 cannot run correctly on profile interpreter"):
        mm(a, a)


@pytest.mark.parametrize("row,reason", [
    (make_row("aten.mm", ["float16", "float32"], [(4, 5), (5, 6)]), "mixed dtypes"),
    (make_row("aten.mm", ["int64"] * 2, [(4, 5), (5, 6)]), "dtype int64 is not served"),
    (make_row("aten.mm", ["float16"] * 2, [(4, 5), (6, 7)]), "do not multiply"),
    (make_row("aten.mm", ["float16"] * 2, [(2, 4, 5), (5, 6)]), "rank-2"),
    (make_row("aten.bmm", ["float16"] * 2, [(2, 4, 5), (3, 5, 6)]), "do not multiply"),
    (make_row("aten.addmm", ["float16"] * 3, [(5,), (4, 5), (5, 6)]), "does not broadcast"),
    (make_row("aten.addmm", ["float16"] * 2, [(4, 5), (5, 6)]), "takes 3 tensors"),
    (make_row("aten.mm", ["float16"] * 2, [(0, 5), (5, 6)]), "empty product"),
    (make_row("aten.mm", ["float16"] * 2, [(70000, 40000), (40000, 8)]), "2^31"),
    (make_row("aten.addmm", ["float16"] * 3, [(6,), (4, 5), (5, 6)], {"beta": "lots"}), "bad alpha/beta"),
])
def test_rows_it_cannot_serve_are_not_servable_with_a_reason(row, reason):
    p = SPEC.problem_from_row(row)
    assert isinstance(p, NotServable) and reason in p.reason


def test_rows_map_to_dims_and_flags():
    p = SPEC.problem_from_row(make_row("aten.addmm", ["bfloat16"] * 3, [(11008,), (512, 4096), (4096, 11008)]))
    assert (p.dims, dict(p.flags), p.dtypes) == ((1, 512, 11008, 4096), {"aligned": "16", "bias": "1"},
                                                 ("bfloat16",))
    p = SPEC.problem_from_row(make_row("aten.addmm", ["float32"] * 3, [(7,), (3, 5), (5, 7)], {"beta": "0"}))
    assert dict(p.flags) == {"aligned": "0", "bias": "0"}  # beta == 0 ignores the input: the no-bias path
    p = SPEC.problem_from_row(make_row("aten.baddbmm", ["float16"] * 3, [(1, 9), (4, 3, 5), (4, 5, 9)]))
    assert p.dims == (4, 3, 9, 5)


@pytest.mark.parametrize("dt,m,n,k,aligned", [
    ("float16", 512, 11008, 4096, "16"), ("float16", 3, 16, 32, "16"),
    ("bfloat16", 3000, 3000, 3000, "8"),  # rows 6000 bytes apart: 16-byte vectors, hinted
    ("float16", 512, 4104, 4096, "8"), ("float32", 512, 4100, 4096, "4"),
    ("bfloat16", 512, 10753, 4096, "0"), ("float16", 3, 4096, 4095, "0"), ("float32", 512, 4098, 4096, "0"),
])
def test_a_trace_row_is_aligned_as_far_as_n_and_k_allow(dt, m, n, k, aligned):
    # M never enters a contiguous operand's strides: an odd token count stays aligned.
    p = SPEC.problem_from_row(make_row("aten.mm", [dt] * 2, [(m, k), (k, n)]))
    assert dict(p.flags)["aligned"] == aligned


def test_a_launch_takes_its_alignment_from_the_real_strides(tmp_path, monkeypatch):
    from nbx_tune.kernels.runtime import certified

    monkeypatch.setenv("NBX_TUNE_DB", f"sqlite:///{tmp_path / 'none.db'}")  # no certificates: every seat misses
    certified.reload()
    wide = torch.randn(32, 50)
    mm(torch.randn(5, 32), wide[:, :16])  # N=16 but b's row stride is 50
    mm(torch.randn(5, 32), torch.randn(32, 16))  # the same dims, contiguous
    mm(torch.randn(5, 32), torch.randn(32, 52)[:, :16])  # a row stride of 52: a multiple of 4
    misses = sorted(certified.launch_stats()["misses"])
    assert [label.split("|")[2] for label in misses] == ["aligned=0,bias=0", "aligned=16,bias=0",
                                                          "aligned=4,bias=0"]
    certified.reload()


def test_only_operands_whose_rows_are_not_16_byte_aligned_are_staged():
    from nbx_tune.kernels.matmul import rows_aligned, stage_operands

    a, b = torch.randn(37, 24), torch.randn(24, 45)  # fp32: 4-element vectors; K = 24 fits them
    a2, b2 = stage_operands(a, b, 4)
    assert a2 is a and b2.shape == (24, 48) and b2.is_contiguous()
    assert torch.equal(b2[:, :45], b) and not b2[:, 45:].any()
    a, b = torch.randn(40, 37).t(), torch.randn(40, 48)  # a column-major, b fine
    a2, b2 = stage_operands(a, b, 4)
    assert b2 is b and a2.is_contiguous() and torch.equal(a2, a)
    a2, b2 = stage_operands(*[torch.randn(3, 37, 40), torch.randn(3, 40, 48)], 4)
    assert rows_aligned(a2.shape, a2.stride(), 4) and rows_aligned(b2.shape, b2.stride(), 4)


def test_a_k_off_the_vector_pads_both_operands_with_zeros():
    from nbx_tune.kernels.matmul import stage_operands

    g = torch.Generator().manual_seed(5)
    a = torch.randn(3, 23, 37, generator=g).transpose(1, 2)  # (3, 37, 23), K = 23 strided
    b = torch.randn(3, 23, 45, generator=g)
    a2, b2 = stage_operands(a, b, 4)
    assert a2.shape == (3, 37, 32) and b2.shape == (3, 32, 48)
    assert a2.is_contiguous() and b2.is_contiguous()
    assert torch.equal(a2[..., :23], a) and torch.equal(b2[:, :23, :45], b)
    assert not a2[..., 23:].any() and not b2[:, 23:].any() and not b2[:, :, 45:].any()
    # Through the kernel: a bias of c's shape, c only N = 45 wide (the store masks at N, not
    # at b2's 48), and a padded column of b2 that would leak into c if it were not zero.
    c = torch.full((3, 37, 45), float("nan"))
    x = torch.randn(3, 37, 45, generator=g)
    launch_matmul(a, b, c, x, 2.0, 0.5, SPEC.configs()[1])
    ref = oracle.baddbmm(x.double().numpy(), a.double().numpy(), b.double().numpy(), 2.0, 0.5)
    assert np.abs(c.double().numpy() - ref).max() / np.abs(ref).max() < 1e-5


@pytest.mark.parametrize("dt", ["float16", "float32"])
@pytest.mark.parametrize("m,n,k", [(37, 40, 24), (19, 44, 36), (33, 41, 24), (21, 24, 20)])
def test_hinted_and_partly_staged_launches_match_the_oracle(dt, m, n, k):
    # Shapes below 16-alignment: rows 8 (fp16) or 4 (fp32) elements apart take the ALIGN
    # hints; N = 41 stages b alone and stores unhinted; K = 20 in fp16 pads both.
    from nbx_tune.kernels.matmul import alignment, vector_elems

    tdt = TORCH_DTYPES[dt]
    g = torch.Generator().manual_seed(m * n + k)
    a, b = (torch.rand(s, generator=g) * 2 - 1 for s in ((2, m, k), (2, k, n)))
    a, b = a.to(tdt), b.to(tdt)
    level = alignment(a.stride(), b.stride(), n, k, vector_elems(tdt))
    assert level < 16
    c = torch.full((2, m, n), float("nan"), dtype=tdt)
    launch_matmul(a, b, c, None, 1.0, 0.0, SPEC.configs()[1])
    ref = oracle.bmm(a.double().numpy(), b.double().numpy())
    assert np.abs(c.double().numpy() - ref).max() / np.abs(ref).max() < (2e-2 if dt == "float16" else 1e-5)


def test_shared_memory_estimate_and_the_hopper_prune():
    hopper = get_profile("hopper")
    p16 = SPEC.problem_from_row(make_row("aten.mm", ["float16"] * 2, [(4096, 4096), (4096, 4096)]))
    p32 = SPEC.problem_from_row(make_row("aten.mm", ["float32"] * 2, [(4096, 4096), (4096, 4096)]))
    deepest = [c for c in CONFIGS if c.kwargs["num_stages"] == 5 and c["BLOCK_N"] == 256][0]
    assert SPEC.smem_bytes(deepest, p16) == 5 * (128 + 256) * 64 * 2
    assert SPEC.static_refusal(hopper, deepest, p16)[0] == "smem_over_budget"
    assert SPEC.static_refusal(hopper, CONFIGS[0], p16) is None
    refused32 = sum(SPEC.static_refusal(hopper, c, p32) is not None for c in CONFIGS)
    refused16 = sum(SPEC.static_refusal(hopper, c, p16) is not None for c in CONFIGS)
    assert refused32 > refused16 >= 1  # fp32 tiles are twice the bytes
    assert len(CONFIGS) >= 36


def test_source_hash_is_the_same_with_and_without_the_interpreter():
    code = "from nbx_tune.kernels.matmul import SPEC; print(SPEC.source_hash)"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == SPEC.source_hash


def test_stages_over_the_profile_maximum_are_refused_unlaunched():
    turing = get_profile("turing")  # max_num_stages 2
    p = SPEC.problem_from_row(make_row("aten.mm", ["float16"] * 2, [(64, 64), (64, 64)]))
    three = next(c for c in CONFIGS if c.num_stages == 3)
    assert SPEC.static_refusal(turing, three, p) == (
        "stages_over_max", "num_stages 3 > pipelining.max_num_stages 2")


@pytest.mark.parametrize("dt", ["float16", "float32"])
@pytest.mark.parametrize("m,n,k", [(37, 45, 29), (21, 20, 40), (19, 70, 24)])
def test_tiles_with_a_second_accumulator_match_the_oracle(dt, m, n, k):
    # A tile BLOCK_N + EXTRA_N = 32 wide: N = 45 leaves the second tile column's extra
    # block wholly past the edge, N = 20 cuts the first one's, N = 70 (a multiple of 2 but
    # not of 8 or 16) spans three; a batch of 2 and a bias of c's shape through both blocks.
    from nbx_tune.kernels.spec import Config

    wide = Config.make(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, EXTRA_N=16, num_warps=1, num_stages=1)
    tdt = TORCH_DTYPES[dt]
    g = torch.Generator().manual_seed(m * n + k)
    a, b, x = (torch.rand(s, generator=g) * 2 - 1 for s in ((2, m, k), (2, k, n), (2, m, n)))
    a, b, x = a.to(tdt), b.to(tdt), x.to(tdt)
    c = torch.full((2, m, n), float("nan"), dtype=tdt)
    _, grid, _ = launch_matmul(a, b, c, x, 1.5, -0.5, wide)
    assert grid == (-(-m // 16) * -(-n // 32), 2)
    ref = oracle.baddbmm(x.double().numpy(), a.double().numpy(), b.double().numpy(), 1.5, -0.5)
    assert np.abs(c.double().numpy() - ref).max() / np.abs(ref).max() < (2e-3 if dt == "float16" else 1e-5)


def test_the_shared_memory_estimate_counts_the_extra_columns():
    p16 = SPEC.problem_from_row(make_row("aten.mm", ["float16"] * 2, [(3072, 3072), (3072, 3072)]))
    wide = [c for c in CONFIGS if "EXTRA_N" in c.kwargs]
    assert wide, "the config space has tiles with a second accumulator"
    for c in wide:
        width = c["BLOCK_M"] + c["BLOCK_N"] + c["EXTRA_N"]
        assert SPEC.smem_bytes(c, p16) == c.num_stages * width * c["BLOCK_K"] * 2


def _tma(extra_n=0):
    from nbx_tune.kernels.spec import Config

    extra = {"EXTRA_N": extra_n} if extra_n else {}
    return Config.make(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, **extra, TMA=1, num_warps=1, num_stages=1)


@pytest.mark.parametrize("dt", ["float16", "float32"])
@pytest.mark.parametrize("batch,m,n,k", [(1, 37, 45, 29), (1, 40, 48, 32), (3, 19, 70, 24), (2, 21, 20, 40)])
@pytest.mark.parametrize("extra_n", [0, 16])
def test_tma_tiles_match_the_oracle(dt, batch, m, n, k, extra_n):
    # Loads through TMA descriptors: boxes past M, N and K read zeros (no wrap, no mask).
    # K = 29 and N = 45 or 70 in fp16 leave rows off 16-byte boundaries, which TMA cannot
    # read: those operands are copied into aligned rows; 40x48x32 is read in place. A batch
    # of 1 takes 2-D descriptors, more take 3-D ones; a bias of c's shape through both blocks.
    cfg, tdt = _tma(extra_n), TORCH_DTYPES[dt]
    g = torch.Generator().manual_seed(batch * m * n + k)
    a, b, x = (torch.rand(s, generator=g) * 2 - 1 for s in ((batch, m, k), (batch, k, n), (batch, m, n)))
    a, b, x = a.to(tdt), b.to(tdt), x.to(tdt)
    c = torch.full((batch, m, n), float("nan"), dtype=tdt)
    _, grid, args = launch_matmul(a, b, c, x, 1.5, -0.5, cfg)
    assert grid == (-(-m // 16) * -(-n // (16 + extra_n)), batch)
    descs, tma = args[4:7], args[-1]
    assert tma == (3 if batch > 1 else 2)
    assert [d is None for d in descs] == [False, False, not extra_n]
    in_place = (k * a.element_size()) % 16 == 0 and (n * b.element_size()) % 16 == 0
    assert (args[0] is a and args[1] is b) == in_place
    ref = oracle.baddbmm(x.double().numpy(), a.double().numpy(), b.double().numpy(), 1.5, -0.5)
    assert np.abs(c.double().numpy() - ref).max() / np.abs(ref).max() < (2e-3 if dt == "float16" else 1e-5)


def test_tma_reads_a_broadcast_or_misaligned_operand_from_an_aligned_copy():
    # A batch stride of 0 (an expanded operand) and a base 2 bytes off a 16-byte boundary
    # are what a descriptor cannot take: both operands are copied, and the product is right.
    from nbx_tune.kernels.matmul import tma_ready

    g = torch.Generator().manual_seed(5)
    a = (torch.rand(1, 19, 32, generator=g) * 2 - 1).half().expand(3, 19, 32)
    raw = (torch.rand(3 * 32 * 48 + 1, generator=g) * 2 - 1).half()
    b = raw[1:].view(3, 32, 48)
    assert not tma_ready(a, batched=True) and not tma_ready(b, batched=True)
    c = torch.empty(3, 19, 48, dtype=torch.float16)
    _, _, args = launch_matmul(a, b, c, None, 1.0, 0.0, _tma())
    assert args[0] is not a and args[1] is not b
    assert tma_ready(args[0], batched=True) and tma_ready(args[1], batched=True)
    ref = oracle.bmm(a.double().numpy(), b.double().numpy())
    assert np.abs(c.double().numpy() - ref).max() / np.abs(ref).max() < 2e-3


def test_the_config_space_has_tma_tiles_and_their_estimate_matches_pointer_tiles():
    p16 = SPEC.problem_from_row(make_row("aten.mm", ["float16"] * 2, [(4096, 4096), (4096, 4096)]))
    tma = [c for c in CONFIGS if c.kwargs.get("TMA")]
    assert tma, "the config space has TMA tiles"
    for c in tma:
        width = c["BLOCK_M"] + c["BLOCK_N"] + c.kwargs.get("EXTRA_N", 0)
        assert SPEC.smem_bytes(c, p16) == c.num_stages * width * c["BLOCK_K"] * 2


@pytest.mark.parametrize("profile,refused", [("hopper", False), ("blackwell", False), ("interpreter", False),
                                             ("ampere", True), ("ada", True), ("cdna3", True), ("apple_m", True)])
def test_tma_tiles_are_refused_unlaunched_where_there_is_no_tma_unit(profile, refused):
    p = SPEC.problem_from_row(make_row("aten.mm", ["float16"] * 2, [(512, 512), (512, 512)]))
    tma = next(c for c in CONFIGS if c.kwargs.get("TMA") and c.num_stages <= 3)
    got = SPEC.static_refusal(get_profile(profile), tma, p)
    assert (got is not None and got[0] == "no_tma") == refused, got


def test_tma_tiles_are_refused_unlaunched_on_a_triton_without_tensor_descriptors(monkeypatch):
    # pyproject allows Triton 3.1, which has no triton.tools.tensor_descriptor: the module
    # still imports, and its TMA tiles are refused before any launch, on Hopper too.
    from nbx_tune.kernels.matmul import kernel, spec

    for where in (kernel, spec):  # the launcher's descriptors, the spec's refusal
        monkeypatch.setattr(where, "TensorDescriptor", None)
    p = SPEC.problem_from_row(make_row("aten.mm", ["float16"] * 2, [(512, 512), (512, 512)]))
    tma = next(c for c in CONFIGS if c.kwargs.get("TMA") and c.num_stages <= 3)
    reason, detail = SPEC.static_refusal(get_profile("hopper"), tma, p)
    assert reason == "no_tma" and "tensor descriptors" in detail
    plain = next(c for c in CONFIGS if not c.kwargs.get("TMA") and c.num_stages <= 3)
    assert SPEC.static_refusal(get_profile("hopper"), plain, p) is None


def _split(split, bm=16, bn=16, bk=16, tma=0, last=0):
    from nbx_tune.kernels.spec import Config

    return Config.make(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2, SPLIT_K=split, **({"TMA": 1} if tma else {}),
                       **({"SUM_LAST": 1} if last else {}), num_warps=1, num_stages=1)


@pytest.mark.parametrize("dt", ["float16", "float32"])
@pytest.mark.parametrize("batch,m,n,k,split", [(1, 1, 45, 200, 4), (1, 7, 33, 97, 3), (2, 19, 40, 130, 5),
                                               (1, 37, 24, 40, 4)])
@pytest.mark.parametrize("tma", [0, 1])
@pytest.mark.slow
def test_split_k_matches_the_oracle_and_repeats_bit_for_bit(dt, batch, m, n, k, split, tma):
    # K = 97 over 3 splits of 16-blocks leaves a ragged last block; K = 40 over 4 splits
    # leaves the fourth split empty (it must write zeros, not leave its partial unwritten);
    # M = 1 and 7 are decode rows, N = 45 and 33 cut the last tile; with a bias and alpha.
    # TMA: the same through descriptors (boxes past K read zeros; unaligned rows copied).
    tdt = TORCH_DTYPES[dt]
    g = torch.Generator().manual_seed(m * n + k)
    a, b, x = (torch.rand(s, generator=g) * 2 - 1 for s in ((batch, m, k), (batch, k, n), (batch, 1, n)))
    a, b, x = a.to(tdt), b.to(tdt), x.to(tdt)
    cfg = _split(split, tma=tma)
    outs = []
    for _ in range(2):
        c = torch.full((batch, m, n), float("nan"), dtype=tdt)
        _, grid, _ = launch_matmul(a, b, c, x.expand(batch, m, n), -1.5, 0.5, cfg)
        outs.append(c)
    assert grid == (-(-m // 16) * -(-n // 16), batch, split)
    ref = oracle.baddbmm(x.double().numpy(), a.double().numpy(), b.double().numpy(), -1.5, 0.5)
    assert np.abs(outs[0].double().numpy() - ref).max() / np.abs(ref).max() < (2e-3 if dt == "float16" else 1e-5)
    assert torch.equal(outs[0].view(torch.int16 if dt == "float16" else torch.int32),
                       outs[1].view(torch.int16 if dt == "float16" else torch.int32))


@pytest.mark.parametrize("dt", ["float16", "float32"])
@pytest.mark.parametrize("batch,m,n,k,split,tma", [(1, 7, 33, 97, 3, 0), (2, 19, 40, 130, 2, 1), (1, 37, 24, 40, 4, 0)])
def test_split_k_summed_by_the_last_split_matches_the_oracle_bit_for_bit(dt, batch, m, n, k, split, tma):
    # SUM_LAST: no reduce launch; the last split of each tile adds the partials in split
    # order, so the result is the two-launch one bit for bit, and every count is back at zero.
    from nbx_tune.kernels.runtime import launch

    tdt = TORCH_DTYPES[dt]
    g = torch.Generator().manual_seed(m + n * k)
    a, b, x = (torch.rand(s, generator=g) * 2 - 1 for s in ((batch, m, k), (batch, k, n), (batch, 1, n)))
    a, b, x = a.to(tdt), b.to(tdt), x.to(tdt)
    outs = []
    for last in (1, 1, 0):
        c = torch.full((batch, m, n), float("nan"), dtype=tdt)
        _, grid, _ = launch_matmul(a, b, c, x.expand(batch, m, n), -1.5, 0.5, _split(split, tma=tma, last=last))
        outs.append(c.view(torch.int16 if dt == "float16" else torch.int32))
    assert grid == (-(-m // 16) * -(-n // 16), batch, split)
    ref = oracle.baddbmm(x.double().numpy(), a.double().numpy(), b.double().numpy(), -1.5, 0.5)
    got = outs[0].view(tdt).double().numpy()
    assert np.abs(got - ref).max() / np.abs(ref).max() < (2e-3 if dt == "float16" else 1e-5)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert not launch.counters(grid[0] * batch, a.device).any()


def test_split_k_serves_the_public_op_with_unaligned_and_transposed_operands(monkeypatch):
    # The public op takes a certified split-K config like any other: here forced as the
    # default. K = 75 in fp16 is staged (padded), b.t() is column-major.
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.kernels.matmul import kernel

    # the spec's defaults, as read at launch (the module's DEFAULTS only seeds them)
    monkeypatch.setattr(SPEC, "default_configs", (_split(3),))
    splits = []
    real = kernel.launch_splitk
    monkeypatch.setattr(kernel, "launch_splitk", lambda *args, **kw: splits.append(1) or real(*args, **kw))
    certified.reload()
    g = torch.Generator().manual_seed(5)
    a = (torch.rand(5, 75, generator=g) * 2 - 1).half()
    w = (torch.rand(29, 75, generator=g) * 2 - 1).half()
    got = mm(a, w.t())
    ref = oracle.mm(a.double().numpy(), w.double().numpy().T)
    assert splits == [1]  # served by the split-K kernel
    assert np.abs(got.double().numpy() - ref).max() / np.abs(ref).max() < 2e-3
    certified.reload()


def test_split_k_configs_are_refused_unlaunched_where_they_cannot_help():
    hopper = get_profile("hopper")
    splits = [c for c in CONFIGS if c.kwargs.get("SPLIT_K", 1) > 1]
    assert splits and all("EXTRA_N" not in c.kwargs for c in splits)  # the split kernel has one accumulator
    tma_split = next(c for c in splits if c.kwargs.get("TMA"))
    assert SPEC.static_refusal(get_profile("ampere"), tma_split, SPEC.problem_from_row(
        make_row("aten.mm", ["bfloat16"] * 2, [(8, 4096), (4096, 4096)])))[0] == "no_tma"

    def prob(m, n, k):
        return SPEC.problem_from_row(make_row("aten.mm", ["bfloat16"] * 2, [(m, k), (k, n)]))

    decode = prob(8, 4096, 4096)
    assert all(SPEC.static_refusal(hopper, c, decode) is None for c in splits)  # all fit and apply
    short_k = prob(8, 4096, 128)
    assert all(SPEC.static_refusal(hopper, c, short_k)[0] == "not_applicable" for c in splits)
    big = prob(4096, 4096, 4096)  # 1024 tiles even at 128 x 128: the machine is full
    why = [SPEC.static_refusal(hopper, c, big) for c in splits]
    assert all(w is not None and w[0] == "not_applicable" and "tiles" in w[1] for w in why)
    # Split-K configs cost no compile where refused: every refusal names its reason.
    from nbx_tune.tuner.store.models import REFUSAL_REASONS

    assert "not_applicable" in REFUSAL_REASONS


@pytest.mark.parametrize("dt", ["float16", "float32"])
@pytest.mark.parametrize("batch,m,n,k", [(1, 37, 48, 32), (3, 19, 80, 16), (1, 5, 48, 48)])
@pytest.mark.parametrize("extra_n", [0, 16])
def test_tma_tiles_read_a_column_major_b_in_place(dt, batch, m, n, k, extra_n):
    # An nn.Linear weight W (N, K) passed as W.t(): B's last stride is K, not 1 (the seat is
    # aligned 16: no staging). TMA reads W's rows in N x K boxes and the kernel transposes
    # them (B_KMAJOR), so nothing is copied; with EXTRA_N a box lies past N (zeros).
    cfg, tdt = _tma(extra_n), TORCH_DTYPES[dt]
    g = torch.Generator().manual_seed(batch * m * n + k + 1)
    a, w, x = (torch.rand(s, generator=g) * 2 - 1 for s in ((batch, m, k), (batch, n, k), (batch, m, n)))
    a, w, x = a.to(tdt), w.to(tdt), x.to(tdt)
    b = w.transpose(1, 2)
    c = torch.full((batch, m, n), float("nan"), dtype=tdt)
    _, grid, args = launch_matmul(a, b, c, x, 1.5, -0.5, cfg)
    assert args[1] is b and args[-3] == 1  # B_KMAJOR, no staging copy
    ref = oracle.baddbmm(x.double().numpy(), a.double().numpy(), b.double().numpy(), 1.5, -0.5)
    assert np.abs(c.double().numpy() - ref).max() / np.abs(ref).max() < (2e-3 if dt == "float16" else 1e-5)
    if batch == 1:  # the public op on a 2-D W.t(), through the same path
        got = mm(a[0], w[0].t())
        assert np.abs(got.double().numpy() - oracle.mm(a[0].double().numpy(), w[0].t().double().numpy())).max() \
            / np.abs(ref).max() < (2e-3 if dt == "float16" else 1e-5)


@pytest.mark.parametrize("batch", [1, 2])
def test_split_k_through_tma_reads_a_column_major_b_in_place(batch):
    # W.t() with K = 96 over 3 splits and N = 48: B_KMAJOR descriptors, nothing copied.
    g = torch.Generator().manual_seed(9 + batch)
    a, w = (torch.rand(s, generator=g) * 2 - 1 for s in ((batch, 7, 96), (batch, 48, 96)))
    b = w.transpose(1, 2)
    c = torch.full((batch, 7, 48), float("nan"))
    launch_matmul(a, b, c, None, 1.0, 0.0, _split(3, tma=1))
    ref = oracle.bmm(a.double().numpy(), b.double().numpy())
    assert np.abs(c.double().numpy() - ref).max() / np.abs(ref).max() < 1e-5


# The space's 64-row tiles 192 wide (a second accumulator) and its 32-wide TMA tiles, as
# shipped: full-size tiles over small odd shapes, so every block is cut by M, N or K.
_MID_TILES = [c for c in CONFIGS if c["BLOCK_M"] == 64 and (c.kwargs.get("EXTRA_N") or c["BLOCK_N"] == 32)
              and c.kwargs.get("SPLIT_K", 1) == 1]


@pytest.mark.parametrize("dt", ["float16", "float32"])
@pytest.mark.parametrize("cfg", _MID_TILES, ids=str)
@pytest.mark.parametrize("kmajor", [False, True])
def test_mid_size_tiles_of_the_space_match_the_oracle(dt, cfg, kmajor):
    # M = 70 is two row tiles (the second 6 rows); N = 200 is two 192-wide tiles, the second's
    # extra block wholly past N (or 7 tiles of 32, the last cut); K = 136 ends mid-block.
    # kmajor: an nn.Linear weight as W.t() (read column-major through TMA, copied otherwise).
    assert len(_MID_TILES) >= 4
    m, n, k, tdt = 70, 200, 136, TORCH_DTYPES[dt]
    g = torch.Generator().manual_seed(m + n + k + kmajor)
    a, x = (torch.rand(s, generator=g) * 2 - 1 for s in ((1, m, k), (1, m, n)))
    w = torch.rand((1, n, k) if kmajor else (1, k, n), generator=g) * 2 - 1
    a, x, w = a.to(tdt), x.to(tdt), w.to(tdt)
    b = w.transpose(1, 2) if kmajor else w
    c = torch.full((1, m, n), float("nan"), dtype=tdt)
    _, grid, _ = launch_matmul(a, b, c, x, 1.5, -0.5, cfg)
    assert grid == (2 * -(-n // (cfg["BLOCK_N"] + cfg.kwargs.get("EXTRA_N", 0))), 1)
    ref = oracle.baddbmm(x.double().numpy(), a.double().numpy(), b.double().numpy(), 1.5, -0.5)
    assert np.abs(c.double().numpy() - ref).max() / np.abs(ref).max() < (2e-3 if dt == "float16" else 1e-5)


def _sched(sched, bm=16, bn=16, bk=16, flatten=0, ws=0):
    extra = {**({"FLATTEN": 1} if flatten else {}), **({"WS": 1} if ws else {})}
    return Config.make(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2, TMA=1, SCHEDULE=sched, **extra,
                       num_warps=1, num_stages=1)


@pytest.mark.parametrize("dt", ["float16", "float32"])
@pytest.mark.parametrize("m,n,k", [(37, 45, 200), (5, 70, 33), (64, 16, 96)])
@pytest.mark.parametrize("cfg", [_sched(1), _sched(1, flatten=1, ws=1)], ids=["persistent", "persistent-flat-ws"])
@pytest.mark.parametrize("kmajor", [0, 1])
def test_persistent_matches_the_oracle_and_repeats_bit_for_bit(dt, m, n, k, cfg, kmajor):
    # 4 programs under the interpreter (`sm_count`): 37 x 45 is 9 tiles of 16, so the
    # persistent programs walk several tiles; K = 33 and 200 leave a ragged last block; a
    # column-major B is read in place; with a bias, alpha and beta.
    tdt = TORCH_DTYPES[dt]
    g = torch.Generator().manual_seed(m * n + k)
    a, x = (torch.rand(s, generator=g) * 2 - 1 for s in ((m, k), (1, n)))
    b = torch.rand((n, k) if kmajor else (k, n), generator=g) * 2 - 1
    a, b, x = a.to(tdt), (b.t() if kmajor else b).to(tdt), x.to(tdt)
    outs = []
    for _ in range(2):
        c = torch.full((m, n), float("nan"), dtype=tdt)
        launch_matmul(a, b, c, x.expand(m, n), -1.5, 0.5, cfg)
        outs.append(c)
    ref = oracle.baddbmm(x.double().numpy()[None], a.double().numpy()[None], b.double().numpy()[None], -1.5, 0.5)[0]
    assert np.abs(outs[0].double().numpy() - ref).max() / np.abs(ref).max() < (2e-3 if dt == "float16" else 1e-5)
    assert torch.equal(outs[0].view(torch.int16 if dt == "float16" else torch.int32),
                       outs[1].view(torch.int16 if dt == "float16" else torch.int32))


def test_persistent_configs_are_refused_where_they_do_not_serve():
    hopper = get_profile("hopper")
    scheds = [c for c in CONFIGS if c.kwargs.get("SCHEDULE")]
    assert {c["SCHEDULE"] for c in scheds} == {1} and all(c.kwargs.get("TMA") for c in scheds)

    def problem(b, m, n, k):
        return SPEC.problem_from_row(make_row("aten.bmm" if b > 1 else "aten.mm", ["bfloat16"] * 2,
                                              [(b, m, k), (b, k, n)] if b > 1 else [(m, k), (k, n)]))
    for c in scheds:
        assert SPEC.static_refusal(hopper, c, problem(3, 512, 512, 512))[0] == "not_applicable"
        assert SPEC.static_refusal(hopper, c, problem(1, 800, 1536, 8960)) is None
    assert all(SPEC.static_refusal(get_profile("ampere"), c, problem(1, 800, 1536, 8960))[0] == "no_tma"
               for c in scheds)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_a_rows_layout_gives_the_seat_its_launch_reads(layout, monkeypatch):
    """A linear layer multiplies by W.t(): its seat is not a row-major operand's (the layout
    is a flag, and at an N off 16 so is the alignment). The row's `layout` gives the planner
    the launch's strides and seat, and the screen's inputs are stored so."""
    from nbx_tune.kernels import matmul
    from nbx_tune.kernels.matmul import alignment, vector_elems

    M, K, N = 24, 64, 172
    a = torch.randn(K, M).t() if layout[0] == "t" else torch.randn(M, K)
    b = torch.randn(N, K).t() if layout[1] == "t" else torch.randn(K, N)
    params = {} if layout == "nn" else {"layout": layout}
    p = SPEC.problem_from_row(make_row("aten.mm", ["float32"] * 2, [(M, K), (K, N)], params))
    at_launch = alignment(a.stride(), b.stride(), N, K, vector_elems(torch.float32))
    assert dict(p.flags)["aligned"] == str(at_launch)
    assert dict(p.flags).get("layout", "nn") == layout  # row-major seats keep their old flags

    class Looked(Exception):
        pass

    def looked_up(spec, dtypes, flags, dims):
        raise Looked(flags)
    monkeypatch.setattr(matmul.ops, "config_for", looked_up)
    with pytest.raises(Looked) as seen:
        matmul._matmul(a, b, None, 1.0, 0.0, 2)
    assert seen.value.args[0] == p.flags  # the launch reads the row's seat
    stored = {name: shape for name, (shape, _) in SPEC.input_shapes(p).items()}
    assert stored == {"a": (1, *a.t().shape) if layout[0] == "t" else (1, M, K),
                      "b": (1, *b.t().shape) if layout[1] == "t" else (1, K, N)}
    rng = np.random.default_rng(0)
    inputs = {k: v for k, (v, _) in SPEC.make_inputs(p, rng).items()}
    ref = SPEC.oracle(p, inputs)["c"]
    from nbx_tune.kernels.matmul import _operands

    la, lb = _operands(p, inputs, lambda x: x.transpose(0, 2, 1))
    np.testing.assert_allclose(ref, la.astype(np.float64) @ lb.astype(np.float64))
    assert (la.shape, lb.shape) == ((1, M, K), (1, K, N))


def test_an_unknown_layout_is_not_served():
    row = make_row("aten.mm", ["float32"] * 2, [(4, 5), (5, 6)], {"layout": "tx"})
    assert isinstance(SPEC.problem_from_row(row), NotServable)

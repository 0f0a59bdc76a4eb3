"""Attention forward on the interpreter: every example row against the fp64 oracle under
several configs, the public op against torch and the oracle, trace rows -> problems, and a
planted fault the screen must catch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nbx_tune.errors import KernelError
from nbx_tune.kernels import attention as A
from nbx_tune.kernels.attention import EFFICIENT, FLASH, FLASH_CPU, SDPA, SPEC
from nbx_tune.kernels.runtime.registry import register, spec_for_op
from nbx_tune.kernels.spec import Config, NotServable, Problem
from nbx_tune.oracles import attention as oracle
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify import screen as screening
from nbx_tune.tuner.certify.selfcheck import check_kernel
from nbx_tune.kernels.trace import make_row

PROFILE = get_profile("interpreter")
HOPPER = get_profile("hopper")
F3 = ["float16"] * 3


def test_example_rows_pass_the_screen():
    checks = check_kernel(SPEC, PROFILE, "cpu", "small", configs_per_row=3)
    bad = [c for c in checks if not c.ok]
    assert not bad, "\n".join(f"{c.op} {c.shapes} {c.dtype} {c.config}: {c.reason} {c.detail}" for c in bad)
    assert all(c.err is not None and c.err <= c.rtol for c in checks)
    # Every op, both dtypes the interpreter can check, and more than one config per row.
    assert {c.op for c in checks} == set(SPEC.ops)
    assert {c.dtype for c in checks} == {"float16", "float32"}
    assert len({str(c.config) for c in checks}) >= 4
    # fp32 multiplies in IEEE fp32: far inside its 1e-4.
    assert max(c.err for c in checks if c.dtype == "float32") < 1e-5


def test_gpu_rows_are_servable_in_every_dtype():
    rows = SPEC.example_rows("gpu")
    assert {r.dtypes[0] for r in rows} == set(SPEC.dtypes)
    for r in rows:
        p = SPEC.problem_from_row(r)
        assert isinstance(p, Problem), (r, p)
        keep = [c for c in SPEC.configs() if not SPEC.static_refusal(HOPPER, c, p)]
        assert len(keep) >= 3, (r.shapes, r.dtypes)


# ----------------------------------------------------------------------------- the oracle

def _torch_ref(q, k, v, causal, scale):
    t = [torch.from_numpy(x) for x in (q, k, v)]
    return F.scaled_dot_product_attention(*t, is_causal=causal, scale=scale,
                                          enable_gqa=t[1].shape[1] != t[0].shape[1]).numpy()


@pytest.mark.parametrize("Lq,Lk", [(7, 11), (11, 7), (1, 9), (9, 9)])
def test_oracle_matches_torch_top_left_causal(Lq, Lk):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, Lq, 8))
    k = rng.standard_normal((2, 2, Lk, 8))
    v = rng.standard_normal((2, 2, Lk, 5))
    for causal in (False, True):
        for scale in (None, 0.7):
            out, lse = oracle.flash_attention(q, k, v, causal, scale)
            np.testing.assert_allclose(out, _torch_ref(q, k, v, causal, scale), rtol=1e-10, atol=1e-12)
            assert np.all(np.isfinite(lse))  # top-left: every row sees key 0
    # torch's own CPU kernel gives the same logsumexp, (B, H, Lq) in natural log.
    qt, kt, vt = (torch.from_numpy(x) for x in (q, k, k))
    _, lse_t = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qt, kt, kt, is_causal=True)
    _, lse = oracle.flash_attention(q, k, k, True)
    np.testing.assert_allclose(lse, lse_t.numpy(), rtol=1e-10)


def test_oracle_efficient_pads_logsumexp_with_inf():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((1, 2, 33, 16)), rng.standard_normal((1, 2, 5, 16))
    _, lse = oracle.efficient_attention(q, k, k, False, None, compute_log_sumexp=True)
    assert lse.shape == (1, 2, 64)
    assert np.all(np.isfinite(lse[..., :33])) and np.all(lse[..., 33:] == np.inf)
    _, none = oracle.efficient_attention(q, k, k, False, None, compute_log_sumexp=False)
    assert none.shape == (1, 2, 0)


# ----------------------------------------------------------------------------- public op

@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-2)])
@pytest.mark.parametrize("shape,kv,dv,causal,scale", [
    ((1, 4, 21, 24), (2, 35), 24, True, None),   # GQA, Lq < Lk, causal
    ((2, 2, 39, 80), (2, 17), 80, True, 0.2),    # Lq > Lk causal, custom scale
    ((1, 2, 1, 16), (2, 45), 40, False, None),   # decode, Dv != D
])
def test_public_op_matches_torch(dtype, tol, shape, kv, dv, causal, scale):
    g = torch.Generator().manual_seed(3)
    B, Hq, Lq, D = shape
    Hkv, Lk = kv
    q = torch.randn(shape, generator=g).to(dtype)
    k = torch.randn((B, Hkv, Lk, D), generator=g).to(dtype)
    v = torch.randn((B, Hkv, Lk, dv), generator=g).to(dtype)
    out = A.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    assert out.shape == (B, Hq, Lq, dv) and out.dtype == dtype
    ref = oracle.scaled_dot_product_attention(q.double().numpy(), k.double().numpy(),
                                              v.double().numpy(), causal, scale)
    err = np.abs(out.double().numpy() - ref).max() / np.abs(ref).max()
    assert err <= tol
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                          scale=scale, enable_gqa=Hkv != Hq)
    assert (out.float() - want).abs().max() <= tol * want.abs().max()


def test_public_op_strided_inputs_and_edges():
    g = torch.Generator().manual_seed(4)
    # (B, L, H, D) memory viewed as (B, H, L, D), as models lay out q/k/v.
    q = torch.randn(1, 19, 2, 16, generator=g).transpose(1, 2)
    k = torch.randn(1, 23, 2, 16, generator=g).transpose(1, 2)
    v = torch.randn(1, 23, 2, 16, generator=g).transpose(1, 2)
    out = A.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (out - want).abs().max() < 1e-5
    # No keys: torch returns zeros.
    empty = A.scaled_dot_product_attention(q, k[:, :, :0], v[:, :, :0])
    assert empty.shape == (1, 2, 19, 16) and not empty.any()
    with pytest.raises(KernelError):
        A.scaled_dot_product_attention(q, k[:, :1].expand(1, 3, 23, 16), v[:, :1].expand(1, 3, 23, 16))
    with pytest.raises(KernelError):
        A.scaled_dot_product_attention(q, k.half(), v)
    with pytest.raises(KernelError):
        A.scaled_dot_product_attention(q[0], k[0], v[0])


def test_public_op_uses_config_for(monkeypatch):
    seen = []
    real = A.ops.config_for

    def spy(spec, dtypes, flags, dims):
        seen.append((spec.name, dtypes, flags, dims))
        return real(spec, dtypes, flags, dims)

    monkeypatch.setattr(A.ops, "config_for", spy)
    q = torch.randn(2, 4, 17, 24)
    kv = torch.randn(2, 2, 29, 24)
    A.scaled_dot_product_attention(q, kv, kv, is_causal=True)
    assert seen == [("attention", ("float32",), (("causal", "1"),), (8, 17, 29, 24, 24))]


# ----------------------------------------------------------------------------- trace rows

def test_registry_serves_every_op():
    register(SPEC)
    for op in SPEC.ops:
        assert spec_for_op(op) is SPEC
        assert spec_for_op(op + ".default") is SPEC


def test_problem_from_real_rows():
    # As the recorder writes F.scaled_dot_product_attention (test_recorder's decoder layer).
    p = SPEC.problem_from_row(make_row(SDPA, ["float32"] * 3, [(2, 4, 10, 8)] * 3,
                                       {"attn_mask": "None", "is_causal": "True"}))
    assert p.dims == (8, 10, 10, 8, 8) and p.dtypes == ("float32",)
    assert dict(p.flags) == {"causal": "1"}
    assert p.get("scale") == pytest.approx(1 / math.sqrt(8)) and p.get("lse") == "none"
    assert set(SPEC.output_specs(p)) == {"out"}

    p = SPEC.problem_from_row(make_row(FLASH, ["bfloat16"] * 3, [(1, 32, 512, 128)] * 3,
                                       {"is_causal": "True", "scale": "0.05"}))
    assert p.dims == (32, 512, 512, 128, 128) and p.get("scale") == 0.05
    assert SPEC.output_specs(p) == {"out": ((1, 32, 512, 128), "bfloat16"),
                                    "lse": ((1, 32, 512), "float32")}

    p = SPEC.problem_from_row(make_row(EFFICIENT, F3, [(2, 8, 33, 64), (2, 2, 70, 64), (2, 2, 70, 96)],
                                       {"attn_bias": "None", "compute_log_sumexp": "True"}))
    assert p.dims == (16, 33, 70, 64, 96) and dict(p.flags) == {"causal": "0"}
    assert p.get("Hq") == 8 and p.get("Hkv") == 2 and p.get("B") == 2
    assert SPEC.output_specs(p)["lse"] == ((2, 8, 64), "float32")
    assert SPEC.input_shapes(p)["v"] == ((2, 2, 70, 96), "float16")

    p = SPEC.problem_from_row(make_row(EFFICIENT, F3, [(1, 2, 5, 16)] * 3,
                                       {"attn_bias": "None", "compute_log_sumexp": "False"}))
    assert set(SPEC.output_specs(p)) == {"out"}

    p = SPEC.problem_from_row(make_row(FLASH_CPU, F3, [(1, 4, 7, 16), (1, 1, 9, 16), (1, 1, 9, 16)],
                                       {"is_causal": "True", "attn_mask": "None"}))
    assert p.dims == (4, 7, 9, 16, 16) and SPEC.output_specs(p)["lse"] == ((1, 4, 7), "float32")
    # An explicit dropout_p=0.0 is the default: served.
    p = SPEC.problem_from_row(make_row(SDPA, F3, [(1, 2, 5, 16)] * 3, {"dropout_p": "0.0"}))
    assert isinstance(p, Problem)


@pytest.mark.parametrize("op,shapes,params,why", [
    (SDPA, [(1, 2, 5, 16)] * 3, {"dropout_p": "0.1"}, "dropout"),
    (SDPA, [(1, 2, 5, 16)] * 3, {"attn_mask": "Tensor"}, "attn_mask"),
    (EFFICIENT, [(1, 2, 5, 16)] * 3 + [(1, 2, 5, 5)], {"compute_log_sumexp": "True"}, "attn_bias"),
    (FLASH_CPU, [(1, 2, 5, 16)] * 3 + [(5, 5)], {}, "attn_mask"),
    (EFFICIENT, [(1, 2, 5, 16)] * 3, {"attn_bias": "None"}, "compute_log_sumexp"),
    (FLASH, [(1, 2, 5, 16)] * 3, {"return_debug_mask": "True"}, "debug"),
    (FLASH, [(1, 2, 5, 16)] * 3, {"is_causal": "maybe"}, "bad param"),
    (FLASH, [(1, 2, 5, 16)] * 3, {"window": "3"}, "unknown param"),
    (FLASH, [(2, 5, 16)] * 3, {}, "4-D"),
    (FLASH, [(1, 2, 5, 16)] * 2, {}, "tensors"),
    (FLASH, [(1, 2, 5, 16), (1, 2, 5, 32), (1, 2, 5, 32)], {}, "head dim"),
    (FLASH, [(1, 2, 5, 16), (2, 2, 5, 16), (2, 2, 5, 16)], {}, "batch"),
    (FLASH, [(1, 2, 5, 16), (1, 2, 5, 16), (1, 2, 6, 16)], {}, "differ"),
    (FLASH, [(1, 4, 5, 16), (1, 3, 5, 16), (1, 3, 5, 16)], {}, "divide"),
    (FLASH, [(1, 2, 5, 16), (1, 4, 5, 16), (1, 4, 5, 16)], {}, "divide"),
    (SDPA, [(1, 4, 5, 16), (1, 2, 5, 16), (1, 2, 5, 16)], {}, "enable_gqa"),
    (FLASH, [(1, 2, 5, 16), (1, 2, 5, 16), (1, 2, 5, 24)], {}, "one head dim"),
    (FLASH, [(1, 2, 5, 16), (1, 2, 9, 16), (1, 2, 9, 16)], {"is_causal": "True"}, "bottom-right"),
    (FLASH, [(1, 2, 5, 512)] * 3, {}, "head dim 512"),
    (FLASH, [(1, 2, 0, 16)] * 3, {}, "empty"),
    (FLASH, [(70000, 1, 5, 16)] * 3, {}, "grid"),
    (FLASH, [(1, 2, 5, 16)] * 3, {"scale": "inf"}, "finite"),
])
def test_rows_not_servable(op, shapes, params, why):
    dts = ["float16"] * len(shapes)
    p = SPEC.problem_from_row(make_row(op, dts, shapes, params))
    assert isinstance(p, NotServable), p
    assert why in p.reason


def test_sdpa_rows_with_a_mask_are_the_masked_familys():
    p = SPEC.problem_from_row(make_row(SDPA, ["float16"] * 4, [(1, 2, 5, 16)] * 3 + [(5, 5)], {}))
    assert p.kernel == "masked_attention" and dict(p.flags)["mask"] == "add"


def test_dtypes_not_servable():
    for dts in (["float64"] * 3, ["float16", "float16", "float32"], ["int64"] * 3):
        p = SPEC.problem_from_row(make_row(FLASH, dts, [(1, 2, 5, 16)] * 3))
        assert isinstance(p, NotServable)


def test_head_dim_buckets_share_one_block():
    # A seat's problems all load D in one power-of-two block: their shared memory matches.
    ladder = HOPPER.ladder("default")
    for d in range(1, 257):
        lo, hi = ladder.bucket(d)
        assert A._block(lo) == A._block(hi) == A._block(d), d
    c = Config.make(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    p = lambda dt, d: Problem("attention", (dt,), (("causal", "0"),), (32, 512, 512, d, d))
    assert SPEC.smem_bytes(c, p("float16", 128)) == (3 * 64 * 256 + 128 * 128) * 2
    assert SPEC.smem_bytes(c, p("float16", 80)) == SPEC.smem_bytes(c, p("float16", 128))
    assert SPEC.static_refusal(HOPPER, c, p("float16", 256))[0] == "smem_over_budget"
    assert SPEC.static_refusal(HOPPER, c, p("float16", 128)) is None


# ----------------------------------------------------------------------------- planted fault

def test_screen_catches_a_wrong_result(monkeypatch):
    """A launch that drops the causal mask (attends to future keys) must fail the screen, and
    one that skips the last query block must be caught as unwritten."""
    row = make_row(FLASH, ["float32"] * 3, [(1, 2, 37, 16)] * 3, {"is_causal": "True"})
    problem = SPEC.problem_from_row(row)
    case = screening.make_case(SPEC, problem, "cpu", 7, True)
    cfg = Config.make(BLOCK_M=16, BLOCK_N=16, num_warps=2, num_stages=1)
    assert screening.screen(SPEC, cfg, case, 1e-4, "cpu").ok

    real = A.launch_attention
    monkeypatch.setattr(A.spec, "launch_attention",  # the spec's launch: what the screen runs
                        lambda q, k, v, o, lse, scale, causal, config:
                        real(q, k, v, o, lse, scale, False, config))
    r = screening.screen(SPEC, cfg, case, 1e-4, "cpu")
    assert r.reason == "wrong_answer"

    monkeypatch.setattr(A.spec, "launch_attention",
                        lambda q, k, v, o, lse, scale, causal, config:
                        real(q[:, :, :32], k, v, o[:, :, :32], lse[:, :, :32], scale, causal, config))
    r = screening.screen(SPEC, cfg, case, 1e-4, "cpu")
    assert r.reason == "unwritten_output"


# ----------------------------------------------------------------------------- decode (split-KV)

def _decode_cfg(split, bm=16, bn=16):
    return Config.make(BLOCK_M=bm, BLOCK_N=bn, SPLIT_KV=split, num_warps=1, num_stages=1)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 3e-3)])
@pytest.mark.parametrize("B,Hq,Hkv,Lq,Lk,D,Dv,causal,split", [
    (2, 6, 2, 1, 45, 24, 40, False, 3),    # GQA group 3 packed in one tile, a ragged last slice
    (1, 4, 4, 3, 130, 16, 16, False, 4),   # no GQA, three queries, 130 keys in 4 slices
    (1, 8, 2, 5, 37, 32, 24, True, 1),     # causal (top-left): rows see 1..5 keys; 20 rows, 2 tiles
    (1, 2, 1, 2, 70, 24, 24, False, 8),    # more slices than 16-key blocks: empty slices
    (2, 3, 1, 1, 20, 80, 80, False, 1),
])
def test_decode_kernel_matches_the_oracle_and_repeats_bit_for_bit(dtype, tol, B, Hq, Hkv, Lq, Lk, D, Dv,
                                                                  causal, split):
    rng = np.random.default_rng(B * 100 + Lk)
    tdt = getattr(torch, dtype)
    q, k, v = (torch.from_numpy(rng.standard_normal(s)).to(tdt)
               for s in ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv)))
    Q, K, V = (t.double().numpy() for t in (q, k, v))
    scale = 0.3
    ref, ref_lse = oracle.efficient_attention(Q, K, V, causal, scale, compute_log_sumexp=True)
    outs = []
    for _ in range(2):
        o = torch.full((B, Hq, Lq, Dv), float("nan"), dtype=tdt)
        lse = torch.full((B, Hq, 32), float("nan"), dtype=torch.float32)  # padded: rows past Lq get +inf
        A.launch_attention(q, k, v, o, lse, scale, causal, _decode_cfg(split))
        outs.append((o, lse))
    o, lse = outs[0]
    assert np.abs(o.double().numpy() - ref).max() / np.abs(ref).max() < tol
    np.testing.assert_allclose(lse.numpy()[:, :, :Lq], ref_lse[:, :, :Lq], rtol=1e-4, atol=1e-4)
    assert torch.isinf(lse[:, :, Lq:]).all() and (lse[:, :, Lq:] > 0).all()
    assert torch.equal(outs[0][0].view(torch.int16 if dtype == "float16" else torch.int32),
                       outs[1][0].view(torch.int16 if dtype == "float16" else torch.int32))
    assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32))


def test_decode_configs_are_refused_unlaunched_where_they_cannot_apply():
    decode = [c for c in SPEC.configs() if "SPLIT_KV" in c.kwargs]
    assert decode and any(c["SPLIT_KV"] > 1 for c in decode)

    def prob(lq, lk, causal=False):
        params = {"attn_mask": "None", "enable_gqa": "True", **({"is_causal": "True"} if causal else {})}
        return SPEC.problem_from_row(make_row(SDPA, ["bfloat16"] * 3, [(1, 32, lq, 128), (1, 8, lk, 128),
                                                                        (1, 8, lk, 128)], params))

    long_ctx = prob(1, 4096)
    assert all(SPEC.static_refusal(HOPPER, c, long_ctx) is None for c in decode)
    prefill = prob(1000, 1000, causal=True)
    assert all(SPEC.static_refusal(HOPPER, c, prefill)[0] == "not_applicable" for c in decode)
    short = prob(1, 100)
    for c in decode:  # slices of 100 keys refused, whole ones kept
        assert (SPEC.static_refusal(HOPPER, c, short) is not None) == (c["SPLIT_KV"] > 1), c


# ----------------------------------------------------------------------------- grouped-query prefill (PACK)

@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 3e-3)])
@pytest.mark.parametrize("B,Hq,Hkv,Lq,Lk,D,Dv,causal,pack,packed", [
    (1, 8, 2, 37, 37, 32, 32, True, 4, 4),   # group 4 in one program: 4 queries per 16-row tile
    (2, 4, 2, 21, 45, 24, 40, True, 2, 2),   # Lq < Lk causal, D off its block, Dv != D
    (1, 6, 2, 19, 11, 16, 16, True, 2, 1),   # group 3, PACK 2: packs gcd(2, 3) = 1 head
    (1, 12, 2, 9, 30, 16, 24, False, 4, 2),  # group 6, PACK 4: packs 2; not causal
])
def test_packed_prefill_matches_the_oracle_and_repeats_bit_for_bit(dtype, tol, B, Hq, Hkv, Lq, Lk, D, Dv, causal,
                                                                    pack, packed):
    rng = np.random.default_rng(B * 100 + Lq + Lk)
    tdt = getattr(torch, dtype)
    q, k, v = (torch.from_numpy(rng.standard_normal(s)).to(tdt)
               for s in ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv)))
    ref, ref_lse = oracle.efficient_attention(*(t.double().numpy() for t in (q, k, v)), causal, 0.3,
                                              compute_log_sumexp=True)
    cfg = Config.make(BLOCK_M=16, BLOCK_N=16, PACK=pack, num_warps=1, num_stages=1)
    launched = []
    real = A._attn_fwd_kernel

    class Spy:  # records the grid and the PACK the launch passes
        def __getitem__(self, grid):
            def run(*args, **kw):
                launched.append((grid, kw["PACK"]))
                return real[grid](*args, **kw)
            return run

    A.kernel._attn_fwd_kernel = Spy()  # where the launcher reads it
    try:
        outs = []
        for _ in range(2):
            o = torch.full((B, Hq, Lq, Dv), float("nan"), dtype=tdt)
            lse = torch.full((B, Hq, -(-Lq // 32) * 32), float("nan"), dtype=torch.float32)  # rows past Lq: +inf
            A.launch_attention(q, k, v, o, lse, 0.3, causal, cfg)
            outs.append((o, lse))
    finally:
        A.kernel._attn_fwd_kernel = real
    assert launched[0] == ((-(-Lq // (16 // packed)), B * Hq // packed), packed)
    o, lse = outs[0]
    assert np.abs(o.double().numpy() - ref).max() / np.abs(ref).max() < tol
    np.testing.assert_allclose(lse.numpy()[:, :, :Lq], ref_lse[:, :, :Lq], rtol=1e-4, atol=1e-4)
    assert torch.isinf(lse[:, :, Lq:]).all() and (lse[:, :, Lq:] > 0).all()  # every packed head's padding
    assert torch.equal(outs[0][0].view(torch.int16 if dtype == "float16" else torch.int32),
                       outs[1][0].view(torch.int16 if dtype == "float16" else torch.int32))


def test_packed_configs_are_refused_where_pack_does_not_divide_the_group():
    packed = [c for c in SPEC.configs() if c.kwargs.get("PACK", 1) > 1]
    assert packed

    def prob(hq, hkv):
        params = {"attn_mask": "None", "is_causal": "True", **({"enable_gqa": "True"} if hq != hkv else {})}
        return SPEC.problem_from_row(make_row(SDPA, ["bfloat16"] * 3, [(1, hq, 1000, 128), (1, hkv, 1000, 128),
                                                                        (1, hkv, 1000, 128)], params))

    assert all(SPEC.static_refusal(HOPPER, c, prob(32, 8)) is None for c in packed)  # group 4
    mha = [SPEC.static_refusal(HOPPER, c, prob(32, 32)) for c in packed]
    assert all(w is not None and w[0] == "not_applicable" for w in mha)

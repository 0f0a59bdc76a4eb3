"""The prefill attention kernel's Hopper levers (TMA, WS, FMA, LPT, PAIR) on the interpreter: each
against the fp64 oracle at odd shapes in fp32 and fp16 (bf16 is proven on the GPU:
bench/attention_prefill.py), the descriptors and grids the launch builds, and the static
refusals that keep them off devices and problems they cannot serve.

The interpreter emulates tensor descriptors (boxes past an edge read zeros, as TMA does), so
the TMA path runs here; warp specialization is a compiler schedule the interpreter ignores,
so a WS config here checks the loop's arithmetic, not the schedule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nbx_tune.kernels import attention as A
from nbx_tune.kernels.attention import SDPA, SPEC
from nbx_tune.kernels.spec import Config
from nbx_tune.oracles import attention as oracle
from nbx_tune.profiles import get_profile
from nbx_tune.kernels.trace import make_row

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None

HOPPER = get_profile("hopper")
LEVERS = ("TMA", "WS", "FMA", "LPT", "PAIR")


def _cfg(bm=16, bn=16, **flags):
    return Config.make(BLOCK_M=bm, BLOCK_N=bn, **flags, num_warps=1, num_stages=1)


class Spy:
    """Stands in for `_attn_fwd_kernel`: records each launch's grid, descriptors and levers."""

    def __init__(self, monkeypatch):
        self.real, self.launches = A._attn_fwd_kernel, []
        monkeypatch.setattr(A.kernel, "_attn_fwd_kernel", self)  # where the launcher reads it

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.launches.append((grid, args[5], args[6], {k: kw.get(k, int(k == "PACK")) for k in ("PACK", *LEVERS)}))
            return self.real[grid](*args, **kw)
        return run


def _inputs(B, Hq, Hkv, Lq, Lk, D, Dv, dtype, seed):
    rng = np.random.default_rng(seed)
    tdt = getattr(torch, dtype)
    return [torch.from_numpy(rng.standard_normal(s)).to(tdt)
            for s in ((B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv))]


def _run(cfg, q, k, v, causal, scale, repeat=1):
    B, Hq, Lq, _ = q.shape
    outs = []
    for _ in range(repeat):
        o = torch.full((B, Hq, Lq, v.shape[3]), float("nan"), dtype=q.dtype)
        lse = torch.full((B, Hq, -(-Lq // 32) * 32), float("nan"), dtype=torch.float32)  # rows past Lq: +inf
        A.launch_attention(q, k, v, o, lse, scale, causal, cfg)
        outs.append((o, lse))
    return outs


def _check(outs, q, k, v, causal, scale, tol):
    ref, ref_lse = oracle.efficient_attention(*(t.double().numpy() for t in (q, k, v)), causal, scale,
                                              compute_log_sumexp=True)
    Lq = q.shape[2]
    o, lse = outs[0]
    assert not torch.isnan(o).any()
    assert np.abs(o.double().numpy() - ref).max() / np.abs(ref).max() < tol
    np.testing.assert_allclose(lse.numpy()[:, :, :Lq], ref_lse[:, :, :Lq], rtol=1e-4, atol=1e-4)
    assert torch.isinf(lse[:, :, Lq:]).all() and (lse[:, :, Lq:] > 0).all()
    for o2, lse2 in outs[1:]:  # bit for bit on a repeat
        bits = torch.int16 if o.dtype == torch.float16 else torch.int32
        assert torch.equal(o.view(bits), o2.view(bits)) and torch.equal(lse.view(torch.int32), lse2.view(torch.int32))


FLAG_SETS = [
    {"FMA": 1},
    {"TMA": 1},
    {"TMA": 1, "FMA": 1, "LPT": 1},
    {"TMA": 1, "WS": 1, "FMA": 1},
    {"PACK": 2, "TMA": 1, "FMA": 1, "LPT": 1},
    {"PACK": 4, "FMA": 1, "LPT": 1},
    {"TMA": 1, "FMA": 1, "PAIR": 1},
    {"PACK": 2, "FMA": 1, "LPT": 1, "PAIR": 1},
]
SHAPES = [  # (B, Hq, Hkv, Lq, Lk, D, Dv, causal)
    (1, 4, 1, 21, 45, 24, 40, True),    # GQA 4:1, Lq < Lk causal, D and Dv off their blocks, Dv != D
    (2, 2, 2, 37, 19, 16, 16, True),    # 1:1, Lq > Lk causal (rows past Lk see every key), two batches
    (1, 8, 2, 30, 30, 32, 32, False),   # GQA 4:1 square, not causal, a ragged last key block
    (1, 3, 3, 9, 50, 80, 80, False),    # 1:1 Lq < Lk not causal, D = 80 in a 128 block
]


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 3e-3)])
@pytest.mark.parametrize("flags", FLAG_SETS,
                         ids=lambda f: "+".join(f"{k}{v}" if k == "PACK" else k for k, v in f.items()))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}H{}/{}L{}x{}d{}/{}{}".format(*s[:7], "c" if s[7] else ""))
@pytest.mark.slow
def test_levers_match_the_oracle_and_repeat_bit_for_bit(monkeypatch, dtype, tol, flags, shape):
    B, Hq, Hkv, Lq, Lk, D, Dv, causal = shape
    q, k, v = _inputs(B, Hq, Hkv, Lq, Lk, D, Dv, dtype, seed=Lq * 100 + Lk)
    spy = Spy(monkeypatch)
    cfg = _cfg(**flags)
    _check(_run(cfg, q, k, v, causal, 0.3, repeat=2), q, k, v, causal, 0.3, tol)
    grid, k_desc, v_desc, passed = spy.launches[0]
    pack = flags.get("PACK", 1)
    if pack > 1 and (Hq // Hkv) % pack:
        pack = 1 if (Hq // Hkv) % 2 else 2
    blocks, bh = -(-Lq // (16 // pack)), B * Hq // pack
    if flags.get("PAIR"):
        blocks = -(-blocks // 2)  # a long and a short query block per program
    assert grid == ((blocks * bh,) if flags.get("LPT") else (blocks, bh))
    assert passed == {"PACK": pack, **{n: flags.get(n, 0) for n in LEVERS}}
    if flags.get("TMA"):
        # 4-D descriptors of the inputs themselves (aligned here), one key block per box.
        assert k_desc.base is k and v_desc.base is v
        assert k_desc.block_shape == [1, 1, 16, A._block(D)] and v_desc.block_shape == [1, 1, 16, A._block(Dv)]
    else:
        assert k_desc is None and v_desc is None


@pytest.mark.skipif(TensorDescriptor is None, reason="Triton without host-side tensor descriptors")
def test_tma_reads_model_layouts_in_place_and_the_rest_from_an_aligned_copy(monkeypatch):
    # A model's (B, L, H, D) projections viewed as (B, H, L, D): strided, read in place. A
    # head dim of 20 in fp16 (40-byte rows) or a broadcast head axis: an aligned copy.
    spy = Spy(monkeypatch)
    cfg = _cfg(TMA=1, FMA=1)
    B, Hq, Hkv, Lq, Lk = 2, 4, 2, 13, 27
    rng = np.random.default_rng(7)

    def t(*shape):
        return torch.from_numpy(rng.standard_normal(shape)).to(torch.float16)

    q = t(B, Lq, Hq, 24).transpose(1, 2)
    k, v = t(B, Lk, Hkv, 24).transpose(1, 2), t(B, Lk, Hkv, 24).transpose(1, 2)
    _check(_run(cfg, q, k, v, True, 0.25), q, k, v, True, 0.25, 3e-3)
    _, k_desc, v_desc, _ = spy.launches[-1]
    assert k_desc.base is k and v_desc.base is v and k_desc.strides == list(k.stride())

    q20, k20, v20 = t(1, 4, Lq, 20), t(1, 2, Lk, 20), t(1, 1, Lk, 32).expand(1, 2, Lk, 32)
    _check(_run(cfg, q20, k20, v20, False, 0.25), q20, k20, v20, False, 0.25, 3e-3)
    _, k_desc, v_desc, _ = spy.launches[-1]
    assert k_desc.base is not k20 and torch.equal(k_desc.base, k20)
    assert v_desc.base is not v20 and torch.equal(v_desc.base, v20) and 0 not in v_desc.strides
    for d in (k_desc, v_desc):
        es = d.base.element_size()
        assert d.base.data_ptr() % 16 == 0 and all(s * es % 16 == 0 for s in d.strides[:-1])


def test_tma_descriptor_strides_of_size_one_dims_are_aligned():
    # torch gives a size-1 dim any stride (here 24 elements: 48 bytes in fp16, not 16-aligned
    # as the descriptor wants); it is never stepped, so an aligned one replaces it.
    base = torch.zeros(1, 2, 5, 24, dtype=torch.float16)
    odd = base.as_strided((1, 2, 5, 24), (24, 120, 24, 1))
    assert A._tma_strides(odd) == [240, 120, 24, 1] and A._tma_strides(base) == [240, 120, 24, 1]
    assert A._tma_strides(base.expand(3, 2, 5, 24)) is None  # a broadcast batch: a copy
    assert A._tma_strides(torch.zeros(2, 2, 5, 20, dtype=torch.float16)) is None  # 40-byte rows


@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_fma_falls_back_to_the_unfolded_update_where_the_scale_is_not_positive(monkeypatch, scale):
    # The folded update takes the row max before scaling, wrong for a negative scale (and
    # -inf * 0 is nan): the launch passes FMA=0 there; both give the oracle's result.
    spy = Spy(monkeypatch)
    q, k, v = _inputs(1, 4, 2, 19, 33, 16, 16, "float32", seed=3)
    _check(_run(_cfg(FMA=1, TMA=1), q, k, v, True, scale), q, k, v, True, scale, 1e-5)
    assert spy.launches[0][3]["FMA"] == 0
    _run(_cfg(FMA=1), q, k, v, True, 0.3)
    assert spy.launches[1][3]["FMA"] == 1


# ----------------------------------------------------------------------------- the direct launch

@pytest.fixture
def fake(monkeypatch):
    import sys
    from pathlib import Path

    from nbx_tune.testing.fake_compiled import FakeTriton

    from nbx_tune.kernels.runtime import launch

    f = FakeTriton()
    monkeypatch.setattr(launch, "through_triton", f)
    return f


@pytest.mark.skipif(TensorDescriptor is None, reason="Triton without host-side tensor descriptors")
def test_a_tma_attention_call_replays_with_descriptors_of_each_calls_key_and_value(fake, monkeypatch):
    # The public op under a TMA config (testing/fake_compiled.py stands in for the compiled
    # kernel): later calls with fresh tensors of the same key replay it, the descriptors made
    # around each call's K and V; a call whose K needs an aligned copy is never remembered.
    from nbx_tune.kernels.runtime import certified, launch

    cfg = _cfg(TMA=1, FMA=1, LPT=1, PAIR=1)
    monkeypatch.setattr(SPEC, "default_configs", (cfg,))
    certified.reload()
    for seed in range(3):
        q, k, v = _inputs(1, 4, 2, 37, 37, 16, 16, "float32", seed=90 + seed)
        ref = oracle.scaled_dot_product_attention(*(t.double().numpy() for t in (q, k, v)), True, None)
        got = A.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert np.abs(got.double().numpy() - ref).max() / np.abs(ref).max() < 1e-5
    assert fake.log == ["triton", "direct", "direct"]
    assert next(iter(launch.REMEMBERED.values())).source.count("(d") == 2  # k's and v's descriptors
    fake.clear()
    q, k, v = _inputs(1, 4, 2, 13, 21, 20, 20, "float16", seed=5)  # 40-byte rows: read from copies
    for _ in range(2):
        A.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert fake.log == ["triton", "triton"]


# ----------------------------------------------------------------------------- the config space

def _problem(hq, hkv, L=1000, D=128, causal=True, dt="bfloat16"):
    params = {"attn_mask": "None", **({"is_causal": "True"} if causal else {}),
              **({"enable_gqa": "True"} if hq != hkv else {})}
    return SPEC.problem_from_row(make_row(SDPA, [dt] * 3, [(1, hq, L, D), (1, hkv, L, D), (1, hkv, L, D)], params))


def _has(c, name):
    return bool(c.kwargs.get(name, 0))


def test_the_space_keeps_every_earlier_config_and_adds_each_lever():
    keys = [str(c) for c in A.CONFIGS]
    assert len(keys) == len(set(keys))
    plain = [c for c in A.CONFIGS if not any(_has(c, n) for n in LEVERS)]
    assert len(plain) == 35  # the space before the levers, unchanged
    for name in LEVERS:
        assert any(_has(c, name) for c in A.CONFIGS), name
    assert all(_has(c, "TMA") for c in A.CONFIGS if _has(c, "WS"))
    assert not any("SPLIT_KV" in c.kwargs for c in A.CONFIGS if any(_has(c, n) for n in LEVERS))
    assert A.DEFAULTS == tuple(c for c in A.DEFAULTS if not any(_has(c, n) for n in LEVERS))


def test_every_lever_config_is_a_candidate_at_the_llama_prefill_on_hopper():
    gqa = _problem(32, 8)
    levers = [c for c in A.CONFIGS if any(_has(c, n) for n in LEVERS)]
    assert [c for c in levers if SPEC.static_refusal(HOPPER, c, gqa)] == []


@pytest.mark.parametrize("profile,refused", [("hopper", False), ("blackwell", False), ("interpreter", False),
                                             ("ampere", True), ("ada", True), ("cdna3", True), ("apple_m", True)])
def test_tma_configs_are_refused_unlaunched_where_there_is_no_tma_unit(profile, refused):
    p = _problem(32, 8)
    for c in (c for c in A.CONFIGS if _has(c, "TMA")):
        got = SPEC.static_refusal(get_profile(profile), c, p)
        if refused:
            assert got is not None and got[0] == "no_tma", (c, got)
        else:
            assert got is None or got[0] != "no_tma", (c, got)


def test_tma_configs_are_refused_on_a_triton_without_tensor_descriptors(monkeypatch):
    for where in (A.kernel, A.spec):  # the launcher's descriptors, the spec's refusal
        monkeypatch.setattr(where, "TensorDescriptor", None)
    c = next(c for c in A.CONFIGS if _has(c, "TMA"))
    assert SPEC.static_refusal(HOPPER, c, _problem(32, 8))[0] == "no_tma"


def test_lever_refusals():
    tma = next(c for c in A.CONFIGS if _has(c, "TMA") and not _has(c, "LPT") and not _has(c, "PACK"))
    lpt = next(c for c in A.CONFIGS if _has(c, "LPT"))
    # Rows of 20 fp16 elements (40 bytes) are off TMA's 16-byte rule: refused, not copied each call.
    why = SPEC.static_refusal(HOPPER, tma, _problem(8, 8, L=300, D=20, dt="float16"))
    assert why is not None and why[0] == "not_applicable" and "16 bytes" in why[1]
    assert SPEC.static_refusal(HOPPER, tma, _problem(8, 8, L=300, D=24, dt="float16")) is None
    # LPT and PAIR balance causal work; a non-causal problem's blocks are all alike.
    for c in (lpt, next(c for c in A.CONFIGS if _has(c, "PAIR"))):
        why = SPEC.static_refusal(HOPPER, c, _problem(12, 12, L=1024, D=64, causal=False))
        assert why is not None and why[0] == "not_applicable"
    # WS without TMA is refused (the space has none; a hand-made one is).
    why = SPEC.static_refusal(HOPPER, _cfg(128, 64, WS=1), _problem(32, 8))
    assert why is not None and why[0] == "not_applicable"


# ----------------------------------------------------------------------------- the bench

def test_bench_smoke_checks_and_times_one_config_per_lever_set(tmp_path, monkeypatch):
    import json
    import sys
    from pathlib import Path

    from nbx_tune.bench import attention_prefill as bench

    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(bench, "SMOKE_SHAPES", [(1, 4, 2, 24, 24, 16, True)])
    assert bench.main(["--smoke"]) == 0
    report = json.loads((tmp_path / "attention_prefill.json").read_text())
    sets = {r[3] for r in report["check"]}
    assert {"-", "FMA", "TMA+FMA", "TMA+WS+FMA", "TMA+FMA+LPT"} <= sets, sets
    assert all(r[-1] == "ok" for r in report["check"]) and {r[1] for r in report["check"]} == {"bhld", "blhd"}
    assert any("Lq21 Lk45" in r[0] for r in report["check"])  # the lever configs at an odd shape too
    (row,) = report["timing"]
    assert row["torch_ms"] > 0 and row["best"] in row["sweep"] and row["plain"] in row["sweep"]

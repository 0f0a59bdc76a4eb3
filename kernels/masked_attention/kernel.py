"""The masked attention kernel (an online softmax over the key blocks a query block can see,
split over the keys for decode) and its launcher: what decides the code a seat runs (every
function here is listed in the spec's `source_parts`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nbx_tune.kernels.attention.kernel import _block as head_block
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.spec import Config

LOG2E = 1.4426950408889634
FP32_MAX = 3.4028234663852886e38
# What a mask holds (MASK constexpr): nothing, a boolean keep-mask, an additive float bias.
NO_MASK, BOOL_MASK, ADD_MASK = 0, 1, 2


@triton.jit
def _masked_step(q, k, v, m_i, l_i, acc, qk_scale, keep, bias,
                 KEEP: tl.constexpr, BIAS: tl.constexpr, SAFE: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    # One key block of the online softmax (base 2). SAFE: a row may have seen no key yet
    # (its max -inf), so the exponent's offset is 0 there instead of -inf - -inf = NaN.
    qk = tl.dot(q, k, input_precision=INPUT_PRECISION) * qk_scale
    if BIAS:
        qk = qk + bias
    if KEEP:
        qk = tl.where(keep, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    if SAFE:
        m_s = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_s = m_new
    p = tl.exp2(qk - m_s[:, None])
    alpha = tl.exp2(m_i - m_s)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=INPUT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _masked_block(q, k_ptrs, v_ptrs, m_rows, start_n, stride_kn, stride_vn, stride_mk, Lk, lo_r, hi_r,
                  m_i, l_i, acc, qk_scale, r_ok, d_ok, dv_ok, offs_n,
                  BOUNDS: tl.constexpr, MASK: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    # A key block read with masks: the ragged tail, the rows' own key intervals (BOUNDS) and
    # the mask tensor (MASK), whichever apply.
    cols = start_n + offs_n
    n_ok = cols < Lk
    k = tl.load(k_ptrs + start_n * stride_kn, mask=d_ok[:, None] & n_ok[None, :], other=0.0)
    v = tl.load(v_ptrs + start_n * stride_vn, mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
    keep = n_ok[None, :] & r_ok[:, None]
    if BOUNDS:
        keep = keep & (cols[None, :] >= lo_r[:, None]) & (cols[None, :] < hi_r[:, None])
    bias = 0.0
    if MASK == 1:
        mv = tl.load(m_rows[:, None] + cols[None, :] * stride_mk, mask=keep, other=0)
        keep = keep & (mv != 0)
    if MASK == 2:
        mv = tl.load(m_rows[:, None] + cols[None, :] * stride_mk, mask=keep, other=0.0).to(tl.float32)
        # In base 2 like the scores; a finite bias stays finite (dtype.min * log2(e) would
        # overflow to -inf and turn torch's uniform row into an empty one).
        bias = tl.where(mv == float("-inf"), float("-inf"), tl.maximum(mv * 1.4426950408889634, -3.4028234663852886e38))
    return _masked_step(q, k, v, m_i, l_i, acc, qk_scale, keep, bias, True, MASK == 2, True, INPUT_PRECISION)


@triton.jit
def _full_block(q, k_ptrs, v_ptrs, m_rows, start_n, stride_kn, stride_vn, stride_mk, m_i, l_i, acc, qk_scale,
                r_ok, d_ok, dv_ok, offs_n, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_DV: tl.constexpr, MASK: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    # A key block every row's interval holds in full: no bounds, only the mask tensor if any.
    if HEAD_DIM == BLOCK_D:
        k = tl.load(k_ptrs + start_n * stride_kn)
    else:
        k = tl.load(k_ptrs + start_n * stride_kn, mask=d_ok[:, None], other=0.0)
    if HEAD_DIM_V == BLOCK_DV:
        v = tl.load(v_ptrs + start_n * stride_vn)
    else:
        v = tl.load(v_ptrs + start_n * stride_vn, mask=dv_ok[None, :], other=0.0)
    cols = start_n + offs_n
    keep = None
    bias = 0.0
    if MASK == 1:
        keep = tl.load(m_rows[:, None] + cols[None, :] * stride_mk, mask=r_ok[:, None], other=0) != 0
    if MASK == 2:
        mv = tl.load(m_rows[:, None] + cols[None, :] * stride_mk, mask=r_ok[:, None], other=0.0).to(tl.float32)
        bias = tl.where(mv == float("-inf"), float("-inf"), tl.maximum(mv * 1.4426950408889634, -3.4028234663852886e38))
    return _masked_step(q, k, v, m_i, l_i, acc, qk_scale, keep, bias, MASK == 1, MASK == 2, MASK != 0,
                        INPUT_PRECISION)


@triton.jit
def _masked_attn_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, m_ptr, kr_ptr, wo_ptr, wl_ptr,
    Hq, GROUP, Lq, Lk, OFF, WIN,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_mb, stride_mh, stride_mq, stride_mk, stride_krb,
    qk_scale,  # scale * log2(e)
    MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, RANGES: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
):
    # One program: BLOCK_M rows of the (GROUP x Lq) rows of one key/value head of one batch
    # (row r: query head kvh * GROUP + r // Lq, query r % Lq), so the query heads sharing a
    # key/value head share its tiles where Lq is short (decode), and one of SPLIT slices of
    # the keys those rows can see. Row i sees keys [lo_i, hi_i): RANGES a per-batch key range
    # (padding), CAUSAL keys j <= i + OFF, WINDOW keys j > i + OFF - WIN; the mask tensor, if
    # any, is read inside that interval only. SPLIT = 1 writes the output, else the slice's
    # normalized output and base-2 logsumexp go to the fp32 workspaces wo and wl.
    pid_r = tl.program_id(0)
    bkv = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    Hkv = Hq // GROUP
    b = bkv // Hkv
    kvh = bkv % Hkv
    rows = pid_r * BLOCK_M + tl.arange(0, BLOCK_M)
    r_ok = rows < GROUP * Lq
    qi = rows % Lq
    h = kvh * GROUP + rows // Lq
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < HEAD_DIM
    dv_ok = offs_dv < HEAD_DIM_V

    q = tl.load(q_ptr + b * stride_qb + h[:, None] * stride_qh + qi[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=r_ok[:, None] & d_ok[None, :], other=0.0)
    k_ptrs = k_ptr + b * stride_kb + kvh * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = v_ptr + b * stride_vb + kvh * stride_vh + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd
    m_rows = m_ptr + b * stride_mb + h * stride_mh + qi * stride_mq

    # Each row's key interval [lo_r, hi_r).
    lo_r = tl.zeros([BLOCK_M], dtype=tl.int32)
    hi_r = tl.zeros([BLOCK_M], dtype=tl.int32) + Lk
    if RANGES:
        lo_r = lo_r + tl.load(kr_ptr + b * stride_krb)
        hi_r = tl.minimum(hi_r, tl.load(kr_ptr + b * stride_krb + 1))
    pos = qi + OFF
    if CAUSAL:
        hi_r = tl.minimum(hi_r, pos + 1)
    if WINDOW:
        lo_r = tl.maximum(lo_r, pos - WIN + 1)
    lo_r = tl.maximum(lo_r, 0)
    live = r_ok & (lo_r < hi_r)  # rows that see a key at all
    BOUNDS: tl.constexpr = RANGES or CAUSAL or WINDOW
    # The keys any live row sees, and those every live row sees (the unmasked blocks).
    lo = tl.min(tl.where(live, lo_r, Lk), 0)
    hi = tl.max(tl.where(live, hi_r, 0), 0)
    n0 = (lo // BLOCK_N) * BLOCK_N
    if BOUNDS:
        f0 = tl.maximum(tl.cdiv(tl.max(tl.where(live, lo_r, 0), 0), BLOCK_N) * BLOCK_N, n0)
        f1 = tl.maximum((tl.min(tl.where(live, hi_r, Lk), 0) // BLOCK_N) * BLOCK_N, f0)
    else:
        f0 = n0
        f1 = (Lk // BLOCK_N) * BLOCK_N
    per = tl.cdiv(tl.cdiv(tl.maximum(hi - n0, 0), BLOCK_N), SPLIT) * BLOCK_N
    a = n0 + split * per
    e = tl.minimum(hi, a + per)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    g0 = tl.minimum(tl.maximum(f0, a), e)
    g1 = tl.maximum(tl.minimum(f1, e), g0)
    for start_n in range(a, g0, BLOCK_N):
        m_i, l_i, acc = _masked_block(q, k_ptrs, v_ptrs, m_rows, start_n, stride_kn, stride_vn, stride_mk, Lk,
                                      lo_r, hi_r, m_i, l_i, acc, qk_scale, r_ok, d_ok, dv_ok, offs_n,
                                      BOUNDS, MASK, INPUT_PRECISION)
    for start_n in range(g0, g1, BLOCK_N):
        m_i, l_i, acc = _full_block(q, k_ptrs, v_ptrs, m_rows, start_n, stride_kn, stride_vn, stride_mk,
                                    m_i, l_i, acc, qk_scale, r_ok, d_ok, dv_ok, offs_n, HEAD_DIM, HEAD_DIM_V,
                                    BLOCK_D, BLOCK_DV, MASK, INPUT_PRECISION)
    for start_n in range(g1, e, BLOCK_N):
        m_i, l_i, acc = _masked_block(q, k_ptrs, v_ptrs, m_rows, start_n, stride_kn, stride_vn, stride_mk, Lk,
                                      lo_r, hi_r, m_i, l_i, acc, qk_scale, r_ok, d_ok, dv_ok, offs_n,
                                      BOUNDS, MASK, INPUT_PRECISION)

    # A row that saw no key (every score masked, or an empty interval whose garbage the
    # unmasked blocks summed) is 0, as torch's SDPA returns it.
    seen = live & (l_i > 0)
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    out = tl.where(seen[:, None], out, 0.0)
    if SPLIT == 1:
        tl.store(o_ptr + b * stride_ob + h[:, None] * stride_oh + qi[:, None] * stride_om + offs_dv[None, :] * stride_od,
                 out.to(o_ptr.dtype.element_ty), mask=r_ok[:, None] & dv_ok[None, :])
    else:
        lse2 = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        row = (split * (tl.num_programs(1) * GROUP) + b * Hq + h) * Lq + qi  # (split, b * Hq + h, qi)
        tl.store(wo_ptr + row[:, None] * HEAD_DIM_V + offs_dv[None, :], out, mask=r_ok[:, None] & dv_ok[None, :])
        tl.store(wl_ptr + row, lse2, mask=r_ok)


_masked_attn_kernel = launch.recorded(_masked_attn_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def _masked_combine_kernel(
    wo_ptr, wl_ptr, o_ptr, BHq, Hq, Lq,
    stride_ob, stride_oh, stride_om, stride_od,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, SPLIT: tl.constexpr,
):
    # One (batch * head, query) row: the SPLIT slices weighted by exp2(lse_s - max), in slice
    # order (no atomics: reproducible). A row no slice saw a key of is 0.
    qi = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // Hq
    h = bh % Hq
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < HEAD_DIM_V
    m = tl.load(wl_ptr + bh * Lq + qi)
    for s in tl.static_range(1, SPLIT):
        m = tl.maximum(m, tl.load(wl_ptr + (s * BHq + bh) * Lq + qi))
    m_s = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    den = tl.sum(acc, 0)
    for s in tl.static_range(SPLIT):
        row = (s * BHq + bh) * Lq + qi
        w = tl.exp2(tl.load(wl_ptr + row) - m_s)
        den += w
        acc += w * tl.load(wo_ptr + row * HEAD_DIM_V + offs_dv, mask=dv_ok, other=0.0)
    out = acc / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + qi * stride_om + offs_dv * stride_od,
             out.to(o_ptr.dtype.element_ty), mask=dv_ok)


_masked_combine_kernel = launch.recorded(_masked_combine_kernel)


def launch_masked_attention(q, k, v, o, scale: float, config: Config, mask=None, mask_kind: int = NO_MASK,
                            causal: bool = False, offset: int = 0, window: int = 0, ranges=None) -> None:
    """o = softmax(scale * q k^T + mask) v over the keys each query row sees.

    q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv), o (B, Hq, Lq, Dv), any strides.
    mask: None, or a tensor viewable as (B, Hq, Lq, Lk) by `expand` (bool: keep where True;
    float: added to the scaled scores). causal: query i sees keys j <= i + offset; window > 0:
    keys j > i + offset - window; ranges: int32 (B or 1, 2) per-batch key range [start, end)."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    Dv = v.shape[3]
    group, split = Hq // Hkv, config["SPLIT"]
    if mask is None:
        m, ms = q, (0, 0, 0, 0)  # never read
    else:
        m = mask.expand(B, Hq, Lq, Lk)
        ms = m.stride()
    if ranges is None:
        kr, krs = o, 0  # never read
    else:
        kr, krs = ranges, (ranges.stride(0) if ranges.shape[0] > 1 else 0)
    if split > 1:
        wo = launch.empty((split, B * Hq, Lq, Dv), torch.float32, q.device)
        wl = launch.empty((split, B * Hq, Lq), torch.float32, q.device)
    else:
        wo = wl = o  # never written
    grid = (triton.cdiv(group * Lq, config["BLOCK_M"]), B * Hkv, split)
    _masked_attn_kernel[grid](
        q, k, v, o, m, kr, wo, wl,
        Hq, group, Lq, Lk, offset, window,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *ms, krs,
        scale * LOG2E,
        MASK=mask_kind if mask is not None else NO_MASK, CAUSAL=bool(causal), WINDOW=window > 0,
        RANGES=ranges is not None, HEAD_DIM=D, HEAD_DIM_V=Dv, BLOCK_D=head_block(D), BLOCK_DV=head_block(Dv),
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **config.kwargs,
    )
    if split > 1:
        _masked_combine_kernel[(Lq, B * Hq)](wo, wl, o, B * Hq, Hq, Lq, *o.stride(),
                                             HEAD_DIM_V=Dv, BLOCK_DV=head_block(Dv), SPLIT=split, num_warps=4)

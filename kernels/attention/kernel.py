"""The attention kernels (prefill: an online softmax over key blocks; decode: split over the keys,
then combined) and their launchers: what decides the code a seat runs (every function here
that the spec hashes is listed in its `source_parts`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.spec import Config

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton before 3.4: no host-side descriptors, so no TMA configs (`no_tma`)
    TensorDescriptor = None
LOG2E = 1.4426950408889634


@triton.jit
def _attn_step(q, k, v, m_i, l_i, acc, qk_scale, keep,
               MASKED: tl.constexpr, FMA: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    # One key block of the online softmax: (m, l, acc) updated by the scores q k (base 2).
    qk = tl.dot(q, k, input_precision=INPUT_PRECISION)
    if FMA:
        # The scale applied after the row max (scale > 0: the launch sees to it) and folded
        # into the subtraction: one fused multiply-add per score instead of a multiply and a
        # subtract. -inf * scale stays -inf, so masked scores still weigh 0.
        if MASKED:
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
    else:
        qk = qk * qk_scale
        if MASKED:
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=INPUT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _attn_fwd_rows(
    pid_m, n_m, b, h0, kvh, q_ptr, k_base, v_base, o_ptr, lse_ptr, k_desc, v_desc,
    Lq, Lk, LSE_LEN, stride_qb, stride_qh, stride_qm, stride_qd, stride_kn, stride_kd,
    stride_vn, stride_vd, stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh,
    stride_lm, qk_scale,
    IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PACK: tl.constexpr, TMA: tl.constexpr,
    WS: tl.constexpr, FMA: tl.constexpr,
):
    # Query block pid_m (of n_m) of heads h0 .. h0 + PACK - 1: its output and logsumexp.
    QB: tl.constexpr = BLOCK_M // PACK
    start_m = pid_m * QB
    if PACK == 1:
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_rows = q_ptr + b * stride_qb + h0 * stride_qh + offs_m * stride_qm
        o_rows = o_ptr + b * stride_ob + h0 * stride_oh + offs_m * stride_om
        l_rows = lse_ptr + b * stride_lb + h0 * stride_lh + offs_m * stride_lm
    else:
        rows = tl.arange(0, BLOCK_M)
        offs_m = start_m + rows % QB
        hr = h0 + rows // QB
        q_rows = q_ptr + b * stride_qb + hr * stride_qh + offs_m * stride_qm
        o_rows = o_ptr + b * stride_ob + hr * stride_oh + offs_m * stride_om
        l_rows = lse_ptr + b * stride_lb + hr * stride_lh + offs_m * stride_lm
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < HEAD_DIM
    dv_ok = offs_dv < HEAD_DIM_V
    m_ok = offs_m < Lq

    q = tl.load(q_rows[:, None] + offs_d[None, :] * stride_qd, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    k_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd  # (BLOCK_D, BLOCK_N)
    v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd  # (BLOCK_N, BLOCK_DV)
    # TMA: K and V through 4-D descriptors (B, Hkv, Lk, D) in (1, 1, BLOCK_N, BLOCK_D) boxes
    # (`kv_descriptors`); boxes past Lk or the head dim read zeros, so no load needs a mask.
    tb = b.to(tl.int32)
    tkvh = kvh.to(tl.int32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    if IS_CAUSAL:
        # Keys 0..start_m are seen by every row of the block; keys past the block's last row
        # by none of them.
        hi = tl.minimum(start_m + QB, Lk)
        n_full = (tl.minimum(start_m + 1, Lk) // BLOCK_N) * BLOCK_N
    else:
        hi = Lk
        n_full = (Lk // BLOCK_N) * BLOCK_N

    # Key blocks every row sees in full: no masks on keys, nor on head dims that fill their
    # power-of-two block (D = 64, 128: the loads need no mask at all). WS: the loop
    # warp-specialized (loads, MMAs and softmax in separate warp groups; TMA loads only).
    for start_n in tl.range(0, n_full, BLOCK_N, warp_specialize=WS == 1):
        if TMA:
            k = k_desc.load([tb, tkvh, start_n, 0]).reshape(BLOCK_N, BLOCK_D).T
            v = v_desc.load([tb, tkvh, start_n, 0]).reshape(BLOCK_N, BLOCK_DV)
        else:
            if HEAD_DIM == BLOCK_D:
                k = tl.load(k_ptrs + start_n * stride_kn)
            else:
                k = tl.load(k_ptrs + start_n * stride_kn, mask=d_ok[:, None], other=0.0)
            if HEAD_DIM_V == BLOCK_DV:
                v = tl.load(v_ptrs + start_n * stride_vn)
            else:
                v = tl.load(v_ptrs + start_n * stride_vn, mask=dv_ok[None, :], other=0.0)
        m_i, l_i, acc = _attn_step(q, k, v, m_i, l_i, acc, qk_scale, None, False, FMA, INPUT_PRECISION)

    # The causal diagonal and the ragged tail of the keys: masked. Every row sees key 0, so
    # m_new is finite from the first block on and no exp2(-inf - -inf) arises.
    for start_n in range(n_full, hi, BLOCK_N):
        cols = start_n + offs_n
        n_ok = cols < Lk
        if TMA:
            k = k_desc.load([tb, tkvh, start_n, 0]).reshape(BLOCK_N, BLOCK_D).T
            v = v_desc.load([tb, tkvh, start_n, 0]).reshape(BLOCK_N, BLOCK_DV)
        else:
            k = tl.load(k_ptrs + start_n * stride_kn, mask=d_ok[:, None] & n_ok[None, :], other=0.0)
            v = tl.load(v_ptrs + start_n * stride_vn, mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        keep = n_ok[None, :]
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        m_i, l_i, acc = _attn_step(q, k, v, m_i, l_i, acc, qk_scale, keep, True, FMA, INPUT_PRECISION)

    out = acc / l_i[:, None]
    tl.store(o_rows[:, None] + offs_dv[None, :] * stride_od, out.to(o_ptr.dtype.element_ty),
             mask=m_ok[:, None] & dv_ok[None, :])
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453  # back to natural log
    tl.store(l_rows, lse, mask=m_ok)
    if pid_m == n_m - 1:
        # The padding rows [Lq, LSE_LEN) of an aligned logsumexp: +inf (LSE_LEN - Lq < 32).
        offs_t = Lq + tl.arange(0, 32)
        for j in tl.static_range(PACK):
            tl.store(lse_ptr + b * stride_lb + (h0 + j) * stride_lh + offs_t * stride_lm,
                     tl.full([32], float("inf"), dtype=tl.float32), mask=offs_t < LSE_LEN)


@triton.jit
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, k_desc, v_desc,
    Hq, GROUP, Lq, Lk, LSE_LEN,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh, stride_lm,
    qk_scale,  # scale * log2(e)
    IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PACK: tl.constexpr = 1,
    TMA: tl.constexpr = 0, WS: tl.constexpr = 0, FMA: tl.constexpr = 0, LPT: tl.constexpr = 0,
    PAIR: tl.constexpr = 0,
):
    # PACK query heads of one key/value head share a program (PACK divides GROUP): row r is
    # head h0 + r // QB at query start_m + r % QB, so each K/V tile is loaded once for all
    # of them (grouped-query prefill). PACK = 1: one head, BLOCK_M queries.
    QB: tl.constexpr = BLOCK_M // PACK
    # PAIR: program j of a head runs query blocks n_m - 1 - j and j, a long causal block and
    # a short one, so every program has about the same work (one wave where they all fit).
    if LPT:
        # One axis, query blocks outermost, longest first: every head's last (longest causal)
        # block starts before any head's shorter ones, so the short ones fill the tail.
        n_m = tl.cdiv(Lq, QB)
        n_bh = tl.num_programs(0) // tl.cdiv(n_m, 1 + PAIR)
        j = tl.program_id(0) // n_bh
        bh = (tl.program_id(0) % n_bh).to(tl.int64)
    else:
        # Causal: the longest query blocks (the last) of a head start first, so the short
        # ones fill the machine's tail instead of one long block running alone at the end.
        n_m = tl.cdiv(Lq, QB) if PAIR else tl.num_programs(0)
        j = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
    pid_m = n_m - 1 - j if IS_CAUSAL else j
    b = bh // (Hq // PACK)
    h0 = (bh % (Hq // PACK)) * PACK
    kvh = h0 // GROUP
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh
    _attn_fwd_rows(pid_m, n_m, b, h0, kvh, q_ptr, k_base, v_base, o_ptr, lse_ptr, k_desc, v_desc,
                   Lq, Lk, LSE_LEN, stride_qb, stride_qh, stride_qm, stride_qd, stride_kn, stride_kd,
                   stride_vn, stride_vd, stride_ob, stride_oh, stride_om, stride_od, stride_lb, stride_lh,
                   stride_lm, qk_scale, IS_CAUSAL, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, INPUT_PRECISION,
                   BLOCK_M, BLOCK_N, PACK, TMA, WS, FMA)
    if PAIR:
        if j < n_m - 1 - j:
            _attn_fwd_rows(n_m - 1 - pid_m, n_m, b, h0, kvh, q_ptr, k_base, v_base, o_ptr, lse_ptr, k_desc,
                           v_desc, Lq, Lk, LSE_LEN, stride_qb, stride_qh, stride_qm, stride_qd, stride_kn,
                           stride_kd, stride_vn, stride_vd, stride_ob, stride_oh, stride_om, stride_od, stride_lb,
                           stride_lh, stride_lm, qk_scale, IS_CAUSAL, HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV,
                           INPUT_PRECISION, BLOCK_M, BLOCK_N, PACK, TMA, WS, FMA)


_attn_fwd_kernel = launch.recorded(_attn_fwd_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def _attn_decode_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, wo_ptr, wl_ptr,
    Hq, GROUP, Lq, Lk,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh, stride_lm,
    qk_scale,  # scale * log2(e)
    IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_KV: tl.constexpr,
):
    # Few queries, many keys (decode). One program owns one key/value head of one batch and
    # BLOCK_M rows packed from the GROUP query heads that read it (row r: head r // Lq of the
    # group, query r % Lq), so each key/value tile is loaded once for the whole group, and
    # one of SPLIT_KV slices of the keys (flash-decoding). With SPLIT_KV = 1 it writes the
    # output and logsumexp; else its slice's normalized output and base-2 logsumexp go to
    # the fp32 workspaces wo (SPLIT_KV, B * Hq, Lq, Dv) and wl (SPLIT_KV, B * Hq, Lq), which
    # `_attn_combine_kernel` merges in slice order (no atomics: bitwise reproducible).
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

    # Causal (top-left): query i sees keys j <= i, so no row sees a key at or past Lq.
    hi = tl.minimum(Lk, Lq) if IS_CAUSAL else Lk
    per = tl.cdiv(tl.cdiv(hi, BLOCK_N), SPLIT_KV) * BLOCK_N
    lo = split * per
    end = tl.minimum(hi, lo + per)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for start_n in range(lo, end, BLOCK_N):
        cols = start_n + offs_n
        n_ok = cols < end
        k = tl.load(k_ptrs + start_n * stride_kn, mask=d_ok[:, None] & n_ok[None, :], other=0.0)
        v = tl.load(v_ptrs + start_n * stride_vn, mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        qk = tl.dot(q, k, input_precision=INPUT_PRECISION) * qk_scale
        keep = n_ok[None, :]
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= qi[:, None])
        qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A row of a causal slice may see none of its keys yet: its max is -inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=INPUT_PRECISION)
        m_i = m_new

    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse2 = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    if SPLIT_KV == 1:
        tl.store(o_ptr + b * stride_ob + h[:, None] * stride_oh + qi[:, None] * stride_om + offs_dv[None, :] * stride_od,
                 out.to(o_ptr.dtype.element_ty), mask=r_ok[:, None] & dv_ok[None, :])
        tl.store(lse_ptr + b * stride_lb + h * stride_lh + qi * stride_lm, lse2 * 0.6931471805599453, mask=r_ok)
    else:
        row = (split * (tl.num_programs(1) * GROUP) + b * Hq + h) * Lq + qi  # (split, b * Hq + h, qi)
        tl.store(wo_ptr + row[:, None] * HEAD_DIM_V + offs_dv[None, :], out, mask=r_ok[:, None] & dv_ok[None, :])
        tl.store(wl_ptr + row, lse2, mask=r_ok)


_attn_decode_kernel = launch.recorded(_attn_decode_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def _attn_combine_kernel(
    wo_ptr, wl_ptr, o_ptr, lse_ptr, BHq, Hq, Lq,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh, stride_lm,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, SPLIT_KV: tl.constexpr,
):
    # One (batch * head, query) row: the SPLIT_KV slices weighted by exp2(lse_s - max), in
    # slice order. Slice 0 always holds key 0, which every row sees: the max is finite.
    qi = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // Hq
    h = bh % Hq
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < HEAD_DIM_V
    m = tl.load(wl_ptr + bh * Lq + qi)
    for s in tl.static_range(1, SPLIT_KV):
        m = tl.maximum(m, tl.load(wl_ptr + (s * BHq + bh) * Lq + qi))
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    den = tl.sum(acc, 0)
    for s in tl.static_range(SPLIT_KV):
        row = (s * BHq + bh) * Lq + qi
        w = tl.exp2(tl.load(wl_ptr + row) - m)
        den += w
        acc += w * tl.load(wo_ptr + row * HEAD_DIM_V + offs_dv, mask=dv_ok, other=0.0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + qi * stride_om + offs_dv * stride_od,
             (acc / den).to(o_ptr.dtype.element_ty), mask=dv_ok)
    tl.store(lse_ptr + b * stride_lb + h * stride_lh + qi * stride_lm, (m + tl.log2(den)) * 0.6931471805599453)


_attn_combine_kernel = launch.recorded(_attn_combine_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def _block(d: int) -> int:
    """The power-of-two block a head dim is loaded in (tl.dot needs at least 16)."""
    return max(16, triton.next_power_of_2(d))


def launch_attention(q, k, v, o, lse, scale: float, is_causal: bool, config: Config) -> None:
    """o = softmax(scale * q k^T [causal]) v and its logsumexp. q (B, Hq, Lq, D), k (B, Hkv,
    Lk, D), v (B, Hkv, Lk, Dv), o (B, Hq, Lq, Dv), lse fp32 (B, Hq, LSE_LEN >= Lq); any strides."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    Dv = v.shape[3]
    if "SPLIT_KV" in config.kwargs:
        launch_attention_decode(q, k, v, o, lse, scale, is_causal, config)
        return
    kwargs = config.kwargs
    pack = kwargs.get("PACK", 1)
    if pack > 1 and (Hq // Hkv) % pack:
        # A seat's problems may differ in their head groups: where this one's group is not a
        # multiple of PACK, the program packs as many heads as both allow (still correct).
        pack = math.gcd(pack, Hq // Hkv)
        kwargs = {**kwargs, "PACK": pack}
    if kwargs.get("FMA") and not scale > 0:
        # The folded scale takes the row max before scaling: right for a positive scale only
        # (a seat's problems may differ in scale); the unfolded update serves the others.
        kwargs = {**kwargs, "FMA": 0}
    k_desc = v_desc = None
    if kwargs.get("TMA"):
        k_desc, v_desc = kv_descriptors(k, v, config["BLOCK_N"], _block(D), _block(Dv))
    blocks, bh = triton.cdiv(Lq, config["BLOCK_M"] // pack), B * Hq // pack
    if kwargs.get("PAIR"):
        blocks = triton.cdiv(blocks, 2)  # a long and a short query block per program
    grid = (blocks * bh,) if kwargs.get("LPT") else (blocks, bh)
    _attn_fwd_kernel[grid](
        q, k, v, o, lse, k_desc, v_desc,
        Hq, Hq // Hkv, Lq, Lk, lse.shape[2],
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(),
        scale * LOG2E,
        IS_CAUSAL=is_causal, HEAD_DIM=D, HEAD_DIM_V=Dv, BLOCK_D=_block(D), BLOCK_DV=_block(Dv),
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **kwargs,
    )


def _tma_strides(t):
    """t's strides as a TMA descriptor may give them (16-byte multiples, the last 1), or None:
    a dim of size 1 is never stepped, so its stride is replaced by an aligned one."""
    es, st = t.element_size(), list(t.stride())
    if st[-1] != 1 and t.shape[-1] > 1:
        return None
    st[-1] = 1
    for d in range(t.dim() - 1):
        if t.shape[d] == 1:
            st[d] = -(-math.prod(t.shape[d + 1:]) * es // 16) * 16 // es
        elif st[d] == 0 or (st[d] * es) % 16:
            return None
    return st


def kv_descriptors(k, v, block_n: int, block_d: int, block_dv: int) -> tuple:
    """Host-side TMA descriptors of k (B, Hkv, Lk, D) and v in (1, 1, block_n, block_d|dv)
    boxes. A tensor TMA cannot read in place (base or a row off 16 bytes, a broadcast stride)
    is described through an aligned copy (such calls are not replayed: kernels/runtime/launch.py)."""
    descs = []
    for t, bd in ((k, block_d), (v, block_dv)):
        st = _tma_strides(t) if t.data_ptr() % 16 == 0 else None
        if st is None:
            per = 16 // t.element_size()
            t = t.new_empty((*t.shape[:-1], -(-t.shape[-1] // per) * per))[..., :t.shape[-1]].copy_(t)
            st = _tma_strides(t)
        descs.append(TensorDescriptor(t, list(t.shape), st, [1, 1, block_n, bd]))
    return tuple(descs)


def launch_attention_decode(q, k, v, o, lse, scale: float, is_causal: bool, config: Config) -> None:
    """`launch_attention` by `_attn_decode_kernel` (a config with SPLIT_KV), then for
    SPLIT_KV > 1 `_attn_combine_kernel` over fp32 workspaces of SPLIT_KV x the output."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    Dv = v.shape[3]
    group, sk = Hq // Hkv, config["SPLIT_KV"]
    if sk > 1:
        wo = launch.empty((sk, B * Hq, Lq, Dv), torch.float32, q.device)
        wl = launch.empty((sk, B * Hq, Lq), torch.float32, q.device)
    else:
        wo, wl = o, lse  # unused
    grid = (triton.cdiv(group * Lq, config["BLOCK_M"]), B * Hkv, sk)
    _attn_decode_kernel[grid](
        q, k, v, o, lse, wo, wl,
        Hq, group, Lq, Lk,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(),
        scale * LOG2E,
        IS_CAUSAL=is_causal, HEAD_DIM=D, HEAD_DIM_V=Dv, BLOCK_D=_block(D), BLOCK_DV=_block(Dv),
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **config.kwargs,
    )
    if sk > 1:
        _attn_combine_kernel[(Lq, B * Hq)](wo, wl, o, lse, B * Hq, Hq, Lq, *o.stride(), *lse.stride(),
                                           HEAD_DIM_V=Dv, BLOCK_DV=_block(Dv), SPLIT_KV=sk, num_warps=4)
    if lse.shape[2] > Lq:  # the padded logsumexp's rows past Lq: +inf, as `_attn_fwd_kernel` writes them
        lse[:, :, Lq:].fill_(float("inf"))

"""Attention forward: softmax(scale * Q K^T [+ causal mask]) V, flash-attention style.

Serves the op the recorder writes for `F.scaled_dot_product_attention`
(`aten.scaled_dot_product_attention`, recorded whole before the device picks a backend) and
the three backend ops PyTorch's dispatcher records under it:
`aten._scaled_dot_product_flash_attention` (CUDA), `aten._scaled_dot_product_efficient_attention`
(CUDA) and `aten._scaled_dot_product_flash_attention_for_cpu`.

One program owns BLOCK_M query rows of one (batch, query head) and walks the keys in blocks of
BLOCK_N with an online softmax in fp32 (running max m, running sum l, the output accumulator
rescaled by exp(m_old - m_new)); the scores are kept in base 2 (scale * log2(e) folded into one
multiplier) so the exponentials are exp2. The head dims D (queries, keys) and Dv (values) are
loaded in power-of-two blocks with masking, so D = 24, 80, 96 ... run in blocks of 32, 128, 128.
Grouped-query attention: query head h reads key/value head h // (Hq // Hkv).

Causal masking is torch's: the lower triangle aligned to the TOP-LEFT of the (Lq, Lk) score
matrix (query i sees keys j <= i), so a causal program stops at key min(Lk, row_end); every row
sees key 0, so no row is ever fully masked (also for Lq > Lk). Key blocks every row of the
program sees in full run without masks; the rest (the causal diagonal and the ragged key tail)
run masked.

Prefill configs may switch on the levers of Triton's fused-attention tutorial (constexprs,
certified only where they win): FMA (the scale folded into the exponent's subtraction), TMA
(K/V through tensor descriptors), WS (the unmasked loop warp-specialized), LPT (every
head's longest causal query block first) and PAIR (a long and a short causal query block per
program). Decode configs (SPLIT_KV) have none of them.

fp32 inputs multiply in IEEE fp32 (input_precision="ieee": both QK^T and PV), fp16/bf16 with
the default (tensor cores, fp32 accumulation), P cast to the input dtype before PV.

The kernel always writes the logsumexp (natural log of the row sums of exp of the scaled
scores, fp32): the ops that return it get it, the others pass a scratch row, so every op runs
the one code path a certificate was screened on. Rows [Lq, LSE_LEN) of the logsumexp get +inf,
the padding of the memory-efficient kernel's (B, H, ceil(Lq / 32) * 32) layout.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton before 3.4: no host-side descriptors, so no TMA configs (`no_tma`)
    TensorDescriptor = None

from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import format_shape
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, one_dtype, seat_flags
from nbx_tune.oracles import attention as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 256
MAX_GRID_Y = 65535  # the grid's second axis holds batch * query heads
INT32_MAX = 2**31 - 1
LSE_ALIGN = 32  # the memory-efficient kernel pads its logsumexp rows to a multiple of 32

SDPA = "aten.scaled_dot_product_attention"
FLASH = "aten._scaled_dot_product_flash_attention"
EFFICIENT = "aten._scaled_dot_product_efficient_attention"
FLASH_CPU = "aten._scaled_dot_product_flash_attention_for_cpu"


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


def _c(bm, bn, warps, stages, split=0, pack=1, tma=0, ws=0, fma=0, lpt=0, pair=0):
    extra = {"SPLIT_KV": split} if split else ({"PACK": pack} if pack > 1 else {})
    for name, on in (("TMA", tma), ("WS", ws), ("FMA", fma), ("LPT", lpt), ("PAIR", pair)):
        if on:
            extra[name] = 1
    return Config.make(BLOCK_M=bm, BLOCK_N=bn, **extra, num_warps=warps, num_stages=stages)


# BLOCK_M 16 for decode (Lq = 1..16: a taller tile is wasted rows); 32-64 for small-smem
# devices and head dim 256; 128 x 64/128 with 8 warps and 3-4 stages for Ampere/Hopper at
# D <= 128 (the shape of Triton's own fused-attention tutorial). 16 x 16 at one stage is the
# fallback that fits fp32 at D = 256 in 48 KB. The space is the same on every device: the
# shared-memory prune refuses the tiles a device cannot hold (e.g. 128 x 128 x 3 stages at
# D = 256).
CONFIGS = (
    _c(16, 16, 2, 1), _c(16, 32, 4, 2), _c(16, 64, 4, 2), _c(16, 128, 4, 2), _c(16, 128, 4, 3),
    _c(32, 32, 4, 2), _c(32, 64, 4, 2), _c(32, 64, 4, 3), _c(32, 128, 4, 2),
    _c(64, 32, 4, 2), _c(64, 32, 4, 3), _c(64, 64, 4, 2), _c(64, 64, 4, 3), _c(64, 64, 4, 4),
    _c(64, 128, 4, 2), _c(64, 128, 4, 3), _c(64, 128, 8, 3),
    _c(128, 32, 4, 2), _c(128, 32, 8, 3), _c(128, 64, 4, 3), _c(128, 64, 8, 2), _c(128, 64, 8, 3),
    _c(128, 64, 8, 4), _c(128, 128, 8, 2), _c(128, 128, 8, 3),
    # Decode (`_attn_decode_kernel`, at most DECODE_MAX_LQ queries): the query heads of a
    # key/value head packed into one tile's rows, the keys split SPLIT_KV ways so that a
    # batch of one still has B * Hkv * SPLIT_KV programs. (128-wide splits and a 64-wide
    # unsplit tile, never within 3 % of the best on the H200, are left out.)
    _c(16, 128, 4, 2, split=1), _c(16, 64, 4, 3, split=4), _c(16, 64, 4, 3, split=8),
    _c(16, 64, 4, 3, split=16), _c(32, 64, 4, 3, split=4),
    # Grouped-query prefill: PACK query heads of a key/value head in one program's rows, so
    # K/V tiles cross from L2 once per PACK heads. Refused where PACK does not divide the group.
    _c(64, 64, 4, 3, pack=2), _c(64, 64, 4, 3, pack=4), _c(128, 64, 8, 3, pack=2), _c(128, 64, 8, 3, pack=4),
    _c(128, 128, 8, 3, pack=4),
    # Prefill with the levers of Triton's fused-attention tutorial: FMA (the scale folded
    # into the exponent's subtraction), TMA (K/V through descriptors; refused without a TMA
    # unit), WS (the unmasked loop warp-specialized, with TMA), LPT (causal: every head's
    # longest query block first, one grid axis), PAIR (causal: a long and a short query block
    # per program); LPT and PAIR are refused where not causal.
    # 64-row tiles with 4 warps (one warp group) give a short prefill's few heads more
    # programs than SMs; 128-row tiles with 8 warps are the tutorial's.
    _c(64, 64, 4, 3, fma=1), _c(64, 64, 4, 4, fma=1), _c(64, 128, 4, 3, fma=1), _c(64, 64, 4, 3, fma=1, lpt=1),
    _c(64, 64, 4, 3, tma=1, fma=1), _c(64, 64, 4, 4, tma=1, fma=1), _c(64, 128, 4, 2, tma=1, fma=1),
    _c(64, 128, 4, 3, tma=1, fma=1), _c(64, 64, 4, 3, tma=1, fma=1, lpt=1), _c(64, 64, 4, 3, pack=4, tma=1, fma=1),
    _c(64, 64, 4, 3, tma=1, ws=1, fma=1),
    _c(128, 64, 8, 3, fma=1), _c(128, 128, 8, 2, fma=1), _c(128, 64, 8, 3, fma=1, lpt=1),
    _c(128, 64, 8, 3, tma=1, fma=1), _c(128, 64, 8, 4, tma=1, fma=1),
    _c(128, 128, 8, 2, tma=1, fma=1), _c(128, 128, 8, 3, tma=1, fma=1),
    _c(128, 64, 8, 3, tma=1, fma=1, lpt=1), _c(128, 128, 8, 2, tma=1, fma=1, lpt=1),
    _c(128, 64, 8, 3, pack=4, tma=1, fma=1), _c(128, 64, 8, 3, pack=4, tma=1, fma=1, lpt=1),
    _c(128, 128, 8, 2, pack=2, tma=1, fma=1, lpt=1),
    _c(128, 64, 8, 3, tma=1, ws=1, fma=1), _c(128, 128, 8, 2, tma=1, ws=1, fma=1),
    _c(128, 64, 8, 3, tma=1, ws=1, fma=1, lpt=1),
    _c(64, 64, 4, 3, tma=1, fma=1, pair=1), _c(128, 64, 8, 3, fma=1, pair=1), _c(128, 64, 8, 3, tma=1, fma=1, pair=1),
    _c(128, 128, 8, 2, tma=1, fma=1, pair=1), _c(128, 64, 8, 3, pack=4, tma=1, fma=1, pair=1),
)
DECODE_MAX_LQ = 16

# Served when a seat has no certificate: the first that fits the device.
DEFAULTS = (_c(128, 64, 8, 3), _c(64, 64, 4, 2), _c(64, 32, 4, 2), _c(32, 32, 4, 2), _c(16, 16, 2, 1))

# Params each op's schema has, besides the tensors (a row naming another is not served).
_PARAMS = {
    SDPA: {"attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"},
    FLASH: {"dropout_p", "is_causal", "return_debug_mask", "scale"},
    EFFICIENT: {"attn_bias", "compute_log_sumexp", "dropout_p", "is_causal", "scale"},
    FLASH_CPU: {"dropout_p", "is_causal", "attn_mask", "scale"},
}
_MASK_PARAM = {SDPA: "attn_mask", EFFICIENT: "attn_bias", FLASH_CPU: "attn_mask"}


class AttentionSpec(KernelSpec):
    name = "attention"
    ops = (SDPA, FLASH, EFFICIENT, FLASH_CPU)
    # BH = batch * query heads (the grid's second axis: how many programs run at short
    # sequences), Lq (query blocks, and for causal the triangle's size), Lk (the key loop's
    # length), D and Dv (the head dims: the tile widths, registers and shared memory of a
    # config; the `default` ladder is exact up to 64 and 16 wide above, and no 16-wide bucket
    # straddles a power of two, so every problem of a seat loads its head dims in the same
    # power-of-two blocks and has the same shared-memory need).
    key = (KeyDim("BH"), KeyDim("Lq"), KeyDim("Lk"), KeyDim("D"), KeyDim("Dv"))
    dtypes = tuple(TORCH_DTYPES)
    description = "flash-attention forward (online softmax), causal or not, GQA, head dims 1..256"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def static_refusal(self, profile, config, problem):
        pack = config.kwargs.get("PACK", 1)
        if pack > 1 and (problem.get("Hq") // problem.get("Hkv")) % pack:
            return ("not_applicable", f"PACK {pack} query heads per program: the group is "
                                      f"{problem.get('Hq') // problem.get('Hkv')} heads")
        if config.kwargs.get("TMA"):
            if TensorDescriptor is None:
                return ("no_tma", f"TMA loads need host-side tensor descriptors, which Triton "
                                  f"{triton.__version__} lacks (3.4 and later have them)")
            if not profile.has_tma:
                return ("no_tma", f"TMA loads need an NVIDIA sm_90 or later device; profile {profile.name} has none")
            esize = DTYPE_BYTES[problem.dtypes[0]]
            dims = [d for d in problem.dims[3:] if d * esize % 16]
            if dims:
                return ("not_applicable", f"TMA: a row of head dim {dims[0]} is not a multiple of 16 bytes "
                                          "(each call would read a copy)")
        elif config.kwargs.get("WS"):
            return ("not_applicable", "WS without TMA: warp specialization needs TMA loads")
        for lever in ("LPT", "PAIR"):
            if config.kwargs.get(lever) and dict(problem.flags)["causal"] != "1":
                return ("not_applicable", f"{lever} balances causal query blocks; not causal")
        sk = config.kwargs.get("SPLIT_KV")
        if sk is not None:
            _, Lq, Lk, _, _ = problem.dims
            causal = dict(problem.flags)["causal"] == "1"
            if Lq > DECODE_MAX_LQ:
                return ("not_applicable", f"the decode kernel is for at most {DECODE_MAX_LQ} queries, Lq is {Lq}")
            if sk > 1 and (causal or Lk < 2 * sk * config["BLOCK_N"]):
                keys = f"causal: at most Lq = {Lq} keys seen" if causal else f"Lk {Lk}"
                return ("not_applicable", f"SPLIT_KV {sk} of {config['BLOCK_N']}-key blocks: {keys}, "
                                          "fewer than 2 blocks per slice")
        return super().static_refusal(profile, config, problem)

    def smem_bytes(self, config, problem):
        # The pipeliner keeps num_stages copies of a K tile (BLOCK_N x BLOCK_D) and a V tile
        # (BLOCK_N x BLOCK_DV); the Q tile (BLOCK_M x BLOCK_D) is staged once for the dot.
        # The row max / row sum reduce within a warp (MMA layout): no cross-warp scratch.
        _, _, _, D, Dv = problem.dims
        esize = DTYPE_BYTES[problem.dtypes[0]]
        bd, bdv = _block(D), _block(Dv)
        stages = max(config.num_stages, 1)
        return (stages * config["BLOCK_N"] * (bd + bdv) + config["BLOCK_M"] * bd) * esize

    def source_parts(self):
        return (_attn_step, _attn_fwd_rows, _attn_fwd_kernel, launch_attention, _tma_strides, kv_descriptors,
                _attn_decode_kernel, _attn_combine_kernel, launch_attention_decode, _block)

    # -- example rows
    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        rows = []
        for dt in self.dtypes:
            d3 = [dt] * 3
            if scale == "small":
                rows += [
                    # Square causal, D = 16, two batches.
                    make_row(FLASH, d3, [(2, 2, 37, 16)] * 3, {"is_causal": "True"}),
                    # GQA (4 query heads on 2 kv heads), Lq != Lk, D = 24, a custom scale.
                    make_row(FLASH, d3, [(1, 4, 19, 24), (1, 2, 45, 24), (1, 2, 45, 24)],
                             {"scale": "0.3"}),
                    # Causal with Lq < Lk, D = 80, with the padded logsumexp.
                    make_row(EFFICIENT, d3, [(1, 2, 29, 80), (1, 2, 41, 80), (1, 2, 41, 80)],
                             {"attn_bias": "None", "compute_log_sumexp": "True", "is_causal": "True"}),
                    # Causal with Lq > Lk (rows past Lk see every key), Dv != D, no logsumexp.
                    make_row(EFFICIENT, d3, [(1, 3, 45, 16), (1, 3, 23, 16), (1, 3, 23, 24)],
                             {"attn_bias": "None", "compute_log_sumexp": "False", "is_causal": "True"}),
                    # GQA causal with Lq != Lk and a custom scale on the CPU backend op.
                    make_row(FLASH_CPU, d3, [(1, 4, 33, 24), (1, 2, 21, 24), (1, 2, 21, 24)],
                             {"is_causal": "True", "attn_mask": "None", "scale": "0.25"}),
                    make_row(FLASH_CPU, d3, [(2, 2, 27, 40)] * 3, {"attn_mask": "None"}),
                    # The recorded whole op: GQA causal, Lq != Lk.
                    make_row(SDPA, d3, [(1, 4, 23, 32), (1, 2, 39, 32), (1, 2, 39, 32)],
                             {"attn_mask": "None", "is_causal": "True", "enable_gqa": "True"}),
                    make_row(SDPA, d3, [(1, 2, 21, 80)] * 3, {"attn_mask": "None", "scale": "0.125"}),
                ]
            else:
                kv8 = (1, 8, 1024, 128)
                rows += [
                    # Llama-2-7B prefill at 512.
                    make_row(SDPA, d3, [(1, 32, 512, 128)] * 3, {"attn_mask": "None", "is_causal": "True"}),
                    # Llama-3-8B-like GQA: 32 query heads on 8 kv heads.
                    make_row(SDPA, d3, [(1, 32, 1024, 128), kv8, kv8],
                             {"attn_mask": "None", "is_causal": "True", "enable_gqa": "True"}),
                    # GPT-2-like, not causal.
                    make_row(SDPA, d3, [(4, 12, 1024, 64)] * 3, {"attn_mask": "None"}),
                    # Decode: one query against 4096 cached keys, GQA.
                    make_row(SDPA, d3, [(1, 32, 1, 128), (1, 8, 4096, 128), (1, 8, 4096, 128)],
                             {"attn_mask": "None", "enable_gqa": "True"}),
                    # Phi-2-like D = 80, causal, an odd length.
                    make_row(FLASH, d3, [(2, 32, 777, 80)] * 3, {"is_causal": "True"}),
                    # D = 96, not causal, with the padded logsumexp, odd lengths.
                    make_row(EFFICIENT, d3, [(2, 16, 333, 96), (2, 16, 517, 96), (2, 16, 517, 96)],
                             {"attn_bias": "None", "compute_log_sumexp": "True"}),
                    # Gemma-like D = 256, causal, Lq < Lk.
                    make_row(EFFICIENT, d3, [(1, 8, 1000, 256), (1, 8, 1100, 256), (1, 8, 1100, 256)],
                             {"attn_bias": "None", "compute_log_sumexp": "True", "is_causal": "True"}),
                    make_row(FLASH_CPU, d3, [(1, 8, 300, 64)] * 3,
                             {"is_causal": "True", "attn_mask": "None"}),
                ]
        return rows

    # -- trace rows -> problems
    def problem_from_row(self, row):
        op = row.base_op
        allowed = _PARAMS.get(op)
        if allowed is None:
            return NotServable(f"{op} is not an attention op")
        unknown = sorted(set(row.params) - allowed)
        if unknown:
            return NotServable(f"{op}: unknown param(s) {', '.join(unknown)}")
        mask_param = _MASK_PARAM.get(op)
        if len(row.shapes) != 3:
            what = f" ({mask_param} given)" if mask_param and len(row.shapes) == 4 else ""
            return NotServable(f"{op}: serves query, key and value only, the row has "
                               f"{len(row.shapes)} tensors{what}")
        if mask_param and row.params.get(mask_param, "None") != "None":
            return NotServable(f"{op}: {mask_param}={row.params[mask_param]} is not served")
        dtype = one_dtype(row, TORCH_DTYPES)
        if isinstance(dtype, NotServable):
            return dtype
        try:
            dropout = row.params.float("dropout_p", 0.0)
            causal = row.params.bool("is_causal", False)
            scale = row.params.float("scale", None)
            gqa = row.params.bool("enable_gqa", False)
            debug = row.params.bool("return_debug_mask", False)
            want_lse = row.params.bool("compute_log_sumexp", None)
        except ValueError as e:
            return NotServable(f"{op}: bad param: {e}")
        if dropout != 0.0:
            return NotServable(f"dropout_p={dropout}: dropout is random, a certified kernel is not")
        if debug:
            return NotServable("return_debug_mask=True (the debug attention mask) is not served")
        if op == EFFICIENT and want_lse is None:
            return NotServable(f"{op}: compute_log_sumexp is required")
        qs, ks, vs = row.shapes
        if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
            return NotServable(f"query, key and value must be 4-D (batch, heads, seq, dim), got "
                               f"{format_shape(qs)}, {format_shape(ks)}, {format_shape(vs)}")
        B, Hq, Lq, D = qs
        Bk, Hkv, Lk, Dk = ks
        if ks[:3] != vs[:3]:
            return NotServable(f"key {format_shape(ks)} and value {format_shape(vs)} differ in batch, heads or length")
        Dv = vs[3]
        if Bk != B:
            return NotServable(f"query batch {B} != key batch {Bk}")
        if Dk != D:
            return NotServable(f"query head dim {D} != key head dim {Dk}")
        if min(B, Hq, Lq, D, Hkv, Lk, Dv) == 0:
            return NotServable("an empty tensor: nothing to launch")
        if Hkv != Hq:
            if Hkv > Hq or Hq % Hkv:
                return NotServable(f"key/value heads {Hkv} do not divide query heads {Hq}")
            if op == SDPA and not gqa:
                return NotServable(f"{Hkv} key/value heads for {Hq} query heads needs enable_gqa=True")
        if op in (FLASH, FLASH_CPU) and Dv != D:
            return NotServable(f"{op} needs one head dim for query, key and value, got {D} and {Dv}")
        if op == FLASH and causal and Lq != Lk:
            # PyTorch's CUDA flash kernel (flash-attn 2) aligns the causal mask to the
            # bottom-right when Lq != Lk; sdpa never routes such a call to it.
            return NotServable(f"{op} with is_causal and Lq {Lq} != Lk {Lk}: the CUDA flash "
                               "kernel aligns the mask bottom-right, this kernel top-left")
        if max(D, Dv) > MAX_HEAD_DIM:
            return NotServable(f"head dim {max(D, Dv)} > {MAX_HEAD_DIM}")
        if B * Hq > MAX_GRID_Y:
            return NotServable(f"batch x heads {B * Hq} > {MAX_GRID_Y} (the grid's second axis)")
        if max(Lq * D, Lk * D, Lk * Dv, Lq * Dv) > INT32_MAX:
            return NotServable("one head's slab holds 2^31 elements or more (indexed in int32)")
        if scale is None:
            scale = 1.0 / math.sqrt(D)
        if not math.isfinite(scale):
            return NotServable(f"scale={scale} is not finite")
        if op == SDPA:
            lse = "none"
        elif op == EFFICIENT:
            lse = "pad32" if want_lse else "none"
        else:
            lse = "exact"
        extra = (("B", B), ("Hkv", Hkv), ("Hq", Hq), ("lse", lse), ("scale", scale))
        return Problem(self.name, (dtype,), seat_flags(causal=int(causal)), (B * Hq, Lq, Lk, D, Dv),
                       extra)

    def resized(self, problem, dims):
        # The sequence lengths only: batch x heads and the head dims stay (the extra holds
        # them); a causal mask over a square stays square.
        BH, _, _, D, Dv = problem.dims
        Lq, Lk = dims[1], dims[2]
        if dict(problem.flags)["causal"] == "1" and (Lq == Lk) != (problem.dims[1] == problem.dims[2]):
            return None
        if max(Lq * D, Lk * D, Lk * Dv, Lq * Dv) > INT32_MAX:
            return None
        return Problem(problem.kernel, problem.dtypes, problem.flags, (BH, Lq, Lk, D, Dv), problem.extra)

    # -- inputs, oracle, outputs, launch
    def input_shapes(self, problem):
        _, Lq, Lk, D, Dv = problem.dims
        B, Hq, Hkv = problem.get("B"), problem.get("Hq"), problem.get("Hkv")
        dt = problem.dtypes[0]
        return {"q": ((B, Hq, Lq, D), dt), "k": ((B, Hkv, Lk, D), dt), "v": ((B, Hkv, Lk, Dv), dt)}

    def make_inputs(self, problem, rng):
        # Standard normal: with the default scale the scores are ~N(0, 1), a softmax neither
        # flat nor one-hot; a custom scale sharpens or flattens it.
        return {name: (rng.standard_normal(shape), dt)
                for name, (shape, dt) in self.input_shapes(problem).items()}

    def oracle(self, problem, inputs):
        causal = dict(problem.flags)["causal"] == "1"
        scale = problem.get("scale")
        mode = problem.get("lse")
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        if mode == "none":
            return {"out": oracle.scaled_dot_product_attention(q, k, v, causal, scale)}
        if mode == "pad32":
            out, lse = oracle.efficient_attention(q, k, v, causal, scale, compute_log_sumexp=True)
        else:
            out, lse = oracle.flash_attention(q, k, v, causal, scale)
        return {"out": out, "lse": lse}

    def output_specs(self, problem):
        _, Lq, _, _, Dv = problem.dims
        B, Hq = problem.get("B"), problem.get("Hq")
        specs = {"out": ((B, Hq, Lq, Dv), problem.dtypes[0])}
        mode = problem.get("lse")
        if mode == "exact":
            specs["lse"] = ((B, Hq, Lq), "float32")
        elif mode == "pad32":
            specs["lse"] = ((B, Hq, -(-Lq // LSE_ALIGN) * LSE_ALIGN), "float32")
        return specs

    def serve_ops(self):
        return {SDPA: _serve_sdpa}

    def launch(self, config, problem, inputs, outputs):
        q = inputs["q"]
        lse = outputs.get("lse")
        if lse is None:  # the op does not return it: the kernel writes a scratch row
            B, Hq, Lq = q.shape[:3]
            lse = torch.empty((B, Hq, Lq), dtype=torch.float32, device=q.device)
        launch_attention(q, inputs["k"], inputs["v"], outputs["out"], lse, problem.get("scale"),
                         dict(problem.flags)["causal"] == "1", config)


SPEC = AttentionSpec()


# ----------------------------------------------------------------------------- public ops

REMEMBERED, tensor_key = launch.REMEMBERED, launch.tensor_key
_DTYPE_NAMES = {v: (k,) for k, v in TORCH_DTYPES.items()}
_CAUSAL = seat_flags(causal=1)
_NOT_CAUSAL = seat_flags(causal=0)


def _span(t) -> int:
    """The largest element offset inside one (batch, head) slab of a 4-D tensor."""
    return (t.shape[2] - 1) * abs(t.stride(2)) + (t.shape[3] - 1) * abs(t.stride(3))


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(scale * q k^T [causal]) v, as torch.nn.functional.scaled_dot_product_attention
    with attn_mask=None, dropout_p=0 (and enable_gqa=True when k and v have fewer heads).

    q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); Hkv divides Hq; D, Dv <= 256.
    is_causal masks top-left (query i sees keys j <= i); scale defaults to 1 / sqrt(D).
    Returns (B, Hq, Lq, Dv) in q's dtype, with the certified config of its seat."""
    # The direct launch (kernels/runtime/launch.py): a call whose key was seen replays its kernel.
    try:
        key = (SPEC, is_causal, scale, q.shape, q.stride(), q.dtype, q.device, q.data_ptr() & 15,
               tensor_key(k), tensor_key(v))
    except AttributeError:  # not tensors: the checks say so
        return _attention(q, k, v, is_causal, scale)
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(q, k, v)
    return launch.remember(key, (q, k, v), _attention, q, k, v, is_causal, scale)


def _attention(q, k, v, is_causal, scale):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise KernelError(f"attention: expected 4-D query, key, value, got {tuple(q.shape)}, "
                          f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    Dv = v.shape[3]
    if (k.shape[0] != B or v.shape[0] != B or v.shape[1] != Hkv or v.shape[2] != Lk
            or k.shape[3] != D or Hkv == 0 or Hq % Hkv):
        raise KernelError(f"attention: shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)} "
                          "do not fit (B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv), Hkv | Hq")
    dtypes = _DTYPE_NAMES.get(q.dtype)
    if dtypes is None or k.dtype != q.dtype or v.dtype != q.dtype:
        raise KernelError(f"attention: dtypes {q.dtype}, {k.dtype}, {v.dtype}: one of float16, "
                          "bfloat16, float32 for all three")
    if max(D, Dv) > MAX_HEAD_DIM:
        raise KernelError(f"attention: head dim {max(D, Dv)} > {MAX_HEAD_DIM}")
    if B * Hq > MAX_GRID_Y:
        raise KernelError(f"attention: batch x heads {B * Hq} > {MAX_GRID_Y}")
    if max(_span(q), _span(k), _span(v)) > INT32_MAX:
        raise KernelError("attention: one head's slab spans 2^31 elements or more")
    # In (B, Lq, Hq, Dv) memory order, as torch's fused CUDA kernels return it: a model's
    # `.transpose(1, 2).contiguous()` after attention is then a view, not a copy.
    out = launch.empty((B, Hq, Lq, Dv), q.dtype, q.device, (Lq * Hq * Dv, Dv, Hq * Dv, 1))
    if out.numel() == 0:
        return out
    if Lk == 0:  # torch: no keys, a zero output
        return out.zero_()
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    config = config_for(SPEC, dtypes, _CAUSAL if is_causal else _NOT_CAUSAL, (B * Hq, Lq, Lk, D, Dv))
    lse = launch.scratch((B, Hq, Lq), torch.float32, q.device)  # not returned: nothing reads it
    launch_attention(q, k, v, out, lse, scale, bool(is_causal), config)
    return out


def _serve_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                enable_gqa=False):
    """aten.scaled_dot_product_attention's arguments, for serve()."""
    if attn_mask is not None:
        raise KernelError("attention: attn_mask is not served")
    if dropout_p != 0.0:
        raise KernelError(f"attention: dropout_p={dropout_p} is not served")
    if not enable_gqa and key.dim() == 4 and query.dim() == 4 and key.shape[1] != query.shape[1]:
        raise KernelError("attention: key/value heads differ from the query's without enable_gqa")
    return scaled_dot_product_attention(query, key, value, is_causal, scale)

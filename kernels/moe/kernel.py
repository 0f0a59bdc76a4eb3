"""The grouped expert GEMM kernels of a mixture-of-experts layer and their launcher: what
decides the code a seat runs (every function here is in the spec's `source_parts`).

A layer is four launches, whatever the number of experts:
1. `_moe_align_kernel` (one program): the (token, slot) pairs sorted by expert, each expert's
   run padded to a multiple of BLOCK_M with a sentinel, and the expert of each row block;
2. `_moe_gate_up_kernel`: per row block, x @ W_gate[e]^T and x @ W_up[e]^T in two
   accumulators and silu(gate) * up in the epilogue, written in sorted order;
3. `_moe_down_kernel`: that @ W_down[e]^T times the pair's routing weight, in fp32, written
   at the pair's own row;
4. `_moe_topk_sum_kernel`: each token's top-k rows summed and rounded once.
The grids are sized from the pair count alone (no host sync: CUDA graphs capture it); row
blocks past the padded end exit at once. An expert id outside [0, E) (transformers' expert
parallel sentinel is E) contributes nothing, as in transformers' expert loop.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nbx_tune.kernels.elementwise import _unary_math
from nbx_tune.kernels.matmul.kernel import grouped_tile

SUM_BLOCK = 512  # columns a program of the top-k sum adds: a memory-bound pass, not tuned


@triton.jit
def _moe_align_kernel(ids_ptr, sorted_ptr, block_expert_ptr, n_blocks_ptr, S, E, ROWS, MAX_BLOCKS,
                      BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr):
    """One program: counts per expert, padded starts, then each pair's sorted row (its rank
    among the earlier pairs of its expert, so the order is stable), the sentinel S in the padding."""
    experts = tl.arange(0, E_PAD)
    lanes = tl.arange(0, CHUNK)
    counts = tl.zeros((E_PAD,), dtype=tl.int32)
    for c in range(0, tl.cdiv(S, CHUNK)):
        offs = c * CHUNK + lanes
        e = tl.load(ids_ptr + offs, mask=offs < S, other=-1).to(tl.int32)
        counts += tl.sum((e[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    pad_start = pad_end - padded
    for c in range(0, tl.cdiv(ROWS, CHUNK)):
        offs = c * CHUNK + lanes
        tl.store(sorted_ptr + offs, tl.zeros((CHUNK,), dtype=tl.int32) + S, mask=offs < ROWS)
    for c in range(0, tl.cdiv(MAX_BLOCKS, CHUNK)):
        blocks = c * CHUNK + lanes
        owner = tl.sum((pad_end[None, :] <= (blocks * BLOCK_M)[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + blocks, owner, mask=blocks < MAX_BLOCKS)
    tl.store(n_blocks_ptr, tl.sum(padded, axis=0) // BLOCK_M)
    tl.debug_barrier()  # the sentinel fill lands before the scatter below overwrites it
    seen = tl.zeros((E_PAD,), dtype=tl.int32)
    for c in range(0, tl.cdiv(S, CHUNK)):
        offs = c * CHUNK + lanes
        e = tl.load(ids_ptr + offs, mask=offs < S, other=-1).to(tl.int32)
        hot = e[:, None] == experts[None, :]
        before = tl.cumsum(hot.to(tl.int32), axis=0) - 1 + seen[None, :]
        dest = tl.sum(tl.where(hot, before + pad_start[None, :], 0), axis=1)
        routed = (offs < S) & (e >= 0) & (e < E)
        tl.store(sorted_ptr + dest, offs, mask=routed)
        seen += tl.sum(hot.to(tl.int32), axis=0)


@triton.jit
def _row_block(pid_m, sorted_ptr, block_expert_ptr, S, BLOCK_M: tl.constexpr):
    """A row block's expert, its rows in the sorted order, the pairs there and which are real."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + rows)
    return tl.load(block_expert_ptr + pid_m).to(tl.int64), rows, pair, pair < S


@triton.jit
def _moe_gate_up_kernel(x_ptr, w_ptr, act_ptr, sorted_ptr, block_expert_ptr, n_blocks_ptr,
                        S, H, I, TOPK, MAX_BLOCKS,
                        stride_xm, stride_we, stride_wn, stride_am,
                        INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """act[row] = silu(x[t] @ W[e, :I]^T) * (x[t] @ W[e, I:]^T) for the pairs of a row block
    (t the pair's token, e its expert); W is (E, 2I, H) with rows contiguous."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), MAX_BLOCKS, tl.cdiv(I, BLOCK_N), GROUP_M)
    if pid_m >= tl.load(n_blocks_ptr):
        return
    e, rows, pair, valid = _row_block(pid_m, sorted_ptr, block_expert_ptr, S, BLOCK_M)
    tok = tl.where(valid, pair // TOPK, 0).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tok[:, None] * stride_xm + rk[None, :]
    g_ptrs = w_ptr + e * stride_we + (rn % I)[None, :] * stride_wn + rk[:, None]  # columns past I wrap
    u_ptrs = g_ptrs + I * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(H, BLOCK_K)):
        k_left = H - k * BLOCK_K
        a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
        g = tl.load(g_ptrs, mask=rk[:, None] < k_left, other=0.0)
        u = tl.load(u_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc_g = tl.dot(a, g, acc_g, input_precision=INPUT_PRECISION)
        acc_u = tl.dot(a, u, acc_u, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    y = _unary_math(acc_g, 0.0, 0.0, 0.0, "silu") * acc_u
    out = act_ptr + rows.to(tl.int64)[:, None] * stride_am + rn[None, :]
    tl.store(out, y.to(act_ptr.dtype.element_ty), mask=valid[:, None] & (rn[None, :] < I))


@triton.jit
def _moe_down_kernel(act_ptr, w_ptr, y_ptr, weights_ptr, sorted_ptr, block_expert_ptr, n_blocks_ptr,
                     S, H, I, MAX_BLOCKS,
                     stride_am, stride_we, stride_wn, stride_ym,
                     INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """y[pair] = weight[pair] * (act[row] @ W[e]^T) in fp32; W is (E, H, I) with rows contiguous.
    Padding rows of act were never written: their products are never stored."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), MAX_BLOCKS, tl.cdiv(H, BLOCK_N), GROUP_M)
    if pid_m >= tl.load(n_blocks_ptr):
        return
    e, rows, pair, valid = _row_block(pid_m, sorted_ptr, block_expert_ptr, S, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + rows.to(tl.int64)[:, None] * stride_am + rk[None, :]
    b_ptrs = w_ptr + e * stride_we + (rn % H)[None, :] * stride_wn + rk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(I, BLOCK_K)):
        k_left = I - k * BLOCK_K
        a = tl.load(a_ptrs, mask=valid[:, None] & (rk[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    safe = tl.where(valid, pair, 0).to(tl.int64)
    acc = acc * tl.load(weights_ptr + safe, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(y_ptr + safe[:, None] * stride_ym + rn[None, :], acc, mask=valid[:, None] & (rn[None, :] < H))


@triton.jit
def _moe_topk_sum_kernel(y_ptr, ids_ptr, out_ptr, H, E, TOPK, BLOCK: tl.constexpr):
    """out[t] = sum over the token's routed slots of y[t * TOPK + j], rounded once; a slot
    whose expert is out of range was never written and is skipped."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in range(0, TOPK):
        e = tl.load(ids_ptr + t * TOPK + j)
        if (e >= 0) & (e < E):
            acc += tl.load(y_ptr + (t * TOPK + j) * H + cols, mask=cols < H, other=0.0)
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < H)


def max_blocks(pairs: int, experts: int, block_m: int) -> int:
    """Row blocks the padded order can take: each expert with pairs pads fewer than BLOCK_M
    rows, and at most min(E, pairs) experts have any. The grids are sized by it."""
    return -(-pairs // block_m) + min(experts, pairs)


def align_chunk(e_pad: int) -> int:
    return max(16, min(128, 8192 // e_pad))  # a (CHUNK, E_PAD) one-hot of at most 8192 lanes


def launch_moe(hidden, w_gate_up, w_down, topk_ids, topk_weights, out, config) -> None:
    """out (T, H) = the routed experts' SwiGLU MLPs of hidden (T, H), weighted and summed over
    each token's top-k; every tensor contiguous, the routing (T, TOPK)."""
    T, H = hidden.shape
    E, I2, _ = w_gate_up.shape
    I, TOPK = I2 // 2, topk_ids.shape[1]
    S = T * TOPK
    bm, bn, bk, group = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["GROUP_M"]
    blocks = max_blocks(S, E, bm)
    dev = hidden.device
    ids = topk_ids.reshape(-1)
    sorted_ids = torch.empty(blocks * bm, dtype=torch.int32, device=dev)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=dev)
    n_blocks = torch.empty(1, dtype=torch.int32, device=dev)
    e_pad = triton.next_power_of_2(E)
    _moe_align_kernel[(1,)](ids, sorted_ids, block_expert, n_blocks, S, E, blocks * bm, blocks,
                            BLOCK_M=bm, E_PAD=e_pad, CHUNK=align_chunk(e_pad), num_warps=4)
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"
    opts = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    act = torch.empty((blocks * bm, I), dtype=hidden.dtype, device=dev)
    _moe_gate_up_kernel[(blocks * triton.cdiv(I, bn),)](
        hidden, w_gate_up, act, sorted_ids, block_expert, n_blocks, S, H, I, TOPK, blocks,
        hidden.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), act.stride(0),
        INPUT_PRECISION=precision, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, **opts)
    y = torch.empty((S, H), dtype=torch.float32, device=dev)
    _moe_down_kernel[(blocks * triton.cdiv(H, bn),)](
        act, w_down, y, topk_weights.reshape(-1), sorted_ids, block_expert, n_blocks, S, H, I, blocks,
        act.stride(0), w_down.stride(0), w_down.stride(1), y.stride(0),
        INPUT_PRECISION=precision, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, **opts)
    _moe_topk_sum_kernel[(T, triton.cdiv(H, SUM_BLOCK))](y, ids, out, H, E, TOPK, BLOCK=SUM_BLOCK, num_warps=4)

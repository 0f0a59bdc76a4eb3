"""The grouped expert GEMM kernels of a mixture-of-experts layer and their launcher: what
decides the code a seat runs (every function here is in the spec's `source_parts`).

A layer is five launches and a memset, whatever the number of experts:
1. `_moe_count_kernel`: per chunk of pairs, its pairs of each expert (a table) and the
   expert totals;
2. `_moe_scatter_kernel`: the (token, slot) pairs in a stable expert order, each expert's run
   padded to a multiple of BLOCK_M rows; every later program reads the E totals and finds its
   run from them;
3. `_moe_gate_up_kernel`: per row block, x @ W_gate[e]^T and x @ W_up[e]^T in two
   accumulators and silu(gate) * up in the epilogue, written in sorted order;
4. `_moe_down_kernel`: that @ W_down[e]^T times the pair's routing weight, in fp32, written
   at the pair's own row;
5. `_moe_topk_sum_kernel`: each token's top-k rows summed and rounded once.
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
def _moe_count_kernel(ids_ptr, counts_ptr, chunk_counts_ptr, S, E, E_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """Per chunk of BLOCK pairs: its pairs of each expert, a row of the chunk table, and added
    to the expert totals (integer atomics: the totals are the same in any order)."""
    c = tl.program_id(0)
    experts = tl.arange(0, E_PAD)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    e = tl.load(ids_ptr + offs, mask=offs < S, other=-1)
    hot = (e[:, None] == experts[None, :]) & (experts[None, :] < E)
    n = tl.sum(hot.to(tl.int32), axis=0)
    tl.store(chunk_counts_ptr + c * E_PAD + experts, n)
    tl.atomic_add(counts_ptr + experts, n, mask=experts < E)


@triton.jit
def _expert_runs(counts_ptr, E, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr):
    """Per expert (E_PAD lanes): its pair count and where its run, padded to BLOCK_M rows,
    starts and ends in the sorted order."""
    experts = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + experts, mask=experts < E, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    return experts, counts, pad_end - padded, pad_end


@triton.jit
def _moe_scatter_kernel(ids_ptr, counts_ptr, chunk_counts_ptr, sorted_ptr, S, E, BLOCK_M: tl.constexpr,
                        E_PAD: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """Each pair of a chunk at its sorted row: the start of its expert's run, plus the expert's
    pairs in earlier chunks (the chunk table's rows above, ROWS at a time), plus those before
    it in the chunk. The order is stable: by expert, then by pair."""
    c = tl.program_id(0)
    experts, _, pad_start, _ = _expert_runs(counts_ptr, E, BLOCK_M, E_PAD)
    lines = tl.arange(0, ROWS)
    for r0 in range(0, c, ROWS):
        above = tl.load(chunk_counts_ptr + (r0 + lines)[:, None] * E_PAD + experts[None, :],
                        mask=(r0 + lines < c)[:, None], other=0)
        pad_start += tl.sum(above, axis=0)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    e = tl.load(ids_ptr + offs, mask=offs < S, other=-1)
    routed = (offs < S) & (e >= 0) & (e < E)
    hot = (e[:, None] == experts[None, :]) & routed[:, None]
    before = tl.cumsum(hot.to(tl.int32), axis=0) - 1
    dest = tl.sum(tl.where(hot, before + pad_start[None, :], 0), axis=1)
    tl.store(sorted_ptr + dest, offs, mask=routed)


@triton.jit
def _row_block(pid_m, sorted_ptr, counts_ptr, E, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr):
    """Row block pid_m of the sorted order: how many blocks hold rows, its expert, its rows,
    the pairs there and which rows hold one (the others are its expert's padding)."""
    experts, counts, pad_start, pad_end = _expert_runs(counts_ptr, E, BLOCK_M, E_PAD)
    row0 = pid_m * BLOCK_M
    e = tl.sum((pad_end <= row0).to(tl.int32), axis=0)
    start = tl.sum(tl.where(experts == e, pad_start, 0), axis=0)
    rows = row0 + tl.arange(0, BLOCK_M)
    valid = rows - start < tl.sum(tl.where(experts == e, counts, 0), axis=0)
    pair = tl.load(sorted_ptr + rows, mask=valid, other=0)
    return tl.max(pad_end, axis=0) // BLOCK_M, e.to(tl.int64), rows, pair, valid


@triton.jit
def _moe_gate_up_kernel(x_ptr, w_ptr, act_ptr, sorted_ptr, counts_ptr,
                        E, H, I, TOPK, MAX_BLOCKS,
                        stride_xm, stride_we, stride_wn, stride_am,
                        INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, E_PAD: tl.constexpr):
    """act[row] = silu(x[t] @ W[e, :I]^T) * (x[t] @ W[e, I:]^T) for the pairs of a row block
    (t the pair's token, e its expert); W is (E, 2I, H) with rows contiguous."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), MAX_BLOCKS, tl.cdiv(I, BLOCK_N), GROUP_M)
    n_blocks, e, rows, pair, valid = _row_block(pid_m, sorted_ptr, counts_ptr, E, BLOCK_M, E_PAD)
    if pid_m >= n_blocks:
        return
    tok = (pair // TOPK).to(tl.int64)  # token 0 on padding rows: read, never stored
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
def _moe_down_kernel(act_ptr, w_ptr, y_ptr, weights_ptr, sorted_ptr, counts_ptr,
                     E, H, I, MAX_BLOCKS,
                     stride_am, stride_we, stride_wn, stride_ym,
                     INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, E_PAD: tl.constexpr):
    """y[pair] = weight[pair] * (act[row] @ W[e]^T) in fp32; W is (E, H, I) with rows contiguous.
    Padding rows of act were never written: they are read as zeros and never stored."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), MAX_BLOCKS, tl.cdiv(H, BLOCK_N), GROUP_M)
    n_blocks, e, rows, pair, valid = _row_block(pid_m, sorted_ptr, counts_ptr, E, BLOCK_M, E_PAD)
    if pid_m >= n_blocks:
        return
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
    pair = pair.to(tl.int64)
    acc = acc * tl.load(weights_ptr + pair, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(y_ptr + pair[:, None] * stride_ym + rn[None, :], acc, mask=valid[:, None] & (rn[None, :] < H))


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


def scatter_block(e_pad: int) -> int:
    """Pairs a chunk holds (and chunk-table rows the scatter sums at a time): (BLOCK, E_PAD)
    one-hots of at most 8192 lanes."""
    return max(16, min(1024, 8192 // e_pad))


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
    e_pad = triton.next_power_of_2(E)
    sb = scatter_block(e_pad)
    chunks = triton.cdiv(S, sb)
    counts = torch.zeros(E, dtype=torch.int32, device=dev)
    chunk_counts = torch.empty((chunks, e_pad), dtype=torch.int32, device=dev)
    sorted_ids = torch.empty(blocks * bm, dtype=torch.int32, device=dev)
    _moe_count_kernel[(chunks,)](ids, counts, chunk_counts, S, E, E_PAD=e_pad, BLOCK=sb, num_warps=4)
    _moe_scatter_kernel[(chunks,)](ids, counts, chunk_counts, sorted_ids, S, E, BLOCK_M=bm, E_PAD=e_pad, BLOCK=sb,
                                   ROWS=sb, num_warps=4)
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"
    opts = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    act = torch.empty((blocks * bm, I), dtype=hidden.dtype, device=dev)
    _moe_gate_up_kernel[(blocks * triton.cdiv(I, bn),)](
        hidden, w_gate_up, act, sorted_ids, counts, E, H, I, TOPK, blocks,
        hidden.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), act.stride(0),
        INPUT_PRECISION=precision, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, E_PAD=e_pad, **opts)
    y = torch.empty((S, H), dtype=torch.float32, device=dev)
    _moe_down_kernel[(blocks * triton.cdiv(H, bn),)](
        act, w_down, y, topk_weights.reshape(-1), sorted_ids, counts, E, H, I, blocks,
        act.stride(0), w_down.stride(0), w_down.stride(1), y.stride(0),
        INPUT_PRECISION=precision, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, E_PAD=e_pad, **opts)
    _moe_topk_sum_kernel[(T, triton.cdiv(H, SUM_BLOCK))](y, ids, out, H, E, TOPK, BLOCK=SUM_BLOCK, num_warps=4)

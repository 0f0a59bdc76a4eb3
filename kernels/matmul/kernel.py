"""The GEMM kernels (tiled, split-K with its reduction, persistent with TMA descriptors) and their
launchers: what decides the code a seat runs (every function here that the spec hashes is
listed in its `source_parts`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from nbx_tune.kernels.copy import STAGING, copy_plan, launch_copy_plan
from nbx_tune.kernels.fill import DEFAULTS as FILL_DEFAULTS
from nbx_tune.kernels.fill import launch_fill
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.spec import Config, Problem

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton before 3.4: no host-side descriptors, so no TMA tiles (`no_tma`)
    TensorDescriptor = None


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr, a_desc, b_desc, b2_desc,
    M, N, K, NB,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    stride_xb, stride_xm, stride_xn,
    alpha, beta,
    HAS_BIAS: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ALIGN_AB: tl.constexpr, ALIGN_C: tl.constexpr, B_KMAJOR: tl.constexpr = 0, EXTRA_N: tl.constexpr = 0,
    TMA: tl.constexpr = 0,
):
    # Triton knows an integer argument's divisibility only when it is a multiple of 16; a
    # row 3000 elements long is a multiple of 8 (16 bytes in fp16) and would load one element
    # at a time. The launch passes ALIGN_* > 1 only where each value below is a multiple of
    # it, so these are no-ops at run time that tell the compiler rows start on 16-byte
    # boundaries and K ends on one: A and B load in 16-byte vectors, C stores likewise.
    if ALIGN_AB > 1:
        K = K // ALIGN_AB * ALIGN_AB
        NB = NB // ALIGN_AB * ALIGN_AB
        stride_ab = stride_ab // ALIGN_AB * ALIGN_AB
        stride_am = stride_am // ALIGN_AB * ALIGN_AB
        stride_bb = stride_bb // ALIGN_AB * ALIGN_AB
        stride_bk = stride_bk // ALIGN_AB * ALIGN_AB
    if ALIGN_C > 1:
        N = N // ALIGN_C * ALIGN_C
        stride_cb = stride_cb // ALIGN_C * ALIGN_C
        stride_cm = stride_cm // ALIGN_C * ALIGN_C
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    # A tile is BLOCK_N + EXTRA_N columns wide, in two accumulators: Triton's blocks are
    # powers of two, their sum need not be: at some sizes only a 192-wide tile leaves the
    # last wave of programs nearly full.
    TILE_N: tl.constexpr = BLOCK_N + EXTRA_N
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, TILE_N), GROUP_M)

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * TILE_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if EXTRA_N > 0:
        rn2 = pid_n * TILE_N + BLOCK_N + tl.arange(0, EXTRA_N)
        acc2 = tl.zeros((BLOCK_M, EXTRA_N), dtype=tl.float32)
    if TMA > 0:
        # A and B through the TMA unit (host-side descriptors, `tma_descriptors`): bulk
        # asynchronous copies with no address arithmetic in registers, and boxes past an
        # edge read as zeros, so no wrap and no K mask. TMA is 3 for batched descriptors
        # (batch, rows, cols), 2 for one product.
        m0 = pid_m * BLOCK_M
        n0 = pid_n * TILE_N
        bi = tl.program_id(1)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k0 = k * BLOCK_K
            # B_KMAJOR: B is column-major (an nn.Linear weight passed as W.t()); its
            # descriptor reads W's (N, K) rows in BLOCK_N x BLOCK_K boxes, transposed in
            # shared memory for the dot instead of copied on the host.
            if TMA == 3:
                a = a_desc.load([bi, m0, k0]).reshape(BLOCK_M, BLOCK_K)
                if B_KMAJOR:
                    b = b_desc.load([bi, n0, k0]).reshape(BLOCK_N, BLOCK_K).T
                else:
                    b = b_desc.load([bi, k0, n0]).reshape(BLOCK_K, BLOCK_N)
            else:
                a = a_desc.load([m0, k0])
                if B_KMAJOR:
                    b = b_desc.load([n0, k0]).T
                else:
                    b = b_desc.load([k0, n0])
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            if EXTRA_N > 0:
                if TMA == 3:
                    if B_KMAJOR:
                        b2 = b2_desc.load([bi, n0 + BLOCK_N, k0]).reshape(EXTRA_N, BLOCK_K).T
                    else:
                        b2 = b2_desc.load([bi, k0, n0 + BLOCK_N]).reshape(BLOCK_K, EXTRA_N)
                else:
                    if B_KMAJOR:
                        b2 = b2_desc.load([n0 + BLOCK_N, k0]).T
                    else:
                        b2 = b2_desc.load([k0, n0 + BLOCK_N])
                acc2 = tl.dot(a, b2, acc2, input_precision=INPUT_PRECISION)
    else:
        rk = tl.arange(0, BLOCK_K)
        # Rows and columns past the edge wrap to valid ones: loads need no M/N mask, and the
        # store below is masked, so the wrapped results are never written. B's columns wrap
        # at NB, its row length: N itself, or N padded to 16 when B was staged (stage_operands).
        ram = rm % M
        rbn = rn % NB
        a_ptrs = a_ptr + batch * stride_ab + ram[:, None] * stride_am + rk[None, :] * stride_ak
        b_ptrs = b_ptr + batch * stride_bb + rk[:, None] * stride_bk + rbn[None, :] * stride_bn
        if EXTRA_N > 0:
            b2_ptrs = b_ptr + batch * stride_bb + rk[:, None] * stride_bk + (rn2 % NB)[None, :] * stride_bn
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            if EXTRA_N > 0:
                b2 = tl.load(b2_ptrs, mask=rk[:, None] < k_left, other=0.0)
                acc2 = tl.dot(a, b2, acc2, input_precision=INPUT_PRECISION)
                b2_ptrs += BLOCK_K * stride_bk
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk

    c_at = c_ptr + batch * stride_cb
    x_at = bias_ptr + batch * stride_xb
    _epilogue(acc, rm, rn, M, N, c_at, stride_cm, stride_cn, x_at, stride_xm, stride_xn, alpha, beta, HAS_BIAS)
    if EXTRA_N > 0:
        _epilogue(acc2, rm, rn2, M, N, c_at, stride_cm, stride_cn, x_at, stride_xm, stride_xn, alpha, beta,
                  HAS_BIAS)


_matmul_kernel = launch.recorded(_matmul_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def _epilogue(acc, rm, rn, M, N, c_at, stride_cm, stride_cn, x_at, stride_xm, stride_xn, alpha, beta,
              HAS_BIAS: tl.constexpr):
    """c[rm, rn] = alpha * acc [+ beta * bias[rm, rn]], inside M x N only."""
    acc = acc * alpha
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_BIAS:
        x_ptrs = x_at + rm[:, None] * stride_xm + rn[None, :] * stride_xn
        acc += beta * tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    c_ptrs = c_at + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_at.dtype.element_ty), mask=mask)


@triton.jit
def _matmul_splitk_kernel(
    a_ptr, b_ptr, w_ptr, a_desc, b_desc, c_ptr, x_ptr, count_ptr,
    M, N, K, NB,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_ws, stride_wb,
    stride_cb, stride_cm, stride_cn, stride_xb, stride_xm, stride_xn, alpha, beta,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, ALIGN_AB: tl.constexpr, TMA: tl.constexpr = 0, B_KMAJOR: tl.constexpr = 0,
    HAS_BIAS: tl.constexpr = 0, SUM_LAST: tl.constexpr = 0,
):
    # Split-K: program (tile, batch, split) sums its share of K, whole BLOCK_K blocks, into
    # an fp32 partial tile of the workspace w (SPLIT_K, B, M, N); `_splitk_reduce_kernel`
    # then adds the SPLIT_K partials in split order. No atomics: every launch sums the same
    # numbers in the same order, so results are bitwise reproducible. For M <= BLOCK_M this
    # is a GEMV-style schedule: B is read once, by N / BLOCK_N x SPLIT_K programs.
    # SUM_LAST: no second launch; the split that finishes a tile last (a counter per tile)
    # adds the partials, still in split order, and writes c.
    if ALIGN_AB > 1:
        K = K // ALIGN_AB * ALIGN_AB
        NB = NB // ALIGN_AB * ALIGN_AB
        stride_ab = stride_ab // ALIGN_AB * ALIGN_AB
        stride_am = stride_am // ALIGN_AB * ALIGN_AB
        stride_bb = stride_bb // ALIGN_AB * ALIGN_AB
        stride_bk = stride_bk // ALIGN_AB * ALIGN_AB
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = split * per
    k_hi = tl.minimum(K, k_lo + per)  # below k_lo when the split is empty: no iteration
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Rows and columns past the edge wrap to valid ones, as in `_matmul_kernel`.
    a_ptrs = a_ptr + batch * stride_ab + (rm % M)[:, None] * stride_am + (k_lo + rk)[None, :] * stride_ak
    b_ptrs = b_ptr + batch * stride_bb + (k_lo + rk)[:, None] * stride_bk + (rn % NB)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA > 0:
        # Through descriptors as in `_matmul_kernel`: a split's range is whole BLOCK_K
        # blocks, so no box crosses into the next split's, and boxes past K read zeros.
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        bi = tl.program_id(1)
        for k in range(k_lo, k_hi, BLOCK_K):
            if TMA == 3:
                a = a_desc.load([bi, m0, k]).reshape(BLOCK_M, BLOCK_K)
                if B_KMAJOR:
                    b = b_desc.load([bi, n0, k]).reshape(BLOCK_N, BLOCK_K).T
                else:
                    b = b_desc.load([bi, k, n0]).reshape(BLOCK_K, BLOCK_N)
            else:
                a = a_desc.load([m0, k])
                if B_KMAJOR:
                    b = b_desc.load([n0, k]).T
                else:
                    b = b_desc.load([k, n0])
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    else:
        for k in range(k_lo, k_hi, BLOCK_K):
            k_left = k_hi - k
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
    w_at = w_ptr + split.to(tl.int64) * stride_ws + batch * stride_wb
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(w_at + rm[:, None] * N + rn[None, :], acc, mask=mask)
    if SUM_LAST:
        # acq_rel: this split's partial is released with its count, and the last one's
        # loads (past L1: .cg) see every other split's.
        count_at = count_ptr + tl.program_id(1) * tl.num_programs(0) + pid
        if tl.atomic_add(count_at, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            w_tile = w_ptr + batch * stride_wb + rm[:, None] * N + rn[None, :]
            total = tl.load(w_tile, mask=mask, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                total += tl.load(w_tile + s * stride_ws, mask=mask, other=0.0, cache_modifier=".cg")
            _epilogue(total, rm, rn, M, N, c_ptr + batch * stride_cb, stride_cm, stride_cn,
                      x_ptr + batch * stride_xb, stride_xm, stride_xn, alpha, beta, HAS_BIAS)
            tl.store(count_at, 0)  # every split has counted: the next launch starts from zero


_matmul_splitk_kernel = launch.recorded(_matmul_splitk_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def _splitk_reduce_kernel(
    w_ptr, c_ptr, bias_ptr, M, N,
    stride_ws, stride_wb, stride_cb, stride_cm, stride_cn, stride_xb, stride_xm, stride_xn,
    alpha, beta,
    HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
):
    # c = alpha * (sum of the SPLIT_K partials, in split order) [+ beta * bias].
    batch = tl.program_id(1).to(tl.int64)
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = idx < M * N
    w_at = w_ptr + batch * stride_wb + idx
    acc = tl.load(w_at, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(w_at + s * stride_ws, mask=ok, other=0.0)
    rm = idx // N
    rn = idx % N
    acc = acc * alpha
    if HAS_BIAS:
        x = tl.load(bias_ptr + batch * stride_xb + rm * stride_xm + rn * stride_xn, mask=ok, other=0.0)
        acc += beta * x.to(tl.float32)
    c_ptrs = c_ptr + batch * stride_cb + rm * stride_cm + rn * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=ok)


_splitk_reduce_kernel = launch.recorded(_splitk_reduce_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of output tile `tile` in the grouped order: GROUP_M row-blocks at a
    time, column by column, so neighbouring programs share B tiles in L2 (every tiled
    GEMM here, convolutions included, walks its tiles in this order)."""
    group = GROUP_M * num_pid_n
    first_m = (tile // group) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % group) % group_m, (tile % group) // group_m


@triton.jit
def _tile_dot(a_desc, b_desc, m0, n0, k_lo, k_hi, acc, INPUT_PRECISION: tl.constexpr, BLOCK_K: tl.constexpr,
              B_KMAJOR: tl.constexpr):
    """acc + A[m0:, k blocks k_lo..k_hi) @ B[those, n0:] through TMA descriptors (boxes past
    an edge read zeros)."""
    for k in range(k_lo, k_hi):
        a = a_desc.load([m0, k * BLOCK_K])
        if B_KMAJOR:
            b = b_desc.load([n0, k * BLOCK_K]).T
        else:
            b = b_desc.load([k * BLOCK_K, n0])
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return acc


@triton.jit
def _persistent_kernel(
    a_desc, b_desc, c_ptr, bias_ptr, M, N, K, stride_cm, stride_cn, stride_xm, stride_xn, alpha, beta,
    HAS_BIAS: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    B_KMAJOR: tl.constexpr, FLATTEN: tl.constexpr, WS: tl.constexpr,
):
    # One program per SM walks the output tiles (SCHEDULE 1): no program launches per tile,
    # and with FLATTEN the compiler pipelines the next tile's first loads into this tile's
    # epilogue. WS: warp specialization (loading warps apart from the computing ones).
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    progs = tl.num_programs(0)
    tile_c = tl.program_id(0) - progs  # the epilogue's own count: FLATTEN moves loads across tiles
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, progs, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _tile_dot(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, k_tiles, acc, INPUT_PRECISION,
                        BLOCK_K, B_KMAJOR)
        tile_c += progs
        pm, pn = grouped_tile(tile_c, num_pid_m, num_pid_n, GROUP_M)
        rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        _epilogue(acc, rm, rn, M, N, c_ptr, stride_cm, stride_cn, bias_ptr, stride_xm, stride_xn, alpha, beta,
                  HAS_BIAS)


_persistent_kernel = launch.recorded(_persistent_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def schedule(config: Config) -> int:
    """The config's SCHEDULE: 0 one program per tile, 1 persistent."""
    return config.kwargs.get("SCHEDULE", 0)


_SMS: dict = {}


def sm_count(device) -> int:
    """Programs a persistent schedule runs: the device's SMs (4 under the interpreter)."""
    n = _SMS.get(device)
    if n is None:
        n = _SMS[device] = (torch.cuda.get_device_properties(device).multi_processor_count
                            if device.type == "cuda" else 4)
    return n


def launch_scheduled(a, c, bias, alpha: float, beta: float, config: Config, descs: tuple, kmajor: int):
    """c = alpha * (a @ b) [+ beta * bias] for one product (batch 1) under a persistent
    config, A and B read through `descs` (`tma_descriptors`). Returns the grid."""
    M, K = a.shape[-2:]
    c2 = c[0] if c.dim() == 3 else c
    x2 = c2 if bias is None else (bias[0] if bias.dim() == 3 else bias)
    bm, bn, bk, group = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["GROUP_M"]
    N = c2.shape[1]
    grid = (min(sm_count(a.device), triton.cdiv(M, bm) * triton.cdiv(N, bn)),)
    _persistent_kernel[grid](*descs[:2], c2, x2, M, N, K, *c2.stride(), *x2.stride(), alpha, beta,
                             bias is not None, "ieee" if a.dtype == torch.float32 else "tf32", bm, bn, bk, group,
                             kmajor, config.kwargs.get("FLATTEN", 0), config.kwargs.get("WS", 0),
                             num_warps=config.num_warps, num_stages=config.num_stages)
    return grid


def split_k(config: Config) -> int:
    """The config's SPLIT_K: programs that share one output tile's K (1 when absent)."""
    return config.kwargs.get("SPLIT_K", 1)


def sum_last(config: Config) -> int:
    """The config's SUM_LAST: 1 when the last split of a tile sums the partials in the same
    launch (no `_splitk_reduce_kernel` launch), else 0."""
    return config.kwargs.get("SUM_LAST", 0)


def launch_splitk(a, b, c, bias, alpha: float, beta: float, config: Config, align_ab: int = 1):
    """c = alpha * (a @ b) [+ beta * bias] by split-K (`_matmul_splitk_kernel`, then
    `_splitk_reduce_kernel`), through an fp32 workspace of SPLIT_K x c's elements. a, b as
    `launch_matmul` leaves them (staged where it staged them); bias expanded or None. A
    TMA config reads A and B through descriptors (`tma_descriptors`)."""
    a, b, descs, tma, kmajor = tma_descriptors(a, b, config)
    M, K = a.shape[-2:]
    N, NB = c.shape[-1], b.shape[-1]
    B = a.shape[0] if a.dim() == 3 else 1
    sk = split_k(config)
    last = sum_last(config)
    block = 512  # the reduction's elements per program: a decode row of 4096 spreads over 8
    w = launch.empty((sk, B, M, N), torch.float32, a.device)
    sa, sb, sc = _strides3(a), _strides3(b), _strides3(c)
    x = c if bias is None else bias
    sx = _strides3(bias) if bias is not None else sc
    grid = (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]), B, sk)
    counts = launch.counters(grid[0] * B, a.device) if last else w
    _matmul_splitk_kernel[grid](
        a, b, w, *descs[:2], c, x, counts, M, N, K, NB, *sa, *sb, w.stride(0), w.stride(1), *sc, *sx,
        alpha, beta, "ieee" if a.dtype == torch.float32 else "tf32",
        config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["GROUP_M"], sk, align_ab, tma, kmajor,
        bias is not None, last, num_warps=config.num_warps, num_stages=config.num_stages)
    if not last:
        _splitk_reduce_kernel[(triton.cdiv(M * N, block), B)](
            w, c, x, M, N, w.stride(0), w.stride(1), *sc, *sx, alpha, beta,
            bias is not None, sk, block, num_warps=4)
    return grid


def extra_columns(config: Config) -> int:
    """The config's EXTRA_N: columns of a second accumulator beside BLOCK_N (0 when absent)."""
    return config.kwargs.get("EXTRA_N", 0)


def uses_tma(config: Config) -> bool:
    """Whether the config loads A and B through TMA descriptors (its TMA, 0 when absent)."""
    return bool(config.kwargs.get("TMA", 0))


_NO_DESC = (None, None, None)


def tma_ready(t, batched: bool) -> bool:
    """Whether a TMA descriptor can read t in place: its base and every row on a 16-byte
    boundary, unit last stride, and (batched) a batch stride that is neither misaligned nor
    a broadcast 0. Single products use t's last two dims only."""
    if t.data_ptr() % 16:
        return False
    st, es = t.stride(), t.element_size()
    if st[-1] != 1 or (st[-2] * es) % 16:
        return False
    return not batched or ((st[0] * es) % 16 == 0 and st[0] != 0)


def _tma_copy(t):
    """t's values in fresh storage whose rows are 16-byte aligned (a view of the first
    t.shape[-1] columns of rows padded to 16 bytes)."""
    per = 16 // t.element_size()
    out = t.new_empty((*t.shape[:-1], -(-t.shape[-1] // per) * per))[..., :t.shape[-1]]
    out.copy_(t)
    return out


def b_kmajor(b, batched: bool) -> bool:
    """Whether a TMA config reads b column-major (`_matmul_kernel`'s B_KMAJOR): b is not
    readable in place row-major but its transpose is (an nn.Linear weight passed as W.t())."""
    return not tma_ready(b, batched) and tma_ready(b.transpose(-1, -2), batched)


def tma_descriptors(a, b, config: Config) -> tuple:
    """(a, b, (a_desc, b_desc, b2_desc), the kernel's TMA, its B_KMAJOR) for a TMA config:
    host-side descriptors of A's BLOCK_M x BLOCK_K boxes and B's BLOCK_K x BLOCK_N (and x
    EXTRA_N) boxes, 3-D when there is a batch of more than one product; a column-major B
    (`b_kmajor`) is described as its transpose, in BLOCK_N x BLOCK_K boxes. An operand TMA
    cannot read in place either way is replaced by an aligned copy. Other configs: a, b, no
    descriptors, 0, 0."""
    if not uses_tma(config):
        return a, b, _NO_DESC, 0, 0
    batched = a.dim() == 3 and a.shape[0] > 1
    if not tma_ready(a, batched):
        a = _tma_copy(a)
    kmajor = b_kmajor(b, batched)
    if not kmajor and not tma_ready(b, batched):
        b = _tma_copy(b)
    bm, bn, bk, extra = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], extra_columns(config)
    if batched:
        da, db, lead = a, b, [1]
    else:
        da, db, lead = (a[0], b[0], []) if a.dim() == 3 else (a, b, [])
    if kmajor:
        db = db.transpose(-1, -2)
        boxes = (lead + [bn, bk], lead + [extra, bk])
    else:
        boxes = (lead + [bk, bn], lead + [bk, extra])
    descs = (TensorDescriptor.from_tensor(da, lead + [bm, bk]), TensorDescriptor.from_tensor(db, boxes[0]),
             TensorDescriptor.from_tensor(db, boxes[1]) if extra else None)
    return a, b, descs, 3 if batched else 2, int(kmajor)


def _strides3(t):
    s = t.stride()
    return s if len(s) == 3 else (0, *s)


def matmul_args(a, b, c, x, alpha: float, beta: float, has_bias: bool, config: Config,
                align_ab: int = 1, align_c: int = 1, descs: tuple = _NO_DESC, tma: int = 0,
                kmajor: int = 0) -> tuple:
    """(grid, every argument of `_matmul_kernel` in its order, constexprs included): a
    launch through Triton and a direct launch of the compiled kernel pass exactly these.
    a and b may be staged copies, wider than the product (stage_operands): N is c's.
    align_ab / align_c: the kernel's ALIGN_AB / ALIGN_C hints (`launch_matmul` says when);
    descs, tma, kmajor: what `tma_descriptors` gave for a TMA config."""
    M, K = a.shape[-2:]
    N, NB = c.shape[-1], b.shape[-1]
    B = a.shape[0] if a.dim() == 3 else 1
    sa, sb, sc, sx = _strides3(a), _strides3(b), _strides3(c), _strides3(x)
    extra_n = extra_columns(config)
    grid = (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"] + extra_n), B)
    args = (a, b, c, x, *descs, M, N, K, NB, *sa, *sb, *sc, *sx, alpha, beta,
            has_bias, "ieee" if a.dtype == torch.float32 else "tf32",
            config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["GROUP_M"], align_ab, align_c,
            kmajor, extra_n, tma)
    return grid, args


def vector_elems(dtype) -> int:
    """Elements in a 16-byte vector, the widest load Triton emits: 8 in fp16/bf16, 4 in fp32."""
    return 16 // dtype.itemsize


def rows_aligned(shape, strides, vec: int) -> bool:
    """Row-major with every row on a `vec`-element boundary: the last stride 1 and the row
    length and every other stride multiples of vec (a broadcast stride 0 is)."""
    if strides[-1] != 1 or shape[-1] % vec:
        return False
    for s in strides[:-1]:
        if s % vec:
            return False
    return True


def stage_operands(a, b, vec: int):
    """a and b, each replaced by a zero-padded contiguous copy only where its loads would
    not be 16-byte vectors: not row-major, or a row or stride not a multiple of vec.

    With a row stride like 50257 Triton loads one element at a time, without software
    pipelining, a small fraction of the speed of aligned loads. A copy
    costs a pass over its operand, so an operand whose rows are aligned is left as it is.
    When K is not a multiple of vec both are padded in K (to 16), so that the K mask is
    uniform over each vector: the zeros add nothing to the sums. A staged B is N padded to
    16 wide: the kernel wraps its columns at NB, B's row length, and stores only N.
    The copies are made by the copy kernel into one `launch.empty` buffer (each view on a
    16-byte boundary), zeroed first by the fill kernel where there is padding: a direct
    launch's replay (kernels/runtime/launch.py) makes them again."""
    K, N = a.shape[-1], b.shape[-1]
    Kp = K if K % vec == 0 else -(-K // 16) * 16
    want = []  # (operand index, tensor, padded shape)
    if Kp != K or not rows_aligned(a.shape, a.stride(), vec):
        want.append((0, a, (*a.shape[:-1], Kp)))
    if Kp != K or not rows_aligned(b.shape, b.stride(), vec):
        want.append((1, b, (*b.shape[:-2], Kp, -(-N // 16) * 16)))
    if not want:
        return a, b
    sizes = [-(-math.prod(shape) // vec) * vec for _, _, shape in want]
    buf = launch.empty((sum(sizes),), a.dtype, a.device)
    if any(shape != tuple(t.shape) for _, t, shape in want):
        launch_fill(buf, 0.0, 0, False, FILL_DEFAULTS[0])
    out, at = [a, b], 0
    for (i, t, shape), size in zip(want, sizes):
        view = buf[at:at + math.prod(shape)].view(shape)
        dst = view[..., :t.shape[-2], :t.shape[-1]]
        launch_copy_plan(t, dst, copy_plan(tuple(t.shape), t.stride(), dst.stride()), STAGING)
        out[i], at = view, at + size
    return out[0], out[1]


def launch_matmul(a, b, c, bias, alpha: float, beta: float, config: Config):
    """c = alpha * (a @ b) [+ beta * bias]: a (B, M, K) or (M, K), b and c likewise; bias
    already expanded to c's shape (any strides, zeros where broadcast) or None. Returns
    (what Triton returned: the compiled kernel on a GPU, None under the interpreter; the
    grid; the arguments).

    By the seat's `alignment`: at 16 Triton's own specialization vectorizes every load and
    store; below it the loads are made 16-byte aligned (stage_operands copies whichever
    operand is not) and the kernel is told so (ALIGN_AB), and so are C's stores where its
    rows allow (ALIGN_C). A TMA config reads A and B through descriptors (`tma_descriptors`)."""
    vec = vector_elems(a.dtype)
    align_ab = align_c = 1
    if alignment(a.stride(), b.stride(), b.shape[-1], a.shape[-1], vec) != 16:
        a, b = stage_operands(a, b, vec)
        align_ab = vec
        align_c = vec if rows_aligned(c.shape, c.stride(), vec) else 1
    if split_k(config) > 1:  # a workspace (`launch.empty`) and, unless SUM_LAST, a second kernel: replayed too
        return None, launch_splitk(a, b, c, bias, alpha, beta, config, align_ab), None
    a, b, descs, tma, kmajor = tma_descriptors(a, b, config)
    if schedule(config):
        return None, launch_scheduled(a, c, bias, alpha, beta, config, descs, kmajor), None
    grid, args = matmul_args(a, b, c, c if bias is None else bias, alpha, beta, bias is not None, config,
                             align_ab, align_c, descs, tma, kmajor)
    return _matmul_kernel[grid](*args, num_warps=config.num_warps, num_stages=config.num_stages), grid, args


def alignment(strides_a, strides_b, n: int, k: int, vec: int) -> int:
    """The seat's `aligned` flag: 16 when N (c's row stride) and every stride of a and b is 1
    or a multiple of 16 elements; else vec (the elements of a 16-byte vector) when both
    operands are row-major with N, K and every other stride multiples of vec; else 0.

    Triton specializes integer arguments on divisibility by 16 and compiles a different
    kernel for each case: an N one off a multiple of 16 runs several times slower under
    every config, and the best config differs, so the cases are different seats. Below
    16, `launch_matmul` makes up what Triton cannot see:
    hints at vec, and at 0 staging copies of the operands that are not row-aligned."""
    if n % 16 == 0:
        for s in strides_a + strides_b:  # a plain loop: a generator costs 0.5 us on every launch
            if s % 16 and s != 1:
                break
        else:
            return 16
    if strides_a[-1] != 1 or strides_b[-1] != 1 or n % vec or k % vec:
        return 0
    for s in strides_a[:-1] + strides_b[:-1]:
        if s % vec:
            return 0
    return vec


def schedule_refusal(config: Config, problem: Problem) -> tuple[str, str] | None:
    """("not_applicable", why) for a persistent config at a seat it does not serve: a batch
    of products."""
    sched = schedule(config)
    if not sched:
        return None
    Bn = problem.dims[0]
    if Bn > 1:
        return ("not_applicable", f"SCHEDULE {sched} runs one product per launch, the seat has a batch of {Bn}")
    return None

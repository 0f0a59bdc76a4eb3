#!/usr/bin/env python3
"""Exploratory: GEMM schedules against wave quantization at M=N=K=3072 (H200, 132 SMs).

kernels/matmul/ reaches 0.94-0.99 of cuBLAS at 2048^3..8192^3 but 0.86 at 3072^3 (with its
128x192 tiles; 0.82 without): 576 tiles of 128x128 on 132 SMs are 4.36 waves, the last one
36 % full.
This script checks each candidate schedule against fp32 torch.matmul, times every config of
it beside cuBLAS (torch.matmul) in the same run, and writes all of it to
$OUT/explore_gemm_schedules.json (./bench_out/ without OUT).

    python bench/explore_gemm_schedules.py        # GPU; env EXPLORE_BUDGET_S=150, EXPLORE_JOBS,
                                                  # EXPLORE_VARIANTS=baseline,splitk_tail (a subset),
                                                  # EXPLORE_SHAPES=3072,3000 (cubes)
    TRITON_INTERPRET=1 python bench/explore_gemm_schedules.py --smoke   # CPU: index math only
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported; no GPU in smoke mode

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from nbx_tune.testing.bench import environment as common_environment, save  # noqa: E402


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


try:
    import nbx_tune  # noqa: F401
except ImportError:  # the repository root is the package: put a link named nbx_tune on the path
    _pkg = Path(tempfile.mkdtemp())
    (_pkg / "nbx_tune").symlink_to(Path(__file__).resolve().parents[2])
    sys.path.insert(0, str(_pkg))
try:
    from nbx_tune.kernels.matmul import CONFIGS, _c as matmul_config, _tma_copy, launch_matmul, tma_ready
    from nbx_tune.kernels.spec import Config
    BASELINE_ERR = None
except Exception as _e:  # the other variants still run
    CONFIGS, matmul_config, launch_matmul, Config, BASELINE_ERR = (), None, None, None, first_line(_e)

HAS_TMA = hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")


# ----------------------------------------------------------------------------- kernels

@triton.jit
def _coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped ordering as in kernels/matmul/: GROUP_M row-blocks in turn share B tiles in L2."""
    group = GROUP_M * num_pid_n
    first_m = (tile // group) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % group) % group_m, (tile % group) // group_m


@triton.jit
def _acc_tile(a_src, b_src, pid_m, pid_n, k_lo, k_hi, M, N, K, sam, sak, sbk, sbn,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, USE_TMA: tl.constexpr,
              WS: tl.constexpr):
    """fp32 sum over K blocks [k_lo, k_hi) of output tile (pid_m, pid_n). a_src and b_src are
    pointers, or TMA descriptors (out-of-bounds boxes read as zeros: no masks needed)."""
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if USE_TMA:
        for k in tl.range(k_lo, k_hi, warp_specialize=WS):
            acc = tl.dot(a_src.load([pid_m * BM, k * BK]), b_src.load([k * BK, pid_n * BN]), acc)
    else:
        # Rows/columns past the edge wrap to valid ones (as kernels/matmul/); stores mask them.
        rm = (pid_m * BM + tl.arange(0, BM)) % M
        rn = (pid_n * BN + tl.arange(0, BN)) % N
        rk = tl.arange(0, BK)
        a_ptrs = a_src + rm[:, None] * sam + (k_lo * BK + rk)[None, :] * sak
        b_ptrs = b_src + (k_lo * BK + rk)[:, None] * sbk + rn[None, :] * sbn
        for k in tl.range(k_lo, k_hi, warp_specialize=WS):
            a = tl.load(a_ptrs, mask=rk[None, :] < K - k * BK, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < K - k * BK, other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BK * sak
            b_ptrs += BK * sbk
    return acc


@triton.jit
def _store_block(c_ptr, acc, rm, rn, M, N, scm, scn):
    """c[rm, rn] = acc, inside M x N only."""
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _store_tile(c_ptr, c_desc, acc, pid_m, pid_n, M, N, scm, scn,
                BM: tl.constexpr, BN: tl.constexpr, TMA_STORE: tl.constexpr):
    out = acc.to(c_ptr.dtype.element_ty)
    if TMA_STORE:
        c_desc.store([pid_m * BM, pid_n * BN], out)  # the TMA unit clips at the edges
    else:
        _store_block(c_ptr, out, pid_m * BM + tl.arange(0, BM), pid_n * BN + tl.arange(0, BN), M, N, scm, scn)


@triton.jit
def _owner(i, per, extra):
    """The program whose stream-K run holds iteration i (programs below `extra` take per + 1)."""
    cut = extra * (per + 1)
    return tl.where(i < cut, i // (per + 1), extra + (i - cut) // max(per, 1))


# dp_tiles/sk_* change with the shape: unspecialized so one binary serves 3072, 4096 and 2048.
@triton.jit(do_not_specialize=["dp_tiles", "sk_per", "sk_extra"])
def _persistent_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, cnt_ptr, a_hd, b_hd, c_hd,
    M, N, K, sam, sak, sbk, sbn, scm, scn, dp_tiles, sk_per, sk_extra,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGS: tl.constexpr, USE_TMA: tl.constexpr, HOST_DESC: tl.constexpr,
    FLATTEN: tl.constexpr, WS: tl.constexpr, STREAM_K: tl.constexpr,
):
    """NUM_PROGS programs; each first does its stream-K run (if STREAM_K), then walks the
    data-parallel tiles pid, pid + NUM_PROGS, ... < dp_tiles."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    a_src, b_src, c_desc = a_ptr, b_ptr, c_ptr
    if USE_TMA:
        if HOST_DESC:
            a_src, b_src, c_desc = a_hd, b_hd, c_hd
        else:  # built once per program, in the scratch given by triton.set_allocator
            a_src = tl.make_tensor_descriptor(a_ptr, [M, K], [sam, 1], [BM, BK])
            b_src = tl.make_tensor_descriptor(b_ptr, [K, N], [sbk, 1], [BK, BN])
            c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [scm, 1], [BM, BN])
    if STREAM_K:
        # Iterations (tile t, k block) of the tail tiles, flattened t * k_tiles + k, split in
        # contiguous runs of sk_per or sk_per + 1; a run may end one tile and start the next.
        it = pid * sk_per + min(pid, sk_extra)
        end = it + sk_per + (pid < sk_extra).to(tl.int32)
        while it < end:
            t = it // k_tiles
            k0 = it - t * k_tiles
            k1 = min(k_tiles, k0 + (end - it))
            pid_m, pid_n = _coords(dp_tiles + t, num_pid_m, num_pid_n, GROUP_M)
            acc = _acc_tile(a_src, b_src, pid_m, pid_n, k0, k1, M, N, K, sam, sak, sbk, sbn,
                            BM, BN, BK, USE_TMA, WS)
            if (k0 == 0) & (k1 == k_tiles):  # the whole tile is ours
                _store_tile(c_ptr, c_desc, acc, pid_m, pid_n, M, N, scm, scn, BM, BN, USE_TMA)
            else:
                owners = (_owner(t * k_tiles + k_tiles - 1, sk_per, sk_extra)
                          - _owner(t * k_tiles, sk_per, sk_extra) + 1)
                w = ws_ptr + t * BM * BN + tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
                tl.atomic_add(w, acc, sem="relaxed")
                tl.debug_barrier()  # every thread's adds precede the counter's release
                if tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel") == owners - 1:
                    # Last contributor: read the sum at L2 (an atomic, not a cached load), then
                    # zero the slot so the next call needs no memset kernel.
                    total = tl.atomic_add(w, tl.zeros((BM, BN), dtype=tl.float32), sem="acq_rel")
                    tl.store(w, tl.zeros((BM, BN), dtype=tl.float32))
                    _store_tile(c_ptr, c_desc, total, pid_m, pid_n, M, N, scm, scn, BM, BN, USE_TMA)
                    tl.atomic_xchg(cnt_ptr + t, 0)
            it += k1 - k0
    for tile in tl.range(pid, dp_tiles, NUM_PROGS, flatten=FLATTEN):
        pid_m, pid_n = _coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = _acc_tile(a_src, b_src, pid_m, pid_n, 0, k_tiles, M, N, K, sam, sak, sbk, sbn,
                        BM, BN, BK, USE_TMA, WS)
        _store_tile(c_ptr, c_desc, acc, pid_m, pid_n, M, N, scm, scn, BM, BN, USE_TMA)


@triton.jit(do_not_specialize=["k_per"])
def _splitk_partial_kernel(a_ptr, b_ptr, ws_ptr, M, N, K, sam, sak, sbk, sbn, k_per,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Program (tile, s): the fp32 sum over K blocks [s * k_per, (s + 1) * k_per) of one BMxBN
    tile of a (M, K) @ (K, N), stored plainly into slice s of ws (S, M, N): no atomics, no
    counters, every element of every slice written exactly once."""
    tile = tl.program_id(0)
    s = tl.program_id(1)
    num_pid_n = tl.cdiv(N, BN)
    pid_m = tile // num_pid_n
    pid_n = tile % num_pid_n
    k_lo = s * k_per
    k_hi = min(tl.cdiv(K, BK), k_lo + k_per)
    acc = _acc_tile(a_ptr, b_ptr, pid_m, pid_n, k_lo, k_hi, M, N, K, sam, sak, sbk, sbn,
                    BM, BN, BK, False, False)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    w = ws_ptr + s.to(tl.int64) * M * N + rm[:, None] * N + rn[None, :]
    tl.store(w, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


# dp_tiles, k_per, slices change with the shape: unspecialized, one binary per config.
@triton.jit(do_not_specialize=["dp_tiles", "k_per", "slices"])
def _ticket_tail_kernel(a_src, b_src, c_ptr, ws_ptr, cnt_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                        dp_tiles, k_per, slices,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                        USE_TMA: tl.constexpr, TAIL_FIRST: tl.constexpr, FIXUP: tl.constexpr = True):
    """One program per whole tile for the first dp_tiles tiles (whole waves), then `slices`
    programs per tail tile, each the fp32 partial product of k_per K blocks stored plainly
    into its slot of ws. The last slice of a tile to finish (a per-tile ticket counter, no
    spinning) adds the other slices' partials, writes C and resets the counter: one launch,
    no memset, no atomics on data. TAIL_FIRST puts the tail programs at the grid's front.
    FIXUP=False (bench/probe_waves.py, timing only) skips the last slice's sum: C is wrong."""
    pid = tl.program_id(0)
    k_tiles = tl.cdiv(K, BK)
    tail_progs = (tl.cdiv(M, BM) * tl.cdiv(N, BN) - dp_tiles) * slices
    if TAIL_FIRST:
        is_tail = pid < tail_progs
        part = pid
        dp_pid = pid - tail_progs
    else:
        is_tail = pid >= dp_tiles
        part = pid - dp_tiles
        dp_pid = pid
    part = tl.maximum(part, 0)
    t = part // slices
    s = part - t * slices
    tile = tl.where(is_tail, dp_tiles + t, dp_pid)
    k_lo = tl.where(is_tail, s * k_per, 0)
    k_hi = tl.where(is_tail, tl.minimum(k_lo + k_per, k_tiles), k_tiles)
    pid_m, pid_n = _coords(tile, tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    acc = _acc_tile(a_src, b_src, pid_m, pid_n, k_lo, k_hi, M, N, K, sam, sak, sbk, sbn,
                    BM, BN, BK, USE_TMA, False)
    if is_tail:
        offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
        tl.store(ws_ptr + part.to(tl.int64) * (BM * BN) + offs, acc)
        tl.debug_barrier()  # every thread's partial precedes the ticket's release
        if tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel") == slices - 1:
            first = (part - s).to(tl.int64)
            for j in range(0, slices if FIXUP else 0):
                if j != s:
                    acc += tl.load(ws_ptr + (first + j) * (BM * BN) + offs, cache_modifier=".cg")
            _store_tile(c_ptr, c_ptr, acc, pid_m, pid_n, M, N, scm, scn, BM, BN, False)
            tl.atomic_xchg(cnt_ptr + t, 0)
    else:
        _store_tile(c_ptr, c_ptr, acc, pid_m, pid_n, M, N, scm, scn, BM, BN, False)


@triton.jit
def _splitk_reduce_kernel(ws_ptr, c_ptr, M, N, scm, scn, S: tl.constexpr,
                          RM: tl.constexpr, RN: tl.constexpr):
    """c = the sum of the S slices of ws (S, M, N), in c's dtype."""
    rm = tl.program_id(0) * RM + tl.arange(0, RM)
    rn = tl.program_id(1) * RN + tl.arange(0, RN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    acc = tl.zeros((RM, RN), dtype=tl.float32)
    for s in tl.static_range(S):
        acc += tl.load(ws_ptr + s * M * N + rm[:, None] * N + rn[None, :], mask=mask, other=0.0)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tall_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                 BM: tl.constexpr, BN: tl.constexpr, EXTRA: tl.constexpr, BK: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """One program per tile of (BM + EXTRA) x BN, in two accumulators: Triton's blocks are
    powers of two, their sum need not be (128 + 64 = 192). The other way round, BM x (BN +
    EXTRA), is kernels/matmul/kernel.py's EXTRA_N (in the baseline variant)."""
    TM: tl.constexpr = BM + EXTRA
    pid_m, pid_n = _coords(tl.program_id(0), tl.cdiv(M, TM), tl.cdiv(N, BN), GROUP_M)
    rk = tl.arange(0, BK)
    # Both blocks wrap past the edge as kernels/matmul/ does; the stores mask them.
    rm = (pid_m * TM + tl.arange(0, BM)) % M
    rm2 = (pid_m * TM + BM + tl.arange(0, EXTRA)) % M
    rn = (pid_n * BN + tl.arange(0, BN)) % N
    a_ptrs = a_ptr + rm[:, None] * sam + rk[None, :] * sak
    a2_ptrs = a_ptr + rm2[:, None] * sam + rk[None, :] * sak
    b_ptrs = b_ptr + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc2 = tl.zeros((EXTRA, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        k_left = K - k * BK
        b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0), b, acc)
        acc2 = tl.dot(tl.load(a2_ptrs, mask=rk[None, :] < k_left, other=0.0), b, acc2)
        a_ptrs += BK * sak
        a2_ptrs += BK * sak
        b_ptrs += BK * sbk
    om = pid_m * TM + tl.arange(0, BM)
    om2 = pid_m * TM + BM + tl.arange(0, EXTRA)
    on = pid_n * BN + tl.arange(0, BN)
    _store_block(c_ptr, acc, om, on, M, N, scm, scn)
    _store_block(c_ptr, acc2, om2, on, M, N, scm, scn)


@triton.jit
def _tma_wide_tile(a_desc, b_desc, b2_desc, c_ptr, tile, M, N, K, scm, scn,
                   BM: tl.constexpr, BN: tl.constexpr, X: tl.constexpr, BK: tl.constexpr,
                   GROUP_M: tl.constexpr, WS: tl.constexpr):
    """One BM x (BN + X) output tile: A and B through host-side TMA descriptors (boxes past
    the edge read as zeros), two accumulators when X > 0, C stored through masked pointers."""
    TN: tl.constexpr = BN + X
    pid_m, pid_n = _coords(tile, tl.cdiv(M, BM), tl.cdiv(N, TN), GROUP_M)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if X > 0:
        acc2 = tl.zeros((BM, X), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BK), warp_specialize=WS):
        a = a_desc.load([pid_m * BM, k * BK])
        acc = tl.dot(a, b_desc.load([k * BK, pid_n * TN]), acc)
        if X > 0:
            acc2 = tl.dot(a, b2_desc.load([k * BK, pid_n * TN + BN]), acc2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * TN + tl.arange(0, BN)
    _store_block(c_ptr, acc, rm, rn, M, N, scm, scn)
    if X > 0:
        _store_block(c_ptr, acc2, rm, pid_n * TN + BN + tl.arange(0, X), M, N, scm, scn)


@triton.jit
def _tma_wide_kernel(a_desc, b_desc, b2_desc, c_ptr, M, N, K, scm, scn,
                     BM: tl.constexpr, BN: tl.constexpr, X: tl.constexpr, BK: tl.constexpr,
                     GROUP_M: tl.constexpr, NUM_PROGS: tl.constexpr, PERSISTENT: tl.constexpr,
                     WS: tl.constexpr):
    """One program per tile, or NUM_PROGS programs walking the tiles (PERSISTENT); WS asks
    Triton to warp-specialize the K loop (loads and MMAs in separate warps)."""
    if PERSISTENT:
        tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN + X)
        for tile in tl.range(tl.program_id(0), tiles, NUM_PROGS, flatten=True):
            _tma_wide_tile(a_desc, b_desc, b2_desc, c_ptr, tile, M, N, K, scm, scn, BM, BN, X, BK, GROUP_M, WS)
    else:
        _tma_wide_tile(a_desc, b_desc, b2_desc, c_ptr, tl.program_id(0), M, N, K, scm, scn,
                       BM, BN, X, BK, GROUP_M, WS)


@triton.jit
def _quad_kernel(a_desc, a2_desc, b_desc, b2_desc, c_ptr, M, N, K, scm, scn,
                 BM: tl.constexpr, XM: tl.constexpr, BN: tl.constexpr, XN: tl.constexpr, BK: tl.constexpr,
                 GROUP_M: tl.constexpr, NUM_PROGS: tl.constexpr, PERSISTENT: tl.constexpr):
    """(BM + XM) x (BN + XN) output tiles, e.g. 192 x 192 (cuBLAS's tile at 3000^3 and 3072^3
    on the H200: 256 tiles, 1.94 waves), in four accumulators since Triton's blocks are
    powers of two: rows [0, BM) and [BM, BM + XM) times columns [0, BN) and [BN, BN + XN).
    A and B through host-side TMA descriptors; one program per tile or NUM_PROGS walking them."""
    TM: tl.constexpr = BM + XM
    TN: tl.constexpr = BN + XN
    tiles = tl.cdiv(M, TM) * tl.cdiv(N, TN)
    step = NUM_PROGS if PERSISTENT else tiles
    for tile in tl.range(tl.program_id(0), tiles, step, flatten=True):
        pid_m, pid_n = _coords(tile, tl.cdiv(M, TM), tl.cdiv(N, TN), GROUP_M)
        m0 = pid_m * TM
        n0 = pid_n * TN
        acc11 = tl.zeros((BM, BN), dtype=tl.float32)
        acc12 = tl.zeros((BM, XN), dtype=tl.float32)
        acc21 = tl.zeros((XM, BN), dtype=tl.float32)
        acc22 = tl.zeros((XM, XN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            a1 = a_desc.load([m0, k * BK])
            a2 = a2_desc.load([m0 + BM, k * BK])
            b1 = b_desc.load([k * BK, n0])
            b2 = b2_desc.load([k * BK, n0 + BN])
            acc11 = tl.dot(a1, b1, acc11)
            acc12 = tl.dot(a1, b2, acc12)
            acc21 = tl.dot(a2, b1, acc21)
            acc22 = tl.dot(a2, b2, acc22)
        rm = m0 + tl.arange(0, BM)
        rm2 = m0 + BM + tl.arange(0, XM)
        rn = n0 + tl.arange(0, BN)
        rn2 = n0 + BN + tl.arange(0, XN)
        _store_block(c_ptr, acc11, rm, rn, M, N, scm, scn)
        _store_block(c_ptr, acc12, rm, rn2, M, N, scm, scn)
        _store_block(c_ptr, acc21, rm2, rn, M, N, scm, scn)
        _store_block(c_ptr, acc22, rm2, rn2, M, N, scm, scn)


# ----------------------------------------------------------------------------- variants
# Each takes (a, b, c, config, num_sms) and returns a no-argument function computing c = a @ b,
# all of each call's GPU work inside it (there is no memset or cast: the stream-K workspace is
# left zeroed by the kernel itself; allocating it is set-up, as a served kernel would cache it).

def v_baseline(a, b, c, cfg, nsms):
    """Ours as served: kernels/matmul/, one program per tile (576 at 3072^3 = 4.36 waves)."""
    if launch_matmul is None:
        raise RuntimeError(f"nbx_tune not importable: {BASELINE_ERR}")
    return lambda: launch_matmul(a, b, c, None, 1.0, 0.0, cfg)


def _persistent(a, b, c, cfg, nsms, use_tma, stream_k):
    (M, K), N, (BM, BN, BK) = a.shape, b.shape[1], (cfg["BM"], cfg["BN"], cfg["BK"])
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    progs = min(tiles, cfg.get("OCC", 1) * nsms)
    dp, per, extra, ws, cnt, hd = tiles, 0, 0, c, c, (None, None, None)
    if stream_k:
        dp = max(tiles // progs - cfg["SK_WAVES"], 0) * progs
        per, extra = divmod((tiles - dp) * triton.cdiv(K, BK), progs)
        # Zeroed once here: each tile's last contributor re-zeroes its slot and counter.
        ws = torch.zeros(max(tiles - dp, 1) * BM * BN, device=a.device, dtype=torch.float32)
        cnt = torch.zeros(max(tiles - dp, 1), device=a.device, dtype=torch.int32)
    host = bool(cfg.get("HOST_DESC", 0))
    if use_tma and not HAS_TMA:
        raise RuntimeError("this Triton has no tl.make_tensor_descriptor / triton.set_allocator")
    if use_tma and host:
        from triton.tools.tensor_descriptor import TensorDescriptor
        hd = (TensorDescriptor.from_tensor(a, [BM, BK]), TensorDescriptor.from_tensor(b, [BK, BN]),
              TensorDescriptor.from_tensor(c, [BM, BN]))
    args = (a, b, c, ws, cnt, *hd, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), dp, per, extra)
    meta = dict(BM=BM, BN=BN, BK=BK, GROUP_M=cfg.get("G", 8), NUM_PROGS=progs, USE_TMA=use_tma,
                HOST_DESC=host, FLATTEN=bool(cfg.get("FLATTEN", 1)), WS=bool(cfg.get("WS", 0)),
                STREAM_K=stream_k, num_warps=cfg["w"], num_stages=cfg["s"])
    return lambda: _persistent_kernel[(progs,)](*args, **meta)


def v_persistent(a, b, c, cfg, nsms):
    """Persistent data-parallel: OCC x SMs programs walk the tiles in grouped order. The tail is
    as uneven (5 tiles on some SMs vs 4.36 average) but with flatten=True the pipeliner can
    overlap one tile's epilogue with the next tile's loads; WS=1 asks for warp specialization."""
    return _persistent(a, b, c, cfg, nsms, use_tma=False, stream_k=False)


def v_tma_persistent(a, b, c, cfg, nsms):
    """Persistent + TMA (the idea of Triton's tutorial 09): A/B loads and the C store go through
    tensor descriptors (device-side tl.make_tensor_descriptor, or host-side TensorDescriptor if
    HOST_DESC=1): asynchronous bulk copies, no address math or masks in registers."""
    return _persistent(a, b, c, cfg, nsms, use_tma=True, stream_k=False)


def v_streamk(a, b, c, cfg, nsms):
    """Data-parallel + stream-K tail: (floor(tiles/P) - SK_WAVES) * P tiles run data-parallel on
    P = OCC x SMs programs; the K iterations of the remaining tiles are split evenly across all
    P. Partial tiles meet in an fp32 workspace via atomics; the last contributor (per-tile
    counter, no spinning) reads the sum back, re-zeroes the slot and writes C. At 3072^3 with
    128x128: 4 DP tiles per SM + 48 tiles x 48 k-blocks / 132 = 4.36 tiles of work on every SM."""
    return _persistent(a, b, c, cfg, nsms, use_tma=bool(cfg.get("TMA", 0)), stream_k=True)


def whole_waves(M, N, BM, BN, nsms) -> int:
    """The first row past the rows whose BMxBN tiles make whole waves on nsms SMs (M when
    there are none, or no rows are left over)."""
    per_row, rows = triton.cdiv(N, BN), triton.cdiv(M, BM)
    big_rows = (rows * per_row // nsms) * nsms // per_row
    return big_rows * BM if 0 < big_rows < rows else M


def split_rows(M, N, cfg, nsms) -> int:
    """The first row of the tail: the rows above it make whole waves of BMxBN tiles; the tail
    rows go to a second launch of smaller TBMxTBN tiles if those fit in one wave (else M)."""
    ms = whole_waves(M, N, cfg["BM"], cfg["BN"], nsms)
    tail_tiles = triton.cdiv(M - ms, cfg["TBM"]) * triton.cdiv(N, cfg["TBN"])
    return ms if tail_tiles <= nsms else M


def v_split_rows(a, b, c, cfg, nsms):
    """Two launches of kernels/matmul/: rows that make whole waves of the big tiles, then the
    tail rows in small tiles that fit one wave. At 3072^3 with 128x256: 264 tiles (2 waves on
    132 SMs) over rows 0..2815, then 96 tiles of 128x64 over rows 2816..3071, where one launch
    runs 288 tiles in 3 waves, the last one 18 % full."""
    if launch_matmul is None:
        raise RuntimeError(f"nbx_tune not importable: {BASELINE_ERR}")
    M, N = c.shape
    ms = split_rows(M, N, cfg, nsms)
    big = Config.make(BLOCK_M=cfg["BM"], BLOCK_N=cfg["BN"], BLOCK_K=cfg["BK"], GROUP_M=cfg.get("G", 8),
                      num_warps=cfg["w"], num_stages=cfg["s"])
    small = Config.make(BLOCK_M=cfg["TBM"], BLOCK_N=cfg["TBN"], BLOCK_K=cfg["TBK"], GROUP_M=cfg.get("G", 8),
                        num_warps=cfg["tw"], num_stages=cfg["ts"])
    if ms == M:
        return lambda: launch_matmul(a, b, c, None, 1.0, 0.0, big)
    parts = ((a[:ms], c[:ms], big), (a[ms:], c[ms:], small))

    def fn():
        for a_part, c_part, conf in parts:
            launch_matmul(a_part, b, c_part, None, 1.0, 0.0, conf)
    return fn


def v_splitk_tail(a, b, c, cfg, nsms):
    """Rows that make whole waves of BMxBN tiles through kernels/matmul/, then the tail
    rows' tiles split along K so that they fill one wave: S = SMs // tail tiles partial
    products stored plainly into an fp32 workspace, and a reduction into C (three launches,
    no atomics). At 3072^3 with 128x256: 264 tiles in 2 waves, then 24 tail tiles x 5 K
    slices of about 10 K blocks each, where split_rows' small tail tiles kept all 48."""
    if launch_matmul is None:
        raise RuntimeError(f"nbx_tune not importable: {BASELINE_ERR}")
    (M, K), N = a.shape, b.shape[1]
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    big = Config.make(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=cfg.get("G", 8),
                      num_warps=cfg["w"], num_stages=cfg["s"])
    ms = whole_waves(M, N, BM, BN, nsms)
    if ms == M:
        return lambda: launch_matmul(a, b, c, None, 1.0, 0.0, big)
    mt, k_tiles = M - ms, triton.cdiv(K, BK)
    tail_tiles = triton.cdiv(mt, BM) * triton.cdiv(N, BN)
    k_per, slices = k_split(k_tiles, max(1, min(k_tiles, nsms // tail_tiles)))
    ws = torch.empty(slices, mt, N, device=a.device, dtype=torch.float32)  # set-up, as a served kernel would keep it
    a_tail, c_tail = a[ms:], c[ms:]
    RM, RN = cfg.get("RM", 32), cfg.get("RN", 128)

    def fn():
        launch_matmul(a[:ms], b, c[:ms], None, 1.0, 0.0, big)
        _splitk_partial_kernel[(tail_tiles, slices)](
            a_tail, b, ws, mt, N, K, a_tail.stride(0), a_tail.stride(1), b.stride(0), b.stride(1), k_per,
            BM=BM, BN=BN, BK=BK, num_warps=cfg["tw"], num_stages=cfg["ts"])
        _splitk_reduce_kernel[(triton.cdiv(mt, RM), triton.cdiv(N, RN))](
            ws, c_tail, mt, N, c_tail.stride(0), c_tail.stride(1), S=slices, RM=RM, RN=RN, num_warps=4)
    return fn


def k_split(k_tiles: int, slices: int) -> tuple:
    """(K blocks a slice, slices) for k_tiles K blocks cut in at most `slices`, none empty."""
    k_per = triton.cdiv(k_tiles, slices)
    return k_per, triton.cdiv(k_tiles, k_per)


def ticket_launch(a, b, c, cfg, n, dp, slices, fixup=True):
    """A no-argument launch of _ticket_tail_kernel over the first n tiles of a @ b: the first
    dp whole, the n - dp after them in (up to) `slices` K slices. v_ticket_tail passes every
    tile; bench/probe_waves.py fewer, or fixup=False, to time the parts (C is then wrong)."""
    (M, K), N = a.shape, b.shape[1]
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    k_per, slices = k_split(triton.cdiv(K, BK), slices)
    tail = n - dp
    ws = torch.empty(max(tail * slices, 1) * BM * BN, device=a.device, dtype=torch.float32)
    cnt = torch.zeros(max(tail, 1), device=a.device, dtype=torch.int32)  # left zeroed by each call
    use_tma = bool(cfg.get("TMA", 0))
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        a, b = (t if tma_ready(t, batched=False) else _tma_copy(t) for t in (a, b))
        src = (TensorDescriptor.from_tensor(a, [BM, BK]), TensorDescriptor.from_tensor(b, [BK, BN]))
    else:
        src = (a, b)
    args = (*src, c, ws, cnt, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), dp, k_per, slices)
    meta = dict(BM=BM, BN=BN, BK=BK, GROUP_M=cfg.get("G", 8), USE_TMA=use_tma, TAIL_FIRST=bool(cfg.get("TF", 0)),
                FIXUP=fixup, num_warps=cfg["w"], num_stages=cfg["s"])
    return lambda: _ticket_tail_kernel[(dp + tail * slices,)](*args, **meta)


def v_ticket_tail(a, b, c, cfg, nsms):
    """_ticket_tail_kernel, one launch: whole waves of BMxBN tiles (OCC x SMs programs a
    wave), and the tail tiles split along K so that their slices fill about one wave. At
    3072^3 with 128x256: 264 whole tiles, then 24 tiles x 5 slices of 10 K blocks."""
    (M, K), N = a.shape, b.shape[1]
    tiles, k_tiles = triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, cfg["BN"]), triton.cdiv(K, cfg["BK"])
    wave = cfg.get("OCC", 1) * nsms
    dp = tiles // wave * wave
    slices = min(k_tiles, cfg.get("MAXS", k_tiles), wave // (tiles - dp)) if dp < tiles and dp else 1
    if slices < 2:
        dp, slices = tiles, 1
    return ticket_launch(a, b, c, cfg, tiles, dp, slices)


def v_tall(a, b, c, cfg, nsms):
    """One launch of _tall_kernel: tiles of 192x128 in two accumulators."""
    (M, K), N = a.shape, b.shape[1]
    grid = (triton.cdiv(M, cfg["BM"] + cfg["X"]) * triton.cdiv(N, cfg["BN"]),)
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    meta = dict(BM=cfg["BM"], BN=cfg["BN"], EXTRA=cfg["X"], BK=cfg["BK"],
                GROUP_M=cfg.get("G", 8), num_warps=cfg["w"], num_stages=cfg["s"])
    return lambda: _tall_kernel[grid](*args, **meta)


def v_tma_wide(a, b, c, cfg, nsms):
    """_tma_wide_kernel: kernels/matmul/kernel.py's BM x (BN + X) tiles with A and B loaded by TMA
    (host-side descriptors: the tma_persistent variant's best at 4096^3), one program per
    tile or persistent (P=1: min(tiles, SMs) programs)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    if launch_matmul is None:
        raise RuntimeError(f"nbx_tune not importable: {BASELINE_ERR}")
    (M, K), N = a.shape, b.shape[1]
    BM, BN, X, BK = cfg["BM"], cfg["BN"], cfg["X"], cfg["BK"]
    # Rows TMA cannot read in place (the odd smoke shapes) are copied, as kernels/matmul/ does.
    a, b = (t if tma_ready(t, batched=False) else _tma_copy(t) for t in (a, b))
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN + X)
    progs = min(tiles, nsms) if cfg["P"] else tiles
    descs = (TensorDescriptor.from_tensor(a, [BM, BK]), TensorDescriptor.from_tensor(b, [BK, BN]),
             TensorDescriptor.from_tensor(b, [BK, max(X, 16)]))
    args = (*descs, c, M, N, K, c.stride(0), c.stride(1))
    meta = dict(BM=BM, BN=BN, X=X, BK=BK, GROUP_M=cfg.get("G", 8), NUM_PROGS=progs, PERSISTENT=bool(cfg["P"]),
                WS=bool(cfg.get("WS", 0)), num_warps=cfg["w"], num_stages=cfg["s"])
    return lambda: _tma_wide_kernel[(progs,)](*args, **meta)


def v_quad(a, b, c, cfg, nsms):
    """_quad_kernel: (BM + XM) x (BN + XN) tiles in four accumulators, A and B by TMA."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    if launch_matmul is None:
        raise RuntimeError(f"nbx_tune not importable: {BASELINE_ERR}")
    (M, K), N = a.shape, b.shape[1]
    BM, XM, BN, XN, BK = cfg["BM"], cfg["XM"], cfg["BN"], cfg["XN"], cfg["BK"]
    a, b = (t if tma_ready(t, batched=False) else _tma_copy(t) for t in (a, b))
    tiles = triton.cdiv(M, BM + XM) * triton.cdiv(N, BN + XN)
    progs = min(tiles, nsms) if cfg["P"] else tiles
    descs = (TensorDescriptor.from_tensor(a, [BM, BK]), TensorDescriptor.from_tensor(a, [XM, BK]),
             TensorDescriptor.from_tensor(b, [BK, BN]), TensorDescriptor.from_tensor(b, [BK, XN]))
    args = (*descs, c, M, N, K, c.stride(0), c.stride(1))
    meta = dict(BM=BM, XM=XM, BN=BN, XN=XN, BK=BK, GROUP_M=cfg.get("G", 8), NUM_PROGS=progs,
                PERSISTENT=bool(cfg["P"]), num_warps=cfg["w"], num_stages=cfg["s"])
    return lambda: _quad_kernel[(progs,)](*args, **meta)


def _rows(keys, rows, **fixed):
    return [{**dict(zip(keys, r)), **fixed} for r in rows]


P_KEYS = ("BM", "BN", "BK", "w", "s", "OCC", "FLATTEN", "WS")
SR_KEYS = ("BM", "BN", "BK", "w", "s", "TBM", "TBN", "TBK", "tw", "ts")
SKT_KEYS = ("BM", "BN", "BK", "w", "s", "tw", "ts")
SK_KEYS = ("BM", "BN", "BK", "w", "s", "OCC", "SK_WAVES", "TMA")
TT_KEYS = ("BM", "BN", "BK", "w", "s", "TMA", "TF", "MAXS")
T_KEYS = ("BM", "BN", "X", "BK", "w", "s")
TW_KEYS = ("BM", "BN", "X", "BK", "w", "s", "P")
Q_KEYS = ("BM", "XM", "BN", "XN", "BK", "w", "s", "P")


NAMED_ONLY = ("tma_ws", "tma_ws1")


def variant_configs(smoke: bool) -> dict:
    """name -> (builder, [config, ...]); at most ~12 each, likeliest first."""
    if smoke:  # tiny tiles: 67x45x39 makes 15 tiles of 16x16 and 3 k-blocks
        tiny = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=1, num_stages=1)
        return {"baseline": (v_baseline, [Config.make(**tiny)] if Config else []),
                "split_rows": (v_split_rows, _rows(SR_KEYS, [(32, 16, 16, 1, 1, 16, 16, 16, 1, 1)], G=2)),
                "splitk_tail": (v_splitk_tail, _rows(SKT_KEYS, [(16, 32, 16, 1, 1, 1, 1), (16, 16, 16, 1, 1, 1, 1)],
                                                     G=2, RM=16, RN=16)),
                "tma_wide": (v_tma_wide, _rows(TW_KEYS, [(16, 16, 16, 16, 1, 1, 0), (16, 16, 16, 16, 1, 1, 1),
                                                          (16, 16, 0, 16, 1, 1, 0)], G=2)),
                "quad": (v_quad, _rows(Q_KEYS, [(16, 16, 16, 16, 16, 1, 1, 0), (32, 16, 16, 16, 16, 1, 1, 1)], G=2)),
                "persistent": (v_persistent, _rows(P_KEYS, [(16, 16, 16, 1, 1, 1, 1, 0),
                                                             (32, 16, 16, 1, 1, 2, 0, 0)], G=2)),
                # Whole waves, then the tail tiles' K split over about one wave; TMA or pointer loads.
        "ticket_tail": (v_ticket_tail, _rows(TT_KEYS, [
            (128, 256, 64, 8, 3, 1, 0, 99), (128, 256, 64, 8, 4, 1, 0, 99), (128, 256, 64, 8, 3, 1, 1, 99),
            (128, 256, 64, 8, 3, 1, 0, 3), (128, 256, 64, 8, 3, 0, 0, 99), (256, 128, 64, 8, 3, 1, 0, 99),
            (128, 128, 64, 8, 4, 1, 0, 99), (128, 128, 64, 8, 4, 1, 1, 99)], G=8)),
        "streamk": (v_streamk, _rows(SK_KEYS, [(16, 16, 16, 1, 1, 1, 0, 0), (16, 32, 16, 1, 1, 1, 1, 0),
                                                        (32, 16, 16, 1, 1, 2, 0, 0)], G=3)),
                "ticket_tail": (v_ticket_tail, _rows(TT_KEYS, [(32, 16, 16, 1, 1, 0, 0, 99), (32, 16, 16, 1, 1, 1, 0, 99),
                                                            (32, 16, 16, 1, 1, 1, 1, 99), (16, 32, 16, 1, 1, 0, 1, 2)],
                                                     G=2))}
    # The wide tiles of kernels/matmul/ (128 x 192 through EXTRA_N) are in, whatever BLOCK_K.
    base = [c for c in CONFIGS if (c["BLOCK_M"], c["BLOCK_N"]) in ((128, 128), (128, 256), (256, 128))
            and (c["BLOCK_K"] == 64 or "EXTRA_N" in c.kwargs)]
    # Configs of kernels/matmul/kernel.py's own kernel that its space lacks: deeper or shallower
    # pipelines and other groupings of the 128x192 tile, 192-wide tiles split the other way
    # (64 + 128) or 64 rows high, and BLOCK_K 128 (a row of A or B misaligned to 128 bytes
    # costs one extra line per 256 bytes loaded instead of per 128: the 3000^3 question).
    cand = [matmul_config(*a, **k) for a, k in (
        ((128, 128, 32, 8, 7), dict(extra_n=64)), ((128, 128, 32, 8, 5), dict(group=4, extra_n=64)),
        ((128, 128, 32, 8, 5), dict(group=16, extra_n=64)), ((128, 128, 16, 8, 8), dict(extra_n=64)),
        ((128, 64, 32, 8, 5), dict(extra_n=128)), ((64, 128, 32, 4, 5), dict(extra_n=64)),
        ((128, 128, 64, 8, 3), dict(extra_n=64)), ((128, 256, 128, 8, 2), {}), ((256, 128, 128, 8, 2), {}),
        ((128, 128, 128, 8, 2), dict(extra_n=64)))] if matmul_config else []
    return {
        "baseline": (v_baseline, base or [None]),
        "candidates": (v_baseline, cand or [None]),
        "tma_wide": (v_tma_wide, _rows(TW_KEYS, [
            (128, 128, 64, 64, 8, 3, 0), (128, 128, 64, 64, 8, 4, 0), (128, 128, 64, 32, 8, 5, 0),
            (128, 128, 64, 32, 8, 6, 0), (128, 128, 64, 64, 8, 3, 1), (128, 128, 64, 64, 8, 4, 1),
            (128, 128, 64, 32, 8, 5, 1), (128, 256, 0, 64, 8, 3, 0), (128, 256, 0, 64, 8, 4, 0),
            (128, 256, 0, 64, 8, 3, 1), (128, 128, 0, 64, 8, 4, 0), (128, 128, 0, 64, 4, 3, 0)], G=8)),
        # tma_wide with its K loop warp-specialized (tl.range(warp_specialize=True)): on
        # Triton 3.6 / H200 some of their compiles had not ended after 230 s (call 18).
        "tma_ws": (v_tma_wide, _rows(TW_KEYS, [
            (128, 128, 64, 64, 8, 4, 0), (128, 128, 64, 64, 8, 3, 0), (128, 128, 64, 32, 8, 5, 0),
            (128, 256, 0, 64, 8, 3, 0), (128, 256, 0, 64, 8, 4, 0), (128, 128, 0, 64, 4, 3, 0),
            (128, 128, 0, 64, 8, 4, 0), (128, 256, 0, 64, 8, 3, 1)], G=8, WS=1)),
        # The same, one accumulator only (which of them never finished compiling is the question).
        "tma_ws1": (v_tma_wide, _rows(TW_KEYS, [
            (128, 256, 0, 64, 8, 3, 0), (128, 256, 0, 64, 8, 4, 0), (128, 128, 0, 64, 4, 3, 0),
            (128, 128, 0, 64, 8, 4, 0), (128, 128, 0, 64, 4, 4, 0), (128, 256, 0, 64, 8, 2, 0)], G=8, WS=1)),
        # BLOCK_K 128 (boxes 256 bytes wide): a row of A or B that starts off a 128-byte
        # line costs one more line per 256 bytes rather than per 128 (the 3000^3 question).
        "tma_bk128": (v_tma_wide, _rows(TW_KEYS, [
            (128, 256, 0, 64, 8, 4, 0), (128, 256, 0, 128, 8, 2, 0), (128, 128, 0, 128, 8, 3, 0),
            (128, 128, 0, 128, 4, 3, 0), (128, 128, 64, 128, 8, 2, 0), (256, 128, 0, 128, 8, 2, 0),
            (128, 128, 0, 128, 8, 2, 0), (64, 256, 0, 128, 4, 3, 0)], G=8)),
        # cuBLAS's tile at 3000^3 and 3072^3 (bench/probe_cublas.py): 192 x 192 in four accumulators.
        "quad": (v_quad, _rows(Q_KEYS, [
            (128, 64, 128, 64, 64, 8, 3, 0), (128, 64, 128, 64, 64, 8, 4, 0), (128, 64, 128, 64, 32, 8, 5, 0),
            (128, 64, 128, 64, 32, 8, 6, 0), (128, 64, 128, 64, 64, 8, 3, 1), (128, 64, 128, 64, 64, 8, 4, 1),
            (128, 64, 128, 64, 64, 16, 3, 0), (128, 64, 128, 64, 64, 16, 4, 0), (128, 64, 128, 64, 32, 16, 6, 0),
            (64, 128, 128, 64, 64, 8, 4, 0), (128, 64, 64, 128, 64, 8, 4, 0)], G=8)),
        "tall": (v_tall, _rows(T_KEYS, [
            (128, 128, 64, 64, 8, 3), (128, 128, 64, 64, 8, 4), (128, 128, 64, 32, 8, 5),
            (64, 128, 128, 64, 8, 3)], G=8)),
        "splitk_tail": (v_splitk_tail, _rows(SKT_KEYS, [
            (128, 256, 64, 8, 3, 8, 3), (128, 256, 64, 8, 4, 8, 3), (128, 256, 64, 8, 3, 8, 4),
            (256, 128, 64, 8, 3, 8, 3), (128, 128, 64, 4, 3, 4, 3), (128, 128, 64, 8, 4, 8, 4),
            (128, 256, 64, 8, 3, 4, 3)], G=8)),
        "split_rows": (v_split_rows, _rows(SR_KEYS, [
            (128, 256, 64, 8, 3, 128, 64, 64, 4, 4), (128, 256, 64, 8, 3, 64, 128, 64, 4, 4),
            (128, 256, 64, 8, 4, 128, 64, 64, 4, 4), (128, 256, 64, 8, 3, 128, 128, 64, 8, 3),
            (256, 128, 64, 8, 3, 64, 128, 64, 4, 4), (256, 128, 64, 8, 3, 128, 64, 64, 4, 4),
            (128, 256, 64, 8, 3, 64, 64, 64, 4, 4), (128, 128, 64, 8, 4, 64, 128, 64, 4, 4),
            (128, 128, 64, 8, 4, 128, 64, 64, 4, 4), (128, 128, 64, 4, 4, 64, 64, 64, 4, 4)], G=8)),
        "persistent": (v_persistent, _rows(P_KEYS, [
            (128, 128, 64, 8, 3, 1, 1, 0), (128, 128, 64, 4, 3, 2, 1, 0), (128, 128, 64, 8, 4, 1, 1, 0),
            (128, 256, 64, 8, 3, 1, 1, 0), (128, 256, 64, 8, 4, 1, 1, 0), (256, 128, 64, 8, 3, 1, 1, 0),
            (128, 128, 64, 8, 3, 1, 0, 0), (128, 128, 64, 4, 3, 2, 0, 0),  # flatten off: control
            (128, 128, 64, 8, 3, 1, 1, 1), (128, 256, 64, 8, 3, 1, 1, 1)], G=8)),  # warp-specialized
        "tma_persistent": (v_tma_persistent, _rows(P_KEYS + ("HOST_DESC",), [
            (128, 128, 64, 8, 3, 1, 1, 0, 0), (128, 128, 64, 8, 4, 1, 1, 0, 0), (128, 128, 64, 8, 5, 1, 1, 0, 0),
            (128, 128, 64, 4, 2, 2, 1, 0, 0),  # s2: two CTAs of 96 KB fit an SM, s3 (128 KB) does not
            (128, 256, 64, 8, 3, 1, 1, 0, 0), (256, 128, 64, 8, 3, 1, 1, 0, 0),
            (128, 128, 64, 8, 3, 1, 1, 0, 1), (128, 256, 64, 8, 3, 1, 1, 0, 1),  # host-side descriptors
            (128, 128, 64, 8, 3, 1, 1, 1, 0), (128, 256, 64, 8, 3, 1, 1, 1, 0)], G=8)),
        # Whole waves, then the tail tiles' K split over about one wave; TMA or pointer loads.
        "ticket_tail": (v_ticket_tail, _rows(TT_KEYS, [
            (128, 256, 64, 8, 3, 1, 0, 99), (128, 256, 64, 8, 4, 1, 0, 99), (128, 256, 64, 8, 3, 1, 1, 99),
            (128, 256, 64, 8, 3, 1, 0, 3), (128, 256, 64, 8, 3, 0, 0, 99), (256, 128, 64, 8, 3, 1, 0, 99),
            (128, 128, 64, 8, 4, 1, 0, 99), (128, 128, 64, 8, 4, 1, 1, 99)], G=8)),
        "streamk": (v_streamk, _rows(SK_KEYS, [
            (128, 128, 64, 8, 3, 1, 0, 0), (128, 128, 64, 4, 3, 2, 0, 0), (128, 128, 64, 8, 3, 1, 1, 0),
            (128, 256, 64, 8, 3, 1, 0, 0), (256, 128, 64, 8, 3, 1, 0, 0),
            (128, 128, 64, 8, 3, 1, 0, 1), (128, 128, 64, 4, 2, 2, 0, 1), (128, 128, 64, 8, 3, 1, 1, 1),
            (128, 256, 64, 8, 3, 1, 0, 1), (128, 256, 64, 8, 3, 1, 1, 1)], G=8)),
    }


def cfg_key(cfg) -> str:
    return ",".join(f"{k}={v}" for k, v in cfg.items()) if isinstance(cfg, dict) else str(cfg)


# ----------------------------------------------------------------------------- smoke (CPU)

def main_smoke() -> int:
    """Interpreter check of the index math: non-TMA variants, tiny shapes, fp32/fp16 (the
    interpreter computes garbage for bf16 tl.dot). Each function runs twice: the second run
    checks that the stream-K workspace was left clean."""
    runs, fails, rng = 0, 0, np.random.default_rng(0)
    for (M, N, K), dt, nsms in itertools.product(((67, 45, 39), (33, 70, 50)),
                                                 (torch.float32, torch.float16), (4, 3)):
        a = torch.from_numpy(rng.standard_normal((M, K))).to(dt)
        b = torch.from_numpy(rng.standard_normal((K, N))).to(dt)
        ref = a.double().numpy() @ b.double().numpy()
        for name, (build, cfgs) in variant_configs(smoke=True).items():
            for cfg in cfgs:
                runs += 1
                c = torch.empty(M, N, dtype=dt)
                try:
                    fn, errs = build(a, b, c, cfg, nsms), []
                    for _ in range(2):
                        c.fill_(float("nan"))  # a tile never written shows up as nan
                        fn()
                        errs.append(float(np.abs(c.double().numpy() - ref).max() / np.abs(ref).max()))
                    ok, msg = all(e <= 2e-2 for e in errs), f"err={max(errs):.2e}"
                except Exception as e:  # noqa: BLE001
                    ok, msg = False, first_line(e)
                fails += not ok
                if not ok or nsms == 4:
                    print(f"{'ok  ' if ok else 'FAIL'} {M}x{N}x{K} {str(dt)[6:]:8} SMs={nsms} {name:10} "
                          f"{cfg_key(cfg)}  {msg}")
    print(f"smoke: {runs - fails}/{runs} passed")
    return 1 if fails else 0


# ----------------------------------------------------------------------------- GPU

SHAPES = ((3072, 3072, 3072), (4096, 4096, 4096), (2048, 2048, 2048), (3000, 3000, 3000))
if os.environ.get("EXPLORE_SHAPES"):  # e.g. EXPLORE_SHAPES=3072,3000: cubes only
    SHAPES = tuple((n, n, n) for n in map(int, os.environ["EXPLORE_SHAPES"].split(",")))
DTYPES = ("float16", "bfloat16")
TOL = {"float16": 2e-2, "bfloat16": 4e-2}
DEV = "cuda"
_WORKER_TENSORS: dict = {}


def _set_allocator():
    if HAS_TMA:  # global scratch for the device-side TMA descriptors
        triton.set_allocator(lambda size, align, stream: torch.empty(size, device="cuda", dtype=torch.int8))


def _warm(job):
    """In a worker process: run one config once so that its binary lands in Triton's on-disk
    cache and the timing process only loads it (serial compiles would not fit the budget)."""
    name, idx, dtname, (M, N, K), nsms = job
    try:
        if (dtname, M, N, K) not in _WORKER_TENSORS:
            _WORKER_TENSORS.clear()
            new = lambda r, k: torch.zeros(r, k, device=DEV, dtype=getattr(torch, dtname))  # noqa: E731
            _WORKER_TENSORS[(dtname, M, N, K)] = (new(M, K), new(K, N), new(M, N))
        build, cfgs = variant_configs(False)[name]
        build(*_WORKER_TENSORS[(dtname, M, N, K)], cfgs[idx], nsms)()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - reported again by the timing pass
        return first_line(e)


# Binaries whose compile had not ended at the precompile deadline: the timing pass skips
# them rather than compile them itself (a compile that never ends would take the budget).
UNFINISHED: set = set()


def job_key(name, i, cfg, dt, shape, nsms) -> tuple:
    """One distinct binary: the dtype, whether all dims are multiples of 16 (Triton
    specializes on it) and NUM_PROGS."""
    progs = 0
    if isinstance(cfg, dict) and "OCC" in cfg:
        progs = min(triton.cdiv(shape[0], cfg["BM"]) * triton.cdiv(shape[1], cfg["BN"]), cfg["OCC"] * nsms)
    return (name, i, dt, all(d % 16 == 0 for d in shape), progs)


def precompile(variants, nsms, deadline) -> dict:
    """Compile every config in EXPLORE_JOBS processes, one job per distinct binary: the dtype,
    whether all dims are multiples of 16 (Triton specializes on it) and NUM_PROGS."""
    jobs, keys = [], []
    for shape, dt in itertools.product(SHAPES, DTYPES):
        for name, (_, cfgs) in variants.items():
            for i, cfg in enumerate(cfgs):
                key = job_key(name, i, cfg, dt, shape, nsms)
                if key not in keys:
                    keys.append(key)
                    jobs.append((name, i, dt, shape, nsms))
    n, t0 = int(os.environ.get("EXPLORE_JOBS", min(12, os.cpu_count() or 1))), time.time()
    if n <= 1:
        return {"skipped": "EXPLORE_JOBS <= 1"}
    try:
        ex = cf.ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"), initializer=_set_allocator)
        futs = [ex.submit(_warm, j) for j in jobs]
        done, _ = cf.wait(futs, timeout=max(1.0, deadline - time.time()))
        UNFINISHED.update(k for k, f in zip(keys, futs) if f not in done)
        # No GPU work of theirs while we time, and none left running: a compile that never
        # ends (warp-specialized TMA loops on Triton 3.6, call 18) would block the shutdown.
        for proc in list(getattr(ex, "_processes", {}).values()):
            proc.terminate()
        ex.shutdown(wait=True, cancel_futures=True)
    except Exception as e:  # noqa: BLE001 - a broken pool only means compiling in the timing pass
        print(f"precompile failed ({first_line(e)}); compiling serially")
        return {"error": first_line(e), "seconds": round(time.time() - t0, 1)}
    print(f"precompiled {len(done)}/{len(jobs)} binaries in {time.time() - t0:.0f} s on {n} processes")
    return {"jobs": len(jobs), "done": len(done), "processes": n, "seconds": round(time.time() - t0, 1),
            "unfinished": [list(k) for k in sorted(UNFINISHED)]}


def environment(nsms) -> dict:
    return {**common_environment(), "capability": list(torch.cuda.get_device_capability()), "num_sms": nsms,
            "has_tensor_descriptor": HAS_TMA, "baseline_import_error": BASELINE_ERR}


def bench(fn) -> float:
    try:
        return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
    except TypeError:  # a do_bench without return_mode
        return triton.testing.do_bench(fn, warmup=10, rep=40)


def run_problem(shape, dtname, variants, nsms, deadline, state) -> dict:
    M, N, K = shape
    dt, flop = getattr(torch, dtname), 2.0 * M * N * K
    g = torch.Generator(device=DEV).manual_seed(0)
    a = torch.randn(M, K, device=DEV, dtype=dt, generator=g)
    b = torch.randn(K, N, device=DEV, dtype=dt, generator=g)
    ref = torch.matmul(a.float(), b.float())
    scale = ref.abs().max().item()
    c, c_blas = torch.empty(M, N, device=DEV, dtype=dt), torch.empty(M, N, device=DEV, dtype=dt)
    blas_ms = bench(lambda: torch.matmul(a, b, out=c_blas))
    prob = {"shape": [M, N, K], "dtype": dtname, "cublas_ms": blas_ms, "cublas_tflops": flop / blas_ms / 1e9,
            "variants": {}}

    def check(fn):
        c.fill_(float("nan"))  # a tile never written shows up as nan
        fn()
        err = ((c.float() - ref).abs().max() / scale).item()
        return err if math.isfinite(err) else 1e30  # nan/inf (1e30 keeps the JSON strict)

    for name, (build, cfgs) in variants.items():
        rows = []
        for i, cfg in enumerate(cfgs):
            r = {"config": cfg_key(cfg)}
            rows.append(r)
            if job_key(name, i, cfg, dtname, shape, nsms) in UNFINISHED:
                r["status"] = "skipped (its compile had not ended at the precompile deadline)"
                print(f"  {name} {r['config']}: {r['status']}")
                continue
            if time.time() > deadline:
                if not state["over"]:
                    print("time budget exceeded: the remaining configs and problems are skipped")
                state["over"], r["status"] = True, "skipped (budget)"
                continue
            try:
                t0 = time.time()
                fn = build(a, b, c, cfg, nsms)
                r["err"] = check(fn)
                r["first_call_s"] = round(time.time() - t0, 2)  # seconds: it compiled here
                if r["err"] <= TOL[dtname]:
                    ms = bench(fn)
                    r["err_after_bench"] = check(fn)  # a stream-K workspace left dirty shows here
                    if r["err_after_bench"] <= TOL[dtname]:
                        r.update(status="ok", ms=ms, tflops=flop / ms / 1e9, vs_cublas=blas_ms / ms)
                        continue
                r["status"] = "wrong"
                print(f"  {name} {r['config']}: WRONG, max err {max(r['err'], r.get('err_after_bench', 0)):.3g}")
            except Exception as e:  # noqa: BLE001 - compile error, unsupported API, out of resources
                r.update(status="error", error=first_line(e))
                print(f"  {name} {r['config']}: {r['error']}")
                try:
                    torch.cuda.synchronize()
                except Exception as e2:  # noqa: BLE001 - a sticky CUDA error: nothing more can run
                    state["context_lost"] = first_line(e2)
                    break
        ok = [r for r in rows if r.get("status") == "ok"]
        best = min(ok, key=lambda r: r["ms"]) if ok else None
        note = "skipped (budget)" if all(r.get("status") == "skipped (budget)" for r in rows) else "none valid"
        prob["variants"][name] = {"best": best, "configs": rows, **({} if best else {"note": note})}
        print(f"{M}x{N}x{K} {dtname:8} {name:15} " + (
            f"{best['ms']:.4f} ms  x{best['vs_cublas']:.3f}  {best['config']}" if best else note))
        if "context_lost" in state:
            break
    print(f"{M}x{N}x{K} {dtname:8} {'cuBLAS':15} {blas_ms:.4f} ms")
    return prob


def print_table(problems):
    rows = [("shape", "dtype", "variant", "best config", "ms", "TFLOP/s", "vs cuBLAS")]
    for p in problems:
        if "variants" not in p:
            continue
        s, dt = "x".join(map(str, p["shape"])), p["dtype"]
        rows.append((s, dt, "cuBLAS", "", f"{p['cublas_ms']:.4f}", f"{p['cublas_tflops']:.0f}", "1.000"))
        for name, v in p["variants"].items():
            b = v["best"]
            rows.append((s, dt, name, b["config"], f"{b['ms']:.4f}", f"{b['tflops']:.0f}", f"{b['vs_cublas']:.3f}")
                        if b else (s, dt, name, f"({v['note']})", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    rows.insert(1, tuple("-" * w for w in widths))
    print("\n" + "\n".join("  ".join(x.ljust(w) for x, w in zip(r, widths)) for r in rows))


def main_gpu() -> int:
    t_start = time.time()
    budget = float(os.environ.get("EXPLORE_BUDGET_S", 150))
    deadline = t_start + budget
    nsms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference stays IEEE
    _set_allocator()
    variants = variant_configs(False)
    only = [v for v in os.environ.get("EXPLORE_VARIANTS", "").split(",") if v]
    if only:  # e.g. EXPLORE_VARIANTS=baseline,split_rows
        variants = {k: v for k, v in variants.items() if k in only}
    else:  # run only when named: some of its compiles never ended on Triton 3.6 (call 18)
        variants = {k: v for k, v in variants.items() if k not in NAMED_ONLY}
    out = {"env": environment(nsms), "budget_s": budget, "problems": []}
    e = out["env"]
    print(f"{e['date']} {e['gpu']} ({nsms} SMs) driver {e['driver']} Triton {e['triton']} torch {e['torch']}")
    out["precompile"] = precompile(variants, nsms, t_start + 0.6 * budget)
    state = {"over": False}
    for shape, dtname in itertools.product(SHAPES, DTYPES):
        if "context_lost" in state or time.time() > deadline:
            state["over"] |= "context_lost" not in state
            out["problems"].append({"shape": list(shape), "dtype": dtname, "skipped": "budget or lost context"})
            continue
        try:
            out["problems"].append(run_problem(shape, dtname, variants, nsms, deadline, state))
        except Exception as e:  # noqa: BLE001
            print(f"{shape} {dtname}: {first_line(e)}")
            out["problems"].append({"shape": list(shape), "dtype": dtname, "error": first_line(e)})
    if "context_lost" in state:
        print(f"CUDA context lost ({state['context_lost']}): the run stopped there")
    out.update(budget_exceeded=state["over"], context_lost=state.get("context_lost"),
               elapsed_s=round(time.time() - t_start, 1))
    print_table(out["problems"])
    path = save("explore_gemm_schedules.json", out)
    print(f"\nwrote {path} ({out['elapsed_s']} s"
          f"{', budget exceeded' if state['over'] else ''})")
    return 0


if __name__ == "__main__":
    if SMOKE:
        sys.exit(main_smoke())
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke (TRITON_INTERPRET=1) for the CPU check")
    sys.exit(main_gpu())

"""Convolutions: aten.convolution (not transposed), 1-D and 2-D, in fp16, bf16 and fp32.

Three kernels; the seat's `kind` flag (`seat_kind`) picks one:

- `_conv_gemm_kernel`, an implicit GEMM for every convolution whose groups see more than
  one input channel each (groups=1 and grouped), pointwise ones aside: M = N*H_out*W_out output pixels,
  N = C_out / groups, K = (C_in / groups)*KH*KW. The input patches are gathered on the
  fly (no im2col buffer): one loop runs over (filter tap, block of BLOCK_K input
  channels), so a tap's row offsets and padding masks are computed once per tile and the
  loop stays a single pipelined loop however small C_in is. A second grid axis runs over
  the groups. The kernel is stride-generic; configs with NHWC=1 copy the input
  channels-last (and the weight channels-innermost) first, which vectorizes the gathers.
- `_conv_pointwise_kernel` (kind=pointwise), for 1x1 filters with no padding and one group
  (any stride): per batch entry a plain GEMM Y[n] (C_out x OH*OW) = W (C_out x C_in) @
  X[n] (C_in x OH*OW), X[n] read through the input's own strides (NCHW, channels-last,
  views; the stride scales them), a grid axis over the batch, no pixel split into n/oh/ow
  where the pixel grid is one strided axis, so unit strides vectorize. Most of a ResNet's
  convolutions. Configs with SPLIT_K split C_in over programs (few tiles, long K: 7x7
  maps), fp32 partials summed in split order by `_pointwise_reduce_kernel` (reproducible).
- `_conv_depthwise_kernel`, a direct kernel for depthwise convolutions (one input channel
  per group: groups == C_in, C_out = groups * multiplier; also a C_in=1 convolution): a
  tile of output pixels x channels accumulates KH*KW scaled input windows, no reduction
  over channels and no tensor cores. It ignores BLOCK_K, GROUP_M and NHWC, so at a
  depthwise seat configs that differ only there are refused as `equivalent` (the same code).

The implicit GEMM and depthwise kernels take tiles of BLOCK_M output pixels x BLOCK_N
output channels (with NHWC); the pointwise kernel's configs (PW=1) take BLOCK_M output
channels x BLOCK_N pixels. Each seat launches only its kernel's configs: the others are
refused as `not_applicable`.

A 1-D convolution (input N, C, W) is a 2-D one with H = KH = 1, launched on 4-D views.

fp32 multiplies in IEEE fp32, not TF32. torch leaves `torch.backends.cudnn.allow_tf32`
True, so torch's own fp32 GPU convolutions round inputs to TF32 (10-bit mantissa, errors
near 1e-3 relative); the screen's fp32 tolerance is 1e-4 of max|ref| against an fp64
oracle, which TF32 fails at real reduction lengths, so IEEE is the only certifiable choice.

Launch key: dims (R, W, CI, CO, G) with R = N*H_out (output rows across the batch, the
`default` ladder), W = W_out (the `W` ladder: a 1-D convolution is one row per batch
entry, and its width is the sequence length), CI and CO the channel counts and G the
groups (`default`). The GEMM's M = R*W, N = CO/G and K = CI/G * taps all follow from them.
Flags: `kind` (gemm | depthwise | pointwise: which kernel), `filter` (KHxKW) and `stride` (SHxSW), which
are constexprs of the kernels (the tap loop and the input addressing are compiled for
them, and they set the gather's memory pattern and arithmetic intensity), and `bias`;
pointwise seats also `aligned` (`pointwise_align`: the vector width their pixel rows allow).
Padding and dilation are runtime values (masks and offsets): any config serves any of
them correctly, so they stay out of the seat (but for whether a 1x1 is padded: its kind). Every load and store is masked, so one
config is correct for every shape of a seat. Pointwise seats are screened at tile edges
too (`resized`); the other kinds at the shapes seen.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels import copy
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.matmul import grouped_tile
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.spec import (Config, KernelSpec, KeyDim, NotServable, Problem, one_dtype, seat_flags,
                                   uniform_inputs)
from nbx_tune.oracles import conv as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
INT32_MAX = 2**31 - 1
MAX_GRID_Y = 65535  # the grid's second axis


@triton.jit
def _conv_gemm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,
    M, H, W, OH, OW, CIG, COG,
    sxn, sxc, sxh, sxw,
    swo, swc, swh, sww,
    syn, syc, syh, syw,
    sb,
    pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr = 1, s_split=0,
):
    # SPLIT_K > 1: program (tile, group, split) runs its share of the (tap, channel block)
    # loop and stores fp32 partials at y + split * s_split (a workspace shaped like y, no
    # bias); `_pointwise_reduce_kernel` sums them in split order: reproducible.
    pid = tl.program_id(0)
    g = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(COG, BLOCK_N), GROUP_M)

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Pixels and channels past the edge wrap to valid ones: the store is masked.
    ram = rm % M
    ohw = OH * OW
    n = ram // ohw
    pix = ram % ohw
    oh = pix // OW
    ow = pix % OW
    ih0 = oh * STRIDE_H - pad_h
    iw0 = ow * STRIDE_W - pad_w
    co = g * COG + rn % COG
    x_m = x_ptr + n * sxn + (g * CIG) * sxc + ih0 * sxh + iw0 * sxw  # tap (0, 0), channel 0
    w_n = w_ptr + co * swo

    cblocks = tl.cdiv(CIG, BLOCK_K)
    t_lo = 0
    t_hi = KH * KW * cblocks
    if SPLIT_K > 1:
        per = tl.cdiv(t_hi, SPLIT_K)
        t_lo = tl.program_id(2) * per
        t_hi = tl.minimum(t_hi, t_lo + per)
        y_ptr += tl.program_id(2).to(tl.int64) * s_split
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(t_lo, t_hi):
        tap = t // cblocks
        c0 = (t - tap * cblocks) * BLOCK_K
        kh = tap // KW
        kw = tap - kh * KW
        ih = ih0 + kh * dil_h
        iw = iw0 + kw * dil_w
        m_ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        ci = c0 + rk
        k_ok = ci < CIG
        a = tl.load(x_m[:, None] + (kh * dil_h * sxh + kw * dil_w * sxw) + ci[None, :] * sxc,
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_n[None, :] + ci[:, None] * swc + (kh * swh + kw * sww),
                    mask=k_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

    if HAS_BIAS:
        acc += tl.load(b_ptr + co * sb).to(tl.float32)[None, :]
    y_ptrs = y_ptr + (n * syn + oh * syh + ow * syw)[:, None] + (co * syc)[None, :]
    mask = (rm < M)[:, None] & (rn < COG)[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


_conv_gemm_kernel = launch.recorded(_conv_gemm_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def _conv_depthwise_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,
    M, CO, H, W, OH, OW, MULT,
    sxn, sxc, sxh, sxw,
    swo, swh, sww,
    syn, syc, syh, syw,
    sb,
    pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_in = rm < M
    n_in = rn < CO
    ohw = OH * OW
    n = rm // ohw
    pix = rm % ohw
    oh = pix // OW
    ow = pix % OW
    ih0 = oh * STRIDE_H - pad_h
    iw0 = ow * STRIDE_W - pad_w
    ci = rn // MULT  # output channel co reads input channel co // multiplier
    x_m = x_ptr + n * sxn + ih0 * sxh + iw0 * sxw
    x_c = ci * sxc
    w_n = w_ptr + rn * swo

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kh in range(KH):
        ih = ih0 + kh * dil_h
        h_ok = m_in & (ih >= 0) & (ih < H)
        for kw in tl.static_range(KW):
            iw = iw0 + kw * dil_w
            ok = h_ok & (iw >= 0) & (iw < W)
            xv = tl.load(x_m[:, None] + (kh * dil_h * sxh + kw * dil_w * sxw) + x_c[None, :],
                         mask=ok[:, None] & n_in[None, :], other=0.0)
            wv = tl.load(w_n + (kh * swh + kw * sww), mask=n_in, other=0.0)
            acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]

    if HAS_BIAS:
        acc += tl.load(b_ptr + rn * sb, mask=n_in, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + (n * syn + oh * syh + ow * syw)[:, None] + (rn * syc)[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_in[:, None] & n_in[None, :])


_conv_depthwise_kernel = launch.recorded(_conv_depthwise_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def _conv_pointwise_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,
    P, OW, CI, CO,
    sxn, sxc, sxh, sxw,
    swo, swc,
    syn, syc, syh, syw,
    sb, s_split,
    FLAT: tl.constexpr, ALIGN: tl.constexpr, HAS_BIAS: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr = 1,
):
    # Y[n] (CO x P) = W (CO x CI) @ X[n] (CI x P), one plain GEMM per batch entry (grid
    # axis 1), P = OH*OW output pixels; sxh, sxw step the input by one output row / column
    # (the convolution's stride folded in by the launch). FLAT (stride 1, `pixels_flat`):
    # both pixel grids are one strided axis, so no pixel is split into (oh, ow) and unit
    # strides stay visible to the compiler (16-byte vector loads).
    if ALIGN > 1:
        # No-ops at run time (`pointwise_align`): they tell the compiler what Triton's
        # specialization (multiples of 16 only) cannot, that P = 196 is a multiple of 4 and
        # so is every pixel row's start: rows load as asynchronous 8-byte copies, not
        # element by element.
        P = P // ALIGN * ALIGN
        sxn = sxn // ALIGN * ALIGN
        sxc = sxc // ALIGN * ALIGN
        syn = syn // ALIGN * ALIGN
        syc = syc // ALIGN * ALIGN
    pid = tl.program_id(0)
    n = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(CO, BLOCK_M), tl.cdiv(P, BLOCK_N), GROUP_M)

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Channels and pixels past the edge wrap to valid ones: loads need only the K mask,
    # and the store is masked.
    co = rm % CO
    pix = rn % P
    if FLAT:
        x_pix = pix * sxw
        y_pix = rn * syw
    else:
        x_pix = (pix // OW) * sxh + (pix % OW) * sxw
        y_pix = (rn // OW) * syh + (rn % OW) * syw
    w_ptrs = w_ptr + co[:, None] * swo + rk[None, :] * swc
    x_ptrs = x_ptr + n * sxn + rk[:, None] * sxc + x_pix[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SPLIT_K == 1:
        for k in range(0, tl.cdiv(CI, BLOCK_K)):
            k_left = CI - k * BLOCK_K
            a = tl.load(w_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(x_ptrs, mask=rk[:, None] < k_left, other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            w_ptrs += BLOCK_K * swc
            x_ptrs += BLOCK_K * sxc
    else:
        # Split-K: program (tile, n, split) sums whole BLOCK_K blocks of its share of C_in
        # into an fp32 partial (y is the workspace, s_split apart); `_pointwise_reduce_kernel`
        # adds the partials in split order, so results are bitwise reproducible.
        split = tl.program_id(2)
        per = tl.cdiv(tl.cdiv(CI, BLOCK_K), SPLIT_K) * BLOCK_K
        k_lo = split * per
        k_hi = tl.minimum(CI, k_lo + per)  # below k_lo for an empty split: no iteration
        w_ptrs += k_lo * swc
        x_ptrs += k_lo * sxc
        for k in range(k_lo, k_hi, BLOCK_K):
            k_left = k_hi - k
            a = tl.load(w_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(x_ptrs, mask=rk[:, None] < k_left, other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            w_ptrs += BLOCK_K * swc
            x_ptrs += BLOCK_K * sxc
        y_ptr += split.to(tl.int64) * s_split

    if HAS_BIAS:
        acc += tl.load(b_ptr + co * sb).to(tl.float32)[:, None]
    y_ptrs = y_ptr + n * syn + (rm * syc)[:, None] + y_pix[None, :]
    mask = (rm < CO)[:, None] & (rn < P)[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)


_conv_pointwise_kernel = launch.recorded(_conv_pointwise_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def _pointwise_reduce_kernel(
    ws_ptr, b_ptr, y_ptr, TOTAL, CO, P, OW, s_split, syn, syc, syh, syw, sb,
    HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
):
    # y = (the SPLIT_K fp32 partials of the workspace (SPLIT_K, N, CO, P), summed in split
    # order) [+ bias], cast and stored through y's strides.
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = idx < TOTAL
    acc = tl.load(ws_ptr + idx, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(ws_ptr + s * s_split + idx, mask=ok, other=0.0)
    pix = idx % P
    nc = idx // P
    co = nc % CO
    n = nc // CO
    if HAS_BIAS:
        acc += tl.load(b_ptr + co * sb, mask=ok, other=0.0).to(tl.float32)
    y_ptrs = y_ptr + n * syn + co * syc + (pix // OW) * syh + (pix % OW) * syw
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=ok)


_pointwise_reduce_kernel = launch.recorded(_pointwise_reduce_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_conv_gemm(x, w, bias, y, stride, padding, dilation, groups: int, config: Config) -> None:
    """y = conv(x, w) [+ bias] by implicit GEMM: x (N, C_in, H, W), w (C_out, C_in/groups,
    KH, KW), y (N, C_out, H_out, W_out), any strides; bias (C_out,) or None.

    A config with NHWC=1 first copies x channels-last and w to (KH, KW, C_in, C_out) order:
    the kernel is stride-generic, and with unit channel strides its input and weight tiles
    load as 16-byte vectors. The copies are part of what the config costs, so the tuner
    weighs them (they win on large compute-bound convolutions, lose on small ones)."""
    if config["NHWC"]:
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.permute(2, 3, 1, 0).contiguous().permute(3, 2, 0, 1)
    nb, _, h, wd = x.shape
    co, cig, kh, kw = w.shape
    oh, ow = y.shape[2], y.shape[3]
    m = nb * oh * ow
    cog = co // groups
    sk = config.kwargs.get("SPLIT_K", 1)
    out, has_bias = y, bias is not None
    if sk > 1:  # fp32 partials in a workspace (SPLIT_K, N, C_out, OH, OW), reduced below
        out, has_bias = launch.empty((sk, nb, co, oh, ow), torch.float32, x.device), False
    grid = (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(cog, config["BLOCK_N"]), groups, sk)
    _conv_gemm_kernel[grid](
        x, w, out if bias is None else bias, out,
        m, h, wd, oh, ow, cig, cog,
        *x.stride(), *w.stride(), *out.stride()[-4:], 0 if bias is None else bias.stride(0),
        padding[0], padding[1], dilation[0], dilation[1],
        KH=kh, KW=kw, STRIDE_H=stride[0], STRIDE_W=stride[1],
        HAS_BIAS=has_bias,
        INPUT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"],
        GROUP_M=config["GROUP_M"], SPLIT_K=sk, s_split=out.stride(0) if sk > 1 else 0,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if sk > 1:
        total, block = nb * co * oh * ow, 1024
        _pointwise_reduce_kernel[(triton.cdiv(total, block),)](
            out, y if bias is None else bias, y, total, co, oh * ow, ow, out.stride(0), *y.stride(),
            0 if bias is None else bias.stride(0), HAS_BIAS=bias is not None, SPLIT_K=sk, BLOCK=block,
            num_warps=4,
        )


def launch_conv_depthwise(x, w, bias, y, stride, padding, dilation, config: Config) -> None:
    """y = conv(x, w) [+ bias] with one input channel per group: w (C_out, 1, KH, KW),
    output channel co reads input channel co // (C_out / C_in)."""
    nb, ci, h, wd = x.shape
    co, _, kh, kw = w.shape
    oh, ow = y.shape[2], y.shape[3]
    m = nb * oh * ow
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    grid = (triton.cdiv(m, bm), triton.cdiv(co, bn))
    _conv_depthwise_kernel[grid](
        x, w, y if bias is None else bias, y,
        m, co, h, wd, oh, ow, co // ci,
        *x.stride(), w.stride(0), w.stride(2), w.stride(3), *y.stride(),
        0 if bias is None else bias.stride(0),
        padding[0], padding[1], dilation[0], dilation[1],
        KH=kh, KW=kw, STRIDE_H=stride[0], STRIDE_W=stride[1], HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=bn, num_warps=config.num_warps, num_stages=config.num_stages,
    )


def pixels_flat(t) -> bool:
    """Whether a 4-D tensor's pixel grid (H, W) is one strided axis: one row, or rows one
    row's length apart (NCHW and channels-last tensors)."""
    return t.shape[2] == 1 or t.stride(2) == t.shape[3] * t.stride(3)


def pointwise_align(p: int, x_strides, y_strides, flat: bool, esize: int) -> int:
    """A pointwise seat's `aligned` flag and its kernel's ALIGN: on the flat path with unit
    pixel strides (NCHW), the largest power of two of elements, up to a 16-byte vector,
    that P and the batch and channel strides of x and y are all multiples of; else 1.
    It changes the compiled code (vector width, asynchronous copies), so it is in the seat."""
    if not flat or x_strides[3] != 1 or y_strides[3] != 1:
        return 1
    a = 16 // esize
    while a > 1 and (p % a or x_strides[0] % a or x_strides[1] % a or y_strides[0] % a or y_strides[1] % a):
        a //= 2
    return a


def launch_conv_pointwise(x, w, bias, y, stride, config: Config) -> None:
    """y = conv(x, w) [+ bias] for a 1x1 filter, no padding, one group: per batch entry the
    GEMM W (C_out x C_in) @ X[n] (C_in x OH*OW), read through x's own strides (NCHW,
    channels-last or a view). A strided convolution's pixels are gathered into a dense
    tensor first, so every seat runs the flat pixel path on contiguous tensors (`_conv`
    stages an input whose pixels are not flat the same way): served code is what the
    census screened."""
    if stride[0] != 1 or stride[1] != 1:
        # The stride's pixels gathered dense first (the copy kernel, exact): the flat path's
        # vector loads then beat loading every pixel alone by 2-4x on a downsample.
        x, stride = copy.dense(x[:, :, ::stride[0], ::stride[1]]), (1, 1)
    if config.kwargs.get("PAD") and y.shape[2] * y.shape[3] % 2:
        _launch_padded(x, w, bias, y, config)
        return
    nb = x.shape[0]
    co, ci = w.shape[0], w.shape[1]
    oh, ow = y.shape[2], y.shape[3]
    sxn, sxc, sxh, sxw = x.stride()
    syn, syc, syh, syw = y.stride()
    flat = pixels_flat(x) and pixels_flat(y)
    p = oh * ow
    sk = config.kwargs.get("SPLIT_K", 1)
    out, has_bias = y, bias is not None
    if sk > 1:  # fp32 partials in a workspace, then `_pointwise_reduce_kernel` writes y
        out, has_bias = launch.empty((sk, nb, co, oh, ow), torch.float32, x.device), False
        syn, syc, syh, syw = out.stride()[1:]
    align = pointwise_align(p, x.stride(), (syn, syc, syh, syw), flat, x.element_size())
    grid = (triton.cdiv(co, config["BLOCK_M"]) * triton.cdiv(p, config["BLOCK_N"]), nb, sk)
    _conv_pointwise_kernel[grid](
        x, w, out if bias is None else bias, out,
        p, ow, ci, co,
        sxn, sxc, sxh, sxw, w.stride(0), w.stride(1), syn, syc, syh, syw,
        0 if bias is None else bias.stride(0), out.stride(0) if sk > 1 else 0,
        FLAT=flat, ALIGN=align, HAS_BIAS=has_bias,
        INPUT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"],
        GROUP_M=config["GROUP_M"], SPLIT_K=sk, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if sk > 1:
        total, block = nb * co * p, 1024
        _pointwise_reduce_kernel[(triton.cdiv(total, block),)](
            out, y if bias is None else bias, y, total, co, p, ow, out.stride(0), *y.stride(),
            0 if bias is None else bias.stride(0), HAS_BIAS=bias is not None, SPLIT_K=sk, BLOCK=block,
            num_warps=4,
        )


def _pixel_rows(nb: int, c: int, oh: int, ow: int, pp: int, like):
    """(a (nb, c, 1, pp) buffer from `launch.empty`, the (nb, c, oh, ow) view of its first
    oh * ow pixels a row)."""
    buf = launch.empty((nb, c, 1, pp), like.dtype, like.device)
    return buf, buf.as_strided((nb, c, oh, ow), (c * pp, pp, ow, 1))


def _launch_padded(x, w, bias, y, config: Config) -> None:
    """`launch_conv_pointwise` for a PAD config at an odd pixel count (7 x 7 = 49): x
    copied into pixel rows padded to a 16-byte multiple, the kernel run over the padded rows
    (16-byte vector loads, where 49-pixel rows load one element at a time; a padding
    pixel's column of the product is its own and never stored), y copied out of padded rows."""
    nb, ci, oh, ow = x.shape
    co = w.shape[0]
    vec = 16 // x.element_size()
    pp = -(-(oh * ow) // vec) * vec
    xs, xv = _pixel_rows(nb, ci, oh, ow, pp, x)
    copy.launch_copy_plan(x, xv, copy.copy_plan(tuple(x.shape), x.stride(), xv.stride()), copy.STAGING)
    ys, yv = _pixel_rows(nb, co, oh, ow, pp, y)
    launch_conv_pointwise(xs, w, bias, ys, (1, 1), dataclasses.replace(config, meta=tuple(
        (k, v) for k, v in config.meta if k != "PAD")))
    copy.launch_copy_plan(yv, y, copy.copy_plan(tuple(y.shape), yv.stride(), y.stride()), copy.STAGING)


def _c(bm, bn, bk, warps, stages, nhwc=0, group=8, split=1):
    return Config.make(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, NHWC=nhwc,
                       **({"SPLIT_K": split} if split > 1 else {}), num_warps=warps, num_stages=stages)


# GEMM tiles as matmul's, plus the tall-narrow ones a convolution needs: C_out of 16-64
# against M = N*H_out*W_out in the hundreds of thousands (stems, early layers, UNet/VAE
# heads), and BLOCK_K=16 for few input channels per tap (C_in = 3, grouped convs). The same
# tall-narrow tiles are the depthwise kernel's good ones (many contiguous pixels of few
# channels). 128x256x64 at 4 stages (192 KB in fp16) is refused by the shared-memory
# prune outside Hopper/Blackwell: the space is the same on every device.
GEMM_CONFIGS = (
    _c(32, 32, 16, 2, 2), _c(32, 32, 32, 4, 2), _c(64, 32, 32, 4, 2), _c(64, 64, 16, 4, 3),
    _c(64, 64, 32, 4, 2), _c(64, 64, 32, 4, 3), _c(64, 64, 64, 4, 3), _c(128, 16, 32, 4, 2),
    _c(128, 32, 16, 4, 3), _c(128, 32, 32, 4, 3), _c(256, 16, 32, 4, 3), _c(256, 32, 32, 8, 3),
    _c(256, 32, 64, 8, 3), _c(512, 16, 32, 8, 2), _c(512, 32, 32, 8, 2), _c(64, 128, 32, 4, 3),
    _c(128, 64, 16, 4, 3), _c(128, 64, 32, 4, 3), _c(128, 64, 32, 4, 4), _c(64, 128, 64, 4, 3),
    _c(128, 64, 64, 4, 3), _c(128, 64, 64, 8, 4), _c(128, 128, 32, 4, 3), _c(128, 128, 32, 8, 3),
    _c(128, 128, 32, 8, 4), _c(128, 128, 64, 4, 3), _c(128, 128, 64, 8, 3), _c(128, 128, 64, 8, 4),
    _c(256, 64, 32, 8, 3), _c(256, 64, 64, 8, 3), _c(64, 256, 32, 8, 3), _c(256, 128, 32, 8, 3),
    _c(256, 128, 64, 8, 3), _c(128, 256, 32, 8, 3), _c(128, 256, 64, 8, 3), _c(128, 256, 64, 8, 4),
    # Channels-last copies first (NHWC=1): worth their copies where many input channels
    # make NCHW's gathers the bottleneck (wide late layers), a loss on small ones; the
    # tuner decides per seat. The two smallest fit 64 KB of shared memory in fp32.
    _c(64, 64, 32, 4, 3, 1), _c(128, 64, 32, 4, 3, 1), _c(64, 128, 64, 4, 3, 1),
    _c(128, 128, 32, 4, 3, 1), _c(128, 128, 64, 4, 3, 1), _c(128, 128, 64, 8, 4, 1),
    _c(256, 32, 32, 8, 3, 1), _c(256, 128, 64, 8, 3, 1), _c(128, 256, 32, 8, 3, 1),
    _c(128, 256, 64, 8, 3, 1),
    # Split-K over the (tap, channel block) loop for 3x3 convolutions on 7x7 and 14x14 maps
    # (512 -> 512 at 7x7 in a batch of 8 is 56 tiles of 64 x 64 for 132 SMs, K = 4608):
    # refused where the tiles already fill the machine or the loop is short (`_split_refusal`).
    _c(64, 64, 64, 4, 4, 1, split=2), _c(64, 64, 64, 4, 4, 1, split=4), _c(64, 128, 64, 4, 3, 1, split=2),
    _c(64, 128, 64, 4, 3, 1, split=4), _c(128, 64, 64, 4, 3, 1, split=4), _c(64, 64, 32, 4, 3, split=4),
)


def _pw(bm, bn, bk, warps, stages, group=8, split=1, pad=0):
    return Config.make(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, PW=1,
                       **({"SPLIT_K": split} if split > 1 else {}), **({"PAD": 1} if pad else {}),
                       num_warps=warps, num_stages=stages)


# The pointwise kernel's tiles (PW=1): BLOCK_M output channels x BLOCK_N pixels of one
# batch entry. A ResNet 1x1 is a GEMM with M = C_out 64..2048, N = OH*OW 49..3136 and
# K = C_in 64..2048 per batch entry of a few: 7x7 and 14x14 maps give few large tiles for
# 132 SMs, so small tiles with deep pipelines are here beside the large ones.
POINTWISE_CONFIGS = (
    _pw(32, 64, 64, 4, 4), _pw(64, 32, 64, 4, 4), _pw(32, 64, 32, 4, 4), _pw(64, 64, 32, 4, 3),
    _pw(64, 64, 64, 4, 3), _pw(64, 64, 64, 4, 4), _pw(64, 64, 64, 4, 5), _pw(64, 64, 128, 4, 3),
    _pw(128, 64, 32, 4, 3), _pw(128, 64, 64, 4, 3), _pw(128, 64, 64, 4, 4), _pw(128, 64, 64, 8, 4),
    _pw(64, 128, 64, 4, 3), _pw(64, 128, 64, 4, 4), _pw(128, 128, 32, 4, 3), _pw(128, 128, 64, 4, 3),
    _pw(128, 128, 64, 8, 4), _pw(128, 256, 64, 8, 3), _pw(256, 128, 64, 8, 3),
    # Split-K for 7x7 and 14x14 maps with a long C_in (2048 -> 512 at 7x7 is 64 tiles of
    # 64 x 64 in a batch of 8): refused where the tiles already fill the machine or K is
    # short (`_split_refusal`).
    _pw(64, 64, 64, 4, 4, split=2), _pw(64, 64, 64, 4, 4, split=4), _pw(32, 64, 128, 4, 3, split=4),
    # PAD: odd pixel counts (7 x 7 maps) run on pixel rows padded to 16 bytes, copies in and
    # out included (`_launch_padded`); refused at seats whose rows are aligned already.
    _pw(64, 64, 64, 4, 4, pad=1), _pw(64, 64, 64, 4, 4, split=2, pad=1), _pw(64, 64, 64, 4, 4, split=4, pad=1),
    _pw(128, 64, 64, 4, 3, pad=1), _pw(64, 64, 128, 4, 3, pad=1),
)
CONFIGS = GEMM_CONFIGS + POINTWISE_CONFIGS

# Served when a seat has no certificate: the first that fits the device, after the one
# `_gemm_defaults` picks for the seat's channels per group.
DEFAULTS = (_c(128, 128, 32, 4, 3), _c(64, 64, 32, 4, 2), _c(32, 32, 32, 4, 2))
# For depthwise seats (their equivalence class representative is served).
DEPTHWISE_DEFAULTS = (_c(128, 32, 32, 4, 3), _c(64, 32, 32, 4, 2), _c(32, 32, 32, 4, 2))
# For pointwise seats; the last fits 64 KB of shared memory in fp32.
POINTWISE_DEFAULTS = (_pw(128, 64, 64, 4, 3), _pw(64, 64, 64, 4, 3), _pw(64, 64, 32, 4, 3))


def _gemm_defaults(problem: Problem) -> tuple:
    """A narrow tile for few output channels per group, BLOCK_K=16 for few input channels:
    a wide tile over a group of 8 output channels computes mostly masked lanes."""
    _, _, ci, co, groups = problem.dims
    cog, cig = co // groups, ci // groups
    bk = 16 if cig < 32 else 32
    if cog <= 16:
        first = _c(128, 16, 32, 4, 2)
    elif cog <= 32:
        first = _c(128, 32, bk, 4, 3)
    elif cog <= 64 or bk == 16:
        first = _c(128, 64, 64 if bk == 32 else 16, 4, 3)
    else:
        first = _c(128, 128, 32, 4, 3)
    return (first, *DEFAULTS)


def _pointwise_defaults(problem: Problem) -> tuple:
    """64 output channels a tile where 128 would leave fewer than 256 programs (C_out 512
    over 8 x 7 x 7 pixels is 32): a long K over few programs leaves most SMs idle."""
    r, ow, _, co, _ = problem.dims
    if triton.cdiv(co, 128) * triton.cdiv(r * ow, 64) < 256:
        return (_pw(64, 64, 64, 4, 3), *POINTWISE_DEFAULTS)
    return POINTWISE_DEFAULTS


def _parse_pair(text: str) -> tuple[int, int]:
    a, b = text.split("x")
    return int(a), int(b)


def seat_kind(cig: int, groups: int, kh: int, kw: int, padding, nb: int) -> str:
    """The seat's `kind` flag, which picks the kernel: `depthwise` for one input channel
    per group, `pointwise` for a 1x1 filter with no padding and one group (any stride, any
    dilation: a 1x1 tap has no spread), `gemm` for the rest."""
    if cig == 1:
        return "depthwise"
    if groups == 1 and kh == 1 and kw == 1 and tuple(padding) == (0, 0) and nb <= MAX_GRID_Y:
        return "pointwise"
    return "gemm"


# Split-K pays a pass over its fp32 workspace: as matmul's SPLIT_MAX_TILES, with this many
# output tiles unsplit the machine is already full.
SPLIT_MAX_TILES = 256


def _split_refusal(config: Config, problem: Problem) -> tuple[str, str] | None:
    """("not_applicable", why) for a split-K config at a seat it cannot help (judged at the
    seat's shape; a split config is correct at any shape)."""
    sk = config.kwargs.get("SPLIT_K", 1)
    if sk == 1:
        return None
    r, ow, ci, co, groups = problem.dims
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    kind = _kind(problem)
    if kind == "depthwise":
        return ("not_applicable", "the depthwise kernel has no reduction to split")
    if kind == "gemm":  # tiles of pixels x output channels, K = taps x channel blocks
        kh, kw = _parse_pair(dict(problem.flags)["filter"])
        blocks = kh * kw * triton.cdiv(ci // groups, bk)
        if blocks < 2 * sk:
            return ("not_applicable", f"SPLIT_K {sk} over {blocks} blocks of taps x {bk} channels: fewer than 2 a split")
        tiles = triton.cdiv(r * ow, bm) * triton.cdiv(co // groups, bn) * groups
    elif ci < 2 * sk * bk:
        return ("not_applicable", f"SPLIT_K {sk} over C_in {ci}: fewer than 2 blocks of {bk} per split")
    else:
        nb = problem.get("batch")
        tiles = (nb * triton.cdiv(r // nb * ow, bn) if nb else triton.cdiv(r * ow, bn)) * triton.cdiv(co, bm)
    if tiles >= SPLIT_MAX_TILES:
        return ("not_applicable", f"{tiles} output tiles without a split (>= {SPLIT_MAX_TILES}): nothing to gain")
    if sk * r * ow * co > INT32_MAX:
        return ("not_applicable", f"a workspace of {sk} x {r * ow * co} elements (indexed in int32)")
    return None


def _rows_unaligned(problem: Problem) -> bool | None:
    """Whether a pointwise seat's pixel rows load one element at a time (its `aligned` flag
    is 1: an odd pixel count in NCHW), a PAD config's case; None at other kinds."""
    if _kind(problem) != "pointwise":
        return None
    return dict(problem.flags).get("aligned") == "1"


def _kind(problem: Problem) -> str:
    return dict(problem.flags).get("kind", "gemm")


def _is_depthwise(problem: Problem) -> bool:
    return _kind(problem) == "depthwise"


def _is_pointwise_config(config: Config) -> bool:
    return config.kwargs.get("PW", 0) == 1


def _spatial(p, name: str, nd: int, default: int):
    v = p.ints(name, (default,) * nd)
    if len(v) == 1:
        v = v * nd  # aten expands a one-element list to every spatial axis
    if len(v) != nd:
        raise ValueError(f"{name} has {len(v)} values for a {nd}-D convolution")
    return v


class ConvSpec(KernelSpec):
    name = "conv"
    ops = ("aten.convolution",)
    key = (KeyDim("R"), KeyDim("W", "W"), KeyDim("CI"), KeyDim("CO"), KeyDim("G"))
    dtypes = tuple(TORCH_DTYPES)
    description = "1-D/2-D convolution: implicit GEMM (groups >= 1) and direct depthwise"

    config_space = CONFIGS
    default_configs = DEFAULTS
    # Timed as a model under CUDA graphs runs it: one flushed launch at a time picked
    # replay's best config at few ResNet convolutions and lost up to a quarter at the others
    # (bench/timing_agreement.py; docs/benchmarks.md).
    timing = "stream"

    def default_config(self, profile, problem):
        if _kind(problem) == "pointwise":
            for c in _pointwise_defaults(problem):
                if not self.static_refusal(profile, c, problem):
                    return c
            return POINTWISE_DEFAULTS[-1]
        if not _is_depthwise(problem):
            for c in _gemm_defaults(problem):
                if not self.static_refusal(profile, c, problem):
                    return c
            return DEFAULTS[-1]
        for c in DEPTHWISE_DEFAULTS:
            rep = self._representative(profile, c, problem)
            if rep is not None:
                return rep
        return DEPTHWISE_DEFAULTS[-1]

    def smem_bytes(self, config, problem):
        if _is_depthwise(problem):
            return 0  # element-wise tiles: no dot, no reduction, no layout exchange
        # The software pipeliner keeps num_stages copies of an input tile and a weight tile.
        esize = 4 if problem.dtypes[0] == "float32" else 2
        return max(config.num_stages, 1) * (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"] * esize

    # The depthwise kernel compiles only BLOCK_M, BLOCK_N and the launch options (not
    # BLOCK_K, GROUP_M, NHWC): configs
    # that agree on those are one candidate there, served by the first that the profile admits.
    @staticmethod
    def _depthwise_ident(profile, c: Config) -> tuple:
        return (c["BLOCK_M"], c["BLOCK_N"], *(getattr(c, o) for o in profile.launch_options))

    def _representative(self, profile, config: Config, problem: Problem) -> Config | None:
        ident = self._depthwise_ident(profile, config)
        for c in GEMM_CONFIGS:
            if self._depthwise_ident(profile, c) == ident and super().static_refusal(profile, c, problem) is None:
                return c
        return None

    def static_refusal(self, profile, config, problem):
        # The seat's kind picks the kernel; a config is for the pointwise kernel (PW=1) or
        # for the implicit GEMM and depthwise ones, never both.
        if _is_pointwise_config(config) != (_kind(problem) == "pointwise"):
            return ("not_applicable", f"a config of the {'pointwise' if _is_pointwise_config(config) else 'implicit GEMM'} "
                                      f"kernel at a {_kind(problem)} seat")
        split = _split_refusal(config, problem)
        if split:
            return split
        if config.kwargs.get("PAD") and _rows_unaligned(problem) is False:
            return ("not_applicable", "PAD pads pixel rows that are not aligned; this seat's are")
        why = super().static_refusal(profile, config, problem)
        if why is not None or not _is_depthwise(problem):
            return why
        rep = self._representative(profile, config, problem)
        if rep is not None and rep != config:
            return ("equivalent",
                    f"same code as {rep} at a depthwise seat on {profile.name}: the direct kernel "
                    "compiles only BLOCK_M, BLOCK_N and the launch options "
                    f"({', '.join(profile.launch_options) or 'none'})")
        return None

    def source_parts(self):
        return (_conv_gemm_kernel, _conv_depthwise_kernel, _conv_pointwise_kernel, _pointwise_reduce_kernel,
                launch_conv_gemm,
                launch_conv_depthwise, launch_conv_pointwise, _launch_padded, _pixel_rows, seat_kind, pixels_flat,
                pointwise_align,
                copy.dense, copy.contiguous_strides, copy.copy_plan, copy.launch_copy_plan, copy._copy_kernel,
                copy.block_start, copy.strided_offsets, grouped_tile)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        def conv(dt, x, w, bias, stride, padding, dilation, groups):
            nd = len(x) - 2
            shapes = [x, w] + ([(w[0],)] if bias else [])
            sp = lambda v: "x".join([str(v)] * nd)  # noqa: E731
            params = {} if bias else {"bias": "None"}
            params.update(stride=sp(stride), padding=sp(padding), dilation=sp(dilation),
                          transposed="False", output_padding=sp(0), groups=str(groups))
            return make_row("aten.convolution", [dt] * len(shapes), shapes, params)

        rows = []
        for dt in self.dtypes:
            if scale == "small":
                rows += [
                    conv(dt, (2, 3, 11, 13), (5, 3, 3, 3), True, 1, 1, 1, 1),
                    conv(dt, (2, 3, 11, 13), (5, 3, 3, 3), False, 2, 1, 2, 1),
                    conv(dt, (2, 7, 9, 10), (6, 7, 1, 1), True, 1, 0, 1, 1),
                    conv(dt, (2, 6, 8, 9), (9, 2, 3, 3), True, 1, 1, 1, 3),
                    conv(dt, (2, 6, 9, 10), (6, 1, 3, 3), False, 1, 1, 1, 6),
                    conv(dt, (2, 4, 37), (7, 4, 5), True, 1, 2, 1, 1),
                    conv(dt, (2, 5, 41), (10, 1, 4), True, 1, 3, 1, 5),
                    conv(dt, (2, 9, 11, 13), (5, 9, 1, 1), False, 2, 0, 1, 1),  # pointwise, strided
                ]
            else:
                rows += [
                    conv(dt, (8, 64, 56, 56), (64, 64, 3, 3), False, 1, 1, 1, 1),
                    conv(dt, (8, 256, 56, 56), (512, 256, 1, 1), False, 2, 0, 1, 1),
                    conv(dt, (2, 320, 64, 64), (320, 320, 3, 3), True, 1, 1, 1, 1),
                    conv(dt, (8, 256, 28, 28), (256, 8, 3, 3), False, 1, 1, 1, 32),
                    conv(dt, (8, 96, 112, 112), (96, 1, 3, 3), False, 1, 1, 1, 96),
                    conv(dt, (4, 80, 3001), (384, 80, 3), True, 1, 1, 1, 1),
                    conv(dt, (2, 1536, 1027), (1536, 1, 4), True, 1, 3, 1, 1536),
                    # pointwise (1x1, no padding): ResNet-50's at batch 8, an odd one, a 1-D one
                    conv(dt, (8, 2048, 7, 7), (512, 2048, 1, 1), False, 1, 0, 1, 1),
                    conv(dt, (8, 64, 56, 56), (256, 64, 1, 1), False, 1, 0, 1, 1),
                    conv(dt, (8, 512, 28, 28), (128, 512, 1, 1), False, 1, 0, 1, 1),
                    conv(dt, (8, 1024, 14, 14), (2048, 1024, 1, 1), False, 2, 0, 1, 1),
                    conv(dt, (3, 200, 13, 15), (72, 200, 1, 1), True, 1, 0, 1, 1),
                    conv(dt, (4, 384, 1001), (96, 384, 1), True, 1, 0, 1, 1),
                ]
        return rows

    # -- trace rows -> problems
    def problem_from_row(self, row):
        p = row.params
        shapes = row.shapes
        if len(shapes) not in (2, 3):
            return NotServable(f"aten.convolution takes input, weight and bias, the row has {len(shapes)} tensors")
        has_bias = len(shapes) == 3
        if has_bias and p.get("bias") == "None":
            return NotServable("bias=None but the row has a third tensor")
        dtype = one_dtype(row, TORCH_DTYPES)
        if isinstance(dtype, NotServable):
            return dtype
        x, w = shapes[0], shapes[1]
        nd = len(x) - 2
        if nd not in (1, 2):
            return NotServable(f"input of rank {len(x)}: only 1-D (N, C, W) and 2-D (N, C, H, W) "
                               "convolutions are served")
        if len(w) != len(x):
            return NotServable(f"weight {format_shape(w)} does not match a rank-{len(x)} input")
        try:
            if p.bool("transposed", False):
                return NotServable("transposed convolution is not served")
            stride = _spatial(p, "stride", nd, 1)
            padding = _spatial(p, "padding", nd, 0)
            dilation = _spatial(p, "dilation", nd, 1)
            p.ints("output_padding", None)  # ignored by torch when not transposed
            groups = p.int("groups", 1)
        except ValueError as e:
            return NotServable(f"bad params: {e}")
        if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or groups < 1:
            return NotServable(f"stride {format_shape(stride)}, padding {format_shape(padding)}, dilation {format_shape(dilation)}, "
                               f"groups {groups}: need stride >= 1, padding >= 0, dilation >= 1, groups >= 1")
        nb, ci = x[0], x[1]
        co, cig = w[0], w[1]
        if min(x) == 0 or min(w) == 0:
            return NotServable("an empty convolution: nothing to launch")
        if ci % groups or cig * groups != ci or co % groups:
            return NotServable(f"input {format_shape(x)} and weight {format_shape(w)} do not form {groups} groups "
                               f"(need C_in = weight.shape[1] * groups and C_out divisible by groups)")
        if has_bias and tuple(shapes[2]) != (co,):
            return NotServable(f"bias {format_shape(shapes[2])} is not ({co},)")
        if nd == 1:
            (h, wd), (kh, kw) = (1, x[2]), (1, w[2])
            stride, padding, dilation = (1, *stride), (0, *padding), (1, *dilation)
        else:
            h, wd, kh, kw = x[2], x[3], w[2], w[3]
        oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        ow = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        if oh <= 0 or ow <= 0:
            return NotServable(f"the filter ({kh}x{kw}, dilation {format_shape(dilation[2 - nd:])}) is larger than "
                               f"the padded input: empty output")
        if max(numel(x), numel(w), nb * co * oh * ow) > INT32_MAX:
            return NotServable("a tensor of 2^31 elements or more (the kernel indexes in int32)")
        depthwise = cig == 1
        if depthwise and triton.cdiv(co, 16) > MAX_GRID_Y:
            return NotServable(f"C_out {co} > {16 * MAX_GRID_Y} (the grid's second axis)")
        if not depthwise and groups > MAX_GRID_Y:
            return NotServable(f"groups {groups} > {MAX_GRID_Y} (the grid's second axis)")
        kind = seat_kind(cig, groups, kh, kw, padding, nb)
        flags = _flags(kind, kh, kw, stride[0], stride[1], has_bias,
                       _row_align(kind, nb, ci, co, h, wd, oh, ow, stride, dtype))
        extra = (("batch", nb), ("dilation", tuple(dilation)), ("in_hw", (h, wd)),
                 ("padding", tuple(padding)), ("rank", nd))
        return Problem(self.name, (dtype,), flags, (nb * oh, ow, ci, co, groups), extra)

    # -- geometry of a problem
    @staticmethod
    def _geometry(problem):
        f = dict(problem.flags)
        r, ow, ci, co, groups = problem.dims
        nb = problem.get("batch")
        h, wd = problem.get("in_hw")
        kh, kw = _parse_pair(f["filter"])
        return dict(nb=nb, oh=r // nb, ow=ow, ci=ci, co=co, groups=groups, h=h, w=wd, kh=kh, kw=kw,
                    stride=_parse_pair(f["stride"]), padding=tuple(problem.get("padding")),
                    dilation=tuple(problem.get("dilation")), rank=problem.get("rank"),
                    bias=f["bias"] == "1")

    def resized(self, problem, dims):
        # Tile-edge shapes for pointwise seats: a 1x1 unpadded convolution is any output
        # size (the input follows: the same stride remainder kept) and any channel counts.
        # The batch is kept where it divides R = N*H_out, else R rows of one entry (1-D:
        # R entries of one row). Other kinds are screened at the shapes seen.
        if _kind(problem) != "pointwise":
            return None
        r, ow, ci, co, groups = dims
        g = self._geometry(problem)
        if g["rank"] == 1:
            nb, oh = r, 1
        else:
            nb = g["nb"] if r % g["nb"] == 0 else 1
            oh = r // nb
        (sh, sw), (h, wd) = g["stride"], (g["h"], g["w"])
        in_hw = ((oh - 1) * sh + 1 + (h - 1) % sh, (ow - 1) * sw + 1 + (wd - 1) % sw)
        if (groups != 1 or seat_kind(ci, groups, 1, 1, (0, 0), nb) != "pointwise"
                or max(nb * ci * in_hw[0] * in_hw[1], co * ci, nb * co * oh * ow) > INT32_MAX):
            return None
        align = _row_align("pointwise", nb, ci, co, *in_hw, oh, ow, (sh, sw), problem.dtypes[0])
        if str(align) != dict(problem.flags)["aligned"]:
            return None
        extra = dict(problem.extra, batch=nb, in_hw=in_hw)
        return dataclasses.replace(problem, dims=(nb * oh, ow, ci, co, 1), extra=tuple(sorted(extra.items())))

    def input_shapes(self, problem):
        g = self._geometry(problem)
        dt = problem.dtypes[0]
        if g["rank"] == 1:
            xs, ws = (g["nb"], g["ci"], g["w"]), (g["co"], g["ci"] // g["groups"], g["kw"])
        else:
            xs = (g["nb"], g["ci"], g["h"], g["w"])
            ws = (g["co"], g["ci"] // g["groups"], g["kh"], g["kw"])
        shapes = {"input": (xs, dt), "weight": (ws, dt)}
        if g["bias"]:
            shapes["bias"] = ((g["co"],), dt)
        return shapes

    def output_specs(self, problem):
        g = self._geometry(problem)
        shape = (g["nb"], g["co"], g["ow"]) if g["rank"] == 1 else (g["nb"], g["co"], g["oh"], g["ow"])
        return {"out": (shape, problem.dtypes[0])}

    def make_inputs(self, problem, rng):
        shapes = self.input_shapes(problem)
        ws, dt = shapes["weight"]
        fan_in = numel(ws[1:])
        out = {"input": (uniform_inputs(rng, shapes["input"][0]), dt),
               # scaled like a trained layer's so outputs stay O(1) in fp16 at any fan-in
               "weight": (uniform_inputs(rng, ws, fan_in ** -0.5), dt)}
        if "bias" in shapes:
            out["bias"] = (uniform_inputs(rng, shapes["bias"][0]), dt)
        return out

    def oracle(self, problem, inputs):
        g = self._geometry(problem)
        args = (inputs["input"], inputs["weight"], inputs.get("bias"))
        if g["rank"] == 1:
            out = oracle.conv1d(*args, g["stride"][1], g["padding"][1], g["dilation"][1], g["groups"])
        else:
            out = oracle.conv2d(*args, g["stride"], g["padding"], g["dilation"], g["groups"])
        return {"out": out}

    def serve_ops(self):
        return {"aten.convolution": _serve_convolution}

    def launch(self, config, problem, inputs, outputs):
        g = self._geometry(problem)
        x, w, y = inputs["input"], inputs["weight"], outputs["out"]
        if g["rank"] == 1:
            x, w, y = x.unsqueeze(2), w.unsqueeze(2), y.unsqueeze(2)
        if _is_depthwise(problem):
            launch_conv_depthwise(x, w, inputs.get("bias"), y, g["stride"], g["padding"], g["dilation"], config)
        elif _kind(problem) == "pointwise":
            launch_conv_pointwise(x, w, inputs.get("bias"), y, g["stride"], config)
        else:
            launch_conv_gemm(x, w, inputs.get("bias"), y, g["stride"], g["padding"], g["dilation"],
                             g["groups"], config)


SPEC = ConvSpec()


# ----------------------------------------------------------------------------- public ops

REMEMBERED, tensor_key = launch.REMEMBERED, launch.tensor_key
_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


@lru_cache(maxsize=1024)
def _flags(kind: str, kh: int, kw: int, sh: int, sw: int, has_bias: bool, align: int = 1):
    if kind == "pointwise":
        return seat_flags(aligned=align, bias=int(has_bias), filter=f"{kh}x{kw}", kind=kind, stride=f"{sh}x{sw}")
    return seat_flags(bias=int(has_bias), filter=f"{kh}x{kw}", kind=kind, stride=f"{sh}x{sw}")


def _row_align(kind, nb, ci, co, h, wd, oh, ow, stride, dtype) -> int:
    """The `aligned` flag of a trace row's seat, whose tensors are contiguous NCHW."""
    if kind != "pointwise":
        return 1
    return pointwise_align(oh * ow, (ci * oh * ow, oh * ow, ow, 1), (co * oh * ow, oh * ow, ow, 1),
                           True, TORCH_DTYPES[dtype].itemsize)


def _span(t) -> int:
    """The largest element offset a tensor's strides reach."""
    return sum((d - 1) * abs(st) for d, st in zip(t.shape, t.stride()) if d > 0)


def _tuple(v, nd: int, name: str) -> tuple:
    if isinstance(v, int):
        return (v,) * nd
    v = tuple(int(e) for e in v)
    if len(v) == 1:
        return v * nd
    if len(v) != nd:
        raise KernelError(f"conv: {name} {v} has {len(v)} values for a {nd}-D convolution")
    return v


def _hashable(v):
    return tuple(v) if type(v) is list else v  # an aten op's int[] arguments arrive as lists


def _direct(x, w, bias, stride, padding, dilation, groups, nd):
    # The direct launch (kernels/runtime/launch.py): a call whose key was seen replays its kernel.
    try:
        key = (SPEC, nd, _hashable(stride), _hashable(padding), _hashable(dilation), groups,
               x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15, tensor_key(w),
               None if bias is None else tensor_key(bias))
        hit = REMEMBERED.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable: the checks say so
        return _conv(x, w, bias, stride, padding, dilation, groups, nd)
    if hit is not None:
        return hit(x, w, bias)
    return launch.remember(key, (x, w, bias), _conv, x, w, bias, stride, padding, dilation, groups, nd)


def _conv(x, w, bias, stride, padding, dilation, groups, nd):
    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    if x.dim() != nd + 2 or w.dim() != nd + 2:
        raise KernelError(f"conv{nd}d: expected a rank-{nd + 2} input and weight, got {tuple(x.shape)} "
                          f"and {tuple(w.shape)}")
    stride = _tuple(stride, nd, "stride")
    dilation = _tuple(dilation, nd, "dilation")
    taps = tuple(w.shape[2:])
    size = tuple(x.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pad = (0,) * nd
            out = tuple((s - d * (k - 1) - 1) // st + 1 for s, d, k, st in zip(size, dilation, taps, stride))
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise KernelError(f"conv{nd}d: padding='same' needs stride 1, got {stride}")
            # torch pads total // 2 before and the rest after (one more after for an odd total)
            pad = tuple(d * (k - 1) // 2 for d, k in zip(dilation, taps))
            out = size
        else:
            raise KernelError(f"conv{nd}d: padding {padding!r} is not 'valid', 'same' or numbers")
    else:
        pad = _tuple(padding, nd, "padding")
        out = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                    for s, p, d, k, st in zip(size, pad, dilation, taps, stride))
    nb, ci = x.shape[0], x.shape[1]
    co, cig = w.shape[0], w.shape[1]
    if groups < 1 or ci != cig * groups or co % groups:
        raise KernelError(f"conv{nd}d: input {tuple(x.shape)} and weight {tuple(w.shape)} do not form "
                          f"{groups} groups")
    if bias is not None and tuple(bias.shape) != (co,):
        raise KernelError(f"conv{nd}d: bias {tuple(bias.shape)} is not ({co},)")
    if min(out) <= 0:
        raise KernelError(f"conv{nd}d: the filter {taps} is larger than the padded input {size}")
    try:
        dtypes = (_DTYPE_NAMES[x.dtype],)
    except KeyError:
        raise KernelError(f"conv{nd}d: dtype {x.dtype} is not served (float16, bfloat16, float32)") from None
    if w.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise KernelError(f"conv{nd}d: mixed dtypes {x.dtype}, {w.dtype}"
                          + ("" if bias is None else f", {bias.dtype}"))
    # The kernels index in int32: a view whose strides reach past 2^31 elements is copied.
    if _span(x) > INT32_MAX:
        x = x.contiguous()
    if _span(w) > INT32_MAX:
        w = w.contiguous()
    if max(x.numel(), w.numel(), nb * co * numel(out)) > INT32_MAX:
        raise KernelError(f"conv{nd}d: a tensor of 2^31 elements or more (the kernels index in int32)")
    y = launch.empty((nb, co, *out), x.dtype, x.device)
    if nb == 0:
        return y.squeeze(0) if unbatched else y
    if nd == 1:
        x4, w4, y4 = x.unsqueeze(2), w.unsqueeze(2), y.unsqueeze(2)
        stride, pad, dilation = (1, stride[0]), (0, pad[0]), (1, dilation[0])
    else:
        x4, w4, y4 = x, w, y
    kh, kw = w4.shape[2], w4.shape[3]
    oh, ow = y4.shape[2], y4.shape[3]
    kind = seat_kind(cig, groups, kh, kw, pad, nb)
    align = 1
    if kind == "pointwise":
        if stride == (1, 1) and not pixels_flat(x4):  # a view: the seat's code is the flat path's
            x4 = copy.dense(x4)
        # A strided one is staged dense by launch_conv_pointwise: aligned as that copy is.
        xs = x4.stride() if stride == (1, 1) else (ci * oh * ow, oh * ow, ow, 1)
        align = pointwise_align(oh * ow, xs, y4.stride(), True, x4.element_size())
    config = config_for(SPEC, dtypes, _flags(kind, kh, kw, stride[0], stride[1], bias is not None, align),
                        (nb * oh, ow, ci, co, groups))
    if kind == "depthwise":
        launch_conv_depthwise(x4, w4, bias, y4, stride, pad, dilation, config)
    elif kind == "pointwise":
        launch_conv_pointwise(x4, w4, bias, y4, stride, config)
    else:
        launch_conv_gemm(x4, w4, bias, y4, stride, pad, dilation, groups, config)
    return y.squeeze(0) if unbatched else y


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1,
           padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """torch.nn.functional.conv2d: input (N, C_in, H, W) or (C_in, H, W), weight (C_out,
    C_in/groups, KH, KW), padding numbers or 'valid'/'same'; any input strides; the output is
    contiguous NCHW."""
    return _direct(input, weight, bias, stride, padding, dilation, groups, 2)


def conv1d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1,
           padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """torch.nn.functional.conv1d: input (N, C_in, W) or (C_in, W), weight (C_out, C_in/groups, K)."""
    return _direct(input, weight, bias, stride, padding, dilation, groups, 1)


def _serve_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                       groups):
    """aten.convolution's arguments, for serve(): 1-D and 2-D, not transposed."""
    if transposed:
        raise KernelError("conv: transposed convolution is not served")
    nd = weight.dim() - 2
    if nd not in (1, 2):
        raise KernelError(f"conv: {nd}-D convolution is not served (1-D, 2-D)")
    return _direct(input, weight, bias, stride, padding, dilation, groups, nd)

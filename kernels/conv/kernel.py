"""The convolution kernels (implicit GEMM, depthwise, pointwise with its split reduction) and their
launchers: what decides the code a seat runs (every function here that the spec hashes is
listed in its `source_parts`).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from nbx_tune.kernels import copy
from nbx_tune.kernels.matmul import grouped_tile
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.spec import Config

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


def seat_kind(cig: int, groups: int, kh: int, kw: int, padding, nb: int) -> str:
    """The seat's `kind` flag, which picks the kernel: `depthwise` for one input channel
    per group, `pointwise` for a 1x1 filter with no padding and one group (any stride, any
    dilation: a 1x1 tap has no spread), `gemm` for the rest."""
    if cig == 1:
        return "depthwise"
    if groups == 1 and kh == 1 and kw == 1 and tuple(padding) == (0, 0) and nb <= MAX_GRID_Y:
        return "pointwise"
    return "gemm"

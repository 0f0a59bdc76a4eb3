"""The convolution spec: config space, launch key, trace rows, static refusals, inputs, oracle, example rows.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import triton

from nbx_tune.kernels import copy
from nbx_tune.kernels.conv.kernel import (MAX_GRID_Y, _conv_depthwise_kernel, _conv_gemm_kernel, _conv_pointwise_kernel,
                                          _launch_padded, _pixel_rows, _pointwise_reduce_kernel, launch_conv_depthwise,
                                          launch_conv_gemm, launch_conv_pointwise, pixels_flat, pointwise_align,
                                          seat_kind)
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.matmul import grouped_tile
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.spec import (Config, KernelSpec, KeyDim, NotServable, Problem, one_dtype, seat_flags,
                                   uniform_inputs)
from nbx_tune.oracles import conv as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
INT32_MAX = 2**31 - 1


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
        from nbx_tune.kernels.conv.ops import _serve_convolution  # ops.py imports this module

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

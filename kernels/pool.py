"""2-D max pooling with indices (`aten.max_pool2d_with_indices`, what `nn.MaxPool2d` and
`F.max_pool2d` record): out = the largest input of each window, indices = its flat
position h * W + w in the input plane.

One stream over the output elements of a contiguous (N, C, H, W) or (C, H, W) input: each
element walks its KH x KW window (constexpr, unrolled) in row-major order and keeps the
first maximum (a later element wins only when strictly greater, or NaN), as torch's kernels
do, so the indices are exact and both outputs are checked bit for bit. The window size is a
flag (it is unrolled), stride, padding and dilation are runtime values.

Launch key: the output element count on the `elements` ladder.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.copy import block_start, dense
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags
from nbx_tune.oracles import pool as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
INDEX_LIMIT = 2**31 - 2**17
MAX_WINDOW = 64  # taps unrolled per output


@triton.jit
def _max_pool2d_kernel(x_ptr, out_ptr, idx_ptr, n, H, W, OH, OW, SH, SW, PH, PW, DH, DW,
                       KH: tl.constexpr, KW: tl.constexpr, INT64: tl.constexpr,
                       BLOCK_SIZE: tl.constexpr):
    offs = block_start(tl.program_id(0), BLOCK_SIZE, INT64) + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    ow = offs % OW
    oh = (offs // OW) % OH
    plane = offs // (OW * OH)
    base = x_ptr + plane * H * W
    best = tl.full([BLOCK_SIZE], float("-inf"), tl.float32)
    arg = tl.zeros([BLOCK_SIZE], dtype=tl.int64)
    for i in tl.static_range(KH):
        h = oh * SH - PH + i * DH
        for j in tl.static_range(KW):
            w = ow * SW - PW + j * DW
            ok = mask & (h >= 0) & (h < H) & (w >= 0) & (w < W)
            v = tl.load(base + h * W + w, mask=ok, other=float("-inf")).to(tl.float32)
            take = ok & ((v > best) | (v != v))
            best = tl.where(take, v, best)
            arg = tl.where(take, (h * W + w).to(tl.int64), arg)
    tl.store(out_ptr + offs, best.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(idx_ptr + offs, arg, mask=mask)


_max_pool2d_kernel = launch.recorded(_max_pool2d_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_max_pool2d(x, out, idx, kernel, stride, padding, dilation, config: Config) -> None:
    """x contiguous (..., H, W); out and idx contiguous (..., OH, OW)."""
    H, W = x.shape[-2:]
    OH, OW = out.shape[-2:]
    n = out.numel()
    grid = (triton.cdiv(n, config["BLOCK_SIZE"]),)
    _max_pool2d_kernel[grid](x, out, idx, n, H, W, OH, OW, stride[0], stride[1], padding[0], padding[1],
                             dilation[0], dilation[1], KH=kernel[0], KW=kernel[1],
                             INT64=max(n, x.numel()) > INDEX_LIMIT, **config.kwargs)


def _c(block, warps):
    return Config.make(BLOCK_SIZE=block, num_warps=warps, num_stages=1)


CONFIGS = (_c(256, 4), _c(512, 4), _c(1024, 4), _c(2048, 8))
DEFAULTS = (_c(512, 4),)


def pool_geometry(shape, kernel, stride, padding, dilation, ceil_mode) -> tuple | str:
    """(kernel, stride, padding, dilation, out_shape) as torch normalizes them, or why not."""
    def pair(v, name, default=None):
        v = tuple(v) if v else default
        if v is None or len(v) not in (1, 2):
            raise ValueError(f"{name} must be one or two ints")
        return (v[0], v[0]) if len(v) == 1 else v
    try:
        k = pair(kernel, "kernel_size")
        s = pair(stride, "stride", k)
        p = pair(padding, "padding", (0,))
        d = pair(dilation, "dilation", (1,))
    except ValueError as e:
        return str(e)
    if len(shape) not in (3, 4):
        return f"an input of rank {len(shape)} (3 or 4 expected)"
    if min(k) < 1 or min(s) < 1 or min(d) < 1 or min(p) < 0 or p[0] > k[0] // 2 or p[1] > k[1] // 2:
        return f"kernel {k}, stride {s}, padding {p}, dilation {d}: not a valid pooling"
    if k[0] * k[1] > MAX_WINDOW:
        return f"a {k[0]}x{k[1]} window is over the {MAX_WINDOW} taps the kernel unrolls"
    OH = oracle.pool_out_size(shape[-2], k[0], s[0], p[0], d[0], ceil_mode)
    OW = oracle.pool_out_size(shape[-1], k[1], s[1], p[1], d[1], ceil_mode)
    if OH <= 0 or OW <= 0:
        return f"an empty output ({OH}x{OW})"
    return k, s, p, d, (*shape[:-2], OH, OW)


class MaxPool2dSpec(KernelSpec):
    name = "max_pool2d"
    ops = ("aten.max_pool2d_with_indices",)
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    exact = True  # a maximum and its position: no rounding anywhere
    description = "2-D max pooling with indices"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_max_pool2d_kernel, block_start, launch_max_pool2d)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != "aten.max_pool2d_with_indices":
            return NotServable(f"{row.op}: overload not served")
        unknown = set(row.params) - {"kernel_size", "stride", "padding", "dilation", "ceil_mode"}
        if unknown:
            return NotServable(f"{row.op}: unsupported params {', '.join(sorted(unknown))}")
        if len(row.shapes) != 1:
            return NotServable(f"{row.op} takes one tensor, the row has {len(row.shapes)}")
        dt, shape = row.dtypes[0], tuple(row.shapes[0])
        if dt not in TORCH_DTYPES:
            return NotServable(f"dtype {dt} is not served ({', '.join(TORCH_DTYPES)})")
        try:
            got = pool_geometry(shape, row.params.ints("kernel_size"), row.params.ints("stride"),
                                row.params.ints("padding"), row.params.ints("dilation"),
                                row.params.bool("ceil_mode", False))
        except ValueError as e:
            return NotServable(f"bad params: {e}")
        if isinstance(got, str):
            return NotServable(got)
        k, s, p, d, out_shape = got
        if numel(shape) == 0:
            return NotServable("an empty input: nothing to launch")
        return Problem(self.name, (dt,), seat_flags(window=f"{k[0]}x{k[1]}"), (numel(out_shape),),
                       (("ceil_mode", bool(row.params.bool("ceil_mode", False))), ("dilation", d), ("kernel", k), ("out_shape", out_shape), ("padding", p),
                        ("shape", shape), ("stride", s)))

    def input_shapes(self, problem):
        return {"x": (tuple(problem.get("shape")), problem.dtypes[0])}

    def make_inputs(self, problem, rng):
        # Few distinct values in half precision make ties, which the indices must break as torch does.
        x = rng.standard_normal(tuple(problem.get("shape")))
        if problem.dtypes[0] != "float32":
            x = np.round(x * 8) / 8
        return {"x": (x, problem.dtypes[0])}

    def oracle(self, problem, inputs):
        x = inputs["x"].reshape(tuple(problem.get("shape")))
        out, idx = oracle.max_pool2d_with_indices(x, problem.get("kernel"), problem.get("stride"),
                                                  problem.get("padding"), problem.get("dilation"),
                                                  problem.get("ceil_mode", False))
        return {"out": out, "indices": idx}

    def output_specs(self, problem):
        shape = tuple(problem.get("out_shape"))
        return {"out": (shape, problem.dtypes[0]), "indices": (shape, "int64")}

    def serve_ops(self):
        return {"aten.max_pool2d_with_indices": max_pool2d_with_indices}

    def launch(self, config, problem, inputs, outputs):
        launch_max_pool2d(inputs["x"].reshape(tuple(problem.get("shape"))), outputs["out"], outputs["indices"],
                          problem.get("kernel"), problem.get("stride"), problem.get("padding"),
                          problem.get("dilation"), config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            dts = ("float16", "float32")
            shapes = ((1, 3, 17, 13), (2, 5, 9))
        else:
            dts = tuple(TORCH_DTYPES)
            shapes = ((8, 64, 112, 112), (3, 129, 77, 41))
        rows = []
        for dt in dts:
            rows += [make_row("aten.max_pool2d_with_indices", [dt], [shapes[0]],
                              {"kernel_size": "3x3", "stride": "2x2", "padding": "1x1"}),
                     make_row("aten.max_pool2d_with_indices", [dt], [shapes[1]], {"kernel_size": "2x2"}),
                     make_row("aten.max_pool2d_with_indices", [dt], [shapes[0]],
                              {"kernel_size": "3x2", "stride": "2x1", "padding": "1x0", "dilation": "2x1"}),
                     make_row("aten.max_pool2d_with_indices", [dt], [shapes[1]],
                              {"kernel_size": "3x3", "stride": "2x2", "ceil_mode": "True"})]
        return rows


SPEC = MaxPool2dSpec()
SPECS = (SPEC,)


def max_pool2d_with_indices(self: torch.Tensor, kernel_size, stride=(), padding=0, dilation=1,
                            ceil_mode: bool = False):
    """aten.max_pool2d_with_indices: (out, indices), indices int64 into each input plane."""
    as_tuple = lambda v: (v,) if isinstance(v, int) else tuple(v)  # noqa: E731
    try:  # the direct launch (kernels/runtime/launch.py)
        key = (SPEC, as_tuple(kernel_size), as_tuple(stride), as_tuple(padding), as_tuple(dilation),
               bool(ceil_mode), *launch.tensor_key(self))
    except (AttributeError, TypeError):
        raise KernelError("max_pool2d_with_indices: bad arguments") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(self)
    return launch.remember(key, (self,), _max_pool2d_call, self, kernel_size, stride, padding, dilation, ceil_mode)


REMEMBERED = launch.REMEMBERED


def _max_pool2d_call(self, kernel_size, stride, padding, dilation, ceil_mode):
    dt = _NAMES.get(self.dtype)
    if dt is None:
        raise KernelError(f"max_pool2d_with_indices: dtype {self.dtype} is not served ({', '.join(TORCH_DTYPES)})")
    as_list = lambda v: [v] if isinstance(v, int) else list(v)  # noqa: E731
    got = pool_geometry(tuple(self.shape), as_list(kernel_size), as_list(stride), as_list(padding),
                        as_list(dilation), ceil_mode)
    if isinstance(got, str):
        raise KernelError(f"max_pool2d_with_indices: {got}")
    k, s, p, d, out_shape = got
    x = dense(self)
    out = launch.empty(out_shape, x.dtype, x.device)
    idx = launch.empty(out_shape, torch.int64, x.device)
    if out.numel() == 0 or x.numel() == 0:
        return out, idx
    config = config_for(SPEC, (dt,), seat_flags(window=f"{k[0]}x{k[1]}"), (out.numel(),))
    launch_max_pool2d(x, out, idx, k, s, p, d, config)
    return out, idx

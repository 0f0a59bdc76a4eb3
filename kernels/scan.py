"""Cumulative sum along a dim (`aten.cumsum`): a mixture-of-experts layer's offsets of its
experts' token counts, a model's learned positions from its attention mask.

The launcher views the input as (outer, N, inner) rows through a contiguous copy's strides;
one program walks one row in BLOCK chunks, each scanned in registers (`tl.cumsum`) and
added to the running total of the chunks before it. The input is cast to the output dtype
first, as torch does (`dtype=int32` of float counts truncates them), then summed in an
accumulator as wide as torch's CPU one: float64 for float32, float32 for the half types,
int64 for the integers (an int32 output wraps as torch's does).

Launch key: the rows R (`default` ladder) and their length N (`row`).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import dense
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags
from nbx_tune.oracles import movement

TORCH_DTYPES = torch_dtypes(*FLOATS, "int32", "int64", "bool")
OUT_DTYPES = torch_dtypes(*FLOATS, "int32", "int64")
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


@triton.jit
def _cumsum_kernel(x_ptr, y_ptr, N, inner, ACC: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    o = (r // inner).to(tl.int64)
    i = (r % inner).to(tl.int64)
    base = o * N * inner + i
    total = tl.zeros([1], dtype=ACC)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < N
        at = base + offs.to(tl.int64) * inner
        x = tl.load(x_ptr + at, mask=m, other=0).to(y_ptr.dtype.element_ty).to(ACC)
        s = tl.cumsum(x, axis=0) + total
        tl.store(y_ptr + at, s.to(y_ptr.dtype.element_ty), mask=m)
        total += tl.sum(x, axis=0)


_cumsum_kernel = launch.recorded(_cumsum_kernel)

_ACC = {torch.float32: tl.float64, torch.float16: tl.float32, torch.bfloat16: tl.float32,
        torch.int32: tl.int64, torch.int64: tl.int64}


def launch_cumsum(x, y, dim: int, config: Config) -> None:
    """y = cumsum(x.to(y.dtype), dim); x and y contiguous, of one shape."""
    N = x.shape[dim]
    inner = numel(x.shape[dim + 1:])
    rows = numel(x.shape) // N
    _cumsum_kernel[(rows,)](x, y, N, inner, ACC=_ACC[y.dtype], **config.kwargs)


CONFIGS = tuple(Config.make(BLOCK=b, num_warps=w, num_stages=1)
                for b, w in ((16, 1), (64, 1), (128, 2), (256, 4), (1024, 4), (2048, 8)))
DEFAULTS = (Config.make(BLOCK=256, num_warps=4, num_stages=1),)


def out_dtype(src: str, dtype: str | None) -> str:
    """torch's: the asked dtype, else int64 for integers and bool, else the input's."""
    if dtype is not None:
        return dtype
    return "int64" if src in ("int32", "int64", "bool") else src


class CumsumSpec(KernelSpec):
    name = "cumsum"
    ops = ("aten.cumsum",)
    key = (KeyDim("R"), KeyDim("N", "row"))
    dtypes = tuple(OUT_DTYPES)
    description = "cumulative sum along a dim (offsets of expert counts, positions of a mask)"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_cumsum_kernel, launch_cumsum)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != "aten.cumsum":
            return NotServable(f"{row.op}: overload not served")
        if len(row.shapes) != 1 or row.dtypes[0] not in TORCH_DTYPES:
            return NotServable(f"cumsum: one tensor of {', '.join(TORCH_DTYPES)} expected")
        src = row.dtypes[0]
        dst = out_dtype(src, row.params.str("dtype"))
        if dst not in OUT_DTYPES:
            return NotServable(f"cumsum: output dtype {dst} is not served")
        shape = tuple(row.shapes[0]) or (1,)
        dim = row.params.int("dim") % len(shape)
        if not numel(shape):
            return NotServable("cumsum: an empty tensor: nothing to launch")
        return Problem(self.name, (dst, src), seat_flags(), (numel(shape) // shape[dim], shape[dim]),
                       (("dim", dim), ("shape", shape)))

    def input_shapes(self, problem):
        return {"x": (tuple(problem.get("shape")), problem.dtypes[1])}

    def make_inputs(self, problem, rng):
        shape, src = tuple(problem.get("shape")), problem.dtypes[1]
        if src == "bool":
            return {"x": (rng.integers(0, 2, shape), src)}
        if src in ("int32", "int64"):
            return {"x": (rng.integers(-1000, 1000, shape), src)}
        return {"x": (rng.standard_normal(shape) * 4, src)}

    def oracle(self, problem, inputs):
        dst = problem.dtypes[0]
        x = movement.cast(inputs["x"].reshape(tuple(problem.get("shape"))), dst)
        if dst in ("int32", "int64"):
            return {"y": np.cumsum(x.astype(np.int64), axis=problem.get("dim")).astype(dst)}
        return {"y": np.cumsum(x.astype(np.float64), axis=problem.get("dim"))}

    def output_specs(self, problem):
        return {"y": (tuple(problem.get("shape")), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        launch_cumsum(inputs["x"].reshape(tuple(problem.get("shape"))), outputs["y"], problem.get("dim"), config)

    def serve_ops(self):
        return {"aten.cumsum": cumsum}

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            cases = (("float32", (8,), "0", None), ("float32", (8,), "0", "int32"),
                     ("int64", (3, 37), "1", None), ("bool", (2, 300), "-1", None),
                     ("int32", (5, 4, 3), "1", None), ("float16", (3, 45), "1", None),
                     ("float32", (9, 70), "0", None))
        else:
            cases = (("float32", (256,), "0", "int32"), ("int64", (8, 4096), "1", None),
                     *((dt, (4096, 129), "1", None) for dt in FLOATS),
                     ("float32", (60,), "0", "int32"), ("int32", (32768,), "0", None))
        return [make_row("aten.cumsum", [dt], [shape], {"dim": dim, **({"dtype": out} if out else {})})
                for dt, shape, dim, out in cases]


SPEC = CumsumSpec()
SPECS = (SPEC,)


def cumsum(self: torch.Tensor, dim: int, *, dtype=None) -> torch.Tensor:
    """aten.cumsum: the running sum along dim, of self cast to `dtype` (torch's default:
    int64 for integers and bool). Replayed (kernels/runtime/launch.py) under a key of dim,
    the dtype asked and self's layout."""
    try:
        key = (SPEC, dim, dtype, *launch.tensor_key(self))
    except AttributeError:  # not a tensor: the checks say so
        return _cumsum(self, dim, dtype)
    hit = launch.REMEMBERED.get(key)
    return hit(self) if hit is not None else launch.remember(key, (self,), _cumsum, self, dim, dtype)


def _cumsum(self, dim, dtype) -> torch.Tensor:
    src = _NAMES.get(self.dtype) if isinstance(self, torch.Tensor) else None
    dst = out_dtype(src, _NAMES.get(dtype, "?") if dtype is not None else None) if src else None
    if src is None or dst not in OUT_DTYPES:
        raise KernelError(f"cumsum: dtypes {getattr(self, 'dtype', None)} -> {dtype} are not served")
    shape = tuple(self.shape) or (1,)
    if not -len(shape) <= dim < len(shape):
        raise KernelError(f"cumsum: dim {dim} out of range (torch raises)")
    dim %= len(shape)
    y = launch.empty(self.shape, OUT_DTYPES[dst], self.device)
    if y.numel() == 0:
        return y
    config = config_for(SPEC, (dst, src), seat_flags(), (numel(shape) // shape[dim], shape[dim]))
    launch_cumsum(dense(self).reshape(shape), y.view(shape), dim, config)
    return y

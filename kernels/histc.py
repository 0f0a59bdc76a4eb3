"""Histogram with equal bins over [min, max] (`aten.histc`): a mixture-of-experts layer's
tokens per expert (`histc(sorted_expert_ids, bins=E, min=0, max=E-1)`).

Each program owns BLOCK_B bins and counts the elements that fall in them, BLOCK_N at a
time (an element's bin against every bin of the block): no atomics and no zeroed output,
so counts are exact and the same on every launch. An element's bin is torch's:
int((x - min) * bins / (max - min)) in the input's dtype (floats: float32 arithmetic, one
rounding per step, as torch's CPU and CUDA kernels compute it; integers: integer
division), x == max in the last bin, elements outside [min, max] and NaN not counted.

A call with min == max (torch then takes the data's range) goes to torch: the range would
need a host read. Launch key: the elements N (`elements`) and the bins B (`row`).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import dense
from nbx_tune.kernels.helpers import torch_dtypes
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags

TORCH_DTYPES = torch_dtypes("float32", "int32", "int64")
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


@triton.jit
def _histc_kernel(x_ptr, out_ptr, n, lo, hi, BINS, IS_FLOAT: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    bins = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    count = tl.zeros([BLOCK_B], dtype=tl.int32)
    for start in range(0, n, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0)
        inside = m & (x >= lo) & (x <= hi)
        if IS_FLOAT:
            pos = ((x - lo) * BINS / (hi - lo)).to(tl.int64)
        else:
            pos = (x.to(tl.int64) - lo) * BINS // (hi - lo)
        pos = tl.where(pos == BINS, BINS - 1, pos)
        pos = tl.where(inside, pos, -1)
        count += tl.sum((pos[:, None] == bins[None, :]).to(tl.int32), axis=0)
    tl.store(out_ptr + bins, count.to(out_ptr.dtype.element_ty), mask=bins < BINS)


_histc_kernel = launch.recorded(_histc_kernel)


def launch_histc(x, out, lo, hi, config: Config) -> None:
    """out (bins,) = counts of x (contiguous) in equal bins over [lo, hi], lo < hi."""
    bins = out.numel()
    is_float = x.dtype.is_floating_point
    lo, hi = (float(lo), float(hi)) if is_float else (int(lo), int(hi))
    _histc_kernel[(triton.cdiv(bins, config["BLOCK_B"]),)](x, out, x.numel(), lo, hi, bins,
                                                           IS_FLOAT=is_float, **config.kwargs)


def _c(bn, bb, warps):
    return Config.make(BLOCK_N=bn, BLOCK_B=bb, num_warps=warps, num_stages=1)


CONFIGS = (_c(128, 8, 1), _c(256, 16, 2), _c(512, 8, 4), _c(256, 32, 4), _c(1024, 8, 4),
           _c(128, 64, 4), _c(512, 32, 8), _c(2048, 4, 8))
DEFAULTS = (_c(256, 16, 2),)


def _bounds(min_, max_, is_float: bool):
    """torch's range in the input's type (float32 for floats), or KernelError."""
    lo, hi = (np.float32(min_), np.float32(max_)) if is_float else (int(min_), int(max_))
    if not (lo < hi):
        raise KernelError("histc: min >= max (the data's range, or torch's error) goes to torch")
    if is_float and not (np.isfinite(lo) and np.isfinite(hi)):
        raise KernelError("histc: an infinite range goes to torch")
    return lo, hi


class HistcSpec(KernelSpec):
    name = "histc"
    ops = ("aten.histc",)
    key = (KeyDim("N", "elements"), KeyDim("B", "row"))
    dtypes = tuple(TORCH_DTYPES)
    exact = True
    description = "histogram with equal bins (tokens per expert)"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_histc_kernel, launch_histc)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != "aten.histc":
            return NotServable(f"{row.op}: overload not served")
        if len(row.shapes) != 1 or row.dtypes[0] not in TORCH_DTYPES:
            return NotServable(f"histc: one tensor of {', '.join(TORCH_DTYPES)} expected")
        bins = row.params.int("bins", 100)
        try:
            lo, hi = _bounds(row.params.float("min", 0.0), row.params.float("max", 0.0),
                             row.dtypes[0] == "float32")
        except KernelError as e:
            return NotServable(str(e))
        n = numel(row.shapes[0])
        if not n or bins <= 0:
            return NotServable("histc: no elements or no bins")
        return Problem(self.name, (row.dtypes[0],), seat_flags(), (n, bins),
                       (("lo", float(lo)), ("hi", float(hi)), ("shape", tuple(row.shapes[0]))))

    def input_shapes(self, problem):
        return {"x": (tuple(problem.get("shape")), problem.dtypes[0])}

    def make_inputs(self, problem, rng):
        lo, hi = problem.get("lo"), problem.get("hi")
        shape, dt = tuple(problem.get("shape")), problem.dtypes[0]
        span = hi - lo
        if dt == "float32":
            # whole ids (expert counts) and values between, some outside, and both ends
            x = np.where(rng.random(shape) < 0.5, np.round(rng.uniform(lo, hi, shape)),
                         rng.uniform(lo - span / 8, hi + span / 8, shape))
            x.reshape(-1)[:2] = (lo, hi)
            return {"x": (x, dt)}
        return {"x": (rng.integers(int(lo) - 2, int(hi) + 3, shape), dt)}

    def oracle(self, problem, inputs):
        lo, hi, bins = problem.get("lo"), problem.get("hi"), problem.dims[1]
        x = inputs["x"].reshape(-1)
        if problem.dtypes[0] == "float32":
            f = x.astype(np.float32)
            flo, fhi = np.float32(lo), np.float32(hi)
            inside = (f >= flo) & (f <= fhi)
            pos = ((f - flo) * np.float32(bins) / (fhi - flo)).astype(np.int64)
        else:
            inside = (x >= lo) & (x <= hi)
            pos = (x.astype(np.int64) - int(lo)) * bins // (int(hi) - int(lo))
        pos = np.where(pos == bins, bins - 1, pos)
        return {"out": np.bincount(pos[inside], minlength=bins).astype(np.float64)}

    def output_specs(self, problem):
        return {"out": ((problem.dims[1],), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        launch_histc(inputs["x"].reshape(-1), outputs["out"], problem.get("lo"), problem.get("hi"), config)

    def serve_ops(self):
        return {"aten.histc": histc}

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            cases = ((28,), 4, "0", "3"), ((300,), 8, "0", "7"), ((7, 9), 5, "-1.5", "2.25"), ((1000,), 60, "0", "59")
        else:
            cases = ((8192,), 8, "0", "7"), ((32768,), 256, "0", "255"), ((12,), 60, "0", "59")
        return [make_row("aten.histc", [dt], [shape], {"bins": str(b), "min": lo, "max": hi})
                for dt in TORCH_DTYPES for shape, b, lo, hi in cases
                if dt == "float32" or "." not in lo]


SPEC = HistcSpec()
SPECS = (SPEC,)


def histc(self: torch.Tensor, bins: int = 100, min=0, max=0) -> torch.Tensor:
    """aten.histc over a range given (min < max); torch's CPU kernel takes floats only."""
    dt = _NAMES.get(self.dtype) if isinstance(self, torch.Tensor) else None
    if dt is None or (dt != "float32" and self.device.type == "cpu"):
        raise KernelError(f"histc: dtype {getattr(self, 'dtype', None)} is not served here")
    if bins <= 0:
        raise KernelError("histc: bins must be > 0 (torch raises)")
    lo, hi = _bounds(min, max, dt == "float32")
    out = launch.empty((bins,), self.dtype, self.device)
    config = config_for(SPEC, (dt,), seat_flags(), (self.numel() or 1, bins))
    launch_histc(dense(self).reshape(-1), out, lo, hi, config)
    return out

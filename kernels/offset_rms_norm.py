"""Gemma's RMS norm in one launch (`nbx_tune.offset_rms_norm`): x normalized in fp32 and
scaled by (1 + weight) in fp32, then cast to x's dtype. transformers' GemmaRMSNorm (Gemma,
Gemma 2: four a layer) takes ten launches for it (casts, pow, mean, add, rsqrt, mul, the
weight's cast and offset, mul, the cast back); torch's rms_norm cannot take it, as (1 +
weight) rounded to bf16 is another weight.

One program a row, the whole row in registers (rows up to MAX_ROW); computed in fp32 and
rounded once, as the model's own fp32 arithmetic is. A non-contiguous x is staged by the
copy kernel first.

Launch key: the row length N on the `row` ladder.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import dense
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.serving import gemma_ops  # noqa: F401  (defines the torch op serve_ops names)
from nbx_tune.kernels.spec import (Config, KernelSpec, KeyDim, NotServable, Problem, float_params, one_dtype,
                                   seat_flags)
from nbx_tune.oracles import norms as oracle

OP = "nbx_tune.offset_rms_norm"
TORCH_DTYPES = torch_dtypes(*FLOATS)
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_FLAGS = seat_flags()
MAX_ROW = 16384  # the longest row held in registers


@triton.jit
def _offset_rms_norm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK: tl.constexpr):
    """y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (1 + w), rows of N contiguous values."""
    r = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    inside = offs < N
    x = tl.load(x_ptr + r * N + offs, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(y_ptr + r * N + offs, (x * rstd * (1.0 + w)).to(y_ptr.dtype.element_ty), mask=inside)


_offset_rms_norm_kernel = launch.recorded(_offset_rms_norm_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_offset_rms_norm(x, weight, out, eps: float, config) -> None:
    """out = the norm of each row of x (contiguous, rows of weight's length); out contiguous."""
    N = weight.numel()
    _offset_rms_norm_kernel[(x.numel() // N,)](x, weight, out, N, float(eps), BLOCK=triton.next_power_of_2(N),
                                               **config.kwargs)


def _c(warps):
    return Config.make(num_warps=warps, num_stages=1)


CONFIGS = (_c(1), _c(2), _c(4), _c(8), _c(16))
DEFAULTS = (_c(4), _c(8))


class OffsetRMSNormSpec(KernelSpec):
    name = "offset_rms_norm"
    ops = (OP,)
    key = (KeyDim("N", "row"),)
    dtypes = tuple(TORCH_DTYPES)
    description = "Gemma's RMS norm: fp32, scaled by (1 + weight), in one launch"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_offset_rms_norm_kernel, launch_offset_rms_norm)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != OP:
            return NotServable(f"{row.op}: overload not served")
        if len(row.shapes) != 2:
            return NotServable(f"{OP} takes x and weight, the row has {len(row.shapes)} tensors")
        dt = one_dtype(row, self.dtypes)
        if isinstance(dt, NotServable):
            return dt
        got = float_params(row, "eps")
        if isinstance(got, NotServable):
            return got
        eps, = got
        if eps is None or not math.isfinite(eps):
            return NotServable(f"{OP} row without a finite eps")
        why = _unservable(tuple(row.shapes[0]), tuple(row.shapes[1]))
        if why:
            return NotServable(why)
        shape = tuple(row.shapes[0])
        return Problem(self.name, (dt,), _FLAGS, (shape[-1],),
                       (("M", numel(shape) // shape[-1]), ("eps", eps), ("shape", shape)))

    def resized(self, problem, dims):
        # As many rows of another length: the kernel sees the row length and count only.
        extra = dict(problem.extra, shape=(problem.get("M"), dims[0]))
        return Problem(problem.kernel, problem.dtypes, problem.flags, (dims[0],), tuple(sorted(extra.items())))

    def input_shapes(self, problem):
        shape, dt = tuple(problem.get("shape")), problem.dtypes[0]
        return {"x": (shape, dt), "weight": ((shape[-1],), dt)}

    def make_inputs(self, problem, rng):
        shape, dt = tuple(problem.get("shape")), problem.dtypes[0]
        return {"x": (2.0 * rng.standard_normal(shape) + 0.5, dt), "weight": (0.5 * rng.standard_normal(shape[-1]), dt)}

    def oracle(self, problem, inputs):
        shape = tuple(problem.get("shape"))
        return {"out": oracle.offset_rms_norm(inputs["x"].reshape(shape), inputs["weight"], problem.get("eps"))}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("shape")), problem.dtypes[0])}

    def serve_ops(self):
        return {OP: offset_rms_norm}

    def launch(self, config, problem, inputs, outputs):
        launch_offset_rms_norm(inputs["x"], inputs["weight"], outputs["out"], problem.get("eps"), config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            dts, shapes = ("float16", "float32"), ((5, 37), (2, 3, 11), (3, 1100))
        else:  # Gemma-2-2B's hidden size: a decode step at batch 16, a prefill, and an odd row
            dts, shapes = tuple(self.dtypes), ((16, 1, 2304), (1, 512, 2304), (3, 4097))
        return [make_row(OP, [dt, dt], [s, (s[-1],)], {"eps": "1e-06"}) for dt in dts for s in shapes]


def _unservable(shape, weight_shape) -> str | None:
    if not shape or numel(shape) == 0:
        return "an empty x: nothing to launch"
    if tuple(weight_shape) != (shape[-1],):
        return f"weight {format_shape(weight_shape)}: {shape[-1]} values (a row of x {format_shape(shape)}) expected"
    if shape[-1] > MAX_ROW:
        return f"rows of {shape[-1]}: at most {MAX_ROW} served"
    return None


SPEC = OffsetRMSNormSpec()
SPECS = (SPEC,)


# ----------------------------------------------------------------------------- public op

REMEMBERED = launch.REMEMBERED


def offset_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMS norm of x's rows: x * rsqrt(mean(x^2) + eps) * (1 + weight) in fp32, in x's
    dtype; x and weight of one dtype (fp16, bf16, fp32)."""
    try:  # the direct launch (kernels/runtime/launch.py)
        key = (SPEC, eps, *launch.tensor_key(x), *launch.tensor_key(weight))
    except AttributeError:
        raise KernelError("offset_rms_norm: x and weight must be tensors") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(x, weight)
    return launch.remember(key, (x, weight), _offset_rms_norm_call, x, weight, eps)


def _offset_rms_norm_call(x, weight, eps) -> torch.Tensor:
    dt = _NAMES.get(x.dtype)
    if dt is None or weight.dtype != x.dtype:
        raise KernelError(f"offset_rms_norm: dtypes {x.dtype}, {weight.dtype}: one of float16, bfloat16, float32 "
                          "expected")
    why = _unservable(tuple(x.shape), tuple(weight.shape))
    if why:
        raise KernelError(f"offset_rms_norm: {why}")
    if weight.device != x.device:
        raise KernelError(f"offset_rms_norm: x on {x.device}, weight on {weight.device}")
    eps = float(eps)
    if not math.isfinite(eps):
        raise KernelError(f"offset_rms_norm: eps {eps!r}: a finite number expected")
    x, weight = dense(x), dense(weight)
    out = launch.empty(x.shape, x.dtype, x.device)
    launch_offset_rms_norm(x, weight, out, eps, config_for(SPEC, (dt,), _FLAGS, (x.shape[-1],)))
    return out

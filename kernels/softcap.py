"""tanh(x / cap) * cap in one launch (`nbx_tune.softcap`: Gemma 2's final-logit soft-cap,
three launches and two logit-sized tensors in torch), in fp16, bf16 and fp32.

An element-wise stream like kernels/elementwise/ and built from its parts (a block's loads
and stores, tanh, the launch geometry and config space). Computed in fp32 and rounded once
(torch rounds x / cap and the tanh to the dtype first). The cap is a runtime scalar, not
part of the seat.

Launch key: the element count on the `elements` ladder. A non-contiguous x is staged by the
copy kernel first.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import block_start, dense, stream_launch
from nbx_tune.kernels.elementwise import CONFIGS, DEFAULTS, INDEX_LIMIT, TORCH_DTYPES, _stream_load, _stream_store, _tanh_f32
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.serving import gemma_ops  # noqa: F401  (defines the torch op serve_ops names)
from nbx_tune.kernels.spec import KernelSpec, KeyDim, NotServable, Problem, float_params, one_dtype, seat_flags
from nbx_tune.oracles import elementwise as oracle

OP = "nbx_tune.softcap"
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_FLAGS = seat_flags()


@triton.jit
def _softcap_block(x_ptr, y_ptr, start, n, cap, BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr,
                   EVICT: tl.constexpr):
    offs = start + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    x = _stream_load(x_ptr + offs, mask, 0.0, MASKED, EVICT).to(tl.float32)
    y = _tanh_f32(x / cap) * cap
    _stream_store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask, MASKED)


@triton.jit
def _softcap_kernel(x_ptr, y_ptr, n, cap, INT64: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                    MASKED: tl.constexpr = True, PERSIST: tl.constexpr = 0, EVICT: tl.constexpr = 0):
    """y = tanh(x / cap) * cap over n contiguous elements. PERSIST > 0: a fixed grid (PERSIST
    programs per SM) strides over the blocks."""
    pid = tl.program_id(0)
    if PERSIST > 0:
        nprog = tl.num_programs(0)
        for it in range(0, tl.cdiv(tl.cdiv(n, BLOCK_SIZE) - pid, nprog)):
            _softcap_block(x_ptr, y_ptr, block_start(pid + it * nprog, BLOCK_SIZE, INT64), n, cap,
                           BLOCK_SIZE, MASKED, EVICT)
    else:
        _softcap_block(x_ptr, y_ptr, block_start(pid, BLOCK_SIZE, INT64), n, cap, BLOCK_SIZE, MASKED, EVICT)


_softcap_kernel = launch.recorded(_softcap_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_softcap(x, out, cap: float, config) -> None:
    """out = tanh(x / cap) * cap, both contiguous, of one shape."""
    n = out.numel()
    grid, kw = stream_launch(n, config, out.device)
    _softcap_kernel[grid](x, out, n, cap, INT64=n > INDEX_LIMIT, **kw)


class SoftcapSpec(KernelSpec):
    name = "softcap"
    ops = (OP,)
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    description = "tanh(x / cap) * cap in one launch (Gemma 2's logit soft-cap)"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_softcap_block, _softcap_kernel, launch_softcap, _tanh_f32, _stream_load, _stream_store,
                block_start, stream_launch)

    def problem_from_row(self, row):
        if row.op.removesuffix(".default") != OP:
            return NotServable(f"{row.op}: overload not served")
        if len(row.shapes) != 1:
            return NotServable(f"{OP} takes 1 tensor, the row has {len(row.shapes)}")
        dt = one_dtype(row, self.dtypes)
        if isinstance(dt, NotServable):
            return dt
        got = float_params(row, "cap")
        if isinstance(got, NotServable):
            return got
        cap, = got
        if cap is None or not math.isfinite(cap) or cap == 0:
            return NotServable(f"{OP}: cap {cap!r}: a finite non-zero cap expected")
        n = numel(row.shapes[0])
        if n == 0:
            return NotServable("an empty tensor: nothing to launch")
        return Problem(self.name, (dt,), _FLAGS, (n,), (("cap", cap), ("shape", tuple(row.shapes[0]))))

    def resized(self, problem, dims):
        # Any element count, as one flat tensor: the kernel sees the count only.
        return Problem(problem.kernel, problem.dtypes, problem.flags, (dims[0],),
                       (("cap", problem.get("cap")), ("shape", (dims[0],))))

    def input_shapes(self, problem):
        return {"x": (tuple(problem.get("shape")), problem.dtypes[0])}

    def make_inputs(self, problem, rng):
        # logits of a few caps' size: the tanh's linear part, its knee and its saturation
        cap = problem.get("cap")
        return {"x": (2.0 * abs(cap) * rng.standard_normal(tuple(problem.get("shape"))), problem.dtypes[0])}

    def oracle(self, problem, inputs):
        return {"out": oracle.softcap(inputs["x"].reshape(tuple(problem.get("shape"))), problem.get("cap"))}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("shape")), problem.dtypes[0])}

    def serve_ops(self):
        return {OP: softcap}

    def launch(self, config, problem, inputs, outputs):
        launch_softcap(inputs["x"], outputs["out"], float(problem.get("cap")), config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            shapes, dts = ((3, 37, 5), (1000,), (1, 1, 43)), ("float16", "float32")
        else:  # Gemma-2's logits (vocabulary 256000): a decode step's at batch 16, one prefill's, and an odd one
            shapes, dts = ((16, 1, 256000), (1, 512, 256000), (3, 1001, 4097)), tuple(TORCH_DTYPES)
        return [make_row(OP, [dt], [s], {"cap": "30.0"}) for dt in dts for s in shapes]


SPEC = SoftcapSpec()
SPECS = (SPEC,)


# ----------------------------------------------------------------------------- public op

REMEMBERED = launch.REMEMBERED


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """tanh(x / cap) * cap: x of fp16, bf16 or fp32, a finite non-zero cap."""
    try:  # the direct launch (kernels/runtime/launch.py)
        key = (SPEC, cap, *launch.tensor_key(x))
    except AttributeError:
        raise KernelError("softcap: x must be a tensor") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(x)
    return launch.remember(key, (x,), _softcap_call, x, cap)


def _softcap_call(x: torch.Tensor, cap: float) -> torch.Tensor:
    dt = _NAMES.get(x.dtype)
    if dt is None:
        raise KernelError(f"softcap: dtype {x.dtype}: one of float16, bfloat16, float32 expected")
    cap = float(cap)
    if not math.isfinite(cap) or cap == 0:
        raise KernelError(f"softcap: cap {cap!r}: a finite non-zero cap expected")
    x = dense(x)
    out = launch.empty(x.shape, x.dtype, x.device)
    n = out.numel()
    if n == 0:
        return out
    if n > 2**62:
        raise KernelError(f"softcap: {format_shape(x.shape)}: too many elements")
    launch_softcap(x, out, cap, config_for(SPEC, (dt,), _FLAGS, (n,)))
    return out

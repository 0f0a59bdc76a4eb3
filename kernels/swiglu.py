"""silu(gate) * up in one launch (`nbx_tune.silu_mul`, LlamaMLP's activation), in fp16, bf16
and fp32: the two launches of silu and mul and the intermediate tensor between them, fused.

An element-wise stream like the unary and binary kernels of kernels/elementwise/, and built
from their parts: the same device code for a block's loads and stores and for silu, the same
launch geometry (`stream_launch`) and the same config space. Computed in fp32 and rounded
once (torch rounds silu(gate) to the dtype before the product).

Launch key: the element count on the `elements` ladder. gate and up have one shape and one
dtype; a non-contiguous operand (a chunk of a fused gate/up projection) is staged by the
copy kernel first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.serving import custom_ops  # noqa: F401  (defines the torch op serve_ops names)
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.copy import block_start, dense, stream_launch
from nbx_tune.kernels.elementwise import (CONFIGS, DEFAULTS, INDEX_LIMIT, TORCH_DTYPES, _stream_load, _stream_store,
                                          _tanh_f32, _unary_math)
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.spec import KernelSpec, KeyDim, NotServable, Problem, plain_row, seat_flags
from nbx_tune.oracles import elementwise as oracle

OP = "nbx_tune.silu_mul"
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_FLAGS = seat_flags()


@triton.jit
def _silu_mul_block(g_ptr, u_ptr, y_ptr, start, n, BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr,
                    EVICT: tl.constexpr):
    offs = start + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    g = _stream_load(g_ptr + offs, mask, 0.0, MASKED, EVICT).to(tl.float32)
    u = _stream_load(u_ptr + offs, mask, 0.0, MASKED, EVICT).to(tl.float32)
    y = _unary_math(g, 0.0, 0.0, 0.0, "silu") * u
    _stream_store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask, MASKED)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, n, INT64: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                     MASKED: tl.constexpr = True, PERSIST: tl.constexpr = 0, EVICT: tl.constexpr = 0):
    """y = silu(g) * u over n contiguous elements. PERSIST > 0: a fixed grid (PERSIST
    programs per SM) strides over the blocks."""
    pid = tl.program_id(0)
    if PERSIST > 0:
        nprog = tl.num_programs(0)
        for it in range(0, tl.cdiv(tl.cdiv(n, BLOCK_SIZE) - pid, nprog)):
            _silu_mul_block(g_ptr, u_ptr, y_ptr, block_start(pid + it * nprog, BLOCK_SIZE, INT64), n,
                            BLOCK_SIZE, MASKED, EVICT)
    else:
        _silu_mul_block(g_ptr, u_ptr, y_ptr, block_start(pid, BLOCK_SIZE, INT64), n, BLOCK_SIZE, MASKED, EVICT)


_silu_mul_kernel = launch.recorded(_silu_mul_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_silu_mul(gate, up, out, config) -> None:
    """out = silu(gate) * up, all three contiguous, of one shape."""
    n = out.numel()
    grid, kw = stream_launch(n, config, out.device)
    _silu_mul_kernel[grid](gate, up, out, n, INT64=n > INDEX_LIMIT, **kw)


class SiluMulSpec(KernelSpec):
    name = "silu_mul"
    ops = (OP,)
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    description = "silu(gate) * up in one launch (a SwiGLU MLP's activation)"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_silu_mul_block, _silu_mul_kernel, launch_silu_mul, _unary_math, _tanh_f32, _stream_load,
                _stream_store, block_start, stream_launch)

    def problem_from_row(self, row):
        dt = plain_row(row, self.ops[0], 2, self.dtypes)
        if isinstance(dt, NotServable):
            return dt
        if tuple(row.shapes[0]) != tuple(row.shapes[1]):
            return NotServable(f"gate {format_shape(row.shapes[0])} and up {format_shape(row.shapes[1])}: "
                               "one shape expected")
        n = numel(row.shapes[0])
        if n == 0:
            return NotServable("an empty tensor: nothing to launch")
        return Problem(self.name, (dt,), _FLAGS, (n,), (("shape", tuple(row.shapes[0])),))

    def resized(self, problem, dims):
        # Any element count, as one flat tensor: the kernel sees the count only.
        return Problem(problem.kernel, problem.dtypes, problem.flags, (dims[0],), (("shape", (dims[0],)),))

    def input_shapes(self, problem):
        shape = (tuple(problem.get("shape")), problem.dtypes[0])
        return {"gate": shape, "up": shape}

    def make_inputs(self, problem, rng):
        return {name: (2.0 * rng.standard_normal(shape), dt) for name, (shape, dt) in self.input_shapes(problem).items()}

    def oracle(self, problem, inputs):
        shape = tuple(problem.get("shape"))
        return {"out": oracle.silu_mul(inputs["gate"].reshape(shape), inputs["up"].reshape(shape))}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("shape")), problem.dtypes[0])}

    def serve_ops(self):
        return {self.ops[0]: silu_mul}

    def launch(self, config, problem, inputs, outputs):
        launch_silu_mul(inputs["gate"], inputs["up"], outputs["out"], config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            shapes, dts = ((3, 37, 5), (1000,), (1, 1, 43)), ("float16", "float32")
        else:  # Llama-7B's MLP: a prefill's, a decode step's, and an odd one
            shapes, dts = ((1, 512, 11008), (1, 1, 11008), (3, 1001, 4097)), tuple(TORCH_DTYPES)
        return [make_row(self.ops[0], [dt, dt], [s, s]) for dt in dts for s in shapes]


SPEC = SiluMulSpec()
SPECS = (SPEC,)


# ----------------------------------------------------------------------------- public op

REMEMBERED = launch.REMEMBERED


def gated_op(spec: KernelSpec, launcher):
    """The public op act(gate) * up of a gated activation's spec (this one's, kernels/gelu_mul.py's):
    gate and up of one shape and dtype (fp16, bf16, fp32), launched by `launcher(gate, up, out, config)`."""
    name = spec.name

    def op(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        try:  # the direct launch (kernels/runtime/launch.py)
            key = (spec, *launch.tensor_key(gate), *launch.tensor_key(up))
        except AttributeError:
            raise KernelError(f"{name}: gate and up must be tensors") from None
        hit = REMEMBERED.get(key)
        if hit is not None:
            return hit(gate, up)
        return launch.remember(key, (gate, up), call, gate, up)

    def call(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        dt = _NAMES.get(gate.dtype)
        if dt is None or up.dtype != gate.dtype:
            raise KernelError(f"{name}: dtypes {gate.dtype}, {up.dtype}: one of float16, bfloat16, float32 expected")
        if gate.shape != up.shape:
            raise KernelError(f"{name}: gate {format_shape(gate.shape)} and up {format_shape(up.shape)}: "
                              "one shape expected")
        if gate.device != up.device:
            raise KernelError(f"{name}: gate on {gate.device}, up on {up.device}")
        gate, up = dense(gate), dense(up)
        out = launch.empty(gate.shape, gate.dtype, gate.device)
        n = out.numel()
        if n == 0:
            return out
        launcher(gate, up, out, config_for(spec, (dt,), _FLAGS, (n,)))
        return out

    op.__name__ = op.__qualname__ = name
    return op


silu_mul = gated_op(SPEC, launch_silu_mul)
silu_mul.__doc__ = "silu(gate) * up: gate and up of one shape and dtype (fp16, bf16, fp32)."

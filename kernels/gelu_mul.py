"""gelu(gate) * up in one launch (`nbx_tune.gelu_mul`, GeGLU: Gemma's MLP activation, gelu
in its tanh form), in fp16, bf16 and fp32: two launches and the tensor between them, fused.

SwiGLU's kernel with gelu for silu (kernels/swiglu.py: the same stream, launch geometry,
config space, key and checks); computed in fp32 and rounded once (torch rounds gelu(gate)
to the dtype before the product).
"""

from __future__ import annotations

import triton
import triton.language as tl

from nbx_tune.kernels.copy import block_start, stream_launch
from nbx_tune.kernels.elementwise import INDEX_LIMIT, _stream_load, _stream_store, _tanh_f32, _unary_math
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.serving import gemma_ops  # noqa: F401  (defines the torch op serve_ops names)
from nbx_tune.kernels.swiglu import SiluMulSpec, gated_op
from nbx_tune.oracles import elementwise as oracle

OP = "nbx_tune.gelu_mul"


@triton.jit
def _gelu_mul_block(g_ptr, u_ptr, y_ptr, start, n, BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr,
                    EVICT: tl.constexpr):
    offs = start + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    g = _stream_load(g_ptr + offs, mask, 0.0, MASKED, EVICT).to(tl.float32)
    u = _stream_load(u_ptr + offs, mask, 0.0, MASKED, EVICT).to(tl.float32)
    y = _unary_math(g, 0.0, 0.0, 0.0, "gelu_tanh") * u
    _stream_store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask, MASKED)


@triton.jit
def _gelu_mul_kernel(g_ptr, u_ptr, y_ptr, n, INT64: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                     MASKED: tl.constexpr = True, PERSIST: tl.constexpr = 0, EVICT: tl.constexpr = 0):
    """y = gelu_tanh(g) * u over n contiguous elements. PERSIST > 0: a fixed grid (PERSIST
    programs per SM) strides over the blocks."""
    pid = tl.program_id(0)
    if PERSIST > 0:
        nprog = tl.num_programs(0)
        for it in range(0, tl.cdiv(tl.cdiv(n, BLOCK_SIZE) - pid, nprog)):
            _gelu_mul_block(g_ptr, u_ptr, y_ptr, block_start(pid + it * nprog, BLOCK_SIZE, INT64), n,
                            BLOCK_SIZE, MASKED, EVICT)
    else:
        _gelu_mul_block(g_ptr, u_ptr, y_ptr, block_start(pid, BLOCK_SIZE, INT64), n, BLOCK_SIZE, MASKED, EVICT)


_gelu_mul_kernel = launch.recorded(_gelu_mul_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_gelu_mul(gate, up, out, config) -> None:
    """out = gelu_tanh(gate) * up, all three contiguous, of one shape."""
    n = out.numel()
    grid, kw = stream_launch(n, config, out.device)
    _gelu_mul_kernel[grid](gate, up, out, n, INT64=n > INDEX_LIMIT, **kw)


class GeluMulSpec(SiluMulSpec):
    name = "gelu_mul"
    ops = (OP,)
    description = "gelu(gate, tanh) * up in one launch (a GeGLU MLP's activation)"

    def source_parts(self):
        return (_gelu_mul_block, _gelu_mul_kernel, launch_gelu_mul, _unary_math, _tanh_f32, _stream_load,
                _stream_store, block_start, stream_launch)

    def oracle(self, problem, inputs):
        shape = tuple(problem.get("shape"))
        return {"out": oracle.gelu_mul(inputs["gate"].reshape(shape), inputs["up"].reshape(shape))}

    def serve_ops(self):
        return {OP: gelu_mul}

    def launch(self, config, problem, inputs, outputs):
        launch_gelu_mul(inputs["gate"], inputs["up"], outputs["out"], config)


SPEC = GeluMulSpec()
SPECS = (SPEC,)

gelu_mul = gated_op(SPEC, launch_gelu_mul)
gelu_mul.__doc__ = "gelu(gate, approximate='tanh') * up: gate and up of one shape and dtype (fp16, bf16, fp32)."

"""An nbx-tune kernel plugin: a fused SwiGLU, out = silu(gate) * up, for the custom op
`mylib.swiglu` (a torch.library op in the user's model; its trace rows read
`mylib.swiglu	bfloat16,bfloat16	512x11008;512x11008		32`).

Everything nbx-tune needs is declared here: the Triton kernel, its launcher, the config
space, the launch key with its ladder, the fp64 oracle, and the trace op it serves.
"""

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags


@triton.jit
def _swiglu(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch_swiglu(gate, up, out, config):
    n = out.numel()
    _swiglu[(triton.cdiv(n, config["BLOCK"]),)](gate, up, out, n, **config.kwargs)


def swiglu_fp64(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The oracle, from the definition, in float64."""
    g = gate.astype(np.float64)
    return g / (1.0 + np.exp(-g)) * up.astype(np.float64)


class SwiGLUSpec(KernelSpec):
    name = "swiglu"
    ops = ("mylib.swiglu",)
    key = (KeyDim("N", "elements"),)  # the element count, on the profile's `elements` ladder
    dtypes = ("float16", "bfloat16", "float32")

    def configs(self):
        return tuple(Config.make(BLOCK=b, num_warps=w, num_stages=1)
                     for b in (256, 1024, 4096) for w in (2, 4, 8))

    def default_preference(self):
        return (Config.make(BLOCK=1024, num_warps=4, num_stages=1),)

    def source_parts(self):
        return (_swiglu, launch_swiglu)

    def problem_from_row(self, row):
        if len(row.shapes) != 2 or row.shapes[0] != row.shapes[1]:
            return NotServable("swiglu takes gate and up of one shape")
        if len(set(row.dtypes)) != 1 or row.dtypes[0] not in self.dtypes:
            return NotServable(f"dtypes {','.join(row.dtypes)}: one of {', '.join(self.dtypes)}")
        n = int(np.prod(row.shapes[0], dtype=np.int64))
        if n == 0:
            return NotServable("empty")
        return Problem(self.name, (row.dtypes[0],), seat_flags(), (n,))

    def input_shapes(self, p):
        return {"gate": ((p.dims[0],), p.dtypes[0]), "up": ((p.dims[0],), p.dtypes[0])}

    def make_inputs(self, p, rng):
        return {name: (rng.standard_normal(shape) * 2, dt) for name, (shape, dt) in self.input_shapes(p).items()}

    def oracle(self, p, inputs):
        return {"out": swiglu_fp64(inputs["gate"], inputs["up"])}

    def output_specs(self, p):
        return {"out": ((p.dims[0],), p.dtypes[0])}

    def launch(self, config, p, inputs, outputs):
        launch_swiglu(inputs["gate"], inputs["up"], outputs["out"], config)


SPEC = SwiGLUSpec()
_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The public op: the certified config of the launch's seat, else the default."""
    out = torch.empty_like(gate)
    config = config_for(SPEC, (_NAMES[gate.dtype],), (), (gate.numel(),))
    launch_swiglu(gate.contiguous(), up.contiguous(), out, config)
    return out

"""A kernel with a candidate that writes far out of bounds: on a GPU it raises an illegal
memory access and poisons its process's CUDA context. Used by proofs/gpu_check.py to show
the tuner survives it (the candidate runs in a worker process)."""

import triton
import triton.language as tl

from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr, FAR: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    # FAR: every store lands 2^40 bytes past the buffer (an illegal address).
    dst = y_ptr + offs + (FAR * (1 << 38))
    tl.store(dst, x * 3.0, mask=offs < n)


def launch_scale(x, y, config):
    n = x.numel()
    _scale[(triton.cdiv(n, config["BLOCK"]),)](x, y, n, **config.kwargs)


GOOD = (Config.make(BLOCK=256, FAR=0), Config.make(BLOCK=1024, FAR=0))
OUT_OF_BOUNDS = Config.make(BLOCK=512, FAR=1)


class ScaleSpec(KernelSpec):
    name = "bench_oob"
    ops = ("bench.oob",)
    key = (KeyDim("n", "elements"),)
    dtypes = ("float32",)

    def configs(self):
        # The faulty candidate in the middle: the tuner must go on after it.
        return (GOOD[0], OUT_OF_BOUNDS, GOOD[1])

    def default_preference(self):
        return GOOD

    def source_parts(self):
        return (_scale, launch_scale)

    def problem_from_row(self, row):
        if row.dtypes != ("float32",):
            return NotServable("float32 only")
        return Problem(self.name, ("float32",), seat_flags(), (row.shapes[0][0],))

    def input_shapes(self, p):
        return {"x": ((p.dims[0],), "float32")}

    def make_inputs(self, p, rng):
        return {"x": (rng.standard_normal(p.dims[0]), "float32")}

    def oracle(self, p, inputs):
        return {"y": 3.0 * inputs["x"]}

    def output_specs(self, p):
        return {"y": ((p.dims[0],), "float32")}

    def launch(self, config, p, inputs, outputs):
        launch_scale(inputs["x"], outputs["y"], config)


SPEC = ScaleSpec()

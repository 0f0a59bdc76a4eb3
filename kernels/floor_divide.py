"""Integer floor division (`aten.floor_divide`): a mixture-of-experts layer's token of each
routed pair, `perm // top_k`.

Element-wise over the output's elements, each operand read through up to four dims of
strides (a broadcast operand has stride 0; a Python or 0-d divisor is a scalar argument).
The quotient is rounded toward negative infinity as torch's: the truncated quotient less
one where the remainder is non-zero and its sign is not the divisor's (written so that a
division that already floors gives the same). A zero divisor makes torch's CPU kernel raise
ZeroDivisionError: the CPU call checks and hands it to torch; on a GPU torch does not
check either, and the quotient by zero is the hardware's. Floats and bool go to torch.

Launch key: the output's elements N (`elements`); flags: whether the divisor is a scalar.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import strided_offsets
from nbx_tune.kernels.helpers import torch_dtypes
from nbx_tune.kernels.index import FLAT_CONFIGS, FLAT_DEFAULTS, dims4
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags

TORCH_DTYPES = torch_dtypes("int32", "int64")
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


@triton.jit
def _floor_divide_kernel(a_ptr, b_ptr, b_scalar, y_ptr, n, D1, D2, D3, SA0, SA1, SA2, SA3,
                         SB0, SB1, SB2, SB3, SCALAR: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + strided_offsets(offs, 4, D1, D2, D3, SA0, SA1, SA2, SA3), mask=m, other=1)
    if SCALAR:
        b = b_scalar.to(a.dtype)
    else:
        b = tl.load(b_ptr + strided_offsets(offs, 4, D1, D2, D3, SB0, SB1, SB2, SB3), mask=m, other=1)
    b = tl.where(m, b, 1)
    q = a // b
    rem = a - q * b
    q = tl.where((rem != 0) & ((rem < 0) != (b < 0)), q - 1, q)
    tl.store(y_ptr + offs, q, mask=m)


_floor_divide_kernel = launch.recorded(_floor_divide_kernel)


def launch_floor_divide(a, b, y, config: Config) -> None:
    """y (contiguous) = floor(a / b), a broadcast to y's shape, b a tensor broadcast to it or
    a Python int; rank <= 4."""
    shape = tuple(y.shape)
    scalar = not isinstance(b, torch.Tensor)
    sb = (0,) * len(shape) if scalar else b.expand(shape).stride()
    args = dims4(shape, a.expand(shape).stride(), sb)
    _floor_divide_kernel[(triton.cdiv(y.numel(), config["BLOCK"]),)](
        a, a if scalar else b, int(b) if scalar else 0, y, y.numel(), *args, SCALAR=scalar, **config.kwargs)


CONFIGS, DEFAULTS = FLAT_CONFIGS, FLAT_DEFAULTS
SCREEN_DIVISOR = -3  # a scalar divisor the trace does not give: negative, so the floor matters


class FloorDivideSpec(KernelSpec):
    name = "floor_divide"
    ops = ("aten.floor_divide", "aten.floor_divide.Scalar")
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    exact = True
    description = "integer floor division (the token of a routed pair)"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_floor_divide_kernel, strided_offsets, launch_floor_divide, dims4)

    def problem_from_row(self, row):
        op = row.op.removesuffix(".default")
        if op not in self.ops:
            return NotServable(f"{row.op}: overload not served")
        if row.dtypes[0] not in TORCH_DTYPES:
            return NotServable(f"floor_divide: dtype {row.dtypes[0]} is not served ({', '.join(TORCH_DTYPES)})")
        shapes = [tuple(s) for s in row.shapes]
        # A 0-d divisor is how a trace writes a Python int (`perm // top_k`), which serve()
        # passes as a scalar: its value is not recorded, and the code does not depend on it.
        scalar = len(shapes) == 1 or shapes[1] == ()
        if scalar:
            other = row.params.int("other", SCREEN_DIVISOR) if len(shapes) == 1 else SCREEN_DIVISOR
            shapes = shapes[:1]
            if other == 0:
                return NotServable("floor_divide: a divisor of 0")
        elif len(set(row.dtypes)) != 1:
            return NotServable(f"floor_divide: mixed dtypes {','.join(row.dtypes)}")
        try:
            shape = tuple(torch.broadcast_shapes(*shapes))
        except RuntimeError as e:
            return NotServable(f"floor_divide: {e}")
        if len(shape) > 4 or not numel(shape):
            return NotServable("floor_divide: rank over 4 or no elements")
        extra = (("shapes", tuple(shapes)),) + ((("other", other),) if scalar else ())
        return Problem(self.name, (row.dtypes[0],), seat_flags(scalar=int(scalar)), (numel(shape),), extra)

    def _shape(self, problem):
        return tuple(torch.broadcast_shapes(*problem.get("shapes")))

    def input_shapes(self, problem):
        names = ("a", "b")
        return {names[i]: (s, problem.dtypes[0]) for i, s in enumerate(problem.get("shapes"))}

    def make_inputs(self, problem, rng):
        shapes, dt = problem.get("shapes"), problem.dtypes[0]
        out = {"a": (rng.integers(-5000, 5000, shapes[0]), dt)}
        if len(shapes) == 2:
            b = rng.integers(-40, 40, shapes[1])
            out["b"] = (np.where(b == 0, 7, b), dt)  # torch refuses a zero divisor
        return out

    def oracle(self, problem, inputs):
        b = inputs["b"] if "b" in inputs else problem.get("other")
        return {"y": np.broadcast_to(np.floor_divide(inputs["a"], b), self._shape(problem)).copy()}

    def output_specs(self, problem):
        return {"y": (self._shape(problem), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        launch_floor_divide(inputs["a"], inputs.get("b", problem.get("other")), outputs["y"], config)

    def serve_ops(self):
        return {"aten.floor_divide": floor_divide, "aten.floor_divide.Scalar": floor_divide}

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        if scale == "small":
            cases = (((28,), None, "2"), ((300,), None, "-3"), ((7, 9), (7, 9), None), ((5, 1, 3), (4, 1), None))
        else:
            cases = (((8192,), None, "2"), ((32768,), None, "8"), ((512, 4096), (4096,), None))
        rows = []
        for dt in TORCH_DTYPES:
            for a, b, other in cases:
                if b is None:
                    rows.append(make_row("aten.floor_divide.Scalar", [dt], [a], {"other": other}))
                else:
                    rows.append(make_row("aten.floor_divide", [dt, dt], [a, b]))
        return rows


SPEC = FloorDivideSpec()
SPECS = (SPEC,)


def floor_divide(self: torch.Tensor, other) -> torch.Tensor:
    """aten.floor_divide of integers (a tensor of self's dtype, or an int): rounded toward
    negative infinity; a zero divisor goes to torch on the CPU (torch raises there)."""
    dt = _NAMES.get(self.dtype) if isinstance(self, torch.Tensor) else None
    if dt is None:
        raise KernelError(f"floor_divide: dtype {getattr(self, 'dtype', None)} is not served (integers)")
    if isinstance(other, torch.Tensor) and other.dim() == 0 and other.device.type == "cpu" \
            and other.dtype in TORCH_DTYPES.values() and (self.dim() > 0 or other.dtype == self.dtype):
        other = int(other)  # a 0-d integer divisor takes self's dtype, as a Python int does
    if isinstance(other, bool) or not isinstance(other, (int, torch.Tensor)):
        raise KernelError(f"floor_divide: a divisor of type {type(other).__name__} is not served")
    if isinstance(other, torch.Tensor):
        if other.dtype != self.dtype or other.device != self.device:
            raise KernelError("floor_divide: a divisor of another dtype or device (torch promotes)")
        try:
            shape = tuple(torch.broadcast_shapes(self.shape, other.shape))
        except RuntimeError:
            raise KernelError("floor_divide: shapes do not broadcast (torch raises)") from None
        if other.device.type == "cpu" and other.numel() and not bool((other != 0).all()):
            raise KernelError("floor_divide: a zero divisor (torch raises ZeroDivisionError)")
        flags = seat_flags(scalar=0)
    else:
        info = torch.iinfo(self.dtype)
        if not info.min <= other <= info.max:
            raise KernelError("floor_divide: a divisor out of the dtype's range")
        if other == 0 and self.device.type == "cpu":
            raise KernelError("floor_divide: a zero divisor (torch raises ZeroDivisionError)")
        shape, flags = tuple(self.shape), seat_flags(scalar=1)
    if len(shape) > 4:
        raise KernelError("floor_divide: rank over 4 is not served")
    y = launch.empty(shape, self.dtype, self.device)
    if y.numel() == 0:
        return y
    config = config_for(SPEC, (dt,), flags, (y.numel(),))
    launch_floor_divide(self, other, y, config)
    return y

"""`aten.where.self`: out = condition ? self : other, one kernel.

torch's rules: the condition must be bool (torch refuses anything else), the output dtype
is torch's result type of self and other (`compare.promote`: a Python number or a 0-d
tensor does not widen a tensor of its kind), both are converted to it before the choice,
and the three broadcast. Either of self and other may be a Python number (a mask's
`torch.where(m, x, min_value)`), passed by value already rounded to the output dtype
(`compare.value_in`). Served dtypes: bool, int32, int64, float16, bfloat16, float32.

The seat: the output's element count on the `elements` ladder; flag `layout` (`same`
where every operand with dims has the output's shape, else `bcast`), read from shapes only
as in `compare`, so a trace row and serve()'s launch of one call meet. Exact.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.compare import (CONFIGS, DEFAULTS, INDEX_LIMIT, TORCH_DTYPES, VALUE_DTYPES, _operand,
                                      broadcast_shape, draw, layout_of, levels, nary_plan, operand_key, promote,
                                      row_operand, row_output, value_in, wide_value)
from nbx_tune.kernels.copy import block_start, strided_offsets
from nbx_tune.kernels.helpers import FLOATS
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags
from nbx_tune.oracles import movement as moves


@triton.jit
def _pick(ptr, offs, mask, value, KIND: tl.constexpr, FLOAT: tl.constexpr, BLOCK_SIZE: tl.constexpr,
          out_ty: tl.constexpr):
    """One operand in the output's dtype: loaded (KIND 1) or the runtime value (KIND 2)."""
    if KIND == 1:
        x = tl.load(ptr + offs, mask=mask).to(out_ty)
    elif FLOAT:
        x = (tl.zeros([BLOCK_SIZE], dtype=tl.float32) + value).to(out_ty)
    else:
        x = (tl.zeros([BLOCK_SIZE], dtype=tl.int64) + value).to(out_ty)
    return x


@triton.jit
def _where_kernel(c_ptr, a_ptr, b_ptr, out_ptr, n, a_value, b_value, D1, D2, D3,
                  SC0, SC1, SC2, SC3, SA0, SA1, SA2, SA3, SB0, SB1, SB2, SB3,
                  A_KIND: tl.constexpr, B_KIND: tl.constexpr, FLOAT: tl.constexpr, NDIM: tl.constexpr,
                  INT64: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """out[i] = c ? a : b over the contiguous output; c, a, b strided over NDIM merged dims
    (a, b: or values, KIND 2); FLOAT: the output is floating (values arrive as fp32)."""
    offs = block_start(tl.program_id(0), BLOCK_SIZE, INT64) + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    out_ty = out_ptr.dtype.element_ty
    c = tl.load(c_ptr + strided_offsets(offs, NDIM, D1, D2, D3, SC0, SC1, SC2, SC3), mask=mask)
    a = _pick(a_ptr, strided_offsets(offs, NDIM, D1, D2, D3, SA0, SA1, SA2, SA3), mask, a_value, A_KIND, FLOAT,
              BLOCK_SIZE, out_ty)
    b = _pick(b_ptr, strided_offsets(offs, NDIM, D1, D2, D3, SB0, SB1, SB2, SB3), mask, b_value, B_KIND, FLOAT,
              BLOCK_SIZE, out_ty)
    tl.store(out_ptr + offs, tl.where(c != 0, a, b), mask=mask)


_where_kernel = launch.recorded(_where_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def launch_where(c, a, b, out, a_value, b_value, config: Config) -> None:
    """out (contiguous, the broadcast shape) = where(c, a, b); a or b None: its value
    (already in out's dtype, `value_in`)."""
    shape = tuple(out.shape)
    tensors = [x for x in (c, a, b) if x is not None]
    sizes, strides = nary_plan(shape, [(tuple(x.shape), x.stride()) for x in tensors])
    d, sc = levels(sizes, strides[0])
    sa = levels(sizes, strides[1])[1] if a is not None else [0, 0, 0, 0]
    sb = levels(sizes, strides[-1])[1] if b is not None else [0, 0, 0, 0]
    n = out.numel()
    extent = max(sum((k - 1) * abs(s) for k, s in zip(sizes, st)) for st in strides)
    floating = out.dtype.is_floating_point
    num = float if floating else int
    grid = (triton.cdiv(n, config["BLOCK_SIZE"]),)
    _where_kernel[grid](c, c if a is None else a, c if b is None else b, out, n,
                        num(a_value or 0), num(b_value or 0), *d, *sc, *sa, *sb,
                        A_KIND=2 if a is None else 1, B_KIND=2 if b is None else 1, FLOAT=floating,
                        NDIM=len(sizes), INT64=max(n, extent) > INDEX_LIMIT, **config.kwargs)


class WhereSpec(KernelSpec):
    name = "where"
    ops = ("aten.where.self",)
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    exact = True
    description = "where(condition, self, other) with broadcasting and Python-number operands"
    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_pick, _where_kernel, block_start, strided_offsets, nary_plan, levels, launch_where, value_in)

    def problem_from_row(self, row):
        op = row.op.removesuffix(".default")
        if op != "aten.where.self":
            return NotServable(f"{op}: overload not served")
        if len(row.shapes) != 3:
            return NotServable(f"where takes 3 tensors, the row has {len(row.shapes)}")
        if row.params:
            return NotServable(f"where: unsupported params {', '.join(sorted(row.params))}")
        (c_dt, a_dt, b_dt), shapes = row.dtypes, [tuple(s) for s in row.shapes]
        if c_dt != "bool":
            return NotServable(f"a condition of dtype {c_dt}: torch takes bool only")
        a, b = row_operand(a_dt, shapes[1]), row_operand(b_dt, shapes[2])
        for dt, kind in (a, b):
            if dt not in (VALUE_DTYPES if kind == "number" else TORCH_DTYPES):
                return NotServable(f"dtype {dt} is not served ({', '.join(TORCH_DTYPES)})")
        out_dt = promote(a, b)
        if out_dt not in TORCH_DTYPES:
            return NotServable(f"a result of dtype {out_dt} is not served")
        out_shape = row_output(shapes)
        if isinstance(out_shape, NotServable):
            return out_shape
        n = numel(out_shape)
        extra = (("a_shape", shapes[1]), ("b_shape", shapes[2]), ("c_shape", shapes[0]), ("out_shape", out_shape))
        return Problem(self.name, (out_dt, a_dt, b_dt), seat_flags(layout=layout_of(out_shape, shapes)), (n,),
                       extra)

    def input_shapes(self, problem):
        out_dt, a_dt, b_dt = problem.dtypes
        return {"c": (tuple(problem.get("c_shape")), "bool"), "a": (tuple(problem.get("a_shape")), a_dt),
                "b": (tuple(problem.get("b_shape")), b_dt)}

    def make_inputs(self, problem, rng):
        return {name: (draw(rng, shape, dt, 1000, lambda s: rng.standard_normal(s) * 1e3), dt)
                for name, (shape, dt) in self.input_shapes(problem).items()}

    def oracle(self, problem, inputs):
        out_dt = problem.dtypes[0]
        c = inputs["c"].reshape(tuple(problem.get("c_shape"))) != 0
        a = moves.cast(inputs["a"].reshape(tuple(problem.get("a_shape"))), out_dt)
        b = moves.cast(inputs["b"].reshape(tuple(problem.get("b_shape"))), out_dt)
        return {"out": np.broadcast_to(np.where(c, a, b), tuple(problem.get("out_shape"))).copy()}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("out_shape")), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        c, a, b = (wide_value(inputs[k].reshape(tuple(problem.get(f"{k}_shape")))) for k in ("c", "a", "b"))
        out_dt = problem.dtypes[0]
        values = [None if isinstance(x, torch.Tensor) else value_in(x, out_dt) for x in (a, b)]
        launch_where(c, *(x if isinstance(x, torch.Tensor) else None for x in (a, b)), outputs["out"], *values,
                     config)

    def serve_ops(self):
        return {"aten.where.self": where}

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        big = scale != "small"
        same = (8, 1023, 257) if big else (3, 37, 5)
        mask, scores = ((4, 1, 1, 4097), (4, 32, 1, 4097)) if big else ((2, 1, 1, 9), (2, 3, 1, 9))
        window = (1, 1, 4097, 4097) if big else (1, 1, 9, 9)
        floats = FLOATS if big else ("float16", "float32")
        rows = []
        for dt in floats:
            rows += [make_row("aten.where.self", ["bool", dt, dt], [same] * 3),
                     make_row("aten.where.self", ["bool", dt, "float64"], [mask, scores, ()]),  # masked_fill
                     make_row("aten.where.self", ["bool", "float64", dt], [window, (), window]),
                     make_row("aten.where.self", ["bool", dt, "float32"], [same, same, ()])]
        rows += [make_row("aten.where.self", ["bool", "float64", "float64"], [window, (), ()]),  # a mask's values
                 make_row("aten.where.self", ["bool", "int64", "int64"], [same, same, ()]),
                 make_row("aten.where.self", ["bool", "bool", "bool"], [mask, window, ()]),
                 make_row("aten.where.self", ["bool", "int32", "float16"], [same, same, same])]
        return rows


SPEC = WhereSpec()
SPECS = (SPEC,)


_BITS = {"int32": 32, "int64": 64}


def where(condition: torch.Tensor, self, other) -> torch.Tensor:
    """torch.where(condition, self, other): self and other tensors or Python numbers."""
    try:  # the direct launch (kernels/runtime/launch.py): a value operand is in the key, not an input
        dev = condition.device
        (sk, s_in), (ok, o_in) = operand_key(self, dev), operand_key(other, dev)
        key = (SPEC, *launch.tensor_key(condition), sk, ok)
    except AttributeError:  # not a tensor: the checks say so
        return _where(condition, self, other)
    hit = launch.REMEMBERED.get(key)
    if hit is not None:
        return hit(condition, s_in, o_in)
    return launch.remember(key, (condition, s_in, o_in), _where, condition, self, other)


def _where(condition: torch.Tensor, self, other) -> torch.Tensor:
    if not isinstance(condition, torch.Tensor):
        raise KernelError("where: the condition must be a tensor")
    if condition.dtype != torch.bool:
        raise KernelError(f"where: a condition of dtype {condition.dtype} (torch takes bool only)")
    a, b = _operand(self, "where"), _operand(other, "where")
    self, other = wide_value(self), wide_value(other)
    out_dt = promote(a, b)
    if out_dt not in TORCH_DTYPES:
        raise KernelError(f"where: a result of dtype {out_dt} is not served")
    tensors = [x for x in (condition, self, other) if isinstance(x, torch.Tensor)]
    if any(t.device != condition.device for t in tensors):
        raise KernelError("where: operands on different devices are not served")
    shapes = [tuple(t.shape) for t in (condition, self, other) if isinstance(t, torch.Tensor)]
    out_shape = broadcast_shape(*shapes)
    if out_shape is None:
        raise KernelError(f"where: shapes {', '.join(map(str, shapes))} do not broadcast")
    values = []
    for x in (self, other):
        if out_dt in ("int32", "int64") and not isinstance(x, torch.Tensor) and \
                not -2 ** (_BITS[out_dt] - 1) <= x < 2 ** (_BITS[out_dt] - 1):
            raise KernelError(f"where: {x} does not fit {out_dt} (torch refuses it)")
        if out_dt in FLOATS and not isinstance(x, torch.Tensor) and x == 0 and math.copysign(1.0, x) < 0:
            raise KernelError("where: a value of -0.0 (the launch passes +0.0; torch keeps the sign)")
        v = None if isinstance(x, torch.Tensor) else value_in(x, out_dt)
        if v is None and not isinstance(x, torch.Tensor):
            raise KernelError(f"where: the value {x!r} in {out_dt} is not served")
        values.append(v)
    out = launch.empty(out_shape, TORCH_DTYPES[out_dt], condition.device)
    n = out.numel()
    if n == 0:
        return out
    config = config_for(SPEC, (out_dt, a[0], b[0]), seat_flags(layout=layout_of(out_shape, shapes)), (n,))
    try:
        launch_where(condition, self if isinstance(self, torch.Tensor) else None,
                     other if isinstance(other, torch.Tensor) else None, out, values[0], values[1], config)
    except ValueError as e:
        raise KernelError(f"where: {e}") from None
    return out


"""Fills: `aten.arange` (start + i * step) and constant fills (`aten.full`, `zeros`, `ones`,
`fill_`, `zero_`), one kernel with the pattern as a constexpr (`fn=arange` or `fn=full`, a
seat flag).

arange is served for integral start and step whose every value the output dtype holds
exactly (int64; float32 up to 2^24, float16 2^11, bfloat16 2^8): it is computed in int64
and converted once, so it is exact. A fill value is rounded to the output dtype on the host
the way torch converts a Python number (double -> float -> half/bfloat16), so the kernel
stores bits it is given. Launch key: the element count on the `elements` ladder. Exact.
"""

from __future__ import annotations

import math
import struct

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.copy import block_start
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags
from nbx_tune.oracles import movement as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS, "int32", "int64", "bool")
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
EXACT_INT = {"float32": 2**24, "float16": 2**11, "bfloat16": 2**8, "int32": 2**31 - 1, "int64": 2**63 - 1}
INDEX_LIMIT = 2**31 - 2**17


@triton.jit
def _fill_kernel(out_ptr, n, start, step, IOTA: tl.constexpr, INT64: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr):
    """out[i] = start + i * step (IOTA, integers) or start (a value already in out's dtype)."""
    offs = block_start(tl.program_id(0), BLOCK_SIZE, INT64) + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    if IOTA:
        v = start + offs.to(tl.int64) * step
    else:
        v = tl.zeros([BLOCK_SIZE], dtype=out_ptr.dtype.element_ty) + start
    tl.store(out_ptr + offs, v.to(out_ptr.dtype.element_ty), mask=mask)


_fill_kernel = launch.recorded(_fill_kernel)  # its calls are replayed (kernels/runtime/launch.py)


def value_in(value, dtype: str):
    """A Python number as torch stores it in `dtype` (floats through float32, as c10's
    Half/BFloat16 constructors do), as a Python number."""
    if dtype == "bool":
        return int(bool(value))
    if dtype in ("int32", "int64"):
        return int(value)
    f = struct.unpack("f", struct.pack("f", float(value)))[0]
    if dtype == "float16":
        return struct.unpack("e", struct.pack("e", f))[0]
    if dtype == "bfloat16":
        bits = struct.unpack("I", struct.pack("f", f))[0]
        if f == f:  # round to nearest even on the top 16 bits; NaN stays NaN
            bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF
        return struct.unpack("f", struct.pack("I", bits))[0]
    return f


def launch_fill(out, start, step, iota: bool, config: Config) -> None:
    """out (contiguous) = arange(start, ..., step) or the value start (already value_in)."""
    n = out.numel()
    grid = (triton.cdiv(n, config["BLOCK_SIZE"]),)
    _fill_kernel[grid](out, n, start, step, IOTA=iota, INT64=n > INDEX_LIMIT, **config.kwargs)


def _c(block, warps):
    return Config.make(BLOCK_SIZE=block, num_warps=warps, num_stages=1)


CONFIGS = (_c(256, 2), _c(1024, 4), _c(4096, 8), _c(8192, 16))
DEFAULTS = (_c(1024, 4),)


def _number(text: str):
    """An int for integer text, a float for float text (`1e-06`, `inf`), a bool for
    True/False; ValueError otherwise."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return float(text)


def arange_count(start, end, step) -> int:
    return max(0, math.ceil((end - start) / step))


def arange_plan(start, end, step, dtype: str | None) -> tuple[str, int] | str:
    """(output dtype, count), or why it is not served."""
    if step == 0:
        return "arange with step 0"
    if not all(math.isfinite(v) for v in (start, end, step)):
        return "arange with a non-finite bound or step"
    if (end - start) * step < 0:  # torch refuses it ("inconsistent with step sign"): its error
        return "arange bounds inconsistent with the step's sign"
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step))
    dt = dtype or ("int64" if ints else "float32")
    if dt not in EXACT_INT or dt == "bool":
        return f"arange in {dt} is not served"
    if dt in ("int32", "int64") and not ints:  # torch truncates bounds its own way
        return f"arange in {dt} with a float bound or step is not served"
    if not all(float(v).is_integer() for v in (start, step)):
        return "arange with a fractional start or step is not served (it would not be exact)"
    n = arange_count(start, end, step)
    last = int(start) + (n - 1) * int(step)
    if max(abs(int(start)), abs(last)) > EXACT_INT[dt]:
        return f"arange values beyond {EXACT_INT[dt]} are not exact in {dt}"
    return dt, n


_FULL_OPS = ("aten.full", "aten.zeros", "aten.ones", "aten.fill_.Scalar", "aten.zero_")
# Constant fills shaped by another tensor or by a number: torch runs them as an allocation and
# a `fill_`, so served whole they launch the seat their trace row maps to (`fn=full`).
_LIKE_OPS = ("aten.new_ones", "aten.new_zeros", "aten.new_full", "aten.full_like", "aten.zeros_like",
             "aten.ones_like", "aten.scalar_tensor")
_ARANGE_OPS = ("aten.arange", "aten.arange.start", "aten.arange.start_step")
_ALLOWED = {"aten.arange": {"end", "dtype"}, "aten.arange.start": {"start", "end", "dtype"},
            "aten.arange.start_step": {"start", "end", "step", "dtype"},
            "aten.full": {"size", "fill_value", "dtype"}, "aten.zeros": {"size", "dtype"},
            "aten.ones": {"size", "dtype"}, "aten.fill_.Scalar": {"value"}, "aten.zero_": set(),
            "aten.new_ones": {"size", "dtype"}, "aten.new_zeros": {"size", "dtype"},
            "aten.new_full": {"size", "fill_value", "dtype"}, "aten.full_like": {"fill_value", "dtype"},
            "aten.zeros_like": {"dtype"}, "aten.ones_like": {"dtype"}, "aten.scalar_tensor": {"s", "dtype"}}


class FillSpec(KernelSpec):
    name = "fill"
    ops = _ARANGE_OPS + _FULL_OPS + _LIKE_OPS
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    exact = True
    description = "arange and constant fills: arange, full, zeros, ones, fill_, zero_"

    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (_fill_kernel, block_start, value_in, launch_fill)

    def problem_from_row(self, row):
        op = row.op.removesuffix(".default")
        if op not in _ALLOWED:
            return NotServable(f"{op}: overload not served")
        unknown = set(row.params) - _ALLOWED[op]
        if unknown:
            return NotServable(f"{op}: unsupported params {', '.join(sorted(unknown))}")
        try:
            if op in _ARANGE_OPS:
                start = _number(row.params.str("start", "0"))
                end = _number(row.params.str("end"))
                step = _number(row.params.str("step", "1"))
                got = arange_plan(start, end, step, row.params.str("dtype"))
                if isinstance(got, str):
                    return NotServable(got)
                dt, n = got
                if n == 0:
                    return NotServable("an empty arange: nothing to launch")
                return Problem(self.name, (dt,), seat_flags(fn="arange"), (n,),
                               (("shape", (n,)), ("start", int(start)), ("step", int(step))))
            if op in _LIKE_OPS:
                shape, dt, value = _like_row(op, row)
            elif op in ("aten.fill_.Scalar", "aten.zero_"):
                if len(row.shapes) != 1:
                    return NotServable(f"{op} takes one tensor, the row has {len(row.shapes)}")
                shape, dt = row.shapes[0], row.dtypes[0]
                value = _number(row.params.str("value", "0"))
            else:
                shape = row.params.ints("size", ())
                value = {"aten.zeros": 0, "aten.ones": 1}.get(op)
                if value is None:
                    value = _number(row.params.str("fill_value"))
                default = ("bool" if isinstance(value, bool) else "int64" if isinstance(value, int)
                           else "float32") if op == "aten.full" else "float32"
                dt = row.params.str("dtype", default)
        except (ValueError, TypeError) as e:
            return NotServable(f"{op}: bad params: {e}")
        if dt not in TORCH_DTYPES:
            return NotServable(f"dtype {dt} is not served ({', '.join(TORCH_DTYPES)})")
        if dt in ("int32", "int64") and not float(value).is_integer():
            return NotServable(f"a fractional fill value {value} into {dt} is not served")
        n = numel(shape)
        if n == 0:
            return NotServable("an empty tensor: nothing to launch")
        value = float(value) if dt in ("float16", "bfloat16", "float32") else int(value)
        return Problem(self.name, (dt,), seat_flags(fn="full"), (n,),
                       (("shape", tuple(shape)), ("value", value)))

    def input_shapes(self, problem):
        return {}

    def make_inputs(self, problem, rng):
        return {}

    def oracle(self, problem, inputs):
        dt = problem.dtypes[0]
        if dict(problem.flags)["fn"] == "arange":
            ref = oracle.arange(problem.get("start"), problem.get("step"), problem.dims[0])
        else:
            ref = oracle.full(tuple(problem.get("shape")), problem.get("value"))
        return {"out": oracle.cast(ref, dt)}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("shape")), problem.dtypes[0])}

    def serve_ops(self):
        return {**{op: arange for op in _ARANGE_OPS}, "aten.full": full, "aten.zeros": zeros,
                "aten.ones": ones, "aten.fill_.Scalar": fill_, "aten.zero_": zero_, **_like_routes()}

    def launch(self, config, problem, inputs, outputs):
        if dict(problem.flags)["fn"] == "arange":
            launch_fill(outputs["out"], problem.get("start"), problem.get("step"), True, config)
        else:
            launch_fill(outputs["out"], value_in(problem.get("value"), problem.dtypes[0]), 0, False, config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        big = scale != "small"
        n = 1000003 if big else 1001
        size = "8x1023x4097" if big else "3x37x5"
        floats = ("float16", "bfloat16", "float32") if big else ("float16", "float32")
        rows = [make_row("aten.arange", [], [], {"end": str(n)}),
                make_row("aten.arange", [], [], {"end": "1"}),
                make_row("aten.arange.start_step", [], [], {"start": "7", "end": "-3000", "step": "-3"}),
                make_row("aten.arange.start", [], [], {"start": "-5", "end": "2000", "dtype": "float32"}),
                make_row("aten.arange", [], [], {"end": "250", "dtype": "bfloat16" if big else "float16"}),
                make_row("aten.full", [], [], {"size": "1x24", "fill_value": "False", "dtype": "bool"}),
                make_row("aten.ones", [], [], {"size": size, "dtype": "int64"})]
        for dt in floats:
            rows += [make_row("aten.full", [], [], {"size": size, "fill_value": "1e-06", "dtype": dt}),
                     make_row("aten.zeros", [], [], {"size": size, "dtype": dt}),
                     make_row("aten.fill_.Scalar", [dt], [(n,)], {"value": "-0.3333"}),
                     make_row("aten.zero_", [dt], [(n,)])]
        return rows


SPEC = FillSpec()
SPECS = (SPEC,)


def _like_row(op: str, row):
    """(shape, dtype, value) of a `_LIKE_OPS` row; ValueError on a bad one."""
    if op == "aten.scalar_tensor":
        if row.shapes:
            raise ValueError("scalar_tensor takes no tensor")
        return (), row.params.str("dtype", "float32"), _number(row.params.str("s"))
    if len(row.shapes) != 1:
        raise ValueError(f"{op} takes one tensor, the row has {len(row.shapes)}")
    shape = row.params.ints("size", ()) if op.startswith("aten.new_") else row.shapes[0]
    value = {"aten.new_ones": 1, "aten.ones_like": 1, "aten.new_zeros": 0, "aten.zeros_like": 0}.get(op)
    if value is None:
        value = _number(row.params.str("fill_value"))
    return tuple(shape), row.params.str("dtype", row.dtypes[0]), value


# ----------------------------------------------------------------------------- public ops

def _dt(dtype, default) -> str:
    """dtype's name; None: `default` (a name, or torch's default dtype)."""
    if dtype is None and isinstance(default, str):
        return default
    try:
        return _NAMES[default if dtype is None else dtype]
    except KeyError:
        raise KernelError(f"fill: dtype {dtype or default} is not served ({', '.join(TORCH_DTYPES)})") from None


def _fill(out: torch.Tensor, value, what: str) -> torch.Tensor:
    dt = _NAMES.get(out.dtype)
    if dt is None:
        raise KernelError(f"{what}: dtype {out.dtype} is not served ({', '.join(TORCH_DTYPES)})")
    if isinstance(value, torch.Tensor):
        value = value.item()
    if dt in FLOATS and value == 0 and math.copysign(1.0, value) < 0:
        raise KernelError(f"{what}: -0.0 (the launch writes +0.0; torch keeps the sign)")
    if dt in ("int32", "int64") and not float(value).is_integer():
        raise KernelError(f"{what}: a fractional value {value} into {dt} is not served")
    if dt in ("int32", "int64") and not -_LIMIT[dt] <= value < _LIMIT[dt]:
        raise KernelError(f"{what}: {value} does not fit {dt} (torch refuses it)")
    if dt in FLOATS and math.isfinite(value) and abs(value) > _FLOAT_MAX:
        raise KernelError(f"{what}: {value} is beyond float32 (torch refuses it, or makes inf)")
    try:
        bits = value_in(value, dt)
    except OverflowError:  # beyond float32 (torch refuses it) or float16 (torch's inf)
        raise KernelError(f"{what}: {value} overflows {dt}: torch's conversion") from None
    if out.numel() == 0:
        return out
    if not out.is_contiguous():
        raise KernelError(f"{what}: a non-contiguous output is not served")
    config = config_for(SPEC, (dt,), seat_flags(fn="full"), (out.numel(),))
    launch_fill(out, bits, 0, False, config)
    return out


REMEMBERED = launch.REMEMBERED
_LIMIT = {"int32": 2**31, "int64": 2**63}
_FLOAT_MAX = 3.4028234663852886e38


def arange(start, end=None, step=1, *, dtype=None, layout=None, device=None, pin_memory=None) -> torch.Tensor:
    """aten.arange (end), .start (start, end) and .start_step: exact values only."""
    try:  # "cuda" is the current device, which may change: keyed resolved (`_resolved`)
        key = (SPEC, "arange", type(start), start, type(end), end, type(step), step, dtype,
               device if device is None else _resolved(device))
        hit = REMEMBERED.get(key)
    except TypeError:  # unhashable, or a device not resolved: the ordinary path
        return _arange_call(start, end, step, dtype, device)
    if hit is not None:  # the direct launch (kernels/runtime/launch.py)
        return hit()
    return launch.remember(key, (), _arange_call, start, end, step, dtype, device)


def _arange_call(start, end, step, dtype, device) -> torch.Tensor:
    if end is None:
        start, end = 0, start
    got = arange_plan(start, end, step, None if dtype is None else _dt(dtype, ""))
    if isinstance(got, str):
        raise KernelError(f"arange: {got}")
    dt, n = got
    out = launch.empty((n,), TORCH_DTYPES[dt], device)
    if n:
        config = config_for(SPEC, (dt,), seat_flags(fn="arange"), (n,))
        launch_fill(out, int(start), int(step), True, config)
    return out


def _created(what: str, size, dt, device, value) -> torch.Tensor:
    """A new tensor of `size` filled with `value`, replayed (kernels/runtime/launch.py) where
    the call names its device and `value` is a Python number: the key holds the op, the size,
    the dtype resolved (the default dtype may change), the device and the value by its repr
    (its type, and -0.0 apart from 0.0). device=None is the default device, and "cuda" the
    current one, which may change: the key holds the device resolved, or the call takes the
    ordinary path."""
    if device is None or not isinstance(value, (bool, int, float)):
        return _fill(torch.empty(tuple(size), dtype=dt, device=device), value, what)
    try:
        dev = _resolved(device)
        key = (SPEC, what, tuple(size), dt, dev, repr(value))
        hit = REMEMBERED.get(key)
    except TypeError:  # not a sequence of sizes, an unhashable size, a device not resolved: the ordinary path
        return _fill(torch.empty(size, dtype=dt, device=device), value, what)
    if hit is not None:
        return hit()
    return launch.remember(key, (), _create, what, key[2], dt, dev, value)


def _resolved(device):
    """The device a tensor made on `device` lands on, or TypeError where that depends on more."""
    dev = device if isinstance(device, torch.device) else torch.device(device)
    if dev.index is not None or dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    raise TypeError(f"the current {dev.type} device")


def _create(what, size, dt, device, value) -> torch.Tensor:
    return _fill(launch.empty(size, dt, device), value, what)


def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None) -> torch.Tensor:
    default = ("bool" if isinstance(fill_value, bool) else "int64" if isinstance(fill_value, int)
               else "float32")
    return _created("full", size, TORCH_DTYPES[_dt(dtype, default)], device, fill_value)


def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None) -> torch.Tensor:
    return _created("zeros", size, TORCH_DTYPES[_dt(dtype, torch.get_default_dtype())], device, 0)


def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None) -> torch.Tensor:
    return _created("ones", size, TORCH_DTYPES[_dt(dtype, torch.get_default_dtype())], device, 1)


def fill_(self: torch.Tensor, value) -> torch.Tensor:
    return _in_place(self, value, "fill_")


def zero_(self: torch.Tensor) -> torch.Tensor:
    return _in_place(self, 0, "zero_")


def _in_place(self, value, what: str) -> torch.Tensor:
    """self filled in place; replayed where value is a Python number (the key: the op, self's
    layout and the value's repr)."""
    if not isinstance(value, (bool, int, float)) or not isinstance(self, torch.Tensor):
        return _fill(self, value, what)
    key = (SPEC, what, *launch.tensor_key(self), repr(value))
    hit = REMEMBERED.get(key)
    return hit(self) if hit is not None else launch.remember(key, (self,), _fill, self, value, what)


def _like_out(self, size, dtype, layout, device, memory_format=None) -> torch.Tensor:
    """The output of a `_LIKE_OPS` fill of self (new_*: of `size`), in self's dtype and on
    its device by default."""
    if not isinstance(self, torch.Tensor):
        raise KernelError("fill: the operand must be a tensor")
    if layout not in (None, torch.strided):
        raise KernelError(f"fill: layout {layout} is not served")
    dt = TORCH_DTYPES[_dt(dtype, _dt(self.dtype, ""))]
    device = self.device if device is None else device
    if size is not None:
        return torch.empty(tuple(size), dtype=dt, device=device)
    return torch.empty_like(self, dtype=dt, device=device, memory_format=memory_format or torch.preserve_format)


def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill(_like_out(self, size, dtype, layout, device), fill_value, "new_full")


def new_ones(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill(_like_out(self, size, dtype, layout, device), 1, "new_ones")


def new_zeros(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _fill(_like_out(self, size, dtype, layout, device), 0, "new_zeros")


def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _filled_like("full_like", fill_value, self, dtype, layout, device, memory_format)


def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _filled_like("ones_like", 1, self, dtype, layout, device, memory_format)


def zeros_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _filled_like("zeros_like", 0, self, dtype, layout, device, memory_format)


def _filled_like(what, value, self, dtype, layout, device, memory_format) -> torch.Tensor:
    """A `*_like` fill, replayed (kernels/runtime/launch.py) where value is a Python number:
    the key holds the op, self's layout (the output's strides follow it), the dtype and the
    device resolved, the layout, the memory format and the value by its repr (-0.0 apart)."""
    if not isinstance(value, (bool, int, float)) or not isinstance(self, torch.Tensor) or \
            layout not in (None, torch.strided):
        return _fill(_like_out(self, None, dtype, layout, device, memory_format), value, what)
    dt = TORCH_DTYPES[_dt(dtype, _dt(self.dtype, ""))]
    try:  # "cuda" is the current device, which may change: keyed resolved
        dev = self.device if device is None else _resolved(device)
        key = (SPEC, what, *launch.tensor_key(self), dt, dev, layout, memory_format, repr(value))
        hit = REMEMBERED.get(key)
    except TypeError:
        return _fill(_like_out(self, None, dtype, layout, device, memory_format), value, what)
    if hit is not None:
        return hit()
    return launch.remember(key, (), _create_like, what, value, self, dt, dev, memory_format)


def _create_like(what, value, self, dt, device, memory_format) -> torch.Tensor:
    # torch's strides for the format (preserve_format keeps self's where dense), made by `empty`
    like = torch.empty_like(self, dtype=dt, device=device, memory_format=memory_format or torch.preserve_format)
    return _fill(launch.empty(tuple(like.shape), dt, device, like.stride()), value, what)


def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _created("scalar_tensor", (), TORCH_DTYPES[_dt(dtype, torch.get_default_dtype())], device, s)


def _like_routes() -> dict:
    return {"aten.new_ones": new_ones, "aten.new_zeros": new_zeros, "aten.new_full": new_full,
            "aten.full_like": full_like, "aten.zeros_like": zeros_like, "aten.ones_like": ones_like,
            "aten.scalar_tensor": scalar_tensor}

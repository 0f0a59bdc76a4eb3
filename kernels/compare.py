"""Comparisons and bitwise/logical ops, the small ops masks are built from: `gt`, `ge`,
`lt`, `le`, `eq`, `ne` (Tensor and Scalar overloads), `bitwise_and`/`or`/`xor`,
`logical_and`/`or`/`xor`, `bitwise_not`, `logical_not`; one kernel, the op a constexpr
(`fn`, a seat flag).

Exactly torch's rules: the operands are converted to torch's result type of the pair
(`torch.result_type`, computed on the host: one rule, torch's own) and compared or combined
there, so a fp16 tensor against a 0-d fp32 tensor compares at fp16 and an int64 tensor
against 0.5 at float32. Float compute types compare in fp32 after the conversion (exact:
fp16 and bf16 widen exactly), integer ones in int64; NaN compares as IEEE (only `ne` is
true). A comparison or a logical op writes bool; a bitwise op writes the result type, and
is refused on floats, as torch refuses it. Served dtypes: bool, int32, int64, float16,
bfloat16, float32.

Operands broadcast with any strides (merged dims, at most 4: `nary_plan`); a Python number
(or a 0-d tensor on another device) is passed by value. The seat: the element count of the
output on the `elements` ladder; flags `fn` and `layout` (`same` where every operand with
dims has the output's shape, else `bcast`): read from shapes only, so a trace row and the
launch serve() makes of the same call meet at one seat whatever the strides. Exact.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import block_start, strided_offsets
from nbx_tune.kernels.elementwise.spec import _scalar_dtype, broadcast_shape
from nbx_tune.kernels.helpers import FLOATS, contiguous_strides, torch_dtypes
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags
from nbx_tune.oracles import movement as moves

TORCH_DTYPES = torch_dtypes("bool", "int32", "int64", *FLOATS)
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
# What a Python number (or a 0-d operand) may be beside them: torch wraps a float as float64.
VALUE_DTYPES = torch_dtypes("bool", "int32", "int64", *FLOATS, "float64")
INDEX_LIMIT = 2**31 - 2**17
MAX_DIMS = 4  # merged dims (strided_offsets')

COMPARE_FNS = ("gt", "ge", "lt", "le", "eq", "ne")
BITWISE_FNS = ("bitwise_and", "bitwise_or", "bitwise_xor")
LOGICAL_FNS = ("logical_and", "logical_or", "logical_xor")
UNARY_FNS = ("bitwise_not", "logical_not")
BINARY_FNS = COMPARE_FNS + BITWISE_FNS + LOGICAL_FNS


# ----------------------------------------------------------------------------- device code

@triton.jit
def as_compute(x, CT: tl.constexpr):
    """x converted to the compute type CT (torch's result type), then widened: fp32 for a
    float CT, int64 for an integer or bool one (a bool as 0/1; a float to bool is x != 0)."""
    if CT == "float16":
        y = x.to(tl.float16).to(tl.float32)
    elif CT == "bfloat16":
        y = x.to(tl.bfloat16).to(tl.float32)
    elif CT == "float32":
        y = x.to(tl.float32)
    elif CT == "int32":
        y = x.to(tl.int32).to(tl.int64)
    elif CT == "bool":
        y = (x != 0).to(tl.int64)
    else:
        y = x.to(tl.int64)
    return y


@triton.jit
def _compare_math(a, b, FN: tl.constexpr):
    if FN == "gt":
        y = a > b
    elif FN == "ge":
        y = a >= b
    elif FN == "lt":
        y = a < b
    elif FN == "le":
        y = a <= b
    elif FN == "eq":
        y = a == b
    elif FN == "ne":
        y = a != b
    elif FN == "bitwise_and":
        y = a & b
    elif FN == "bitwise_or":
        y = a | b
    elif FN == "bitwise_xor":
        y = a ^ b
    elif FN == "logical_and":
        y = (a != 0) & (b != 0)
    elif FN == "logical_or":
        y = (a != 0) | (b != 0)
    elif FN == "logical_xor":
        y = (a != 0) ^ (b != 0)
    elif FN == "bitwise_not":
        y = ~a
    else:  # logical_not
        y = a == 0
    return y


@triton.jit
def _compare_kernel(a_ptr, b_ptr, out_ptr, n, b_value, D1, D2, D3, SA0, SA1, SA2, SA3,
                    SB0, SB1, SB2, SB3, FN: tl.constexpr, CT: tl.constexpr, B_KIND: tl.constexpr,
                    NDIM: tl.constexpr, INT64: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """out[i] = FN(a, b) over the contiguous output; a strided over NDIM merged dims (the
    output's), b likewise (B_KIND 1), the runtime value b_value (2) or absent (0: unary)."""
    offs = block_start(tl.program_id(0), BLOCK_SIZE, INT64) + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    a = as_compute(tl.load(a_ptr + strided_offsets(offs, NDIM, D1, D2, D3, SA0, SA1, SA2, SA3), mask=mask), CT)
    if B_KIND == 1:
        b = as_compute(tl.load(b_ptr + strided_offsets(offs, NDIM, D1, D2, D3, SB0, SB1, SB2, SB3),
                               mask=mask), CT)
    elif B_KIND == 2:  # a value already in CT (`value_in`): widened the way a loaded one is
        if (CT == "float16") or (CT == "bfloat16") or (CT == "float32"):
            b = tl.zeros([BLOCK_SIZE], dtype=tl.float32) + b_value
        else:
            b = tl.zeros([BLOCK_SIZE], dtype=tl.int64) + b_value
    else:
        b = a
    y = _compare_math(a, b, FN)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


_compare_kernel = launch.recorded(_compare_kernel)  # its calls are replayed (kernels/runtime/launch.py)


# ----------------------------------------------------------------------------- host plan

def nary_plan(out_shape, operands) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """The output's dims merged as far as every operand ((shape, strides), broadcast to
    out_shape) allows: (sizes, strides per operand), outermost first. ValueError past
    MAX_DIMS merged dims."""
    expanded = []
    for shape, strides in operands:
        pad = len(out_shape) - len(shape)
        expanded.append([0] * pad + [0 if d == 1 else s for d, s in zip(shape, strides)])
    merged: list[tuple[int, list[int]]] = []
    for i, d in enumerate(out_shape):
        if d == 1:
            continue
        st = [e[i] for e in expanded]
        if merged and all(ps == s * d for ps, s in zip(merged[-1][1], st)):
            merged[-1] = (merged[-1][0] * d, st)
        else:
            merged.append((d, st))
    if not merged:
        merged = [(1, [0] * len(operands))]
    if len(merged) > MAX_DIMS:
        raise ValueError(f"{len(merged)} dims after merging (the kernel takes {MAX_DIMS})")
    return tuple(d for d, _ in merged), [tuple(st[k] for _, st in merged) for k in range(len(operands))]


def levels(sizes, strides) -> tuple[list[int], list[int]]:
    """(D1..D3, S0..S3) of `strided_offsets`: innermost-first sizes, the outermost stride first."""
    nd = len(sizes)
    d = [sizes[nd - 1 - k] if k < nd - 1 else 1 for k in range(3)]
    s = [strides[0]] + [strides[nd - 1 - k] if k < nd - 1 else 0 for k in range(3)]
    return d, s


def wide_value(x):
    """A 0-d float64 tensor as the Python number it holds: what a trace writes for a wrapped
    number, launched as a value (no kernel loads float64)."""
    if isinstance(x, torch.Tensor) and x.dim() == 0 and x.dtype == torch.float64:
        return x.item()
    return x


def launch_compare(a, b, out, fn: str, ct: str, b_value, config: Config) -> None:
    """out (contiguous, the broadcast shape) = fn(a, b) computed in ct; b a tensor, or None
    with b_value a number already in ct (`value_in`), or None for a unary fn."""
    shape = tuple(out.shape)
    ops = [(tuple(a.shape), a.stride())] + ([] if b is None else [(tuple(b.shape), b.stride())])
    sizes, strides = nary_plan(shape, ops)
    d, sa = levels(sizes, strides[0])
    sb = levels(sizes, strides[1])[1] if b is not None else [0, 0, 0, 0]
    n = out.numel()
    extent = max(sum((k - 1) * abs(s) for k, s in zip(sizes, st)) for st in strides)
    kind = 1 if b is not None else (2 if fn not in UNARY_FNS else 0)
    value = 0 if kind != 2 else (float(b_value) if ct[0] == "f" else int(b_value))
    if fn == "bitwise_not" and ct == "bool":
        fn = "logical_not"  # ~ of a bool is not; of its 0/1 in int64 it would be -1/-2
    grid = (triton.cdiv(n, config["BLOCK_SIZE"]),)
    _compare_kernel[grid](a, a if b is None else b, out, n, value, *d, *sa, *sb, FN=fn, CT=ct, B_KIND=kind,
                          NDIM=len(sizes), INT64=max(n, extent) > INDEX_LIMIT, **config.kwargs)


# ----------------------------------------------------------------------------- torch's rules

_SAMPLE = {"bool": True, "int64": 1, "float64": 1.0}


def promote(a: tuple[str, str], b: tuple[str, str] | None = None) -> str:
    """torch's result type of operands given as (dtype, kind), kind "tensor" (with dims),
    "0d" or "number" (a Python number: dtype bool, int64 or float64), computed by torch."""
    def sample(dt, kind):
        if kind == "number":
            return _SAMPLE[dt]
        return torch.empty((1,) if kind == "tensor" else (), dtype=VALUE_DTYPES[dt])
    if b is None:
        return a[0]
    x, y = sample(*a), sample(*b)
    if not isinstance(x, torch.Tensor):
        x, y = y, x  # the order does not matter to torch's rule
    return str(torch.result_type(x, y)).removeprefix("torch.")


def result_of(fn: str, ct: str) -> str | NotServable:
    """The output dtype of fn computed in ct, or why torch refuses it."""
    if ct not in TORCH_DTYPES:
        return NotServable(f"compute dtype {ct} is not served ({', '.join(TORCH_DTYPES)})")
    if fn in BITWISE_FNS or fn == "bitwise_not":
        if ct in FLOATS:
            return NotServable(f"{fn} of {ct}: torch refuses bitwise ops on floats")
        return ct
    return "bool"


def value_in(value, dtype: str):
    """A Python number as torch converts it to `dtype` (floats through float32, as c10's
    Half/BFloat16 constructors do; NaN and the infinities kept)."""
    if dtype == "bool":
        return int(bool(value))
    if dtype in ("int32", "int64"):
        if isinstance(value, float) and not value.is_integer():
            return None
        v = int(value)
        if dtype == "int32":
            v = (v + 2**31) % 2**32 - 2**31
        return v
    t = torch.tensor(float(value), dtype=torch.float64).to(TORCH_DTYPES[dtype])
    return float(t)


# ----------------------------------------------------------------------------- the spec

_OPS = {f"aten.{fn}.{o}": fn for fn in COMPARE_FNS + BITWISE_FNS for o in ("Tensor", "Scalar")}
_OPS.update({f"aten.{fn}": fn for fn in LOGICAL_FNS + UNARY_FNS})


def _wrapped_dtype(text: str) -> str | None:
    """The dtype torch wraps a Scalar param in (bool, int64, float64), None for no number."""
    return "bool" if text in ("True", "False") else _scalar_dtype(text)


def _number(text: str):
    return text == "True" if text in ("True", "False") else int(text) if _wrapped_dtype(text) == "int64" \
        else float(text)


def row_operand(dt: str, shape) -> tuple[str, str]:
    """A row's operand as `promote` takes it: a 0-d float64/int64/bool is what a trace writes
    for a Python number."""
    if not len(shape):
        return (dt, "number" if dt in _SAMPLE else "0d")
    return (dt, "tensor")


def row_output(shapes) -> tuple[int, ...] | NotServable:
    """The output shape of a row's operands, or why it is not launched (no broadcast, empty,
    more merged dims than the kernels take)."""
    out_shape = broadcast_shape(*shapes)
    if out_shape is None:
        return NotServable(f"shapes {' and '.join(format_shape(s) for s in shapes)} do not broadcast")
    if numel(out_shape) == 0:
        return NotServable("an empty output: nothing to launch")
    try:
        nary_plan(out_shape, [(s, contiguous_strides(s)) for s in shapes])
    except ValueError as e:
        return NotServable(str(e))
    return out_shape


def layout_of(out_shape, shapes) -> str:
    """`same` where every operand with dims has the output's shape, else `bcast`."""
    return "bcast" if any(len(s) and tuple(s) != tuple(out_shape) for s in shapes) else "same"


def _c(block, warps):
    return Config.make(BLOCK_SIZE=block, num_warps=warps, num_stages=1)


CONFIGS = (_c(256, 2), _c(512, 4), _c(1024, 4), _c(2048, 8), _c(4096, 8), _c(8192, 16))
DEFAULTS = (_c(1024, 4),)


class CompareSpec(KernelSpec):
    name = "compare"
    ops = tuple(_OPS)
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    exact = True
    description = "comparisons and bitwise/logical ops: gt, ge, lt, le, eq, ne, bitwise_and/or/xor/not, logical_*"
    config_space = CONFIGS
    default_configs = DEFAULTS

    def source_parts(self):
        return (as_compute, _compare_math, _compare_kernel, block_start, strided_offsets, nary_plan, levels,
                launch_compare, value_in)

    def problem_from_row(self, row):
        op = row.op.removesuffix(".default")
        fn = _OPS.get(op)
        if fn is None:
            return NotServable(f"{op}: overload not served")
        unary = fn in UNARY_FNS
        scalar = op.endswith(".Scalar")
        want = 1 if unary or scalar else 2
        if len(row.shapes) != want:
            return NotServable(f"{op} takes {want} tensor(s), the row has {len(row.shapes)}")
        unknown = set(row.params) - ({"other"} if scalar else set())
        if unknown:
            return NotServable(f"{op}: unsupported params {', '.join(sorted(unknown))}")
        a_shape, a_dt = tuple(row.shapes[0]), row.dtypes[0]
        if a_dt not in TORCH_DTYPES:
            return NotServable(f"dtype {a_dt} is not served ({', '.join(TORCH_DTYPES)})")
        extra = [("a_shape", a_shape)]
        a = (a_dt, "tensor" if len(a_shape) else "0d")
        if unary:
            b, b_dt, shapes = None, None, [a_shape]
        elif scalar:
            text = row.params.str("other", "")
            b_dt = _wrapped_dtype(text)
            if b_dt is None:
                return NotServable(f"{op} needs a numeric other=, got {text!r}")
            b = (b_dt, "number")
            extra.append(("b_value", _number(text)))
            shapes = [a_shape]
        else:
            b_shape, b_dt = tuple(row.shapes[1]), row.dtypes[1]
            if b_dt not in VALUE_DTYPES or (b_dt == "float64" and len(b_shape)):
                return NotServable(f"dtype {b_dt} is not served ({', '.join(TORCH_DTYPES)})")
            b = row_operand(b_dt, b_shape)
            extra.append(("b_shape", b_shape))
            shapes = [a_shape, b_shape]
        ct = promote(a, b)
        out_dt = result_of(fn, ct)
        if isinstance(out_dt, NotServable):
            return out_dt
        out_shape = row_output(shapes)
        if isinstance(out_shape, NotServable):
            return out_shape
        n = numel(out_shape)
        if scalar and value_in(dict(extra)["b_value"], ct) is None:
            return NotServable(f"a fractional scalar compared in {ct} is not served")
        extra += [("ct", ct), ("out_shape", out_shape)]
        dtypes = (out_dt, a_dt) if unary else (out_dt, a_dt, b_dt)
        return Problem(self.name, dtypes, seat_flags(fn=fn, layout=layout_of(out_shape, shapes)), (n,),
                       tuple(sorted(extra)))

    def input_shapes(self, problem):
        shapes = {"a": (tuple(problem.get("a_shape")), problem.dtypes[1])}
        if problem.get("b_shape") is not None:
            shapes["b"] = (tuple(problem.get("b_shape")), problem.dtypes[2])
        return shapes

    def make_inputs(self, problem, rng):
        # Few distinct values (halves in [-2, 2]): equal pairs are common, so eq/ge/le are
        # tested on ties.
        return {name: (draw(rng, shape, dt, 4, lambda s: rng.integers(-4, 5, s) * 0.5), dt)
                for name, (shape, dt) in self.input_shapes(problem).items()}

    def oracle(self, problem, inputs):
        fn, ct = dict(problem.flags)["fn"], problem.get("ct")
        a = _in_compute(inputs["a"].reshape(tuple(problem.get("a_shape"))), ct)
        if "b" in inputs:
            b = _in_compute(inputs["b"].reshape(tuple(problem.get("b_shape"))), ct)
        elif problem.get("b_value") is not None:
            b = _in_compute(np.asarray(problem.get("b_value")), ct)
        else:
            b = None
        y = _ORACLE["logical_not" if fn == "bitwise_not" and ct == "bool" else fn](a, b)  # ~True is False
        out = np.broadcast_to(y, tuple(problem.get("out_shape"))).copy()
        return {"out": moves.cast(out, problem.dtypes[0])}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("out_shape")), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        fn, ct = dict(problem.flags)["fn"], problem.get("ct")
        a = inputs["a"].reshape(tuple(problem.get("a_shape")))
        b = inputs.get("b")
        value = problem.get("b_value")
        if b is not None:
            b = wide_value(b.reshape(tuple(problem.get("b_shape"))))
            if not isinstance(b, torch.Tensor):
                b, value = None, b
        launch_compare(a, b, outputs["out"], fn, ct, None if value is None else value_in(value, ct), config)

    def serve_ops(self):
        return {op: _public(fn) for op, fn in _OPS.items()}

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        big = scale != "small"
        same = (8, 1023, 257) if big else (3, 37, 5)
        bc = ((1, 1, 1, 4097), (1, 1, 4097, 1)) if big else ((1, 1, 1, 13), (1, 1, 13, 1))
        mask = ((4, 1, 1, 4097), (1, 1, 4097, 4097)) if big else ((2, 1, 1, 9), (1, 1, 9, 9))
        floats = FLOATS if big else ("float16", "float32")
        rows = []
        for i, fn in enumerate(COMPARE_FNS):
            dt = floats[i % len(floats)]
            rows += [make_row(f"aten.{fn}.Tensor", ["int64", "int64"], list(bc)),  # a sliding window's
                     make_row(f"aten.{fn}.Tensor", [dt, dt], [same, same]),
                     make_row(f"aten.{fn}.Scalar", [dt], [same], {"other": "0.5"})]
        rows += [make_row("aten.gt.Tensor", ["float16", "float32"], [same, ()]),  # a 0-d operand: fp16
                 make_row("aten.lt.Tensor", ["int64", "float64"], [same, ()]),  # ids < 0.5: float32
                 make_row("aten.eq.Scalar", ["bool"], [same], {"other": "1"}),
                 make_row("aten.ne.Tensor", ["int32", "int64"], [same, same])]
        for fn in BITWISE_FNS:
            rows += [make_row(f"aten.{fn}.Tensor", ["bool", "bool"], list(mask)),
                     make_row(f"aten.{fn}.Tensor", ["bool", "bool"], [(), mask[1]]),
                     make_row(f"aten.{fn}.Tensor", ["int64", "int32"], [same, same]),
                     make_row(f"aten.{fn}.Scalar", ["int32"], [same], {"other": "6"})]
        for fn in LOGICAL_FNS:
            rows += [make_row(f"aten.{fn}", ["bool", "bool"], list(mask)),
                     make_row(f"aten.{fn}", ["float32", "int64"], [same, same])]
        rows += [make_row("aten.bitwise_not", ["bool"], [mask[1]]),
                 make_row("aten.bitwise_not", ["int64"], [same]),
                 make_row("aten.logical_not", ["bool"], [mask[1]]),
                 make_row("aten.logical_not", [floats[0]], [same])]
        return rows


def draw(rng, shape, dt: str, ints: int, floats) -> np.ndarray:
    """Seeded values of one operand: bools, integers in [-ints, ints], or `floats(shape)`
    with 5 % of them NaN, the infinities or -0.0."""
    if dt == "bool":
        return rng.integers(0, 2, shape)
    if dt in ("int32", "int64"):
        return rng.integers(-ints, ints + 1, shape)
    v = floats(shape)
    return np.where(rng.random(shape) < 0.05, rng.choice([np.nan, np.inf, -np.inf, -0.0], shape), v)


def _in_compute(x, ct: str) -> np.ndarray:
    """Values converted to the compute type as the kernel converts them (exact integers,
    floats rounded), as float64 or int64."""
    x = np.asarray(x)
    if ct == "bool":
        return (x != 0).astype(np.int64)
    if ct in ("int32", "int64"):
        return moves.cast(x, ct).astype(np.int64)
    return moves.cast(x.astype(np.float64), ct)


_ORACLE = {
    "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "bitwise_and": lambda a, b: a & b, "bitwise_or": lambda a, b: a | b, "bitwise_xor": lambda a, b: a ^ b,
    "logical_and": lambda a, b: (a != 0) & (b != 0), "logical_or": lambda a, b: (a != 0) | (b != 0),
    "logical_xor": lambda a, b: (a != 0) ^ (b != 0),
    "bitwise_not": lambda a, b: ~a, "logical_not": lambda a, b: a == 0,
}

SPEC = CompareSpec()
SPECS = (SPEC,)


# ----------------------------------------------------------------------------- public ops

def _operand(x, what: str):
    """(dtype, kind) of an operand: a served tensor, a 0-d tensor, or a Python number."""
    if isinstance(x, torch.Tensor):
        dt = _NAMES.get(x.dtype)
        if dt is None and not (x.dim() == 0 and x.dtype == torch.float64):
            raise KernelError(f"{what}: dtype {x.dtype} is not served ({', '.join(TORCH_DTYPES)})")
        return (dt or "float64", "tensor" if x.dim() else "0d")
    if isinstance(x, bool):
        return ("bool", "number")
    if isinstance(x, int):
        return ("int64", "number")
    if isinstance(x, float):
        return ("float64", "number")
    raise KernelError(f"{what}: an operand of type {type(x).__name__} is not served")


def operand_key(x, device) -> tuple:
    """(key part, the tensor a replay takes or None) of an operand of compare's or where's
    direct launch (kernels/runtime/launch.py): a tensor's layout, or a value the launch is
    passed (a Python number; a 0-d tensor on another device, or in float64: `wide_value`) by
    its repr, which holds its type and tells -0.0 from 0.0 (where(m, x, -0.0))."""
    if isinstance(x, torch.Tensor):
        if x.dim() == 0 and (x.device != device or x.dtype == torch.float64):
            return (x.dtype, x.device, repr(x.item())), None
        return launch.tensor_key(x), x
    return repr(x), None


def binary(fn: str, a: torch.Tensor, b) -> torch.Tensor:
    """fn(a, b) as torch computes it: a a tensor, b a tensor (broadcast) or a Python number."""
    try:  # the direct launch: b is a: one input, both operands at its address
        bk, b_in = (None, None) if b is a else operand_key(b, a.device)
        key = (SPEC, fn, *launch.tensor_key(a), bk)
    except (AttributeError, TypeError):  # not a tensor: the checks say so
        return _binary(fn, a, b)
    hit = launch.REMEMBERED.get(key)
    if b_in is None:
        return hit(a) if hit is not None else launch.remember(key, (a,), _binary, fn, a, b)
    return hit(a, b) if hit is not None else launch.remember(key, (a, b), _binary, fn, a, b)


def _binary(fn: str, a: torch.Tensor, b) -> torch.Tensor:
    if not isinstance(a, torch.Tensor):
        raise KernelError(f"{fn}: the first operand must be a tensor")
    ao = _operand(a, fn)
    if ao[0] == "float64":
        raise KernelError(f"{fn}: dtype float64 is not served")
    value = None
    bo = _operand(b, fn)
    if isinstance(b, torch.Tensor) and b.dim() == 0 and b.device != a.device:
        b = b.item()  # a CPU scalar beside a device tensor: a value, as torch treats it
    b = wide_value(b)
    ct = promote(ao, bo)
    out_dt = result_of(fn, ct)
    if isinstance(out_dt, NotServable):
        raise KernelError(f"{fn}: {out_dt.reason}")
    if isinstance(b, torch.Tensor):
        if b.device != a.device:
            raise KernelError(f"{fn}: operands on {a.device} and {b.device}")
        shapes = [tuple(a.shape), tuple(b.shape)]
    else:
        value = value_in(b, ct)
        if value is None:
            raise KernelError(f"{fn}: a fractional scalar compared in {ct} is not served")
        shapes = [tuple(a.shape)]
        b = None
    out_shape = broadcast_shape(*shapes)
    if out_shape is None:
        raise KernelError(f"{fn}: shapes {shapes[0]} and {shapes[-1]} do not broadcast")
    out = launch.empty(out_shape, TORCH_DTYPES[out_dt], a.device)
    n = out.numel()
    if n == 0:
        return out
    dtypes = (out_dt, ao[0], bo[0])
    config = config_for(SPEC, dtypes, seat_flags(fn=fn, layout=layout_of(out_shape, shapes)), (n,))
    try:
        launch_compare(a, b, out, fn, ct, value, config)
    except ValueError as e:  # more merged dims than the kernel takes
        raise KernelError(f"{fn}: {e}") from None
    return out


def unary(fn: str, x: torch.Tensor) -> torch.Tensor:
    try:  # the direct launch
        key = (SPEC, fn, *launch.tensor_key(x))
    except AttributeError:
        return _unary(fn, x)
    hit = launch.REMEMBERED.get(key)
    return hit(x) if hit is not None else launch.remember(key, (x,), _unary, fn, x)


def _unary(fn: str, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise KernelError(f"{fn}: the operand must be a tensor")
    dt = _operand(x, fn)[0]
    if dt == "float64":
        raise KernelError(f"{fn}: dtype float64 is not served")
    out_dt = result_of(fn, dt)
    if isinstance(out_dt, NotServable):
        raise KernelError(f"{fn}: {out_dt.reason}")
    out = launch.empty(tuple(x.shape), TORCH_DTYPES[out_dt], x.device)
    if out.numel() == 0:
        return out
    config = config_for(SPEC, (out_dt, dt), seat_flags(fn=fn, layout="same"), (out.numel(),))
    try:
        launch_compare(x, None, out, fn, dt, None, config)
    except ValueError as e:
        raise KernelError(f"{fn}: {e}") from None
    return out


def _public(fn: str):
    """The public op of `fn`: `unary` or `binary` bound to it."""
    def op(*args):
        return unary(fn, *args) if fn in UNARY_FNS else binary(fn, *args)
    op.__name__ = op.__qualname__ = fn
    op.__doc__ = f"torch.{fn} on the compare kernel (torch's promotion, broadcasting, NaN)."
    return op


(gt, ge, lt, le, eq, ne, bitwise_and, bitwise_or, bitwise_xor, logical_and, logical_or, logical_xor, bitwise_not,
 logical_not) = map(_public, BINARY_FNS + UNARY_FNS)

"""The element-wise specs: config space, launch key, trace rows, inputs, oracles, example rows.
"""

from __future__ import annotations

import math

from nbx_tune.kernels.copy import block_start, stream_launch, strided_offsets
from nbx_tune.kernels.elementwise.kernel import (FLAT, STRIDED, _binary_block, _binary_kernel, _binary_math,
                                                 _contiguous_strides, _expanded_strides, _levels, _stream_load,
                                                 _stream_store, _tanh_f32, _unary_block, _unary_kernel, _unary_math,
                                                 binary_plan, launch_binary, launch_binary_plan, launch_unary,
                                                 pow_params, small_int_pow, unary_plan)
from nbx_tune.kernels.helpers import FLOATS, torch_dtypes
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags
from nbx_tune.oracles import elementwise as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
# What a 0-d operand (or a Python number) may be: torch converts it to the other's dtype.
SCALAR_DTYPES = torch_dtypes(*FLOATS, "float64", "int32", "int64")
_NAMES = {v: k for k, v in SCALAR_DTYPES.items()}
INT_DTYPES = ("int32", "int64")

UNARY_FNS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp", "log", "neg",
             "rsqrt", "sqrt", "sin", "cos", "pow")
BINARY_FNS = ("add", "sub", "rsub", "mul", "div", "maximum", "minimum")


def broadcast_shape(*shapes) -> tuple[int, ...] | None:
    """torch's broadcast of shapes, or None when they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        d = 1
        for s in shapes:
            k = i - (rank - len(s))
            if k < 0 or s[k] == 1:
                continue
            if d != 1 and s[k] != d:
                return None
            d = s[k]
        out.append(d)
    return tuple(out)


def layout_of(a_kind: int, b_kind: int) -> str:
    if STRIDED in (a_kind, b_kind):
        return "bcast"
    if a_kind == FLAT and b_kind == FLAT:
        return "same"
    return "scalar"


# ----------------------------------------------------------------------------- configs

def _c(block, warps, **extra):
    return Config.make(BLOCK_SIZE=block, num_warps=warps, num_stages=1, **extra)


# Memory-bound streams: the block is what a config changes (bytes in flight per program,
# and the grid's length); num_warps sets elements per thread (8 fp16 = one 128-bit access at
# BLOCK 1024 / 4 warps). No loop, so nothing to pipeline: one stage. The last ones are the
# stream levers for mid-size launches (1-8 M elements): more bytes per thread, a persistent
# grid (PERSIST programs per SM, full occupancy at PERSIST x warps = 64), evict-first
# loads of the inputs (EVICT), so the L2 keeps the output that the next op reads, and a
# block that shrinks until the grid has FILL programs per SM (16384 elements in 16 warps is
# 128 programs at 2 M elements: under one per SM of the H200's 132).
CONFIGS = (
    _c(256, 2), _c(256, 4), _c(512, 2), _c(512, 4), _c(1024, 4), _c(1024, 8), _c(2048, 4),
    _c(2048, 8), _c(4096, 4), _c(4096, 8), _c(4096, 16), _c(8192, 8), _c(8192, 16),
    _c(16384, 16),
    _c(16384, 8), _c(32768, 16), _c(2048, 4, PERSIST=16), _c(4096, 8, PERSIST=8),
    _c(8192, 16, PERSIST=4), _c(4096, 8, EVICT=1), _c(16384, 16, EVICT=1),
    _c(8192, 16, PERSIST=4, EVICT=1), _c(16384, 16, FILL=4), _c(8192, 8, FILL=8),
)
DEFAULTS = (_c(1024, 4), _c(256, 4))


def _promote(x: str, y: str) -> str:
    if x == y:
        return x
    return "float32"  # fp16 + bf16, or either with fp32


def result_dtype(a_dt: str, a_0d: bool, b_dt: str, b_0d: bool) -> str | NotServable:
    """torch's result dtype of a binary op on floating tensors, or on integer ones (or
    NotServable)."""
    if a_dt in INT_DTYPES and b_dt in INT_DTYPES:  # positions and lengths: exact in int64
        if a_0d == b_0d:
            return "int64" if "int64" in (a_dt, b_dt) else "int32"
        return b_dt if a_0d else a_dt
    for dt, zero_d in ((a_dt, a_0d), (b_dt, b_0d)):
        if dt not in (SCALAR_DTYPES if zero_d else TORCH_DTYPES):
            kind = "a 0-d operand" if zero_d else "an operand"
            return NotServable(f"{kind} of dtype {dt} is not served")
    if a_0d == b_0d:
        fa, fb = a_dt in TORCH_DTYPES, b_dt in TORCH_DTYPES
        if fa and fb:
            return _promote(a_dt, b_dt)
        if a_0d and (fa or fb) and not (a_dt == "float64" or b_dt == "float64"):
            return a_dt if fa else b_dt  # a 0-d integer with a 0-d float: the float
        return NotServable(f"0-d operands {a_dt} and {b_dt}: the result would not be a served dtype")
    return b_dt if a_0d else a_dt


def _scalar_dtype(text: str) -> str | None:
    """The dtype torch wraps a Scalar param in: int64 for an integer, float64 for a float."""
    try:
        int(text)
        return "int64"
    except ValueError:
        pass
    try:
        float(text)
        return "float64"
    except ValueError:
        return None


# ----------------------------------------------------------------------------- unary spec

_UNARY_OPS = {
    "aten.relu": "relu", "aten.gelu": "gelu", "aten.silu": "silu", "aten.sigmoid": "sigmoid",
    "aten.tanh": "tanh", "aten.exp": "exp", "aten.log": "log", "aten.neg": "neg",
    "aten.rsqrt": "rsqrt", "aten.sqrt": "sqrt", "aten.sin": "sin", "aten.cos": "cos",
    "aten.pow.Tensor_Scalar": "pow",
}


class _ElementwiseSpec(KernelSpec):
    """What the unary and binary families share: one seat per element count, every dtype,
    one config space, and no shared memory (no reduction, no layout conversion)."""
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    config_space = CONFIGS
    default_configs = DEFAULTS
    routes = ""  # the ops.py function mapping the family's aten ops to its public ops

    def smem_bytes(self, config, problem):
        return 0  # registers only

    def serve_ops(self):
        from nbx_tune.kernels.elementwise import ops  # ops.py imports this module

        return getattr(ops, self.routes)()


class ElementwiseUnarySpec(_ElementwiseSpec):
    name = "elementwise_unary"
    ops = tuple(_UNARY_OPS)
    routes = "_serve_unary"
    description = "one-stream element-wise math: relu, gelu, silu, sigmoid, tanh, exp, log, ..."

    def source_parts(self):
        return (_tanh_f32, _unary_math, _unary_kernel, pow_params, small_int_pow, launch_unary, unary_plan,
                block_start, _stream_load, _stream_store, strided_offsets, _unary_block, stream_launch)

    def problem_from_row(self, row):
        op = row.op.removesuffix(".default")
        fn = _UNARY_OPS.get(op)
        if fn is None:
            return NotServable(f"{op}: only the default overload is served here")
        if len(row.shapes) != 1:
            return NotServable(f"{op} takes one tensor, the row has {len(row.shapes)}")
        dtype = row.dtypes[0]
        if dtype not in TORCH_DTYPES:
            return NotServable(f"dtype {dtype} is not served (float16, bfloat16, float32)")
        shape = row.shapes[0]
        n = numel(shape)
        if n == 0:
            return NotServable("an empty tensor: nothing to launch")
        extra = [("shape", tuple(shape))]
        known = {"approximate"} if fn == "gelu" else {"exponent"} if fn == "pow" else set()
        unknown = set(row.params) - known
        if unknown:
            return NotServable(f"{op}: unsupported params {', '.join(sorted(unknown))}")
        if fn == "gelu":
            approx = row.params.str("approximate", "none")
            if approx not in ("none", "tanh"):
                return NotServable(f"gelu approximate={approx!r} (none or tanh)")
            fn = "gelu_tanh" if approx == "tanh" else "gelu"
        if fn == "pow":
            try:
                e = row.params.float("exponent")
            except ValueError as err:
                return NotServable(f"bad exponent: {err}")
            if e is None or not math.isfinite(e):
                return NotServable("pow needs a finite scalar exponent")
            extra.append(("exponent", e))
        return Problem(self.name, (dtype,), seat_flags(fn=fn), (n,), tuple(sorted(extra)))

    def resized(self, problem, dims):
        # Any element count, as one flat tensor: the kernel sees the count only.
        extra = dict(problem.extra, shape=(dims[0],))
        return Problem(problem.kernel, problem.dtypes, problem.flags, (dims[0],), tuple(sorted(extra.items())))

    def input_shapes(self, problem):
        return {"x": (tuple(problem.get("shape")), problem.dtypes[0])}

    def make_inputs(self, problem, rng):
        fn = dict(problem.flags)["fn"]
        shape = tuple(problem.get("shape"))
        if fn == "exp":
            x = rng.uniform(-4.0, 4.0, shape)
        elif fn == "log":
            x = rng.uniform(0.02, 10.0, shape)
        elif fn == "sqrt":
            x = rng.uniform(0.01, 10.0, shape)
        elif fn == "rsqrt":
            x = rng.uniform(0.1, 10.0, shape)
        elif fn in ("sin", "cos"):
            x = rng.uniform(-2 * math.pi, 2 * math.pi, shape)
        elif fn == "pow":
            e, is_int, _ = pow_params(problem.get("exponent"))
            # |x|^e within [2^-10, 2^10]: no fp16 overflow, and no zero base for e < 0.
            r = min(1.0, 10.0 / abs(e)) if e else 1.0
            x = 2.0 ** rng.uniform(-r, r, shape)
            if is_int:  # negative bases only where the result is real
                x = x * rng.choice([-1.0, 1.0], shape)
        else:
            x = 2.0 * rng.standard_normal(shape)
        return {"x": (x, problem.dtypes[0])}

    def oracle(self, problem, inputs):
        fn = dict(problem.flags)["fn"]
        x = inputs["x"].reshape(tuple(problem.get("shape")))
        if fn == "gelu_tanh":
            return {"y": oracle.gelu(x, "tanh")}
        if fn == "pow":
            return {"y": oracle.pow(x, problem.get("exponent"))}
        return {"y": getattr(oracle, fn)(x)}

    def output_specs(self, problem):
        return {"y": (tuple(problem.get("shape")), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        fn = dict(problem.flags)["fn"]
        params = pow_params(problem.get("exponent")) if fn == "pow" else (0.0, 0.0, 0.0)
        launch_unary(inputs["x"], outputs["y"], fn, params, config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        rows = []
        if scale == "small":
            shapes = ((1000,), (3, 37, 5))
            dts = ("float16", "float32", "bfloat16")
        else:
            shapes = ((512, 11008), (8, 320, 64, 64), (2049, 4097))
            dts = tuple(TORCH_DTYPES)
        ops = [(op, {}) for op in _UNARY_OPS if op != "aten.pow.Tensor_Scalar"]
        ops += [("aten.gelu", {"approximate": "tanh"}),
                ("aten.pow.Tensor_Scalar", {"exponent": "2"}),
                ("aten.pow.Tensor_Scalar", {"exponent": "-3"}),
                ("aten.pow.Tensor_Scalar", {"exponent": "0.5"}),
                ("aten.pow.Tensor_Scalar", {"exponent": "1.7"})]
        for i, dt in enumerate(dts):
            if scale == "small" and dt == "bfloat16":  # skipped by the interpreter: a token few
                ops_dt = ops[:2]
            else:
                ops_dt = ops
            for j, (op, params) in enumerate(ops_dt):
                rows.append(make_row(op, [dt], [shapes[(i + j) % len(shapes)]], params))
        return rows


# ----------------------------------------------------------------------------- binary spec

_BINARY_OPS = {
    "aten.add.Tensor": "add", "aten.sub.Tensor": "sub", "aten.rsub.Tensor": "rsub",
    "aten.mul.Tensor": "mul", "aten.div.Tensor": "div", "aten.maximum": "maximum",
    "aten.minimum": "minimum",
    "aten.add.Scalar": "add", "aten.sub.Scalar": "sub", "aten.rsub.Scalar": "rsub",
    "aten.mul.Scalar": "mul", "aten.div.Scalar": "div",
    "aten.div.Tensor_mode": "div",
}
# In-place forms (a ResNet's residual `out += identity` records aten.add_.Tensor): the same
# computation and seat as the out-of-place op, served when the result has self's shape and dtype.
_INPLACE_OPS = {"aten.add_.Tensor": "aten.add.Tensor", "aten.sub_.Tensor": "aten.sub.Tensor",
                "aten.mul_.Tensor": "aten.mul.Tensor", "aten.div_.Tensor": "aten.div.Tensor",
                "aten.add_.Scalar": "aten.add.Scalar", "aten.sub_.Scalar": "aten.sub.Scalar",
                "aten.mul_.Scalar": "aten.mul.Scalar", "aten.div_.Scalar": "aten.div.Scalar"}
_ALPHA_FNS = ("add", "sub", "rsub")


class ElementwiseBinarySpec(_ElementwiseSpec):
    name = "elementwise_binary"
    ops = tuple(_BINARY_OPS) + tuple(_INPLACE_OPS)
    routes = "_serve_binary"
    description = "two-operand element-wise math with broadcasting: add, sub, mul, div, maximum, ..."

    def source_parts(self):
        return (_binary_math, _binary_kernel, _contiguous_strides, _expanded_strides, binary_plan,
                _levels, launch_binary_plan, launch_binary, block_start, _stream_load, _stream_store,
                _binary_block, stream_launch)

    def problem_from_row(self, row):
        op = row.op.removesuffix(".default")
        inplace = op in _INPLACE_OPS
        op = _INPLACE_OPS.get(op, op)
        fn = _BINARY_OPS.get(op)
        if fn is None:
            return NotServable(f"{op}: overload not served")
        if op == "aten.div.Tensor_mode":
            mode = row.params.str("rounding_mode")
            return NotServable(f"div rounding_mode={mode}: rounding modes are not served "
                               "(a floor/trunc of an fp32 quotient can differ by one from the exact one)")
        # A Python number in the Tensor slot, written as a param (other=1e-06) rather than a
        # 0-d operand: the same launch as the `.Scalar` overload's.
        scalar_op = op.endswith(".Scalar") or (len(row.shapes) == 1 and "other" in row.params)
        want = 1 if scalar_op else 2
        if len(row.shapes) != want:
            return NotServable(f"{op} takes {want} tensor(s), the row has {len(row.shapes)}")
        known = {"alpha"} if fn in _ALPHA_FNS else set()
        if scalar_op:
            known.add("other")
        unknown = set(row.params) - known
        if unknown:
            return NotServable(f"{op}: unsupported params {', '.join(sorted(unknown))}")
        try:
            alpha = row.params.float("alpha", 1.0)
        except ValueError as e:
            return NotServable(f"bad alpha: {e}")
        if not math.isfinite(alpha):
            return NotServable(f"alpha={alpha} is not finite")
        a_shape, a_dt = row.shapes[0], row.dtypes[0]
        extra = [("a_shape", tuple(a_shape))]
        if fn in _ALPHA_FNS:
            extra.append(("alpha", alpha))
        if scalar_op:
            text = row.params.str("other")
            b_dt = None if text is None else _scalar_dtype(text)
            if b_dt is None:
                return NotServable(f"{op} needs a numeric scalar other=, got {text!r}")
            value = float(text)
            if not math.isfinite(value):
                return NotServable(f"other={text} is not finite")
            b_shape, b_0d = None, True
            extra.append(("b_value", value))
        else:
            b_shape, b_dt = row.shapes[1], row.dtypes[1]
            b_0d = len(b_shape) == 0
            extra.append(("b_shape", tuple(b_shape)))
        out_dt = result_dtype(a_dt, len(a_shape) == 0, b_dt, b_0d)
        if isinstance(out_dt, NotServable):
            return out_dt
        if out_dt in INT_DTYPES and fn == "div":
            return NotServable("true division of integers is not served")
        out_shape = broadcast_shape(a_shape, b_shape or ())
        if out_shape is None:
            return NotServable(f"shapes {format_shape(a_shape)} and {format_shape(b_shape)} do not broadcast")
        if inplace and (tuple(out_shape) != tuple(a_shape) or out_dt != a_dt):
            return NotServable(f"in-place {fn}: the result ({format_shape(out_shape)}, {out_dt}) is not "
                               f"self's ({format_shape(a_shape)}, {a_dt})")
        n = numel(out_shape)
        if n == 0:
            return NotServable("an empty output: nothing to launch")
        try:
            plan = binary_plan(out_shape, a_shape, _contiguous_strides(a_shape), b_shape,
                               None if b_shape is None else _contiguous_strides(b_shape))
        except ValueError as e:
            return NotServable(str(e))
        extra.append(("out_shape", out_shape))
        flags = seat_flags(fn=fn, layout=layout_of(plan[1], plan[2]))
        return Problem(self.name, (out_dt, a_dt, b_dt), flags, (n,), tuple(sorted(extra)))

    def resized(self, problem, dims):
        # Another element count where the operands are whole tensors of the output's shape or
        # 0-d (layouts "same" and "scalar"): flat, as the kernel sees them. A broadcast keeps
        # its shapes.
        n, out = dims[0], tuple(problem.get("out_shape"))
        shapes = {k: problem.get(k) for k in ("a_shape", "b_shape")}
        if dict(problem.flags)["layout"] == "bcast" or any(
                s is not None and len(s) and tuple(s) != out for s in shapes.values()):
            return None
        extra = dict(problem.extra, out_shape=(n,))
        extra.update({k: (n,) for k, s in shapes.items() if s is not None and len(s)})
        return Problem(problem.kernel, problem.dtypes, problem.flags, (n,), tuple(sorted(extra.items())))

    def input_shapes(self, problem):
        shapes = {"a": (tuple(problem.get("a_shape")), problem.dtypes[1])}
        if problem.get("b_shape") is not None:
            shapes["b"] = (tuple(problem.get("b_shape")), problem.dtypes[2])
        return shapes

    def make_inputs(self, problem, rng):
        fn = dict(problem.flags)["fn"]
        out = {}
        for name, (shape, dt) in self.input_shapes(problem).items():
            if dt in ("int32", "int64"):  # a wrapped Python int: small, never zero
                v = rng.integers(1, 6, shape) * rng.choice([-1, 1], shape)
            elif name == "b" and fn == "div":  # denominators away from zero: no fp16 overflow
                v = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
            else:
                v = rng.standard_normal(shape)
            out[name] = (v, dt)
        return out

    def oracle(self, problem, inputs):
        fn = dict(problem.flags)["fn"]
        a = inputs["a"].reshape(tuple(problem.get("a_shape")))
        if "b" in inputs:
            b = inputs["b"].reshape(tuple(problem.get("b_shape")))
        else:
            b = problem.get("b_value")
        if fn in _ALPHA_FNS:
            y = getattr(oracle, fn)(a, b, problem.get("alpha", 1.0))
        else:
            y = getattr(oracle, fn)(a, b)
        return {"out": y.reshape(tuple(problem.get("out_shape")))}

    def output_specs(self, problem):
        return {"out": (tuple(problem.get("out_shape")), problem.dtypes[0])}

    def launch(self, config, problem, inputs, outputs):
        fn = dict(problem.flags)["fn"]
        a = inputs["a"].reshape(tuple(problem.get("a_shape")))
        b = inputs.get("b")
        if b is not None:
            b = b.reshape(tuple(problem.get("b_shape")))
        launch_binary(a, b, outputs["out"], fn, problem.get("b_value", 0.0),
                      problem.get("alpha", 1.0), config)

    def example_rows(self, scale):
        from nbx_tune.kernels.rows import make_row

        rows = []
        if scale == "small":
            same, odd = (3, 37, 5), (1000,)
            bc = ((7, 1, 5), (1, 9, 5))
            row_bc = ((37, 45), (45,))
            dts = ("float16", "float32")
        else:
            same, odd = (512, 11008), (8, 320, 64, 64)
            bc = ((8, 320, 1, 64), (1, 320, 64, 1))
            row_bc = ((2049, 4097), (4097,))
            dts = tuple(TORCH_DTYPES)
        tensor_ops = [op for op in _BINARY_OPS if not op.endswith((".Scalar", "_mode"))]
        for dt in dts:
            d2 = [dt, dt]
            for i, op in enumerate(tensor_ops):
                # every fn in the same layout; the others spread over the fns
                rows.append(make_row(op, d2, [same if i % 2 else odd] * 2))
                alt = (
                    lambda: make_row(op, d2, list(bc)),
                    lambda: make_row(op, [dt, "float64"], [same, ()]),  # x * 0.5
                    lambda: make_row(op, d2, list(row_bc)),
                    lambda: make_row(op, ["float64", dt], [(), odd]),  # 0.5 - x, a is 0-d
                    lambda: make_row(op, [dt, "int64"], [odd, ()]),  # x + 1
                    lambda: make_row(op, d2, [row_bc[1], row_bc[0]]),
                    lambda: make_row(op, d2, [same, ()]),  # a 0-d tensor of the same dtype
                )[i]()
                rows.append(alt)
            rows += [
                make_row("aten.add.Tensor", d2, [same, same], {"alpha": "2"}),
                make_row("aten.sub.Tensor", d2, list(bc), {"alpha": "0.5"}),
                make_row("aten.add.Scalar", [dt], [odd], {"other": "2.5"}),
                make_row("aten.mul.Scalar", [dt], [same], {"other": "3"}),
                make_row("aten.div.Scalar", [dt], [odd], {"other": "-0.75"}),
                make_row("aten.rsub.Scalar", [dt], [same], {"other": "1", "alpha": "2"}),
            ]
        # torch's promotion: mixed dimensioned operands widen, a 0-d fp32 tensor does not.
        rows += [
            make_row("aten.add.Tensor", ["float16", "float32"], [same, same]),
            make_row("aten.mul.Tensor", ["float32", "float16"], list(bc)),
            make_row("aten.mul.Tensor", ["float16", "float32"], [same, ()]),
            make_row("aten.sub.Tensor", ["float32", "float16"], [(), same]),
        ]
        # Integer position arithmetic (cache_position + offset, lengths), exact in int64.
        rows += [make_row("aten.add.Tensor", ["int64", "int64"], [odd, ()]),
                 make_row("aten.mul.Tensor", ["int64", "int64"], list(bc)),
                 make_row("aten.sub.Tensor", ["int32", "int64"], [same, ()], {"alpha": "3"}),
                 make_row("aten.maximum", ["int64", "int64"], [same, same]),
                 make_row("aten.rsub.Scalar", ["int64"], [odd], {"other": "1"})]
        if scale != "small":
            rows += [make_row("aten.add.Tensor", ["bfloat16", "float16"], [same, same]),
                     make_row("aten.mul.Tensor", ["bfloat16", "float32"], [same, ()])]
        return rows


UNARY_SPEC = ElementwiseUnarySpec()
BINARY_SPEC = ElementwiseBinarySpec()
SPECS = (UNARY_SPEC, BINARY_SPEC)

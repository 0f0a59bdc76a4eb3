"""Element-wise ops: unary (relu, gelu, silu, sigmoid, tanh, exp, log, neg, rsqrt, sqrt, sin,
cos, pow by a scalar) and binary with broadcasting (add, sub, rsub, mul, div, maximum,
minimum) in fp16, bf16 and fp32.

Two specs, one per kernel: `elementwise_unary` (one stream in, contiguous or strided, one
contiguous out) and `elementwise_binary` (two operands, each contiguous, a scalar, or
strided/broadcast). They
are separate kernels because their launchers, inputs and code paths differ; inside each,
the function is a constexpr (`fn=gelu_tanh`), so it is a seat flag. Every op computes in
fp32 (load, `.to(tl.float32)`, compute, cast on store), which is what torch's CUDA kernels
do for fp16/bf16 ("opmath") and keeps bf16 correct.

Launch key: the element count on the `elements` ladder (DESIGN: "elementwise: the element
count"); the binary kernel's layout (`same`: both operands contiguous and of the output's
shape; `scalar`: one is a single value; `bcast`: any other, indexed through broadcast
strides) is a flag, because it changes the code.

The binary dtype signature is (output, a, b): the output leads, so the screen's tolerance
(`dtypes[0]`) is the output's. Output dtypes follow torch's promotion: two dimensioned
operands promote (fp16 + bf16 -> fp32, anything + fp32 -> fp32); a 0-d operand (a wrapped
Python number is recorded as a 0-d float64 / int64 tensor) takes the other's dtype.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import launch, semantics
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.copy import block_start, copy_plan, dense, stream_launch, strided_offsets
from nbx_tune.kernels.helpers import FLOATS, contiguous_strides, torch_dtypes
from nbx_tune.kernels.rows import format_shape, numel
from nbx_tune.kernels.spec import Config, KernelSpec, KeyDim, NotServable, Problem, seat_flags
from nbx_tune.oracles import elementwise as oracle

TORCH_DTYPES = torch_dtypes(*FLOATS)
# What a 0-d operand (or a Python number) may be: torch converts it to the other's dtype.
SCALAR_DTYPES = torch_dtypes(*FLOATS, "float64", "int32", "int64")
_NAMES = {v: k for k, v in SCALAR_DTYPES.items()}
INT_DTYPES = ("int32", "int64")
INDEX_LIMIT = 2**31 - 2**17  # beyond this offsets are computed in int64
MAX_RANK = 5  # broadcast dims after merging (the kernel decomposes indices over up to 5)

UNARY_FNS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp", "log", "neg",
             "rsqrt", "sqrt", "sin", "cos", "pow")
BINARY_FNS = ("add", "sub", "rsub", "mul", "div", "maximum", "minimum")

# Operand kinds of the binary kernel (constexpr A_KIND / B_KIND).
FLAT, SCALAR, STRIDED, VALUE = 0, 1, 2, 3


# ----------------------------------------------------------------------------- device code

@triton.jit
def _tanh_f32(x):
    # tanh from exp: 1 - 2 / (e^{2|x|} + 1), odd; exact at 0, saturates without overflow.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _unary_math(x, p0, p1, p2, FN: tl.constexpr, IPOW: tl.constexpr = 0):
    """One unary function on fp32 values; p0..p2 are runtime scalars (pow: exponent,
    exponent is an integer, exponent is odd); IPOW > 0: pow by that small integer, as
    products (models square and cube; exp2/log2 cost 1.5-2x torch's time there)."""
    if FN == "relu":
        y = tl.where(x > 0, x, 0.0)
        y = tl.where(x != x, x, y)  # NaN stays NaN
    elif FN == "gelu":
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif FN == "gelu_tanh":
        y = 0.5 * x * (1.0 + _tanh_f32(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    elif FN == "silu":
        y = x * tl.sigmoid(x)
    elif FN == "sigmoid":
        y = tl.sigmoid(x)
    elif FN == "tanh":
        y = _tanh_f32(x)
    elif FN == "exp":
        y = tl.exp(x)
    elif FN == "log":
        y = tl.log(x)
    elif FN == "neg":
        y = -x
    elif FN == "rsqrt":
        y = tl.rsqrt(x)
    elif FN == "sqrt":
        y = tl.sqrt(x)
    elif FN == "sin":
        y = tl.sin(x)
    elif FN == "cos":
        y = tl.cos(x)
    elif IPOW > 0:
        y = x
        for _ in tl.static_range(IPOW - 1):
            y = y * x
    else:  # pow: |x|^e from exp2/log2, the sign restored for odd integer exponents
        r = tl.exp2(p0 * tl.log2(tl.abs(x)))
        neg = x < 0
        r = tl.where(neg & (p2 != 0.0), -r, r)
        r = tl.where(neg & (p1 == 0.0), float("nan"), r)
        y = tl.where(p0 == 0.0, 1.0, r)
    return y


@triton.jit
def _stream_load(ptrs, mask, other, MASKED: tl.constexpr, EVICT: tl.constexpr):
    """A load of a stream read once: unmasked where every block is full (MASKED False);
    EVICT: marked evict-first, so the L2 keeps what the next op reads (the output)."""
    if MASKED:
        if EVICT:
            x = tl.load(ptrs, mask=mask, other=other, eviction_policy="evict_first")
        else:
            x = tl.load(ptrs, mask=mask, other=other)
    else:
        if EVICT:
            x = tl.load(ptrs, eviction_policy="evict_first")
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _stream_store(ptrs, y, mask, MASKED: tl.constexpr):
    if MASKED:
        tl.store(ptrs, y, mask=mask)
    else:
        tl.store(ptrs, y)


@triton.jit
def _unary_block(x_ptr, y_ptr, start, n, p0, p1, p2, D1, D2, D3, S0, S1, S2, S3,
                 FN: tl.constexpr, IPOW: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                 NDIM: tl.constexpr, MASKED: tl.constexpr, EVICT: tl.constexpr):
    offs = start + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    if NDIM > 0:  # a strided input
        x_off = strided_offsets(offs, NDIM, D1, D2, D3, S0, S1, S2, S3)
    else:
        x_off = offs
    x = _stream_load(x_ptr + x_off, mask, 1.0, MASKED, EVICT).to(tl.float32)
    y = _unary_math(x, p0, p1, p2, FN, IPOW)
    _stream_store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask, MASKED)


@triton.jit
def _unary_kernel(x_ptr, y_ptr, n, p0, p1, p2, D1, D2, D3, S0, S1, S2, S3,
                  FN: tl.constexpr, INT64: tl.constexpr, BLOCK_SIZE: tl.constexpr, IPOW: tl.constexpr = 0,
                  NDIM: tl.constexpr = 0, MASKED: tl.constexpr = True, PERSIST: tl.constexpr = 0,
                  EVICT: tl.constexpr = 0):
    """y = FN(x), y contiguous; x contiguous (NDIM 0) or strided over NDIM merged dims.
    PERSIST > 0: a fixed grid (PERSIST programs per SM) strides over the blocks."""
    pid = tl.program_id(0)
    if PERSIST > 0:
        nprog = tl.num_programs(0)
        for it in range(0, tl.cdiv(tl.cdiv(n, BLOCK_SIZE) - pid, nprog)):
            _unary_block(x_ptr, y_ptr, block_start(pid + it * nprog, BLOCK_SIZE, INT64), n, p0, p1, p2,
                         D1, D2, D3, S0, S1, S2, S3, FN, IPOW, BLOCK_SIZE, NDIM, MASKED, EVICT)
    else:
        _unary_block(x_ptr, y_ptr, block_start(pid, BLOCK_SIZE, INT64), n, p0, p1, p2,
                     D1, D2, D3, S0, S1, S2, S3, FN, IPOW, BLOCK_SIZE, NDIM, MASKED, EVICT)


_unary_kernel = launch.recorded(_unary_kernel)  # its calls are replayed (kernels/runtime/launch.py)


@triton.jit
def _binary_math(a, b, alpha, FN: tl.constexpr):
    if FN == "add":
        y = a + alpha * b
    elif FN == "sub":
        y = a - alpha * b
    elif FN == "rsub":
        y = b - alpha * a
    elif FN == "mul":
        y = a * b
    elif FN == "div":
        y = a / b
    elif FN == "maximum":
        y = tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    else:  # minimum
        y = tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
    return y


@triton.jit
def _binary_block(a_ptr, b_ptr, out_ptr, start, n, b_value, alpha, D1, D2, D3, D4,
                  SA0, SA1, SA2, SA3, SA4, SB0, SB1, SB2, SB3, SB4,
                  FN: tl.constexpr, A_KIND: tl.constexpr, B_KIND: tl.constexpr, NDIM: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, INT: tl.constexpr, MASKED: tl.constexpr, EVICT: tl.constexpr):
    offs = start + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    if A_KIND == 2 or B_KIND == 2:
        rem = offs
        a_off = offs * 0
        b_off = offs * 0
        if NDIM > 1:
            i = rem % D1
            rem = rem // D1
            a_off += i * SA1
            b_off += i * SB1
        if NDIM > 2:
            i = rem % D2
            rem = rem // D2
            a_off += i * SA2
            b_off += i * SB2
        if NDIM > 3:
            i = rem % D3
            rem = rem // D3
            a_off += i * SA3
            b_off += i * SB3
        if NDIM > 4:
            i = rem % D4
            rem = rem // D4
            a_off += i * SA4
            b_off += i * SB4
        a_off += rem * SA0
        b_off += rem * SB0
    if A_KIND == 0:
        a = _stream_load(a_ptr + offs, mask, 1, MASKED, EVICT)
    elif A_KIND == 1:
        a = tl.load(a_ptr)
    else:
        a = _stream_load(a_ptr + a_off, mask, 1, MASKED, 0)  # a broadcast operand is read again
    if B_KIND == 0:
        b = _stream_load(b_ptr + offs, mask, 1, MASKED, EVICT)
    elif B_KIND == 1:
        b = tl.load(b_ptr)
    elif B_KIND == 2:
        b = _stream_load(b_ptr + b_off, mask, 1, MASKED, 0)
    else:
        b = b_value  # a float argument (an int one when INT)
    if INT:  # exact; `+ zeros` because an int argument of 1 arrives as a constexpr
        a = a.to(tl.int64)
        b = (b + tl.zeros([BLOCK_SIZE], dtype=tl.int64)).to(tl.int64)
    else:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    y = _binary_math(a, b, alpha, FN)
    _stream_store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask, MASKED)


@triton.jit
def _binary_kernel(a_ptr, b_ptr, out_ptr, n, b_value, alpha,
                   D1, D2, D3, D4,
                   SA0, SA1, SA2, SA3, SA4,
                   SB0, SB1, SB2, SB3, SB4,
                   FN: tl.constexpr, A_KIND: tl.constexpr, B_KIND: tl.constexpr,
                   NDIM: tl.constexpr, INT64: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   INT: tl.constexpr = False, MASKED: tl.constexpr = True, PERSIST: tl.constexpr = 0,
                   EVICT: tl.constexpr = 0):
    """out[i] = FN(a, b) over the contiguous output (INT: integers, computed in int64). An operand is FLAT (0: its element i),
    SCALAR (1: one element, loaded once), STRIDED (2: element i's broadcast offset) or
    VALUE (3, b only: the runtime scalar b_value). STRIDED offsets decompose i over the
    merged output dims: D1..D4 are the sizes of the innermost dims (D1 innermost), SA1..
    the matching strides, SA0 the stride of the outermost dim. PERSIST > 0: a fixed grid
    (PERSIST programs per SM) strides over the blocks."""
    pid = tl.program_id(0)
    if PERSIST > 0:
        nprog = tl.num_programs(0)
        for it in range(0, tl.cdiv(tl.cdiv(n, BLOCK_SIZE) - pid, nprog)):
            _binary_block(a_ptr, b_ptr, out_ptr, block_start(pid + it * nprog, BLOCK_SIZE, INT64), n,
                          b_value, alpha, D1, D2, D3, D4, SA0, SA1, SA2, SA3, SA4, SB0, SB1, SB2, SB3, SB4,
                          FN, A_KIND, B_KIND, NDIM, BLOCK_SIZE, INT, MASKED, EVICT)
    else:
        _binary_block(a_ptr, b_ptr, out_ptr, block_start(pid, BLOCK_SIZE, INT64), n,
                      b_value, alpha, D1, D2, D3, D4, SA0, SA1, SA2, SA3, SA4, SB0, SB1, SB2, SB3, SB4,
                      FN, A_KIND, B_KIND, NDIM, BLOCK_SIZE, INT, MASKED, EVICT)


_binary_kernel = launch.recorded(_binary_kernel)  # its calls are replayed (kernels/runtime/launch.py)


# ----------------------------------------------------------------------------- launchers

def pow_params(exponent: float) -> tuple[float, float, float]:
    """(exponent, is an integer, is odd) as the unary kernel's p0..p2."""
    e = float(exponent)
    is_int = math.isfinite(e) and e == math.floor(e)
    return (e, 1.0 if is_int else 0.0, 1.0 if is_int and int(e) % 2 else 0.0)


MAX_IPOW = 3  # pow by 1..MAX_IPOW runs as products (torch squares for 4: other roundings)


def small_int_pow(fn: str, params: tuple) -> int:
    """The unary kernel's IPOW: the exponent where pow is by a small positive integer."""
    e = params[0]
    return int(e) if fn == "pow" and params[1] and 1 <= e <= MAX_IPOW else 0


def unary_plan(x) -> tuple:
    """(NDIM, D1..D3, S0..S3) of the unary kernel's input: NDIM 0 where x is contiguous, else
    x's dims merged (copy_plan), innermost-first sizes and strides; more than the copy
    kernel's MAX_RANK merged dims raise ValueError (the caller stages a copy)."""
    if x.is_contiguous():
        return (0, 1, 1, 1, 0, 0, 0, 0)
    n, flat, sizes, sx, _ = copy_plan(tuple(x.shape), x.stride(), contiguous_strides(x.shape))
    if flat:
        return (0, 1, 1, 1, 0, 0, 0, 0)
    nd = len(sizes)
    d = [sizes[nd - 1 - k] if k < nd - 1 else 1 for k in range(3)]
    st = [sx[0]] + [sx[nd - 1 - k] if k < nd - 1 else 0 for k in range(3)]
    return (nd, *d, *st)


def launch_unary(x, y, fn: str, params: tuple, config: Config, plan=None) -> None:
    """y = fn(x) over n elements: y contiguous, x contiguous or strided (`unary_plan`, the
    same shape as y)."""
    n = y.numel()
    nd, d1, d2, d3, s0, s1, s2, s3 = plan or unary_plan(x)
    grid, kw = stream_launch(n, config, y.device)
    extent = 0 if nd == 0 else sum((k - 1) * s for k, s in zip(x.shape, x.stride()))
    _unary_kernel[grid](x, y, n, float(params[0]), float(params[1]), float(params[2]),
                        d1, d2, d3, s0, s1, s2, s3, FN=fn, INT64=max(n, extent) > INDEX_LIMIT,
                        IPOW=small_int_pow(fn, params), NDIM=nd, **kw)


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


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _expanded_strides(shape, strides, out_shape) -> list[int]:
    """An operand's strides over the output's dims: 0 where it broadcasts."""
    pad = len(out_shape) - len(shape)
    out = [0] * pad
    for d, s in zip(shape, strides):
        out.append(0 if d == 1 else s)
    return out


def binary_plan(out_shape, a_shape, a_strides, b_shape, b_strides) -> tuple:
    """Merge the output's dims as far as both operands allow and classify each operand.

    Returns (n, a_kind, b_kind, sizes, a_strides, b_strides): sizes/strides outermost
    first, at most MAX_RANK dims (more raises ValueError). `b_shape` None: b is a value."""
    n = 1
    for d in out_shape:
        n *= d
    ops = [_expanded_strides(a_shape, a_strides, out_shape)]
    if b_shape is not None:
        ops.append(_expanded_strides(b_shape, b_strides, out_shape))
    dims = [(d, [s[i] for s in ops]) for i, d in enumerate(out_shape) if d != 1]
    merged: list[tuple[int, list[int]]] = []
    for d, st in dims:  # outermost first: merge a dim into the one before it when contiguous
        if merged:
            pd, pst = merged[-1]
            if all(ps == s * d for ps, s in zip(pst, st)):
                merged[-1] = (pd * d, st)
                continue
        merged.append((d, list(st)))
    if not merged:
        merged = [(1, [0] * len(ops))]
    if len(merged) > MAX_RANK:
        raise ValueError(f"{len(merged)} broadcast dims after merging (the kernel takes {MAX_RANK})")
    sizes = tuple(d for d, _ in merged)
    contiguous = _contiguous_strides(sizes)

    def kind(i):
        st = tuple(s[i] for _, s in merged)
        if n == 1 or st == contiguous:
            return FLAT
        if all(s == 0 for s in st):
            return SCALAR
        return STRIDED

    a_kind = kind(0)
    b_kind = kind(1) if b_shape is not None else VALUE
    return (n, a_kind, b_kind, sizes, tuple(s[0] for _, s in merged),
            tuple(s[1] for _, s in merged) if b_shape is not None else (0,) * len(merged))


def layout_of(a_kind: int, b_kind: int) -> str:
    if STRIDED in (a_kind, b_kind):
        return "bcast"
    if a_kind == FLAT and b_kind == FLAT:
        return "same"
    return "scalar"


def _levels(sizes, strides):
    """(D1..D4, S0..S4): innermost-first sizes/strides, the outermost stride as S0."""
    nd = len(sizes)
    d = [sizes[nd - 1 - k] if k < nd - 1 else 1 for k in range(4)]
    s = [strides[0]] + [strides[nd - 1 - k] if k < nd - 1 else 0 for k in range(4)]
    return d, s


def launch_binary_plan(a, b, out, plan, fn: str, b_value: float, alpha: float, config: Config) -> None:
    """out = fn(a, b) with a plan from `binary_plan`; b None when it is the value b_value."""
    n, a_kind, b_kind, sizes, sa, sb = plan
    d, ls_a = _levels(sizes, sa)
    _, ls_b = _levels(sizes, sb)
    extent = max(sum((k - 1) * abs(s) for k, s in zip(sizes, st)) for st in (sa, sb))
    grid, kw = stream_launch(n, config, out.device)
    num = float if out.dtype.is_floating_point else int
    _binary_kernel[grid](
        a, a if b is None else b, out, n, num(b_value), num(alpha),
        d[0], d[1], d[2], d[3], *ls_a, *ls_b,
        FN=fn, A_KIND=a_kind, B_KIND=b_kind, NDIM=len(sizes),
        INT64=max(n, extent) > INDEX_LIMIT, INT=num is int, **kw,
    )


def launch_binary(a, b, out, fn: str, b_value: float, alpha: float, config: Config) -> None:
    """out (contiguous, the broadcast shape) = fn(a, b): a tensor, b a tensor or None
    (then b_value is the second operand); any strides."""
    plan = binary_plan(tuple(out.shape), tuple(a.shape), a.stride(),
                       None if b is None else tuple(b.shape), None if b is None else b.stride())
    launch_binary_plan(a, b, out, plan, fn, b_value, alpha, config)


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


class ElementwiseUnarySpec(KernelSpec):
    name = "elementwise_unary"
    ops = tuple(_UNARY_OPS)
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    description = "one-stream element-wise math: relu, gelu, silu, sigmoid, tanh, exp, log, ..."

    config_space = CONFIGS
    default_configs = DEFAULTS

    def smem_bytes(self, config, problem):
        return 0  # no reduction, no layout conversion: registers only

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

    def serve_ops(self):
        return _serve_unary()

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


class ElementwiseBinarySpec(KernelSpec):
    name = "elementwise_binary"
    ops = tuple(_BINARY_OPS) + tuple(_INPLACE_OPS)
    key = (KeyDim("N", "elements"),)
    dtypes = tuple(TORCH_DTYPES)
    description = "two-operand element-wise math with broadcasting: add, sub, mul, div, maximum, ..."

    config_space = CONFIGS
    default_configs = DEFAULTS

    def smem_bytes(self, config, problem):
        return 0  # no reduction, no layout conversion: registers only

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

    def serve_ops(self):
        return _serve_binary()

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


# ----------------------------------------------------------------------------- public ops

REMEMBERED = launch.REMEMBERED
_UNARY_FLAGS = {fn: seat_flags(fn=fn) for fn in UNARY_FNS}
_NO_PARAMS = (0.0, 0.0, 0.0)


def _dtype_name(t: torch.Tensor, what: str) -> str:
    try:
        name = _NAMES[t.dtype]
    except KeyError:
        raise KernelError(f"{what}: dtype {t.dtype} is not served (float16, bfloat16, float32)") from None
    return name


def _unary(fn: str, x: torch.Tensor, params=_NO_PARAMS) -> torch.Tensor:
    # The direct launch (kernels/runtime/launch.py): a call whose key was seen replays its kernel.
    try:
        key = (UNARY_SPEC, fn, params, x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15)
    except AttributeError:
        raise KernelError(f"{fn}: the operand must be a tensor") from None
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(x)
    return launch.remember(key, (x,), _unary_call, fn, x, params)


def _unary_call(fn: str, x: torch.Tensor, params) -> torch.Tensor:
    dt = _dtype_name(x, fn)
    if dt not in TORCH_DTYPES:
        raise KernelError(f"{fn}: dtype {x.dtype} is not served (float16, bfloat16, float32)")
    y = launch.empty(x.shape, x.dtype, x.device)
    n = x.numel()
    if n == 0:
        return y
    try:  # a strided input (rotate_half's x[..., 64:]) is read in place
        plan = unary_plan(x)
    except ValueError:  # more merged dims than the kernel takes: a copy by the copy kernel
        x = dense(x)
        plan = None
    config = config_for(UNARY_SPEC, (dt,), _UNARY_FLAGS[fn], (n,))
    launch_unary(x, y, fn, params, config, plan)
    return y


def relu(x: torch.Tensor) -> torch.Tensor:
    """max(x, 0), NaN kept."""
    return _unary("relu", x)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """x * Phi(x) (approximate='none', with erf) or its tanh form (approximate='tanh')."""
    if approximate not in ("none", "tanh"):
        raise KernelError(f"gelu: approximate={approximate!r} (none or tanh)")
    return _unary("gelu_tanh" if approximate == "tanh" else "gelu", x)


def silu(x: torch.Tensor) -> torch.Tensor:
    return _unary("silu", x)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return _unary("sigmoid", x)


def tanh(x: torch.Tensor) -> torch.Tensor:
    return _unary("tanh", x)


def exp(x: torch.Tensor) -> torch.Tensor:
    return _unary("exp", x)


def log(x: torch.Tensor) -> torch.Tensor:
    return _unary("log", x)


def neg(x: torch.Tensor) -> torch.Tensor:
    return _unary("neg", x)


def rsqrt(x: torch.Tensor) -> torch.Tensor:
    return _unary("rsqrt", x)


def sqrt(x: torch.Tensor) -> torch.Tensor:
    return _unary("sqrt", x)


def sin(x: torch.Tensor) -> torch.Tensor:
    return _unary("sin", x)


def cos(x: torch.Tensor) -> torch.Tensor:
    return _unary("cos", x)


def pow(x: torch.Tensor, exponent: float) -> torch.Tensor:
    """x ** exponent for a Python-number exponent (torch.pow(Tensor, Scalar))."""
    if isinstance(exponent, torch.Tensor) or not math.isfinite(float(exponent)):
        raise KernelError("pow: the exponent must be a finite Python number")
    return _unary("pow", x, pow_params(exponent))


def _served_pow(x: torch.Tensor, exponent: float) -> torch.Tensor:
    """pow under serve(), which promises torch's values at every input: exp2/log2 of |x|
    loses the sign of -0.0 for odd exponents (pow(-0.0, -1) is -inf) and makes NaN of
    pow(-inf, 1.5) (torch: inf), so torch runs those exponents until the kernel, which the
    shipped table certifies, is fixed. The public op keeps them (values within tolerance)."""
    if isinstance(exponent, torch.Tensor) or not math.isfinite(float(exponent)):
        raise KernelError("pow: the exponent must be a finite Python number")
    params = pow_params(exponent)
    if not params[1]:
        raise KernelError("pow: a non-integer exponent is not served (pow(-inf, 1.5), pow(-0.0, 0.5))")
    if params[2] and not small_int_pow("pow", params):
        raise KernelError("pow: an odd integer exponent outside 1..3 is not served (the sign of -0.0)")
    return _unary("pow", x, params)


# Plans of binary launches by op and operand signature: the broadcast/merge math and the
# checks (integer true division) run once per distinct (fn, dtypes, shapes, strides), after
# that a launch is dict lookups. fn is in the key: a plan made for an int64 add must never
# serve an int64 div (tests/test_serve_semantics.py).
_BINARY_PLANS: dict = {}


def _binary_plan_for(fn, a, b, b_is_value, b_dt, python_number):
    a_dt = _dtype_name(a, fn)
    if b_is_value:
        key = (fn, a_dt, tuple(a.shape), a.stride(), b_dt, python_number)
    else:
        key = (fn, a_dt, tuple(a.shape), a.stride(), b_dt, tuple(b.shape), b.stride())
    hit = _BINARY_PLANS.get(key)
    if hit is not None:
        return hit
    a_shape = tuple(a.shape)
    if b_is_value:
        if python_number and a_dt in TORCH_DTYPES:
            out_dt = a_dt  # a wrapped number never promotes a floating tensor, 0-d or not
        else:
            out_dt = result_dtype(a_dt, a.dim() == 0, b_dt, True)
        b_shape = None
        out_shape = a_shape
    else:
        b_shape = tuple(b.shape)
        out_dt = result_dtype(a_dt, a.dim() == 0, b_dt, b.dim() == 0)
        out_shape = broadcast_shape(a_shape, b_shape)
        if out_shape is None:
            raise KernelError(f"{fn}: shapes {a_shape} and {b_shape} do not broadcast")
    if isinstance(out_dt, NotServable):
        raise KernelError(f"{fn}: {out_dt.reason}")
    if out_dt in INT_DTYPES and fn == "div":
        raise KernelError("div: true division of integers is not served")
    try:
        plan = binary_plan(out_shape, a_shape, a.stride(), b_shape,
                           None if b_is_value else b.stride())
    except ValueError as e:
        raise KernelError(f"{fn}: {e}") from None
    layout = layout_of(plan[1], plan[2])
    flags = {f: seat_flags(fn=f, layout=layout) for f in BINARY_FNS}
    hit = (plan, out_shape, SCALAR_DTYPES[out_dt], (out_dt, a_dt, b_dt), flags)
    if len(_BINARY_PLANS) >= 1 << 14:
        _BINARY_PLANS.clear()
    _BINARY_PLANS[key] = hit
    return hit


def _binary(fn: str, a: torch.Tensor, b, alpha: float = 1.0) -> torch.Tensor:
    # The direct launch (kernels/runtime/launch.py). A Python number is in the key with its type (an
    # int and a float are different seats); so is the value of a scalar tensor on another
    # device, which the launch passes as a number. b is a: one input, both operands at its address.
    try:
        dev = a.device
        if not isinstance(b, torch.Tensor):
            bk, b_in = (type(b), b), False
        elif b is a:
            bk, b_in = None, False
        elif b.device != dev:
            bk, b_in = (b.dtype, b.device, b.item() if b.dim() == 0 else b.shape), True
        else:
            bk, b_in = (b.shape, b.stride(), b.dtype, b.data_ptr() & 15), True
        key = (BINARY_SPEC, fn, alpha, a.shape, a.stride(), a.dtype, dev, a.data_ptr() & 15, bk)
        hit = REMEMBERED.get(key)
    except (AttributeError, TypeError):  # not a tensor, or an unhashable b: the checks say so
        return _binary_call(fn, a, b, alpha)
    if b_in:
        return hit(a, b) if hit is not None else launch.remember(key, (a, b), _binary_call, fn, a, b, alpha)
    return hit(a) if hit is not None else launch.remember(key, (a,), _binary_call, fn, a, b, alpha)


def _binary_call(fn: str, a: torch.Tensor, b, alpha: float) -> torch.Tensor:
    if not isinstance(a, torch.Tensor):
        raise KernelError(f"{fn}: the first operand must be a tensor")
    value, python_number = 0.0, False
    if isinstance(b, torch.Tensor):
        if b.dim() == 0 and b.device != a.device:  # a CPU scalar with a GPU tensor
            b_dt = _dtype_name(b, fn)
            b, value, is_value = None, b.item(), True
        else:
            b_dt = _dtype_name(b, fn)
            is_value = False
    elif isinstance(b, bool) or not isinstance(b, (int, float)):
        raise KernelError(f"{fn}: the second operand must be a tensor or a Python int/float")
    else:
        b_dt = "int64" if isinstance(b, int) else "float64"
        b, value, is_value, python_number = None, b, True, True
    plan, out_shape, out_dtype, dtypes, flags = _binary_plan_for(fn, a, b, is_value, b_dt, python_number)
    out = launch.empty(out_shape, out_dtype, a.device)
    n = plan[0]
    if out.numel() == 0:
        return out
    config = config_for(BINARY_SPEC, dtypes, flags[fn], (n,))
    launch_binary_plan(a, b, out, plan, fn, value, alpha, config)
    return out


def add(a: torch.Tensor, b, alpha: float = 1) -> torch.Tensor:
    """a + alpha * b; b a tensor (broadcast) or a Python number."""
    return _binary("add", a, b, alpha)


def sub(a: torch.Tensor, b, alpha: float = 1) -> torch.Tensor:
    """a - alpha * b."""
    return _binary("sub", a, b, alpha)


def rsub(a: torch.Tensor, b, alpha: float = 1) -> torch.Tensor:
    """b - alpha * a (torch.rsub)."""
    return _binary("rsub", a, b, alpha)


def mul(a: torch.Tensor, b) -> torch.Tensor:
    return _binary("mul", a, b)


def div(a: torch.Tensor, b) -> torch.Tensor:
    """True division a / b."""
    return _binary("div", a, b)


def maximum(a: torch.Tensor, b) -> torch.Tensor:
    """Element-wise max, NaN-propagating."""
    return _binary("maximum", a, b)


def minimum(a: torch.Tensor, b) -> torch.Tensor:
    """Element-wise min, NaN-propagating."""
    return _binary("minimum", a, b)


# ----------------------------------------------------------------------------- serve()

def _serve_unary() -> dict:
    # gelu and pow check an argument first and keep their function; the others are _unary
    # bound to their fn (the same call, less one Python frame on each served launch).
    ops = {op: globals()[fn] if fn in ("gelu", "pow") else functools.partial(_unary, fn)
           for op, fn in _UNARY_OPS.items()}
    ops["aten.gelu"] = lambda x, approximate="none": gelu(x, approximate)
    ops["aten.pow.Tensor_Scalar"] = _served_pow
    return ops


def _inplace(fn):
    """An in-place op on the out-of-place kernel: the result is copied into self (cast as
    torch's in-place ops cast it). Where torch refuses the in-place op (overlap; a result
    that broadcasts past self or would be cast down to its kind) torch runs and refuses it."""
    def run(a, b, *args, **kwargs):
        if isinstance(a, torch.Tensor):
            semantics.check_writable("in-place", a, b)
        out = fn(a, b, *args, **kwargs)
        if out.shape != a.shape or not torch.can_cast(out.dtype, a.dtype):
            raise KernelError(f"in-place: a {out.dtype} result of shape {tuple(out.shape)} "
                              f"into {a.dtype} {tuple(a.shape)} (torch refuses it)")
        return a.copy_(out)
    return run


def _serve_binary() -> dict:
    # add, sub and rsub keep their own default alpha (an int 1: Triton compiles it as a constant).
    fns = {"add": add, "sub": sub, "rsub": rsub,
           **{fn: functools.partial(_binary, fn) for fn in ("mul", "div", "maximum", "minimum")}}
    ops = {op: fns[fn] for op, fn in _BINARY_OPS.items() if op != "aten.div.Tensor_mode"}
    ops.update({op: _inplace(ops[base]) for op, base in _INPLACE_OPS.items()})
    return ops

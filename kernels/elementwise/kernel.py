"""The element-wise kernels (unary and binary) and their launchers: what decides the code a seat runs
(every function here that a spec hashes is listed in its `source_parts`).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from nbx_tune.kernels.copy import block_start, copy_plan, stream_launch, strided_offsets
from nbx_tune.kernels.helpers import contiguous_strides
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.spec import Config

INDEX_LIMIT = 2**31 - 2**17  # beyond this offsets are computed in int64
MAX_RANK = 5  # broadcast dims after merging (the kernel decomposes indices over up to 5)

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

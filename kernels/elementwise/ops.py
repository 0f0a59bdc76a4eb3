"""The element-wise public ops (torch tensors in, the certified config's launch) and their serve() routes.
"""

from __future__ import annotations

import functools
import math

import torch

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import dense
from nbx_tune.kernels.elementwise.kernel import (binary_plan, launch_binary_plan, launch_unary, pow_params,
                                                 small_int_pow, unary_plan)
from nbx_tune.kernels.elementwise.spec import (BINARY_FNS, BINARY_SPEC, INT_DTYPES, SCALAR_DTYPES, TORCH_DTYPES,
                                               UNARY_FNS, UNARY_SPEC, _BINARY_OPS, _INPLACE_OPS, _NAMES, _UNARY_OPS,
                                               broadcast_shape, layout_of, result_dtype)
from nbx_tune.kernels.runtime import launch, semantics
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import NotServable, seat_flags


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


def _unary_op(fn: str):
    """The public op of a unary function with no argument but x: the kernel's `fn`."""
    def op(x: torch.Tensor) -> torch.Tensor:
        return _unary(fn, x)
    op.__name__ = op.__qualname__ = fn
    op.__doc__ = f"{fn}(x) element-wise, in x's dtype (fp32 inside)."
    return op


silu, sigmoid, tanh, exp, log, neg, rsqrt, sqrt, sin, cos = map(
    _unary_op, ("silu", "sigmoid", "tanh", "exp", "log", "neg", "rsqrt", "sqrt", "sin", "cos"))


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
    # The direct launch (kernels/runtime/launch.py). A Python number is in the key by its repr,
    # which holds its type (an int and a float are different seats) and tells -0.0 from 0.0
    # (x / -0.0 is -inf) and every NaN alike; so is the value of a scalar tensor on another
    # device, which the launch passes as a number. b is a: one input, both operands at its address.
    try:
        dev = a.device
        if not isinstance(b, torch.Tensor):
            bk, b_in = repr(b), False
        elif b is a:
            bk, b_in = None, False
        elif b.device != dev:
            bk, b_in = (b.dtype, b.device, repr(b.item()) if b.dim() == 0 else b.shape), True
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
    if is_value and fn in ("add", "sub", "rsub") and out_dtype in (torch.float16, torch.bfloat16):
        # torch's add and sub cast the number to the result's dtype before computing in fp32
        # (h + 0.1 adds fp16(0.1)); its mul and div take the number as it is, as the kernel does.
        value = torch.tensor(value, dtype=out_dtype).item()
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

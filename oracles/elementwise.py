"""Element-wise ops in float64, from their definitions (torch.relu, gelu, ..., add, maximum).

Inputs arrive as the exact values the kernel sees (already rounded to their dtype); every
function computes in float64 and broadcasts like numpy (= like torch).
"""

import numpy as np

_SQRT_HALF = 0.70710678118654752440
_TWO_OVER_SQRT_PI = 1.12837916709551257390
_SQRT_TWO_OVER_PI = 0.79788456080286535588


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def erf(x) -> np.ndarray:
    """erf(x) = 2/sqrt(pi) * integral_0^x exp(-t^2) dt, by the series of positive terms

        erf(x) = 2x/sqrt(pi) * exp(-x^2) * sum_n (2x^2)^n / (1*3*5*...*(2n+1))

    (no cancellation, so full fp64 accuracy), summed until every term is below 1e-17 of
    its sum; |x| >= 6 gives +-1 (erfc(6) = 2e-17)."""
    x = _f64(x)
    ax = np.minimum(np.abs(np.nan_to_num(x, nan=0.0)), 6.0).ravel()
    total = np.ones_like(ax)
    # Elements grouped by magnitude, so that small |x| sum few terms: the terms grow while
    # n < x^2 and then fall faster than geometrically.
    for lo, hi in ((0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.5), (4.5, 6.1)):
        idx = np.nonzero((ax >= lo) & (ax < hi))[0]
        if not idx.size:
            continue
        two_x2 = 2.0 * ax[idx] ** 2
        term = np.ones_like(two_x2)
        part = np.ones_like(two_x2)
        n = 0
        while n < 400:
            term *= two_x2 / (2 * n + 3)
            part += term
            n += 1
            if n > 2 * hi * hi and not np.any(term > 1e-17 * part):
                break
        total[idx] = part
    r = (_TWO_OVER_SQRT_PI * ax * np.exp(-ax * ax) * total).reshape(x.shape)
    r = np.where(np.abs(x) >= 6.0, 1.0, np.minimum(r, 1.0))
    return np.where(np.isnan(x), np.nan, np.sign(x) * r)


# ----------------------------------------------------------------------------- unary


def relu(x):
    """max(x, 0)."""
    x = _f64(x)
    return np.where(x > 0, x, 0.0) + np.where(np.isnan(x), np.nan, 0.0)


def gelu(x, approximate: str = "none"):
    """x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); with approximate='tanh',
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = _f64(x)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(_SQRT_TWO_OVER_PI * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + erf(x * _SQRT_HALF))


def sigmoid(x):
    """1 / (1 + exp(-x))."""
    x = _f64(x)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    """x * sigmoid(x)."""
    return _f64(x) * sigmoid(x)


def silu_mul(gate, up):
    """silu(gate) * up (a SwiGLU's activation)."""
    return silu(gate) * _f64(up)


def tanh(x):
    """(e^x - e^-x) / (e^x + e^-x)."""
    return np.tanh(_f64(x))


def exp(x):
    return np.exp(_f64(x))


def log(x):
    """Natural log: -inf at 0, NaN below."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(_f64(x))


def neg(x):
    return -_f64(x)


def sqrt(x):
    with np.errstate(invalid="ignore"):
        return np.sqrt(_f64(x))


def rsqrt(x):
    """1 / sqrt(x)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(_f64(x))


def sin(x):
    return np.sin(_f64(x))


def cos(x):
    return np.cos(_f64(x))


def pow(x, exponent: float):
    """x ** exponent for a scalar exponent: x^0 = 1 everywhere (torch's rule, NaN included);
    a negative base with a fractional exponent is NaN."""
    x = _f64(x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = np.power(x, float(exponent))
    if exponent == 0:
        return np.ones_like(x)
    return r


# ----------------------------------------------------------------------------- binary


def add(a, b, alpha: float = 1.0):
    """a + alpha * b."""
    return _f64(a) + float(alpha) * _f64(b)


def sub(a, b, alpha: float = 1.0):
    """a - alpha * b."""
    return _f64(a) - float(alpha) * _f64(b)


def rsub(a, b, alpha: float = 1.0):
    """b - alpha * a (torch.rsub: the operands of sub swapped)."""
    return _f64(b) - float(alpha) * _f64(a)


def mul(a, b):
    return _f64(a) * _f64(b)


def div(a, b):
    """True division: x/0 is +-inf, 0/0 NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _f64(a) / _f64(b)


def maximum(a, b):
    """Element-wise max; NaN in either operand gives NaN (torch.maximum)."""
    return np.maximum(_f64(a), _f64(b))


def minimum(a, b):
    """Element-wise min; NaN in either operand gives NaN (torch.minimum)."""
    return np.minimum(_f64(a), _f64(b))


def gelu_mul(gate, up):
    """gelu(gate) in its tanh form, times up (a GeGLU's activation: Gemma's MLP)."""
    return gelu(gate, "tanh") * _f64(up)


def softcap(x, cap: float):
    """tanh(x / cap) * cap: logits soft-capped to (-cap, cap) (Gemma 2)."""
    return np.tanh(_f64(x) / cap) * cap

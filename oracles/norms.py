"""Layer, RMS and group normalization in float64, from their definitions
(aten.native_layer_norm, aten._fused_rms_norm / aten.rms_norm, aten.native_group_norm).

Each returns the normalized output and the statistics the op returns beside it, shaped as
torch shapes them: layer norm's mean and rstd keep the leading dims with 1 for each
normalized dim; RMS norm's rstd likewise; group norm's mean and rstd are (N, group).
Variances are biased (divided by the element count), as in every torch normalization.
"""

import numpy as np


def layer_norm(x, normalized_ndim: int, weight=None, bias=None, eps: float = 1e-5):
    """(out, mean, rstd): out = (x - mean) * rstd * weight + bias over the last
    `normalized_ndim` dims, rstd = 1 / sqrt(var + eps)."""
    x = np.asarray(x, dtype=np.float64)
    axes = tuple(range(x.ndim - normalized_ndim, x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * np.asarray(weight, dtype=np.float64)
    if bias is not None:
        out = out + np.asarray(bias, dtype=np.float64)
    return out, mean, rstd


def rms_norm(x, normalized_ndim: int, weight=None, eps: float = 1.1920928955078125e-07):
    """(out, rstd): out = x * rstd * weight over the last `normalized_ndim` dims,
    rstd = 1 / sqrt(mean(x^2) + eps). torch's eps=None is float32's machine epsilon
    (the default here) for float16, bfloat16 and float32 inputs alike."""
    x = np.asarray(x, dtype=np.float64)
    axes = tuple(range(x.ndim - normalized_ndim, x.ndim))
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)
    out = x * rstd
    if weight is not None:
        out = out * np.asarray(weight, dtype=np.float64)
    return out, rstd


def group_norm(x, groups: int, weight=None, bias=None, eps: float = 1e-5):
    """(out, mean, rstd) for x of shape (N, C, *spatial): channels split into `groups`
    groups of C / groups, each normalized over its channels and all spatial positions;
    weight and bias (C,) scale and shift per channel. mean and rstd are (N, groups)."""
    x = np.asarray(x, dtype=np.float64)
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    mean = np.mean(g, axis=2)
    var = np.mean((g - mean[:, :, None]) ** 2, axis=2)
    rstd = 1.0 / np.sqrt(var + eps)
    out = ((g - mean[:, :, None]) * rstd[:, :, None]).reshape(x.shape)
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * np.asarray(weight, dtype=np.float64).reshape(per_channel)
    if bias is not None:
        out = out + np.asarray(bias, dtype=np.float64).reshape(per_channel)
    return out, mean, rstd


def offset_rms_norm(x, weight, eps: float):
    """x * rstd * (1 + weight) over the last dim (Gemma's RMS norm, its weight an offset from 1)."""
    return rms_norm(x, 1, 1.0 + np.asarray(weight, dtype=np.float64), eps)[0]

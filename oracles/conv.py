"""Convolutions in float64, from their definition (torch.nn.functional.conv1d / conv2d,
aten.convolution with transposed=False).

    out[n, o, p] = bias[o] + sum_{c, t} x_pad[n, g*Cg + c, p*stride + t*dilation] * w[o, c, t]

where g = o // (C_out / groups) is the group of output channel o, Cg = C_in / groups the
input channels of one group, p runs over the output positions, t over the filter taps,
and x_pad is x with `padding` zeros on both sides of every spatial axis. The sum is taken
one filter tap at a time: the input window of a tap is a strided slice of x_pad, and
its contribution a matrix product over the group's channels.
"""

import itertools

import numpy as np

from nbx_tune.oracles.products import matmul as _matmul


def _conv(x, w, bias, stride, padding, dilation, groups):
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    nd = x.ndim - 2
    n, c_in = x.shape[:2]
    c_out, c_group = w.shape[:2]
    taps = w.shape[2:]
    if c_in != c_group * groups or c_out % groups:
        raise ValueError(f"channels {c_in} -> {c_out} do not split into {groups} groups of {c_group}")
    out_g = c_out // groups
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    size = tuple((xp.shape[2 + i] - dilation[i] * (taps[i] - 1) - 1) // stride[i] + 1 for i in range(nd))
    if min(size) <= 0:
        raise ValueError(f"empty output {size}")
    # (n, groups, c_group, *spatial) and (groups, out_g, c_group, *taps)
    xg = xp.reshape(n, groups, c_group, *xp.shape[2:])
    wg = w.reshape(groups, out_g, c_group, *taps)
    acc = np.zeros((n, groups, *size, out_g))
    for tap in itertools.product(*(range(k) for k in taps)):
        win = tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                    for t, d, s, o in zip(tap, dilation, stride, size))
        patch = xg[(slice(None), slice(None), slice(None), *win)]  # (n, g, c, *size)
        patch = np.moveaxis(patch, 2, -1)  # (n, g, *size, c)
        wt = wg[(slice(None), slice(None), slice(None), *tap)]  # (g, out_g, c)
        wt = np.swapaxes(wt, 1, 2)  # (g, c, out_g)
        # acc[n, g, *size, o] += sum_c patch[n, g, *size, c] * wt[g, c, o]
        acc += _matmul(patch.reshape(n, groups, -1, c_group), wt[None]).reshape(acc.shape)
    out = np.moveaxis(acc, -1, 2).reshape(n, c_out, *size)  # channel = g * out_g + o
    if bias is not None:
        out = out + np.asarray(bias, dtype=np.float64).reshape(1, c_out, *([1] * nd))
    return out


def _tuple(v, nd):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd


def conv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1) -> np.ndarray:
    """x (N, C_in, H, W), w (C_out, C_in / groups, KH, KW), bias (C_out,) or None ->
    (N, C_out, H_out, W_out); padding is symmetric (zeros on both sides)."""
    return _conv(x, w, bias, _tuple(stride, 2), _tuple(padding, 2), _tuple(dilation, 2), groups)


def conv1d(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1) -> np.ndarray:
    """x (N, C_in, W), w (C_out, C_in / groups, K), bias (C_out,) or None -> (N, C_out, W_out)."""
    return _conv(x, w, bias, _tuple(stride, 1), _tuple(padding, 1), _tuple(dilation, 1), groups)

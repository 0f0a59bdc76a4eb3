"""The convolution public ops (conv2d, conv1d on torch tensors) and their serve() route.
"""

from __future__ import annotations

import torch

from nbx_tune.errors import KernelError
from nbx_tune.kernels import copy
from nbx_tune.kernels.conv.kernel import (launch_conv_depthwise, launch_conv_gemm, launch_conv_pointwise, pixels_flat,
                                          pointwise_align, seat_kind)
from nbx_tune.kernels.conv.spec import INT32_MAX, SPEC, TORCH_DTYPES, _flags
from nbx_tune.kernels.rows import numel
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for


# ----------------------------------------------------------------------------- public ops

REMEMBERED, tensor_key = launch.REMEMBERED, launch.tensor_key
_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def _span(t) -> int:
    """The largest element offset a tensor's strides reach."""
    return sum((d - 1) * abs(st) for d, st in zip(t.shape, t.stride()) if d > 0)


def _tuple(v, nd: int, name: str) -> tuple:
    if isinstance(v, int):
        return (v,) * nd
    v = tuple(int(e) for e in v)
    if len(v) == 1:
        return v * nd
    if len(v) != nd:
        raise KernelError(f"conv: {name} {v} has {len(v)} values for a {nd}-D convolution")
    return v


def _hashable(v):
    return tuple(v) if type(v) is list else v  # an aten op's int[] arguments arrive as lists


def _direct(x, w, bias, stride, padding, dilation, groups, nd):
    # The direct launch (kernels/runtime/launch.py): a call whose key was seen replays its kernel.
    try:
        key = (SPEC, nd, _hashable(stride), _hashable(padding), _hashable(dilation), groups,
               x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15, tensor_key(w),
               None if bias is None else tensor_key(bias))
        hit = REMEMBERED.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable: the checks say so
        return _conv(x, w, bias, stride, padding, dilation, groups, nd)
    if hit is not None:
        return hit(x, w, bias)
    return launch.remember(key, (x, w, bias), _conv, x, w, bias, stride, padding, dilation, groups, nd)


def _conv(x, w, bias, stride, padding, dilation, groups, nd):
    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    if x.dim() != nd + 2 or w.dim() != nd + 2:
        raise KernelError(f"conv{nd}d: expected a rank-{nd + 2} input and weight, got {tuple(x.shape)} "
                          f"and {tuple(w.shape)}")
    stride = _tuple(stride, nd, "stride")
    dilation = _tuple(dilation, nd, "dilation")
    taps = tuple(w.shape[2:])
    size = tuple(x.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pad = (0,) * nd
            out = tuple((s - d * (k - 1) - 1) // st + 1 for s, d, k, st in zip(size, dilation, taps, stride))
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise KernelError(f"conv{nd}d: padding='same' needs stride 1, got {stride}")
            # torch pads total // 2 before and the rest after (one more after for an odd total)
            pad = tuple(d * (k - 1) // 2 for d, k in zip(dilation, taps))
            out = size
        else:
            raise KernelError(f"conv{nd}d: padding {padding!r} is not 'valid', 'same' or numbers")
    else:
        pad = _tuple(padding, nd, "padding")
        out = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                    for s, p, d, k, st in zip(size, pad, dilation, taps, stride))
    nb, ci = x.shape[0], x.shape[1]
    co, cig = w.shape[0], w.shape[1]
    if groups < 1 or ci != cig * groups or co % groups:
        raise KernelError(f"conv{nd}d: input {tuple(x.shape)} and weight {tuple(w.shape)} do not form "
                          f"{groups} groups")
    if bias is not None and tuple(bias.shape) != (co,):
        raise KernelError(f"conv{nd}d: bias {tuple(bias.shape)} is not ({co},)")
    if min(out) <= 0:
        raise KernelError(f"conv{nd}d: the filter {taps} is larger than the padded input {size}")
    try:
        dtypes = (_DTYPE_NAMES[x.dtype],)
    except KeyError:
        raise KernelError(f"conv{nd}d: dtype {x.dtype} is not served (float16, bfloat16, float32)") from None
    if w.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise KernelError(f"conv{nd}d: mixed dtypes {x.dtype}, {w.dtype}"
                          + ("" if bias is None else f", {bias.dtype}"))
    # The kernels index in int32: a view whose strides reach past 2^31 elements is copied.
    if _span(x) > INT32_MAX:
        x = x.contiguous()
    if _span(w) > INT32_MAX:
        w = w.contiguous()
    if max(x.numel(), w.numel(), nb * co * numel(out)) > INT32_MAX:
        raise KernelError(f"conv{nd}d: a tensor of 2^31 elements or more (the kernels index in int32)")
    y = launch.empty((nb, co, *out), x.dtype, x.device)
    if nb == 0:
        return y.squeeze(0) if unbatched else y
    if nd == 1:
        x4, w4, y4 = x.unsqueeze(2), w.unsqueeze(2), y.unsqueeze(2)
        stride, pad, dilation = (1, stride[0]), (0, pad[0]), (1, dilation[0])
    else:
        x4, w4, y4 = x, w, y
    kh, kw = w4.shape[2], w4.shape[3]
    oh, ow = y4.shape[2], y4.shape[3]
    kind = seat_kind(cig, groups, kh, kw, pad, nb)
    align = 1
    if kind == "pointwise":
        if stride == (1, 1) and not pixels_flat(x4):  # a view: the seat's code is the flat path's
            x4 = copy.dense(x4)
        # A strided one is staged dense by launch_conv_pointwise: aligned as that copy is.
        xs = x4.stride() if stride == (1, 1) else (ci * oh * ow, oh * ow, ow, 1)
        align = pointwise_align(oh * ow, xs, y4.stride(), True, x4.element_size())
    config = config_for(SPEC, dtypes, _flags(kind, kh, kw, stride[0], stride[1], bias is not None, align),
                        (nb * oh, ow, ci, co, groups))
    if kind == "depthwise":
        launch_conv_depthwise(x4, w4, bias, y4, stride, pad, dilation, config)
    elif kind == "pointwise":
        launch_conv_pointwise(x4, w4, bias, y4, stride, config)
    else:
        launch_conv_gemm(x4, w4, bias, y4, stride, pad, dilation, groups, config)
    return y.squeeze(0) if unbatched else y


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1,
           padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """torch.nn.functional.conv2d: input (N, C_in, H, W) or (C_in, H, W), weight (C_out,
    C_in/groups, KH, KW), padding numbers or 'valid'/'same'; any input strides; the output is
    contiguous NCHW."""
    return _direct(input, weight, bias, stride, padding, dilation, groups, 2)


def conv1d(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride=1,
           padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """torch.nn.functional.conv1d: input (N, C_in, W) or (C_in, W), weight (C_out, C_in/groups, K)."""
    return _direct(input, weight, bias, stride, padding, dilation, groups, 1)


def _serve_convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                       groups):
    """aten.convolution's arguments, for serve(): 1-D and 2-D, not transposed."""
    if transposed:
        raise KernelError("conv: transposed convolution is not served")
    nd = weight.dim() - 2
    if nd not in (1, 2):
        raise KernelError(f"conv: {nd}-D convolution is not served (1-D, 2-D)")
    return _direct(input, weight, bias, stride, padding, dilation, groups, nd)

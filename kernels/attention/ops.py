"""The attention public op (scaled_dot_product_attention on torch tensors) and its serve() route.
"""

from __future__ import annotations

import math

import torch

from nbx_tune.errors import KernelError
from nbx_tune.kernels.attention.kernel import launch_attention
from nbx_tune.kernels.attention.spec import SPEC, TORCH_DTYPES, size_limit
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import seat_flags


# ----------------------------------------------------------------------------- public ops

REMEMBERED, tensor_key = launch.REMEMBERED, launch.tensor_key
_DTYPE_NAMES = {v: (k,) for k, v in TORCH_DTYPES.items()}
_CAUSAL = seat_flags(causal=1)
_NOT_CAUSAL = seat_flags(causal=0)


def _span(t) -> int:
    """The largest element offset inside one (batch, head) slab of a 4-D tensor."""
    return (t.shape[2] - 1) * abs(t.stride(2)) + (t.shape[3] - 1) * abs(t.stride(3))


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(scale * q k^T [causal]) v, as torch.nn.functional.scaled_dot_product_attention
    with attn_mask=None, dropout_p=0 (and enable_gqa=True when k and v have fewer heads).

    q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); Hkv divides Hq; D, Dv <= 256.
    is_causal masks top-left (query i sees keys j <= i); scale defaults to 1 / sqrt(D).
    Returns (B, Hq, Lq, Dv) in q's dtype, with the certified config of its seat."""
    # The direct launch (kernels/runtime/launch.py): a call whose key was seen replays its kernel.
    try:
        key = (SPEC, is_causal, scale, q.shape, q.stride(), q.dtype, q.device, q.data_ptr() & 15,
               tensor_key(k), tensor_key(v))
    except AttributeError:  # not tensors: the checks say so
        return _attention(q, k, v, is_causal, scale)
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(q, k, v)
    return launch.remember(key, (q, k, v), _attention, q, k, v, is_causal, scale)


def checked_qkv(q, k, v, who: str) -> tuple:
    """(B, Hq, Lq, D, Hkv, Lk, Dv, dtype name) of a query, key and value the attention kernels
    take (4-D, fitting shapes, one float dtype), else KernelError naming `who`."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise KernelError(f"{who}: expected 4-D query, key, value, got {tuple(q.shape)}, "
                          f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    Dv = v.shape[3]
    if (k.shape[0] != B or v.shape[0] != B or v.shape[1] != Hkv or v.shape[2] != Lk
            or k.shape[3] != D or Hkv == 0 or Hq % Hkv):
        raise KernelError(f"{who}: shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)} "
                          "do not fit (B, Hq, Lq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv), Hkv | Hq")
    dtypes = _DTYPE_NAMES.get(q.dtype)
    if dtypes is None or k.dtype != q.dtype or v.dtype != q.dtype:
        raise KernelError(f"{who}: dtypes {q.dtype}, {k.dtype}, {v.dtype}: one of float16, "
                          "bfloat16, float32 for all three")
    return B, Hq, Lq, D, Hkv, Lk, Dv, dtypes[0]


def _attention(q, k, v, is_causal, scale):
    B, Hq, Lq, D, Hkv, Lk, Dv, dt = checked_qkv(q, k, v, "attention")
    dtypes = (dt,)
    why = size_limit(B, Hq, D, Dv, max(_span(q), _span(k), _span(v)))
    if why:
        raise KernelError(f"attention: {why}")
    # In (B, Lq, Hq, Dv) memory order, as torch's fused CUDA kernels return it: a model's
    # `.transpose(1, 2).contiguous()` after attention is then a view, not a copy.
    out = launch.empty((B, Hq, Lq, Dv), q.dtype, q.device, (Lq * Hq * Dv, Dv, Hq * Dv, 1))
    if out.numel() == 0:
        return out
    if Lk == 0:  # torch: no keys, a zero output
        return out.zero_()
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    config = config_for(SPEC, dtypes, _CAUSAL if is_causal else _NOT_CAUSAL, (B * Hq, Lq, Lk, D, Dv))
    lse = launch.scratch((B, Hq, Lq), torch.float32, q.device)  # not returned: nothing reads it
    launch_attention(q, k, v, out, lse, scale, bool(is_causal), config)
    return out


def _serve_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                enable_gqa=False):
    """aten.scaled_dot_product_attention's arguments, for serve()."""
    if attn_mask is not None:  # the masked attention family's (kernels/masked_attention/)
        from nbx_tune.kernels.masked_attention.ops import serve_masked_sdpa

        return serve_masked_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if dropout_p != 0.0:
        raise KernelError(f"attention: dropout_p={dropout_p} is not served")
    if not enable_gqa and key.dim() == 4 and query.dim() == 4 and key.shape[1] != query.shape[1]:
        raise KernelError("attention: key/value heads differ from the query's without enable_gqa")
    return scaled_dot_product_attention(query, key, value, is_causal, scale)

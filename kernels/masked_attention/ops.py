"""The masked attention public op (`nbx_tune.masked_attention`) and the route serve() takes for
`aten.scaled_dot_product_attention` with an attn_mask (kernels/attention/ops.py hands it here).
"""

from __future__ import annotations

import torch

from nbx_tune.errors import KernelError
from nbx_tune.kernels.attention.ops import _span, checked_qkv
from nbx_tune.kernels.masked_attention.kernel import launch_masked_attention
from nbx_tune.kernels.masked_attention.pattern import recognise
from nbx_tune.kernels.masked_attention.spec import MASK_KINDS, OP, SPEC, seat_of, size_limit
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for


def key_ranges(seq_lens: torch.Tensor, Lk: int, padding: str) -> torch.Tensor:
    """int32 (B, 2): sequence b's keys [start, end) for its length, padded on `padding`'s side."""
    n = seq_lens.to(torch.int32).clamp(0, Lk)
    start = (Lk - n) if padding == "left" else torch.zeros_like(n)
    return torch.stack([start, start + n], 1).contiguous()


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                     window: int | None = None, seq_lens: torch.Tensor | None = None, *, is_causal: bool = False,
                     padding: str = "right", scale: float | None = None) -> torch.Tensor:
    """softmax(scale * q k^T + mask) v over the keys each query row sees.

    q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv), Hkv dividing Hq (grouped-query).
    mask: bool (keep where True) or additive in q's dtype, broadcastable to (B, Hq, Lq, Lk).
    is_causal: query i sees keys j <= i + Lk - Lq (the last query at the last key, as with a KV
    cache; torch's is_causal for Lq = Lk). window: a causal sliding window, keys
    j > i + Lk - Lq - window too, computed, never read. seq_lens (B,): sequence b's keys are its
    last seq_lens[b] (padding="left") or first (padding="right"). A row that sees no key is 0.
    Returns (B, Hq, Lq, Dv) in q's dtype, with the certified config of its seat."""
    if padding not in ("left", "right"):
        raise KernelError(f"masked_attention: padding={padding!r}: left or right")
    if window is not None and window <= 0:
        raise KernelError(f"masked_attention: window={window}: a positive number of keys")
    ranges = None if seq_lens is None else key_ranges(seq_lens, k.shape[2] if k.dim() == 4 else 0, padding)
    return _launch(q, k, v, mask, bool(is_causal or window), window or 0, ranges, scale)


def _launch(q, k, v, mask, causal, window, ranges, scale):
    B, Hq, Lq, D, Hkv, Lk, Dv, dt = checked_qkv(q, k, v, "masked_attention")
    kind = "none"
    if mask is not None:
        if mask.dtype == torch.bool:
            kind = "bool"
        elif mask.dtype == q.dtype:
            kind = "add"
        else:
            raise KernelError(f"masked_attention: a {mask.dtype} mask for {q.dtype} attention (bool or {q.dtype})")
        if mask.dim() > 4 or any(m not in (1, n) for m, n in zip(reversed(mask.shape), (Lk, Lq, Hq, B))):
            raise KernelError(f"masked_attention: mask {tuple(mask.shape)} does not broadcast to {(B, Hq, Lq, Lk)}")
    why = size_limit(B, Hkv, D, Dv, max(_span(q), _span(k), _span(v)))
    if why:
        raise KernelError(f"masked_attention: {why}")
    out = launch.empty((B, Hq, Lq, Dv), q.dtype, q.device, (Lq * Hq * Dv, Dv, Hq * Dv, 1))
    if out.numel() == 0:
        return out
    if Lk == 0:
        return out.zero_()
    if scale is None:
        scale = D ** -0.5
    dtypes, flags, dims = seat_of(dt, kind, causal, window, ranges is not None, B, Hq, Hkv, Lq, Lk, D, Dv)
    config = config_for(SPEC, dtypes, flags, dims)
    launch_masked_attention(q, k, v, out, scale, config, mask=mask, mask_kind=MASK_KINDS[kind], causal=causal,
                            offset=Lk - Lq, window=window, ranges=ranges)
    return out


def serve_masked_sdpa(query, key, value, attn_mask, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """aten.scaled_dot_product_attention with an attn_mask, for serve(): a mask recognised as a
    causal / sliding-window / padding pattern (kernels/masked_attention/pattern.py) is computed,
    any other is read."""
    if dropout_p != 0.0:
        raise KernelError(f"masked_attention: dropout_p={dropout_p} is not served")
    if is_causal:
        raise KernelError("masked_attention: is_causal with an attn_mask is not served (torch refuses it)")
    if query.dim() != 4 or key.dim() != 4:
        raise KernelError("masked_attention: expected 4-D query and key")
    if not enable_gqa and key.shape[1] != query.shape[1]:
        raise KernelError("masked_attention: key/value heads differ from the query's without enable_gqa")
    Lq, Lk = query.shape[2], key.shape[2]
    if attn_mask.dtype == torch.bool or attn_mask.dtype == query.dtype:
        found = recognise(attn_mask, Lq, Lk)
        if found is not None:
            return _launch(query, key, value, None, found.causal, found.window, found.ranges, scale)
    return _launch(query, key, value, attn_mask, False, 0, None, scale)


def sdpa_launch_row(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    """The trace row (op, dtypes, shapes, params) of what `serve_masked_sdpa` launches for these
    arguments where the mask is a recognised pattern: the public op's row, its window and key
    ranges in it, so that a census seats what serve() will run. None where serve() would read
    the mask, or not serve the call (the recorder then writes the SDPA row as it is); a mask
    without values (meta) cannot be recognised."""
    if (attn_mask is None or attn_mask.is_meta or dropout_p != 0.0 or is_causal or query.dim() != 4
            or key.dim() != 4 or value.dim() != 4 or (not enable_gqa and key.shape[1] != query.shape[1])
            or attn_mask.dtype not in (torch.bool, query.dtype)):
        return None
    try:
        found = recognise(attn_mask, query.shape[2], key.shape[2])
    except RuntimeError:  # a mask this check cannot read (e.g. under CUDA-graph capture)
        return None
    if found is None:
        return None
    dt = str(query.dtype).removeprefix("torch.")
    dtypes, shapes = [dt, str(key.dtype).removeprefix("torch."), str(value.dtype).removeprefix("torch.")], \
        [tuple(query.shape), tuple(key.shape), tuple(value.shape)]
    params = {}
    if found.causal:
        params["is_causal"] = "True"
    if found.window:
        params["window"] = str(found.window)
    if found.ranges is not None:
        # Which side the screen pads; the seat is the same either way.
        params["ranges"] = "left" if bool((found.ranges[:, 0] > 0).any()) else "right"
        dtypes.append("int32")
        shapes.append(tuple(found.ranges.shape))
    if scale is not None:
        params["scale"] = repr(float(scale))
    return OP, tuple(dtypes), tuple(shapes), tuple(sorted(params.items()))

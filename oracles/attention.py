"""Scaled dot-product attention in float64, from its definition.

    out = softmax(scale * Q K^T + mask) V        lse = log(sum_j exp(scale * Q K^T + mask))

Q is (B, Hq, Lq, D), K (B, Hkv, Lk, D), V (B, Hkv, Lk, Dv). Grouped-query attention: Hkv
divides Hq and query head h reads key/value head h // (Hq // Hkv) (torch's enable_gqa, which
repeat_interleaves K and V over the heads). `is_causal` masks with the lower triangle aligned
to the TOP-LEFT of the (Lq, Lk) score matrix, tril(ones(Lq, Lk)): query i sees keys j <= i,
as torch.nn.functional.scaled_dot_product_attention documents. The default scale is
1 / sqrt(D).

One function per trace op; they differ only in what the op returns.
"""

import math

import numpy as np


def _attention(q, k, v, is_causal, scale):
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    out = np.empty((B, Hq, Lq, v.shape[3]), dtype=np.float64)
    lse = np.empty((B, Hq, Lq), dtype=np.float64)
    keep = np.tril(np.ones((Lq, Lk), dtype=bool)) if is_causal else None
    # One head at a time: a (Lq, Lk) score matrix, never (B, H, Lq, Lk) at once.
    for b in range(B):
        for h in range(Hq):
            kv = h // group
            s = (q[b, h] @ k[b, kv].T) * scale
            if keep is not None:
                s = np.where(keep, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            l = p.sum(axis=1, keepdims=True)
            out[b, h] = (p @ v[b, kv]) / l
            lse[b, h] = (m + np.log(l))[:, 0]
    return out, lse


def scaled_dot_product_attention(q, k, v, is_causal=False, scale=None):
    """aten.scaled_dot_product_attention: the attention output (B, Hq, Lq, Dv)."""
    return _attention(q, k, v, is_causal, scale)[0]


def flash_attention(q, k, v, is_causal=False, scale=None):
    """aten._scaled_dot_product_flash_attention (and _for_cpu): (output, logsumexp), the
    logsumexp (B, Hq, Lq) in natural log of the scaled, masked scores."""
    return _attention(q, k, v, is_causal, scale)


flash_attention_for_cpu = flash_attention


def efficient_attention(q, k, v, is_causal=False, scale=None, compute_log_sumexp=True):
    """aten._scaled_dot_product_efficient_attention: (output, log_sumexp). The log_sumexp is
    (B, Hq, ceil(Lq / 32) * 32), the rows past Lq padded with +inf (the memory-efficient
    kernel's layout), or (B, Hq, 0) when compute_log_sumexp is false."""
    out, lse = _attention(q, k, v, is_causal, scale)
    B, Hq, Lq = lse.shape
    width = -(-Lq // 32) * 32 if compute_log_sumexp else 0
    padded = np.full((B, Hq, width), np.inf)
    padded[:, :, :min(Lq, width)] = lse[:, :, :width]
    return out, padded

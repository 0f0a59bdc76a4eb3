"""Masked scaled dot-product attention in float64, from its definition.

    out = softmax(scale * Q K^T + bias) V     over the keys each query row may see

Q is (B, Hq, Lq, D), K (B, Hkv, Lk, D), V (B, Hkv, Lk, Dv); query head h reads key/value head
h // (Hq // Hkv). Which keys row i of batch b sees is the AND of what is given:
- `mask`: a boolean array broadcastable to (B, Hq, Lq, Lk) (keep where True), or a float array
  added to the scaled scores (-inf drops a key);
- `causal`: keys j <= i + offset (offset = Lk - Lq puts the last query at the last key, as a
  model's KV cache does; 0 is torch's top-left `is_causal`);
- `window` > 0: keys j > i + offset - window (a sliding window of `window` keys, itself included);
- `ranges`: an int array (B or 1, 2), batch b's keys in [ranges[b, 0], ranges[b, 1]) (padding).
A row that sees no key (every score -inf) is 0, as torch's SDPA returns it (its math
backend's safe softmax, and its CPU kernel). The default scale is 1 / sqrt(D).
"""

import math

import numpy as np


def visible(B, Lq, Lk, causal=False, offset=0, window=0, ranges=None):
    """The (B, 1, Lq, Lk) boolean keys-seen pattern of causal / window / ranges."""
    i = np.arange(Lq)[:, None] + offset
    j = np.arange(Lk)[None, :]
    keep = np.ones((Lq, Lk), dtype=bool)
    if causal:
        keep &= j <= i
    if window:
        keep &= j > i - window
    keep = np.broadcast_to(keep, (B, 1, Lq, Lk))
    if ranges is not None:
        r = np.broadcast_to(np.asarray(ranges, dtype=np.int64), (B, 2))
        jj = np.arange(Lk)[None, :]
        inside = (jj >= r[:, :1]) & (jj < r[:, 1:])  # (B, Lk)
        keep = keep & inside[:, None, None, :]
    return keep


def masked_attention(q, k, v, mask=None, causal=False, offset=0, window=0, ranges=None, scale=None):
    """The attention output (B, Hq, Lq, Dv) in float64."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    seen = visible(B, Lq, Lk, causal, offset, window, ranges)
    bias = None
    if mask is not None:
        mask = np.broadcast_to(np.asarray(mask), (B, Hq, Lq, Lk))
        if mask.dtype == bool:
            seen = seen & mask
        else:
            bias = mask.astype(np.float64)
    out = np.zeros((B, Hq, Lq, v.shape[3]), dtype=np.float64)
    # One head at a time: a (Lq, Lk) score matrix, never (B, H, Lq, Lk) at once.
    for b in range(B):
        for h in range(Hq):
            kv = h // group
            s = (q[b, h] @ k[b, kv].T) * scale
            if bias is not None:
                s = s + bias[b, h]
            s = np.where(seen[b, 0 if seen.shape[1] == 1 else h], s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            live = np.isfinite(m)[:, 0]
            p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
            l = p.sum(axis=1, keepdims=True)
            out[b, h][live] = ((p @ v[b, kv]) / np.where(l > 0, l, 1.0))[live]
    return out

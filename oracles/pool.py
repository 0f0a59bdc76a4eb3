"""2-D max pooling with indices (torch.max_pool2d_with_indices), from its definition: each
output is the largest input in its window (padding never wins), its index the flat position
h * W + w of the first such input in row-major window order (a NaN wins, as in torch)."""

import numpy as np


def pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape."""
    span = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = span // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode: bool = False):
    x = np.asarray(x, dtype=np.float64)
    *lead, H, W = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    OH = pool_out_size(H, kh, sh, ph, dh, ceil_mode)
    OW = pool_out_size(W, kw, sw, pw, dw, ceil_mode)
    best = np.full((*lead, OH, OW), -np.inf)
    idx = np.full((*lead, OH, OW), -1, dtype=np.int64)
    oh = np.arange(OH)[:, None]
    ow = np.arange(OW)[None, :]
    for i in range(kh):
        for j in range(kw):
            h = oh * sh - ph + i * dh
            w = ow * sw - pw + j * dw
            ok = (h >= 0) & (h < H) & (w >= 0) & (w < W)
            v = np.where(ok, x[..., np.clip(h, 0, H - 1), np.clip(w, 0, W - 1)], -np.inf)
            take = ok & ((v > best) | np.isnan(v))
            best = np.where(take, v, best)
            idx = np.where(take, np.broadcast_to(h * W + w, take.shape), idx)
    return best, idx

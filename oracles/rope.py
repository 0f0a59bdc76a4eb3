"""Rotary position embedding in float64, from its definition (transformers'
apply_rotary_pos_emb for one tensor, unsqueeze_dim=1).

Inputs arrive as the exact values the kernel sees (already rounded to their dtype).
"""

import numpy as np


def rotate_half(x) -> np.ndarray:
    """The last dim's halves swapped, the new first half negated: (-x2, x1), with x1 the
    first D // 2 elements."""
    x = np.asarray(x, dtype=np.float64)
    h = x.shape[-1] // 2
    return np.concatenate((-x[..., h:], x[..., :h]), axis=-1)


def rotary(x, cos, sin) -> np.ndarray:
    """x * cos + rotate_half(x) * sin, x (B, H, S, D), cos and sin (B, S, D) broadcast over
    the heads."""
    x = np.asarray(x, dtype=np.float64)
    c = np.asarray(cos, dtype=np.float64)[:, None]
    s = np.asarray(sin, dtype=np.float64)[:, None]
    return x * c + rotate_half(x) * s

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


def cos_sin(position_ids, inv_freq, scaling: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """transformers' rotary embedding tables: angle = position * inv_freq, rounded to float32
    as the model computes it (the angle's rounding is part of the op: at position 4096 an
    ulp of the angle moves cos by ~5e-4), then cos and sin in float64 of that angle, each of
    the D / 2 frequencies twice (cat(freqs, freqs)), times scaling. Returns (cos, sin) of
    shape position_ids.shape + (D,)."""
    pos = np.asarray(position_ids).astype(np.float32)
    angle = (pos[..., None] * np.asarray(inv_freq, dtype=np.float32)).astype(np.float64)
    angle = np.concatenate((angle, angle), axis=-1)
    return np.cos(angle) * scaling, np.sin(angle) * scaling

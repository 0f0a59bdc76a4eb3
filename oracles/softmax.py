"""Softmax and log-softmax in float64, from their definitions (aten._softmax,
aten._safe_softmax, aten._log_softmax).

    softmax(x)_i     = exp(x_i - m) / sum_j exp(x_j - m),   m = max_j x_j
    log_softmax(x)_i = x_i - m - log(sum_j exp(x_j - m))

Subtracting the row maximum changes nothing mathematically and keeps exp() finite. A row
whose entries are all -inf has no maximum to subtract: softmax gives NaN there, as torch
does, and safe softmax gives 0.
"""

import numpy as np


def _shifted(x: np.ndarray, dim: int):
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=dim, keepdims=True)
    empty = np.isneginf(m)  # a row of -inf only
    m_safe = np.where(empty, 0.0, m)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = x - m_safe
        s = np.sum(np.exp(z), axis=dim, keepdims=True)
    return z, s, empty


def softmax(x: np.ndarray, dim: int) -> np.ndarray:
    """exp(x - max) / sum(exp(x - max)) along `dim`; NaN on a row of -inf only."""
    z, s, _ = _shifted(x, dim)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.exp(z) / s


def safe_softmax(x: np.ndarray, dim: int) -> np.ndarray:
    """softmax, except that a row whose entries are all -inf gives 0, not NaN."""
    z, s, empty = _shifted(x, dim)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.exp(z) / s
    return np.where(empty, 0.0, out)


def log_softmax(x: np.ndarray, dim: int) -> np.ndarray:
    """x - max - log(sum(exp(x - max))) along `dim`; -inf where x is -inf."""
    z, s, _ = _shifted(x, dim)
    with np.errstate(invalid="ignore", divide="ignore"):
        return z - np.log(s)

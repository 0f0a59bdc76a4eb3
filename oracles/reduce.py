"""Reductions in float64 (or exact int64), from their definitions (torch.sum, mean, amax, amin).

`dims` is a tuple of non-negative axes (empty: every axis). Integer results are computed
in int64 and then cast to the output dtype, which wraps exactly as torch's integer
arithmetic does (two's complement).
"""

import numpy as np


def _axes(x: np.ndarray, dims) -> tuple:
    return tuple(range(x.ndim)) if not dims else tuple(int(d) for d in dims)


def _is_int(dtype: str) -> bool:
    return dtype.startswith("int") or dtype.startswith("uint") or dtype == "bool"


def sum(x: np.ndarray, dims=(), keepdim: bool = False, out_dtype: str = "float64") -> np.ndarray:
    """sum over `dims` of x: integer outputs exactly (int64, then wrapped to out_dtype)."""
    axes = _axes(x, dims)
    if _is_int(out_dtype):
        acc = np.sum(np.asarray(x).astype(np.int64), axis=axes, keepdims=keepdim, dtype=np.int64)
        return np.asarray(acc).astype(np.dtype(out_dtype))
    return np.asarray(np.sum(np.asarray(x, dtype=np.float64), axis=axes, keepdims=keepdim))


def mean(x: np.ndarray, dims=(), keepdim: bool = False) -> np.ndarray:
    """sum over `dims` divided by the number of elements reduced."""
    axes = _axes(x, dims)
    count = 1
    for a in axes:
        count *= x.shape[a]
    return np.asarray(np.sum(np.asarray(x, dtype=np.float64), axis=axes, keepdims=keepdim) / count)


def amax(x: np.ndarray, dims=(), keepdim: bool = False) -> np.ndarray:
    """Largest element over `dims`; NaN if any reduced element is NaN."""
    return _extreme(np.max, x, dims, keepdim)


def amin(x: np.ndarray, dims=(), keepdim: bool = False) -> np.ndarray:
    """Smallest element over `dims`; NaN if any reduced element is NaN."""
    return _extreme(np.min, x, dims, keepdim)


def _extreme(pick, x: np.ndarray, dims, keepdim: bool) -> np.ndarray:
    """np.max or np.min over `dims`, integers in int64 and the rest in float64 (NaN wins)."""
    x = np.asarray(x)
    wide = np.int64 if np.issubdtype(x.dtype, np.integer) else np.float64
    return np.asarray(pick(x.astype(wide), axis=_axes(x, dims), keepdims=keepdim))

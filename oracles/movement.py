"""Data movement from its definition (torch's casts, clone/copy, cat, embedding, arange,
full/fill): exact. A cast's result is the input rounded to the target dtype (round to
nearest, ties to even), returned as the float64 (or integer) values of that dtype, so the
screen can ask the kernel for every bit.
"""

import numpy as np

FLOATS = ("float16", "bfloat16", "float32", "float64")


def round_bfloat16(x) -> np.ndarray:
    """float64 values rounded to bfloat16 (round to nearest even), returned as float64.

    Through float32 first: exact for every value that is already a float32 (all inputs the
    screen makes), and bfloat16's rounding of a float32 is the top 16 bits after adding
    0x7FFF plus the lowest kept bit."""
    f = np.asarray(x, dtype=np.float64).astype(np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.where(np.isnan(f), np.nan, out)


def cast(x, dtype: str) -> np.ndarray:
    """x converted to `dtype` as torch's `.to(dtype)` does: floats round to nearest even,
    integers and booleans convert exactly; floats to integers truncate toward zero. Half
types are reached through float32, as torch converts a double (identical for every input
that is already a float32)."""
    x = np.asarray(x)
    if dtype == "bfloat16":
        return round_bfloat16(x)
    if dtype == "float16":  # through float32, as c10::Half converts a double
        return x.astype(np.float32).astype(np.float16).astype(np.float64)
    if dtype in FLOATS:
        return x.astype(np.dtype(dtype)).astype(np.float64)
    if dtype == "bool":
        return x != 0
    if x.dtype.kind == "f":
        x = np.trunc(x)
    return x.astype(np.dtype(dtype))


def cat(tensors, dim: int) -> np.ndarray:
    """torch.cat: legacy 1-D empty tensors (shape (0,)) are skipped."""
    kept = [np.asarray(t) for t in tensors if not (np.ndim(t) == 1 and np.shape(t)[0] == 0)]
    return np.concatenate(kept, axis=dim)


def embedding(weight, indices) -> np.ndarray:
    """Rows of weight by index: out[..., :] = weight[indices[...], :]."""
    return np.asarray(weight)[np.asarray(indices).astype(np.int64)]


def arange(start: int, step: int, n: int) -> np.ndarray:
    """start, start + step, ... (n values), as exact integers."""
    return start + step * np.arange(n, dtype=np.int64)


def full(shape, value) -> np.ndarray:
    return np.full(tuple(shape), value, dtype=np.float64 if isinstance(value, float) else np.int64)

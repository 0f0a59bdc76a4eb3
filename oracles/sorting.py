"""Sorting and selection from the definition: a stable sort along the last axis, NaN the
largest value (as torch orders it), ties kept in index order; top-k is its first k."""

import numpy as np


def stable_order(x, descending: bool) -> np.ndarray:
    """Indices that sort each row of x (last axis) stably: NaN after every number ascending,
    before every number descending, equal values (and -0.0 with +0.0) in index order."""
    x = np.asarray(x)
    nan = np.isnan(x) if x.dtype.kind == "f" else np.zeros(x.shape, bool)
    filled = np.where(nan, 0, x)
    idx = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
    if descending:
        # numbers largest first; -x of an integer sample is exact (no INT64_MIN in a screen)
        keys = (idx, -filled, ~nan)
    else:
        keys = (idx, filled, nan)
    return np.lexsort(keys, axis=-1).astype(np.int64)


def topk(x, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """(values, indices) of the k first entries of each row's stable order."""
    order = stable_order(x, largest)[..., :k]
    return np.take_along_axis(np.asarray(x), order, axis=-1), order

"""fp64 oracle of eager attention's score chain (kernels/score_softmax.py)."""

from __future__ import annotations

import numpy as np

from nbx_tune.oracles.softmax import softmax


def score_softmax(scores, scaling: float, softcap: float | None, mask) -> np.ndarray:
    """softmax(softcap(scores * scaling) + mask) over the last dim; softcap(w) = tanh(w / c) * c."""
    w = np.asarray(scores, dtype=np.float64) * scaling
    if softcap is not None:
        w = np.tanh(w / softcap) * softcap
    if mask is not None:
        w = w + np.asarray(mask, dtype=np.float64)
    return softmax(w, -1)

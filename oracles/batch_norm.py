"""Batch normalization in inference (torch.batch_norm with training=False) in float64:
y = (x - running_mean[c]) / sqrt(running_var[c] + eps) * weight[c] + bias[c], channels on
dim 1."""

import numpy as np


def batch_norm_inference(x, running_mean, running_var, weight=None, bias=None, eps: float = 1e-5):
    x = np.asarray(x, dtype=np.float64)
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    c = lambda v: np.asarray(v, dtype=np.float64).reshape(shape)  # noqa: E731
    y = (x - c(running_mean)) / np.sqrt(c(running_var) + eps)
    if weight is not None:
        y = y * c(weight)
    if bias is not None:
        y = y + c(bias)
    return y

"""Matrix products in float64, from their definitions (torch.mm / addmm / bmm / baddbmm).

Inputs already in float64 are used as they are (np.asarray; astype always copies, a
large cost at GEMM sizes); the products are `products.matmul`'s."""

import numpy as np

from nbx_tune.oracles.products import matmul as _matmul


def mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(M, K) @ (K, N): out[i, j] = sum_k a[i, k] * b[k, j]."""
    return _matmul(a, b)


def bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(B, M, K) @ (B, K, N), one product per batch entry."""
    return _matmul(a, b)


def addmm(bias: np.ndarray, a: np.ndarray, b: np.ndarray, alpha: float = 1.0,
          beta: float = 1.0) -> np.ndarray:
    """beta * bias + alpha * (a @ b), bias broadcast to the product's shape.

    As in torch, beta == 0 ignores `bias` entirely (NaN in it does not propagate)."""
    prod = alpha * _matmul(a, b)
    if beta == 0:
        return prod
    return beta * np.broadcast_to(np.asarray(bias, np.float64), prod.shape) + prod


baddbmm = addmm

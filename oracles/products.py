"""The oracles' matrix products in float64: numpy's, or for the large ones a faster float64
product a caller hands in (the screen hands the GPU's: an LM head's fp64 product in numpy
was most of a re-certification's time, docs/benchmarks.md).

A handed product is trusted only as far as it checks (Freivalds' test): for two seeded
random vectors x, out @ x must equal a @ (b @ x), computed in numpy, to CHECK_RTOL of
|a| @ (|b| @ |x|), the scale of the sums' terms (far above fp64 rounding over any K, far
below any screen tolerance). One wrong element anywhere moves out @ x, at the cost of a
few matrix-vector products. Where the test fails, or the product cannot run (out of
memory), numpy's product is used. Either way the oracle is the definition's float64
product, summed in some order.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Products of fewer flops, or of fewer flops per operand element (a decode step's skinny
# GEMM), are numpy's: moving their operands and checking the product would cost more than
# numpy's own product.
LARGE_FLOPS = 1 << 30
MIN_INTENSITY = 128
CHECK_RTOL = 1e-9
CHUNK_ROWS = 512
MAX_THREADS = 8  # the check's passes over the operands, in row blocks: memory-bound past a few cores

_fast = None  # (a, b) -> ndarray | None, set by `faster`


@contextlib.contextmanager
def faster(product):
    """Within the block, large products go to `product(a, b)` (float64 arrays, numpy's
    matmul broadcasting), which returns their float64 product or None where it cannot."""
    global _fast
    before, _fast = _fast, product
    try:
        yield
    finally:
        _fast = before


def matmul(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if _fast is None or a.ndim < 2 or b.ndim < 2 or _flops(a, b) < LARGE_FLOPS \
            or _flops(a, b) < MIN_INTENSITY * (a.size + b.size):
        return np.matmul(a, b)
    # The check's side that needs no product runs beside the handed product (numpy's
    # matrix-vector products and the upload, product and download all release the GIL).
    with ThreadPoolExecutor(1) as pool:
        expected = pool.submit(_expected, a, b)
        out = _fast(a, b)
        want, bound = expected.result()
    if out is None or out.shape != np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]) \
            or not _agrees(out, want, bound):
        return np.matmul(a, b)
    return out


def _flops(a: np.ndarray, b: np.ndarray) -> int:
    batch = int(np.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), dtype=np.int64))
    return 2 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


def _check_vectors(n: int) -> np.ndarray:
    return np.random.default_rng(0x0DD5EED).uniform(-1.0, 1.0, (n, 2))


def _expected(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a @ (b @ x), |a| @ (|b| @ |x|)) for the check's vectors x, a block of rows at a time
    on threads (numpy's abs runs on one core; its products and abs release the GIL). Faster
    than one thread where the process's thread pools do not spin, as in the census's worker
    (tuner/execution/isolation.py); lab/certify_cost/NOTES.md has both cases measured."""
    x = _check_vectors(b.shape[-1])
    bx, abs_bx = _rows_times(b, x)
    return _rows_times(a, bx, abs_bx)


def _rows_times(m: np.ndarray, v: np.ndarray, abs_v: np.ndarray | None = None):
    """(m @ v, |m| @ |v|), or |m| @ abs_v where given. |block| is written into one buffer a
    thread, reused block after block: |m| whole would be a copy of m, and a fresh |block|
    each time pays its page faults again."""
    abs_v = np.abs(v) if abs_v is None else abs_v
    shape = np.broadcast_shapes(m.shape[:-2], v.shape[:-2]) + (m.shape[-2], v.shape[-1])
    out, abs_out = np.empty(shape), np.empty(shape)
    starts = range(0, m.shape[-2], CHUNK_ROWS)
    threads = max(1, min(MAX_THREADS, cores(), len(starts)))

    def run(t: int) -> None:
        buf = np.empty(m[..., :CHUNK_ROWS, :].shape)
        for k in starts[t::threads]:
            block = m[..., k:k + CHUNK_ROWS, :]
            out[..., k:k + CHUNK_ROWS, :] = np.matmul(block, v)
            abs_block = np.abs(block, out=buf[..., :block.shape[-2], :])
            abs_out[..., k:k + CHUNK_ROWS, :] = np.matmul(abs_block, abs_v)

    if threads == 1:
        run(0)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, range(threads)))
    return out, abs_out


def cores() -> int:
    """The CPU cores this process may run on (the screen's draws size their threads by it too)."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; macOS has only cpu_count
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def _agrees(out: np.ndarray, want: np.ndarray, bound: np.ndarray) -> bool:
    """Freivalds' test: out @ x against a @ (b @ x), to CHECK_RTOL of the terms' scale."""
    got = np.matmul(out, _check_vectors(out.shape[-1]))
    if not (np.isfinite(want).all() and np.isfinite(got).all()):
        return False
    return bool(np.all(np.abs(got - want) <= CHECK_RTOL * bound))

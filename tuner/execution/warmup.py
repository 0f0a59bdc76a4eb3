"""What a candidate worker does on a GPU while it waits for its first seat: the one-time
costs of the first seat's inputs, oracles, screens and timings, paid ahead.

A census's first seat took seconds longer to prepare than a larger one after it
(docs/benchmarks.md, Tuning cost): the device context, cuBLAS loaded for the oracle's
float64 product, each of torch's kernels the screen's judgement runs loaded on first use,
the timer's sleep calibrated and its flush buffer allocated, a first CUDA graph captured.
The worker starts before its parent has imported torch (tuner/commands.py), so this runs on a
thread beside the worker's own imports of Triton and the kernels, and the worker waits for
it before the first seat: nothing here is timed against a candidate.
"""

from __future__ import annotations

import threading


def start(triton_imported: threading.Event, device: str = "cuda") -> threading.Thread | None:
    """Warm the device on a thread (None where there is no GPU), and Triton's driver once
    the caller sets `triton_imported`; join it before the first seat."""
    import torch

    if not torch.cuda.is_available():
        return None
    thread = threading.Thread(target=_warm, args=(triton_imported, device), name="nbx-warm-up", daemon=True)
    thread.start()
    return thread


def _warm(triton_imported: threading.Event, device: str) -> None:
    try:
        run(device)
        # Triton's driver module (a C compile on a cold cache) loads on the first launch;
        # touched here only once the worker's own import of Triton is done.
        if triton_imported.wait(timeout=60):
            import triton

            triton.runtime.driver.active.utils  # noqa: B018
    except Exception:  # a warm-up that fails costs only the time it saved: the seat redoes it
        pass


def run(device: str = "cuda") -> None:
    """The first seat's one-time steps, on small tensors."""
    import numpy as np
    import torch

    from nbx_tune.tuner.timing import benchmarkers as timing

    torch.cuda.init()
    a = torch.rand(64, 64, dtype=torch.float64, device=device)
    # The oracle's product and what judges an output against it (tuner/certify/screen.py).
    ref = torch.matmul(a, a)
    got = ref.to(torch.float32).to(torch.float64)
    finite = torch.isfinite(got)
    float(((got - ref).abs()[finite]).max())
    int((got.view(torch.int64) == 0).sum())
    torch.empty(64, dtype=torch.bfloat16, device=device).view(torch.int16).fill_(1)
    # The host side of a case: a draw, rounding, widening, a move and a copy back.
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(4096)).to(torch.bfloat16)
    x.to(torch.float64).numpy()
    x.to(device).clone().cpu()
    # The timer: its sleep calibrated, its flush buffer, events and a graph captured.
    timing.gpu_time(lambda: a.add_(0), 1.0, 1.0)
    timing.stream_time([lambda: a.add_(0)], 1.0, 1.0)
    torch.cuda.synchronize()

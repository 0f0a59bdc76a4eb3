"""Compile a seat's candidates in parallel on the CPU cores, ahead of the worker that
screens and times them.

Triton compiles a config on its first launch, one at a time, while the GPU waits: for a
GEMM config space that is most of a seat's tuning time. Here a pool of processes runs each
candidate's launcher with Triton's launches turned into warm-ups (compile, do not launch),
on empty tensors of the seat's shapes, so every specialization the worker will need is
already in Triton's on-disk cache when it gets there. A compile that crashes or fails here
costs nothing: the worker compiles that config itself and the tuner refuses it there, with
the error text. Nothing compiled here is trusted for anything but speed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor


def _compile_only():
    """Make every `kernel[grid](...)` in this process compile without launching."""
    from triton.runtime.jit import JITFunction

    def getitem(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=True, **kwargs)

    JITFunction.__getitem__ = getitem


def _init(plugins):
    _compile_only()
    from nbx_tune.kernels.registry import load_plugin

    for p in plugins:
        load_plugin(p)


def _compile(kernel: str, problems, config, device: str) -> str | None:
    import torch

    from nbx_tune.kernels.registry import get_spec
    from nbx_tune.tuner.screen import TORCH_DTYPES

    spec = get_spec(kernel)
    try:
        for p in problems:
            inputs = {n: torch.empty(s, dtype=TORCH_DTYPES[d], device=device)
                      for n, (s, d) in spec.input_shapes(p).items()}
            outputs = {n: torch.empty(s, dtype=TORCH_DTYPES[d], device=device)
                       for n, (s, d) in spec.output_specs(p).items()}
            spec.launch(config, p, inputs, outputs)
    except Exception as e:  # the worker meets it again and refuses the config there
        return f"{type(e).__name__}: {e}"
    return None


def _ready() -> None:
    pass


class Precompiler:
    """A pool that compiles configs ahead of the worker; one per census."""

    def __init__(self, plugins, workers: int | None = None):
        n = workers or max(1, min(16, (os.cpu_count() or 2) - 1))
        self.pool = ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"), initializer=_init,
                                        initargs=(plugins,))
        # A spawned process takes seconds to import torch and Triton: start them all now,
        # while the census plans, rather than on the first seat's submissions.
        for _ in range(n):
            self.pool.submit(_ready)
        self.futures = []

    def submit(self, kernel: str, problems, configs, device: str) -> None:
        self.futures = [self.pool.submit(_compile, kernel, tuple(problems), c, device) for c in configs]

    def close(self) -> None:
        for f in self.futures:
            f.cancel()
        self.pool.shutdown(wait=False, cancel_futures=True)

"""What the compile pool's processes need before their first job, imported once by the pool's
fork server (tuner/precompile.py): torch, Triton, the built-in kernels and Triton's cache key
(a hash of Triton's own files, half a second a process). Each process forked from it starts
with them in memory, instead of 15 processes importing torch at once beside the census's own
import. Nothing here may initialize a GPU: a process forked after that cannot use it."""

try:
    import torch  # noqa: F401
    import triton  # noqa: F401

    from nbx_tune.kernels.registry import all_specs

    all_specs()
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        from triton.compiler.compiler import triton_key
    triton_key()
except Exception:  # each process then imports what it needs itself (precompile._init)
    pass

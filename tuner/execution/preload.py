"""What the compile pool's processes need before their first job, imported once by the pool's
fork server (tuner/execution/precompile.py): torch, Triton, the built-in kernels and Triton's cache key
(a hash of Triton's own files, half a second a process). Each process forked from it starts
with them in memory, instead of 15 processes importing torch at once beside the census's own
import. Nothing here may initialize a GPU: a process forked after that cannot use it."""

import os
import sys


def _in_fork_server() -> bool:
    """Whether this import is the fork server's preload (its main() is on the stack), not a
    test's or a user's."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "main" and f.f_code.co_filename.endswith(os.path.join("multiprocessing",
                                                                                   "forkserver.py")):
            return True
        f = f.f_back
    return False


if _in_fork_server():
    # The server and the processes forked from it print nothing anyone reads (a compile that
    # fails is the worker's to report), and the server's own interpreter shut-down (torch
    # loaded) comes after the census has exited: holding the census's stdout and stderr, it
    # kept whatever reads them (`nbx-tune census --json | jq`, a bench) waiting that long.
    _null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(_null, 1)
    os.dup2(_null, 2)
    os.close(_null)

try:
    import torch  # noqa: F401
    import triton  # noqa: F401

    from nbx_tune.kernels.runtime.registry import all_specs

    all_specs()
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        from triton.compiler.compiler import triton_key
    triton_key()
except Exception:  # each process then imports what it needs itself (precompile._init)
    pass

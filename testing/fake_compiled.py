"""A stand-in for Triton's compiled kernels, so that the direct launch (kernels/runtime/launch.py) runs
on the CPU.

The interpreter compiles nothing. `FakeTriton` takes the place of `launch.through_triton`:
it launches the real kernel through the interpreter, logs "triton", and returns a fake
compiled kernel that remembers what Triton would have compiled for (each argument's
specialization, runtime/jit.py's `specialize_impl`). Called by a replay, the fake refuses
arguments Triton would have compiled differently (an integer's value 1, divisibility by 16
or 32-bit range; a pointer's 16-byte alignment; anything else that changed), logs
"direct", and runs the real kernel through the interpreter on the addresses the replay
passed, so a wrong address or argument order shows in the result.
"""

import ctypes

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from nbx_tune.kernels.runtime import launch


def specialization(v):
    if isinstance(v, torch.Tensor):
        return ("ptr", v.dtype, v.data_ptr() % 16 == 0)
    if isinstance(v, (bool, str)) or v is None:
        return v
    if isinstance(v, int):
        return ("int", v == 1, v % 16 == 0, -2**31 <= v < 2**31)
    if isinstance(v, float):
        return "fp32"
    if launch._is_constant(v):  # a dtype constexpr (scan's ACC): compiled for its value
        return ("const", str(v))
    if isinstance(v, TensorDescriptor):  # compiled for its dtype and box
        return ("desc", v.base.dtype, tuple(v.block_shape), len(v.shape))
    raise TypeError(type(v))


def _extent(t) -> int:
    """Bytes from t's address to the end of its storage: what a kernel may touch."""
    return t.untyped_storage().nbytes() - (t.data_ptr() - t.untyped_storage().data_ptr())


class FakeCompiled:
    function, packed_metadata = "function", "metadata"  # what a lean replay passes back to run

    def __init__(self, kernel, bound, options, log):
        self.kernel, self.options, self.log = kernel, options, log
        self.spec = [specialization(v) for v in bound]
        self.pointers = {i: (v.dtype, _extent(v)) for i, v in enumerate(bound) if isinstance(v, torch.Tensor)}

    def __getitem__(self, grid):
        # Triton's launcher reads grid[0], grid[1] and grid[2] (an IndexError on 3.6 otherwise).
        assert len(grid) == 3, grid

        def runner(*args):
            assert len(args) == len(self.spec), "a replay passed another number of arguments"
            real = []
            for i, v in enumerate(args):
                if i in self.pointers and isinstance(v, int):  # an address, as replays pass them
                    assert v % 16 == 0 if self.spec[i][2] else v % 16 != 0, \
                        f"argument {i}: compiled for another alignment"
                    dtype, nbytes = self.pointers[i]
                    v = torch.frombuffer((ctypes.c_char * nbytes).from_address(v), dtype=dtype)
                assert specialization(v) == self.spec[i], \
                    f"argument {i}: {specialization(v)} where Triton compiled for {self.spec[i]}"
                real.append(v)
            self.log.append("direct")
            self.kernel[grid](*real, **self.options)
        return runner


    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter_hook, exit_hook, *args):
        """The compiled launcher, as a lean replay calls it (launch._lean_launcher)."""
        assert (stream, function, metadata) == ("stream", self.function, self.packed_metadata)
        assert (launch_metadata, enter_hook, exit_hook) == (None, None, None)
        self.log.append("lean")
        self[(g0, g1, g2)](*args)


def lean_launcher(compiled):
    """launch._lean_launcher for FakeCompiled kernels: their run, on a stream called "stream"."""
    from types import SimpleNamespace

    hooks = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    return (compiled.run, compiled.function, compiled.packed_metadata, hooks, lambda device: "stream", lambda: 0)


class FakeTriton:
    """launch.through_triton, handing out FakeCompiled kernels; `log` says which path ran."""

    def __init__(self):
        self.log = []

    def __call__(self, kernel, grid, args, kwargs):
        self.log.append("triton")
        kernel[grid](*args, **kwargs)
        bound = launch._bound(kernel, args, kwargs)
        options = {k: v for k, v in kwargs.items() if k not in launch._signatures[kernel].parameters}
        return FakeCompiled(kernel, bound, options, self.log)

    def clear(self):
        self.log.clear()

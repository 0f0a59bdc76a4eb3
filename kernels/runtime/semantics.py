"""Checks a served op runs before its launch where torch checks: torch's refusals stay torch's.

Each raises `KernelError`, so serve() hands the call to torch (counted with the reason),
and torch raises its own error type and message (or computes what it computes where the
check is conservative). They sit in the public op before the replay lookup
(kernels/runtime/launch.py), so a remembered call runs them too.

- `check_writable`: an in-place op's or copy_'s output must not overlap itself (an
  expanded tensor; where torch cannot tell, as for a strided slice such as a KV cache's
  slot, the strides decide: disjoint served, else handed to torch) nor any input partially: the result would depend on the write order,
  and torch refuses it ("unsupported operation: some elements of the input tensor and the
  written-to tensor refer to a single memory location"). An input that is the output
  itself (`a.add_(a)`) is allowed, as torch allows it.
- `check_indices`: an index outside [-0, n) (embedding) would read outside the table.
  On the CPU (the interpreter) a host check: torch raises IndexError. On a GPU a host check
  would sync the host every call; the launch instead queues `torch._assert_async` on the
  device, as torch's CUDA embedding asserts on the device (a bad index there poisons the
  context in either case), at the cost of a few small launches and no sync.
"""

from __future__ import annotations

import torch

from nbx_tune.errors import KernelError


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    lo = hi = t.data_ptr()
    for size, stride in zip(t.shape, t.stride()):
        if stride >= 0:
            hi += (size - 1) * stride * t.element_size()
        else:
            lo += (size - 1) * stride * t.element_size()
    return lo, hi + t.element_size()


def _strides_disjoint(t: torch.Tensor) -> bool:
    """No two indices of `t` reach one element: each dim's stride (smallest first) steps
    past everything the smaller dims reach. Sufficient, not necessary: False is "maybe"."""
    reach = 0
    for stride, size in sorted((abs(st), sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() \
        and a.dtype == b.dtype


def check_writable(what: str, out: torch.Tensor, *inputs) -> None:
    """Raise KernelError where writing `out` from `inputs` may overlap (module docstring)."""
    if out.numel() == 0:
        return
    overlap = torch._debug_has_internal_overlap(out)  # 0: no, 1: overlaps, 2: too hard to tell
    if overlap == 1:
        raise KernelError(f"{what}: the written-to tensor overlaps itself (torch refuses it)")
    if overlap == 2 and not _strides_disjoint(out):
        raise KernelError(f"{what}: the written-to tensor may overlap itself (torch's write order decides)")
    storage = out.untyped_storage().data_ptr()
    lo, hi = _byte_range(out)
    for t in inputs:
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device != out.device:
            continue
        if t.untyped_storage().data_ptr() != storage or _same_view(t, out):
            continue
        t_lo, t_hi = _byte_range(t)
        if t_lo < hi and lo < t_hi:
            raise KernelError(f"{what}: an input overlaps the written-to tensor (torch refuses it)")


def check_indices(what: str, indices: torch.Tensor, n: int, negative: bool = False) -> None:
    """Every index in [0, n) ([-n, n) with `negative`: advanced indexing counts from the
    end): on the CPU checked here (KernelError, so torch raises its own error), on a GPU
    asserted on the device without a host sync."""
    if indices.numel() == 0:
        return
    low = -n if negative else 0
    if indices.device.type == "cpu":
        lo, hi = torch.aminmax(indices)
        if int(lo) < low or int(hi) >= n:
            raise KernelError(f"{what}: an index out of range [{low}, {n}) (torch raises)")
    else:
        torch._assert_async(((indices >= low) & (indices < n)).all(),
                            f"{what}: index out of range in self")

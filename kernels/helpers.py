"""What the kernel families share on the host: the one map from a dtype's name (as traces
and seats write it) to torch's dtype, and the strides of a contiguous tensor."""

from __future__ import annotations

import torch

# Every dtype a trace may name; a family takes the ones it serves (`torch_dtypes`).
DTYPES = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
    "float64": torch.float64, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
FLOATS = ("float16", "bfloat16", "float32")  # the floating dtypes the kernels compute in


def torch_dtypes(*names: str) -> dict[str, torch.dtype]:
    """name -> torch dtype for `names`, in that order."""
    return {n: DTYPES[n] for n in names}


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(tuple(shape)):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))

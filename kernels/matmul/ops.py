"""The matmul public ops (mm, addmm, bmm, baddbmm on torch tensors) and their serve() routes.
"""

from __future__ import annotations

import torch

from nbx_tune.errors import KernelError
from nbx_tune.kernels.matmul.kernel import alignment, launch_matmul
from nbx_tune.kernels.matmul.spec import LAYOUTS, SPEC, TORCH_DTYPES, matmul_flags
from nbx_tune.kernels.runtime import launch
from nbx_tune.kernels.runtime.certified import config_for


# ----------------------------------------------------------------------------- public ops

REMEMBERED, tensor_key = launch.REMEMBERED, launch.tensor_key
_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def operand_major(t) -> str:
    """`t` for a matrix stored transposed (column-major: a linear layer's W.t()), else `n`:
    the letter of each operand in a row's `layout` and a seat's flag."""
    if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.size(-1) > 1 and t.stride(-1) != 1 \
            and (t.stride(-2) == 1 or t.size(-2) == 1):
        return "t"
    return "n"


_FLAGS = {(bias, aligned, layout): matmul_flags(bias, aligned, layout)
          for bias in (0, 1) for aligned in (0, 4, 8, 16) for layout in LAYOUTS}


def _run(a, b, bias, alpha, beta, rank):
    # The direct launch (kernels/runtime/launch.py): a call whose key was seen replays its compiled
    # kernel. alpha and beta are in the key, so a replay passes them as they were.
    try:
        key = (SPEC, rank, float(alpha), float(beta), a.shape, a.stride(), a.dtype, a.device, a.data_ptr() & 15,
               b.shape, b.stride(), b.dtype, b.device, b.data_ptr() & 15,
               None if bias is None else tensor_key(bias))
    except AttributeError:  # not tensors: the checks below say so
        return _matmul(a, b, bias, alpha, beta, rank)
    hit = REMEMBERED.get(key)
    if hit is not None:
        return hit(a, b, bias)
    return launch.remember(key, (a, b, bias), _matmul, a, b, bias, alpha, beta, rank)


def _matmul(a, b, bias, alpha, beta, rank):
    ash, bsh = tuple(a.shape), tuple(b.shape)
    if len(ash) != rank or len(bsh) != rank:
        raise KernelError(f"matmul: expected rank-{rank} operands, got {ash} and {bsh}")
    if ash[-1] != bsh[-2] or (rank == 3 and ash[0] != bsh[0]):
        raise KernelError(f"matmul: shapes {ash} and {bsh} do not multiply")
    dt = a.dtype
    for t in (b, bias):
        if t is not None and t.dtype != dt:
            raise KernelError(f"matmul: mixed dtypes {dt} and {t.dtype}")
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        raise KernelError(f"matmul: dtype {dt} is not served (float16, bfloat16, float32)")
    M, K, N = ash[-2], ash[-1], bsh[-1]
    has_bias = bias is not None and beta != 0
    out_shape = (*ash[:-1], N)
    c = launch.empty(out_shape, dt, a.device)
    if M == 0 or N == 0 or K == 0 or (rank == 3 and ash[0] == 0):
        return c.zero_() if not has_bias else c.copy_(beta * bias.expand(out_shape))
    # Triton passes a Python int as an integer and specializes on its value (1 becomes a
    # constant), so alpha=1 and alpha=2 would need two compiled kernels; floats never do.
    alpha, beta = float(alpha), float(beta)
    dims = (ash[0] if rank == 3 else 1, M, N, K)
    aligned = alignment(a.stride(), b.stride(), N, K, 16 // a.element_size())
    flags = _FLAGS[int(has_bias), aligned, operand_major(a) + operand_major(b)]
    config = config_for(SPEC, (name,), flags, dims)
    x = bias.expand(out_shape) if has_bias else None
    # A TMA descriptor of a copy (an operand off 16 bytes, or staged at aligned=0) is not
    # remembered: a replay rebuilds descriptors around inputs only (kernels/runtime/launch.py).
    launch_matmul(a, b, c, x, alpha, beta, config)
    return c


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D a (M, K), b (K, N), with the certified config of its seat."""
    return _run(a, b, None, 1.0, 0.0, 2)


def addmm(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: float = 1.0,
          alpha: float = 1.0) -> torch.Tensor:
    """beta * input + alpha * (mat1 @ mat2), input broadcast to (M, N)."""
    return _run(mat1, mat2, input, alpha, beta, 2)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched a @ b for a (B, M, K), b (B, K, N)."""
    return _run(a, b, None, 1.0, 0.0, 3)


def baddbmm(input: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *,
            beta: float = 1.0, alpha: float = 1.0) -> torch.Tensor:
    """beta * input + alpha * (batch1 @ batch2), input broadcast to (B, M, N)."""
    return _run(batch1, batch2, input, alpha, beta, 3)

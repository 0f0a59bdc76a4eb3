"""The public op `nbx_tune.moe_experts` (a mixture-of-experts layer's routed experts) and its
serve() route.
"""

from __future__ import annotations

import torch

from nbx_tune.errors import KernelError
from nbx_tune.kernels.copy import dense
from nbx_tune.kernels.moe.kernel import launch_moe
from nbx_tune.kernels.moe.spec import EMPTY, FLAGS, SPEC, TORCH_DTYPES, moe_problem
from nbx_tune.kernels.runtime.certified import config_for
from nbx_tune.kernels.spec import NotServable
from nbx_tune.kernels.serving import custom_ops  # noqa: F401  (defines the torch op serve_ops names)

_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_IDS = (torch.int64, torch.int32)


def moe_experts(hidden: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
    """sum over j of topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = topk_ids[t, j],
    as transformers' experts modules compute it: hidden (T, H), w_gate_up (E, 2I, H) with the
    gate's rows first, w_down (E, H, I), the routing (T, K). An id outside [0, E) adds nothing.
    Returns (T, H) in hidden's dtype."""
    tensors = (hidden, w_gate_up, w_down, topk_ids, topk_weights)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise KernelError("moe_experts: hidden, w_gate_up, w_down, topk_ids and topk_weights must be tensors")
    dt = _NAMES.get(hidden.dtype)
    if dt is None or w_gate_up.dtype != hidden.dtype or w_down.dtype != hidden.dtype:
        raise KernelError(f"moe_experts: dtypes {hidden.dtype}, {w_gate_up.dtype}, {w_down.dtype}: one of "
                          "float16, bfloat16, float32 for hidden and both weights expected")
    if topk_ids.dtype not in _IDS or _NAMES.get(topk_weights.dtype) is None:
        raise KernelError(f"moe_experts: routing {topk_ids.dtype} ids and {topk_weights.dtype} weights: "
                          "int64/int32 ids and float weights expected")
    if len({t.device for t in tensors}) != 1:
        raise KernelError(f"moe_experts: tensors on {', '.join(sorted({str(t.device) for t in tensors}))}")
    problem = moe_problem(*(tuple(t.shape) for t in tensors), (dt, dt), _NAMES[topk_weights.dtype])
    if problem is EMPTY:  # no token, no expert or no slot: a sum of nothing
        return torch.zeros_like(hidden)
    if isinstance(problem, NotServable):
        raise KernelError(f"moe_experts: {problem.reason}")
    out = torch.empty_like(hidden, memory_format=torch.contiguous_format)
    config = config_for(SPEC, problem.dtypes, FLAGS, problem.dims)
    launch_moe(dense(hidden), dense(w_gate_up), dense(w_down), dense(topk_ids), dense(topk_weights), out, config)
    return out

"""Mixture-of-experts layers: the routed experts' grouped GEMMs (`nbx_tune.moe_experts`), in
fp16, bf16 and fp32 (the interpreter's tests).

The (token, slot) pairs are sorted by expert and padded per expert to the row block, so one
launch multiplies every expert's rows: gate and up projections in one kernel with SwiGLU in
its epilogue, then the down projection with the routing weights, then each token's top-k sum.

The family is three modules: `kernel.py` (the Triton kernels and their launcher), `spec.py`
(the `KernelSpec`) and `ops.py` (the public op, which serve() routes to).
"""

from nbx_tune.kernels.moe.spec import CONFIGS, OP, SPEC, SPECS, moe_row, skewed_routing
from nbx_tune.kernels.moe.ops import moe_experts

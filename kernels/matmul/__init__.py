"""Matrix products: aten.mm, aten.addmm, aten.bmm, aten.baddbmm in fp16, bf16 and fp32.

One tiled GEMM serves all four: a batch axis (1 for mm/addmm) and an optional bias added
as `beta * bias + alpha * (A @ B)`, the bias broadcast through zero strides. Programs are
ordered in groups of GROUP_M row-blocks so neighbouring programs share B tiles in L2.
fp32 inputs multiply in IEEE fp32 (as torch.mm does by default), not TF32.

The family is three modules: `kernel.py` (the Triton kernels and their launchers), `spec.py`
(the `KernelSpec`) and `ops.py` (the public ops, which serve() routes to). The names other
modules use are re-exported here.
"""

from nbx_tune.kernels.matmul.kernel import (_matmul_kernel, _tma_copy, alignment, extra_columns, grouped_tile,
                                            launch_matmul, matmul_args, rows_aligned, schedule, split_k, stage_operands,
                                            tma_descriptors, tma_ready, uses_tma, vector_elems)
from nbx_tune.kernels.matmul.spec import CONFIGS, SPEC, TORCH_DTYPES, _c, _operands
from nbx_tune.kernels.matmul.ops import _FLAGS, _matmul, addmm, baddbmm, bmm, mm, operand_major

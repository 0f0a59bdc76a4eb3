"""Masked attention forward: softmax(scale * Q K^T + mask) V over the keys each query row sees.

What a row sees is the AND of a mask tensor (boolean, or an additive float bias; any broadcast
over batch and heads), and of a pattern the kernel computes instead of reading: causal (aligned
bottom-right, the last query at the last key, as with a KV cache), a sliding window (keys within
`window` of the query's position), and per-sequence key ranges (a padded batch, left or right).
Each row's keys form an interval [lo, hi) under the pattern, so a program (BLOCK_M query rows of
one key/value head) walks only the key blocks some row of it sees, and the blocks every row sees
in full run without masks; a mask tensor is read inside that range only.

Under serve(), `aten.scaled_dot_product_attention` with an attn_mask comes here (the attention
family serves it without one): a mask that equals such a pattern exactly (`pattern.py`, checked
once per mask tensor) is not read at all; any other is. A row that sees no key is 0, as torch
returns it. Grouped-query attention: the query heads of a key/value head are packed in a
program's rows where the queries are few (decode), which splits the keys SPLIT ways.

The family: `kernel.py` (the Triton kernels and their launcher), `spec.py` (the `KernelSpec`),
`ops.py` (the public op and the serve() route), `pattern.py` (mask recognition).
"""

from nbx_tune.kernels.masked_attention.kernel import launch_masked_attention
from nbx_tune.kernels.masked_attention.spec import CONFIGS, DEFAULTS, OP, SPEC
from nbx_tune.kernels.masked_attention.ops import masked_attention, serve_masked_sdpa

"""Attention forward: softmax(scale * Q K^T [+ causal mask]) V, flash-attention style.

Serves the op the recorder writes for `F.scaled_dot_product_attention`
(`aten.scaled_dot_product_attention`, recorded whole before the device picks a backend) and
the three backend ops PyTorch's dispatcher records under it:
`aten._scaled_dot_product_flash_attention` (CUDA), `aten._scaled_dot_product_efficient_attention`
(CUDA) and `aten._scaled_dot_product_flash_attention_for_cpu`.

One program owns BLOCK_M query rows of one (batch, query head) and walks the keys in blocks of
BLOCK_N with an online softmax in fp32 (running max m, running sum l, the output accumulator
rescaled by exp(m_old - m_new)); the scores are kept in base 2 (scale * log2(e) folded into one
multiplier) so the exponentials are exp2. The head dims D (queries, keys) and Dv (values) are
loaded in power-of-two blocks with masking, so D = 24, 80, 96 ... run in blocks of 32, 128, 128.
Grouped-query attention: query head h reads key/value head h // (Hq // Hkv).

Causal masking is torch's: the lower triangle aligned to the TOP-LEFT of the (Lq, Lk) score
matrix (query i sees keys j <= i), so a causal program stops at key min(Lk, row_end); every row
sees key 0, so no row is ever fully masked (also for Lq > Lk). Key blocks every row of the
program sees in full run without masks; the rest (the causal diagonal and the ragged key tail)
run masked.

Prefill configs may switch on the levers of Triton's fused-attention tutorial (constexprs,
certified only where they win): FMA (the scale folded into the exponent's subtraction), TMA
(K/V through tensor descriptors), WS (the unmasked loop warp-specialized), LPT (every
head's longest causal query block first) and PAIR (a long and a short causal query block per
program). Decode configs (SPLIT_KV) have none of them.

fp32 inputs multiply in IEEE fp32 (input_precision="ieee": both QK^T and PV), fp16/bf16 with
the default (tensor cores, fp32 accumulation), P cast to the input dtype before PV.

The kernel always writes the logsumexp (natural log of the row sums of exp of the scaled
scores, fp32): the ops that return it get it, the others pass a scratch row, so every op runs
the one code path a certificate was screened on. Rows [Lq, LSE_LEN) of the logsumexp get +inf,
the padding of the memory-efficient kernel's (B, H, ceil(Lq / 32) * 32) layout.

The family is three modules: `kernel.py` (the Triton kernels and their launchers), `spec.py`
(the `KernelSpec`) and `ops.py` (the public op and its serve() route). The names other
modules use are re-exported here.
"""

from nbx_tune.kernels.attention.kernel import _attn_fwd_kernel, _block, _tma_strides, launch_attention
from nbx_tune.kernels.attention.spec import CONFIGS, DECODE_MAX_LQ, DEFAULTS, EFFICIENT, FLASH, FLASH_CPU, SDPA, SPEC
from nbx_tune.kernels.attention.ops import scaled_dot_product_attention

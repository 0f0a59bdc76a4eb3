"""Fusions: model code that is exactly a known pattern of several torch ops, swapped for
the one op a kernel serves. `engine` matches and swaps; the patterns are grouped by the
model family whose code they are (`llama`, `gpt2`, `gemma`, `eager_attention`, `cache`: transformers' KV
cache, `moe`: mixture-of-experts layers)."""

from nbx_tune.kernels.serving.fusions import cache, eager_attention, engine, gemma, gpt2, llama, moe

# The order they are tried in.
engine.FUSIONS = (llama.RMS_NORM, gpt2.GELU_TANH, llama.ROTARY, llama.SILU_MUL, llama.ADD_RMS_NORM,
                  gpt2.ADD_LAYER_NORM, llama.ROPE_TABLES, cache.CAT_KV, gemma.FINAL_SOFTCAP, gemma.OFFSET_RMS_NORM,
                  eager_attention.SOFTCAPPED, eager_attention.PLAIN, moe.EXPERTS, moe.EXPERTS_LOOP)

"""Record one inference forward (a prefill) of a Llama decoder, random weights.

    python examples/models/llama.py --scale small -o examples/traces/llama_small.tsv
    python examples/models/llama.py --scale 7b -o examples/traces/llama2_7b_seq512_bf16.tsv
    python examples/models/llama.py --scale 8b -o examples/traces/llama3_8b_seq1024_bf16.tsv
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from _record import main, prefill


def _scale(describe, config, seq, device, dtype):
    return prefill(f"{describe}: LlamaForCausalLM, {config.num_hidden_layers} layers, hidden "
                   f"{config.hidden_size}, {config.num_attention_heads} heads "
                   f"({config.num_key_value_heads} key/value), intermediate "
                   f"{config.intermediate_size}, vocab {config.vocab_size}",
                   LlamaForCausalLM, config, seq, device, dtype)


SCALES = {
    # Grouped-query (2 key/value heads); intermediate 172 is deliberately not a power of two.
    "small": _scale("small Llama", LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=172, vocab_size=320, max_position_embeddings=64,
        attn_implementation="sdpa"), seq=24, device="cpu", dtype=torch.float32),
    # Llama-2-7B's dimensions.
    "7b": _scale("Llama-2-7B dimensions", LlamaConfig(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        intermediate_size=11008, vocab_size=32000, max_position_embeddings=4096,
        attn_implementation="sdpa"), seq=512, device="meta", dtype=torch.bfloat16),
    # Llama-3-8B's dimensions: grouped-query (8 key/value heads) and a 128k vocabulary,
    # whose LM head is the largest GEMM of a prefill.
    "8b": _scale("Llama-3-8B dimensions", LlamaConfig(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
        rope_theta=500000.0, attn_implementation="sdpa"), seq=1024, device="meta", dtype=torch.bfloat16),
}

if __name__ == "__main__":
    main(SCALES)

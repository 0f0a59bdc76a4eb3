"""Record one decode step (one new token per sequence, a KV cache already holding the
context) or one prefill of a Llama-class model, random weights, on the meta device.

    python examples/models/decode.py --scale llama2-7b-b8-ctx2048 -o examples/traces/llama2_7b_decode_b8_ctx2048_bf16.tsv
    python examples/models/decode.py --scale llama3-8b-prefill1000 -o examples/traces/llama3_8b_prefill1000_bf16.tsv
    python examples/models/decode.py --scale qwen2-1.5b-prefill800 -o examples/traces/qwen2_1p5b_prefill800_bf16.tsv

The cache is filled before the recorder starts (its fill is not part of the step); the step
itself is what a generation loop runs per token: HF's DynamicCache appends the new keys and
values (an `aten.cat` per layer), attention reads one query against context + 1 keys, and
the LM head runs on the one new position.
"""

import inspect

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from _record import Scale, main


def _describe(name, cls, c, batch, what):
    return (f"{name}: {cls.__name__}, {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
            f"{c.num_attention_heads} heads ({c.num_key_value_heads} key/value), intermediate "
            f"{c.intermediate_size}, vocab {c.vocab_size}; batch {batch}, {what}; sdpa attention")


def _decode(name, cls, config, batch, ctx):
    def inputs():
        # The meta device (or the scale's) is current here: the cache holds ctx positions.
        cache = DynamicCache(config=config)
        d = config.hidden_size // config.num_attention_heads
        for layer in range(config.num_hidden_layers):
            kv = torch.zeros(batch, config.num_key_value_heads, ctx, d)
            cache.update(kv, kv.clone(), layer)
        # transformers 5.25 renamed past_key_values to cache (the old name warns until 5.40).
        name = "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"
        return {"input_ids": torch.randint(0, config.vocab_size, (batch, 1)), name: cache,
                "position_ids": torch.full((batch, 1), ctx, dtype=torch.long), "use_cache": True}

    return Scale(describe=_describe(name, cls, config, batch, f"one decode step, KV cache of {ctx} tokens"),
                 build=lambda: cls(config), inputs=inputs, device="meta", dtype=torch.bfloat16)


def _prefill(name, cls, config, seq):
    return Scale(describe=_describe(name, cls, config, 1, f"prefill of {seq} tokens, KV cache on"),
                 build=lambda: cls(config),
                 inputs=lambda: {"input_ids": torch.randint(0, config.vocab_size, (1, seq))},
                 device="meta", dtype=torch.bfloat16)


LLAMA2_7B = LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                        intermediate_size=11008, vocab_size=32000, max_position_embeddings=8192,
                        attn_implementation="sdpa")
# Llama-3-8B's dimensions: grouped-query (8 key/value heads for 32), vocabulary 128256.
LLAMA3_8B = LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                        intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
                        rope_theta=500000.0, attn_implementation="sdpa")
# Qwen2-1.5B's dimensions: hidden 1536, 12 query heads on 2 key/value heads, vocabulary 151936.
QWEN2_1P5B = Qwen2Config(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True, attn_implementation="sdpa")

SCALES = {
    **{f"llama2-7b-b{b}-ctx{c}": _decode("Llama-2-7B dimensions", LlamaForCausalLM, LLAMA2_7B, b, c)
       for b, c in ((1, 4096), (8, 2048), (32, 1024), (64, 512))},
    "llama3-8b-b16-ctx4096": _decode("Llama-3-8B dimensions", LlamaForCausalLM, LLAMA3_8B, 16, 4096),
    "llama3-8b-prefill1000": _prefill("Llama-3-8B dimensions", LlamaForCausalLM, LLAMA3_8B, 1000),
    "qwen2-1.5b-prefill800": _prefill("Qwen2-1.5B dimensions", Qwen2ForCausalLM, QWEN2_1P5B, 800),
}

if __name__ == "__main__":
    main(SCALES)

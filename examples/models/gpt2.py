"""Record one inference forward (a prefill) of GPT-2, random weights.

    python examples/models/gpt2.py --scale small -o examples/traces/gpt2_small.tsv
    python examples/models/gpt2.py --scale 124m -o examples/traces/gpt2_seq1024_bf16.tsv
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from _record import main, prefill


def _scale(describe, config, seq, device, dtype):
    return prefill(f"{describe}: GPT2LMHeadModel, {config.n_layer} layers, hidden {config.n_embd}, "
                   f"{config.n_head} heads, vocab {config.vocab_size}", GPT2LMHeadModel, config, seq, device, dtype)


SCALES = {
    "small": _scale("small GPT-2", GPT2Config(
        n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=320, bos_token_id=319,
        eos_token_id=319,
        attn_implementation="sdpa"), seq=24, device="cpu", dtype=torch.float32),
    # GPT2Config's defaults are GPT-2 small (124M): 12 layers, hidden 768, vocab 50257.
    "124m": _scale("GPT-2 124M", GPT2Config(attn_implementation="sdpa"),
                   seq=1024, device="meta", dtype=torch.bfloat16),
}

if __name__ == "__main__":
    main(SCALES)

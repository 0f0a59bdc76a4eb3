"""The patterns of transformers' GPT-2: gelu_new's tanh approximation, and a block's
residual add with the layer norm after it."""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F

from nbx_tune.kernels.serving import custom_ops, hand_off
from nbx_tune.kernels.serving.fusions.engine import Fusion, Pattern, _add_and_hand_off, _calls, _fusable, is_layer_norm


def _gelu_tanh(original: Callable) -> Callable:
    def forward(self, input):
        _calls["gelu_tanh"] += 1
        return F.gelu(input, approximate="tanh")

    return forward


# transformers' NewGELUActivation (GPT-2's "gelu_new"): gelu's tanh form in eight launches
# (three scalar muls, pow, add, tanh, a scalar add, mul), each rounding to the input's dtype.
GELU_TANH = Fusion("gelu_tanh", "aten.gelu", Pattern('''
def forward(self, input):
    return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))
'''), _gelu_tanh)

def _add_layer_norm_block(original: Callable) -> Callable:
    def forward(self, hidden_states, cache=None, attention_mask=None, encoder_hidden_states=None,
                encoder_attention_mask=None, use_cache=False, **kwargs):
        ln = self.ln_2
        if encoder_hidden_states is not None:  # cross-attention between the add and ln_2
            return original(self, hidden_states, cache=cache, attention_mask=attention_mask,
                            encoder_hidden_states=encoder_hidden_states,
                            encoder_attention_mask=encoder_attention_mask, use_cache=use_cache, **kwargs)
        residual = hidden_states
        handed = hand_off.take(self.ln_1, hidden_states)  # the block before computed it
        hidden_states = self.ln_1(hidden_states) if handed is None else handed
        attn_output, _ = self.attn(hidden_states, cache=cache, attention_mask=attention_mask, use_cache=use_cache,
                                   **kwargs)
        if is_layer_norm(ln) and _fusable(attn_output, residual, ln.weight, ln.bias):
            _calls["add_layer_norm"] += 1
            hidden_states, residual = custom_ops.add_layer_norm(attn_output, residual, ln.weight, ln.bias, ln.eps)
        else:  # the pattern as written
            hidden_states = attn_output + residual
            residual = hidden_states
            hidden_states = ln(hidden_states)
        return _add_and_hand_off(self, "ln_1", residual, self.mlp(hidden_states))

    return forward


# transformers' GPT2Block.forward: the residual add after attention and ln_2, two launches,
# as torch.ops.nbx_tune.add_layer_norm (without cross-attention, which runs between them).
ADD_LAYER_NORM = Fusion("add_layer_norm", "nbx_tune.add_layer_norm", Pattern('''
def forward(self, hidden_states, cache=None, attention_mask=None, encoder_hidden_states=None,
            encoder_attention_mask=None, use_cache=False, **kwargs):
    residual = hidden_states
    hidden_states = self.ln_1(hidden_states)
    attn_output, _ = self.attn(
        hidden_states,
        cache=cache,
        attention_mask=attention_mask,
        use_cache=use_cache,
        **kwargs,
    )
    # residual connection
    hidden_states = attn_output + residual

    if encoder_hidden_states is not None:
        # add one self-attention block for cross-attention
        if not hasattr(self, "crossattention"):
            raise ValueError(
                f"If `encoder_hidden_states` are passed, {self} has to be instantiated with "
                "cross-attention layers by setting `config.add_cross_attention=True`"
            )
        residual = hidden_states
        hidden_states = self.ln_cross_attn(hidden_states)
        cross_attn_output, _ = self.crossattention(
            hidden_states,
            cache=cache,
            attention_mask=attention_mask,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
        )
        # residual connection
        hidden_states = residual + cross_attn_output

    residual = hidden_states
    hidden_states = self.ln_2(hidden_states)
    feed_forward_hidden_states = self.mlp(hidden_states)
    # residual connection
    hidden_states = residual + feed_forward_hidden_states

    return hidden_states
'''), _add_layer_norm_block)

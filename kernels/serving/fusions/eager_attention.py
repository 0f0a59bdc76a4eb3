"""The patterns of transformers' eager (non-SDPA) attention: between the two matmuls, the
scores scaled, soft-capped (Gemma 2), masked and put through an fp32 softmax cast back, up to
seven launches a layer, as the one op torch.ops.nbx_tune.score_softmax. Gemma 2 runs eager
attention by default (SDPA has no soft-cap); Llama and its copies where a user asks for it."""

from __future__ import annotations

from typing import Callable

import torch

from nbx_tune.kernels.serving import gemma_ops
from nbx_tune.kernels.serving.fusions.engine import Fusion, Pattern, _calls

# transformers' repeat_kv (grouped-query heads repeated for the eager matmuls).
REPEAT_KV = Pattern('''
def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)
''')


def _chain(names: dict, module, query, key, value, attention_mask, scaling, softcap):
    """The pattern's attention with its score chain as one op."""
    repeat_kv = names["repeat_kv"]
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    _calls["score_softmax"] += 1
    attn_weights = gemma_ops.score_softmax(torch.matmul(query, key_states.transpose(2, 3)), scaling, softcap,
                                           attention_mask)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def _chained(query, attention_mask, dropout, module, scaling, softcap) -> bool:
    """The one op gives the pattern's result: no dropout, a float mask, plain numbers."""
    return ((not dropout or not module.training) and type(scaling) in (float, int)
            and (softcap is None or type(softcap) in (float, int))
            and (attention_mask is None or (attention_mask.is_floating_point() and attention_mask.dim() == 4)))


def _softcapped(original: Callable) -> Callable:
    def eager_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None,
                                **kwargs):
        if scaling is None:
            scaling = module.head_dim**-0.5
        if not _chained(query, attention_mask, dropout, module, scaling, softcap):
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            softcap=softcap, **kwargs)
        return _chain(original.__globals__, module, query, key, value, attention_mask, scaling, softcap)

    return eager_attention_forward


# transformers' Gemma 2 eager_attention_forward (and its copies): scale, soft-cap, mask, softmax.
SOFTCAPPED = Fusion("score_softmax", "nbx_tune.score_softmax", Pattern('''
def eager_attention_forward(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    softcap=None,
    **kwargs,
):
    if scaling is None:
        scaling = module.head_dim**-0.5

    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)

    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling

    if softcap is not None:
        attn_weights = attn_weights / softcap
        attn_weights = torch.tanh(attn_weights)
        attn_weights = attn_weights * softcap
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask

    # upcast attention to fp32
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()
    return attn_output, attn_weights
''', helpers=(("repeat_kv", REPEAT_KV),)), _softcapped, function="eager_attention_forward")


def _plain(original: Callable) -> Callable:
    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        if not _chained(query, attention_mask, dropout, module, scaling, None):
            return original(module, query, key, value, attention_mask, scaling, dropout=dropout, **kwargs)
        return _chain(original.__globals__, module, query, key, value, attention_mask, scaling, None)

    return eager_attention_forward


# transformers' Llama eager_attention_forward (and its copies: Qwen2, Mistral, ...): scale,
# mask, softmax.
PLAIN = Fusion("score_softmax", "nbx_tune.score_softmax", Pattern('''
def eager_attention_forward(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling,
    dropout=0.0,
    **kwargs,
):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)

    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask

    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous()

    return attn_output, attn_weights
''', helpers=(("repeat_kv", REPEAT_KV),)), _plain, function="eager_attention_forward")

"""The patterns of transformers' Llama family (and the models that copy its code: Qwen2,
Mistral, Qwen3, Phi-3, Granite): the RMS norm, the rotary embedding and its cos/sin tables,
SwiGLU's activation, and a decoder layer's residual add with the norm after it."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from nbx_tune.kernels.serving import custom_ops, hand_off
from nbx_tune.kernels.serving.fusions import gemma
from nbx_tune.kernels.serving.fusions.engine import Fusion, Pattern, _add_and_hand_off, _calls, _fusable, is_rms_norm


def _rms_norm(original: Callable) -> Callable:
    def forward(self, hidden_states):
        weight = self.weight
        if hidden_states.dtype != weight.dtype or weight.dim() != 1:
            return original(self, hidden_states)  # the pattern promotes to the weight's dtype
        handed = hand_off.take(self, hidden_states)  # the last layer's add computed it
        if handed is not None:
            return handed
        _calls["rms_norm"] += 1
        return F.rms_norm(hidden_states, weight.shape, weight, self.variance_epsilon)

    return forward


# transformers' LlamaRMSNorm.forward, shared by the models whose norm is "copied from" it
# (Qwen2, Mistral, ...): the norm in float32, cast back, then scaled in the input's dtype.
RMS_NORM = Fusion("rms_norm", "aten.rms_norm", Pattern('''
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
'''), _rms_norm)



def _rotary(original: Callable) -> Callable:
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 \
                or not q.dtype == k.dtype == cos.dtype == sin.dtype:
            return original(q, k, cos, sin, unsqueeze_dim)  # another layout, or promotion
        _calls["rotary"] += 1
        return custom_ops.rotary_qk(q, k, cos, sin)

    return apply_rotary_pos_emb


# transformers' rotate_half and apply_rotary_pos_emb (Llama, and the models that copy it):
# ten launches for q and k (mul, neg, cat, mul, add each), one as torch.ops.nbx_tune.rotary_qk.
ROTATE_HALF = Pattern('''
def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
''')
ROTARY = Fusion("rotary", "nbx_tune.rotary_qk", Pattern('''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
''', helpers=(("rotate_half", ROTATE_HALF),)), _rotary, function="apply_rotary_pos_emb")

# transformers' SiLU activation module (ACT2FN["silu"]); torch's nn.SiLU is one too.
SILU_ACTIVATION = Pattern('''
def forward(self, input):
    return nn.functional.silu(input)
''')
_silu_types: dict[type, bool] = {}


def is_silu(module) -> bool:
    kind = type(module)
    if kind not in _silu_types:
        _silu_types[kind] = issubclass(kind, torch.nn.SiLU) or SILU_ACTIVATION.matches(kind.__dict__.get("forward"))
    return _silu_types[kind]


def _silu_mul(original: Callable) -> Callable:
    def forward(self, x):
        if not is_silu(self.act_fn):  # GeGLU (Gemma), or another activation: the pattern as written
            return gemma.gated_gelu(original, self, x)
        _calls["silu_mul"] += 1
        return self.down_proj(custom_ops.silu_mul(self.gate_proj(x), self.up_proj(x)))

    return forward


# transformers' LlamaMLP.forward (and its copies): silu(gate) * up in two launches, one as
# torch.ops.nbx_tune.silu_mul; the three projections stay the model's own modules.
SILU_MUL = Fusion("silu_mul", "nbx_tune.silu_mul", Pattern('''
def forward(self, x):
    down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    return down_proj
'''), _silu_mul)


def _add_rms_norm_layer(original: Callable) -> Callable:
    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                position_embeddings=None, **kwargs):
        norm = self.post_attention_layernorm
        residual = hidden_states
        handed = hand_off.take(self.input_layernorm, hidden_states)  # the layer before computed it
        hidden_states = self.input_layernorm(hidden_states) if handed is None else handed
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, cache=cache, use_cache=use_cache,
                                          position_embeddings=position_embeddings, **kwargs)
        if is_rms_norm(norm) and _fusable(hidden_states, residual, norm.weight):
            _calls["add_rms_norm"] += 1
            hidden_states, residual = custom_ops.add_rms_norm(hidden_states, residual, norm.weight,
                                                              norm.variance_epsilon)
        else:  # the pattern as written
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = norm(hidden_states)
        return _add_and_hand_off(self, "input_layernorm", residual, self.mlp(hidden_states))

    return forward


# transformers' LlamaDecoderLayer.forward (and its copies: Qwen2, Mistral, ...): the residual
# add after attention and the post-attention RMS norm, two launches, as
# torch.ops.nbx_tune.add_rms_norm. The forward sits behind a kwarg-renaming decorator.
ADD_RMS_NORM = Fusion("add_rms_norm", "nbx_tune.add_rms_norm", Pattern('''
def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
            position_embeddings=None, **kwargs):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    # Self Attention
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    hidden_states = residual + hidden_states

    # Fully Connected
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = self.mlp(hidden_states)
    hidden_states = residual + hidden_states
    return hidden_states
'''), _add_rms_norm_layer)


def _rope_tables(original: Callable) -> Callable:
    def forward(self, x, position_ids):
        inv_freq, scaling = self.inv_freq, self.attention_scaling
        if type(scaling) not in (float, int) or inv_freq.dtype != torch.float32 or inv_freq.dim() != 1 \
                or not x.device == position_ids.device == inv_freq.device:
            return original(self, x, position_ids)  # the pattern moves or casts inv_freq first
        _calls["rope_cos_sin"] += 1
        return custom_ops.rope_cos_sin(position_ids, inv_freq, float(scaling), x.dtype)

    return forward


# transformers' LlamaRotaryEmbedding.forward (and its copies): the cos and sin tables of a
# forward's positions, nine launches once a forward, as torch.ops.nbx_tune.rope_cos_sin. It
# sits behind dynamic_rope_update, which recomputes inv_freq first where the rope type wants.
ROPE_TABLES = Fusion("rope_cos_sin", "nbx_tune.rope_cos_sin", Pattern('''
def forward(self, x, position_ids):
    freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * self.attention_scaling
    sin = emb.sin() * self.attention_scaling

    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)
'''), _rope_tables)

"""The library's own torch ops, `torch.ops.nbx_tune.*`: one op for a pattern a model writes
as several small aten ops, so that serve() runs it as one launch.

    torch.ops.nbx_tune.rotary(x, cos, sin)    # transformers' apply_rotary_pos_emb, one tensor
    torch.ops.nbx_tune.rotary_qk(q, k, cos, sin)  # the same for q and k, in one launch
    torch.ops.nbx_tune.silu_mul(gate, up)     # silu(gate) * up, LlamaMLP's activation
    torch.ops.nbx_tune.add_rms_norm(x, residual, weight, eps)  # (rms_norm(residual + x), the sum)
    torch.ops.nbx_tune.add_layer_norm(x, residual, weight, bias, eps)  # the same with a layer norm
    torch.ops.nbx_tune.rope_cos_sin(position_ids, inv_freq, scaling, dtype)  # LlamaRotaryEmbedding's tables
    torch.ops.nbx_tune.cat_kv(keys, key_states, values, value_states, dim)  # a KV cache's two cats
    torch.ops.nbx_tune.moe_experts(hidden, w_gate_up, w_down, topk_ids, topk_weights)  # routed experts

Each op's torch implementation is the pattern itself, written as the model writes it, and is
registered as a composite (CompositeImplicitAutograd): outside serve() it runs the pattern's
own ops, so the result is what the model's code gives, bit for bit, on any device (meta
included), and autograd differentiates through those ops. serve() registers a CUDA (or,
under the interpreter, CPU) kernel for each, as it does for SDPA: then the op is one
Triton launch (kernels/rope.py, kernels/swiglu.py, kernels/residual_norm.py, kernels/kv_cache.py) and, with grad wanted, torch's pattern.
The trace recorder writes each as one row (`nbx_tune.rotary`, `nbx_tune.silu_mul`).

Defined through `torch.library.Library`, not `custom_op`, whose Python autograd layer costs
every call several microseconds more (lab/serve_eager_profile/op_definition_cost.py), about
what a launch of these ops costs.

Imports torch only, never triton: a module swap or the recorder may load it before the
kernels have chosen between a GPU and Triton's interpreter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def rotate_half(x: Tensor) -> Tensor:
    """transformers' rotate_half: cat(-x[..., h:], x[..., :h]) with h = D // 2."""
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return (x * cos) + (rotate_half(x) * sin)


def _rotary_qk(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    return _rotary(q, cos, sin), _rotary(k, cos, sin)


def _silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


def _add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    total = residual + x
    return F.rms_norm(total, (total.shape[-1],), weight, eps), total


def _add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    total = x + residual
    return F.layer_norm(total, (total.shape[-1],), weight, bias, eps), total


def _rope_cos_sin(position_ids: Tensor, inv_freq: Tensor, scaling: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    freqs = position_ids[..., None].float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * scaling
    sin = emb.sin() * scaling
    return cos.to(dtype=dtype), sin.to(dtype=dtype)


def _cat_kv(keys: Tensor, key_states: Tensor, values: Tensor, value_states: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    return torch.cat([keys, key_states], dim=dim), torch.cat([values, value_states], dim=dim)


def _moe_experts(hidden: Tensor, w_gate_up: Tensor, w_down: Tensor, topk_ids: Tensor, topk_weights: Tensor) -> Tensor:
    # transformers' experts loop (MixtralExperts.forward with a SiLU), one expert at a time;
    # an id outside [0, E) (its expert-parallel sentinel) adds nothing.
    final = torch.zeros_like(hidden)
    mask = F.one_hot(topk_ids.long().clamp(-1, w_gate_up.shape[0]) % (w_gate_up.shape[0] + 1),
                     num_classes=w_gate_up.shape[0] + 1).permute(2, 1, 0)
    for e in range(w_gate_up.shape[0]):
        top_k_pos, token_idx = torch.where(mask[e])
        if token_idx.numel() == 0:
            continue
        gate, up = F.linear(hidden[token_idx], w_gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w_down[e]) * topk_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, y.to(final.dtype))
    return final


_LIB = torch.library.Library("nbx_tune", "DEF")  # kept for the process: the ops live as long as it
for _schema, _pattern in (
        ("rotary(Tensor x, Tensor cos, Tensor sin) -> Tensor", _rotary),
        ("rotary_qk(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)", _rotary_qk),
        ("silu_mul(Tensor gate, Tensor up) -> Tensor", _silu_mul),
        ("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)", _add_rms_norm),
        ("add_layer_norm(Tensor x, Tensor residual, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor)",
         _add_layer_norm),
        ("rope_cos_sin(Tensor position_ids, Tensor inv_freq, float scaling, ScalarType dtype) -> (Tensor, Tensor)",
         _rope_cos_sin),
        ("cat_kv(Tensor keys, Tensor key_states, Tensor values, Tensor value_states, int dim) -> (Tensor, Tensor)",
         _cat_kv),
        ("moe_experts(Tensor hidden, Tensor w_gate_up, Tensor w_down, Tensor topk_ids, Tensor topk_weights) -> Tensor",
         _moe_experts)):
    _LIB.define(_schema)
    _LIB.impl(_schema.partition("(")[0], _pattern, "CompositeImplicitAutograd")

rotary = torch.ops.nbx_tune.rotary.default  # (x (B, H, S, D), cos and sin (B, S, D)) -> x's shape
rotary_qk = torch.ops.nbx_tune.rotary_qk.default  # (q, k, cos, sin) -> (q's, k's): apply_rotary_pos_emb
silu_mul = torch.ops.nbx_tune.silu_mul.default  # (gate, up) -> their shape
add_rms_norm = torch.ops.nbx_tune.add_rms_norm.default  # (x, residual, weight, eps) -> (normed, sum)
add_layer_norm = torch.ops.nbx_tune.add_layer_norm.default  # (x, residual, weight, bias, eps) -> (normed, sum)
rope_cos_sin = torch.ops.nbx_tune.rope_cos_sin.default  # (position_ids, inv_freq, scaling, dtype) -> (cos, sin)
cat_kv = torch.ops.nbx_tune.cat_kv.default  # (keys, key_states, values, value_states, dim) -> (keys, values)
moe_experts = torch.ops.nbx_tune.moe_experts.default  # (hidden (T, H), w_gate_up, w_down, ids, weights) -> (T, H)

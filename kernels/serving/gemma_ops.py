"""The library's own torch ops for the patterns Gemma's models write as several small ops
(kernels/serving/custom_ops.py has Llama's; the same rules hold: each op's composite body
is the pattern as the model writes it, bit for bit outside serve(), differentiable there,
and under serve() one Triton launch).

    torch.ops.nbx_tune.gelu_mul(gate, up)     # gelu(gate, approximate="tanh") * up: GeGLU (Gemma's MLP)
    torch.ops.nbx_tune.softcap(x, cap)        # tanh(x / cap) * cap: Gemma 2's logit soft-cap
    torch.ops.nbx_tune.score_softmax(scores, scaling, softcap, mask)  # eager attention's score chain
    torch.ops.nbx_tune.offset_rms_norm(x, weight, eps)  # Gemma's RMS norm: in fp32, scaled by (1 + weight)

Imports torch only, never triton (as custom_ops.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _gelu_mul(gate: Tensor, up: Tensor) -> Tensor:
    return F.gelu(gate, approximate="tanh") * up


def _softcap(x: Tensor, cap: float) -> Tensor:
    x = x / cap
    x = torch.tanh(x)
    return x * cap


def _score_softmax(scores: Tensor, scaling: float, softcap: float | None, mask: Tensor | None) -> Tensor:
    """transformers' eager attention between its two matmuls: scale, soft-cap, mask, softmax
    in fp32, back to the scores' dtype."""
    w = scores * scaling
    if softcap is not None:
        w = w / softcap
        w = torch.tanh(w)
        w = w * softcap
    if mask is not None:
        w = w + mask
    return F.softmax(w, dim=-1, dtype=torch.float32).to(scores.dtype)


def _offset_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' GemmaRMSNorm: normalized in fp32, times (1 + weight) in fp32, then x's dtype."""
    out = x.float()
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps)
    out = out * (1.0 + weight.float())
    return out.type_as(x)


_LIB = torch.library.Library("nbx_tune", "FRAGMENT")  # kept for the process: the ops live as long as it
for _schema, _pattern in (
        ("gelu_mul(Tensor gate, Tensor up) -> Tensor", _gelu_mul),
        ("softcap(Tensor x, float cap) -> Tensor", _softcap),
        ("score_softmax(Tensor scores, float scaling, float? softcap, Tensor? mask) -> Tensor", _score_softmax),
        ("offset_rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", _offset_rms_norm)):
    _LIB.define(_schema)
    _LIB.impl(_schema.partition("(")[0], _pattern, "CompositeImplicitAutograd")

gelu_mul = torch.ops.nbx_tune.gelu_mul.default  # (gate, up) -> their shape
softcap = torch.ops.nbx_tune.softcap.default  # (x, cap) -> x's shape
score_softmax = torch.ops.nbx_tune.score_softmax.default  # (scores (B, H, Q, K), scaling, softcap, mask) -> probs
offset_rms_norm = torch.ops.nbx_tune.offset_rms_norm.default  # (x, weight (x's last dim), eps) -> x's shape

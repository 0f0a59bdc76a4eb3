"""The library's own torch ops, `torch.ops.nbx_tune.*`: one op for a pattern a model writes
as several small aten ops, so that serve() runs it as one launch.

    torch.ops.nbx_tune.rotary(x, cos, sin)    # transformers' apply_rotary_pos_emb, one tensor
    torch.ops.nbx_tune.silu_mul(gate, up)     # silu(gate) * up, LlamaMLP's activation

Each op's torch implementation (CPU, CUDA, any device) is the pattern itself, written as the
model writes it, so outside serve() the op returns what the model's code did, bit for bit;
its fake kernel gives meta-device tracing (and the recorder) the shape, dtype and strides.
serve() routes each op to its Triton kernel (kernels/rope.py, kernels/swiglu.py), whose trace
rows read `nbx_tune.rotary` and `nbx_tune.silu_mul`. Both have a backward, so a model that
keeps grad enabled still trains through them.

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


def _rotate_half_transposed(y: Tensor) -> Tensor:
    """The adjoint of rotate_half (the gradient through it): cat(y[..., D-h:], -y[..., :D-h])."""
    k = y.shape[-1] - y.shape[-1] // 2
    return torch.cat((y[..., k:], -y[..., :k]), dim=-1)


def _like(shape, dtype, x: Tensor) -> Tensor:
    """The output a composite element-wise result gets: x's layout where it has x's shape
    and dtype (torch's iterator follows its first operand), else contiguous."""
    if tuple(shape) == tuple(x.shape) and dtype == x.dtype:
        return torch.empty_like(x)
    return torch.empty(shape, dtype=dtype, device=x.device)


@torch.library.custom_op("nbx_tune::rotary", mutates_args=())
def rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary position embedding of one tensor, as transformers' apply_rotary_pos_emb with
    unsqueeze_dim=1: x (B, H, S, D), cos and sin (B, S, D)."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return (x * cos) + (rotate_half(x) * sin)


@rotary.register_fake
def _rotary_fake(x, cos, sin):
    shape = torch.broadcast_shapes(x.shape, cos.unsqueeze(1).shape, sin.unsqueeze(1).shape)
    return _like(shape, torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype), x)


def _rotary_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _rotary_backward(ctx, g):
    x, cos, sin = ctx.saved_tensors
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    gx = gc = gs = None
    if ctx.needs_input_grad[0]:
        gx = (g * c + _rotate_half_transposed(g * s)).sum_to_size(x.shape).to(x.dtype)
    if ctx.needs_input_grad[1]:
        gc = (g * x).sum_to_size(c.shape).squeeze(1).to(cos.dtype)
    if ctx.needs_input_grad[2]:
        gs = (g * rotate_half(x)).sum_to_size(s.shape).squeeze(1).to(sin.dtype)
    return gx, gc, gs


rotary.register_autograd(_rotary_backward, setup_context=_rotary_setup)


@torch.library.custom_op("nbx_tune::silu_mul", mutates_args=())
def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up: LlamaMLP's act_fn(gate_proj(x)) * up_proj(x) with act silu."""
    return F.silu(gate) * up


@silu_mul.register_fake
def _silu_mul_fake(gate, up):
    return _like(torch.broadcast_shapes(gate.shape, up.shape), torch.promote_types(gate.dtype, up.dtype), gate)


def _silu_mul_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _silu_mul_backward(ctx, g):
    gate, up = ctx.saved_tensors
    gg = gu = None
    if ctx.needs_input_grad[0]:
        sg = torch.sigmoid(gate)
        gg = (g * up * sg * (1 + gate * (1 - sg))).sum_to_size(gate.shape).to(gate.dtype)
    if ctx.needs_input_grad[1]:
        gu = (g * F.silu(gate)).sum_to_size(up.shape).to(up.dtype)
    return gg, gu


silu_mul.register_autograd(_silu_mul_backward, setup_context=_silu_mul_setup)

"""The patterns of transformers' mixture-of-experts layers (Mixtral, Qwen2/3-MoE, OLMoE,
DeepSeek-V3 and the models that copy their experts module): the routed experts, a Python
loop over experts or sorted grouped GEMMs, as torch.ops.nbx_tune.moe_experts.

transformers (5.x) wraps an experts class's forward (`use_experts_implementation`) in a
dispatcher that picks the code by `config._experts_implementation`: "eager" runs the class's
own loop, "grouped_mm" (the default where torch has `_grouped_mm`) its grouped forward. The
dispatcher is swapped; on each call it asks the same interface which code would run, and
runs the one op only where that code is one of the two patterns below (their helpers too)
and the module's switches say the plain SwiGLU experts (no bias, no transposed weights, no
post-expert norm, no expert parallelism, transformers' gate). Anything else runs as written.
An experts module without the dispatcher (an older transformers) is swapped when its forward
is the loop. The router and the shared expert stay the model's own modules.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Callable

from types import FunctionType

from nbx_tune.kernels.serving import custom_ops
from nbx_tune.kernels.serving.fusions.engine import Fusion, Pattern, _calls, shape_of
from nbx_tune.kernels.serving.fusions.llama import is_silu

# transformers' experts loop (MixtralExperts.forward and its copies).
EXPERTS_LOOP_SOURCE = '''
def forward(self, hidden_states, top_k_index, top_k_weights):
    final_hidden_states = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1)
        expert_mask = expert_mask.permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in expert_hit:
        expert_idx = expert_idx[0]
        if expert_idx == self.num_experts:
            continue
        top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
        current_state = hidden_states[token_idx]
        gate, up = nn.functional.linear(current_state, self.gate_up_proj[expert_idx]).chunk(2, dim=-1)
        current_hidden_states = self.act_fn(gate) * up
        current_hidden_states = nn.functional.linear(current_hidden_states, self.down_proj[expert_idx])
        current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
        final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
    return final_hidden_states
'''
EXPERTS_LOOP_PATTERN = Pattern(EXPERTS_LOOP_SOURCE)

# transformers.integrations.moe: the grouped forward and the helpers it calls.
GROUPED_MM = Pattern('''
def _grouped_mm(input, weight, offs):
    if _can_use_grouped_mm(input, weight, offs):
        if hasattr(torch.nn.functional, 'grouped_mm'):
            return torch.nn.functional.grouped_mm(input.to(weight.dtype), weight, offs=offs)
        elif hasattr(torch, '_grouped_mm'):
            return torch._grouped_mm(input.to(weight.dtype), weight, offs=offs)
    return torch.ops.transformers.grouped_mm_fallback(input.to(weight.dtype), weight, offs=offs)
''')
GROUPED_LINEAR = Pattern('''
def _grouped_linear(input, weight, offs, bias=None, is_transposed=False):
    if is_transposed:
        out = _grouped_mm(input, weight, offs=offs)
    else:
        out = _grouped_mm(input, weight.transpose(-2, -1), offs=offs)
    if bias is not None:
        out.add_(bias)
    return out
''', helpers=(("_grouped_mm", GROUPED_MM),))
APPLY_GATE = Pattern('''
def _default_apply_gate(self, gate_up_out):
    gate, up = gate_up_out.chunk(2, dim=-1)
    return self.act_fn(gate) * up
''')
GROUPED_FORWARD = Pattern('''
def grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    device = hidden_states.device
    num_top_k = top_k_index.size(-1)
    num_tokens = hidden_states.size(0)
    hidden_dim = hidden_states.size(-1)
    sample_weights = top_k_weights.reshape(-1)
    expert_ids = top_k_index.reshape(-1)
    expert_ids_g, perm = torch.sort(expert_ids)
    selected_hidden_states_g = hidden_states[perm // num_top_k]
    sample_weights_g = sample_weights[perm]
    histc_input = expert_ids_g.float() if device.type in ('cpu', 'mps') else expert_ids_g.int()
    tokens_per_expert = torch.histc(histc_input, bins=self.num_experts, min=0, max=self.num_experts - 1)
    offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
    sentinel_mask = None
    if self._is_expert_parallel:
        sentinel_mask = (expert_ids_g >= self.num_experts).unsqueeze(-1)
        expert_ids_g.clamp_(max=self.num_experts - 1)
    if self.has_gate:
        selected_weights = self.gate_up_proj
        selected_biases = self.gate_up_proj_bias[expert_ids_g] if self.has_bias else None
    else:
        selected_weights = self.up_proj
        selected_biases = self.up_proj_bias[expert_ids_g] if self.has_bias else None
    if sentinel_mask is not None:
        selected_hidden_states_g.masked_fill_(sentinel_mask, 0.0)
    proj_out = _grouped_linear(selected_hidden_states_g, selected_weights, offsets, bias=selected_biases, is_transposed=self.is_transposed)
    if sentinel_mask is not None:
        proj_out = proj_out.masked_fill(sentinel_mask, 0.0)
    if self.has_gate:
        proj_out = self._apply_gate(proj_out)
    else:
        proj_out = self.act_fn(proj_out)
    selected_weights = self.down_proj
    selected_biases = self.down_proj_bias[expert_ids_g] if self.has_bias else None
    proj_out = _grouped_linear(proj_out, selected_weights, offsets, bias=selected_biases, is_transposed=self.is_transposed)
    if sentinel_mask is not None:
        proj_out = proj_out.masked_fill(sentinel_mask, 0.0)
    if self.has_post_expert_norm:
        proj_out = self.post_expert_norm(proj_out)
    weighted_out = proj_out * sample_weights_g.unsqueeze(-1)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.size(0), device=device)
    weighted_out = weighted_out[inv_perm]
    final_hidden_states = weighted_out.view(num_tokens, num_top_k, hidden_dim).sum(dim=1)
    return final_hidden_states.to(hidden_states.dtype)
''', helpers=(("_grouped_linear", GROUPED_LINEAR),))

# transformers' dispatcher around an experts class's forward (use_experts_implementation).
DISPATCH_SOURCE = '''
def forward(self, *args, **kwargs):
    experts_forward = experts_interface.get_interface(self.config._experts_implementation, original_forward)
    return experts_forward(self, *args, **kwargs)
'''
_DISPATCH_CLOSURE = ("experts_interface", "original_forward")


class DispatchPattern(Pattern):
    """The dispatcher: its free names are closure cells, not globals, so the syntax tree and
    the closure's names decide (the code it dispatches to is judged on each call)."""

    def matches(self, fn) -> bool:
        if not isinstance(fn, FunctionType) or fn.__code__.co_freevars != _DISPATCH_CLOSURE:
            return False
        known = self.verdicts
        if fn not in known:
            try:
                # Its code's source: getsource(fn) would follow __wrapped__ to the wrapped forward.
                known[fn] = shape_of(inspect.getsource(fn.__code__)) == self.shape
            except Exception:  # no source to read: never swapped unseen
                known[fn] = False
        return known[fn]


def _closure(fn) -> dict:
    return {name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ())}


_plain: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # experts class -> plain switches


def _plain_switches(module) -> bool:
    """The grouped forward's switches give plain SwiGLU experts, with transformers' gate."""
    return (getattr(module, "has_gate", False) is True and not getattr(module, "has_bias", True)
            and not getattr(module, "is_transposed", True) and getattr(module, "is_concatenated", False) is True
            and not getattr(module, "has_post_expert_norm", True) and not getattr(module, "_is_expert_parallel", True)
            and APPLY_GATE.matches(getattr(type(module), "_apply_gate", None)))


def _servable(module, hidden, top_k_index, top_k_weights) -> bool:
    """The one op gives the code's result: (T, H) activations and (E, 2I, H), (E, H, I) weights
    of one dtype, a SiLU, routing of (T, K)."""
    w13, w2 = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not all(hasattr(t, "dtype") for t in (hidden, top_k_index, top_k_weights, w13, w2)):
        return False
    return (hidden.dim() == 2 and w13.dim() == 3 and w2.dim() == 3 and w13.dtype == w2.dtype == hidden.dtype
            and top_k_index.dim() == 2 and top_k_weights.shape == top_k_index.shape
            and top_k_weights.is_floating_point() and not top_k_index.is_floating_point()
            and w13.shape[0] == getattr(module, "num_experts", -1) and is_silu(getattr(module, "act_fn", None)))


def _run(module, hidden, top_k_index, top_k_weights):
    _calls["moe_experts"] += 1
    return custom_ops.moe_experts(hidden, module.gate_up_proj, module.down_proj, top_k_index, top_k_weights)


def _dispatched(original: Callable) -> Callable:
    cells = _closure(original)
    interface, default = cells["experts_interface"], cells["original_forward"]

    def forward(self, *args, **kwargs):
        if len(args) == 3 and not kwargs and _servable(self, *args):
            impl = interface.get_interface(self.config._experts_implementation, default)
            if (impl is default and EXPERTS_LOOP_PATTERN.matches(impl)) or \
                    (GROUPED_FORWARD.matches(impl) and _plain_switches(self)):
                return _run(self, *args)
        return original(self, *args, **kwargs)

    return forward


def _loop(original: Callable) -> Callable:
    def forward(self, hidden_states, top_k_index, top_k_weights):
        if not _servable(self, hidden_states, top_k_index, top_k_weights):
            return original(self, hidden_states, top_k_index, top_k_weights)
        return _run(self, hidden_states, top_k_index, top_k_weights)

    return forward


EXPERTS = Fusion("moe_experts", "nbx_tune.moe_experts", DispatchPattern(DISPATCH_SOURCE), _dispatched)
EXPERTS_LOOP = Fusion("moe_experts", "nbx_tune.moe_experts", EXPERTS_LOOP_PATTERN, _loop)

"""The patterns of transformers' Gemma 2 (and the Gemma models that copy its code): its RMS
norm (in fp32, scaled by 1 + weight: ten launches, four norms a layer), GeGLU's activation
(`gelu(gate, tanh) * up`, the MLP LlamaMLP's code with Gemma's activation) and the final
logits' soft-cap (`tanh(logits / cap) * cap`, three launches on the vocabulary-sized logits)."""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F

from nbx_tune.kernels.serving import gemma_ops
from nbx_tune.kernels.serving.fusions.engine import Fusion, Pattern, _calls

# transformers' GELUTanh (ACT2FN["gelu_pytorch_tanh"], Gemma's hidden_activation): its act is
# functools.partial(F.gelu, approximate="tanh") unless built with the Python formula.
GELU_TANH_ACTIVATION = Pattern('''
def forward(self, input):
    return self.act(input)
''')
_gelu_types: dict[type, bool] = {}


def is_gelu_tanh(module) -> bool:
    """`module` computes F.gelu(x, approximate="tanh") and nothing else."""
    kind = type(module)
    if issubclass(kind, torch.nn.GELU):
        return kind.forward is torch.nn.GELU.forward and module.approximate == "tanh"
    if kind not in _gelu_types:
        _gelu_types[kind] = GELU_TANH_ACTIVATION.matches(kind.__dict__.get("forward"))
    act = getattr(module, "act", None) if _gelu_types[kind] else None
    return (isinstance(act, functools.partial) and act.func is F.gelu and not act.args
            and act.keywords == {"approximate": "tanh"})


def gated_gelu(original: Callable, mlp, x):
    """The gated MLP of SILU_MUL's pattern (kernels/serving/fusions/llama.py) whose activation
    is gelu's tanh form: down(gelu_mul(gate(x), up(x))), or the pattern as written."""
    if not is_gelu_tanh(mlp.act_fn):
        return original(mlp, x)
    _calls["gelu_mul"] += 1
    return mlp.down_proj(gemma_ops.gelu_mul(mlp.gate_proj(x), mlp.up_proj(x)))


def _final_softcap(original: Callable) -> Callable:
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        cap = self.config.final_logit_softcapping
        if cap is None or labels is not None or type(cap) not in (float, int):  # the pattern as written
            return original(self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            cache=cache, inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache,
                            logits_to_keep=logits_to_keep, **kwargs)
        names = original.__globals__
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
        hidden_states = names["slice_logits_to_keep"](outputs.last_hidden_state, logits_to_keep)
        _calls["softcap"] += 1
        logits = gemma_ops.softcap(self.lm_head(hidden_states), float(cap))
        return names["CausalLMOutputWithPast"](loss=None, logits=logits, cache=outputs.cache,
                                               hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    return forward


# transformers' Gemma2ForCausalLM.forward: the logits soft-capped in three launches (div,
# tanh, mul) on a (batch, tokens, vocabulary) tensor, as torch.ops.nbx_tune.softcap (with
# labels, the loss: the pattern as written). It sits behind three decorators.
FINAL_SOFTCAP = Fusion("softcap", "nbx_tune.softcap", Pattern('''
def forward(
    self,
    input_ids=None,
    attention_mask=None,
    position_ids=None,
    cache=None,
    inputs_embeds=None,
    labels=None,
    use_cache=None,
    logits_to_keep=0,
    **kwargs,
):
    # decoder outputs consists of (dec_features, layer_state, dec_hidden, dec_attn)
    outputs: BaseModelOutputWithPast = self.model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        inputs_embeds=inputs_embeds,
        use_cache=use_cache,
        **kwargs,
    )

    hidden_states = outputs.last_hidden_state
    hidden_states = slice_logits_to_keep(hidden_states, logits_to_keep)
    logits = self.lm_head(hidden_states)
    if self.config.final_logit_softcapping is not None:
        logits = logits / self.config.final_logit_softcapping
        logits = torch.tanh(logits)
        logits = logits * self.config.final_logit_softcapping

    loss = None
    if labels is not None:
        loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)

    return CausalLMOutputWithPast(
        loss=loss,
        logits=logits,
        cache=outputs.cache,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
    )
'''), _final_softcap)


# transformers' GemmaRMSNorm._norm, which the norm's forward calls as a method.
_NORM = Pattern('''
def _norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
''')


def _offset_rms_norm(original: Callable) -> Callable:
    def forward(self, x):
        weight = self.weight
        if weight.dtype != x.dtype or weight.dim() != 1 or not _NORM.matches(getattr(type(self), "_norm", None)):
            return original(self, x)  # a weight of another dtype, or another _norm: the pattern as written
        _calls["offset_rms_norm"] += 1
        return gemma_ops.offset_rms_norm(x, weight, self.eps)

    return forward


# transformers' GemmaRMSNorm.forward (Gemma, Gemma 2 and their copies): the norm in fp32,
# scaled by (1 + weight) in fp32, cast back, as torch.ops.nbx_tune.offset_rms_norm.
OFFSET_RMS_NORM = Fusion("offset_rms_norm", "nbx_tune.offset_rms_norm", Pattern('''
def forward(self, x):
    output = self._norm(x.float())
    output = output * (1.0 + self.weight.float())
    return output.type_as(x)
'''), _offset_rms_norm)

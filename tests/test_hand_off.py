"""The hand-off (kernels/serving/hand_off.py): a decoder layer's last add computes the norm the next
layer starts with, only where the model's loop runs nothing between the two, and the value
taken is always the norm of the very tensor handed."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from nbx_tune.kernels.serving.fusions import engine as fusions
from nbx_tune.kernels.serving import hand_off
from tests.test_fusions import PatternDecoderLayer, _norm
from tests.test_serve import no_repo_root_on_path  # noqa: F401  (a fixture)


class Model(nn.Module):
    """A decoder stack as transformers writes one (LlamaModel.forward's loop and final norm)."""

    def __init__(self, n_layers=3, n=24):
        super().__init__()
        torch.manual_seed(1)
        self.layers = nn.ModuleList(PatternDecoderLayer(n) for _ in range(n_layers))
        for layer in self.layers:
            with torch.no_grad():
                layer.input_layernorm.weight.copy_(torch.randn(n))
        self.norm = _norm(n=n)

    def forward(self, hidden_states, scale=None):
        for i, decoder_layer in enumerate(self.layers[: len(self.layers)]):
            hidden_states = decoder_layer(
                hidden_states,
                attention_mask=None,
                position_ids=None,
            )

        hidden_states = self.norm(hidden_states)
        return hidden_states


class ScalingModel(Model):
    """Something of the model's own runs between two layers: no hand-off may skip it."""

    def forward(self, hidden_states, scale=2.0):
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states)
            hidden_states.mul_(scale)
        hidden_states = self.norm(hidden_states)
        return hidden_states


class PassingModel(Model):
    """The loop passes the layer's input on as another argument: not the pattern."""

    def forward(self, hidden_states, scale=None):
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, position_ids=hidden_states)
        return self.norm(hidden_states)


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def _run(model, x, **kw):
    """(unfused output, fused output, the fusions' stats)."""
    ref = model(x, **kw)
    fusions.reset_stats()
    fusions.acquire()
    try:
        got = model(x, **kw)
        stats = fusions.stats()
    finally:
        fusions.release()
    return ref, got, stats


def test_each_layers_last_add_computes_the_next_norm_and_the_models_final_norm():
    model, x = Model(), torch.randn(2, 5, 24)
    ref, got, stats = _run(model, x)
    # 3 adds after attention, 3 last adds handing off (2 to the next layer, 1 to the final
    # norm): one norm is left, the first layer's
    assert stats == {"add_rms_norm": 6, "rms_norm": 1}
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_every_call_takes_the_same_path_the_first_included():
    model, x = Model(), torch.randn(2, 5, 24)
    fusions.reset_stats()
    fusions.acquire()
    try:
        first = model(x)
        once = fusions.stats()
        fusions.reset_stats()
        second = model(x)
        assert fusions.stats() == once
    finally:
        fusions.release()
    assert torch.equal(first, second)


def test_the_loops_of_a_forward_are_read_from_its_syntax():
    assert hand_off.loops_of(Model.forward.__code__) == [("layers", "norm")]
    assert hand_off.loops_of(ScalingModel.forward.__code__) == []  # two statements in the loop
    assert hand_off.loops_of(PassingModel.forward.__code__) == []  # the input passed on again

    def no_final(self, h):
        for layer in self.h:
            h = layer(h)
        h = self.ln_f(h) + 1
        return h

    assert hand_off.loops_of(no_final.__code__) == [("h", None)]


def test_a_model_that_changes_the_sum_between_layers_gets_no_hand_off():
    model, x = ScalingModel(), torch.randn(2, 5, 24)
    ref, got, stats = _run(model, x)
    assert stats == {"add_rms_norm": 3, "rms_norm": 4}
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("where", ["producer", "consumer"])
def test_a_hook_between_two_layers_stops_the_hand_off(where):
    model, x = Model(), torch.randn(2, 5, 24)
    if where == "producer":  # a forward hook that changes the layer's output in place
        model.layers[0].register_forward_hook(lambda m, a, out: out.mul_(3))
    else:  # a pre-hook that changes the next layer's input in place
        model.layers[1].register_forward_pre_hook(lambda m, a: a[0].mul_(3))
    ref, got, stats = _run(model, x)
    # the first layer's norm, the second's own; a layer with a hook hands nothing on either
    assert stats["rms_norm"] == {"producer": 2, "consumer": 3}[where]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_a_norm_takes_only_the_tensor_handed_and_only_unchanged():
    norm = _norm()
    total, normed = torch.randn(3, 24), torch.randn(3, 24)
    hand_off.hand(norm, total, normed)
    assert hand_off.take(norm, total.clone()) is None  # another tensor
    assert hand_off.take(norm, total) is None  # taken once: gone
    hand_off.hand(norm, total, normed)
    total.add_(1)
    assert hand_off.take(norm, total) is None  # changed since
    hand_off.hand(norm, total, normed)
    assert hand_off.take(_norm(), total) is None  # another norm
    hand_off.hand(norm, total, normed)
    assert hand_off.take(norm, total) is normed
    with torch.inference_mode():  # no version to read: the loop's syntax and the hooks vouch
        t = torch.randn(3, 24)
        hand_off.hand(norm, t, normed)
        assert hand_off.take(norm, t) is normed


def test_a_layer_called_on_its_own_has_no_successor_and_links_keep_no_model_alive():
    layer = PatternDecoderLayer()
    fusions.reset_stats()
    fusions.acquire()
    try:
        layer(torch.randn(2, 3, 24))
        assert fusions.stats() == {"add_rms_norm": 1, "rms_norm": 1}
        model = Model()
        model(torch.randn(2, 3, 24))
        gone = weakref.ref(model.layers[2])
        del model
        gc.collect()
        assert gone() is None
    finally:
        fusions.release()


def test_transformers_llama_and_gpt2_hand_off_and_give_torchs_logits(no_repo_root_on_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2)).eval()
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=3, n_head=4, bos_token_id=0, eos_token_id=0)).eval()
    ids = torch.randint(0, 64, (1, 7))
    with torch.inference_mode():
        ref, got, stats = _run(llama, ids)
        torch.testing.assert_close(got.logits, ref.logits, rtol=1e-5, atol=1e-5)
        assert stats["add_rms_norm"] == 6 and stats["rms_norm"] == 1  # 2 + 1 hand-offs
        ref, got, stats = _run(gpt2, ids)
        torch.testing.assert_close(got.logits, ref.logits, rtol=1e-5, atol=1e-5)
        assert stats["add_layer_norm"] == 5  # 2 hand-offs: ln_f is torch's LayerNorm, not fused

"""Gemma 2's small ops as one launch each: `nbx_tune.gelu_mul` (GeGLU), `nbx_tune.softcap`
(tanh(x / c) * c), `nbx_tune.score_softmax` (eager attention's scale, soft-cap, mask and
fp32 softmax) and `nbx_tune.offset_rms_norm` (Gemma's RMS norm, scaled by 1 + weight). Their kernels against fp64 oracles at odd shapes; their torch ops against the
model's own code, bit for bit; the fusions that call them (kernels/serving/fusions/gemma.py,
eager_attention.py) on tiny transformers models under serve(), against torch's logits."""

from __future__ import annotations

import functools
import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import nbx_tune
from nbx_tune.errors import KernelError
from nbx_tune.kernels.serving import gemma_ops
from nbx_tune.kernels.serving import serve as serving
from nbx_tune.kernels.serving.fusions import engine as fusions
from nbx_tune.kernels.serving.fusions import gemma
from nbx_tune.oracles import elementwise as ew_oracle
from nbx_tune.oracles import norms as norm_oracle
from nbx_tune.oracles import score_softmax as score_oracle
from nbx_tune.profiles import get_profile

# the modules (the package's names of the same spelling are the public ops)
gelu_mul, softcap, score_softmax, offset_rms_norm = (
    importlib.import_module(f"nbx_tune.kernels.{m}") for m in ("gelu_mul", "softcap", "score_softmax", "offset_rms_norm"))
PROFILE = get_profile("interpreter")
DTYPES = {"float32": torch.float32, "float16": torch.float16}


def rel_err(got: torch.Tensor, want: np.ndarray) -> float:
    return float(np.abs(got.double().numpy() - want).max() / np.abs(want).max())


@pytest.fixture
def transformers_off_root(transformers_module):
    """transformers (conftest's transformers_module: the root off sys.path)."""
    return transformers_module


# ----------------------------------------------------------------------------- the kernels

@pytest.mark.parametrize("dt", sorted(DTYPES))
def test_gelu_mul_matches_the_oracle_on_strided_halves(dt):
    g = torch.Generator().manual_seed(1)
    gate, up = (2 * torch.randn(3, 37, 10, generator=g)).to(DTYPES[dt]).chunk(2, -1)
    assert not gate.is_contiguous()
    got = gelu_mul.gelu_mul(gate, up)
    want = ew_oracle.gelu_mul(gate.double().numpy(), up.double().numpy())
    assert got.shape == gate.shape and got.dtype == gate.dtype
    assert rel_err(got, want) <= PROFILE.screen_rtol[dt]
    assert rel_err(got, want) <= rel_err(gemma_ops.gelu_mul(gate, up), want)
    with pytest.raises(KernelError, match="gelu_mul: gate .* one shape"):
        gelu_mul.gelu_mul(torch.randn(3, 4), torch.randn(4))


@pytest.mark.parametrize("dt", sorted(DTYPES))
def test_softcap_matches_the_oracle_across_the_tanh(dt):
    g = torch.Generator().manual_seed(2)
    x = (60 * torch.randn(5, 1, 4099, generator=g)).to(DTYPES[dt])[:, :, 3:]  # an offset view
    got = softcap.softcap(x, 30.0)
    want = ew_oracle.softcap(x.double().numpy(), 30.0)
    assert got.shape == x.shape and got.dtype == x.dtype
    assert rel_err(got, want) <= PROFILE.screen_rtol[dt]
    assert rel_err(got, want) <= rel_err(gemma_ops.softcap(x, 30.0), want) * 1.01 + 1e-7
    with pytest.raises(KernelError, match="cap 0.0"):
        softcap.softcap(x, 0.0)


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("cap", [None, 50.0])
@pytest.mark.parametrize("mask_shape", [None, (2, 1, 5, 37), (1, 3, 5, 37)], ids=["no-mask", "per-batch", "per-head"])
def test_score_softmax_matches_the_oracle(dt, cap, mask_shape):
    g = torch.Generator().manual_seed(3)
    scores = (8 * torch.randn(2, 5, 3, 37, generator=g)).to(DTYPES[dt]).transpose(1, 2)  # (2, 3, 5, 37), strided
    mask = None
    if mask_shape is not None:
        m = torch.rand(mask_shape, generator=g) < 0.3
        m[..., 0] = False
        mask = (m * torch.finfo(DTYPES[dt]).min).to(DTYPES[dt])
    got = score_softmax.score_softmax(scores, 0.3, cap, mask)
    want = score_oracle.score_softmax(scores.double().numpy(), 0.3, cap,
                                      None if mask is None else mask.double().numpy())
    assert got.shape == scores.shape and got.dtype == scores.dtype and got.is_contiguous()
    assert rel_err(got, want) <= PROFILE.screen_rtol[dt]
    assert np.allclose(got.double().numpy().sum(-1), 1.0, atol=1e-2)


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("n", [37, 1100])
def test_offset_rms_norm_matches_the_oracle_on_a_strided_x(dt, n):
    g = torch.Generator().manual_seed(5)
    x = (2 * torch.randn(3, 2 * n, generator=g) + 0.5).to(DTYPES[dt])[:, ::2]
    w = (0.5 * torch.randn(n, generator=g)).to(DTYPES[dt])
    got = offset_rms_norm.offset_rms_norm(x, w, 1e-6)
    want = norm_oracle.offset_rms_norm(x.double().numpy(), w.double().numpy(), 1e-6)
    assert got.shape == x.shape and got.dtype == x.dtype
    assert rel_err(got, want) <= PROFILE.screen_rtol[dt]
    assert rel_err(got, want) <= rel_err(gemma_ops.offset_rms_norm(x, w, 1e-6), want) * 1.01 + 1e-7
    with pytest.raises(KernelError, match="weight"):
        offset_rms_norm.offset_rms_norm(x, w[:-1], 1e-6)


def test_score_softmax_refuses_what_it_does_not_serve():
    s = torch.randn(2, 3, 5, 7)
    with pytest.raises(KernelError, match="mask"):
        score_softmax.score_softmax(s, 1.0, None, torch.zeros(2, 3, 4, 7))
    with pytest.raises(KernelError, match="batch, heads, queries, keys"):
        score_softmax.score_softmax(s[0], 1.0)
    with pytest.raises(KernelError, match="at most"):
        score_softmax.score_softmax(torch.randn(1, 1, 1, score_softmax.MAX_ROW + 1), 1.0)


# ----------------------------------------------------------------------------- the torch ops

def test_the_torch_ops_are_the_models_code_bit_for_bit(transformers_off_root):
    from transformers.activations import ACT2FN
    from transformers.models.gemma2 import modeling_gemma2 as m

    g = torch.Generator().manual_seed(4)
    gate, up = torch.randn(3, 17, generator=g), torch.randn(3, 17, generator=g)
    assert torch.equal(torch.ops.nbx_tune.gelu_mul(gate, up), ACT2FN["gelu_pytorch_tanh"](gate) * up)
    x = 40 * torch.randn(2, 9, generator=g)
    assert torch.equal(torch.ops.nbx_tune.softcap(x, 30.0), torch.tanh(x / 30.0) * 30.0)
    norm = m.Gemma2RMSNorm(9, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    h = x.half()
    assert torch.equal(torch.ops.nbx_tune.offset_rms_norm(h, norm.weight, 1e-6), norm(h))
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g) for _ in range(3))
    mask = torch.zeros(2, 1, 5, 5).masked_fill(torch.ones(5, 5).triu(1).bool(), torch.finfo(torch.float32).min)
    module = torch.nn.Module()
    module.num_key_value_groups, module.head_dim = 1, 8
    _, want = m.eager_attention_forward(module, q, k, v, mask, scaling=0.25, softcap=20.0)
    got = torch.ops.nbx_tune.score_softmax(torch.matmul(q, k.transpose(2, 3)), 0.25, 20.0, mask)
    assert torch.equal(got, want)


def test_only_gelus_tanh_form_is_geglu():
    assert gemma.is_gelu_tanh(torch.nn.GELU(approximate="tanh"))
    assert not gemma.is_gelu_tanh(torch.nn.GELU())

    class GELUTanh(torch.nn.Module):  # transformers' activation, as it writes it
        def __init__(self, approximate="tanh"):
            super().__init__()
            self.act = functools.partial(F.gelu, approximate=approximate)

        def forward(self, input):
            return self.act(input)

    assert gemma.is_gelu_tanh(GELUTanh())
    assert not gemma.is_gelu_tanh(GELUTanh("none"))


# ----------------------------------------------------------------------------- models under serve()

def _tiny(transformers, family: str, **kw):
    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager", **kw)
    if family == "gemma2":
        cfg = transformers.Gemma2Config(head_dim=16, sliding_window=8, **common)
        return transformers.Gemma2ForCausalLM(cfg).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()


@pytest.mark.slow
def test_a_tiny_gemma2_with_eager_attention_runs_its_chains_as_one_launch_each(transformers_off_root):
    model = _tiny(transformers_off_root, "gemma2")
    assert model.config.final_logit_softcapping and model.config.attn_logit_softcapping
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        want = model(ids).logits
        serving.reset_stats()
        with nbx_tune.serve():
            got = model(ids).logits
            fused = fusions.stats()
        again = model(ids).logits  # after: the model's own code, bit for bit
    assert torch.equal(again, want)
    layers = model.config.num_hidden_layers
    assert fused["score_softmax"] == layers and fused["gelu_mul"] == layers and fused["softcap"] == 1
    assert fused["offset_rms_norm"] == 4 * layers + 1  # four a layer and the final norm
    assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-4
    st = serving.stats()
    for op in ("nbx_tune.score_softmax", "nbx_tune.gelu_mul", "nbx_tune.softcap", "nbx_tune.offset_rms_norm"):
        assert st[op]["certified"] + st[op]["default"] >= 1 and not st[op]["torch"], (op, st[op])
    assert "aten.tanh" not in st  # both soft-caps fused
    assert not fusions.swapped()


@pytest.fixture
def fused_only():
    """The fusions without serve(): the one ops run their torch bodies (the pattern's ops)."""
    fusions.acquire()
    fusions.reset_stats()
    yield
    fusions.release()


@pytest.mark.parametrize("family", ["gemma2", "llama"])
def test_fused_models_give_the_models_logits_bit_for_bit(transformers_off_root, fused_only, family):
    """Outside serve() each one op is its pattern's own ops: the swapped code changes nothing."""
    model = _tiny(transformers_off_root, family)
    fusions.settle()  # a model module imported while active: judged once imported (serve() does it on an op)
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        got = model(ids).logits
        fused = fusions.stats()
        fusions.release()
        try:
            want = model(ids).logits
        finally:
            fusions.acquire()
    assert torch.equal(got, want)
    layers = model.config.num_hidden_layers
    assert fused["score_softmax"] == layers
    if family == "gemma2":
        assert fused["gelu_mul"] == layers and fused["softcap"] == 1 and fused["offset_rms_norm"] == 4 * layers + 1


def test_with_dropout_in_training_the_attention_is_the_models_own(transformers_off_root, fused_only):
    model = _tiny(transformers_off_root, "gemma2", attention_dropout=0.5)
    fusions.settle()
    model.train()
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 5)))
    assert "score_softmax" not in fusions.stats() and fusions.stats()["gelu_mul"] == 2


def test_a_gemma_norm_with_another_norm_method_runs_as_written(transformers_off_root, fused_only):
    from transformers.models.gemma2 import modeling_gemma2 as m

    fusions.settle()
    assert "offset_rms_norm" in fusions.swapped().get(f"{m.__name__}.Gemma2RMSNorm.forward", "")

    class EpsOutside(m.Gemma2RMSNorm):  # the same forward, another _norm
        def _norm(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)) + self.eps

    norm, x = EpsOutside(8), torch.randn(2, 8)
    with torch.no_grad():
        norm(x)
    assert "offset_rms_norm" not in fusions.stats()

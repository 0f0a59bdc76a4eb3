"""Fusions (kernels/serving/fusions/): model code that is exactly a known pattern runs as one op
while serve() or the recorder is active, and only then; a variant is never swapped."""

from __future__ import annotations

import math
import sys
from collections import Counter

import pytest
import torch
from torch import nn

import nbx_tune
from nbx_tune.kernels.serving.fusions import engine as fusions, llama
from nbx_tune.kernels.serving import serve as serving
from nbx_tune.tuner.trace.recorder import Recorder


class PatternNorm(nn.Module):
    """transformers' LlamaRMSNorm, written as a model library writes it."""

    def __init__(self, hidden_size, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        "A docstring and annotations the pattern does not have."
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)  # a comment
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


PATTERN_FORWARD = PatternNorm.forward  # as defined, before any fusion context


class NewGelu(nn.Module):
    """transformers' NewGELUActivation (GPT-2's gelu_new)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class NewGeluOtherConstant(nn.Module):
    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.0447 * torch.pow(input, 3.0))))


class OnePlusWeightNorm(PatternNorm):
    """Gemma's variant: scales by (1 + weight). Same names, other arithmetic."""

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (1.0 + self.weight) * hidden_states.to(input_dtype)


class EpsOutsideNorm(PatternNorm):
    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance) + self.variance_epsilon
        return self.weight * hidden_states.to(input_dtype)


@pytest.fixture(autouse=True)
def no_grad():
    """Fusions serve inference: these tests run without grad, as a served model does."""
    with torch.no_grad():
        yield


@pytest.fixture
def fused():
    fusions.reset_stats()
    fusions.acquire()
    try:
        yield
    finally:
        fusions.release()


def _norm(cls=PatternNorm, n=24, dtype=torch.float32):
    torch.manual_seed(0)
    m = cls(n).to(dtype)
    with torch.no_grad():
        m.weight.copy_(torch.randn(n))
    return m


def test_the_pattern_is_swapped_inside_and_restored_after(fused):
    m = _norm()
    x = torch.randn(3, 5, 24)
    assert type(m).forward.__wrapped__ is PATTERN_FORWARD
    y = m(x)
    assert fusions.stats() == {"rms_norm": 1}
    assert f"{__name__}.PatternNorm.forward" in fusions.swapped()
    fusions.release()
    try:
        assert type(m).forward is PATTERN_FORWARD
        ref = m(x)
    finally:
        fusions.acquire()  # the fixture releases once more
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)
    assert fusions.stats() == {"rms_norm": 1}


@pytest.mark.parametrize("cls", [OnePlusWeightNorm, EpsOutsideNorm])
def test_a_variant_is_never_swapped(fused, cls):
    assert "__wrapped__" not in vars(cls.forward)
    assert not any(name.endswith(f".{cls.__qualname__}.forward") for name in fusions.swapped())
    m = _norm(cls)
    m(torch.randn(2, 24))
    assert fusions.stats() == {}


def test_torch_bound_to_something_else_is_not_the_pattern(tmp_path, monkeypatch):
    assert llama.RMS_NORM.pattern.matches(PATTERN_FORWARD)
    (tmp_path / "other_torch.py").write_text("import torch.nn as torch\n" + llama.RMS_NORM.pattern.source)
    monkeypatch.syspath_prepend(str(tmp_path))
    import other_torch

    assert not llama.RMS_NORM.pattern.matches(other_torch.forward)
    namespace = {"torch": torch}  # the very pattern, but no source to read: never swapped
    exec(compile(llama.RMS_NORM.pattern.source, "<no file>", "exec"), namespace)
    assert not llama.RMS_NORM.pattern.matches(namespace["forward"])


def test_a_class_defined_while_active_is_swapped_and_the_hook_leaves_after():
    assert "__init_subclass__" not in vars(nn.Module)
    fusions.acquire()
    try:
        assert "__init_subclass__" in vars(nn.Module)

        class LateNorm(nn.Module):
            forward = PATTERN_FORWARD

        class LateOther(nn.Module):
            def forward(self, x):
                return x

        assert vars(LateNorm)["forward"].__wrapped__ is PATTERN_FORWARD
        assert not hasattr(vars(LateOther)["forward"], "__wrapped__")
    finally:
        fusions.release()
    assert "__init_subclass__" not in vars(nn.Module)
    assert vars(LateNorm)["forward"] is PATTERN_FORWARD


def test_gpt2s_gelu_is_one_tanh_gelu_and_a_changed_constant_is_not(fused):
    x = torch.randn(5, 33, dtype=torch.float64)
    y = NewGelu()(x)
    assert fusions.stats() == {"gelu_tanh": 1}
    z = NewGeluOtherConstant()(x)
    assert fusions.stats() == {"gelu_tanh": 1}
    torch.testing.assert_close(y, torch.nn.functional.gelu(x, approximate="tanh"), rtol=0, atol=0)
    ref = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)  # the same function
    assert not torch.equal(z, ref)


class PatternMLP(nn.Module):
    """transformers' LlamaMLP."""

    def __init__(self, act):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(12, 20, bias=False), nn.Linear(12, 20, bias=False)
        self.down_proj = nn.Linear(20, 12, bias=False)
        self.act_fn = act

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


MLP_FORWARD = PatternMLP.forward


def test_the_mlps_silu_times_up_is_one_op_and_another_activation_is_kept(fused):
    torch.manual_seed(0)
    x = torch.randn(3, 12)
    for act, calls in ((nn.SiLU(), 1), (nn.GELU(), 0)):
        m = PatternMLP(act)
        y = m(x)
        assert fusions.stats().get("silu_mul", 0) == calls
        torch.testing.assert_close(y, MLP_FORWARD(m, x), rtol=0, atol=0)  # outside serve: torch's own math
        fusions.reset_stats()


def rename_kwarg(old, new):
    """A kwarg-renaming decorator, as transformers' deprecate_kwarg is (it wraps decoder layers)."""
    import functools

    def decorate(func):
        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            if old in kwargs:
                kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)
        return wrapped
    return decorate


class ToyAttention(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.o_proj = nn.Linear(n, n, bias=False)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                position_embeddings=None, **kwargs):
        return self.o_proj(hidden_states), None


class PatternDecoderLayer(nn.Module):
    """transformers' LlamaDecoderLayer (5.25), its forward behind two decorators."""

    def __init__(self, n=24):
        super().__init__()
        self.self_attn = ToyAttention(n)
        self.mlp = nn.Linear(n, n, bias=False)
        self.input_layernorm, self.post_attention_layernorm = _norm(n=n), _norm(n=n)

    @rename_kwarg("past_key_values", "cache")
    @rename_kwarg("layer_past", "cache")
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> torch.Tensor:
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


DECORATED_FORWARD = vars(PatternDecoderLayer)["forward"]


def _layer_cell():
    """The cell of the innermost decorator that holds the layer's own forward."""
    inner = DECORATED_FORWARD.__wrapped__
    return next(c for c in inner.__closure__ if c.cell_contents is inner.__wrapped__
                or getattr(c.cell_contents, "__wrapped__", None) is inner.__wrapped__)


def test_a_decoder_layer_behind_decorators_has_its_add_and_norm_fused_in_the_decorators_cell():
    torch.manual_seed(0)
    layer, x = PatternDecoderLayer(), torch.randn(2, 5, 24)
    own = DECORATED_FORWARD.__wrapped__.__wrapped__
    ref = layer(x)  # no context: the model's code
    fusions.reset_stats()
    fusions.acquire()
    try:
        assert vars(PatternDecoderLayer)["forward"] is DECORATED_FORWARD  # the decorators stay
        assert _layer_cell().cell_contents.__wrapped__ is own
        assert fusions.swapped()[f"{__name__}.PatternDecoderLayer.forward"] == "nbx_tune.add_rms_norm"
        y = layer(x, past_key_values=None)  # through the renaming
        assert fusions.stats() == {"add_rms_norm": 1, "rms_norm": 1}
        layer.post_attention_layernorm.register_forward_hook(lambda *a: None)  # a hook must run: not fused
        z = layer(x)
        assert fusions.stats() == {"add_rms_norm": 1, "rms_norm": 3}
    finally:
        fusions.release()
    assert _layer_cell().cell_contents is own
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)  # F.rms_norm's rounding, not the pattern's
    assert torch.equal(y, z)  # the one op's composite is the add and the norm the layer makes


def test_a_layer_whose_post_norm_is_a_variant_keeps_its_add(fused):
    layer = PatternDecoderLayer()
    layer.post_attention_layernorm = _norm(OnePlusWeightNorm)
    y = layer(torch.randn(2, 3, 24))
    assert fusions.stats() == {"rms_norm": 1} and y.shape == (2, 3, 24)


def test_the_recorder_writes_the_layers_add_and_norm_as_one_row():
    layer = PatternDecoderLayer().to(torch.float16)
    with torch.inference_mode(), Recorder() as rec:
        layer(torch.randn(3, 7, 24).to(torch.float16))
    rows = {r.op: r for r in rec.rows}
    row = rows["nbx_tune.add_rms_norm"]
    assert row.shapes == ((3, 7, 24), (3, 7, 24), (24,)) and dict(row.params) == {"eps": "1e-06"}
    assert rows["aten.rms_norm"].count == 1 and rows["aten.add.Tensor"].count == 1


def test_with_grad_wanted_the_models_own_code_runs(fused):
    m = _norm()
    x = torch.randn(3, 24, requires_grad=True)
    with torch.enable_grad():
        m(x).sum().backward()
    assert fusions.stats() == {} and x.grad is not None and m.weight.grad is not None


def test_a_weight_in_another_dtype_keeps_the_patterns_promotion(fused):
    m = _norm()  # float32 weight
    x = torch.randn(4, 24).to(torch.float16)
    y = m(x)
    assert y.dtype == torch.float32  # weight (fp32) * normalized (fp16): the pattern's dtype
    assert fusions.stats() == {}


def test_serve_and_the_recorder_fuse_by_default_and_not_when_turned_off(monkeypatch):
    m = _norm()
    x = torch.randn(3, 24)

    def recorded(**kw):
        with torch.inference_mode(), Recorder(**kw) as rec:
            m(x)
        return Counter(r.op for r in rec.rows for _ in range(r.count))

    assert recorded() == {"aten.rms_norm": 1}
    unfused = recorded(fuse=False)
    assert unfused["aten.rms_norm"] == 0 and unfused["aten.rsqrt"] == 1 and sum(unfused.values()) >= 6
    monkeypatch.setenv(fusions.ENV_FUSE, "0")
    assert recorded() == unfused
    assert serving.serve().fuse is False and serving.serve(fuse=True).fuse is True


def test_the_recorder_writes_the_one_op_on_the_meta_device():
    with torch.device("meta"):
        m = PatternNorm(4096).to(torch.bfloat16)
        x = torch.empty(1, 7, 4096, dtype=torch.bfloat16)
    with torch.inference_mode(), Recorder() as rec:
        m(x)
    (row,) = rec.rows
    assert (row.op, row.dtypes, row.shapes) == ("aten.rms_norm", ("bfloat16", "bfloat16"), ((1, 7, 4096), (4096,)))
    assert dict(row.params)["eps"] == "1e-06"


def test_under_serve_the_norm_is_one_served_launch():
    m = _norm(n=40)
    x = torch.randn(3, 7, 40)
    with torch.inference_mode():
        ref = m(x)
        serving.reset_stats()
        with nbx_tune.serve():
            y = m(x)
        st = serving.stats()
    assert set(st) == {"aten.rms_norm"}, st
    assert st["aten.rms_norm"]["certified"] + st["aten.rms_norm"]["default"] == 1
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    assert "fused: rms_norm (1 calls)" in serving.format_stats()


def test_transformers_patterns_are_swapped_and_their_variants_are_not(fused, monkeypatch):
    pytest.importorskip("transformers")
    root = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", root)])
    import importlib

    wanted = {"models.llama.modeling_llama.LlamaRMSNorm": True,
              "models.qwen2.modeling_qwen2.Qwen2RMSNorm": True,
              "models.mistral.modeling_mistral.MistralRMSNorm": True,
              "models.gemma.modeling_gemma.GemmaRMSNorm": True,  # (1 + weight): its own op, not rms_norm
              "models.llama.modeling_llama.LlamaMLP": True,
              "models.gpt2.modeling_gpt2.GPT2MLP": False,
              "activations.NewGELUActivation": True,  # GPT-2's gelu_new
              "activations.GELUActivation": False}  # erf's gelu, already one op
    for path in wanted:
        importlib.import_module(f"transformers.{path.rsplit('.', 1)[0]}")
    fusions.settle()  # imported while active (unless an earlier test did): judged once imported
    for path, swap in wanted.items():
        module, cls = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(f"transformers.{module}"), cls)
        assert hasattr(vars(cls)["forward"], "__wrapped__") == swap, path
    # decoder layers behind their kwarg decorators: the residual add and the norm after attention
    swapped = fusions.swapped()
    for path, op in (("llama.modeling_llama.LlamaDecoderLayer", "add_rms_norm"),
                     ("qwen2.modeling_qwen2.Qwen2DecoderLayer", "add_rms_norm"),
                     ("mistral.modeling_mistral.MistralDecoderLayer", "add_rms_norm"),
                     ("gpt2.modeling_gpt2.GPT2Block", "add_layer_norm"),
                     ("llama.modeling_llama.LlamaRotaryEmbedding", "rope_cos_sin"),
                     ("qwen2.modeling_qwen2.Qwen2RotaryEmbedding", "rope_cos_sin")):
        assert swapped[f"transformers.models.{path}.forward"] == f"nbx_tune.{op}", path
    assert swapped["transformers.cache_utils.DynamicLayer.update"] == "nbx_tune.cat_kv"  # a class, not a module
    assert swapped["transformers.models.gemma.modeling_gemma.GemmaRMSNorm.forward"] == "nbx_tune.offset_rms_norm"
    # the rotary tables behind dynamic_rope_update: one op, and the pattern where inv_freq is not float32
    from transformers import LlamaConfig

    llama_ = importlib.import_module("transformers.models.llama.modeling_llama")
    emb = llama_.LlamaRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=2))
    x, pos = torch.empty(0, dtype=torch.float16), torch.arange(9).view(1, 9)
    fusions.reset_stats()
    tables = emb(x, pos)
    assert fusions.stats() == {"rope_cos_sin": 1} and tables[0].shape == (1, 9, 32)
    emb.inv_freq = emb.inv_freq.double()
    emb(x, pos)
    assert fusions.stats() == {"rope_cos_sin": 1}
    # a function, behind the kernel hub's wrapper module where transformers has one
    llama = importlib.import_module("transformers.models.llama.modeling_llama")
    assert fusions.swapped()["transformers.models.llama.modeling_llama.apply_rotary_pos_emb"] == "nbx_tune.rotary_qk"
    q, k = torch.randn(2, 7, 3, 8).transpose(1, 2), torch.randn(2, 7, 1, 8).transpose(1, 2)
    cos, sin = torch.randn(2, 7, 8), torch.randn(2, 7, 8)
    fusions.reset_stats()
    got = llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert fusions.stats() == {"rotary": 1}
    want = llama.apply_rotary_pos_emb.__wrapped__(q, k, cos, sin)
    assert all(torch.equal(a, b) for a, b in zip(got, want))  # outside serve: the pattern's own ops


@pytest.mark.slow
def test_nbx_tune_run_fuses_a_class_the_program_defines(tmp_path):
    """`nbx-tune run` enters serve() before the program imports its model code: the class is
    checked when created, and its norm is one served aten.rms_norm."""
    import inspect
    import json

    from nbx_tune.tuner.trace.serve_main import run_command

    script = tmp_path / "prog.py"
    script.write_text("import torch\nfrom torch import nn\n\n\n"
                      + inspect.getsource(PatternNorm)
                      + "\n\nwith torch.inference_mode():\n"
                        "    PatternNorm(40)(torch.randn(3, 40))\n")
    stats = tmp_path / "stats.json"
    assert run_command([sys.executable, str(script)], stats) == 0
    data = json.loads(stats.read_text())
    assert set(data) == {"aten.ones", "aten.rms_norm"}, data  # the weight's init, the norm
    assert data["aten.rms_norm"]["certified"] + data["aten.rms_norm"]["default"] == 1


# A function target, as transformers' apply_rotary_pos_emb is: a module-level function
# that calls a module-level helper, and which a kernel hub may wrap in an nn.Module.
_HALF = fusions.Pattern('''
def halve(x):
    return x * 0.5
''')
_TWICE_HALF = fusions.Pattern('''
def twice_half(a, b):
    return halve(a), halve(b)
''', helpers=(("halve", _HALF),))

MODEL_MODULE = '''
import torch
from torch import nn


def halve(x):
    return x * 0.5


def twice_half(a, b):
    """Both halved."""
    return halve(a), halve(b)


class Layer(nn.Module):  # a class: its creation, while a context is active, checks the module
    pass


def wrap(func):  # a kernel hub's wrapper: a module whose forward calls the function
    class Func(nn.Module):
        def forward(self, *args):
            return func(*args)
    return Func()


wrapped_twice_half = wrap(twice_half)
'''


@pytest.fixture
def function_fusion(monkeypatch):
    def make(original):
        def fused(a, b):
            fusions._calls["twice_half"] += 1
            return original(a, b)
        return fused

    fusion = fusions.Fusion("twice_half", "aten.mul.Tensor", _TWICE_HALF, make, function="twice_half")
    monkeypatch.setattr(fusions, "FUSIONS", (*fusions.FUSIONS, fusion))
    fusions.reset_stats()
    return fusion


def _model_module(tmp_path, monkeypatch, name, source=MODEL_MODULE):
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    return importlib.import_module(name)


def test_a_module_function_is_swapped_and_restored(tmp_path, monkeypatch, function_fusion):
    mod = _model_module(tmp_path, monkeypatch, "model_fn_a")
    original = mod.twice_half
    fusions.acquire()
    try:
        assert mod.twice_half is not original and mod.twice_half.__wrapped__ is original
        assert fusions.swapped()["model_fn_a.twice_half"] == "aten.mul.Tensor"
        mod.twice_half(torch.ones(2), torch.ones(3))
        assert fusions.stats() == {"twice_half": 1}
    finally:
        fusions.release()
    assert mod.twice_half is original


def test_a_function_whose_helper_differs_is_not_swapped(tmp_path, monkeypatch, function_fusion):
    mod = _model_module(tmp_path, monkeypatch, "model_fn_b",
                        MODEL_MODULE.replace("return x * 0.5", "return x * 0.25"))
    fusions.acquire()
    try:
        assert "__wrapped__" not in vars(mod.twice_half)
    finally:
        fusions.release()


def test_a_hub_wrapped_function_is_judged_by_the_function_it_wraps(tmp_path, monkeypatch):
    mod = _model_module(tmp_path, monkeypatch, "model_fn_d")
    assert fusions.underlying(mod.twice_half, "twice_half") is mod.twice_half
    assert fusions.underlying(mod.wrapped_twice_half, "twice_half") is mod.twice_half
    assert fusions.underlying(mod.wrapped_twice_half, "halve") is None
    assert _TWICE_HALF.matches(fusions.underlying(mod.wrapped_twice_half, "twice_half"))


def test_a_module_imported_while_active_gets_its_functions_swapped(tmp_path, monkeypatch, function_fusion):
    fusions.acquire()
    try:
        mod = _model_module(tmp_path, monkeypatch, "model_fn_c")  # its Layer class notes the module
        fusions.settle()
        assert mod.twice_half.__wrapped__.__name__ == "twice_half"
        kept = mod.twice_half  # as a module importing it by name now keeps it
        kept(torch.ones(1), torch.ones(1))
        assert fusions.stats() == {"twice_half": 1}
    finally:
        fusions.release()
    assert "__wrapped__" not in vars(mod.twice_half)
    kept(torch.ones(1), torch.ones(1))  # outside the context: the original runs
    assert fusions.stats() == {"twice_half": 1}


def test_a_trace_says_which_fusions_it_was_recorded_with(tmp_path):
    from nbx_tune.tuner.trace.recorder import record

    m = _norm()
    for fuse, note in ((True, "# fusions: rms_norm x2 (kernels/serving/fusions/)"),
                       (False, "# fusions: off (the model's own ops, as torch runs them)")):
        path = tmp_path / f"{fuse}.tsv"
        with torch.inference_mode(), record(path, ["a comment"], fuse=fuse):
            m(torch.randn(2, 24))
            m(torch.randn(3, 24))
        lines = path.read_text().splitlines()
        assert lines[1:3] == ["# a comment", note], lines[:4]


def test_a_module_imported_while_active_is_swapped_once_imported_not_before(tmp_path, monkeypatch, function_fusion):
    """transformers hands apply_rotary_pos_emb to a class decorator that checks what it is
    given, later in the same module: nothing of a module is swapped while it is imported."""
    source = MODEL_MODULE + '''

twice_half.marker = True


def needs_marker(fn):
    assert hasattr(fn, "marker"), "swapped while the module was still being imported"
    return lambda cls: cls


@needs_marker(twice_half)
class Attention(nn.Module):
    pass
'''
    fusions.acquire()
    try:
        mod = _model_module(tmp_path, monkeypatch, "model_fn_e", source)
        assert "__wrapped__" not in vars(mod.twice_half) and fusions.pending
        with torch.inference_mode(), Recorder():
            torch.ones(2) + 1  # an op settles what was imported
        assert mod.twice_half.__wrapped__.__name__ == "twice_half" and not fusions.pending
    finally:
        fusions.release()


@pytest.mark.slow
def test_nbx_tune_run_fuses_a_transformers_llama_the_program_imports(tmp_path):
    """The whole path of a program: transformers imported under serve() (its modules judged
    once imported, its decorators untouched), then every pattern runs as its one op."""
    pytest.importorskip("transformers")
    import json

    from nbx_tune.tuner.trace.serve_main import run_command

    script = tmp_path / "llama_prog.py"
    script.write_text(
        "import torch, transformers\n"
        "cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,\n"
        "    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)\n"
        "torch.manual_seed(0)\n"
        "model = transformers.LlamaForCausalLM(cfg).eval()\n"
        "with torch.inference_mode():\n"
        "    model(torch.randint(0, 64, (1, 5)))\n")
    stats = tmp_path / "stats.json"
    assert run_command([sys.executable, str(script)], stats) == 0
    data = json.loads(stats.read_text())
    launches = {op: s["certified"] + s["default"] for op, s in data.items()}
    assert launches["aten.rms_norm"] == 1 and launches["nbx_tune.rotary_qk"] == 1  # q and k: one launch
    assert launches["nbx_tune.silu_mul"] == 1
    # the layer behind its decorators: its add and norm after attention, and its last add with
    # the model's final norm (the hand-off), which leaves one norm, the layer's first
    assert launches["nbx_tune.add_rms_norm"] == 2
    assert launches["nbx_tune.cat_kv"] == 1  # the KV cache's class, imported under the context
    assert launches["nbx_tune.rope_cos_sin"] == 1
    assert not {"aten.rsqrt", "aten.neg", "aten.silu", "aten.pow.Tensor_Scalar"} & set(launches), launches
    fused_ops = ("aten.rms_norm", "nbx_tune.rotary_qk", "nbx_tune.silu_mul", "nbx_tune.add_rms_norm",
                 "nbx_tune.cat_kv", "nbx_tune.rope_cos_sin")
    assert all(data[op]["torch"] == 0 for op in fused_ops), data

"""The library's fused ops on the interpreter (and the screen of Gemma's: tests/test_gemma_fusions.py):
`nbx_tune.rotary` (rotary position embedding of one tensor), `nbx_tune.silu_mul` (silu(gate) * up)
and `nbx_tune.add_rms_norm` / `add_layer_norm` (a residual add and the norm of the sum), `nbx_tune.rope_cos_sin` (the rotary
embedding's cos and sin tables), `nbx_tune.cat_kv` (a KV cache's two cats). Their kernels against the fp64
oracles at odd shapes and strides; their torch ops (kernels/serving/custom_ops.py) against
transformers' own code, bit for bit, and their backward; recorded rows (CPU and meta) to
seats; a census of those seats; and serve() running the torch ops on the certified kernels."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import nbx_tune
from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import certified
from nbx_tune.kernels.serving import custom_ops
from nbx_tune.kernels import kv_cache, residual_norm, rope, swiglu
from nbx_tune.kernels.serving import serve as serving
from nbx_tune.kernels.runtime.registry import spec_for_op
from nbx_tune.kernels.spec import NotServable
from nbx_tune.oracles import elementwise as ew_oracle
from nbx_tune.oracles import norms as norm_oracle
from nbx_tune.oracles import rope as rope_oracle
from nbx_tune.profiles import get_profile
from nbx_tune.tuner.certify.selfcheck import check_kernel
from nbx_tune.kernels.trace import make_row

PROFILE = get_profile("interpreter")
SPECS = (rope.SPEC, rope.QK_SPEC, rope.COS_SIN_SPEC, swiglu.SPEC, residual_norm.RMS_SPEC, residual_norm.LAYER_SPEC,
         kv_cache.SPEC,  # and Gemma's (tests/test_gemma_fusions.py), modules named as their public ops
         *(importlib.import_module(f"nbx_tune.kernels.{m}").SPEC for m in ("gelu_mul", "softcap", "score_softmax",
                                                                   "offset_rms_norm")))
DTYPES = {"float32": torch.float32, "float16": torch.float16}


@pytest.fixture
def transformers_llama(transformers_module):
    """transformers' Llama module (conftest's transformers_module: the root off sys.path)."""
    from transformers.models.llama import modeling_llama

    return modeling_llama


def rel_err(got: torch.Tensor, want: np.ndarray) -> float:
    return float(np.abs(got.double().numpy() - want).max() / np.abs(want).max())


def rotary_inputs(dt, B=2, H=3, S=7, D=10, cos_batch=None, seed=0):
    """x as transformers makes q: a (B, S, H, D) projection viewed as (B, H, S, D)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, H, D, generator=g).to(dt).transpose(1, 2)
    cb = B if cos_batch is None else cos_batch
    cos = (torch.rand(cb, S, D, generator=g) * 2 - 1).to(dt)
    sin = (torch.rand(cb, S, D, generator=g) * 2 - 1).to(dt)
    return x, cos, sin


# ----------------------------------------------------------------------------- the screen


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
@pytest.mark.slow
def test_selfcheck_small_rows_pass_the_screen(spec):
    checks = check_kernel(spec, PROFILE, "cpu", "small", configs_per_row=3)
    bad = [(c.op, c.shapes, c.dtype, str(c.config), c.reason, c.detail) for c in checks if not c.ok]
    assert not bad
    assert {"float16", "float32"} <= {c.dtype for c in checks}
    assert len({c.config for c in checks}) >= 2


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_gpu_rows_are_servable_and_claim_every_dtype(spec):
    problems = [spec.problem_from_row(r) for r in spec.example_rows("gpu")]
    assert not [p for p in problems if isinstance(p, NotServable)]
    assert {"float16", "bfloat16", "float32"} <= {p.dtypes[0] for p in problems}
    assert spec.default_config(PROFILE, problems[0]) in spec.configs()


# ----------------------------------------------------------------------------- the kernels


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("cos_batch", [None, 1])
def test_rotary_matches_the_oracle_on_a_transposed_view(dt, cos_batch):
    x, cos, sin = rotary_inputs(DTYPES[dt], cos_batch=cos_batch)
    assert not x.is_contiguous()
    got = rope.rotary(x, cos, sin)
    want = rope_oracle.rotary(x.double().numpy(), cos.double().numpy(), sin.double().numpy())
    assert got.shape == x.shape and got.dtype == x.dtype
    assert rel_err(got, want) <= PROFILE.screen_rtol[dt]
    torch_way = custom_ops.rotary(x, cos, sin)  # three roundings in fp16, one here
    assert rel_err(got, want) <= rel_err(torch_way, want)
    assert got.stride() == torch_way.stride()  # the layout torch's result has


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("cos_batch", [None, 1])
def test_rotary_qk_rotates_q_and_k_of_their_own_heads_in_one_launch(dt, cos_batch):
    """Grouped-query: q of 3 heads, k of 1, both transposed views, one launch for both."""
    q, cos, sin = rotary_inputs(DTYPES[dt], cos_batch=cos_batch, seed=4)
    k = rotary_inputs(DTYPES[dt], H=1, seed=5)[0]
    rope.REMEMBERED.clear()
    launches = []
    real = rope.launch_rotary
    rope.launch_rotary = lambda *a, **kw: (launches.append(1), real(*a, **kw))[1]
    try:
        got_q, got_k = rope.rotary_qk(q, k, cos, sin)
    finally:
        rope.launch_rotary = real
    assert launches == [1]
    tol = 1e-6 if dt == "float32" else 2e-3
    for got, x in ((got_q, q), (got_k, k)):
        want = rope_oracle.rotary(x.double().numpy(), cos.double().numpy(), sin.double().numpy())
        assert got.shape == x.shape and rel_err(got, want) <= tol
    with pytest.raises(KernelError, match="one batch, sequence and head dim"):
        rope.rotary_qk(q, k[..., :4, :], cos, sin)


def test_rotary_reads_strided_halves_and_cos_of_any_layout():
    # x's last dim not innermost: staged; cos a transposed view: staged; a contiguous x too.
    x, cos, sin = rotary_inputs(torch.float32, B=1, H=5, S=3, D=6)
    xs = x.transpose(2, 3).contiguous().transpose(2, 3)
    ct = cos.transpose(1, 2).contiguous().transpose(1, 2)
    want = rope_oracle.rotary(x.double().numpy(), cos.double().numpy(), sin.double().numpy())
    for args in ((xs, cos, sin), (x.contiguous(), ct, sin), (x, cos, sin)):
        assert rel_err(rope.rotary(*args), want) <= 1e-6


def test_rotary_planted_swap_of_the_halves_is_caught():
    """The oracle is not the kernel's mirror: rotating the other way differs from it."""
    x, cos, sin = rotary_inputs(torch.float32)
    want = rope_oracle.rotary(x.double().numpy(), cos.double().numpy(), sin.double().numpy())
    h = x.shape[-1] // 2
    wrong = x * cos.unsqueeze(1) + torch.cat((x[..., h:], -x[..., :h]), -1) * sin.unsqueeze(1)
    assert rel_err(wrong, want) > 0.1


def test_the_screen_runs_rotary_on_a_models_layout_and_catches_a_kernel_that_ignores_it():
    """The screen lays x out as a model's q ((B, S, H, D) memory viewed as (B, H, S, D)): the
    kernel's launch passes it, a launch that reads x as if contiguous fails it."""
    from nbx_tune.tuner.certify import screen as screening

    problem = rope.SPEC.problem_from_row(make_row("nbx_tune.rotary", ["float32"] * 3,
                                                  [(2, 3, 7, 10), (1, 7, 10), (1, 7, 10)]))
    case = screening.make_case(rope.SPEC, problem, "cpu", 7, True)
    rtol = screening.output_rtols(rope.SPEC, problem, PROFILE)["out"]
    config = rope.SPEC.default_config(PROFILE, problem)
    right = torch.empty(2, 7, 3, 10)
    rope.SPEC.launch(config, problem, case.inputs, {"out": right})
    assert screening.compare("out", right, case.reference("out", right), rtol, problem).ok
    wrong = torch.empty(2, 7, 3, 10)
    x, c, s = (case.inputs[k] for k in ("x", "cos", "sin"))
    rope.launch_rotary(x.reshape(2, 3, 7, 10), c.reshape(1, 7, 10), s.reshape(1, 7, 10),
                       wrong.view(2, 3, 7, 10), config)
    assert screening.compare("out", wrong, case.reference("out", wrong), rtol, problem).reason == "wrong_answer"


@pytest.mark.parametrize("dt", sorted(DTYPES))
def test_silu_mul_matches_the_oracle(dt):
    g = torch.Generator().manual_seed(1)
    both = (2 * torch.randn(3, 37, 10, generator=g)).to(DTYPES[dt])
    gate, up = both.chunk(2, -1)  # a fused gate/up projection's halves: strided views
    assert not gate.is_contiguous()
    got = swiglu.silu_mul(gate, up)
    want = ew_oracle.silu_mul(gate.double().numpy(), up.double().numpy())
    assert got.shape == gate.shape and got.dtype == gate.dtype
    assert rel_err(got, want) <= PROFILE.screen_rtol[dt]
    assert rel_err(got, want) <= rel_err(custom_ops.silu_mul(gate, up), want)


def _add_norm_inputs(dt, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, r = (torch.randn(*shape, generator=g) * 2).to(dt), (torch.randn(*shape, generator=g) * 2 + 0.5).to(dt)
    w, b = (1 + 0.5 * torch.randn(shape[-1], generator=g)).to(dt), (0.5 * torch.randn(shape[-1], generator=g)).to(dt)
    return x, r, w, b


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("shape", [(3, 7, 37), (2, 20000)], ids=["rows", "looped"])  # 20000: past any block
def test_add_norms_match_the_oracle_and_return_torchs_sum(dt, shape):
    x, r, w, b = _add_norm_inputs(DTYPES[dt], shape)
    total = x.double().numpy() + r.double().numpy()
    for got, want in ((residual_norm.add_rms_norm(x, r, w, 1e-5),
                       norm_oracle.rms_norm(total, 1, w.double().numpy(), 1e-5)[0]),
                      (residual_norm.add_layer_norm(x, r, w, b, 1e-5),
                       norm_oracle.layer_norm(total, 1, w.double().numpy(), b.double().numpy(), 1e-5)[0])):
        out, s = got
        assert out.shape == s.shape == x.shape and out.dtype == s.dtype == x.dtype
        assert rel_err(out, want) <= PROFILE.screen_rtol[dt]
        assert torch.equal(s, r + x)  # the sum torch's add rounds, which the layer keeps as its residual


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("positions", ["batch", "one_dim", "strided"])
def test_rope_cos_sin_matches_the_oracle(dt, positions):
    """Positions far along (the angle's fp32 rounding is the op's), of a batch, of one dim, and
    a strided view (every other column): each frequency twice, scaled."""
    pos = {"batch": torch.tensor([[0, 3, 4095, 8191, 17]] * 2) + torch.tensor([[0], [1]]),
           "one_dim": torch.arange(1000, 1011),
           "strided": torch.arange(0, 60).view(4, 15)[:, ::2]}[positions]
    inv = 1.0 / 10000 ** (torch.arange(0, 48, 2).float() / 48)
    cos, sin = rope.rope_cos_sin(pos, inv, 0.75, DTYPES[dt])
    want_cos, want_sin = rope_oracle.cos_sin(pos.numpy(), inv.numpy(), 0.75)
    assert cos.shape == sin.shape == (*pos.shape, 48) and cos.dtype == DTYPES[dt]
    atol = PROFILE.screen_rtol[dt]  # the tables lie in [-0.75, 0.75]: an absolute bound
    assert np.abs(cos.double().numpy() - want_cos).max() <= atol
    assert np.abs(sin.double().numpy() - want_sin).max() <= atol
    assert torch.equal(cos[..., :24], cos[..., 24:])  # cat(freqs, freqs)


@pytest.mark.parametrize("dt", [torch.float32, torch.float16, torch.int64], ids=str)
def test_cat_kv_grows_keys_and_values_in_one_launch_and_copies_into_an_empty_cache(dt, monkeypatch):
    """A decode step's cats (the new states a transposed view, as a model's k and v are) in
    one launch, bit for bit torch.cat; a prefill's empty cache: each state copied."""
    def states(*shape):  # (B, S, H, D) viewed as (B, H, S, D)
        return (torch.randn(*shape) * 100).to(dt).transpose(1, 2)

    launches, real = [], kv_cache.launch_cat
    monkeypatch.setattr(kv_cache, "launch_cat", lambda *a: (launches.append("launch_cat"), real(*a))[1])
    keys, values = (torch.randn(2, 3, 6, 8) * 100).to(dt), (torch.randn(2, 3, 6, 8) * 100).to(dt)
    k, v = states(2, 1, 3, 8), states(2, 1, 3, 8)
    got = kv_cache.cat_kv(keys, k, values, v, -2)
    assert launches == []  # the pair kernel, not the cat family's
    assert torch.equal(got[0], torch.cat([keys, k], -2)) and torch.equal(got[1], torch.cat([values, v], -2))
    empty = torch.tensor([], dtype=dt)
    k, v = states(1, 5, 3, 8), states(1, 5, 3, 8)
    got = kv_cache.cat_kv(empty, k, empty, v, -2)
    assert launches == ["launch_cat", "launch_cat"]
    assert torch.equal(got[0], k) and torch.equal(got[1], v) and got[0].is_contiguous()


def test_bad_calls_raise_a_kernel_error():
    x, cos, sin = rotary_inputs(torch.float32)
    with pytest.raises(KernelError, match="odd head dim"):
        rope.rotary(x[..., :9], cos[..., :9], sin[..., :9])
    with pytest.raises(KernelError, match="dtypes"):
        rope.rotary(x, cos.half(), sin)
    with pytest.raises(KernelError, match=r"\(B or 1, S, D\)"):
        rope.rotary(x, cos[:, :3], sin[:, :3])
    with pytest.raises(KernelError, match="one shape"):
        swiglu.silu_mul(torch.randn(3, 4), torch.randn(4))
    x, r, w, b = _add_norm_inputs(torch.float32, (3, 8))
    with pytest.raises(KernelError, match="one shape"):
        residual_norm.add_rms_norm(x, r[:2], w, 1e-5)
    with pytest.raises(KernelError, match="8 values"):
        residual_norm.add_layer_norm(x, r, w, b[:4], 1e-5)
    with pytest.raises(KernelError, match="dtypes"):
        residual_norm.add_rms_norm(x, r.half(), w, 1e-5)
    with pytest.raises(KernelError, match="inv_freq dtype float16"):
        rope.rope_cos_sin(torch.arange(5), torch.ones(4, dtype=torch.float16), 1.0, torch.float32)
    with pytest.raises(KernelError, match="cat_kv: dtypes"):
        kv_cache.cat_kv(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 1, 4).half(), torch.ones(1, 2, 3, 4),
                        torch.ones(1, 2, 1, 4), -2)
    with pytest.raises(KernelError, match="cat_kv"):
        kv_cache.cat_kv(torch.ones(1, 2, 3, 4), torch.ones(1, 3, 1, 4), torch.ones(1, 2, 3, 4), torch.ones(1, 2, 1, 4), -2)
    with pytest.raises(KernelError, match="position dtype float32"):
        rope.rope_cos_sin(torch.arange(5.0), torch.ones(4), 1.0, torch.float32)


# ----------------------------------------------------------------------------- the torch ops


def test_torch_ops_are_transformers_code_bit_for_bit(transformers_llama):
    m = transformers_llama
    from transformers.activations import ACT2FN

    for dt in (torch.float32, torch.float16, torch.bfloat16):
        q, cos, sin = rotary_inputs(dt, seed=2)
        k, _, _ = rotary_inputs(dt, seed=3)
        q_want, k_want = m.apply_rotary_pos_emb(q, k, cos, sin)
        for got, want in ((torch.ops.nbx_tune.rotary(q, cos, sin), q_want),
                          (torch.ops.nbx_tune.rotary(k, cos[:1], sin[:1]), m.apply_rotary_pos_emb(
                              q, k, cos[:1], sin[:1])[1])):
            assert torch.equal(got, want) and got.stride() == want.stride()
        gate, up = torch.randn(2, 5, 11).to(dt), torch.randn(2, 5, 11).to(dt)
        assert torch.equal(torch.ops.nbx_tune.silu_mul(gate, up), ACT2FN["silu"](gate) * up)
    from transformers import LlamaConfig

    emb = m.LlamaRotaryEmbedding(LlamaConfig(hidden_size=96, num_attention_heads=2, max_position_embeddings=64))
    pos = torch.tensor([[0, 5, 4095], [7, 1, 2]])
    for dt in (torch.float32, torch.bfloat16):
        want = emb(torch.empty(0, dtype=dt), pos)
        got = torch.ops.nbx_tune.rope_cos_sin(pos, emb.inv_freq, emb.attention_scaling, dt)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_torch_ops_have_a_backward():
    x, cos, sin = (t.double().requires_grad_() for t in rotary_inputs(torch.float32, B=2, H=2, S=3, D=6,
                                                                       cos_batch=1))
    assert torch.autograd.gradcheck(custom_ops.rotary, (x, cos, sin))
    g, u = torch.randn(3, 4, dtype=torch.float64, requires_grad=True), torch.randn(3, 4, dtype=torch.float64,
                                                                                   requires_grad=True)
    assert torch.autograd.gradcheck(custom_ops.silu_mul, (g, u))


def test_meta_tensors_get_the_shape_dtype_and_layout_of_a_real_call():
    x, cos, sin = rotary_inputs(torch.float16, cos_batch=1)
    real = torch.ops.nbx_tune.rotary(x, cos, sin)
    meta = torch.ops.nbx_tune.rotary(x.to("meta"), cos.to("meta"), sin.to("meta"))
    assert (meta.shape, meta.dtype, meta.stride()) == (real.shape, real.dtype, real.stride())
    g = torch.randn(4, 6, device="meta", dtype=torch.bfloat16)
    assert torch.ops.nbx_tune.silu_mul(g, g).shape == (4, 6)


# ----------------------------------------------------------------------------- trace rows


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_recorded_rows_map_to_the_seats(device):
    from nbx_tune.profiles import current_profile
    from nbx_tune.tuner.census.census import plan
    from nbx_tune.tuner.trace.recorder import Recorder
    from nbx_tune.kernels.trace import Trace

    x, cos, sin = (t.to(device) for t in rotary_inputs(torch.float16, cos_batch=1))
    gate = torch.randn(3, 37, 5, dtype=torch.float16, device=device)
    with Recorder() as rec:
        torch.ops.nbx_tune.rotary(x, cos, sin)
        torch.ops.nbx_tune.rotary(x, cos, sin)
        torch.ops.nbx_tune.silu_mul(gate, gate)
    rows = {r.op: r for r in rec.rows}
    assert set(rows) == {"nbx_tune.rotary", "nbx_tune.silu_mul"}
    assert rows["nbx_tune.rotary"].shapes == ((2, 3, 7, 10), (1, 7, 10), (1, 7, 10))
    assert rows["nbx_tune.rotary"].count == 2 and not rows["nbx_tune.rotary"].params
    p = plan(Trace("recorded", rec.rows), "sha", current_profile())
    assert not p.not_servable and not p.uncovered
    seats = {key[0]: sp for key, sp in p.seats.items()}
    assert set(seats) == {"rotary", "silu_mul"}
    assert seats["rotary"].launches == 2 and seats["silu_mul"].launches == 1
    assert spec_for_op("nbx_tune.rotary") is rope.SPEC and spec_for_op("nbx_tune.silu_mul") is swiglu.SPEC
    assert rope.SPEC.problem_from_row(rows["nbx_tune.rotary"]).dims == (2 * 3 * 7 * 10, 10)


@pytest.mark.parametrize("row,why", [
    (make_row("nbx_tune.rotary", ["float16"] * 3, [(1, 2, 3, 9), (1, 3, 9), (1, 3, 9)]), "odd head dim"),
    (make_row("nbx_tune.rotary", ["float16", "float32", "float32"], [(1, 2, 3, 8), (1, 3, 8), (1, 3, 8)]),
     "mixed dtypes"),
    (make_row("nbx_tune.rotary", ["float32"] * 3, [(2, 2, 3, 8), (3, 3, 8), (3, 3, 8)]), "(B or 1, S, D)"),
    (make_row("nbx_tune.rotary", ["float32"] * 3, [(2, 3, 8), (3, 8), (3, 8)]), "(B, H, S, D)"),
    (make_row("nbx_tune.silu_mul", ["float32"] * 2, [(3, 4), (4,)]), "one shape"),
    (make_row("nbx_tune.silu_mul", ["float64"] * 2, [(3, 4), (3, 4)]), "not served"),
])
def test_rows_not_served_say_why(row, why):
    p = spec_for_op(row.op).problem_from_row(row)
    assert isinstance(p, NotServable) and why in p.reason


# ----------------------------------------------------------------------------- census and serve()


def test_census_certifies_the_seats_and_serve_runs_the_torch_ops_on_them(tmp_path, db_url):
    from nbx_tune.tuner import commands as api
    from nbx_tune.tuner.trace.recorder import record

    x, cos, sin = rotary_inputs(torch.float32, cos_batch=1)
    gate, up = torch.randn(3, 37, 5), torch.randn(3, 37, 5)
    trace = tmp_path / "t.tsv"
    with record(trace):
        torch.ops.nbx_tune.rotary(x, cos, sin)
        torch.ops.nbx_tune.silu_mul(gate, up)
    rep = api.census(str(trace), db_url, profile="interpreter", isolate=False)
    assert {s.kernel for s in rep.seats} == {"rotary", "silu_mul"}
    assert rep.counts()["certified"]["launches"] == rep.launches == 2
    certified.reload()
    serving.reset_stats()
    with nbx_tune.serve():
        y = torch.ops.nbx_tune.rotary(x, cos, sin)
        z = torch.ops.nbx_tune.silu_mul(gate, up)
        odd = torch.ops.nbx_tune.rotary(x[..., :9], cos[..., :9], sin[..., :9])  # torch's, counted
    st = serving.stats()
    assert st["nbx_tune.rotary"]["certified"] == 1 and st["nbx_tune.silu_mul"]["certified"] == 1
    assert st["nbx_tune.rotary"]["torch"] == 1 and "odd head dim" in next(iter(st["nbx_tune.rotary"]["reasons"]))
    assert torch.equal(y, rope.rotary(x, cos, sin)) and torch.equal(z, swiglu.silu_mul(gate, up))
    assert torch.equal(odd, custom_ops.rotary(x[..., :9], cos[..., :9], sin[..., :9]))
    serving.reset_stats()
    torch.ops.nbx_tune.rotary(x, cos, sin)  # outside serve(): torch's, not counted
    assert serving.stats() == {}


def test_the_library_ops_are_recorded_certified_and_served_as_one_launch(tmp_path, db_url):
    from nbx_tune.tuner import commands as api
    from nbx_tune.tuner.trace.recorder import record

    x, r, w, b = _add_norm_inputs(torch.float32, (2, 5, 37))
    trace = tmp_path / "t.tsv"
    pos, inv = torch.arange(7).view(1, 7), torch.rand(12)
    with torch.inference_mode(), record(trace) as rec:
        torch.ops.nbx_tune.add_rms_norm(x, r, w, 1e-6)
        torch.ops.nbx_tune.add_layer_norm(x, r, w, b, 1e-5)
        torch.ops.nbx_tune.rope_cos_sin(pos, inv, 1.0, torch.float16)
        torch.ops.nbx_tune.cat_kv(x, r[:, :1], x, r[:, :1], 1)
    rows = {row.op: row for row in rec.rows}
    assert set(rows) == {"nbx_tune.add_rms_norm", "nbx_tune.add_layer_norm", "nbx_tune.rope_cos_sin",
                         "nbx_tune.cat_kv"}  # not their parts
    assert dict(rows["nbx_tune.rope_cos_sin"].params) == {"scaling": "1.0", "dtype": "float16"}
    assert rows["nbx_tune.add_layer_norm"].shapes == ((2, 5, 37), (2, 5, 37), (37,), (37,))
    assert dict(rows["nbx_tune.add_rms_norm"].params) == {"eps": "1e-06"}
    rep = api.census(str(trace), db_url, profile="interpreter", isolate=False)
    assert {s.kernel for s in rep.seats} == {"add_rms_norm", "add_layer_norm", "rope_cos_sin", "cat_kv"}
    assert rep.counts()["certified"]["launches"] == rep.launches == 4
    certified.reload()
    serving.reset_stats()
    with torch.inference_mode(), nbx_tune.serve():
        got = torch.ops.nbx_tune.add_rms_norm(x, r, w, 1e-6)
        torch.ops.nbx_tune.add_layer_norm(x, r, w, b, 1e-5)
        tables = torch.ops.nbx_tune.rope_cos_sin(pos, inv, 1.0, torch.float16)
        kv = torch.ops.nbx_tune.cat_kv(x, r[:, :1], x, r[:, :1], 1)
    st = serving.stats()
    assert st["nbx_tune.cat_kv"]["certified"] == 1
    assert all(torch.equal(a, b) for a, b in zip(kv, custom_ops.cat_kv(x, r[:, :1], x, r[:, :1], 1)))
    assert st["nbx_tune.add_rms_norm"]["certified"] == st["nbx_tune.add_layer_norm"]["certified"] == 1
    assert st["nbx_tune.rope_cos_sin"]["certified"] == 1
    assert all((a.float() - b.float()).abs().max() <= 1e-3 for a, b in zip(tables, custom_ops.rope_cos_sin(
        pos, inv, 1.0, torch.float16)))
    want = custom_ops.add_rms_norm(x, r, w, 1e-6)  # outside serve(): torch's add and rms_norm
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("row,why", [
    (make_row("nbx_tune.add_rms_norm", ["float32"] * 3, [(3, 8), (3, 8), (8,)]), "without eps"),
    (make_row("nbx_tune.add_rms_norm", ["float32"] * 3, [(3, 8), (1, 8), (8,)], {"eps": "1e-5"}), "one shape"),
    (make_row("nbx_tune.add_layer_norm", ["float32"] * 3, [(3, 8), (3, 8), (8,)], {"eps": "1e-5"}), "4 tensors"),
    (make_row("nbx_tune.add_layer_norm", ["float32"] * 4, [(3, 8), (3, 8), (8,), (4,)], {"eps": "1e-5"}),
     "bias 4: 8 values (a row) expected"),
    (make_row("nbx_tune.rope_cos_sin", ["int64", "float32"], [(1, 9), (8,)], {"scaling": "1.0"}),
     "table dtype not given"),
    (make_row("nbx_tune.rope_cos_sin", ["int64", "float32"], [(1, 2, 9), (8,)], {"scaling": "1.0", "dtype": "float32"}),
     "(B, S) or (S,)"),
    (make_row("nbx_tune.rope_cos_sin", ["int64", "float16"], [(1, 9), (8,)], {"scaling": "1.0", "dtype": "float32"}),
     "float32 expected"),
    (make_row("nbx_tune.cat_kv", ["float32"] * 4, [(1, 2, 3, 4), (1, 2, 1, 4)] * 2), "without dim"),
    (make_row("nbx_tune.cat_kv", ["float32", "float16"] * 2, [(1, 2, 3, 4), (1, 2, 1, 4)] * 2, {"dim": "-2"}),
     "mixed dtypes"),
])
def test_library_op_rows_not_served_say_why(row, why):
    p = spec_for_op(row.op).problem_from_row(row)
    assert isinstance(p, NotServable) and why in p.reason, p


def test_grad_flows_through_the_served_ops():
    """With grad wanted the composite runs torch's pattern under serve() too (served kernels
    are forward only, as for SDPA): the fall-through is counted, and the gradients are torch's."""
    x, cos, sin = rotary_inputs(torch.float32, cos_batch=1)
    gate, up = torch.randn(3, 8), torch.randn(3, 8)
    grads = []
    for served in (False, True):
        leaves = [t.clone().requires_grad_() for t in (x, gate, up)]
        serving.reset_stats()
        with nbx_tune.serve() if served else torch.enable_grad():
            y = torch.ops.nbx_tune.rotary(leaves[0], cos, sin).sum() + torch.ops.nbx_tune.silu_mul(
                leaves[1], leaves[2]).sum()
        y.backward()
        grads.append([t.grad for t in leaves])
        if served:
            st = serving.stats()
            assert st["nbx_tune.rotary"]["torch"] == 1 and st["nbx_tune.silu_mul"]["torch"] == 1
            assert all("autograd" in why for s in st.values() for why in s["reasons"])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_a_llama_with_its_patterns_swapped_for_the_ops_is_transformers_and_served_whole(transformers_llama,
                                                                                      monkeypatch):
    """transformers' Llama with apply_rotary_pos_emb and LlamaMLP's activation written as the
    ops (by hand here): torch's logits bit for bit outside serve(), and under serve() every
    fused launch on its kernel (q and k with a batch of 1 of cos and sin: the broadcast path)."""
    m = transformers_llama
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=88, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model, ids = LlamaForCausalLM(cfg).eval(), torch.randint(0, 97, (2, 9))
    with torch.inference_mode():
        ref = model(ids).logits
    monkeypatch.setattr(m, "apply_rotary_pos_emb", lambda q, k, cos, sin, unsqueeze_dim=1: (
        torch.ops.nbx_tune.rotary(q, cos, sin), torch.ops.nbx_tune.rotary(k, cos, sin)))
    monkeypatch.setattr(m.LlamaMLP, "forward", lambda self, x: self.down_proj(
        torch.ops.nbx_tune.silu_mul(self.gate_proj(x), self.up_proj(x))))
    serving.reset_stats()
    with torch.inference_mode():
        swapped = model(ids).logits
        with nbx_tune.serve():
            served = model(ids).logits
    assert torch.equal(swapped, ref)
    assert ((served - ref).abs().max() / ref.abs().max()).item() <= PROFILE.screen_rtol["float32"]
    st = serving.stats()
    assert st["nbx_tune.rotary"]["default"] == 2 * 2 and st["nbx_tune.silu_mul"]["default"] == 2
    assert not any(s["torch"] for s in st.values()), st


@pytest.mark.slow
def test_decode_steps_on_a_growing_cache_are_served_with_every_fusion(transformers_llama):
    """A prefill and two decode steps of transformers' Llama on its DynamicCache, as
    generation runs them: the fused code's logits are torch's within the fp32 tolerance, the
    cache grows through nbx_tune.cat_kv, and no launch falls through to torch."""
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from nbx_tune.kernels.serving.fusions import engine as fusions

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=88, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model, ids = LlamaForCausalLM(cfg).eval(), torch.randint(0, 97, (2, 9))

    def steps():
        cache, out = DynamicCache(config=cfg), []
        out.append(model(ids, use_cache=True, cache=cache).logits)
        for t in range(2):
            out.append(model(ids[:, t:t + 1], use_cache=True, cache=cache).logits)
        return out, cache.layers[0].keys.shape

    with torch.inference_mode():
        ref, ref_len = steps()
        serving.reset_stats()
        fusions.reset_stats()
        with nbx_tune.serve():
            got, got_len = steps()
    assert got_len == ref_len == (2, 2, 11, 16)
    for a, b in zip(got, ref):
        assert ((a - b).abs().max() / b.abs().max()).item() <= PROFILE.screen_rtol["float32"]
    assert fusions.stats()["cat_kv"] == 3 * 2  # each layer, each step
    st = serving.stats()
    assert not any(s["torch"] for s in st.values()), st


def test_generate_under_serve_gives_torchs_tokens(transformers_llama):
    """transformers' own generation loop (greedy, a growing DynamicCache) under serve(): the
    tokens torch's ops give. What serve() does not cover there (the loop's bool bookkeeping)
    falls through to torch and says why."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=88, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model, ids = LlamaForCausalLM(cfg).eval(), torch.randint(0, 97, (2, 9))
    kw = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    with torch.inference_mode():
        ref = model.generate(ids, **kw)
        serving.reset_stats()
        with nbx_tune.serve():
            got = model.generate(ids, **kw)
    assert torch.equal(got, ref)
    st = serving.stats()
    assert st["nbx_tune.cat_kv"]["default"] + st["nbx_tune.cat_kv"]["certified"] == 4 * 2
    assert all("not served" in why for s in st.values() if s["torch"] for why in s["reasons"]), st

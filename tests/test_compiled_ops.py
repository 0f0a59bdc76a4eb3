"""Certified kernels inside torch.compile (kernels/serving/compiled_ops.py): the library's GEMM
and attention ops as compiled-graph nodes, placed by an Inductor pass where a seat is certified.

Inductor generates C++ on the CPU; the nodes the pass places run the Triton kernels on the
interpreter, in fp32. Seats are certified by a trace of the model's eager run: each row's seat
gets its kernel's default config in the loaded state, as an exported table would give it
(the slow case runs a real census instead)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import nbx_tune
from nbx_tune.kernels.runtime import certified
from nbx_tune.kernels.serving import compiled_ops as co

MODELS = Path(__file__).resolve().parents[1] / "examples" / "models"


class Block(torch.nn.Module):
    """Linear layers (one with a bias: addmm, one without: mm) around causal GQA attention."""

    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv, self.hd = heads, kv_heads, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.hd)
        self.out = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, L, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.hd, self.kv * self.hd, self.kv * self.hd], dim=-1)
        q = q.view(B, L, self.heads, self.hd).transpose(1, 2)
        k = k.view(B, L, self.kv, self.hd).transpose(1, 2)
        v = v.view(B, L, self.kv, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.out(torch.relu(y.transpose(1, 2).reshape(B, L, -1)))


@pytest.fixture(autouse=True)
def fresh_compile():
    """Every compile runs the pass: no graph from Inductor's cache of an earlier run."""
    import torch._inductor.config as ic

    torch._dynamo.reset()
    co.reset_stats()
    with ic.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()
    co.reset_stats()


def certify_trace(run) -> set:
    """Record `run()` eagerly and put a certificate for each of its GEMM and attention seats
    into the loaded state (the kernel's default config). Returns the seat labels."""
    from nbx_tune.kernels.runtime.registry import spec_for_op
    from nbx_tune.kernels.spec import bucket_of, seat_label
    from nbx_tune.tuner.trace.recorder import Recorder

    with torch.inference_mode(), Recorder() as rec:
        run()
    st = certified.state()
    labels = set()
    for row in rec.rows:
        spec = spec_for_op(row.op)
        if spec is None or spec.name not in ("matmul", "attention"):
            continue
        p = spec.problem_from_row(row)
        bucket = bucket_of(st.profile, spec.key, p.dims)
        st.entries[(spec.name, p.dtypes, p.flags, bucket)] = (spec.default_preference()[0], "test")
        labels.add(seat_label(spec.name, p.dtypes, p.flags, spec.key, bucket))
    st.memo.clear()
    return labels


def _ran(stats, kind="certified") -> int:
    return sum(s[kind] for s in stats.values())


def test_each_op_passes_opcheck():
    a, b, bias = torch.randn(5, 8), torch.randn(8, 6), torch.randn(6)
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    for op, args in ((co.mm, (a, b, "s")), (co.bmm, (a[None], b[None], "s")),
                     (co.addmm, (bias, a, b, 1.0, 1.0, "s")), (co.sdpa, (q, k, v, True, None, "s")),
                     (co.sdpa, (q, k, v, False, 0.3, "s"))):
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def test_ops_match_torch_on_certified_and_uncertified_seats():
    """A call at a certified seat runs the kernel, any other runs torch: both give torch's."""
    a, b = torch.randn(16, 32), torch.randn(32, 24)
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    ref_mm = a @ b
    ref_attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.allclose(co.mm(a, b, "x"), ref_mm, atol=1e-5)
    assert torch.allclose(co.sdpa(q, k, v, True, None, "y"), ref_attn, atol=1e-5)
    assert _ran(co.stats()) == 0 and _ran(co.stats(), "torch") == 2
    certify_trace(lambda: (torch.mm(a, b), F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                         enable_gqa=True)))
    co.reset_stats()
    assert torch.allclose(co.mm(a, b, "x"), ref_mm, atol=1e-5)
    out = co.sdpa(q, k, v, True, None, "y")
    assert torch.allclose(out, ref_attn, atol=1e-5)
    assert out.stride() == co.sdpa(q, k, v, False, None, "z").stride()  # torch's side keeps the fake's strides
    st = co.stats()
    assert st["x"]["certified"] == 1 and st["y"]["certified"] == 1 and st["z"]["torch"] == 1, st


def _compile_block(fullgraph=True, **kw):
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 8, 32)
    with torch.inference_mode():
        ref = model(x)
    return model, x, ref, co.compiled(model, fullgraph=fullgraph, **kw)


def test_compiled_model_runs_certified_nodes_and_matches_torch():
    model, x, ref, compiled = _compile_block()
    labels = certify_trace(lambda: model(x))
    assert len(labels) == 3  # the qkv addmm, the out mm, the attention
    with torch.inference_mode():
        out = compiled(x)
        out = compiled(x)
    assert torch.allclose(out, ref, atol=1e-5)
    st = co.stats()
    assert len(st) == 3 and {s["seat"] for s in st.values()} == labels, st
    assert _ran(st) == 6 and _ran(st, "torch") == 0, st


def test_no_certificate_leaves_inductors_nodes():
    model, x, ref, compiled = _compile_block()
    with torch.inference_mode():
        assert torch.allclose(compiled(x), ref, atol=1e-5)
    assert co.stats() == {}


def test_a_seat_torch_is_faster_at_stays_torchs(monkeypatch):
    model, x, ref, compiled = _compile_block()
    labels = certify_trace(lambda: model(x))
    st = certified.state()
    attention = next(s for s in st.entries if s[0] == "attention")
    st.deferred[attention] = {"nbx_ms": 2.0, "torch_ms": 1.0}
    with torch.inference_mode():
        assert torch.allclose(compiled(x), ref, atol=1e-5)
    placed = {s["seat"] for s in co.stats().values()}
    assert placed == {lb for lb in labels if lb.startswith("matmul")}


def test_dynamic_shapes_outside_the_seats_bucket_run_torch():
    """The compiled node is shape-generic: a length whose seat is certified runs the kernel, one
    in another bucket runs torch (never a default config)."""
    model, x, ref, compiled = _compile_block(dynamic=True)
    certify_trace(lambda: model(x))
    long = torch.randn(2, 200, 32)
    with torch.inference_mode():
        assert torch.allclose(compiled(x), ref, atol=1e-5)
        assert torch.allclose(compiled(long), model(long), atol=1e-5)
    st = co.stats()
    assert _ran(st) == 3 and _ran(st, "torch") == 3, st
    assert all(r.startswith("no certified seat") for s in st.values() for r in s["reasons"]), st


def test_one_graph_and_no_break():
    from torch._dynamo.utils import counters

    model, x, ref, compiled = _compile_block()
    certify_trace(lambda: model(x))
    counters.clear()
    with torch.inference_mode():
        compiled(x)
    assert sum(counters["graph_break"].values()) == 0 and counters["stats"]["unique_graphs"] == 1


def test_serve_around_a_compiled_model_places_the_ops_and_leaves_no_pass_behind():
    import torch._inductor.config as ic

    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 8, 32)
    with torch.inference_mode():
        ref = model(x)
    certify_trace(lambda: model(x))
    compiled = torch.compile(model, fullgraph=True)
    before = ic.post_grad_custom_pre_pass
    with torch.inference_mode(), nbx_tune.serve():
        out = compiled(x)
    assert ic.post_grad_custom_pre_pass is before
    assert torch.allclose(out, ref, atol=1e-5)
    assert _ran(co.stats()) == 3, co.stats()
    assert nbx_tune.compiled_stats() == co.stats()


def _small_llama(monkeypatch):
    pytest.importorskip("transformers")
    root = MODELS.parent.parent  # transformers probes for a package named `kernels`: not this repo's
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != root] + [str(MODELS)])
    spec = importlib.util.spec_from_file_location("nbx_example_llama", MODELS / "llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from _record import _build

    torch.manual_seed(0)
    return _build(module.SCALES["small"], "cpu")


@pytest.mark.slow
def test_llama_compiled_fullgraph_inside_serve(monkeypatch):
    """serve()'s fusions swap the decoder's code; under torch.compile the swapped code traces the
    original (the hand-off's frame walk broke the graph: fullgraph raised), and the pass serve()
    installed places the certified ops."""
    model, inputs = _small_llama(monkeypatch)
    with torch.inference_mode():
        ref = model(**inputs).logits
    certify_trace(lambda: model(**inputs))
    compiled = torch.compile(model, fullgraph=True)
    with torch.inference_mode(), nbx_tune.serve():
        out = compiled(**inputs).logits
    assert torch.allclose(out, ref, atol=1e-4)
    assert _ran(co.stats()) == 17 and _ran(co.stats(), "torch") == 0, co.stats()


@pytest.mark.slow
def test_llama_trace_census_compiled_every_node_certified(tmp_path, db_url, monkeypatch):
    """The user's flow: record a small transformers Llama, certify its seats by a census on
    the interpreter, compile it (fullgraph) with the pass: every GEMM and attention node runs
    its certified kernel and the logits are torch's."""
    from nbx_tune.tuner import commands as api
    from nbx_tune.tuner.trace.recorder import record

    model, inputs = _small_llama(monkeypatch)
    trace = tmp_path / "llama.tsv"
    with torch.inference_mode(), record(trace):
        ref = model(**inputs).logits
    api.census(str(trace), db_url, profile="interpreter", isolate=False)
    certified.reload()
    with torch.inference_mode():
        out = nbx_tune.compiled(model, fullgraph=True)(**inputs).logits
    rtol = certified.state().profile.screen_rtol["float32"]
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= rtol
    st = co.stats()
    # 2 layers x (q, k, v, o, gate, up, down) + the LM head, and 2 attentions
    assert _ran(st) == 17 and _ran(st, "torch") == 0, st

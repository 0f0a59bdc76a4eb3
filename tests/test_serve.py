"""nbx_tune.serve(): aten ops on the certified kernels, torch for the rest, and nothing
changed outside the context. The example models (transformers' Llama, GPT-2 and ResNet at
their small scales) run end to end on the interpreter and match torch in fp32."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import nbx_tune
from nbx_tune.errors import KernelError
from nbx_tune.kernels.runtime import certified
from nbx_tune.kernels.serving import serve as serving
from nbx_tune.kernels.runtime.registry import get_spec
from nbx_tune.kernels.rows import make_row

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"

# Launches each example model may still run on torch, by op. Every family the example
# traces need is served now: an entry here is a regression to explain.
EXPECTED_TORCH = {"llama": {}, "gpt2": {}, "resnet": {}}


@pytest.fixture(autouse=True)
def fresh_stats():
    serving.reset_stats()
    yield
    assert not serving.active()


def _served(stats: dict, op: str) -> int:
    s = stats.get(op, {})
    return s.get("certified", 0) + s.get("default", 0)


# ----------------------------------------------------------------------------- scope


def test_outside_the_context_torch_is_untouched():
    mm_before = str(torch.library.get_kernel("aten::mm", serving.dispatch_key()))
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    with nbx_tune.serve():
        assert str(torch.library.get_kernel("aten::mm", serving.dispatch_key())) != mm_before
        inside = a @ b
    assert str(torch.library.get_kernel("aten::mm", serving.dispatch_key())) == mm_before
    assert _served(serving.stats(), "aten.mm") == 1
    assert certified.launch_stats()["ops"]["aten.mm"]["default"] == 1
    torch.testing.assert_close(inside, a @ b, rtol=1e-5, atol=1e-5)
    a @ b  # not counted: torch's own kernel again
    assert _served(serving.stats(), "aten.mm") == 1


def test_decorator_nesting_and_inference_mode():
    x = torch.randn(4, 33)

    @nbx_tune.serve()
    def f(t):
        with nbx_tune.serve():  # nested: one set of overrides, removed by the outer exit
            y = torch.relu(t)
        return torch.softmax(y, dim=-1)

    with torch.inference_mode():
        y = f(x)
    assert not serving.active()
    torch.testing.assert_close(y, torch.softmax(torch.relu(x), dim=-1), rtol=1e-5, atol=1e-6)
    st = serving.stats()
    assert _served(st, "aten.relu") == 1 and _served(st, "aten._softmax") == 1


def test_grad_still_flows_through_served_ops():
    """Autograd sits above a plain op's override (mm, layer norm: served, backward recorded);
    a composite replaced whole (SDPA) falls through when grad is wanted."""
    x = torch.randn(2, 5, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    with nbx_tune.serve():
        h = torch.nn.functional.layer_norm(x @ w, (8,))
        o = torch.nn.functional.scaled_dot_product_attention(h[None], h[None], h[None])
        o.sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    h = torch.nn.functional.layer_norm(x @ w, (8,))
    torch.nn.functional.scaled_dot_product_attention(h[None], h[None], h[None]).sum().backward()
    torch.testing.assert_close(gx, x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw, w.grad, rtol=1e-4, atol=1e-5)
    st = serving.stats()
    assert _served(st, "aten.native_layer_norm") == 1
    assert st["aten.scaled_dot_product_attention"]["torch"] == 1


def test_fallthrough_counts_the_reason_and_keeps_torch_semantics():
    i = torch.arange(6)
    d = torch.arange(6, dtype=torch.float64)
    h = torch.randn(6, dtype=torch.float16)
    with torch.inference_mode(), nbx_tune.serve():
        j = i + 1  # int64: served by the integer path; the wrapped 1 keeps int64
        e = d + 1  # float64: no kernel serves it
        f = i * 0.5  # int64 with a float: torch promotes to the default float dtype
        g = h + 1e-3  # float16 with a float: served, stays float16
    assert j.dtype == torch.int64 and torch.equal(j, torch.arange(1, 7))
    assert e.dtype == torch.float64 and torch.equal(e, torch.arange(1, 7, dtype=torch.float64))
    assert f.dtype == torch.float32 and torch.equal(f, torch.arange(6) * 0.5)
    assert g.dtype == torch.float16 and torch.equal(g, h + 1e-3)
    st = serving.stats()
    assert st["aten.add.Tensor"]["torch"] == 1 and "float64" in next(iter(st["aten.add.Tensor"]["reasons"]))
    assert _served(st, "aten.add.Tensor") == 2


def test_a_kernels_own_torch_calls_go_to_torch(monkeypatch):
    """A served function that calls a served op itself reaches torch's kernel, not itself."""
    routes = dict(serving.routes())
    inner = []

    def mul_via_torch(a, b):
        inner.append(1)
        return torch.mul(a, b) + 0  # both ops are overridden: they must go to torch here

    overload, _, kernel = routes["aten.mul.Tensor"]
    routes["aten.mul.Tensor"] = (overload, mul_via_torch, kernel)
    monkeypatch.setattr(serving, "_routes", routes)
    x = torch.randn(5)
    with nbx_tune.serve():
        y = x * x
    assert inner == [1]
    torch.testing.assert_close(y, x * x)
    st = serving.stats()
    assert _served(st, "aten.mul.Tensor") == 1 and "aten.add.Tensor" not in st


def test_a_failing_kernel_falls_through(monkeypatch):
    routes = dict(serving.routes())

    def broken(*args, **kwargs):
        raise KernelError("relu: not today")

    overload, _, kernel = routes["aten.relu"]
    routes["aten.relu"] = (overload, broken, kernel)
    monkeypatch.setattr(serving, "_routes", routes)
    x = torch.randn(7)
    with nbx_tune.serve():
        y = torch.relu(x)
    assert torch.equal(y, torch.relu(x))
    assert serving.stats()["aten.relu"] == {"certified": 0, "default": 0, "torch": 1,
                                            "reasons": {"relu: not today": 1}}


def test_every_route_is_a_trace_op_of_its_kernel_or_a_known_alias():
    """Routing comes from the specs; each routed op maps to a real torch overload."""
    routes = serving.routes()
    assert {"aten.mm", "aten.add.Tensor", "aten.scaled_dot_product_attention",
            "aten.convolution", "aten.native_layer_norm"} <= set(routes)
    for op, (overload, fn, kernel) in routes.items():
        assert callable(fn) and isinstance(overload, torch._ops.OpOverload)
        assert op in get_spec(kernel).ops, f"{op} is routed but {kernel} does not list it"


def test_certified_and_default_are_told_apart(monkeypatch):
    """A seat with a certificate counts as certified, one without as default."""
    x = torch.randn(3, 5)
    st = certified.state()
    with nbx_tune.serve():
        torch.relu(x)
    assert serving.stats()["aten.relu"]["default"] == 1
    # Certify the seat in the loaded state (as a table would), then launch again.
    from nbx_tune.kernels.spec import bucket_of, seat_flags

    spec = get_spec("elementwise_unary")
    bucket = bucket_of(st.profile, spec.key, (15,))
    st.entries[("elementwise_unary", ("float32",), seat_flags(fn="relu"), bucket)] = (
        spec.default_preference()[0], "test")
    st.memo.clear()
    with nbx_tune.serve():
        torch.relu(x)
    assert serving.stats()["aten.relu"] == {"certified": 1, "default": 1, "torch": 0, "reasons": {}}


# ----------------------------------------------------------------------------- scalars in traces


@pytest.mark.parametrize("op,scalar", [("aten.add.Tensor", "1e-06"), ("aten.mul.Tensor", "2"),
                                       ("aten.sub.Tensor", "0.5")])
def test_a_scalar_param_maps_to_the_seat_of_a_0d_operand(op, scalar):
    spec = get_spec("elementwise_binary")
    as_param = spec.problem_from_row(make_row(op, ["float32"], [(4, 9)], {"other": scalar}))
    dt = "int64" if "." not in scalar and "e" not in scalar else "float64"
    as_operand = spec.problem_from_row(make_row(op, ["float32", dt], [(4, 9), ()]))
    assert not hasattr(as_param, "reason"), as_param
    assert (as_param.kernel, as_param.dtypes, as_param.flags, as_param.dims) == \
        (as_operand.kernel, as_operand.dtypes, as_operand.flags, as_operand.dims)
    assert as_param.get("b_value") == float(scalar)


# ----------------------------------------------------------------------------- whole models


@pytest.fixture
def no_repo_root_on_path(monkeypatch):
    """transformers probes for a package named `kernels`; run from the repository root,
    `python -m pytest` would offer it this repository's `kernels/` folder."""
    root = MODELS.parent.parent
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if Path(p or ".").resolve() != root])
    stray = sys.modules.get("kernels")
    if stray is not None and Path(getattr(stray, "__file__", "") or "").resolve().is_relative_to(root):
        monkeypatch.delitem(sys.modules, "kernels")


def _example(name: str):
    pytest.importorskip("transformers")
    if str(MODELS) not in sys.path:
        sys.path.insert(0, str(MODELS))
    spec = importlib.util.spec_from_file_location(f"nbx_example_{name}", MODELS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from _record import _build

    torch.manual_seed(0)
    return _build(module.SCALES["small"], "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED_TORCH))
def test_example_model_under_serve_matches_torch(name, no_repo_root_on_path):
    from nbx_tune.tuner.trace.recorder import Recorder

    model, inputs = _example(name)
    with torch.inference_mode():
        with Recorder() as rec:
            ref = model(**inputs).logits
        with nbx_tune.serve():
            out = model(**inputs).logits
    rtol = certified.state().profile.screen_rtol["float32"]
    err = ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()
    assert err <= rtol, f"{name}: logits differ from torch by {err:.2e} (> {rtol})"

    launches = Counter()
    for row in rec.rows:
        launches[row.op] += row.count
    st = serving.stats()
    expected = EXPECTED_TORCH[name]
    for op, n in launches.items():
        want = n - expected.get(op, 0)
        assert _served(st, op) == want, (f"{name}: {op}: {_served(st, op)} of {n} launches served, "
                                         f"expected {want}; stats {st.get(op)}")
    assert set(expected) <= set(launches), f"{name}: stale EXPECTED_TORCH entries"
    assert set(st) <= set(launches), f"{name}: served ops the trace does not show: {set(st) - set(launches)}"


# ----------------------------------------------------------------------------- nbx-tune run


def test_run_command_serves_a_whole_program_and_keeps_its_exit_status(tmp_path):
    from nbx_tune.tuner.trace.serve_main import run_command

    script = tmp_path / "prog.py"
    script.write_text("import sys, torch\n"
                      "a = torch.randn(6, 5)\n"
                      "c = torch.relu(a @ torch.randn(5, 3))\n"
                      "print(tuple(c.shape))\n"
                      "sys.exit(3)\n")
    stats = tmp_path / "stats.json"
    rc = run_command([sys.executable, str(script)], stats)
    assert rc == 3
    import json

    data = json.loads(stats.read_text())
    assert _served(data, "aten.mm") == 1 and _served(data, "aten.relu") == 1


def test_run_command_refuses_a_non_python_command():
    from nbx_tune.errors import NbxError
    from nbx_tune.tuner.trace.serve_main import run_command

    with pytest.raises(NbxError, match="^run: ls is not a Python interpreter"):
        run_command(["ls"])


def test_census_reads_both_scalar_encodings_as_one_seat():
    """A trace from another recorder writes `x + 1e-06` as other=1e-06; ours as a 0-d operand."""
    from nbx_tune.profiles import current_profile
    from nbx_tune.tuner.census.census import plan
    from nbx_tune.kernels.trace import parse_trace_text

    text = ("op\tdtypes\tshapes\tparams\tcount\n"
            "aten.add.Tensor\tfloat32\t1x24x1\tother=1e-06\t5\n"
            "aten.add.Tensor\tfloat32,float64\t1x24x1;()\t\t3\n")
    p = plan(parse_trace_text(text), "sha", current_profile())
    assert not p.not_servable and not p.uncovered
    assert len(p.seats) == 1 and next(iter(p.seats.values())).launches == 8


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_trace_census_serve_every_launch_certified(tmp_path, db_url, no_repo_root_on_path, name):
    """The main path end to end: record a small GPT-2 or Llama (with serve()'s fusions, as
    `nbx-tune trace` records), certify its seats, then run it under serve(): every launch
    lands on a certified config (none on a default) and the logits are torch's."""
    from nbx_tune.tuner import commands as api
    from nbx_tune.tuner.trace.recorder import record

    model, inputs = _example(name)
    trace = tmp_path / f"{name}.tsv"
    with torch.inference_mode():
        with record(trace) as rec:
            ref = model(**inputs).logits
    rep = api.census(str(trace), db_url, profile="interpreter", isolate=False)
    assert rep.counts()["certified"]["seats"] > 0
    certified.reload()  # the census's certificates, read as a launch reads them
    with torch.inference_mode(), nbx_tune.serve():
        out = model(**inputs).logits
    rtol = certified.state().profile.screen_rtol["float32"]
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= rtol
    st = serving.stats()
    assert sum(s["default"] + s["torch"] for s in st.values()) == 0, st
    assert sum(s["certified"] for s in st.values()) == rec.launches
    # each layer's add and norm after attention; its last add with the norm after it (the
    # hand-off): the next layer's first norm, and for Llama the model's final norm too
    assert rec.fused == {"gpt2": {"add_layer_norm": 3, "cat_kv": 2, "gelu_tanh": 2},
                         "llama": {"add_rms_norm": 4, "cat_kv": 2, "rms_norm": 1, "rope_cos_sin": 1, "rotary": 2,
                                   "silu_mul": 2}}[name]


@pytest.mark.parametrize("sig,status", [("SIGSEGV", 139), ("SIGKILL", 137)])
def test_a_program_killed_by_a_signal_exits_as_a_shell_says_with_its_stats_so_far(tmp_path, capfd, sig, status):
    """It used to exit 245 / 247 (Python's -11 / -9 modulo 256), silently, with no stats."""
    from nbx_tune.tuner.trace.serve_main import SNAPSHOT_S, run_command

    script = tmp_path / "prog.py"
    script.write_text("import os, signal, time, torch\n"
                      "torch.relu(torch.randn(6, 5))\n"
                      f"time.sleep({4 * SNAPSHOT_S})\n"
                      f"os.kill(os.getpid(), signal.{sig})\n")
    rc = run_command([sys.executable, str(script)])
    err = capfd.readouterr().err
    assert rc == status
    assert f"died of {sig} (signal {status - 128})" in err and f"exit status {status}" in err
    assert "aten.relu" in err.split("so far")[1]  # the child's last snapshot, printed by the parent


def test_a_python_number_is_rounded_to_a_half_tensors_dtype_as_torch_does():
    """torch's fp16 + 0.1 adds fp16(0.1) in fp32 math; the kernel added fp32(0.1): 537 of
    4096 values differed by an ulp. torch's mul and div take the number unrounded. bf16
    waits for the GPU (the interpreter's bf16 arithmetic is not)."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(4096, generator=gen).half()
    for c in (1e-3, 0.1, -2.7):
        with torch.inference_mode(), nbx_tune.serve():
            got = [h + c, h * c, h - c, h / c, c - h]
        want = [h + c, h * c, h - c, h / c, c - h]
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w), (c, int((g != w).sum()))

"""bench/torch_compare.py: a trace row becomes torch's own aten call (tensors placed by the
op's schema, params parsed by its types), and the script's smoke mode runs end to end."""

import json
from pathlib import Path

import pytest
import torch

from nbx_tune.tuner.timing.torch_baselines import _WRAPPED

from nbx_tune.bench import torch_compare as tc  # noqa: E402

from nbx_tune.kernels.trace import make_row  # noqa: E402


@pytest.mark.parametrize("row,shape", [
    (make_row("aten.mm", ["float32"] * 2, [(5, 7), (7, 3)]), (5, 3)),
    # input, mat1, mat2 in schema order; beta and alpha are keyword-only params.
    (make_row("aten.addmm", ["float32"] * 3, [(3,), (5, 7), (7, 3)], {"beta": "0.5"}), (5, 3)),
    # A list argument takes every tensor; an int param.
    (make_row("aten.cat", ["float32"] * 2, [(2, 3), (2, 5)], {"dim": "-1"}), (2, 8)),
    (make_row("aten.mean.dim", ["float32"], [(4, 6)], {"dim": "-1", "keepdim": "True"}), (4, 1)),
    # A dtype param by name; a wrapped Python number (0-d float64) passed as a number.
    (make_row("aten._to_copy", ["float32"], [(4, 6)], {"dtype": "bfloat16"}), (4, 6)),
    (make_row("aten.mul.Tensor", ["float32", "float64"], [(4, 6), ()]), (4, 6)),
    (make_row("aten.pow.Tensor_Scalar", ["float32"], [(3,)], {"exponent": "2"}), (3,)),
    (make_row("aten.scaled_dot_product_attention", ["float32"] * 3, [(1, 4, 5, 8), (1, 2, 9, 8), (1, 2, 9, 8)],
              {"attn_mask": "None", "is_causal": "True", "enable_gqa": "True"}), (1, 4, 5, 8)),
])
def test_a_row_becomes_torchs_own_call(row, shape):
    fn, nbytes = tc.torch_call(row, "cpu")
    out = fn(0)
    assert tuple(out.shape) == shape
    assert nbytes == sum(torch.empty(s, dtype=getattr(torch, d)).nbytes for s, d in zip(row.shapes, row.dtypes)
                         if not (s == () and d in _WRAPPED))
    if row.op == "aten._to_copy":
        assert out.dtype == torch.bfloat16


def test_a_row_whose_tensors_do_not_fit_the_schema_is_an_error():
    with pytest.raises(ValueError, match="placed 1 of 2"):
        tc.torch_call(make_row("aten.neg", ["float32"] * 2, [(3,), (3,)]), "cpu")[0](0)


def test_smoke_run_writes_every_trace_with_totals(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert tc.main(["--smoke", "--rows", "3"]) == 0
    rep = json.loads((tmp_path / "torch_compare.json").read_text())
    assert set(rep["traces"]) == {"llama_small", "gpt2_small"}
    for t in rep["traces"].values():
        assert len(t["rows"]) == 3 and t["launches"]["timed"] > 0
        assert t["total_ms"]["nbx"]["eager"] > 0 and t["total_ms"]["torch"]["eager"] > 0
        assert all("nbx" in r and "torch" in r for r in t["rows"])
        # No table serves the interpreter profile here: no row's pick was timed anywhere.
        assert all(r["measured_on"] is None for r in t["rows"] if not r["certified"])


def test_a_picks_gpu_is_named_short():
    assert tc._short("NVIDIA H100 80GB HBM3") == "H100" and tc._short("NVIDIA H200") == "H200"
    assert tc._short(None) == "-" and tc._short("database") == "database"


def test_a_shipped_entry_says_which_gpu_timed_it(monkeypatch):
    from nbx_tune.kernels.runtime import certified
    from nbx_tune.kernels.runtime.registry import all_specs
    from nbx_tune.kernels.spec import encode_bucket, encode_flags
    from nbx_tune.tuner.search import seat_search

    spec = all_specs()["matmul"]
    p = spec.problem_from_row(make_row("aten.mm", ["float32"] * 2, [(5, 7), (7, 3)]))
    st = certified.state()
    bucket = certified.bucket_of(st.profile, spec.key, p.dims)
    monkeypatch.setitem(st.entries, (spec.name, p.dtypes, p.flags, bucket), (None, "/x/shipped.json"))
    key = ("matmul", "float32", encode_flags(p.flags), encode_bucket(spec.key, bucket))
    monkeypatch.setattr(seat_search, "shipped", lambda name: {key: {"provenance": {"device_name": "NVIDIA H200"}}})
    assert tc.measured_on(spec, p) == "NVIDIA H200"
    monkeypatch.setitem(st.entries, (spec.name, p.dtypes, p.flags, bucket), (None, "database"))
    assert tc.measured_on(spec, p) == "database"


def test_arguments_a_trace_never_records_are_supplied():
    # aten.batch_norm requires cudnn_enabled, which the recorder never writes; a factory
    # op's device is the run's own.
    row = make_row("aten.batch_norm", ["float32"] * 5, [(2, 3, 4, 4), (3,), (3,), (3,), (3,)],
                   {"training": "False", "momentum": "0.1", "eps": "1e-05"})
    assert tc.torch_call(row, "cpu")[0](0).shape == (2, 3, 4, 4)
    out = tc.torch_call(make_row("aten.arange", [], [], {"end": "7"}), "cpu")[0](0)
    assert out.device.type == "cpu" and out.numel() == 7


def test_every_row_of_every_example_trace_becomes_a_torch_call():
    # On the meta device: shapes and dtypes only, nothing computed.
    from nbx_tune.kernels.trace import read_trace

    traces = sorted((Path(__file__).resolve().parents[1] / "examples" / "traces").glob("*.tsv"))
    assert len(traces) >= 13
    for path in traces:
        for row in read_trace(path).rows:
            fn, _ = tc.torch_call(row, "meta")
            fn(0)

"""Every launch of every example trace (Llama, GPT-2, the ResNets) maps to a seat of a kernel,
data movement, batch norm, pooling and integer position arithmetic included; and a census
on the interpreter certifies every seat of the new families' rows of the small traces."""

from pathlib import Path

import pytest

from nbx_tune.profiles import get_profile
from nbx_tune.tuner import commands as api
from nbx_tune.tuner.census.census import load_plan
from nbx_tune.kernels.trace import read_trace, write_trace

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "traces"
SMALL = ("llama_small", "gpt2_small", "convnet_small")
MOVEMENT = {"copy", "cat", "embedding", "fill"}


@pytest.mark.parametrize("name", sorted(p.stem for p in EXAMPLES.glob("*.tsv")))
def test_every_launch_of_the_example_traces_is_served(name):
    plan = load_plan(EXAMPLES / f"{name}.tsv", get_profile("hopper"))
    assert plan.uncovered == {} and plan.not_servable == []
    assert sum(sp.launches for sp in plan.seats.values()) == plan.trace.launches
    kernels = {sp.kernel for sp in plan.seats.values()}
    if name.startswith(("llama", "gpt2", "qwen")):
        assert {"matmul", "attention", "embedding"} <= kernels
        # a fused decode step's last add is the hand-off's (kernels/serving/hand_off.py): none is left
        assert "elementwise_binary" in kernels or name.endswith("_fused")
        # the unfused rotary tables' cos and sin (GPT-2: gelu); fused Llamas have none left
        assert ("elementwise_unary" in kernels) == (not name.endswith("_fused") or name.startswith("gpt2"))
    if name in ("llama_small", "gpt2_small"):
        ints = [s for s in plan.seats if s[0] == "elementwise_binary" and s[1].startswith("int64")]
        assert ints and {"cat", "fill"} <= kernels  # positions (arange, int64 adds); the KV cache
    if name.startswith("gpt2"):
        assert "layer_norm" in kernels
    if name.startswith("llama") and not name.endswith("_fused"):
        assert {"reduce", "copy"} <= kernels  # the RMS norm's mean, its float32 casts
    if name.endswith("_fused") and not name.startswith("gpt2"):
        assert {"rms_norm", "rotary_qk", "silu_mul", "add_rms_norm", "rope_cos_sin"} <= kernels  # kernels/serving/fusions/engine.py
        assert "reduce" not in kernels
    if name.startswith("gpt2") and name.endswith("_fused"):
        assert "add_layer_norm" in kernels
    if name.startswith(("convnet", "resnet")):
        assert {"conv", "batch_norm", "max_pool2d"} <= kernels


@pytest.mark.slow
def test_census_certifies_every_new_seat_of_the_small_traces(tmp_path, db_url):
    """The rows of the small example traces served by the new families (copies, casts, cat,
    embedding, arange, batch norm, max pooling, integer adds), one census: all certified."""
    from nbx_tune.kernels.runtime.registry import spec_for_op

    rows = []
    for name in SMALL:
        for r in read_trace(EXAMPLES / f"{name}.tsv").rows:
            spec = spec_for_op(r.op)
            p = spec.problem_from_row(r)
            if spec.name in MOVEMENT | {"batch_norm", "max_pool2d"} or p.dtypes[0] == "int64":
                rows.append(r)
    path = tmp_path / "new_ops.tsv"
    write_trace(path, rows)
    rep = api.census(str(path), db_url, profile="interpreter", isolate=False)
    c = rep.counts()
    assert rep.uncovered == {} and rep.not_servable == []
    assert c["certified"]["launches"] == rep.launches == sum(r.count for r in rows)
    assert {s.kernel for s in rep.seats} == MOVEMENT | {"batch_norm", "max_pool2d", "elementwise_binary"}
    by_op = rep.by_op()
    assert {e["op"] for e in by_op} == {r.op for r in rows}
    assert all(e["served"] == e["launches"] and not e["why"] for e in by_op)
    assert rep.to_dict()["by_op"] == by_op


def test_census_reports_coverage_per_op_with_the_reason_for_what_is_not_served(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_text("op\tdtypes\tshapes\tparams\tcount\n"
                    "aten.cat\tfloat32,float32\t3x5;3x5\tdim=0\t4\n"
                    "aten.cat\tfloat32,float16\t3x5;3x5\t\t2\n"
                    "aten.logcumsumexp\tint64\t1x24\tdim=-1\t3\n")
    rep = api.census(str(path), f"sqlite:///{tmp_path / 'none.db'}", profile="interpreter", dry_run=True,
                     isolate=False)
    by_op = {e["op"]: e for e in rep.by_op()}
    assert by_op["aten.cat"]["launches"] == 6 and by_op["aten.cat"]["served"] == 0
    assert by_op["aten.cat"]["by_status"] == {"pending": 4, "not servable": 2}
    assert any("mixed dtypes" in w for w in by_op["aten.cat"]["why"])
    assert by_op["aten.logcumsumexp"] == {"op": "aten.logcumsumexp", "kernel": None, "launches": 3, "served": 0,
                                    "by_status": {"not covered": 3}, "why": ["no kernel serves this op"]}

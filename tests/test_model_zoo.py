"""Tiny random-weight models of many transformers families under serve() on the interpreter
(testing/model_zoo.py): the logits within 1e-4 relative of torch's, the mask-building ops
(comparisons, bitwise/logical ops, where, the fills shaped by a tensor) never handed to
torch, and every seat serve() launches named by a row of the forward's trace (what a census
certifies). What each family still hands to torch is recorded (printed with -s; the table is
bench/model_zoo_coverage.py's). Four families in the fast suite, the rest marked slow."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from nbx_tune.kernels import all_any, compare, fill, select  # noqa: E402
from nbx_tune.profiles import get_profile  # noqa: E402
from nbx_tune.testing import model_zoo  # noqa: E402

PROFILE = get_profile("interpreter")

FAST = ("llama", "mistral", "gpt2", "bert")  # dense, sliding window, learned positions, an encoder
SLOW = tuple(f for f in model_zoo.FAMILIES if f not in FAST)
# The aten ops of the families this branch built: none may fall through on any family.
MINE = {op.removesuffix(".default") for spec in (compare.SPEC, select.SPEC, all_any.SPEC) for op in spec.serve_ops()} | {
    op for op in fill.SPEC.serve_ops() if op in fill._LIKE_OPS} | {"aten.index.Tensor"}  # x[i0, i1]: index_nd

RECORD: dict = {}  # family -> {op: {reason: calls}}: what fell through, for the report
# Where serve() launches seats no trace row names, until other issues' ops are served whole:
# ops with no route whose torch kernels call served ops inside (histc fills, sort
# copies, stack cats), and SDPA with a mask handed to torch, whose math path returns
# another memory order than the CPU's fused kernel the trace ran (the model's
# `.contiguous()` after it then copies). cause -> the kernels of the seats it may leave.
OPAQUE = {"aten.histc": {"fill"}, "aten.sort": {"copy"}, "aten.stack": {"cat"},
          "aten.scaled_dot_product_attention": {"copy"}}


def _check(family: str) -> model_zoo.Result:
    res = model_zoo.run(family, trace=False)
    assert not res.error, res.error
    RECORD[family] = res.fell_through()
    print(family, res.totals(), RECORD[family])
    assert res.rel_err <= 1e-4, (family, res.rel_err)
    mine = {op: why for op, why in RECORD[family].items() if op in MINE}
    assert mine == {}, (family, mine)
    assert all(why for whys in RECORD[family].values() for why in whys)  # every fall-through says why
    # the trace records what serve() launches: a census of it leaves no default launch
    model, kwargs = model_zoo.build(family)
    rows = model_zoo.record(model, kwargs)
    unnamed = model_zoo.missed_seats(lambda: model(**kwargs)) - model_zoo.trace_seats(rows, PROFILE)
    causes = {r.op for r in rows} & (set(OPAQUE) - {"aten.scaled_dot_product_attention"})
    if "aten.scaled_dot_product_attention" in RECORD[family]:
        causes.add("aten.scaled_dot_product_attention")
    allowed = set().union(*(OPAQUE[c] for c in causes))
    assert {seat.split("|")[0] for seat in unnamed} <= allowed, (family, unnamed, causes)
    return res


def test_at_least_fifteen_families():
    assert len(model_zoo.FAMILIES) >= 15
    assert len(MINE) >= 20  # the routes were read (a broken read would pass the check vacuously)


@pytest.mark.parametrize("family", FAST)
def test_family_logits_match_torch_and_mask_ops_are_served(family):
    res = _check(family)
    if family == "mistral":  # the sliding-window mask of a padded batch runs on the kernels
        for op in ("aten.new_ones", "aten.le.Tensor", "aten.gt.Tensor", "aten.bitwise_and.Tensor"):
            s = res.served[op]
            assert s["certified"] + s["default"] >= 1 and s["torch"] == 0, (op, s)


@pytest.mark.slow
@pytest.mark.parametrize("family", SLOW)
def test_slow_family_logits_match_torch_and_mask_ops_are_served(family):
    _check(family)


def test_the_coverage_bench_prints_a_row_per_family_and_refuses_an_unknown_one(tmp_path, monkeypatch, capsys):
    import json

    from nbx_tune.bench import model_zoo_coverage as bench

    monkeypatch.setenv("OUT", str(tmp_path))
    assert bench.main(["--families", "gpt2"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("gpt2 ")).split()
    data = json.loads((tmp_path / "model_zoo_coverage.json").read_text())["rows"][0]
    assert data["family"] == "gpt2" and data["rel_err"] <= 1e-4
    # no census: every launch on a default config, as the table and the JSON say alike
    assert "no census" in out and row[1] == "0" and int(row[2]) == data["totals"]["default"] > 0
    assert bench.main(["--families", "gpt2,nosuch"]) == 2

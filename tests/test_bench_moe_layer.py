"""bench/moe_layer.py in its smoke mode: the census of the experts' seats, then transformers'
MoE block and the experts op timed side by side on the interpreter, with their errors."""

import json

import pytest

from nbx_tune.bench import moe_layer


def test_an_unknown_layer_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert moe_layer.main(["--smoke", "--layers", "mixtral,grok"]) == 2
    assert "unknown layer grok" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_seat_rows_are_the_experts_ops_seats_with_the_models_routing_dtype():
    from nbx_tune.kernels.moe import SPEC

    rows = moe_layer.seat_rows({k: moe_layer.LAYERS[k] for k in ("mixtral", "deepseek")}, (1, 4096), "bfloat16")
    problems = [SPEC.problem_from_row(r) for r in rows]
    assert [p.dims for p in problems] == [(8, 2, 4096, 14336, 1), (8, 2, 4096, 14336, 1024),
                                          (64, 6, 2048, 1408, 1), (64, 6, 2048, 1408, 384)]
    assert [r.dtypes[4] for r in rows] == ["float32", "float32", "bfloat16", "bfloat16"]


@pytest.mark.slow
def test_smoke_certifies_the_seat_and_times_every_side(tmp_path, monkeypatch, transformers_module):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.delenv("NBX_TUNE_DB", raising=False)
    assert moe_layer.main(["--smoke", "--layers", "qwen2_moe", "--tokens", "3"]) == 0
    rep = json.loads((tmp_path / "moe_layer.json").read_text())
    assert rep["census"]["coverage"]["certified"]["seats"] == 1
    case = rep["cases"]["qwen2_moe T=3"]
    assert set(case["ms"]) == {"gmm", "serve", "experts_gmm", "op"} and set(case["eager_ms"]) == {"loop", "serve"}
    assert all(v > 0 for v in (*case["ms"].values(), *case["eager_ms"].values()))
    assert case["err"]["op"] <= 1e-5
    assert not [k for k in rep["misses"] if k.startswith("moe_experts")]

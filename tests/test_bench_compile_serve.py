"""bench/compile_serve.py: its report prints compile default's time over each variant, and its
smoke mode (CPU interpreter, a tiny model, fp32) runs every variant end to end."""

import json

import pytest

from nbx_tune.bench import compile_serve as cs


def test_the_report_puts_each_variant_beside_compile_default(capsys):
    cs.report({"llama": {"variants": {
        "compile default": {"compile_s": 10.0, "eager_ms": 2.0, "graph_ms": 1.0, "err": 1e-3, "certified_nodes": 0},
        "compile + nbx-tune": {"compile_s": 11.0, "eager_ms": 1.6, "graph_ms": 1.25, "err": 1e-3,
                               "certified_nodes": 17},
        "compile max-autotune": {"error": "RuntimeError: boom"}}}})
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "nbx-tune" in line).split()
    assert row[-5:] == ["1.25", "1.250", "0.80", "1.00e-03", "17"]
    assert "failed: RuntimeError: boom" in out


def test_an_unknown_model_is_one_line(capsys):
    with pytest.raises(SystemExit):
        cs.main(["--models", "llama,gpt5", "--smoke"])
    assert "unknown model gpt5" in capsys.readouterr().err


@pytest.mark.slow
def test_smoke_runs_every_variant(tmp_path, monkeypatch, transformers_module):
    monkeypatch.setenv("OUT", str(tmp_path))
    results = cs.main(["--smoke", "--no-census", "--models", "gpt2"])
    v = results["gpt2"]["variants"]
    assert set(v) == {"torch eager", "compile default", "compile + nbx-tune", "serve(compile)"}
    for name, d in v.items():
        assert "error" not in d and d["eager_ms"] > 0 and d["err"] < 1e-4, (name, d)
    saved = json.loads((tmp_path / "compile_serve_gpt2.json").read_text())
    assert set(saved["models"]) == {"gpt2"}

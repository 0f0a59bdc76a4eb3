"""bench/elementwise_rows.py in its smoke mode: rows run end to end with a plain config and
two stream levers, every config checked against torch / fp64, the staged and per-input-copy
paths beside them, and a planted wrong config reported."""

import json

import pytest

from nbx_tune.bench import elementwise_rows as er  # noqa: E402


@pytest.mark.slow
def test_smoke_rows_time_every_side_and_check_them(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert er.main(["--smoke", "--rows", "neg bf16 half decode,cat(-x2,pow2 f32 llama2"]) == 0
    rep = json.loads((tmp_path / "elementwise_rows.json").read_text())
    rows = {r["row"]: r for r in rep["rows"]}
    assert set(rows) == {"neg bf16 half decode-b64", "cat(-x2, x1) bf16 llama2-512", "pow2 f32 llama2-512"}
    for r in rows.values():
        sides = {s["side"] for s in r["sides"]}
        assert "torch" in sides and len(sides) >= 4 and r["best"] in sides and not r["bad_configs"]
        assert all(s["ms"] > 0 and s["check"] == "ok" for s in r["sides"])
        assert r["rot_out"]["rot"] > 0
    assert "staged (copy + neg)" in {s["side"] for s in rows["neg bf16 half decode-b64"]["sides"]}
    assert "two copies" in {s["side"] for s in rows["cat(-x2, x1) bf16 llama2-512"]["sides"]}


def test_a_wrong_config_is_reported(tmp_path, monkeypatch):
    from nbx_tune.kernels import elementwise as ew

    monkeypatch.setenv("OUT", str(tmp_path))
    real = ew.launch_unary

    def off_by_one(x, y, fn, params, config, plan=None):  # every config but the first is wrong
        real(x, y, fn, params, config, plan)
        if config != ew.UNARY_SPEC.configs()[0]:
            y.view(-1)[0] += 1
    for where in (ew, ew.spec, ew.ops):  # the bench's calls, the spec's launch, the public ops
        monkeypatch.setattr(where, "launch_unary", off_by_one)
    assert er.main(["--smoke", "--rows", "neg bf16 half decode"]) == 1
    row = json.loads((tmp_path / "elementwise_rows.json").read_text())["rows"][0]
    # the staged path launches the default config: wrong too
    assert set(row["bad_configs"]) == {s["side"] for s in row["sides"]} - {"torch", row["best"]}
    assert row["best"] == str(ew.UNARY_SPEC.configs()[0])

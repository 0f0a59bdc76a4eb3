"""bench/masked_attention.py in its smoke mode: every side timed and checked against torch,
and a wrong config reported with exit status 1."""

import json

import pytest

from nbx_tune.bench import masked_attention as bench  # noqa: E402


@pytest.mark.slow
def test_smoke_times_every_side_against_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert bench.main(["--smoke"]) == 0
    rows = json.loads((tmp_path / "masked_attention.json").read_text())["rows"]
    assert [r["shape"][0] for r in rows] == [s[0] for s in bench.SMOKE]
    for r in rows:
        assert {"torch", "served", "best", "gqa", "read"} <= set(r["ms"])
        assert all(t > 0 for t in r["ms"].values())
        assert all(e < 1e-4 for e in r["errors"].values())


def test_a_wrong_config_is_reported(tmp_path, monkeypatch):
    from nbx_tune.kernels.masked_attention import kernel

    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(bench, "SMOKE", bench.SMOKE[1:])
    real = kernel.launch_masked_attention

    def off(q, k, v, o, *a, **kw):
        real(q, k, v, o, *a, **kw)
        o[0, 0, 0, 0] += 1

    monkeypatch.setattr(kernel, "launch_masked_attention", off)
    assert bench.main(["--smoke"]) == 1

"""bench/moe_routing.py in its smoke mode: every routing case on the kernels gives torch's
bits or is handed to torch (the CPU's sort with ties), and the tie probe is reported."""

import json

import pytest

from nbx_tune.bench import moe_routing


@pytest.mark.slow
def test_smoke_cases_are_torchs_bits_or_handed_to_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert moe_routing.main(["--smoke", "--no-census"]) == 0
    rep = json.loads((tmp_path / "moe_routing.json").read_text())
    cases = rep["cases"]
    assert len(cases) == 23  # 7 routing ops at 3 sizes, the mask read and its all()
    for name, c in cases.items():
        if name.startswith("sort"):  # the expert ids: ties everywhere, torch's on the CPU
            assert "ties" in c["torch"], c
        else:
            assert c["torch_bits"] and c["ms"]["kernel"] > 0, (name, c)
    assert set(rep["torch_ties_in_index_order"]) == {"sort", "topk"}

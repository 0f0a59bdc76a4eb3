"""Certified max-autotune choices (kernels/serving/inductor_table.py, tuner/inductor/choices.py):
the table's format and staleness, Inductor's own lookup reading it, the degrade on a torch
without the hook, and the CPU side of certifying a choice."""

import json
import logging

import numpy as np
import pytest
import torch

from nbx_tune.errors import NbxError
from nbx_tune.kernels.serving import inductor_table as it
from nbx_tune.tuner.inductor import choices

KEY = "((torch.float16, [64, 128], [128, 1]), (torch.float16, [128, 256], [256, 1]))+mm"
CFG = {"template_id": "triton::mm", "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8,
       "num_stages": 3, "num_warps": 4}


def _entry(key=KEY, torch_version="2.11.0+cu130", **prov):
    return {"key": key, "op": "mm", "config": dict(CFG),
            "provenance": {"torch_version": torch_version, "triton_version": "3.6.0",
                           "device_name": "NVIDIA H100 80GB HBM3", "max_rel_err": 1e-3, "ms": 0.01,
                           "measured_at": "2026-12-07T18:00:00+00:00", **prov}}


def test_a_table_round_trips_and_a_bad_entry_is_named(tmp_path):
    path = tmp_path / "t.json"
    it.write(path, "hopper", [_entry()])
    assert it.read(path)["entries"] == [_entry()]
    doc = json.loads(path.read_text())
    del doc["entries"][0]["provenance"]["ms"]
    path.write_text(json.dumps(doc))
    with pytest.raises(NbxError, match=r"t\.json: entries\[0\]: provenance\.ms"):
        it.read(path)
    with pytest.raises(NbxError, match="entries\\[0\\]: config.template_id"):
        it.write(tmp_path / "u.json", "hopper", [{**_entry(), "config": {"BLOCK_M": 64}}])
    assert not (tmp_path / "u.json").exists()  # nothing half-written


def test_staleness_follows_torch_minor_triton_and_gpu():
    prov = _entry()["provenance"]
    here = ("2.11.1+cu130", "3.6.0", "NVIDIA H100 80GB HBM3")
    assert it.stale_reason(prov, *here) is None  # a patch release keeps Inductor's templates
    assert "torch 2.11.0" in it.stale_reason(prov, "2.13.0", *here[1:])
    assert "Triton" in it.stale_reason(prov, here[0], "3.5.0", here[2])
    assert "H200" in it.stale_reason(prov, *here[:2], "NVIDIA H200")
    table, stale = it.lookup_table([{"entries": [_entry(), _entry(key="k2", torch_version="2.9.0")]}], *here)
    assert table == {KEY: [CFG]} and [k for k, _ in stale] == ["k2"]


class _Inputs:
    """What Inductor's lookup reads of a GEMM's inputs (its MMKernelInputs' methods)."""

    _scalars: dict = {}

    def device(self):
        return torch.device("cuda", 0)

    def dtypes(self):
        return [torch.float16, torch.float16]

    def shapes_hinted(self):
        return [(64, 128), (128, 256)]

    def strides_hinted(self):
        return [(128, 1), (256, 1)]


def test_inductors_lookup_reads_the_certified_table(monkeypatch):
    """The key format is Inductor's own: its lookup, given a GEMM's inputs, finds the entry
    the table holds under that text and hands the config back without the template id."""
    cls = it.handler_class()
    if cls is None:
        pytest.skip("this torch has no Inductor lookup table")
    monkeypatch.setattr(cls, "_get_device_key", staticmethod(lambda device: "sm90"))
    handler = cls()
    handler.table, _ = it.lookup_table([{"entries": [_entry()]}], "2.11.0", "3.6.0", "NVIDIA H100 80GB HBM3")
    got = handler.lookup_template_configs(_Inputs(), "mm", ["triton::mm", "aten::mm"])
    assert got == {"triton::mm": [{k: v for k, v in CFG.items() if k != "template_id"}]}
    assert handler.lookup_template_configs(_Inputs(), "addmm", ["triton::mm"]) == {}
    other = cls()
    other.table = {}
    assert handler.uuid() != other.uuid()  # another table: another compile, not a cache hit


def test_install_sets_and_restores_inductors_handler():
    import torch._inductor.config as ic

    if it.hook() is None:
        pytest.skip("this torch has no Inductor lookup table")
    before = ic.inductor_choices_class
    with it.choices({KEY: [CFG]}) as on:
        assert on and ic.inductor_choices_class().table == {KEY: [CFG]}
    assert ic.inductor_choices_class is before


def test_a_torch_without_the_hook_gets_one_line(monkeypatch, caplog):
    monkeypatch.setattr(it, "hook", lambda: None)
    with caplog.at_level(logging.WARNING, logger="nbx_tune"):
        assert it.install({KEY: [CFG]}) is False
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "no Inductor template lookup table" in lines[0] and torch.__version__ in lines[0]


def test_gemm_problems_of_a_trace(tmp_path):
    trace = tmp_path / "t.tsv"
    trace.write_text("# nbx-tune trace v1\n"
                     "op\tdtypes\tshapes\tparams\tcount\n"
                     "aten.mm\tbfloat16,bfloat16\t512x4096;4096x11008\tlayout=nt\t2\n"
                     "aten.mm\tbfloat16,bfloat16\t512x4096;4096x4096\tlayout=nt\t8\n"
                     "aten.add.Tensor\tbfloat16,bfloat16\t512x4096;512x4096\t\t3\n")
    got = choices.gemm_problems(trace)
    assert [(g.op, g.dims, g.layout) for g in got] == [("mm", (1, 512, 4096, 4096), "nt"),
                                                       ("mm", (1, 512, 11008, 4096), "nt")]
    a, b = choices.operands(choices.Gemm("mm", "float32", (1, 8, 6, 4), "nt"), "cpu")
    assert a.shape == (8, 4) and b.shape == (4, 6) and b.stride() == (1, 4)  # a weight's W.t()
    assert np.allclose(choices.oracle(choices.Gemm("mm", "float32", (1, 8, 6, 4), "nt"), (a, b)),
                       (a.double() @ b.double()).numpy())


def test_the_entry_is_the_fastest_survivor_and_keeps_the_refusals():
    ref = np.ones((4, 4))
    assert choices.judge(ref * (1 + 1e-4), ref, 1e-3) == (pytest.approx(1e-4), None)
    err, why = choices.judge(ref * 1.1, ref, 1e-3)
    assert why.startswith("inaccurate")
    assert choices.judge(ref * np.nan, ref, 1e-3)[1] == "non-finite output"
    c = choices.Choice(choices.Gemm("mm", "bfloat16", (1, 64, 64, 64), "nn"), KEY, aten_ms=0.02)
    c.measured = [choices.Measured({"BLOCK_M": 1}, 1e-3, 0.010), choices.Measured({"BLOCK_M": 2}, 1e-3, 0.008),
                  choices.Measured({"BLOCK_M": 3}, 0.5, None, "inaccurate: error 0.5 > 0.01"),
                  choices.Measured({"BLOCK_M": 4}, 1e-3, 0.001, None)]
    c.measured[3].refusal = "compile or launch: RuntimeError: out of resources"
    e = choices.entry(c, {"torch_version": "2.11.0", "triton_version": "3.6.0", "device_name": "H100"})
    assert e["config"] == {"BLOCK_M": 2} and e["provenance"]["runner_up_ms"] == 0.010
    assert [r["config"]["BLOCK_M"] for r in e["provenance"]["refusals"]] == [3, 4]
    c.measured = c.measured[2:]
    assert choices.entry(c, {}) is None


def test_the_recording_compile_reads_inductors_key():
    """The GPU path's first step on this torch: one compile under max-autotune, its choices
    recorded. The key is the text Inductor's lookup makes of these operands (a weight's W.t()
    strides included); the CPU has no Triton templates to list."""
    if it.hook() is None:
        pytest.skip("this torch has no Inductor lookup table")
    g = choices.Gemm("mm", "float32", (1, 64, 48, 32), "nt")
    key, configs = choices.enumerate_configs(g, choices.operands(g, "cpu"))
    assert key == "((torch.float32, [64, 32], [32, 1]), (torch.float32, [32, 48], [1, 32]))+mm"
    assert configs == []

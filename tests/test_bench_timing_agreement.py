"""bench/timing_agreement.py: a config whose outputs differ is left out, the summary reads
each way's pick under replay, and the smoke mode runs end to end."""

import json

import pytest
import torch

from nbx_tune.bench import timing_agreement as ta  # noqa: E402

from nbx_tune.kernels.runtime.registry import all_specs  # noqa: E402


def test_outputs_agree_within_the_dtypes_tolerance_and_exactly_where_exact():
    spec = all_specs()["elementwise_binary"]
    ref = {"out": torch.ones(8, dtype=torch.bfloat16)}
    assert ta.agrees(spec, ref, {"out": ref["out"] * 1.01})
    assert not ta.agrees(spec, ref, {"out": ref["out"] * 1.1})
    copy = all_specs()["copy"]
    assert copy.exact and not ta.agrees(copy, ref, {"out": ref["out"] * 1.01})


def test_the_summary_reads_each_ways_pick_under_replay():
    res = {"replay": {"torch": 1.0, "a": 2.0, "b": 1.0, "c": 4.0},
           "launch": {"a": 0.5, "b": 0.6, "c": 0.7}, "stream": {"a": 0.9, "b": 0.8, "c": 1.0}}
    s = ta.summarize(res)
    assert s["best"] == "b" and s["torch/best"] == 1.0
    assert s["launch"]["pick"] == "a" and s["launch"]["loss"] == 1.0 and s["launch"]["rank_of_best"] == 2
    assert s["stream"]["pick"] == "b" and s["stream"]["loss"] == 0.0


@pytest.mark.slow
def test_smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # main sets it: restored after the test
    assert ta.main(["--smoke", "--kernels", "elementwise_binary", "--rows", "1", "--configs", "2"]) == 0
    got = json.loads((tmp_path / "timing_agreement.json").read_text())
    (row,) = got["rows"]
    assert row["kernel"] == "elementwise_binary" and set(row["replay"]) == {"torch", *row["launch"]}
    assert row["summary"]["launch"]["pick"] in row["launch"]

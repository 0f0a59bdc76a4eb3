"""bench/launch_overhead.py --serve --smoke: serve()'s path against torch's op, per family, on
the CPU interpreter, side by side, with what serve() ran."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(tmp_path, report: str, *args) -> tuple[str, dict]:
    """bench/launch_overhead.py with `args`: its stdout and the JSON report it saved."""
    env = {**os.environ, "OUT": str(tmp_path), "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "launch_overhead.py"), *args],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, json.loads((tmp_path / report).read_text())


@pytest.mark.slow
def test_serve_smoke_times_both_sides_of_each_family(tmp_path):
    out, rep = _bench(tmp_path, "launch_overhead_serve_smoke.json", "--serve", "--smoke", "--only", "softcap,gelu_mul")
    assert "torch/serve" in out
    assert {d["family"] for d in rep["us_per_call"].values()} == {"softcap", "gelu_mul"}
    for d in rep["us_per_call"].values():
        assert d["torch_us"] > 0 and d["serve_us"] > 0
        ran = next(iter(d["ran"].values()))
        assert ran["certified"] + ran["default"] == 1  # the call ran on the family's kernel


@pytest.mark.slow
def test_serve_cpu_times_serves_own_work_with_launches_mocked(tmp_path):
    """--serve --cpu: every call of the families asked for runs the kernel's replay (certified,
    the launch mocked), timed against torch's CPU op."""
    out, rep = _bench(tmp_path, "launch_overhead_serve_cpu.json", "--serve", "--cpu", "--only", "where,layer_norm")
    assert "launches mocked" in out
    assert {d["family"] for d in rep["us_per_call"].values()} == {"where", "layer_norm"}
    for d in rep["us_per_call"].values():
        assert d["torch_us"] > 0 and d["serve_us"] > 0
        assert all(s["certified"] >= 1 and not s["default"] and not s["torch"] for s in d["ran"].values())

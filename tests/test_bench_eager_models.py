"""bench/eager_models.py --smoke: a tiny Gemma-2 with eager attention, torch eager against
serve() eager side by side on the CPU interpreter, with what serve() ran and fused."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_smoke_times_torch_and_serve_eager_and_says_what_serve_ran(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "eager_models.py"), "--smoke", "--rows",
                        "gemma2-2b decode"], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "goal (serve eager >= torch eager on every row)" in r.stdout
    rep = json.loads((tmp_path / "eager_models.json").read_text())
    row = rep["rows"]["gemma2-2b decode"]
    assert set(row["ms"]) == {"torch eager", "serve eager"} and all(v > 0 for v in row["ms"].values())
    assert row["err_vs_torch"] <= 1e-4
    assert {"score_softmax", "gelu_mul", "softcap"} <= set(row["fused"])
    assert row["totals"]["certified"] + row["totals"]["default"] > 0

"""One rule for every entry point on a machine with no GPU (profiles/detect.py's
use_interpreter_without_gpu): the census, the public ops, serve() and `nbx-tune run` switch
to Triton's CPU interpreter themselves, or say in one line why they cannot."""

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with no GPU")


def _python(code: str, *args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args, "-c", code] if not args else [sys.executable, *args],
                          env=env, capture_output=True, text=True, timeout=300)


def test_serve_switches_to_the_interpreter_by_itself():
    r = _python("import torch, nbx_tune\n"
                "with nbx_tune.serve():\n"
                "    y = torch.relu(torch.tensor([-1.0, 2.0]))\n"
                "print(y.tolist(), nbx_tune.serve_stats()['aten.relu'])")
    assert r.returncode == 0, r.stderr  # it used to raise "no kernel for CUDA for aten::relu"
    assert "[0.0, 2.0]" in r.stdout and "'certified'" in r.stdout
    assert "no GPU found" in r.stderr


def test_serve_after_triton_was_imported_is_one_line_naming_the_fix():
    r = _python("import triton, torch, nbx_tune\n"
                "try:\n"
                "    with nbx_tune.serve():\n"
                "        pass\n"
                "except nbx_tune.NbxError as e:\n"
                "    print('error:', e)\n")
    assert r.returncode == 0, r.stderr
    line, = r.stdout.splitlines()
    assert "set TRITON_INTERPRET=1 before starting Python" in line


def test_nbx_tune_run_switches_to_the_interpreter_by_itself(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import torch\nprint(torch.relu(torch.tensor([-1.0, 2.0])).tolist())\n")
    r = _python("", "-m", "nbx_tune.cli.app", "run", "--", sys.executable, str(script))
    assert r.returncode == 0, r.stderr
    assert "[0.0, 2.0]" in r.stdout and "no GPU found" in r.stderr and "aten.relu" in r.stderr


def test_profiles_list_names_the_interpreter_where_a_census_would_run_on_it():
    """It said "this device: none" on the machine where the census ran on `interpreter`."""
    r = _python("", "-m", "nbx_tune.cli.app", "profiles", "list", "--json")
    assert r.returncode == 0, r.stderr
    import json

    d = json.loads(r.stdout)
    assert (d["device_target"], d["device_profile"]) == ("interpreter", "interpreter")

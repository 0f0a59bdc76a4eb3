"""Every public op the README names is importable as written and is the op, not a module
(`softmax` is also the name of the module that holds it), and the kernels find Triton's
CPU interpreter on a machine with no GPU, as the CLI does."""

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import torch

import nbx_tune.kernels as kernels
from nbx_tune.kernels.runtime.registry import all_specs

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_ops() -> set:
    names = set()
    for m in re.finditer(r"from nbx_tune\.kernels import ([\w, ]+)", README.read_text()):
        names |= {n.strip() for n in m.group(1).split(",") if n.strip()}
    return names


def test_every_public_op_is_importable_and_callable_after_every_kernel_module_is_loaded():
    all_specs()  # imports every kernel module, nbx_tune.kernels.softmax included
    names = readme_ops() | set(kernels.__all__)
    assert {"mm", "softmax", "rms_norm", "launch_stats"} <= names
    for name in sorted(names):
        scope = {}
        exec(f"from nbx_tune.kernels import {name}", scope)
        assert callable(scope[name]) and not isinstance(scope[name], types.ModuleType), name


def test_softmax_imported_as_the_readme_writes_it_computes_softmax():
    all_specs()
    from nbx_tune.kernels import log_softmax, softmax

    x = torch.randn(3, 37)
    torch.testing.assert_close(softmax(x, -1), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(log_softmax(x, -1), torch.log_softmax(x, -1), rtol=1e-5, atol=1e-5)


def test_the_kernels_find_the_interpreter_on_a_machine_with_no_gpu(tmp_path):
    if torch.cuda.is_available():
        return  # this machine has a GPU: nothing to find
    code = ("import torch\nfrom nbx_tune.kernels import mm\n"
            "a, b = torch.randn(5, 7, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)\n"
            "print(float((mm(a.float(), b.float()).double() - a @ b).abs().max()))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["NBX_TUNE_DB"] = f"sqlite:///{tmp_path / 'none.db'}"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.strip().splitlines()[-1]) < 1e-4
    assert "CPU interpreter" in r.stderr

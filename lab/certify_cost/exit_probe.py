"""What a census's parent pays to learn its GPU's target, and to exit afterwards: each
variant is a fresh interpreter that imports torch, does one thing, prints when it is done
and returns (or leaves with os._exit); the exit's cost is the time from that print until
this script's wait returns. Cold: an empty Triton cache (Triton's driver builds its C
module on first use). Usage: python3 exit_probe.py [REPEATS]."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "import torch": "pass",
    "torch.cuda.is_available": "torch.cuda.is_available()",
    "torch capability": "torch.cuda.get_device_capability()",
    "triton target (cold)": "import triton; triton.runtime.driver.active.get_current_target()",
    "triton target (warm)": "import triton; triton.runtime.driver.active.get_current_target()",
    "a CUDA context": "torch.empty(1, device='cuda')",
}
CHILD = r"""
import json, os, sys, time
import torch
t0 = time.time()
{body}
t1 = time.time()
print(json.dumps([t1 - t0, t1]), flush=True)
if sys.argv[1] == "os_exit":
    os._exit(0)
"""


def run(body: str, how: str, cache: str) -> tuple[float, float]:
    env = {**os.environ, "TRITON_CACHE_DIR": cache}
    p = subprocess.Popen([sys.executable, "-c", CHILD.format(body=body), how], stdout=subprocess.PIPE,
                         text=True, env=env)
    out = p.stdout.readline()
    p.wait()
    end = time.time()
    took, done = json.loads(out)
    return took, end - done


if __name__ == "__main__":
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    warm = tempfile.mkdtemp(prefix="nbx-exit-warm-")
    run(VARIANTS["triton target (warm)"], "return", warm)
    print(f"{'what':<26} {'exit':<8} {'its own s':>10} {'exit s':>8}")
    for name, body in VARIANTS.items():
        for how in ("return", "os_exit"):
            rs = [run(body, how, tempfile.mkdtemp(prefix="nbx-exit-") if "cold" in name else warm)
                  for _ in range(repeats)]
            print(f"{name:<26} {how:<8} {statistics.median(r[0] for r in rs):10.3f} "
                  f"{statistics.median(r[1] for r in rs):8.3f}", flush=True)

"""Which device is this, and which profile serves it.

The device is named by the target string Triton reports, `"{backend}:{arch}"` (`cuda:90`,
`hip:gfx942`), or `interpreter` under `TRITON_INTERPRET=1`. The interpreter is recognised
from the environment alone: with no GPU, Triton's `get_current_target()` raises.
A profile claims a device through `compute_capability_matches` prefixes; the longest
matching prefix wins, and a tie between two profiles is an error, never a guess.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from dataclasses import dataclass

from nbx_tune.errors import DeviceError, ProfileError

INTERPRETER = "interpreter"
_TRUE = {"1", "true", "yes", "on"}


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


@dataclass(frozen=True)
class DeviceInfo:
    target: str  # "cuda:90", "hip:gfx942", "interpreter"
    name: str  # "NVIDIA H200", "Triton interpreter on x86_64"
    driver: str  # "580.159.03", "n/a"


def current_target() -> str:
    if interpreter_enabled():
        return INTERPRETER
    target = _torch_cuda_target()
    if target is not None:
        return target
    try:
        from triton.runtime import driver

        t = driver.active.get_current_target()
    except Exception as e:  # no driver, no device: Triton raises RuntimeError
        raise DeviceError(
            f"no GPU found by Triton ({str(e).splitlines()[0]}); "
            "set TRITON_INTERPRET=1 to run on the CPU interpreter"
        ) from None
    return f"{t.backend}:{t.arch}"


def _torch_cuda_target() -> str | None:
    """An NVIDIA GPU's target as Triton's CUDA driver derives it (from torch's compute
    capability), without that driver: a census's parent launches nothing, and the driver's
    first use (its C module built on a cold cache, Triton's source hashed) would be start-up
    time spent for nothing. None where torch is not a CUDA build or sees no GPU: Triton
    is asked."""
    try:
        import torch

        if torch.version.hip is not None or not torch.version.cuda or not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability()
    except Exception:  # no torch, or no usable driver
        return None
    return f"cuda:{major * 10 + minor}"


def use_interpreter_without_gpu(notice=None) -> None:
    """The one rule every entry point follows (the CLI's commands, the public ops, serve(),
    `nbx-tune run`): with no GPU and no TRITON_INTERPRET, switch to Triton's CPU
    interpreter and say so through `notice` (once per process).

    It must be decided before triton is first imported: Triton builds its library functions
    (tl.cdiv, ...) for the interpreter or for a GPU at import. So the GPU is looked for
    through torch, which does not import triton; where triton is imported already and sees
    no GPU, the fallback is impossible and this raises a DeviceError naming the fix."""
    if interpreter_enabled():
        return
    import sys

    import torch

    if torch.cuda.is_available():  # CUDA and ROCm builds alike
        return
    if "triton" in sys.modules:
        if gpu_available():
            return
        raise DeviceError("no GPU found and triton was imported before nbx-tune could switch to its CPU "
                          "interpreter: set TRITON_INTERPRET=1 before starting Python")
    os.environ["TRITON_INTERPRET"] = "1"
    if notice:
        notice("no GPU found: running on Triton's CPU interpreter (TRITON_INTERPRET=1)")


def gpu_available() -> bool:
    """True when Triton can see a GPU driver (never raises)."""
    try:
        from triton.runtime import driver

        driver.active.get_current_target()
        return True
    except Exception:
        return False


def _driver_version() -> str:
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module\s+([\d.]+)", f.read())
            if m:
                return m.group(1)
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch

        return f"hip {torch.version.hip}" if torch.version.hip else "unknown"
    except Exception:
        return "unknown"


@functools.lru_cache(maxsize=1)
def device_info() -> DeviceInfo:
    target = current_target()
    if target == INTERPRETER:
        return DeviceInfo(target, f"Triton interpreter on {platform.machine() or 'cpu'}", "n/a")
    try:
        import torch

        name = torch.cuda.get_device_name()
    except Exception:
        name = target
    return DeviceInfo(target, name, _driver_version())


def match_profile(target: str, profiles) -> "object":
    """The profile whose longest `compute_capability_matches` prefix matches `target`."""
    best, best_len, tied = None, -1, []
    for p in profiles:
        for prefix in p.compute_capability_matches:
            if target.startswith(prefix):
                if len(prefix) > best_len:
                    best, best_len, tied = p, len(prefix), [p.name]
                elif len(prefix) == best_len and p is not best:
                    tied.append(p.name)
    if best is None:
        raise ProfileError(
            f"no profile matches device target {target!r}; pass --profile NAME "
            "(nbx-tune profiles list) or add a profile with a matching compute_capability_matches prefix"
        )
    if len(tied) > 1:
        raise ProfileError(
            f"device target {target!r} matches profiles {', '.join(sorted(tied))} equally; "
            "make one compute_capability_matches prefix longer"
        )
    return best

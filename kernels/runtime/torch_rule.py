"""Torch baselines: when serve() hands a certified seat back to torch.

A baseline is one measurement of a certificate's config against torch's own op at the
seat's shapes from real traces, both sides timed the same way in alternating rounds
(`nbx-tune baseline`, tuner/timing/torch_baselines.py). Where torch is the faster of the two on this GPU
with this torch, a model under serve() runs torch's op at that seat: a certified kernel
never makes a served model slower than the torch it replaces. The kernel library's public
ops (`nbx_tune.matmul`, ...) always run the kernel; only serve() defers.

The rule is here and nowhere else. A baseline applies where all of these hold:
- it was measured against the very config the seat serves (a new certificate drops it);
- on a GPU of the same name (a sibling device of the profile ranks torch otherwise: cuBLAS
  and the kernels scale differently between an H100 and an H200);
- with torch of the same major.minor version (its kernels are what was measured).
It defers when torch was faster by more than MARGIN; the newest applicable baseline of a
seat decides.
"""

from __future__ import annotations

from datetime import datetime

from nbx_tune.kernels.runtime.table_schema import finite_number

# torch must be this much faster before a seat goes back to it: below that the two sides
# are within the run-to-run spread of the measurement, and the certified kernel stays.
MARGIN = 0.02

# The keys of one baseline, in a table entry's provenance (`torch_baselines`) and in the
# database's `torch_baselines` view alike.
KEYS = {"device_name": str, "torch_version": str, "nbx_ms": float, "torch_ms": float,
        "method": str, "measured_at": str}


def torch_minor(version: str) -> str:
    """"2.11" of "2.11.0+cu130": what a baseline's torch must match."""
    return ".".join(str(version).split("+")[0].split(".")[:2])


def defers(nbx_ms: float, torch_ms: float) -> bool:
    """Whether torch, at torch_ms, is faster than the certified kernel's nbx_ms beyond the
    measurement's spread."""
    return torch_ms * (1.0 + MARGIN) < nbx_ms


def applicable(baselines, config: str, device_name: str | None, torch_version: str | None) -> dict | None:
    """The newest baseline of `baselines` (dicts with KEYS and `config`) that holds for
    `config` on this GPU and torch, or None."""
    if not device_name or not torch_version:
        return None
    here = torch_minor(torch_version)
    ok = [b for b in baselines if b.get("config") == config and b.get("device_name") == device_name
          and torch_minor(b.get("torch_version", "")) == here]
    return max(ok, key=lambda b: str(b.get("measured_at", "")), default=None)


# Why serve() runs torch at such a seat: the words serve_stats() counts its calls under
# (`nbx-tune show` and `nbx-tune baseline` say which seats, and by how much).
REASON = "torch is faster at this seat on this GPU (its baseline)"


def problem(b) -> str | None:
    """Why one baseline (a table entry's, as read from JSON) is malformed, or None."""
    if not isinstance(b, dict):
        return "expected an object"
    missing = [k for k in KEYS if k not in b]
    if missing:
        return f"{missing[0]}: missing"
    for k, typ in KEYS.items():
        v = b[k]
        if typ is float:
            if not finite_number(v) or v <= 0:
                return f"{k}: {v!r} is not a positive finite time"
        elif not isinstance(v, str) or not v:
            return f"{k}: expected a non-empty string"
    try:
        datetime.fromisoformat(b["measured_at"])
    except ValueError:
        return "measured_at: not an ISO date and time"
    unknown = sorted(set(b) - set(KEYS))
    return f"{unknown[0]}: unknown key" if unknown else None

"""Shared by the bench scripts: where outputs go, and the header every table carries."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path


def out_dir(default: str = "bench_out") -> Path:
    d = Path(os.environ.get("OUT") or default)
    d.mkdir(parents=True, exist_ok=True)
    return d


def environment() -> dict:
    """Date, GPU, driver, Triton and torch: recorded beside every figure."""
    import torch
    import triton

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "python": platform.python_version(),
           "torch": torch.__version__, "triton": triton.__version__,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none"}
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, timeout=20).stdout.strip()
    except OSError:
        env["driver"] = "n/a"
    return env


def save(name: str, data) -> Path:
    p = out_dir() / name
    p.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    return p


def table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)

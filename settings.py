"""Where nbx-tune keeps things: the database URL and exported tables, from the environment.

Shared by the tuner (writer) and the kernels' launch-time read, which must agree on where
the database is without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_DB = "NBX_TUNE_DB"
ENV_TABLE = "NBX_TUNE_TABLE"
ENV_PREFETCH = "NBX_TUNE_PREFETCH"


def default_db_path() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("nbx-tune")) / "nbx-tune.db"


def db_url(explicit: str | None = None) -> str:
    """`--db`, else NBX_TUNE_DB, else a SQLite file in the user's cache directory."""
    if explicit:
        return explicit
    env = os.environ.get(ENV_DB, "").strip()
    if env:
        return env
    return f"sqlite:///{default_db_path()}"


def table_paths() -> list[Path]:
    """Exported certified tables named by NBX_TUNE_TABLE (os.pathsep-separated)."""
    raw = os.environ.get(ENV_TABLE, "").strip()
    return [Path(p) for p in raw.split(os.pathsep) if p.strip()]


def prefetch() -> bool:
    """NBX_TUNE_PREFETCH=1: while a census times a seat, its compile pool makes the next
    seat's inputs and fp64 oracles and compiles its candidates (tuner/isolation.py). Off
    by default: made ahead (by a thread then), a seat's preparation took under 0.05 s
    instead of 0.3 to 1.1 s on the H200, but no GPU run has yet shown the bucketing loss
    within 5 % with it (docs/benchmarks.md, 2026-12-03)."""
    return os.environ.get(ENV_PREFETCH, "").strip().lower() in ("1", "true", "yes", "on")

"""Where nbx-tune keeps things: the database URL and exported tables, from the environment.

Shared by the tuner (writer) and the kernels' launch-time read, which must agree on where
the database is without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_DB = "NBX_TUNE_DB"
ENV_TABLE = "NBX_TUNE_TABLE"


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


def table_paths(env: str = ENV_TABLE) -> list[Path]:
    """Exported certified tables named by NBX_TUNE_TABLE (os.pathsep-separated); Inductor's
    certified template choices by NBX_TUNE_INDUCTOR_TABLE (kernels/serving/inductor_table.py)."""
    raw = os.environ.get(env, "").strip()
    return [Path(p) for p in raw.split(os.pathsep) if p.strip()]


ENV_INDUCTOR_TABLE = "NBX_TUNE_INDUCTOR_TABLE"

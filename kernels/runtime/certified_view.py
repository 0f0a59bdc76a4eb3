"""The launch-time read of the database's `certified_configs` view, and nothing else.

The view is the contract between the tuner (the writer) and the kernels (the reader); its
columns are defined once, by the migration that creates it. This reader takes the rows as
they are (`SELECT *`, keyed by the view's own column names), so a column added there needs
no edit here. A SQLite database is read with the standard library, read-only: a launch
never creates, migrates or locks the writer's database, and the kernels need no
SQLAlchemy. Any other URL (PostgreSQL for a fleet) goes through SQLAlchemy, imported only
then.
"""

from __future__ import annotations

from pathlib import Path

VIEW = "certified_configs"
BASELINES = "torch_baselines"  # the current certificates' torch baselines (kernels/runtime/torch_rule.py)
SQLITE_PREFIX = "sqlite:///"


def sqlite_path(url: str) -> Path | None:
    """The file of a `sqlite:///` URL, None for any other database."""
    return Path(url[len(SQLITE_PREFIX):]) if url.startswith(SQLITE_PREFIX) else None


def read_view(url: str, profile: str, view: str = VIEW) -> list[dict] | None:
    """The rows of `profile` in `view` (the current certificates, or their baselines), one
    dict per row; None when the URL names a SQLite file that does not exist (it is not
    created). Raises whatever the driver raises."""
    path = sqlite_path(url)
    if path is not None:
        return _read_sqlite(path, profile, view) if path.exists() else None
    return _read_sqlalchemy(url, profile, view)


def _read_sqlite(path: Path, profile: str, view: str) -> list[dict]:
    import sqlite3

    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        cur = conn.execute(f"SELECT * FROM {view} WHERE profile = ?", (profile,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]
    finally:
        conn.close()


def _read_sqlalchemy(url: str, profile: str, view: str) -> list[dict]:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            result = conn.execute(text(f"SELECT * FROM {view} WHERE profile = :profile"),
                                  {"profile": profile})
            return [dict(row) for row in result.mappings()]
    finally:
        engine.dispose()

"""Opening the database: URL checks, SQLite settings, and the schema check at start.

A fresh database is created at the migrations' head. An older schema is refused with the
command that upgrades it; a newer one (written by a later nbx-tune) is refused too, since
this code cannot know what it means. SQLite runs in WAL mode with a busy timeout, and every
writing transaction takes the write lock up front (BEGIN IMMEDIATE) so that two writers
queue instead of failing on a lock upgrade; a read takes no lock and never waits.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, DisconnectionError, NoSuchModuleError, OperationalError

from nbx_tune import settings
from nbx_tune.errors import StoreError

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
BUSY_TIMEOUT_MS = 60_000
WRITE = "nbx_write"  # the execution option that marks a transaction as a writer's
MIGRATION_LOCK = 0x6E6278  # the advisory lock key schema changes take on PostgreSQL


PING_IDLE_S = 1.0  # a pooled connection idle longer than this is pinged before it is used
_unpinged = threading.local()  # set while a caller whose statement is its own check takes a connection


def ping_when_idle(engine: Engine) -> None:
    """pool_pre_ping's check, a round trip and a transaction of its own, only for a pooled
    connection idle more than PING_IDLE_S: one that served a statement a moment ago is
    alive, and pinging it before each transaction doubled a fleet worker's transactions
    (a seat's claim, reads and write follow each other within milliseconds). A connection
    the server dropped while idle is found at its next use, and replaced."""
    @event.listens_for(engine, "checkin")
    def _idle_from(dbapi_conn, record):
        record.info["idle_from"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_conn, record, proxy):
        since = record.info.get("idle_from")
        if since is None or time.monotonic() - since <= PING_IDLE_S or getattr(_unpinged, "on", False):
            return  # fresh from connect, used a moment ago, or the caller retries a dropped one
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception:
            raise DisconnectionError() from None  # the pool connects anew and retries


@contextmanager
def unpinged():
    """Connections taken in this block are not pinged however long they idled: for a
    single-statement caller that retries once when the connection turns out dropped (a
    heartbeat), the ping would be a second round trip for nothing."""
    _unpinged.on = True
    try:
        yield
    finally:
        _unpinged.on = False


SECRET_PARAMS = ("password", "passwd", "sslpassword", "sslkey")  # query parameters never printed


def safe_url(url: str | URL) -> str:
    """The URL as it may be printed: never with its password, in the URL or its query."""
    try:
        u = make_url(url)
        hidden = {k: "***" for k in u.query if k.lower() in SECRET_PARAMS}
        return (u.update_query_dict(hidden) if hidden else u).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable URL>"


def parse_url(url: str) -> URL:
    try:
        u = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StoreError(f"bad database URL {safe_url(url)!r}: expected e.g. "
                         "sqlite:///path/to/nbx.db or postgresql+psycopg://user@host/db") from None
    if u.get_backend_name() not in ("sqlite", "postgresql"):
        raise StoreError(f"database URL {safe_url(u)}: unsupported backend {u.get_backend_name()!r} "
                         "(sqlite or postgresql)")
    return u


def _enter_wal(cur) -> None:
    """Switch to WAL, waiting out a concurrent switch. SQLite answers a journal-mode change
    that meets another connection's lock with "database is locked" at once, without calling
    the busy handler, so two processes opening one fresh file race here; the loser retries
    (by then the file is usually WAL already, which the pragma leaves as it is)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves, below
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        _enter_wal(cur)
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        # Writers take the lock at BEGIN and queue; readers (the default) never wait on a
        # writer: in WAL mode a deferred read sees the last commit.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE) else "BEGIN")


def make_engine(url: str) -> Engine:
    u = parse_url(url)
    try:
        if u.get_backend_name() == "sqlite":
            db = u.database
            if db and db != ":memory:" and not db.startswith("file:"):
                parent = Path(db).expanduser().parent
                if not parent.exists():
                    if Path(db) == settings.default_db_path():
                        parent.mkdir(parents=True, exist_ok=True)
                    else:
                        raise StoreError(f"database URL {safe_url(u)}: directory {parent} does not exist")
            engine = create_engine(u, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
            _sqlite_setup(engine)
        else:
            engine = create_engine(u)
            ping_when_idle(engine)
    except NoSuchModuleError:
        raise StoreError(f"database URL {safe_url(u)}: no driver for {u.drivername!r} "
                         "(for PostgreSQL: pip install 'nbx-tune[postgres]')") from None
    except ModuleNotFoundError as e:
        raise StoreError(f"database URL {safe_url(u)}: driver not installed ({e.name}); "
                         "for PostgreSQL: pip install 'nbx-tune[postgres]'") from None
    return engine


def _alembic_config(connection=None) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Apply every migration up to head; returns (before, after)."""
    before = _checked_revision(engine, allow_old=True)
    _upgrade_locked(engine, only_if_empty=False)
    return before, head_revision()


def _connect_error(engine: Engine, e: Exception) -> StoreError:
    msg = str(getattr(e, "orig", e)).splitlines()[0]
    return StoreError(f"cannot open database {safe_url(engine.url)}: {msg}")


def _checked_revision(engine: Engine, allow_old: bool) -> str | None:
    """The database's revision after checking it is ours and not from the future."""
    script = ScriptDirectory.from_config(_alembic_config())
    try:
        with engine.connect() as conn:
            # Tables first, then the revision: on PostgreSQL (READ COMMITTED) each read sees
            # its own snapshot, and a migration another process commits between them then
            # shows as a revision, never as tables without one. (SQLite holds both reads in
            # one transaction.)
            tables = set(inspect(conn).get_table_names())
            rev = MigrationContext.configure(conn).get_current_revision()
    except DatabaseError as e:  # OperationalError, and a damaged file ("file is not a database")
        raise _connect_error(engine, e) from None
    known = {r.revision for r in script.walk_revisions()}
    if rev is None:
        if tables - {"alembic_version"}:
            raise StoreError(f"database {safe_url(engine.url)} has tables but no nbx-tune schema "
                             f"revision ({', '.join(sorted(tables)[:4])}...): use an empty database")
        return None
    if rev not in known:
        raise StoreError(f"database {safe_url(engine.url)} is at schema revision {rev}, newer than "
                         f"this nbx-tune knows (head {script.get_current_head()}): upgrade nbx-tune")
    if rev != script.get_current_head() and not allow_old:
        raise StoreError(f"database {safe_url(engine.url)} is at schema revision {rev}; this "
                         f"nbx-tune needs {script.get_current_head()}: run "
                         f"`nbx-tune db upgrade --db {safe_url(engine.url)}`")
    return rev


def _upgrade_locked(engine: Engine, only_if_empty: bool) -> None:
    """Migrate under a lock, deciding inside it: two processes opening one fresh database
    at once create the schema once (PostgreSQL: an advisory lock; SQLite: BEGIN IMMEDIATE)."""
    with engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
        if only_if_empty and MigrationContext.configure(conn).get_current_revision() is not None:
            return
        try:
            command.upgrade(_alembic_config(conn), "head")
        except Exception as e:  # rolled back with the transaction: the schema is as it was
            msg = str(getattr(e, "orig", e)).strip().splitlines()
            raise StoreError(f"database {safe_url(engine.url)}: migrating to {head_revision()} failed "
                             f"({type(e).__name__}: {msg[0] if msg else ''}); nothing was changed") from None


def open_engine(url: str | None = None) -> Engine:
    """An engine on a database at head: created fresh if empty, refused if old or newer."""
    engine = make_engine(settings.db_url(url))
    if _checked_revision(engine, allow_old=False) is None:
        try:
            _upgrade_locked(engine, only_if_empty=True)
        except DatabaseError as e:
            raise _connect_error(engine, e) from None
        _checked_revision(engine, allow_old=False)
    return engine

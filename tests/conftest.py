"""Test setup: everything runs on Triton's CPU interpreter against a fresh database.

TRITON_INTERPRET must be set before triton is first imported (Triton builds its library
functions for the interpreter or for a GPU at import), so it is set here, at collection.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
# The CLI's rich consoles are made at import and keep the width they found then; tests read
# whole lines of its tables, so every process (xdist's workers too) gets one wide width.
os.environ["COLUMNS"] = "400"

import pytest  # noqa: E402


# The default run leaves out the cases marked slow (end-to-end runs through the
# interpreter); `--all` (CI, .ci/run) runs every case.
def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", help="also run the slow end-to-end cases (CI does)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--all") or config.getoption("-m"):
        return
    slow = [i for i in items if "slow" in i.keywords]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if "slow" not in i.keywords]


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """Each test gets its own database and no exported tables, and a fresh launch-time read."""
    monkeypatch.setenv("NBX_TUNE_DB", f"sqlite:///{tmp_path / 'nbx.db'}")
    monkeypatch.delenv("NBX_TUNE_TABLE", raising=False)
    from nbx_tune.kernels.runtime import certified

    certified.reload()
    yield
    certified.reload()


@pytest.fixture
def transformers_module(monkeypatch):
    """transformers, imported with this repository's root off sys.path (its `kernels/` folder
    would pass for transformers' optional `kernels` package)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != root])
    stray = sys.modules.get("kernels")
    if stray is not None and Path(getattr(stray, "__file__", "") or "").resolve().is_relative_to(root):
        monkeypatch.delitem(sys.modules, "kernels")
    return pytest.importorskip("transformers")


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'nbx.db'}"


# ----------------------------------------------------------------------------- PostgreSQL
# NBX_TUNE_TEST_PG names a PostgreSQL database whose role may CREATE DATABASE (.ci/run starts
# a server on loopback and sets it). Each test gets a fresh database of its own. Without it
# the PostgreSQL cases are skipped, unless NBX_TUNE_REQUIRE_PG=1 (CI) makes that a failure.

import uuid  # noqa: E402

PG_ADMIN = os.environ.get("NBX_TUNE_TEST_PG", "").strip()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db(request, tmp_path):
    """A fresh database URL on each engine."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'any.db'}"
        return
    if not PG_ADMIN:
        if os.environ.get("NBX_TUNE_REQUIRE_PG") == "1":
            pytest.fail("NBX_TUNE_REQUIRE_PG=1 but NBX_TUNE_TEST_PG is not set")
        pytest.skip("no PostgreSQL server (set NBX_TUNE_TEST_PG)")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"nbx_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def db_count(url: str, table: str, where: str = "") -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(text(f"SELECT count(*) FROM {table} {where}")).scalar()
    finally:
        engine.dispose()


from contextlib import contextmanager  # noqa: E402


@contextmanager
def registered_here(specs):
    """`specs` registered inside the block only: other tests (census, CLI) still see the
    registry as the package ships it."""
    from nbx_tune.kernels.runtime import registry

    registry.all_specs()
    saved = (dict(registry._specs), dict(registry._by_op))
    for spec in specs:
        registry.register(spec, "tests")
    try:
        yield
    finally:
        for live, old in zip((registry._specs, registry._by_op), saved):
            live.clear()
            live.update(old)


def database_at(url: str, revision: str, kernel: str, kind: str) -> None:
    """A database made by an older nbx-tune, at migration `revision`: one seat of `kernel`
    certified BLOCK=256 by one tuning of `kind` (what an upgrade must keep)."""
    from alembic import command
    from sqlalchemy import text

    from nbx_tune.tuner.store.db import _alembic_config, make_engine

    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(_alembic_config(conn), revision)
            conn.execute(text("INSERT INTO seats (id, profile, kernel, dtypes, flags, bucket, created_at) "
                              "VALUES (1, 'interpreter', :kernel, 'float32', '', 'n=1000', '2026-12-01')"),
                         {"kernel": kernel})
            conn.execute(text("INSERT INTO tunings (id, seat_id, kind, outcome, started_at, finished_at, worker, "
                              "device_name, device_target, driver, triton_version, torch_version, "
                              "kernel_source_hash, config_space_hash, profile_hash, candidates, survivors, "
                              "screen_s, bench_s, total_s) "
                              "VALUES (1, 1, :kind, 'certified', '2026-12-01', '2026-12-01', 'w', 'd', "
                              "'interpreter', 'n/a', 't', 't', 'h', 'h', 'h', 1, 1, 0, 0, 0)"), {"kind": kind})
            conn.execute(text("INSERT INTO certificates (seat_id, tuning_id, config, median_ms, p20_ms, p80_ms, "
                              "screens, timing_method, created_at) "
                              "VALUES (1, 1, 'BLOCK=256', 1.0, 1.0, 1.0, '[]', 'w', '2026-12-01')"))
    finally:
        engine.dispose()


@pytest.fixture
def fake_triton(monkeypatch):
    """testing/fake_compiled.py's stand-in for Triton's compiled kernels, so that calls are
    remembered and replayed under the interpreter (kernels/runtime/launch.py); no replay
    outlives the test."""
    from nbx_tune.kernels.runtime import launch
    from nbx_tune.testing.fake_compiled import FakeTriton

    f = FakeTriton()
    monkeypatch.setattr(launch, "through_triton", f)
    launch.forget()
    yield f
    launch.forget()

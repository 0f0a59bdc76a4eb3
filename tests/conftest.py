"""Test setup: everything runs on Triton's CPU interpreter against a fresh database.

TRITON_INTERPRET must be set before triton is first imported (Triton builds its library
functions for the interpreter or for a GPU at import), so it is set here, at collection.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """Each test gets its own database and no exported tables, and a fresh launch-time read."""
    monkeypatch.setenv("NBX_TUNE_DB", f"sqlite:///{tmp_path / 'nbx.db'}")
    monkeypatch.delenv("NBX_TUNE_TABLE", raising=False)
    from nbx_tune.kernels import certified

    certified.reload()
    yield
    certified.reload()


@pytest.fixture
def db_url(tmp_path):
    return f"sqlite:///{tmp_path / 'nbx.db'}"

"""Alembic environment and versions, shipped in the wheel and applied in code
(`nbx_tune.tuner.store.db.upgrade`, `nbx-tune db upgrade`)."""

"""Alembic environment: runs on the connection nbx-tune hands it (never an ini file)."""

from alembic import context

from nbx_tune.tuner.store.models import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,  # SQLite alters tables by copying them
)
with context.begin_transaction():
    context.run_migrations()

"""Refusals carry the measured error and the tolerance it was judged against as numbers
(until now only in the detail text), so `refusals --json` can give them as fields.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("refusals") as batch:
        batch.add_column(sa.Column("err", sa.Float, nullable=True))
        batch.add_column(sa.Column("rtol", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("refusals") as batch:
        batch.drop_column("rtol")
        batch.drop_column("err")

"""How a tuning searched (full, re-certified from a seat's history, ranked by what earlier
seats measured, or an audit of that shortcut), which tuning it started from, and at an
audit the loss the shortcut would have had; a certificate keeps how it was found and what
it was re-certified from, so an exported table carries both.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tunings") as b:
        b.add_column(sa.Column("search", sa.String(16), nullable=False, server_default="full"))
        b.add_column(sa.Column("seeded_from", sa.Integer(), nullable=True))
        b.add_column(sa.Column("shortcut_loss", sa.Float(), nullable=True))
    with op.batch_alter_table("certificates") as b:
        b.add_column(sa.Column("search", sa.String(16), nullable=False, server_default="full"))
        b.add_column(sa.Column("recertified_from", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("certificates") as b:
        b.drop_column("recertified_from")
        b.drop_column("search")
    with op.batch_alter_table("tunings") as b:
        b.drop_column("shortcut_loss")
        b.drop_column("seeded_from")
        b.drop_column("search")

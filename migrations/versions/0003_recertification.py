"""How a tuning searched (full, re-certified from a seat's history, ranked by what earlier
seats measured, or an audit of that shortcut), which tuning it started from, and at an
audit the loss the shortcut would have had; a certificate keeps how it was found and what
it was re-certified from, so an exported table carries both.
"""

import sqlalchemy as sa

from nbx_tune.migrations.alter import add_columns, drop_columns

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    add_columns("tunings", sa.Column("search", sa.String(16), nullable=False, server_default="full"),
                sa.Column("seeded_from", sa.Integer(), nullable=True),
                sa.Column("shortcut_loss", sa.Float(), nullable=True))
    add_columns("certificates", sa.Column("search", sa.String(16), nullable=False, server_default="full"),
                sa.Column("recertified_from", sa.Text(), nullable=True))


def downgrade() -> None:
    drop_columns("certificates", "recertified_from", "search")
    drop_columns("tunings", "shortcut_loss", "seeded_from", "search")

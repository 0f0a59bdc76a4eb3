"""Refusals carry the measured error and the tolerance it was judged against as numbers
(until now only in the detail text), so `refusals --json` can give them as fields.
"""

import sqlalchemy as sa

from nbx_tune.migrations.alter import add_columns, drop_columns

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    add_columns("refusals", sa.Column("err", sa.Float, nullable=True), sa.Column("rtol", sa.Float, nullable=True))


def downgrade() -> None:
    drop_columns("refusals", "rtol", "err")

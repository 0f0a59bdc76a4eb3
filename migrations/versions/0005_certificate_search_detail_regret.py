"""A certificate keeps why its search did (or did not) tune the seat in full, and an
imported certificate the sampled regret its table carried (the importing database never
measured it), so an import then export keeps both.
"""

import sqlalchemy as sa

from nbx_tune.migrations.alter import add_columns, drop_columns

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    add_columns("certificates", sa.Column("search_detail", sa.Text(), nullable=True),
                sa.Column("sampled_regret", sa.Text(), nullable=True))


def downgrade() -> None:
    drop_columns("certificates", "sampled_regret", "search_detail")

"""A certificate keeps why its search did (or did not) tune the seat in full, and an
imported certificate the sampled regret its table carried (the importing database never
measured it), so an import then export keeps both.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("certificates") as b:
        b.add_column(sa.Column("search_detail", sa.Text(), nullable=True))
        b.add_column(sa.Column("sampled_regret", sa.Text(), nullable=True))


def downgrade() -> None:
    # SQLite drops a column by copying the table, which a view reading it forbids: the view
    # is set aside and made again from its own text.
    bind = op.get_bind()
    views = []
    if bind.dialect.name == "sqlite":
        views = [r[0] for r in bind.execute(sa.text(
            "SELECT sql FROM sqlite_master WHERE type = 'view' AND sql LIKE '%certificates%'"))]
        for name, in bind.execute(sa.text(
                "SELECT name FROM sqlite_master WHERE type = 'view' AND sql LIKE '%certificates%'")):
            op.execute(f'DROP VIEW "{name}"')
    with op.batch_alter_table("certificates") as b:
        b.drop_column("sampled_regret")
        b.drop_column("search_detail")
    for sql in views:
        op.execute(sql)

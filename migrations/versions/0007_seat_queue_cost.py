"""A seat's queue cost: the fleet's estimate of its tuning time (runner.seat_cost), kept on
the seat so a worker lists the queue, longest seats first, in one query instead of working
out every seat's cost from its shapes at each listing. NULL until a worker first lists the
seat, and again after a census adds a shape to it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("seats") as b:
        b.add_column(sa.Column("queue_cost", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("seats") as b:
        b.drop_column("queue_cost")

"""A seat's queue cost: the fleet's estimate of its tuning time (tuner/fleet/seat_tuner.seat_cost), kept on
the seat so a worker lists the queue, longest seats first, in one query instead of working
out every seat's cost from its shapes at each listing. NULL until a worker first lists the
seat, and again after a census adds a shape to it.
"""

import sqlalchemy as sa

from nbx_tune.migrations.alter import add_columns, drop_columns

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    add_columns("seats", sa.Column("queue_cost", sa.Float, nullable=True))


def downgrade() -> None:
    drop_columns("seats", "queue_cost", in_place=True)  # certificates and tunings point at seats

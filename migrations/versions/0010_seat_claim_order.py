"""The never-tuned seats in claim order: `seats.tuned` (set by the transaction that writes
a seat's first tuning) and a partial index of the seats not tuned by (profile, queue cost,
id), so a worker's claim is one statement that takes the longest free seat from the index's
head (Store.claim_untuned) instead of reading a window of its own listing of the queue.
"""

import sqlalchemy as sa
from alembic import op

from nbx_tune.migrations.alter import drop_columns

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    # In place (ALTER TABLE ADD COLUMN on both engines): SQLite's copy of the table would
    # break the views and foreign keys that read it.
    op.add_column("seats", sa.Column("tuned", sa.Boolean, nullable=False, server_default=sa.false()))
    seats, tunings = sa.table("seats", sa.column("id"), sa.column("tuned")), sa.table("tunings", sa.column("seat_id"))
    op.execute(seats.update().where(sa.select(tunings.c.seat_id).where(tunings.c.seat_id == seats.c.id).exists())
               .values(tuned=sa.true()))
    op.create_index("ix_seats_claim_order", "seats", ["profile", "queue_cost", "id"],
                    sqlite_where=sa.text("tuned = 0"), postgresql_where=sa.text("NOT tuned"))


def downgrade() -> None:
    op.drop_index("ix_seats_claim_order", "seats")
    drop_columns("seats", "tuned", in_place=True)  # certificates and tunings point at seats

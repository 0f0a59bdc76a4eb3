"""An index of the audits (tunings.search = 'audit'), partial: a seat's search asks whether
its kernel was ever audited (Store.has_audit) before each seat, and without it that is a
scan of every tuning, a cost growing with the queue (a 20,000-seat fleet run: the whole
table read at every seat).
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    where = sa.text("search = 'audit'")
    op.create_index("ix_tunings_audits", "tunings", ["seat_id"], sqlite_where=where, postgresql_where=where)


def downgrade() -> None:
    op.drop_index("ix_tunings_audits", "tunings")

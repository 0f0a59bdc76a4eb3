"""Indexes for the queries a census and `nbx-tune seats` run on every call: seats by
profile and kernel, certificates by seat, tunings by census run.
"""

from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_index("ix_seats_profile_kernel", "seats", ["profile", "kernel"])
    op.create_index("ix_certificates_seat_id", "certificates", ["seat_id"])
    op.create_index("ix_tunings_census_run_id", "tunings", ["census_run_id"])


def downgrade() -> None:
    op.drop_index("ix_tunings_census_run_id", "tunings")
    op.drop_index("ix_certificates_seat_id", "certificates")
    op.drop_index("ix_seats_profile_kernel", "seats")

"""The initial schema: seats, their shapes and traces, tunings, measurements, refusals,
certificates, and the `certified_configs` view the kernels read at launch.
"""

import sqlalchemy as sa
from alembic import op

from nbx_tune.migrations.alter import create_table

revision = "0001"
down_revision = None

TS = sa.DateTime(timezone=True)

# The contract between the writer (tuner) and the reader (kernels): current certificates
# with the provenance a launch checks before serving them.
CERTIFIED_VIEW = """
CREATE VIEW certified_configs AS
SELECT s.id AS seat_id, s.profile, s.kernel, s.dtypes, s.flags, s.bucket,
       c.config, c.median_ms, c.unscreened, c.created_at AS certified_at,
       t.kernel_source_hash, t.config_space_hash, t.profile_hash, t.triton_version,
       t.device_target, t.device_name
FROM certificates c
JOIN seats s ON s.id = c.seat_id
JOIN tunings t ON t.id = c.tuning_id
WHERE c.superseded_at IS NULL
"""


def _timed_config() -> tuple[sa.Column, ...]:
    """A config and its timing (median, 20th and 80th percentiles): a measurement's and a
    certificate's alike (a column belongs to one table, so each gets its own)."""
    return (sa.Column("config", sa.String(512), nullable=False), sa.Column("median_ms", sa.Float, nullable=False),
            sa.Column("p20_ms", sa.Float, nullable=False), sa.Column("p80_ms", sa.Float, nullable=False))


def upgrade() -> None:
    create_table(
        "traces",
        sa.Column("sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("rows", sa.Integer, nullable=False),
        sa.Column("launches", sa.BigInteger, nullable=False),
        sa.Column("first_seen", TS, nullable=False),
    )
    create_table(
        "census_runs",
        sa.Column("trace_id", sa.Integer, sa.ForeignKey("traces.id"), nullable=False),
        sa.Column("profile", sa.String(64), nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("summary", sa.Text),
    )
    create_table(
        "seats",
        sa.Column("profile", sa.String(64), nullable=False),
        sa.Column("kernel", sa.String(128), nullable=False),
        sa.Column("dtypes", sa.String(255), nullable=False),
        sa.Column("flags", sa.String(255), nullable=False),
        sa.Column("bucket", sa.String(255), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("claimed_by", sa.String(255)),
        sa.Column("claim_expires", sa.Float),
        sa.UniqueConstraint("profile", "kernel", "dtypes", "flags", "bucket", name="uq_seats_identity"),
    )
    create_table(
        "seat_shapes",
        sa.Column("seat_id", sa.Integer, sa.ForeignKey("seats.id"), nullable=False),
        sa.Column("problem", sa.Text, nullable=False),
        sa.Column("volume", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("seat_id", "problem", name="uq_seat_shapes"),
        indexed=("seat_id",),
    )
    op.create_table(
        "trace_needs",
        sa.Column("trace_id", sa.Integer, sa.ForeignKey("traces.id"), primary_key=True),
        sa.Column("seat_id", sa.Integer, sa.ForeignKey("seats.id"), primary_key=True),
        sa.Column("rows", sa.Integer, nullable=False),
        sa.Column("launches", sa.BigInteger, nullable=False),
    )
    create_table(
        "tunings",
        sa.Column("seat_id", sa.Integer, sa.ForeignKey("seats.id"), nullable=False),
        sa.Column("census_run_id", sa.Integer, sa.ForeignKey("census_runs.id")),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=False),
        sa.Column("worker", sa.String(255), nullable=False),
        sa.Column("device_name", sa.String(255), nullable=False),
        sa.Column("device_target", sa.String(64), nullable=False),
        sa.Column("driver", sa.String(64), nullable=False),
        sa.Column("triton_version", sa.String(64), nullable=False),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("kernel_source_hash", sa.String(64), nullable=False),
        sa.Column("config_space_hash", sa.String(64), nullable=False),
        sa.Column("profile_hash", sa.String(64), nullable=False),
        sa.Column("candidates", sa.Integer, nullable=False),
        sa.Column("survivors", sa.Integer, nullable=False),
        sa.Column("screen_s", sa.Float, nullable=False),
        sa.Column("bench_s", sa.Float, nullable=False),
        sa.Column("total_s", sa.Float, nullable=False),
        indexed=("seat_id",),
    )
    create_table(
        "measurements",
        sa.Column("tuning_id", sa.Integer, sa.ForeignKey("tunings.id"), nullable=False),
        *_timed_config(),
        sa.Column("method", sa.String(64), nullable=False),
        sa.Column("final", sa.Boolean, nullable=False),
        sa.Column("screens", sa.Text, nullable=False),
        indexed=("tuning_id",),
    )
    create_table(
        "refusals",
        sa.Column("tuning_id", sa.Integer, sa.ForeignKey("tunings.id"), nullable=False),
        sa.Column("seat_id", sa.Integer, sa.ForeignKey("seats.id"), nullable=False),
        sa.Column("config", sa.String(512)),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("problem", sa.Text),
        sa.Column("created_at", TS, nullable=False),
        indexed=("tuning_id", "seat_id", "reason"),
    )
    create_table(
        "certificates",
        sa.Column("seat_id", sa.Integer, sa.ForeignKey("seats.id"), nullable=False),
        sa.Column("tuning_id", sa.Integer, sa.ForeignKey("tunings.id"), nullable=False),
        *_timed_config(),
        sa.Column("runner_up", sa.String(512)),
        sa.Column("runner_up_ms", sa.Float),
        sa.Column("margin", sa.Float),
        sa.Column("screens", sa.Text, nullable=False),
        sa.Column("screened_min", sa.Text),
        sa.Column("screened_max", sa.Text),
        sa.Column("unscreened", sa.Text),
        sa.Column("timing_method", sa.String(32), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("superseded_at", TS),
        sa.Column("superseded_reason", sa.Text),
    )
    op.create_index("uq_certificates_current", "certificates", ["seat_id"], unique=True,
                    sqlite_where=sa.text("superseded_at IS NULL"),
                    postgresql_where=sa.text("superseded_at IS NULL"))
    op.execute(CERTIFIED_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW certified_configs")
    for table in ("certificates", "refusals", "measurements", "tunings", "trace_needs",
                  "seat_shapes", "seats", "census_runs", "traces"):
        op.drop_table(table)

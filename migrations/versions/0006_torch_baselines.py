"""Torch baselines: a certificate's config measured against torch's own op on one GPU with
one torch, and the `torch_baselines` view the launch read takes them from (the seats
serve() hands back to torch: kernels/runtime/torch_rule.py).
"""

import sqlalchemy as sa
from alembic import op

from nbx_tune.migrations.alter import create_table

revision = "0006"
down_revision = "0005"

# The reader's contract, as certified_configs is: baselines of current certificates only,
# with the config they were measured against (the reader matches it to what it serves).
BASELINES_VIEW = """
CREATE VIEW torch_baselines AS
SELECT s.profile, s.kernel, s.dtypes, s.flags, s.bucket, c.config,
       b.device_name, b.torch_version, b.nbx_ms, b.torch_ms, b.method, b.measured_at
FROM baselines b
JOIN certificates c ON c.id = b.certificate_id
JOIN seats s ON s.id = c.seat_id
WHERE c.superseded_at IS NULL
"""


def upgrade() -> None:
    create_table(
        "baselines",
        sa.Column("certificate_id", sa.Integer, sa.ForeignKey("certificates.id"), nullable=False),
        sa.Column("device_name", sa.String(255), nullable=False),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("nbx_ms", sa.Float, nullable=False),
        sa.Column("torch_ms", sa.Float, nullable=False),
        sa.Column("method", sa.String(64), nullable=False),
        sa.Column("rows", sa.Text),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        indexed=("certificate_id",),
    )
    op.execute(BASELINES_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW torch_baselines")
    op.drop_index("ix_baselines_certificate_id", table_name="baselines")
    op.drop_table("baselines")

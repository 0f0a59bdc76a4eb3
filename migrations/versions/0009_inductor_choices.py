"""Certified max-autotune choices: Inductor's GEMM template configs certified by nbx-tune
(tuner/inductor/choices.py), each certification with its refusals, the chosen config kept
as certificates are (at most one current per profile and lookup key, the others superseded),
and the `inductor_current` view that serving reads (kernels/serving/inductor_table.py).
"""

import sqlalchemy as sa
from alembic import op

from nbx_tune.migrations.alter import create_table

revision = "0009"
down_revision = "0008"

TS = sa.DateTime(timezone=True)
CURRENT = sa.text("superseded_at IS NULL")

# The reader's contract: the current choice of each (profile, key) with what its staleness
# is judged on (torch's major.minor, Triton, the GPU's name: inductor_table.stale_reason).
CURRENT_VIEW = """
CREATE VIEW inductor_current AS
SELECT c.profile, c.key, k.op, c.config, c.ms, c.max_rel_err, k.aten_ms,
       k.torch_version, k.triton_version, k.device_name, k.measured_at
FROM inductor_choices c
JOIN inductor_certifications k ON k.id = c.certification_id
WHERE c.superseded_at IS NULL
"""


def upgrade() -> None:
    create_table(
        "inductor_certifications",
        sa.Column("profile", sa.String(64), nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("op", sa.String(16), nullable=False),
        sa.Column("dtype", sa.String(32)),
        sa.Column("dims", sa.String(128)),
        sa.Column("layout", sa.String(8)),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("candidates", sa.Integer),
        sa.Column("aten_ms", sa.Float),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("triton_version", sa.String(64), nullable=False),
        sa.Column("device_name", sa.String(255), nullable=False),
        sa.Column("driver", sa.String(64)),
        sa.Column("measured_at", TS, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_inductor_certifications_profile_key", "inductor_certifications", ["profile", "key"])
    create_table(
        "inductor_refusals",
        sa.Column("certification_id", sa.Integer, sa.ForeignKey("inductor_certifications.id"), nullable=False),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        indexed=("certification_id",),
    )
    create_table(
        "inductor_choices",
        sa.Column("certification_id", sa.Integer, sa.ForeignKey("inductor_certifications.id"), nullable=False),
        sa.Column("profile", sa.String(64), nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column("ms", sa.Float, nullable=False),
        sa.Column("max_rel_err", sa.Float, nullable=False),
        sa.Column("runner_up_ms", sa.Float),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("superseded_at", TS),
        sa.Column("superseded_reason", sa.Text),
        indexed=("certification_id",),
    )
    op.create_index("uq_inductor_choices_current", "inductor_choices", ["profile", "key"], unique=True,
                    sqlite_where=CURRENT, postgresql_where=CURRENT)
    op.execute(CURRENT_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW inductor_current")
    op.drop_index("uq_inductor_choices_current", table_name="inductor_choices")
    op.drop_index("ix_inductor_choices_certification_id", table_name="inductor_choices")
    op.drop_table("inductor_choices")
    op.drop_index("ix_inductor_refusals_certification_id", table_name="inductor_refusals")
    op.drop_table("inductor_refusals")
    op.drop_index("ix_inductor_certifications_profile_key", table_name="inductor_certifications")
    op.drop_table("inductor_certifications")

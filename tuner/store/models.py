"""The database schema, as SQLAlchemy 2 models. The migrations in `migrations/versions`
create exactly this; `tests/test_store.py` checks the two agree.

    traces ─< trace_needs >─ seats ─< seat_shapes
    census_runs                 seats ─< tunings ─< measurements
                                         tunings ─< refusals, certificates ─< baselines
    inductor_certifications ─< inductor_refusals, inductor_choices

A seat is (profile, kernel, dtypes, flags, bucket); the kernel source hash, config-space
hash, Triton version, profile hash and device it was tuned under live on its tunings, so a
seat keeps its whole history when any of them changes. At most one certificate per seat is
current (superseded_at IS NULL): a partial unique index holds that in the database itself.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text,
                        UniqueConstraint)
from sqlalchemy import false, text as sql_text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from nbx_tune.kernels.spec import label_of
from nbx_tune.tuner.certify.reasons import REFUSAL_REASONS, TRANSIENT_REASONS  # noqa: F401 (re-exported)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class Trace(Base):
    __tablename__ = "traces"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    path: Mapped[str] = mapped_column(Text)
    rows: Mapped[int] = mapped_column(Integer)
    launches: Mapped[int] = mapped_column(BigInteger)
    first_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class CensusRun(Base):
    __tablename__ = "census_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trace_id: Mapped[int] = mapped_column(ForeignKey("traces.id"))
    profile: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16))  # running | done | failed | interrupted
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    summary: Mapped[str | None] = mapped_column(Text)  # JSON: coverage and outcome counts


class Seat(Base):
    __tablename__ = "seats"
    __table_args__ = (UniqueConstraint("profile", "kernel", "dtypes", "flags", "bucket",
                                       name="uq_seats_identity"),
                      Index("ix_seats_profile_kernel", "profile", "kernel"),
                      # The seats never tuned, in claim order (migration 0010): a worker's claim
                      # (Store.claim_untuned) reads its head; tuned seats leave it.
                      Index("ix_seats_claim_order", "profile", "queue_cost", "id",
                            sqlite_where=sql_text("tuned = 0"), postgresql_where=sql_text("NOT tuned")))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    profile: Mapped[str] = mapped_column(String(64))
    kernel: Mapped[str] = mapped_column(String(128))
    dtypes: Mapped[str] = mapped_column(String(255))
    flags: Mapped[str] = mapped_column(String(255))
    bucket: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # A tuner claims a seat before tuning it; a claim whose holder died expires.
    claimed_by: Mapped[str | None] = mapped_column(String(255))
    claim_expires: Mapped[float | None] = mapped_column(Float)
    # The fleet's estimate of the seat's tuning time (runner.seat_cost), set when a worker
    # first lists it and cleared when a census adds a shape: workers take long seats first.
    queue_cost: Mapped[float | None] = mapped_column(Float)
    # Set by the transaction that writes the seat's first tuning (Store.write_result): the
    # never-tuned seats are the server-ordered claim's (ix_seats_claim_order).
    tuned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false(), nullable=False)

    shapes: Mapped[list["SeatShape"]] = relationship(back_populates="seat")

    @property
    def label(self) -> str:
        return label_of(self.kernel, self.dtypes, self.flags, self.bucket)


class SeatShape(Base):
    """A distinct problem (shape and params) a census saw in the seat's bucket."""

    __tablename__ = "seat_shapes"
    __table_args__ = (UniqueConstraint("seat_id", "problem", name="uq_seat_shapes"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seat_id: Mapped[int] = mapped_column(ForeignKey("seats.id"), index=True)
    problem: Mapped[str] = mapped_column(Text)  # Problem.to_json()
    volume: Mapped[int] = mapped_column(BigInteger)

    seat: Mapped[Seat] = relationship(back_populates="shapes")


class TraceNeed(Base):
    """Which trace needs which seat, with its launch count."""

    __tablename__ = "trace_needs"
    trace_id: Mapped[int] = mapped_column(ForeignKey("traces.id"), primary_key=True)
    seat_id: Mapped[int] = mapped_column(ForeignKey("seats.id"), primary_key=True)
    rows: Mapped[int] = mapped_column(Integer)
    launches: Mapped[int] = mapped_column(BigInteger)


class Tuning(Base):
    """One attempt at a seat (or one import of a certificate), with the provenance it was
    made under."""

    __tablename__ = "tunings"
    # The audits alone (migration 0008): Store.has_audit, asked before every seat.
    __table_args__ = (Index("ix_tunings_audits", "seat_id", sqlite_where=sql_text("search = 'audit'"),
                            postgresql_where=sql_text("search = 'audit'")),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seat_id: Mapped[int] = mapped_column(ForeignKey("seats.id"), index=True)
    census_run_id: Mapped[int | None] = mapped_column(ForeignKey("census_runs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # tune | rescreen | import
    outcome: Mapped[str] = mapped_column(String(16))  # certified | unscreened | refused
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    worker: Mapped[str] = mapped_column(String(255))
    device_name: Mapped[str] = mapped_column(String(255))
    device_target: Mapped[str] = mapped_column(String(64))
    driver: Mapped[str] = mapped_column(String(64))
    triton_version: Mapped[str] = mapped_column(String(64))
    torch_version: Mapped[str] = mapped_column(String(64))
    kernel_source_hash: Mapped[str] = mapped_column(String(64))
    config_space_hash: Mapped[str] = mapped_column(String(64))
    profile_hash: Mapped[str] = mapped_column(String(64))
    candidates: Mapped[int] = mapped_column(Integer, default=0)
    survivors: Mapped[int] = mapped_column(Integer, default=0)
    screen_s: Mapped[float] = mapped_column(Float, default=0.0)
    bench_s: Mapped[float] = mapped_column(Float, default=0.0)
    total_s: Mapped[float] = mapped_column(Float, default=0.0)
    # full | recertified | fallback | ranked | audit (tuner/certify/recertify.py, strategies/ranked.py)
    search: Mapped[str] = mapped_column(String(16), default="full", server_default="full")
    seeded_from: Mapped[int | None] = mapped_column(Integer)  # the tuning a re-certification started from
    shortcut_loss: Mapped[float | None] = mapped_column(Float)  # audit: the ranked pick's loss against the best


class Measurement(Base):
    """A candidate that survived the screen and was timed."""

    __tablename__ = "measurements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tuning_id: Mapped[int] = mapped_column(ForeignKey("tunings.id"), index=True)
    config: Mapped[str] = mapped_column(String(512))
    median_ms: Mapped[float] = mapped_column(Float)
    p20_ms: Mapped[float] = mapped_column(Float)
    p80_ms: Mapped[float] = mapped_column(Float)
    method: Mapped[str] = mapped_column(String(64))
    final: Mapped[bool] = mapped_column(Boolean)  # full timing; quick estimates cannot win
    screens: Mapped[str] = mapped_column(Text)  # JSON [{problem, err, rtol}]


class Refusal(Base):
    """A config rejected at a seat (config NULL: the whole seat), with the reason and the
    detail (measured error against the tolerance, or the error text)."""

    __tablename__ = "refusals"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tuning_id: Mapped[int] = mapped_column(ForeignKey("tunings.id"), index=True)
    seat_id: Mapped[int] = mapped_column(ForeignKey("seats.id"), index=True)
    config: Mapped[str | None] = mapped_column(String(512))
    reason: Mapped[str] = mapped_column(String(32), index=True)
    detail: Mapped[str] = mapped_column(Text)
    problem: Mapped[str | None] = mapped_column(Text)  # the shape it failed at, if any
    err: Mapped[float | None] = mapped_column(Float)  # its measured error there, if judged
    rtol: Mapped[float | None] = mapped_column(Float)  # the tolerance it was judged against
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Certificate(Base):
    __tablename__ = "certificates"
    __table_args__ = (
        Index("uq_certificates_current", "seat_id", unique=True,
              sqlite_where=sql_text("superseded_at IS NULL"),
              postgresql_where=sql_text("superseded_at IS NULL")),
        Index("ix_certificates_seat_id", "seat_id"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seat_id: Mapped[int] = mapped_column(ForeignKey("seats.id"))
    tuning_id: Mapped[int] = mapped_column(ForeignKey("tunings.id"))
    config: Mapped[str] = mapped_column(String(512))
    median_ms: Mapped[float] = mapped_column(Float)
    p20_ms: Mapped[float] = mapped_column(Float)
    p80_ms: Mapped[float] = mapped_column(Float)
    runner_up: Mapped[str | None] = mapped_column(String(512))
    runner_up_ms: Mapped[float | None] = mapped_column(Float)
    margin: Mapped[float | None] = mapped_column(Float)  # (runner-up - winner) / winner
    screens: Mapped[str] = mapped_column(Text)  # JSON [{problem, err, rtol}]
    screened_min: Mapped[str | None] = mapped_column(Text)  # Problem JSON, None if unscreened
    screened_max: Mapped[str | None] = mapped_column(Text)
    unscreened: Mapped[str | None] = mapped_column(Text)  # why a served shape was never screened
    timing_method: Mapped[str] = mapped_column(String(32))
    search: Mapped[str] = mapped_column(String(16), default="full", server_default="full")
    recertified_from: Mapped[str | None] = mapped_column(Text)  # the tuning it was re-certified from
    search_detail: Mapped[str | None] = mapped_column(Text)  # why it was (or was not) tuned in full
    # An imported certificate's sampled regret ({"audits", "median", "max"} JSON), which the
    # importing database never measured: kept so an export carries it on.
    sampled_regret: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    superseded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    superseded_reason: Mapped[str | None] = mapped_column(Text)


class Baseline(Base):
    """One measurement of a certificate's config against torch's own op at the seat's
    shapes, on one GPU with one torch (`nbx-tune baseline`); under serve() a seat whose
    applicable baseline says torch is faster runs torch (kernels/runtime/torch_rule.py)."""

    __tablename__ = "baselines"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    certificate_id: Mapped[int] = mapped_column(ForeignKey("certificates.id"), index=True)
    device_name: Mapped[str] = mapped_column(String(255))
    torch_version: Mapped[str] = mapped_column(String(64))
    nbx_ms: Mapped[float] = mapped_column(Float)  # the certified config, per launch-weighted call
    torch_ms: Mapped[float] = mapped_column(Float)
    method: Mapped[str] = mapped_column(String(64))  # how both sides were timed
    rows: Mapped[str | None] = mapped_column(Text)  # JSON: the trace rows timed, with counts and times
    measured_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class InductorCertification(Base):
    """One certification (or import) of Inductor's template configs for one GEMM lookup key
    on a profile (tuner/inductor/choices.py), with the versions its staleness is judged on
    (kernels/serving/inductor_table.stale_reason)."""

    __tablename__ = "inductor_certifications"
    __table_args__ = (Index("ix_inductor_certifications_profile_key", "profile", "key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    profile: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(Text)  # Inductor's lookup key: input dtypes, sizes, strides + op
    op: Mapped[str] = mapped_column(String(16))  # mm | addmm | bmm
    dtype: Mapped[str | None] = mapped_column(String(32))  # the problem, where known (an old table's entry: no)
    dims: Mapped[str | None] = mapped_column(String(128))  # JSON [B, M, N, K]
    layout: Mapped[str | None] = mapped_column(String(8))
    kind: Mapped[str] = mapped_column(String(16))  # certify | import
    outcome: Mapped[str] = mapped_column(String(16))  # chosen | refused (no config passed)
    candidates: Mapped[int | None] = mapped_column(Integer)  # configs tried, where known
    aten_ms: Mapped[float | None] = mapped_column(Float)
    torch_version: Mapped[str] = mapped_column(String(64))
    triton_version: Mapped[str] = mapped_column(String(64))
    device_name: Mapped[str] = mapped_column(String(255))
    driver: Mapped[str | None] = mapped_column(String(64))
    measured_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class InductorRefusal(Base):
    __tablename__ = "inductor_refusals"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    certification_id: Mapped[int] = mapped_column(ForeignKey("inductor_certifications.id"), index=True)
    config: Mapped[str] = mapped_column(Text)  # JSON, as Inductor's lookup table holds it
    reason: Mapped[str] = mapped_column(Text)


class InductorChoice(Base):
    """A certification's chosen config. At most one per (profile, key) is current
    (superseded_at IS NULL), held by a partial unique index as certificates are."""

    __tablename__ = "inductor_choices"
    __table_args__ = (
        Index("uq_inductor_choices_current", "profile", "key", unique=True,
              sqlite_where=sql_text("superseded_at IS NULL"), postgresql_where=sql_text("superseded_at IS NULL")),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    certification_id: Mapped[int] = mapped_column(ForeignKey("inductor_certifications.id"), index=True)
    profile: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(Text)
    config: Mapped[str] = mapped_column(Text)  # JSON: template_id, its parameters, template_hash
    ms: Mapped[float] = mapped_column(Float)
    max_rel_err: Mapped[float] = mapped_column(Float)
    runner_up_ms: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    superseded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    superseded_reason: Mapped[str | None] = mapped_column(Text)

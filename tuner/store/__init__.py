"""The store: the one place the tuner reads and writes the database.

Every write is one short transaction: a census's plan (trace, seats, shapes, needs) in
one, each seat's tuning (tuning, measurements, refusals, certificate, superseding) in
one. A killed process leaves either all of a seat or none of it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import namedtuple
from contextlib import contextmanager
from itertools import islice
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import ARRAY, Integer, String, any_, bindparam, false as sa_false, func, select, update
from sqlalchemy.exc import DatabaseError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from nbx_tune.errors import StoreError
from nbx_tune.kernels.spec import Problem, label_of, split_label
from nbx_tune.tuner.store.db import WRITE, open_engine, safe_url, unpinged
from nbx_tune.tuner.store.models import (Baseline, CensusRun, Certificate, Measurement, Refusal, Seat,
                                         SeatShape, Trace, TraceNeed, Tuning, utcnow)

LOCK_RETRIES = 8
CLAIM_WINDOW = 256  # seat ids a claim reads at a time, at most (claim_next)
QUEUE_COST_LOCK = 0x6E627863  # the advisory lock a fresh queue's costs are worked out under
CLAIM_FIRST = 16  # ... and in its first read: a window grows fourfold per read up to CLAIM_WINDOW

# SQLAlchemy makes the class of an ORM update at the first one run and publishes it before it
# is marked cacheable: threads making their first update at once (a host's workers, their
# heartbeats) could leave every ORM update of the process compiled anew at each call (an
# SAWarning in the 1,000-worker simulation). Made here, by the one thread importing this.
update(Seat)._annotate({})


class LeaseLost(StoreError):
    """A worker's claim on a seat passed to another worker (its lease ran out while it
    stalled) before it wrote its result: the result is dropped, the other worker's stands."""


def holder_id() -> str:
    """Who holds a claim: host:pid, and the GPU a worker was given (NBX_TUNE_WORKER_ID
    names it outright, for a fleet's own naming)."""
    explicit = os.environ.get("NBX_TUNE_WORKER_ID")
    if explicit:
        return explicit
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("HIP_VISIBLE_DEVICES")
    return f"{socket.gethostname()}:{os.getpid()}" + (f":gpu{gpu}" if gpu else "")


def _dead_local_holder(holder: str) -> bool:
    parts = holder.split(":")
    if len(parts) < 2:
        return False
    host, pid = parts[0], parts[1]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


SeatKey = namedtuple("SeatKey", "id profile kernel dtypes flags bucket")
TuningKey = namedtuple("TuningKey", "id seat_id kind outcome search survivors seeded_from shortcut_loss")


@dataclass
class SeatRecord:
    """A seat with what its status is derived from."""

    seat: Seat
    cert: Certificate | None = None
    cert_tuning: Tuning | None = None
    last_tuning: Tuning | None = None
    problems: list[Problem] = field(default_factory=list)
    launches: int = 0
    seat_refusal: Refusal | None = None  # the last tuning's refusal of the whole seat


def _among(session: Session, column, ids: list, name: str = "ids", type_=Integer):
    """`column IN ids`: on PostgreSQL `= ANY(:ids)`, one array parameter, so the statement's
    text is the same for any number of ids (prepared once by the driver)."""
    if session.bind.dialect.name == "postgresql":
        return column == any_(bindparam(name, ids, type_=ARRAY(type_)))
    return column.in_(ids)


def insert_ignore(session: Session, model, values: dict, keys: tuple[str, ...]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING, on SQLite and PostgreSQL alike."""
    dialect = session.bind.dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    session.execute(insert(model).values(**values).on_conflict_do_nothing(index_elements=list(keys)))


def insert_ignore_many(session: Session, model, rows: list[dict], keys: tuple[str, ...],
                       chunk: int = 5000) -> None:
    """insert_ignore for many rows, as one executemany per chunk: a 200,000-row trace is
    recorded in seconds, not one statement per shape."""
    if not rows:
        return
    dialect = session.bind.dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    stmt = insert(model).on_conflict_do_nothing(index_elements=list(keys))
    for i in range(0, len(rows), chunk):
        session.execute(stmt, rows[i:i + chunk])


class Store:
    def __init__(self, url: str | None = None):
        self.engine = open_engine(url)
        self.url = safe_url(self.engine.url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def reading(self):
        """The reads of this thread inside the block share one transaction (one connection
        checkout, BEGIN and COMMIT instead of one per read): a seat's reads before its
        tuning, several Store calls, are one round of the database. Writes keep their own."""
        local = self.__dict__.setdefault("_pinned", threading.local())
        if getattr(local, "session", None) is not None:
            yield
            return
        with self.session(write=False) as s:
            local.session = s
            try:
                yield
            finally:
                local.session = None

    @contextmanager
    def session(self, write: bool = True):
        """One transaction. A writer's BEGIN takes the write lock (SQLite: BEGIN IMMEDIATE,
        with a busy timeout) and is retried while another writer holds it, so users never
        see "database is locked"; once begun, the block runs to commit or rollback. A read
        (write=False) takes no lock: queries never wait behind a census. A read inside
        `reading()` joins its transaction."""
        pinned = None if write else getattr(self.__dict__.get("_pinned"), "session", None)
        if pinned is not None:
            yield pinned
            return
        s = self._sessions()
        try:
            self._begin(s, write)
            yield s
            s.commit()
        except (OperationalError, DatabaseError) as e:
            s.rollback()
            if isinstance(e, IntegrityError):  # a broken invariant is a bug, never a user error
                raise
            raise StoreError(f"database {self.url}: {str(e.orig).splitlines()[0]}") from None
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    def _begin(self, s: Session, write: bool = True) -> None:
        for attempt in range(LOCK_RETRIES):
            try:
                s.connection(execution_options={WRITE: write})
                return
            except OperationalError as e:
                s.rollback()
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
                if attempt == LOCK_RETRIES - 1:
                    raise StoreError(f"database {self.url} stayed locked by another writer; "
                                     "try again when the other census finishes") from None
                time.sleep(min(2.0, 0.1 * 2 ** attempt))

    # ------------------------------------------------------------------ census writes

    def record_census(self, trace, sha256: str, profile: str, seats: dict) -> tuple[int, dict]:
        """Record a census plan: the trace, its run, each seat with the shapes and launch
        counts the trace needs. `seats` maps (kernel, dtypes, flags, bucket) strings to
        {problem: launches}. Returns (run id, {seat key: seat id})."""
        ids = {}
        with self.session() as s:
            insert_ignore(s, Trace, {"sha256": sha256, "path": trace.path, "rows": len(trace.rows),
                                      "launches": trace.launches, "first_seen": utcnow()}, ("sha256",))
            trace_id = s.scalar(select(Trace.id).where(Trace.sha256 == sha256))
            run = CensusRun(trace_id=trace_id, profile=profile, status="running",
                            host=socket.gethostname(), pid=os.getpid(), started_at=utcnow())
            s.add(run)
            s.flush()
            # In key order: two censuses sharing seats lock them in the same order, so one
            # waits for the other instead of deadlocking (PostgreSQL aborts one otherwise).
            for key, problems in sorted(seats.items(), key=lambda kv: kv[0]):
                kernel, dtypes, flags, bucket = key
                insert_ignore(s, Seat, {"profile": profile, "kernel": kernel, "dtypes": dtypes,
                                         "flags": flags, "bucket": bucket, "created_at": utcnow()},
                               ("profile", "kernel", "dtypes", "flags", "bucket"))
                seat_id = s.scalar(select(Seat.id).where(
                    Seat.profile == profile, Seat.kernel == kernel, Seat.dtypes == dtypes,
                    Seat.flags == flags, Seat.bucket == bucket))
                ids[key] = seat_id
                insert_ignore_many(s, SeatShape, [{"seat_id": seat_id, "problem": p.to_json(), "volume": p.volume}
                                                  for p in problems], ("seat_id", "problem"))
                s.execute(update(Seat).where(Seat.id == seat_id, Seat.queue_cost.is_not(None))
                          .values(queue_cost=None))  # a new shape may change it: the next listing sets it
                rows, launches = len(problems), sum(problems.values())
                # Two censuses of one trace may record it at once: insert-or-keep, then set.
                insert_ignore(s, TraceNeed, {"trace_id": trace_id, "seat_id": seat_id, "rows": rows,
                                             "launches": launches}, ("trace_id", "seat_id"))
                s.execute(update(TraceNeed).where(TraceNeed.trace_id == trace_id, TraceNeed.seat_id == seat_id)
                          .values(rows=rows, launches=launches))
            return run.id, ids

    def finish_census(self, run_id: int, status: str, summary: dict) -> None:
        with self.session() as s:
            run = s.get(CensusRun, run_id)
            run.status, run.finished_at, run.summary = status, utcnow(), json.dumps(summary, sort_keys=True)

    # ------------------------------------------------------------------ claims

    def claim(self, seat_id: int, holder: str, ttl_s: float) -> bool:
        """Take the seat for tuning unless a live holder has it. A claim expires ttl_s
        after its holder's last heartbeat; a holder on this host whose process is gone
        loses its claim at once."""
        now = time.time()
        with self.session() as s:
            res = s.execute(update(Seat).where(
                Seat.id == seat_id,
                (Seat.claimed_by.is_(None)) | (Seat.claim_expires < now) | (Seat.claimed_by == holder),
            ).values(claimed_by=holder, claim_expires=now + ttl_s))
            if res.rowcount == 1:
                return True
            other = s.scalar(select(Seat.claimed_by).where(Seat.id == seat_id))
            if other is None or not _dead_local_holder(other):
                return False
            res = s.execute(update(Seat).where(Seat.id == seat_id, Seat.claimed_by == other)
                            .values(claimed_by=holder, claim_expires=now + ttl_s))
            return res.rowcount == 1

    def claim_next(self, seat_ids, holder: str, ttl_s: float, since_tuning: int | None = None,
                   finished: set | None = None, held: dict | None = None) -> int | None:
        """Claim the first of `seat_ids`, in their order, that nobody live holds (workers
        pass the longest seats first, so the last seats of a queue are short ones). The
        ids are read in windows (CLAIM_FIRST, growing to CLAIM_WINDOW), only as far as the first free one, and only
        that row is locked (SELECT ... FOR UPDATE SKIP LOCKED on PostgreSQL, passing over a
        row another worker is claiming this instant; SQLite serializes writers with BEGIN
        IMMEDIATE): a claim costs the same at the head of a 100,000-seat queue as of a
        10-seat one, and never hides the queue's other free seats from another worker.
        With `since_tuning` (the newest tuning id when the caller listed `seat_ids`), a
        seat tuned since is skipped and its id added to `finished`; a seat another live
        worker holds is added to `held` with its lease's end. The caller need not list
        the queue again, nor read past the same held seats at its next claim."""
        ids = iter(seat_ids)
        now = time.time()
        free = (Seat.claimed_by.is_(None)) | (Seat.claim_expires < now) | (Seat.claimed_by == holder)
        if since_tuning is None:
            done = sa_false()
        else:
            done = select(Tuning.id).where(Tuning.seat_id == Seat.id, Tuning.id > since_tuning).exists()
        size = CLAIM_FIRST  # most claims find a free seat near the head: read little first
        with self.session() as s:
            while window := list(islice(ids, size)):
                size = min(CLAIM_WINDOW, 4 * size)
                # One statement a window: each seat's holder, lease and whether it was tuned
                # since the caller's list (on PostgreSQL the ids as one array parameter,
                # a statement prepared once, not a list of placeholders rendered per call).
                state = {i: (by, end, was_done) for i, by, end, was_done in s.execute(
                    select(Seat.id, Seat.claimed_by, Seat.claim_expires, done).where(_among(s, Seat.id, window)))}
                for sid in window:
                    by, end, was_done = state.get(sid, (None, None, False))
                    if was_done:
                        if finished is not None:
                            finished.add(sid)
                        continue
                    if by is not None and by != holder and end is not None and end >= now:
                        if held is not None:
                            held[sid] = end
                        continue
                    # Locked and taken in one statement, passing over a row another worker
                    # is claiming this instant (SKIP LOCKED; SQLite has one writer at a time).
                    mine = select(Seat.id).where(Seat.id == sid, free).with_for_update(skip_locked=True)
                    if s.execute(update(Seat).where(Seat.id == mine.scalar_subquery())
                                 .values(claimed_by=holder, claim_expires=now + ttl_s)).rowcount == 1:
                        return sid
            return None

    def claim_untuned(self, profile: str, holder: str, ttl_s: float, kernels) -> tuple | None:
        """Claim the longest never-tuned seat of `profile` (of one of `kernels`: those this
        worker can tune) that nobody live holds, in one statement ordered by the server:
        `UPDATE seats ... WHERE id = (SELECT id ... ORDER BY queue_cost DESC LIMIT 1 FOR
        UPDATE SKIP LOCKED) RETURNING ...`, over the partial index of the seats never tuned
        (ix_seats_claim_order). A dead holder's seat is free once its lease has ended; a row
        another worker is claiming this instant is passed over, never waited on (SQLite has
        one writer at a time). A seat whose cost is unknown yet goes first (NULLS FIRST:
        the index read backwards), as an unknown length is not one to leave to the tail.
        Returns (id, kernel, label) or None."""
        now = time.time()
        with self.session() as s:
            pick = (select(Seat.id).where(
                Seat.profile == profile, ~Seat.tuned,
                _among(s, Seat.kernel, sorted(kernels), "kernels", String),
                (Seat.claimed_by.is_(None)) | (Seat.claim_expires < now) | (Seat.claimed_by == holder))
                .order_by(Seat.queue_cost.desc().nulls_first(), Seat.id.desc()).limit(1)
                .with_for_update(skip_locked=True))
            row = s.execute(update(Seat).where(Seat.id == pick.scalar_subquery())
                            .values(claimed_by=holder, claim_expires=now + ttl_s)
                            .returning(Seat.id, Seat.kernel, Seat.dtypes, Seat.flags, Seat.bucket)).first()
            return None if row is None else (row[0], row[1], label_of(*row[1:]))

    def untuned_held(self, profile: str, kernels) -> float | None:
        """The earliest lease end of the held never-tuned seats of `profile` (of one of
        `kernels`), or None when none is held: a worker that finds no seat free waits for
        their holders to finish them, or for that lease to end."""
        with self.session(write=False) as s:
            return s.scalar(select(func.min(Seat.claim_expires)).where(
                Seat.profile == profile, ~Seat.tuned, Seat.claimed_by.is_not(None),
                _among(s, Seat.kernel, sorted(kernels), "kernels", String)))

    def untuned_without_cost(self, profile: str) -> bool:
        """Whether a never-tuned seat of `profile` has no queue cost stored (a census that
        recorded it did not work it out, or is adding a shape to it)."""
        with self.session(write=False) as s:
            return s.scalar(select(Seat.id).where(Seat.profile == profile, ~Seat.tuned,
                                                  Seat.queue_cost.is_(None)).limit(1)) is not None

    def untuned_seats(self, profile: str) -> list[tuple]:
        """The profile's seats never tuned, in one query without their records (a seat
        with no tuning is pending): (id, kernel, label, queue cost or None)."""
        with self.session(write=False) as s:
            rows = s.execute(select(Seat.id, Seat.kernel, Seat.dtypes, Seat.flags, Seat.bucket, Seat.queue_cost)
                             .where(Seat.profile == profile, ~select(Tuning.id).where(Tuning.seat_id == Seat.id)
                                    .exists()).order_by(Seat.id))
            return [(i, k, label_of(k, d, f, b), c) for i, k, d, f, b, c in rows]

    def seat_problems(self, seat_ids) -> dict[int, list[Problem]]:
        """Each seat's shapes."""
        out = {}
        with self.session(write=False) as s:
            ids = list(seat_ids)
            for i in range(0, len(ids), 5000):
                for sid, problem in s.execute(select(SeatShape.seat_id, SeatShape.problem)
                                              .where(SeatShape.seat_id.in_(ids[i:i + 5000]))):
                    out.setdefault(sid, []).append(Problem.from_json(problem))
        return out

    def fill_queue_costs(self, profile: str, cost_of) -> None:
        """Work out (`cost_of(kernel, problems)`, None to leave one unset) and store the
        costs of the profile's never-tuned seats that have none, one lister at a time (an
        advisory lock on PostgreSQL, the write lock on SQLite): a fleet's workers starting
        together on a fresh queue would each read every seat's shapes and work out every
        cost (1,000 workers on 2,000 seats: 2 minutes of the simulation's start on two
        cores). The first does it; the others wait for it, then find the costs stored.
        Rows a census is writing this instant are passed over (SKIP LOCKED, as in
        set_queue_costs): the next listing costs them."""
        with self.session() as s:
            if s.bind.dialect.name == "postgresql":
                s.execute(select(func.pg_advisory_xact_lock(QUEUE_COST_LOCK)))
            rows = s.execute(select(Seat.id, Seat.kernel).where(
                Seat.profile == profile, Seat.queue_cost.is_(None),
                ~select(Tuning.id).where(Tuning.seat_id == Seat.id).exists())
                .with_for_update(skip_locked=True, of=Seat)).all()
            if not rows:
                return
            ids = [sid for sid, _ in rows]
            shapes: dict[int, list] = {}
            for i in range(0, len(ids), 5000):
                for sid, problem in s.execute(select(SeatShape.seat_id, SeatShape.problem)
                                              .where(_among(s, SeatShape.seat_id, ids[i:i + 5000]))):
                    shapes.setdefault(sid, []).append(Problem.from_json(problem))
            costs = [{"sid": sid, "cost": c} for sid, kernel in rows
                     if (c := cost_of(kernel, shapes.get(sid, []))) is not None]
            seats = Seat.__table__
            if costs:
                s.connection().execute(update(seats).where(seats.c.id == bindparam("sid"))
                                       .values(queue_cost=bindparam("cost")), costs)

    def set_queue_costs(self, costs: dict[int, float]) -> None:
        """Record seats' queue costs (a listing's work, kept for the next worker's)."""
        seats = Seat.__table__
        ids = sorted(costs)
        for i in range(0, len(ids), 1000):
            # Short transactions; each writes the rows still without a cost that no other
            # worker listing at the same instant is writing (SKIP LOCKED), so a thousand
            # workers starting at once write each seat's cost once, and never deadlock.
            with self.session() as s:
                mine = s.scalars(select(Seat.id).where(Seat.id.in_(ids[i:i + 1000]), Seat.queue_cost.is_(None))
                                 .with_for_update(skip_locked=True)).all()
                if mine:
                    s.connection().execute(update(seats).where(seats.c.id == bindparam("sid"))
                                           .values(queue_cost=bindparam("cost")),
                                           [{"sid": k, "cost": costs[k]} for k in mine])

    def last_tuning_id(self) -> int:
        """The newest tuning's id (0 for none): a worker's mark of when it listed its queue."""
        with self.session(write=False) as s:
            return int(s.scalar(select(func.max(Tuning.id))) or 0)

    def claimed_by(self, seat_id: int) -> str | None:
        with self.session(write=False) as s:
            return s.scalar(select(Seat.claimed_by).where(Seat.id == seat_id, Seat.claim_expires >= time.time()))

    def extend_claim(self, seat_id: int, holder: str, ttl_s: float) -> bool:
        """A heartbeat. On PostgreSQL one autocommitted UPDATE, one round trip: no ping of
        the idle connection first, no BEGIN and COMMIT around it (four round trips before;
        a thousand workers beat 30-100 times a second). A connection the server dropped
        fails the UPDATE, is replaced by the pool, and the beat is sent again once."""
        stmt = update(Seat).where(Seat.id == seat_id, Seat.claimed_by == holder)
        if self.engine.dialect.name != "postgresql":  # SQLite: a writer's BEGIN IMMEDIATE
            with self.session() as s:
                return s.execute(stmt.values(claim_expires=time.time() + ttl_s)).rowcount == 1
        for attempt in (0, 1):
            try:
                with unpinged(), self.engine.connect() as c:
                    c = c.execution_options(isolation_level="AUTOCOMMIT")
                    return c.execute(stmt.values(claim_expires=time.time() + ttl_s)).rowcount == 1
            except DBAPIError as e:
                if attempt or not e.connection_invalidated:  # the second try returns or raises
                    raise StoreError(f"database {self.url}: {str(e.orig).splitlines()[0]}") from None

    def release(self, seat_id: int, holder: str) -> None:
        with self.session() as s:
            s.execute(update(Seat).where(Seat.id == seat_id, Seat.claimed_by == holder)
                      .values(claimed_by=None, claim_expires=None))

    # ------------------------------------------------------------------ tuning results

    def write_result(self, seat_id: int, run_id: int | None, kind: str, result, prov: dict,
                     worker: str, started_at: datetime) -> int:
        """Record one tuning of a seat whole: its candidates, refusals and certificate.
        The seat's previous certificate is superseded (kept, never deleted). Only the
        seat's holder writes: the transaction first releases `worker`'s claim, which locks
        the row against claimers; if `worker` no longer holds it (its lease ran out and
        another worker took the seat, or finished it) nothing is written and LeaseLost is
        raised, so a seat is tuned twice at most, never certified twice."""
        with self.session() as s:
            held = s.execute(update(Seat).where(Seat.id == seat_id, Seat.claimed_by == worker)
                             .values(claimed_by=None, claim_expires=None, tuned=True))  # out of claim_untuned's
            if held.rowcount != 1:
                raise LeaseLost(f"seat {seat_id}: {worker}'s claim was taken by another worker; "
                                "its result is dropped")
            t = Tuning(seat_id=seat_id, census_run_id=run_id, kind=kind, outcome=result.outcome,
                       started_at=started_at, finished_at=utcnow(), worker=worker, **prov,
                       candidates=len(result.records),
                       survivors=sum(1 for r in result.records if r.reason is None),
                       screen_s=result.screen_s, bench_s=result.bench_s, total_s=result.total_s,
                       **_search_columns(result))
            s.add(t)
            s.flush()
            for r in result.records:
                if r.reason:
                    judged = r.failed_screen
                    s.add(Refusal(tuning_id=t.id, seat_id=seat_id, config=r.config.key(), reason=r.reason,
                                  detail=r.detail, problem=r.problem.to_json() if r.problem else None,
                                  err=judged.err if judged else None, rtol=judged.rtol if judged else None,
                                  created_at=utcnow()))
                elif r.timing is not None:
                    s.add(Measurement(tuning_id=t.id, config=r.config.key(), median_ms=r.timing.median_ms,
                                      p20_ms=r.timing.p20_ms, p80_ms=r.timing.p80_ms,
                                      method=r.timing.method, final=r.final,
                                      screens=_screens_json(r.screens)))
            if result.seat_refusal:
                s.add(Refusal(tuning_id=t.id, seat_id=seat_id, config=None, reason=result.seat_refusal[0],
                              detail=result.seat_refusal[1], created_at=utcnow()))
            current = s.scalar(select(Certificate).where(Certificate.seat_id == seat_id,
                                                         Certificate.superseded_at.is_(None)))
            if current is not None:
                current.superseded_at = utcnow()
                current.superseded_reason = f"{kind} tuning {t.id}: {result.outcome}"
                s.flush()  # the partial unique index allows one current certificate
            if result.winner is not None:
                w, ru = result.winner, result.runner_up
                screened = sorted(result.screened, key=Problem.order)
                s.add(Certificate(
                    seat_id=seat_id, tuning_id=t.id, config=w.config.key(), median_ms=w.timing.median_ms,
                    p20_ms=w.timing.p20_ms, p80_ms=w.timing.p80_ms,
                    runner_up=ru.config.key() if ru else None, runner_up_ms=ru.timing.median_ms if ru else None,
                    margin=result.margin, screens=_screens_json(w.screens),
                    screened_min=screened[0].to_json() if screened else None,
                    screened_max=screened[-1].to_json() if screened else None,
                    unscreened=result.unscreened, timing_method=w.timing.method, created_at=utcnow(),
                    search=_search_columns(result)["search"], recertified_from=getattr(
                        getattr(result, "note", None), "recertified_from", None),
                    search_detail=getattr(getattr(result, "note", None), "detail", None) or None,
                    sampled_regret=getattr(getattr(result, "note", None), "sampled_regret", None)))
            return t.id

    # ------------------------------------------------------------------ reads

    def seat_records(self, profile: str | None = None, kernel: str | None = None,
                     seat_ids=None, tuned_only: bool = False) -> list[SeatRecord]:
        with self.session(write=False) as s:
            q = select(Seat)
            if tuned_only:
                q = q.where(select(Tuning.id).where(Tuning.seat_id == Seat.id).exists())
            if profile:
                q = q.where(Seat.profile == profile)
            if kernel:
                q = q.where(Seat.kernel == kernel)
            if seat_ids is not None:
                q = q.where(Seat.id.in_(list(seat_ids)))
            seats = s.scalars(q.order_by(Seat.id)).all()
            recs = {st.id: SeatRecord(st) for st in seats}
            if not recs:
                return []
            ids = list(recs)
            # A seat never tuned (seats.tuned: set with its first tuning) has no certificate,
            # tuning or refusal to read: a worker's freshly claimed seat reads its shapes alone.
            tuned = [st.id for st in seats if st.tuned]
            for c, t in s.execute(select(Certificate, Tuning).join(Tuning, Tuning.id == Certificate.tuning_id)
                                  .where(Certificate.seat_id.in_(tuned), Certificate.superseded_at.is_(None))
                                  ) if tuned else ():
                recs[c.seat_id].cert, recs[c.seat_id].cert_tuning = c, t
            last = (select(Tuning.seat_id, func.max(Tuning.id).label("tid"))
                    .where(Tuning.seat_id.in_(tuned)).group_by(Tuning.seat_id).subquery())
            for t in s.scalars(select(Tuning).join(last, Tuning.id == last.c.tid)) if tuned else ():
                recs[t.seat_id].last_tuning = t
            for r in s.scalars(select(Refusal).join(last, Refusal.tuning_id == last.c.tid)
                               .where(Refusal.config.is_(None))) if tuned else ():
                recs[r.seat_id].seat_refusal = r
            for sid, problem in s.execute(select(SeatShape.seat_id, SeatShape.problem)
                                          .where(SeatShape.seat_id.in_(ids))):
                recs[sid].problems.append(Problem.from_json(problem))
            for sid, n in s.execute(select(TraceNeed.seat_id, func.sum(TraceNeed.launches))
                                    .where(TraceNeed.seat_id.in_(ids)).group_by(TraceNeed.seat_id)):
                recs[sid].launches = int(n or 0)
            return list(recs.values())

    def refusals(self, kernel=None, reason=None, profile=None, seat_id=None, limit=None):
        """(Refusal, Seat, Tuning) rows, newest first."""
        with self.session(write=False) as s:
            q = _refusal_filters(select(Refusal, Seat, Tuning).join(Seat, Seat.id == Refusal.seat_id)
                                 .join(Tuning, Tuning.id == Refusal.tuning_id), kernel, reason, profile)
            if seat_id is not None:
                q = q.where(Refusal.seat_id == seat_id)
            q = q.order_by(Refusal.id.desc())
            if limit:
                q = q.limit(limit)
            return s.execute(q).all()

    def count_refusals(self, kernel=None, reason=None, profile=None) -> int:
        with self.session(write=False) as s:
            q = _refusal_filters(select(func.count(Refusal.id)).join(Seat, Seat.id == Refusal.seat_id),
                                 kernel, reason, profile)
            return int(s.scalar(q) or 0)

    def history(self, seat_id: int):
        """Every tuning of a seat with its certificate (if any) and measurements."""
        with self.session(write=False) as s:
            tunings = s.scalars(select(Tuning).where(Tuning.seat_id == seat_id).order_by(Tuning.id)).all()
            certs = {c.tuning_id: c for c in s.scalars(select(Certificate).where(Certificate.seat_id == seat_id))}
            meas = {}
            for m in s.scalars(select(Measurement).join(Tuning, Tuning.id == Measurement.tuning_id)
                               .where(Tuning.seat_id == seat_id).order_by(Measurement.median_ms)):
                meas.setdefault(m.tuning_id, []).append(m)
            return [(t, certs.get(t.id), meas.get(t.id, [])) for t in tunings]

    def find_seat(self, ref: str, profile: str | None = None) -> Seat | None:
        """A seat by id or by its label `kernel|dtypes|flags|bucket`."""
        with self.session(write=False) as s:
            if ref.isdigit():  # past 2^63 no row can have it, and SQLite would overflow
                return s.get(Seat, int(ref)) if int(ref) < 2 ** 63 else None
            parts = split_label(ref)
            if parts is None:
                return None
            q = select(Seat).where(Seat.kernel == parts[0], Seat.dtypes == parts[1],
                                   Seat.flags == parts[2], Seat.bucket == parts[3])
            if profile:
                q = q.where(Seat.profile == profile)
            found = s.scalars(q).all()
            if len(found) > 1:
                raise StoreError(f"seat {ref} exists for profiles {', '.join(f.profile for f in found)}: "
                                 "pass --profile or the seat's id")
            return found[0] if found else None

    def judged_configs(self, tuning_id: int) -> set[str]:
        """Every config a tuning measured or refused: the candidates it knew."""
        with self.session(write=False) as s:
            out = set(s.scalars(select(Measurement.config).where(Measurement.tuning_id == tuning_id)))
            out.update(s.scalars(select(Refusal.config).where(Refusal.tuning_id == tuning_id,
                                                               Refusal.config.is_not(None))))
            return out

    def kernel_measurements(self, profile: str, kernel: str, limit: int = 200):
        """The newest tunings of a kernel on a profile that timed something, newest first:
        [(seat, tuning, [(config, median_ms)], [(config, reason)])], what a ranked search
        learns from (tuner/search/ranked.py). The seat and tuning are named tuples of the
        columns searches read (SeatKey, TuningKey), not mapped objects: a seat's search reads
        this before every seat, and loading 200 tunings' full rows was most of its cost."""
        with self.session(write=False) as s:
            rows = s.execute(select(*(getattr(Seat, c) for c in SeatKey._fields),
                                    *(getattr(Tuning, c) for c in TuningKey._fields))
                             .join(Tuning, Tuning.seat_id == Seat.id)
                             .where(Seat.profile == profile, Seat.kernel == kernel, Tuning.kind != "import",
                                    Tuning.survivors > 0)
                             .order_by(Tuning.id.desc()).limit(limit)).all()
            n = len(SeatKey._fields)
            rows = [(SeatKey(*r[:n]), TuningKey(*r[n:])) for r in rows]
            ids = [t.id for _, t in rows]
            meas, refused = {}, {}
            if ids:
                for tid, c, ms in s.execute(select(Measurement.tuning_id, Measurement.config, Measurement.median_ms)
                                            .where(_among(s, Measurement.tuning_id, ids))):
                    meas.setdefault(tid, []).append((c, ms))
                for tid, c, why in s.execute(select(Refusal.tuning_id, Refusal.config, Refusal.reason)
                                             .where(_among(s, Refusal.tuning_id, ids), Refusal.config.is_not(None))):
                    refused.setdefault(tid, []).append((c, why))
            return [(seat, t, meas.get(t.id, []), refused.get(t.id, [])) for seat, t in rows]

    def has_audit(self, profile: str, kernel: str) -> bool:
        """Whether a kernel was ever audited on a profile with a loss measured (what
        `shortcut_losses` would return something for), through the audits' own index:
        asked before each seat, it must not read every tuning."""
        with self.session(write=False) as s:
            return s.scalar(select(Tuning.id).join(Seat, Seat.id == Tuning.seat_id)
                            .where(Tuning.search == "audit", Seat.profile == profile, Seat.kernel == kernel,
                                   Tuning.shortcut_loss.is_not(None)).limit(1)) is not None

    def shortcut_losses(self, profile: str, kernel: str | None = None) -> list[float]:
        """The losses audits measured for ranked searches (tunings.search = 'audit')."""
        with self.session(write=False) as s:
            q = (select(Tuning.shortcut_loss).join(Seat, Seat.id == Tuning.seat_id)
                 .where(Seat.profile == profile, Tuning.search == "audit", Tuning.shortcut_loss.is_not(None)))
            if kernel:
                q = q.where(Seat.kernel == kernel)
            return [float(x) for x in s.scalars(q)]

    # ------------------------------------------------------------------ torch baselines

    def add_baseline(self, seat_id: int, config: str, values: dict) -> int | None:
        """Record a baseline (Baseline's columns but the certificate) against the seat's
        current certificate if it serves `config`; None when it does not (a census replaced
        it while torch was being timed: the measurement is of a config no longer served)."""
        with self.session() as s:
            cert = s.scalar(select(Certificate).where(Certificate.seat_id == seat_id,
                                                      Certificate.superseded_at.is_(None)))
            if cert is None or cert.config != config:
                return None
            b = Baseline(certificate_id=cert.id, **values)
            s.add(b)
            s.flush()
            return b.id

    def current_certificates(self, profile: str) -> dict:
        """(kernel, dtypes, flags, bucket) -> (seat id, Certificate, Tuning) of each current
        certificate of `profile` (stale or not: the caller judges)."""
        with self.session(write=False) as s:
            rows = s.execute(select(Seat, Certificate, Tuning)
                             .join(Certificate, Certificate.seat_id == Seat.id)
                             .join(Tuning, Tuning.id == Certificate.tuning_id)
                             .where(Seat.profile == profile, Certificate.superseded_at.is_(None))).all()
            for row in rows:
                for obj in row:
                    s.expunge(obj)
        return {(seat.kernel, seat.dtypes, seat.flags, seat.bucket): (seat.id, cert, t) for seat, cert, t in rows}

    def baselines_of(self, certificate_ids) -> dict[int, list[Baseline]]:
        """certificate id -> its baselines, oldest first."""
        ids = list(certificate_ids)
        out: dict[int, list[Baseline]] = {}
        if not ids:
            return out
        with self.session(write=False) as s:
            for b in s.scalars(select(Baseline).where(Baseline.certificate_id.in_(ids))
                               .order_by(Baseline.measured_at, Baseline.id)):
                s.expunge(b)
                out.setdefault(b.certificate_id, []).append(b)
        return out

    def census_runs(self, limit: int = 20):
        with self.session(write=False) as s:
            return s.execute(select(CensusRun, Trace).join(Trace, Trace.id == CensusRun.trace_id)
                             .order_by(CensusRun.id.desc()).limit(limit)).all()

    def run_tunings(self, run_id: int):
        """(Tuning, Seat) of every seat a census run tuned or re-screened, in order."""
        with self.session(write=False) as s:
            return s.execute(select(Tuning, Seat).join(Seat, Seat.id == Tuning.seat_id)
                             .where(Tuning.census_run_id == run_id).order_by(Tuning.started_at, Tuning.id)).all()


def _search_columns(result) -> dict:
    note = getattr(result, "note", None)
    if note is None:
        return {"search": "full"}
    return {"search": note.search, "seeded_from": note.seeded_from, "shortcut_loss": note.shortcut_loss}


def _screens_json(screens) -> str:
    return json.dumps([{"problem": json.loads(r.problem.to_json()), "err": r.err, "rtol": r.rtol,
                        **({"repeat": r.repeat} if getattr(r, "repeat", None) else {})}
                       for r in screens], sort_keys=True)


def _refusal_filters(q, kernel=None, reason=None, profile=None):
    """The filters `refusals` and `count_refusals` share, on a query joined to Seat."""
    if kernel:
        q = q.where(Seat.kernel == kernel)
    if reason:
        q = q.where(Refusal.reason == reason)
    if profile:
        q = q.where(Seat.profile == profile)
    return q

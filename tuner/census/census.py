"""The census: one run over a model trace.

    parse the trace (nothing is written if it is malformed)
    -> map each row to a seat (or to "not covered" / "not servable", with launch counts)
    -> record the plan (trace, seats, shapes, which trace needs which seat)
    -> report coverage: certified, pending, refused, unscreened, stale
    -> tune what is pending or stale, re-screen what a new shape made unscreened
    -> report the result

A second census of the same trace finds every seat certified and tunes nothing.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from nbx_tune.errors import NbxError
from nbx_tune.kernels.runtime.registry import get_spec, spec_for_op
from nbx_tune.kernels.spec import (NotServable, bucket_of, encode_bucket, encode_dtypes, encode_flags, label_of,
                                   split_label)
from nbx_tune.tuner.census.status import seat_status
from nbx_tune.kernels.trace import MAX_INT, Trace, read_trace


@dataclass
class SeatPlan:
    kernel: str
    dtypes: str
    flags: str
    bucket: str
    problems: Counter = field(default_factory=Counter)  # Problem -> launches
    rows: int = 0
    ops: Counter = field(default_factory=Counter)  # trace op -> launches

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.kernel, self.dtypes, self.flags, self.bucket)

    @property
    def label(self) -> str:
        return label_of(*self.key)

    @property
    def launches(self) -> int:
        return sum(self.problems.values())


@dataclass
class Plan:
    trace: Trace
    sha256: str
    profile: object
    seats: dict = field(default_factory=dict)  # key -> SeatPlan
    uncovered: Counter = field(default_factory=Counter)  # op -> launches
    uncovered_rows: Counter = field(default_factory=Counter)  # op -> rows
    not_servable: list = field(default_factory=list)  # (line, op, reason, launches)


BIG_PLAN = 20_000  # rows or shapes above which a census says what it is doing before doing it


def plan(trace: Trace, sha256: str, profile, notice=None) -> Plan:
    p = Plan(trace, sha256, profile)
    if notice is not None and len(trace.rows) > BIG_PLAN:
        notice(f"mapping {len(trace.rows):,} trace rows to seats")
    for row in trace.rows:
        spec = spec_for_op(row.op)
        if spec is None:
            p.uncovered[row.op] += row.count
            p.uncovered_rows[row.op] += 1
            continue
        try:
            problem = spec.problem_from_row(row)
        except (ValueError, KeyError, TypeError) as e:  # a param the kernel could not read
            problem = NotServable(f"unreadable params: {e}")
        except Exception as e:  # a plugin's bug costs its rows, never the census
            problem = NotServable(f"kernel {spec.name} could not read this row "
                                  f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
        if not isinstance(problem, NotServable) and problem.volume > MAX_INT:
            problem = NotServable("more than 2^63 - 1 elements")
        if isinstance(problem, NotServable):
            p.not_servable.append((row.line, row.op, problem.reason, row.count))
            continue
        if problem.kernel != spec.name:  # a row one family hands to another (SDPA with a mask)
            spec = get_spec(problem.kernel)
        try:
            bucket = bucket_of(profile, spec.key, problem.dims)
        except ValueError as e:
            p.not_servable.append((row.line, row.op, str(e), row.count))
            continue
        key = (spec.name, encode_dtypes(problem.dtypes), encode_flags(problem.flags),
               encode_bucket(spec.key, bucket))
        sp = p.seats.get(key)
        if sp is None:
            sp = p.seats[key] = SeatPlan(*key)
        sp.problems[problem] += row.count
        sp.rows += 1
        sp.ops[row.op] += row.count
    return p


def load_plan(path: str | Path, profile, notice=None) -> Plan:
    trace = read_trace(path)
    sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return plan(trace, sha, profile, notice)


@dataclass
class SeatLine:
    """One seat of a census report."""

    id: int | None
    label: str
    kernel: str
    status: str
    why: str
    launches: int
    shapes: int
    config: str | None = None
    median_ms: float | None = None
    action: str = ""  # tuned / re-certified / rescreened / "" (nothing to do)
    recertified_from: str | None = None  # re-certified: the tuning it came from, in words
    ops: dict = field(default_factory=dict)  # trace op -> launches in this seat

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Report:
    trace: str
    profile: str
    rows: int
    launches: int
    seats: list[SeatLine]
    uncovered: dict
    not_servable: list
    run_id: int | None = None
    dry_run: bool = False
    seconds: float = 0.0
    db: str | None = None  # the database, as it may be printed

    def counts(self) -> dict:
        c = Counter(s.status for s in self.seats)
        launches = Counter()
        for s in self.seats:
            launches[s.status] += s.launches
        return {st: {"seats": c.get(st, 0), "launches": launches.get(st, 0)}
                for st in ("certified", "unscreened", "pending", "refused", "stale")}

    def by_op(self) -> list[dict]:
        """Coverage per trace op: its launches by seat status (certified and unscreened
        are served by a certificate), and the reasons for launches no kernel serves."""
        ops: dict[str, dict] = {}

        def entry(op):
            return ops.setdefault(op, {"op": op, "kernel": None, "launches": 0, "served": 0, "by_status": {},
                                       "why": []})

        for s in self.seats:
            for op, n in s.ops.items():
                e = entry(op)
                e["kernel"] = s.kernel
                e["launches"] += n
                e["by_status"][s.status] = e["by_status"].get(s.status, 0) + n
                if s.status in ("certified", "unscreened"):
                    e["served"] += n
                elif s.why and s.why not in e["why"]:
                    e["why"].append(s.why)
        for op, n in self.uncovered.items():
            e = entry(op)
            e["launches"] += n
            e["by_status"]["not covered"] = n
            e["why"].append("no kernel serves this op")
        for line, op, why, n in self.not_servable:
            e = entry(op)
            e["launches"] += n
            e["by_status"]["not servable"] = e["by_status"].get("not servable", 0) + n
            e["why"].append(f"line {line}: {why}")
        return sorted(ops.values(), key=lambda e: (-e["launches"], e["op"]))

    def to_dict(self) -> dict:
        return {"trace": self.trace, "profile": self.profile, "rows": self.rows,
                "launches": self.launches, "dry_run": self.dry_run, "run_id": self.run_id,
                "seconds": round(self.seconds, 3), "coverage": self.counts(),
                "seats": [s.to_dict() for s in self.seats], "by_op": self.by_op(),
                "db": self.db,
                "not_covered": [{"op": op, "launches": n, "reason": "no kernel serves this op"}
                                for op, n in sorted(self.uncovered.items())],
                "not_servable": [{"line": ln, "op": op, "reason": why, "launches": n}
                                 for ln, op, why, n in self.not_servable]}


def report_lines(store, pl: Plan, ids: dict | None) -> list[SeatLine]:
    """Each planned seat with its status now (from the store, if there is one)."""
    from nbx_tune.kernels.runtime.registry import all_specs
    from nbx_tune.tuner.store import SeatRecord

    specs = all_specs()
    recs = {}
    if store is not None and ids:
        recs = {r.seat.id: r for r in store.seat_records(seat_ids=ids.values())}
    lines = []
    for key, sp in pl.seats.items():
        sid = ids.get(key) if ids else None
        rec = recs.get(sid)
        problems = list(sp.problems)
        if rec is None:
            st = seat_status(SeatRecord(None, problems=problems), specs.get(sp.kernel), pl.profile)
            cfg = ms = None
        else:
            # A dry run has not recorded this trace's shapes: judge with them too.
            seen = list(dict.fromkeys((*rec.problems, *problems)))  # linear: 200k-row traces
            st = seat_status(replace(rec, problems=seen), specs.get(sp.kernel), pl.profile)
            cfg = rec.cert.config if rec.cert else None
            ms = rec.cert.median_ms if rec.cert else None
        lines.append(SeatLine(sid, sp.label, sp.kernel, st.status, st.why, sp.launches,
                              len(sp.problems), cfg, ms, ops=dict(sp.ops)))
    return lines


def predict(pl: Plan, lines: list[SeatLine]) -> list[SeatLine]:
    """A dry run says what the census would do to each seat it would tune: refuse it
    unlaunched (a dtype the profile cannot screen), or certify it unscreened (a shape over
    the screen's byte budget)."""
    from nbx_tune.kernels.runtime.registry import all_specs
    from nbx_tune.tuner.certify.tune import seat_job, unscreenable

    specs = all_specs()
    for ln in lines:
        if ln.status not in ("pending", "stale"):
            continue
        spec, problems = specs.get(ln.kernel), list(pl.seats[_key(ln.label)].problems)
        if spec is None:
            continue
        bad = unscreenable(spec, pl.profile, problems)
        if bad:
            ln.status, ln.why = "refused", f"predicted dtype_unscreenable: {bad[1]}"
            continue
        _, skipped = seat_job(spec, pl.profile, ln.label, problems, "cpu")
        if skipped:
            over = ", ".join(f"{n / 2**20:.0f} MiB" for _, n in skipped)
            ln.why = "; ".join(x for x in (ln.why, (
                f"predicted unscreened: operands of {over} > the profile's "
                f"{pl.profile.screen_max_bytes / 2**20:.0f} MiB screen budget")) if x)
    return lines


def _key(label: str) -> tuple:
    return split_label(label)


def _report(pl: Plan, lines, run_id, dry_run, t0) -> Report:
    return Report(pl.trace.path, pl.profile.name, len(pl.trace.rows), pl.trace.launches, lines,
                  dict(pl.uncovered), list(pl.not_servable), run_id, dry_run, time.perf_counter() - t0)


def find_existing(store, pl: Plan) -> dict:
    """Seat ids of planned seats that already exist (read-only: for --dry-run)."""
    if store is None:
        return {}
    recs = store.seat_records(profile=pl.profile.name)
    by_key = {(r.seat.kernel, r.seat.dtypes, r.seat.flags, r.seat.bucket): r.seat.id for r in recs}
    return {k: by_key[k] for k in pl.seats if k in by_key}


def run_census(pl: Plan, store, tuner=None, reporter=None, dry_run: bool = False) -> Report:
    """Record and tune (or with dry_run, only report) a census of a planned trace.

    `tuner` is a `SeatTuner` (tuner/fleet/seat_tuner.py) that certifies seats on this device; with
    None, the census records the plan and reports coverage without tuning."""
    t0 = time.perf_counter()
    profile = pl.profile
    if dry_run:
        return _report(pl, predict(pl, report_lines(store, pl, find_existing(store, pl))), None, True, t0)
    shapes = sum(len(sp.problems) for sp in pl.seats.values())
    if reporter is not None and shapes > BIG_PLAN:
        reporter.notice(f"recording {shapes:,} shapes of {len(pl.seats):,} seats")
    run_id, ids = store.record_census(pl.trace, pl.sha256, profile.name,
                                      {k: sp.problems for k, sp in pl.seats.items()})
    status = "done"
    before = []
    try:  # from here on the run row is finished whatever happens: never left `running`
        before = report_lines(store, pl, ids)
        if reporter is not None:
            reporter.coverage(_report(pl, before, run_id, False, t0))
        if tuner is not None:
            tuner.run(tuner.todo(before), pl, ids, run_id, reporter)
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except BaseException:
        status = "failed"
        raise
    finally:
        after = report_lines(store, pl, ids)
        acted = {ln.label: ln for ln in before}
        for ln in after:
            was = acted.get(ln.label)
            ln.action, ln.recertified_from = (was.action, was.recertified_from) if was else ("", None)
        rep = _report(pl, after, run_id, False, t0)
        try:
            store.finish_census(run_id, status, {"coverage": rep.counts(), "seconds": round(rep.seconds, 3)})
        except NbxError:
            if status == "done":
                raise
    return rep

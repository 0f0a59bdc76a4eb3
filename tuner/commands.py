"""What the CLI's commands do, as library calls. The CLI parses arguments and draws
results; everything else happens here (and below)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from nbx_tune.errors import NbxError, ProfileError, StoreError
from nbx_tune.profiles import (builtin_profiles, current_target, device_info, get_profile,
                               match_profile, use_interpreter_without_gpu)
from nbx_tune.tuner.certify.reasons import REFUSAL_REASONS  # noqa: F401 (the CLI's --reason help)


def ensure_device(notice=None) -> None:
    """With no GPU and no TRITON_INTERPRET, switch to the interpreter and say so (the rule
    of every entry point: profiles/detect.use_interpreter_without_gpu)."""
    use_interpreter_without_gpu(notice)


def check_plugins(plugins) -> None:
    """A plugin module that cannot be found is one line here, before any worker process
    tries (and prints its own traceback)."""
    import importlib.util

    for p in plugins or ():
        try:
            found = importlib.util.find_spec(p) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise NbxError(f"plugin {p}: cannot import: no module named {p!r} (is it installed, "
                           "or on PYTHONPATH?)")


def load_plugins(plugins) -> None:
    from nbx_tune.kernels.runtime.registry import load_plugin

    for p in plugins or ():
        load_plugin(p)


def resolve_profile(name: str | None, for_tuning: bool):
    """The profile a command works on: --profile, else the running device's. A census
    that tunes must run on a device its profile claims."""
    if name is None:
        return match_profile(current_target(), builtin_profiles().values())
    profile = get_profile(name)
    if for_tuning:
        target = current_target()
        from nbx_tune.kernels.runtime.validity import claims

        if not claims(profile, target):
            raise ProfileError(f"profile {profile.name} does not claim this device ({target}); a census "
                               "tunes on the device it runs on (use --dry-run to plan for another profile)")
    return profile


def known_profiles(extra=None) -> dict:
    profiles = dict(builtin_profiles())
    if extra is not None:
        profiles[extra.name] = extra
    return profiles


def census(model: str, db: str | None = None, profile: str | None = None, dry_run: bool = False,
           reporter=None, strategy: str = "pruned", plugins=(), isolate: bool = True,
           enqueue: bool = False):
    """dry_run: plan only, write nothing. enqueue: record the plan for workers, tune nothing
    (any profile: the workers of its device tune it)."""
    tunes = not (dry_run or enqueue)
    from nbx_tune.tuner.timing.strategies import get_strategy

    get_strategy(strategy)  # a bad --strategy fails before any process starts or file is made
    check_plugins(plugins)  # and a missing plugin before the worker processes try to import it
    executor = _early_executor(isolate and tunes, plugins)
    try:
        ensure_device(reporter.notice if reporter else None)  # before anything imports triton
        load_plugins(plugins)
        from nbx_tune.tuner.census.census import load_plan, run_census
        from nbx_tune.tuner.store import Store

        prof = resolve_profile(profile, for_tuning=tunes)
        plan = load_plan(model, prof, reporter.notice if reporter else None)  # fails before any database I/O
        # A dry run reads the database if there is one, and never creates or writes it.
        store = _existing_store(db) if dry_run else Store(db)
        try:
            if dry_run:
                rep = run_census(plan, store, dry_run=True)
            elif enqueue:
                from nbx_tune.tuner.fleet.seat_tuner import queue_cost

                rep = run_census(plan, store, None, reporter)
                # The seats' costs worked out here, once: workers claim in their order and
                # never compute them (a thousand workers starting at once would wait on it).
                store.fill_queue_costs(prof.name, queue_cost(prof))
            else:
                rep = run_census(plan, store, make_tuner(store, prof, strategy, isolate, executor), reporter)
            rep.db = store.url if store is not None else None
        finally:
            if store is not None:
                store.close()
        if not dry_run:  # what it reports must be in the database, read as the next command will
            from nbx_tune.tuner.census.readback import verify_certificates

            verify_certificates(store.engine.url, rep)
        return rep
    finally:
        if executor is not None:
            executor.close()


def worker(db: str | None = None, profile: str | None = None, reporter=None, strategy: str = "pruned",
           plugins=(), isolate: bool = True, max_seats: int | None = None, lease_s: float | None = None):
    """One worker on this device: tune queued seats of its profile until none is left."""
    executor = _early_executor(isolate, plugins)
    try:
        ensure_device(reporter.notice if reporter else None)
        load_plugins(plugins)
        from nbx_tune.tuner.fleet.workers import run_worker
        from nbx_tune.tuner.store import Store

        prof = resolve_profile(profile, for_tuning=True)
        store = Store(db)
        try:
            tuner = make_tuner(store, prof, strategy, isolate, executor)
            if lease_s:
                tuner.claim_ttl = lease_s
            return run_worker(tuner, reporter, max_seats)
        finally:
            store.close()
    finally:
        if executor is not None:
            executor.close()


def _early_executor(isolate: bool, plugins=()):
    """The worker process and the compile pool, started first: their imports of torch and
    Triton and their device set-up (seconds each) then overlap this process's, and its
    planning and database set-up. The worker looks for the GPU itself; the pool starts
    unless TRITON_INTERPRET is set, and is closed if the profile turns out to be the
    interpreter's (Isolated.use_profile). The caller closes the executor."""
    if not isolate:
        return None
    from nbx_tune.tuner.execution.isolation import Isolated

    return Isolated(plugins=plugins)


def make_tuner(store, profile, strategy: str = "pruned", isolate: bool = True, executor=None):
    """Candidates run in a worker process (isolate) or in this one (trusted kernels, tests).
    `executor`: an `Isolated` started early (see _early_executor), which the caller closes;
    else the tuner's own executor is made here and closed by whoever closes the tuner's."""
    from nbx_tune.tuner.timing.benchmarkers import for_profile
    from nbx_tune.tuner.execution.executor import InProcess
    from nbx_tune.tuner.execution.isolation import Isolated
    from nbx_tune.tuner.fleet.seat_tuner import SeatTuner
    from nbx_tune.tuner.timing.strategies import get_strategy

    if executor is not None:
        executor.use_profile(profile)
    elif isolate:
        executor = Isolated(profile)
    else:
        executor = InProcess(for_profile(profile))
    return SeatTuner(store, profile, device_info(), executor, get_strategy(strategy))


def _existing_store(db: str | None, required: bool = False):
    """The store of a database that exists; None, or with `required` an error, for a SQLite
    file that does not: a query never creates a database (a mistyped --db would otherwise
    report an empty one and exit 0)."""
    from nbx_tune import settings
    from nbx_tune.tuner.store import Store

    url = settings.db_url(db)
    if _missing_sqlite(url):
        if required:
            _missing_sqlite(url, raise_it=True)
        return None
    return Store(url)


# ----------------------------------------------------------------------------- queries

@dataclass
class SeatView:
    id: int
    profile: str
    kernel: str
    dtypes: str
    flags: str
    bucket: str
    status: str
    why: str
    config: str | None
    median_ms: float | None
    launches: int
    shapes: int
    claimed_by: str | None

    @property
    def label(self) -> str:
        from nbx_tune.kernels.spec import label_of

        return label_of(self.kernel, self.dtypes, self.flags, self.bucket)

    def to_dict(self) -> dict:
        return {**self.__dict__, "label": self.label}


def _status_profile(name: str, profiles: dict):
    return profiles.get(name)


def seat_views(db=None, status=None, kernel=None, profile=None, plugins=()) -> list[SeatView]:
    from nbx_tune.kernels.runtime.registry import all_specs
    from nbx_tune.tuner.census.status import STATUSES, seat_status
    from nbx_tune.tuner.store import Store

    if status:
        bad = [s for s in status if s not in STATUSES]
        if bad:
            raise NbxError(f"unknown status {bad[0]!r}; known: {', '.join(STATUSES)}")
    load_plugins(plugins)
    specs = all_specs()
    prof_name = get_profile(profile).name if profile else None
    profiles = known_profiles(get_profile(profile) if profile else None)
    store = _existing_store(db, required=True)
    try:
        out = []
        for r in store.seat_records(profile=prof_name, kernel=kernel):
            st = seat_status(r, specs.get(r.seat.kernel), profiles.get(r.seat.profile))
            if status and st.status not in status:
                continue
            out.append(SeatView(r.seat.id, r.seat.profile, r.seat.kernel, r.seat.dtypes, r.seat.flags,
                                r.seat.bucket, st.status, st.why, r.cert.config if r.cert else None,
                                r.cert.median_ms if r.cert else None, r.launches, len(r.problems),
                                r.seat.claimed_by))
        return out
    finally:
        store.close()


def show_seat(ref: str, db=None, profile=None, plugins=()) -> dict:
    from nbx_tune.kernels.runtime.torch_rule import defers
    from nbx_tune.tuner.store.export import baseline_dict, iso_utc

    store = _existing_store(db, required=True)
    try:
        seat = store.find_seat(ref, get_profile(profile).name if profile else None)
        if seat is None:
            raise NbxError(f"no seat {ref!r} (nbx-tune seats lists them; give an id or "
                           "kernel|dtypes|flags|bucket)")
        view = [v for v in seat_views(db, profile=seat.profile, kernel=seat.kernel, plugins=plugins)
                if v.id == seat.id][0]
        history = []
        for t, cert, meas in store.history(seat.id):
            h = {"tuning": t.id, "kind": t.kind, "outcome": t.outcome, "finished_at": iso_utc(t.finished_at),
                 "worker": t.worker, "provenance": {k: getattr(t, k) for k in (
                     "device_name", "device_target", "driver", "triton_version", "torch_version",
                     "kernel_source_hash", "config_space_hash", "profile_hash")},
                 "candidates": t.candidates, "survivors": t.survivors, "search": t.search,
                 "seeded_from": t.seeded_from, "shortcut_loss": t.shortcut_loss,
                 "seconds": {"screen": round(t.screen_s, 3), "bench": round(t.bench_s, 3),
                             "total": round(t.total_s, 3)},
                 "measurements": [{"config": m.config, "median_ms": m.median_ms, "p20_ms": m.p20_ms,
                                   "p80_ms": m.p80_ms, "method": m.method, "final": m.final} for m in meas]}
            if cert is not None:
                h["certificate"] = {
                    "config": cert.config, "median_ms": cert.median_ms, "spread_ms": [cert.p20_ms, cert.p80_ms],
                    "runner_up": cert.runner_up, "runner_up_ms": cert.runner_up_ms, "margin": cert.margin,
                    "screens": json.loads(cert.screens), "unscreened": cert.unscreened,
                    "timing_method": cert.timing_method, "current": cert.superseded_at is None,
                    "search": cert.search, "recertified_from": cert.recertified_from,
                    "search_detail": cert.search_detail,
                    "sampled_regret": json.loads(cert.sampled_regret) if cert.sampled_regret else None,
                    "superseded_reason": cert.superseded_reason,
                    "torch_baselines": [{**baseline_dict(b), "torch_faster": defers(b.nbx_ms, b.torch_ms)}
                                        for b in store.baselines_of([cert.id]).get(cert.id, ())]}
            history.append(h)
        refusals = [{"tuning": t.id, "config": r.config, "reason": r.reason, "detail": r.detail,
                     **_judged(r)} for r, _, t in store.refusals(seat_id=seat.id)]
        from nbx_tune.tuner.search.ranked import regret_summary

        return {"seat": view.to_dict(), "history": history, "refusals": refusals,
                "sampled_regret": regret_summary(store.shortcut_losses(seat.profile, seat.kernel))}
    finally:
        store.close()


def refusal_rows(db=None, kernel=None, reason=None, profile=None, limit=None, with_total=False):
    """Refusals, newest first; with_total: (rows, how many match in all)."""
    from nbx_tune.tuner.store.export import iso_utc

    if reason and reason not in REFUSAL_REASONS:
        raise NbxError(f"unknown reason {reason!r}; known: {', '.join(REFUSAL_REASONS)}")
    prof_name = get_profile(profile).name if profile else None
    store = _existing_store(db, required=True)
    try:
        rows = [{"id": r.id, "seat": seat.id, "profile": seat.profile,
                 "label": seat.label,
                 "config": r.config, "reason": r.reason, "detail": r.detail, **_judged(r), "tuning": t.id,
                 "triton_version": t.triton_version, "kernel_source_hash": t.kernel_source_hash,
                 "device": t.device_name, "at": iso_utc(r.created_at)}
                for r, seat, t in store.refusals(kernel=kernel, reason=reason, profile=prof_name, limit=limit)]
        if not with_total:
            return rows
        total = len(rows) if not limit or len(rows) < limit else store.count_refusals(kernel, reason, prof_name)
        return rows, total
    finally:
        store.close()


def _judged(r) -> dict:
    """Where a refusal was judged, as fields: the shape, the measured error, the tolerance."""
    return {"problem": json.loads(r.problem) if r.problem else None, "err": r.err, "rtol": r.rtol}


def report(model=None, db=None, profile=None, plugins=()) -> dict:
    """`nbx-tune report`'s data (tuner/report/data.py): of the trace `model` if given, else
    of every seat of the profile (--profile, else the last census run's). A database with
    no census gives the data of an empty report, which the page says."""
    load_plugins(plugins)
    import torch
    import triton

    from nbx_tune.kernels.runtime.registry import all_specs
    from nbx_tune.tuner.census.census import find_existing, load_plan, report_lines
    from nbx_tune.tuner.report.data import gather

    with _existing_store(db, required=True) as store:
        runs = store.census_runs(limit=1)
        prof = get_profile(profile) if profile else (get_profile(runs[0][0].profile) if runs else None)
        plan = lines = None
        if model is not None:
            if prof is None:  # nothing to plan against: the trace is still checked
                from nbx_tune.kernels.trace import read_trace

                read_trace(model)
            else:
                plan = load_plan(model, prof)
                lines = report_lines(store, plan, find_existing(store, plan))
        return gather(store, prof, all_specs(), plan, lines,
                      {"triton_version": triton.__version__, "torch_version": torch.__version__})


def write_report(data: dict, out: str) -> str:
    """The report page (tuner/report/page.py) written whole to `out`; its path."""
    from pathlib import Path

    from nbx_tune.files import write_atomic
    from nbx_tune.tuner.report.page import render

    path = Path(out)
    write_atomic(path, render(data), NbxError)
    return str(path)


def export(profile: str | None, out: str, db=None, plugins=()):
    """Without `profile`, or with one the database holds no seat of, a one-line error naming
    the profiles it holds (an empty table used to be written, exit 0)."""
    from nbx_tune.tuner.store.export import export_table, profiles_held

    load_plugins(plugins)
    prof = get_profile(profile) if profile is not None else None
    with _existing_store(db, required=True) as store:
        held = profiles_held(store)
        if prof is None or prof.name not in held:
            has = ", ".join(f"{n} ({k} seats)" for n, k in held.items()) or "no seat of any profile"
            try_ = f"; nbx-tune export --profile {next(iter(held))} -o {out}" if held else ""
            raise NbxError((f"export: which profile? database {store.url} holds {has}{try_}" if prof is None else
                            f"export: database {store.url} holds no seat of profile {prof.name}, so the table "
                            f"would be empty; it holds {has}{try_}; nothing written"))
        return export_table(store, prof, out)


def import_(path: str, db=None, plugins=(), notice=None):
    ensure_device(notice)  # an entry that claims to beat the current certificate is screened here
    load_plugins(plugins)
    from nbx_tune.tuner.store.export import check_table, import_table, screen_here
    from nbx_tune.tuner.store import Store

    checked = check_table(path, known_profiles())  # a bad table fails before the database opens
    with Store(db) as store:
        return import_table(store, checked, screen_here)


def baseline(models, db=None, profile=None, plugins=(), budget_s=None, on_seat=None, notice=None):
    """Each certified seat of the traces against torch's op on this device, recorded as the
    seats' torch baselines (tuner/timing/torch_baselines.py)."""
    ensure_device(notice)
    load_plugins(plugins)
    from nbx_tune.tuner.timing.torch_baselines import measure
    from nbx_tune.kernels.trace import read_trace

    prof = resolve_profile(profile, for_tuning=True)  # timed here: this device's profile
    rows = [row for m in models for row in read_trace(m).rows]  # a bad trace fails before the database
    with _existing_store(db, required=True) as store:
        return measure(rows, store, prof, device_info(), on_seat, budget_s)


def db_upgrade(db=None) -> tuple:
    """(the URL as it may be printed, revision before, revision after)."""
    from nbx_tune import settings
    from nbx_tune.tuner.store.db import make_engine, safe_url, upgrade

    url = settings.db_url(db)
    engine = make_engine(url)
    try:
        return (safe_url(url), *upgrade(engine))
    finally:
        engine.dispose()


def trace(output, argv: list[str]):
    """Record a program's aten ops into a trace file (tuner/trace/recorder.py)."""
    from nbx_tune.tuner.trace.recorder import trace_command

    return trace_command(output, argv)


def run_program(argv: list[str], stats_json=None, want_stats: bool = False) -> tuple:
    """`nbx-tune run`: a program under serve() (tuner/trace/serve_main.py). (its exit status, its
    per-op stats when `want_stats` or `stats_json`: None if it died before writing them)."""
    import tempfile
    from pathlib import Path

    from nbx_tune.tuner.trace.serve_main import run_command

    if not (want_stats or stats_json):
        return run_command(list(argv)), None
    with tempfile.TemporaryDirectory() as d:
        path = Path(stats_json) if stats_json else Path(d) / "stats.json"
        rc = run_command(list(argv), path)
        try:
            return rc, json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return rc, None


def run_fleet(gpus: list[str], command: list[str]) -> None:
    """Start `command` once per GPU id, each seeing only its GPU, and wait for all."""
    from nbx_tune.tuner.fleet.workers import spawn_workers, wait_workers

    wait_workers(spawn_workers(gpus, command))


def db_current(db=None) -> dict:
    from nbx_tune import settings
    from nbx_tune.tuner.store.db import current_revision, head_revision, make_engine, safe_url

    url = settings.db_url(db)
    _missing_sqlite(url, raise_it=True)
    engine = make_engine(url)
    try:
        return {"url": safe_url(url), "revision": current_revision(engine), "head": head_revision()}
    except Exception as e:
        from sqlalchemy.exc import DatabaseError

        if isinstance(e, DatabaseError):
            raise NbxError(f"cannot open database {safe_url(url)}: {str(e.orig).splitlines()[0]}") from None
        raise
    finally:
        engine.dispose()


def _missing_sqlite(url: str, raise_it: bool = False) -> bool:
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else None
    if path is None or path == ":memory:" or path.startswith("file:") or os.path.exists(path):
        return False
    if raise_it:
        raise StoreError(f"no database at {path} (a mistyped --db? a census creates one)")
    return True


# Inductor's certified template choices: `nbx-tune inductor ...` (their own module).
from nbx_tune.tuner.inductor.commands import (inductor_certify, inductor_export, inductor_import,  # noqa: E402,F401
                                              inductor_list, inductor_show)

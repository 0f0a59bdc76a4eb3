"""Export a profile's certified configs as a certified table, and import tables made
elsewhere.

Export writes only certificates that hold for this code (kernel source, config space and
profile hashes); the Triton version and device travel as provenance and are judged by the
reader. The file is written whole or not at all.

Import merges a table into the database in one transaction: never across architectures,
never a stale entry, and between two certificates of one seat the faster is current and
the other is recorded as superseded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import func, insert, select, update

from nbx_tune.errors import NbxError, TableError
from nbx_tune.kernels.runtime import torch_rule as baseline, table_format, table_schema, validity
from nbx_tune.kernels.runtime.registry import all_specs
from nbx_tune.kernels.spec import Problem, label_of
from nbx_tune.tuner.certify import provenance
from nbx_tune.files import write_atomic
from nbx_tune.tuner.store.seat_check import SeatChecker
from nbx_tune.tuner.store.models import Baseline, Certificate, Seat, Tuning, utcnow
from nbx_tune.tuner.store import insert_ignore_many
from nbx_tune.tuner.search.ranked import regret_summary
from nbx_tune.tuner.search.searches import SEARCHES


def baseline_dict(b: Baseline) -> dict:
    """A baseline as a table carries it (kernels/baseline.KEYS)."""
    return {"device_name": b.device_name, "torch_version": b.torch_version, "nbx_ms": b.nbx_ms,
            "torch_ms": b.torch_ms, "method": b.method, "measured_at": iso_utc(b.measured_at)}


def newest_baselines(found) -> list[dict]:
    """The newest baseline per GPU and torch minor version, as table dicts (what a reader
    would apply: kernels/baseline.applicable)."""
    newest = {}
    for b in sorted(found, key=lambda b: b["measured_at"]):
        newest[(b["device_name"], baseline.torch_minor(b["torch_version"]))] = b
    return [newest[k] for k in sorted(newest)]


def _entry(seat: Seat, cert: Certificate, t: Tuning, regret: dict | None = None,
           baselines=()) -> dict:
    prov = {k: getattr(t, k) for k in provenance.FIELDS}
    prov["certified_at"] = iso_utc(cert.created_at)
    # How the winner was found, and the kernel's sampled regret (tuner/search/ranked.py):
    # optional provenance keys, which readers of format 1 pass over. An imported
    # certificate carries the regret of the database that made it; others this one's.
    prov["search"] = cert.search
    if cert.recertified_from:
        prov["recertified_from"] = cert.recertified_from
    if cert.search_detail:
        prov["search_detail"] = cert.search_detail
    regret = json.loads(cert.sampled_regret) if cert.sampled_regret else regret
    if regret:
        prov["sampled_regret"] = regret
    if baselines:
        prov["torch_baselines"] = newest_baselines(baseline_dict(b) for b in baselines)
    return {
        "kernel": seat.kernel, "dtypes": seat.dtypes, "flags": seat.flags, "bucket": seat.bucket,
        "config": cert.config, "median_ms": cert.median_ms, "spread_ms": [cert.p20_ms, cert.p80_ms],
        "runner_up": cert.runner_up, "runner_up_ms": cert.runner_up_ms, "margin": cert.margin,
        "screens": json.loads(cert.screens), "unscreened": cert.unscreened,
        # objects, not JSON text inside JSON
        "screened_min": json.loads(cert.screened_min) if cert.screened_min else None,
        "screened_max": json.loads(cert.screened_max) if cert.screened_max else None,
        "timing_method": cert.timing_method, "provenance": prov,
    }


def iso_utc(dt: datetime) -> str:
    """SQLite hands datetimes back without their zone; they were written in UTC."""
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).astimezone(timezone.utc).isoformat()


def _code_stale(prov, spec, profile) -> str | None:
    """Stale for this code wherever it runs: Triton's version and the running device are
    the reader's to judge (the rule: kernels/runtime/validity.py)."""
    return validity.stale_reason(prov, spec, profile)


@dataclass
class ExportSummary:
    path: str
    entries: int
    skipped: list = field(default_factory=list)  # (seat label, why)


def profiles_held(store) -> dict:
    """The profiles the database holds seats of, with how many, the most first."""
    with store.session(write=False) as s:
        rows = s.execute(select(Seat.profile, func.count()).group_by(Seat.profile)).all()
    return dict(sorted(rows, key=lambda r: (-r[1], r[0])))


def export_table(store, profile, out: str | Path) -> ExportSummary:
    specs = all_specs()
    entries, skipped = [], []
    with store.session(write=False) as s:
        rows = s.execute(select(Seat, Certificate, Tuning)
                         .join(Certificate, Certificate.seat_id == Seat.id)
                         .join(Tuning, Tuning.id == Certificate.tuning_id)
                         .where(Seat.profile == profile.name, Certificate.superseded_at.is_(None))).all()
    regrets = {k: regret_summary(store.shortcut_losses(profile.name, k)) for k in {r[0].kernel for r in rows}}
    baselines = store.baselines_of(cert.id for _, cert, _ in rows)
    for seat, cert, t in rows:
        e = _entry(seat, cert, t, regrets[seat.kernel], baselines.get(cert.id, ()))
        why = _code_stale(e["provenance"], specs.get(seat.kernel), profile)
        if why:
            skipped.append((seat.label, why))
            continue
        entries.append(e)
    text = table_format.dumps(profile.name, profile.architecture, profile.hash, entries)
    write_atomic(Path(out), text, NbxError)
    return ExportSummary(str(out), len(entries), skipped)


def _search_of(prov: dict) -> dict:
    """The optional provenance keys of how a winner was found, as certificate columns
    (`sampled_regret` was checked by `check_table`)."""
    search = prov.get("search")
    frm = prov.get("recertified_from")
    detail = prov.get("search_detail")
    regret = prov.get("sampled_regret")
    return {"search": search if search in SEARCHES else "full",
            "recertified_from": frm if isinstance(frm, str) else None,
            "search_detail": detail if isinstance(detail, str) else None,
            "sampled_regret": json.dumps(regret, sort_keys=True) if regret else None}


def regret_problem(r) -> str | None:
    """Why a provenance's `sampled_regret` is malformed, or None (absent counts as fine)."""
    if r is None:
        return None
    if not isinstance(r, dict) or set(r) != {"audits", "median", "max"}:
        return 'expected {"audits", "median", "max"}'
    if not isinstance(r["audits"], int) or isinstance(r["audits"], bool) or r["audits"] < 1:
        return "audits: expected a count of at least 1"
    for k in ("median", "max"):
        if not table_schema.nonnegative(r[k]):
            return f"{k}: expected a loss >= 0"
    return None


@dataclass
class ImportSummary:
    path: str
    profile: str
    added: int = 0  # became the seat's current certificate
    kept_existing: int = 0  # the seat's current certificate was faster; the import is recorded
    unchanged: int = 0  # the same certificate is current already: nothing recorded but new baselines
    baselines: int = 0  # torch baselines recorded with the certificates they measured
    unscreened: list = field(default_factory=list)  # (seat label, why): claimed faster, not screened here
    skipped: list = field(default_factory=list)  # (seat label, why)


@dataclass
class CheckedTable:
    path: str
    profile: object
    usable: list
    skipped: list


def check_table(path: str | Path, profiles: dict) -> CheckedTable:
    """Everything an import checks before it opens the database."""
    doc = table_format.read(path)
    name = doc["profile"]
    profile = profiles.get(name)
    if profile is None:
        raise TableError(f"{path}: profile {name!r} is not known here (nbx-tune profiles list)")
    if doc["architecture"] != profile.architecture:
        raise TableError(f"{path}: a table for architecture {doc['architecture']!r}, but profile "
                         f"{name} here is {profile.architecture!r}")
    specs = all_specs()
    usable, skipped, spaces = [], [], {}
    seats = SeatChecker(profile)  # a seat this build can key and screen, or the table is refused
    for i, e in enumerate(doc["entries"]):
        label = label_of(e["kernel"], e["dtypes"], e["flags"], e["bucket"])
        prov = e["provenance"]
        bad = regret_problem(prov.get("sampled_regret"))
        if bad:
            raise TableError(f"{path}: entries[{i}].provenance.sampled_regret: {bad}")
        if not validity.claims(profile, prov["device_target"]):
            raise TableError(f"{path}: entries[{i}]: made on device {prov['device_target']}, which profile "
                             f"{name} does not claim (a table for another architecture?)")
        why = _code_stale(prov, specs.get(e["kernel"]), profile)
        if why:
            skipped.append((label, f"stale: {why}"))
            continue
        if e["kernel"] not in spaces:
            spaces[e["kernel"]] = validity.config_index(specs[e["kernel"]])
        try:
            config = validity.declared_config(spaces[e["kernel"]], e["config"])
        except ValueError as err:
            raise TableError(f"{path}: entries[{i}].config: {err}") from None
        bad = seats.issue(specs[e["kernel"]], e, config)
        if bad:
            raise TableError(f"{path}: entries[{i}].{bad}")
        usable.append(e)
    return CheckedTable(str(path), profile, usable, skipped)


def import_table(store, checked: CheckedTable, screen=None) -> ImportSummary:
    """Merge a checked table into the database in one transaction. An entry that claims to
    beat the seat's current certificate replaces it only once `screen(spec, profile,
    config, problems)` passes it at the shapes the current one was screened at (it returns
    None, or why not); without a `screen`, the current certificate is kept.

    In batches, never a query per entry: the seats are inserted in one executemany, the
    profile's seats and current certificates read in one query each, the tunings and
    certificates written by a flush each (100,000 entries took 303 s one by one)."""
    specs = all_specs()
    profile, name, path = checked.profile, checked.profile.name, checked.path
    usable = checked.usable
    summary = ImportSummary(path, name, skipped=list(checked.skipped))
    now = utcnow()
    with store.session() as s:
        insert_ignore_many(s, Seat, [{"profile": name, "kernel": e["kernel"], "dtypes": e["dtypes"],
                                      "flags": e["flags"], "bucket": e["bucket"], "created_at": now}
                                     for e in usable], ("profile", "kernel", "dtypes", "flags", "bucket"))
        seat_ids = {(k, d, f, b): i for i, k, d, f, b in s.execute(
            select(Seat.id, Seat.kernel, Seat.dtypes, Seat.flags, Seat.bucket).where(Seat.profile == name))}
        currents = {c.seat_id: (c, t) for c, t in s.execute(
            select(Certificate, Tuning).join(Tuning, Tuning.id == Certificate.tuning_id)
            .join(Seat, Seat.id == Certificate.seat_id)
            .where(Seat.profile == name, Certificate.superseded_at.is_(None)))}
        made = []  # (entry, its tuning, made at, the certificate it replaces, that one valid, why kept back)
        for e in usable:
            seat_id = seat_ids[table_format.seat_sort_key(e)]
            current, cur_tuning = currents.get(seat_id, (None, None))
            cur_valid = current is not None and _code_stale(
                {k: getattr(cur_tuning, k) for k in provenance.FIELDS}, specs.get(e["kernel"]), profile) is None
            if cur_valid and current.config == e["config"] and current.median_ms == e["median_ms"]:
                summary.unchanged += 1  # this very certificate is current already
                summary.baselines += _add_baselines(s, current, e)
                continue
            prov = e["provenance"]
            at = datetime.fromisoformat(prov["certified_at"])
            t = dict(seat_id=seat_id, kind="import", outcome="unscreened" if e["unscreened"] else "certified",
                     started_at=at, finished_at=now, worker=f"import:{Path(path).name}",
                     **{k: prov[k] for k in provenance.FIELDS},
                     candidates=0, survivors=0, screen_s=0.0, bench_s=0.0, total_s=0.0)
            why = None
            if cur_valid and current.median_ms <= e["median_ms"]:
                why = (f"import: the current certificate is faster "
                       f"({current.median_ms:.4g} ms <= {e['median_ms']:.4g} ms)")
                summary.kept_existing += 1
            elif cur_valid:  # claims to beat a valid certificate: screened here first
                problems = [Problem.from_json(x) for x in dict.fromkeys(
                    (current.screened_max, current.screened_min)) if x]
                not_screened = ("it cannot be screened in this process" if screen is None else
                                screen(specs[e["kernel"]], profile, e["config"], problems))
                if not_screened:
                    why = f"import: claims to be faster but did not pass the screen here: {not_screened}"
                    summary.unscreened.append((label_of(e["kernel"], e["dtypes"], e["flags"], e["bucket"]),
                                               not_screened))
            made.append((e, t, at, current if why is None else None, cur_valid, why))
        tuning_ids = _insert_ids(s, Tuning, [t for _, t, *_ in made])
        tuned = sorted({t["seat_id"] for _, t, *_ in made})
        for i in range(0, len(tuned), 5000):  # tuned now: out of the workers' claim (Store.claim_untuned)
            s.execute(update(Seat).where(Seat.id.in_(tuned[i:i + 5000]), ~Seat.tuned).values(tuned=True))
        for e, t, at, replaced, cur_valid, why in made:
            if replaced is not None:
                replaced.superseded_at = now
                replaced.superseded_reason = (f"import from {Path(path).name}: "
                                              + ("faster, and screened here" if cur_valid else
                                                 "replaces a stale certificate"))
        s.flush()  # superseded before their successors are added: one current certificate per seat
        rows = []
        for (e, t, at, replaced, cur_valid, why), tuning_id in zip(made, tuning_ids):
            prov = e["provenance"]
            rows.append(dict(seat_id=t["seat_id"], tuning_id=tuning_id, config=e["config"],
                             median_ms=e["median_ms"], p20_ms=e["spread_ms"][0], p80_ms=e["spread_ms"][1],
                             runner_up=e["runner_up"], runner_up_ms=e["runner_up_ms"], margin=e["margin"],
                             screens=json.dumps(e["screens"], sort_keys=True),
                             screened_min=table_format.problem_text(e["screened_min"]),
                             screened_max=table_format.problem_text(e["screened_max"]),
                             unscreened=e["unscreened"], timing_method=e["timing_method"], created_at=at,
                             superseded_at=now if why else None, superseded_reason=why, **_search_of(prov)))
            summary.added += why is None
        cert_ids = _insert_ids(s, Certificate, rows)
        for (e, *_, why), cert_id in zip(made, cert_ids):
            if e["provenance"].get("torch_baselines"):  # kept with the certificate they measured
                n = _add_baselines(s, s.get(Certificate, cert_id), e, new=True)
                summary.baselines += 0 if why else n
    return summary


def _insert_ids(s, model, rows: list[dict], chunk: int = 5000) -> list[int]:
    """Insert `rows` (each of another seat) as one executemany per chunk; their ids in the
    rows' order, read back by seat (RETURNING with the rows' order runs a statement a row
    on SQLite)."""
    for i in range(0, len(rows), chunk):
        s.execute(insert(model), rows[i:i + chunk])
    seats = [r["seat_id"] for r in rows]
    ids = {}
    mark = model.tuning_id if model is Certificate else model.finished_at
    for i in range(0, len(seats), 500):  # under every backend's limit on bound parameters
        part = seats[i:i + 500]
        ids.update(s.execute(select(model.seat_id, func.max(model.id)).where(
            model.seat_id.in_(part), mark.in_({r[mark.key] for r in rows[i:i + 500]}))
            .group_by(model.seat_id)).all())
    return [ids[k] for k in seats]


def _add_baselines(s, cert: Certificate, e: dict, new: bool = False) -> int:
    """The entry's torch baselines recorded against `cert` (the certificate of the very
    config they measured), each once; returns how many were new. A `new` certificate has
    none yet: nothing to read."""
    if not e["provenance"].get("torch_baselines"):
        return 0
    have = set() if new else {(b.device_name, b.torch_version, iso_utc(b.measured_at))
                              for b in s.scalars(select(Baseline).where(Baseline.certificate_id == cert.id))}
    added = 0
    for b in e["provenance"].get("torch_baselines") or ():
        at = datetime.fromisoformat(b["measured_at"])
        if (b["device_name"], b["torch_version"], iso_utc(at)) in have:
            continue
        s.add(Baseline(certificate_id=cert.id, device_name=b["device_name"], torch_version=b["torch_version"],
                       nbx_ms=float(b["nbx_ms"]), torch_ms=float(b["torch_ms"]), method=b["method"],
                       measured_at=at))
        added += 1
    return added


def screen_here(spec, profile, config: str, problems) -> str | None:
    """Screen an imported config against the fp64 oracle on this device, in this process
    (it is one of the kernel's declared configs: tuner/export.check_table). None if it
    passed, else why not. Only a device its profile claims can screen for it."""
    from nbx_tune.profiles import current_target
    from nbx_tune.tuner.timing.benchmarkers import for_profile
    from nbx_tune.tuner.execution.executor import CandidateRunner
    from nbx_tune.tuner.certify.tune import seat_job

    target = current_target()
    if not validity.claims(profile, target):
        return f"this device ({target}) is not one profile {profile.name} claims"
    if not problems:
        return "the current certificate records no screened shape"
    job, skipped = seat_job(spec, profile, "import", problems, "cpu" if target == "interpreter" else "cuda")
    if skipped:
        return "its shapes are over the profile's screen byte budget"
    out = CandidateRunner(spec, job, for_profile(profile)).screen(validity.declared_config(
        validity.config_index(spec), config))
    return None if out.ok else f"{out.reason}: {out.detail}"

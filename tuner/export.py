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

from sqlalchemy import select

from nbx_tune.errors import NbxError, TableError
from nbx_tune.kernels import table_format
from nbx_tune.kernels.registry import all_specs
from nbx_tune.kernels.spec import label_of
from nbx_tune.tuner import provenance
from nbx_tune.tuner.files import write_atomic
from nbx_tune.tuner.store.models import Certificate, Seat, Tuning, utcnow
from nbx_tune.tuner.store import insert_ignore
from nbx_tune.tuner.strategies.ranked import regret_summary
from nbx_tune.tuner.strategies.search import SEARCHES


def _entry(seat: Seat, cert: Certificate, t: Tuning, regret: dict | None = None) -> dict:
    prov = {k: getattr(t, k) for k in provenance.FIELDS}
    prov["certified_at"] = iso_utc(cert.created_at)
    # How the winner was found, and the kernel's sampled regret (tuner/strategies/ranked.py):
    # optional provenance keys, which readers of format 1 pass over.
    prov["search"] = cert.search
    if cert.recertified_from:
        prov["recertified_from"] = cert.recertified_from
    if regret:
        prov["sampled_regret"] = regret
    return {
        "kernel": seat.kernel, "dtypes": seat.dtypes, "flags": seat.flags, "bucket": seat.bucket,
        "config": cert.config, "median_ms": cert.median_ms, "spread_ms": [cert.p20_ms, cert.p80_ms],
        "runner_up": cert.runner_up, "runner_up_ms": cert.runner_up_ms, "margin": cert.margin,
        "screens": json.loads(cert.screens), "screened_min": cert.screened_min,
        "screened_max": cert.screened_max, "unscreened": cert.unscreened,
        "timing_method": cert.timing_method, "provenance": prov,
    }


def iso_utc(dt: datetime) -> str:
    """SQLite hands datetimes back without their zone; they were written in UTC."""
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).astimezone(timezone.utc).isoformat()


def _code_stale(prov, spec, profile) -> str | None:
    """Stale for this code regardless of where it runs (Triton and device are the reader's)."""
    if spec is None:
        return "kernel not registered"
    for key, now in (("kernel_source_hash", spec.source_hash), ("config_space_hash", spec.config_space_hash),
                     ("profile_hash", profile.hash)):
        if prov[key] != now:
            return f"{key} {prov[key]} != {now}"
    return None


@dataclass
class ExportSummary:
    path: str
    entries: int
    skipped: list = field(default_factory=list)  # (seat label, why)


def export_table(store, profile, out: str | Path) -> ExportSummary:
    specs = all_specs()
    entries, skipped = [], []
    with store.session() as s:
        rows = s.execute(select(Seat, Certificate, Tuning)
                         .join(Certificate, Certificate.seat_id == Seat.id)
                         .join(Tuning, Tuning.id == Certificate.tuning_id)
                         .where(Seat.profile == profile.name, Certificate.superseded_at.is_(None))).all()
    regrets = {k: regret_summary(store.shortcut_losses(profile.name, k)) for k in {r[0].kernel for r in rows}}
    for seat, cert, t in rows:
        e = _entry(seat, cert, t, regrets[seat.kernel])
        why = _code_stale(e["provenance"], specs.get(seat.kernel), profile)
        if why:
            skipped.append((seat.label, why))
            continue
        entries.append(e)
    text = table_format.dumps(profile.name, profile.architecture, profile.hash, entries)
    write_atomic(Path(out), text, NbxError)
    return ExportSummary(str(out), len(entries), skipped)


def _search_of(prov: dict) -> dict:
    """The optional provenance keys of how a winner was found, as certificate columns."""
    search = prov.get("search")
    frm = prov.get("recertified_from")
    return {"search": search if search in SEARCHES else "full",
            "recertified_from": frm if isinstance(frm, str) else None}


@dataclass
class ImportSummary:
    path: str
    profile: str
    added: int = 0  # became the seat's current certificate
    kept_existing: int = 0  # the seat's current certificate was faster; the import is recorded
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
    usable, skipped = [], []
    for i, e in enumerate(doc["entries"]):
        label = label_of(e["kernel"], e["dtypes"], e["flags"], e["bucket"])
        prov = e["provenance"]
        if not any(prov["device_target"].startswith(p) for p in profile.compute_capability_matches):
            raise TableError(f"{path}: entries[{i}]: made on device {prov['device_target']}, which profile "
                             f"{name} does not claim (a table for another architecture?)")
        why = _code_stale(prov, specs.get(e["kernel"]), profile)
        if why:
            skipped.append((label, f"stale: {why}"))
            continue
        usable.append(e)
    return CheckedTable(str(path), profile, usable, skipped)


def import_table(store, checked: CheckedTable) -> ImportSummary:
    """Merge a checked table into the database in one transaction."""
    specs = all_specs()
    profile, name, path = checked.profile, checked.profile.name, checked.path
    usable = checked.usable
    summary = ImportSummary(path, name, skipped=list(checked.skipped))
    now = utcnow()
    with store.session() as s:
        for e in usable:
            insert_ignore(s, Seat, {"profile": name, "kernel": e["kernel"], "dtypes": e["dtypes"],
                                     "flags": e["flags"], "bucket": e["bucket"], "created_at": now},
                           ("profile", "kernel", "dtypes", "flags", "bucket"))
            seat = s.scalars(select(Seat).where(Seat.profile == name, Seat.kernel == e["kernel"],
                                                Seat.dtypes == e["dtypes"], Seat.flags == e["flags"],
                                                Seat.bucket == e["bucket"])).one()
            prov = e["provenance"]
            made = datetime.fromisoformat(prov["certified_at"])
            t = Tuning(seat_id=seat.id, kind="import", outcome="unscreened" if e["unscreened"] else "certified",
                       started_at=made, finished_at=now, worker=f"import:{Path(path).name}",
                       **{k: prov[k] for k in provenance.FIELDS},
                       candidates=0, survivors=0, screen_s=0.0, bench_s=0.0, total_s=0.0)
            s.add(t)
            s.flush()
            cert = Certificate(seat_id=seat.id, tuning_id=t.id, config=e["config"], median_ms=e["median_ms"],
                               p20_ms=e["spread_ms"][0], p80_ms=e["spread_ms"][1], runner_up=e["runner_up"],
                               runner_up_ms=e["runner_up_ms"], margin=e["margin"],
                               screens=json.dumps(e["screens"], sort_keys=True),
                               screened_min=e["screened_min"], screened_max=e["screened_max"],
                               unscreened=e["unscreened"], timing_method=e["timing_method"], created_at=made,
                               **_search_of(prov))
            current = s.scalar(select(Certificate).where(Certificate.seat_id == seat.id,
                                                         Certificate.superseded_at.is_(None)))
            if current is not None:
                cur_t = s.get(Tuning, current.tuning_id)
                cur_valid = _code_stale({k: getattr(cur_t, k) for k in provenance.FIELDS},
                                        specs.get(e["kernel"]), profile) is None
                if cur_valid and current.median_ms <= e["median_ms"]:
                    cert.superseded_at = now
                    cert.superseded_reason = (f"import: the current certificate is faster "
                                              f"({current.median_ms:.4g} ms <= {e['median_ms']:.4g} ms)")
                    s.add(cert)
                    summary.kept_existing += 1
                    continue
                current.superseded_at = now
                current.superseded_reason = (f"import from {Path(path).name}: "
                                             + ("faster" if cur_valid else "replaces a stale certificate"))
                s.flush()
            s.add(cert)
            summary.added += 1
    return summary

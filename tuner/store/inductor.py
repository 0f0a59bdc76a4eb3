"""The database's side of Inductor's certified template choices (migration 0009): a GEMM
lookup key's certifications with their refusals, the current choice, export to the shipped
table format (kernels/serving/inductor_table.py) and import from it.

A record, what `write` takes, is a table entry (`inductor_table` format) whose `config` may be
None: a certification where no config passed, kept for its refusals. Between the current
choice of a (profile, key) and a new one:
- a config refused by a newer certification, or one under the same versions, is not kept current;
- made under other versions (torch major.minor, Triton, GPU: `inductor_table.stale_reason`),
  the newer measurement wins: the times are not comparable;
- under the same, the faster wins (the census's rule for an imported certificate);
the other is kept, superseded, with why. Each write is one transaction, read back before it
is reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from nbx_tune.errors import NbxError, StoreError
from nbx_tune.kernels.serving import inductor_table
from nbx_tune.tuner.store.export import iso_utc
from nbx_tune.tuner.store.models import InductorCertification, InductorChoice, InductorRefusal, utcnow

KINDS = ("certify", "import")


@dataclass
class Written:
    certification_id: int
    key: str
    outcome: str  # chosen | refused (no config passed) | unchanged (an import of the current choice, again)
    current: bool  # this certification's config is the one served now
    why: str


def config_text(config: dict) -> str:
    """A config as the database holds it: canonical JSON, so equal configs are equal text."""
    return json.dumps(config, sort_keys=True)


def _aware(dt: datetime) -> datetime:
    """In UTC with its zone (SQLite hands datetimes back without theirs; they were written in UTC)."""
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def _utc(text: str) -> datetime:
    return _aware(datetime.fromisoformat(text))


def _check(rec: dict, where: str) -> None:
    """A record is an entry (checked by the format's own rule), or one whose config is None."""
    probe = rec if rec.get("config") is not None else {
        **rec, "config": {"template_id": "-"},
        "provenance": {**(rec.get("provenance") or {}), "max_rel_err": 0.0, "ms": 0.0}}
    why = inductor_table.entry_problem(probe)
    if why:
        raise NbxError(f"{where}: {why}")


def write(store, profile: str, records: list[dict], kind: str = "certify", where: str = "inductor records") -> list[Written]:
    """Record certifications (one per record) in one transaction; what each changed, read back.
    A bad record is one line naming `where` and its index, before anything is written."""
    if kind not in KINDS:
        raise ValueError(kind)
    for i, rec in enumerate(records):  # all checked before the database is touched
        _check(rec, f"{where}[{i}]")
    for attempt in range(3):
        try:
            with store.session() as s:
                out = [_write(s, profile, rec, kind) for rec in records]
            break
        except IntegrityError:  # another writer made a key's first choice meanwhile: judged against it now
            if attempt == 2:
                raise
    _read_back(store, profile, out)
    return out


def _write(s, profile: str, rec: dict, kind: str) -> Written:
    prov, config = rec["provenance"], rec.get("config")
    current = s.scalar(select(InductorChoice).where(InductorChoice.profile == profile, InductorChoice.key == rec["key"],
                                                    InductorChoice.superseded_at.is_(None)).with_for_update())
    cur_cert = s.get(InductorCertification, current.certification_id) if current is not None else None
    measured = _utc(prov["measured_at"])
    if (kind == "import" and current is not None and config is not None and current.config == config_text(config)
            and current.ms == prov["ms"] and _aware(cur_cert.measured_at) == measured):
        return Written(cur_cert.id, rec["key"], "unchanged", True, "this choice is already current")
    g = rec.get("gemm") or {}
    cert = InductorCertification(
        profile=profile, key=rec["key"], op=rec["op"], dtype=g.get("dtype"),
        dims=json.dumps(g["dims"]) if g.get("dims") else None, layout=g.get("layout"), kind=kind,
        outcome="chosen" if config is not None else "refused", candidates=prov.get("candidates"),
        aten_ms=prov.get("aten_ms"), torch_version=prov["torch_version"], triton_version=prov["triton_version"],
        device_name=prov["device_name"], driver=prov.get("driver"), measured_at=measured, created_at=utcnow())
    s.add(cert)
    s.flush()
    refused = {}
    for r in prov.get("refusals", []):
        s.add(InductorRefusal(certification_id=cert.id, config=config_text(r["config"]), reason=r["reason"]))
        refused.setdefault(config_text(r["config"]), r["reason"])
    why_old = why_new = None  # why the current choice gives way; why the new one does not
    if current is not None:
        other = inductor_table.stale_reason(_provenance(cur_cert, current), prov["torch_version"],
                                            prov["triton_version"], prov["device_name"])
        newer = measured >= _aware(cur_cert.measured_at)
        if current.config in refused and (newer or not other):  # an older screen elsewhere says nothing here
            why_old = f"refused by certification {cert.id}: {refused[current.config]}"
        elif config is not None and other:
            if newer:
                why_old = f"certification {cert.id} is newer and {other}"
            else:
                why_new = f"the current choice (certification {cur_cert.id}) is newer and {other}"
        elif config is not None:
            if prov["ms"] < current.ms:
                why_old = f"certification {cert.id} is faster: {prov['ms']:.4g} ms against {current.ms:.4g}"
            else:
                why_new = (f"the current choice (certification {cur_cert.id}) is as fast or faster: "
                           f"{current.ms:.4g} ms against {prov['ms']:.4g}")
    if why_old is not None:
        current.superseded_at, current.superseded_reason = utcnow(), why_old
        s.flush()  # the partial unique index allows one current choice
    if config is None:
        return Written(cert.id, rec["key"], "refused", False,
                       "no config passed" + (f"; the current choice gave way: {why_old}" if why_old else
                                             "; the current choice stands" if current is not None else ""))
    new = InductorChoice(certification_id=cert.id, profile=profile, key=rec["key"], config=config_text(config),
                         ms=prov["ms"], max_rel_err=prov["max_rel_err"], runner_up_ms=prov.get("runner_up_ms"),
                         created_at=utcnow())
    if why_new is not None:
        new.superseded_at, new.superseded_reason = utcnow(), why_new
    s.add(new)
    s.flush()
    return Written(cert.id, rec["key"], "chosen", why_new is None, why_new or why_old or "the first choice of this key")


def _read_back(store, profile: str, written: list[Written]) -> None:
    """Every certification written is there, and the current choice of each key is what was
    reported (a write never reports what a reader would not find)."""
    with store.session(write=False) as s:
        for w in written:
            if s.get(InductorCertification, w.certification_id) is None:
                raise StoreError(f"database {store.url}: certification {w.certification_id} of {w.key} "
                                 "was not read back after its commit")
            now = s.scalar(select(InductorChoice.certification_id).where(
                InductorChoice.profile == profile, InductorChoice.key == w.key, InductorChoice.superseded_at.is_(None)))
            if w.current and now != w.certification_id:
                raise StoreError(f"database {store.url}: the choice of {w.key} written as current "
                                 f"(certification {w.certification_id}) is not what a reader finds ({now})")


# ----------------------------------------------------------------------------- reads


def _provenance(cert: InductorCertification, choice: InductorChoice | None, refusals=()) -> dict:
    prov = {"torch_version": cert.torch_version, "triton_version": cert.triton_version,
            "device_name": cert.device_name, "driver": cert.driver, "aten_ms": cert.aten_ms,
            "candidates": cert.candidates, "measured_at": iso_utc(cert.measured_at),
            "refusals": [{"config": json.loads(r.config), "reason": r.reason} for r in refusals]}
    if choice is not None:
        prov.update(ms=choice.ms, max_rel_err=choice.max_rel_err, runner_up_ms=choice.runner_up_ms)
    return prov


def _gemm(cert: InductorCertification) -> dict | None:
    if cert.dtype is None or cert.dims is None or cert.layout is None:
        return None
    return {"dtype": cert.dtype, "dims": json.loads(cert.dims), "layout": cert.layout}


def _entry(cert, choice, refusals) -> dict:
    e = {"key": cert.key, "op": cert.op, "config": json.loads(choice.config) if choice is not None else None,
         "provenance": _provenance(cert, choice, refusals)}
    g = _gemm(cert)
    return {**e, "gemm": g} if g else e


def _refusals_of(s, ids) -> dict[int, list]:
    out: dict[int, list] = {}
    ids = list(ids)
    for i in range(0, len(ids), 5000):
        for r in s.scalars(select(InductorRefusal).where(InductorRefusal.certification_id.in_(ids[i:i + 5000]))
                           .order_by(InductorRefusal.id)):
            out.setdefault(r.certification_id, []).append(r)
    return out


def current_entries(store, profile: str | None = None) -> list[tuple[str, int, dict]]:
    """(profile, certification id, entry) of each current choice, stale or not (the caller
    judges: `stale`), in the table's order (op, key)."""
    with store.session(write=False) as s:
        q = (select(InductorChoice, InductorCertification)
             .join(InductorCertification, InductorCertification.id == InductorChoice.certification_id)
             .where(InductorChoice.superseded_at.is_(None)))
        if profile is not None:
            q = q.where(InductorChoice.profile == profile)
        rows = s.execute(q).all()
        refusals = _refusals_of(s, [c.id for _, c in rows])
        out = [(choice.profile, cert.id, _entry(cert, choice, refusals.get(cert.id, ()))) for choice, cert in rows]
    return sorted(out, key=lambda r: (r[0], r[2]["op"], r[2]["key"]))


def stale(entry: dict, here: tuple) -> str | None:
    """Why an entry does not hold under `here` (torch, Triton, GPU name or None): the table's rule."""
    return inductor_table.stale_reason(entry["provenance"], *here)


def history(store, ref: str, profile: str | None = None) -> list[dict]:
    """Every certification of a lookup key (or of the key of certification `ref`, an id),
    oldest first: the entry it made (config None where none passed), its kind, whether its
    choice is current, and why it was superseded."""
    with store.session(write=False) as s:
        if ref.isdigit():
            found = s.get(InductorCertification, int(ref)) if int(ref) < 2 ** 63 else None
            if found is None:
                raise NbxError(f"inductor: no certification {ref} in database {store.url}")
            key, profile = found.key, found.profile
        else:
            key = ref
        q = select(InductorCertification).where(InductorCertification.key == key)
        if profile is not None:
            q = q.where(InductorCertification.profile == profile)
        certs = s.scalars(q.order_by(InductorCertification.id)).all()
        if not certs:
            raise NbxError(f"inductor: no choice for key {ref!r}{f' on profile {profile}' if profile else ''} in "
                           f"database {store.url} (`nbx-tune inductor list` shows the keys)")
        profiles = sorted({c.profile for c in certs})
        if len(profiles) > 1:
            raise NbxError(f"inductor: key {ref!r} has choices for profiles {', '.join(profiles)}: pass --profile")
        choices = {c.certification_id: c for c in s.scalars(select(InductorChoice).where(
            InductorChoice.certification_id.in_([c.id for c in certs])))}
        refusals = _refusals_of(s, [c.id for c in certs])
        out = []
        for c in certs:
            choice = choices.get(c.id)
            out.append({"certification": c.id, "profile": c.profile, "kind": c.kind, "outcome": c.outcome,
                        "created_at": iso_utc(c.created_at), "current": choice is not None and choice.superseded_at is None,
                        "superseded_reason": choice.superseded_reason if choice is not None else None,
                        "entry": _entry(c, choice, refusals.get(c.id, ()))})
        return out


def profiles_held(store) -> dict[str, int]:
    """Profiles with current choices, with how many, the most first."""
    with store.session(write=False) as s:
        rows = s.execute(select(InductorChoice.profile, func.count()).where(InductorChoice.superseded_at.is_(None))
                         .group_by(InductorChoice.profile)).all()
    return dict(sorted(rows, key=lambda r: (-r[1], r[0])))


# ----------------------------------------------------------------------------- tables


def export_table(store, profile: str, out: str | Path) -> int:
    """Write the profile's current choices as a table (the shipped format), whole or not at
    all; stale ones too: a table's reader judges them where it runs. Returns how many."""
    entries = [e for _, _, e in current_entries(store, profile)]
    inductor_table.write(Path(out), profile, entries)
    return len(entries)


def import_table(store, doc: dict, path: str) -> list[Written]:
    """A table read by `inductor_table.read` (checked whole), merged in one transaction."""
    return write(store, doc["profile"], doc["entries"], kind="import", where=f"{path}: entries")

"""What `nbx-tune inductor ...` does, as library calls (re-exported by tuner/commands.py,
the CLI's one door into the tuner): certify a trace's GEMM choices on a GPU, list and show
the database's, export them to a table and import one."""

from __future__ import annotations

from dataclasses import dataclass, field

from nbx_tune.errors import NbxError

NEEDS_GPU = ("inductor certify needs a GPU with Inductor's Triton GEMM templates (Inductor lists none "
             "on the CPU or under TRITON_INTERPRET); run it on the GPU the choices are for")


def inductor_here() -> tuple:
    """(torch, Triton, the GPU's name or None with no GPU here): what an entry's staleness is
    judged against (kernels/serving/inductor_table.stale_reason)."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from nbx_tune.profiles import device_info
    from nbx_tune.profiles.detect import interpreter_enabled

    try:
        triton_version = version("triton")
    except PackageNotFoundError:
        triton_version = None
    gpu = device_info().name if torch.cuda.is_available() and not interpreter_enabled() else None
    return torch.__version__, triton_version, gpu


@dataclass
class CertifyRun:
    profile: str
    db: str  # the URL as it may be printed
    gemms: list = field(default_factory=list)  # [choices.Certified]


def inductor_certify(traces, db=None, profile=None, limit: int = 0, budget_s=None, on_gemm=None) -> CertifyRun:
    """Certify the traces' GEMM choices on this GPU into the database (tuner/inductor/choices.py)."""
    import torch

    from nbx_tune.kernels.serving import inductor_table
    from nbx_tune.profiles.detect import interpreter_enabled

    if not torch.cuda.is_available() or interpreter_enabled():
        raise NbxError(NEEDS_GPU)
    if inductor_table.hook() is None:
        raise NbxError(inductor_table.NO_HOOK.format(version=torch.__version__))
    from nbx_tune.profiles import device_info
    from nbx_tune.tuner.commands import resolve_profile
    from nbx_tune.tuner.inductor.choices import gemm_problems, certify_traces
    from nbx_tune.tuner.store import Store

    for t in traces:  # a bad trace fails before the database is opened
        gemm_problems(t)
    prof = resolve_profile(profile, for_tuning=True)
    with Store(db) as store:
        return CertifyRun(prof.name, store.url, certify_traces(traces, store, prof, device_info(), limit, budget_s,
                                                               on_gemm))


def _store(db):
    from nbx_tune.tuner.commands import _existing_store

    return _existing_store(db, required=True)


def _profile_name(profile):
    from nbx_tune.profiles import get_profile

    return get_profile(profile).name if profile else None


def inductor_list(db=None, profile=None) -> list[dict]:
    """The current choices (of `profile`), each an entry with its profile and why it is stale here."""
    from nbx_tune.tuner.store import inductor as idb

    name = _profile_name(profile)
    here = inductor_here()
    with _store(db) as store:
        return [{"profile": p, "certification": i, **e, "stale": idb.stale(e, here)}
                for p, i, e in idb.current_entries(store, name)]


def inductor_show(ref: str, db=None, profile=None) -> list[dict]:
    """Every certification of a lookup key (or of the key of certification id `ref`), oldest first."""
    from nbx_tune.tuner.store import inductor as idb

    name = _profile_name(profile)
    here = inductor_here()
    with _store(db) as store:
        rows = idb.history(store, ref, name)
    for r in rows:
        r["stale"] = idb.stale(r["entry"], here) if r["current"] else None
    return rows


def inductor_export(profile, out: str, db=None) -> dict:
    """The profile's current choices as a table (the shipped format); an empty one is an error."""
    from nbx_tune.tuner.store import inductor as idb

    with _store(db) as store:
        held = idb.profiles_held(store)
        name = _profile_name(profile)
        if name is None or name not in held:
            has = ", ".join(f"{n} ({k} choices)" for n, k in held.items()) or "no choice of any profile"
            try_ = f"; nbx-tune inductor export --profile {next(iter(held))} -o {out}" if held else ""
            raise NbxError(f"inductor export: {'which profile? ' if name is None else ''}database {store.url} holds "
                           f"{has}{'' if name is None else f', none of profile {name}'}{try_}; nothing written")
        return {"path": str(out), "profile": name, "entries": idb.export_table(store, name, out)}


def inductor_import(path: str, db=None) -> dict:
    """A table's choices merged into the database in one transaction (checked whole first)."""
    from nbx_tune.kernels.serving import inductor_table
    from nbx_tune.profiles import builtin_profiles
    from nbx_tune.tuner.store import Store
    from nbx_tune.tuner.store import inductor as idb

    doc = inductor_table.read(path)
    if doc["profile"] not in builtin_profiles():
        raise NbxError(f"{path}: profile {doc['profile']!r} is not a known profile "
                       f"({', '.join(sorted(builtin_profiles()))})")
    with Store(db) as store:
        written = idb.import_table(store, doc, str(path))
    return {"path": str(path), "profile": doc["profile"],
            "choices": [{"key": w.key, "certification": w.certification_id, "outcome": w.outcome,
                         "current": w.current, "why": w.why} for w in written]}

"""Certified max-autotune choices: Inductor's GEMM template configs, screened and timed by
nbx-tune (tuner/inductor/choices.py), served to Inductor through its template lookup table.

Inductor's `max-autotune` times its own Triton GEMM templates at compile time (minutes per
model, on every machine, no correctness screen). torch >= 2.10 has a lookup table for them
(`torch._inductor.lookup_table.LookupTableChoices`, `config.lookup_table`): a key made of the
GEMM's input dtypes, sizes and strides and the op's name, mapped to the template configs to
use instead of the search. With one config Inductor compiles it and times nothing.

    install()                      # Inductor's choices read the certified table from now on
    with choices(): compiled(x)    # the same, for a block

The choices come from the database (its `inductor_current` view, NBX_TUNE_DB: what
`nbx-tune inductor certify` and `import` write), then from tables, JSON files (`write` /
`read`; NBX_TUNE_INDUCTOR_TABLE names them, os.pathsep-separated, then
`kernels/tables/inductor/<profile>.json` if shipped; `nbx-tune inductor export` writes one):

    {"format": "nbx-tune inductor choices v1", "profile": "hopper",
     "entries": [{"key": "<Inductor's device-agnostic lookup key>", "op": "mm",
                  "gemm": {"dtype": "bfloat16", "dims": [B, M, N, K], "layout": "nt"},   # optional
                  "config": {"template_id": "triton::mm", "BLOCK_M": 128, ..., "template_hash": ...},
                  "provenance": {"torch_version", "triton_version", "device_name", "driver", "max_rel_err",
                                 "ms", "aten_ms", "runner_up_ms", "candidates",
                                 "refusals": [{"config", "reason"}], "measured_at"}}]}

An entry is served only where it holds (`stale_reason`): torch of the same major.minor (the
templates and their keys are torch's), the same Triton, the same GPU name. Inductor itself
drops a config whose template source changed since (`template_hash`, its check_src_hash).
A torch without the lookup table gets one line saying so, and Inductor searches as ever.

Imports torch (and Inductor) only when installing; reading and writing tables needs neither.
"""

from __future__ import annotations

import contextlib
import json
import logging
from datetime import datetime
from pathlib import Path

from nbx_tune import settings
from nbx_tune.errors import NbxError
from nbx_tune.files import write_atomic
from nbx_tune.kernels.runtime import certified_view
from nbx_tune.kernels.runtime.torch_rule import torch_minor

log = logging.getLogger("nbx_tune")

FORMAT = "nbx-tune inductor choices v1"
VIEW = "inductor_current"  # the database's current choices (migration 0009)
TABLE_DIR = Path(__file__).resolve().parents[1] / "tables" / "inductor"
PROVENANCE = {"torch_version": str, "triton_version": str, "device_name": str, "max_rel_err": float,
              "ms": float, "measured_at": str}
NO_HOOK = ("nbx-tune: torch {version} has no Inductor template lookup table "
           "(torch._inductor.lookup_table.LookupTableChoices): certified max-autotune choices are off, "
           "Inductor searches as ever")


# ----------------------------------------------------------------------------- the file


def entry_problem(e) -> str | None:
    """What is wrong with a table entry, or None: the one check of the format, for the file and
    for what the database imports. `gemm` (the problem: dtype, [B, M, N, K], layout),
    `provenance.refusals`, `candidates` and `driver` are optional; where present they are checked."""
    if not isinstance(e, dict):
        return "expected an object"
    for k, typ in (("key", str), ("op", str), ("config", dict), ("provenance", dict)):
        if not isinstance(e.get(k), typ):
            return f"{k}: missing or not a {typ.__name__}"
    if not isinstance(e["config"].get("template_id"), str):
        return "config.template_id: missing"
    prov = e["provenance"]
    for k, typ in PROVENANCE.items():
        v = prov.get(k)
        if typ is float and not _number(v):
            return f"provenance.{k}: not a number"
        if typ is str and (not isinstance(v, str) or not v):
            return f"provenance.{k}: missing"
    try:
        datetime.fromisoformat(prov["measured_at"])
    except ValueError:
        return "provenance.measured_at: not an ISO date and time"
    for k in ("aten_ms", "runner_up_ms"):
        if prov.get(k) is not None and not _number(prov[k]):
            return f"provenance.{k}: not a number"
    if prov.get("candidates") is not None and (isinstance(prov["candidates"], bool)
                                               or not isinstance(prov["candidates"], int)):
        return "provenance.candidates: not an integer"
    if prov.get("driver") is not None and not isinstance(prov["driver"], str):
        return "provenance.driver: not a string"
    refusals = prov.get("refusals", [])
    if not isinstance(refusals, list) or not all(
            isinstance(r, dict) and isinstance(r.get("config"), dict) and isinstance(r.get("reason"), str)
            for r in refusals):
        return "provenance.refusals: expected a list of {config, reason}"
    g = e.get("gemm")
    if g is not None and not (isinstance(g, dict) and isinstance(g.get("dtype"), str)
                              and isinstance(g.get("layout"), str) and isinstance(g.get("dims"), list)
                              and len(g["dims"]) == 4 and all(type(d) is int for d in g["dims"])):
        return "gemm: expected {dtype, dims: [B, M, N, K], layout}"
    return None


def _number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float))


def read(path: Path) -> dict:
    """The table at `path`, checked whole: a bad one raises NbxError naming the file and entry."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise NbxError(f"{path}: cannot read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise NbxError(f"{path}:{e.lineno}: not JSON: {e.msg}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise NbxError(f"{path}: format: expected {FORMAT!r}")
    if not isinstance(doc.get("profile"), str) or not isinstance(doc.get("entries"), list):
        raise NbxError(f"{path}: expected a profile name and a list of entries")
    for i, e in enumerate(doc["entries"]):
        why = entry_problem(e)
        if why:
            raise NbxError(f"{path}: entries[{i}]: {why}")
    return doc


def write(path: Path, profile: str, entries: list[dict]) -> None:
    """Write a table whole (or nothing); entries are checked as `read` checks them."""
    for i, e in enumerate(entries):
        why = entry_problem(e)
        if why:
            raise NbxError(f"{path}: entries[{i}]: {why}")
    doc = {"format": FORMAT, "profile": profile, "entries": sorted(entries, key=lambda e: (e["op"], e["key"]))}
    write_atomic(Path(path), json.dumps(doc, indent=1, sort_keys=True) + "\n", NbxError)


def stale_reason(prov: dict, torch_version: str, triton_version: str | None, device_name: str | None) -> str | None:
    """Why an entry's choice does not hold here, or None: the one staleness rule of this table."""
    if torch_minor(prov.get("torch_version", "")) != torch_minor(torch_version):
        return f"chosen with torch {prov.get('torch_version')}, this is {torch_version}"
    if triton_version is not None and prov.get("triton_version") != triton_version:
        return f"chosen with Triton {prov.get('triton_version')}, this is {triton_version}"
    if device_name is not None and prov.get("device_name") != device_name:
        return f"chosen on {prov.get('device_name')}, this is {device_name}"
    return None


def lookup_table(docs, torch_version: str, triton_version: str | None, device_name: str | None):
    """(Inductor's lookup table: key -> [config], the stale entries: [(key, why)]) from tables
    read in order (the first table holding a key wins)."""
    table, stale = {}, []
    for doc in docs:
        for e in doc["entries"]:
            why = stale_reason(e["provenance"], torch_version, triton_version, device_name)
            if why:
                stale.append((e["key"], why))
            elif e["key"] not in table:
                table[e["key"]] = [dict(e["config"])]
    return table, stale


def table_paths(profile: str) -> list[Path]:
    shipped = TABLE_DIR / f"{profile}.json"
    return settings.table_paths(settings.ENV_INDUCTOR_TABLE) + ([shipped] if shipped.exists() else [])


# ----------------------------------------------------------------------------- Inductor's side


def hook():
    """Inductor's LookupTableChoices class, or None on a torch without it."""
    try:
        from torch._inductor.lookup_table import LookupTableChoices
    except ImportError:
        return None
    return LookupTableChoices if hasattr(LookupTableChoices, "_get_lookup_table") else None


def handler_class():
    """LookupTableChoices reading the certified table instead of `config.lookup_table.table`,
    or None (and the one line why) on a torch without the hook."""
    import torch

    base = hook()
    if base is None:
        log.warning(NO_HOOK.format(version=torch.__version__))
        return None

    class CertifiedChoices(base):
        table: dict = {}

        def _get_lookup_table(self):
            return self.table

        def uuid(self):  # Inductor's FX graph cache keys on it: another table, another compile
            import hashlib

            return hashlib.sha256(json.dumps(self.table, sort_keys=True, default=str).encode()).hexdigest()

    return CertifiedChoices


def db_entries(url: str, profile: str) -> list[dict]:
    """The database's current choices of `profile` as table entries (stale or not: the reader
    judges); none where the database (a SQLite file) does not exist. Raises what the driver raises."""
    rows = certified_view.read_view(url, profile, VIEW) or []
    keys = ("torch_version", "triton_version", "device_name", "max_rel_err", "ms", "aten_ms")
    return [{"key": r["key"], "op": r["op"], "config": json.loads(r["config"]),
             "provenance": {**{k: r[k] for k in keys}, "measured_at": str(r["measured_at"])}} for r in rows]


def current_table() -> tuple[dict, list]:
    """The certified lookup table for this process's profile, torch, Triton and GPU: the
    database's current choices (NBX_TUNE_DB) first, then the tables' (NBX_TUNE_INDUCTOR_TABLE,
    the shipped one). A database that cannot be read costs its choices, never the compile."""
    import torch
    import triton

    from nbx_tune.profiles import current_profile, device_info

    profile = current_profile()
    docs = []
    try:
        docs.append({"entries": db_entries(settings.db_url(), profile.name)})
    except Exception as e:
        log.warning("nbx-tune: cannot read Inductor choices from the database (%s: %s); the tables' are used",
                    type(e).__name__, (str(e).splitlines() or [""])[0])
    for path in table_paths(profile.name):
        doc = read(path)
        if doc["profile"] == profile.name:
            docs.append(doc)
    return lookup_table(docs, torch.__version__, triton.__version__, device_info().name)


_installed = []  # the handlers install() replaced, to put back


def install(table: dict | None = None) -> bool:
    """Make Inductor's template choices read the certified table (`table`, else the current
    one). False, with one line why, on a torch without the hook."""
    cls = handler_class()
    if cls is None:
        return False
    if table is None:
        table, stale = current_table()
        for key, why in stale:
            log.info("nbx-tune: stale Inductor choice not served: %s: %s", key, why)
    handler = cls()
    handler.table = table
    import torch._inductor.config as ic
    from torch._inductor.virtualized import V

    if hasattr(ic, "inductor_choices_class"):  # process-wide: compiles on any thread
        _installed.append(("config", ic.inductor_choices_class))
        ic.inductor_choices_class = lambda: handler
    else:
        _installed.append(("virtualized", None))
    V.set_choices_handler(handler)
    return True


def uninstall() -> None:
    if not _installed:
        return
    import torch._inductor.config as ic
    from torch._inductor.choices import InductorChoices
    from torch._inductor.virtualized import V

    how, saved = _installed.pop()
    if how == "config":
        ic.inductor_choices_class = saved
    V.set_choices_handler(saved() if callable(saved) else InductorChoices())


@contextlib.contextmanager
def choices(table: dict | None = None):
    """install() for a block."""
    on = install(table)
    try:
        yield on
    finally:
        if on:
            uninstall()

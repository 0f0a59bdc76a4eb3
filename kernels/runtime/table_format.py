"""The certified table: the exported, read-only, deterministic form of a profile's
certified configs (JSON: no pickle, no code), shipped inside wheels and read at launch.

    {"format": "nbx-tune certified table", "format_version": 1,
     "profile": "hopper", "architecture": "hopper", "profile_hash": "...",
     "entries": [{"kernel", "dtypes", "flags", "bucket", "config", "median_ms", ...,
                  "provenance": {...}}, ...],
     "sha256": "<hash of the canonical entries>"}

Entries are sorted by seat; the checksum catches an edited or truncated file. The screened
range's ends (`screened_min`, `screened_max`) are problem objects; tables written before
were JSON text in a string, and read the same. Provenance may hold optional keys beyond
PROVENANCE_KEYS, which readers pass over: `search` (how the winner was found: full,
recertified, fallback, ranked, audit), `recertified_from` (the tuning it was re-certified
from, in words), `search_detail` (why it was or was not tuned in full) and
`sampled_regret` (the kernel's audited losses of ranked searches: {"audits", "median",
"max"}; an import keeps it, and the export after passes it on) and `torch_baselines`
(the config against torch's op on named GPUs: kernels/runtime/torch_rule.py). Everything
here is plain data checked field by field: a broken file is a `TableError` naming the file
and the position, and no entry of it is used.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from nbx_tune.errors import TableError
from nbx_tune.kernels.runtime import torch_rule as baseline, table_schema

FORMAT = "nbx-tune certified table"
FORMAT_VERSION = 1

PROVENANCE_KEYS = ("device_name", "device_target", "driver", "triton_version", "torch_version",
                   "kernel_source_hash", "config_space_hash", "profile_hash", "certified_at")
ENTRY_KEYS = {"kernel": str, "dtypes": str, "flags": str, "bucket": str, "config": str,
              "median_ms": float, "spread_ms": list, "runner_up": (str, type(None)),
              "runner_up_ms": (float, type(None)), "margin": (float, type(None)),
              "screens": list, "screened_min": (dict, str, type(None)), "screened_max": (dict, str, type(None)),
              "unscreened": (str, type(None)), "timing_method": str, "provenance": dict}


def canonical(entries: list[dict]) -> str:
    return json.dumps(entries, sort_keys=True, separators=(",", ":"))


def checksum(entries: list[dict]) -> str:
    return hashlib.sha256(canonical(entries).encode()).hexdigest()


def seat_sort_key(e: dict) -> tuple:
    return (e["kernel"], e["dtypes"], e["flags"], e["bucket"])


def dumps(profile: str, architecture: str, profile_hash: str, entries: list[dict]) -> str:
    entries = sorted(entries, key=seat_sort_key)
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "profile": profile,
           "architecture": architecture, "profile_hash": profile_hash,
           "entries": entries, "sha256": checksum(entries)}
    return json.dumps(doc, sort_keys=True, indent=1) + "\n"


def _check_entry(e: Any, where: str) -> dict:
    if not isinstance(e, dict):
        raise TableError(f"{where}: expected an object")
    for k, types in ENTRY_KEYS.items():
        if k not in e:
            raise TableError(f"{where}.{k}: missing")
        v = e[k]
        if types is float and isinstance(v, int) and not isinstance(v, bool):
            continue
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,))):
            raise TableError(f"{where}.{k}: wrong type {type(v).__name__}")
    unknown = set(e) - set(ENTRY_KEYS)
    if unknown:
        raise TableError(f"{where}.{sorted(unknown)[0]}: unknown key")
    for k in PROVENANCE_KEYS:
        if not isinstance(e["provenance"].get(k), str):
            raise TableError(f"{where}.provenance.{k}: missing or not a string")
    _check_numbers(e, where)
    found = e["provenance"].get("torch_baselines")
    if found is not None:
        if not isinstance(found, list):
            raise TableError(f"{where}.provenance.torch_baselines: expected a list")
        for j, b in enumerate(found):
            bad = baseline.problem(b)
            if bad:
                raise TableError(f"{where}.provenance.torch_baselines[{j}].{bad}")
    try:
        datetime.fromisoformat(e["provenance"]["certified_at"])
    except ValueError:
        raise TableError(f"{where}.provenance.certified_at: not an ISO date and time") from None
    return e


def _positive(v) -> bool:
    return table_schema.finite_number(v) and v > 0


def _check_numbers(e: dict, where: str) -> None:
    """Times are finite and positive, the spread is [p20, p80]: an edited NaN or -1 would
    rank or divide by nonsense downstream."""
    if not _positive(e["median_ms"]):
        raise TableError(f"{where}.median_ms: {e['median_ms']!r} is not a positive finite time")
    spread = e["spread_ms"]
    if len(spread) != 2 or not all(_positive(v) or v == 0 for v in spread) or spread[0] > spread[1]:
        raise TableError(f"{where}.spread_ms: expected [p20, p80], two finite times >= 0 in order")
    if e["runner_up_ms"] is not None and not _positive(e["runner_up_ms"]):
        raise TableError(f"{where}.runner_up_ms: {e['runner_up_ms']!r} is not a positive finite time")
    if e["margin"] is not None and not table_schema.finite_number(e["margin"]):
        raise TableError(f"{where}.margin: {e['margin']!r} is not finite")
    bad = table_schema.entry_issue(e)
    if bad:
        raise TableError(f"{where}.{bad}")


def loads(text: str, source: str) -> dict:
    """Parse and check a table; returns the document with checked entries."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TableError(f"{source}: line {e.lineno}, column {e.colno}: not valid JSON ({e.msg}); "
                         "is the file truncated?") from None
    except RecursionError:
        raise TableError(f"{source}: nested too deeply to be a certified table") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TableError(f"{source}: not an nbx-tune certified table (no \"format\": \"{FORMAT}\")")
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise TableError(f"{source}: format_version {version!r}; this nbx-tune reads version "
                         f"{FORMAT_VERSION} (export the table again with a matching nbx-tune)")
    for k in ("profile", "architecture", "profile_hash", "sha256"):
        if not isinstance(doc.get(k), str):
            raise TableError(f"{source}: {k}: missing or not a string")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise TableError(f"{source}: entries: missing or not a list")
    seen = {}
    for i, e in enumerate(entries):
        _check_entry(e, f"{source}: entries[{i}]")
        first = seen.setdefault(seat_sort_key(e), i)
        if first != i:
            raise TableError(f"{source}: entries[{i}]: the same seat as entries[{first}] (one entry per seat)")
    if checksum(entries) != doc["sha256"]:
        raise TableError(f"{source}: sha256 does not match the entries: the file was edited or "
                         "damaged after export (export it again)")
    return doc


def read(path: str | Path) -> dict:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TableError(f"{p}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    return loads(text, str(p))


def problem_text(value) -> str | None:
    """A screened-range end as the database holds it (JSON text), from either form."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)

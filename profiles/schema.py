"""Device profiles: YAML files loaded into frozen, validated dataclasses.

A profile says what a device can run (shared memory, registers, pipelining stages), how its
launches are bucketed (ladders), how strictly a candidate is screened (per-dtype tolerance,
byte budget) and how it is timed. A malformed file is a `ProfileError` naming the file and
the key path (`autotune.buckets.default[3].up_to`), never a partial profile.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import yaml

from nbx_tune.errors import ProfileError
from nbx_tune.profiles.ladder import Ladder, LadderRow

# Dtype names a profile may give a tolerance for: torch's names, as they appear in traces.
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "bool")
KNOWN_DTYPES = FLOAT_DTYPES + INT_DTYPES

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
TIMING_METHODS = ("do_bench", "wall")


@dataclass(frozen=True)
class Memory:
    max_shared_memory_per_block: int
    max_registers_per_block: int
    warp_size: int


@dataclass(frozen=True)
class Timing:
    method: str  # "do_bench" (CUDA/HIP events, median) or "wall" (host clock, median)
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    repeats: int = 3  # wall-clock method: timed calls after one warm-up call


@dataclass(frozen=True)
class Profile:
    name: str
    vendor: str
    architecture: str
    description: str
    compute_capability_matches: tuple[str, ...]
    memory: Memory
    max_num_stages: int
    launch_options: tuple[str, ...]
    ladders: Mapping[str, Ladder]
    timing: Timing
    candidate_timeout_s: float
    screen_rtol: Mapping[str, float]
    screen_max_bytes: int
    screen_unsupported: Mapping[str, str]
    source: str
    hash: str = field(compare=False)
    base_hash: str = field(compare=False, default="")  # the certified part less its ladders

    def hash_for(self, ladders) -> str:
        """The hash a kernel's certificates hold to: what certification depends on, with only
        the ladders that bucket that kernel's key, so re-laddering one family leaves the
        others' certificates valid."""
        used = {n: [[r.up_to, r.step] for r in self.ladder(n).rows] for n in sorted(set(ladders))}
        text = json.dumps({"base": self.base_hash, "buckets": used}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def ladder(self, name: str) -> Ladder:
        return self._entry(self.ladders, name, f"autotune.buckets: no ladder {name!r} (a kernel's launch key needs it)")

    @property
    def has_tma(self) -> bool:
        """Whether the devices have a TMA unit (NVIDIA sm_90 and later), read off the
        capabilities this profile matches; the interpreter emulates tensor descriptors."""
        if self.vendor == "triton":
            return True
        caps = [m.partition(":")[2] for m in self.compute_capability_matches]
        return self.vendor == "nvidia" and all(c.isdigit() and int(c) >= 90 for c in caps)

    def rtol(self, dtype: str) -> float:
        return self._entry(self.screen_rtol, dtype, f"autotune_screen_rtol: no tolerance for {dtype!r}")

    def _entry(self, table: Mapping, key: str, missing: str):
        """table[key], or the one-line error naming this profile's file and what is missing."""
        try:
            return table[key]
        except KeyError:
            raise ProfileError(f"{self.source}: {missing}") from None


# ----------------------------------------------------------------------------- validation


def _where(path: str) -> str:
    return path or "(top level)"


class _Reader:
    """Walks the parsed YAML, checking each key; every failure names file and key path."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, path: str, problem: str):
        raise ProfileError(f"{self.source}: {_where(path)}: {problem}")

    def mapping(self, value: Any, path: str, allowed: set[str], required: set[str]) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {type(value).__name__}")
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                self.fail(f"{path}.{key}".lstrip("."), "unknown key")
        for key in sorted(required - set(value)):
            self.fail(f"{path}.{key}".lstrip("."), "missing")
        return value

    def int_(self, value: Any, path: str, minimum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected an integer, got {value!r}")
        if minimum is not None and value < minimum:
            self.fail(path, f"must be >= {minimum}, got {value}")
        return value

    def number(self, value: Any, path: str, minimum: float = 0.0) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(path, f"expected a number, got {value!r}")
        if value < minimum:
            self.fail(path, f"must be >= {minimum}, got {value}")
        return float(value)

    def str_(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value:
            self.fail(path, f"expected a non-empty string, got {value!r}")
        return value

    def str_list(self, value: Any, path: str, choices: tuple[str, ...] | None = None) -> tuple:
        if not isinstance(value, list):
            self.fail(path, f"expected a list, got {type(value).__name__}")
        out = []
        for i, item in enumerate(value):
            self.str_(item, f"{path}[{i}]")
            if choices is not None and item not in choices:
                self.fail(f"{path}[{i}]", f"{item!r} is not one of {', '.join(choices)}")
            out.append(item)
        return tuple(out)

    def ladder(self, name: str, value: Any, path: str) -> Ladder:
        if not isinstance(value, list) or not value:
            self.fail(path, "expected a non-empty list of {up_to, step} rows")
        rows = []
        prev = 0
        for i, row in enumerate(value):
            rp = f"{path}[{i}]"
            self.mapping(row, rp, {"up_to", "step"}, {"up_to", "step"})
            step = self.int_(row["step"], f"{rp}.step")
            if step <= 0:
                self.fail(f"{rp}.step", f"must be > 0, got {step}")
            up_to = row["up_to"]
            if up_to is None:
                if i != len(value) - 1:
                    self.fail(f"{rp}.up_to", "null (unbounded) is only allowed on the last row")
            else:
                self.int_(up_to, f"{rp}.up_to")
                if up_to <= prev:
                    self.fail(f"{rp}.up_to", f"must increase (got {up_to} after {prev})")
                if up_to % step:
                    self.fail(f"{rp}.up_to", f"{up_to} is not a multiple of its row's step {step}")
                prev = up_to
            rows.append(LadderRow(up_to, step))
        return Ladder(name, tuple(rows))


_TOP_KEYS = {
    "vendor", "architecture", "description", "compute_capability_matches", "memory",
    "pipelining", "launch_options", "autotune", "autotune_screen_rtol",
    "autotune_screen_max_bytes", "screen_unsupported",
}
_TOP_REQUIRED = _TOP_KEYS - {"screen_unsupported", "description"}


def parse_profile(data: Any, source: str, name: str) -> Profile:
    """Validate parsed YAML into a Profile; `source` names the file in every error."""
    r = _Reader(source)
    if data is None:
        r.fail("", "the file is empty")
    r.mapping(data, "", _TOP_KEYS, _TOP_REQUIRED)

    mem = r.mapping(data["memory"], "memory",
                    {"max_shared_memory_per_block", "max_registers_per_block", "warp_size"},
                    {"max_shared_memory_per_block", "max_registers_per_block", "warp_size"})
    memory = Memory(
        r.int_(mem["max_shared_memory_per_block"], "memory.max_shared_memory_per_block", 0),
        r.int_(mem["max_registers_per_block"], "memory.max_registers_per_block", 1),
        r.int_(mem["warp_size"], "memory.warp_size", 1),
    )
    pipe = r.mapping(data["pipelining"], "pipelining", {"max_num_stages"}, {"max_num_stages"})
    max_stages = r.int_(pipe["max_num_stages"], "pipelining.max_num_stages", 1)

    auto = r.mapping(data["autotune"], "autotune",
                     {"buckets", "timing", "candidate_timeout_s"}, {"buckets", "timing", "candidate_timeout_s"})
    buckets = auto["buckets"]
    if not isinstance(buckets, dict) or not buckets:
        r.fail("autotune.buckets", "expected a mapping of ladder name -> rows")
    ladders = {}
    for lname, rows in buckets.items():
        r.str_(lname, "autotune.buckets")
        ladders[lname] = r.ladder(lname, rows, f"autotune.buckets.{lname}")
    if "default" not in ladders:
        r.fail("autotune.buckets.default", "missing")

    t = r.mapping(auto["timing"], "autotune.timing",
                  {"method", "warmup_ms", "rep_ms", "repeats"}, {"method"})
    method = r.str_(t["method"], "autotune.timing.method")
    if method not in TIMING_METHODS:
        r.fail("autotune.timing.method", f"{method!r} is not one of {', '.join(TIMING_METHODS)}")
    timing = Timing(
        method,
        r.number(t.get("warmup_ms", 25.0), "autotune.timing.warmup_ms"),
        r.number(t.get("rep_ms", 100.0), "autotune.timing.rep_ms", 1e-3),
        r.int_(t.get("repeats", 3), "autotune.timing.repeats", 1),
    )
    timeout = r.number(auto["candidate_timeout_s"], "autotune.candidate_timeout_s", 1e-3)

    rt = data["autotune_screen_rtol"]
    if not isinstance(rt, dict) or not rt:
        r.fail("autotune_screen_rtol", "expected a mapping of dtype -> tolerance")
    rtol = {}
    for dt, tol in rt.items():
        if dt not in KNOWN_DTYPES:
            r.fail(f"autotune_screen_rtol.{dt}", f"unknown dtype (known: {', '.join(KNOWN_DTYPES)})")
        rtol[dt] = r.number(tol, f"autotune_screen_rtol.{dt}")
        if dt in INT_DTYPES and rtol[dt] != 0.0:
            r.fail(f"autotune_screen_rtol.{dt}", "integer results are compared bit-exactly: must be 0")

    unsupported = data.get("screen_unsupported") or {}
    if not isinstance(unsupported, dict):
        r.fail("screen_unsupported", "expected a mapping of dtype -> reason")
    for dt, why in unsupported.items():
        if dt not in KNOWN_DTYPES:
            r.fail(f"screen_unsupported.{dt}", "unknown dtype")
        r.str_(why, f"screen_unsupported.{dt}")

    matches = r.str_list(data["compute_capability_matches"], "compute_capability_matches")
    if not matches:
        r.fail("compute_capability_matches", "needs at least one prefix")
    launch_options = r.str_list(data["launch_options"], "launch_options", LAUNCH_OPTIONS)

    # The hash covers what certification depends on, in canonical form: comments, timing
    # and timeouts can change without making certificates stale.
    certified_part = {k: data[k] for k in ("architecture", "memory", "pipelining",
                                           "launch_options", "autotune_screen_rtol",
                                           "autotune_screen_max_bytes")}
    base = hashlib.sha256(json.dumps(certified_part, sort_keys=True).encode()).hexdigest()[:16]
    certified_part["buckets"] = buckets
    digest = hashlib.sha256(json.dumps(certified_part, sort_keys=True).encode()).hexdigest()[:16]

    return Profile(
        name=name,
        vendor=r.str_(data["vendor"], "vendor"),
        architecture=r.str_(data["architecture"], "architecture"),
        description=str(data.get("description", "")),
        compute_capability_matches=matches,
        memory=memory,
        max_num_stages=max_stages,
        launch_options=launch_options,
        ladders=MappingProxyType(ladders),
        timing=timing,
        candidate_timeout_s=timeout,
        screen_rtol=MappingProxyType(rtol),
        screen_max_bytes=r.int_(data["autotune_screen_max_bytes"], "autotune_screen_max_bytes", 0),
        screen_unsupported=MappingProxyType(dict(unsupported)),
        source=source,
        hash=digest,
        base_hash=base,
    )


def load_profile_file(path: str | Path) -> Profile:
    """Load one profile file; its name is the file's stem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ProfileError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(top level)"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ProfileError(f"{path}: {where}: not valid YAML: {problem}") from None
    return parse_profile(data, str(path), path.stem)

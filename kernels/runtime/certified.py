"""The launch-time read of certified configs.

Loaded once per process, from (first wins per seat): the exported tables named by
NBX_TUNE_TABLE, the database's `certified_configs` view (NBX_TUNE_DB or the default
file, only if it exists: a launch never creates a database), and the tables shipped in
this package (`kernels/tables/<profile>.json`). An entry is served only if its provenance
matches this process: kernel source hash, config-space hash, profile hash, Triton version
and the device's compile target (kernels/runtime/validity.py); anything else is stale and is
never served.

After loading, a launch is one dict lookup on (kernel, dtypes, flags, dims); the ladder
math runs once per distinct shape. The public ops go further and replay the compiled
kernels of each exact call (kernels/runtime/launch.py); `reload()` drops both memos, so a new
certificate is served.
A seat with no certificate gets the kernel's declared default config, the miss is counted
(`launch_stats()`), and the log says so once per seat. Under serve() a seat whose torch
baseline on this GPU is faster raises `TorchFaster`, and torch runs the op (the rule:
kernels/runtime/torch_rule.py; eager, host time counts too: kernels/runtime/eager_rule.py);
a replay of such a call asks again.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from nbx_tune import settings
from nbx_tune.errors import KernelError, NbxError, TorchFaster
from nbx_tune.kernels.runtime import (torch_rule as baseline, certified_view, eager_rule, launch, table_format,
                                      validity)
from nbx_tune.kernels.spec import (Config, KernelSpec, Problem, bucket_of, decode_bucket,
                                   decode_flags, label_of, seat_label)

log = logging.getLogger("nbx_tune")

TABLE_DIR = Path(__file__).resolve().parents[1] / "tables"  # kernels/tables/
MEMO_LIMIT = 1 << 16  # distinct launch shapes remembered before the memo starts over

class MissTally(Counter):
    """Misses by seat, with their running total: what serve() reads around one op to tell a
    launch on a certified config from one on the default."""

    total = 0

    def __setitem__(self, key, value):
        self.total += value - self.get(key, 0)
        super().__setitem__(key, value)


class Serving(threading.local):
    # inside serve()'s call of a kernel, the op's eager_rule.HostClock (kernels/serving/serve.py
    # sets it; any truthy value counts): seats may defer to torch
    busy = False


SERVING = Serving()


@dataclass
class LaunchState:
    profile: object
    triton_version: str | None = None
    device_target: str | None = None  # the running device's: another target is never served
    device_name: str | None = None  # a torch baseline holds on the GPU it was measured on
    torch_version: str | None = None
    entries: dict = field(default_factory=dict)  # (kernel, dtypes, flags, bucket) -> (Config, source)
    baselines: dict = field(default_factory=dict)  # (kernel, dtypes, flags, bucket) -> [baseline dicts]
    deferred: dict = field(default_factory=dict)  # seat -> the baseline that sends it to torch under serve()
    checks: dict = field(default_factory=dict)  # seat -> its call's check under serve() (_seat_check)
    # seat -> the GPUs its baselines were measured on, where none holds here (another GPU,
    # torch or config): serve() runs the kernel there, and says once how to measure this GPU
    unmeasured: dict = field(default_factory=dict)
    # (kernel, dtypes, flags, dims) -> (Config, miss seat or None, the seat's check or None)
    memo: dict = field(default_factory=dict)
    misses: Counter = field(default_factory=MissTally)
    stale: list = field(default_factory=list)  # (source, seat label, why)
    # Rows of kernels not registered when the configs were loaded (a plugin imported by the
    # program, never registered): admitted when a launch hands config_for their spec.
    unknown: dict = field(default_factory=dict)  # kernel -> [(source, dtypes, flags, bucket, config, prov)]
    sources: list = field(default_factory=list)
    warned: set = field(default_factory=set)
    spaces: dict = field(default_factory=dict)  # kernel -> its declared configs (validity.config_index)


_state: LaunchState | None = None
_lock = threading.Lock()


def _add(state: LaunchState, source: str, kernel: str, dtypes: str, flags: str, bucket: str,
         config: str, prov: dict, spec: KernelSpec | None = None) -> None:
    from nbx_tune.kernels.runtime.registry import all_specs

    spec = spec or all_specs().get(kernel)
    if spec is None:
        state.unknown.setdefault(kernel, []).append((source, kernel, dtypes, flags, bucket, config, prov))
        return
    dt = tuple(dtypes.split(","))
    fl = decode_flags(flags)
    try:
        bk = decode_bucket(spec.key, bucket)
        index = state.spaces.get(kernel)
        if index is None:
            index = state.spaces[kernel] = validity.config_index(spec)
        cfg = validity.declared_config(index, config)
    except (KeyError, ValueError) as e:
        state.stale.append((source, label_of(kernel, dtypes, flags, bucket), f"unreadable: {e}"))
        return
    why = validity.stale_reason(prov, spec, state.profile, state.triton_version, state.device_target)
    if why:
        state.stale.append((source, seat_label(kernel, dt, fl, spec.key, bk), why))
        return
    state.entries.setdefault((kernel, dt, fl, bk), (cfg, source))
    for b in (prov.get("torch_baselines") or ()) if isinstance(prov, dict) else ():
        state.baselines.setdefault((kernel, dt, fl, bk), []).append({**b, "config": config})


def _load_table(state: LaunchState, path: Path) -> None:
    doc = table_format.read(path)
    if doc["profile"] != state.profile.name:
        log.info("nbx-tune: %s is a table for profile %s, not %s: not used", path, doc["profile"],
                 state.profile.name)
        return
    for e in doc["entries"]:
        _add(state, str(path), e["kernel"], e["dtypes"], e["flags"], e["bucket"], e["config"],
             e["provenance"])
    state.sources.append(str(path))


def _load_db(state: LaunchState) -> None:
    try:
        rows = certified_view.read_view(settings.db_url(), state.profile.name)
    except Exception as e:  # an unreadable database costs certified configs, never the launch
        log.warning("nbx-tune: cannot read certified configs from the database (%s: %s); "
                    "launches use declared defaults", type(e).__name__, str(e).splitlines()[0])
        return
    if rows is None:
        return
    for r in rows:  # the row's provenance columns are what the staleness check reads
        _add(state, "database", r["kernel"], r["dtypes"], r["flags"], r["bucket"], r["config"], r)
    state.sources.append("database")
    try:
        rows = certified_view.read_view(settings.db_url(), state.profile.name, certified_view.BASELINES)
    except Exception as e:  # a database made before baselines: none to apply
        log.info("nbx-tune: no torch baselines read from the database (%s)", str(e).splitlines()[0])
        return
    from nbx_tune.kernels.runtime.registry import all_specs

    for r in rows or ():
        spec = all_specs().get(r["kernel"])
        try:
            seat = (r["kernel"], tuple(r["dtypes"].split(",")), decode_flags(r["flags"]),
                    decode_bucket(spec.key, r["bucket"]))
        except (AttributeError, KeyError, ValueError):
            continue  # a kernel not registered here, or a seat it no longer reads
        state.baselines.setdefault(seat, []).append(dict(r))


def _defer(state: LaunchState) -> None:
    """The seats whose served config torch beats on this GPU (kernels/runtime/torch_rule.py)."""
    for seat, found in state.baselines.items():
        hit = state.entries.get(seat)
        if hit is None:
            continue
        b = baseline.applicable(found, str(hit[0]), state.device_name, state.torch_version)
        if b is None:
            state.unmeasured[seat] = sorted({str(x.get("device_name")) for x in found})
            continue
        if baseline.defers(b["nbx_ms"], b["torch_ms"]):
            state.deferred[seat] = b
        if eager_rule.checked(b["nbx_ms"], b["torch_ms"]):
            state.checks[seat] = eager_rule.seat_check(b["nbx_ms"], b["torch_ms"], SERVING, _refuse)


def _refuse(why: str):
    raise TorchFaster(why)


def _load() -> LaunchState:
    import triton

    from nbx_tune.profiles import current_profile, current_target, device_info

    state = LaunchState(current_profile(), triton.__version__, current_target(), device_info().name,
                        _torch_version())
    for path in settings.table_paths():
        _load_table(state, path)  # a broken table the user named is an error, not a warning
    _load_db(state)
    shipped = TABLE_DIR / f"{state.profile.name}.json"
    if shipped.exists():
        try:
            _load_table(state, shipped)
        except NbxError as e:
            log.warning("nbx-tune: shipped table unusable: %s", e)
    _defer(state)
    for source, seat, why in state.stale:
        log.info("nbx-tune: stale certificate not served (%s): %s: %s", source, seat, why)
    return state


def _torch_version() -> str | None:
    try:  # a launch takes torch tensors: torch is there, and mostly imported already
        import torch
    except ImportError:
        return None
    return torch.__version__


def state() -> LaunchState:
    global _state
    if _state is None:
        with _lock:
            if _state is None:
                _state = _load()
    return _state


def reload() -> None:
    """Forget what was loaded (after a census in this process, or in tests)."""
    global _state
    with _lock:
        _state = None
        launch.forget()


def _resolve(st: LaunchState, spec: KernelSpec, dtypes, flags, dims) -> tuple:
    for dt in dtypes:
        why = st.profile.screen_unsupported.get(dt)
        if why:
            raise KernelError(f"{spec.name}: {dt} cannot run correctly on profile {st.profile.name}: {why}")
    late = st.unknown.pop(spec.name, ())
    for row in late:  # a kernel first seen here, by its spec
        _add(st, *row, spec=spec)
    if late:
        _defer(st)
    bucket = bucket_of(st.profile, spec.key, dims)
    hit = st.entries.get((spec.name, dtypes, flags, bucket))
    if hit is not None:
        seat = (spec.name, dtypes, flags, bucket)
        if seat in st.unmeasured and SERVING.busy and "unmeasured" not in st.warned:
            st.warned.add("unmeasured")
            log.warning("nbx-tune: serve: %d certified seats have torch baselines, none for %s with torch %s "
                        "and their config (measured on %s): their kernels run; `nbx-tune baseline --model "
                        "TRACE` measures them here, and serve() then runs torch where it is faster",
                        len(st.unmeasured), st.device_name, st.torch_version,
                        ", ".join(sorted({g for gs in st.unmeasured.values() for g in gs})))
        return (hit[0], None, st.checks.get(seat))
    label = seat_label(spec.name, dtypes, flags, spec.key, bucket)
    cfg = spec.default_config(st.profile, Problem(spec.name, dtypes, flags, tuple(dims)))
    if label not in st.warned:
        st.warned.add(label)
        stale = next((f"{why} ({source})" for source, seat, why in st.stale if seat == label), None)
        log.warning("nbx-tune: no certified config for %s on %s: using the default %s (%s)", label,
                    st.profile.name, cfg, f"its certificate is stale: {stale}; run `nbx-tune census` "
                    "to certify it again" if stale else "run `nbx-tune census` to certify it")
    return (cfg, label, None)


def config_for(spec: KernelSpec, dtypes: tuple, flags: tuple, dims: tuple) -> Config:
    """The config a launch uses: certified for its seat, else the declared default. Under
    serve(), raises TorchFaster at a seat torch beats (its baseline; eager, host time too)."""
    st = _state or state()
    key = (spec.name, dtypes, flags, dims)
    hit = st.memo.get(key)
    if hit is None:
        if len(st.memo) >= MEMO_LIMIT:
            st.memo.clear()
        hit = st.memo[key] = _resolve(st, spec, dtypes, flags, dims)
    if hit[2] is not None:  # outside serve() the kernel runs; a replay of this call asks again
        launch.guard(hit[2])
        hit[2]()
    if hit[1] is not None:
        st.misses[hit[1]] += 1
        launch.note_miss(st.misses, hit[1])  # a replay of this call counts it too
    return hit[0]


def launch_stats() -> dict:
    """Misses by seat, stale certificates skipped, where configs were loaded from, the
    direct launches (calls remembered, and why others were not: kernels/runtime/launch.py), and per
    aten op what `serve()` ran (certified, default, torch with reasons) once it was used."""
    import sys

    from nbx_tune.kernels.runtime.registry import all_specs

    st = state()
    specs = all_specs()
    serving = sys.modules.get("nbx_tune.kernels.serving.serve")
    return {"profile": st.profile.name, "certified_seats": len(st.entries), "direct_launches": len(launch.REMEMBERED),
            "deferred_to_torch": sorted(seat_label(k, dt, fl, specs[k].key, bk) for k, dt, fl, bk in st.deferred),
            "baselines_not_here": len(st.unmeasured),
            "misses": dict(st.misses), "stale": list(st.stale), "sources": list(st.sources),
            "not_remembered": dict(launch.REFUSED), "ops": serving.stats() if serving is not None else {}}

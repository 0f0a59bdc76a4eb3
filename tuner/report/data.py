"""What `nbx-tune report` draws, gathered from the database as plain JSON-able dicts
(`tuner/report/page.py` draws them; `--json` prints them).

Every number comes from what the store already keeps: seat records and their status
(`tuner/census/status.py`), a trace's plan (`tuner/census/census.py`, as a dry run reads it), refusals,
torch baselines, the tunings of a census run and the census runs' summaries.

Coverage puts each launch of the trace (or, with no trace, of every trace the database
planned) in one category, as serve() would run it:
    certified     a current certificate, screened at every shape seen
    unscreened    a current certificate, some shape seen never screened
    torch         certified, but the seat's newest torch baseline says torch is faster
                  (kernels/runtime/torch_rule.py's rule, on the GPU that baseline was measured on)
    default       a seat with no certificate valid here (pending, refused, stale): the
                  kernel's declared default config
    no kernel     no kernel serves the op, or the row could not be mapped to a seat
"""

from __future__ import annotations

import json
from collections import Counter

from nbx_tune.kernels.runtime import torch_rule as rule
from nbx_tune.kernels.spec import decode_bucket
from nbx_tune.tuner.store.export import iso_utc
from nbx_tune.tuner.census.status import seat_status

CATEGORIES = ("certified", "unscreened", "torch", "default", "no kernel")
SECTIONS = ("overview", "coverage", "speed", "refusals", "buckets", "timeline", "provenance")
_RANK = ("certified", "unscreened", "stale", "pending", "refused")
PROVENANCE = ("device_name", "device_target", "driver", "triton_version", "torch_version",
              "kernel_source_hash", "config_space_hash", "profile_hash")


def gather(store, profile, specs, plan=None, lines=None, here=None) -> dict:
    """The report's data for `profile` (a Profile, or None when the database holds no seat).

    plan, lines: a trace's census plan and its seats' report lines (`census.report_lines`):
    the report is then of that trace; else of every seat of the profile. here: this
    installation's versions ({"triton_version", "torch_version"}), for the provenance."""
    recs = store.seat_records(profile=profile.name) if profile is not None else []
    statuses = {r.seat.id: seat_status(r, specs.get(r.seat.kernel), profile) for r in recs}
    if plan is not None:
        in_scope = {ln.id for ln in lines if ln.id is not None}
        recs = [r for r in recs if r.seat.id in in_scope]
    baselines = _newest_baselines(store, recs)
    launches = _launches(recs, plan)
    return {
        "overview": _overview(store, profile, plan, recs, statuses, launches),
        "coverage": coverage(recs, statuses, baselines, launches, plan, lines),
        "speed": speed(recs, baselines, launches),
        "refusals": refusals(store, profile, recs),
        "buckets": buckets(recs, statuses, specs, profile, plan),
        "timeline": timeline(store, plan),
        "provenance": provenance(store, recs, statuses, specs, here or {}),
    }


# ----------------------------------------------------------------------------- pieces

def _launches(recs, plan) -> dict:
    """seat id -> launches: the trace's, or every planned trace's (trace_needs)."""
    if plan is None:
        return {r.seat.id: r.launches for r in recs}
    by_key = {sp.key: sp.launches for sp in plan.seats.values()}
    return {r.seat.id: by_key.get((r.seat.kernel, r.seat.dtypes, r.seat.flags, r.seat.bucket), 0) for r in recs}


def _newest_baselines(store, recs) -> dict:
    """seat id -> the newest baseline of its current certificate (a dict), if any."""
    cert_seat = {r.cert.id: r.seat.id for r in recs if r.cert is not None}
    out = {}
    for cid, found in store.baselines_of(cert_seat).items():
        b = found[-1]  # oldest first
        out[cert_seat[cid]] = {"device_name": b.device_name, "torch_version": b.torch_version,
                               "nbx_ms": b.nbx_ms, "torch_ms": b.torch_ms, "method": b.method,
                               "measured_at": iso_utc(b.measured_at)}
    return out


def category(status: str, baseline: dict | None) -> str:
    """How serve() runs a seat of this status (and newest baseline)."""
    if status in ("certified", "unscreened"):
        if baseline is not None and rule.defers(baseline["nbx_ms"], baseline["torch_ms"]):
            return "torch"
        return status
    return "default"


def _overview(store, profile, plan, recs, statuses, launches) -> dict:
    runs = store.census_runs(limit=1)
    last = runs[0][0] if runs else None
    return {"db": store.url, "profile": profile.name if profile is not None else None,
            "empty": not recs and plan is None,
            "trace": ({"path": plan.trace.path, "sha256": plan.sha256, "rows": len(plan.trace.rows),
                       "launches": plan.trace.launches} if plan is not None else None),
            "seats": len(recs), "launches": sum(launches.values()),
            "seats_by_status": dict(Counter(statuses[r.seat.id].status for r in recs)),
            "last_census": (iso_utc(last.finished_at or last.started_at) if last is not None else None)}


def coverage(recs, statuses, baselines, launches, plan=None, lines=None) -> dict:
    """Launches per op (with a trace; per kernel without) in each category of CATEGORIES,
    with why a launch is not served by a certificate. Each row's categories add up to its
    launches, and the rows to the trace's."""
    rows: dict[str, dict] = {}

    def row(name, kernel):
        return rows.setdefault(name, {"op": name, "kernel": kernel, "launches": 0,
                                      "by_category": dict.fromkeys(CATEGORIES, 0), "why": []})

    def add(e, cat, n, why=None):
        e["launches"] += n
        e["by_category"][cat] += n
        if why and why not in e["why"]:
            e["why"].append(why)

    if plan is not None:
        for ln in lines:
            # The census's own judgement of the seat, with this trace's shapes seen.
            cat = category(ln.status, baselines.get(ln.id))
            for op, n in ln.ops.items():
                add(row(op, ln.kernel), cat, n, _why(cat, ln.status, ln.why, baselines.get(ln.id), ln.label))
        for op, n in plan.uncovered.items():
            add(row(op, None), "no kernel", n, "no kernel serves this op")
        for line, op, why, n in plan.not_servable:
            add(row(op, None), "no kernel", n, f"line {line}: {why}")
    else:
        for r in recs:
            st = statuses[r.seat.id]
            cat = category(st.status, baselines.get(r.seat.id))
            add(row(r.seat.kernel, r.seat.kernel), cat, launches[r.seat.id],
                _why(cat, st.status, st.why, baselines.get(r.seat.id), r.seat.label))
    ops = sorted(rows.values(), key=lambda e: (-e["launches"], e["op"]))
    totals = {c: sum(e["by_category"][c] for e in ops) for c in CATEGORIES}
    return {"scope": "trace" if plan is not None else "database", "categories": list(CATEGORIES),
            "rows": ops, "totals": totals, "launches": sum(totals.values())}


def _why(cat, status, why, baseline, label) -> str | None:
    if cat == "torch":
        return (f"{label}: torch {baseline['nbx_ms'] / baseline['torch_ms']:.2f}x faster "
                f"on {baseline['device_name']}")
    if cat == "default":
        return f"{label}: {status}" + (f" ({why})" if why else "")
    return None


def speed(recs, baselines, launches) -> dict:
    """Each seat with a torch baseline: torch's time over the kernel's (above 1: the kernel is
    faster), and the launch-weighted end to end: all kernels, and as serve() runs them
    (torch where it is faster)."""
    seats = []
    for r in recs:
        b = baselines.get(r.seat.id)
        if b is None:
            continue
        seats.append({"seat": r.seat.id, "label": r.seat.label, "kernel": r.seat.kernel,
                      "launches": launches[r.seat.id], "nbx_ms": b["nbx_ms"], "torch_ms": b["torch_ms"],
                      "speedup": b["torch_ms"] / b["nbx_ms"] if b["nbx_ms"] > 0 else None,
                      "serve_runs": "torch" if rule.defers(b["nbx_ms"], b["torch_ms"]) else "nbx",
                      "device_name": b["device_name"], "torch_version": b["torch_version"],
                      "method": b["method"], "measured_at": b["measured_at"]})
    seats.sort(key=lambda s: (-(s["launches"] * s["torch_ms"]), s["label"]))
    return {"seats": seats, "end_to_end": end_to_end(seats),
            "unmeasured": sum(1 for r in recs if r.cert is not None and r.seat.id not in baselines)}


def end_to_end(seats) -> dict | None:
    """Launch-weighted totals over seats with baselines: sum(launches x ms) per side."""
    w = [s for s in seats if s["launches"] > 0]
    if not w:
        return None
    torch_ms = sum(s["launches"] * s["torch_ms"] for s in w)
    nbx_ms = sum(s["launches"] * s["nbx_ms"] for s in w)
    served_ms = sum(s["launches"] * (s["torch_ms"] if s["serve_runs"] == "torch" else s["nbx_ms"]) for s in w)
    return {"seats": len(w), "launches": sum(s["launches"] for s in w), "torch_ms": torch_ms,
            "nbx_ms": nbx_ms, "served_ms": served_ms,
            "speedup": torch_ms / nbx_ms if nbx_ms > 0 else None,
            "served_speedup": torch_ms / served_ms if served_ms > 0 else None}


def refusals(store, profile, recs) -> dict:
    """The refusals of each seat's last tuning (what holds now): counts by reason and
    kernel, and each one with where it was judged (shape, error, tolerance) or its error."""
    last = {r.last_tuning.id for r in recs if r.last_tuning is not None}
    items = []
    if profile is not None and last:
        for r, seat, t in store.refusals(profile=profile.name):
            if r.tuning_id not in last:
                continue
            items.append({"seat": seat.id, "label": seat.label, "kernel": seat.kernel, "reason": r.reason,
                          "config": r.config, "detail": r.detail,
                          "problem": json.loads(r.problem) if r.problem else None, "err": r.err,
                          "rtol": r.rtol, "tuning": t.id})
    by = {}
    for it in items:
        by.setdefault(it["reason"], Counter())[it["kernel"]] += 1
    by_reason = {k: dict(sorted(v.items())) for k, v in sorted(by.items(), key=lambda kv: -sum(kv[1].values()))}
    return {"total": len(items), "by_reason": by_reason, "items": items}


def buckets(recs, statuses, specs, profile, plan=None) -> list[dict]:
    """Per kernel and launch dimension: the ladder, the buckets its seats hold on it, and the
    shapes seen there (with their launches, given a trace)."""
    counts = {}
    if plan is not None:
        for sp in plan.seats.values():
            for p, n in sp.problems.items():
                counts[p] = counts.get(p, 0) + n
    out = {}
    for r in recs:
        spec = specs.get(r.seat.kernel)
        if spec is None or profile is None:
            continue
        try:
            bucket = decode_bucket(spec.key, r.seat.bucket)
        except (KeyError, ValueError):
            continue
        k = out.setdefault(r.seat.kernel, {"kernel": r.seat.kernel, "dims": [
            {"name": d.name, "ladder": d.ladder,
             "ladder_rows": [[row.up_to, row.step] for row in profile.ladder(d.ladder).rows],
             "buckets": [], "shapes": {}} for d in spec.key]})
        for i, (lo, hi) in enumerate(bucket):
            dim = k["dims"][i]
            dim["buckets"].append({"lo": lo, "hi": hi, "seat": r.seat.id, "status": statuses[r.seat.id].status})
            for p in r.problems:
                if i < len(p.dims):
                    v = p.dims[i]
                    dim["shapes"][v] = dim["shapes"].get(v, 0) + counts.get(p, 0)
    for k in out.values():
        for dim in k["dims"]:
            # Seats sharing a bucket on this dim: the best status is the one drawn.
            best = {}
            for b in sorted(dim["buckets"], key=lambda b: -_RANK.index(b["status"])):
                best[(b["lo"], b["hi"])] = b
            dim["buckets"] = sorted(best.values(), key=lambda b: (b["lo"], b["hi"]))
            dim["shapes"] = [{"value": v, "launches": n} for v, n in sorted(dim["shapes"].items())]
    return [out[k] for k in sorted(out)]


def timeline(store, plan=None) -> dict:
    """The seats the last census run that tuned anything (of this trace, given one) spent
    time on: when each started and ended, and its seconds screening, timing, and the rest
    (compiles, inputs and oracles, the store)."""
    for run, trace in store.census_runs(limit=50):
        if plan is not None and trace.sha256 != plan.sha256:
            continue
        rows = store.run_tunings(run.id)
        if not rows:
            continue
        t0 = min(t.started_at for t, _ in rows)
        seats = []
        for t, seat in rows:
            seats.append({"seat": seat.id, "label": seat.label, "kernel": seat.kernel, "kind": t.kind,
                          "outcome": t.outcome, "search": t.search,
                          "start_s": (t.started_at - t0).total_seconds(),
                          "end_s": (t.finished_at - t0).total_seconds(),
                          "screen_s": t.screen_s, "bench_s": t.bench_s, "total_s": t.total_s,
                          "other_s": max(0.0, t.total_s - t.screen_s - t.bench_s),
                          "candidates": t.candidates, "survivors": t.survivors})
        return {"run": _run_dict(run, trace), "seats": seats,
                "seconds": {k: sum(s[k] for s in seats) for k in ("screen_s", "bench_s", "other_s", "total_s")}}
    return {"run": None, "seats": [], "seconds": None}


def _run_dict(run, trace) -> dict:
    return {"id": run.id, "trace": trace.path, "profile": run.profile, "status": run.status,
            "started_at": iso_utc(run.started_at),
            "finished_at": iso_utc(run.finished_at) if run.finished_at else None,
            "summary": json.loads(run.summary) if run.summary else None}


def provenance(store, recs, statuses, specs, here) -> dict:
    """What the current certificates were made under (each distinct provenance with its seat
    count), this installation's versions and kernel hashes, what is stale and why, and the
    census runs, newest first."""
    groups = Counter()
    for r in recs:
        if r.cert_tuning is not None:
            groups[tuple(getattr(r.cert_tuning, f) for f in PROVENANCE)] += 1
    kernels = sorted({r.seat.kernel for r in recs})
    return {
        "certificates": [{**dict(zip(PROVENANCE, k)), "seats": n} for k, n in sorted(groups.items())],
        "here": {**here, "kernel_source_hash": {k: specs[k].source_hash for k in kernels if k in specs}},
        "stale": [{"seat": r.seat.id, "label": r.seat.label, "why": statuses[r.seat.id].why}
                  for r in recs if statuses[r.seat.id].status == "stale"],
        "runs": [_run_dict(run, trace) for run, trace in store.census_runs(limit=20)],
    }

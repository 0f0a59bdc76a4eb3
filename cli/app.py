"""`nbx-tune`: census, queries, export/import, profiles, database, trace.

Commands are thin: they parse options, call `nbx_tune.tuner.api` (or the profiles
module), and draw the result. A user error is an `NbxError`, printed on one line with the
next step to take, exit code 1; misuse (a bad option) is exit code 2.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from nbx_tune.cli import render
from nbx_tune.errors import NbxError

app = typer.Typer(help="Autotuning and certification of Triton kernels, with a persistent config database.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
profiles_app = typer.Typer(help="Device profiles: list, show, check.", no_args_is_help=True)
db_app = typer.Typer(help="The database schema: upgrade, current.", no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")
app.add_typer(db_app, name="db")

out = Console()
err = Console(stderr=True)

DbOpt = typer.Option(None, "--db", help="Database URL (else NBX_TUNE_DB, else a SQLite file in the user cache).")
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON.")
PluginOpt = typer.Option(None, "--plugin", help="Import a module providing kernels (repeatable).")
ProfileOpt = typer.Option(None, "--profile", help="Profile name or .yml file (default: this device's).")


def _print_seats(lines, title: str) -> None:
    """The seats table, then why each seat that is not plainly certified is what it is."""
    out.print(render.seats_table(lines, title))
    for line in render.seat_notes(lines):
        out.print(line, highlight=False)


def user_errors(fn):
    """Print an NbxError on one line and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NbxError as e:
            render.error(err, str(e))
            raise typer.Exit(1) from None

    return wrapper


@app.command()
@user_errors
def census(
    model: Path = typer.Option(..., "--model", help="Trace file (trace format v1)."),
    db: Optional[str] = DbOpt,
    profile: Optional[str] = ProfileOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="Plan and report coverage only; write nothing."),
    json_out: bool = JsonOpt,
    strategy: str = typer.Option(
        "pruned", "--strategy",
        help="Search strategy: pruned (quick estimates, then the contenders timed in turned rounds) or exhaustive."),
    isolate: bool = typer.Option(True, "--isolate/--no-isolate",
                                 help="Run candidates in a worker process that a crash or hang cannot take down."),
    enqueue: bool = typer.Option(False, "--enqueue", help="Record the seats for `nbx-tune worker`; tune nothing."),
    plugin: Optional[List[str]] = PluginOpt,
):
    """Map a trace to seats, report coverage, and certify what is pending."""
    from nbx_tune.tuner import api

    console = err if json_out else out
    with render.RichReporter(console, show_tables=not json_out) as reporter:
        rep = api.census(str(model), db, profile, dry_run, reporter, strategy, plugin or (), isolate, enqueue)
    if json_out:
        render.print_json(rep.to_dict())
        return
    if dry_run:
        out.print(render.coverage_table(rep))
    out.print(render.ops_table(rep))
    extra = render.uncovered_table(rep)
    if extra is not None:
        out.print(extra)
    title = ("Seats (dry run: nothing written)" if dry_run else
             f"Seats queued by census run {rep.run_id} (tuned by `nbx-tune worker`)" if enqueue else
             f"Seats after census run {rep.run_id}")
    _print_seats(rep.seats, title)
    c = rep.counts()
    out.print(f"{c['certified']['seats']} certified, {c['unscreened']['seats']} unscreened, "
              f"{c['refused']['seats']} refused, {c['pending']['seats']} pending, "
              f"{c['stale']['seats']} stale seats in {rep.seconds:.1f} s")


@app.command()
@user_errors
def worker(
    db: Optional[str] = DbOpt,
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Comma-separated GPU ids: one worker process per id."),
    profile: Optional[str] = ProfileOpt,
    max_seats: Optional[int] = typer.Option(None, "--max-seats", help="Stop after tuning this many seats."),
    lease: Optional[float] = typer.Option(None, "--lease", help="Seconds a claim outlives its last heartbeat."),
    strategy: str = typer.Option("pruned", "--strategy"),
    isolate: bool = typer.Option(True, "--isolate/--no-isolate"),
    json_out: bool = JsonOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """Tune queued seats of this device's profile until none is left (a fleet shares one --db)."""
    from nbx_tune.tuner import api

    if gpus:
        from nbx_tune.tuner.fleet import spawn_workers, wait_workers

        ids = [g.strip() for g in gpus.split(",") if g.strip()]
        argv = [*(["--db", db] if db else []), *(["--profile", profile] if profile else []),
                *(["--max-seats", str(max_seats)] if max_seats else []), *(["--lease", str(lease)] if lease else []),
                "--strategy", strategy, "--isolate" if isolate else "--no-isolate", *(["--json"] if json_out else []),
                *[x for p in plugin or () for x in ("--plugin", p)]]
        wait_workers(spawn_workers(ids, argv))
        return
    console = err if json_out else out
    with render.RichReporter(console, show_tables=False) as reporter:
        rep = api.worker(db, profile, reporter, strategy, plugin or (), isolate, max_seats, lease)
    if json_out:
        render.print_json(rep.to_dict())
        return
    out.print(f"worker {rep.holder} ({rep.device}, {rep.profile}): {len(rep.tuned)} seats in {rep.seconds:.1f} s "
              f"({rep.seats_per_hour:.0f} seats/hour)", highlight=False)


@app.command()
@user_errors
def seats(
    status: Optional[List[str]] = typer.Option(None, "--status", help="certified, unscreened, pending, refused, stale (repeatable)."),
    kernel: Optional[str] = typer.Option(None, "--kernel"),
    profile: Optional[str] = ProfileOpt,
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """List seats with their status, certified config and who holds them."""
    from nbx_tune.tuner import api

    views = api.seat_views(db, status, kernel, profile, plugin or ())
    if json_out:
        render.print_json([v.to_dict() for v in views])
        return
    _print_seats(views, f"{len(views)} seats")


@app.command()
@user_errors
def show(
    seat: str = typer.Argument(..., help="Seat id, or kernel|dtypes|flags|bucket."),
    profile: Optional[str] = ProfileOpt,
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """One seat whole: its certificate, history, measurements and refusals."""
    from nbx_tune.tuner import api

    d = api.show_seat(seat, db, profile, plugin or ())
    if json_out:
        render.print_json(d)
        return
    s = d["seat"]
    out.print(f"[bold]seat {s['id']}[/] {s['label']} on {s['profile']}: {render.status_text(s['status'])}"
              + (f" ({s['why']})" if s["why"] else ""), highlight=False)
    for h in d["history"]:
        p = h["provenance"]
        out.print(f"\n[bold]tuning {h['tuning']}[/] ({h['kind']}, {h['outcome']}) {h['finished_at']} on "
                  f"{p['device_name']} [{p['device_target']}], driver {p['driver']}, Triton {p['triton_version']}, "
                  f"torch {p['torch_version']}; {h['candidates']} candidates, {h['survivors']} survived; "
                  f"screen {h['seconds']['screen']} s, timing {h['seconds']['bench']} s", highlight=False)
        c = h.get("certificate")
        if c:
            state = "current" if c["current"] else f"superseded: {c['superseded_reason']}"
            margin = "-" if c["margin"] is None else f"{100 * c['margin']:.1f} %"
            out.print(f"  certificate ({state}): {c['config']} {render.ms(c['median_ms'])} ms "
                      f"[{render.ms(c['spread_ms'][0])}..{render.ms(c['spread_ms'][1])}] by {c['timing_method']}; "
                      f"runner-up {c['runner_up'] or '-'} {render.ms(c['runner_up_ms'])} ms, margin {margin}",
                      highlight=False)
            for sc in c["screens"]:
                out.print(f"  screened at {sc['problem']['dims']}: err {sc['err']:.3g} <= rtol {sc['rtol']:.3g}"
                          + (f", two launches: {sc['repeat']}" if sc.get("repeat") else ""), highlight=False)
            if c["unscreened"]:
                out.print(f"  [yellow]unscreened:[/] {c['unscreened']}")
        out.print(f"  search: {render.search_text(h, c)}", highlight=False)
        if h["measurements"]:
            t = Table(title="timed candidates")
            for col in ("config", "median ms", "p20", "p80", "method"):
                t.add_column(col, overflow="fold")
            for m in h["measurements"][:12]:
                t.add_row(m["config"], render.ms(m["median_ms"]), render.ms(m["p20_ms"]),
                          render.ms(m["p80_ms"]), m["method"])
            out.print(t)
    if d["refusals"]:
        t = Table(title=f"refusals ({len(d['refusals'])})")
        for col in ("tuning", "config", "reason", "detail"):
            t.add_column(col, overflow="fold")  # a config's tail (warps, stages) tells two apart
        for r in d["refusals"]:
            t.add_row(str(r["tuning"]), r["config"] or "(whole seat)", r["reason"], r["detail"])
        out.print(t)
    out.print(f"\nsampled regret of ranked searches ({s['kernel']} on {s['profile']}): "
              f"{render.regret_text(d['sampled_regret'])}", highlight=False)


@app.command()
@user_errors
def refusals(
    kernel: Optional[str] = typer.Option(None, "--kernel"),
    reason: Optional[str] = typer.Option(None, "--reason", help="e.g. wrong_answer, smem_over_budget, crash."),
    profile: Optional[str] = ProfileOpt,
    limit: int = typer.Option(200, "--limit"),
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
):
    """Every rejected config with its reason, detail and the versions it was made under."""
    from nbx_tune.tuner import api

    rows = api.refusal_rows(db, kernel, reason, profile, limit)
    if json_out:
        render.print_json(rows)
        return
    t = Table(title=f"{len(rows)} refusals")
    for col in ("seat", "config", "reason", "detail", "Triton"):
        t.add_column(col, overflow="fold")  # a config's tail (warps, stages) tells two apart
    for r in rows:
        t.add_row(f"{r['seat']} {r['label']}", r["config"] or "(whole seat)", r["reason"], r["detail"],
                  r["triton_version"])
    out.print(t)


@app.command()
@user_errors
def unscreened(
    profile: Optional[str] = ProfileOpt,
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """Seats served by a config never screened at some of their shapes, and why."""
    from nbx_tune.tuner import api

    views = api.seat_views(db, ["unscreened"], None, profile, plugin or ())
    if json_out:
        render.print_json([v.to_dict() for v in views])
        return
    _print_seats(views, f"{len(views)} unscreened seats")


@app.command()
@user_errors
def export(
    profile: str = typer.Option(..., "--profile", help="Profile whose certified configs to export."),
    output: Path = typer.Option(..., "-o", "--output", help="Table file to write (JSON)."),
    db: Optional[str] = DbOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """Write a profile's certified configs as a deterministic certified table."""
    from nbx_tune.tuner import api

    s = api.export(profile, str(output), db, plugin or ())
    out.print(f"wrote {s.entries} certified configs to {s.path}", highlight=False)
    for label, why in s.skipped:
        out.print(f"[yellow]skipped[/] {label}: stale ({why})", highlight=False)


@app.command("import")
@user_errors
def import_cmd(
    table: Path = typer.Argument(..., help="A certified table written by `nbx-tune export`."),
    db: Optional[str] = DbOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """Merge a certified table into the database (the faster certificate of a seat wins)."""
    from nbx_tune.tuner import api

    s = api.import_(str(table), db, plugin or ())
    out.print(f"{s.path} ({s.profile}): {s.added} certificates added, {s.kept_existing} kept the "
              f"faster existing one, {len(s.skipped)} skipped", highlight=False)
    for label, why in s.skipped:
        out.print(f"[yellow]skipped[/] {label}: {why}", highlight=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@user_errors
def trace(
    output: Path = typer.Option(..., "-o", "--output", help="Trace file to write."),
    command: Optional[List[str]] = typer.Argument(None, help="The command to record, after --."),
):
    """Record the aten ops a PyTorch program dispatches: nbx-tune trace -o t.tsv -- python m.py"""
    from nbx_tune.tuner.recorder import trace_command

    summary = trace_command(output, list(command or []))
    out.print(f"wrote {summary.rows} rows ({summary.launches} launches) to {summary.path}", highlight=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@user_errors
def run(
    command: Optional[List[str]] = typer.Argument(None, help="The command to run, after --."),
    stats_json: Optional[Path] = typer.Option(None, "--stats-json", help="Also write the per-op stats as JSON."),
):
    """Run a PyTorch program on the certified kernels: nbx-tune run -- python m.py (stats at exit)"""
    from nbx_tune.tuner.serve_main import run_command

    raise typer.Exit(run_command(list(command or []), stats_json))


# ----------------------------------------------------------------------------- profiles

@profiles_app.command("list")
@user_errors
def profiles_list(json_out: bool = JsonOpt):
    """Shipped profiles, and which one this device matches."""
    from nbx_tune.profiles import builtin_profiles, current_target, match_profile

    profiles = builtin_profiles()
    try:
        target = current_target()
        mine = match_profile(target, profiles.values()).name
    except NbxError:
        target, mine = "none", None
    if json_out:
        render.print_json({"device_target": target, "device_profile": mine, "profiles": [
            {"name": p.name, "vendor": p.vendor, "architecture": p.architecture,
             "matches": list(p.compute_capability_matches), "source": p.source} for p in profiles.values()]})
        return
    t = Table(title=f"Profiles (this device: {target})")
    for col in ("name", "vendor", "matches", "shared mem", "stages", "screen budget", "description"):
        t.add_column(col)
    for p in sorted(profiles.values(), key=lambda p: (p.vendor, p.name)):
        name = f"[bold green]{p.name} *[/]" if p.name == mine else p.name
        t.add_row(name, p.vendor, ", ".join(p.compute_capability_matches),
                  f"{p.memory.max_shared_memory_per_block // 1024} KiB", str(p.max_num_stages),
                  f"{p.screen_max_bytes / 2**20:.0f} MiB", p.description)
    out.print(t)


def _profile_dict(p) -> dict:
    return {"name": p.name, "vendor": p.vendor, "architecture": p.architecture, "description": p.description,
            "source": p.source, "hash": p.hash, "compute_capability_matches": list(p.compute_capability_matches),
            "memory": p.memory.__dict__, "max_num_stages": p.max_num_stages,
            "launch_options": list(p.launch_options), "timing": p.timing.__dict__,
            "candidate_timeout_s": p.candidate_timeout_s, "screen_rtol": dict(p.screen_rtol),
            "screen_max_bytes": p.screen_max_bytes, "screen_unsupported": dict(p.screen_unsupported),
            "ladders": {n: [{"up_to": r.up_to, "step": r.step} for r in lad.rows] for n, lad in p.ladders.items()}}


@profiles_app.command("show")
@user_errors
def profiles_show(name: str = typer.Argument(..., help="Profile name or .yml file."), json_out: bool = JsonOpt):
    """Every setting of one profile."""
    from nbx_tune.profiles import get_profile

    d = _profile_dict(get_profile(name))
    if json_out:
        render.print_json(d)
        return
    t = Table(title=f"{d['name']}: {d['description']} ({d['source']})", show_header=False)
    t.add_column("key", style="bold")
    t.add_column("value")
    for k, v in d.items():
        if k != "ladders":
            t.add_row(k, str(v))
    for n, rows in d["ladders"].items():
        t.add_row(f"ladder {n}", ", ".join(f"<={r['up_to'] if r['up_to'] is not None else 'inf'} step {r['step']}"
                                           for r in rows))
    out.print(t)


@profiles_app.command("check")
@user_errors
def profiles_check(file: Path = typer.Argument(..., help="A profile .yml file to validate.")):
    """Validate a profile file; errors name the file and the key path."""
    from nbx_tune.profiles import load_profile_file

    p = load_profile_file(file)
    out.print(f"{file}: ok (profile {p.name}, {p.architecture}, hash {p.hash})", highlight=False)


# ----------------------------------------------------------------------------- database

@db_app.command("upgrade")
@user_errors
def db_upgrade(db: Optional[str] = DbOpt):
    """Apply the schema migrations up to head (creates a fresh database)."""
    from nbx_tune.tuner import api
    from nbx_tune.tuner.store.db import safe_url
    from nbx_tune import settings

    before, after = api.db_upgrade(db)
    url = safe_url(settings.db_url(db))
    if before == after:
        out.print(f"{url}: already at head ({after})", highlight=False)
    else:
        out.print(f"{url}: upgraded {before or 'empty'} -> {after}", highlight=False)


@db_app.command("current")
@user_errors
def db_current(db: Optional[str] = DbOpt, json_out: bool = JsonOpt):
    """The database's schema revision and the head this nbx-tune needs."""
    from nbx_tune.tuner import api

    d = api.db_current(db)
    if json_out:
        render.print_json(d)
        return
    state = "at head" if d["revision"] == d["head"] else (
        "empty" if d["revision"] is None else "needs `nbx-tune db upgrade`")
    out.print(f"{d['url']}: revision {d['revision'] or '(none)'}, head {d['head']} ({state})", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())

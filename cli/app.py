"""`nbx-tune`: census, queries, export/import, profiles, database, trace.

Commands are thin: they parse options, call `nbx_tune.tuner.commands` (or the profiles
module), and draw the result. A user error is an `NbxError`, printed on one line with the
next step to take, exit code 1; misuse (a bad option) is exit code 2.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from nbx_tune.cli import render
from nbx_tune.cli.inductor import inductor_app
from nbx_tune.errors import NbxError
from nbx_tune.tuner import commands as api


class _Boundary(TyperGroup):
    """The CLI's one boundary: every command, sub-commands included, runs inside it. A user
    error is one line and exit 1; Ctrl-C says what was kept, exit 130."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except NbxError as e:
            render.error(err, str(e))
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            render.interrupted(err)
            raise typer.Exit(130) from None


app = typer.Typer(help="Autotuning and certification of Triton kernels, with a persistent config database.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, cls=_Boundary)
profiles_app = typer.Typer(help="Device profiles: list, show, check.", no_args_is_help=True)
db_app = typer.Typer(help="The database schema: upgrade, current.", no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")
app.add_typer(db_app, name="db")
app.add_typer(inductor_app, name="inductor")

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


def _seat_list(views, json_out: bool, what: str) -> None:
    """`seats` and `unscreened`: the views as JSON, or the table titled with their count."""
    if json_out:
        render.print_json([v.to_dict() for v in views])
    else:
        _print_seats(views, f"{len(views)} {what}")


@app.command()
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
    baseline: bool = typer.Option(
        False, "--baseline",
        help="Then time the trace's certified seats against torch's op on this device and record it, "
             "as `nbx-tune baseline` does: under serve(), torch runs where it is faster."),
    plugin: Optional[List[str]] = PluginOpt,
):
    """Map a trace to seats, report coverage, and certify what is pending."""
    from nbx_tune.tuner import commands as api

    if baseline and (dry_run or enqueue):
        raise NbxError("--baseline times the seats this census certifies: not with --dry-run or --enqueue")
    console = err if json_out else out
    with render.RichReporter(console, show_tables=not json_out) as reporter:
        rep = api.census(str(model), db, profile, dry_run, reporter, strategy, plugin or (), isolate, enqueue)
    base = None
    if baseline:
        with render.progress_bar(console, "torch baselines") as step:
            base = api.baseline([str(model)], db, profile, plugin or (), None, step,
                                notice=lambda text: err.print(f"note: {text}", highlight=False)).to_dict()
    if json_out:
        render.print_json({**rep.to_dict(), **({"baselines": base} if base is not None else {})})
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
    if base is not None:
        _print_baselines(base)
    if not dry_run:
        out.print(render.next_steps(rep, db_given=db is not None, baselined=base is not None), highlight=False)


@app.command()
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
    from nbx_tune.tuner import commands as api

    if gpus:
        ids = [g.strip() for g in gpus.split(",") if g.strip()]
        argv = [*(["--db", db] if db else []), *(["--profile", profile] if profile else []),
                *(["--max-seats", str(max_seats)] if max_seats else []), *(["--lease", str(lease)] if lease else []),
                "--strategy", strategy, "--isolate" if isolate else "--no-isolate", *(["--json"] if json_out else []),
                *[x for p in plugin or () for x in ("--plugin", p)]]
        # One process of this same command per GPU: the CLI starts itself; the tuner never does.
        api.run_fleet(ids, [sys.executable, "-m", "nbx_tune.cli.app", "worker", *argv])
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
def seats(
    status: Optional[List[str]] = typer.Option(None, "--status", help="certified, unscreened, pending, refused, stale (repeatable)."),
    kernel: Optional[str] = typer.Option(None, "--kernel"),
    profile: Optional[str] = ProfileOpt,
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """List seats with their status, certified config and who holds them."""
    from nbx_tune.tuner import commands as api

    _seat_list(api.seat_views(db, status, kernel, profile, plugin or ()), json_out, "seats")


@app.command()
def show(
    seat: str = typer.Argument(..., help="Seat id, or kernel|dtypes|flags|bucket."),
    profile: Optional[str] = ProfileOpt,
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """One seat whole: its certificate, history, measurements and refusals."""
    from nbx_tune.tuner import commands as api

    d = api.show_seat(seat, db, profile, plugin or ())
    if json_out:
        render.print_json(d)
        return
    render.show_seat(out, d)


@app.command()
def refusals(
    kernel: Optional[str] = typer.Option(None, "--kernel"),
    reason: Optional[str] = typer.Option(None, "--reason", help="One of: " + ", ".join(api.REFUSAL_REASONS) + "."),
    profile: Optional[str] = ProfileOpt,
    limit: int = typer.Option(200, "--limit", help="Show the newest N (0: all); the title says how many there are."),
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
):
    """Every rejected config with its reason, detail and the versions it was made under."""
    from nbx_tune.tuner import commands as api

    rows, total = api.refusal_rows(db, kernel, reason, profile, limit or None, with_total=True)
    if json_out:
        render.print_json(rows)
        return
    out.print(render.refusals_table(rows, total))


@app.command()
def unscreened(
    profile: Optional[str] = ProfileOpt,
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """Seats served by a config never screened at some of their shapes, and why."""
    from nbx_tune.tuner import commands as api

    _seat_list(api.seat_views(db, ["unscreened"], None, profile, plugin or ()), json_out, "unscreened seats")


@app.command()
def export(
    profile: Optional[str] = typer.Option(None, "--profile", help="Profile whose certified configs to export "
                                          "(without it, the error names those the database holds)."),
    output: Path = typer.Option(..., "-o", "--output", help="Table file to write (JSON)."),
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """Write a profile's certified configs as a deterministic certified table."""
    from nbx_tune.tuner import commands as api

    s = api.export(profile, str(output), db, plugin or ())
    if json_out:
        render.print_json({"path": s.path, "entries": s.entries,
                           "skipped": [{"seat": label, "why": why} for label, why in s.skipped]})
        return
    out.print(f"wrote {s.entries} certified configs to {s.path}", highlight=False)
    for label, why in s.skipped:
        out.print(f"[yellow]skipped[/] {label}: stale ({why})", highlight=False)


@app.command("import")
def import_cmd(
    table: Path = typer.Argument(..., help="A certified table written by `nbx-tune export`."),
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """Merge a certified table into the database (the faster certificate of a seat wins,
    once screened here when it would replace a valid one)."""
    from nbx_tune.tuner import commands as api

    s = api.import_(str(table), db, plugin or (), notice=lambda text: err.print(f"note: {text}", highlight=False))
    if json_out:
        render.print_json({"path": s.path, "profile": s.profile, "added": s.added,
                           "kept_existing": s.kept_existing, "unchanged": s.unchanged, "baselines": s.baselines,
                           "not_screened": [{"seat": label, "why": why} for label, why in s.unscreened],
                           "skipped": [{"seat": label, "why": why} for label, why in s.skipped]})
        return
    out.print(render.import_summary(s), highlight=False)
    for label, why in s.unscreened:
        out.print(f"[yellow]kept the current certificate[/] {label}: the import claims to be faster "
                  f"but did not pass the screen here ({why})", highlight=False)
    for label, why in s.skipped:
        out.print(f"[yellow]skipped[/] {label}: {why}", highlight=False)


@app.command()
def baseline(
    model: List[Path] = typer.Option(..., "--model", help="Trace file (repeatable): the rows whose seats are timed."),
    db: Optional[str] = DbOpt,
    profile: Optional[str] = ProfileOpt,
    budget_s: Optional[float] = typer.Option(None, "--budget-s", help="Start no seat after this many seconds."),
    json_out: bool = JsonOpt,
    plugin: Optional[List[str]] = PluginOpt,
):
    """Time each certified seat of the traces against torch's own op on this GPU, and record
    it: under serve(), a seat where torch is faster runs torch."""
    from nbx_tune.tuner import commands as api

    console = err if json_out else out
    with render.progress_bar(console, "seats") as step:
        rep = api.baseline([str(m) for m in model], db, profile, plugin or (), budget_s, step,
                           notice=lambda text: err.print(f"note: {text}", highlight=False))
    if json_out:
        render.print_json(rep.to_dict())
        return
    _print_baselines(rep.to_dict())



@app.command()
def report(
    model: Optional[Path] = typer.Option(None, "--model", help="Trace file: report its ops (else every seat of the profile)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="HTML file to write (self-contained, offline)."),
    db: Optional[str] = DbOpt,
    profile: Optional[str] = typer.Option(None, "--profile", help="Profile name or .yml file (default: the last census's)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report's data as JSON."),
    plugin: Optional[List[str]] = PluginOpt,
):
    """The database as one HTML page: coverage, speed against torch, refusals, buckets,
    certification cost and provenance."""
    from nbx_tune.tuner import commands as api

    if output is None and not json_out:
        raise NbxError("nbx-tune report needs -o report.html (or --json)")
    data = api.report(str(model) if model else None, db, profile, plugin or ())
    if output is not None:
        path = api.write_report(data, str(output))
        if not json_out:
            out.print(f"wrote {path}", highlight=False)
    if json_out:
        render.print_json(data)

def _print_baselines(d: dict) -> None:
    """The seats against torch, why any got no baseline, and what serve() runs."""
    out.print(render.baselines_table(d))
    for line in render.baselines_notes(d):
        out.print(line, highlight=False)
    out.print(render.baselines_summary(d), highlight=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def trace(
    output: Path = typer.Option(..., "-o", "--output", help="Trace file to write."),
    json_out: bool = JsonOpt,
    command: Optional[List[str]] = typer.Argument(None, help="The command to record, after --."),
):
    """Record the aten ops a PyTorch program dispatches: nbx-tune trace -o t.tsv -- python m.py

    This records the whole program, model construction and weight initialization included.
    To record only the forward pass, wrap it in your script instead:
    `with nbx_tune.record("t.tsv"): model(x)`."""
    from nbx_tune.tuner import commands as api

    summary = api.trace(output, list(command or []))
    if json_out:
        render.print_json({"path": str(summary.path), "rows": summary.rows, "launches": summary.launches})
        return
    out.print(f"wrote {summary.rows} rows ({summary.launches} launches) to {summary.path}", highlight=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    command: Optional[List[str]] = typer.Argument(None, help="The command to run, after --."),
    stats_json: Optional[Path] = typer.Option(None, "--stats-json", help="Also write the per-op stats as JSON."),
    json_out: bool = typer.Option(False, "--json", help="Print the exit status and per-op stats as JSON "
                                  "on stdout when the program ends (after its own output)."),
):
    """Run a PyTorch program on the certified kernels: nbx-tune run -- python m.py (stats at exit)"""
    from nbx_tune.tuner import commands as api

    rc, stats = api.run_program(list(command or []), stats_json, json_out)
    if json_out:
        render.print_json({"exit_status": rc, "stats": stats})
    raise typer.Exit(rc)


# ----------------------------------------------------------------------------- profiles

@profiles_app.command("list")
def profiles_list(json_out: bool = JsonOpt):
    """Shipped profiles, and which one this device matches."""
    from nbx_tune.profiles import builtin_profiles, current_target, match_profile

    from nbx_tune.tuner.commands import ensure_device

    profiles = builtin_profiles()
    try:
        ensure_device()  # no GPU: the interpreter, as the census that ran here saw it
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
def profiles_check(file: Path = typer.Argument(..., help="A profile .yml file to validate."), json_out: bool = JsonOpt):
    """Validate a profile file; errors name the file and the key path."""
    from nbx_tune.profiles import load_profile_file

    p = load_profile_file(file)
    if json_out:
        render.print_json({"file": str(file), "ok": True, "profile": p.name, "architecture": p.architecture,
                           "hash": p.hash})
        return
    out.print(f"{file}: ok (profile {p.name}, {p.architecture}, hash {p.hash})", highlight=False)


# ----------------------------------------------------------------------------- database

@db_app.command("upgrade")
def db_upgrade(db: Optional[str] = DbOpt, json_out: bool = JsonOpt):
    """Apply the schema migrations up to head (creates a fresh database)."""
    from nbx_tune.tuner import commands as api

    url, before, after = api.db_upgrade(db)
    if json_out:
        render.print_json({"url": url, "before": before, "after": after})
        return
    if before == after:
        out.print(f"{url}: already at head ({after})", highlight=False)
    else:
        out.print(f"{url}: upgraded {before or 'empty'} -> {after}", highlight=False)


@db_app.command("current")
def db_current(db: Optional[str] = DbOpt, json_out: bool = JsonOpt):
    """The database's schema revision and the head this nbx-tune needs."""
    from nbx_tune.tuner import commands as api

    d = api.db_current(db)
    if json_out:
        render.print_json(d)
        return
    state = "at head" if d["revision"] == d["head"] else (
        "empty" if d["revision"] is None else "needs `nbx-tune db upgrade`")
    out.print(f"{d['url']}: revision {d['revision'] or '(none)'}, head {d['head']} ({state})", highlight=False)


def main() -> None:
    code = 0
    try:
        app()
    except SystemExit as e:
        code = e.code
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    # The command is done. What is left is the interpreter's shut-down, which with torch
    # and Triton loaded takes most of a second of a census's wall time: the exit handlers
    # still run (multiprocessing's, logging's, temporary files'), the module teardown does not.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`nbx-tune show | head`)
            code = code or 1
    os._exit(code or 0)


if __name__ == "__main__":
    main()

"""`nbx-tune inductor ...`: Inductor's max-autotune GEMM choices, certified by nbx-tune and
kept in the database (certify, list, show, export, import). Thin, as every command: the work
is `nbx_tune.tuner.commands`'."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from nbx_tune.cli import render
from nbx_tune.tuner import commands as api

inductor_app = typer.Typer(help="Inductor's max-autotune GEMM choices, certified: certify, list, show, export, "
                                "import.", no_args_is_help=True)

out = Console()
err = Console(stderr=True)

DbOpt = typer.Option(None, "--db", help="Database URL (else NBX_TUNE_DB, else a SQLite file in the user cache).")
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON.")
ProfileOpt = typer.Option(None, "--profile", help="Profile name or .yml file.")


def dims_text(e: dict) -> str:
    g = e.get("gemm")
    if not g:
        return "?"
    B, M, N, K = g["dims"]
    return f"{g['dtype']} {'' if B == 1 else f'{B}x'}{M}x{N}x{K} {g['layout']}"


def config_text(c: dict | None) -> str:
    """A template config in a line: its template, tile, stages and warps (the rest with --json)."""
    if not c:
        return "none passed"
    tile = "x".join(str(c[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K") if k in c)
    return f"{c['template_id']} {tile} s{c.get('num_stages', '?')} w{c.get('num_warps', '?')}"


def _speed(p: dict) -> str:
    return f"{p['aten_ms'] / p['ms']:.2f}" if p.get("aten_ms") and p.get("ms") else "-"


@inductor_app.command("certify")
def certify(
    trace: List[Path] = typer.Option(..., "--trace", help="Trace file (repeatable): its GEMMs are certified."),
    db: Optional[str] = DbOpt,
    profile: Optional[str] = typer.Option(None, "--profile", help="Profile name (default: this device's)."),
    limit: int = typer.Option(0, "--limit", help="At most this many GEMMs, most launched first (0: all)."),
    budget_s: Optional[float] = typer.Option(None, "--budget-s", help="Start no GEMM after this many seconds."),
    json_out: bool = JsonOpt,
):
    """Screen Inductor's Triton GEMM template configs for a trace's GEMMs against the fp64
    oracle, time the survivors beside aten, and record the fastest with the refusals (GPU)."""
    rows = []

    def one(c):
        rows.append(c)
        if not json_out:
            w = c.written
            err.print(f"{dims_text({'gemm': c.record['gemm']}) if c.record else c.gemm}: "
                      f"{c.error or (w.outcome + (' (current)' if w.current else ' (not current: ' + w.why + ')'))} "
                      f"[{c.seconds:.0f} s]", highlight=False)

    run = api.inductor_certify([str(t) for t in trace], db, profile, limit, budget_s, one)
    if json_out:
        render.print_json({"profile": run.profile, "db": run.db, "gemms": [{"gemm": c.gemm.__dict__, "error": c.error, "seconds": c.seconds,
                            "entry": c.record, **({"written": c.written.__dict__} if c.written else {})}
                           for c in rows]})
        return
    t = Table(title=f"Inductor choices certified for {run.profile}: "
                    f"{sum(1 for c in rows if c.written and c.written.current)} current of {len(rows)} GEMMs")
    for col in ("GEMM", "configs", "refused", "chosen", "aten/chosen", "s"):
        t.add_column(col)
    for c in rows:
        p = (c.record or {}).get("provenance", {})
        t.add_row(dims_text({"gemm": c.record["gemm"]}) if c.record else str(c.gemm), str(p.get("candidates", "-")),
                  str(len(p.get("refusals", []))), c.error or config_text(c.record["config"]), _speed(p),
                  f"{c.seconds:.0f}")
    out.print(t)
    out.print(f"recorded in {run.db}; `nbx-tune inductor export --profile {run.profile} -o T.json` writes the table",
              highlight=False)


@inductor_app.command("list")
def list_(profile: Optional[str] = ProfileOpt, db: Optional[str] = DbOpt, json_out: bool = JsonOpt):
    """The current choices: key, GEMM, config, its time against aten's, and whether it is stale here."""
    rows = api.inductor_list(db, profile)
    if json_out:
        render.print_json(rows)
        return
    t = Table(title=f"{len(rows)} Inductor choices")
    for col in ("id", "profile", "key", "op", "GEMM", "config", "ms", "aten ms", "aten/chosen", "stale here?"):
        t.add_column(col, overflow="fold")
    for r in rows:
        p = r["provenance"]
        t.add_row(str(r["certification"]), r["profile"], r["key"], r["op"], dims_text(r), config_text(r["config"]),
                  render.ms(p["ms"]), render.ms(p.get("aten_ms")), _speed(p),
                  f"[yellow]{r['stale']}[/]" if r["stale"] else "no")
    out.print(t)


@inductor_app.command("show")
def show(
    key: str = typer.Argument(..., help="Inductor's lookup key (as `inductor list` prints it), or a certification id."),
    profile: Optional[str] = ProfileOpt,
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
):
    """One key whole: every certification of it, its config, times, refusals and provenance."""
    rows = api.inductor_show(key, db, profile)
    if json_out:
        render.print_json(rows)
        return
    out.print(f"[bold]{rows[0]['entry']['key']}[/] ({rows[0]['profile']}, {rows[0]['entry']['op']}, "
              f"{dims_text(rows[0]['entry'])})", highlight=False)
    for r in rows:
        e, p = r["entry"], r["entry"]["provenance"]
        state = ("[green]current[/]" + (f", [yellow]stale here: {r['stale']}[/]" if r["stale"] else "")
                 if r["current"] else f"superseded: {r['superseded_reason']}" if e["config"] else "nothing chosen")
        out.print(f"certification {r['certification']} ({r['kind']}, {r['created_at']}): {state}", highlight=False)
        out.print(f"  chose {config_text(e['config'])}" + (f": {render.ms(p['ms'])} ms, aten "
                  f"{render.ms(p.get('aten_ms'))} ms, error {p['max_rel_err']:.3g}" if e["config"] else ""),
                  highlight=False)
        out.print(f"  {p.get('candidates', '?')} configs, {len(p['refusals'])} refused; torch {p['torch_version']}, "
                  f"Triton {p['triton_version']}, {p['device_name']}, driver {p.get('driver') or '?'}, "
                  f"measured {p['measured_at']}", highlight=False)
        for ref in p["refusals"]:
            out.print(f"    refused {json.dumps(ref['config'], sort_keys=True)}: {ref['reason']}", highlight=False)


@inductor_app.command("export")
def export(
    profile: Optional[str] = typer.Option(None, "--profile", help="Profile whose choices to export."),
    output: Path = typer.Option(..., "-o", "--output",
                                help="Table to write (JSON; shipped as kernels/tables/inductor/<profile>.json)."),
    db: Optional[str] = DbOpt,
    json_out: bool = JsonOpt,
):
    """Write a profile's current choices as a table in the shipped format (stale ones too:
    a table's reader judges them where it runs)."""
    d = api.inductor_export(profile, str(output), db)
    if json_out:
        render.print_json(d)
        return
    out.print(f"wrote {d['entries']} Inductor choices of {d['profile']} to {d['path']}", highlight=False)


@inductor_app.command("import")
def import_(table: Path = typer.Argument(..., help="A table written by `nbx-tune inductor export`."),
            db: Optional[str] = DbOpt, json_out: bool = JsonOpt):
    """Merge a table's choices into the database (under the same versions the faster wins;
    under other versions the newer)."""
    d = api.inductor_import(str(table), db)
    if json_out:
        render.print_json(d)
        return
    counts = {}
    for c in d["choices"]:
        counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
    out.print(f"{d['path']} ({d['profile']}): " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
              highlight=False)
    for c in d["choices"]:
        if c["outcome"] == "chosen" and not c["current"]:
            out.print(f"[yellow]kept the current choice[/] {c['key']}: {c['why']}", highlight=False)

"""Rich drawing of results: tables, the census progress, one-line errors."""

from __future__ import annotations

import json

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn)
from rich.table import Table

STATUS_STYLE = {"certified": "green", "unscreened": "yellow", "pending": "cyan", "refused": "red",
                "stale": "magenta"}


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def status_text(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def ms(v) -> str:
    return "" if v is None else f"{v:.4g}"


def short_config(text: str | None) -> str:
    """BLOCK_M=64,BLOCK_N=64,...,num_warps=4,num_stages=2 -> BM64 BN64 ... w4 s2."""
    if not text:
        return ""
    out = []
    for item in text.split(","):
        k, _, v = item.partition("=")
        if k == "num_warps":
            out.append(f"w{v}")
        elif k == "num_stages":
            out.append(f"s{v}")
        else:
            out.append("".join(p[0] for p in k.split("_") if p) + v)
    return " ".join(out)


def coverage_table(rep) -> Table:
    t = Table(title=f"Coverage of {rep.trace} on {rep.profile}: {rep.rows} rows, {rep.launches} launches")
    t.add_column("", style="bold")
    t.add_column("seats", justify="right")
    t.add_column("launches", justify="right")
    for status, c in rep.counts().items():
        t.add_row(status_text(status), str(c["seats"]), str(c["launches"]))
    uncovered = sum(rep.uncovered.values())
    t.add_row("not covered", f"{len(rep.uncovered)} ops", str(uncovered))
    bad = sum(n for *_, n in rep.not_servable)
    t.add_row("not servable", f"{len(rep.not_servable)} rows", str(bad))
    return t


def ops_table(rep) -> Table:
    """Coverage per trace op: launches served by a certificate, and why the rest are not."""
    t = Table(title="Coverage by op")
    t.add_column("op", overflow="fold")
    t.add_column("kernel", overflow="fold")
    t.add_column("launches", justify="right")
    t.add_column("served", justify="right")
    t.add_column("the rest", overflow="fold")
    for e in rep.by_op():
        rest = ", ".join(f"{n} {st}" for st, n in e["by_status"].items() if st not in ("certified", "unscreened"))
        t.add_row(e["op"], e["kernel"] or "-", str(e["launches"]), str(e["served"]), rest or "-")
    return t


def uncovered_table(rep) -> Table | None:
    if not rep.uncovered and not rep.not_servable:
        return None
    t = Table(title="Not covered and not servable")
    t.add_column("op")
    t.add_column("launches", justify="right")
    t.add_column("why")
    for op, n in sorted(rep.uncovered.items(), key=lambda kv: -kv[1]):
        t.add_row(op, str(n), "no kernel serves this op")
    for line, op, why, n in rep.not_servable:
        t.add_row(op, str(n), f"line {line}: {why}")
    return t


def seats_table(lines, title: str) -> Table:
    """One row per seat; why a seat is not certified is in the notes printed under it."""
    t = Table(title=title)
    t.add_column("id", justify="right", no_wrap=True)
    t.add_column("seat (kernel dtype flags)", overflow="fold")
    t.add_column("bucket", overflow="fold")
    t.add_column("status", no_wrap=True)
    t.add_column("config", overflow="fold")
    t.add_column("ms", justify="right", no_wrap=True)
    t.add_column("launches", justify="right", no_wrap=True)
    for s in lines:
        kernel, dtypes, flags, bucket = s.label.split("|")
        seat = f"{kernel} {dtypes}" + ("" if flags == "-" else f" {flags}")
        t.add_row(str(s.id or ""), seat, bucket, status_text(s.status), short_config(s.config),
                  ms(s.median_ms), str(s.launches))
    return t


def seat_notes(lines) -> list[str]:
    """Why each seat that is not plainly certified is what it is."""
    out = []
    for s in lines:
        bits = []
        if getattr(s, "claimed_by", None):
            bits.append(f"held by {s.claimed_by}")
        if s.why:
            bits.append(s.why)
        if bits:
            out.append(f"  seat {s.id or '-'} {status_text(s.status)}: {'; '.join(bits)}")
    return out


class RichReporter:
    """Draws a census as it goes: the coverage table, a progress bar over seats and over
    the current seat's candidates, and notices (a skipped screen is never silent)."""

    def __init__(self, console: Console, show_tables: bool = True):
        self.console = console
        self.show_tables = show_tables
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                 transient=False)
        self.seats_task = None
        self.cand_task = None
        self.refused = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.seats_task is not None:
            self.progress.stop()

    def coverage(self, report) -> None:
        if self.show_tables:
            self.console.print(coverage_table(report))

    def seat_start(self, label, index, total, candidates) -> None:
        if self.seats_task is None:
            self.progress.start()
            self.seats_task = self.progress.add_task("seats", total=total)
            self.cand_task = self.progress.add_task("candidates", total=candidates)
        self.progress.update(self.seats_task, completed=index, description=f"seat {index + 1}/{total}")
        self.progress.reset(self.cand_task, total=candidates, description=label)
        self.refused = 0

    def candidate(self, label, config, status) -> None:
        if self.cand_task is not None:
            self.progress.advance(self.cand_task)

    def seat_done(self, label, result) -> None:
        if self.seats_task is not None:
            self.progress.advance(self.seats_task)
        w = result.winner
        won = f"{short_config(w.config.key())} {w.timing.median_ms:.4g} ms" if w else "no certificate"
        refused = sum(1 for r in result.records if r.reason)
        what = (f"{refused} of {len(result.records)} candidates refused" if result.records
                else "the winner screened at the shapes seen since")  # a re-screen
        self.console.print(f"  {status_text(result.outcome)} {label}: {won} ({what}, {result.total_s:.1f} s)")

    def notice(self, text: str) -> None:
        self.console.print(f"[yellow]note:[/] {text}")


def error(console: Console, message: str) -> None:
    """One line, never wrapped, never read as markup (messages quote user text)."""
    console.print(f"error: {message}", style="bold red", markup=False, highlight=False, soft_wrap=True)


def search_text(h: dict, cert: dict | None) -> str:
    """How a tuning searched (tuner/strategies/search.py), for `nbx-tune show`."""
    text = h.get("search") or "full"
    if h.get("seeded_from") is not None:
        text += f" from tuning {h['seeded_from']}"
    if cert and cert.get("recertified_from"):
        text += f" ({cert['recertified_from']})"
    if h.get("shortcut_loss") is not None:
        text += f"; the ranked shortlist's pick would have lost {100 * h['shortcut_loss']:.2f} %"
    return text


def regret_text(r: dict | None) -> str:
    if not r:
        return "no audit on record"
    return f"median {100 * r['median']:.2f} %, max {100 * r['max']:.2f} % over {r['audits']} audited seat(s)"

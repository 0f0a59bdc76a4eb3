"""Rich drawing of results: tables, the census progress, one-line errors."""

from __future__ import annotations

import json
from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn)
from rich.table import Table

# Refusals decided from the profile alone: the candidate never ran.
UNLAUNCHED = ("equivalent", "smem_over_budget", "stages_over_max", "no_tma")

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
        won = (f"{short_config(w.config.key())} {w.timing.median_ms:.4g} ms" if w else
               f"no certificate, {result.seat_refusal[0]}" if result.seat_refusal else "no certificate")
        what = (candidate_summary(result.records) if result.records
                else "the winner screened at the shapes seen since")  # a re-screen
        self.console.print(f"  {status_text(result.outcome)} {label}: {won} ({what}; {result.total_s:.1f} s)")

    def notice(self, text: str) -> None:
        self.console.print(f"[yellow]note:[/] {text}")


def candidate_summary(records) -> str:
    """`14 candidates: 7 pruned unlaunched (7 equivalent), 1 failed (wrong_answer 1), 6 passed`:
    a pruned config is not a wrong one."""
    if not records:
        return "no candidate run"
    reasons = Counter(r.reason for r in records if r.reason)
    pruned = {k: n for k, n in reasons.items() if k in UNLAUNCHED}
    failed = {k: n for k, n in reasons.items() if k not in UNLAUNCHED}
    parts = [f"{len(records)} candidates"]
    if pruned:
        parts.append(f"{sum(pruned.values())} pruned unlaunched ({_counts(pruned)})")
    if failed:
        parts.append(f"{sum(failed.values())} failed ({_counts(failed)})")
    parts.append(f"{len(records) - sum(reasons.values())} passed")
    return parts[0] + ": " + ", ".join(parts[1:])


def _counts(c: dict) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def next_steps(rep, db_given: bool = True, baselined: bool = False) -> str:
    """After a census: where the results are and what to try next."""
    db = f" --db {rep.db}" if rep.db and db_given else ""
    return (f"Results are in {rep.db or 'the database'}. Next: `nbx-tune seats{db}`, "
            f"`nbx-tune show SEAT{db}`, `nbx-tune refusals{db}`; your code gets the certified "
            "configs through `from nbx_tune.kernels import mm` (and the other ops)"
            + ("." if baselined else
               f"; `nbx-tune baseline --model {rep.trace}{db}` times them against torch on this GPU, "
               "so that serve() runs torch's op where it is faster."))


def refusals_table(rows, total: int) -> Table:
    shown = f"{len(rows)} refusals" if len(rows) == total else \
        f"{len(rows)} of {total} refusals, newest first (--limit 0 shows all)"
    t = Table(title=shown)
    t.add_column("seat", overflow="fold")
    t.add_column("config", overflow="fold")  # folded, never cut: configs differ at their tails
    t.add_column("reason", no_wrap=True)
    t.add_column("detail", overflow="fold")
    t.add_column("Triton", no_wrap=True)
    for r in rows:
        t.add_row(f"{r['seat']} {r['label']}", r["config"] or "(whole seat)", r["reason"], r["detail"],
                  r["triton_version"])
    return t


def import_summary(s) -> str:
    return (f"{s.path} ({s.profile}): {s.added} certificates added, {s.kept_existing} kept the faster "
            f"existing one, {s.unchanged} already current, {len(s.unscreened)} not screened here, "
            f"{len(s.skipped)} skipped" + (f"; {s.baselines} torch baselines recorded" if s.baselines else ""))


class progress_bar:
    """A progress bar over items, as a context manager that yields `step(index, total,
    label)`; drawn from the first step on."""

    def __init__(self, console: Console, what: str):
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)
        self.what, self.task = what, None

    def __enter__(self):
        return self.step

    def step(self, index: int, total: int, label: str) -> None:
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task(self.what, total=total)
        self.progress.update(self.task, completed=index, description=f"{self.what} {index + 1}/{total}: {label}")

    def __exit__(self, *exc):
        if self.task is not None:
            self.progress.stop()


def baselines_table(d: dict) -> Table:
    """`nbx-tune baseline`: each seat's certified config against torch's op; why a seat got
    no baseline is in the notes printed under it (baselines_notes)."""
    t = Table(title=f"Certified seats against torch {d['torch_version']} on {d['device_name']}",
              caption="x torch: torch ms over nbx ms (below 1: torch is faster); runs: what serve() runs")
    t.add_column("id", justify="right", no_wrap=True)
    t.add_column("seat", overflow="fold", ratio=1, min_width=24)
    for c in ("calls", "nbx ms", "torch ms", "x torch"):
        t.add_column(c, justify="right", no_wrap=True)
    t.add_column("runs", no_wrap=True)
    for s in d["seats"]:
        ratio = s["torch_over_nbx"]
        runs = s["serve_runs"] or "-"
        t.add_row(str(s["seat_id"] or ""), s["seat"].replace("|", " "), str(s["launches"]) if s["rows"] else "",
                  ms(s["nbx_ms"]), ms(s["torch_ms"]), "" if ratio is None else f"{ratio:.3f}",
                  "[yellow]torch[/]" if runs == "torch" else runs)
    return t


def baselines_notes(d: dict) -> list[str]:
    return [f"  {escape(s['seat'])}: no baseline: {escape(s['why_not_recorded'])}"
            for s in d["seats"] if s["why_not_recorded"]]


def baselines_summary(d: dict) -> str:
    return (f"{d['timed']} seats timed ({d['method']}), {d['recorded']} recorded; under serve() "
            f"{d['deferred_to_torch']} run torch (faster there by more than {d['margin']:.0%}), the other "
            f"{d['timed'] - d['deferred_to_torch']} the certified kernels; {d['untimed']} not timed (budget); "
            f"{d['seconds']:.1f} s")


def show_seat(out: Console, d: dict) -> None:
    """`nbx-tune show`: one seat whole."""
    s = d["seat"]
    out.print(f"[bold]seat {s['id']}[/] {escape(s['label'])} on {s['profile']}: {status_text(s['status'])}"
              + (f" ({escape(s['why'])})" if s["why"] else ""), highlight=False)
    for h in d["history"]:
        p = h["provenance"]
        out.print(f"\n[bold]tuning {h['tuning']}[/] ({h['kind']}, {h['outcome']}) {h['finished_at']} on "
                  f"{escape(p['device_name'])} \\[{p['device_target']}], driver {p['driver']}, "
                  f"Triton {p['triton_version']}, torch {p['torch_version']}; {h['candidates']} candidates, "
                  f"{h['survivors']} survived; screen {h['seconds']['screen']} s, timing {h['seconds']['bench']} s",
                  highlight=False)
        c = h.get("certificate")
        if c:
            state = "current" if c["current"] else f"superseded: {escape(c['superseded_reason'] or '')}"
            margin = "-" if c["margin"] is None else f"{100 * c['margin']:.1f} %"
            out.print(f"  certificate ({state}): {c['config']} {ms(c['median_ms'])} ms "
                      f"\\[{ms(c['spread_ms'][0])}..{ms(c['spread_ms'][1])}] by {c['timing_method']}; "
                      f"runner-up {c['runner_up'] or '-'} {ms(c['runner_up_ms'])} ms, margin {margin}",
                      highlight=False)
            for sc in c["screens"]:
                out.print(f"  screened at {sc['problem']['dims']}: err {sc['err']:.3g} <= rtol {sc['rtol']:.3g}"
                          + (f", two launches: {escape(str(sc['repeat']))}" if sc.get("repeat") else ""),
                          highlight=False)
            if c["unscreened"]:
                out.print(f"  [yellow]unscreened:[/] {escape(c['unscreened'])}")
            if c.get("sampled_regret"):
                out.print(f"  sampled regret (from the table it was imported from): "
                          f"{regret_text(c['sampled_regret'])}", highlight=False)
            for b in c.get("torch_baselines") or ():
                out.print(f"  against torch {b['torch_version']} on {escape(b['device_name'])} ({b['measured_at']}): "
                          f"{ms(b['nbx_ms'])} ms, torch {ms(b['torch_ms'])} ms: serve() runs "
                          + ("[yellow]torch[/] there" if b["torch_faster"] else "the kernel"), highlight=False)
        out.print(f"  search: {escape(search_text(h, c))}", highlight=False)
        if h["measurements"]:
            t = Table(title="timed candidates")
            for col in ("config", "median ms", "p20", "p80", "method"):
                t.add_column(col, overflow="fold")
            for m in h["measurements"][:12]:
                t.add_row(m["config"], ms(m["median_ms"]), ms(m["p20_ms"]), ms(m["p80_ms"]), m["method"])
            out.print(t)
    if d["refusals"]:
        t = Table(title=f"refusals ({len(d['refusals'])})")
        for col in ("tuning", "config", "reason", "detail"):
            t.add_column(col, overflow="fold")
        for r in d["refusals"]:
            t.add_row(str(r["tuning"]), r["config"] or "(whole seat)", r["reason"], r["detail"])
        out.print(t)
    out.print(f"\nsampled regret of ranked searches ({s['kernel']} on {s['profile']}): "
              f"{regret_text(d['sampled_regret'])}", highlight=False)


def interrupted(console: Console) -> None:
    console.print("interrupted: every seat finished before now is kept in the database; run the same "
                  "command again to resume (it tunes only what is left)", style="bold yellow", markup=False,
                  highlight=False, soft_wrap=True)


def error(console: Console, message: str) -> None:
    """One line, never wrapped, never read as markup (messages quote user text)."""
    console.print(f"error: {message}", style="bold red", markup=False, highlight=False, soft_wrap=True)


def search_text(h: dict, cert: dict | None) -> str:
    """How a tuning searched (tuner/search/searches.py), for `nbx-tune show`."""
    text = h.get("search") or "full"
    if h.get("seeded_from") is not None:
        text += f" from tuning {h['seeded_from']}"
    detail = (cert or {}).get("search_detail") or ""
    if cert and cert.get("recertified_from") and cert["recertified_from"] not in detail:
        text += f" ({cert['recertified_from']})"
    if detail:
        text += f": {detail}"
    if h.get("shortcut_loss") is not None:
        text += f"; the ranked shortlist's pick would have lost {100 * h['shortcut_loss']:.2f} %"
    return text


def regret_text(r: dict | None) -> str:
    if not r:
        return "no audit on record"
    return f"median {100 * r['median']:.2f} %, max {100 * r['max']:.2f} % over {r['audits']} audited seat(s)"

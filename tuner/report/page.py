"""`nbx-tune report`'s page: the data of tuner/report/data.py as one self-contained HTML
file. Plots are matplotlib figures written as SVG and inlined (glyphs as paths, no fonts,
no script, nothing fetched), tables are plain HTML, drill-downs are <details>: the file
opens from disk on an offline machine and prints.

The SVG is deterministic (a fixed hash salt, no date), so a report of the same data is
the same file.
"""

from __future__ import annotations

import html
import io
import json
import re

from nbx_tune.errors import NbxError
from nbx_tune.tuner.report.data import CATEGORIES, SECTIONS

COLORS = {"certified": "#2e7d32", "unscreened": "#9ccc65", "torch": "#f9a825", "default": "#90a4ae",
          "no kernel": "#c62828", "pending": "#90a4ae", "refused": "#c62828", "stale": "#8d6e63"}
MEANING = {
    "certified": "a certificate screened at every shape seen",
    "unscreened": "a certificate, but some shape seen was never screened",
    "torch": "certified, but torch is faster at the seat (its newest baseline): serve() runs torch",
    "default": "no certificate valid here (pending, refused, stale): the kernel's default config",
    "no kernel": "no kernel serves the op, or its row could not be mapped to a seat",
}
TITLES = {"overview": "Overview", "coverage": "Coverage", "speed": "Speed against torch",
          "refusals": "Refusals", "buckets": "Ladders and buckets", "timeline": "Certification cost",
          "provenance": "Provenance"}
MAX_BARS = 40  # rows a bar chart draws; the tables below it list the rest
MAX_TIMELINE = 150
MAX_EXAMPLES = 25  # refusals listed per (kernel, reason)
CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1100px;
  padding:0 1.5em 3em;color:#1c2430;background:#fff;line-height:1.45}
header{border-bottom:3px solid #2e7d32;margin-bottom:1em}
h1{margin:.6em 0 .2em;font-size:1.7em} h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;margin-top:1.6em}
nav a{margin-right:1em;color:#0b5cad;text-decoration:none} .muted{color:#57606a}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em;width:100%}
th,td{border:1px solid #d0d7de;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f5f7} td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:.92em;background:#f3f5f7;padding:0 .2em;border-radius:3px;word-break:break-all}
figure{margin:.8em 0;break-inside:avoid} figure svg{width:100%;height:auto}
.cards{display:flex;flex-wrap:wrap;gap:.8em} .card{border:1px solid #d0d7de;border-radius:6px;padding:.5em .9em;min-width:9em}
.card b{display:block;font-size:1.5em} details{margin:.3em 0} summary{cursor:pointer}
.swatch{display:inline-block;width:.9em;height:.9em;border-radius:2px;vertical-align:middle;margin-right:.3em}
.empty{background:#fff8e1;border:1px solid #f9a825;padding:.6em 1em;border-radius:6px}
@media print{nav{display:none} body{max-width:none} details{display:block} h2{break-after:avoid}}
"""


def render(data: dict) -> str:
    """The page, as text."""
    plt = _pyplot()
    empty = data["overview"]["empty"]
    body = [f"<header><h1>nbx-tune report</h1><p class=muted>{_e(_subtitle(data['overview']))}</p>",
            "<nav>" + "".join(f'<a href="#{s}">{TITLES[s]}</a>' for s in SECTIONS) + "</nav></header>"]
    draw = {"overview": _overview, "coverage": _coverage, "speed": _speed, "refusals": _refusals,
            "buckets": _buckets, "timeline": _timeline, "provenance": _provenance}
    for s in SECTIONS:
        inner = draw[s](data, plt) if not empty or s == "overview" else _nothing()
        body.append(f'<section id="{s}"><h2>{TITLES[s]}</h2>{inner}</section>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>nbx-tune report</title><style>{CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise NbxError("nbx-tune report draws with matplotlib, which is not installed: "
                       "pip install 'nbx-tune[report]'") from None
    matplotlib.use("svg")  # no display, no raster backend
    matplotlib.rcParams.update({"svg.hashsalt": "nbx-tune-report", "svg.fonttype": "path",
                                "font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    import matplotlib.pyplot as plt

    return plt


def _svg(fig, plt) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>", "", text[text.index("<svg"):], flags=re.S)  # RDF, no use here
    return "<figure>" + text + "</figure>"


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _table(head, rows, num=()) -> str:
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(
        f"<td class=num>{_e(v)}</td>" if i in num else f"<td>{v if isinstance(v, _Raw) else _e(v)}</td>"
        for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


class _Raw(str):
    """Cell text that is already HTML."""


def _code(x) -> _Raw:
    return _Raw(f"<code>{_e(x)}</code>") if x not in (None, "") else _Raw("")


def _nothing() -> str:
    return "<p class=empty>Nothing recorded yet.</p>"


def _short(label: str, n: int = 64) -> str:
    return label if len(label) <= n else label[:n - 1] + "\u2026"


def _ms(x) -> str:
    return "" if x is None else f"{x:.4g}"


def _subtitle(o: dict) -> str:
    parts = [f"database {o['db']}", f"profile {o['profile'] or '(none)'}"]
    if o["trace"]:
        parts.append(f"trace {o['trace']['path']}")
    if o["last_census"]:
        parts.append(f"last census {o['last_census']}")
    return " \u00b7 ".join(parts)


# ----------------------------------------------------------------------------- sections

def _overview(data, plt) -> str:
    o = data["overview"]
    if o["empty"]:
        return ("<p class=empty>This database holds no census yet: run "
                "<code>nbx-tune census --model TRACE</code>, then this report again.</p>")
    cov = data["coverage"]
    cards = [("seats", o["seats"]), ("launches", f"{cov['launches']:,}")]
    if cov["launches"]:
        served = cov["totals"]["certified"] + cov["totals"]["unscreened"]
        cards.append(("served by a certificate", f"{100 * served / cov['launches']:.1f} %"))
    e2e = data["speed"]["end_to_end"]
    if e2e and e2e["served_speedup"]:
        cards.append(("end to end vs torch, as served", f"{e2e['served_speedup']:.3g}x"))
    cards.append(("refusals now", data["refusals"]["total"]))
    cards.append(("stale seats", len(data["provenance"]["stale"])))
    out = "<div class=cards>" + "".join(f"<div class=card><b>{_e(v)}</b>{_e(k)}</div>" for k, v in cards) + "</div>"
    if o["trace"]:
        t = o["trace"]
        out += (f"<p>Trace <code>{_e(t['path'])}</code>: {t['rows']:,} rows, {t['launches']:,} launches "
                f"(sha256 <code>{_e(t['sha256'][:16])}</code>).</p>")
    else:
        out += "<p class=muted>Every seat of the profile, with the launches of every trace a census planned. " \
               "<code>--model TRACE</code> reports one trace by op.</p>"
    by = o["seats_by_status"]
    out += "<p>Seats by status: " + ", ".join(
        f"<span class=swatch style=\"background:{COLORS.get(k, '#777')}\"></span>{_e(k)} {n}"
        for k, n in sorted(by.items())) + "</p>"
    return out


def _coverage(data, plt) -> str:
    cov = data["coverage"]
    rows = cov["rows"]
    if not rows:
        return "<p class=muted>No launches.</p>"
    what = "op" if cov["scope"] == "trace" else "kernel"
    out = "<p>" + " ".join(f"<span class=swatch style=\"background:{COLORS[c]}\"></span><b>{_e(c)}</b>: "
                           f"{_e(MEANING[c])}." for c in CATEGORIES) + "</p>"
    shown = rows[:MAX_BARS][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(shown) + 1.1))
    left = [0] * len(shown)
    for c in CATEGORIES:
        vals = [r["by_category"][c] for r in shown]
        if any(vals):
            ax.barh(range(len(shown)), vals, left=left, color=COLORS[c], label=c, height=0.7)
            left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(len(shown)), [_short(r["op"], 40) for r in shown])
    ax.set_xlabel(f"launches ({cov['scope']})")
    ax.legend(loc="lower right", frameon=False)
    out += _svg(fig, plt)
    total = cov["launches"] or 1
    out += "<p>" + ", ".join(f"{_e(c)} {cov['totals'][c]:,} ({100 * cov['totals'][c] / total:.1f} %)"
                             for c in CATEGORIES) + f" of {cov['launches']:,} launches.</p>"
    table = [[_code(r["op"]), r["kernel"] or "", f"{r['launches']:,}",
              *[f"{r['by_category'][c]:,}" for c in CATEGORIES], _Raw("<br>".join(_e(w) for w in r["why"]))]
             for r in rows]
    out += _table([what, "kernel", "launches", *CATEGORIES, "why not served by a certificate"], table,
                  num=range(2, 3 + len(CATEGORIES)))
    return out


def _speed(data, plt) -> str:
    sp = data["speed"]
    seats = sp["seats"]
    if not seats:
        return ("<p class=muted>No torch baselines: <code>nbx-tune baseline --model TRACE</code> times "
                "the certified seats against torch's op on a GPU.</p>")
    e = sp["end_to_end"]
    out = ""
    if e:
        out += (f"<p>Launch-weighted end to end over {e['seats']} seats ({e['launches']:,} launches): torch "
                f"{_ms(e['torch_ms'])} ms, the kernels {_ms(e['nbx_ms'])} ms (<b>{e['speedup']:.3g}x</b>), as "
                f"serve() runs them (torch where faster) {_ms(e['served_ms'])} ms "
                f"(<b>{e['served_speedup']:.3g}x</b>). Above 1x the kernels are faster.</p>")
    methods = sorted({s["method"] for s in seats})
    devices = sorted({s["device_name"] for s in seats})
    out += f"<p class=muted>Measured on {_e(', '.join(devices))} by {_e(', '.join(methods))}.</p>"
    shown = [s for s in seats if s["speedup"]][:MAX_BARS][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.26 * len(shown) + 1.1))
    ax.barh(range(len(shown)), [s["speedup"] for s in shown], height=0.7,
            color=[COLORS["torch"] if s["serve_runs"] == "torch" else COLORS["certified"] for s in shown])
    ax.set_xscale("log")
    ax.axvline(1.0, color="#333", linewidth=0.8)
    ax.set_yticks(range(len(shown)), [_short(s["label"], 60) for s in shown], fontsize=7)
    ax.set_xlabel("torch time / kernel time per seat (log; right of 1: the kernel is faster; amber: serve() runs torch)")
    out += _svg(fig, plt)
    out += _table(["seat", "launches", "kernel ms", "torch ms", "torch / kernel", "serve() runs"],
                  [[_code(s["label"]), f"{s['launches']:,}", _ms(s["nbx_ms"]), _ms(s["torch_ms"]),
                    f"{s['speedup']:.3g}" if s["speedup"] else "", s["serve_runs"]] for s in seats], num=(1, 2, 3, 4))
    if sp["unmeasured"]:
        out += f"<p class=muted>{sp['unmeasured']} certified seat(s) have no baseline.</p>"
    return out


def _refusals(data, plt) -> str:
    rf = data["refusals"]
    if not rf["total"]:
        return "<p class=muted>No refusals in the seats' last tunings.</p>"
    reasons = list(rf["by_reason"])[::-1]
    kernels = sorted({k for v in rf["by_reason"].values() for k in v})
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(reasons) + 1.2))
    left = [0] * len(reasons)
    for i, k in enumerate(kernels):
        vals = [rf["by_reason"][r].get(k, 0) for r in reasons]
        ax.barh(range(len(reasons)), vals, left=left, color=cmap(i % 20), label=k, height=0.7)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(len(reasons)), reasons)
    ax.set_xlabel("configs refused (the seats' last tunings)")
    ax.legend(loc="lower right", frameon=False, fontsize=7)
    out = f"<p>{rf['total']:,} refusals. Open a group for the failing shapes, errors and tolerances.</p>"
    out += _svg(fig, plt)
    groups = {}
    for it in rf["items"]:
        groups.setdefault((it["kernel"], it["reason"]), []).append(it)
    for (kernel, reason), items in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        items = sorted(items, key=lambda it: (it["err"] is None, it["problem"] is None, it["seat"]))
        rows = [[_code(it["label"]), _code(it["config"] or "(the whole seat)"), _code(_problem(it["problem"])),
                 "" if it["err"] is None else f"{it['err']:.3g}", "" if it["rtol"] is None else f"{it['rtol']:.3g}",
                 it["detail"]] for it in items[:MAX_EXAMPLES]]
        more = f"<p class=muted>and {len(items) - MAX_EXAMPLES} more (<code>nbx-tune refusals --kernel " \
               f"{_e(kernel)} --reason {_e(reason)}</code>)</p>" if len(items) > MAX_EXAMPLES else ""
        out += (f"<details><summary><b>{_e(kernel)}</b> \u2014 {_e(reason)} ({len(items)})</summary>"
                + _table(["seat", "config", "shape", "error", "tolerance", "detail"], rows, num=(3, 4)) + more
                + "</details>")
    return out


def _problem(p) -> str:
    if not p:
        return ""
    extra = p.get("extra") or {}
    return "x".join(str(d) for d in p.get("dims", ())) + (" " + json.dumps(extra, sort_keys=True) if extra else "")


def _buckets(data, plt) -> str:
    ks = data["buckets"]
    if not ks:
        return "<p class=muted>No seats.</p>"
    out = ("<p>Each launch dimension on its ladder (log scale): the profile's ladder rows end at the dotted "
           "lines, each seat's bucket is a bar coloured by the seat's status, and the shapes seen are dots"
           + (" sized by their launches in the trace" if data["overview"]["trace"] else "") + ".</p>")
    for k in ks:
        dims = k["dims"]
        fig, axes = plt.subplots(len(dims), 1, figsize=(9, 0.75 * len(dims) + 0.6), squeeze=False)
        for ax, d in zip(axes[:, 0], dims):
            vals = [b["lo"] for b in d["buckets"]] + [b["hi"] for b in d["buckets"]] + [s["value"] for s in d["shapes"]]
            lo, hi = max(min(vals) / 1.6, 0.6), max(vals) * 1.6
            for up_to, _ in d["ladder_rows"]:
                if up_to is not None and lo <= up_to <= hi:
                    ax.axvline(up_to + 0.5, color="#999", linestyle=":", linewidth=0.8)
            for b in d["buckets"]:
                ax.broken_barh([(b["lo"] - 0.4, b["hi"] - b["lo"] + 0.8)], (0.5, 0.38),
                               color=COLORS.get(b["status"], "#777"), alpha=0.85)
            if d["shapes"]:
                n = [s["launches"] for s in d["shapes"]]
                top = max(n) or 1
                ax.scatter([s["value"] for s in d["shapes"]], [0.25] * len(n), color="#1c2430", zorder=3,
                           s=[10 + 60 * (x / top) if any(n) else 14 for x in n])
            ax.set_xscale("log")
            ax.set_xlim(lo, hi)
            ax.set_ylim(0, 1)
            ax.set_yticks([])
            ax.set_ylabel(f"{d['name']}\n({d['ladder']})", rotation=0, ha="right", va="center")
        axes[0, 0].set_title(k["kernel"], loc="left", fontsize=10)
        fig.subplots_adjust(hspace=0.9)
        out += _svg(fig, plt)
    return out


def _timeline(data, plt) -> str:
    tl = data["timeline"]
    if not tl["seats"]:
        return "<p class=muted>No census run has tuned a seat yet.</p>"
    run, seats = tl["run"], tl["seats"]
    sec = tl["seconds"]
    out = (f"<p>Census run {run['id']} of <code>{_e(run['trace'])}</code> ({_e(run['status'])}, started "
           f"{_e(run['started_at'])}): {len(seats)} seats, {sec['total_s']:.1f} s of seat time: screen "
           f"{sec['screen_s']:.1f} s, timing {sec['bench_s']:.1f} s, the rest (compiles, inputs and oracles, "
           f"the store) {sec['other_s']:.1f} s.</p>")
    shown = seats[:MAX_TIMELINE][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.22 * len(shown) + 1.2))
    parts = (("screen_s", "screen", "#1976d2"), ("bench_s", "timing", "#f9a825"), ("other_s", "compile and the rest", "#90a4ae"))
    for i, s in enumerate(shown):
        x = s["start_s"]
        for key, _, color in parts:
            if s[key] > 0:
                ax.broken_barh([(x, s[key])], (i - 0.35, 0.7), color=color)
                x += s[key]
    for _, name, color in parts:
        ax.barh([0], [0], color=color, label=name)
    ax.set_yticks(range(len(shown)), [_short(s["label"], 56) for s in shown], fontsize=7)
    ax.set_xlabel("seconds since the run's first seat (each bar: the seat's time split by phase, not in order)")
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, frameon=False)
    out += _svg(fig, plt)
    if len(seats) > MAX_TIMELINE:
        out += f"<p class=muted>The first {MAX_TIMELINE} of {len(seats)} seats are drawn.</p>"
    out += _table(["seat", "kind", "outcome", "search", "candidates", "survivors", "screen s", "timing s", "rest s",
                   "total s"],
                  [[_code(s["label"]), s["kind"], s["outcome"], s["search"], s["candidates"], s["survivors"],
                    f"{s['screen_s']:.2f}", f"{s['bench_s']:.2f}", f"{s['other_s']:.2f}", f"{s['total_s']:.2f}"]
                   for s in seats], num=range(4, 10))
    return out


def _provenance(data, plt) -> str:
    p = data["provenance"]
    here = p["here"]
    out = (f"<p>Here: Triton {_e(here.get('triton_version'))}, torch {_e(here.get('torch_version'))}.</p>")
    fields = ["device_name", "device_target", "driver", "triton_version", "torch_version", "kernel_source_hash",
              "config_space_hash", "profile_hash"]
    if p["certificates"]:
        out += "<h3>What the current certificates were made under</h3>"
        hashes = here.get("kernel_source_hash", {})
        rows = []
        for c in p["certificates"]:
            rows.append([*(_code(c[f]) for f in fields), c["seats"]])
        out += _table(["device", "target", "driver", "Triton", "torch", "kernel source", "config space", "profile",
                       "seats"], rows, num=(8,))
        out += "<p class=muted>Kernel sources here: " + ", ".join(
            f"{_e(k)} <code>{_e(v)}</code>" for k, v in sorted(hashes.items())) + "</p>"
    out += "<h3>Stale</h3>"
    if p["stale"]:
        out += _table(["seat", "why"], [[_code(s["label"]), s["why"]] for s in p["stale"]])
    else:
        out += "<p class=muted>Nothing is stale here.</p>"
    out += "<h3>Census runs</h3>"
    rows = []
    for r in p["runs"]:
        cov = (r["summary"] or {}).get("coverage", {})
        rows.append([r["id"], _code(r["trace"]), r["profile"], r["status"], r["started_at"], r["finished_at"] or "",
                     ", ".join(f"{k} {v['seats']}" for k, v in sorted(cov.items()) if v.get("seats"))])
    out += _table(["run", "trace", "profile", "status", "started", "finished", "seats by status at its end"], rows,
                  num=(0,))
    return out

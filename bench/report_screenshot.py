"""Render an `nbx-tune report` page to a PNG with headless Chromium (the README's
screenshot), and check it as the browser test does: no console error, no request but the
file itself, every section present.

    python bench/report_screenshot.py report.html docs/report.png [--width 1200] [--full]

Needs the `playwright` pip package and a Chromium (Debian's `chromium`, or CHROMIUM=path);
nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from nbx_tune.tuner.report.data import SECTIONS


def chromium_path() -> str | None:
    """$CHROMIUM if set (None if it is not a file), else the first Chromium on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"] if os.path.isfile(os.environ["CHROMIUM"]) else None
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def load(page_path: Path, png: Path | None = None, width: int = 1200, full_page: bool = True) -> dict:
    """Open the page headless; {"console_errors", "page_errors", "requests", "sections", "png"}.
    Every request other than the page's own file:// URL is listed (the page must make none)."""
    from playwright.sync_api import sync_playwright

    exe = chromium_path()
    if exe is None:
        raise RuntimeError("no Chromium found (apt-get install chromium, or set CHROMIUM)")
    url = page_path.resolve().as_uri()
    seen = {"console_errors": [], "page_errors": [], "requests": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.on("console", lambda m: m.type == "error" and seen["console_errors"].append(m.text))
            page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
            page.on("request", lambda r: r.url != url and seen["requests"].append(r.url))
            page.goto(url, wait_until="load")
            seen["sections"] = [s for s in SECTIONS if page.query_selector(f"section#{s}") is not None]
            if png is not None:
                page.screenshot(path=str(png), full_page=full_page)
                seen["png"] = str(png)
        finally:
            browser.close()
    return seen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--width", type=int, default=1200)
    ap.add_argument("--full", action="store_true", help="the whole page (default: the first screen)")
    a = ap.parse_args(argv)
    if not a.page.is_file():
        print(f"{a.page}: no such file", file=sys.stderr)
        return 1
    seen = load(a.page, a.png, a.width, a.full)
    problems = seen["console_errors"] + seen["page_errors"] + [f"request {u}" for u in seen["requests"]]
    problems += [f"section {s} missing" for s in SECTIONS if s not in seen["sections"]]
    for p in problems:
        print(p, file=sys.stderr)
    print(f"wrote {a.png}" + (f" ({len(problems)} problem(s))" if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""`nbx-tune report`: the data it draws, gathered from a real census and baseline on the
interpreter, the page it writes, and that page in a headless Chromium (skipped without
one, a failure under NBX_TUNE_REQUIRE_BROWSER=1, as CI sets it)."""

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nbx_tune.testing import planted
from nbx_tune.cli.app import app
from nbx_tune.errors import NbxError, TraceError
from nbx_tune.kernels.runtime import torch_rule as rule
from nbx_tune.kernels.runtime.registry import register
from nbx_tune.tuner import commands as api
from nbx_tune.tuner.report.data import CATEGORIES, SECTIONS, category, end_to_end

register(planted.SPEC)
ROOT = Path(__file__).resolve().parents[1]
HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"
TRACE = (
    "test.double\tfloat32\t1000\t\t5\n"       # planted faults: judged refusals
    "aten.add.Tensor\tfloat32,float32\t8x32;8x32\t\t12\n"
    "aten.add.Tensor\tfloat32,float32\t4x8;4x8\t\t3\n"
    "aten.mm\tbfloat16,bfloat16\t16x16;16x16\t\t1\n"  # refused here: the interpreter cannot screen bf16
    "aten.logcumsumexp\tint64\t1x24\tdim=-1\t7\n"    # no kernel
    "aten.mm\tfloat32,float32\t16x16;17x16\t\t2\n"  # not servable
)
LAUNCHES = 5 + 12 + 3 + 1 + 7 + 2


@pytest.fixture(scope="module")
def censused(tmp_path_factory):
    """A database made by a census and a torch baseline of TRACE: (trace path, db url)."""
    d = tmp_path_factory.mktemp("report")
    t = d / "t.tsv"
    t.write_text(HEAD + TRACE)
    url = f"sqlite:///{d / 'r.db'}"
    api.census(str(t), url, isolate=False)
    api.baseline([str(t)], url)
    return t, url


@pytest.fixture(scope="module")
def data(censused):
    t, url = censused
    return api.report(str(t), url)


def test_coverage_puts_every_launch_of_the_trace_in_one_category(data):
    cov = data["coverage"]
    assert cov["scope"] == "trace" and cov["launches"] == LAUNCHES == data["overview"]["trace"]["launches"]
    for r in cov["rows"]:
        assert sum(r["by_category"].values()) == r["launches"]
    assert sum(cov["totals"].values()) == LAUNCHES
    rows = {r["op"]: r for r in cov["rows"]}
    assert rows["aten.logcumsumexp"]["by_category"]["no kernel"] == 7
    assert rows["aten.logcumsumexp"]["why"] == ["no kernel serves this op"]
    mm = rows["aten.mm"]
    assert mm["by_category"]["default"] == 1 and mm["by_category"]["no kernel"] == 2  # bf16 refused; bad shapes
    assert any("dtype_unscreenable" in w for w in mm["why"]) and any(w.startswith("line 8: ") for w in mm["why"])
    # The add seat has a baseline: its launches go to torch exactly when the rule defers.
    add = [s for s in data["speed"]["seats"] if s["kernel"] == "elementwise_binary"]
    assert add, "the census's add seat was baselined"
    want = "torch" if rule.defers(add[0]["nbx_ms"], add[0]["torch_ms"]) else "certified"
    assert rows["aten.add.Tensor"]["by_category"][want] == 15


def test_category_follows_status_and_the_baseline_rule():
    assert category("certified", None) == "certified" and category("unscreened", None) == "unscreened"
    assert category("certified", {"nbx_ms": 2.0, "torch_ms": 1.0}) == "torch"
    assert category("certified", {"nbx_ms": 1.01, "torch_ms": 1.0}) == "certified"  # within the margin
    assert category("unscreened", {"nbx_ms": 1.0, "torch_ms": 3.0}) == "unscreened"
    for st in ("pending", "refused", "stale"):
        assert category(st, {"nbx_ms": 2.0, "torch_ms": 1.0}) == "default"


def test_speed_ratios_and_the_launch_weighted_end_to_end(data):
    seats = data["speed"]["seats"]
    for s in seats:
        assert s["speedup"] == pytest.approx(s["torch_ms"] / s["nbx_ms"])
    e = data["speed"]["end_to_end"]
    assert e["launches"] == sum(s["launches"] for s in seats)
    assert e["speedup"] == pytest.approx(sum(s["launches"] * s["torch_ms"] for s in seats)
                                         / sum(s["launches"] * s["nbx_ms"] for s in seats))
    # By hand: seat a 10 launches, kernel 1 ms vs torch 2 ms; seat b 30 launches, kernel 4 vs torch 1.
    a = {"launches": 10, "nbx_ms": 1.0, "torch_ms": 2.0, "serve_runs": "nbx"}
    b = {"launches": 30, "nbx_ms": 4.0, "torch_ms": 1.0, "serve_runs": "torch"}
    e = end_to_end([a, b])
    assert e["speedup"] == pytest.approx((20 + 30) / (10 + 120))
    assert e["served_speedup"] == pytest.approx((20 + 30) / (10 + 30))
    assert end_to_end([]) is None


def test_refusals_drill_down_to_the_shape_error_and_tolerance(data, censused):
    rf = data["refusals"]
    assert rf["total"] == len(rf["items"]) == sum(sum(v.values()) for v in rf["by_reason"].values())
    planted_items = {it["config"]: it for it in rf["items"] if it["kernel"] == "test_double"}
    wrong = planted_items[planted.WRONG.key()]
    assert wrong["reason"] == "wrong_answer" and wrong["problem"]["dims"] == [1000]
    assert wrong["err"] > wrong["rtol"] > 0
    assert planted_items[planted.UNWRITTEN.key()]["reason"] == "unwritten_output"
    assert planted_items[planted.HUGE.key()]["reason"] == "smem_over_budget"
    whole = [it for it in rf["items"] if it["config"] is None]
    assert [it["reason"] for it in whole] == ["dtype_unscreenable"]
    # The same as `nbx-tune refusals` reports for the seats' last tunings.
    assert {it["config"] for it in rf["items"] if it["kernel"] == "test_double"} == {
        r["config"] for r in api.refusal_rows(censused[1], kernel="test_double")}


def test_buckets_timeline_and_provenance(data):
    dims = {(k["kernel"], d["name"]): d for k in data["buckets"] for d in k["dims"]}
    n = dims[("elementwise_binary", "N")]
    assert [s["value"] for s in n["shapes"]] == [32, 256] and [s["launches"] for s in n["shapes"]] == [3, 12]
    assert all(b["lo"] <= s["value"] <= b["hi"] for s in n["shapes"] for b in n["buckets"])
    assert n["ladder_rows"] and dims[("test_double", "n")]["shapes"] == [{"value": 1000, "launches": 5}]
    tl = data["timeline"]
    assert tl["run"]["status"] == "done" and {s["kernel"] for s in tl["seats"]} >= {"test_double", "matmul"}
    for s in tl["seats"]:
        assert s["end_s"] >= s["start_s"] >= 0
        assert s["other_s"] == pytest.approx(max(0.0, s["total_s"] - s["screen_s"] - s["bench_s"]))
    p = data["provenance"]
    assert sum(c["seats"] for c in p["certificates"]) == data["overview"]["seats_by_status"]["certified"]
    assert p["stale"] == [] and p["runs"][0]["id"] == tl["run"]["id"]


def test_without_a_trace_the_report_is_of_every_seat_by_kernel(censused, data):
    whole = api.report(None, censused[1])
    assert whole["coverage"]["scope"] == "database" and whole["overview"]["trace"] is None
    # The interpreter's trace is the only one planned: the same launches, served alike.
    served = {c: data["coverage"]["totals"][c] for c in CATEGORIES if c != "no kernel"}
    assert {c: whole["coverage"]["totals"][c] for c in served} == served


@pytest.mark.slow
def test_page_has_every_section_is_deterministic_and_json_matches(data, tmp_path):
    page = tmp_path / "r.html"
    api.write_report(data, str(page))
    text = page.read_text()
    for s in SECTIONS:
        assert f'<section id="{s}">' in text
    assert text.count("<svg") >= 5 and "http://" not in text.replace("http://www.w3.org/", "")
    assert "<script" not in text and "<link" not in text and "src=" not in text
    api.write_report(data, str(tmp_path / "again.html"))
    assert (tmp_path / "again.html").read_text() == text
    assert json.loads(json.dumps(data)) == data  # JSON-able as it is


def test_empty_database_gives_a_page_that_says_so(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    api.db_upgrade(url)
    d = api.report(None, url)
    assert d["overview"]["empty"] and d["coverage"]["launches"] == 0
    page = tmp_path / "e.html"
    api.write_report(d, str(page))
    assert "holds no census yet" in page.read_text()


def test_bad_inputs_are_one_line_errors_and_write_nothing(tmp_path, censused):
    _, url = censused
    with pytest.raises(NbxError, match="no database at"):
        api.report(None, f"sqlite:///{tmp_path / 'missing.db'}")
    bad = tmp_path / "bad.tsv"
    bad.write_text(HEAD + "aten.mm\tfloat32\n")
    with pytest.raises(TraceError, match="bad.tsv"):
        api.report(str(bad), url)
    with pytest.raises(TraceError, match="nope.tsv"):
        api.report(str(tmp_path / "nope.tsv"), url)
    with pytest.raises(NbxError, match="cannot write"):
        api.write_report(api.report(None, url), str(tmp_path / "no" / "dir" / "r.html"))


def test_missing_matplotlib_names_the_extra(monkeypatch, data, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(NbxError, match=r"pip install 'nbx-tune\[report\]'"):
        api.write_report(data, str(tmp_path / "r.html"))
    assert not (tmp_path / "r.html").exists()


def test_cli_report_writes_the_page_and_prints_its_json(censused, tmp_path):
    t, url = censused
    runner = CliRunner()
    page = tmp_path / "r.html"
    r = runner.invoke(app, ["report", "--model", str(t), "--db", url, "-o", str(page)])
    assert r.exit_code == 0, r.output
    assert page.is_file() and str(page) in r.output
    r = runner.invoke(app, ["report", "--db", url, "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["coverage"]["scope"] == "database"
    r = runner.invoke(app, ["report", "--db", url])
    assert r.exit_code == 1 and "-o report.html" in r.output
    assert runner.invoke(app, ["report", "--help"]).exit_code == 0


# ----------------------------------------------------------------------------- the browser

def _browser():
    """bench/report_screenshot.py's loader, or a skip (a failure where CI requires it)."""
    from nbx_tune.bench import report_screenshot

    missing = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "the playwright package is not installed"
    if missing is None and report_screenshot.chromium_path() is None:
        missing = "no Chromium (apt-get install chromium)"
    if missing:
        if os.environ.get("NBX_TUNE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"NBX_TUNE_REQUIRE_BROWSER=1 but {missing}")
        pytest.skip(missing)
    return report_screenshot


@pytest.mark.slow
def test_page_in_headless_chromium_loads_offline_with_no_error_and_draws(data, tmp_path):
    shot = _browser()
    page, png = tmp_path / "r.html", tmp_path / "r.png"
    api.write_report(data, str(page))
    seen = shot.load(page, png)
    assert seen["console_errors"] == [] and seen["page_errors"] == []
    assert seen["requests"] == []  # nothing fetched but the page itself
    assert seen["sections"] == list(SECTIONS)
    from PIL import Image

    im = Image.open(png).convert("RGB")
    colors = im.getcolors(maxcolors=1 << 20) or []
    assert im.size[0] >= 800 and im.size[1] > 2000  # the whole page, not a blank viewport
    assert len(colors) > 50  # text and plots, not one colour
    # The timeline's screen bars are on screen: a colour only an SVG draws.
    assert any(c == (0x19, 0x76, 0xd2) for _, c in colors)


@pytest.mark.slow
def test_the_browser_check_sees_a_fetch_a_console_error_and_a_missing_section(tmp_path):
    shot = _browser()
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><section id="overview"></section>'
                    '<img src="http://127.0.0.1:9/x.png"><script>console.error("boom")</script></body></html>')
    seen = shot.load(page)
    assert seen["requests"] == ["http://127.0.0.1:9/x.png"]
    assert "boom" in seen["console_errors"]
    assert seen["sections"] == ["overview"]


def test_a_required_browser_that_is_missing_fails_instead_of_skipping(monkeypatch):
    monkeypatch.setenv("CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setenv("NBX_TUNE_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="NBX_TUNE_REQUIRE_BROWSER=1"):
        _browser()
    monkeypatch.delenv("NBX_TUNE_REQUIRE_BROWSER")
    with pytest.raises(pytest.skip.Exception):
        _browser()

"""A census end to end on the interpreter: coverage, tuning, the second census that tunes
nothing, dry runs and bad traces that write nothing, unscreened and stale seats."""

from pathlib import Path

import pytest
import torch
import yaml

from nbx_tune.testing import planted
from conftest import db_count
from nbx_tune.errors import TraceError
from nbx_tune.kernels.runtime import certified
from nbx_tune.kernels import mm
from nbx_tune.kernels.runtime.registry import register
from nbx_tune.profiles import builtin_profiles
from nbx_tune.tuner import commands as api

register(planted.SPEC)

def census(*args, isolate=False, **kwargs):
    """In-process candidates keep these tests fast; test_isolation.py runs the workers."""
    return api.census(*args, isolate=isolate, **kwargs)


HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"


def trace(tmp_path, body, name="t.tsv"):
    p = tmp_path / name
    p.write_text(HEAD + body)
    return p


def count(db_url, table):
    return db_count(db_url, table)


MATMUL_TRACE = (
    "aten.mm\tfloat32,float32\t37x29;29x45\t\t3\n"
    "aten.addmm\tfloat16,float16,float16\t45;33x29;29x45\tbeta=0.5\t4\n"
    "aten.mm\tbfloat16,bfloat16\t16x16;16x16\t\t1\n"
    "aten.logcumsumexp\tint64\t1x24\tdim=-1\t7\n"
    "aten.mm\tfloat32,float32\t16x16;17x16\t\t2\n"
)


@pytest.mark.slow
def test_census_certifies_then_the_second_tunes_nothing_and_launches_read_it(tmp_path, any_db, monkeypatch):
    db_url = any_db
    monkeypatch.setenv("NBX_TUNE_DB", db_url)
    t = trace(tmp_path, MATMUL_TRACE)
    rep = census(str(t), db_url, isolate=True)  # the default: candidates in a worker process
    c = rep.counts()
    assert (rep.rows, rep.launches) == (5, 17)
    assert c["certified"] == {"seats": 2, "launches": 7}
    assert c["refused"] == {"seats": 1, "launches": 1}  # bf16 cannot be screened here
    assert rep.uncovered == {"aten.logcumsumexp": 7}
    assert [(ln, why) for ln, _, why, _ in rep.not_servable] == [(7, "shapes 1x16x16 and 1x17x16 do not multiply")]
    tunings = count(db_url, "tunings")
    assert tunings == 3 and count(db_url, "certificates") == 2

    again = census(str(t), db_url)
    assert again.counts() == c
    assert count(db_url, "tunings") == tunings  # nothing tuned twice
    assert all(s.action == "" for s in again.seats)

    # The kernels read the certificate back at launch: no miss, and the certified config.
    certified.reload()
    a, b = torch.randn(37, 29), torch.randn(29, 45)
    torch.testing.assert_close(mm(a, b), a @ b, rtol=1e-4, atol=1e-4)
    stats = certified.launch_stats()
    assert stats["misses"] == {} and stats["certified_seats"] == 2 and stats["sources"] == ["database"]
    seat = [s for s in rep.seats if s.label.startswith("matmul|float32")][0]
    from nbx_tune.kernels.runtime.registry import get_spec

    assert certified.config_for(get_spec("matmul"), ("float32",), (("aligned", "0"), ("bias", "0")), (1, 37, 45, 29)).key() == seat.config
    # A shape in no certified seat uses the default, and the miss is counted.
    mm(torch.randn(5, 7), torch.randn(7, 3))
    assert sum(certified.launch_stats()["misses"].values()) == 1


def test_dry_run_and_bad_traces_write_nothing(tmp_path, db_url):
    db_file = Path(db_url[len("sqlite:///"):])
    rep = census(str(trace(tmp_path, MATMUL_TRACE)), db_url, dry_run=True)
    assert rep.dry_run and rep.counts()["pending"]["seats"] == 2
    assert rep.counts()["refused"]["seats"] == 1  # bf16 on the interpreter: predicted, as the run would
    assert not db_file.exists()
    bad = trace(tmp_path, "aten.mm\tfloat32,float32\t4x4;4x4\t\t1\naten.mm\tfloat32\t4xq\t\t1\n", "bad.tsv")
    with pytest.raises(TraceError, match=r"bad.tsv: line 4: column 3 \(shapes\)"):
        census(str(bad), db_url)
    assert not db_file.exists()
    # With a database in place, a bad trace leaves it exactly as it was.
    census(str(trace(tmp_path, "test.double\tfloat32\t100\t\t1\n", "ok.tsv")), db_url)
    before = {t: count(db_url, t) for t in ("seats", "traces", "census_runs", "tunings")}
    with pytest.raises(TraceError):
        census(str(bad), db_url)
    assert {t: count(db_url, t) for t in before} == before


def _profile_with_budget(tmp_path, budget):
    data = yaml.safe_load(Path(builtin_profiles()["interpreter"].source).read_text())
    data["autotune_screen_max_bytes"] = budget
    p = tmp_path / "tiny_budget.yml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


class Notes:
    def __init__(self):
        self.notes = []

    def notice(self, text):
        self.notes.append(text)

    def __getattr__(self, name):
        return lambda *a, **k: None


def test_over_the_byte_budget_the_screen_is_skipped_announced_and_the_seat_unscreened(tmp_path, db_url):
    profile = _profile_with_budget(tmp_path, 4000)  # 700 fp32 elements in + out = 5600 bytes
    notes = Notes()
    rep = census(str(trace(tmp_path, "test.double\tfloat32\t700\t\t1\ntest.double\tfloat32\t300\t\t1\n")),
                     db_url, profile=profile, reporter=notes)
    (seat,) = rep.seats
    assert seat.status == "unscreened" and "autotune_screen_max_bytes 4000" in seat.why
    assert any("screen skipped" in n and "the seat will be unscreened" in n for n in notes.notes)
    views = api.seat_views(db_url, ["unscreened"], profile=profile)
    assert [v.id for v in views] == [seat.id]
    # The winner was still screened at the small shape, so it is no wrong config.
    assert seat.config in {c.key() for c in planted.GOOD}


@pytest.mark.slow
def test_a_new_shape_makes_the_seat_unscreened_until_its_winner_is_screened_there(tmp_path, db_url):
    census(str(trace(tmp_path, "test.double\tfloat32\t40000\t\t1\n", "a.tsv")), db_url)
    b = trace(tmp_path, "test.double\tfloat32\t60000\t\t1\n", "b.tsv")  # same elements bucket
    plan = census(str(b), db_url, dry_run=True)
    assert plan.seats[0].status == "unscreened" and "never screened at" in plan.seats[0].why
    rep = census(str(b), db_url)
    assert rep.seats[0].status == "certified" and rep.seats[0].action == "rescreened"  # no re-tune
    assert count(db_url, "certificates") == 2  # the first is kept, superseded


def test_a_kernel_edit_makes_certificates_stale_never_served_and_retuned(tmp_path, db_url, monkeypatch):
    t = trace(tmp_path, "test.double\tfloat32\t1000\t\t1\n")
    first = census(str(t), db_url)
    assert first.seats[0].status == "certified"
    monkeypatch.setitem(planted.SPEC.__dict__, "source_hash", "edited-kernel")
    stale = api.seat_views(db_url, ["stale"])
    assert len(stale) == 1 and "kernel source changed" in stale[0].why
    certified.reload()
    st = certified.state()
    assert not any(k[0] == "test_double" for k in st.entries)
    assert any("kernel source changed" in why for _, _, why in st.stale)
    rep = census(str(t), db_url)
    assert rep.seats[0].status == "certified" and rep.seats[0].action == "re-certified"  # from its history
    assert rep.seats[0].to_dict()["recertified_from"].startswith("tuning 1")
    shown = api.show_seat(str(rep.seats[0].id), db_url)
    certs = [h["certificate"] for h in shown["history"] if "certificate" in h]
    assert [c["current"] for c in certs] == [False, True]  # history stays queryable


def test_planning_and_recording_a_long_trace_is_linear_and_says_what_it_does(tmp_path, db_url, monkeypatch):
    """3,000 distinct shapes of one seat: judging the seat compares each shape a bounded
    number of times (the old `p not in rec.problems` compared about n^2 / 2 times: 4.5
    million here), and a census over a long trace announces its planning and recording."""
    from nbx_tune.kernels.spec import Problem
    from nbx_tune.tuner.census import census as census_mod
    from nbx_tune.tuner.census.census import load_plan, run_census
    from nbx_tune.tuner.store import Store

    n = 3000
    t = trace(tmp_path, "".join(f"test.double\tfloat32\t{1000 + i}\t\t1\n" for i in range(n)))
    prof = builtin_profiles()["interpreter"]
    monkeypatch.setattr(census_mod, "BIG_PLAN", 100)
    notices = []

    class Rep:
        def coverage(self, report):
            pass

        def notice(self, text):
            notices.append(text)

    store = Store(db_url)
    try:
        run_census(load_plan(t, prof, notices.append), store, None, Rep())
        assert any("mapping 3,000 trace rows" in x for x in notices)
        assert any("recording 3,000 shapes of 1 seats" in x for x in notices)
        calls = [0]
        eq = Problem.__eq__

        def counting(a, b):
            calls[0] += 1
            return eq(a, b)

        monkeypatch.setattr(Problem, "__eq__", counting)
        rep = run_census(load_plan(t, prof), store, None, None)
        assert rep.seats[0].shapes == n and rep.seats[0].status == "pending"
        assert calls[0] < 20 * n
    finally:
        store.close()


def test_an_interrupted_census_is_recorded_interrupted_never_left_running(tmp_path, db_url):
    from nbx_tune.tuner.census.census import load_plan, run_census
    from nbx_tune.tuner.store import Store

    t = trace(tmp_path, "test.double\tfloat32\t1000\t\t1\n")

    class Interrupting:
        def coverage(self, report):
            raise KeyboardInterrupt  # Ctrl-C while the coverage table is drawn

        def notice(self, text):
            pass

    store = Store(db_url)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_census(load_plan(t, builtin_profiles()["interpreter"]), store, None, Interrupting())
        runs = store.census_runs()
        assert [r.status for r, _ in runs] == ["interrupted"]
    finally:
        store.close()


def test_a_dry_run_predicts_refusals_and_byte_budget_overruns(tmp_path, db_url):
    """The plan says what the census will do: a bf16 seat on the interpreter is refused
    unlaunched, a shape over the screen budget makes its seat unscreened."""
    t = trace(tmp_path, "aten.mm\tbfloat16,bfloat16\t16x16;16x16\t\t1\ntest.double\tfloat32\t700\t\t1\n")
    profile = _profile_with_budget(tmp_path, 4000)
    dry = {s.kernel: s for s in census(str(t), db_url, profile=profile, dry_run=True).seats}
    assert dry["matmul"].status == "refused" and "predicted dtype_unscreenable" in dry["matmul"].why
    assert dry["test_double"].status == "pending" and "predicted unscreened" in dry["test_double"].why
    real = {s.kernel: s for s in census(str(t), db_url, profile=profile).seats}
    assert real["matmul"].status == "refused" and real["test_double"].status == "unscreened"


def test_the_launch_time_read_of_a_sqlite_database_needs_no_sqlalchemy(tmp_path, db_url):
    """kernels/ reads the certified_configs view with the standard library (a SQLite URL),
    every column of the view by its own name, and leaves the file as it was."""
    import os
    import subprocess
    import sys

    census(str(trace(tmp_path, "aten.mm\tfloat32,float32\t21x16;16x24\t\t1\n")), db_url)
    db = Path(db_url[len("sqlite:///"):])
    before = db.stat().st_mtime_ns
    code = ("import sys; from nbx_tune.kernels.runtime import certified_view as v; "
            "rows = v.read_view(sys.argv[1], 'interpreter'); "
            "print(len(rows), sorted(rows[0]), 'sqlalchemy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, db_url], capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    assert words[0] == "1" and words[-1] == "False"  # one certificate; SQLAlchemy never imported
    for col in ("kernel", "dtypes", "flags", "bucket", "config", "kernel_source_hash",
                "config_space_hash", "profile_hash", "triton_version", "device_target"):
        assert repr(col) in out.stdout
    assert db.stat().st_mtime_ns == before
    from nbx_tune.kernels.runtime import certified_view

    assert certified_view.read_view(f"sqlite:///{tmp_path / 'absent.db'}", "interpreter") is None
    assert not (tmp_path / "absent.db").exists()

"""testing/bench.py's database helpers that the cost benches read their results with: a
table made stale as a kernel source change makes it is re-certified by the next census,
and the breakdown after a given tuning counts that census's seats alone."""

import shutil

from nbx_tune.testing import planted
from nbx_tune.kernels.runtime.registry import register
from nbx_tune.tuner import commands as api

from nbx_tune.testing.bench import breakdown, query, stale_everything  # noqa: E402

register(planted.SPEC)
HEAD = "# nbx-tune trace v1\nop\tdtypes\tshapes\tparams\tcount\n"


def test_a_staled_census_table_is_recertified_and_its_breakdown_read_apart(tmp_path, monkeypatch):
    t = tmp_path / "t.tsv"
    t.write_text(HEAD + "test.double\tfloat32\t1000\t\t1\n")
    made = f"sqlite:///{tmp_path / 'made.db'}"
    assert all(s.status == "certified" for s in api.census(str(t), made, isolate=False).seats)
    shutil.copyfile(tmp_path / "made.db", tmp_path / "up.db")
    up = f"sqlite:///{tmp_path / 'up.db'}"
    stale_everything(up)
    assert len(api.seat_views(up, ["stale"])) == 1 and not api.seat_views(made, ["stale"])
    (last,) = query(up, "SELECT max(id) FROM tunings")[0]
    monkeypatch.setenv("NBX_TUNE_SEARCH", "auto")
    rep = api.census(str(t), up, isolate=False)
    before, after = breakdown(made), breakdown(up, last)
    # Re-certified from its history is said so; a fallback tuned every candidate.
    assert [s.action for s in rep.seats] == ["re-certified" if after[0][0] == "recertified" else "tuned"]
    assert sum(n for _, n, *_ in before) == 1 and "recertified" not in [s for s, *_ in before]
    assert sum(n for _, n, *_ in after) == 1 and {s for s, *_ in after} <= {"recertified", "fallback"}
    assert sum(n for _, n, *_ in breakdown(up)) == 2

"""bench/ranking_replay.py --table: each shipped seat is ranked by the votes of the others,
never by its own entry, and the counts it reports are of the seats it ranked."""

import json

from nbx_tune.bench import ranking_replay as rr  # noqa: E402

from nbx_tune.tuner.search.seat_search import shipped, shipped_votes  # noqa: E402


def test_a_seats_own_entry_never_votes_for_it():
    (kernel, d, f, b), e = next((k, e) for k, e in shipped("hopper").items() if k[0] == "matmul")
    votes = shipped_votes("hopper", kernel, (d, f, b))
    assert votes and all(where != (d, f, b) for where, _, _ in votes)
    assert len(votes) == sum(1 for k in shipped("hopper") if k[0] == kernel) - 1


def test_the_table_mode_counts_what_it_ranked(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    rr.table_only("hopper")
    got = json.loads((tmp_path / "shipped_votes.json").read_text())
    assert "matmul:8" in got
    for v in got.values():
        assert v["winner"] <= v["winner_or_runner_up"] <= v["voted"] <= v["seats"]
    assert got["matmul:4"]["winner"] <= got["matmul:8"]["winner"]

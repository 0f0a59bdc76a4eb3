"""testing/bench.side_by_side: what the benchmarks compare is timed in turned rounds."""


from nbx_tune.testing.bench import side_by_side  # noqa: E402


def test_a_steady_drift_reaches_both_sides_alike():
    calls = []

    def drifting(fn, rep):  # the GPU a little slower at every call: 1.0, 1.1, 1.2, ...
        calls.append((fn(), rep))
        return 1.0 + 0.1 * (len(calls) - 1)

    t = side_by_side({"a": lambda: "a", "b": lambda: "b"}, rep_ms=200, rounds=4, timer=drifting)
    assert [name for name, _ in calls] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert all(rep == 50 for _, rep in calls)
    assert abs(t["a"] - t["b"]) < 1e-9  # timed in one block each, a would read 1.15 and b 1.55


def test_the_median_of_the_rounds_drops_one_burst():
    seen = {"x": iter([1.0, 9.0, 1.1, 1.0]), "y": iter([2.0, 2.1, 2.0, 2.2])}
    t = side_by_side({"x": "x", "y": "y"}, rep_ms=40, rounds=4, timer=lambda name, rep: next(seen[name]))
    assert t["x"] < t["y"] and t["x"] == 1.05

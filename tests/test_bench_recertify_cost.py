"""bench/recertify_cost.py: the seats it re-certifies are a seeded sample of the shipped
table with every kernel in it, and the trace rows it hands both censuses hold exactly those
seats, with every shape the full traces give them."""

import json
from collections import Counter

from nbx_tune.bench import recertify_cost as rc  # noqa: E402

from nbx_tune.kernels.runtime.certified import TABLE_DIR  # noqa: E402
from nbx_tune.profiles import get_profile  # noqa: E402
from nbx_tune.tuner.census.census import plan  # noqa: E402
from nbx_tune.kernels.trace import Trace  # noqa: E402


def test_the_sample_is_seeded_holds_every_kernel_and_is_shared_by_size():
    keys = [("big", "", "", f"b{i}") for i in range(40)] + [("mid", "", "", f"b{i}") for i in range(10)] \
        + [("one", "", "", "b0")]
    got = rc.sample(keys, 12, 0)
    assert len(got) == 12 and got == rc.sample(keys, 12, 0) and got != rc.sample(keys, 12, 1)
    n = Counter(k[0] for k in got)
    assert n["one"] == 1 and n["big"] > n["mid"] >= 1
    assert rc.sample(keys, None, 0) == sorted(keys) and rc.sample(keys, 999, 0) == sorted(keys)


def test_the_rows_hold_the_chosen_shipped_seats_with_all_their_shapes():
    profile = get_profile("hopper")
    table = json.loads((TABLE_DIR / "hopper.json").read_text())
    shipped = {(e["kernel"], e["dtypes"], e["flags"], e["bucket"]) for e in table["entries"]}
    traces = [t for t in rc.TRACES if "llama2_7b_seq512" in t or "gpt2" in t]
    every, held = rc.seat_rows(traces, profile, shipped)
    chosen = set(rc.sample(held, 10, 0))
    rows, keys = rc.seat_rows(traces, profile, chosen)
    assert keys == chosen
    whole = plan(Trace("all", tuple(every)), "", profile).seats
    part = plan(Trace("part", tuple(rows)), "", profile).seats
    assert set(part) == chosen and all(part[k].problems == whole[k].problems for k in chosen)


def test_losses_are_grouped_by_the_device_each_seed_was_certified_on():
    a, b, c = ("k", "", "", "b0"), ("k", "", "", "b1"), ("k", "", "", "b2")
    origin = {a: "H100", b: "H200", c: "H200"}
    got = rc.by_origin([(a, 0.01, None), (b, 0.0, None), (c, 0.05, 0.0)], origin)
    assert got == {"H100": {"seats": 1, "median": 0.01, "max": 0.01},
                   "H200": {"seats": 2, "median": 0.025, "max": 0.05}}
    # The shipped table names a device for every entry: a seat missing from it is kept, as "?".
    assert rc.by_origin([(("x", "", "", "b"), 0.0, None)], origin) == {"?": {"seats": 1, "median": 0.0, "max": 0.0}}


def test_a_summary_is_the_median_and_the_worst_loss_and_nan_where_none_differ():
    losses = [(("a",), 0.0, None), (("b",), 0.05, 0.01), (("c",), -0.01, 0.0)]
    assert rc.summary(losses) == (0.0, 0.05)
    med, worst = rc.summary([])
    assert med != med and worst != worst

"""How a ranked search's shortlist would have done, replayed from a database's tunings (no
GPU): each seat in turn is left out, its candidates are ranked from the other seats'
measurements, and the loss of the shortlist's pick is read from the seat's own
measurements (its fastest shortlisted config against its fastest config).

    python bench/ranking_replay.py [--db URL] [--profile hopper] [--kernel matmul]

    python bench/ranking_replay.py --table [--profile hopper]

`--table` needs no database and no GPU: each seat of the table shipped for the profile is
left out in turn and ranked by the votes of the others (what a fresh census's seat with no
near seat in its database gets, `strategies/ranked.votes`); the table says how often the
seat's own winner, or its runner-up, is among the TOP most voted.

Run it on a database whose seats were tuned in full (a census under NBX_TUNE_SEARCH=full,
e.g. `NBX_TUNE_SEARCH=full bash release/gpu_session.sh census`). Rankers side by side:
`nearby` (tuner/search/ranked.py), `wins` (how often a config was within 2 % of the
best at the other seats), `shipped` (the shipped table's votes, the seat's own entry left
out), `declared` (the config space's own order) and `random`; each at
a few shortlist sizes, TOP best-ranked plus SAMPLE seeded others.
"""

from __future__ import annotations

import random
import statistics
import sys

from nbx_tune.testing.bench import save, table  # noqa: E402

SIZES = ((4, 2), (6, 3), (8, 4), (12, 4))


def wins_order(prior, keys):
    count = {k: 0.0 for k in keys}
    for _, meas, _ in prior:
        if not meas:
            continue
        best = min(ms for _, ms in meas)
        for c, ms in meas:
            if c in count and ms <= best * 1.02:
                count[c] += 1
    return sorted(keys, key=lambda k: -count[k])


def _pct(x: float) -> str:
    return "nothing survived" if x == float("inf") else f"{100 * x:.2f} %"


def table_only(profile: str) -> None:
    from nbx_tune.tuner.search.seat_search import shipped, shipped_votes
    from nbx_tune.tuner.search.ranked import Ranked

    entries = shipped(profile)
    rows, result = [], {}
    for k in sorted({key[0] for key in entries}):
        seats = [(key[1:], e) for key, e in entries.items() if key[0] == k]
        if len(seats) < 3:
            continue
        for top_n in (4, 8):
            hit = either = ranked = 0
            for seat, e in seats:
                r = Ranked("", seat, [], audit=False, shipped=shipped_votes(profile, k, seat))
                if not r.informed:
                    continue
                ranked += 1
                top = r.best(top_n)
                hit += e["config"] in top
                either += e["config"] in top or e.get("runner_up") in top
            rows.append([k, len(seats), top_n, ranked, f"{hit}/{ranked}", f"{either}/{ranked}"])
            result[f"{k}:{top_n}"] = {"seats": len(seats), "voted": ranked, "winner": hit, "winner_or_runner_up": either}
    save("shipped_votes.json", result)
    print(table(rows, ["kernel", "shipped seats", "top", "seats with near votes", "own winner in top",
                       "winner or runner-up in top"]))


def main(db: str | None, profile: str, kernel: str | None) -> None:
    from nbx_tune.kernels.spec import Config
    from nbx_tune.tuner.store import Store
    from nbx_tune.tuner.search.seat_search import shipped_votes
    from nbx_tune.tuner.search.ranked import STATIC, Ranked

    store = Store(db)
    kernels = [kernel] if kernel else sorted({r.seat.kernel for r in store.seat_records(profile=profile)})
    rows, result = [], {}
    for k in kernels:
        tunings = [(s, t, meas, ref) for s, t, meas, ref in store.kernel_measurements(profile, k, limit=100000)
                   if len(meas) >= 4 and getattr(t, "search", "full") in ("full", "fallback", "audit")]
        latest = {}
        for s, t, meas, ref in tunings:  # newest first: one tuning per seat
            latest.setdefault(s.id, (s, t, meas, ref))
        seats = list(latest.values())
        if len(seats) < 3:
            continue
        losses = {}
        for s, t, meas, ref in seats:
            prior = [((o.dtypes, o.flags, o.bucket), m, r) for o, _, m, r in seats if o.id != s.id]
            times = {}
            for c, ms in meas:
                times[c] = min(times.get(c, ms), ms)
            keys = sorted(set(times) | {c for c, why in ref if why not in STATIC})
            cands = [Config.parse(c) for c in keys]
            label = "|".join((s.kernel, s.dtypes, s.flags, s.bucket))
            ranked = Ranked(label, (s.dtypes, s.flags, s.bucket), prior, audit=False)
            voted = Ranked(label, (s.dtypes, s.flags, s.bucket), [], audit=False,
                           shipped=shipped_votes(profile, k, (s.dtypes, s.flags, s.bucket)))
            best = min(times.values())
            orders = {"nearby": None, "shipped": None, "wins": wins_order(prior, keys), "declared": keys,
                      "random": random.Random(label).sample(keys, len(keys))}
            for name, order in orders.items():
                for top_n, sample_n in SIZES:
                    if name in ("nearby", "shipped"):
                        short = [c.key() for c in (ranked if name == "nearby" else voted).shortlist(cands, top_n, sample_n)]
                    else:
                        head = order[:top_n]
                        rest = [c for c in order if c not in head]
                        short = head + random.Random(label).sample(rest, min(sample_n, len(rest)))
                    got = [times[c] for c in short if c in times]
                    loss = min(got) / best - 1 if got else float("inf")
                    losses.setdefault((name, top_n, sample_n), []).append((loss, len(short) / len(keys)))
        for (name, top_n, sample_n), xs in losses.items():
            ls = [x for x, _ in xs]
            finite = [x for x in ls if x != float("inf")]
            rows.append([k, name, f"{top_n}+{sample_n}", len(ls), f"{100 * statistics.mean(f for _, f in xs):.0f} %",
                         _pct(statistics.median(ls)),
                         f"{100 * max(finite):.2f} %" if finite else "-",
                         f"{sum(1 for x in ls if x <= 0.02)}/{len(ls)}", len(ls) - len(finite)])
        result[k] = {f"{n}:{a}+{b}": v for (n, a, b), v in losses.items()}
    store.close()
    save("ranking_replay.json", result)
    print(table(rows, ["kernel", "ranker", "shortlist", "seats", "share timed", "median loss", "max loss",
                       "within 2 %", "nothing survived"]))


if __name__ == "__main__":
    args = sys.argv[1:]

    def opt(name, default=None):
        return args[args.index(name) + 1] if name in args else default

    if "--table" in args:
        table_only(opt("--profile", "hopper"))
    else:
        main(opt("--db"), opt("--profile", "hopper"), opt("--kernel"))

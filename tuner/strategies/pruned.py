"""A short first estimate of every survivor, then full timing of the contenders only,
interleaved.

Candidates whose quick estimate is more than SLACK behind the quick best are far enough
behind that a full timing would not change the winner; they stay on record with their
quick time. At most TOP_K contenders get the full timing, in ROUNDS rounds: each round
times every contender for a 1/ROUNDS share of the profile's full timing, the order turned
by one each round, and a contender's time is the median of its rounds.
"""

from nbx_tune.tuner.bench import combine
from nbx_tune.tuner.strategies import Measured

# Quick estimates on a shared GPU spread by a few percent, and a neighbour's burst can cost
# one estimate more: 30 % is far outside that. On the H200, 20 % with 5 contenders (and
# quick estimates of 5 ms) certified a 2048^3 bf16 GEMM at 0.58 of cuBLAS where 30 % and
# 8 had reached 0.92 (docs/benchmarks.md, third session), so the wider net stays.
# A mid round (30 ms estimates of the contenders, full timing of three finalists within
# 10 %) made a six-seat census on the H200 1.6 s faster (with one other change), but in
# both calls that used it the bucketing loss read over 10 % (docs/benchmarks.md,
# 2026-12-03): every contender is still timed in full.
SLACK = 0.30
TOP_K = 8
MIN_K = 2
# Timed one after the other, each contender in one block, the H200's census disagreed with
# a later side-by-side timing by up to 8 % (the GPU's clocks drift over a seat's second of
# back-to-back GEMMs, and the quick best is timed first): the bucketing loss read 8.22 %
# and 2048^3 fell to 0.81 of cuBLAS. In four turned rounds, in the same run: 4.38 % and
# 0.97 (docs/benchmarks.md, 2026-12-03, third session).
ROUNDS = 4


def run(candidates, measure, slack: float = SLACK, top_k: int = TOP_K, rounds: int = ROUNDS):
    quick = []
    for c in candidates:
        t = measure(c, "quick")
        if t is not None:
            quick.append(Measured(c, t, False))
    if not quick:
        return []
    quick.sort(key=lambda m: m.timing.median_ms)
    best = quick[0].timing.median_ms
    contenders = [m for i, m in enumerate(quick)
                  if i < MIN_K or m.timing.median_ms <= best * (1 + slack)][:top_k]
    out = [m for m in quick if m not in contenders]
    alive = [m.config for m in contenders]
    got: dict = {c: [] for c in alive}
    for r in range(rounds):
        k = r % len(alive) if alive else 0
        for c in alive[k:] + alive[:k]:
            t = measure(c, f"round:{rounds}")
            if t is None:
                got.pop(c)  # failed: the tuner has recorded why; it leaves the next rounds
            else:
                got[c].append(t)
        alive = [c for c in alive if c in got]
    out += [Measured(c, combine(ts), True) for c, ts in got.items()]
    return out

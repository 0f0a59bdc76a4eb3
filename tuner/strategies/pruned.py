"""A short first estimate of every survivor, then full timing of the contenders only.

Candidates whose quick estimate is more than SLACK behind the quick best are far enough
behind that a full timing would not change the winner; they stay on record with their
quick time. At most TOP_K contenders get the full timing.
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
ROUNDS = 4  # the "interleaved" strategy's rounds of full timing


def run(candidates, measure, slack: float = SLACK, top_k: int = TOP_K, rounds: int = 1):
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
    if rounds == 1:
        for m in contenders:
            t = measure(m.config, "full")
            if t is not None:
                out.append(Measured(m.config, t, True))
        return out
    # Interleaved: every contender once per round, the order turned by one each round so
    # that no contender is always timed first (coolest GPU) or last.
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

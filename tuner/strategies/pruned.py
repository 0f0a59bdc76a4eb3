"""A short first estimate of every survivor, then full timing of the contenders only,
interleaved.

Candidates whose quick estimate is more than SLACK behind the quick best are far enough
behind that a full timing would not change the winner; they stay on record with their
quick time. At most TOP_K contenders get the full timing, in ROUNDS rounds: each round
times every contender for a 1/ROUNDS share of the profile's full timing, the order turned
by one each round, and a contender's time is the median of its rounds.
"""

from nbx_tune.tuner.timing import combine
from nbx_tune.tuner.strategies import Measured

# Quick estimates on a shared GPU spread by a few percent, and a neighbour's burst can cost
# one estimate more: 30 % is far outside that. A narrower net (20 %, 5 contenders) dropped
# the real winner of a short GEMM on a quick estimate's noise, so the wider net stays, and
# every contender is timed in full (a mid round that cut them down was faster but picked
# worse winners).
SLACK = 0.30
TOP_K = 8
MIN_K = 2
# Rounds, not one block per contender: the GPU's clocks drift over a seat's second of
# back-to-back launches, so contenders timed one after the other are ranked partly by when
# they ran. Turning the order each round lets the drift reach them alike.
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

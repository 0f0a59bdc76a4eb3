"""A short first estimate of every survivor, then full timing of the contenders only,
interleaved.

Candidates whose quick estimate is more than SLACK behind the quick best are far enough
behind that a full timing would not change the winner; they stay on record with their
quick time. At most TOP_K contenders get the full timing, in ROUNDS rounds: each round
times every contender for a 1/ROUNDS share of the profile's full timing, the order turned
by one each round, and a contender's time is the median of its rounds.

With `settle` (a search's shortlist: strategies/ranked.py), the rounds stop after
MIN_ROUNDS once one contender was first, or within NEAR_TIE of the first, in every round so
far (`settled`): more rounds would refine medians that already agree on the winner, or
choose between near-equals; rounds that disagree more (a drift, a neighbour's burst) go on
to ROUNDS. A tuning of the whole space (a full tuning, an audit) runs
every round: its times rank the configs for the seats after it (their scores), not only
its winner, and an audit's winner is the truth the shortcut is measured against.
"""

from nbx_tune.tuner.timing.benchmarkers import combine
from nbx_tune.tuner.timing.strategies import Measured

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
# Rounds every contender gets before its timing may stop early: one round can put a
# contender first on a neighbour's burst; two that agree leave at most a near tie to
# refine, which costs less than the rounds would.
MIN_ROUNDS = 2
# Contenders this close in every round are near-equals: the rounds that would tell them
# apart cost more than the pick could lose (GEMM tiles a fraction of a percent apart took
# all four rounds where two put a different one of them first).
NEAR_TIE = 0.01


def settled(rounds: list) -> bool:
    """Whether the rounds so far ({config: ms} each, in order) settle the winner: at least
    MIN_ROUNDS of them, and a config first or within NEAR_TIE of the first in each."""
    if len(rounds) < MIN_ROUNDS or not all(rounds):
        return False
    bests = [min(r.values()) for r in rounds]
    return any(all(c in r and r[c] <= best * (1 + NEAR_TIE) for r, best in zip(rounds, bests))
               for c in rounds[0])


def within(times: dict, slack: float = SLACK, top_k: int = TOP_K) -> list:
    """The configs of `times` (config -> ms) worth a full timing: the MIN_K fastest and any
    within `slack` of the fastest, at most `top_k`, fastest first."""
    order = sorted(times, key=times.get)
    return [c for i, c in enumerate(order) if i < MIN_K or times[c] <= times[order[0]] * (1 + slack)][:top_k]


def turned_rounds(alive: list, measure, rounds: int = ROUNDS, after=None) -> dict:
    """config -> its timings, one per round: each round times every config still alive for
    a 1/rounds share of a full timing, the order turned by one each round; a config whose
    timing fails leaves (the tuner has recorded why). `after(r, this_round, alive, got)`
    -> (alive, stop), when given, may narrow the configs or stop after each round."""
    got: dict = {c: [] for c in alive}
    for r in range(rounds):
        k = r % len(alive) if alive else 0
        this = {}
        for c in alive[k:] + alive[:k]:
            t = measure(c, f"round:{rounds}")
            if t is None:
                got.pop(c)
            else:
                got[c].append(t)
                this[c] = t.median_ms
        alive = [c for c in alive if c in got]
        if after is not None:
            alive, stop = after(r, this, alive, got)
            if stop:
                break
    return got


def run(candidates, measure, slack: float = SLACK, top_k: int = TOP_K, rounds: int = ROUNDS,
        settle: bool = False):
    quick = {}
    for c in candidates:
        t = measure(c, "quick")
        if t is not None:
            quick[c] = t
    if not quick:
        return []
    alive = within({c: t.median_ms for c, t in quick.items()}, slack, top_k)
    out = [Measured(c, t, False) for c, t in sorted(quick.items(), key=lambda ct: ct[1].median_ms) if c not in alive]
    seen = []

    def after(r, this, alive, got):
        if this:
            seen.append(this)
        return alive, settled(seen)

    got = turned_rounds(alive, measure, rounds, after if settle else None)
    out += [Measured(c, combine(ts), True) for c, ts in got.items()]
    return out


run.quick_first = True  # strategies/__init__.py: the tuner may take the estimates as it screens

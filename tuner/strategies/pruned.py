"""A short first estimate of every survivor, then full timing of the contenders only.

Candidates whose quick estimate is more than SLACK behind the quick best are far enough
behind that a full timing would not change the winner; they stay on record with their
quick time. At most TOP_K contenders get the full timing.
"""

from nbx_tune.tuner.strategies import Measured

SLACK = 0.30  # quick estimates on a shared GPU spread by a few percent; 30 % is far outside that
TOP_K = 8
MIN_K = 2


def run(candidates, measure, slack: float = SLACK, top_k: int = TOP_K):
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
    for m in contenders:
        t = measure(m.config, "full")
        if t is not None:
            out.append(Measured(m.config, t, True))
    return out

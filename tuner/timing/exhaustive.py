"""Time every survivor with the full settings."""

from nbx_tune.tuner.timing.strategies import Measured


def run(candidates, measure, settle: bool = False):
    """Every survivor in full (`settle`, a shortlist's licence to stop early, has nothing
    to stop here)."""
    out = []
    for c in candidates:
        t = measure(c, "full")
        if t is not None:
            out.append(Measured(c, t, True))
    return out

"""Search strategies: how screened survivors are timed to find a seat's winner.

One strategy per module, each behind one function

    strategy(candidates, measure, settle=False) -> list[Measured]

where `measure(config, mode)` returns a Timing, or None when the candidate failed (the
tuner records that refusal itself). Only `final` measurements compete for the win. The
tests replay recorded measurements through `measure`, with no GPU.

A strategy whose first step is a quick estimate of every candidate says so
(`run.quick_first = True`): the tuner then takes each candidate's estimate as soon as it
is screened, while the compile pool is still building the next candidates, and hands it
to the strategy's first `measure(config, "quick")`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from nbx_tune.errors import NbxError
from nbx_tune.kernels.spec import Config
from nbx_tune.tuner.timing.benchmarkers import Timing


@dataclass(frozen=True)
class Measured:
    config: Config
    timing: Timing
    final: bool  # timed with the profile's full settings; only these can win


Measure = Callable[[Config, str], "Timing | None"]


def quick_first(strategy) -> bool:
    """Whether `strategy` (or the function a functools.partial wraps) starts with a quick
    estimate of every candidate."""
    return bool(getattr(getattr(strategy, "func", strategy), "quick_first", False))


def get_strategy(name: str):
    from nbx_tune.tuner.timing import exhaustive, pruned

    table = {"exhaustive": exhaustive.run, "pruned": pruned.run}
    try:
        return table[name]
    except KeyError:
        raise NbxError(f"unknown strategy {name!r}; known: {', '.join(sorted(table))}") from None


STRATEGIES = ("pruned", "exhaustive")

"""Search strategies: how screened survivors are timed to find a seat's winner.

One strategy per module, each behind one function

    strategy(candidates, measure, settle=False) -> list[Measured]

where `measure(config, mode)` returns a Timing, or None when the candidate failed (the
tuner records that refusal itself). Only `final` measurements compete for the win. The
tests replay recorded measurements through `measure`, with no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from nbx_tune.errors import NbxError
from nbx_tune.kernels.spec import Config
from nbx_tune.tuner.timing import Timing


@dataclass(frozen=True)
class Measured:
    config: Config
    timing: Timing
    final: bool  # timed with the profile's full settings; only these can win


Measure = Callable[[Config, str], "Timing | None"]


def get_strategy(name: str):
    from nbx_tune.tuner.strategies import exhaustive, pruned

    table = {"exhaustive": exhaustive.run, "pruned": pruned.run}
    try:
        return table[name]
    except KeyError:
        raise NbxError(f"unknown strategy {name!r}; known: {', '.join(sorted(table))}") from None


STRATEGIES = ("pruned", "exhaustive")

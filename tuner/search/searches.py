"""Searches: which of a seat's candidates are screened and timed, in what order.

A timing strategy (`exhaustive`, `pruned`) ranks the configs it is handed; a search decides
what to hand it. Every search has the same two calls:

    search.compile_first(candidates) -> the configs the compile pool starts on
    search.run(candidates, evaluate) -> SearchNote

where `evaluate(configs)` screens those not yet screened (every screen shape of the seat),
times the survivors among `configs` with the strategy (or the search's own, passed as
`evaluate(configs, timing)`; `evaluate(configs, settle=True)` lets the strategy stop once
the winner is settled, for a shortlist) and returns their `Measured`. The
tuner certifies the fastest full timing of whatever was evaluated last, so a search can
only choose among screened configs: nothing unscreened is ever certified.

`Full` evaluates every candidate. `tuner/certify/recertify.py` starts from a seat's history, and
`strategies/ranked.py` from what earlier seats of the kernel measured.
"""

from __future__ import annotations

from dataclasses import dataclass

SEARCHES = ("full", "recertified", "fallback", "ranked", "audit")


@dataclass(frozen=True)
class SearchNote:
    """How a seat's winner was found, written on its tuning and certificate."""

    search: str = "full"  # one of SEARCHES
    seeded_from: int | None = None  # the tuning a re-certification started from
    recertified_from: str | None = None  # that tuning, in words that survive an export
    shortcut_loss: float | None = None  # audit: the ranked pick's loss against the best
    detail: str = ""  # why, for the console and the certificate
    sampled_regret: str | None = None  # an imported certificate's regret (JSON), kept when it is renewed


class Full:
    name = "full"

    def compile_first(self, candidates):
        return list(candidates)

    def run(self, candidates, evaluate) -> SearchNote:
        evaluate(list(candidates))
        return SearchNote("full")


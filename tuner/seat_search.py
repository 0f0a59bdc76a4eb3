"""Which search a seat gets (tuner/strategies/search.py):

    a seat with a certificate in its history  -> re-certified from it (tuner/recertify.py)
    else, earlier seats of the kernel timed   -> ranked, or an audit (strategies/ranked.py)
    else                                      -> every candidate

NBX_TUNE_SEARCH=full turns both shortcuts off (a baseline for bench/recertify_cost.py).
"""

from __future__ import annotations

import os

from nbx_tune.tuner.recertify import Recertify, seed_from_history
from nbx_tune.tuner.strategies.ranked import AUDIT_RATE, Ranked, label_fraction
from nbx_tune.tuner.strategies.search import Full

ENV = "NBX_TUNE_SEARCH"
MODES = ("auto", "full")


def mode() -> str:
    m = os.environ.get(ENV, "auto").strip() or "auto"
    if m not in MODES:
        from nbx_tune.errors import NbxError

        raise NbxError(f"{ENV}={m!r}: expected one of {', '.join(MODES)}")
    return m


def for_seat(store, rec, spec, profile):
    """The search for a seat record (`Store.seat_records`)."""
    if mode() == "full":
        return Full()
    seed = seed_from_history(store.history(rec.seat.id), store.judged_configs)
    if seed is not None:
        return Recertify(seed, spec.config_space_hash)
    s = rec.seat
    label = "|".join((s.kernel, s.dtypes, s.flags, s.bucket))
    prior = [((o.dtypes, o.flags, o.bucket), meas, refused)
             for o, _, meas, refused in store.kernel_measurements(profile.name, s.kernel) if o.id != s.id]
    audit = not store.shortcut_losses(profile.name, s.kernel) or label_fraction(label) < AUDIT_RATE
    ranked = Ranked(label, (s.dtypes, s.flags, s.bucket), prior, audit)
    return ranked if ranked.informed else Full()

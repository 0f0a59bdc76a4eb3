"""Which search a seat gets (tuner/search/searches.py):

    a seat with a certificate in its history  -> re-certified from it (tuner/certify/recertify.py)
    else, a table shipped in the package
          holds the seat (any provenance)     -> re-certified from that entry
      (from a shortlist's ranking, the configs that won at near seats are timed beside it,
       fewer where the old winner stood clear of its runner-up)
    else, earlier seats of the kernel timed,
      or a shipped table's near seats         -> ranked, or an audit (strategies/ranked.py)
    else                                      -> every candidate

NBX_TUNE_SEARCH=ranked ignores what is known of the seat itself (a fresh census, as the
baselines of bench/recertify_cost.py run it); =cold ignores the shipped table altogether (a
census that knows only its own database: what the table's votes save is measured against
it); =full turns every shortcut off.
"""

from __future__ import annotations

import os
from functools import lru_cache

from nbx_tune.tuner.certify.recertify import (    EXPLORE,
    EXPLORE_CLEAR,
    Recertify,
    seed_from_entry,
    seed_from_history,
)
from nbx_tune.tuner.search.ranked import AUDIT_RATE, Ranked, label_fraction
from nbx_tune.tuner.search.searches import Full

ENV = "NBX_TUNE_SEARCH"
MODES = ("auto", "ranked", "cold", "full")


def mode() -> str:
    m = os.environ.get(ENV, "auto").strip() or "auto"
    if m not in MODES:
        from nbx_tune.errors import NbxError

        raise NbxError(f"{ENV}={m!r}: expected one of {', '.join(MODES)}")
    return m


def for_seat(store, rec, spec, profile, audit_later: bool = False):
    """The search for a seat record (`Store.seat_records`). `audit_later`: the kernel's
    first audit is due at a later seat of this census (tuner/fleet/seat_tuner.py), not here."""
    if mode() == "full":
        return Full()
    s = rec.seat
    label = "|".join((s.kernel, s.dtypes, s.flags, s.bucket))
    if mode() == "auto":
        # A seat never tuned has no history to read (most of a fresh queue's seats).
        seed = seed_from_history(store.history(s.id), store.judged_configs) \
            if rec.last_tuning is not None else None
        if seed is None:
            entry = shipped(profile.name).get((s.kernel, s.dtypes, s.flags, s.bucket))
            seed = seed_from_entry(entry, f"shipped table {profile.name}.json") if entry else None
        if seed is not None:
            explore = () if seed.complete else ranked(store, s, label, profile).best(
                EXPLORE_CLEAR if seed.clear else EXPLORE)
            return Recertify(seed, spec.config_space_hash, explore)
    r = ranked(store, s, label, profile, audit_later)
    return r if r.informed else Full()


def ranked(store, s, label: str, profile, audit_later: bool = False) -> Ranked:
    """The ranked search of seat `s`, from what the kernel's other seats measured here and
    what the table shipped for the profile picked at its other seats (never the seat's own
    entry: a fresh census must not read its answer there). Audited where no audit of the
    kernel is on record (unless one is due later in the census) or where the label's hash
    draws one."""
    prior = [((o.dtypes, o.flags, o.bucket), meas, refused)
             for o, _, meas, refused in store.kernel_measurements(profile.name, s.kernel) if o.id != s.id]
    seat = (s.dtypes, s.flags, s.bucket)
    table = [] if mode() == "cold" else shipped_votes(profile.name, s.kernel, seat)
    audit = (not audit_later and not store.has_audit(profile.name, s.kernel)) \
        or label_fraction(label) < AUDIT_RATE
    return Ranked(label, seat, prior, audit, table)


def shipped_votes(profile_name: str, kernel: str, seat: tuple) -> list:
    """The shipped table's entries of `kernel` as `strategies/ranked.votes` takes them,
    [(seat tuple, winner, runner-up)], the seat's own left out."""
    return [((d, f, b), e["config"], e.get("runner_up")) for (k, d, f, b), e in shipped(profile_name).items()
            if k == kernel and (d, f, b) != seat]


@lru_cache(maxsize=None)
def shipped(profile_name: str) -> dict:
    """(kernel, dtypes, flags, bucket) -> entry of the table shipped for a profile
    (kernels/tables/): read once; a missing or broken table seeds nothing."""
    from nbx_tune.errors import NbxError
    from nbx_tune.kernels.runtime import table_format
    from nbx_tune.kernels.runtime.certified import TABLE_DIR

    path = TABLE_DIR / f"{profile_name}.json"
    if not path.exists():
        return {}
    try:
        doc = table_format.read(path)
    except NbxError:
        return {}
    return {(e["kernel"], e["dtypes"], e["flags"], e["bucket"]): e for e in doc["entries"]}

"""A seat's status, derived from its records and this installation.

    certified   a current certificate, valid here, whose winner was screened at every
                shape seen in the bucket
    unscreened  a current certificate, valid here, serving a shape its winner was never
                screened at (over the byte budget, or seen after it was screened: the next
                census screens the winner there)
    refused     the last tuning, valid here, refused every candidate (or the dtype)
    stale       a current certificate made under another kernel source, config space,
                profile, Triton or device: never served, re-tuned by the next census
    pending     nothing yet (or only records made under other provenance)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from nbx_tune.kernels.spec import Problem
from nbx_tune.tuner.certify import provenance
from nbx_tune.tuner.certify.reasons import TRANSIENT_REASONS

STATUSES = ("certified", "unscreened", "pending", "refused", "stale")


@dataclass
class Status:
    status: str
    why: str = ""
    outside: tuple[Problem, ...] = ()  # shapes seen that the winner was never screened at


def seat_status(rec, spec, profile) -> Status:
    """The status of a seat from its records `rec` (a `store.SeatRecord`: the current
    certificate and its tuning, the last tuning and its refusal of the whole seat, the
    shapes seen) under `spec` and `profile` as installed here (None: not known here)."""
    cert, cert_tuning, last_tuning = rec.cert, rec.cert_tuning, rec.last_tuning
    if profile is None:
        return Status("stale", "profile not known here") if cert is not None else Status("pending")
    seat_refusal = rec.seat_refusal
    if seat_refusal is not None and seat_refusal.reason in TRANSIENT_REASONS:
        return Status("pending", f"{seat_refusal.reason}: {seat_refusal.detail}; tried again by the next census")
    if cert is not None:
        why = provenance.stale_reason(cert_tuning, spec, profile)
        if why is None:
            return _screened_status(cert, rec.problems)
    if last_tuning is not None and last_tuning.outcome == "refused":
        if provenance.stale_reason(last_tuning, spec, profile) is None:
            why = f"{seat_refusal.reason}: {seat_refusal.detail}" if seat_refusal else "every candidate refused"
            return Status("refused", why)
    if cert is not None:
        return Status("stale", why)
    return Status("pending")


def screened_problems(cert) -> set[Problem]:
    """The shapes a certificate's winner was screened at."""
    return {Problem.from_json(json.dumps(s["problem"])) for s in json.loads(cert.screens or "[]")}


def _screened_status(cert, problems: list[Problem]) -> Status:
    if cert.screened_max is None:
        return Status("unscreened", cert.unscreened or "never screened")
    screened = screened_problems(cert)
    outside = tuple(p for p in problems if p not in screened)
    if cert.unscreened:  # a shape the screen skipped for the byte budget says why
        return Status("unscreened", cert.unscreened, outside)
    if outside:
        return Status("unscreened", f"{len(outside)} shape(s) seen that the winner was never screened at", outside)
    return Status("certified")

"""Tuning a census's seats on this device, one claimed seat at a time.

A seat is claimed before it is tuned (so two censuses on one database tune it once), its
status is checked again under the claim (the other census may have certified it), the
claim is kept alive by a heartbeat while the seat is tuned, and the result is written in
one transaction that also releases the claim. A claim whose holder died expires.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone

from nbx_tune.kernels.registry import get_spec
from nbx_tune.tuner import provenance
from nbx_tune.tuner.status import seat_status
from nbx_tune.tuner.store import holder_id
from nbx_tune.tuner.tune import NullReporter, tune_seat

CLAIM_TTL_S = 120.0  # a dead holder's seat is free again this long after its last heartbeat


class _Heartbeat:
    def __init__(self, store, seat_id: int, holder: str, ttl: float):
        self.store, self.seat_id, self.holder, self.ttl = store, seat_id, holder, ttl
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self):
        while not self._stop.wait(self.ttl / 4):
            try:
                self.store.extend_claim(self.seat_id, self.holder, self.ttl)
            except Exception:  # a missed beat only shortens the claim
                pass

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class SeatTuner:
    def __init__(self, store, profile, device, executor, strategy, holder: str | None = None,
                 claim_ttl: float = CLAIM_TTL_S):
        self.store, self.profile, self.device = store, profile, device
        self.executor, self.strategy = executor, strategy
        self.holder = holder or holder_id()
        self.claim_ttl = claim_ttl
        self.torch_device = "cpu" if device.target == "interpreter" else "cuda"

    def _worth_it(self, rec, spec, st) -> bool:
        """An unscreened seat is re-tuned only if a shape outside its screened range can
        be screened now (one over the byte budget would stay unscreened)."""
        if st.status != "unscreened":
            return st.status in ("pending", "stale")
        return any(spec.operand_bytes(p) <= self.profile.screen_max_bytes for p in st.outside)

    def run(self, lines, plan, ids, run_id, reporter=None) -> None:
        reporter = reporter or NullReporter()
        todo = [ln for ln in lines if ln.id is not None]
        for i, ln in enumerate(todo):
            spec = get_spec(ln.kernel)
            if not self.store.claim(ln.id, self.holder, self.claim_ttl):
                reporter.notice(f"{ln.label}: being tuned by another process; left to it")
                continue
            try:
                rec = self.store.seat_records(seat_ids=[ln.id])[0]
                st = seat_status(rec.cert, rec.cert_tuning, rec.last_tuning, rec.problems, spec,
                                 self.profile, rec.seat_refusal)
                if not self._worth_it(rec, spec, st):
                    self.store.release(ln.id, self.holder)
                    continue
                reporter.seat_start(ln.label, i, len(todo), len(spec.configs()))
                started = datetime.now(timezone.utc)
                with _Heartbeat(self.store, ln.id, self.holder, self.claim_ttl):
                    result = tune_seat(spec, self.profile, ln.label, rec.problems, self.executor,
                                       self.strategy, self.torch_device, reporter)
                self.store.write_result(ln.id, run_id, "tune", result,
                                        provenance.current(spec, self.profile, self.device),
                                        self.holder, started)
                ln.action = "tuned"
                reporter.seat_done(ln.label, result)
            except BaseException:
                self.store.release(ln.id, self.holder)
                raise

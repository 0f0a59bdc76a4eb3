"""Tuning a census's seats on this device, one claimed seat at a time.

A seat is claimed before it is tuned (so two censuses on one database tune it once), its
status is checked again under the claim (the other census may have certified it), the
claim is kept alive by a heartbeat while the seat is tuned, and the result is written in
one transaction that also releases the claim. A claim whose holder died expires.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import datetime, timezone

from nbx_tune.kernels.runtime.registry import get_spec
from nbx_tune.tuner.certify import provenance
from nbx_tune.tuner.search import seat_search
from nbx_tune.tuner.certify.recertify import from_sibling
from nbx_tune.tuner.census.status import seat_status
from nbx_tune.tuner.search.searches import Full
from nbx_tune.tuner.store import LeaseLost, holder_id
from nbx_tune.kernels.spec import Config
from nbx_tune.tuner.certify.tune import NullReporter, first_compiles, renewed, screen_configs, tune_seat

CLAIM_TTL_S = 120.0  # a dead holder's seat is free again this long after its last heartbeat
WAIT_POLL_S = 1.0
# The compile pool is kept this many configs ahead of the seat being tuned: the next seats'
# first configs (a re-certification's few contenders, a shortlist) compile while this one
# is screened and timed, instead of after, one seat at a time.
PREFETCH_CONFIGS = 16


class _Heartbeat:
    """Renews a claim's lease every quarter lease from the moment the seat is claimed (the
    seat's reads included) until its result is written. A holder that stalls a whole lease
    anyway loses the seat to another worker, and the write refuses (Store.write_result)."""

    def __init__(self, store, seat_id: int, holder: str, ttl: float):
        self.store, self.seat_id, self.holder, self.ttl = store, seat_id, holder, ttl
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self):
        while not self._stop.wait(self.ttl / 4):
            try:
                if not self.store.extend_claim(self.seat_id, self.holder, self.ttl):
                    return  # taken by another worker: the write will refuse
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
        self.recertified_from: dict = {}  # seat id -> the tuning its certificate was re-certified from
        self.prefetched: dict = {}  # seat id -> how many configs were queued for it ahead
        self.audit_later: set = set()  # seat ids whose kernel's audit is due at a later seat (run)
        self.leases_lost: list = []  # labels of seats whose claim passed to another worker mid-tuning

    def _worth_it(self, rec, spec, st) -> bool:
        """An unscreened seat is worked on only if a shape its winner was never screened at
        can be screened now (one over the byte budget would stay unscreened)."""
        if st.status == "certified":  # a sibling device's table, served until re-timed here
            return from_sibling(rec.cert_tuning, self.device)
        if st.status != "unscreened":
            return st.status in ("pending", "stale")
        return any(spec.operand_bytes(p) <= self.profile.screen_max_bytes for p in st.outside)

    def run(self, lines, plan, ids, run_id, reporter=None) -> None:
        reporter = reporter or NullReporter()
        todo = [ln for ln in lines if ln.id is not None]
        # A kernel with no audit on record is audited at its last seat of this census, not
        # its first: the whole space then compiles while the seats before it are timed, and
        # is queued at the pool's lowest priority when the kernel's first seat starts. That
        # last seat is made its pending seat of the smallest shape (`_audited_last`).
        unaudited = {ln.kernel for ln in todo if not self.store.has_audit(self.profile.name, ln.kernel)}
        todo = self._audited_last(todo, unaudited)
        last = {ln.kernel: ln.id for ln in todo}
        self.audit_later = {ln.id for ln in todo if ln.kernel in unaudited and last[ln.kernel] != ln.id}
        started = set()
        held_elsewhere = []
        for i, ln in enumerate(todo):
            first = ln.kernel not in started and ln.kernel in unaudited
            self.prefetch(ln, todo[i + 1:], last[ln.kernel] if first else None)
            started.add(ln.kernel)
            if not self._tune_one(ln, i, len(todo), run_id, reporter):
                held_elsewhere.append(ln)
        # Seats another process was tuning: wait for it to finish them, or to die (its
        # claim then expires, or is seen dead on this host) and finish them here.
        if held_elsewhere:
            reporter.notice(f"{len(held_elsewhere)} seat(s) are being tuned by another process: waiting for them")
        while held_elsewhere:
            time.sleep(WAIT_POLL_S)
            held_elsewhere = [ln for ln in held_elsewhere
                              if not self._tune_one(ln, len(todo) - 1, len(todo), run_id, reporter)]

    def _audited_last(self, todo: list, unaudited: set) -> list:
        """`todo` with each unaudited kernel's pending seat of the smallest timed shape moved
        to that kernel's last place, where its audit falls: an audit times every candidate,
        and each timing costs less the smaller the shape."""
        ids = [ln.id for ln in todo if ln.kernel in unaudited]
        recs = {r.seat.id: r for r in self.store.seat_records(seat_ids=ids)} if ids else {}
        # Pending as the database has it now (a line's status dates from the census's plan).
        pending = [ln for ln in todo if ln.id in recs and seat_status(
            recs[ln.id], get_spec(ln.kernel), self.profile).status == "pending"]
        volume = {ln.id: max((p.volume for p in recs[ln.id].problems), default=0) for ln in pending}
        out = list(todo)
        for kernel in sorted(unaudited):
            mine = [ln for ln in pending if ln.kernel == kernel]
            if not mine:
                continue
            cheapest = min(mine, key=lambda ln: volume[ln.id])  # the first of equals
            last = max(i for i, ln in enumerate(out) if ln.kernel == kernel)
            out.remove(cheapest)
            out.insert(last, cheapest)
        return out

    def _tune_one(self, ln, index, total, run_id, reporter) -> bool:
        """Tune a seat if it still needs it; False while another live process holds it."""
        if not self.store.claim(ln.id, self.holder, self.claim_ttl):
            return False
        action = self.tune_claimed(ln.id, ln.kernel, ln.label, index, total, run_id, reporter)
        if action:
            ln.action = action
            ln.recertified_from = self.recertified_from.get(ln.id)
        return True

    def tune_claimed(self, seat_id, kernel, label, index, total, run_id, reporter) -> str | None:
        """Tune a seat this process has claimed, if it still needs it (another process may
        have certified it meanwhile); the result's transaction releases the claim. A
        certificate whose winner was never screened at shapes seen since has the winner
        screened there first; only a failure there tunes the seat again. Returns what was
        done ("rescreened", "re-certified", "tuned") or None."""
        spec = get_spec(kernel)
        try:
            with _Heartbeat(self.store, seat_id, self.holder, self.claim_ttl):
                with self.store.reading():  # the seat's reads and its search's, one transaction
                    rec = self.store.seat_records(seat_ids=[seat_id])[0]
                    st = seat_status(rec, spec, self.profile)
                    worth = self._worth_it(rec, spec, st)
                    if worth:
                        reporter.seat_start(label, index, total, len(spec.configs()))
                        started = datetime.now(timezone.utc)
                        search = seat_search.for_seat(self.store, rec, spec, self.profile,
                                                      seat_id in self.audit_later)
                if not worth:
                    self.store.release(seat_id, self.holder)
                    return None
                kind, result = "rescreen", self._rescreened(rec, spec, st, label, reporter)
                if result is None:
                    kind, result = "tune", tune_seat(spec, self.profile, label, rec.problems, self.executor,
                                                     self.strategy, self.torch_device, reporter, search)
                try:
                    self.store.write_result(seat_id, run_id, kind, result,
                                            provenance.current(spec, self.profile, self.device),
                                            self.holder, started)
                except LeaseLost as e:
                    self.leases_lost.append(label)
                    reporter.notice(str(e))
                    return None
            reporter.seat_done(label, result)
            return self._action(seat_id, kind, result)
        except BaseException:
            self.store.release(seat_id, self.holder)
            raise

    def _action(self, seat_id, kind: str, result) -> str:
        """What the census says it did: a seat re-certified from its history is not "tuned"
        (`show` says the same; the tuning it came from is kept for the report)."""
        if kind == "rescreen":
            return "rescreened"
        note = getattr(result, "note", None)
        if note is not None and note.search == "recertified":
            self.recertified_from[seat_id] = note.recertified_from or f"tuning {note.seeded_from}"
            return "re-certified"
        return "tuned"

    def prefetch(self, current, upcoming, whole=None) -> None:
        """Queue the first configs of the seat about to start (unless queued ahead) and of
        the seats coming next, at most PREFETCH_CONFIGS ahead (each seat once; a seat timing
        the whole space has the rest queued at its start, so a fallback here does not wait
        behind it); then, at the lowest priority, all of seat `whole`'s (a deferred audit:
        run). Only for speed: a seat whose search turns out other than planned here (an
        earlier seat informed it) compiles what it needs."""
        if not hasattr(self.executor, "prefetch"):
            return
        if current.id not in self.prefetched:
            self.prefetched[current.id] = self._queue(current, PREFETCH_CONFIGS)
        ahead = 0
        for ln in upcoming:
            if ahead >= PREFETCH_CONFIGS:
                break
            if ln.id not in self.prefetched:
                self.prefetched[ln.id] = self._queue(ln, PREFETCH_CONFIGS - ahead)
            ahead += self.prefetched[ln.id]
        ln = next((ln for ln in upcoming if ln.id == whole), None)
        if ln is not None:
            # All of them, whatever the window queued: its order may have changed since, and
            # the pool queues a config of a seat once. A seat that turns out no audit (its
            # history re-certifies it) is left to the window.
            n = self._queue(ln, None, whole_only=True)
            if n:
                self.prefetched[whole] = max(self.prefetched.get(whole, 0), n)

    def _queue(self, ln, limit: int | None, whole_only: bool = False) -> int:
        """Queue seat `ln`'s first configs for compiling, at most `limit` (with `whole_only`,
        only where its search times the whole space: an audit or a full tuning, then at the
        pool's lowest priority); how many."""
        try:
            spec = get_spec(ln.kernel)
            rec = self.store.seat_records(seat_ids=[ln.id])[0]
            if seat_status(rec, spec, self.profile).status in ("pending", "stale") \
                    or from_sibling(rec.cert_tuning, self.device):
                search = seat_search.for_seat(self.store, rec, spec, self.profile, ln.id in self.audit_later)
                if whole_only and not (isinstance(search, Full) or getattr(search, "audit", False)):
                    return 0
                job, first = first_compiles(spec, self.profile, ln.label, rec.problems, self.torch_device, search)
                first = first[:limit]
                if job is not None and first:
                    self.executor.prefetch(spec, job, first, later=whole_only)
                    return len(first)
        except Exception:  # planning ahead never costs the census anything
            pass
        return 0

    def _rescreened(self, rec, spec, st, label, reporter):
        """The certificate renewed with its winner's screens at the shapes seen since it was
        made, or None when there are none to screen or the winner fails at one."""
        new = [p for p in st.outside if spec.operand_bytes(p) <= self.profile.screen_max_bytes]
        if rec.cert is None or st.status != "unscreened" or not new:
            return None
        t0 = time.perf_counter()
        winner = screen_configs(spec, self.profile, label, [Config.parse(rec.cert.config)], new,
                                self.executor, self.torch_device)[0]
        if winner.reason:
            reporter.notice(f"{label}: the certified {rec.cert.config} fails at a shape seen since it was "
                            f"certified ({winner.reason}: {winner.detail}): tuning the seat again")
            return None
        return renewed(rec.cert, winner.screens, time.perf_counter() - t0)

    def todo(self, lines) -> list:
        """The census lines to tune: pending, stale and unscreened seats, and certified ones
        whose certificate came from a sibling device's table."""
        certified = [ln.id for ln in lines if ln.status == "certified" and ln.id is not None]
        sibling = {rec.seat.id for rec in (self.store.seat_records(seat_ids=certified) if certified else ())
                   if from_sibling(rec.cert_tuning, self.device)}
        return [ln for ln in lines if ln.status in ("pending", "stale", "unscreened") or ln.id in sibling]

    def claim_untuned(self):
        """Claim the longest never-tuned seat nobody live holds, as the server orders them
        (Store.claim_untuned): (id, kernel, label) or None."""
        return self.store.claim_untuned(self.profile.name, self.holder, self.claim_ttl, _known_kernels())

    def untuned_held(self) -> float | None:
        """The earliest lease end of a held never-tuned seat (None: none held)."""
        return self.store.untuned_held(self.profile.name, _known_kernels())

    def cost_queue(self) -> None:
        """Store the costs a census left unset (one lister at a time, fill_queue_costs):
        `census --enqueue` works them out, so a worker mostly finds none to do."""
        if self.store.untuned_without_cost(self.profile.name):
            self.store.fill_queue_costs(self.profile.name, self._queue_cost)

    def needing_work(self, untuned_only: bool = False, tuned_only: bool = False) -> list:
        """Seats of this profile that a worker should tune, longest first (`seat_cost`):
        (id, kernel, label). A seat never tuned is pending: those come from one query, with
        the cost kept on the seat (worked out and stored here where none is yet); only
        seats with a tuning have their records read and their status judged, which
        `untuned_only` skips (a worker's listing when its list runs dry: seats enqueued since).
        `tuned_only` lists those alone: a worker claims the never-tuned seats from the
        server (claim_untuned), and lists only the seats whose status needs Python."""
        if tuned_only:
            return self._tuned_needing_work()
        untuned = [t for t in self.store.untuned_seats(self.profile.name) if _spec_or_none(t[1]) is not None]
        if any(t[3] is None for t in untuned):
            # Worked out by one worker at a time; the others find them stored (fill_queue_costs).
            self.store.fill_queue_costs(self.profile.name, self._queue_cost)
            untuned = [t for t in self.store.untuned_seats(self.profile.name) if _spec_or_none(t[1]) is not None]
        missing = [t[0] for t in untuned if t[3] is None]  # a census was writing them: costed here
        costs = {}
        if missing:
            shapes = self.store.seat_problems(missing)
            costs = {sid: seat_cost(_spec_or_none(kernel), shapes.get(sid, []), self.profile)
                     for sid, kernel, _, cost in untuned if cost is None}
            self.store.set_queue_costs(costs)
        out = [(costs[sid] if cost is None else cost, sid, kernel, label) for sid, kernel, label, cost in untuned]
        return _longest_first(out + ([] if untuned_only else self._tuned_needing_work(costed=True)))

    def _tuned_needing_work(self, costed: bool = False) -> list:
        """The seats with a tuning that need work (stale, unscreened with a shape it can now
        screen, a sibling device's certificate), longest first: their records read, their
        status judged here."""
        out = []
        for rec in self.store.seat_records(profile=self.profile.name, tuned_only=True):
            spec = _spec_or_none(rec.seat.kernel)
            if spec is None:
                continue
            st = seat_status(rec, spec, self.profile)
            if self._worth_it(rec, spec, st):
                s = rec.seat
                out.append((seat_cost(spec, rec.problems, self.profile), s.id, s.kernel, s.label))
        return out if costed else _longest_first(out)

    def _queue_cost(self, kernel: str, problems) -> float | None:
        return queue_cost(self.profile)(kernel, problems)


def seat_cost(spec, problems, profile) -> float:
    """A rough guess of a seat's tuning time, to hand out the long seats first: a share per
    candidate that survives the static prune (its compile, screen and timing), growing with
    the bytes it moves at the seat's largest shape (its oracle and its timed launches)."""
    if not problems:
        return 0.0
    biggest = max(problems, key=spec.operand_bytes)
    return _cost_at(spec, profile, biggest)


def _cost_at(spec, profile, biggest) -> float:
    # Cached: the configs loop is the listing's Python work, and seats share shapes. Keyed
    # by the profile object (profiles are not hashable), which the entry keeps alive.
    key = (spec, id(profile), biggest)
    hit = _COSTS.get(key)
    if hit is not None and hit[0] is profile:
        return hit[1]
    live = sum(1 for c in spec.configs() if spec.static_refusal(profile, c, biggest) is None)
    cost = max(live, 1) * (1.0 + math.log2(1.0 + spec.operand_bytes(biggest) / 2**20))
    if len(_COSTS) > 100_000:
        _COSTS.clear()
    _COSTS[key] = (profile, cost)
    return cost


_COSTS: dict = {}


def _longest_first(costed: list) -> list:
    """(cost, id, kernel, label) rows as (id, kernel, label), longest first, then by id."""
    costed.sort(key=lambda t: (-t[0], t[1]))
    return [t[1:] for t in costed]


def queue_cost(profile):
    """The queue cost of a seat of `profile` from its kernel and shapes (None for a kernel
    not registered here): what `census --enqueue` stores on its seats (fill_queue_costs)."""
    def cost_of(kernel: str, problems) -> float | None:
        spec = _spec_or_none(kernel)
        return None if spec is None else seat_cost(spec, problems, profile)
    return cost_of


def _known_kernels() -> list:
    from nbx_tune.kernels.runtime.registry import all_specs

    return list(all_specs())


def _spec_or_none(kernel: str):
    from nbx_tune.kernels.runtime.registry import all_specs

    return all_specs().get(kernel)

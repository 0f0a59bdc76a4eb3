"""A tuning fleet: censuses enqueue seats, workers on any number of hosts and GPUs tune
them, all through one database (PostgreSQL for a fleet; SQLite works on one host).

    nbx-tune census --model llama.tsv --enqueue --db URL    # plan and record, tune nothing
    nbx-tune worker --db URL --gpus 0,1                     # one worker process per GPU

A worker tunes the seats of its own device's profile that need work. It claims one at a
time (SELECT ... FOR UPDATE SKIP LOCKED: two workers never wait on, or take, the same
seat), keeps the claim alive with heartbeats, and writes the seat in one transaction that
releases it. A worker that dies stops beating; its lease expires (at once, when it lived on
this host) and another worker finishes the seat. A worker exits when no seat of its profile
needs work and none is held by a live worker.
"""

from __future__ import annotations

import os
import subprocess
import time
from itertools import chain
from dataclasses import dataclass, field

from nbx_tune.errors import NbxError

IDLE_POLL_S = 0.5  # a worker that waits for others' last seats looks again after this,
IDLE_MAX_S = 4.0  # doubling while it finds nothing, up to this (1,000 waiting: 250 looks a second)


@dataclass
class WorkerReport:
    holder: str
    profile: str
    device: str
    tuned: list = field(default_factory=list)  # seat labels, in order
    lost: list = field(default_factory=list)  # seats tuned here whose claim another worker took first
    seconds: float = 0.0

    @property
    def seats_per_hour(self) -> float:
        return 3600.0 * len(self.tuned) / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"holder": self.holder, "profile": self.profile, "device": self.device,
                "tuned": self.tuned, "lost": self.lost, "seconds": round(self.seconds, 3),
                "seats_per_hour": round(self.seats_per_hour, 1)}


def run_worker(tuner, reporter=None, max_seats: int | None = None, wait_for_held: bool = True) -> WorkerReport:
    """Tune seats that need work until none is left (or max_seats are done).

    The never-tuned seats (most of a queue) are claimed from the server in its order, the
    longest free one in one statement each (`tuner.claim_untuned`: no listing, no per-claim
    cost growing with the queue or the fleet). The seats whose status needs Python (stale,
    unscreened, a sibling device's certificate) are listed once, when the worker starts,
    and claimed from that list when no never-tuned seat is free."""
    from nbx_tune.tuner.certify.tune import NullReporter

    reporter = reporter or NullReporter()
    rep = WorkerReport(tuner.holder, tuner.profile.name, tuner.device.name)
    t0 = time.perf_counter()
    tuner.cost_queue()  # costs a census left unset, so the server orders every seat
    listed = _Listed(tuner)  # listed now, not when the never-tuned run out: by then the
    # tuned seats are the whole queue, and each worker would read all of their records
    server, taken, idle = True, set(), IDLE_POLL_S
    while max_seats is None or len(rep.tuned) < max_seats:
        got = tuner.claim_untuned() if server else None
        if got is not None and got[0] in taken:
            # Handed back a seat this worker took and released untuned: it can do nothing
            # for it (never for a pending seat), so it leaves the rest to the listing.
            tuner.store.release(got[0], tuner.holder)
            server, got = False, None
        if got is None:
            got = listed.claim()
        if got is None:
            # Nothing free: wait while other live workers hold seats (they finish them, or
            # die and their leases end), then look again: at the earliest held lease's end
            # (a dead holder's seat is free then) or after `idle`, which doubles while
            # nothing turns up (before: every worker of a fleet looked twice a second).
            end = tuner.untuned_held()
            if not wait_for_held or (end is None and not listed.held):
                break
            due = idle if end is None else max(IDLE_POLL_S / 10, end - time.time())
            time.sleep(min(idle, due))
            idle = min(IDLE_MAX_S, 2 * idle)
            listed.look_again()
            continue
        idle = IDLE_POLL_S
        sid, kernel, label = got
        taken.add(sid)
        if tuner.tune_claimed(sid, kernel, label, len(rep.tuned), len(rep.tuned) + listed.left() + 1,
                              None, reporter):
            rep.tuned.append(label)
    rep.lost = list(getattr(tuner, "leases_lost", ()))
    rep.seconds = time.perf_counter() - t0
    return rep


class _Listed:
    """The seats with a tuning that need work, listed once (a read of their records) and
    claimed in that order (Store.claim_next). `gone`: listed seats tuned since (or taken
    here); `held`: listed seats another live worker held when a claim passed them, with
    its lease's end. Claims pass over held seats (a claim's cost does not grow with the
    workers ahead of it on the list) and look at one again when its lease has ended, or
    after a wait when nothing else is left."""

    def __init__(self, tuner):
        self.tuner = tuner
        self.mark = tuner.store.last_tuning_id()  # a claim skips seats tuned since the list
        listed = tuner.needing_work(tuned_only=True)
        self.todo, self.labels = [x[0] for x in listed], {sid: (k, label) for sid, k, label in listed}
        self.gone, self.held, self.head, self.again = set(), {}, 0, False

    def claim(self):
        t = self.tuner
        todo, gone, held = self.todo, self.gone, self.held
        while self.head < len(todo) and (todo[self.head] in gone or todo[self.head] in held):
            self.head += 1  # a claim reads the list from its first seat not known gone or held
        now = time.time()
        due = list(held) if self.again else [sid for sid, end in held.items() if end < now]
        self.again = False
        if self.head == len(todo) and not due:
            return None
        for sid in due:
            del held[sid]
        left = chain(due, (todo[j] for j in range(self.head, len(todo)) if todo[j] not in gone and todo[j] not in held))
        sid = t.store.claim_next(left, t.holder, t.claim_ttl, since_tuning=self.mark, finished=gone, held=held)
        if sid is None:
            return None
        gone.add(sid)
        return (sid, *self.labels[sid])

    def look_again(self) -> None:
        self.again = True  # after a wait, every held seat is looked at again

    def left(self) -> int:
        return len(self.todo) - len(self.gone)


def worker_timeline(rows, t_launch: float, t_end: float) -> list[dict]:
    """Where each worker's time went, from its tunings' (worker, start, finish, device)
    in epoch seconds: before its first seat (start-up), tuning, between seats (claims,
    heartbeats, the database), and at the end (waiting for other workers' last seats)."""
    out = {}
    for worker, start, finish, device in rows:
        out.setdefault(worker, {"worker": worker, "device": device, "seats": []})["seats"].append((start, finish))
    res = []
    for w in out.values():
        seats = sorted(w.pop("seats"))
        busy = sum(f - s for s, f in seats)
        gaps = sum(max(0.0, b[0] - a[1]) for a, b in zip(seats, seats[1:]))
        res.append({**w, "n_seats": len(seats), "startup_s": round(seats[0][0] - t_launch, 2),
                    "busy_s": round(busy, 2), "between_s": round(gaps, 2),
                    "idle_end_s": round(t_end - seats[-1][1], 2)})
    return sorted(res, key=lambda r: r["worker"])


def spawn_workers(gpus: list[str], command: list[str]) -> list[subprocess.Popen]:
    """One worker process per GPU id (an id may repeat: workers sharing a GPU), each seeing
    only its GPU. `command` is the caller's (the CLI passes its own `worker` command)."""
    from nbx_tune.tuner.execution.precompile import COMPILE_PROCS_ENV

    # The host's cores are split between the workers' compile pools (one core each left
    # for the worker that times); their compile locks keep them from compiling twice.
    per_worker = max(1, min(16, ((os.cpu_count() or 2) - len(gpus)) // max(1, len(gpus))))
    procs = []
    for gpu in gpus:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, "HIP_VISIBLE_DEVICES": gpu}
        env.setdefault(COMPILE_PROCS_ENV, str(per_worker))
        env.pop("NBX_TUNE_WORKER_ID", None)
        procs.append(subprocess.Popen(list(command), env=env))
    return procs


def wait_workers(procs) -> None:
    codes = [p.wait() for p in procs]
    bad = [(i, c) for i, c in enumerate(codes) if c != 0]
    if bad:
        raise NbxError(f"{len(bad)} of {len(procs)} workers failed (exit codes "
                       f"{', '.join(str(c) for _, c in bad)}); their seats go back to the queue")

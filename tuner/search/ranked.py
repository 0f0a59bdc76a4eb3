"""A census cheaper than timing everything: candidates ranked by what earlier seats of the
same kernel and profile measured, the most promising screened and timed with a seeded
sample of the rest, and an audit now and then that times every candidate and records the
loss the shortcut would have had there.

The ranking: each earlier tuning gives a config its time over that tuning's best (a
refusal at run time counts as REFUSED_PENALTY); a config's score is the mean of the log of
those, weighted by how near the earlier seat is (4 ** -distance: the sum over key dims of
|log2| of the ratio of the buckets' middles, plus one per differing dtype or flags). Only
seats within NEAR count: a decode GEMM (M=8) ranked by prefill GEMMs (M=512) alone got a
prefill tile 2x slower than the space's best, so a seat with no near neighbour (here or in
the shipped table, below) is tuned in full (and its full tuning informs the next ones). The TOP best-scored and SAMPLE others drawn with a seed from the seat's label are evaluated;
configs no earlier seat ran are only ever in the sample, and configs that failed (or ran
REFUSED_PENALTY times the best) wherever they ran are not even in that.

A seat the database knows no near seat of may still have near seats in the table shipped
for its profile (kernels/tables/): each entry there names a winner and a runner-up, no more,
so those seats count as votes, not scores (`votes`: 4 ** -distance for a winner, half that
for a runner-up). The configs with the most votes rank after the database's (all of them,
up to TOP, where the database knows nothing near; SHIPPED_EXTRA beside its TOP otherwise).
How often the votes hold a seat's own winner: `bench/ranking_replay.py --table`.

Audits: a seat is audited when no audit of the kernel is on record for the profile (a
census holds that first audit for the kernel's last seat in it, whose whole space then
compiles while the seats before it are timed: tuner/fleet/seat_tuner.py), or when its label's hash
falls in AUDIT_RATE. An audit evaluates every candidate (the winner
is the true best), and records the shortcut pick's loss against it: `nbx-tune show` and
exported tables show the median and maximum of those.
"""

from __future__ import annotations

import hashlib
import math
import random

from nbx_tune.tuner.search.searches import SearchNote

TOP = 8
SAMPLE = 4
AUDIT_RATE = 0.125
REFUSED_PENALTY = 4.0  # a config that failed at run time nearby: ranked last among known
MIN_PRIOR = 4  # an earlier tuning counts when it timed at least this many configs
NEAR = 3.0  # farthest an earlier seat may be to count: a factor 8 in one dim, or 2 and 4 in two
SHIPPED_EXTRA = 2  # the shipped table's most voted configs timed beside the database's TOP
RUNNER_UP_VOTE = 0.5
STATIC = ("smem_over_budget", "stages_over_max", "no_tma", "equivalent")  # judged again here


def _middles(bucket: str) -> dict[str, float]:
    out = {}
    for part in bucket.split(","):
        name, _, rng = part.partition("=")
        lo, sep, hi = rng.partition("..")
        try:
            a, b = float(lo), float(hi) if sep else float(lo)
        except ValueError:
            continue
        out[name] = math.sqrt(max(a, 1.0) * max(b, 1.0))
    return out


def distance(a: tuple, b: tuple) -> float:
    """Between two seats given as (dtypes, flags, bucket)."""
    ma, mb = _middles(a[2]), _middles(b[2])
    d = sum(abs(math.log2(ma[k] / mb[k])) for k in ma.keys() & mb.keys())
    d += len(ma.keys() ^ mb.keys())
    return d + (a[0] != b[0]) + (a[1] != b[1])


def scores(seat: tuple, prior) -> dict[str, tuple[float, float]]:
    """config key -> (score, weight) from `prior`: [(seat tuple, [(config, ms)], [(config,
    reason)])]. Lower scores rank first."""
    acc: dict[str, list[float]] = {}
    for where, meas, refused in prior:
        timed = [(c, ms) for c, ms in meas if ms > 0]
        if len(timed) < MIN_PRIOR:
            continue
        d = distance(seat, where)
        if d > NEAR:
            continue
        w = 4.0 ** -d
        best = min(ms for _, ms in timed)
        seen = {}
        for c, ms in timed:
            seen[c] = min(seen.get(c, ms), ms)
        for c, ms in seen.items():
            a = acc.setdefault(c, [0.0, 0.0])
            a[0] += w * math.log(ms / best)
            a[1] += w
        for c, why in refused:
            if why not in STATIC and c not in seen:
                a = acc.setdefault(c, [0.0, 0.0])
                a[0] += w * math.log(REFUSED_PENALTY)
                a[1] += w
    return {c: (s / w, w) for c, (s, w) in acc.items() if w > 0}


def votes(seat: tuple, shipped) -> dict[str, float]:
    """config key -> votes from `shipped`: [(seat tuple, winner key, runner-up key or None)],
    the entries of a shipped table (their seats within NEAR)."""
    out: dict[str, float] = {}
    for where, winner, runner_up in shipped:
        d = distance(seat, where)
        if d > NEAR:
            continue
        w = 4.0 ** -d
        out[winner] = out.get(winner, 0.0) + w
        if runner_up:
            out[runner_up] = out.get(runner_up, 0.0) + RUNNER_UP_VOTE * w
    return out


def label_fraction(label: str) -> float:
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "little") / 2.0 ** 64


class Ranked:
    name = "ranked"

    def __init__(self, label: str, seat: tuple, prior, audit: bool, shipped=()):
        self.label, self.audit = label, audit
        self.scores = scores(seat, prior)
        self.votes = votes(seat, shipped)

    @property
    def informed(self) -> bool:
        return bool(self.scores or self.votes)

    @property
    def source(self) -> str:
        """Whose measurements ranked the shortlist, in words (for the certificate)."""
        return " and ".join(w for w, known in (("the database's near seats", self.scores),
                                                ("the shipped table's near seats", self.votes)) if known)

    def _ranked_keys(self) -> list[str]:
        """Config keys best first: the database's scores, then the shipped table's votes."""
        keys = sorted(self.scores, key=lambda k: self.scores[k][0])
        return keys + sorted((k for k in self.votes if k not in self.scores), key=lambda k: -self.votes[k])

    def best(self, n: int) -> tuple:
        """The n best-ranked config keys: what won most at near seats."""
        return tuple(self._ranked_keys()[:n])

    def order(self, candidates):
        """Candidates best-ranked first, those no earlier seat ran last (in declared order)."""
        rank = {k: i for i, k in enumerate(self._ranked_keys())}
        known = sorted((c for c in candidates if c.key() in rank), key=lambda c: rank[c.key()])
        return known + [c for c in candidates if c.key() not in rank]

    def _top(self, ordered, top_n: int) -> list:
        scored = [c for c in ordered if c.key() in self.scores][:top_n]
        voted = sorted((c for c in ordered if c.key() in self.votes and c not in scored),
                       key=lambda c: -self.votes[c.key()])
        return scored + voted[:SHIPPED_EXTRA if scored else top_n]

    def shortlist(self, candidates, top_n: int = TOP, sample_n: int = SAMPLE):
        ordered = self.order(candidates)
        top = self._top(ordered, top_n)
        # Configs that failed or ran REFUSED_PENALTY times the best wherever they ran
        # cannot win: not even the sample compiles them (an audit still does).
        hopeless = math.log(REFUSED_PENALTY) - 1e-9
        rest = [c for c in ordered if c not in top and self.scores.get(c.key(), (0.0,))[0] < hopeless]
        rng = random.Random(self.label)
        sample = rng.sample(rest, min(sample_n, len(rest)))
        return top + [c for c in rest if c in sample]

    def compile_first(self, candidates):
        return self.order(candidates) if self.audit else self.shortlist(candidates)

    def run(self, candidates, evaluate) -> SearchNote:
        short = self.shortlist(candidates)
        if self.audit:
            measured = evaluate(self.order(candidates))
            loss = shortcut_loss(short, measured)
            return SearchNote("audit", shortcut_loss=loss,
                              detail="" if loss is None else
                              f"audit: every candidate timed; the ranked shortlist's pick would have lost {loss:.1%}")
        measured = evaluate(short, settle=True)
        if any(m.final for m in measured):
            return SearchNote("ranked", detail=f"ranked: {len(short)} of {len(candidates)} candidates evaluated"
                                               f" ({self.source})")
        evaluate(list(candidates))
        return SearchNote("full", detail="ranked shortlist: nothing survived; every candidate evaluated")


def shortcut_loss(short, measured) -> float | None:
    """What the shortlist's pick would have lost against the best of everything. A
    shortlisted config the strategy gave only a quick estimate (it was far behind)
    counts at that estimate."""
    finals = [m.timing.median_ms for m in measured if m.final]
    if not finals:
        return None
    inside = set(short)
    times = {m.config: m.timing.median_ms for m in measured if m.config in inside}
    if not times:
        return None
    return max(0.0, min(times.values()) / min(finals) - 1)


def regret_summary(losses) -> dict | None:
    """Median and maximum of the audited losses, for `nbx-tune show` and exports."""
    if not losses:
        return None
    xs = sorted(losses)
    n = len(xs)
    median = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return {"audits": n, "median": round(median, 6), "max": round(xs[-1], 6)}

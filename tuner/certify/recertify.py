"""Re-certifying a seat from its history instead of tuning it afresh.

A seat whose certificate went stale (kernel source, config space, Triton, driver, torch or
profile changed), one certified from a sibling device's table (an import made on another
device of the profile), or one seen at a new shape starts from what its last tunings
measured:

    1. the contenders: the old winner, the runner-up and every config whose old time was
       within NEAR of the old best (at most MAX_CONTENDERS), plus the configs the space
       gained since (at most MAX_NEW; more and the seat is tuned in full); where the old
       ranking timed only a shortlist (a ranked search, or a re-certification), also the
       EXPLORE configs that won most at near seats (`explore`): a shortlist that missed
       the space's best would otherwise be re-certified for ever (decode attention kept a
       pick at half torch's speed that way, split-KV never timed);
    2. they are screened at every screen shape of the seat and timed, like any candidate,
       though in turned rounds with no quick estimates first (they are few and all near
       the top; one warm-up, thrown away, loads the GPU the screen left idle), stopping
       where the census's rounds stop (`pruned.settled`: one contender first, or nearly,
       in every round so far) once the old ranking holds on what they measured (a
       fallback is worth the rounds that confirm it: `time_contenders`);
    3. the old ranking holds unless the new measurements say otherwise (`judge`), read
       against what this run's timings cannot tell apart: each config's noise (half its
       launches' p20..p80 band, half the range of its rounds, at least the timer's
       resolution; the old timing's where recorded) and the old margins:
         - it does not hold where a contender the old ranking timed is now faster than
           the old winner by more than TOLERANCE beyond their noise (the old ranking's
           pick would lose that), or where no contender survives the screen and a full
           timing (a new config that wins is simply picked; an explored one too, its
           lead counted as below);
         - else the contenders' moves against the pick, each shrunk by the noise of the
           ratio (so a move within noise counts as none), bound what a config left out
           (at least `gap` behind then) could gain, moving as much again:

               new best / (old best x (1 + gap) x pace x lo^2 / hi) - 1  <=  TOLERANCE

           with pace the new/old time of the fastest contender with an old time, and lo,
           hi the lowest and highest move against it (1 for itself). An explored config
           is a config left out, timed: the old ranking put it behind its winner, so
           where it is now ahead, that move counts in lo (not in hi: how far behind it
           was is not known, nor is it `gap`, which the shortlist measured only among
           the configs it timed). A shortlist ranked on another device can miss what
           this one ranks first: an explored config well ahead says so;
    4. else every candidate is screened and timed; so too after the first round where the
       old ranking was timed by another method family than this run's (a kernel now timed
       as a stream, tuner/timing/benchmarkers.py): its margins say nothing about the new ranking.

Where the history is clear (the runner-up was CLEAR or more behind the winner), fewer
configs are timed: the pair, and at most EXPLORE_CLEAR of the near seats' winners.

Either way the winner was screened here; the certificate records that it was re-certified
and from which tuning, and why the seat did or did not fall back (`search_detail`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nbx_tune.tuner.timing.strategies import Measured
from nbx_tune.tuner.timing.pruned import MIN_K, ROUNDS, settled, turned_rounds, within
from nbx_tune.tuner.search.searches import SearchNote
from nbx_tune.tuner.timing.benchmarkers import combine, family, noise as timing_noise

NEAR = 0.10
MAX_CONTENDERS = 6
MAX_NEW = 6
EXPLORE = 4
# A runner-up this far behind the winner makes the history clear: EXPLORE_CLEAR configs of
# the near seats' winners are timed beside the pair instead of EXPLORE.
CLEAR = 0.10
EXPLORE_CLEAR = 1
# The loss the shortcut may risk: the re-certification goal's maximum loss against a
# fresh census (3 %), which is also about what re-timing one config moves on a GPU.
TOLERANCE = 0.03
# Tunings whose measurements rank the whole space (the others timed a subset).
WHOLE_SPACE = ("full", "fallback", "audit")


@dataclass(frozen=True)
class Seed:
    tuning_id: int | None  # the tuning of the certificate being replaced (None: a shipped table)
    source: str  # that tuning in words: device, Triton, source hash
    old_ms: dict  # config key -> the time the reference ranking measured
    contenders: tuple  # config keys, fastest first
    gap: float  # how far behind the old best the fastest config left out was
    known: frozenset | None  # every config the reference judged; None when unknown
    config_space_hash: str
    complete: bool = True  # whether the reference ranking timed the whole space
    old_noise: dict = field(default_factory=dict)  # config key -> noise of its old time, where recorded
    margin: float | None = None  # the old certificate's runner-up margin
    timing: str | None = None  # the timing method family of old_ms (tuner/timing.family); None: unknown

    @property
    def clear(self) -> bool:
        """The old winner stood CLEAR or more ahead of its runner-up."""
        return self.margin is not None and self.margin >= CLEAR

    @property
    def winner(self) -> str:
        return min(self.old_ms, key=self.old_ms.get)


def _band(median, p20, p80) -> float | None:
    return (p80 - p20) / (2 * median) if median and p20 is not None and p80 is not None else None


def _describe(t) -> str:
    return (f"tuning {t.id} ({t.kind}, {t.device_name}, Triton {t.triton_version}, "
            f"source {t.kernel_source_hash}, space {t.config_space_hash})")


def seed_from_history(history, judged=None) -> Seed | None:
    """A seed from `Store.history(seat_id)`: [(tuning, certificate or None, measurements)],
    oldest first. `judged(tuning_id)` gives the configs a tuning measured or refused."""
    certified = [(t, c, m) for t, c, m in history if c is not None]
    if not certified:
        return None
    t_cert, cert, meas_cert = certified[-1]
    whole = [(t, m) for t, c, m in history if getattr(t, "search", "full") in WHOLE_SPACE and m]
    ref_t, ref_meas = whole[-1] if whole else (t_cert, meas_cert)
    old_ms, old_noise = {}, {}
    for m in sorted(ref_meas, key=lambda m: not m.final):  # a full timing wins over a quick one
        if m.config not in old_ms:
            old_ms[m.config] = m.median_ms
            old_noise[m.config] = _band(m.median_ms, m.p20_ms, m.p80_ms)
    # The certificate's own pair, where the reference did not time them (an import).
    old_ms.setdefault(cert.config, cert.median_ms)
    old_noise.setdefault(cert.config, _band(cert.median_ms, cert.p20_ms, cert.p80_ms))
    if cert.runner_up and cert.runner_up_ms is not None:
        old_ms.setdefault(cert.runner_up, cert.runner_up_ms)
    best = min(old_ms.values())
    ranked = sorted(old_ms, key=old_ms.get)
    clear = cert.margin is not None and cert.margin >= CLEAR
    near = ranked[:1] if clear else [k for k in ranked if old_ms[k] <= best * (1 + NEAR)][:MAX_CONTENDERS]
    contenders = tuple(dict.fromkeys([*near, cert.config, *([cert.runner_up] if cert.runner_up else [])]))
    left_out = [old_ms[k] for k in ranked if k not in contenders]
    if left_out:
        gap = min(left_out) / best - 1
    else:  # nothing timed was left out: what lies beyond is at least the margin behind
        gap = cert.margin or 0.0
    known = None
    if ref_meas and judged is not None and getattr(ref_t, "search", "full") in WHOLE_SPACE \
            and ref_t.kind != "import":
        known = frozenset(judged(ref_t.id))
    # An import's tuning timed nothing: how its certificate was found (the table's provenance)
    # says whether its ranking covered the whole space.
    complete = getattr(ref_t, "search", "full") in WHOLE_SPACE and (
        ref_t.kind != "import" or getattr(cert, "search", "full") in WHOLE_SPACE)
    return Seed(t_cert.id, _describe(t_cert), old_ms, contenders, max(gap, 0.0), known,
                ref_t.config_space_hash, complete,
                {k: v for k, v in old_noise.items() if v is not None}, cert.margin,
                family(cert.timing_method) if getattr(cert, "timing_method", None) else None)


def seed_from_entry(e: dict, source: str) -> Seed:
    """A seed from a certified table's entry (a table shipped in the package): its winner
    and runner-up, whatever code or Triton it was made under, since only their ranking
    is used and both are screened here again."""
    old_ms = {e["config"]: e["median_ms"]}
    if e.get("runner_up") and e.get("runner_up_ms") is not None:
        old_ms.setdefault(e["runner_up"], e["runner_up_ms"])
    p = e["provenance"]
    spread = e.get("spread_ms") or [None, None]
    band = _band(e["median_ms"], *spread[:2]) if len(spread) >= 2 else None
    return Seed(None, f"{source} ({p['device_name']}, Triton {p['triton_version']}, source "
                      f"{p['kernel_source_hash']}, space {p['config_space_hash']})",
                old_ms, tuple(old_ms), max(e.get("margin") or 0.0, 0.0), None, p["config_space_hash"],
                p.get("search", "full") in WHOLE_SPACE, {e["config"]: band} if band is not None else {},
                e.get("margin"), family(e["timing_method"]) if e.get("timing_method") else None)


def _within_noise(move: float, n: float) -> float:
    """A move shrunk by the noise `n` of its ratio: one within noise counts as none."""
    return move / (1 + n) if move > 1 + n else move * (1 + n) if move < 1 / (1 + n) else 1.0


def loss_bound(seed: Seed, finals: dict, timed: dict | None = None, noise: dict | None = None,
               explored=()) -> float | None:
    """The most a config left out could beat the new pick by (see the module's rule), or
    None when no contender with an old time was timed in full again. `timed` adds the
    quick estimates of contenders the strategy left behind: their pace counts too.
    `noise` (config key -> relative noise of its new timing) shrinks each move by what
    the timings cannot tell apart; without it every move counts in full. `explored`: the
    config keys timed that the old ranking left out (`Recertify.explore`)."""
    timed = {**(timed or {}), **finals}
    old = {k: t for k, t in timed.items() if seed.old_ms.get(k, 0) > 0}
    with_old = [k for k in finals if k in old]
    if not with_old:
        return None
    ref = min(with_old, key=finals.get)  # the fastest timed config with an old time
    pace = old[ref] / seed.old_ms[ref]

    def band(k):  # the noise of a new/old ratio; an old time's noise, where unknown, as its new one's
        if noise is None:
            return 0.0
        new = noise.get(k, 0.0)
        return (new ** 2 + seed.old_noise.get(k, new) ** 2) ** 0.5

    def against_ref(k):  # the noise of k's move measured against ref's
        return (band(k) ** 2 + band(ref) ** 2) ** 0.5

    lo = hi = 1.0
    for k in old:
        move = _within_noise((old[k] / seed.old_ms[k]) / pace, against_ref(k) if k != ref else 0.0)
        lo, hi = min(lo, move), max(hi, move)
    best_old = min(seed.old_ms.values())
    for k in explored:  # moves ahead only: how far behind it was is not known
        if k in timed and k not in seed.old_ms:
            lo = min(lo, _within_noise(timed[k] / (best_old * pace), against_ref(k)))
    return min(finals.values()) / (best_old * (1 + seed.gap) * pace * lo * lo / hi) - 1


@dataclass(frozen=True)
class Verdict:
    holds: bool
    why: str  # in words, for the certificate
    bound: float | None = None
    settled: bool = False  # no further timing can change it (another method's ranking)


def judge(seed: Seed, measured, explored=()) -> Verdict:
    """Whether the old ranking holds after re-timing its contenders (`measured`: the
    strategy's `Measured`; `explored`: the config keys timed beside them that the old
    ranking left out), and why (the module's rule)."""
    finals = {m.config.key(): m.timing for m in measured if m.final}
    timed = {m.config.key(): m.timing for m in measured}
    now = {family(t.method) for t in timed.values()}
    if seed.timing and now and now != {seed.timing}:
        # Another method ranks configs otherwise (a kernel now timed as a stream): the old
        # margins say nothing about the new ranking.
        return Verdict(False, f"the old ranking was timed by {seed.timing}, this run times by "
                              f"{', '.join(sorted(now))}", settled=True)
    noise = {k: timing_noise(t) for k, t in timed.items()}
    if not any(k in seed.old_ms for k in finals):
        return Verdict(False, "no old contender survived the screen and a full timing")
    w = seed.winner
    if w in finals:
        tw, nw = finals[w].median_ms, noise[w]
        for k, t in sorted(finals.items(), key=lambda kv: kv[1].median_ms):
            n = (nw ** 2 + noise[k] ** 2) ** 0.5
            if k != w and k in seed.old_ms and tw / t.median_ms > (1 + TOLERANCE) * (1 + n):
                return Verdict(False, f"the old ranking no longer holds: {k} is now {tw / t.median_ms - 1:.1%} "
                                      f"faster than the old winner {w} (noise {n:.1%}, tolerance {TOLERANCE:.0%})")
    bound = loss_bound(seed, {k: t.median_ms for k, t in finals.items()},
                       {k: t.median_ms for k, t in timed.items()}, noise, explored)
    worst = max(noise[k] for k in finals)
    if bound > TOLERANCE:
        return Verdict(False, f"the old ranking no longer holds: a config left out could be up to {bound:.1%} "
                              f"faster than the pick (gap then {seed.gap:.1%}, noise up to {worst:.1%} "
                              f"allowed for)", bound)
    pick = min(finals, key=lambda k: finals[k].median_ms)
    how = ("the old winner is still the fastest" if pick == w else
           f"{pick} is ahead of the old winner within noise and tolerance" if w in finals else
           f"the old winner was not timed again, {pick} took its place")
    return Verdict(True, f"{how}; worst case {max(bound, 0.0):.1%} behind (gap then {seed.gap:.1%}, "
                         f"noise up to {worst:.1%})", bound)


class Recertify:
    """The search of a seat that has history: contenders first, the whole space only if the
    new measurements say the old ranking no longer holds."""

    name = "recertified"
    compile_confirm = True  # its few contenders are all expected to be confirmed (tuner/certify/tune.py)

    def __init__(self, seed: Seed, config_space_hash: str, explore=()):
        self.seed, self.space = seed, config_space_hash
        self.explore = tuple(explore)  # config keys timed beside the contenders (module docstring)
        self.rounds = 0  # how many rounds `time_contenders` ran

    def time_contenders(self, candidates, measure, rounds: int = ROUNDS):
        """A timing strategy (tuner/strategies/): strategies/pruned.py's turned rounds without
        its quick estimates, until the rounds settle the first (`pruned.settled`) and the old
        ranking holds on them (`judge`). As there, after the first round only the contenders `within`
        reach of the best go on; the others stay on record with that round's time."""
        seen, behind, so_far = [], [], []
        if candidates:
            # The rounds' warm-ups are short, made for a GPU the contender before has loaded.
            # The first follows the screen, on an idle GPU at its boost clock: a long GEMM
            # timed there reads faster than under the load a model puts on it, and ranks
            # ahead of one timed later (lab/certify_cost/NOTES.md, call 42).
            measure(candidates[0], "warm")

        def after(r, this, alive, got):
            self.rounds = r + 1
            if this:
                seen.append(this)
            if r == 0 and len(alive) > MIN_K:
                keep = within(this)
                behind.extend(Measured(c, got.pop(c)[0], False) for c in alive if c not in keep)
                alive = [c for c in alive if c in keep]
            so_far[:] = behind + [Measured(c, combine(ts), True) for c, ts in got.items() if ts]
            verdict = judge(self.seed, so_far, self.explore)
            return alive, verdict.settled or (settled(seen) and verdict.holds)

        turned_rounds(list(candidates), measure, rounds, after)
        return so_far

    def plan(self, candidates):
        """(contenders to evaluate first, why the whole space is needed instead or None)."""
        by_key = {c.key(): c for c in candidates}
        first = [by_key[k] for k in dict.fromkeys((*self.seed.contenders, *self.explore)) if k in by_key]
        if self.seed.known is not None:
            new = [c for c in candidates if c.key() not in self.seed.known]
        elif self.seed.config_space_hash == self.space:
            new = []
        else:
            return [], "the config space changed and the seed does not say which configs are new"
        if len(new) > MAX_NEW:
            return [], f"{len(new)} configs new since the seed (> {MAX_NEW})"
        first += [c for c in new if c not in first]
        if not first:
            return [], "none of the old contenders is a candidate now"
        return first, None

    def compile_first(self, candidates):
        first, why = self.plan(candidates)
        return list(candidates) if why else first

    def run(self, candidates, evaluate) -> SearchNote:
        seed = self.seed
        first, why = self.plan(candidates)
        if why is None:
            verdict = judge(seed, evaluate(first, self.time_contenders), self.explore)
            if verdict.holds:
                return SearchNote("recertified", seed.tuning_id, seed.source, None,
                                  f"re-certified from {seed.source}: {len(first)} contender(s) timed in "
                                  f"{self.rounds} round(s), {verdict.why}")
            why = verdict.why
        evaluate(list(candidates))
        return SearchNote("fallback", seed.tuning_id, seed.source, None,
                          f"tuned in full after re-certification from {seed.source}: {why}")


def from_sibling(cert_tuning, device) -> bool:
    """A certificate imported from a table made on another device of this profile: served
    (its configs were screened for this compile target) until a census re-times it here."""
    return (cert_tuning is not None and cert_tuning.kind == "import"
            and cert_tuning.device_name != getattr(device, "name", None))

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
    2. they are screened at every screen shape of the seat and timed, like any candidate;
    3. the old ranking holds when the new best is no slower than the pace the contenders
       now run at explains, within what the old gap to the first config left out covers:

           new best x (1 + spread) / (old best x lo x (1 + gap)) - 1  <=  TOLERANCE

       where lo is the lowest new/old time ratio of a contender and spread = hi/lo - 1
       how far the contenders moved apart: a config left out (at least `gap` behind then)
       that moved as much again beyond the contender that sped up most would still not
       beat the pick by more than TOLERANCE;
    4. else, or when no contender survives, every candidate is screened and timed.

Either way the winner was screened here; the certificate records that it was re-certified
and from which tuning.
"""

from __future__ import annotations

from dataclasses import dataclass

from nbx_tune.tuner.strategies.search import SearchNote

NEAR = 0.10
MAX_CONTENDERS = 6
MAX_NEW = 6
EXPLORE = 4
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
    old_ms = {}
    for m in sorted(ref_meas, key=lambda m: not m.final):  # a full timing wins over a quick one
        old_ms.setdefault(m.config, m.median_ms)
    # The certificate's own pair, where the reference did not time them (an import).
    old_ms.setdefault(cert.config, cert.median_ms)
    if cert.runner_up and cert.runner_up_ms is not None:
        old_ms.setdefault(cert.runner_up, cert.runner_up_ms)
    best = min(old_ms.values())
    ranked = sorted(old_ms, key=old_ms.get)
    near = [k for k in ranked if old_ms[k] <= best * (1 + NEAR)][:MAX_CONTENDERS]
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
    return Seed(t_cert.id, _describe(t_cert), old_ms, contenders, max(gap, 0.0), known,
                ref_t.config_space_hash, getattr(ref_t, "search", "full") in WHOLE_SPACE)


def seed_from_entry(e: dict, source: str) -> Seed:
    """A seed from a certified table's entry (a table shipped in the package): its winner
    and runner-up, whatever code or Triton it was made under, since only their ranking
    is used and both are screened here again."""
    old_ms = {e["config"]: e["median_ms"]}
    if e.get("runner_up") and e.get("runner_up_ms") is not None:
        old_ms.setdefault(e["runner_up"], e["runner_up_ms"])
    p = e["provenance"]
    return Seed(None, f"{source} ({p['device_name']}, Triton {p['triton_version']}, source "
                      f"{p['kernel_source_hash']}, space {p['config_space_hash']})",
                old_ms, tuple(old_ms), max(e.get("margin") or 0.0, 0.0), None, p["config_space_hash"],
                p.get("search", "full") in WHOLE_SPACE)


def loss_bound(seed: Seed, finals: dict, timed: dict | None = None) -> float | None:
    """The most a config left out could beat the new pick by (see the module's rule), or
    None when no contender with an old time was timed in full again. `timed` adds the
    quick estimates of contenders the strategy left behind: their pace counts too."""
    timed = {**(timed or {}), **finals}
    ratios = [timed[k] / seed.old_ms[k] for k in timed if k in seed.old_ms and seed.old_ms[k] > 0]
    if not finals or not ratios or not any(k in seed.old_ms for k in finals):
        return None
    best_old = min(seed.old_ms.values())
    lo, hi = min(ratios), max(ratios)
    return min(finals.values()) * (hi / lo) / (best_old * lo * (1 + seed.gap)) - 1


class Recertify:
    """The search of a seat that has history: contenders first, the whole space only if the
    new measurements say the old ranking no longer holds."""

    name = "recertified"

    def __init__(self, seed: Seed, config_space_hash: str, explore=()):
        self.seed, self.space = seed, config_space_hash
        self.explore = tuple(explore)  # config keys timed beside the contenders (module docstring)

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
            measured = evaluate(first)
            finals = {m.config.key(): m.timing.median_ms for m in measured if m.final}
            bound = loss_bound(seed, finals, {m.config.key(): m.timing.median_ms for m in measured})
            if bound is None:
                why = "no old contender survived the screen and a full timing"
            elif bound > TOLERANCE:
                why = (f"the old ranking no longer holds (a config left out could be up to {bound:.1%} "
                       f"faster than the pick; gap then {seed.gap:.1%})")
            else:
                return SearchNote("recertified", seed.tuning_id, seed.source, None,
                                  f"re-certified from {seed.source}: {len(first)} contender(s) timed, "
                                  f"worst case {max(bound, 0.0):.1%} behind")
        evaluate(list(candidates))
        return SearchNote("fallback", seed.tuning_id, seed.source, None,
                          f"tuned in full after re-certification from {seed.source}: {why}")


def from_sibling(cert_tuning, device) -> bool:
    """A certificate imported from a table made on another device of this profile: served
    (its configs were screened for this compile target) until a census re-times it here."""
    return (cert_tuning is not None and cert_tuning.kind == "import"
            and cert_tuning.device_name != getattr(device, "name", None))
